//! The script brain: deterministic, for tests and demos, no LLM.
//!
//! Each user message is read line by line. A plain line is echoed; a line starting with `/`
//! is a command whose result makes one line of the reply; `//text` echoes `/text`. The
//! language is documented in `specs/agent-script.md`.

use std::time::Duration;

use hako_shared::config::parse_size;
use hako_shared::contract::{BlockStatus, OutputBlock};

use super::{Brain, BrainError, Io, Outcome, Query, Reply};
use crate::output::{NOISE_CHUNK, Stream, frame_raw};
use crate::{mcp, probe};

/// Upper bound of `/sleep`.
pub const MAX_SLEEP: Duration = Duration::from_secs(7 * 24 * 3600);
/// Upper bound of `/blocks`.
pub const MAX_BLOCKS: u32 = 10_000;
/// Upper bound of `/flood`.
pub const MAX_FLOOD: u64 = 64 << 30;
/// Default and upper bound of the `/connect` timeout.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
const MAX_CONNECT_TIMEOUT: Duration = Duration::from_secs(60);

/// A parsed script command.
#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    /// `/sleep SECONDS`
    Sleep(Duration),
    /// `/await-followup SECONDS`
    AwaitFollowUp(Duration),
    /// `/exit CODE`
    Exit(i32),
    /// `/blocks N`
    Blocks(u32),
    /// `/error MSG`
    Error(String),
    /// `/fatal MSG`
    Fatal(String),
    /// `/flood BYTES [stdout|stderr]`
    Flood {
        /// How many bytes of noise.
        bytes: u64,
        /// Where to.
        stream: Stream,
    },
    /// `/fake-marker`
    FakeMarker,
    /// `/bad-block`
    BadBlock,
    /// `/ignore-sigterm`
    IgnoreSigterm,
    /// `/write PATH CONTENT`
    Write {
        /// The file.
        path: String,
        /// Its new content (the rest of the line).
        content: String,
    },
    /// `/read PATH`
    Read(String),
    /// `/ls PATH`
    Ls(String),
    /// `/env`
    Env,
    /// `/whoami`
    Whoami,
    /// `/secrets`
    Secrets,
    /// `/connect HOST:PORT [TIMEOUT_MS]`
    Connect {
        /// `host:port`.
        addr: String,
        /// Connect timeout.
        timeout: Duration,
    },
    /// `/mcp TOOL [JSON]`
    Mcp {
        /// Tool name.
        tool: String,
        /// Tool arguments (a JSON object).
        arguments: serde_json::Value,
    },
    /// `/session ID`
    Session(String),
    /// `/echo-input`
    EchoInput,
}

/// One line of a script.
#[derive(Debug, Clone, PartialEq)]
pub enum Line {
    /// Text to echo.
    Text(String),
    /// A command to run.
    Command(Command),
    /// A command that could not be parsed; the string is the reply line saying why.
    Invalid(String),
}

fn no_args(name: &str, rest: &str, cmd: Command) -> Result<Command, String> {
    if rest.is_empty() {
        Ok(cmd)
    } else {
        Err(format!("{name}: takes no arguments"))
    }
}

fn one_arg<'a>(name: &str, rest: &'a str, what: &str) -> Result<&'a str, String> {
    match rest.split_whitespace().collect::<Vec<_>>()[..] {
        [one] => Ok(one),
        _ => Err(format!("{name}: expected {what}")),
    }
}

/// Parses one line of a user message.
pub fn parse_line(line: &str) -> Line {
    let Some(body) = line.strip_prefix('/') else {
        return Line::Text(line.to_owned());
    };
    if body.starts_with('/') {
        return Line::Text(body.to_owned());
    }
    let (name, rest) = match body.split_once(char::is_whitespace) {
        Some((n, r)) => (n, r.trim()),
        None => (body, ""),
    };
    match parse_command(name, rest) {
        Ok(c) => Line::Command(c),
        Err(msg) => Line::Invalid(msg),
    }
}

/// A command's one argument in seconds: fractional, 0 to [`MAX_SLEEP`].
fn seconds(name: &str, rest: &str) -> Result<Duration, String> {
    let raw = one_arg(name, rest, &format!("seconds, e.g. /{name} 1.5"))?;
    let secs: f64 = raw
        .parse()
        .map_err(|_| format!("{name}: invalid seconds {raw:?}"))?;
    match Duration::try_from_secs_f64(secs) {
        Ok(d) if d <= MAX_SLEEP => Ok(d),
        _ => Err(format!(
            "{name}: seconds must be between 0 and {}",
            MAX_SLEEP.as_secs()
        )),
    }
}

fn parse_command(name: &str, rest: &str) -> Result<Command, String> {
    match name {
        "sleep" => seconds(name, rest).map(Command::Sleep),
        "await-followup" => seconds(name, rest).map(Command::AwaitFollowUp),
        "exit" => {
            let raw = one_arg(name, rest, "an exit code 0-255")?;
            match raw.parse::<u8>() {
                Ok(code) => Ok(Command::Exit(i32::from(code))),
                Err(_) => Err(format!("exit: invalid code {raw:?}, expected 0-255")),
            }
        }
        "blocks" => {
            let raw = one_arg(name, rest, "a block count")?;
            match raw.parse::<u32>() {
                Ok(n) if n <= MAX_BLOCKS => Ok(Command::Blocks(n)),
                _ => Err(format!("blocks: count must be 0-{MAX_BLOCKS}")),
            }
        }
        "error" => Ok(Command::Error(or_default(
            rest,
            "error requested by script",
        ))),
        "fatal" => Ok(Command::Fatal(or_default(
            rest,
            "fatal requested by script",
        ))),
        "flood" => {
            let mut words = rest.split_whitespace();
            let size = words
                .next()
                .ok_or_else(|| "flood: expected a byte count, e.g. /flood 10m stderr".to_owned())?;
            let bytes = parse_size(size).map_err(|e| format!("flood: {e}"))?;
            if bytes > MAX_FLOOD {
                return Err(format!("flood: at most {MAX_FLOOD} bytes"));
            }
            let stream = match words.next() {
                None | Some("stdout") => Stream::Stdout,
                Some("stderr") => Stream::Stderr,
                Some(other) => return Err(format!("flood: unknown stream {other:?}")),
            };
            if words.next().is_some() {
                return Err("flood: too many arguments".into());
            }
            Ok(Command::Flood { bytes, stream })
        }
        "fake-marker" => no_args(name, rest, Command::FakeMarker),
        "bad-block" => no_args(name, rest, Command::BadBlock),
        "ignore-sigterm" => no_args(name, rest, Command::IgnoreSigterm),
        "write" => {
            // The content is the rest of the line after the path, spaces included.
            let (path, content) = match rest.split_once(char::is_whitespace) {
                Some((p, c)) => (p, c),
                None => (rest, ""),
            };
            if path.is_empty() {
                return Err("write: expected PATH CONTENT".into());
            }
            Ok(Command::Write {
                path: path.to_owned(),
                content: content.to_owned(),
            })
        }
        "read" => Ok(Command::Read(one_arg(name, rest, "a path")?.to_owned())),
        "ls" => Ok(Command::Ls(one_arg(name, rest, "a path")?.to_owned())),
        "env" => no_args(name, rest, Command::Env),
        "whoami" => no_args(name, rest, Command::Whoami),
        "secrets" => no_args(name, rest, Command::Secrets),
        "connect" => {
            let words: Vec<&str> = rest.split_whitespace().collect();
            let (addr, timeout) = match words[..] {
                [addr] => (addr, CONNECT_TIMEOUT),
                [addr, ms] => {
                    let ms: u64 = ms
                        .parse()
                        .map_err(|_| format!("connect: invalid timeout {ms:?} (milliseconds)"))?;
                    (addr, Duration::from_millis(ms).min(MAX_CONNECT_TIMEOUT))
                }
                _ => return Err("connect: expected HOST:PORT [TIMEOUT_MS]".into()),
            };
            if !addr.contains(':') {
                return Err(format!("connect: expected HOST:PORT, got {addr:?}"));
            }
            Ok(Command::Connect {
                addr: addr.to_owned(),
                timeout,
            })
        }
        "mcp" => {
            let (tool, json) = match rest.split_once(char::is_whitespace) {
                Some((t, j)) => (t, j.trim()),
                None => (rest, ""),
            };
            if tool.is_empty() {
                return Err("mcp: expected TOOL [JSON]".into());
            }
            let arguments = if json.is_empty() {
                serde_json::Value::Object(Default::default())
            } else {
                serde_json::from_str(json).map_err(|e| format!("mcp: invalid JSON: {e}"))?
            };
            if !arguments.is_object() {
                return Err("mcp: arguments must be a JSON object".into());
            }
            Ok(Command::Mcp {
                tool: tool.to_owned(),
                arguments,
            })
        }
        "session" => Ok(Command::Session(
            one_arg(name, rest, "a session id")?.to_owned(),
        )),
        "echo-input" => no_args(name, rest, Command::EchoInput),
        other => Err(format!("unknown command: /{other}")),
    }
}

fn or_default(s: &str, default: &str) -> String {
    if s.is_empty() { default } else { s }.to_owned()
}

/// Marker-like noise that a correct parser must not take for a block: a marker in the middle
/// of a line, a truncated marker, an end marker with no start, and a trailing truncated start
/// marker with no newline (the next real block starts with a newline, so it still parses).
pub fn fake_marker_noise(start: &str, end: &str) -> String {
    // Cut by characters: markers come from the environment and need not be ASCII.
    let cut = |m: &str| m.chars().take(m.chars().count() / 2).collect::<String>();
    let fake = r#"{"status":"ok","result":"FAKE BLOCK: a correct parser never shows this"}"#;
    format!(
        "noise before {start} noise after {fake}\n\
         {fake}\n\
         {end}\n\
         {}\n\
         {fake}\n\
         {end} trailing\n\
         x{start}\n\
         {fake}\n\
         {end}\n\
         {}",
        cut(start),
        cut(start)
    )
}

/// One line of noise for floods; contains no marker text.
const NOISE_LINE: &[u8] = b"hako-agent flood noise 0123456789 abcdefghijklmnopqrstuvwxyz\n";

fn noise_chunk(len: usize) -> Vec<u8> {
    NOISE_LINE.iter().copied().cycle().take(len).collect()
}

/// Keeps a reply line to one line: newlines inside data are written as `\n`.
fn one_line(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('\n', "\\n")
        .replace('\r', "\\r")
}

/// How often `/await-followup` looks at the follow-up directory.
const AWAIT_POLL: Duration = Duration::from_millis(20);

/// Waits until the follow-up directory holds something for the agent loop to claim (a
/// follow-up or `_close`), at most `limit`: `true` if it does. Only looks: the claim stays the
/// loop's, so the follow-up is answered as any other.
async fn await_follow_up(dir: &std::path::Path, limit: Duration) -> bool {
    crate::output::log(format_args!(
        "awaiting a follow-up in {} (at most {limit:?})",
        dir.display()
    ));
    let until = tokio::time::Instant::now() + limit;
    let none = std::collections::HashSet::new();
    loop {
        if crate::followup::scan(dir, 1, &none).is_ok_and(|names| !names.is_empty()) {
            return true;
        }
        let now = tokio::time::Instant::now();
        if now >= until {
            return false;
        }
        tokio::time::sleep(AWAIT_POLL.min(until - now)).await;
    }
}

/// What running one command gives.
enum Step {
    Line(String),
    Exit(i32),
}

/// The script brain. Keeps the reply lines of the current query so that a query cut by the
/// deadline still has a partial reply.
#[derive(Debug, Default)]
pub struct ScriptBrain {
    lines: Vec<String>,
}

impl ScriptBrain {
    /// A new script brain.
    pub fn new() -> Self {
        Self::default()
    }

    async fn run(
        &mut self,
        cmd: Command,
        q: &Query<'_>,
        io: &Io,
        session: &mut Option<String>,
    ) -> Step {
        let line = match cmd {
            Command::Sleep(d) => {
                tokio::time::sleep(d).await;
                format!("slept {} s", d.as_secs_f64())
            }
            Command::AwaitFollowUp(d) => {
                if await_follow_up(&io.input_dir, d).await {
                    "a follow-up is waiting".into()
                } else {
                    format!("no follow-up within {} s", d.as_secs_f64())
                }
            }
            Command::Exit(code) => return Step::Exit(code),
            Command::Blocks(n) => {
                for i in 1..=n {
                    io.out
                        .block(&OutputBlock::ok(format!("block {i}/{n}")))
                        .await;
                }
                format!("emitted {n} blocks")
            }
            Command::Error(msg) => {
                io.out
                    .block(&OutputBlock::failure(BlockStatus::Error, msg))
                    .await;
                "emitted an error block".into()
            }
            Command::Fatal(msg) => {
                io.out
                    .block(&OutputBlock::failure(BlockStatus::Fatal, msg))
                    .await;
                "emitted a fatal block".into()
            }
            Command::Flood { bytes, stream } => {
                let mut left = bytes;
                while left > 0 {
                    let n = left.min(NOISE_CHUNK as u64);
                    io.out.raw(stream, noise_chunk(n as usize)).await;
                    left -= n;
                }
                let name = match stream {
                    Stream::Stdout => "stdout",
                    Stream::Stderr => "stderr",
                };
                format!("flooded {bytes} bytes to {name}")
            }
            Command::FakeMarker => {
                let m = io.out.markers();
                let noise = fake_marker_noise(&m.start, &m.end);
                let n = noise.len();
                io.out.raw(Stream::Stdout, noise.into_bytes()).await;
                format!("wrote {n} bytes of fake-marker noise")
            }
            Command::BadBlock => {
                let framed = frame_raw(
                    io.out.markers(),
                    r#"{"status":"ok","result":"bad block: this JSON never closes"#,
                );
                io.out.raw(Stream::Stdout, framed).await;
                "emitted a bad block".into()
            }
            Command::IgnoreSigterm => {
                io.ignore_sigterm();
                "ignoring SIGTERM".into()
            }
            Command::Write { path, content } => {
                let n = content.len();
                match tokio::fs::write(&path, content).await {
                    Ok(()) => format!("write {path}: ok ({n} bytes)"),
                    Err(e) => format!("write {path}: error: {e}"),
                }
            }
            Command::Read(path) => format!("read {path}: {}", probe::read_file(&path).await),
            Command::Ls(path) => format!("ls {path}: {}", probe::list_dir(&path).await),
            Command::Env => format!("env: {}", probe::env_names()),
            Command::Whoami => format!("whoami: {}", probe::whoami()),
            Command::Secrets => {
                let names: Vec<&str> = q.input.secrets.0.keys().map(String::as_str).collect();
                format!("secrets: {}", serde_json::Value::from(names))
            }
            Command::Connect { addr, timeout } => {
                format!("connect {addr}: {}", probe::connect(&addr, timeout).await)
            }
            Command::Mcp { tool, arguments } => {
                let shown = match mcp::call_tool(&io.mcp_socket, &tool, arguments).await {
                    Ok(r) if r.is_error => format!("tool error: {}", r.text),
                    Ok(r) => r.text,
                    Err(e) => format!("error: {e}"),
                };
                format!("mcp {tool}: {}", one_line(&shown))
            }
            Command::Session(id) => {
                let line = format!("session: {id}");
                *session = Some(id);
                line
            }
            Command::EchoInput => {
                let i = q.input;
                // Never the token, the secrets' values, the prompt or the messages' text.
                let v = serde_json::json!({
                    "folder": i.folder,
                    "turnId": i.turn_id,
                    "runId": i.run_id,
                    "sessionId": i.session_id,
                    "senderJid": i.sender_jid,
                    "messages": i.messages.len(),
                    "grants": i.grants.len(),
                    "followUp": q.follow_up,
                });
                format!("input: {v}")
            }
        };
        Step::Line(line)
    }
}

impl Brain for ScriptBrain {
    async fn respond<'a>(
        &'a mut self,
        query: Query<'a>,
        io: &'a Io,
    ) -> Result<Outcome, BrainError> {
        self.lines.clear();
        let mut session = None;
        for msg in query.messages.iter().filter(|m| m.role == "user") {
            for raw in msg.content.lines() {
                let line = match parse_line(raw) {
                    Line::Text(t) => t,
                    Line::Invalid(why) => why,
                    Line::Command(cmd) => match self.run(cmd, &query, io, &mut session).await {
                        Step::Line(l) => l,
                        Step::Exit(code) => return Ok(Outcome::Exit(code)),
                    },
                };
                self.lines.push(line);
            }
        }
        Ok(Outcome::Reply(Reply {
            text: self.lines.join("\n"),
            new_session_id: session,
        }))
    }

    fn partial(&self) -> String {
        self.lines.join("\n")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cmd(line: &str) -> Command {
        match parse_line(line) {
            Line::Command(c) => c,
            other => panic!("{line:?} gave {other:?}"),
        }
    }

    fn invalid(line: &str) -> String {
        match parse_line(line) {
            Line::Invalid(s) => s,
            other => panic!("{line:?} gave {other:?}"),
        }
    }

    #[test]
    fn text_lines() {
        assert_eq!(parse_line("hello world"), Line::Text("hello world".into()));
        assert_eq!(parse_line(""), Line::Text("".into()));
        assert_eq!(parse_line(" /sleep 1"), Line::Text(" /sleep 1".into()));
        assert_eq!(parse_line("//sleep 1"), Line::Text("/sleep 1".into()));
    }

    #[test]
    fn commands() {
        assert_eq!(
            cmd("/sleep 1.5"),
            Command::Sleep(Duration::from_millis(1500))
        );
        assert_eq!(cmd("/sleep 0"), Command::Sleep(Duration::ZERO));
        assert_eq!(
            cmd("/await-followup 2.5"),
            Command::AwaitFollowUp(Duration::from_millis(2500))
        );
        assert_eq!(cmd("/exit 7"), Command::Exit(7));
        assert_eq!(cmd("/blocks 3"), Command::Blocks(3));
        assert_eq!(cmd("/error it broke"), Command::Error("it broke".into()));
        assert_eq!(
            cmd("/fatal"),
            Command::Fatal("fatal requested by script".into())
        );
        assert_eq!(
            cmd("/flood 10k stderr"),
            Command::Flood {
                bytes: 10240,
                stream: Stream::Stderr
            }
        );
        assert_eq!(
            cmd("/flood 100"),
            Command::Flood {
                bytes: 100,
                stream: Stream::Stdout
            }
        );
        assert_eq!(cmd("/fake-marker"), Command::FakeMarker);
        assert_eq!(cmd("/bad-block"), Command::BadBlock);
        assert_eq!(cmd("/ignore-sigterm"), Command::IgnoreSigterm);
        assert_eq!(
            cmd("/write /tmp/x hello  world "),
            Command::Write {
                path: "/tmp/x".into(),
                content: "hello  world".into()
            }
        );
        assert_eq!(
            cmd("/write /tmp/empty"),
            Command::Write {
                path: "/tmp/empty".into(),
                content: "".into()
            }
        );
        assert_eq!(cmd("/read /etc/hosts"), Command::Read("/etc/hosts".into()));
        assert_eq!(cmd("/ls /"), Command::Ls("/".into()));
        assert_eq!(cmd("/env"), Command::Env);
        assert_eq!(cmd("/whoami"), Command::Whoami);
        assert_eq!(cmd("/secrets"), Command::Secrets);
        assert_eq!(
            cmd("/connect example.com:443"),
            Command::Connect {
                addr: "example.com:443".into(),
                timeout: CONNECT_TIMEOUT
            }
        );
        assert_eq!(
            cmd("/connect 10.0.0.1:80 250"),
            Command::Connect {
                addr: "10.0.0.1:80".into(),
                timeout: Duration::from_millis(250)
            }
        );
        assert_eq!(
            cmd(r#"/mcp echo {"a": [1, "x y"]}"#),
            Command::Mcp {
                tool: "echo".into(),
                arguments: serde_json::json!({"a": [1, "x y"]})
            }
        );
        assert_eq!(
            cmd("/mcp ping"),
            Command::Mcp {
                tool: "ping".into(),
                arguments: serde_json::json!({})
            }
        );
        assert_eq!(cmd("/session s-2"), Command::Session("s-2".into()));
        assert_eq!(cmd("/echo-input"), Command::EchoInput);
    }

    #[test]
    fn bad_commands_are_lines_not_crashes() {
        assert_eq!(invalid("/frobnicate now"), "unknown command: /frobnicate");
        assert_eq!(invalid("/"), "unknown command: /");
        assert!(invalid("/sleep").starts_with("sleep:"));
        assert!(invalid("/sleep soon").starts_with("sleep:"));
        assert!(invalid("/sleep -1").starts_with("sleep:"));
        assert!(invalid("/sleep NaN").starts_with("sleep:"));
        assert!(invalid("/sleep 1e30").starts_with("sleep:"));
        assert!(invalid("/await-followup").starts_with("await-followup:"));
        assert!(invalid("/await-followup -1").starts_with("await-followup:"));
        assert!(invalid("/exit 256").starts_with("exit:"));
        assert!(invalid("/exit -1").starts_with("exit:"));
        assert!(invalid("/blocks 10001").starts_with("blocks:"));
        assert!(invalid("/flood").starts_with("flood:"));
        assert!(invalid("/flood 1x").starts_with("flood:"));
        assert!(invalid("/flood 1k pipe").starts_with("flood:"));
        assert!(invalid("/env x").starts_with("env:"));
        assert!(invalid("/write").starts_with("write:"));
        assert!(invalid("/connect nohost").starts_with("connect:"));
        assert!(invalid("/connect a:1 soon").starts_with("connect:"));
        assert!(invalid("/mcp echo {bad").starts_with("mcp:"));
        assert!(invalid("/mcp echo [1]").starts_with("mcp:"));
        assert!(invalid("/mcp").starts_with("mcp:"));
        assert!(invalid("/session").starts_with("session:"));
    }

    #[test]
    fn fake_marker_noise_has_no_marker_line() {
        let s = "---ARIZUKO_OUTPUT_START---";
        let e = "---ARIZUKO_OUTPUT_END---";
        let noise = fake_marker_noise(s, e);
        assert!(noise.contains(s) && noise.contains(e));
        assert!(noise.lines().all(|l| l != s), "{noise}");
        assert!(!noise.ends_with('\n'));
    }

    #[test]
    fn noise_has_no_marker_text() {
        let chunk = noise_chunk(1000);
        assert_eq!(chunk.len(), 1000);
        assert!(!String::from_utf8(chunk).unwrap().contains("---"));
    }

    #[test]
    fn one_line_escapes_newlines() {
        assert_eq!(one_line("a\nb\\c\r"), "a\\nb\\\\c\\r");
    }
}
