//! The `egress` binary: reads the environment, starts the proxy, stops on SIGTERM.

use std::process::ExitCode;

use hako_shared::config::Env;

#[tokio::main]
async fn main() -> ExitCode {
    if let Err(e) = hako_shared::telemetry::init() {
        eprintln!("egress: {e}");
        return ExitCode::from(2);
    }
    let config = match hako_egress::Config::from_env(&Env::from_process()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("egress: {e}");
            return ExitCode::from(2);
        }
    };
    let running = match hako_egress::bind_and_start(config).await {
        Ok(r) => r,
        Err(e) => {
            eprintln!("egress: {e}");
            return ExitCode::FAILURE;
        }
    };
    hako_shared::http::shutdown_signal().await;
    tracing::info!("shutting down");
    running.shutdown().await;
    ExitCode::SUCCESS
}
