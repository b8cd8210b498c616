//! The `authd` binary: reads the environment, starts the library, stops on SIGTERM/Ctrl-C.

use std::process::ExitCode;

use anyhow::Context as _;
use hako_shared::config::Env;

#[tokio::main]
async fn main() -> ExitCode {
    // The image's healthcheck: `authd health` asks the running daemon's /ready.
    if std::env::args().nth(1).as_deref() == Some("health") {
        return hako_shared::http::health_check(&["LISTEN_ADDR"], "127.0.0.1:8181");
    }
    if let Err(e) = hako_shared::telemetry::init() {
        eprintln!("authd: {e}");
        return ExitCode::from(2);
    }
    // A bad configuration exits 2 with a message naming the variable (never a key's value).
    let config = match hako_authd::Config::from_env(&Env::from_process()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("authd: {e}");
            return ExitCode::from(2);
        }
    };
    match run(config).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("authd: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(config: hako_authd::Config) -> anyhow::Result<()> {
    let addr = config.listen_addr;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on LISTEN_ADDR={addr}"))?;
    let running = hako_authd::start(config, listener)
        .await
        .context("authd failed to start")?;
    hako_shared::http::shutdown_signal().await;
    tracing::info!("shutting down");
    running.shutdown().await.context("shutdown")?;
    Ok(())
}
