//! Logging setup: human-readable logs by default, JSON lines with `LOG_FORMAT=json`,
//! filtering with `RUST_LOG` (default `info`).

use tracing_subscriber::EnvFilter;

/// Installs the global tracing subscriber. Call once, first thing in `main`.
/// Returns an error naming `LOG_FORMAT` when it holds something other than `json` or `text`.
pub fn init() -> Result<(), crate::config::ConfigError> {
    init_with("info")
}

/// Like [`init`], with `default_filter` when `RUST_LOG` is unset (the CLI keeps quiet: `warn`).
pub fn init_with(default_filter: &str) -> Result<(), crate::config::ConfigError> {
    let format = std::env::var("LOG_FORMAT").unwrap_or_default();
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        // Colour codes only for a person at a terminal, never in files or container logs.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    let result = match format.as_str() {
        "json" => builder.json().flatten_event(true).try_init(),
        "" | "text" => builder.try_init(),
        other => {
            return Err(crate::config::ConfigError::Invalid {
                var: "LOG_FORMAT".into(),
                value: other.into(),
                reason: "expected json or text".into(),
            });
        }
    };
    // A subscriber already installed (tests running several daemons) is fine.
    let _ = result;
    Ok(())
}
