//! `hako-testkit`: one static binary, test-only, for the egress tests and bench
//! (`specs/egress.md`). It runs inside `FROM scratch` containers built by the image pipeline.
//!
//! ```text
//! hako-testkit                                     the agent: reads the container input, runs its commands
//! hako-testkit fetch URL [--ca B64] [--token T] [--timeout-ms MS]
//! hako-testkit bench URL --requests N --concurrency C [--ca B64] [--via connect]
//! hako-testkit http-server --listen ADDR --name NAME
//! hako-testkit tls-server --listen ADDR --name NAME --san NAME...
//! hako-testkit secret-server --listen ADDR --san NAME... --expect-sha256 HEX
//! ```
//!
//! `fetch` is an ordinary client: it goes through `HTTPS_PROXY`/`HTTP_PROXY` (or their
//! lowercase forms) when set, taking the proxy credentials from the URL's user part as curl
//! does, and prints one JSON line. The agent starts it as a child process with the token put
//! into those variables by `hako_shared::allowlist::child_proxy_env`, as an agent runner hands
//! it to its tools.

mod agent;
mod client;
mod secret_server;
mod servers;

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("hako-testkit: runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = rt.block_on(async move {
        match args.first().map(String::as_str) {
            None => agent::run().await,
            Some("fetch") => client::fetch_main(&args[1..]).await,
            Some("bench") => client::bench_main(&args[1..]).await,
            Some("http-server") => servers::http_main(&args[1..]).await,
            Some("tls-server") => servers::tls_main(&args[1..]).await,
            Some("secret-server") => secret_server::main(&args[1..]).await,
            Some(other) => Err(format!("unknown command {other:?}")),
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("hako-testkit: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The value after `--name` in `args`, if any.
pub fn opt<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    args.windows(2)
        .find(|w| w[0] == name)
        .map(|w| w[1].as_str())
}

/// Every value after `--name` in `args`.
pub fn opts<'a>(args: &'a [String], name: &str) -> Vec<&'a str> {
    args.windows(2)
        .filter(|w| w[0] == name)
        .map(|w| w[1].as_str())
        .collect()
}
