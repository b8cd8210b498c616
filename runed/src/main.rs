//! The `runed` binary: reads the environment, starts the library, detaches on SIGTERM.

use std::process::ExitCode;

use anyhow::Context as _;
use hako_shared::config::Env;

#[tokio::main]
async fn main() -> ExitCode {
    // The image's healthcheck: `runed health` asks the running daemon's /ready.
    if std::env::args().nth(1).as_deref() == Some("health") {
        return hako_shared::http::health_check(&["RUNED_LISTEN", "LISTEN_ADDR"], "127.0.0.1:8182");
    }
    if let Err(e) = hako_shared::telemetry::init() {
        eprintln!("runed: {e}");
        return ExitCode::from(2);
    }
    let config = match hako_runed::Config::from_env(&Env::from_process()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("runed: {e}");
            return ExitCode::from(2);
        }
    };
    match run(config).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("runed: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(config: hako_runed::Config) -> anyhow::Result<()> {
    let addr = config.listen_addr;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr}"))?;
    let running = hako_runed::start(config, listener)
        .await
        .context("runed failed to start")?;
    hako_shared::http::shutdown_signal().await;
    tracing::info!("shutting down; live runs are detached and will be re-adopted");
    running.shutdown().await;
    Ok(())
}
