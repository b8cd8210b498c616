//! Tenant isolation of the execution plane, attacked the way a hostile tenant would: a
//! hostile agent image (`tests/fixtures/hostile.rs`) racing Docker with symlink swaps,
//! planting trees, sockets and files where the host looks, against real containers on the
//! real Docker daemon. Each test reproduces an attack the nested data layout lost to.

mod common;

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use hako_runner::{CloseWhen, RunEvent};
use hako_shared::runs::{Outcome, RunState, SidecarSpec, Trust};

use common::*;

const CANARY: &str = "victim-canary-7f3a";
const HOST_SECRET: &str = "host-secret-91bd";

/// The results of every block of a report, one string.
fn all_text(r: &hako_runner::RunReport) -> String {
    r.blocks
        .iter()
        .map(|b| {
            format!(
                "{} {} {}",
                b.result.as_deref().unwrap_or(""),
                b.error.as_deref().unwrap_or(""),
                b.new_session_id.as_deref().unwrap_or("")
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Item 1 of the isolation issue. A parent folder's agent keeps exchanging every name its
/// sub-folders' storage had under its own writable mounts with symlinks to another tenant's
/// workspace and to a root-owned host directory, while its sub-folders run 100 times. No
/// sub-folder run may ever see the victim's or the host's files, or write there.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_racing_parent_never_redirects_its_childrens_mounts() {
    let rig = Rig::with(|c, _| c.run_timeout = Duration::from_secs(600)).await;
    let hostile = hostile_image(&rig.docker).await;
    let t = rig.tmp.path().to_owned();
    // The victim: another tenant with a canary in its workspace.
    let (r, _) = rig
        .run(rig.spec("victim", &format!("/write /workspace/canary.txt {CANARY}")))
        .await;
    assert_eq!(r.outcome, Outcome::Ok, "{r:?}");
    let victim_ws = rig.data().join("folders/victim/workspace");
    assert!(victim_ws.join("canary.txt").exists());
    // A root-owned host directory outside the data dir, readable by anyone.
    let secret = t.join("host-secret");
    std::fs::create_dir(&secret).unwrap();
    std::fs::write(secret.join("canary.txt"), HOST_SECRET).unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o755)).unwrap();

    let children = ["b", "c", "d", "e"];
    let targets = format!("{},{}", victim_ws.display(), secret.display());
    let mut parent_spec = rig.spec("a", &format!("swap 590 {targets} {}", children.join(",")));
    parent_spec.group.image = Some(hostile.clone());
    // Half a CPU is plenty to race; the rest of the machine runs the children.
    parent_spec.group.cpus = Some(0.5);
    parent_spec.close = CloseWhen::Manual;
    let mut parent = rig.start(parent_spec);
    parent.started().await;
    let (_, first) = parent.block().await;
    assert_eq!(first, "swapping");

    // 100 runs in all: at 200 this was the suite's costliest test (89 CPU-seconds alone on two
    // cores); every run is its own try at the race, and the swapper's pace is checked below.
    let runs_each = 25;
    let mut tasks = Vec::new();
    for child in children {
        let runner = rig.runner.clone();
        let mut specs = Vec::new();
        for i in 0..runs_each {
            let prompt = format!(
                "/read /workspace/canary.txt\n/read /home/agent/canary.txt\n/read /var/run/pub/arizuko/canary.txt\n/ls /workspace\n/write /workspace/mark-{child}-{i}.txt x\n/write /home/agent/mark-{child}-{i}.txt x"
            );
            let mut spec = rig.spec(&format!("a/{child}"), &prompt);
            // A child whose mounts were redirected may never see its `_close`: bounded.
            spec.group.timeout = Some(hako_shared::runs::HumanDuration(Duration::from_secs(20)));
            specs.push(spec);
        }
        tasks.push(tokio::spawn(async move {
            let mut escapes = Vec::new();
            let mut ok = 0;
            for spec in specs {
                let (tx, mut rx) = tokio::sync::mpsc::channel(64);
                let live = hako_runner::LiveRun::new(spec.run_id.clone(), spec.folder.clone());
                let drain = tokio::spawn(async move { while rx.recv().await.is_some() {} });
                let end = runner
                    .run(spec, tx, Default::default(), live)
                    .await
                    .report()
                    .expect("finished");
                assert!(runner.remove_containers(&end).await.is_empty());
                drain.await.unwrap();
                let text = all_text(&end);
                if text.contains(CANARY) || text.contains(HOST_SECRET) {
                    escapes.push(text);
                } else if end.outcome == Outcome::Ok {
                    ok += 1;
                }
            }
            (ok, escapes)
        }));
    }
    let mut total_ok = 0;
    for t in tasks {
        let (ok, escapes) = t.await.unwrap();
        assert!(escapes.is_empty(), "escapes: {escapes:#?}");
        total_ok += ok;
    }
    assert_eq!(
        total_ok,
        children.len() * runs_each,
        "every child run answered"
    );
    // The swapper really raced all along.
    let mut swapped = 0u64;
    while let Ok(Some(ev)) =
        tokio::time::timeout(Duration::from_millis(100), parent.events.recv()).await
    {
        if let RunEvent::Block { block, .. } = ev
            && let Some(n) = block
                .result
                .as_deref()
                .and_then(|r| r.strip_prefix("swapped "))
                .and_then(|r| r.split(' ').next())
                .and_then(|n| n.parse().ok())
        {
            swapped = n;
        }
    }
    assert!(swapped > 5_000, "the parent kept swapping ({swapped})");
    parent.control.kill.cancel();
    let (r, _) = parent.end().await;
    assert_eq!(r.state, RunState::Killed);
    // Nothing landed with the victim or the host; every mark is in its child's own dirs.
    let names = |d: &std::path::Path| -> Vec<String> {
        std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect()
    };
    for dir in [&victim_ws, &secret] {
        let stray: Vec<String> = names(dir)
            .into_iter()
            .filter(|n| n.starts_with("mark-"))
            .collect();
        assert!(stray.is_empty(), "{}: {stray:?}", dir.display());
    }
    assert_eq!(names(&secret), vec!["canary.txt"]);
    for child in children {
        let ws = rig.data().join(format!("folders/a.{child}/workspace"));
        let marks = names(&ws).iter().filter(|n| n.starts_with("mark-")).count();
        assert_eq!(marks, runs_each, "a/{child}");
    }
}

/// Item 2: sub-folders named like the host's own directories (`input`, `env`, `sidecars`)
/// reach nothing of their parent's: no follow-up injected into the parent's live agent, no
/// directory where the parent's env file goes, no socket that passes for the parent's sidecar.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sub_folders_named_like_host_dirs_alias_nothing() {
    let rig = Rig::new().await;
    let hostile = hostile_image(&rig.docker).await;

    // `a/env`, then `a`: the parent's env file is still a file it can have.
    let (r, _) = rig.run(rig.spec("a/env", "hi")).await;
    assert_eq!(r.outcome, Outcome::Ok, "{r:?}");
    let (r, _) = rig.run(rig.spec("a", "/read /workspace/env-dir/env")).await;
    assert_eq!(r.outcome, Outcome::Ok, "{r:?}");
    assert!(
        line(&r, "read /workspace/env-dir/env").contains("Written by runed"),
        "{r:?}"
    );

    // `a/input` drops a follow-up into its own socket dir while `a` waits for follow-ups.
    let mut spec = rig.spec("a", "first");
    spec.close = CloseWhen::Manual;
    let mut parent = rig.start(spec);
    parent.started().await;
    assert_eq!(parent.block().await.1, "first");
    let mut inject = rig.spec(
        "a/input",
        "write /var/run/pub/arizuko/0000000000001-000001.json injected\nwrite /workspace/ipc/input/0000000000001-000002.json injected",
    );
    inject.group.image = Some(hostile.clone());
    let (r, _) = rig.run(inject).await;
    assert!(
        all_text(&r).contains("Ok(())"),
        "the writes themselves worked: {r:?}"
    );
    let steer = rig
        .runner
        .steer(&parent.live, &["second".into()])
        .await
        .unwrap();
    assert!(steer.delivered);
    assert_eq!(parent.block().await.1, "second");
    rig.runner.close(&parent.live).await.unwrap();
    let (r, _) = parent.end().await;
    let text = all_text(&r);
    assert!(
        !text.contains("injected") && !text.contains(".json"),
        "{text}"
    );

    // `a/sidecars` keeps a socket named like `a`'s sidecar; `a`'s sidecar never makes one.
    let mut plant = rig.spec("a/sidecars", "socks /var/run/pub/arizuko/echo.sock 30");
    plant.group.image = Some(hostile.clone());
    plant.close = CloseWhen::Manual;
    let mut planter = rig.start(plant);
    planter.started().await;
    assert_eq!(planter.block().await.1, "planting");
    let mut spec = rig.spec("a", "hi");
    spec.group.sidecars = vec![SidecarSpec {
        name: "echo".into(),
        image: hostile.clone(),
        command: vec![],
        memory: None,
        cpus: None,
    }];
    let (r, _) = rig.run(spec).await;
    assert_eq!(r.outcome, Outcome::Error, "{r:?}");
    assert!(
        r.error
            .as_deref()
            .unwrap_or("")
            .contains("sidecar \"echo\""),
        "the sidecar's own socket is what counts: {r:?}"
    );
    planter.control.kill.cancel();
    planter.end().await;
}

/// Item 3: trees an agent leaves in the follow-up drop and the sidecar socket directory
/// (10,000 levels deep, a non-UTF-8 name) neither crash the runner nor jam the folder: the
/// next run gets fresh directories at once, and the trash is emptied without recursion.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn deep_trees_left_by_an_agent_neither_crash_nor_jam() {
    let rig = Rig::new().await;
    let hostile = hostile_image(&rig.docker).await;
    let mut spec = rig.spec(
        "a",
        "deep /workspace/ipc/input 10000\ndeep /var/run/pub/arizuko/sidecars 10000\nwrite /workspace/ipc/input/_close x",
    );
    spec.group.image = Some(hostile);
    let (r, _) = rig.run(spec).await;
    let text = all_text(&r);
    assert!(
        text.contains("deep: 10000 levels in /workspace/ipc/input"),
        "{text}"
    );
    assert!(
        text.contains("deep: 10000 levels in /var/run/pub/arizuko/sidecars"),
        "{text}"
    );
    // The next run of the folder starts clean (a stale `_close` would end it at once).
    let mut spec = rig.spec(
        "a",
        "/ls /workspace/ipc/input\n/ls /var/run/pub/arizuko/sidecars",
    );
    spec.close = CloseWhen::Manual;
    let mut run = rig.start(spec);
    run.started().await;
    let (_, reply) = run.block().await;
    assert_eq!(
        reply,
        "ls /workspace/ipc/input: []\nls /var/run/pub/arizuko/sidecars: []"
    );
    rig.runner.close(&run.live).await.unwrap();
    let (r, _) = run.end().await;
    assert_eq!(r.outcome, Outcome::Ok, "{r:?}");
    let reaped = rig.runner.reap_trash().await.unwrap();
    let trash = rig.data().join("trash");
    assert_eq!(std::fs::read_dir(&trash).unwrap().count(), 0, "{reaped:?}");
}

/// Item 8: a trusted sub-folder's env file (here with a `GH_TOKEN` canary) is out of its
/// untrusted parent's sight, and readable only by the agent user.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_untrusted_parent_never_reads_a_trusted_childs_env() {
    let rig = Rig::with(|c, _| {
        c.host_env = BTreeMap::from([("GH_TOKEN".to_owned(), "gh-canary-5521".to_owned())]);
    })
    .await;
    let mut spec = rig.spec("a/b", "/read /workspace/env-dir/env");
    spec.group.trust = Trust::Main;
    spec.group.env_allowlist = vec!["GH_TOKEN".into()];
    let (r, _) = rig.run(spec).await;
    assert!(
        line(&r, "read /workspace/env-dir/env").contains("gh-canary-5521"),
        "{r:?}"
    );
    let env = rig.data().join("folders/a.b/env/env");
    let mode = std::fs::metadata(&env).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let (r, _) = rig
        .run(rig.spec(
            "a",
            "/ls /workspace/env-dir\n/read /workspace/env-dir/b/env\n/read /workspace/env-dir/env\n/ls /workspace\n/ls /home/agent",
        ))
        .await;
    assert_eq!(r.outcome, Outcome::Ok, "{r:?}");
    assert_eq!(
        line(&r, "ls /workspace/env-dir"),
        "ls /workspace/env-dir: [\"env\"]"
    );
    assert!(!all_text(&r).contains("gh-canary"), "{r:?}");
}

/// Tenants' files and live turns' sockets are closed to the host's other accounts: the data
/// layout's top directories are 0700 (an older install's 0755 is closed at the next start).
#[tokio::test]
async fn the_data_layout_is_closed_to_other_accounts() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(data.join("folders")).unwrap();
    std::fs::write(data.join("LAYOUT"), "2").unwrap();
    std::fs::set_permissions(data.join("folders"), std::fs::Permissions::from_mode(0o755)).unwrap();
    hako_runner::storage::Storage::open(&data).unwrap();
    for top in ["folders", "shares", "global"] {
        let mode = std::fs::metadata(data.join(top))
            .unwrap()
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(mode, 0o700, "{top}: {mode:o}");
    }
}
