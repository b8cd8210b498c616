//! A minimal agent that speaks the container contract: one input line on stdin, then one
//! command per line of the user messages, each answered by its own output block at once
//! (`<command>: <JSON>`), so a test can act between commands.
//!
//! | command | does |
//! |---|---|
//! | `fetch URL [--ca B64] [--token T]` | a child process `hako-testkit fetch …` whose proxy variables carry the run's token (`child_proxy_env`), as an agent runner starts its tools |
//! | `direct URL` | the same child with every proxy variable removed: a connection that bypasses the proxy |
//! | `tcp HOST:PORT [MS]` | a TCP connection attempt from this process |
//! | `tcp-gateway PORT [MS]` | the same to the container's default gateway |
//! | `env` | the proxy variables of the container's environment (what Docker stores) |
//! | `child-env` | the proxy variables a tool gets, the token shown as `<token>` |
//! | `jti` | the token's `jti` (not a secret: the revocation key) |
//! | `wait-file NAME MS` | waits for `/workspace/ipc/input/NAME`, then removes it |
//! | `hold HOST:PORT MS` | a `CONNECT` tunnel with the token: a block when open, one when it ends |
//! | `bench URL N C [connect]` | a child `hako-testkit bench URL --requests N --concurrency C [--via connect]`, with the token in its proxy variables |
//! | `sh LINE` | `/bin/sh -c LINE` (in an image that has one: `hako-toolbox`), with the token in its proxy variables: `{"code", "stdout", "stderr"}` (the last 64 KiB of each) |

use std::io::{BufRead as _, Read as _};
use std::time::{Duration, Instant};

use base64::Engine as _;
use hako_shared::allowlist::{NO_PROXY_VARS, PROXY_VARS, child_proxy_env};
use hako_shared::contract::{
    ContainerInput, MARKER_END_ENV, MARKER_START_ENV, OUTPUT_END, OUTPUT_START,
};
use serde_json::{Value, json};

struct Out {
    start: String,
    end: String,
}

impl Out {
    fn block(&self, result: &str) {
        let body = json!({"status": "ok", "result": result});
        let text = format!("\n{}\n{body}\n{}\n", self.start, self.end);
        let mut out = std::io::stdout().lock();
        let _ = std::io::Write::write_all(&mut out, text.as_bytes());
        let _ = std::io::Write::flush(&mut out);
    }
}

/// Reads the input and runs its commands.
pub async fn run() -> Result<(), String> {
    // The host's wake signal (follow-ups, `_close`) must not kill this agent: it takes no
    // follow-ups, it only runs its commands and exits.
    let mut usr1 = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::user_defined1())
        .map_err(|e| format!("SIGUSR1: {e}"))?;
    tokio::spawn(async move { while usr1.recv().await.is_some() {} });
    let line = tokio::task::spawn_blocking(|| {
        let mut line = String::new();
        std::io::stdin()
            .lock()
            .take(16 << 20)
            .read_line(&mut line)
            .map(|_| line)
    })
    .await
    .map_err(|e| e.to_string())?
    .map_err(|e| format!("stdin: {e}"))?;
    let input: ContainerInput =
        serde_json::from_str(&line).map_err(|e| format!("input: line {}", e.line()))?;
    let token = input.token.expose().to_owned();
    let out = Out {
        start: std::env::var(MARKER_START_ENV).unwrap_or_else(|_| OUTPUT_START.into()),
        end: std::env::var(MARKER_END_ENV).unwrap_or_else(|_| OUTPUT_END.into()),
    };
    let commands: Vec<String> = input
        .messages
        .iter()
        .filter(|m| m.role == "user")
        .flat_map(|m| m.content.lines().map(str::to_owned).collect::<Vec<_>>())
        .filter(|l| !l.trim().is_empty())
        .collect();
    for c in commands {
        let result = command(&c, &token, &out).await;
        out.block(&format!("{c}: {result}"));
    }
    Ok(())
}

async fn command(line: &str, token: &str, out: &Out) -> Value {
    let words: Vec<String> = line.split_whitespace().map(str::to_owned).collect();
    let arg = |i: usize| words.get(i).map(String::as_str).unwrap_or("");
    let ms = |i: usize, d: u64| Duration::from_millis(arg(i).parse().unwrap_or(d));
    match arg(0) {
        "fetch" => child("fetch", &words[1..], token, false).await,
        "direct" => child("fetch", &words[1..], token, true).await,
        "bench" => {
            let mut args = vec![arg(1).to_owned(), "--requests".into(), arg(2).to_owned()];
            args.extend(["--concurrency".into(), arg(3).to_owned()]);
            if arg(4) == "connect" {
                args.extend(["--via".into(), "connect".into()]);
            }
            child("bench", &args, token, false).await
        }
        "sh" => shell(line.trim_start()[2..].trim_start(), token).await,
        "tcp" => tcp(arg(1), ms(2, 3000)).await,
        "tcp-gateway" => match gateway() {
            Some(gw) => tcp(&format!("{gw}:{}", arg(1)), ms(2, 3000)).await,
            None => json!({"error": "no default route"}),
        },
        "env" => {
            let mut m = serde_json::Map::new();
            for k in PROXY_VARS.iter().chain(NO_PROXY_VARS.iter()) {
                m.insert((*k).into(), std::env::var(k).ok().into());
            }
            Value::Object(m)
        }
        "child-env" => {
            let vars = child_proxy_env(std::env::vars(), token);
            let shown: serde_json::Map<String, Value> = vars
                .into_iter()
                .map(|(k, v)| (k, v.replace(token, "<token>").into()))
                .collect();
            Value::Object(shown)
        }
        "jti" => json!(jti_of(token)),
        "wait-file" => {
            let path = std::path::Path::new(hako_shared::contract::INPUT_DIR).join(arg(1));
            let deadline = Instant::now() + ms(2, 30_000);
            loop {
                if std::fs::remove_file(&path).is_ok() {
                    break json!("found");
                }
                if Instant::now() > deadline {
                    break json!({"error": "timed out"});
                }
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
        }
        "hold" => {
            let name = line.to_owned();
            crate::client::hold(arg(1), token, ms(2, 30_000), || {
                out.block(&format!("{name}: open"))
            })
            .await
        }
        other => json!({"error": format!("unknown command {other:?}")}),
    }
}

/// Runs `hako-testkit <what> ARGS` as a child process: with the run's token in its proxy
/// variables, or (`bypass`) with no proxy variable at all.
async fn child(what: &str, args: &[String], token: &str, bypass: bool) -> Value {
    let exe = std::env::current_exe().unwrap_or_else(|_| "/hako-testkit".into());
    let mut cmd = tokio::process::Command::new(exe);
    cmd.arg(what).args(args).kill_on_drop(true);
    if bypass {
        for k in PROXY_VARS {
            cmd.env_remove(k);
        }
    } else {
        cmd.envs(child_proxy_env(std::env::vars(), token));
    }
    match tokio::time::timeout(Duration::from_secs(600), cmd.output()).await {
        Ok(Ok(o)) => {
            let text = String::from_utf8_lossy(&o.stdout);
            serde_json::from_str(text.trim()).unwrap_or_else(|_| json!({"error": text.trim()}))
        }
        Ok(Err(e)) => json!({"error": format!("spawn: {e}")}),
        Err(_) => json!({"error": "the child did not finish"}),
    }
}

/// Runs `line` in `/bin/sh` as an agent runs a tool: the run's token in its proxy variables.
async fn shell(line: &str, token: &str) -> Value {
    let tail = |b: &[u8]| {
        let from = b.len().saturating_sub(64 << 10);
        String::from_utf8_lossy(&b[from..]).into_owned()
    };
    let mut cmd = tokio::process::Command::new("/bin/sh");
    cmd.arg("-c")
        .arg(line)
        .kill_on_drop(true)
        .envs(child_proxy_env(std::env::vars(), token));
    match tokio::time::timeout(Duration::from_secs(300), cmd.output()).await {
        Ok(Ok(o)) => json!({
            "code": o.status.code(),
            "stdout": tail(&o.stdout),
            "stderr": tail(&o.stderr),
        }),
        Ok(Err(e)) => json!({"error": format!("spawn: {e}")}),
        Err(_) => json!({"error": "the command did not finish"}),
    }
}

async fn tcp(addr: &str, limit: Duration) -> Value {
    let started = Instant::now();
    match tokio::time::timeout(limit, tokio::net::TcpStream::connect(addr)).await {
        Ok(Ok(s)) => json!({"connected": s.peer_addr().map(|p| p.to_string()).ok()}),
        Ok(Err(e)) => json!({"error": e.to_string(), "ms": started.elapsed().as_millis() as u64}),
        Err(_) => json!({"error": "timed out", "ms": started.elapsed().as_millis() as u64}),
    }
}

/// The default gateway, from `/proc/net/route`.
fn gateway() -> Option<std::net::Ipv4Addr> {
    let text = std::fs::read_to_string("/proc/net/route").ok()?;
    text.lines().skip(1).find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.get(1) != Some(&"00000000") {
            return None;
        }
        let gw = u32::from_str_radix(f.get(2)?, 16).ok()?;
        Some(std::net::Ipv4Addr::from(gw.swap_bytes()))
    })
}

fn jti_of(token: &str) -> Option<String> {
    let payload = token.split('.').nth(1)?;
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload)
        .ok()?;
    let v: Value = serde_json::from_slice(&raw).ok()?;
    v.get("jti")?.as_str().map(str::to_owned)
}
