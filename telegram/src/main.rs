//! The `hako-telegram` binary: reads the environment, starts the library, stops on SIGTERM.

use std::process::ExitCode;

use anyhow::Context as _;
use hako_shared::config::Env;

#[tokio::main]
async fn main() -> ExitCode {
    // The image's healthcheck: `hako-telegram health` asks the running adapter's /ready.
    if std::env::args().nth(1).as_deref() == Some("health") {
        return hako_shared::http::health_check(&["TELEGRAM_LISTEN"], "127.0.0.1:8190");
    }
    if let Err(e) = hako_shared::telemetry::init() {
        eprintln!("hako-telegram: {e}");
        return ExitCode::from(2);
    }
    let config = match hako_telegram::Config::from_env(&Env::from_process()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("hako-telegram: {e}");
            return ExitCode::from(2);
        }
    };
    match run(config).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("hako-telegram: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(config: hako_telegram::Config) -> anyhow::Result<()> {
    let addr = config.listen_addr;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr}"))?;
    let running = hako_telegram::start(config, listener)
        .await
        .context("hako-telegram failed to start")?;
    tokio::select! {
        () = hako_shared::http::shutdown_signal() => {}
        () = running.stopped() => {}
    }
    tracing::info!("shutting down");
    running.shutdown().await;
    Ok(())
}
