//! What a hostile tenant, model or chat adapter tries against hako, run the way each was
//! found (`specs/tenancy.md`): a channel's child token, a flood of held calls on a live
//! turn's socket, a long call shown cut to its approver, a tenant's verdict, a group deleted
//! and made again, a deleted folder's files, many sub-folder tokens holding every stream, a
//! foreign `Host` in open dev mode, a routd SIGTERM while a call is held, a customer
//! approving their own call, task firings past the day's bytes, a stream of a chat moved to
//! another folder, `register_group` over the operator's group. Real authd, runed and routd,
//! real `hako-agent` containers; every assertion is what a chat, the API or the disk shows.

mod common;

use std::path::Path;
use std::time::Duration;

use common::*;
use hako_client::authd::AuthdClient;
use hako_client::routd;
use hako_client::testing::send;
use hako_shared::auth::wire::MintRequest;
use hako_shared::chat::MessageKind;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

/// Posts `text` into `chat` as `sender` with `token`.
async fn post(
    rig: &Rig,
    token: &str,
    chat: &str,
    id: &str,
    sender: &str,
    text: &str,
) -> (u16, Value) {
    rig.api()
        .post(
            token,
            "/v1/messages",
            json!({"id": id, "chat_jid": chat, "sender": sender, "content": text}),
        )
        .await
}

/// A token minted from `parent`'s (authd keeps the chain's subject).
async fn child_of(rig: &Rig, parent: &str, scope: &[&str], folder: Option<&str>) -> String {
    AuthdClient::new(&rig.authd_url())
        .unwrap()
        .mint(
            parent,
            &MintRequest {
                scope: scope.iter().map(|s| (*s).to_owned()).collect(),
                folder: folder.map(str::to_owned),
                ttl_seconds: Some(600),
                ..Default::default()
            },
        )
        .await
        .unwrap()
        .token
}

/// A chat adapter's child token is the adapter's: held to the chats `ROUTD_CHANNEL_CHATS`
/// names, never a folder's `web:` chats, and no sign-in link (it posted into `web:main`,
/// sent `/new` there, read `web:acme` and signed in to the page with no folder).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_channels_child_token_is_held_to_the_channels_chats() {
    let rig = Rig::new(&[], &[("ROUTD_CHANNEL_CHATS", "tg:*")]).await;
    rig.put_group("main", json!({"name": "main", "group": {"trust": "main"}}))
        .await;
    rig.put_group("acme", json!({"name": "acme"})).await;
    rig.route("tg:*", "acme").await;
    let child = child_of(&rig, &rig.channel, &["messages:write", "chats:read"], None).await;
    for (chat, text) in [("web:main", "hello main"), ("web:main", "/new")] {
        let (s, v) = post(
            &rig,
            &child,
            chat,
            &format!("c-{}", text.len()),
            "mallory",
            text,
        )
        .await;
        assert_eq!(
            (s, v["error"].as_str()),
            (403, Some("folder_forbidden")),
            "{chat} {text}: {v}"
        );
    }
    let (s, v) = rig.send(&child, routd::chat_messages("web:acme")).await;
    assert_eq!(s, 404, "another folder's web chat: {v}");
    let (s, v) = post(&rig, &child, "tg:42", "c-ok", "alice", "hi from telegram").await;
    assert_eq!(s, 201, "the chats it serves still work: {v}");
    // Files: the same chats as messages. Into web:main's folder never; into tg:42's folder
    // (acme) yes; a folder-bound token of acme cannot put files into main's chat either.
    let put = |token: String, chat: &'static str| {
        let rig = &rig;
        async move {
            let file = b"planted".to_vec().into();
            rig.send(&token, routd::put_chat_media(chat, "planted.txt", file))
                .await
        }
    };
    let (s, v) = put(child.clone(), "web:main").await;
    assert_eq!(s, 404, "no file into another folder's web chat: {v}");
    let acme_user = child_of(&rig, &rig.operator, &["messages:write"], Some("acme")).await;
    let (s, v) = put(acme_user, "web:main").await;
    assert_eq!(
        s, 404,
        "a tenant's token reaches no other folder's chat: {v}"
    );
    let (s, v) = put(child.clone(), "tg:42").await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(
        (v["folder"].as_str(), v["path"].as_str()),
        (Some("acme"), Some("/workspace/media/planted.txt")),
        "{v}"
    );
    let media = |folder: &str| {
        rig.data()
            .join(hako_shared::layout::dir_rel(
                &hako_shared::GroupFolder::new(folder).unwrap(),
                hako_shared::layout::FolderDir::Workspace,
            ))
            .join("media/planted.txt")
    };
    assert_eq!(std::fs::read(media("acme")).unwrap(), b"planted");
    assert!(!media("main").exists());
    let r = reqwest::Client::builder()
        .no_proxy()
        .build()
        .unwrap()
        .post(format!("{}/web/session", rig.base()))
        .header("origin", rig.base())
        .json(&json!({"token": child}))
        .send()
        .await
        .unwrap();
    assert_eq!(
        r.status().as_u16(),
        401,
        "no sign-in with an adapter's token"
    );
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"], "invalid_link", "{v}");
    assert!(
        rig.history("web:main").await.is_empty(),
        "nothing reached web:main"
    );
    rig.stop().await;
}

/// A raw MCP client on a live turn's socket.
struct Mcp {
    lines: tokio::io::Lines<BufReader<tokio::net::unix::OwnedReadHalf>>,
    w: tokio::net::unix::OwnedWriteHalf,
}

impl Mcp {
    async fn connect(sock: &Path) -> Mcp {
        let (r, w) = tokio::net::UnixStream::connect(sock)
            .await
            .unwrap()
            .into_split();
        let mut m = Mcp {
            lines: BufReader::new(r).lines(),
            w,
        };
        m.send(
            json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "hostile", "version": "0"}}}),
        )
        .await;
        m.next().await;
        m.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await;
        m
    }

    async fn send(&mut self, v: Value) {
        let mut line = v.to_string();
        line.push('\n');
        self.w.write_all(line.as_bytes()).await.unwrap();
    }

    async fn call(&mut self, id: u64, tool: &str, args: Value) {
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": tool, "arguments": args}}))
            .await;
    }

    /// The next message, if the connection still answers within a few seconds.
    async fn next(&mut self) -> Option<Value> {
        let line = tokio::time::timeout(Duration::from_secs(5), self.lines.next_line())
            .await
            .ok()?
            .ok()??;
        serde_json::from_str(&line).ok()
    }
}

fn db_bytes(data: &Path) -> u64 {
    ["routd.db", "routd.db-wal"]
        .iter()
        .filter_map(|f| std::fs::metadata(data.join(f)).ok())
        .map(|m| m.len())
        .sum()
}

/// Held calls are a bounded write path: 120 held `send_message` calls of 60 KiB from six
/// connections on one turn's socket hold at most four requests, each counted against the
/// turn's and the group's bounds (they added 99 MB to routd.db in 9 s before); a nested
/// argument too large for a person to read is refused; and another tenant's pending request
/// stays in its own list however many requests other folders hold (the list took the newest
/// 100 of all folders, then filtered).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn held_calls_are_bounded_and_each_tenant_sees_its_own() {
    let rig = Rig::new(LONG_RUNS, &[]).await;
    // beta's pending request first: the flood that follows is newer.
    rig.put_group(
        "beta",
        json!({"name": "beta", "grants": ["*", "?send_message"]}),
    )
    .await;
    let beta = rig.running_turn("beta").await;
    let (turn, run) = (
        beta["turn_id"].as_str().unwrap().to_owned(),
        beta["run_id"].as_str().unwrap().to_owned(),
    );
    let spawn = rig
        .spawn_token("beta", &format!("{turn}.1"), &run, 300)
        .await
        .token;
    let api = rig.api();
    let held = tokio::spawn({
        let op = routd::turn_tool(
            &format!("{turn}.1"),
            "send_message",
            &json!({"text": "beta's own"}),
        );
        async move { send(&api, &spawn, op).await }
    });
    let beta_id = nth_request(&rig, "web:beta", 1).await;

    rig.put_group(
        "flood",
        json!({"name": "flood", "grants": ["*", "?send_message", "?agent_tool:Bash"]}),
    )
    .await;
    rig.running_turn("flood").await;
    let sock = rig.data().join("folders/flood/ipc/mcp.sock");
    let before = db_bytes(&rig.data());
    let text = "x".repeat(60 << 10);
    let mut conns = Vec::new();
    for _ in 0..6 {
        conns.push(Mcp::connect(&sock).await);
    }
    for (c, conn) in conns.iter_mut().enumerate() {
        for i in 0..20u64 {
            conn.call(
                100 * c as u64 + i + 1,
                "send_message",
                json!({"text": text}),
            )
            .await;
        }
    }
    // Each connection answers what it does not hold at once; the held ones wait.
    let drained = futures_util::future::join_all(conns.iter_mut().map(|conn| async move {
        let mut refused = 0;
        while let Some(m) = conn.next().await {
            if m["result"]["isError"] == true || m.get("error").is_some() {
                refused += 1;
            }
        }
        refused
    }))
    .await;
    let refused: usize = drained.iter().sum();
    let (_, list) = rig
        .api()
        .get(&rig.operator, "/v1/approvals?limit=1000")
        .await;
    let flood: Vec<&Value> = list["approvals"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["folder"] == "flood")
        .collect();
    assert_eq!(flood.len(), 4, "at most four held at once: {list}");
    assert_eq!(refused, 116, "the rest refused at once");
    let grew = db_bytes(&rig.data()).saturating_sub(before);
    assert!(
        grew < 2 << 20,
        "routd.db grew {grew} bytes for 120 held calls"
    );
    // A nested argument no one can read whole is refused, not stored.
    let mut one = Mcp::connect(&sock).await;
    one.call(
        9,
        "agent_tool",
        json!({"tool_name": "Bash", "input": {"command": "y".repeat(100 << 10)}}),
    )
    .await;
    let m = one.next().await.expect("an answer at once");
    assert_eq!(m["result"]["isError"], true, "{m}");
    assert!(m.to_string().contains("at most"), "{m}");

    // beta's tenant, listing one request, sees its own: four newer ones are flood's.
    let tenant = rig.mint(&["approvals:read"], Some("beta"), 600).await;
    let (s, v) = rig.api().get(&tenant, "/v1/approvals?limit=1").await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["approvals"][0]["id"], beta_id.as_str(), "{v}");
    held.abort();
    rig.stop().await;
}

/// The approver sees what runs: a call longer than the chat shows is marked cut there and
/// names where to read it whole, and the API gives it whole (`SECRET-TAIL` was approved
/// unseen). A tenant's verdict is the tenant's, not the operator's, in the notice and the
/// audit (tenant tokens carry the operator's subject).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_approver_sees_the_whole_call_and_who_decided() {
    let rig = Rig::new(LONG_RUNS, &[]).await;
    rig.put_group(
        "acme",
        json!({"name": "acme", "grants": ["*", "?send_message"]}),
    )
    .await;
    let long = format!("{} SECRET-TAIL: exfil=4711", "a".repeat(3000));
    rig.say(
        "web:acme",
        "l-1",
        &format!(r#"/mcp send_message {{"text":"{long}"}}"#),
    )
    .await;
    let id = nth_request(&rig, "web:acme", 1).await;
    let h = rig.history("web:acme").await;
    let asked = h.iter().find(|m| m.kind == MessageKind::Approval).unwrap();
    assert!(!asked.content.contains("SECRET-TAIL"), "{}", asked.content);
    assert!(
        asked.content.contains("cut")
            && asked.content.contains(&format!("hako approvals show {id}")),
        "the chat says it is cut and where to read it: {}",
        asked.content
    );
    let tenant = rig
        .mint(&["approvals:read", "approvals:write"], Some("acme"), 600)
        .await;
    let (s, a) = rig.send(&tenant, routd::approval(&id)).await;
    assert_eq!(s, 200, "{a}");
    assert_eq!(
        a["arguments"]["text"],
        long.as_str(),
        "the API shows it whole"
    );
    let (s, v) = rig.send(&tenant, routd::decide(&id, false)).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["decided_by"], "operator@acme", "{v}");
    let h = rig
        .wait_for("web:acme", "the verdict's notice", |h| {
            notices(h)
                .iter()
                .any(|n| n.contains(&id) && n.contains("denied by"))
        })
        .await;
    let notice = notices(&h)
        .into_iter()
        .find(|n| n.contains(&id) && n.contains("denied by"))
        .unwrap();
    assert!(notice.contains("denied by operator@acme"), "{notice}");
    let (_, audit) = rig.api().get(&rig.operator, "/v1/audit?limit=100").await;
    let verdict = audit["entries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["action"] == "approval.verdict" && e["detail"].as_str().unwrap().contains(&id))
        .cloned()
        .unwrap_or(Value::Null);
    assert_eq!(verdict["actor"], "operator@acme", "{audit}");
    rig.stop().await;
}

/// A tenant cannot shed the operator's policy: it cannot delete the group the operator set
/// (and `PUT` it back by name with every tool, approvals from the chat, the default limits),
/// nor make its own root group, nor a group with no group of its own above; it deletes what
/// it made. A main group's agent cannot re-register the operator's sub-group.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tenant_cannot_shed_the_operators_policy() {
    let rig = Rig::new(&[], &[]).await;
    let policy = json!({"name": "acme", "grants": ["get_history"],
        "approvals": {"from": "operator"}, "group": {"memory": "256m"}});
    rig.put_group("acme", policy.clone()).await;
    let tenant = rig
        .mint(&["groups:write", "groups:read"], Some("acme"), 600)
        .await;
    let (s, v) = rig.api().delete(&tenant, "/v1/groups/acme").await;
    assert_eq!(
        (s, v["error"].as_str()),
        (403, Some("folder_forbidden")),
        "{v}"
    );
    let (_, g) = rig.api().get(&rig.operator, "/v1/groups/acme").await;
    assert_eq!(g["grants"], policy["grants"], "unchanged: {g}");
    // Its own sub-group: made from acme's settings, and deleted by it.
    let (s, v) = rig
        .api()
        .put(&tenant, "/v1/groups/acme%2Fbots", json!({"name": "bots"}))
        .await;
    assert_eq!(s, 201, "{v}");
    assert_eq!(v["grants"], policy["grants"], "{v}");
    let (s, v) = rig.api().delete(&tenant, "/v1/groups/acme%2Fbots").await;
    assert_eq!(s, 204, "{v}");
    // A tenant of a folder the operator has not set up makes nothing there.
    let stray = rig
        .mint(&["groups:write", "groups:read"], Some("gamma"), 600)
        .await;
    for path in ["/v1/groups/gamma", "/v1/groups/gamma%2Fx"] {
        let (s, v) = rig.api().put(&stray, path, json!({"name": "mine"})).await;
        assert_eq!(
            (s, v["error"].as_str()),
            (403, Some("folder_forbidden")),
            "{path}: {v}"
        );
    }
    // The operator's sub-group of a main group is not the main agent's to replace.
    rig.put_group("main", json!({"name": "main", "group": {"trust": "main"}}))
        .await;
    rig.put_group(
        "main/ops",
        json!({"name": "ops", "grants": ["get_history"], "approvals": {"from": "operator"}}),
    )
    .await;
    rig.say(
        "web:main",
        "r-1",
        r#"/mcp register_group {"folder":"main/ops","name":"mine now","grants":["*"]}"#,
    )
    .await;
    let h = rig
        .wait_for("web:main", "the register_group result", |h| {
            replies(h).iter().any(|r| r.contains("register_group"))
        })
        .await;
    let answer = replies(&h)
        .into_iter()
        .find(|r| r.contains("register_group"))
        .unwrap();
    assert!(
        tool_lines(&answer)["register_group"][0].starts_with("tool error: not_granted"),
        "{answer}"
    );
    let (_, ops) = rig.api().get(&rig.operator, "/v1/groups/main%2Fops").await;
    assert_eq!(
        (&ops["name"], &ops["grants"]),
        (&json!("ops"), &json!(["get_history"])),
        "{ops}"
    );
    rig.stop().await;
}

/// A deleted group's folder does not pass to the next group made there: its files (what its
/// agent wrote, settings it planted) and its warm box go with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_deleted_groups_files_and_box_do_not_reach_the_next_group() {
    let rig = Rig::new(&[("RUNED_WARM_MAX", "4")], &[]).await;
    rig.put_group("old", json!({"name": "old"})).await;
    rig.say(
        "web:old",
        "o-1",
        "/write /workspace/planted.txt left by the old group",
    )
    .await;
    rig.wait_for("web:old", "the write", |h| !replies(h).is_empty())
        .await;
    rig.wait_idle("old").await;
    let folder = rig.data().join("folders/old");
    assert!(folder.join("workspace/planted.txt").is_file());
    let docker = bollard::Docker::connect_with_local_defaults().unwrap();
    let boxes = |docker: bollard::Docker, install: String| async move {
        let labels = vec![
            format!("io.hako.install={install}"),
            "io.hako.folder=old".to_owned(),
        ];
        labelled(&docker, labels).await.len()
    };
    eventually("the folder's warm box", LIMIT, || async {
        match boxes(docker.clone(), rig.install.clone()).await {
            0 => Err("none yet"),
            _ => Ok(()),
        }
    })
    .await;
    let (s, v) = rig.api().delete(&rig.operator, "/v1/groups/old").await;
    assert_eq!(s, 204, "{v}");
    assert!(
        !folder.exists(),
        "the folder's directory left with its group"
    );
    eventually("the warm box removed", LIMIT, || async {
        match boxes(docker.clone(), rig.install.clone()).await {
            0 => Ok(()),
            n => Err(n),
        }
    })
    .await;
    rig.put_group("old", json!({"name": "new owner"})).await;
    rig.say("web:old", "o-2", "/read /workspace/planted.txt")
        .await;
    let h = rig
        .wait_for("web:old", "the read", |h| replies(h).len() >= 2)
        .await;
    let read = replies(&h).pop().unwrap();
    assert!(!read.contains("left by the old group"), "{read}");
    rig.stop().await;
}

/// Sub-folder tokens are one tenant's: 16 children each bound to a sub-group of `acme` hold
/// `ROUTD_MAX_STREAMS_PER_CALLER` streams between them, not 16 times that; and tenants
/// together leave a quarter of `ROUTD_MAX_STREAMS` to the operator (a tenant's children held
/// all 256, and every other tenant and the operator got 429).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sub_folder_tokens_do_not_multiply_a_tenants_streams() {
    let rig = Rig::new(
        &[],
        &[
            ("ROUTD_MAX_STREAMS_PER_CALLER", "3"),
            ("ROUTD_MAX_STREAMS", "8"),
        ],
    )
    .await;
    for g in ["acme", "beta", "gamma"] {
        rig.put_group(g, json!({"name": g})).await;
    }
    let tenant = rig
        .mint(
            &["chats:read", "groups:write", "groups:read"],
            Some("acme"),
            600,
        )
        .await;
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let open = |token: String, chat: String| {
        let (http, base) = (http.clone(), rig.base());
        async move {
            http.get(format!("{base}/v1/chats/{}/events", enc(&chat)))
                .bearer_auth(token)
                .send()
                .await
                .unwrap()
        }
    };
    let mut held = Vec::new();
    let mut refused = 0;
    for i in 0..6 {
        let f = format!("acme/s{i}");
        let cfg = serde_json::from_value(json!({"name": f})).unwrap();
        let (s, v) = rig.send(&tenant, routd::put_group(&f, &cfg)).await;
        assert_eq!(s, 201, "{v}");
        let child = rig.mint(&["chats:read"], Some(&f), 600).await;
        let r = open(child, format!("web:{f}")).await;
        match r.status().as_u16() {
            200 => held.push(r),
            429 => refused += 1,
            s => panic!("stream answered {s}"),
        }
    }
    assert_eq!(
        (held.len(), refused),
        (3, 3),
        "acme's sub-folders share acme's three"
    );
    // Other tenants fill what tenants may hold together (6 of 8); the operator still gets in.
    let beta = rig.mint(&["chats:read"], Some("beta"), 600).await;
    for _ in 0..3 {
        let r = open(beta.clone(), "web:beta".into()).await;
        assert_eq!(r.status(), 200);
        held.push(r);
    }
    let gamma = rig.mint(&["chats:read"], Some("gamma"), 600).await;
    let over = open(gamma, "web:gamma".into()).await;
    assert_eq!(over.status(), 429, "tenants hold six of eight");
    let op = open(rig.operator.clone(), "web:beta".into()).await;
    assert_eq!(
        op.status(),
        200,
        "the operator is never locked out by tenants"
    );
    rig.stop().await;
}

/// An open chat stream ends when its chat is routed away from the caller's folder.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stream_ends_when_its_chat_moves_to_another_folder() {
    let rig = Rig::new(&[], &[]).await;
    rig.put_group("acme", json!({"name": "acme"})).await;
    rig.put_group("beta", json!({"name": "beta"})).await;
    let (s, v) = rig
        .api()
        .post(
            &rig.operator,
            "/v1/routes",
            json!({"pattern": "tg:7", "folder": "acme"}),
        )
        .await;
    assert_eq!(s, 201, "{v}");
    let route = v["id"].as_i64().unwrap();
    let tenant = rig.mint(&["chats:read"], Some("acme"), 600).await;
    let mut stream = reqwest::Client::builder()
        .no_proxy()
        .build()
        .unwrap()
        .get(format!("{}/v1/chats/{}/events", rig.base(), enc("tg:7")))
        .bearer_auth(&tenant)
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status(), 200);
    let (s, _) = rig.send(&rig.operator, routd::delete_route(route)).await;
    assert_eq!(s, 200);
    rig.route("tg:7", "beta").await;
    let ended = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            match stream.chunk().await {
                Ok(Some(_)) => continue,
                _ => return,
            }
        }
    })
    .await;
    assert!(ended.is_ok(), "the stream of a chat now beta's ended");
    rig.stop().await;
}

/// Open dev mode answers requests to loopback names only: a page the developer visits can
/// point its own name at 127.0.0.1 (DNS rebinding), and with a foreign `Host` and `Origin`
/// it made `main` `network: open` and posted messages.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_dev_mode_refuses_foreign_hosts() {
    let dir = tempfile::tempdir().unwrap();
    let env = hako_shared::config::Env::from_pairs([
        ("HAKO_OPEN_DEV", "1"),
        ("DATA_DIR", dir.path().to_str().unwrap()),
        ("RUNED_URL", "http://127.0.0.1:9"),
    ]);
    let cfg = hako_routd::Config::from_env(&env).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let routd = hako_routd::start(cfg, listener).await.unwrap();
    let port = routd.addr().port();
    let raw = |host: String, origin: Option<&'static str>| async move {
        let body = r#"{"name":"main","group":{"trust":"main","network":"open"}}"#;
        let origin = origin
            .map(|o| format!("Origin: {o}\r\n"))
            .unwrap_or_default();
        let req = format!(
            "PUT /v1/groups/main HTTP/1.1\r\nHost: {host}\r\n{origin}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .unwrap();
        s.write_all(req.as_bytes()).await.unwrap();
        let mut out = String::new();
        tokio::io::AsyncReadExt::read_to_string(&mut s, &mut out)
            .await
            .unwrap();
        out
    };
    let foreign = raw(format!("rebind.example:{port}"), None).await;
    assert!(foreign.starts_with("HTTP/1.1 403"), "{foreign}");
    assert!(foreign.contains("foreign_host"), "{foreign}");
    let cross = raw(format!("127.0.0.1:{port}"), Some("http://rebind.example")).await;
    assert!(cross.starts_with("HTTP/1.1 403"), "{cross}");
    let local = raw(format!("localhost:{port}"), None).await;
    assert!(
        local.starts_with("HTTP/1.1 201"),
        "a local caller is served: {local}"
    );
    routd.shutdown().await;
}

/// routd SIGTERMed while a call is held: the call is not run and its request is not
/// decided by the stop (a SIGTERM used to record `turn_ended` with no notice in some rounds,
/// and the turn resumed); the agent asks again after the restart and the person's Approve
/// runs it once, in every round.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sigterm_with_a_held_call_keeps_it_for_the_person() {
    let mut rig = Rig::new(LONG_RUNS, &[]).await;
    rig.spawn_routd_binary().await;
    let chat = "tg:term";
    rig.put_group(
        "term",
        json!({"name": "term", "grants": ["*", "?send_message"], "approvals": {"wait": "10m"}}),
    )
    .await;
    rig.route(chat, "term").await;
    for round in 1..=3 {
        let text = format!("round {round}");
        rig.say(
            chat,
            &format!("t-{round}"),
            &format!(r#"/mcp send_message {{"text":"{text}"}}"#),
        )
        .await;
        let id = nth_request(&rig, chat, round).await;
        let (mut child, _) = rig.child.take().unwrap();
        rustix::process::kill_process(
            rustix::process::Pid::from_child(&child),
            rustix::process::Signal::TERM,
        )
        .unwrap();
        child.wait().unwrap();
        rig.spawn_routd_binary().await;
        let (_, a) = rig.send(&rig.operator, routd::approval(&id)).await;
        assert_eq!(a["state"], "pending", "round {round}: {a}");
        assert!(
            !replies(&rig.history(chat).await).contains(&text),
            "round {round}: not run before the verdict"
        );
        let (s, v) = rig.send(&rig.operator, routd::decide(&id, true)).await;
        assert_eq!(s, 200, "round {round}: {v}");
        rig.wait_for(chat, "the approved call's effect", |h| {
            replies(h).contains(&text)
        })
        .await;
        rig.wait_idle("term").await;
        let h = rig.history(chat).await;
        assert_eq!(
            replies(&h).iter().filter(|r| **r == text).count(),
            1,
            "round {round}: run once"
        );
        assert_eq!(requests(&h).len(), round, "round {round}: asked once");
    }
    rig.stop().await;
}

/// A chat's word counts only where the chat is the group's alone and the call stays in it:
/// in a group serving `tg:*`, a customer cannot approve what their own prompt made the agent
/// do; a call reaching another chat is not the asking chat's to approve; and a `sender`
/// nobody vouches for (a tenant's post) names no approver. The operator decides each.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_chat_approves_only_what_is_its_own() {
    let rig = Rig::new(LONG_RUNS, &[]).await;
    // Many customers through one glob route.
    rig.put_group(
        "support",
        json!({"name": "support", "grants": ["*", "?send_message"]}),
    )
    .await;
    rig.route("tg:cust-*", "support").await;
    rig.say(
        "tg:cust-alice",
        "a-1",
        r#"/mcp send_message {"text":"refund me"}"#,
    )
    .await;
    let id = nth_request(&rig, "tg:cust-alice", 1).await;
    let (s, v) = post(
        &rig,
        &rig.channel,
        "tg:cust-alice",
        "a-2",
        "alice",
        &format!("/approve {id}"),
    )
    .await;
    assert_eq!(s, 201, "{v}");
    let h = rig
        .wait_for("tg:cust-alice", "the refusal", |h| {
            notices(h).iter().any(|n| n.contains("may not answer"))
        })
        .await;
    assert!(
        notices(&h).iter().any(|n| n.contains("many chats")),
        "{:?}",
        notices(&h)
    );
    let (_, a) = rig.send(&rig.operator, routd::approval(&id)).await;
    assert_eq!(a["state"], "pending", "{a}");
    let (s, _) = rig.send(&rig.operator, routd::decide(&id, false)).await;
    assert_eq!(s, 200);
    rig.wait_idle("support").await;

    // A call reaching another chat, asked in a chat of its own.
    rig.put_group(
        "desk",
        json!({"name": "desk", "grants": ["*", "?send_message:tg:desk-b"]}),
    )
    .await;
    rig.route("tg:desk-a", "desk").await;
    rig.route("tg:desk-b", "desk").await;
    rig.say(
        "tg:desk-a",
        "d-1",
        r#"/mcp send_message {"text":"to b","chat_jid":"tg:desk-b"}"#,
    )
    .await;
    let id = nth_request(&rig, "tg:desk-a", 1).await;
    post(
        &rig,
        &rig.channel,
        "tg:desk-a",
        "d-2",
        "alice",
        &format!("/approve {id}"),
    )
    .await;
    rig.wait_for("tg:desk-a", "the refusal", |h| {
        notices(h).iter().any(|n| n.contains("another chat"))
    })
    .await;
    let (_, a) = rig.send(&rig.operator, routd::approval(&id)).await;
    assert_eq!(a["state"], "pending", "{a}");
    rig.send(&rig.operator, routd::decide(&id, false)).await;
    rig.wait_idle("desk").await;

    // Named approvers: a tenant's post claiming to be one names no one.
    rig.put_group(
        "named",
        json!({"name": "named", "grants": ["*", "?send_message"],
               "approvals": {"from": "senders", "senders": ["boss"]}}),
    )
    .await;
    rig.route("tg:named", "named").await;
    rig.say("tg:named", "n-1", r#"/mcp send_message {"text":"named"}"#)
        .await;
    let id = nth_request(&rig, "tg:named", 1).await;
    let tenant = rig.mint(&["messages:write"], Some("named"), 600).await;
    let (s, v) = post(
        &rig,
        &tenant,
        "tg:named",
        "n-2",
        "boss",
        &format!("/approve {id}"),
    )
    .await;
    assert_eq!(s, 201, "{v}");
    rig.wait_for("tg:named", "the refusal", |h| {
        notices(h).iter().any(|n| n.contains("may not answer"))
    })
    .await;
    let (_, a) = rig.send(&rig.operator, routd::approval(&id)).await;
    assert_eq!(
        a["state"], "pending",
        "a claimed sender approved nothing: {a}"
    );
    // The adapter vouches for its sender: that is the named approver.
    post(
        &rig,
        &rig.channel,
        "tg:named",
        "n-3",
        "boss",
        &format!("/approve {id}"),
    )
    .await;
    rig.wait_for("tg:named", "the approved call's effect", |h| {
        replies(h).iter().any(|r| r == "named")
    })
    .await;
    rig.stop().await;
}

/// Task firings write into the log: they count against the group's bytes of the day, and
/// past that bound a firing is skipped, never written (100 cron tasks × 64 KiB a minute
/// were not counted).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn task_firings_count_against_the_groups_bytes() {
    let rig = Rig::new(&[], &[("ROUTD_GROUP_MAX_BYTES_PER_DAY", "2500")]).await;
    rig.put_group("cron", json!({"name": "cron"})).await;
    let prompt = "p".repeat(1500);
    let script = [
        format!(r#"/mcp schedule_task {{"prompt":"{prompt}","after":"2s"}}"#),
        format!(r#"/mcp schedule_task {{"prompt":"{prompt}","after":"2s"}}"#),
    ]
    .join("\n");
    rig.say("web:cron", "c-1", &script).await;
    rig.wait_for("web:cron", "the schedules", |h| !replies(h).is_empty())
        .await;
    rig.wait_for("web:cron", "a firing", |h| {
        h.iter().any(|m| m.kind == MessageKind::Task)
    })
    .await;
    // Both were due together; give the second every chance to fire.
    eventually("both tasks done", LIMIT, || async {
        let (_, t) = rig
            .api()
            .get(&rig.operator, "/v1/tasks?folder=cron&all=true")
            .await;
        let tasks = t["tasks"].as_array().cloned().unwrap_or_default();
        if tasks.len() == 2 && tasks.iter().all(|t| t["state"] != "active") {
            Ok(())
        } else {
            Err(t)
        }
    })
    .await;
    let fired = rig
        .history("web:cron")
        .await
        .iter()
        .filter(|m| m.kind == MessageKind::Task)
        .count();
    assert_eq!(fired, 1, "the second firing was over the day's bytes");
    rig.stop().await;
}
