//! The `routd` binary: reads the environment, starts the library, stops on SIGTERM.

use std::process::ExitCode;

use anyhow::Context as _;
use hako_shared::config::Env;

#[tokio::main]
async fn main() -> ExitCode {
    // The image's healthcheck: `routd health` asks the running daemon's /ready.
    if std::env::args().nth(1).as_deref() == Some("health") {
        return hako_shared::http::health_check(&["ROUTD_LISTEN", "LISTEN_ADDR"], "127.0.0.1:8183");
    }
    if let Err(e) = hako_shared::telemetry::init() {
        eprintln!("routd: {e}");
        return ExitCode::from(2);
    }
    let config = match hako_routd::Config::from_env(&Env::from_process()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("routd: {e}");
            return ExitCode::from(2);
        }
    };
    match run(config).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("routd: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(config: hako_routd::Config) -> anyhow::Result<()> {
    let addr = config.listen_addr;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr}"))?;
    let running = hako_routd::start(config, listener)
        .await
        .context("routd failed to start")?;
    hako_shared::http::shutdown_signal().await;
    tracing::info!("shutting down; live turns resume at the next start");
    running.shutdown().await;
    Ok(())
}
