//! The `hako-agent` binary: argument parsing and a current-thread runtime around the library.

use std::io::Write;
use std::time::Instant;

use hako_agent::cli::{self, Cli};
use hako_agent::output::log;

fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    // One thread is plenty for one agent, keeps the binary's footprint small, and lets the
    // brain's futures hold non-Send state.
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
}

fn main() {
    // The query deadline is measured from here, as close to process start as we get.
    let started = Instant::now();
    let code = match cli::parse(std::env::args_os().skip(1)) {
        Ok(Cli::Version) => {
            println!("hako-agent {}", env!("CARGO_PKG_VERSION"));
            0
        }
        Ok(Cli::Help) => {
            print!("{}", cli::USAGE);
            0
        }
        Err(msg) => {
            eprint!("hako-agent: {msg}\n{}", cli::USAGE);
            2
        }
        Ok(Cli::Agent) => match runtime() {
            Ok(rt) => rt.block_on(hako_agent::agent::run(started)),
            Err(e) => {
                // No runtime, so no writer thread: frame the fatal block by hand.
                log(format_args!("cannot start the runtime: {e}"));
                let env = hako_shared::config::Env::from_process();
                let block = hako_shared::contract::OutputBlock::failure(
                    hako_shared::contract::BlockStatus::Fatal,
                    format!("hako-agent cannot start its runtime: {e}"),
                );
                let framed =
                    hako_agent::output::frame_block(&hako_agent::config::markers(&env), &block);
                let _ = std::io::stdout().lock().write_all(&framed);
                1
            }
        },
        Ok(Cli::McpBridge { socket, after }) => match runtime() {
            Ok(rt) => match rt.block_on(hako_agent::brain::harness::bridge::bridge(
                socket.clone(),
                after,
            )) {
                Ok(()) => 0,
                Err(e) => {
                    log(format_args!("mcp-bridge to {}: {e}", socket.display()));
                    1
                }
            },
            Err(e) => {
                log(format_args!("cannot start the runtime: {e}"));
                1
            }
        },
        Ok(Cli::ServeMcp { socket }) => match runtime() {
            Ok(rt) => match rt.block_on(hako_agent::mcp::serve(&socket)) {
                Ok(()) => 0,
                Err(e) => {
                    log(format_args!("serve-mcp on {}: {e}", socket.display()));
                    1
                }
            },
            Err(e) => {
                log(format_args!("cannot start the runtime: {e}"));
                1
            }
        },
    };
    let _ = std::io::stdout().flush();
    // `exit` rather than returning: the stdin thread may still be blocked in a read, and
    // the runtime must not wait for it.
    std::process::exit(code);
}
