//! Command-line arguments. Hand-parsed: three forms do not justify an argument-parser crate in
//! a static binary that ships in every agent image.

use std::ffi::OsString;
use std::path::PathBuf;

/// Usage text.
pub const USAGE: &str = "usage:
  hako-agent                            run the agent (container contract on stdin/stdout)
  hako-agent serve-mcp --socket PATH    serve the echo MCP server on a unix socket
  hako-agent mcp-bridge --socket PATH [--after MARK]
                                        stdio MCP to a unix socket (Claude Code, Codex);
                                        --after: connect once the file MARK exists
  hako-agent --version                  print the version
";

/// What the command line asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cli {
    /// Run the agent.
    Agent,
    /// Serve the echo MCP server on this socket.
    ServeMcp {
        /// The socket path.
        socket: PathBuf,
    },
    /// Copy stdin/stdout to and from this socket (a stdio MCP server).
    McpBridge {
        /// The socket path.
        socket: PathBuf,
        /// Connect only once this file exists (the turn began).
        after: Option<PathBuf>,
    },
    /// Print the version.
    Version,
    /// Print usage.
    Help,
}

/// Parses the arguments after the program name; the error is the message to print.
pub fn parse(args: impl IntoIterator<Item = OsString>) -> Result<Cli, String> {
    let args: Vec<OsString> = args.into_iter().collect();
    let strs: Vec<Option<&str>> = args.iter().map(|a| a.to_str()).collect();
    match strs[..] {
        [] => Ok(Cli::Agent),
        [Some("--version" | "-V" | "version")] => Ok(Cli::Version),
        [Some("--help" | "-h" | "help")] => Ok(Cli::Help),
        [Some("serve-mcp"), Some("--socket"), _] => Ok(Cli::ServeMcp {
            socket: PathBuf::from(&args[2]),
        }),
        [Some("serve-mcp"), ..] => Err("serve-mcp needs --socket PATH".into()),
        [Some("mcp-bridge"), Some("--socket"), _] => Ok(Cli::McpBridge {
            socket: PathBuf::from(&args[2]),
            after: None,
        }),
        [Some("mcp-bridge"), Some("--socket"), _, Some("--after"), _] => Ok(Cli::McpBridge {
            socket: PathBuf::from(&args[2]),
            after: Some(PathBuf::from(&args[4])),
        }),
        [Some("mcp-bridge"), ..] => Err("mcp-bridge needs --socket PATH".into()),
        _ => Err(format!("unexpected arguments: {args:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(args: &[&str]) -> Result<Cli, String> {
        parse(args.iter().map(OsString::from))
    }

    #[test]
    fn forms() {
        assert_eq!(p(&[]), Ok(Cli::Agent));
        assert_eq!(p(&["--version"]), Ok(Cli::Version));
        assert_eq!(p(&["--help"]), Ok(Cli::Help));
        assert_eq!(
            p(&["serve-mcp", "--socket", "/run/x.sock"]),
            Ok(Cli::ServeMcp {
                socket: "/run/x.sock".into()
            })
        );
        assert!(p(&["serve-mcp"]).is_err());
        assert_eq!(
            p(&["mcp-bridge", "--socket", "/run/m.sock"]),
            Ok(Cli::McpBridge {
                socket: "/run/m.sock".into(),
                after: None,
            })
        );
        assert_eq!(
            p(&["mcp-bridge", "--socket", "/run/m.sock", "--after", "/tmp/t"]),
            Ok(Cli::McpBridge {
                socket: "/run/m.sock".into(),
                after: Some("/tmp/t".into()),
            })
        );
        assert!(p(&["mcp-bridge", "--socket", "/run/m.sock", "--after"]).is_err());
        assert!(p(&["mcp-bridge", "--socket", "/run/m.sock", "--frob"]).is_err());
        assert!(p(&["mcp-bridge"]).is_err());
        assert!(p(&["serve-mcp", "--socket"]).is_err());
        assert!(p(&["--frob"]).is_err());
    }
}
