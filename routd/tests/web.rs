//! The web page in a real headless Chromium against a real authd, runed and routd, with the
//! agent in its container: sign-in by link, a chat answered without a reload, history after
//! one, a stream that resumes across a SIGKILLed routd, agent text that stays inert, a
//! tenant's narrow view, CSRF, sign-out and revocation.

mod common;

use std::time::Duration;

use common::browser::{Browser, link, sign_in};
use common::{Rig, eventually};
use hako_client::authd::AuthdClient;
use hako_client::routd;
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(90);

/// The messages the page shows: (data-id, data-seq, text) in page order.
async fn shown(b: &Browser) -> Vec<(String, i64, String)> {
    let v = b
        .js(
            "return [...document.querySelectorAll('#messages > li')].map(li => \
             [li.dataset.id, Number(li.dataset.seq), li.querySelector('.text').textContent]);",
            json!([]),
        )
        .await;
    serde_json::from_value(v).unwrap()
}

/// Waits until the page shows a reply (an outbound message) containing `needle`.
async fn wait_reply(b: &Browser, needle: &str) {
    b.wait(
        &format!("a reply with {needle:?} on the page"),
        &format!(
            "return [...document.querySelectorAll('#messages > li.out .text')]\
             .some(e => e.textContent.includes({}))",
            serde_json::to_string(needle).unwrap()
        ),
        WAIT,
    )
    .await;
}

/// What the page shows equals the chat's log, each message once, in order.
async fn page_matches_log(rig: &Rig, b: &Browser, chat: &str) {
    let log = rig.history(chat).await;
    let want: Vec<(String, i64)> = log.iter().map(|m| (m.id.to_string(), m.seq)).collect();
    eventually(
        &format!("the page showing the log's messages {want:?}"),
        WAIT,
        || async {
            let got: Vec<(String, i64)> =
                shown(b).await.into_iter().map(|(i, s, _)| (i, s)).collect();
            if got == want { Ok(()) } else { Err(got) }
        },
    )
    .await;
}

fn screenshot_path(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../target/web-screenshots")
        .join(name)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_signs_in_answers_without_reload_and_resumes_across_a_killed_routd() {
    let mut rig = Rig::sim(&[], &[]).await;
    rig.spawn_routd_binary().await;
    // `send_message` asks a person first.
    rig.put_group(
        "webco",
        json!({"name": "Web Co", "grants": ["*", "?send_message"]}),
    )
    .await;
    let chat = "web:webco";
    let b = Browser::start().await;

    // Without a session a page sends the browser to sign in.
    b.goto(&format!("{}/web/", rig.base())).await;
    b.wait(
        "the sign-in page",
        "return location.pathname === '/web/signin' && document.getElementById('signin-status').textContent.includes('Not signed in')",
        WAIT,
    )
    .await;

    sign_in(&rig, &b, None).await;
    b.wait(
        "the one group, opened",
        "return document.getElementById('chat-title').textContent === 'web:webco'",
        WAIT,
    )
    .await;

    // A message typed and sent; the agent's answer appears without a reload.
    b.type_into("#text", "hello from the browser").await;
    b.click("#send").await;
    wait_reply(&b, "hello from the browser").await;
    page_matches_log(&rig, &b, chat).await;

    // Agent text that would be markup elsewhere stays text.
    // (one line: Enter in the box sends)
    let hostile = "<script>window.__pwned = 'script'</script> \
                   <img src=x onerror=\"window.__pwned = 'img'\"> \
                   <a href=\"javascript:window.__pwned = 'link'\">click me</a>";
    b.type_into("#text", hostile).await;
    b.click("#send").await;
    wait_reply(&b, "onerror").await;
    let inert = b
        .js(
            "const m = document.getElementById('messages'); \
             return {pwned: window.__pwned === undefined ? null : String(window.__pwned), \
             markup: m.querySelectorAll('script, img, a, iframe').length, \
             text: [...m.querySelectorAll('li.out .text')].map(e => e.textContent).join('\\n')};",
            json!([]),
        )
        .await;
    assert_eq!(inert["pwned"], Value::Null, "a script ran: {inert}");
    assert_eq!(inert["markup"], 0, "agent text became markup: {inert}");
    assert!(
        inert["text"]
            .as_str()
            .unwrap()
            .contains("<script>window.__pwned"),
        "the text is shown as written: {inert}"
    );
    // Clicking where the link would be does nothing either.
    b.js(
        "[...document.querySelectorAll('#messages .text')].forEach(e => e.click()); return 1;",
        json!([]),
    )
    .await;
    assert_eq!(
        b.js("return window.__pwned === undefined", json!([])).await,
        true
    );

    // A held tool call shows as a request with buttons; Approve lets it run.
    b.type_into("#text", r#"/mcp send_message {"text":"launch at noon"}"#)
        .await;
    b.click("#send").await;
    b.wait(
        "the approval request's buttons",
        "return document.querySelector('#approvals .approval button.approve')",
        WAIT,
    )
    .await;
    b.click("#approvals .approval button.approve").await;
    b.wait(
        "the verdict on the card",
        "const n = document.querySelector('#approvals .approval .hint'); \
         return n && n.textContent.startsWith('approved');",
        WAIT,
    )
    .await;
    b.wait(
        "the approved tool's message in the chat",
        "return [...document.querySelectorAll('#messages > li.out.message .text')]\
         .some(e => e.textContent === 'launch at noon')",
        WAIT,
    )
    .await;

    // A reload shows the history, each message once.
    b.reload().await;
    b.wait(
        "the history after a reload",
        "return document.querySelectorAll('#messages > li.out').length >= 2",
        WAIT,
    )
    .await;
    page_matches_log(&rig, &b, chat).await;
    b.wait(
        "the stream, live again",
        "return document.getElementById('stream-state').textContent === 'live'",
        WAIT,
    )
    .await;

    // routd is SIGKILLed; a message arrives after it is back and before the page reconnects:
    // the page shows it and the answer, nothing missing, nothing twice.
    let (mut child, _) = rig.child.take().unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    b.wait(
        "the page to notice",
        "return document.getElementById('stream-state').textContent !== 'live'",
        WAIT,
    )
    .await;
    rig.spawn_routd_binary().await;
    rig.say(chat, "m-after-kill", "said while the page was away")
        .await;
    wait_reply(&b, "said while the page was away").await;
    page_matches_log(&rig, &b, chat).await;
    b.screenshot(&screenshot_path("chat.png")).await;

    // The watch page: every daemon ready; a turn that takes its time shows as a live run of
    // the folder, its message as waiting for an answer.
    rig.say(chat, "m-slow", "/sleep 20").await;
    b.goto(&format!("{}/web/watch", rig.base())).await;
    b.wait(
        "three ready daemons",
        "const rows = [...document.querySelectorAll('#daemons tbody tr')]; \
         return rows.length === 3 && rows.every(r => r.cells[1].textContent === 'ready');",
        WAIT,
    )
    .await;
    b.wait(
        "the folder's live run and its waiting message",
        "const run = [...document.querySelectorAll('#runs tbody tr')] \
           .some(r => r.cells[1].textContent === 'webco' && r.cells[2].textContent === 'running'); \
         const wait = [...document.querySelectorAll('#backlog tbody tr')] \
           .some(r => r.cells[0].textContent === 'webco' && r.cells[1].textContent === '1'); \
         return run && wait;",
        WAIT,
    )
    .await;
    b.screenshot(&screenshot_path("watch.png")).await;
    drop(b);
    rig.stop().await;
}

/// A raw browser-like client: cookies by hand, so the test sees each header.
fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

/// Exchanges a link's token for a session: (status, cookie value, body).
async fn exchange(rig: &Rig, token: &str) -> (u16, Option<String>, Value) {
    let r = http()
        .post(format!("{}/web/session", rig.base()))
        .header("origin", rig.base())
        .json(&json!({"token": token}))
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let cookie = r
        .headers()
        .get("set-cookie")
        .map(|v| v.to_str().unwrap().to_owned());
    if let Some(c) = &cookie {
        for attr in ["HttpOnly", "SameSite=Strict", "Path=/"] {
            assert!(c.contains(attr), "{attr} missing: {c}");
        }
    }
    let value = cookie.map(|c| {
        c.split(';')
            .next()
            .unwrap()
            .trim_start_matches("hako_session=")
            .to_owned()
    });
    (status, value, r.json().await.unwrap_or(Value::Null))
}

async fn with_cookie(
    rig: &Rig,
    method: reqwest::Method,
    path: &str,
    cookie: &str,
    csrf: Option<&str>,
    body: Option<Value>,
) -> (u16, Value) {
    let mut req = http()
        .request(method, format!("{}{path}", rig.base()))
        .header("cookie", format!("hako_session={cookie}"));
    if let Some(c) = csrf {
        req = req.header("x-hako-csrf", c);
    }
    if let Some(b) = body {
        req = req.json(&b);
    }
    let r = req.send().await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_link_sees_its_folder_only_and_sessions_end_as_they_should() {
    let rig = Rig::sim(&[], &[]).await;
    rig.put_group("acme", json!({"name": "Acme"})).await;
    rig.put_group("other", json!({"name": "Other"})).await;
    rig.say("web:other", "m-other-1", "other's secret").await;

    // The tenant's page lists its folder only, and cannot read another's chat.
    let b = Browser::start().await;
    sign_in(&rig, &b, Some("acme")).await;
    let groups = b
        .wait(
            "the group list",
            "const g = [...document.querySelectorAll('button.group')].map(b => b.dataset.folder); \
             return g.length ? g : null;",
            WAIT,
        )
        .await;
    assert_eq!(groups, json!(["acme"]));
    let probe = "const done = arguments[arguments.length - 1]; \
                 fetch(arguments[0], {method: arguments[1], headers: arguments[2], \
                 body: arguments[3]}).then(r => done(r.status)).catch(e => done(String(e)));";
    let other = b
        .js_async(
            probe,
            json!([routd::chat_messages("web:other").path, "GET", {}, null]),
        )
        .await;
    assert_eq!(other, 404, "a tenant's session read another folder's chat");
    // A change without the CSRF token is refused; with it, it goes through.
    let post = |csrf: Value| {
        json!([
            "/v1/messages",
            "POST",
            {"content-type": "application/json", "x-hako-csrf": csrf},
            json!({"chat_jid": "web:acme", "sender": "t", "content": "/ping"}).to_string()
        ])
    };
    assert_eq!(b.js_async(probe, post(json!("wrong"))).await, 403);
    let csrf = b
        .js_async(
            "const done = arguments[0]; fetch('/web/session').then(r => r.json()).then(s => done(s.csrf));",
            json!([]),
        )
        .await;
    assert_eq!(b.js_async(probe, post(csrf)).await, 201);

    // Sign-out ends the session: the page goes to sign-in and stays there.
    b.click("#signout").await;
    b.wait(
        "the sign-in page after sign-out",
        "return location.pathname === '/web/signin'",
        WAIT,
    )
    .await;
    b.goto(&format!("{}/web/", rig.base())).await;
    b.wait(
        "a redirect to sign-in",
        "return location.pathname === '/web/signin'",
        WAIT,
    )
    .await;
    drop(b);

    // A link signs in once.
    let (token, jti) = link(&rig, Some("acme"), 600).await;
    let (s, cookie, view) = exchange(&rig, &token).await;
    assert_eq!(s, 201, "{view}");
    assert_eq!(view["folder"], "acme");
    let cookie = cookie.expect("a session cookie");
    let csrf = view["csrf"].as_str().unwrap().to_owned();
    let (s, _, v) = exchange(&rig, &token).await;
    assert_eq!((s, v["error"].as_str()), (409, Some("link_used")), "{v}");
    // The session reads what its link could; the cookie's answers are never cached.
    let (s, v) = with_cookie(
        &rig,
        reqwest::Method::GET,
        "/v1/groups",
        &cookie,
        None,
        None,
    )
    .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["groups"].as_array().unwrap().len(), 1, "{v}");
    // Revoking the link's token ends the session (routd polls revocations every second).
    AuthdClient::new(&rig.authd_url())
        .unwrap()
        .revoke(&rig.operator, &jti)
        .await
        .unwrap();
    let v = eventually("the revoked link's session ending", WAIT, || async {
        let (s, v) = with_cookie(
            &rig,
            reqwest::Method::GET,
            "/web/session",
            &cookie,
            None,
            None,
        )
        .await;
        if s == 401 { Ok(v) } else { Err((s, v)) }
    })
    .await;
    assert_eq!(v["error"], "session_ended", "{v}");
    let (s, v) = with_cookie(
        &rig,
        reqwest::Method::POST,
        "/v1/messages",
        &cookie,
        Some(&csrf),
        Some(json!({"chat_jid": "web:acme", "sender": "t", "content": "x"})),
    )
    .await;
    assert_eq!(
        (s, v["error"].as_str()),
        (401, Some("session_ended")),
        "{v}"
    );

    // The operator ends a session through routd (the link's token long gone or not): its open
    // chat stream ends, and its cookie opens nothing more. The session cannot do this itself.
    let (token, jti) = link(&rig, Some("acme"), 600).await;
    let (s, cookie, _) = exchange(&rig, &token).await;
    assert_eq!(s, 201);
    let cookie = cookie.unwrap();
    let (s, v) = with_cookie(
        &rig,
        reqwest::Method::GET,
        "/v1/web-sessions",
        &cookie,
        None,
        None,
    )
    .await;
    assert_eq!(
        (s, v["error"].as_str()),
        (403, Some("insufficient_scope")),
        "{v}"
    );
    let mut stream = http()
        .get(format!(
            "{}{}",
            rig.base(),
            routd::chat_events("web:acme").query("after", 0).path
        ))
        .header("cookie", format!("hako_session={cookie}"))
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status(), 200);
    let (s, v) = rig.api().get(&rig.operator, "/v1/web-sessions").await;
    assert_eq!(s, 200, "{v}");
    assert!(
        v["sessions"]
            .as_array()
            .unwrap()
            .iter()
            .any(|x| x["link_jti"] == jti.as_str()),
        "{v}"
    );
    let (s, v) = rig.send(&rig.operator, routd::end_web_session(&jti)).await;
    assert_eq!((s, v["folder"].as_str()), (200, Some("acme")), "{v}");
    let ended = tokio::time::timeout(WAIT, async {
        while let Ok(Some(_)) = stream.chunk().await {}
    })
    .await;
    assert!(ended.is_ok(), "the ended session's stream stays open");
    let (s, v) = with_cookie(
        &rig,
        reqwest::Method::GET,
        "/web/session",
        &cookie,
        None,
        None,
    )
    .await;
    assert_eq!(
        (s, v["error"].as_str()),
        (401, Some("session_ended")),
        "{v}"
    );
    let (s, _) = rig.send(&rig.operator, routd::end_web_session(&jti)).await;
    assert_eq!(s, 404);

    // A long-lived API token is not a link; a forged one is nothing; a page from elsewhere
    // cannot sign in.
    let (long, _) = link(&rig, None, 1800).await;
    let (s, _, v) = exchange(&rig, &long).await;
    assert_eq!((s, v["error"].as_str()), (401, Some("invalid_link")), "{v}");
    let (s, _, v) = exchange(&rig, "eyJhbGciOiJFZERTQSJ9.e30.AAAA").await;
    assert_eq!((s, v["error"].as_str()), (401, Some("invalid_link")), "{v}");
    let (fresh, _) = link(&rig, None, 600).await;
    let r = http()
        .post(format!("{}/web/session", rig.base()))
        .header("origin", "http://evil.example")
        .json(&json!({"token": fresh}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    // The pages carry a strict policy and are never cached.
    let r = http()
        .get(format!("{}/web/signin", rig.base()))
        .send()
        .await
        .unwrap();
    let csp = r.headers()["content-security-policy"].to_str().unwrap();
    assert!(
        csp.contains("script-src 'self'") && !csp.contains("unsafe-inline"),
        "{csp}"
    );
    assert_eq!(r.headers()["cache-control"], "no-store");
    let r = http()
        .get(format!("{}/web/", rig.base()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 303);
    assert_eq!(r.headers()["location"], "/web/signin");
    rig.stop().await;
}

/// Posts a sign-in from a browser holding `cookie` (its live session), `replace` as the
/// page sends it once the person chose: (status, new cookie value, body).
async fn sign_in_over(
    rig: &Rig,
    cookie: &str,
    token: &str,
    replace: bool,
) -> (u16, Option<String>, Value) {
    let r = http()
        .post(format!("{}/web/session", rig.base()))
        .header("origin", rig.base())
        .header("cookie", format!("hako_session={cookie}"))
        .json(&json!({"token": token, "replace": replace}))
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let value = r.headers().get("set-cookie").map(|c| {
        c.to_str()
            .unwrap()
            .split(';')
            .next()
            .unwrap()
            .trim_start_matches("hako_session=")
            .to_owned()
    });
    (status, value, r.json().await.unwrap_or(Value::Null))
}

/// A session ends for good with the token its link was minted from: a tenant's 3 s link
/// from an 8 s token, the token revoked at authd, stays ended after both expired and authd's
/// revocation list forgot them (it was refused for a few seconds, then worked again and
/// posted). And a link never swaps a browser's live session by itself: it answers 409
/// `already_signed_in` naming both, and only the person's choice (`replace`) signs in anew
/// (a tenant's link opened by the operator turned the operator's browser into the tenant's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_dies_with_its_parent_token_and_a_link_never_swaps_one_silently() {
    let rig = Rig::sim(&[], &[]).await;
    rig.put_group("acme", json!({"name": "Acme"})).await;
    let authd = AuthdClient::new(&rig.authd_url()).unwrap();
    let scopes = ["chats:read", "messages:write", "groups:read"];
    let parent = rig.mint_full(&scopes, Some("acme"), 8).await;
    let short = authd
        .mint(
            &parent.token,
            &hako_shared::auth::wire::MintRequest {
                scope: scopes.iter().map(|s| (*s).to_owned()).collect(),
                ttl_seconds: Some(3),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let (s, cookie, v) = exchange(&rig, &short.token).await;
    assert_eq!(s, 201, "{v}");
    let (cookie, csrf) = (cookie.unwrap(), v["csrf"].as_str().unwrap().to_owned());
    authd.revoke(&rig.operator, &parent.jti).await.unwrap();
    eventually("the session ending with its parent token", WAIT, || async {
        let (s, v) = with_cookie(
            &rig,
            reqwest::Method::GET,
            "/web/session",
            &cookie,
            None,
            None,
        )
        .await;
        if s == 401 { Ok(v) } else { Err((s, v)) }
    })
    .await;
    // Past both tokens' expiry and the verifiers' leeway (1 s): authd lists neither now.
    let forgotten = std::time::UNIX_EPOCH + Duration::from_secs(parent.expires_at as u64 + 3);
    if let Ok(left) = forgotten.duration_since(std::time::SystemTime::now()) {
        tokio::time::sleep(left).await;
    }
    let (s, v) = with_cookie(
        &rig,
        reqwest::Method::GET,
        "/web/session",
        &cookie,
        None,
        None,
    )
    .await;
    assert_eq!(
        (s, v["error"].as_str()),
        (401, Some("session_ended")),
        "{v}"
    );
    let (s, v) = with_cookie(
        &rig,
        reqwest::Method::POST,
        "/v1/messages",
        &cookie,
        Some(&csrf),
        Some(json!({"chat_jid": "web:acme", "sender": "t", "content": "after"})),
    )
    .await;
    assert_eq!(s, 401, "{v}");

    // The operator's browser, then a tenant's link opened in it.
    let (s, op_cookie, v) = exchange(&rig, &link(&rig, None, 600).await.0).await;
    assert_eq!(s, 201, "{v}");
    let op_cookie = op_cookie.unwrap();
    let tenant_link = link(&rig, Some("acme"), 600).await.0;
    let (s, none, v) = sign_in_over(&rig, &op_cookie, &tenant_link, false).await;
    assert_eq!(
        (s, v["error"].as_str()),
        (409, Some("already_signed_in")),
        "{v}"
    );
    assert!(none.is_none(), "no cookie set");
    let msg = v["message"].as_str().unwrap();
    assert!(
        msg.contains("operator") && msg.contains("operator@acme"),
        "{msg}"
    );
    let (s, v) = with_cookie(
        &rig,
        reqwest::Method::GET,
        "/web/session",
        &op_cookie,
        None,
        None,
    )
    .await;
    assert_eq!(
        (s, &v["folder"]),
        (200, &Value::Null),
        "still the operator's: {v}"
    );
    // The person chose the link: the tenant's session, the operator's ended.
    let (s, tenant_cookie, v) = sign_in_over(&rig, &op_cookie, &tenant_link, true).await;
    assert_eq!(s, 201, "{v}");
    assert_eq!(v["folder"], "acme", "{v}");
    let (s, _) = with_cookie(
        &rig,
        reqwest::Method::GET,
        "/web/session",
        &op_cookie,
        None,
        None,
    )
    .await;
    assert_eq!(s, 401, "the replaced session ended");
    let (s, _) = with_cookie(
        &rig,
        reqwest::Method::GET,
        "/web/session",
        &tenant_cookie.unwrap(),
        None,
        None,
    )
    .await;
    assert_eq!(s, 200);
    rig.stop().await;
}
