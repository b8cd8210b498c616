//! Probes of the sandbox for the script commands: identity, files, env names, network.
//!
//! Each returns the text of one reply line; failures are reported in that text, never raised.
//! Filesystem calls go through `tokio::fs` (a blocking thread), so that a path that blocks
//! (a FIFO, a hung mount) can still be cut by the deadline or SIGTERM.

use std::io::Read;
use std::time::Duration;

use serde_json::{Value, json};

/// Upper bound of what `/read` reports.
pub const MAX_READ: usize = 64 * 1024;
/// Upper bound of the entries `/ls` reports.
pub const MAX_LS: usize = 1000;
/// Linux `EROFS`: the error a write to a read-only filesystem gives.
const EROFS: i32 = 30;

/// The env var names this process sees, sorted, as a JSON array (never the values).
pub fn env_names() -> Value {
    let mut names: Vec<String> = std::env::vars_os()
        .map(|(k, _)| k.to_string_lossy().into_owned())
        .collect();
    names.sort();
    Value::from(names)
}

/// The `Key:` line of `/proc/self/status`.
fn status_field<'a>(status: &'a str, key: &str) -> Option<&'a str> {
    status.lines().find_map(|l| {
        l.strip_prefix(key)
            .and_then(|r| r.strip_prefix(':'))
            .map(str::trim)
    })
}

/// The n-th number of a `Uid:`/`Gid:` line (real, effective, saved, filesystem).
fn nth_id(status: &str, key: &str, n: usize) -> Value {
    status_field(status, key)
        .and_then(|v| v.split_whitespace().nth(n))
        .and_then(|v| v.parse::<u32>().ok())
        .map_or(Value::Null, Value::from)
}

/// Identity and confinement of this process, as a JSON object: ids and groups, capability
/// sets, NoNewPrivs and Seccomp (from `/proc/self/status`), `HOME`, the working directory,
/// and whether `/` is writable (by trying to create a file there).
pub fn whoami() -> Value {
    let status = std::fs::File::open("/proc/self/status")
        .and_then(|f| {
            let mut s = String::new();
            f.take(64 * 1024).read_to_string(&mut s)?;
            Ok(s)
        })
        .unwrap_or_default();
    let groups: Vec<u32> = status_field(&status, "Groups")
        .unwrap_or("")
        .split_whitespace()
        .filter_map(|g| g.parse().ok())
        .collect();
    let field = |k: &str| status_field(&status, k).map_or(Value::Null, Value::from);
    let (root_readonly, root_write) = probe_root_write();
    json!({
        "uid": nth_id(&status, "Uid", 0),
        "euid": nth_id(&status, "Uid", 1),
        "gid": nth_id(&status, "Gid", 0),
        "egid": nth_id(&status, "Gid", 1),
        "groups": groups,
        "CapEff": field("CapEff"),
        "CapPrm": field("CapPrm"),
        "CapBnd": field("CapBnd"),
        "NoNewPrivs": field("NoNewPrivs"),
        "Seccomp": field("Seccomp"),
        "HOME": std::env::var("HOME").ok(),
        "cwd": std::env::current_dir().ok().map(|p| p.display().to_string()),
        "root_readonly": root_readonly,
        "root_write": root_write,
    })
}

/// Tries to create (then removes) a file in `/`. Returns (read-only?, "ok" or the error).
fn probe_root_write() -> (bool, String) {
    let path = format!("/.hako-agent-probe-{}", std::process::id());
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&path)
    {
        Ok(_) => {
            let _ = std::fs::remove_file(&path);
            (false, "ok".into())
        }
        Err(e) => (e.raw_os_error() == Some(EROFS), e.to_string()),
    }
}

/// The content of a file (at most [`MAX_READ`] bytes, lossy UTF-8) as a JSON string, or the error.
pub async fn read_file(path: &str) -> String {
    let path = path.to_owned();
    let res = tokio::task::spawn_blocking(move || -> std::io::Result<(Vec<u8>, bool)> {
        let f = std::fs::File::open(path)?;
        let mut buf = Vec::new();
        f.take(MAX_READ as u64 + 1).read_to_end(&mut buf)?;
        let truncated = buf.len() > MAX_READ;
        buf.truncate(MAX_READ);
        Ok((buf, truncated))
    })
    .await;
    match res {
        Ok(Ok((bytes, truncated))) => {
            let text = Value::from(String::from_utf8_lossy(&bytes).into_owned());
            if truncated {
                format!("{text} (truncated at {MAX_READ} bytes)")
            } else {
                text.to_string()
            }
        }
        Ok(Err(e)) => format!("error: {e}"),
        Err(e) => format!("error: {e}"),
    }
}

/// The entry names of a directory, sorted, directories with a trailing `/`, as a JSON array.
pub async fn list_dir(path: &str) -> String {
    let mut rd = match tokio::fs::read_dir(path).await {
        Ok(rd) => rd,
        Err(e) => return format!("error: {e}"),
    };
    let mut names = Vec::new();
    let mut truncated = false;
    loop {
        match rd.next_entry().await {
            Ok(Some(entry)) => {
                if names.len() == MAX_LS {
                    truncated = true;
                    break;
                }
                let mut name = entry.file_name().to_string_lossy().into_owned();
                if entry.file_type().await.is_ok_and(|t| t.is_dir()) {
                    name.push('/');
                }
                names.push(name);
            }
            Ok(None) => break,
            Err(e) => return format!("error: {e}"),
        }
    }
    names.sort();
    let list = Value::from(names);
    if truncated {
        format!("{list} (truncated at {MAX_LS} entries)")
    } else {
        list.to_string()
    }
}

/// Tries a TCP connection to `host:port` within `timeout`.
pub async fn connect(addr: &str, timeout: Duration) -> String {
    match tokio::time::timeout(timeout, tokio::net::TcpStream::connect(addr)).await {
        Ok(Ok(stream)) => match stream.peer_addr() {
            Ok(peer) => format!("connected to {peer}"),
            Err(_) => "connected".into(),
        },
        Ok(Err(e)) => format!("error: {e}"),
        Err(_) => format!("error: timed out after {} ms", timeout.as_millis()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STATUS: &str = "Name:\thako-agent\nUid:\t1000\t1001\t1000\t1000\nGid:\t100\t100\t100\t100\n\
                          Groups:\t5 6 \nCapEff:\t0000000000000000\nNoNewPrivs:\t1\nSeccomp:\t2\n";

    #[test]
    fn status_parsing() {
        assert_eq!(nth_id(STATUS, "Uid", 0), json!(1000));
        assert_eq!(nth_id(STATUS, "Uid", 1), json!(1001));
        assert_eq!(nth_id(STATUS, "Gid", 1), json!(100));
        assert_eq!(nth_id(STATUS, "Nope", 0), Value::Null);
        assert_eq!(status_field(STATUS, "CapEff"), Some("0000000000000000"));
        assert_eq!(status_field(STATUS, "NoNewPrivs"), Some("1"));
        assert_eq!(status_field(STATUS, "Groups"), Some("5 6"));
        // A key that is a prefix of another key does not match it.
        assert_eq!(status_field(STATUS, "Cap"), None);
    }

    #[test]
    fn whoami_has_every_field() {
        let v = whoami();
        for k in [
            "uid",
            "gid",
            "groups",
            "CapEff",
            "CapPrm",
            "CapBnd",
            "NoNewPrivs",
            "Seccomp",
            "HOME",
            "cwd",
            "root_readonly",
            "root_write",
        ] {
            assert!(v.get(k).is_some(), "{k} missing in {v}");
        }
        assert!(v["uid"].is_u64());
    }

    #[tokio::test(flavor = "current_thread")]
    async fn files() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("f");
        std::fs::write(&p, "a\nb").unwrap();
        std::fs::create_dir(d.path().join("sub")).unwrap();
        assert_eq!(read_file(p.to_str().unwrap()).await, r#""a\nb""#);
        assert!(read_file("/nonexistent/x").await.starts_with("error: "));
        assert_eq!(
            list_dir(d.path().to_str().unwrap()).await,
            r#"["f","sub/"]"#
        );
    }
}
