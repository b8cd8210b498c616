//! routd end to end: a real authd, runed and routd (in-process on loopback ports, or the
//! `routd` binary where a test kills it), the real `hako-agent` as host processes on the
//! simulated engine (no Docker: routd's logic, with the real pair), real databases, a
//! webhook receiver on loopback. Every assertion is what the chat sees: its history, its
//! event stream, its webhook.

mod common;

use std::time::{Duration, Instant};

use common::*;
use hako_client::authd::AuthdClient;
use hako_client::routd;
use hako_client::testing::send;
use hako_shared::auth::wire::MintRequest;
use hako_shared::chat::{MessageState, MessageView};
use serde_json::{Value, json};

/// A message in, the agent's echo out: in the history, on the chat's event stream, and on a
/// signed webhook; the turn records what ran.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_message_in_and_the_reply_out_on_sse_and_webhook() {
    let rig = Rig::sim(&[], &[]).await;
    let chat = "tg:100";
    rig.group_for("team/a", chat).await;
    let (recv, url) = Receiver::start(0).await;
    let secret = "webhook-secret-0123456789";
    let (s, v) = rig
        .api()
        .post(
            &rig.operator,
            "/v1/webhooks",
            json!({"prefix": "tg:", "url": url, "secret": secret}),
        )
        .await;
    assert_eq!(s, 201, "{v}");
    assert!(v.get("secret").is_none(), "the secret is never shown: {v}");
    // A stream open before the message: it sees the message and the reply.
    let events_url = format!("{}{}", rig.base(), routd::chat_events(chat).path);
    let op = rig.operator.clone();
    let stream = tokio::spawn(async move { sse(&events_url, &op, None, 2).await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let posted = rig.say(chat, "msg-1", "hello, hako").await;
    assert_eq!(
        (posted["routed"].as_bool(), posted["folder"].as_str()),
        (Some(true), Some("team/a"))
    );
    // The reply goes out as it streams; the turn ends (and answers the message) after.
    let h = rig
        .wait_for(chat, "the reply", |h| {
            !replies(h).is_empty() && h[0].state == MessageState::Answered
        })
        .await;
    assert_eq!(replies(&h), ["hello, hako"]);
    let reply = h
        .iter()
        .find(|m| m.content == "hello, hako" && m.direction == hako_shared::chat::Direction::Out)
        .unwrap();
    assert_eq!(reply.reply_to.as_deref(), Some("msg-1"));
    let inbound = &h[0];
    assert_eq!(
        (inbound.id.as_str(), inbound.state.as_str()),
        ("msg-1", "answered")
    );
    let events = stream.await.unwrap();
    assert_eq!(events[0].1["id"], "msg-1");
    assert_eq!(events[1].1["content"], "hello, hako");
    assert!(events[0].0 < events[1].0, "event ids are the log's seqs");
    // The webhook: one signed delivery of the reply, keyed by its id.
    eventually("a webhook delivery", LIMIT, || async {
        if recv.requests().is_empty() {
            Err(())
        } else {
            Ok(())
        }
    })
    .await;
    let (headers, body, _) = recv.requests()[0].clone();
    assert!(signature_ok(secret, &headers, &body), "{headers:?}");
    assert!(!signature_ok("another-secret-0123456789", &headers, &body));
    assert_eq!(headers["idempotency-key"], reply.id);
    let delivered: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(delivered["message"]["content"], "hello, hako");
    let turn = rig.turn(reply.turn_id.as_deref().unwrap()).await;
    assert_eq!(
        (
            turn["state"].as_str(),
            turn["outcome"].as_str(),
            turn["attempt"].as_i64(),
            turn["replies"].as_i64()
        ),
        (Some("done"), Some("ok"), Some(1), Some(1)),
        "{turn}"
    );
    assert_eq!(turn["messages"], json!(["msg-1"]));
    assert!(turn["run_id"].as_str().unwrap().starts_with("run-"));
    let h = rig
        .wait_for(chat, "delivered", |h| {
            h.iter().any(|m| m.state == MessageState::Delivered)
        })
        .await;
    assert_eq!(
        h.iter()
            .filter(|m| m.state == MessageState::Delivered)
            .count(),
        1
    );
    rig.stop().await;
}

/// Three messages arriving while the chat's turn is live: each is answered (steered into the
/// live run, or in the next turn), none lost, none twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn messages_during_a_live_turn_are_all_answered_once() {
    // The run stays up 4 s after its reply, taking follow-ups.
    let rig = Rig::sim(&[("RUNED_IDLE_TIMEOUT", "4s")], &[]).await;
    let chat = "tg:200";
    rig.group_for("steer", chat).await;
    rig.say(chat, "s-1", "/sleep 2\nfirst").await;
    // Wait until the turn runs, then three more.
    rig.first_running(None).await;
    for (id, text) in [("s-2", "second"), ("s-3", "third"), ("s-4", "fourth")] {
        rig.say(chat, id, text).await;
    }
    let h = rig
        .wait_for(chat, "every message answered", |h| {
            h.iter()
                .filter(|m| m.direction == hako_shared::chat::Direction::In)
                .all(|m| m.state == MessageState::Answered)
        })
        .await;
    let all = replies(&h).join("\n");
    for word in ["first", "second", "third", "fourth"] {
        assert_eq!(
            all.matches(word).count(),
            1,
            "{word} answered exactly once: {all:?}"
        );
    }
    rig.stop().await;
}

/// A message steered into a run that ends before its agent takes it: the run's end does not
/// answer it; the next turn does (a message handed over as a run ends was once lost here).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_message_steered_as_the_run_ends_is_answered_by_the_next_turn() {
    let rig = Rig::sim(&[], &[]).await;
    let chat = "tg:210";
    rig.group_for("ending", chat).await;
    // A reply, then a busy agent that exits without reading its follow-ups.
    rig.say(chat, "e-1", "/blocks 1\n/sleep 3\n/exit 0").await;
    rig.wait_for(chat, "the first reply", |h| !replies(h).is_empty())
        .await;
    rig.say(chat, "e-2", "late").await;
    let h = rig
        .wait_for(chat, "every message answered", |h| {
            h.iter()
                .filter(|m| m.direction == hako_shared::chat::Direction::In)
                .all(|m| m.state == MessageState::Answered)
                && replies(h).iter().any(|r| r.contains("late"))
        })
        .await;
    let turn_of = |id: &str| {
        h.iter()
            .find(|m| m.id == id)
            .and_then(|m| m.turn_id.clone())
            .unwrap()
    };
    assert_ne!(turn_of("e-1"), turn_of("e-2"), "{h:?}");
    assert_eq!(
        replies(&h).iter().filter(|r| r.contains("late")).count(),
        1,
        "{h:?}"
    );
    rig.stop().await;
}

/// A turn whose run says `fatal` with no output is tried again, really (a new run), then its
/// messages fail and the chat gets a notice.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fatal_turn_is_retried_then_failed_with_a_notice() {
    let rig = Rig::sim(&[], &[("ROUTD_MAX_TURN_RETRIES", "1")]).await;
    let chat = "tg:300";
    rig.group_for("fatal", chat).await;
    rig.say(chat, "f-1", "/fatal boom\n/exit 1").await;
    let h = rig
        .wait_for(chat, "the failure notice", |h| !notices(h).is_empty())
        .await;
    assert!(replies(&h).is_empty(), "{h:?}");
    let n = notices(&h);
    assert_eq!(n.len(), 1, "{n:?}");
    assert!(n[0].contains("after 2 tries"), "{n:?}");
    assert_eq!(h[0].state, MessageState::Failed);
    let turn = rig.turn(h[0].turn_id.as_deref().unwrap()).await;
    assert_eq!(
        (
            turn["state"].as_str(),
            turn["attempt"].as_i64(),
            turn["outcome"].as_str()
        ),
        (Some("failed"), Some(2), Some("fatal")),
        "{turn}"
    );
    // Two real runs on runed, one per try.
    let runed = hako_shared::testing::ApiClient::new(rig.runed_url());
    let (s, v) = runed.get(&rig.operator, "/v1/sessions?folder=fatal").await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["sessions"].as_array().unwrap().len(), 2, "{v}");
    rig.stop().await;
}

/// Slash commands: `/ping`, `/chatid`, `/new` (a fresh session next turn) and `/stop` (the
/// live run killed; the turn ends `killed` with a notice and is never retried). None of them
/// reaches the agent.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn slash_commands_new_stop_ping_chatid() {
    let rig = Rig::sim(&[], &[]).await;
    let chat = "tg:400";
    rig.group_for("cmds", chat).await;
    rig.say(chat, "c-1", "/ping").await;
    rig.say(chat, "c-2", "/chatid").await;
    let h = rig
        .wait_for(chat, "answers", |h| notices(h).len() == 2)
        .await;
    assert_eq!(notices(&h)[0], "pong");
    assert!(notices(&h)[1].contains("tg:400") && notices(&h)[1].contains("cmds"));
    assert!(
        h.iter()
            .filter(|m| m.kind == hako_shared::chat::MessageKind::Command)
            .all(|m| m.state == MessageState::Handled)
    );
    // A session the agent announces is sent on the next turn; /new drops it.
    rig.say(chat, "c-3", "/session s-77").await;
    rig.wait_for(chat, "the session reply", |h| {
        replies(h).iter().any(|r| r == "session: s-77")
    })
    .await;
    let (_, g) = rig.api().get(&rig.operator, "/v1/groups/cmds").await;
    assert_eq!(
        (
            g["sessions"][0]["chat_jid"].as_str(),
            g["sessions"][0]["session_id"].as_str()
        ),
        (Some(chat), Some("s-77")),
        "the chat's session: {g}"
    );
    // The next message must start a turn of its own (not be steered into this one).
    rig.wait_idle("cmds").await;
    rig.say(chat, "c-4", "/echo-input").await;
    let h = rig.wait_for(chat, "echo", |h| replies(h).len() == 2).await;
    assert!(
        replies(&h)[1].contains(r#""sessionId":"s-77""#),
        "{:?}",
        replies(&h)
    );
    rig.say(chat, "c-5", "/new").await;
    rig.wait_for(chat, "new", |h| notices(h).len() == 3).await;
    let (_, g) = rig.api().get(&rig.operator, "/v1/groups/cmds").await;
    assert_eq!(g["sessions"], serde_json::json!([]), "{g}");
    rig.wait_idle("cmds").await;
    rig.say(chat, "c-6", "/echo-input").await;
    let h = rig.wait_for(chat, "echo", |h| replies(h).len() == 3).await;
    assert!(
        replies(&h)[2].contains(r#""sessionId":"""#),
        "{:?}",
        replies(&h)
    );
    // /stop during a long run.
    rig.wait_idle("cmds").await;
    rig.say(chat, "c-7", "/sleep 60").await;
    let turn_id = rig.first_running(None).await["turn_id"]
        .as_str()
        .unwrap()
        .to_owned();
    rig.say(chat, "c-8", "/stop").await;
    let h = rig
        .wait_for(chat, "stopped", |h| {
            notices(h).iter().any(|n| n.contains("was stopped"))
        })
        .await;
    assert!(
        notices(&h).iter().any(|n| n == "Stopped."),
        "{:?}",
        notices(&h)
    );
    let turn = rig.turn(&turn_id).await;
    assert_eq!(
        (turn["state"].as_str(), turn["attempt"].as_i64()),
        (Some("killed"), Some(1))
    );
    // `killed` is over: no step leaves it (store::turns' unit test goes through every
    // state and step), so nothing retries the turn.
    assert!(turn["ended_at"].is_i64(), "{turn}");
    rig.stop().await;
}

/// A client reconnecting with `Last-Event-ID` gets exactly what it missed, from the log.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sse_resumes_from_last_event_id() {
    let rig = Rig::sim(&[], &[]).await;
    let chat = "web:resume";
    let (s, v) = rig
        .api()
        .put(&rig.operator, "/v1/groups/resume", json!({"name": "r"}))
        .await;
    assert_eq!(s, 201, "{v}");
    rig.say(chat, "r-1", "one").await;
    rig.wait_for(chat, "reply one", |h| replies(h).len() == 1)
        .await;
    rig.say(chat, "r-2", "two").await;
    let h = rig
        .wait_for(chat, "reply two", |h| replies(h).len() == 2)
        .await;
    assert_eq!(h.len(), 4);
    let url = format!("{}{}", rig.base(), routd::chat_events(chat).path);
    let got = sse(&url, &rig.operator, Some(h[0].seq), 3).await;
    let ids: Vec<i64> = got.iter().map(|(id, _)| *id).collect();
    assert_eq!(ids, h[1..].iter().map(|m| m.seq).collect::<Vec<_>>());
    assert_eq!(got[2].1["content"], "two");
    rig.stop().await;
}

/// routd killed with SIGKILL while a turn runs: restarted, it follows the same run to its end
/// and binds the turn's socket again (the agent's tool call after the restart works); the
/// reply is delivered once, and nothing runs twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn routd_killed_mid_turn_resumes_it() {
    let mut rig = Rig::sim(&[], &[]).await;
    rig.spawn_routd_binary().await;
    let chat = "tg:600";
    rig.group_for("crash", chat).await;
    // The agent calls its tools after the restart: the new routd bound the socket again.
    rig.say(chat, "k-1", "/sleep 3\n/mcp list_tasks\nsurvivor")
        .await;
    let t = rig.first_running(None).await;
    let (turn_id, run_id) = (
        t["turn_id"].as_str().unwrap().to_owned(),
        t["run_id"].as_str().unwrap().to_owned(),
    );
    let (mut child, _) = rig.child.take().unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    rig.spawn_routd_binary().await;
    let h = rig
        .wait_for(chat, "the reply after the restart", |h| {
            !replies(h).is_empty()
        })
        .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let h2 = rig.history(chat).await;
    assert_eq!(h.len(), h2.len(), "nothing more arrives");
    assert_eq!(
        replies(&h2),
        ["slept 3 s\nmcp list_tasks: {\"tasks\":[]}\nsurvivor"]
    );
    // The turn ends with its run (the agent exits after its reply, a moment later).
    let turn = eventually("the turn ends", LIMIT, || async {
        let turn = rig.turn(&turn_id).await;
        if turn["state"] != "running" {
            Ok(turn)
        } else {
            Err(turn)
        }
    })
    .await;
    assert_eq!(
        (
            turn["state"].as_str(),
            turn["attempt"].as_i64(),
            turn["run_id"].as_str()
        ),
        (Some("done"), Some(1), Some(run_id.as_str())),
        "the same run, followed to its end: {turn}"
    );
    rig.stop().await;
}

/// runed away for a while: the turn waits (visible in `/ready`, the metric and the turn's
/// state) and runs when runed is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn runed_down_then_back() {
    let mut rig = Rig::sim(&[], &[]).await;
    let chat = "tg:700";
    rig.group_for("outage", chat).await;
    rig.runed.take().unwrap().shutdown().await;
    rig.say(chat, "o-1", "patience").await;
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let r = http
        .get(format!("{}/ready", rig.base()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 503);
    let v: Value = r.json().await.unwrap();
    assert!(v["message"].as_str().unwrap().contains("runed"), "{v}");
    // The turn's first try finds runed away and says so in the metric.
    eventually("routd sees runed unavailable", LIMIT, || async {
        let metrics = rig.metrics().await;
        if metrics.contains("routd_runed_unavailable 1") {
            Ok(())
        } else {
            Err(metrics)
        }
    })
    .await;
    let (_, v) = rig
        .api()
        .get(&rig.operator, "/v1/turns?state=starting")
        .await;
    assert_eq!(v["turns"].as_array().unwrap().len(), 1, "{v}");
    assert!(replies(&rig.history(chat).await).is_empty());
    rig.start_runed().await;
    let h = rig
        .wait_for(chat, "the reply once runed is back", |h| {
            !replies(h).is_empty()
        })
        .await;
    assert_eq!(replies(&h), ["patience"]);
    rig.stop().await;
}

/// A webhook receiver that fails, then recovers: the message is retried (same idempotency
/// key, every attempt recorded) until delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failing_webhook_is_retried_until_it_recovers() {
    let rig = Rig::sim(&[], &[]).await;
    let chat = "wa:800";
    rig.group_for("hooks", chat).await;
    let (recv, url) = Receiver::start(2).await;
    let (s, v) = rig
        .api()
        .post(
            &rig.operator,
            "/v1/webhooks",
            json!({"prefix": "wa:", "url": url, "secret": "0123456789abcdef"}),
        )
        .await;
    assert_eq!(s, 201, "{v}");
    rig.say(chat, "w-1", "ring").await;
    let h = rig
        .wait_for(chat, "delivered", |h| {
            h.iter().any(|m| m.state == MessageState::Delivered)
        })
        .await;
    let reqs = recv.requests();
    assert_eq!(
        reqs.iter().map(|r| r.2).collect::<Vec<_>>(),
        [503, 503, 200]
    );
    let keys: Vec<&String> = reqs.iter().map(|r| &r.0["idempotency-key"]).collect();
    assert!(
        keys.iter().all(|k| *k == keys[0]),
        "one key for every attempt"
    );
    let reply = h
        .iter()
        .find(|m| m.state == MessageState::Delivered)
        .unwrap();
    assert_eq!(&reply.id, keys[0]);
    rig.stop().await;
}

/// A receiver that never takes the message: it is tried exactly `ROUTD_WEBHOOK_ATTEMPTS`
/// times, backing off, then marked undeliverable, and nobody is called again. (routd once
/// read the attempt count from the wrong column: every try was "the first", 100 ms apart
/// here, and a dead receiver was called for a day.) And the turn's latency metric is the
/// time from the message to the reply, not since 1970.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dead_webhook_is_tried_a_bounded_number_of_times() {
    let rig = Rig::sim(&[], &[("ROUTD_WEBHOOK_ATTEMPTS", "3")]).await;
    let chat = "wa:900";
    rig.group_for("deadhook", chat).await;
    let (recv, url) = Receiver::start(usize::MAX).await;
    let (s, v) = rig
        .api()
        .post(
            &rig.operator,
            "/v1/webhooks",
            json!({"prefix": "wa:", "url": url, "secret": "0123456789abcdef"}),
        )
        .await;
    assert_eq!(s, 201, "{v}");
    let sent = Instant::now();
    rig.say(chat, "d-1", "ring").await;
    rig.wait_for(chat, "undeliverable", |h| {
        h.iter().any(|m| m.state == MessageState::Undeliverable)
    })
    .await;
    let took = sent.elapsed();
    // Backing off: 100 ms, then 200 ms (jitter only adds) before the third and last try.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        recv.requests().iter().map(|r| r.2).collect::<Vec<_>>(),
        [503, 503, 503],
        "three tries, then none"
    );
    let metrics = rig.metrics().await;
    let sum: f64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("routd_turn_latency_seconds_sum "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no turn latency sum: {metrics}"));
    assert!(
        sum > 0.0 && sum <= took.as_secs_f64(),
        "one turn's latency, at most the {took:?} the test waited: {sum}"
    );
    rig.stop().await;
}

/// runed's queue for the folder is full (429 `queue_full`, a transient answer): the turn
/// waits and starts once there is room, and the message is answered. (It used to fail the
/// turn for good: "The agent could not be started", the message lost.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_full_runed_queue_delays_the_turn_instead_of_failing_it() {
    let rig = Rig::sim(&[("RUNED_MAX_QUEUED_PER_FOLDER", "1")], &[]).await;
    let chat = "tg:queue";
    rig.group_for("crowded", chat).await;
    // Two holds: one takes the folder's slot, one waits in its queue, which is then full.
    let runed = hako_shared::testing::ApiClient::new(rig.runed_url());
    let mut holds = Vec::new();
    for _ in 0..2 {
        let (s, v) = runed
            .post(&rig.operator, "/v1/holds", json!({"folder": "crowded"}))
            .await;
        assert_eq!(s, 202, "{v}");
        let id = v["run_id"].as_str().unwrap().to_owned();
        if holds.is_empty() {
            // The first hold must have left the queue for the slot before the second is
            // asked for, or the second finds the queue (of one) already full.
            let op = hako_client::runed::run(&id);
            eventually(
                "the first hold running",
                Duration::from_secs(30),
                || async {
                    let (_, v) = send(&runed, &rig.operator, op.clone()).await;
                    if v["state"] == "running" {
                        Ok(())
                    } else {
                        Err(v)
                    }
                },
            )
            .await;
        }
        holds.push(id);
    }
    let (s, v) = runed
        .post(&rig.operator, "/v1/holds", json!({"folder": "crowded"}))
        .await;
    assert_eq!((s, v["error"].as_str()), (429, Some("queue_full")), "{v}");
    rig.say(chat, "q-1", "still there?").await;
    // The turn is asked for and refused with 429, twice at least, meanwhile.
    eventually("runed refuses the turn's start twice", LIMIT, || async {
        let busy = rig.metric_value("routd_runed_busy_total ").await;
        if busy >= Some(2.0) { Ok(()) } else { Err(busy) }
    })
    .await;
    let h = rig.history(chat).await;
    assert!(
        notices(&h).is_empty(),
        "no failure notice: {:?}",
        notices(&h)
    );
    assert_eq!(h[0].state, MessageState::Pending, "{h:?}");
    for id in &holds {
        let (s, v) = send(&runed, &rig.operator, hako_client::runed::kill_run(id)).await;
        assert_eq!(s, 200, "{v}");
    }
    let h = rig
        .wait_for(chat, "the reply", |h| {
            !replies(h).is_empty() && h[0].state == MessageState::Answered
        })
        .await;
    assert_eq!(replies(&h), ["still there?"]);
    assert!(notices(&h).is_empty(), "{:?}", notices(&h));
    rig.stop().await;
}

/// Ingress: malformed and unknown input refused with the envelope; a chat without a route is
/// stored and answered once a route appears; ids are idempotent; tokens are checked.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ingress_is_checked_and_nothing_is_dropped() {
    let rig = Rig::sim(&[], &[]).await;
    let api = rig.api();
    let post = |token: String, body: Value| {
        let api = api.clone();
        async move { api.post(&token, "/v1/messages", body).await }
    };
    let (s, v) = api
        .raw(
            reqwest::Method::POST,
            "/v1/messages",
            Some(&rig.channel),
            "application/json",
            "{not json",
        )
        .await;
    assert_eq!((s, v["error"].as_str()), (400, Some("invalid_json")));
    let (s, v) = post(
        rig.channel.clone(),
        json!({"chat_jid": "x:1", "sender": "a", "content": "c", "admin": true}),
    )
    .await;
    assert_eq!((s, v["error"].as_str()), (400, Some("invalid_json")), "{v}");
    let (s, v) = post(
        rig.channel.clone(),
        json!({"chat_jid": "x:1", "sender": "a", "content": "x".repeat(70_000)}),
    )
    .await;
    assert_eq!(
        (s, v["error"].as_str()),
        (400, Some("invalid_request")),
        "{v}"
    );
    assert!(v["message"].as_str().unwrap().contains("content"), "{v}");
    let (s, v) = post(
        rig.channel.clone(),
        json!({"chat_jid": "x:1", "sender": "a", "content": "c", "id": "bad id"}),
    )
    .await;
    assert_eq!(s, 400, "{v}");
    // No route yet: stored, reported, answered later.
    let (s, v) = post(
        rig.channel.clone(),
        json!({"id": "late-1", "chat_jid": "x:1", "sender": "a", "content": "waiting"}),
    )
    .await;
    assert_eq!((s, v["routed"].as_bool()), (201, Some(false)), "{v}");
    let (s, v) = post(
        rig.channel.clone(),
        json!({"id": "late-1", "chat_jid": "x:1", "sender": "a", "content": "waiting"}),
    )
    .await;
    assert_eq!((s, v["duplicate"].as_bool()), (200, Some(true)), "{v}");
    let (s, v) = post(
        rig.channel.clone(),
        json!({"id": "late-1", "chat_jid": "x:1", "sender": "a", "content": "other"}),
    )
    .await;
    assert_eq!((s, v["error"].as_str()), (409, Some("id_conflict")), "{v}");
    rig.group_for("late", "x:*").await;
    let h = rig
        .wait_for("x:1", "answered after the route", |h| {
            !replies(h).is_empty()
        })
        .await;
    assert_eq!(replies(&h), ["waiting"]);
    assert_eq!(
        h.iter()
            .filter(|m| m.direction == hako_shared::chat::Direction::In)
            .count(),
        1
    );
    // Tokens.
    let body = json!({"chat_jid": "x:2", "sender": "a", "content": "c"});
    let (s, v) = post("forged.token.here".into(), body.clone()).await;
    assert_eq!(s, 401, "{v}");
    let short = rig.mint(&["messages:write"], None, 1).await;
    tokio::time::sleep(Duration::from_millis(3200)).await;
    let (s, v) = post(short, body.clone()).await;
    assert_eq!(
        (s, v["error"].as_str()),
        (401, Some("token_expired")),
        "{v}"
    );
    let reader = rig.mint(&["chats:read"], None, 60).await;
    let (s, v) = post(reader, body.clone()).await;
    assert_eq!(
        (s, v["error"].as_str()),
        (403, Some("insufficient_scope")),
        "{v}"
    );
    let foreign = rig
        .mint(&["messages:write", "chats:read"], Some("other"), 60)
        .await;
    let (s, v) = post(foreign.clone(), body.clone()).await;
    assert_eq!(
        (s, v["error"].as_str()),
        (403, Some("folder_forbidden")),
        "{v}"
    );
    let (s, _) = api.get(&foreign, "/v1/chats/x%3A1/messages").await;
    assert_eq!(s, 404, "another folder's chat is not there for it");
    let own = rig
        .mint(&["messages:write", "chats:read"], Some("late"), 60)
        .await;
    let (s, v) = post(own.clone(), body).await;
    assert_eq!(s, 201, "a folder-bound caller posts to its own chats: {v}");
    let (s, _) = api.get(&own, "/v1/chats/x%3A1/messages").await;
    assert_eq!(s, 200);
    // The sweep: every route, every bad input, always the envelope.
    let sent = api.sweep_errors(hako_routd::OPENAPI, &rig.operator).await;
    assert!(sent > 50, "{sent}");
    rig.stop().await;
}

/// schemathesis (an independent API tester) generates requests from routd's served document,
/// valid and invalid, and finds no answer the document does not describe: no 5xx, only
/// documented statuses and shapes, bad input and bad tokens refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn schemathesis_finds_no_answer_the_document_does_not_describe() {
    let rig = Rig::sim(&[], &[]).await;
    let (url, token) = (rig.base(), rig.operator.clone());
    tokio::task::spawn_blocking(move || {
        hako_shared::testing::schemathesis(&url, &token, "examples,coverage,fuzzing,stateful")
    })
    .await
    .expect("schemathesis");
    rig.stop().await;
}

/// The committed OpenAPI document passes an independent validator (openapi-spec-validator).
#[test]
fn the_openapi_document_validates() {
    assert_eq!(
        hako_shared::testing::validate_openapi(hako_routd::OPENAPI),
        "3.1.0"
    );
}

/// The turn's tools, used by a real agent container over its MCP socket, and seen from
/// outside: a message it sent and its progress note (edited in place) in the chat, a task it
/// scheduled firing on time and producing a turn of its own, the calls its group may not
/// make refused as tool errors; after the run the socket is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_agent_uses_its_tools_on_the_turn_socket() {
    let rig = Rig::sim(&[], &[]).await;
    let chat = "web:tools";
    let (s, v) = rig
        .api()
        .put(&rig.operator, "/v1/groups/tools", json!({"name": "tools"}))
        .await;
    assert_eq!(s, 201, "{v}");
    let script = [
        r#"/mcp send_message {"text":"working on it"}"#,
        r#"/mcp set_status {"text":"step 1"}"#,
        r#"/mcp set_status {"text":"step 2"}"#,
        r#"/mcp get_history {"limit":5}"#,
        r#"/mcp schedule_task {"prompt":"tick from the task","after":"2s"}"#,
        r#"/mcp list_tasks"#,
        r#"/mcp spawn_group {"folder":"tools/sub","prompt":"hi"}"#,
        r#"/mcp send_message {"text":"elsewhere","chat_jid":"tg:1"}"#,
        r#"/mcp set_status {"text":""}"#,
    ]
    .join("\n");
    rig.say(chat, "t-1", &script).await;
    let h = rig
        .wait_for(chat, "the task's own turn", |h| {
            replies(h).iter().any(|r| r == "tick from the task")
        })
        .await;
    let answer = replies(&h)
        .into_iter()
        .find(|r| r.contains("mcp send_message"))
        .expect("the script's answer");
    let lines = tool_lines(&answer);
    // What the agent was told, call by call.
    assert!(
        lines["send_message"][0].contains(r#""duplicate":false"#),
        "{answer}"
    );
    assert!(
        lines["get_history"][0].contains("working on it"),
        "{answer}"
    );
    assert!(
        lines["schedule_task"][0].contains(r#""state":"active""#),
        "{answer}"
    );
    assert!(
        lines["list_tasks"][0].contains("tick from the task"),
        "{answer}"
    );
    assert_eq!(
        lines["spawn_group"],
        ["tool error: not_granted: spawn_group is only for the operator's main group"],
        "{answer}"
    );
    // Past the turn's chat: only a grant that names the chat reaches it.
    assert_eq!(
        lines["send_message"][1],
        r#"tool error: not_granted: the group's grants do not allow send_message on "tg:1""#
    );
    assert!(
        lines["set_status"][2].starts_with("tool error: invalid_arguments: text is empty"),
        "{answer}"
    );
    // What the chat saw: the tool's message, before the answer.
    let pos = |text: &str| h.iter().position(|m| m.content == text);
    let sent = pos("working on it").expect("the tool's message in the chat");
    assert!(sent < h.iter().position(|m| m.content == answer).unwrap());
    assert_eq!(h[sent].direction, hako_shared::chat::Direction::Out);
    // One progress note, edited in place: its last text, version 1.
    let status: Vec<&MessageView> = h
        .iter()
        .filter(|m| m.kind == hako_shared::chat::MessageKind::Status)
        .collect();
    assert_eq!(status.len(), 1, "{h:#?}");
    assert_eq!(
        (status[0].content.as_str(), status[0].version),
        ("step 2", 1)
    );
    // The task fired once, as a message of its own, and its turn answered it.
    let fired: Vec<&MessageView> = h
        .iter()
        .filter(|m| m.kind == hako_shared::chat::MessageKind::Task)
        .collect();
    assert_eq!(fired.len(), 1, "{h:#?}");
    assert_eq!(fired[0].content, "tick from the task");
    let scheduled_at = h[sent].timestamp;
    assert!(
        fired[0].timestamp - scheduled_at >= 1500,
        "fired {} ms after the call, asked for 2 s",
        fired[0].timestamp - scheduled_at
    );
    // After the turns, nobody listens in the folder's ipc/ any more.
    let sock = rig.data().join("folders/tools/ipc/mcp.sock");
    gone_with_its_turn(&sock).await;
    let ipc = std::fs::symlink_metadata(rig.data().join("folders/tools/ipc")).unwrap();
    assert_eq!(
        std::os::unix::fs::MetadataExt::mode(&ipc) & 0o022,
        0,
        "ipc/ is the host's"
    );
    rig.stop().await;
}

/// The same tools over HTTP with the run's spawn token, and the official MCP Python SDK on a
/// live turn's socket; another folder's token, a user token and calls after the turn ended
/// are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tools_over_http_and_the_python_sdk_on_a_live_turn() {
    let rig = Rig::sim(LONG_RUNS, &[]).await;
    let python = tokio::task::spawn_blocking(hako_shared::testing::conformance_python)
        .await
        .unwrap();
    let chat = "web:live";
    let (s, v) = rig
        .api()
        .put(&rig.operator, "/v1/groups/live", json!({"name": "live"}))
        .await;
    assert_eq!(s, 201, "{v}");
    let turn = rig.running_turn("live").await;
    let turn_id = turn["turn_id"].as_str().unwrap().to_owned();
    let run_id = turn["run_id"].as_str().unwrap().to_owned();
    // The official SDK, through a stdio bridge, as an agent image without native socket
    // support reaches it.
    let sock = rig.data().join("folders/live/ipc/mcp.sock");
    assert!(sock.exists());
    let input = json!({"socket": sock, "text": "from the python sdk"});
    let seen = tokio::task::spawn_blocking(move || {
        hako_shared::testing::run_python(
            &python,
            include_str!("../../mcp/tests/sdk_client.py"),
            &input,
        )
    })
    .await
    .unwrap();
    assert_eq!(seen["sent"]["is_error"], false, "{seen}");
    assert_eq!(seen["refused"]["is_error"], true, "{seen}");
    assert_eq!(seen["tools"].as_array().unwrap().len(), 8, "{seen}");
    // HTTP, with a spawn token of this turn (runed mints them so for each run).
    let client = AuthdClient::new(&rig.authd_url()).unwrap();
    let runed_token = rig.service_token("runed").await;
    let spawn = |folder: &'static str, turn: String| {
        let (rig, run_id) = (&rig, run_id.clone());
        async move { rig.spawn_token(folder, &turn, &run_id, 300).await.token }
    };
    let own = spawn("live", format!("{turn_id}.1")).await;
    let send = |token: String, key: &'static str, text: &'static str| {
        let base = rig.base();
        let turn_id = turn_id.clone();
        async move {
            // raw on purpose: the Idempotency-Key header, which an op does not carry.
            let r = reqwest::Client::builder()
                .no_proxy()
                .build()
                .unwrap()
                .post(format!("{base}/v1/turns/{turn_id}.1/send"))
                .bearer_auth(token)
                .header("idempotency-key", key)
                .json(&json!({"text": text}))
                .send()
                .await
                .unwrap();
            (r.status().as_u16(), r.json::<Value>().await.unwrap())
        }
    };
    let (s, first) = send(own.clone(), "k-1", "over http").await;
    assert_eq!(s, 200, "{first}");
    let (s, again) = send(own.clone(), "k-1", "over http").await;
    assert_eq!(s, 200, "{again}");
    assert_eq!(
        (again["id"].clone(), again["duplicate"].clone()),
        (first["id"].clone(), json!(true))
    );
    // Another folder's spawn token, a user token with the scope, no token: not this turn.
    let (s, v) = rig
        .api()
        .put(&rig.operator, "/v1/groups/other", json!({"name": "other"}))
        .await;
    assert_eq!(s, 201, "{v}");
    let foreign = spawn("other", format!("{turn_id}.1")).await;
    let (s, v) = send(foreign, "k-2", "x").await;
    assert_eq!((s, v["error"].as_str()), (404, Some("not_found")), "{v}");
    let user = client
        .mint(
            &runed_token,
            &MintRequest {
                scope: vec!["turns:act".into()],
                folder: Some("live".into()),
                ttl_seconds: Some(300),
                typ: Some(hako_shared::auth::TokenType::User),
                ..Default::default()
            },
        )
        .await
        .unwrap()
        .token;
    let (s, v) = send(user, "k-3", "x").await;
    assert_eq!((s, v["error"].as_str()), (404, Some("not_found")), "{v}");
    let args = json!({"folder": "live/x", "prompt": "p"});
    let (s, v) = rig
        .send(&own, routd::turn_tool(&turn_id, "spawn_group", &args))
        .await;
    assert_eq!((s, v["error"].as_str()), (403, Some("not_granted")), "{v}");
    let args = json!({"limit": 0});
    let (s, v) = rig
        .send(&own, routd::turn_tool(&turn_id, "get_history", &args))
        .await;
    assert_eq!(
        (s, v["error"].as_str()),
        (400, Some("invalid_arguments")),
        "{v}"
    );
    let (s, v) = rig
        .send(&own, routd::turn_tool(&turn_id, "rm_rf", &json!({})))
        .await;
    assert_eq!(s, 404, "{v}");
    // The chat saw each message once.
    let h = rig
        .wait_for(chat, "the sent messages", |h| {
            replies(h).iter().filter(|r| *r == "over http").count() == 1
                && replies(h).iter().any(|r| r == "from the python sdk")
        })
        .await;
    assert_eq!(replies(&h).iter().filter(|r| *r == "over http").count(), 1);
    // The turn ends (stopped): its tools go with it.
    rig.say(chat, "l-2", "/stop").await;
    rig.wait_for(chat, "stopped", |h| {
        notices(h).iter().any(|n| n.contains("was stopped"))
    })
    .await;
    let (s, v) = send(own.clone(), "k-4", "too late").await;
    assert_eq!((s, v["error"].as_str()), (409, Some("turn_ended")), "{v}");
    gone_with_its_turn(&sock).await;
    assert!(std::os::unix::net::UnixStream::connect(&sock).is_err());
    rig.stop().await;
}

/// A main group's agent registers a sub-group and spawns a turn there; the sub-group answers
/// in its own chat.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_main_group_registers_and_spawns_a_sub_group() {
    let rig = Rig::sim(&[], &[]).await;
    // A grant that does not parse is refused, named, and nothing is stored.
    let (s, v) = rig
        .api()
        .put(
            &rig.operator,
            "/v1/groups/typo",
            json!({"name": "typo", "grants": ["send_mesage"]}),
        )
        .await;
    assert_eq!(
        (s, v["error"].as_str()),
        (400, Some("invalid_request")),
        "{v}"
    );
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .contains(r#"unknown tool "send_mesage""#),
        "{v}"
    );
    let (s, _) = rig.api().get(&rig.operator, "/v1/groups/typo").await;
    assert_eq!(s, 404);
    let (s, v) = rig
        .api()
        .put(
            &rig.operator,
            "/v1/groups/boss",
            json!({"name": "boss", "group": {"trust": "main"}}),
        )
        .await;
    assert_eq!(s, 201, "{v}");
    let script = [
        r#"/mcp register_group {"folder":"boss/helper","name":"Helper","grants":["send_message"]}"#,
        r#"/mcp spawn_group {"folder":"boss/helper","prompt":"hello helper"}"#,
        r#"/mcp register_group {"folder":"elsewhere","name":"x"}"#,
    ]
    .join("\n");
    rig.say("web:boss", "b-1", &script).await;
    let h = rig
        .wait_for("web:boss/helper", "the helper's answer", |h| {
            replies(h).iter().any(|r| r == "hello helper")
        })
        .await;
    assert!(
        h.iter()
            .any(|m| m.sender == "group:boss" && m.content == "hello helper")
    );
    let boss = rig
        .wait_for("web:boss", "the boss's answer", |h| !replies(h).is_empty())
        .await;
    let answer = replies(&boss)[0].clone();
    let lines = tool_lines(&answer);
    assert!(
        lines["spawn_group"][0].contains(r#""chat_jid":"web:boss/helper""#),
        "{lines:?}"
    );
    let refusals: Vec<&str> = answer
        .lines()
        .filter(|l| l.starts_with("mcp register_group: tool error"))
        .collect();
    assert_eq!(
        refusals,
        [
            "mcp register_group: tool error: not_granted: folder elsewhere: a group may only manage sub-folders of its own (boss/…)"
        ]
    );
    let (_, g) = rig
        .api()
        .get(&rig.operator, "/v1/groups/boss%2Fhelper")
        .await;
    assert_eq!(
        (g["name"].as_str(), g["grants"].clone()),
        (Some("Helper"), json!(["send_message"]))
    );
    // What the agent did is in routd's audit log under its turn.
    let turn = boss
        .iter()
        .find_map(|m| m.turn_id.clone())
        .expect("the answer's turn");
    let (s, v) = rig
        .send(&rig.operator, routd::audit().query("limit", 100))
        .await;
    assert_eq!(s, 200, "{v}");
    let rows = v["entries"].as_array().unwrap();
    for action in ["group.register", "group.spawn"] {
        let row = rows
            .iter()
            .find(|r| r["action"] == action && r["outcome"] == "ok")
            .unwrap_or_else(|| panic!("no {action} row: {v}"));
        assert_eq!(row["turn_id"], turn.as_str(), "{row}");
        assert_eq!(row["actor"], format!("turn:{turn}"), "{row}");
    }
    rig.stop().await;
}

/// Every audit row names the request it was written for, and the id travels with the
/// request's own calls: a group deleted at routd has its folder retired at runed, and both
/// daemons' rows carry the caller's `x-request-id`, so one id finds the whole story.
#[tokio::test]
async fn audit_rows_name_their_request_across_daemons() {
    let rig = Rig::sim(&[], &[]).await;
    rig.put_group("audited", json!({"name": "audited"})).await;
    let client = hako_client::Client::new(
        hako_client::Daemon::Routd,
        &rig.base(),
        Duration::from_secs(30),
    )
    .unwrap();
    let id: std::sync::Arc<str> = "req-audit-1".into();
    hako_shared::http::with_request_id(
        id,
        client.call(routd::delete_group("audited"), Some(&rig.operator)),
    )
    .await
    .expect("the group is deleted");
    let (s, v) = rig
        .send(&rig.operator, routd::audit().query("limit", 100))
        .await;
    assert_eq!(s, 200, "{v}");
    let row = v["entries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["action"] == "group.delete")
        .unwrap_or_else(|| panic!("no group.delete row: {v}"))
        .clone();
    assert_eq!(
        (row["request_id"].as_str(), row["outcome"].as_str()),
        (Some("req-audit-1"), Some("ok")),
        "{row}"
    );
    assert!(row["turn_id"].is_null(), "an operator's act: {row}");
    let runed = hako_shared::testing::ApiClient::new(rig.runed_url());
    let (s, v) = send(
        &runed,
        &rig.operator,
        hako_client::runed::audit().query("limit", 100),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    let retired = v["entries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["action"] == "folder.retire" && r["folder"] == "audited")
        .unwrap_or_else(|| panic!("no folder.retire row: {v}"))
        .clone();
    assert_eq!(retired["request_id"], "req-audit-1", "{retired}");
    // A request that came with no id got one, and its row names that one.
    let (_, v) = rig
        .send(&rig.operator, routd::audit().query("limit", 100))
        .await;
    let put = v["entries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["action"] == "group.put")
        .unwrap_or_else(|| panic!("no group.put row: {v}"))
        .clone();
    let made = put["request_id"].as_str().unwrap_or_default();
    assert!(!made.is_empty() && made != "req-audit-1", "{put}");
    // A caller's id is kept only when it is a short plain token: anything else (too long,
    // or carrying what a log or a page would render) is replaced by one routd makes.
    for hostile in ["x".repeat(65), "<img src=x>".to_owned()] {
        let cfg: hako_shared::chat::GroupConfig =
            serde_json::from_value(json!({"name": "hostile"})).unwrap();
        hako_shared::http::with_request_id(
            hostile.as_str().into(),
            client.call(routd::put_group("hostile", &cfg), Some(&rig.operator)),
        )
        .await
        .expect("the group is put");
        let (_, v) = rig
            .send(&rig.operator, routd::audit().query("limit", 1))
            .await;
        let row = &v["entries"][0];
        assert_eq!(row["action"], "group.put", "{row}");
        let id = row["request_id"].as_str().unwrap_or_default();
        assert!(id.starts_with("req-") && id.len() < 65, "{row}");
    }
    rig.stop().await;
}

/// Waits until a turn's socket is removed (its turn ended).
async fn gone_with_its_turn(sock: &std::path::Path) {
    eventually(
        &format!("{} is removed with its turn", sock.display()),
        Duration::from_secs(30),
        || async { if sock.exists() { Err(()) } else { Ok(()) } },
    )
    .await
}
