//! `hako`: the command-line entry point. All the work is in the library.

use std::process::ExitCode;

use clap::Parser;

#[tokio::main]
async fn main() -> ExitCode {
    let cli = hako_cli::Cli::parse();
    match hako_cli::run(cli).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("hako: {e:#}");
            ExitCode::FAILURE
        }
    }
}
