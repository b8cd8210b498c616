//! Tenancy at the routing plane, attacked from outside as a hostile tenant would: one group
//! serving many chats keeps each chat's session and reach apart; a folder-bound tenant
//! changes only what it may and cannot mint budgets or groups; one turn cannot fill the
//! disk. Real authd, runed and routd, the real `hako-agent` as host processes on the simulated
//! engine (no Docker: what a container's isolation adds is `hostile.rs`'s); every assertion is what
//! a chat, a turn or the API shows.

mod common;

use common::*;
use hako_client::routd;
use hako_shared::chat::GroupConfig;
use serde_json::{Value, json};

/// A glob route (`tg:*` → `support`) makes one group serve many customers. Each chat has
/// its own agent session (alice's is never resumed in bob's turn), and a turn's tools reach
/// its own chat only: alice's turn can neither write into bob's chat nor schedule a task
/// there (whose turn would read bob's history) unless a grant names bob's chat.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_group_serving_many_chats_keeps_them_apart() {
    let rig = Rig::sim(&[], &[]).await;
    rig.put_group("support", json!({"name": "support"})).await;
    rig.route("tg:*", "support").await;
    let (alice, bob) = ("tg:alice", "tg:bob");

    // alice's session: announced by her turn, resumed by her next one only.
    rig.say(alice, "a-1", "my card PIN is 4711\n/session alice-s")
        .await;
    rig.wait_for(alice, "alice's answer", |h| !replies(h).is_empty())
        .await;
    rig.wait_idle("support").await;
    rig.say(bob, "b-1", "/echo-input").await;
    let h = rig
        .wait_for(bob, "bob's answer", |h| !replies(h).is_empty())
        .await;
    let input: Value =
        serde_json::from_str(replies(&h)[0].strip_prefix("input: ").unwrap()).unwrap();
    assert_eq!(
        input["sessionId"], "",
        "bob starts his own session: {input}"
    );
    rig.wait_idle("support").await;
    rig.say(alice, "a-2", "/echo-input").await;
    let h = rig
        .wait_for(alice, "alice's second answer", |h| replies(h).len() == 2)
        .await;
    let input: Value =
        serde_json::from_str(replies(&h)[1].strip_prefix("input: ").unwrap()).unwrap();
    assert_eq!(input["sessionId"], "alice-s", "{input}");
    let (_, g) = rig.api().get(&rig.operator, "/v1/groups/support").await;
    assert_eq!(
        g["sessions"],
        json!([{"chat_jid": alice, "session_id": "alice-s",
                "updated_at": g["sessions"][0]["updated_at"]}]),
        "{g}"
    );

    // alice's turn reaching into bob's chat: refused, nothing lands there.
    rig.wait_idle("support").await;
    let script = [
        r#"/mcp send_message {"text":"hi bob, from alice's turn","chat_jid":"tg:bob"}"#,
        r#"/mcp schedule_task {"prompt":"send me bob's history","after":"1s","chat_jid":"tg:bob"}"#,
        r#"/mcp send_message {"text":"to myself"}"#,
    ]
    .join("\n");
    rig.say(alice, "a-3", &script).await;
    let h = rig
        // The turn's answer, not the message its script sends on the way (a reply too).
        .wait_for(alice, "alice's third answer", |h| {
            replies(h).iter().any(|r| r.contains("mcp schedule_task"))
        })
        .await;
    let answer = replies(&h)
        .into_iter()
        .find(|r| r.contains("mcp schedule_task"))
        .unwrap();
    let lines = tool_lines(&answer);
    assert!(
        lines["send_message"][0].starts_with("tool error: not_granted"),
        "{answer}"
    );
    assert!(
        lines["schedule_task"][0].starts_with("tool error: not_granted"),
        "{answer}"
    );
    assert!(
        lines["send_message"][1].contains(r#""duplicate":false"#),
        "{answer}"
    );
    let bobs = rig.history(bob).await;
    assert!(
        bobs.iter()
            .all(|m| !m.content.contains("from alice's turn")),
        "nothing of alice's turn in bob's chat: {bobs:#?}"
    );
    let (_, tasks) = rig
        .api()
        .get(&rig.operator, "/v1/tasks?folder=support")
        .await;
    assert_eq!(tasks["tasks"], json!([]), "{tasks}");

    // The operator names bob's chat in a grant: now it reaches.
    let (s, v) = rig
        .api()
        .put(
            &rig.operator,
            "/v1/groups/support",
            json!({"name": "support", "grants": ["*", "send_message:tg:bob"]}),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    rig.wait_idle("support").await;
    rig.say(
        alice,
        "a-4",
        r#"/mcp send_message {"text":"a note the operator allowed","chat_jid":"tg:bob"}"#,
    )
    .await;
    rig.wait_for(bob, "the allowed note", |h| {
        h.iter().any(|m| m.content == "a note the operator allowed")
    })
    .await;
    rig.stop().await;
}

/// A folder-bound tenant renames its group: the operator's grants, model, budget and limits
/// stay (a name-only PUT used to put them all back to the defaults). A group it creates
/// below starts from its parent's settings, never wider, and the number it may make is
/// bounded.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tenant_changes_only_its_groups_name_and_prompt() {
    let rig = Rig::sim(&[], &[("ROUTD_MAX_TENANT_GROUPS", "3")]).await;
    let operator_set = json!({
        "name": "acme",
        "grants": ["get_history", "!send_message"],
        "group": {"memory": "256m", "pids": 64,
                  "llm": {"model": "claude-stub-1", "daily_tokens": 10}},
    });
    let (s, v) = rig
        .api()
        .put(&rig.operator, "/v1/groups/acme", operator_set.clone())
        .await;
    assert_eq!(s, 201, "{v}");
    let tenant = rig
        .mint(&["groups:write", "groups:read"], Some("acme"), 600)
        .await;
    let (s, v) = rig
        .api()
        .put(
            &tenant,
            "/v1/groups/acme",
            json!({"name": "ACME support", "system_prompt": "Be brief."}),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    let (_, g) = rig.api().get(&rig.operator, "/v1/groups/acme").await;
    assert_eq!(g["name"], "ACME support");
    assert_eq!(g["system_prompt"], "Be brief.");
    assert_eq!(g["grants"], operator_set["grants"], "{g}");
    let llm = &g["group"]["llm"];
    assert_eq!(
        (llm["model"].as_str(), llm["daily_tokens"].as_u64()),
        (Some("claude-stub-1"), Some(10)),
        "{g}"
    );
    assert_eq!(g["group"]["memory"], (256u64 << 20).to_string(), "{g}");
    assert_eq!(g["group"]["pids"], 64, "{g}");

    // Widening is still refused outright.
    let (s, v) = rig
        .api()
        .put(
            &tenant,
            "/v1/groups/acme",
            json!({"name": "x", "group": {"llm": {"model": "claude-stub-1", "daily_tokens": 1000000}}}),
        )
        .await;
    assert_eq!(
        (s, v["error"].as_str()),
        (403, Some("folder_forbidden")),
        "{v}"
    );

    // A sub-group starts from its parent's settings: the same budget, model and grants.
    let (s, v) = rig
        .api()
        .put(&tenant, "/v1/groups/acme%2Fbots", json!({"name": "bots"}))
        .await;
    assert_eq!(s, 201, "{v}");
    assert_eq!(v["grants"], operator_set["grants"], "{v}");
    assert_eq!(v["group"]["llm"], g["group"]["llm"], "{v}");
    assert_eq!(v["group"]["trust"], "untrusted", "{v}");
    // At most ROUTD_MAX_TENANT_GROUPS (3) under the tenant's folder, acme included.
    let (s, v) = rig
        .api()
        .put(&tenant, "/v1/groups/acme%2Fb2", json!({"name": "b2"}))
        .await;
    assert_eq!(s, 201, "{v}");
    let (s, v) = rig
        .api()
        .put(&tenant, "/v1/groups/acme%2Fb3", json!({"name": "b3"}))
        .await;
    assert_eq!(
        (s, v["error"].as_str()),
        (429, Some("too_many_groups")),
        "{v}"
    );
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .contains("ROUTD_MAX_TENANT_GROUPS"),
        "{v}"
    );
    // A rename of an existing one still works at the cap.
    let (s, v) = rig
        .api()
        .put(
            &tenant,
            "/v1/groups/acme%2Fb2",
            json!({"name": "b2 renamed"}),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    rig.stop().await;
}

/// Brokered secrets are the operator's to lend: a tenant cannot name one in its group, add a
/// host to one, or give one to a sub-group it makes; its rename leaves them as they were.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tenant_cannot_lend_itself_a_secret_or_a_host() {
    let rig = Rig::sim(&[], &[]).await;
    let lent = json!({
        "network": "allowlist",
        "egress_allowlist": ["api.github.com", "github.com"],
        "secrets": [{"name": "GH_TOKEN", "hosts": ["api.github.com"]}],
    });
    let (s, v) = rig
        .api()
        .put(
            &rig.operator,
            "/v1/groups/acme",
            json!({"name": "acme", "group": lent}),
        )
        .await;
    assert_eq!(s, 201, "{v}");
    assert_eq!(v["group"]["secrets"], lent["secrets"], "{v}");
    // The operator's own mistakes are named: a host not on the list.
    let (s, v) = rig
        .api()
        .put(
            &rig.operator,
            "/v1/groups/acme",
            json!({"name": "acme", "group": {"network": "allowlist", "egress_allowlist": ["github.com"],
                   "secrets": [{"name": "GH_TOKEN", "hosts": ["gitlab.com"]}]}}),
        )
        .await;
    assert_eq!(s, 400, "{v}");
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .contains("secrets[0].hosts[0]"),
        "{v}"
    );
    let tenant = rig
        .mint(&["groups:write", "groups:read"], Some("acme"), 600)
        .await;
    let wider_secret = json!({"network": "allowlist", "egress_allowlist": ["api.github.com", "github.com"],
        "secrets": [{"name": "GH_TOKEN", "hosts": ["api.github.com"]},
                    {"name": "NPM_TOKEN", "hosts": ["github.com"]}]});
    let wider_host = json!({"network": "allowlist", "egress_allowlist": ["api.github.com", "github.com"],
        "secrets": [{"name": "GH_TOKEN", "hosts": ["api.github.com", "github.com"]}]});
    for (path, group) in [
        ("/v1/groups/acme", wider_secret.clone()),
        ("/v1/groups/acme", wider_host),
        ("/v1/groups/acme", lent.clone()),
        ("/v1/groups/acme%2Fbots", wider_secret),
    ] {
        let (s, v) = rig
            .api()
            .put(&tenant, path, json!({"name": "x", "group": group}))
            .await;
        assert_eq!(
            (s, v["error"].as_str()),
            (403, Some("folder_forbidden")),
            "{path}: {v}"
        );
    }
    let (s, v) = rig
        .api()
        .put(&tenant, "/v1/groups/acme", json!({"name": "ACME"}))
        .await;
    assert_eq!(s, 200, "{v}");
    let (_, g) = rig.api().get(&rig.operator, "/v1/groups/acme").await;
    assert_eq!(g["group"]["secrets"], lent["secrets"], "{g}");
    assert_eq!(
        g["group"]["egress_allowlist"], lent["egress_allowlist"],
        "{g}"
    );
    rig.stop().await;
}

/// One turn writing without end is stopped: a bounded number of messages and bytes per
/// turn, status edits bounded too (each one was a webhook delivery), refused as
/// `rate_limited` tool errors the agent reads; nothing beyond the bound is stored (6,151
/// messages, 407 MB of routd.db in 8 s before).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_turn_cannot_fill_the_disk() {
    let rig = Rig::sim(
        &[],
        &[
            ("ROUTD_TURN_MAX_MESSAGES", "3"),
            ("ROUTD_TURN_MAX_STATUS", "2"),
        ],
    )
    .await;
    let chat = "web:flood";
    rig.put_group("flood", json!({"name": "flood"})).await;
    let mut script: Vec<String> = (0..5)
        .map(|i| format!(r#"/mcp send_message {{"text":"flood {i}"}}"#))
        .collect();
    script.extend((0..3).map(|i| format!(r#"/mcp set_status {{"text":"step {i}"}}"#)));
    rig.say(chat, "f-1", &script.join("\n")).await;
    let h = rig
        .wait_for(chat, "the answer", |h| {
            replies(h).iter().any(|r| r.contains("mcp send_message"))
        })
        .await;
    let answer = replies(&h)
        .into_iter()
        .find(|r| r.contains("mcp send_message"))
        .unwrap();
    let lines = tool_lines(&answer);
    let refused = |tool: &str| {
        lines[tool]
            .iter()
            .filter(|l| l.starts_with("tool error: rate_limited"))
            .count()
    };
    assert_eq!(refused("send_message"), 2, "{answer}");
    assert_eq!(refused("set_status"), 1, "{answer}");
    assert!(answer.contains("ROUTD_TURN_MAX_MESSAGES"), "{answer}");
    let floods = h.iter().filter(|m| m.content.starts_with("flood ")).count();
    assert_eq!(floods, 3, "only what the bound lets through is stored");
    rig.stop().await;
}

/// A scheduled task belongs to its group: listed and cancelled over the API (a tenant sees
/// and cancels only its own), and cancelled with its group, so it never fires into whoever
/// owns the folder next (it did, outliving its group).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tasks_belong_to_their_group() {
    let rig = Rig::sim(&[], &[]).await;
    for f in ["jobs", "other"] {
        let cfg: GroupConfig = serde_json::from_value(json!({"name": f})).unwrap();
        let (s, v) = rig.send(&rig.operator, routd::put_group(f, &cfg)).await;
        assert_eq!(s, 201, "{v}");
    }
    let script = [
        r#"/mcp schedule_task {"prompt":"soon","after":"10m"}"#,
        r#"/mcp schedule_task {"prompt":"later","after":"1h"}"#,
    ]
    .join("\n");
    rig.say("web:jobs", "j-1", &script).await;
    rig.wait_for("web:jobs", "the answer", |h| !replies(h).is_empty())
        .await;
    let (s, v) = rig.api().get(&rig.operator, "/v1/tasks?folder=jobs").await;
    assert_eq!(s, 200, "{v}");
    let tasks = v["tasks"].as_array().unwrap().clone();
    assert_eq!(tasks.len(), 2, "{v}");
    assert_eq!(tasks[0]["prompt"], "soon");
    assert_eq!(tasks[0]["chat_jid"], "web:jobs");
    let (soon, later) = (
        tasks[0]["id"].as_str().unwrap().to_owned(),
        tasks[1]["id"].as_str().unwrap().to_owned(),
    );
    // Another tenant sees none of them and cannot cancel them.
    let stranger = rig
        .mint(&["groups:write", "groups:read"], Some("other"), 600)
        .await;
    let (s, v) = rig.api().get(&stranger, "/v1/tasks").await;
    assert_eq!((s, v["tasks"].clone()), (200, json!([])), "{v}");
    let (s, v) = rig.send(&stranger, routd::cancel_task(&later)).await;
    assert_eq!(s, 404, "{v}");
    // The tenant of the folder cancels one.
    let owner = rig
        .mint(&["groups:write", "groups:read"], Some("jobs"), 600)
        .await;
    let (s, v) = rig.send(&owner, routd::cancel_task(&later)).await;
    assert_eq!((s, v["state"].as_str()), (200, Some("cancelled")), "{v}");
    // The group goes: so does its other task, before a new owner takes the folder.
    let (s, _) = rig.api().delete(&rig.operator, "/v1/groups/jobs").await;
    assert_eq!(s, 204);
    rig.put_group("jobs", json!({"name": "new owner"})).await;
    let (_, v) = rig
        .api()
        .get(&rig.operator, "/v1/tasks?folder=jobs&all=true")
        .await;
    let states: Vec<(&str, &str)> = v["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| (t["id"].as_str().unwrap(), t["state"].as_str().unwrap()))
        .collect();
    assert!(states.contains(&(soon.as_str(), "cancelled")), "{v}");
    let (_, v) = rig.api().get(&rig.operator, "/v1/tasks?folder=jobs").await;
    assert_eq!(
        v["tasks"],
        json!([]),
        "no active task of the old group: {v}"
    );
    rig.stop().await;
}

/// Reads a chat's event stream until it ends; answers whether it ended within `within`.
async fn ends_within(resp: &mut reqwest::Response, within: std::time::Duration) -> bool {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, resp.chunk()).await {
            Err(_) => return false,
            Ok(Ok(Some(_))) => continue,
            Ok(_) => return true,
        }
    }
}

/// A chat's event stream ends when its token is revoked, or expires (a revoked, then
/// expired token kept receiving messages); tenants' streams are counted apart (every tenant
/// token has the operator as its subject, and one tenant's 16 streams were a 429 for all).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn chat_streams_end_with_their_token_and_tenants_are_counted_apart() {
    let rig = Rig::sim(&[], &[("ROUTD_MAX_STREAMS_PER_CALLER", "2")]).await;
    for f in ["red", "blue"] {
        let cfg: GroupConfig = serde_json::from_value(json!({"name": f})).unwrap();
        let (s, v) = rig.send(&rig.operator, routd::put_group(f, &cfg)).await;
        assert_eq!(s, 201, "{v}");
    }
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let open = |token: String, chat: &'static str| {
        let http = http.clone();
        let url = format!("{}{}", rig.base(), routd::chat_events(chat).path);
        async move { http.get(url).bearer_auth(token).send().await.unwrap() }
    };
    // Revoked: the stream ends (within the revocation poll and a recheck).
    let client = hako_client::authd::AuthdClient::new(&rig.authd_url()).unwrap();
    let minted = client
        .mint(
            &rig.operator,
            &hako_shared::auth::wire::MintRequest {
                scope: vec!["chats:read".into()],
                folder: Some("red".into()),
                ttl_seconds: Some(600),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let mut revoked = open(minted.token.clone(), "web:red").await;
    assert_eq!(revoked.status(), 200);
    client.revoke(&rig.operator, &minted.jti).await.unwrap();
    assert!(
        ends_within(&mut revoked, std::time::Duration::from_secs(30)).await,
        "the revoked token's stream ended"
    );
    // Expired: ends too (a 3 s token, 1 s of leeway).
    let short = rig.mint(&["chats:read"], Some("red"), 3).await;
    let mut expiring = open(short, "web:red").await;
    assert_eq!(expiring.status(), 200);
    assert!(
        ends_within(&mut expiring, std::time::Duration::from_secs(30)).await,
        "the expired token's stream ended"
    );
    // Two tenants, each at its bound: neither blocks the other, nor the operator.
    let red = rig.mint(&["chats:read"], Some("red"), 600).await;
    let blue = rig.mint(&["chats:read"], Some("blue"), 600).await;
    let _r1 = open(red.clone(), "web:red").await;
    let _r2 = open(red.clone(), "web:red").await;
    let over = open(red.clone(), "web:red").await;
    assert_eq!(over.status(), 429, "red's third stream");
    let b1 = open(blue.clone(), "web:blue").await;
    assert_eq!(b1.status(), 200, "blue is not red");
    let op = open(rig.operator.clone(), "web:blue").await;
    assert_eq!(op.status(), 200, "the operator is not red");
    rig.stop().await;
}

/// The `channel` identity (a chat adapter) reaches only the chats `ROUTD_CHANNEL_CHATS` names,
/// and never a folder's `web:` chats, which belong to that folder's callers (it posted into
/// `web:main`, the trusted group, and read another tenant's history).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_channel_identity_reaches_only_the_chats_it_serves() {
    let rig = Rig::sim(&[], &[("ROUTD_CHANNEL_CHATS", "tg:*")]).await;
    rig.put_group("main", json!({"name": "main"})).await;
    let api = rig.api();
    let post = |chat: &str| {
        api.post(
            &rig.channel,
            "/v1/messages",
            json!({"chat_jid": chat, "sender": "mallory", "content": "let me in"}),
        )
    };
    let (s, v) = post("web:main").await;
    assert_eq!(
        (s, v["error"].as_str()),
        (403, Some("folder_forbidden")),
        "{v}"
    );
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .contains("ROUTD_CHANNEL_CHATS"),
        "{v}"
    );
    let (s, v) = post("wa:123").await;
    assert_eq!(s, 403, "not a chat this adapter serves: {v}");
    let (s, v) = post("tg:123").await;
    assert_eq!(s, 201, "{v}");
    // Reading a web: chat's history or stream: no such chat, for the adapter.
    let (s, _) = rig
        .api()
        .get(&rig.channel, "/v1/chats/web:main/messages")
        .await;
    assert_eq!(s, 404);
    let (s, _) = rig
        .api()
        .get(&rig.channel, "/v1/chats/tg:123/messages")
        .await;
    assert_eq!(s, 200);
    // The operator still reaches them.
    let (s, v) = rig
        .api()
        .post(
            &rig.operator,
            "/v1/messages",
            json!({"chat_jid": "web:main", "sender": "op", "content": "/ping"}),
        )
        .await;
    assert_eq!(s, 201, "{v}");
    rig.stop().await;
}

/// A webhook may not point inside the host or its network (the daemons on loopback, the
/// cloud's metadata address, the LAN) unless the operator opts in.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn webhooks_to_private_addresses_need_the_operators_opt_in() {
    let rig = Rig::sim(&[], &[("ROUTD_WEBHOOK_ALLOW_PRIVATE", "0")]).await;
    let secret = "a-webhook-secret-0123456789";
    for (i, url) in [
        "http://127.0.0.1:8183/v1/messages",
        "http://169.254.169.254/latest/meta-data",
        "http://[::1]:8181/",
        "http://10.1.2.3/hook",
        "http://localhost:9/hook",
        "http://[::ffff:192.168.1.1]/hook",
    ]
    .iter()
    .enumerate()
    {
        let (s, v) = rig
            .api()
            .post(
                &rig.operator,
                "/v1/webhooks",
                json!({"prefix": format!("p{i}:"), "url": url, "secret": secret}),
            )
            .await;
        assert_eq!(
            (s, v["error"].as_str()),
            (400, Some("invalid_request")),
            "{url}: {v}"
        );
        assert!(
            v["message"]
                .as_str()
                .unwrap()
                .contains("ROUTD_WEBHOOK_ALLOW_PRIVATE"),
            "{v}"
        );
    }
    let (s, v) = rig
        .api()
        .post(
            &rig.operator,
            "/v1/webhooks",
            json!({"prefix": "tg:", "url": "https://hooks.example.com/hako", "secret": secret}),
        )
        .await;
    assert_eq!(s, 201, "{v}");
    rig.stop().await;
}

/// A group whose stored grants this build cannot read (a hand edit, a newer hako) fails
/// closed: its turn ends with a notice instead of running with every tool (unreadable grants
/// used to read as `[]`, which means `*`), and its API view is an error, not defaults. An
/// unknown turn state in a query is refused, not read as "no such turns".
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unreadable_group_settings_fail_closed() {
    let rig = Rig::sim(&[], &[]).await;
    let chat = "web:garbled";
    rig.put_group(
        "garbled",
        json!({"name": "garbled", "grants": ["send_message"]}),
    )
    .await;
    rig.route(chat, "garbled").await;
    let db = rusqlite::Connection::open(rig.data().join("routd.db")).unwrap();
    let n = db
        .execute(
            "UPDATE groups SET grants = '{not json' WHERE folder = 'garbled'",
            [],
        )
        .unwrap();
    assert_eq!(n, 1);
    drop(db);
    rig.say(chat, "g-1", r#"/mcp reset_session {}"#).await;
    let h = rig
        .wait_for(chat, "a notice", |h| !notices(h).is_empty())
        .await;
    assert!(
        replies(&h).iter().all(|r| !r.contains("reset_session")),
        "{h:?}"
    );
    assert!(
        notices(&h)[0].contains("could not be started")
            && notices(&h)[0].contains("settings do not read"),
        "{:?}",
        notices(&h)
    );
    assert_eq!(h[0].state, hako_shared::chat::MessageState::Failed, "{h:?}");
    let (s, v) = rig.api().get(&rig.operator, "/v1/groups/garbled").await;
    assert_eq!(s, 500, "{v}");
    let (s, v) = rig.api().get(&rig.operator, "/v1/turns?state=bogus").await;
    assert_eq!(
        (s, v["error"].as_str()),
        (400, Some("invalid_query")),
        "{v}"
    );
    let (s, v) = rig.api().get(&rig.operator, "/v1/turns?state=failed").await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["turns"][0]["state"], "failed", "{v}");
    rig.stop().await;
}
