//! runed end to end on Docker: a real authd and a real runed in-process on loopback ports,
//! real containers of the agent image, a real `runed.db`. What needs no container engine of
//! its own (the queue, kills, holds, steering, re-adoption, streams) is in `logic.rs`, on the
//! simulated engine.

mod common;
mod rig;

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use hako_client::authd::AuthdClient;
use hako_client::runed;
use hako_client::testing::send;
use hako_shared::runs::SteerRequest;
use hako_shared::testing::eventually;
use rig::*;
use serde_json::{Value, json};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn daemon_run_end_to_end_with_spawn_token_and_idempotency() {
    let rig = Rig::new(&[]).await;
    let run = rig.run("team/a", "turn-e2e-1", "hello\n/echo-input").await;
    // Same turn → same run.
    let again = rig.run("team/a", "turn-e2e-1", "ignored").await;
    assert_eq!(run, again);
    // Another tenant's same turn id is a turn of its own: no 409 that would tell it the id
    // exists elsewhere, and no way to claim the id first.
    let b = rig
        .mint(&["runs:run", "runs:read"], Some("team/b"), 60)
        .await;
    let (s, v) = rig
        .post(
            &b,
            "/v1/runs",
            json!({"folder": "team/b", "turn_id": "turn-e2e-1",
                   "messages": [{"role": "user", "content": "other"}]}),
        )
        .await;
    assert_eq!(s, 202, "{v}");
    assert_ne!(v["run_id"].as_str(), Some(run.as_str()));
    assert!(v.get("existing").is_none(), "{v}");
    let other = v["run_id"].as_str().unwrap().to_owned();
    let v = rig.wait(&run).await;
    assert_eq!(v["state"], "exited", "{v}");
    assert_eq!(v["outcome"], "ok", "{v}");
    let out = results(&v).join("\n");
    assert!(out.contains("hello"), "{out}");
    assert!(out.contains(&format!("\"runId\":\"{run}\"")), "{out}");
    assert!(out.contains("\"turnId\":\"turn-e2e-1\""), "{out}");
    // The spawn token: minted by authd (recorded by jti), revoked at the end.
    let jti: String = rig
        .db()
        .query_row(
            "SELECT jti FROM mcp_tokens WHERE run_id = ?1",
            [&run],
            |r| r.get(0),
        )
        .unwrap();
    let c = AuthdClient::new(&rig.authd_url()).unwrap();
    // Revocation follows the recorded end (authd may be slow): wait for it, boundedly.
    revoked(&c, &jti, "the spawn token is revoked at the end").await;
    let audit = c.audit(&rig.operator, None, None).await.unwrap();
    let mint = audit
        .entries
        .iter()
        .find(|e| e.action == "mint" && e.detail.contains(&jti))
        .expect("authd recorded the mint");
    assert!(mint.detail.contains("team/a"), "{}", mint.detail);
    // Only one run for the turn, and the session log has it.
    let n: i64 = rig
        .db()
        .query_row(
            "SELECT count(*) FROM spawns WHERE turn_id = 'turn-e2e-1' AND folder = 'team/a'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(n, 1);
    let (s, v) = rig.get(&rig.routd, "/v1/sessions?folder=team/a").await;
    assert_eq!(s, 200);
    assert_eq!(v["sessions"][0]["run_id"], run.as_str());
    assert_eq!(rig.wait(&other).await["outcome"], "ok");
    assert_eq!(rig.containers().await, 0, "container removed");
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn daemon_tokens_and_bodies_are_checked_at_the_edge() {
    let rig = Rig::new(&[]).await;
    let run = rig.run("a", "turn-edge-1", "hi").await;
    let body = json!({"folder": "a", "turn_id": "turn-edge-2"});
    // Forged: a valid token with its signature altered.
    let mut forged = rig.routd.clone();
    let last = forged.pop().unwrap();
    forged.push(if last == 'A' { 'B' } else { 'A' });
    let (s, v) = rig.post(&forged, "/v1/runs", body.clone()).await;
    assert_eq!(
        (s, v["error"].as_str()),
        (401, Some("invalid_token")),
        "{v}"
    );
    // No token.
    let r = rig
        .http
        .post(rig.url("/v1/runs"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 401);
    // Under-scoped.
    let reader = rig.mint(&["runs:read"], None, 60).await;
    let (s, v) = rig.post(&reader, "/v1/runs", body.clone()).await;
    assert_eq!((s, v["error"].as_str()), (403, Some("insufficient_scope")));
    // Foreign folder: cannot start there, cannot see runs there.
    let b = rig
        .mint(&["runs:run", "runs:read", "runs:kill"], Some("b"), 60)
        .await;
    let (s, _) = rig.post(&b, "/v1/runs", body.clone()).await;
    assert_eq!(s, 403);
    let (s, v) = send(&rig.api(), &b, runed::run(&run)).await;
    assert_eq!((s, v["error"].as_str()), (404, Some("not_found")));
    let (s, _) = send(&rig.api(), &b, runed::kill_run(&run)).await;
    assert_eq!(s, 404);
    // Folder-bound callers cannot widen the group.
    let a = rig.mint(&["runs:run", "runs:read"], Some("a"), 60).await;
    for group in [
        json!({"trust": "main"}),
        json!({"network": "open"}),
        json!({"image": "alpine"}),
        json!({"mounts": [{"host_path": "/etc", "container_path": "etc"}]}),
    ] {
        let (s, v) = rig
            .post(
                &a,
                "/v1/runs",
                json!({"folder": "a", "turn_id": "turn-edge-3", "group": group}),
            )
            .await;
        assert_eq!(
            (s, v["error"].as_str()),
            (403, Some("forbidden_group_setting")),
            "{v}"
        );
    }
    // The reproduced attack: a folder-bound caller asking for no limits at all, or absurd
    // ones. Values that are never meant are refused for everyone, naming the field; limits
    // above the install's defaults are a privilege.
    for (group, code, field) in [
        (json!({"memory": "0", "cpus": 0, "pids": 0}), 400, "memory"),
        (
            json!({"memory": "4096g", "cpus": 1e-12, "pids": -1}),
            400,
            "memory",
        ),
        (json!({"cpus": 1e-12}), 400, "cpus"),
        (json!({"pids": -1}), 400, "pids"),
        (json!({"memory": "2g"}), 403, "memory"),
        (json!({"cpus": 3}), 403, "cpus"),
        (json!({"pids": 100000}), 403, "pids"),
        (
            json!({"egress_allowlist": ["x.example"]}),
            403,
            "egress_allowlist",
        ),
    ] {
        let (s, v) = rig
            .post(
                &a,
                "/v1/runs",
                json!({"folder": "a", "turn_id": "turn-edge-4", "group": group}),
            )
            .await;
        assert_eq!(s, code, "{group}: {v}");
        assert!(
            v["message"].as_str().unwrap().contains(field),
            "{group}: {v}"
        );
    }
    let (s, v) = rig
        .post(
            &rig.routd,
            "/v1/runs",
            json!({"folder": "a", "turn_id": "turn-edge-5", "group": {"pids": 0}}),
        )
        .await;
    assert_eq!(
        (s, v["error"].as_str()),
        (400, Some("invalid_group")),
        "unbound too: {v}"
    );
    // Tighter limits are the folder's own business, and reach Docker as asked.
    let (s, v) = rig
        .post(
            &a,
            "/v1/runs",
            json!({"folder": "a", "turn_id": "turn-edge-6",
                   "messages": [{"role": "user", "content": "/sleep 30"}],
                   "group": {"memory": "256m", "cpus": 0.5, "pids": 64}}),
        )
        .await;
    assert_eq!(s, 202, "{v}");
    let tight = v["run_id"].as_str().unwrap().to_owned();
    rig.wait(&run).await;
    rig.wait_state(&tight, "running").await;
    let agents = rig.runner().list_agents().await.unwrap();
    let c = agents
        .iter()
        .find(|c| c.run_id() == Some(tight.as_str()))
        .expect("the tight run's container");
    let host = rig
        .docker()
        .inspect_container(&c.id, None)
        .await
        .unwrap()
        .host_config
        .unwrap();
    assert_eq!(
        (host.memory, host.nano_cpus, host.pids_limit),
        (Some(256 << 20), Some(500_000_000), Some(64))
    );
    let (s, _) = send(&rig.api(), &a, runed::kill_run(&tight)).await;
    assert_eq!(s, 403, "a has no runs:kill");
    let (s, _) = send(&rig.api(), &rig.routd, runed::kill_run(&tight)).await;
    assert_eq!(s, 200);
    // Expired: a 1 s token works until it expires (with the 1 s skew allowed), then it is
    // refused as expired, within a bound.
    let short = rig.mint(&["runs:read"], Some("a"), 1).await;
    let v = eventually("the 1 s token expires", Duration::from_secs(15), || async {
        let (s, v) = send(&rig.api(), &short, runed::run(&run)).await;
        if s == 401 {
            return Ok(v);
        }
        assert_eq!(s, 200, "before it expires: {v}");
        Err(v)
    })
    .await;
    assert_eq!(v["error"].as_str(), Some("token_expired"), "{v}");
    // Malformed, invalid and oversized bodies.
    let r = rig
        .http
        .post(rig.url("/v1/runs"))
        .bearer_auth(&rig.routd)
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    let (s, _) = rig
        .post(
            &rig.routd,
            "/v1/runs",
            json!({"folder": "../x", "turn_id": "t"}),
        )
        .await;
    assert_eq!(s, 400);
    let (s, v) = rig
        .post(
            &rig.routd,
            "/v1/runs",
            json!({"folder": "a", "turn_id": "bad turn"}),
        )
        .await;
    // Ids are typed (`TurnId`): refused while the body is parsed, naming the field.
    assert_eq!((s, v["error"].as_str()), (400, Some("invalid_json")));
    assert!(
        v["message"].as_str().unwrap().contains("invalid turn id"),
        "{v}"
    );
    // `@` too: authd's mint refuses it, so runed must not accept a run it cannot start.
    let (s, v) = rig
        .post(
            &rig.routd,
            "/v1/runs",
            json!({"folder": "a", "turn_id": "user@chat"}),
        )
        .await;
    assert_eq!((s, v["error"].as_str()), (400, Some("invalid_json")), "{v}");
    assert!(v["message"].as_str().unwrap().contains("turn_id"), "{v}");
    let big = "x".repeat(2 << 20);
    let (s, v) = rig
        .post(
            &rig.routd,
            "/v1/runs",
            json!({"folder": "a", "turn_id": "t-big", "system_prompt": big}),
        )
        .await;
    assert_eq!((s, v["error"].as_str()), (413, Some("body_too_large")));
    rig.wait(&run).await;
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn daemon_run_timeout() {
    // The ceiling counts from just before the launch, the agent's own deadline from its
    // start: 16 s leaves the agent a 4 s margin, room for a container start on a loaded
    // machine (3 s were seen in CI with a 5 s ceiling, whose 1.25 s margin was not enough).
    let rig = Rig::new(&[("RUNED_RUN_TIMEOUT", "16s")]).await;
    // A well-behaved agent answers its own deadline (30 s, here a quarter, before the
    // ceiling) with a summary: that is output, so the outcome is ok.
    let chatty = rig
        .run("to2", "turn-to-2", "/ignore-sigterm\n/sleep 60")
        .await;
    // A frozen agent says nothing: the ceiling cuts it, outcome timed_out.
    let frozen = rig.run("to1", "turn-to-1", "/sleep 60").await;
    rig.wait_state(&frozen, "running").await;
    let docker = bollard::Docker::connect_with_unix(
        "/var/run/docker.sock",
        30,
        bollard::API_DEFAULT_VERSION,
    )
    .unwrap();
    let id = rig
        .db()
        .query_row(
            "SELECT container_id FROM spawns WHERE run_id = ?1",
            [&frozen],
            |r| r.get::<_, String>(0),
        )
        .unwrap();
    docker.pause_container(&id).await.expect("pause");
    let v2 = rig.wait(&frozen).await;
    assert_eq!(v2["state"], "timed_out", "{v2}");
    // Stopping thaws the agent, which may still write its deadline summary before the
    // kill: then that is the output (ok); otherwise nothing was said (timed_out).
    assert!(
        v2["outcome"] == "timed_out" || results(&v2).join("").contains("query timeout"),
        "{v2}"
    );
    // Cut by the ceiling (16 s) and the stop's grace (10 s), counted on runed's own clock
    // from the run's start: a wait in the queue or a slow container start on a loaded
    // machine is not the ceiling's to answer for (a wall clock from the post took 50 s).
    // The paused box would never end by itself, so any bound proves the cut; this one
    // leaves room for the stop itself waiting on a stalled Docker daemon (a CI run saw every
    // Docker call stall for about 38 s at once: this run then took 44 s).
    let ms = |k: &str| hako_shared::time::parse_rfc3339(v2[k].as_str().unwrap()).unwrap();
    let ran = Duration::from_millis((ms("ended_at") - ms("started_at")).max(0) as u64);
    assert!(ran < Duration::from_secs(75), "ran {ran:?}: {v2}");
    let v = rig.wait(&chatty).await;
    assert_eq!(v["outcome"], "ok", "{v}");
    assert!(
        results(&v).join("\n").contains("query timeout"),
        "the agent's summary: {v}"
    );
    assert_eq!(rig.containers().await, 0, "containers gone");
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn daemon_waits_for_docker_at_start() {
    let sockdir = tempfile::tempdir().unwrap();
    let sock = sockdir.path().join("docker.sock");
    let host = format!("unix://{}", sock.display());
    let rig = Rig::new(&[("DOCKER_HOST", &host)]).await;
    let a = rig.run("dk1", "turn-dk-1", "one").await;
    let b = rig.run("dk2", "turn-dk-2", "two").await;
    // The scheduler has looked at the queue for a second with both runs in it (its gauges,
    // refreshed on each of its rounds, say so), and started neither.
    let m = eventually(
        "the scheduler goes round",
        Duration::from_secs(20),
        || async {
            let m = metrics(&rig).await;
            if m.get("runed_oldest_queued_seconds")
                .is_some_and(|&v| v >= 1.0)
            {
                Ok(m)
            } else {
                Err(m)
            }
        },
    )
    .await;
    assert_eq!(m.get("runed_queue_length"), Some(&2.0), "{m:?}");
    for r in [&a, &b] {
        let (_, v) = rig.status(r).await;
        assert_eq!(v["state"], "queued", "{v}");
    }
    let r = rig.http.get(rig.url("/ready")).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 503);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"], "not_ready", "{v}");
    assert!(
        v["message"].as_str().unwrap_or_default().contains("docker"),
        "/ready says why: {v}"
    );
    std::os::unix::fs::symlink("/var/run/docker.sock", &sock).unwrap();
    for r in [&a, &b] {
        let v = rig.wait(r).await;
        assert_eq!(v["outcome"], "ok", "{v}");
    }
    let r = rig.http.get(rig.url("/ready")).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    rig.stop().await;
}

/// A unix-socket proxy in front of `/var/run/docker.sock` that can "cut" Docker: stop
/// accepting (the socket file disappears) and abort every forwarded connection, as a Docker
/// restart does, and "restore" it at the same path.
struct DockerProxy {
    path: std::path::PathBuf,
    on: std::sync::Mutex<
        Option<(
            tokio_util::sync::CancellationToken,
            tokio::task::JoinHandle<()>,
        )>,
    >,
}

impl DockerProxy {
    fn new(path: std::path::PathBuf) -> DockerProxy {
        let p = DockerProxy {
            path,
            on: std::sync::Mutex::new(None),
        };
        p.restore();
        p
    }

    fn restore(&self) {
        let listener = tokio::net::UnixListener::bind(&self.path).expect("bind the proxy");
        let cut = tokio_util::sync::CancellationToken::new();
        let c = cut.clone();
        let task = tokio::spawn(async move {
            let mut conns = tokio::task::JoinSet::new();
            loop {
                tokio::select! {
                    () = c.cancelled() => break,
                    a = listener.accept() => {
                        let Ok((mut inbound, _)) = a else { continue };
                        conns.spawn(async move {
                            if let Ok(mut up) =
                                tokio::net::UnixStream::connect("/var/run/docker.sock").await
                            {
                                let _ = tokio::io::copy_bidirectional(&mut inbound, &mut up).await;
                            }
                        });
                    }
                }
            }
            drop(listener);
            // Aborts every forwarded connection (both ends close).
            conns.shutdown().await;
        });
        *self.on.lock().unwrap() = Some((cut, task));
    }

    async fn cut(&self) {
        let on = self.on.lock().unwrap().take();
        if let Some((cut, task)) = on {
            cut.cancel();
            let _ = tokio::time::timeout(Duration::from_secs(10), task).await;
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Docker goes away mid-life (a daemon restart) and comes back. What a user sees: `/ready`
/// turns 503 naming Docker; runs posted meanwhile stay `queued` and run once it is back.
/// The run that was in flight keeps `running` through the outage (runed lost its wait and
/// output streams, but not the container, which goes on and here answers while Docker is
/// away; it then waits to be told to close, which needs Docker); once Docker answers it is
/// re-attached like at a restart: its output is read back from the container's logs, it is
/// closed and ends `exited`/ok, once (one spawn row, one answer), and its container is
/// removed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn daemon_survives_docker_going_away() {
    let sockdir = tempfile::tempdir().unwrap();
    let sock = sockdir.path().join("docker.sock");
    let proxy = DockerProxy::new(sock.clone());
    let host = format!("unix://{}", sock.display());
    let rig = Rig::new(&[("DOCKER_HOST", &host)]).await;
    let first = rig.run("dg1", "turn-dg-1", "before").await;
    let v = rig.wait(&first).await;
    assert_eq!(v["outcome"], "ok", "through the proxy: {v}");
    assert_eq!(ready(&rig).await.0, 200);

    let long = rig.run("dg2", "turn-dg-2", "/sleep 6\nafter sleep").await;
    rig.wait_state(&long, "running").await;
    let cid: String = rig
        .db()
        .query_row(
            "SELECT container_id FROM spawns WHERE run_id = ?1",
            [&long],
            |r| r.get(0),
        )
        .unwrap();
    proxy.cut().await;

    // /ready says why, soon.
    let v = eventually("/ready answers 503", Duration::from_secs(20), || async {
        let (s, v) = ready(&rig).await;
        if s == 503 { Ok(v) } else { Err((s, v)) }
    })
    .await;
    assert_eq!(v["error"], "not_ready", "{v}");
    assert!(
        v["message"].as_str().unwrap_or_default().contains("docker"),
        "/ready says why: {v}"
    );

    // Runs posted while Docker is away stay queued; the in-flight one stays running while
    // its container finishes (seen through the real socket, not runed's).
    let q1 = rig.run("dg3", "turn-dg-3", "three").await;
    let q2 = rig.run("dg4", "turn-dg-4", "four").await;
    let docker = bollard::Docker::connect_with_unix(
        "/var/run/docker.sock",
        30,
        bollard::API_DEFAULT_VERSION,
    )
    .unwrap();
    // Generous: it ends as soon as the answer shows, and on a busy Docker (CI runs the
    // 200-run cap test beside this one) a 6 s sleep and a logs call can take far longer.
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut polls = 0;
    loop {
        for r in [&q1, &q2] {
            let (_, v) = rig.status(r).await;
            assert_eq!(v["state"], "queued", "while Docker is away: {v}");
        }
        let (_, v) = rig.status(&long).await;
        assert_eq!(v["state"], "running", "the in-flight run, Docker away: {v}");
        polls += 1;
        // The agent's answer is written while Docker is away from runed.
        let logs: Vec<_> = docker
            .logs(
                &cid,
                Some(
                    bollard::query_parameters::LogsOptionsBuilder::new()
                        .stdout(true)
                        .build(),
                ),
            )
            .collect()
            .await;
        let answered = logs
            .iter()
            .flatten()
            .any(|l| String::from_utf8_lossy(&l.clone().into_bytes()).contains("after sleep"));
        if answered && polls >= 10 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the long run's container never answered"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(ready(&rig).await.0, 503);

    proxy.restore();
    for r in [&q1, &q2] {
        let v = rig.wait(r).await;
        assert_eq!(
            (v["state"].as_str(), v["outcome"].as_str()),
            (Some("exited"), Some("ok")),
            "{v}"
        );
    }
    let v = rig.wait(&long).await;
    assert_eq!(
        (v["state"].as_str(), v["outcome"].as_str()),
        (Some("exited"), Some("ok")),
        "{v}"
    );
    let out = results(&v);
    assert_eq!(
        out.iter().filter(|r| r.contains("after sleep")).count(),
        1,
        "answered once: {out:?}"
    );
    let n: i64 = rig
        .db()
        .query_row(
            "SELECT count(*) FROM spawns WHERE turn_id = 'turn-dg-2'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(n, 1, "not run twice");
    // Its container is removed after recovery (after the end is recorded, so a look right
    // after the end may still find it: waited for, boundedly).
    eventually(
        "its container is removed after recovery",
        Duration::from_secs(30),
        || async {
            match docker.inspect_container(&cid, None).await {
                Ok(c) => Err(c.state),
                Err(_) => Ok(()),
            }
        },
    )
    .await;
    assert_eq!(ready(&rig).await.0, 200);
    assert_eq!(rig.containers().await, 0, "containers gone");
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn daemon_binary_detaches_on_sigterm_and_readopts() {
    let mut rig = Rig::new(&[]).await;
    rig.runed.take().unwrap().shutdown().await;
    rig.spawn_binary().await;
    let run = rig
        .run("term", "turn-term-1", "/sleep 4\nafter sleep")
        .await;
    rig.wait_state(&run, "running").await;
    let (mut child, _) = rig.child.take().unwrap();
    let pid = rustix::process::Pid::from_raw(child.id() as i32).unwrap();
    let t = Instant::now();
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            t.elapsed() < Duration::from_secs(8),
            "runed did not exit after SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(status.success(), "{status:?}");
    let agents = rig.runner().list_agents().await.unwrap();
    assert_eq!(agents.len(), 1, "{agents:?}");
    assert_eq!(agents[0].state, "running", "the container keeps running");
    rig.spawn_binary().await;
    let v = rig.wait(&run).await;
    assert_eq!(v["outcome"], "ok", "{v}");
    let out = results(&v);
    assert_eq!(
        out.iter().filter(|r| r.contains("after sleep")).count(),
        1,
        "{out:?}"
    );
    let n = rig.spawns();
    assert_eq!(n, 1, "nothing ran twice");
    assert_eq!(rig.containers().await, 0);
    rig.stop().await;
}

/// Item 9 of the isolation issue: an empty `AUTHD_URL` (or none) used to mean open mode,
/// and the image listens on `0.0.0.0`. The binary now refuses to start, naming what to fix;
/// open mode needs `HAKO_OPEN_DEV=1` and a loopback address.
#[test]
fn runed_binary_refuses_accidental_open_mode() {
    let dir = tempfile::tempdir().unwrap();
    let start = |env: &[(&str, &str)]| {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_runed"));
        cmd.env_clear()
            .env("DATA_DIR", dir.path())
            .env("RUNED_LISTEN", "127.0.0.1:0");
        for (k, v) in env {
            cmd.env(k, v);
        }
        let out = cmd
            .stdin(std::process::Stdio::null())
            .output()
            .expect("runed runs");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, err) = start(&[("AUTHD_URL", ""), ("RUNED_LISTEN", "0.0.0.0:0")]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("AUTHD_URL is set but empty"), "{err}");
    let (code, err) = start(&[]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("AUTHD_URL is required") && err.contains("HAKO_OPEN_DEV=1"),
        "{err}"
    );
    let (code, err) = start(&[("HAKO_OPEN_DEV", "1"), ("RUNED_LISTEN", "0.0.0.0:0")]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("RUNED_LISTEN") && err.contains("loopback"),
        "{err}"
    );
    let (code, err) = start(&[
        ("AUTHD_URL", "http://127.0.0.1:1"),
        ("AUTHD_SERVICE_KEY", ""),
    ]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("AUTHD_SERVICE_KEY is set but empty"), "{err}");
}

/// Item 6 of the isolation issue: runed killed (SIGKILL) after a run answered, with the
/// run's container gone before its end was recorded (the order before the fix removed the
/// container first). On restart the stored answer stands: the run ends `ok`, is not retried,
/// and its spawn token is revoked. And in the order runed follows now, a kill at any point
/// leaves either an unfinished run with its container (re-adopted) or a recorded end.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn daemon_sigkill_after_an_answer_never_reruns_the_turn() {
    let mut rig = Rig::new(&[]).await;
    rig.runed.take().unwrap().shutdown().await;
    rig.spawn_binary().await;
    let run = rig
        .run("killed", "turn-kill-1", "/blocks 1\n/sleep 60")
        .await;
    let v = rig.wait_outputs(&run, 1).await;
    assert_eq!(results(&v), ["block 1/1"]);
    let (mut child, _) = rig.child.take().unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    let agents = rig.runner().list_agents().await.unwrap();
    assert_eq!(agents.len(), 1, "{agents:?}");
    // The state the old order could leave behind: the container removed, the end unrecorded.
    rig.docker()
        .remove_container(
            &agents[0].id,
            Some(
                bollard::query_parameters::RemoveContainerOptionsBuilder::new()
                    .force(true)
                    .build(),
            ),
        )
        .await
        .unwrap();
    let jti: String = rig
        .db()
        .query_row(
            "SELECT jti FROM mcp_tokens WHERE run_id = ?1",
            [&run],
            |r| r.get(0),
        )
        .unwrap();
    rig.spawn_binary().await;
    let v = rig.wait(&run).await;
    assert_eq!(v["outcome"], "ok", "the stored answer stands: {v}");
    assert_eq!(results(&v), ["block 1/1"]);
    let c = AuthdClient::new(&rig.authd_url()).unwrap();
    revoked(&c, &jti, "the spawn token is revoked on this path too").await;
    let n = rig.spawns();
    assert_eq!(n, 1, "nothing ran twice");
    rig.stop().await;
}

fn vm_rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// Item 7: the queue is bounded (per folder and overall, 429 naming the limit), and queued
/// requests wait in the database, not in runed's memory: 60 runs of 0.9 MB each behind a hold
/// leave the runed binary's resident memory about where it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn daemon_queue_is_bounded_and_kept_on_disk() {
    let mut rig = Rig::new(&[
        ("RUNED_MAX_QUEUED", "70"),
        ("RUNED_MAX_QUEUED_PER_FOLDER", "60"),
    ])
    .await;
    rig.runed.take().unwrap().shutdown().await;
    rig.spawn_binary().await;
    let pid = rig.child.as_ref().unwrap().0.id();
    // Holds take each folder's slot, so everything after them waits.
    for f in ["q", "r"] {
        let (s, v) = rig
            .post(&rig.routd, "/v1/holds", json!({"folder": f, "ttl": "5m"}))
            .await;
        assert_eq!(s, 202, "{v}");
    }
    let big = "p".repeat(900_000);
    let post = |folder: &'static str, turn: String| {
        let body = json!({"folder": folder, "turn_id": turn, "system_prompt": big.clone()});
        let rig = &rig;
        async move { rig.post(&rig.routd, "/v1/runs", body).await }
    };
    // Warm up the allocator and the database, then measure around the rest.
    for i in 0..5 {
        assert_eq!(post("q", format!("q-{i}")).await.0, 202);
    }
    let before = vm_rss_kib(pid);
    for i in 5..60 {
        let (s, v) = post("q", format!("q-{i}")).await;
        assert_eq!(s, 202, "{i}: {v}");
    }
    let after = vm_rss_kib(pid);
    let grown_mib = after.saturating_sub(before) / 1024;
    eprintln!("runed RSS {before} -> {after} KiB over 55 queued runs of 0.9 MB");
    assert!(
        grown_mib < 20,
        "55 queued runs of 0.9 MB grew runed by {grown_mib} MiB ({before} -> {after} KiB)"
    );
    let (s, v) = post("q", "q-60".into()).await;
    assert_eq!((s, v["error"].as_str()), (429, Some("queue_full")), "{v}");
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .contains("RUNED_MAX_QUEUED_PER_FOLDER"),
        "{v}"
    );
    // A repeat of a queued turn is still answered as that run.
    let (s, v) = post("q", "q-7".into()).await;
    assert_eq!((s, v["existing"].as_bool()), (202, Some(true)), "{v}");
    for i in 0..10 {
        assert_eq!(post("r", format!("r-{i}")).await.0, 202);
    }
    let (s, v) = post("r", "r-10".into()).await;
    assert_eq!(s, 429, "{v}");
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .contains("(RUNED_MAX_QUEUED)"),
        "{v}"
    );
    // The requests wait on disk.
    let on_disk: i64 = rig
        .db()
        .query_row(
            "SELECT count(*) FROM spawns WHERE state = 'queued' AND length(request) > 900000",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(on_disk, 70);
    rig.stop().await;
}

/// Item 5: the output cap counts every field. A hostile agent emitting 200 blocks whose
/// `result`, `error` and `newSessionId` are 100 KB each (60 MB in all) under a 64 KiB cap:
/// runed stores at most the cap, flags the run truncated, and its memory stays put (the
/// review saw 36 MB stored and runed grow from 26 to 250 MiB).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn daemon_output_cap_counts_every_field() {
    let mut rig = Rig::new(&[("RUNED_OUTPUT_CAP", "64k"), ("MIMALLOC_PURGE_DELAY", "0")]).await;
    let docker = hako_runner::docker::DockerEngine::connect_default()
        .unwrap()
        .client()
        .clone();
    let hostile = common::hostile_image(&docker).await;
    rig.runed.take().unwrap().shutdown().await;
    rig.spawn_binary().await;
    let pid = rig.child.as_ref().unwrap().0.id();
    // Warm-up run, then measure around the flood.
    let warm = rig.run("cap", "turn-cap-0", "hi").await;
    rig.wait(&warm).await;
    let flood = |turn: &'static str| {
        let rig = &rig;
        let body = json!({"folder": "cap", "turn_id": turn, "group": {"image": hostile.clone()},
                          "messages": [{"role": "user", "content": "fields 200 100000"}]});
        async move {
            let (s, v) = rig.post(&rig.routd, "/v1/runs", body).await;
            assert_eq!(s, 202, "{v}");
            let run = v["run_id"].as_str().unwrap().to_owned();
            (rig.wait(&run).await, run)
        }
    };
    let before = vm_rss_kib(pid);
    flood("turn-cap-1").await;
    let first = vm_rss_kib(pid);
    let (v, run) = flood("turn-cap-2").await;
    let after = vm_rss_kib(pid);
    eprintln!(
        "runed RSS {before} -> {first} -> {after} KiB over two floods of 60 MB of block fields"
    );
    assert_eq!(v["truncated"], true, "{}", v["state"]);
    let outputs = v["outputs"].as_array().unwrap();
    let text: usize = outputs
        .iter()
        .flat_map(|b| {
            ["result", "error", "newSessionId"].map(|f| b[f].as_str().map_or(0, str::len))
        })
        .sum();
    assert!(text <= 64 << 10, "{text} bytes stored under a 64 KiB cap");
    assert!(outputs.len() <= 2, "{} blocks kept", outputs.len());
    let stored: i64 = rig
        .db()
        .query_row(
            "SELECT coalesce(sum(length(block)), 0) FROM spawn_outputs WHERE run_id = ?1",
            [&run],
            |r| r.get(0),
        )
        .unwrap();
    assert!(stored < 80_000, "{stored} bytes in spawn_outputs");
    // What the first flood adds is the allocator's working set; a second flood must not add
    // to it (the review saw 26 -> 250 MiB, growing with the output). runed runs with
    // MIMALLOC_PURGE_DELAY=0 here: with mimalloc's default delay the freed pages it had not
    // yet returned made the second reading swing by ±17 MiB, and the test fail by chance
    // (4 runs in 6); a leak keeps its pages whatever the delay.
    let second_mib = after.saturating_sub(first) / 1024;
    assert!(
        second_mib < 8,
        "a second flood grew runed by {second_mib} MiB"
    );
    assert!(
        after.saturating_sub(before) / 1024 < 64,
        "{before} -> {after} KiB"
    );
    rig.stop().await;
}

#[test]
fn the_openapi_document_validates() {
    assert_eq!(
        hako_shared::testing::validate_openapi(hako_runed::OPENAPI),
        "3.1.0"
    );
}

/// The runtime of a run's agent container, from the Docker API.
async fn container_runtime(rig: &Rig, run: &str) -> String {
    let docker = hako_deploy::connect_docker().unwrap();
    let list = docker
        .list_containers(Some(
            bollard::query_parameters::ListContainersOptionsBuilder::new()
                .all(true)
                .filters(&std::collections::HashMap::from([(
                    "label".to_owned(),
                    vec![format!("io.hako.run={run}")],
                )]))
                .build(),
        ))
        .await
        .unwrap();
    let _ = rig;
    let id = list[0].id.clone().unwrap();
    let c = docker
        .inspect_container(
            &id,
            None::<bollard::query_parameters::InspectContainerOptions>,
        )
        .await
        .unwrap();
    c.host_config.and_then(|h| h.runtime).unwrap_or_default()
}

/// Untrusted groups run under gVisor (`RUNED_UNTRUSTED_RUNTIME=runsc`, its `runsc-nonet`
/// variant for a container without a network): the agent sees gVisor's kernel, not the
/// host's; a follow-up is taken, `/stop` kills, runed restarted mid-run re-adopts the run; a
/// main group stays on the default runtime.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn daemon_gvisor_runs_untrusted_groups() {
    let mut rig = Rig::new(&[
        ("RUNED_UNTRUSTED_RUNTIME", "runsc"),
        ("RUNED_IDLE_TIMEOUT", "8s"),
    ])
    .await;
    let metrics = rig
        .http
        .get(rig.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains(r#"runed_runtime_info{runtime="runsc",trust="untrusted"} 1"#)
            || metrics.contains(r#"runed_runtime_info{trust="untrusted",runtime="runsc"} 1"#),
        "{metrics}"
    );
    let a = rig
        .run("gv", "turn-gv-1", "/read /proc/version\n/whoami")
        .await;
    rig.wait_outputs(&a, 1).await;
    assert_eq!(container_runtime(&rig, &a).await, "runsc-nonet");
    let v = rig.wait_outputs(&a, 1).await;
    let out = results(&v).join("\n");
    assert!(
        out.contains("Linux version 4.4.0"),
        "gVisor's kernel, not the host's: {out}"
    );
    assert!(out.contains(r#""CapEff":"0000000000000000""#), "{out}");
    // A follow-up into the gVisor box.
    let steer: SteerRequest =
        serde_json::from_value(json!({"steer_id": "gv-f", "messages": ["steered into gvisor"]}))
            .unwrap();
    let (s, v) = send(&rig.api(), &rig.routd, runed::steer(&a, &steer)).await;
    assert_eq!(s, 200, "{v}");
    let v = rig.wait(&a).await;
    assert_eq!(v["outcome"], "ok", "{v}");
    assert!(
        results(&v)
            .iter()
            .any(|r| r.contains("steered into gvisor")),
        "{v}"
    );
    assert_eq!(v["steers"][0]["state"], "taken", "{v}");

    // A main group: the host's runtime.
    let (s, v) = rig
        .post(
            &rig.routd,
            "/v1/runs",
            json!({"folder": "gvmain", "turn_id": "turn-gv-main",
                   "messages": [{"role": "user", "content": "/read /proc/version"}],
                   "group": {"trust": "main"}}),
        )
        .await;
    assert_eq!(s, 202, "{v}");
    let m = v["run_id"].as_str().unwrap().to_owned();
    let v = rig.wait_outputs(&m, 1).await;
    assert!(
        !results(&v).join("\n").contains("Linux version 4.4.0"),
        "{v}"
    );

    // runed restarted while a gVisor run sleeps: re-adopted, it finishes.
    let b = rig
        .run("gv2", "turn-gv-2", "/sleep 4\nafter the restart")
        .await;
    rig.wait_state(&b, "running").await;
    rig.runed.take().unwrap().shutdown().await;
    rig.start_runed().await;
    let v = rig.wait(&b).await;
    assert_eq!(v["outcome"], "ok", "{v}");
    assert!(results(&v).join("\n").contains("after the restart"), "{v}");

    // /stop kills a gVisor run.
    let c = rig.run("gv3", "turn-gv-3", "/sleep 600").await;
    rig.wait_state(&c, "running").await;
    let (s, v) = rig
        .post(&rig.routd, "/v1/runs/stop", json!({"folder": "gv3"}))
        .await;
    assert_eq!(s, 200, "{v}");
    let v = rig.wait(&c).await;
    assert_eq!(v["outcome"], "killed", "{v}");
    rig.stop().await;
}

/// A runtime the Docker daemon does not list: runed refuses to start when the install names
/// it (never a silent fallback to runc), and a run whose group names it fails, naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn daemon_refuses_a_runtime_docker_lacks() {
    let rig = Rig::new(&[]).await;
    let cfg = runed_config(
        &rig.data,
        &rig.authd_url(),
        &[("RUNED_UNTRUSTED_RUNTIME".into(), "no-such-runtime".into())],
    );
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let e = match hako_runed::start(cfg, l).await {
        Ok(_) => panic!("runed started with a runtime Docker lacks"),
        Err(e) => e.to_string(),
    };
    assert!(
        e.contains("RUNED_UNTRUSTED_RUNTIME") && e.contains("no-such-runtime"),
        "{e}"
    );
    let (s, v) = rig
        .post(
            &rig.routd,
            "/v1/runs",
            json!({"folder": "rt", "turn_id": "turn-rt-1",
                   "messages": [{"role": "user", "content": "hi"}],
                   "group": {"runtime": "no-such-runtime"}}),
        )
        .await;
    assert_eq!(s, 202, "{v}");
    let v = rig.wait(v["run_id"].as_str().unwrap()).await;
    assert_eq!(v["state"], "error", "{v}");
    assert!(
        v["error"].as_str().unwrap().contains("no-such-runtime"),
        "{v}"
    );
    rig.stop().await;
}

/// #27: a folder's next turn is answered by the box started after its last one, created
/// before the turn was asked for; the box waits longer than the agent's query timeout
/// without giving up, and the turn's deadline counts from the turn: a turn that outlasts it
/// ends in the agent's own summary, before runed's ceiling.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn daemon_warm_box_serves_the_next_turn_with_the_deadline_counted_from_the_turn() {
    // A 16 s ceiling: the agent's query timeout is 12 s (4 s for the agent to end its turn
    // and its box to exit, on a loaded machine).
    let rig = Rig::new(&[("RUNED_WARM_MAX", "4"), ("RUNED_RUN_TIMEOUT", "16s")]).await;
    let first = rig.run("warm-a", "turn-wa-1", "first").await;
    let v = rig.wait(&first).await;
    assert_eq!(v["outcome"], "ok", "{v}");
    assert_eq!(
        metric(&rig, "runed_warm_misses_total", "reason=\"empty\"").await,
        1.0
    );
    let boxed = rig.warm_boxes("warm-a", 1).await.remove(0);
    assert_ne!(
        boxed.id,
        rig.container_of(&first),
        "a new box, not the run's"
    );
    let box_created = rig.created_ms(&boxed.id).await;
    metric_becomes(&rig, "runed_warm_boxes", 1.0).await;
    // Past the agent's query timeout: a box that counted it from its own start would have
    // given up by now.
    let made = Instant::now();
    tokio::time::sleep(Duration::from_secs(13).saturating_sub(made.elapsed())).await;
    let second = rig
        .run("warm-a", "turn-wa-2", "/sleep 2\nsecond answer")
        .await;
    let v = rig.wait(&second).await;
    assert_eq!(v["outcome"], "ok", "{v}");
    assert_eq!(results(&v), ["slept 2 s\nsecond answer"], "{v}");
    assert_eq!(rig.container_of(&second), boxed.id, "the warm box answered");
    let asked = rig.run_created_ms(&second).await;
    assert!(
        box_created + 12_000 < asked,
        "the box was created {} ms before the run was asked for",
        asked - box_created
    );
    assert_eq!(metric(&rig, "runed_warm_hits_total", "").await, 1.0);
    assert!(metric(&rig, "runed_warm_saved_milliseconds_total", "").await > 0.0);
    rig.until_gone(&boxed.id, Duration::from_secs(30)).await;
    // The next box; this turn outlasts its 12 s: the agent ends it with its summary, within
    // runed's 16 s ceiling (a deadline counted from the box's start would have ended it
    // at once, or the ceiling would).
    let next = rig.warm_boxes("warm-a", 1).await.remove(0);
    let t = Instant::now();
    let third = rig.run("warm-a", "turn-wa-3", "/sleep 60").await;
    let v = rig.wait(&third).await;
    let took = t.elapsed();
    assert_eq!(rig.container_of(&third), next.id);
    assert_eq!(
        v["state"], "exited",
        "the agent's deadline, not the ceiling: {v}"
    );
    assert!(
        took >= Duration::from_secs(11),
        "the deadline came early: {took:?} {v}"
    );
    assert_eq!(metric(&rig, "runed_warm_hits_total", "").await, 2.0);
    rig.stop().await;
}

/// #27: a changed group spec does not take the box (it is removed, the run starts cold), nor
/// does a run find a box killed while it waited; a box nobody takes expires; a group that
/// says `warm: false` gets none.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn daemon_warm_box_misses_on_a_changed_spec_and_expires() {
    let rig = Rig::new(&[("RUNED_WARM_MAX", "4"), ("RUNED_WARM_TTL", "8s")]).await;
    let run = |turn: &'static str, group: Value| {
        let rig = &rig;
        async move {
            let (s, v) = rig
                .post(
                    &rig.routd,
                    "/v1/runs",
                    json!({"folder": "warm-b", "turn_id": turn, "group": group,
                           "messages": [{"role": "user", "content": "hi"}]}),
                )
                .await;
            assert_eq!(s, 202, "{v}");
            let id = v["run_id"].as_str().unwrap().to_owned();
            let v = rig.wait(&id).await;
            assert_eq!(v["outcome"], "ok", "{v}");
            id
        }
    };
    run("turn-wb-1", json!({})).await;
    let old = rig.warm_boxes("warm-b", 1).await.remove(0);
    // Another memory limit: another box.
    let changed = run("turn-wb-2", json!({"memory": "512m"})).await;
    assert_ne!(rig.container_of(&changed), old.id);
    assert_eq!(
        metric(&rig, "runed_warm_misses_total", "reason=\"spec\"").await,
        1.0
    );
    assert_eq!(metric(&rig, "runed_warm_hits_total", "").await, 0.0);
    rig.until_gone(&old.id, Duration::from_secs(30)).await;
    // The box made after it has the new limit. Killed while it waits: the next run finds it
    // gone and starts cold.
    let fresh = rig.warm_boxes("warm-b", 1).await.remove(0);
    let docker = rig.docker();
    let info = docker.inspect_container(&fresh.id, None).await.unwrap();
    assert_eq!(info.host_config.unwrap().memory, Some(512 << 20));
    docker.kill_container(&fresh.id, None).await.unwrap();
    let after_kill = run("turn-wb-3", json!({"memory": "512m"})).await;
    assert_ne!(rig.container_of(&after_kill), fresh.id);
    assert_eq!(
        metric(&rig, "runed_warm_misses_total", "reason=\"gone\"").await,
        1.0
    );
    rig.until_gone(&fresh.id, Duration::from_secs(30)).await;
    // The box made after that one: nobody takes it, and it expires.
    let last = rig.warm_boxes("warm-b", 1).await.remove(0);
    rig.until_gone(&last.id, Duration::from_secs(30)).await;
    metric_becomes(&rig, "runed_warm_boxes", 0.0).await;
    // A group that wants none gets none.
    run("turn-wb-4", json!({"warm": false})).await;
    let after = rig.runner().list_agents().await.unwrap();
    assert!(!after.iter().any(hako_runner::warm::is_warm), "{after:?}");
    rig.stop().await;
}

/// #27: runed killed (SIGKILL) with a warm box waiting and a run in another warm box: the
/// restarted runed removes the waiting box, never as a run, and re-adopts the run, which
/// finishes once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn daemon_killed_with_warm_boxes_removes_them_and_readopts_the_run_in_one() {
    let mut rig = Rig::new(&[("RUNED_WARM_MAX", "4")]).await;
    rig.runed.take().unwrap().shutdown().await;
    rig.spawn_binary().await;
    // One folder after the other, each box awaited: a box is not made while another
    // folder's run waits for a slot, and the outcome is recorded before the box is made.
    let mut boxes = Vec::new();
    for folder in ["warm-c", "warm-d"] {
        let r = rig.run(folder, &format!("turn-{folder}-1"), "hello").await;
        assert_eq!(rig.wait(&r).await["outcome"], "ok");
        boxes.push(rig.warm_boxes(folder, 1).await.remove(0));
    }
    let (taken, waiting) = (boxes.remove(0), boxes.remove(0));
    let run = rig
        .run("warm-c", "turn-warm-c-2", "/sleep 4\nafter the kill")
        .await;
    rig.wait_state(&run, "running").await;
    assert_eq!(rig.container_of(&run), taken.id);
    let (mut child, _) = rig.child.take().unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    rig.spawn_binary().await;
    let v = rig.wait(&run).await;
    assert_eq!(v["outcome"], "ok", "{v}");
    assert_eq!(results(&v), ["slept 4 s\nafter the kill"], "{v}");
    rig.until_gone(&waiting.id, Duration::from_secs(30)).await;
    rig.until_gone(&taken.id, Duration::from_secs(30)).await;
    let n = rig.spawns();
    assert_eq!(n, 3, "no box became a run of its own, nothing ran twice");
    rig.stop().await;
}

/// #27, a hostile image that says it waits (`io.hako.warm`) but writes into its follow-up
/// drop before its turn: the next run does not take that box (`dirty`) and starts cold. The
/// same image without the label gets no box at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn daemon_a_warm_box_that_writes_before_its_turn_is_not_taken() {
    let rig = Rig::new(&[("RUNED_WARM_MAX", "4")]).await;
    let docker = rig.docker();
    let hostile = common::hostile_image(&docker).await;
    let image = common::derived_image(
        &docker,
        &hostile,
        "hostile-warm",
        "LABEL io.hako.warm=\"1\"\nENV HOSTILE_EARLY=/workspace/ipc/input/planted.json",
    )
    .await;
    let run = |folder: &'static str, turn: &'static str, image: String| {
        let rig = &rig;
        async move {
            let (s, v) = rig
                .post(
                    &rig.routd,
                    "/v1/runs",
                    json!({"folder": folder, "turn_id": turn, "group": {"image": image},
                           "messages": [{"role": "user", "content": "write /tmp/x y"}]}),
                )
                .await;
            assert_eq!(s, 202, "{v}");
            let id = v["run_id"].as_str().unwrap().to_owned();
            let v = rig.wait(&id).await;
            assert_eq!(v["outcome"], "ok", "{v}");
            id
        }
    };
    // The same program without the label: never warmed (it would count its deadline from
    // its own start).
    run("warm-u", "turn-wu-1", hostile.clone()).await;
    run("warm-h", "turn-wh-1", image.clone()).await;
    let planted = rig.warm_boxes("warm-h", 1).await.remove(0);
    let input = rig.data.join("runed/folders/warm-h/input");
    eventually("the box writes", Duration::from_secs(30), || async {
        let planted = input.join("planted.json");
        if planted.exists() {
            Ok(())
        } else {
            Err(planted)
        }
    })
    .await;
    let second = run("warm-h", "turn-wh-2", image.clone()).await;
    assert_ne!(
        rig.container_of(&second),
        planted.id,
        "the dirty box was taken"
    );
    assert_eq!(
        metric(&rig, "runed_warm_misses_total", "reason=\"dirty\"").await,
        1.0
    );
    rig.until_gone(&planted.id, Duration::from_secs(30)).await;
    assert!(rig.warm_boxes("warm-u", 0).await.is_empty());
    rig.stop().await;
}

/// Media: a file a chat sent lands in the folder's `workspace/media/`, owned by the agent;
/// what the agent planted there (a symlink for the directory, a symlink at the name) is
/// replaced, never followed; bad names and folders, too large a file, a full directory, a
/// token of another folder or without `media:write` are refused with the envelope.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn media_lands_in_the_workspace_and_planted_links_are_never_followed() {
    use hako_shared::layout::{FolderDir, dir_rel};
    use std::os::unix::fs::MetadataExt;
    let rig = Rig::new(&[("RUNED_MEDIA_MAX", "4k"), ("RUNED_MEDIA_FOLDER_MAX", "10k")]).await;
    let api = rig.api();
    // The op's path and bytes, sent as they are (`testing::send` sends JSON only).
    let put = |folder: &str, name: &str, token: &str, data: Vec<u8>| {
        let api = api.clone();
        let op = runed::put_media(folder, name, data.into());
        let hako_client::Body::Bytes(data) = op.body else {
            unreachable!("a media upload is bytes")
        };
        let token = token.to_owned();
        async move {
            api.raw(
                op.method,
                &op.path,
                Some(&token),
                "application/octet-stream",
                data,
            )
            .await
        }
    };
    let folder = hako_shared::GroupFolder::new("acme/media").unwrap();
    let ws = rig
        .data
        .join("runed")
        .join(dir_rel(&folder, FolderDir::Workspace));
    let media = ws.join("media");

    // A folder nothing ran in yet: made, and the file is the agent's.
    let (s, v) = put(
        "acme/media",
        "photo.jpg",
        &rig.routd,
        b"jpeg bytes".to_vec(),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["path"], "/workspace/media/photo.jpg", "{v}");
    assert_eq!(v["bytes"], 10);
    assert_eq!(
        std::fs::read(media.join("photo.jpg")).unwrap(),
        b"jpeg bytes"
    );
    let meta = std::fs::metadata(media.join("photo.jpg")).unwrap();
    if rustix::process::geteuid().is_root() {
        assert_eq!(meta.uid(), 1000, "the agent's file");
    }

    // The agent replaced media/ with a link to a host directory, and put a link at a name.
    let outside = rig.data.join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("victim"), b"keep me").unwrap();
    std::fs::remove_dir_all(&media).unwrap();
    std::os::unix::fs::symlink(&outside, &media).unwrap();
    let (s, v) = put("acme/media", "victim", &rig.routd, b"overwritten?".to_vec()).await;
    assert_eq!(s, 200, "{v}");
    assert!(
        media.symlink_metadata().unwrap().is_dir(),
        "media/ is a directory again"
    );
    assert_eq!(std::fs::read(outside.join("victim")).unwrap(), b"keep me");
    assert_eq!(
        std::fs::read(media.join("victim")).unwrap(),
        b"overwritten?"
    );
    std::os::unix::fs::symlink(outside.join("victim"), media.join("doc.pdf")).unwrap();
    let (s, v) = put("acme/media", "doc.pdf", &rig.routd, b"pdf".to_vec()).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(std::fs::read(outside.join("victim")).unwrap(), b"keep me");
    assert!(
        !media
            .join("doc.pdf")
            .symlink_metadata()
            .unwrap()
            .is_symlink()
    );

    // Names and folders that could leave the directory.
    for name in ["..x", ".hidden", "a b", "x/../../y"] {
        let (s, v) = put("acme/media", name, &rig.routd, b"x".to_vec()).await;
        assert_eq!(
            (s, v["error"].as_str()),
            (400, Some("invalid_media_name")),
            "{name}: {v}"
        );
    }
    for folder in ["../../etc", "/abs", "a//b"] {
        let (s, v) = put(folder, "ok.txt", &rig.routd, b"x".to_vec()).await;
        assert_eq!(
            (s, v["error"].as_str()),
            (400, Some("invalid_request")),
            "{folder}: {v}"
        );
    }

    // One file over RUNED_MEDIA_MAX; then the folder's limit, where a file replaced counts
    // once.
    let (s, v) = put("acme/media", "big.bin", &rig.routd, vec![7; 5000]).await;
    assert_eq!(
        (s, v["error"].as_str()),
        (413, Some("body_too_large")),
        "{v}"
    );
    for i in 0..2 {
        let (s, v) = put(
            "acme/media",
            &format!("f{i}.bin"),
            &rig.routd,
            vec![1; 4000],
        )
        .await;
        assert_eq!(s, 200, "{v}");
    }
    let (s, v) = put("acme/media", "f2.bin", &rig.routd, vec![1; 4000]).await;
    assert_eq!((s, v["error"].as_str()), (413, Some("media_full")), "{v}");
    let (s, v) = put("acme/media", "f1.bin", &rig.routd, vec![2; 4000]).await;
    assert_eq!(s, 200, "a file replaced counts once: {v}");
    assert!(!media.join("f2.bin").exists());

    // Another folder's token; a token without media:write.
    let other = rig.mint(&["media:write"], Some("other"), 60).await;
    let (s, v) = put("acme/media", "x.txt", &other, b"x".to_vec()).await;
    assert_eq!((s, v["error"].as_str()), (404, Some("not_found")), "{v}");
    let reader = rig.mint(&["runs:read"], None, 60).await;
    let (s, v) = put("acme/media", "x.txt", &reader, b"x".to_vec()).await;
    assert_eq!(
        (s, v["error"].as_str()),
        (403, Some("insufficient_scope")),
        "{v}"
    );
    assert!(!media.join("x.txt").exists());
    rig.stop().await;
}
