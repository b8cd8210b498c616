//! runed's logic end to end with no Docker: a real authd and a real runed in-process on
//! loopback ports, a real `runed.db`, and boxes on the simulated engine
//! (`hako_runner::sim`), which runs hako-agent's script language in part. The queue, the
//! per-folder and per-tenant limits, kills, holds, steering, re-adoption after a restart and
//! the streams are runed's own logic: they are proven here in seconds. What only Docker can
//! show stays in `daemon.rs`.

mod rig;

use std::time::{Duration, Instant};

use hako_client::runed;
use hako_client::testing::send;
use hako_shared::runs::SteerRequest;
use hako_shared::testing::eventually;
use rig::*;
use serde_json::{Value, json};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn daemon_kill_queued_and_running() {
    let rig = Rig::sim(&[]).await;
    let long = rig.run("k", "turn-kill-1", "/sleep 60").await;
    let queued = rig.run("k", "turn-kill-2", "never").await;
    rig.wait_state(&long, "running").await;
    // The queued one is killed before it starts: it never starts.
    let (_, v) = send(&rig.api(), &rig.routd, runed::kill_run(&queued)).await;
    assert_eq!(
        (v["state"].as_str(), v["outcome"].as_str()),
        (Some("killed"), Some("killed"))
    );
    assert_eq!(v["started_at"], Value::Null);
    let t = Instant::now();
    let (_, v) = send(&rig.api(), &rig.routd, runed::kill_run(&long)).await;
    assert_eq!(
        (v["state"].as_str(), v["outcome"].as_str()),
        (Some("killed"), Some("killed")),
        "{v}"
    );
    assert!(t.elapsed() < Duration::from_secs(20));
    assert_eq!(rig.containers().await, 0, "the container is gone");
    // Not retried: a run queued in the folder after the kills runs and ends, and the
    // killed ones, which were ahead of it in the folder's queue, are still killed, the
    // queued one never started.
    let after = rig.run("k", "turn-kill-3", "after the kills").await;
    assert_eq!(rig.wait(&after).await["outcome"], "ok");
    let (_, v) = rig.status(&queued).await;
    assert_eq!(v["state"], "killed");
    assert_eq!(v["started_at"], Value::Null);
    let (_, v) = rig.status(&long).await;
    assert_eq!(v["state"], "killed", "{v}");
    let n: i64 = rig
        .db()
        .query_row("SELECT count(*) FROM spawns WHERE folder = 'k'", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(n, 3, "no run was added for a retry");
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn daemon_detach_and_readopt() {
    let mut rig = Rig::sim(&[]).await;
    // Re-attached while running.
    let a = rig.run("ra", "turn-ra-1", "/sleep 6\nafter sleep").await;
    rig.wait_state(&a, "running").await;
    rig.runed.take().unwrap().shutdown().await;
    rig.start_runed().await;
    let v = rig.wait(&a).await;
    assert_eq!(v["outcome"], "ok", "{v}");
    assert!(results(&v).join("\n").contains("after sleep"), "{v}");
    // Finished while runed was down (the agent exits by itself after its block): output
    // recovered from the stopped container.
    let b = rig
        .run("rb", "turn-rb-1", "/sleep 1\n/blocks 1\n/exit 0")
        .await;
    rig.wait_state(&b, "running").await;
    let runner = rig.runner();
    rig.runed.take().unwrap().shutdown().await;
    eventually(
        "the container finishes",
        Duration::from_secs(30),
        || async {
            let running: Vec<_> = runner
                .list_agents()
                .await
                .unwrap()
                .into_iter()
                .filter(|c| c.state == "running")
                .collect();
            if running.is_empty() {
                Ok(())
            } else {
                Err(running)
            }
        },
    )
    .await;
    rig.start_runed().await;
    let v = rig.wait(&b).await;
    assert_eq!(v["outcome"], "ok", "{v}");
    let out = results(&v);
    assert_eq!(
        out.iter().filter(|r| r.contains("block 1/1")).count(),
        1,
        "{out:?}"
    );
    let n = rig.spawns();
    assert_eq!(n, 2, "nothing ran twice");
    assert_eq!(rig.containers().await, 0);
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn daemon_one_live_run_per_folder_under_50_requests() {
    let rig = std::sync::Arc::new(Rig::sim(&[]).await);
    let mut hs = Vec::new();
    for i in 0..50 {
        let rig = rig.clone();
        hs.push(tokio::spawn(async move {
            rig.run("solo", &format!("turn-solo-{i}"), "x").await
        }));
    }
    let mut runs = Vec::new();
    for h in hs {
        runs.push(h.await.unwrap());
    }
    let mut spans = Vec::new();
    for r in &runs {
        let v = rig.wait(r).await;
        assert_eq!(v["outcome"], "ok", "{v}");
        spans.push((
            v["started_at"].as_str().unwrap().to_owned(),
            v["ended_at"].as_str().unwrap().to_owned(),
        ));
    }
    // RFC 3339 in one zone sorts as text: no two runs of the folder overlap.
    spans.sort();
    for w in spans.windows(2) {
        assert!(w[0].1 <= w[1].0, "overlap: {w:?}");
    }
    match std::sync::Arc::try_unwrap(rig) {
        Ok(rig) => rig.stop().await,
        Err(_) => panic!("rig still shared"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn daemon_steer_delivers_a_follow_up_exactly_once() {
    // The agent waits for follow-ups until it has been idle this long after its output.
    let rig = Rig::sim(&[("RUNED_IDLE_TIMEOUT", "8s")]).await;
    let run = rig.run("st", "turn-steer-1", "first answer").await;
    rig.wait_outputs(&run, 1).await;
    let body: SteerRequest = serde_json::from_value(
        json!({"steer_id": "f-1", "messages": [{"role": "user", "content": "steered line"}]}),
    )
    .unwrap();
    let (s, v) = send(&rig.api(), &rig.routd, runed::steer(&run, &body)).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(
        (v["steer_id"].as_str(), v["state"].as_str()),
        (Some("f-1"), Some("placed")),
        "{v}"
    );
    // A repeat (a caller that lost the answer) places nothing new.
    let (s, v) = send(&rig.api(), &rig.routd, runed::steer(&run, &body)).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["steer_id"], "f-1", "{v}");
    let bad: SteerRequest =
        serde_json::from_value(json!({"steer_id": "../x", "messages": ["bad id"]})).unwrap();
    let (s, v) = send(&rig.api(), &rig.routd, runed::steer(&run, &bad)).await;
    assert_eq!(
        (s, v["error"].as_str()),
        (400, Some("invalid_request")),
        "{v}"
    );
    let v = rig.wait(&run).await;
    assert_eq!(v["outcome"], "ok", "{v}");
    assert_eq!(
        v["steers"],
        json!([{"steer_id": "f-1", "state": "taken"}]),
        "the run's record says the agent took it"
    );
    let out = results(&v);
    assert!(out[0].contains("first answer"), "{out:?}");
    assert_eq!(
        out.iter().filter(|r| r.contains("steered line")).count(),
        1,
        "the follow-up is answered exactly once: {out:?}"
    );
    assert!(
        rig.input_files("st").is_empty(),
        "{:?}",
        rig.input_files("st")
    );
    // After the end: reported as not delivered, nothing left behind.
    let late: SteerRequest = serde_json::from_value(json!({"messages": ["too late"]})).unwrap();
    let (s, v) = send(&rig.api(), &rig.routd, runed::steer(&run, &late)).await;
    assert_eq!((s, v["error"].as_str()), (409, Some("not_live")), "{v}");
    assert!(
        rig.input_files("st").is_empty(),
        "{:?}",
        rig.input_files("st")
    );
    let (_, v) = rig.status(&run).await;
    assert_eq!(results(&v).len(), out.len(), "nothing more was answered");
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn daemon_cap_holds_under_200_runs_across_20_folders() {
    let rig = std::sync::Arc::new(Rig::sim(&[("MAX_CONTAINERS", "4")]).await);
    // Count this install's containers while the runs go.
    let runner = rig.runner();
    let done = tokio_util::sync::CancellationToken::new();
    let sampler = {
        let done = done.clone();
        tokio::spawn(async move {
            let mut max = 0;
            let mut samples = 0;
            while !done.is_cancelled() {
                if let Ok(l) = runner.list_agents().await {
                    max = max.max(l.len());
                    samples += 1;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            (max, samples)
        })
    };
    let mut hs = Vec::new();
    for i in 0..200 {
        let rig = rig.clone();
        hs.push(tokio::spawn(async move {
            rig.run(&format!("cap{}", i % 20), &format!("turn-cap-{i}"), "x")
                .await
        }));
    }
    let mut runs = Vec::new();
    for h in hs {
        runs.push(h.await.unwrap());
    }
    let mut edges = Vec::new();
    for r in &runs {
        let v = rig.wait(r).await;
        assert_eq!(v["outcome"], "ok", "{v}");
        edges.push((v["started_at"].as_str().unwrap().to_owned(), 1i32));
        edges.push((v["ended_at"].as_str().unwrap().to_owned(), -1i32));
    }
    done.cancel();
    let (max_seen, samples) = sampler.await.unwrap();
    assert!(samples > 10, "the sampler ran ({samples})");
    assert!(max_seen <= 4, "{max_seen} containers alive at once");
    // Ends sort before starts at the same instant (RFC 3339 in one zone sorts as text).
    edges.sort();
    let (mut live, mut peak) = (0, 0);
    for (_, d) in &edges {
        live += d;
        peak = peak.max(live);
    }
    assert!(peak <= 4, "{peak} runs overlapped");
    assert!(peak >= 2, "runs ran in parallel ({peak})");
    match std::sync::Arc::try_unwrap(rig) {
        Ok(rig) => rig.stop().await,
        Err(_) => panic!("rig still shared"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn daemon_events_stream_states_and_blocks() {
    let rig = Rig::sim(&[]).await;
    // A run queued behind another, so the stream sees it from the start.
    let first = rig.run("ev", "turn-ev-0", "/sleep 1").await;
    let run = rig.run("ev", "turn-ev-1", "/blocks 2").await;
    let mut r = rig
        .http
        .get(rig.url(&runed::run_events(&run).path))
        .bearer_auth(&rig.routd)
        .timeout(Duration::from_secs(60))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let mut text = String::new();
    // The stream ends after the terminal state.
    while let Some(chunk) = r.chunk().await.unwrap() {
        text.push_str(&String::from_utf8_lossy(&chunk));
        assert!(text.len() < 1 << 20);
    }
    let events: Vec<(String, Value)> = text
        .split("\n\n")
        .filter_map(|ev| {
            let name = ev.lines().find_map(|l| l.strip_prefix("event: "))?;
            let data = ev.lines().find_map(|l| l.strip_prefix("data: "))?;
            Some((name.to_owned(), serde_json::from_str(data).ok()?))
        })
        .collect();
    let states: Vec<&str> = events
        .iter()
        .filter(|(n, _)| n == "state")
        .map(|(_, v)| v["state"].as_str().unwrap())
        .collect();
    assert_eq!(
        states,
        ["queued", "starting", "running", "exited"],
        "{text}"
    );
    let blocks: Vec<&str> = events
        .iter()
        .filter(|(n, _)| n == "output")
        .map(|(_, v)| v["block"]["result"].as_str().unwrap_or_default())
        .collect();
    assert!(blocks.len() >= 2, "{text}");
    assert!(blocks[0].contains("block 1/2"), "{blocks:?}");
    assert!(blocks[1].contains("block 2/2"), "{blocks:?}");
    // Blocks arrive before the final state.
    let last_out = events.iter().rposition(|(n, _)| n == "output").unwrap();
    assert_eq!(events.len() - 1, last_out + 1, "{text}");
    rig.wait(&first).await;
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn daemon_holds_and_stop() {
    let rig = Rig::sim(&[]).await;
    let (s, v) = rig
        .post(
            &rig.routd,
            "/v1/holds",
            json!({"folder": "hd", "ttl": "60s"}),
        )
        .await;
    assert_eq!(s, 202, "{v}");
    let hold = v["run_id"].as_str().unwrap().to_owned();
    rig.wait_state(&hold, "running").await;
    let run = rig.run("hd", "turn-hd-1", "after the hold").await;
    // Another folder is not blocked.
    let other = rig.run("hd2", "turn-hd-2", "elsewhere").await;
    assert_eq!(rig.wait(&other).await["outcome"], "ok");
    let (_, v) = rig.status(&run).await;
    assert_eq!(v["state"], "queued", "the hold blocks its folder: {v}");
    let (s, v) = send(&rig.api(), &rig.routd, runed::kill_run(&hold)).await;
    assert_eq!(s, 200, "{v}");
    assert!(
        ["exited", "killed"].contains(&v["state"].as_str().unwrap()),
        "{v}"
    );
    let v = rig.wait(&run).await;
    assert_eq!(v["outcome"], "ok", "released: {v}");
    // POST /v1/runs/stop kills the folder's live run and the one waiting behind it (a stop
    // must not let a queued run start after it); another folder's run is untouched.
    let long = rig.run("sp", "turn-sp-1", "/sleep 60").await;
    let keep = rig.run("sp2", "turn-sp-2", "/sleep 2\nkept").await;
    rig.wait_state(&long, "running").await;
    let waiting = rig.run("sp", "turn-sp-3", "never runs").await;
    let (s, v) = rig
        .post(&rig.routd, "/v1/runs/stop", json!({"folder": "sp"}))
        .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["killed"], json!([long, waiting]), "{v}");
    for id in [&long, &waiting] {
        let (_, v) = rig.status(id).await;
        assert_eq!(
            (v["state"].as_str(), v["outcome"].as_str()),
            (Some("killed"), Some("killed")),
            "{v}"
        );
    }
    let v = rig.wait(&keep).await;
    assert_eq!(v["outcome"], "ok", "{v}");
    // A folder-bound caller cannot stop another folder.
    let a = rig.mint(&["runs:kill"], Some("a"), 60).await;
    let (s, _) = rig.post(&a, "/v1/runs/stop", json!({"folder": "sp"})).await;
    assert_eq!(s, 403);
    assert_eq!(rig.containers().await, 0);
    // The audit log: the operator reads it; others cannot.
    let (s, v) = rig.get(&rig.operator, "/v1/audit").await;
    assert_eq!(s, 200, "{v}");
    let actions: Vec<&str> = v["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["action"].as_str().unwrap())
        .collect();
    for want in ["hold.create", "run.kill", "run.stop"] {
        assert!(actions.contains(&want), "{want} in {actions:?}");
    }
    let reader = rig.mint(&["runs:read"], None, 60).await;
    let (s, v) = rig.get(&reader, "/v1/audit").await;
    assert_eq!((s, v["error"].as_str()), (403, Some("insufficient_scope")));
    let bound = rig
        .mint_from(&rig.operator, &["audit:read"], Some("sp"), 60)
        .await;
    let (s, v) = rig.get(&bound, "/v1/audit").await;
    assert_eq!(
        (s, v["error"].as_str()),
        (403, Some("folder_forbidden")),
        "{v}"
    );
    rig.stop().await;
}

/// Item 10: streams and long-polls are bounded per caller (and overall): one caller cannot
/// pin the daemon's memory and connections with streams that never end.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn daemon_streams_and_long_polls_are_bounded_per_caller() {
    let rig = Rig::sim(&[("RUNED_MAX_STREAMS_PER_CALLER", "2")]).await;
    let run = rig.run("streams", "turn-streams-1", "/sleep 20").await;
    let open = |token: String| {
        let (http, url) = (rig.http.clone(), rig.url(&runed::run_events(&run).path));
        async move { http.get(url).bearer_auth(token).send().await.unwrap() }
    };
    let a = open(rig.routd.clone()).await;
    let b = open(rig.routd.clone()).await;
    assert_eq!((a.status().as_u16(), b.status().as_u16()), (200, 200));
    let c = open(rig.routd.clone()).await;
    assert_eq!(c.status().as_u16(), 429);
    let v: Value = c.json().await.unwrap();
    assert_eq!(v["error"], "too_many_streams", "{v}");
    // A long-poll counts too; another caller is not held back.
    let op = runed::run(&run).query("wait", "1s");
    let (s, v) = send(&rig.api(), &rig.routd, op).await;
    assert_eq!(
        (s, v["error"].as_str()),
        (429, Some("too_many_streams")),
        "{v}"
    );
    let other = open(rig.operator.clone()).await;
    assert_eq!(other.status().as_u16(), 200);
    drop((a, b, other));
    let (s, _) = send(&rig.api(), &rig.routd, runed::kill_run(&run)).await;
    assert_eq!(s, 200);
    rig.stop().await;
}

/// One tenant's many sub-groups cannot take every slot: with two slots, a tenant (a folder's
/// first segment) holds one, and another tenant's run starts at once in the other (it waited
/// for the first tenant's long runs before: a reply of 0.4 s took 40.7 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn daemon_one_tenant_cannot_take_every_slot() {
    let rig = Rig::sim(&[("MAX_CONTAINERS", "2"), ("RUNED_RUN_TIMEOUT", "120s")]).await;
    let mut acme = Vec::new();
    for i in 0..3 {
        acme.push(
            rig.run(
                &format!("acme/g{i}"),
                &format!("turn-fair-a{i}"),
                "/sleep 60",
            )
            .await,
        );
    }
    let beta = rig.run("beta", "turn-fair-b", "quick").await;
    let v = rig.wait(&beta).await;
    assert_eq!(v["outcome"], "ok", "{v}");
    let states: Vec<String> = {
        let mut s = Vec::new();
        for r in &acme {
            let (_, v) = rig.status(r).await;
            s.push(v["state"].as_str().unwrap().to_owned());
        }
        s
    };
    assert_eq!(
        states.iter().filter(|s| *s == "queued").count(),
        2,
        "acme holds one slot of two while beta runs: {states:?}"
    );
    for r in &acme {
        let (s, _) = send(&rig.api(), &rig.routd, runed::kill_run(r)).await;
        assert_eq!(s, 200);
    }
    rig.stop().await;
}

/// Every error any route gives is the envelope: the strict client sends every kind of bad
/// input (no token, a forged one, a malformed query, malformed JSON, a wrong content type, a
/// body of the wrong shape) to every operation the OpenAPI document lists.
/// A folder's next box waits while another folder's run is live (it would take that run's
/// CPU), and is made once runed is idle: after a burst every folder that ran last has its box.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn daemon_a_warm_box_waits_for_the_other_runs_to_end() {
    let rig = Rig::sim(&[("RUNED_WARM_MAX", "4")]).await;
    let slow = rig.run("wb", "turn-wb-1", "/sleep 5\nb done").await;
    rig.wait_state(&slow, "running").await;
    let quick = rig.run("wa", "turn-wa-1", "a done").await;
    assert_eq!(rig.wait(&quick).await["outcome"], "ok");
    // Watched until the slow run ends, at least a second of it after the quick one ended.
    let mut watched = Duration::ZERO;
    let t = Instant::now();
    loop {
        let boxes = rig.warm_now("wa").await.len();
        let (_, v) = rig.status(&slow).await;
        if v["state"] != "running" {
            break;
        }
        assert_eq!(boxes, 0, "a box was made beside a live run");
        watched = t.elapsed();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        watched >= Duration::from_secs(1),
        "the slow run ended {watched:?} after the quick one: nothing was shown"
    );
    assert_eq!(rig.wait(&slow).await["outcome"], "ok");
    // Idle now: both folders have their box, and the next turn takes the put-off one.
    let put_off = rig.warm_boxes("wa", 1).await;
    rig.warm_boxes("wb", 1).await;
    let next = rig.run("wa", "turn-wa-2", "again").await;
    assert_eq!(rig.wait(&next).await["outcome"], "ok");
    assert_eq!(
        rig.container_of(&next),
        put_off[0].id,
        "the next turn took the box"
    );
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn daemon_every_route_answers_errors_as_envelopes() {
    let rig = Rig::sim(&[]).await;
    // The served document is the generated one, and it is the committed one.
    let (s, doc) = rig.get(&rig.routd, "/openapi.json").await;
    assert_eq!(s, 200);
    assert_eq!(doc, serde_json::to_value(hako_runed::openapi()).unwrap());
    assert_eq!(
        doc,
        serde_json::from_str::<Value>(hako_runed::OPENAPI).unwrap()
    );
    let sent = rig
        .api()
        .sweep_errors(hako_runed::OPENAPI, &rig.routd)
        .await;
    assert!(sent > 40, "{sent}");
    // The review's examples, by name (raw on purpose: malformed queries no op would build).
    for path in [
        "/v1/sessions?limit=x",
        "/v1/audit?limit=x",
        "/v1/runs/x?wait=soon",
    ] {
        let (s, v) = rig.get(&rig.operator, path).await;
        assert_eq!(s, 400, "{path}: {v}");
    }
    rig.stop().await;
}

/// The committed OpenAPI document passes an independent validator (openapi-spec-validator).
/// schemathesis (an independent API tester) generates requests from runed's served document,
/// valid and invalid, and finds no answer the document does not describe. Its coverage phase
/// is left out here: schemathesis 4.32 crashes building cases for `POST /v1/runs`'s schema.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn daemon_schemathesis_finds_no_answer_the_document_does_not_describe() {
    let rig = Rig::sim(&[]).await;
    let (url, token) = (rig.url(""), rig.routd.clone());
    tokio::task::spawn_blocking(move || {
        hako_shared::testing::schemathesis(&url, &token, "examples,fuzzing,stateful")
    })
    .await
    .expect("schemathesis");
    rig.stop().await;
}
