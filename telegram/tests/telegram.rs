//! The Telegram adapter against a Bot API server of our own, with real authd, runed, routd
//! and the real agent (host processes on the simulated engine; a real container where the
//! test looks into the box), asserted from outside: what the fake Telegram was asked to
//! send, and what routd's log holds.

mod common;

use std::time::Duration;

use common::{FakeTelegram, LIMIT, Stack, TOKEN, eventually};
use hako_client::{Op, telegram};
use serde_json::{Value, json};

const ALICE: i64 = 111;
const GROUP: i64 = -100_200;
const STRANGER: i64 = 999;

/// A private message gets one reply; markup is literal; a 12,000-character reply arrives in
/// order, split; a 429 is waited out and the reply sent once; a chat not on the allowlist
/// gets one refusal and no turn; a group message without the mention makes no turn.
#[tokio::test(flavor = "multi_thread")]
async fn messages_in_and_replies_out() {
    let stack = Stack::start().await;
    stack.group("alice", "tg:111", json!({})).await;
    stack.group("team", "tg:-100200", json!({})).await;
    let fake = FakeTelegram::start().await;
    let log = stack.dir.path().join("adapter.log");
    let adapter = stack.adapter(&fake, &[ALICE, GROUP], &log);

    // A private message: one reply, in that chat; "typing…" while the turn ran.
    fake.message(ALICE, ALICE as u64, "hello from telegram");
    fake.wait_sent(ALICE, "the reply", |t| t == "hello from telegram")
        .await;
    assert!(
        fake.ok_calls("sendChatAction")
            .iter()
            .any(|c| c.body["chat_id"] == ALICE && c.body["action"] == "typing"),
        "typing… was shown"
    );

    // A stranger: one polite refusal however often they write, and nothing reaches routd.
    fake.message(STRANGER, STRANGER as u64, "let me in");
    fake.message(STRANGER, STRANGER as u64, "please");
    // A group message without the mention, then one with it: the second's reply proves the
    // first was handled (updates are handled in order).
    fake.message(GROUP, 7, "nobody asked the bot");
    fake.message(GROUP, 7, "@hakobot a question for the bot");
    fake.wait_sent(GROUP, "the mentioned reply", |t| {
        t == "a question for the bot"
    })
    .await;
    let refusals = fake.sent(STRANGER);
    assert_eq!(refusals.len(), 1, "{refusals:?}");
    assert!(refusals[0].contains("allow"), "{refusals:?}");
    assert!(
        stack.history("tg:999").await.is_empty(),
        "no turn for a stranger"
    );
    let group_log = stack.history("tg:-100200").await;
    assert!(
        !group_log
            .iter()
            .any(|m| m["content"].as_str().unwrap_or("").contains("nobody asked")),
        "a message without the mention never reached routd: {group_log:?}"
    );
    assert_eq!(fake.sent(GROUP).len(), 1);

    // Markup is sent as written, without a parse mode.
    let markup = "*bold* _it_ <b>x</b> [link](http://e.x) `code` ~s~ ||spoiler||";
    fake.message(ALICE, ALICE as u64, markup);
    fake.wait_sent(ALICE, "the markup reply", |t| t == markup)
        .await;
    let call = fake
        .ok_calls("sendMessage")
        .into_iter()
        .find(|c| c.body["text"] == markup)
        .unwrap();
    assert!(call.body.get("parse_mode").is_none(), "{:?}", call.body);

    // 12,000 characters (120 lines of 99 and their breaks): three messages, in order,
    // nothing lost.
    let long: Vec<String> = (0..120)
        .map(|i| format!("{i:04} {}", "y".repeat(94)))
        .collect();
    let long = long.join("\n");
    assert_eq!(long.chars().count(), 120 * 100 - 1);
    let before = fake.sent(ALICE).len();
    fake.message(ALICE, ALICE as u64, &long);
    let parts = eventually("the long reply in parts", LIMIT, || async {
        let sent = fake.sent(ALICE)[before..].to_vec();
        if sent.join("\n") == long {
            Ok(sent)
        } else {
            Err(format!("{} parts so far", sent.len()))
        }
    })
    .await;
    assert_eq!(parts.len(), 3, "split at 4096");
    assert!(parts.iter().all(|p| p.encode_utf16().count() <= 4096));

    // 429 with retry_after 2: the reply waits it out and is sent once.
    fake.fail_next("sendMessage", 429, Some(2));
    fake.message(ALICE, ALICE as u64, "after the limit");
    fake.wait_sent(ALICE, "the limited reply", |t| t == "after the limit")
        .await;
    let calls = fake.calls();
    let limited = calls
        .iter()
        .find(|c| c.method == "sendMessage" && c.status == 429)
        .expect("the 429 was answered");
    let sent: Vec<_> = calls
        .iter()
        .filter(|c| {
            c.method == "sendMessage" && c.status == 200 && c.body["text"] == "after the limit"
        })
        .collect();
    assert_eq!(sent.len(), 1, "sent once");
    assert!(
        sent[0].at.duration_since(limited.at) >= Duration::from_millis(1900),
        "sent after retry_after: {:?}",
        sent[0].at.duration_since(limited.at)
    );

    // 5xx: retried with backoff, sent once.
    fake.fail_next("sendMessage", 502, None);
    fake.message(ALICE, ALICE as u64, "after a bad gateway");
    fake.wait_sent(ALICE, "the reply after a 502", |t| {
        t == "after a bad gateway"
    })
    .await;
    assert_eq!(
        fake.sent(ALICE)
            .iter()
            .filter(|t| *t == "after a bad gateway")
            .count(),
        1
    );

    // The health hako status reads: polling, nothing failed or waiting.
    let h = eventually("the outbox drains", LIMIT, || async {
        let h = adapter.health().await;
        if h["backlog"] == 0 {
            Ok(h)
        } else {
            Err(h.to_string())
        }
    })
    .await;
    assert!(h["last_poll_ms"].as_i64().is_some(), "{h}");
    assert_eq!(
        (h["failed"].as_i64(), h["unconfirmed"].as_i64()),
        (Some(0), Some(0)),
        "{h}"
    );

    // Anyone else posting deliveries: unsigned, signed with another secret, or replayed with
    // a stale timestamp, each refused with the error envelope, and nothing is sent.
    let body = r#"{"message":{"chat_jid":"tg:111","content":"forged"}}"#;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let sign = |secret: &str, ts: i64| {
        let key = aws_lc_rs::hmac::Key::new(aws_lc_rs::hmac::HMAC_SHA256, secret.as_bytes());
        let tag = aws_lc_rs::hmac::sign(&key, format!("{ts}.{body}").as_bytes());
        let hex: String = tag.as_ref().iter().map(|b| format!("{b:02x}")).collect();
        format!("v1={hex}")
    };
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    for (sig, ts) in [
        (None, now),
        (Some(sign("not-the-secret", now)), now),
        (Some(sign(common::SECRET, now - 600)), now - 600),
    ] {
        // raw on purpose: forged signatures and timestamps on a delivery routd would sign.
        let mut req = http
            .post(format!("{}/v1/deliveries", adapter.url))
            .header("content-type", "application/json")
            .header("idempotency-key", format!("forged-{ts}"))
            .header("x-hako-timestamp", ts.to_string())
            .body(body);
        if let Some(s) = &sig {
            req = req.header("x-hako-signature", s);
        }
        let r = req.send().await.unwrap();
        assert_eq!(r.status().as_u16(), 401);
        let v: serde_json::Value = r.json().await.unwrap();
        assert_eq!(v["error"], "unauthorized", "{v}");
        assert!(v["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
    }
    assert!(!fake.sent(ALICE).iter().any(|t| t == "forged"));
    drop(adapter);
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(!text.is_empty());
    assert!(
        !text.contains(TOKEN),
        "the bot token is in the adapter's log"
    );
    assert!(!text.contains(TOKEN.split(':').nth(1).unwrap()));
    stack.stop().await;
}

/// Updates replayed after the adapter is SIGKILLed mid-burst (and a server that ignores the
/// offset): each message answered once.
#[tokio::test(flavor = "multi_thread")]
async fn a_burst_replayed_after_sigkill_is_answered_once() {
    let stack = Stack::start().await;
    stack.group("alice", "tg:111", json!({})).await;
    let fake = FakeTelegram::start().await;
    let log = stack.dir.path().join("adapter.log");
    let texts = ["burst one", "burst two", "burst three", "burst four"];
    for t in texts {
        fake.message(ALICE, ALICE as u64, t);
    }
    let mut adapter = stack.adapter(&fake, &[ALICE], &log);
    eventually("part of the burst reaches routd", LIMIT, || async {
        let n = stack.history("tg:111").await.len();
        if n >= 1 { Ok(()) } else { Err("nothing yet") }
    })
    .await;
    adapter.kill();
    // The server "lost" the acknowledgements: it serves every update again.
    fake.set_replay(true);
    let adapter = stack.adapter(&fake, &[ALICE], &log);
    // Every text answered; then the restarted adapter has polled past the burst and sent
    // everything it was given.
    eventually("every message answered", LIMIT, || async {
        let all = fake.sent(ALICE).join("\n");
        match texts.iter().find(|t| !all.contains(*t)) {
            None => Ok(()),
            Some(t) => Err(format!("{t:?} not answered yet: {all:?}")),
        }
    })
    .await;
    eventually("routd idle and the outbox empty", LIMIT, || async {
        let log = stack.history("tg:111").await;
        let pending = log
            .iter()
            .filter(|m| m["direction"] == "in" && m["state"] == "pending")
            .count();
        let delivering = log.iter().filter(|m| m["state"] == "delivering").count();
        let h = adapter.health().await;
        if pending == 0 && delivering == 0 && h["backlog"] == 0 && h["updates"].as_u64().is_some() {
            Ok(())
        } else {
            Err(format!("pending {pending}, delivering {delivering}, {h}"))
        }
    })
    .await;
    let all = fake.sent(ALICE).join("\n");
    for t in texts {
        assert_eq!(all.matches(t).count(), 1, "{t:?} answered once: {all:?}");
    }
    let inbound = stack
        .history("tg:111")
        .await
        .into_iter()
        .filter(|m| m["direction"] == "in")
        .count();
    assert_eq!(inbound, texts.len(), "each update is one message in routd");
    drop(adapter);
    assert!(!std::fs::read_to_string(&log).unwrap().contains(TOKEN));
    stack.stop().await;
}

/// A held call appears with Approve and Deny buttons; a press by someone the group does not
/// name is refused with an alert; the allowed person's press runs the call once and the
/// message says who decided.
#[tokio::test(flavor = "multi_thread")]
async fn approvals_are_buttons() {
    let stack = Stack::start().await;
    stack
        .group(
            "team",
            "tg:-100200",
            json!({"grants": ["*", "?send_message"],
                   "approvals": {"from": "senders", "senders": ["tg:111"], "wait": "10m"}}),
        )
        .await;
    let fake = FakeTelegram::start().await;
    let log = stack.dir.path().join("adapter.log");
    let _adapter = stack.adapter(&fake, &[GROUP], &log);
    fake.message(
        GROUP,
        ALICE as u64,
        r#"@hakobot /mcp send_message {"text":"the deploy ran"}"#,
    );
    let ask = eventually("the approval message with buttons", LIMIT, || async {
        fake.ok_calls("sendMessage")
            .into_iter()
            .find(|c| c.body["reply_markup"]["inline_keyboard"].is_array())
            .ok_or("not yet")
    })
    .await;
    let buttons = &ask.body["reply_markup"]["inline_keyboard"][0];
    let approve = buttons[0]["callback_data"].as_str().unwrap().to_owned();
    assert!(approve.starts_with("hako:approve:ap-"), "{buttons}");
    assert!(
        buttons[1]["callback_data"]
            .as_str()
            .unwrap()
            .starts_with("hako:deny:ap-")
    );
    // The message id the fake gave the approval message.
    let message = fake
        .calls()
        .iter()
        .filter(|c| c.method == "sendMessage" && c.status == 200)
        .position(|c| c.body["reply_markup"].is_object())
        .unwrap();
    let _ = message;

    // Someone else presses Approve: refused, visibly; nothing runs.
    fake.press(GROUP, 1, 222, &approve);
    let refused = eventually("the refusal alert", LIMIT, || async {
        fake.ok_calls("answerCallbackQuery")
            .into_iter()
            .find(|c| c.body["show_alert"] == true)
            .ok_or("not yet")
    })
    .await;
    assert!(
        refused.body["text"].as_str().unwrap().contains("may not"),
        "{:?}",
        refused.body
    );
    assert!(!fake.sent(GROUP).iter().any(|t| t == "the deploy ran"));

    // Alice presses Approve: the call runs once, the message says she decided.
    fake.press(GROUP, 1, ALICE as u64, &approve);
    fake.wait_sent(GROUP, "the approved call's message", |t| {
        t == "the deploy ran"
    })
    .await;
    let edit = eventually("the approval message edited", LIMIT, || async {
        fake.ok_calls("editMessageText")
            .into_iter()
            .next()
            .ok_or("not yet")
    })
    .await;
    assert!(
        edit.body["text"]
            .as_str()
            .unwrap()
            .contains("Approved by user111"),
        "{:?}",
        edit.body
    );
    fake.wait_sent(GROUP, "the agent's reply", |t| {
        t.starts_with("mcp send_message:")
    })
    .await;
    assert_eq!(
        fake.sent(GROUP)
            .iter()
            .filter(|t| *t == "the deploy ran")
            .count(),
        1,
        "the call ran once"
    );
    stack.stop().await;
}

/// A photo, a document and a voice note reach the folder's media directory, and the agent's
/// input names each where the agent finds it (the script agent lists and reads them from its
/// box); a file over the bot's limit is named, never fetched; a folder whose media directory
/// is full gets the message with the file named as not saved; a group photo not meant for
/// the bot is never fetched.
#[tokio::test(flavor = "multi_thread")]
async fn photos_and_documents_reach_the_agent() {
    use hako_shared::layout::{FolderDir, dir_rel};
    // Docker: the agent lists the file where a box sees it.
    let stack = Stack::start_on_docker().await;
    stack.group("alice", "tg:111", json!({})).await;
    stack.group("team", "tg:-100200", json!({})).await;
    let fake = FakeTelegram::start().await;
    let log = stack.dir.path().join("adapter.log");
    let _adapter = stack.adapter(&fake, &[ALICE, GROUP], &log);
    let media = stack
        .dir
        .path()
        .join("data")
        .join(dir_rel(
            &hako_shared::GroupFolder::new("alice").unwrap(),
            FolderDir::Workspace,
        ))
        .join("media");

    // A photo in two sizes: the larger is fetched, saved and listed from inside the box.
    let jpeg = b"\xff\xd8\xff\xe0 not really a jpeg".to_vec();
    let mid = fake.media(
        ALICE,
        ALICE as u64,
        "/ls /workspace/media",
        json!({"photo": [
            {"file_id": "thumb", "file_unique_id": "t", "width": 90, "height": 90, "file_size": 5},
            {"file_id": "full", "file_unique_id": "f", "width": 1280, "height": 960, "file_size": jpeg.len()},
        ]}),
        &[("full", &jpeg)],
    );
    let name = format!("tg111_{mid}.jpg");
    let line = format!(
        "[photo: /workspace/media/{name} (image/jpeg, {} bytes)]",
        jpeg.len()
    );
    let reply = fake
        .wait_sent(ALICE, "the photo's reply", |t| t.contains(&line))
        .await;
    assert!(
        reply.lines().next().unwrap().contains(&name),
        "the agent lists the file in its box: {reply}"
    );
    assert_eq!(std::fs::read(media.join(&name)).unwrap(), jpeg);
    assert_eq!(fake.downloads(), ["documents/full"], "one size fetched");

    // A document keeps its name after the ids; the agent reads it.
    let mid = fake.peek_message_id();
    let doc = format!("tg111_{mid}_notes_v2.txt");
    fake.media(
        ALICE,
        ALICE as u64,
        &format!("/read /workspace/media/{doc}"),
        json!({"document": {"file_id": "doc1", "file_unique_id": "d1",
                            "file_name": "notes v2.txt", "mime_type": "text/plain"}}),
        &[("doc1", b"the words of the document")],
    );
    fake.wait_sent(ALICE, "the document read in the box", |t| {
        t.contains("the words of the document")
            && t.contains(&format!(
                "[document: /workspace/media/{doc} (text/plain, 25 bytes)]"
            ))
    })
    .await;

    // A voice note without a caption: the line alone is the message.
    let mid = fake.media(
        ALICE,
        ALICE as u64,
        "",
        json!({"voice": {"file_id": "v1", "file_unique_id": "v", "duration": 2, "file_size": 4}}),
        &[("v1", b"OggS")],
    );
    fake.wait_sent(ALICE, "the voice note's line", |t| {
        t == format!("[voice: /workspace/media/tg111_{mid}.ogg (audio/ogg, 4 bytes)]")
    })
    .await;

    // Over the bot's limit (20 MiB): named, not fetched.
    let before = fake.downloads().len();
    fake.media(
        ALICE,
        ALICE as u64,
        "",
        json!({"document": {"file_id": "huge", "file_unique_id": "h", "file_name": "big.iso",
                            "file_size": 30_000_000}}),
        &[],
    );
    fake.wait_sent(ALICE, "the too-large line", |t| {
        t.starts_with("[document not received: 30000000 bytes")
    })
    .await;
    assert_eq!(fake.downloads().len(), before, "never fetched");

    // The folder's media directory holds at most 64k here: the message still comes, the
    // file named as not saved.
    let big = vec![b'x'; 70 << 10];
    fake.media(
        ALICE,
        ALICE as u64,
        "too much",
        json!({"document": {"file_id": "big1", "file_unique_id": "b1", "file_name": "big.bin"}}),
        &[("big1", &big)],
    );
    let reply = fake
        .wait_sent(ALICE, "the not-saved line", |t| t.starts_with("too much"))
        .await;
    assert!(
        reply.contains("[document not saved: ") && reply.contains("limit"),
        "{reply}"
    );

    // A group photo without the mention is not for the bot: nothing fetched, no turn.
    let before = fake.downloads().len();
    fake.media(
        GROUP,
        7,
        "just a holiday picture",
        json!({"photo": [{"file_id": "g1", "file_unique_id": "g", "width": 10, "height": 10}]}),
        &[("g1", b"img")],
    );
    fake.message(GROUP, 7, "@hakobot after the picture");
    fake.wait_sent(GROUP, "the mentioned reply", |t| t == "after the picture")
        .await;
    assert_eq!(
        fake.downloads().len(),
        before,
        "the group photo was not fetched"
    );
    assert!(!std::fs::read_to_string(&log).unwrap().contains(TOKEN));
    stack.stop().await;
}

/// Pairing: a stranger's refusal carries a code; nobody but the operator can accept it (no
/// token, a tenant's, one without `groups:write`, a wrong code); accepted, the chat is told
/// and answered from its next message, across an adapter restart; let out, it is refused
/// again with a new code and reaches no turn.
#[tokio::test(flavor = "multi_thread")]
async fn a_stranger_is_paired_by_the_operator_and_let_out_again() {
    use hako_client::authd::AuthdClient;
    use hako_shared::auth::wire::MintRequest;
    let stack = Stack::start().await;
    stack.group("alice", "tg:111", json!({})).await;
    stack.group("guest", "tg:999", json!({})).await;
    let fake = FakeTelegram::start().await;
    let log = stack.dir.path().join("adapter.log");
    let mut adapter = stack.adapter(&fake, &[ALICE], &log);

    fake.message(STRANGER, STRANGER as u64, "hello?");
    let refusal = fake
        .wait_sent(STRANGER, "the refusal with a code", |t| {
            t.contains("hako telegram pair ")
        })
        .await;
    let code = refusal.rsplit(' ').next().unwrap().to_owned();
    assert_eq!(code.len(), 9, "{refusal}");

    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let call = |op: Op<Value>, token: Option<String>| {
        let (http, url) = (http.clone(), adapter.url.clone());
        async move {
            let mut req = http.request(op.method, format!("{url}{}", op.path));
            if let Some(t) = token {
                req = req.bearer_auth(t);
            }
            let r = req.send().await.unwrap();
            let status = r.status().as_u16();
            (
                status,
                r.json::<serde_json::Value>().await.unwrap_or_default(),
            )
        }
    };
    let mint = |scope: &[&str], folder: Option<&str>| {
        let req = MintRequest {
            scope: scope.iter().map(|s| (*s).to_owned()).collect(),
            folder: folder.map(str::to_owned),
            ttl_seconds: Some(600),
            ..Default::default()
        };
        let (url, op) = (stack.authd_url.clone(), stack.operator.clone());
        async move {
            AuthdClient::new(&url)
                .unwrap()
                .mint(&op, &req)
                .await
                .unwrap()
                .token
        }
    };
    let pair = telegram::pair(&code);
    let (s, v) = call(pair.clone(), None).await;
    assert_eq!((s, v["error"].as_str()), (401, Some("unauthorized")), "{v}");
    let tenant = mint(&["groups:write"], Some("alice")).await;
    let reader = mint(&["chats:read"], None).await;
    for t in [tenant, reader] {
        let (s, v) = call(pair.clone(), Some(t)).await;
        assert_eq!(
            (s, v["error"].as_str()),
            (403, Some("insufficient_scope")),
            "{v}"
        );
    }
    let op = Some(stack.operator.clone());
    let (s, v) = call(telegram::pair("ABCD-EFGH"), op.clone()).await;
    assert_eq!((s, v["error"].as_str()), (404, Some("not_found")), "{v}");
    assert!(stack.history("tg:999").await.is_empty(), "still no turn");

    // The operator accepts (in lower case, as a person might type it).
    let (s, v) = call(telegram::pair(&code.to_lowercase()), op.clone()).await;
    assert_eq!((s, v["chat_id"].as_i64()), (200, Some(STRANGER)), "{v}");
    fake.wait_sent(STRANGER, "the chat is told", |t| t.contains("now allowed"))
        .await;
    fake.message(STRANGER, STRANGER as u64, "now let in");
    fake.wait_sent(STRANGER, "the reply", |t| t == "now let in")
        .await;
    let (s, v) = call(pair.clone(), op.clone()).await;
    assert_eq!(s, 404, "a code is used once: {v}");
    let (s, v) = call(telegram::pairings(), op.clone()).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["paired"][0]["chat_id"], STRANGER, "{v}");
    assert_eq!(v["paired"][0]["by"], "operator", "{v}");

    // Across a restart of the adapter.
    adapter.kill();
    let adapter = stack.adapter(&fake, &[ALICE], &log);
    fake.message(STRANGER, STRANGER as u64, "after a restart");
    fake.wait_sent(STRANGER, "the reply after a restart", |t| {
        t == "after a restart"
    })
    .await;

    // Let out: refused again, with a new code, and no turn.
    let call = |op: Op<Value>| {
        let (http, url, token) = (http.clone(), adapter.url.clone(), stack.operator.clone());
        async move {
            let r = http
                .request(op.method, format!("{url}{}", op.path))
                .bearer_auth(token)
                .send()
                .await
                .unwrap();
            r.status().as_u16()
        }
    };
    assert_eq!(call(telegram::unpair(STRANGER)).await, 204);
    assert_eq!(call(telegram::unpair(STRANGER)).await, 404);
    fake.message(STRANGER, STRANGER as u64, "out again");
    let again = fake
        .wait_sent(STRANGER, "a second refusal", |t| {
            t.contains("hako telegram pair ") && !t.ends_with(&code)
        })
        .await;
    assert_ne!(again, refusal);
    fake.message(ALICE, ALICE as u64, "alice still here");
    fake.wait_sent(ALICE, "alice's reply", |t| t == "alice still here")
        .await;
    assert!(
        !fake.sent(STRANGER).iter().any(|t| t == "out again"),
        "no turn once let out"
    );
    let log_text = std::fs::read_to_string(&log).unwrap();
    assert!(!log_text.contains(TOKEN));
    stack.stop().await;
}
