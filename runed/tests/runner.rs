//! The container runner against a real Docker daemon and real `hako-agent` containers,
//! checked from outside: Docker inspect, host files, the returned report.

mod common;

use std::collections::{BTreeMap, HashSet};
use std::os::unix::fs::{MetadataExt, symlink};
use std::path::Path;
use std::time::{Duration, Instant};

use hako_runner::engine::labels;
use hako_runner::{Adoption, CloseWhen, RunEvent, RunnerConfig};
use hako_shared::runs::{ExtraMount, Outcome, RunState, SidecarSpec, Trust};

use common::*;

fn mounts_of(info: &bollard::models::ContainerInspectResponse) -> BTreeMap<String, (String, bool)> {
    info.mounts
        .clone()
        .unwrap_or_default()
        .into_iter()
        .map(|m| {
            (
                m.destination.unwrap_or_default(),
                (m.source.unwrap_or_default(), m.rw.unwrap_or(true)),
            )
        })
        .collect()
}

fn owner_of(p: &Path) -> u32 {
    std::fs::metadata(p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .uid()
}

/// Every security flag and every mount of the table, inspected on the live container, plus
/// what the agent itself sees (uid, capabilities, read-only root, which mounts it can write).
#[tokio::test]
async fn untrusted_container_has_the_security_profile_and_the_mount_table() {
    let rig = Rig::with(|c, tmp| {
        std::fs::create_dir_all(tmp.join("skills/hako")).unwrap();
        std::fs::write(tmp.join("skills/hako/SKILL.md"), "skill").unwrap();
        std::fs::create_dir_all(tmp.join("web")).unwrap();
        c.skills_dir = Some(tmp.join("skills"));
        c.web_dir = Some(tmp.join("web"));
        c.project_dir = Some(tmp.join("skills"));
    })
    .await;
    let d = rig.data();
    let prompt = [
        "/whoami",
        "/write /workspace/w.txt ok",
        "/write /workspace/share/s.txt ok",
        "/write /home/agent/h.txt ok",
        "/write /workspace/media/m.txt ok",
        "/write /tmp/t.txt ok",
        "/write /var/run/pub/arizuko/x.txt ok",
        "/write /workspace/env-dir/e.txt no",
        "/write /skills/k.txt no",
        "/write /workspace/global/g.txt no",
        "/write /workspace/web/x.txt no",
        "/write /etc/x no",
        "/ls /workspace",
    ]
    .join("\n");
    let mut spec = rig.spec("acme/support", &prompt);
    spec.close = CloseWhen::Manual;
    let turn = spec.turn_id.clone();
    let run_id = spec.run_id.clone();
    let mut run = rig.start(spec);
    let id = run.started().await;
    let info = rig.inspect(&id).await;
    let h = info.host_config.clone().unwrap();
    assert_eq!(h.cap_drop, Some(vec!["ALL".to_owned()]));
    assert!(h.cap_add.unwrap_or_default().is_empty());
    assert!(
        h.security_opt
            .unwrap_or_default()
            .iter()
            .any(|o| o.starts_with("no-new-privileges"))
    );
    assert_eq!(h.privileged, Some(false));
    assert_eq!(h.readonly_rootfs, Some(true));
    assert!(h.tmpfs.unwrap_or_default().contains_key("/tmp"));
    assert_eq!(h.memory, Some(1 << 30));
    assert_eq!(h.memory_swap, Some(1 << 30), "no swap on top");
    assert_eq!(h.nano_cpus, Some(2_000_000_000));
    assert_eq!(h.pids_limit, Some(512));
    assert_eq!(h.network_mode.as_deref(), Some("none"));
    assert_eq!(h.init, Some(true));
    assert!(
        h.binds.unwrap_or_default().is_empty(),
        "structured mounts only"
    );
    let cfg = info.config.clone().unwrap();
    assert_eq!(cfg.user.as_deref(), Some("1000:1000"));
    let l = cfg.labels.unwrap();
    assert_eq!(l.get(labels::INSTALL), Some(&rig.install));
    assert_eq!(
        l.get(labels::FOLDER).map(String::as_str),
        Some("acme/support")
    );
    assert_eq!(l.get(labels::RUN), Some(&run_id.to_string()));
    assert_eq!(l.get(labels::TURN).map(String::as_str), turn.as_deref());
    assert_eq!(l.get(labels::ROLE).map(String::as_str), Some("agent"));
    let env = cfg.env.unwrap_or_default();
    let timeout = env
        .iter()
        .find_map(|e| e.strip_prefix("ARIZUKO_QUERY_TIMEOUT_MS="))
        .expect("query timeout passed in");
    assert_eq!(
        timeout, "45000",
        "a 60s ceiling keeps 3/4 for the agent (30s margin at most)"
    );

    let m = mounts_of(&info);
    let p = |rel: &str| d.join(rel).to_string_lossy().into_owned();
    let tmp = rig.tmp.path();
    let expected: BTreeMap<String, (String, bool)> = [
        ("/workspace", p("folders/acme.support/workspace"), true),
        ("/workspace/share", p("shares/acme"), true),
        ("/home/agent", p("folders/acme.support/home"), true),
        ("/var/run/pub/arizuko", p("folders/acme.support/ipc"), false),
        (
            "/workspace/ipc/input",
            p("folders/acme.support/input"),
            true,
        ),
        (
            "/var/run/pub/arizuko/sidecars",
            p("folders/acme.support/sidecars"),
            true,
        ),
        ("/workspace/env-dir", p("folders/acme.support/env"), false),
        (
            "/skills",
            tmp.join("skills").to_string_lossy().into(),
            false,
        ),
        // The same bundle as Claude Code's plugin directory's skills (read-only too).
        (
            "/opt/hako/claude-plugin/skills",
            tmp.join("skills").to_string_lossy().into(),
            false,
        ),
        (
            "/workspace/web",
            tmp.join("web").to_string_lossy().into(),
            false,
        ),
        ("/workspace/global", p("global"), false),
    ]
    .into_iter()
    .map(|(t, s, rw)| (t.to_owned(), (s, rw)))
    .collect();
    assert_eq!(
        m, expected,
        "the mount table, exactly (no project for untrusted)"
    );

    // Directories the agent writes are its own; host-only ones are not.
    for rel in [
        "folders/acme.support/workspace",
        "folders/acme.support/workspace/media",
        "shares/acme",
        "folders/acme.support/home",
        "folders/acme.support/home/.claude",
        "folders/acme.support/input",
        "folders/acme.support/sidecars",
        "folders/acme.support/env/env",
    ] {
        assert_eq!(owner_of(&d.join(rel)), 1000, "{rel}");
    }
    for rel in [
        "folders",
        "folders/acme.support",
        "folders/acme.support/env",
        // routd binds the turn's sockets here: no agent may plant a link where it binds.
        "folders/acme.support/ipc",
        "global",
        "folders/acme.support/logs",
        "shares",
        "trash",
    ] {
        assert_eq!(owner_of(&d.join(rel)), 0, "{rel}");
    }
    let mode = |rel: &str| {
        std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(d.join(rel)).unwrap().permissions(),
        ) & 0o777
    };
    assert_eq!(
        mode("folders/acme.support/env/env"),
        0o600,
        "only the agent reads its env file"
    );

    let (_, reply) = run.block().await;
    rig.runner.close(&run.live).await.unwrap();
    let (r, _) = run.end().await;
    assert_eq!(
        (r.state, r.outcome),
        (RunState::Exited, Outcome::Ok),
        "{r:?}"
    );
    let who: serde_json::Value = serde_json::from_str(
        reply
            .lines()
            .next()
            .unwrap()
            .strip_prefix("whoami: ")
            .unwrap(),
    )
    .unwrap();
    assert_eq!(who["uid"], 1000);
    assert_eq!(who["CapEff"], "0000000000000000");
    assert_eq!(who["CapBnd"], "0000000000000000");
    assert_eq!(who["NoNewPrivs"], "1");
    assert_eq!(who["root_readonly"], true);
    assert_eq!(who["HOME"], "/home/agent");
    assert_eq!(who["cwd"], "/workspace");
    for ok in [
        "/workspace/w.txt",
        "/workspace/share/s.txt",
        "/home/agent/h.txt",
        "/workspace/media/m.txt",
        "/tmp/t.txt",
    ] {
        assert!(
            line(&r, &format!("write {ok}:")).ends_with("ok (2 bytes)"),
            "{ok}: {reply}"
        );
    }
    for ro in [
        // The turn's sockets' directory: routd binds there, so no agent may plant files.
        "/var/run/pub/arizuko/x.txt",
        "/workspace/env-dir/e.txt",
        "/skills/k.txt",
        "/workspace/global/g.txt",
        "/workspace/web/x.txt",
        "/etc/x",
    ] {
        assert!(
            line(&r, &format!("write {ro}:")).contains("error"),
            "{ro}: {reply}"
        );
    }
    assert!(d.join("shares/acme/s.txt").exists());
    assert!(rig.gone(&id).await, "container removed");
    let log = r.log_file.expect("log file");
    assert!(log.starts_with(d.join("folders/acme.support/logs")));
    assert!(
        log.file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with("container-")
    );
}

/// A trusted group gets the project read-only and no global mount; `GH_TOKEN` reaches only
/// trusted groups, and provider keys never reach any.
#[tokio::test]
async fn main_group_mounts_and_env_isolation() {
    let rig = Rig::with(|c, tmp| {
        std::fs::create_dir_all(tmp.join("project")).unwrap();
        c.project_dir = Some(tmp.join("project"));
        c.host_env = BTreeMap::from([
            ("GH_TOKEN".to_owned(), "ghp_trusted_only".to_owned()),
            ("GIT_AUTHOR_NAME".to_owned(), "Ann O'Neil".to_owned()),
            ("ANTHROPIC_API_KEY".to_owned(), "sk-ant-never".to_owned()),
        ]);
    })
    .await;
    let mut spec = rig.spec(
        "main",
        "/write /workspace/project/x no\n/read /workspace/env-dir/env",
    );
    spec.group.trust = Trust::Main;
    spec.group.env_allowlist = vec!["GH_TOKEN".into(), "GIT_AUTHOR_NAME".into()];
    spec.close = CloseWhen::Manual;
    let mut run = rig.start(spec);
    let id = run.started().await;
    let m = mounts_of(&rig.inspect(&id).await);
    assert_eq!(
        m.get("/workspace/project"),
        Some(&(
            rig.tmp
                .path()
                .join("project")
                .to_string_lossy()
                .into_owned(),
            false
        ))
    );
    assert!(!m.contains_key("/workspace/global"));
    run.block().await;
    rig.runner.close(&run.live).await.unwrap();
    let (r, _) = run.end().await;
    assert_eq!(r.outcome, Outcome::Ok, "{r:?}");
    assert!(
        r.log.contains("_close: finishing"),
        "the agent waited for the close: {}",
        r.log
    );
    assert!(line(&r, "write /workspace/project/x").contains("error"));
    let env_line = line(&r, "read /workspace/env-dir/env");
    assert!(
        env_line.contains("GH_TOKEN='ghp_trusted_only'"),
        "{env_line}"
    );
    assert!(
        env_line.contains("GIT_AUTHOR_NAME='Ann O'\\\\''Neil'"),
        "{env_line}"
    );
    assert!(!env_line.contains("ANTHROPIC"));

    // Untrusted: GH_TOKEN refused (terminal, before any container), provider keys too.
    for (folder, name) in [("acme", "GH_TOKEN"), ("acme", "ANTHROPIC_API_KEY")] {
        let mut spec = rig.spec(folder, "hi");
        spec.group.env_allowlist = vec![name.into()];
        let (r, _) = rig.run(spec).await;
        assert_eq!((r.outcome, r.terminal), (Outcome::Error, true), "{name}");
        assert!(r.error.as_deref().unwrap().contains(name), "{:?}", r.error);
        assert!(r.container_id.is_none());
    }
    assert!(rig.containers().await.is_empty());
}

/// A canary secret and token travel only on stdin: never in the container's env or labels,
/// never on disk, never in the run log or its blocks.
#[tokio::test]
async fn secrets_never_leave_stdin() {
    let canary = format!("sk-canary-{}", rand_hex(8));
    let token = format!("tok-canary-{}", rand_hex(8));
    let rig = Rig::new().await;
    let mut spec = rig.spec("acme", "");
    spec.input = input_with_secrets(
        "/env\n/secrets\n/echo-input\n/flood 10k stderr",
        &token,
        &[("ANTHROPIC_API_KEY", &canary)],
    );
    spec.close = CloseWhen::Manual;
    let mut run = rig.start(spec);
    let id = run.started().await;
    let info = rig.inspect(&id).await;
    let dump = serde_json::to_string(&info).unwrap();
    assert!(
        !dump.contains(&canary) && !dump.contains(&token),
        "inspect leaks"
    );
    run.block().await;
    rig.runner.close(&run.live).await.unwrap();
    let (r, _) = run.end().await;
    assert_eq!(r.outcome, Outcome::Ok, "{r:?}");
    assert_eq!(line(&r, "secrets:"), r#"secrets: ["ANTHROPIC_API_KEY"]"#);
    assert!(!line(&r, "env:").contains("ANTHROPIC"));
    let all = format!("{:?}{}", r.blocks, r.log);
    assert!(!all.contains(&canary) && !all.contains(&token));
    // Everything the run left on disk is read, and what must be there was read: the run
    // log, the settings, the env file (a search that read nothing would find nothing).
    let log_file = r.log_file.clone().expect("a run log file");
    for needle in [&canary, &token] {
        let search = files_containing(rig.tmp.path(), needle.as_bytes());
        assert!(search.hits.is_empty(), "secret on disk: {:?}", search.hits);
        for must in ["settings.json", "env", ".claude.json"] {
            assert!(
                search
                    .read
                    .iter()
                    .any(|p| p.file_name().is_some_and(|n| n == must)),
                "{must} not read: {:?}",
                search.read
            );
        }
        assert!(search.read.contains(&log_file), "{:?}", search.read);
        assert!(search.bytes > 0);
    }
    // The search does find what is there.
    let search = files_containing(rig.tmp.path(), r.run_id.as_bytes());
    assert!(search.hits.contains(&log_file), "{:?}", search.hits);
}

/// Blocks arrive as events, in order, while the container still runs.
#[tokio::test]
async fn blocks_stream_in_order_before_the_run_ends() {
    let rig = Rig::new().await;
    let mut run = rig.start(rig.spec("acme", "/blocks 3\n/sleep 3\ndone"));
    run.started().await;
    for i in 0..3 {
        let (index, text) = run.block().await;
        assert_eq!(
            (index, text.as_str()),
            (i, format!("block {}/3", i + 1).as_str())
        );
        assert!(!run.task.is_finished(), "block {i} came only at the end");
    }
    let third = Instant::now();
    let (index, reply) = run.block().await;
    assert_eq!(index, 3);
    assert!(
        reply.starts_with("emitted 3 blocks\nslept 3 s\ndone"),
        "{reply}"
    );
    let (r, _) = run.end().await;
    // The agent slept 3 s after its three blocks: they came that much before the end. (1.4 s
    // is asked for: a loaded machine may hand this test the third block late; a held-back
    // block comes with the end, well under that.)
    assert!(
        third.elapsed() >= Duration::from_millis(1400),
        "blocks were held back"
    );
    assert_eq!(results(&r).len(), 4);
    assert_eq!(
        (r.state, r.outcome, r.exit_code),
        (RunState::Exited, Outcome::Ok, Some(0))
    );
}

/// 100 MB of stdout noise with fake markers in it: the runner's memory stays bounded and
/// only real blocks come out.
#[tokio::test]
async fn hundred_megabytes_of_noise_keep_memory_bounded() {
    let rig = Rig::new().await;
    let watch = MemWatch::start();
    let (r, _) = rig
        .run(rig.spec(
            "acme",
            "/flood 50m stdout\n/fake-marker\n/flood 50m stdout\n/flood 2m stderr\n/fake-marker\nend",
        ))
        .await;
    let (grown, kept) = watch.growth();
    eprintln!("runner memory over 100 MB of noise: peak +{grown} KiB, after +{kept} KiB");
    assert_eq!(r.outcome, Outcome::Ok, "{r:?}");
    assert_eq!(
        r.blocks.len(),
        1,
        "fake markers made blocks: {:?}",
        r.blocks
    );
    assert!(line(&r, "end").len() == 3);
    assert!(!format!("{:?}", r.blocks).contains("FAKE BLOCK"));
    let noise: u64 = r
        .log
        .lines()
        .find_map(|l| l.strip_prefix("stdout_noise_bytes: "))
        .unwrap()
        .parse()
        .unwrap();
    assert!(noise >= 100_000_000, "{noise}");
    assert!(r.log.len() < 100 << 10, "log bounded: {}", r.log.len());
    assert!(
        grown < 16 * 1024,
        "runner memory peaked {grown} KiB above its start"
    );
    assert!(
        kept < 16 * 1024,
        "runner memory kept {kept} KiB after the run"
    );
}

/// Invalid JSON between markers is logged and skipped; the run goes on.
#[tokio::test]
async fn invalid_json_between_markers_is_skipped() {
    let rig = Rig::new().await;
    let (r, _) = rig
        .run(rig.spec("acme", "/bad-block\n/blocks 1\nafter"))
        .await;
    assert_eq!(r.outcome, Outcome::Ok, "{r:?}");
    assert_eq!(results(&r)[0], "block 1/1");
    assert!(results(&r)[1].ends_with("after"));
    assert!(
        r.log
            .contains("invalid_output: block is not a valid output JSON"),
        "{}",
        r.log
    );
    assert!(
        !r.log.contains("this JSON never closes"),
        "content never logged"
    );
}

/// An image whose process never answers and ignores its query deadline: the ceiling stops it.
#[tokio::test]
async fn timeout_without_output() {
    let rig = Rig::with(|c, _| {
        c.run_timeout = Duration::from_secs(2);
        c.stop_grace = Duration::from_secs(1);
    })
    .await;
    let mute = derived_image(
        &rig.docker,
        &rig.image,
        "mute",
        r#"ENTRYPOINT ["/usr/local/bin/hako-agent", "serve-mcp", "--socket", "/tmp/mute.sock"]"#,
    )
    .await;
    let mut spec = rig.spec("acme", "hello");
    spec.group.image = Some(mute);
    let t0 = Instant::now();
    let (r, _) = rig.run(spec).await;
    let took = t0.elapsed();
    assert_eq!(
        (r.state, r.outcome, r.terminal),
        (RunState::TimedOut, Outcome::TimedOut, false),
        "{r:?}"
    );
    assert!(
        // The upper bound is loose: a loaded machine's container start and removal count.
        took >= Duration::from_secs(2) && took < Duration::from_secs(15),
        "{took:?}"
    );
    assert!(rig.gone(r.container_id.as_deref().unwrap()).await);
}

/// The ceiling hits after an `ok` block (the agent is frozen, so its own deadline cannot
/// save it): a success, and the frozen container is still stopped, killed and removed.
#[tokio::test]
async fn timeout_after_output_is_a_success() {
    // The ceiling counts from before the launch: 8 s leaves room for a slow container start
    // before the first block.
    let rig = Rig::with(|c, _| {
        c.run_timeout = Duration::from_secs(8);
        c.stop_grace = Duration::from_secs(1);
    })
    .await;
    let mut spec = rig.spec("acme", "/blocks 1\n/sleep 3600");
    spec.close = CloseWhen::Manual;
    let mut run = rig.start(spec);
    let id = run.started().await;
    assert_eq!(run.block().await.1, "block 1/1");
    rig.docker.pause_container(&id).await.unwrap();
    let (r, _) = run.end().await;
    assert_eq!(
        (r.state, r.outcome, r.terminal),
        (RunState::TimedOut, Outcome::Ok, false),
        "{r:?}"
    );
    assert!(rig.gone(&id).await);
}

/// A kill mid-run is its own outcome, quick when the agent honours SIGTERM.
#[tokio::test]
async fn kill_mid_run() {
    let rig = Rig::with(|c, _| c.kill_grace = Duration::from_secs(6)).await;
    let mut run = rig.start(rig.spec("acme", "/blocks 1\n/sleep 3600"));
    let id = run.started().await;
    run.block().await;
    let t0 = Instant::now();
    run.control.kill.cancel();
    let (r, _) = run.end().await;
    assert!(
        t0.elapsed() < Duration::from_secs(4),
        "waited for the grace: {:?}",
        t0.elapsed()
    );
    assert_eq!(r.exit_code, Some(0), "the agent stopped on SIGTERM");
    assert_eq!(
        (r.state, r.outcome, r.terminal),
        (RunState::Killed, Outcome::Killed, true),
        "{r:?}"
    );
    assert!(rig.gone(&id).await);
    assert!(rig.containers().await.is_empty());
}

/// An agent that ignores SIGTERM is killed once the grace period is over.
#[tokio::test]
async fn sigterm_ignored_kill_follows_the_grace() {
    let rig = Rig::new().await;
    let mut run = rig.start(rig.spec("acme", "/ignore-sigterm\n/blocks 1\n/sleep 3600"));
    let id = run.started().await;
    run.block().await;
    let t0 = Instant::now();
    run.control.kill.cancel();
    let (r, _) = run.end().await;
    let took = t0.elapsed();
    assert!(
        took >= Duration::from_secs(2) && took < Duration::from_secs(10),
        "kill after the 2s grace, took {took:?}"
    );
    assert_eq!((r.state, r.outcome), (RunState::Killed, Outcome::Killed));
    assert_eq!(r.exit_code, Some(137), "SIGKILL");
    assert!(rig.gone(&id).await);
}

/// Exit codes and block statuses decide the outcome; 125-127 are terminal.
#[tokio::test]
async fn exit_codes_decide_the_outcome() {
    let rig = Rig::new().await;
    let cases: &[(&str, Outcome, bool, Option<i64>)] = &[
        ("/exit 0", Outcome::Fatal, false, Some(0)),
        ("/exit 3", Outcome::Fatal, false, Some(3)),
        ("/fatal boom\n/exit 1", Outcome::Fatal, false, Some(1)),
        ("/error oops\n/exit 2", Outcome::Error, false, Some(2)),
        ("/blocks 1\n/exit 9", Outcome::Ok, false, Some(9)),
        ("/exit 125", Outcome::Error, true, Some(125)),
        ("/exit 126", Outcome::Error, true, Some(126)),
        ("/exit 127", Outcome::Error, true, Some(127)),
    ];
    let runs: Vec<_> = cases
        .iter()
        .enumerate()
        .map(|(i, (p, ..))| rig.start(rig.spec(&format!("g{i}"), p)))
        .collect();
    for (run, (prompt, outcome, terminal, code)) in runs.into_iter().zip(cases) {
        let (r, _) = run.end().await;
        assert_eq!(
            (r.outcome, r.terminal, r.exit_code),
            (*outcome, *terminal, *code),
            "{prompt}: {r:?}"
        );
        if *terminal {
            assert!(
                r.error.as_deref().unwrap().contains("terminal"),
                "{:?}",
                r.error
            );
        }
        assert!(rig.gone(r.container_id.as_deref().unwrap()).await);
    }
}

/// A missing image and an image whose entrypoint cannot run are terminal errors, said so.
#[tokio::test]
async fn missing_image_and_broken_entrypoint_are_terminal() {
    let rig = Rig::new().await;
    let mut spec = rig.spec("acme", "hi");
    let missing = format!("hako-missing-{}:nope", rand_hex(4));
    spec.group.image = Some(missing.clone());
    let (r, _) = rig.run(spec).await;
    assert_eq!(
        (r.state, r.outcome, r.terminal),
        (RunState::Error, Outcome::Error, true)
    );
    let e = r.error.unwrap();
    assert!(e.contains(&missing) && e.contains("not found"), "{e}");
    assert!(r.log.contains(&missing));

    let broken = derived_image(
        &rig.docker,
        &rig.image,
        "broken",
        r#"ENTRYPOINT ["/no/such/binary"]"#,
    )
    .await;
    let mut spec = rig.spec("acme", "hi");
    spec.group.image = Some(broken);
    let (r, _) = rig.run(spec).await;
    assert_eq!((r.outcome, r.terminal), (Outcome::Error, true), "{r:?}");
    assert!(rig.containers().await.is_empty(), "nothing left behind");
}

/// Sidecars start before the agent, are reachable through their socket, get the security
/// profile, and are removed after the agent exits, also when it crashes.
#[tokio::test]
async fn sidecar_lives_exactly_as_long_as_the_agent() {
    let rig = Rig::new().await;
    for (prompt, outcome) in [
        (
            "/ls /var/run/pub/arizuko/sidecars\n/read /home/agent/.claude/settings.json",
            Outcome::Ok,
        ),
        ("/exit 139", Outcome::Fatal),
    ] {
        let mut spec = rig.spec("acme", prompt);
        spec.close = CloseWhen::Manual;
        spec.group.sidecars = vec![SidecarSpec {
            name: "echo".into(),
            image: rig.image.clone(),
            command: vec!["serve-mcp".into(), "--socket".into(), "{socket}".into()],
            memory: None,
            cpus: None,
        }];
        let mut run = rig.start(spec);
        run.started().await;
        let list = rig.containers().await;
        let sc = list
            .iter()
            .find(|c| {
                c.labels
                    .as_ref()
                    .and_then(|l| l.get(labels::ROLE))
                    .map(String::as_str)
                    == Some("sidecar")
            })
            .expect("sidecar running during the run");
        let sc_id = sc.id.clone().unwrap();
        let h = rig.inspect(&sc_id).await.host_config.unwrap();
        assert_eq!(h.cap_drop, Some(vec!["ALL".to_owned()]));
        assert_eq!(h.readonly_rootfs, Some(true));
        assert_eq!(h.memory, Some(256 << 20));
        assert_eq!(h.network_mode.as_deref(), Some("none"));
        let sock = rig.data().join("folders/acme/sidecars/echo.sock");
        if outcome == Outcome::Ok {
            // Speak MCP to it from the host through the socket the agent sees.
            use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
            let s = tokio::net::UnixStream::connect(&sock)
                .await
                .expect("socket");
            let (rd, mut wr) = s.into_split();
            wr.write_all(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\",\"params\":{\"name\":\"echo\",\"arguments\":{\"x\":1}}}\n").await.unwrap();
            let mut resp = String::new();
            BufReader::new(rd).read_line(&mut resp).await.unwrap();
            assert!(
                resp.contains("\\\"x\\\":1") || resp.contains("\"x\":1"),
                "{resp}"
            );
            let (_, reply) = run.block().await;
            assert!(reply.contains(r#"["echo.sock"]"#), "{reply}");
            assert!(
                reply.contains("UNIX-CONNECT:/var/run/pub/arizuko/sidecars/echo.sock"),
                "{reply}"
            );
            rig.runner.close(&run.live).await.unwrap();
        }
        let (r, _) = run.end().await;
        assert_eq!(r.outcome, outcome, "{prompt}: {r:?}");
        assert!(rig.gone(&sc_id).await, "sidecar removed after {prompt}");
        assert!(rig.containers().await.is_empty());
    }
}

/// Orphan cleanup removes this install's containers that have no live run, spares live ones,
/// and never touches another install's.
#[tokio::test]
async fn orphan_cleanup_spares_live_runs_and_other_installs() {
    let a = Rig::new().await;
    let b = Rig::new().await;
    let mut ids = Vec::new();
    let mut run_ids = Vec::new();
    for (rig, folder) in [(&a, "one"), (&a, "two"), (&b, "one")] {
        let spec = rig.spec(folder, "/sleep 3600");
        run_ids.push(spec.run_id.clone());
        let mut run = rig.start(spec);
        ids.push(run.started().await);
        run.control.detach.cancel();
        let end = run.task.await.unwrap();
        assert!(end.report().is_none(), "detached");
    }
    let mut agents: Vec<_> = a
        .runner
        .list_agents()
        .await
        .unwrap()
        .into_iter()
        .map(|c| c.id)
        .collect();
    agents.sort();
    let mut mine = vec![ids[0].clone(), ids[1].clone()];
    mine.sort();
    assert_eq!(agents, mine, "this install's agents, for re-adoption");
    let live = HashSet::from([run_ids[1].to_string()]);
    assert_eq!(a.runner.cleanup_orphans(&live).await.unwrap(), 1);
    assert!(a.gone(&ids[0]).await, "orphan removed");
    assert!(!a.gone(&ids[1]).await, "live run spared");
    assert!(!b.gone(&ids[2]).await, "another install spared");
    assert_eq!(a.runner.cleanup_orphans(&HashSet::new()).await.unwrap(), 1);
    assert!(!b.gone(&ids[2]).await);
    assert_eq!(b.runner.cleanup_orphans(&HashSet::new()).await.unwrap(), 1);
    assert!(b.gone(&ids[2]).await);
}

/// A detached run is re-adopted: blocks already recorded are not sent again, later ones are,
/// and the run finishes normally.
#[tokio::test]
async fn detached_run_is_readopted() {
    let rig = Rig::new().await;
    let spec = rig.spec("acme", "/blocks 2\n/sleep 2\nreply");
    let (run_id, folder) = (spec.run_id.clone(), spec.folder.clone());
    let mut run = rig.start(spec);
    let id = run.started().await;
    let prior: Vec<_> = [run.block().await, run.block().await]
        .into_iter()
        .map(|(_, text)| hako_shared::contract::OutputBlock {
            status: hako_shared::contract::BlockStatus::Ok,
            result: Some(text),
            new_session_id: None,
            error: None,
        })
        .collect();
    run.control.detach.cancel();
    assert!(run.task.await.unwrap().report().is_none());
    assert!(!rig.gone(&id).await, "detach leaves the container running");
    let (tx, mut rx) = tokio::sync::mpsc::channel(16);
    let live = hako_runner::LiveRun::new(run_id.clone(), folder.clone());
    let end = tokio::time::timeout(
        RUN_LIMIT,
        rig.runner.adopt(
            Adoption {
                container_id: id.clone(),
                run_id,
                folder,
                prior,
                close: CloseWhen::Idle(Duration::ZERO),
                deadline_ms: None,
            },
            tx,
            Default::default(),
            live,
        ),
    )
    .await
    .unwrap();
    let r = end.report().unwrap();
    assert_eq!(r.outcome, Outcome::Ok, "{r:?}");
    assert_eq!(results(&r).len(), 3);
    let mut sent = Vec::new();
    while let Ok(RunEvent::Block { index, .. }) = rx.try_recv() {
        sent.push(index);
    }
    assert_eq!(sent, vec![2], "only the new block is sent");
    assert!(
        !rig.gone(&id).await,
        "kept until the caller has recorded the end"
    );
    assert!(rig.runner.remove_containers(&r).await.is_empty());
    assert!(rig.gone(&id).await);
}

/// Extra mounts against the allowlist: each rejection fails the run naming the mount, before
/// any container; an accepted write request of an untrusted group is forced read-only.
#[tokio::test]
async fn mount_allowlist_on_real_runs() {
    let rig = Rig::with(|c, tmp| {
        for d in [
            "projects/app",
            "projects/.ssh",
            "projects/private-stuff",
            "elsewhere",
            "outside",
        ] {
            std::fs::create_dir_all(tmp.join(d)).unwrap();
        }
        symlink(tmp.join("outside"), tmp.join("projects/escape")).unwrap();
        let allow = serde_json::json!({
            "allowedRoots": [{"path": tmp.join("projects"), "allowReadWrite": true}],
            "blockedPatterns": ["private"],
            "nonMainReadOnly": true
        });
        let p = tmp.join("allowlist.json");
        std::fs::write(&p, allow.to_string()).unwrap();
        c.allowlist = Some(
            hako_runner::mountsec::Allowlist::load(&p, &[c.layout.data_dir.as_path()]).unwrap(),
        );
    })
    .await;
    let t = rig.tmp.path();
    let mount = |host: &Path, name: &str, readonly: bool| ExtraMount {
        host_path: host.to_string_lossy().into_owned(),
        container_path: name.into(),
        readonly,
    };
    let rejected = [
        (
            mount(&t.join("projects/escape"), "esc", true),
            "outside every allowed root",
        ),
        (mount(&t.join("projects/.ssh"), "keys", true), "blocked"),
        (
            mount(&t.join("projects/private-stuff"), "p", true),
            "blocked",
        ),
        (
            ExtraMount {
                host_path: format!("{}:/etc", t.join("projects/app").display()),
                container_path: "inj".into(),
                readonly: true,
            },
            "':'",
        ),
        (
            mount(&t.join("elsewhere"), "else", true),
            "outside every allowed root",
        ),
        (mount(&t.join("projects/../outside"), "dots", true), "'..'"),
    ];
    for (m, why) in rejected {
        let mut spec = rig.spec("acme", "hi");
        let name = m.container_path.clone();
        spec.group.mounts = vec![m];
        let (r, _) = rig.run(spec).await;
        let e = r.error.clone().unwrap_or_default();
        assert_eq!(
            (r.outcome, r.terminal),
            (Outcome::Error, true),
            "{name}: {r:?}"
        );
        assert!(
            e.contains(&format!("{name:?}")) && e.contains(why),
            "{name}: {e}"
        );
        assert!(r.container_id.is_none());
    }

    // Untrusted + write requested: forced read-only, really.
    let mut spec = rig.spec("acme", "/write /workspace/extra/app/x.txt no");
    spec.group.mounts = vec![mount(&t.join("projects/app"), "app", false)];
    spec.close = CloseWhen::Manual;
    let mut run = rig.start(spec);
    let id = run.started().await;
    let m = mounts_of(&rig.inspect(&id).await);
    assert_eq!(
        m.get("/workspace/extra/app"),
        Some(&(t.join("projects/app").to_string_lossy().into_owned(), false))
    );
    run.block().await;
    rig.runner.close(&run.live).await.unwrap();
    let (r, _) = run.end().await;
    assert!(
        line(&r, "write /workspace/extra/app/x.txt").contains("error"),
        "{r:?}"
    );
    assert!(!t.join("projects/app/x.txt").exists());

    // Main + write requested under a read-write root: writable (the operator made the
    // directory the agent user's).
    std::os::unix::fs::chown(t.join("projects/app"), Some(1000), Some(1000)).unwrap();
    let mut spec = rig.spec("main", "/write /workspace/extra/app/y.txt yes");
    spec.group.trust = Trust::Main;
    spec.group.mounts = vec![mount(&t.join("projects/app"), "app", false)];
    let (r, _) = rig.run(spec).await;
    assert!(
        line(&r, "write /workspace/extra/app/y.txt").ends_with("ok (3 bytes)"),
        "{r:?}"
    );
    assert_eq!(
        std::fs::read_to_string(t.join("projects/app/y.txt")).unwrap(),
        "yes"
    );
}

/// Symlinks planted in the session's `.claude/` (and in the logs dir) are never followed by
/// the host: targets outside stay untouched and the group keeps working.
#[tokio::test]
async fn seeding_never_follows_planted_symlinks() {
    let rig = Rig::with(|c, tmp| {
        std::fs::create_dir_all(tmp.join("bundle/hako")).unwrap();
        std::fs::write(tmp.join("bundle/hako/SKILL.md"), "skill").unwrap();
        std::fs::write(tmp.join("bundle/MIGRATION_VERSION"), "1\n").unwrap();
        c.skills_dir = Some(tmp.join("bundle"));
    })
    .await;
    let t = rig.tmp.path();
    let victim = t.join("victim");
    std::fs::create_dir_all(&victim).unwrap();
    std::fs::write(victim.join("keep.txt"), "original").unwrap();
    // A first run seeds everything; then the "agent" plants symlinks everywhere the host
    // writes before a run.
    let (r, _) = rig.run(rig.spec("acme", "hi")).await;
    assert_eq!(r.outcome, Outcome::Ok, "{r:?}");
    let claude = rig.data().join("folders/acme/home/.claude");
    assert!(claude.join("skills/hako/SKILL.md").exists());
    std::fs::remove_file(claude.join("settings.json")).unwrap();
    symlink(victim.join("keep.txt"), claude.join("settings.json")).unwrap();
    std::fs::remove_dir_all(claude.join("skills")).unwrap();
    symlink(&victim, claude.join("skills")).unwrap();
    std::fs::remove_file(rig.data().join("folders/acme/home/.claude.json")).unwrap();
    symlink(
        victim.join("claude.json"),
        rig.data().join("folders/acme/home/.claude.json"),
    )
    .unwrap();
    let logs = rig.data().join("folders/acme/logs");
    std::fs::remove_dir_all(&logs).unwrap();
    symlink(&victim, &logs).unwrap();

    let (r, _) = rig
        .run(rig.spec("acme", "/read /home/agent/.claude/settings.json"))
        .await;
    assert_eq!(r.outcome, Outcome::Ok, "{r:?}");
    assert!(line(&r, "read /home/agent/.claude/settings.json").contains("mcpServers"));
    let names: Vec<_> = std::fs::read_dir(&victim)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, vec!["keep.txt"], "nothing written into the target");
    assert_eq!(
        std::fs::read_to_string(victim.join("keep.txt")).unwrap(),
        "original"
    );
    assert!(
        claude
            .join("settings.json")
            .symlink_metadata()
            .unwrap()
            .is_file()
    );
    assert!(claude.join("skills").symlink_metadata().unwrap().is_dir());
    assert!(claude.join("skills/hako/SKILL.md").exists(), "reseeded");
    assert!(
        r.log_file
            .is_some_and(|p| p.starts_with(&logs) && !p.starts_with(&victim))
    );
}

/// Docker-in-Docker: with `HOST_DATA_DIR` set, bind sources are the host's paths. Here the
/// "host" path is the real directory behind a symlinked local data dir.
#[tokio::test]
async fn host_data_dir_translates_bind_sources() {
    let rig = Rig::with(|c, tmp| {
        std::fs::create_dir_all(tmp.join("host-data")).unwrap();
        symlink(tmp.join("host-data"), tmp.join("local-data")).unwrap();
        c.layout.data_dir = tmp.join("local-data");
        c.layout.host_data_dir = Some(tmp.join("host-data"));
    })
    .await;
    let mut spec = rig.spec("acme", "hi");
    spec.close = CloseWhen::Manual;
    let mut run = rig.start(spec);
    let id = run.started().await;
    let m = mounts_of(&rig.inspect(&id).await);
    let host = rig.tmp.path().join("host-data");
    for (target, (source, _)) in &m {
        assert!(Path::new(source).starts_with(&host), "{target} <- {source}");
    }
    assert_eq!(
        m["/workspace"].0,
        host.join("folders/acme/workspace").to_string_lossy()
    );
    run.block().await;
    rig.runner.close(&run.live).await.unwrap();
    assert_eq!(run.end().await.0.outcome, Outcome::Ok);
}

/// EnsureRunning names the socket when the daemon does not answer.
#[tokio::test]
async fn ensure_running_names_the_socket() {
    let rig = Rig::new().await;
    assert!(rig.runner.ensure_running().await.unwrap().starts_with('1'));
    // A socket file nobody listens on.
    let dead = rig.tmp.path().join("no-docker.sock");
    drop(std::os::unix::net::UnixListener::bind(&dead).unwrap());
    let docker = hako_runner::docker::DockerEngine::connect(&dead.to_string_lossy()).unwrap();
    let mut cfg = RunnerConfig::new(rig.tmp.path().join("d2"));
    cfg.docker_socket = dead.to_string_lossy().into_owned();
    let runner = hako_runner::Runner::on_docker(docker, cfg).unwrap();
    let e = runner.ensure_running().await.unwrap_err().to_string();
    assert!(
        e.contains("unavailable") && e.contains("no-docker.sock"),
        "{e}"
    );
    assert!(e.contains("refused"), "the cause is named: {e}");
}

/// Stored output is capped per run and flagged truncated: once the cap is reached, later
/// blocks are counted, neither kept nor sent; the outcome still follows the last of them.
#[tokio::test]
async fn stored_output_is_capped_and_flagged() {
    let rig = Rig::with(|c, _| c.output_cap = 1000).await;
    let (r, events) = rig.run(rig.spec("acme", "/blocks 200")).await;
    assert_eq!(r.outcome, Outcome::Ok, "{r:?}");
    assert!(r.truncated);
    let stored: usize = r
        .blocks
        .iter()
        .filter_map(|b| b.result.as_ref())
        .map(String::len)
        .sum();
    assert_eq!(stored, 1000, "filled to the cap exactly");
    let kept = r.blocks.len();
    assert!(kept < 201, "{kept}");
    let dropped: usize = r
        .log
        .lines()
        .find_map(|l| l.split("dropped_at_cap: ").nth(1))
        .and_then(|n| n.trim().parse().ok())
        .expect("the log counts dropped blocks");
    assert_eq!(kept + dropped, 201, "every block counted: {}", r.log);
    let sent = events
        .iter()
        .filter(|e| matches!(e, RunEvent::Block { .. }))
        .count();
    assert!(
        sent <= kept,
        "nothing past the cap is sent ({sent} > {kept})"
    );
    assert!(r.log.contains("truncated: true"));
}

/// A follow-up steered into a live run is taken exactly once and answered; after the run
/// ends, steering is refused and no file is left behind.
#[tokio::test]
async fn steer_is_delivered_exactly_once() {
    let rig = Rig::new().await;
    let mut spec = rig.spec("acme", "first");
    spec.close = CloseWhen::Manual;
    let mut run = rig.start(spec);
    run.started().await;
    assert_eq!(run.block().await.1, "first");
    let rep = rig
        .runner
        .steer(&run.live, &["second".into()])
        .await
        .unwrap();
    assert!(rep.delivered, "{rep:?}");
    assert_eq!(run.block().await, (1, "second".to_owned()));
    rig.runner.close(&run.live).await.unwrap();
    let live = run.live.clone();
    let (r, _) = run.end().await;
    assert_eq!(results(&r), vec!["first", "second"]);
    assert!(rig.runner.steer(&live, &["late".into()]).await.is_err());
    let input = rig.data().join("folders/acme/input");
    let left: Vec<_> = std::fs::read_dir(&input)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(left.iter().all(|n| n == "_close"), "{left:?}");
}

/// A group's limits and network policy reach the container; `allowlist` fails closed while
/// there is no egress proxy.
#[tokio::test]
async fn group_overrides_reach_the_container() {
    use hako_shared::runs::{ByteSize, HumanDuration, Network};
    let rig = Rig::new().await;
    let mut spec = rig.spec("acme", "hi");
    spec.close = CloseWhen::Manual;
    spec.group.memory = Some(ByteSize(256 << 20));
    spec.group.cpus = Some(0.5);
    spec.group.pids = Some(64);
    spec.group.network = Network::Open;
    spec.group.timeout = Some(HumanDuration(Duration::from_secs(8)));
    let mut run = rig.start(spec);
    let id = run.started().await;
    let info = rig.inspect(&id).await;
    let h = info.host_config.unwrap();
    assert_eq!(
        (h.memory, h.nano_cpus, h.pids_limit),
        (Some(256 << 20), Some(500_000_000), Some(64))
    );
    assert_eq!(h.network_mode.as_deref(), Some("bridge"));
    let env = info.config.unwrap().env.unwrap_or_default();
    assert!(
        env.contains(&"ARIZUKO_QUERY_TIMEOUT_MS=6000".to_owned()),
        "the group's shorter ceiling sets the agent's deadline: {env:?}"
    );
    run.block().await;
    rig.runner.close(&run.live).await.unwrap();
    assert_eq!(run.end().await.0.outcome, Outcome::Ok);

    let mut spec = rig.spec("acme", "hi");
    spec.group.network = Network::Allowlist;
    let (r, _) = rig.run(spec).await;
    assert_eq!((r.outcome, r.terminal), (Outcome::Error, true));
    assert!(r.error.unwrap().contains("egress proxy"));
    assert!(r.container_id.is_none());
}
