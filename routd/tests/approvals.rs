//! Human approval of held tool calls, end to end: real authd, runed and routd, the real
//! `hako-agent` (as host processes on the simulated engine: no Docker) whose script brain calls the turn's tools over MCP (`/mcp …`), and
//! the same tools over HTTP with a spawn token. Every assertion is what a user sees: the
//! chat's history and stream, the API's answers, the agent's tool results.

mod common;

use common::*;
use hako_client::routd;
use hako_shared::chat::MessageView;
use serde_json::{Value, json};

/// A group whose `send_message` asks, with `approvals` as its settings, routed from `chat`.
async fn asking_group(rig: &Rig, folder: &str, chat: &str, approvals: Value) {
    rig.put_group(
        folder,
        json!({"name": folder, "grants": ["*", "?send_message"], "approvals": approvals}),
    )
    .await;
    rig.route(chat, folder).await;
}

/// Posts `text` into `chat` as `sender`, through the chat adapter.
async fn post_as(rig: &Rig, chat: &str, id: &str, sender: &str, text: &str) {
    let (s, v) = rig
        .api()
        .post(
            &rig.channel,
            "/v1/messages",
            json!({"id": id, "chat_jid": chat, "sender": sender, "content": text}),
        )
        .await;
    assert_eq!(s, 201, "{v}");
}

/// A verdict on request `id` posted by `who`: the status and the answer.
async fn verdict(rig: &Rig, who: &str, id: &str, approve: bool) -> (u16, Value) {
    rig.send(who, routd::decide(id, approve)).await
}

/// The request as the API shows it to the operator.
async fn request(rig: &Rig, id: &str) -> Value {
    let (s, v) = rig.send(&rig.operator, routd::approval(id)).await;
    assert_eq!(s, 200, "{v}");
    v
}

/// The agent's reply lines of `send_message` calls in `chat`, once the turn answered.
async fn send_results(rig: &Rig, chat: &str, calls: usize) -> Vec<String> {
    let h = rig
        .wait_for(chat, "the agent's tool results", |h| {
            replies(h)
                .iter()
                .map(|r| tool_lines(r).get("send_message").map_or(0, Vec::len))
                .sum::<usize>()
                >= calls
        })
        .await;
    replies(&h)
        .iter()
        .flat_map(|r| tool_lines(r).remove("send_message").unwrap_or_default())
        .collect()
}

/// How many messages of `chat` say `text` exactly (the tool's effect).
fn sent(h: &[MessageView], text: &str) -> usize {
    replies(h).iter().filter(|r| *r == text).count()
}

/// An ask call is held and asked on the chat's stream; `/approve` from the chat releases it
/// and its effect shows, once; a second verdict changes nothing (409 from the API, a notice
/// in the chat); the request, its verdict, the metric and the audit say so.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_ask_call_is_held_asked_and_approved_once() {
    let rig = Rig::sim(&[], &[]).await;
    let chat = "tg:ask-1";
    asking_group(&rig, "asking", chat, json!({})).await;
    let stream = {
        let url = format!("{}{}", rig.base(), routd::chat_events(chat).path);
        let token = rig.operator.clone();
        // The user's message, then the question.
        // From the log's start (`Last-Event-ID: 0`): the stream may connect after the post.
        tokio::spawn(async move { sse(&url, &token, Some(0), 2).await })
    };
    rig.say(
        chat,
        "a-1",
        r#"/mcp send_message {"text":"launch at noon"}"#,
    )
    .await;
    let id = nth_request(&rig, chat, 1).await;
    let seen = stream.await.unwrap();
    assert!(
        seen.iter()
            .any(|(_, m)| m["kind"] == "approval"
                && m["content"].as_str().unwrap_or("").contains(&id)),
        "the request reached the chat's stream: {seen:?}"
    );
    let a = request(&rig, &id).await;
    assert_eq!(
        (
            a["state"].as_str(),
            a["tool"].as_str(),
            a["chat_jid"].as_str()
        ),
        (Some("pending"), Some("send_message"), Some(chat)),
        "{a}"
    );
    assert_eq!(a["arguments"]["text"], "launch at noon");
    // Held: nothing was sent yet, and the request is listed as waiting.
    assert_eq!(sent(&rig.history(chat).await, "launch at noon"), 0);
    let (s, list) = rig.api().get(&rig.operator, "/v1/approvals").await;
    assert_eq!(s, 200, "{list}");
    assert!(
        list["approvals"]
            .as_array()
            .unwrap()
            .iter()
            .any(|x| x["id"] == id.as_str()),
        "{list}"
    );
    assert_eq!(
        rig.metric_value("routd_approvals_pending ").await,
        Some(1.0)
    );

    post_as(&rig, chat, "a-2", "alice", &format!("/approve {id}")).await;
    let results = send_results(&rig, chat, 1).await;
    assert!(results[0].contains("\"duplicate\":false"), "{results:?}");
    let h = rig.history(chat).await;
    assert_eq!(sent(&h, "launch at noon"), 1, "{:#?}", replies(&h));
    let a = request(&rig, &id).await;
    assert_eq!(a["state"], "approved");
    assert_eq!(
        a["decided_by"].as_str(),
        Some(format!("chat:{chat}:alice").as_str())
    );

    // Later verdicts change nothing.
    let (s, v) = verdict(&rig, &rig.operator, &id, false).await;
    assert_eq!(
        (s, v["error"].as_str()),
        (409, Some("already_decided")),
        "{v}"
    );
    post_as(&rig, chat, "a-3", "alice", &format!("/deny {id}")).await;
    let h = rig
        .wait_for(chat, "the late verdict's answer", |h| {
            notices(h).iter().any(|n| n.contains("already decided"))
        })
        .await;
    assert_eq!(sent(&h, "launch at noon"), 1);
    assert_eq!(request(&rig, &id).await["state"], "approved");
    assert_eq!(
        rig.metric_value("routd_approvals_total{result=\"approved\"}")
            .await,
        Some(1.0)
    );
    assert_eq!(
        rig.metric_value("routd_approvals_pending ").await,
        Some(0.0)
    );
    let (s, audit) = rig.api().get(&rig.operator, "/v1/audit?limit=100").await;
    assert_eq!(s, 200, "{audit}");
    let actions: Vec<(String, String)> = audit["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["detail"].as_str().unwrap_or("").starts_with(&id))
        .map(|e| {
            (
                e["action"].as_str().unwrap().to_owned(),
                e["outcome"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert!(
        actions.contains(&("approval.request".into(), "pending".into())),
        "{actions:?}"
    );
    assert!(
        actions.contains(&("approval.verdict".into(), "approved".into())),
        "{actions:?}"
    );
    rig.stop().await;
}

/// `/deny` and the wait running out both give the agent an error it can read, and the call
/// has no effect; the chat is told each time.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_denied_or_unanswered_call_is_an_error_with_no_effect() {
    let rig = Rig::sim(&[], &[]).await;
    let chat = "tg:ask-2";
    asking_group(&rig, "denying", chat, json!({"wait": "2s"})).await;
    rig.say(
        chat,
        "d-1",
        "/mcp send_message {\"text\":\"first\"}\n/mcp send_message {\"text\":\"second\"}",
    )
    .await;
    let first = nth_request(&rig, chat, 1).await;
    post_as(&rig, chat, "d-2", "bob", &format!("/deny {first}")).await;
    // The second is left to time out.
    let second = nth_request(&rig, chat, 2).await;
    let results = send_results(&rig, chat, 2).await;
    assert!(
        results[0].starts_with("tool error: denied: a person denied"),
        "{results:?}"
    );
    assert!(
        results[1].starts_with("tool error: denied: no one approved"),
        "{results:?}"
    );
    let h = rig.history(chat).await;
    assert_eq!(
        sent(&h, "first") + sent(&h, "second"),
        0,
        "{:#?}",
        replies(&h)
    );
    assert_eq!(request(&rig, &first).await["state"], "denied");
    assert_eq!(request(&rig, &second).await["state"], "timed_out");
    assert!(
        notices(&h)
            .iter()
            .any(|n| n.contains(&second) && n.contains("no answer in time")),
        "{:#?}",
        notices(&h)
    );
    rig.stop().await;
}

/// A verdict from the chat and one from the operator's API, sent at the same instant, many
/// times over: exactly one wins each time, the loser is told (409, or the chat's notice), and
/// the call's effect matches the winner.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_verdicts_give_exactly_one_effect() {
    let rig = Rig::sim(&[], &[]).await;
    let chat = "tg:ask-3";
    asking_group(&rig, "racing", chat, json!({})).await;
    const N: usize = 6;
    let script: Vec<String> = (0..N)
        .map(|i| format!("/mcp send_message {{\"text\":\"race-{i}\"}}"))
        .collect();
    rig.say(chat, "r-0", &script.join("\n")).await;
    let mut api_won = Vec::new();
    for i in 0..N {
        let id = nth_request(&rig, chat, i + 1).await;
        // The chat approves and the operator denies on even rounds, the other way on odd.
        let chat_approves = i % 2 == 0;
        let verb = if chat_approves { "approve" } else { "deny" };
        let api = rig.api();
        let (msg_id, verdict) = (format!("r-{i}-v"), format!("/{verb} {id}"));
        let op = routd::decide(&id, !chat_approves);
        let ((s, v), ()) = tokio::join!(
            hako_client::testing::send(&api, &rig.operator, op),
            post_as(&rig, chat, &msg_id, "carol", &verdict),
        );
        let a = request(&rig, &id).await;
        let won = s == 200;
        if !won {
            assert_eq!(
                (s, v["error"].as_str()),
                (409, Some("already_decided")),
                "{v}"
            );
        }
        assert_eq!(
            a["state"] == "approved",
            won != chat_approves,
            "round {i}: {a} api {s}"
        );
        let who = a["decided_by"].as_str().unwrap();
        assert_eq!(who.starts_with("chat:"), !won, "round {i}: {who}");
        api_won.push(won);
    }
    let results = send_results(&rig, chat, N).await;
    let h = rig
        .wait_for(chat, "every losing chat verdict answered", |h| {
            let lost = notices(h)
                .iter()
                .filter(|n| n.contains("already decided"))
                .count();
            lost == api_won.iter().filter(|w| **w).count()
        })
        .await;
    let ids = requests(&h);
    for i in 0..N {
        let ran = request(&rig, &ids[i]).await["state"] == "approved";
        assert_eq!(
            sent(&h, &format!("race-{i}")),
            usize::from(ran),
            "round {i}"
        );
        assert_eq!(
            !results[i].starts_with("tool error"),
            ran,
            "round {i}: {}",
            results[i]
        );
        let told = notices(&h)
            .iter()
            .any(|n| n.contains(&ids[i]) && n.contains("already decided"));
        assert_eq!(
            told, api_won[i],
            "round {i}: the chat's late verdict is answered"
        );
    }
    rig.stop().await;
}

/// Verdicts that are not the judge's to give: another chat's request (one group serving two
/// chats), a sender the group does not name, a token bound to another folder, a tenant's
/// token where the operator alone approves. Each is refused and changes nothing; the
/// operator's then counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn verdicts_from_elsewhere_are_refused() {
    let rig = Rig::sim(LONG_RUNS, &[]).await;
    rig.put_group(
        "shop",
        json!({"name": "shop", "grants": ["*", "?send_message"],
               "approvals": {"from": "senders", "senders": ["manager"], "wait": "10m"}}),
    )
    .await;
    rig.route("tg:shop-*", "shop").await;
    rig.put_group("elsewhere", json!({"name": "elsewhere"}))
        .await;
    let (a, b) = ("tg:shop-a", "tg:shop-b");
    rig.say(a, "e-1", r#"/mcp send_message {"text":"refund 500"}"#)
        .await;
    let id = nth_request(&rig, a, 1).await;
    // Another chat of the same group: there is no such request for it.
    post_as(&rig, b, "e-2", "manager", &format!("/approve {id}")).await;
    rig.wait_for(b, "the other chat's answer", |h| {
        notices(h).iter().any(|n| n.contains("no approval request"))
    })
    .await;
    // A sender the group does not name.
    post_as(&rig, a, "e-3", "customer", &format!("/approve {id}")).await;
    rig.wait_for(a, "the customer's answer", |h| {
        notices(h)
            .iter()
            .any(|n| n.contains("customer may not answer"))
    })
    .await;
    // A token bound to another folder: not found; a tenant's own token while the group names
    // its approvers is allowed to answer, but first the operator-only case.
    let foreign = rig
        .mint(
            &["approvals:write", "approvals:read"],
            Some("elsewhere"),
            300,
        )
        .await;
    let (s, v) = verdict(&rig, &foreign, &id, true).await;
    assert_eq!((s, v["error"].as_str()), (404, Some("not_found")), "{v}");
    let (s, v) = rig.send(&foreign, routd::approval(&id)).await;
    assert_eq!(s, 404, "{v}");
    let (s, v) = rig.api().get(&foreign, "/v1/approvals").await;
    assert_eq!(
        (s, v["approvals"].as_array().map(Vec::len)),
        (200, Some(0)),
        "{v}"
    );
    let no_scope = rig.mint(&["chats:read"], None, 300).await;
    let (s, v) = verdict(&rig, &no_scope, &id, true).await;
    assert_eq!(s, 403, "{v}");
    // Malformed verdicts (raw on purpose: a body the typed verdict cannot hold).
    let yes = json!({"approve": "yes"});
    let (s, v) = rig
        .send(&rig.operator, routd::decide(&id, true).with_json(&yes))
        .await;
    assert_eq!(s, 400, "{v}");
    assert_eq!(request(&rig, &id).await["state"], "pending");
    assert_eq!(sent(&rig.history(a).await, "refund 500"), 0);
    // The named approver, in the request's own chat, counts.
    post_as(&rig, a, "e-4", "manager", &format!("/approve {id}")).await;
    rig.wait_for(a, "the approved send", |h| sent(h, "refund 500") == 1)
        .await;

    // Operator-only: a tenant's token covering the folder is refused, the operator counts.
    rig.put_group(
        "vault",
        json!({"name": "vault", "grants": ["*", "?send_message"], "approvals": {"from": "operator"}}),
    )
    .await;
    rig.route("tg:vault", "vault").await;
    rig.say("tg:vault", "v-1", r#"/mcp send_message {"text":"open"}"#)
        .await;
    let id = nth_request(&rig, "tg:vault", 1).await;
    let tenant = rig.mint(&["approvals:write"], Some("vault"), 300).await;
    let (s, v) = verdict(&rig, &tenant, &id, true).await;
    assert_eq!(
        (s, v["error"].as_str()),
        (403, Some("folder_forbidden")),
        "{v}"
    );
    post_as(&rig, "tg:vault", "v-2", "alice", &format!("/approve {id}")).await;
    rig.wait_for("tg:vault", "the chat's refusal", |h| {
        notices(h).iter().any(|n| n.contains("may not answer"))
    })
    .await;
    assert_eq!(request(&rig, &id).await["state"], "pending");
    let (s, v) = verdict(&rig, &rig.operator, &id, true).await;
    assert_eq!((s, v["state"].as_str()), (200, Some("approved")), "{v}");
    rig.wait_for("tg:vault", "the operator's approved send", |h| {
        sent(h, "open") == 1
    })
    .await;
    rig.stop().await;
}

/// `/stop` during a hold ends the turn and denies what it held; a verdict after that is too
/// late.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stop_during_a_hold_denies_it() {
    let rig = Rig::sim(LONG_RUNS, &[]).await;
    let chat = "tg:ask-5";
    asking_group(&rig, "stopping", chat, json!({"wait": "10m"})).await;
    rig.say(chat, "s-1", r#"/mcp send_message {"text":"never"}"#)
        .await;
    let id = nth_request(&rig, chat, 1).await;
    post_as(&rig, chat, "s-2", "alice", "/stop").await;
    eventually("the hold ends with /stop", LIMIT, || async {
        let r = request(&rig, &id).await;
        if r["state"] == "pending" {
            Err(r)
        } else {
            Ok(())
        }
    })
    .await;
    assert_eq!(request(&rig, &id).await["state"], "turn_ended");
    let (s, v) = verdict(&rig, &rig.operator, &id, true).await;
    assert_eq!(
        (s, v["error"].as_str()),
        (409, Some("already_decided")),
        "{v}"
    );
    let h = rig.history(chat).await;
    assert_eq!(sent(&h, "never"), 0);
    assert!(
        notices(&h)
            .iter()
            .any(|n| n.contains(&id) && n.contains("the turn ended"))
    );
    rig.stop().await;
}

/// routd SIGKILLed while a call is held: the request outlives it. The agent's call asks again
/// under its name when the restarted routd binds the turn's socket, and waits on the same
/// request: still pending, no second request asked in the chat; the person's Approve after
/// the restart runs the call once. A held call whose agent never asks again (over HTTP, no
/// retry) is denied after `ROUTD_APPROVAL_REATTACH`, told and audited.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_held_call_outlives_a_routd_kill() {
    let mut rig = Rig::sim(LONG_RUNS, &[("ROUTD_APPROVAL_REATTACH", "3s")]).await;
    rig.spawn_routd_binary().await;
    let chat = "tg:ask-6";
    asking_group(&rig, "killing", chat, json!({"wait": "10m"})).await;
    rig.say(chat, "k-1", r#"/mcp send_message {"text":"half-done"}"#)
        .await;
    let id = nth_request(&rig, chat, 1).await;
    let (mut child, _) = rig.child.take().unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    rig.spawn_routd_binary().await;
    // The agent comes back for it well within the grace: it stays pending past the grace.
    let waited = std::time::Instant::now();
    eventually("the grace to pass", LIMIT, || async {
        if waited.elapsed() > std::time::Duration::from_secs(5) {
            Ok(())
        } else {
            Err(())
        }
    })
    .await;
    assert_eq!(request(&rig, &id).await["state"], "pending");
    let (s, v) = verdict(&rig, &rig.operator, &id, true).await;
    assert_eq!(s, 200, "{v}");
    let h = rig
        .wait_for(chat, "the approved call's effect", |h| {
            sent(h, "half-done") == 1
        })
        .await;
    assert_eq!(requests(&h).len(), 1, "asked once in the chat");
    rig.wait_idle("killing").await;
    assert_eq!(sent(&rig.history(chat).await, "half-done"), 1, "sent once");

    // Over HTTP nobody asks again: denied after the grace, and the chat is told.
    rig.put_group(
        "gone",
        json!({"name": "gone", "grants": ["*", "?send_message"], "approvals": {"wait": "10m"}}),
    )
    .await;
    let turn = rig.running_turn("gone").await;
    let (turn_id, run_id) = (
        turn["turn_id"].as_str().unwrap().to_owned(),
        turn["run_id"].as_str().unwrap().to_owned(),
    );
    let token = rig
        .spawn_token("gone", &format!("{turn_id}.1"), &run_id, 300)
        .await
        .token;
    let api = rig.api();
    let held = tokio::spawn({
        let args = json!({"text": "never"});
        let op = routd::turn_tool(&format!("{turn_id}.1"), "send_message", &args);
        async move { hako_client::testing::send(&api, &token, op).await }
    });
    let gone = nth_request(&rig, "web:gone", 1).await;
    let (mut child, _) = rig.child.take().unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    let _ = held.await;
    rig.spawn_routd_binary().await;
    eventually("the orphan denied", LIMIT, || async {
        let r = request(&rig, &gone).await;
        if r["state"] == "abandoned" {
            Ok(())
        } else {
            Err(r)
        }
    })
    .await;
    rig.wait_for("web:gone", "the notice", |h| {
        notices(h)
            .iter()
            .any(|n| n.contains(&gone) && n.contains("did not ask for it again"))
    })
    .await;
    rig.stop().await;
}

/// The same tool over HTTP with the run's spawn token goes through the same gate: held until
/// the verdict, then 200 with its effect, or 403 `denied`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_call_over_http_is_held_by_the_same_gate() {
    let rig = Rig::sim(LONG_RUNS, &[]).await;
    rig.put_group(
        "http",
        json!({"name": "http", "grants": ["*", "?send_message"]}),
    )
    .await;
    let turn = rig.running_turn("http").await;
    let (turn_id, run_id) = (
        turn["turn_id"].as_str().unwrap().to_owned(),
        turn["run_id"].as_str().unwrap().to_owned(),
    );
    let token = rig
        .spawn_token("http", &format!("{turn_id}.1"), &run_id, 300)
        .await
        .token;
    let chat = "web:http";
    let call = |text: &'static str| {
        let (api, token, op) = (
            rig.api(),
            token.clone(),
            routd::turn_tool(
                &format!("{turn_id}.1"),
                "send_message",
                &json!({"text": text}),
            ),
        );
        tokio::spawn(async move { hako_client::testing::send(&api, &token, op).await })
    };
    let held = call("over http");
    let id = nth_request(&rig, chat, 1).await;
    assert!(!held.is_finished(), "the call waits for its verdict");
    let (s, v) = verdict(&rig, &rig.operator, &id, true).await;
    assert_eq!(s, 200, "{v}");
    let (s, v) = held.await.unwrap();
    assert_eq!(s, 200, "{v}");
    let refused = call("not this");
    let id = nth_request(&rig, chat, 2).await;
    let (s, v) = verdict(&rig, &rig.operator, &id, false).await;
    assert_eq!(s, 200, "{v}");
    let (s, v) = refused.await.unwrap();
    assert_eq!((s, v["error"].as_str()), (403, Some("denied")), "{v}");
    let h = rig.history(chat).await;
    assert_eq!((sent(&h, "over http"), sent(&h, "not this")), (1, 0));
    rig.stop().await;
}
