//! `hako chat` end to end: the real binary, a temp data dir, real containers.

use std::io::Write;
use std::process::{Command, Output, Stdio};

fn hako(data: &std::path::Path, image: &str, args: &[&str], stdin: &str) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_hako"))
        .args(args)
        .env("DATA_DIR", data)
        .env("CONTAINER_IMAGE", image)
        .env(
            "HAKO_INSTALL_ID",
            format!("cli-test-{}", std::process::id()),
        )
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn hako");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(stdin.as_bytes())
        .expect("write stdin");
    child.wait_with_output().expect("hako runs")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[tokio::test]
async fn each_line_is_one_turn_and_the_session_carries_over() {
    let image = hako_deploy::ensure_agent_image().await.expect("image");
    let data = tempfile::tempdir().expect("tempdir");
    let out = hako(
        data.path(),
        &image,
        &["chat", "team/dev"],
        "hello\n\n/session s-42\n/echo-input\n",
    );
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines[0], "hello");
    assert_eq!(lines[1], "session: s-42");
    // The third turn's container got the session the second one announced.
    assert!(lines[2].contains(r#""sessionId":"s-42""#), "{stdout}");
    assert!(lines[2].contains(r#""folder":"team/dev""#), "{stdout}");
    // Three turns, three containers, three run logs.
    let logs = std::fs::read_dir(data.path().join("folders/team.dev/logs"))
        .expect("logs dir")
        .count();
    assert_eq!(logs, 3);
}

#[tokio::test]
async fn a_failed_turn_is_reported_and_sets_the_exit_code() {
    let image = hako_deploy::ensure_agent_image().await.expect("image");
    let data = tempfile::tempdir().expect("tempdir");
    let out = hako(
        data.path(),
        &image,
        &["chat", "demo", "--message", "/fatal boom\n/exit 1"],
        "",
    );
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("agent fatal: boom"), "{stderr}");
    assert!(stderr.contains("the turn failed"), "{stderr}");
}

#[test]
fn a_bad_folder_or_setting_says_what_to_fix() {
    let data = tempfile::tempdir().expect("tempdir");
    let out = hako(data.path(), "unused", &["chat", "../etc"], "");
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("is not a valid group folder"),
        "{}",
        text(&out.stderr)
    );
    let out = Command::new(env!("CARGO_BIN_EXE_hako"))
        .args(["chat", "demo", "--message", "hi"])
        .env("DATA_DIR", data.path())
        .env("RUNED_RUN_TIMEOUT", "soon")
        .output()
        .expect("hako runs");
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("RUNED_RUN_TIMEOUT"),
        "{}",
        text(&out.stderr)
    );
}
