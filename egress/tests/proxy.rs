//! The proxy in-process against a real authd (in-process), with targets on loopback: what
//! passes, what is refused and why, what is counted, and what the log says. The containers,
//! networks and runed's wiring are tested in `runed/tests/egress.rs`.

mod common;

use std::time::{Duration, Instant};

use common::*;
use hako_shared::auth::wire::MintRequest;
use hako_shared::auth::{Signer, now_secs};
use hako_shared::testing::eventually;
use tokio::net::TcpListener;

#[tokio::test]
async fn allowed_targets_answer_over_http_and_through_connect() {
    let rig = Rig::new().await;
    let web = http_target("web").await;
    let tls = echo_target().await;
    let proxy = rig.proxy(|_| {}).await;
    let p = proxy.proxy_addr();
    let (token, _) = rig
        .spawn_token("run-ok", &[web.to_string(), tls.to_string()], 300)
        .await;

    // Plain HTTP, basic credentials as curl sends them from http://hako:<token>@proxy.
    let (st, text) = get(p, &format!("http://{web}/a/b?c=d"), &basic(&token)).await;
    assert_eq!(st, 200, "{text}");
    assert!(
        text.contains("target web got:\nGET /a/b?c=d HTTP/1.1"),
        "origin-form: {text}"
    );
    assert!(
        !text.to_ascii_lowercase().contains("proxy-authorization") && !text.contains(&token),
        "the token never reaches the target: {text}"
    );
    // The Host the target sees is the allowed authority, not one the client made up.
    let (st, text) = send(
        p,
        &format!(
            "GET http://{web}/fronted HTTP/1.1\r\nHost: evil.test\r\n{}Connection: close\r\n\r\n",
            basic(&token)
        ),
    )
    .await;
    assert_eq!(st, 200, "{text}");
    assert!(text.contains(&format!("host: {web}")), "{text}");
    assert!(!text.contains("evil.test"), "{text}");
    // CONNECT with a bearer token: a tunnel that carries bytes both ways, untouched.
    let mut t = connect(p, &tls.to_string(), &bearer(&token)).await.unwrap();
    assert!(echo_round(&mut t, b"\x16\x03\x01 client hello bytes").await);
    assert!(echo_round(&mut t, &[0u8; 100_000]).await);
    drop(t);
    assert_eq!(metric(&proxy, "egress_allowed_total{kind=\"http\"}"), 2);
    assert_eq!(metric(&proxy, "egress_allowed_total{kind=\"connect\"}"), 1);
    // The admin listener: health, readiness, the metrics.
    let a = proxy.admin_addr();
    assert_eq!(admin_get(a, "/health").await.0, 200);
    let (st, m) = admin_get(a, "/metrics").await;
    assert_eq!(st, 200);
    assert!(
        m.contains("egress_denied_total{reason=\"host_not_allowed\"} 0"),
        "{m}"
    );
}

#[tokio::test]
async fn every_refusal_is_counted_under_its_reason_and_names_the_host() {
    let rig = Rig::new().await;
    let web = http_target("web").await;
    let tls = echo_target().await;
    let proxy = rig.proxy(|c| c.max_per_token = 2).await;
    let p = proxy.proxy_addr();
    let port = web.port();
    let (token, _) = rig
        .spawn_token(
            "run-deny",
            &[
                web.to_string(),
                tls.to_string(),
                format!("localhost:{port}"),
                "*.example.test".into(),
            ],
            300,
        )
        .await;
    let forged = {
        let mut c = hako_shared::auth::Claims {
            iss: hako_shared::auth::DEFAULT_ISSUER.into(),
            sub: "runed".into(),
            typ: hako_shared::auth::TokenType::Spawn,
            scope: vec!["egress:connect".into()],
            folder: Some("acme/support".into()),
            jti: "forged-jti-000000000000".into(),
            iat: now_secs(),
            nbf: now_secs(),
            exp: now_secs() + 300,
            run_id: Some("run-deny".into()),
            turn_id: Some("t".into()),
            parent_jti: None,
            egress: vec![web.to_string()],
            secrets: vec![],
        };
        c.egress.push("evil.test".into());
        Signer::generate().unwrap().sign(&c).unwrap()
    };
    let user = rig
        .client
        .mint(
            &rig.routd_token,
            &MintRequest {
                scope: vec!["runs:read".into()],
                folder: Some("acme".into()),
                ttl_seconds: Some(300),
                ..Default::default()
            },
        )
        .await
        .unwrap()
        .token;
    let url = format!("http://{web}/");
    let cases: Vec<(String, String, u16, &str)> = vec![
        (url.clone(), String::new(), 407, "no_token"),
        (url.clone(), bearer("not-a-token"), 407, "bad_token"),
        (
            url.clone(),
            "Proxy-Authorization: Digest x\r\n".into(),
            407,
            "bad_token",
        ),
        (url.clone(), bearer(&forged), 407, "bad_token"),
        (url.clone(), bearer(&user), 403, "token_not_for_egress"),
        (
            "http://evil.test/".into(),
            bearer(&token),
            403,
            "host_not_allowed",
        ),
        (
            format!("http://{}:{}/", web.ip(), port + 1),
            bearer(&token),
            403,
            "host_not_allowed",
        ),
        (
            "http://169.254.169.254/latest/meta-data/".into(),
            bearer(&token),
            403,
            "host_not_allowed",
        ),
        (
            "http://example.test/".into(),
            bearer(&token),
            403,
            "host_not_allowed",
        ),
        // Named in the list, but the name leads to loopback: DNS rebinding onto the host.
        (
            format!("http://localhost:{port}/"),
            bearer(&token),
            403,
            "private_address",
        ),
    ];
    for (url, auth, status, reason) in &cases {
        let (st, text) = get(p, url, auth).await;
        assert_eq!(st, *status, "{url} {reason}: {text}");
        assert!(
            text.contains(&format!("x-hako-egress-denied: {reason}")),
            "{reason}: {text}"
        );
        let host = url.trim_start_matches("http://").trim_end_matches('/');
        let host = host.split('/').next().unwrap();
        let shown = if host.contains(':') {
            host.to_owned()
        } else {
            format!("{host}:80")
        };
        assert!(
            text.contains(&format!("{shown} denied ({reason})")),
            "{text}"
        );
        if *status == 407 {
            assert!(
                text.to_ascii_lowercase()
                    .contains("proxy-authenticate: basic"),
                "{text}"
            );
        }
    }
    // Not a proxy request at all.
    let (st, text) = send(
        p,
        "GET /etc/passwd HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(st, 400, "{text}");
    // The same refusals through CONNECT.
    for (target, reason) in [
        ("evil.test:443", "host_not_allowed"),
        (&*format!("localhost:{port}"), "private_address"),
        ("169.254.169.254:80", "host_not_allowed"),
    ] {
        let (st, text) = connect(p, target, &bearer(&token)).await.unwrap_err();
        assert_eq!(st, 403, "{text}");
        assert!(text.contains(reason), "{text}");
    }
    // At most two connections per token; a third is refused until one ends.
    let a = connect(p, &tls.to_string(), &bearer(&token)).await.unwrap();
    let mut b = connect(p, &tls.to_string(), &bearer(&token)).await.unwrap();
    let (st, text) = connect(p, &tls.to_string(), &bearer(&token))
        .await
        .unwrap_err();
    assert_eq!(
        (st, text.contains("too_many_connections")),
        (429, true),
        "{text}"
    );
    drop(a);
    let (target, auth) = (tls.to_string(), bearer(&token));
    let mut c = eventually("a connection in the freed place", LIMIT, || {
        connect(p, &target, &auth)
    })
    .await;
    assert!(echo_round(&mut b, b"b").await && echo_round(&mut c, b"c").await);

    for (reason, n) in [
        ("no_token", 1),
        ("bad_token", 3),
        ("token_not_for_egress", 1),
        ("host_not_allowed", 6),
        ("private_address", 2),
        ("bad_request", 1),
    ] {
        let got = metric(
            &proxy,
            &format!("egress_denied_total{{reason=\"{reason}\"}}"),
        );
        assert_eq!(got, n, "{reason}");
    }
    assert!(
        metric(
            &proxy,
            "egress_denied_total{reason=\"too_many_connections\"}"
        ) >= 1
    );
    assert_eq!(metric(&proxy, "egress_allowed_total{kind=\"http\"}"), 0);
}

#[tokio::test]
async fn expired_and_revoked_tokens_are_refused_and_their_live_tunnels_cut() {
    let rig = Rig::new().await;
    let tls = echo_target().await;
    let proxy = rig.proxy(|_| {}).await;
    let p = proxy.proxy_addr();
    let allow = [tls.to_string()];

    // Expiry: a token of 2 s (the verifier's leeway is 1 s) loses its tunnel and then is refused.
    let (short, _) = rig.spawn_token("run-short", &allow, 2).await;
    let mut t = connect(p, &tls.to_string(), &bearer(&short)).await.unwrap();
    assert!(echo_round(&mut t, b"before").await);
    assert!(
        closed_within(&mut t, Duration::from_secs(8)).await,
        "the tunnel outlived its token"
    );
    let (st, text) = connect(p, &tls.to_string(), &bearer(&short))
        .await
        .unwrap_err();
    assert_eq!((st, text.contains("expired")), (407, true), "{text}");

    // Revocation mid-run: the run's end revokes its token at authd; within a poll the proxy
    // cuts its tunnels and refuses it.
    let (tok, jti) = rig.spawn_token("run-revoked", &allow, 300).await;
    let mut t = connect(p, &tls.to_string(), &bearer(&tok)).await.unwrap();
    assert!(echo_round(&mut t, b"live").await);
    let revoked_at = Instant::now();
    rig.client.revoke(&rig.runed_token, &jti).await.unwrap();
    assert!(
        closed_within(&mut t, Duration::from_secs(5)).await,
        "tunnel of a revoked token"
    );
    let (st, text) = connect(p, &tls.to_string(), &bearer(&tok))
        .await
        .unwrap_err();
    assert_eq!((st, text.contains("revoked")), (407, true), "{text}");
    eprintln!("revocation cut the tunnel after {:?}", revoked_at.elapsed());
    assert_eq!(metric(&proxy, "egress_closed_total{reason=\"revoked\"}"), 1);
    assert_eq!(metric(&proxy, "egress_closed_total{reason=\"expired\"}"), 1);
    assert_eq!(proxy.open_connections(), 0);
}

#[tokio::test]
async fn authd_out_of_reach_fails_closed() {
    let mut rig = Rig::new().await;
    let tls = echo_target().await;
    let (tok, _) = rig.spawn_token("run-authd", &[tls.to_string()], 300).await;

    // A proxy that has never reached authd: not ready, and nothing passes.
    let dead = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let dead_url = format!("http://{}", dead.local_addr().unwrap());
    drop(dead);
    let pl = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let al = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let blind = hako_egress::start(config_for(&dead_url), pl, al)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (st, text) = admin_get(blind.admin_addr(), "/ready").await;
    assert_eq!(st, 503, "{text}");
    let (st, text) = connect(blind.proxy_addr(), &tls.to_string(), &bearer(&tok))
        .await
        .unwrap_err();
    assert_eq!(
        (st, text.contains("verifier_unavailable")),
        (503, true),
        "{text}"
    );

    // A proxy that knew authd's keys, once authd is gone past the revocation list's age:
    // its live tunnels are cut and new requests refused (a revocation could be missed).
    let proxy = rig.proxy(|_| {}).await;
    let p = proxy.proxy_addr();
    let mut t = connect(p, &tls.to_string(), &bearer(&tok)).await.unwrap();
    assert!(echo_round(&mut t, b"up").await);
    rig.authd.take().unwrap().shutdown().await.unwrap();
    assert!(closed_within(&mut t, Duration::from_secs(8)).await);
    let (st, text) = connect(p, &tls.to_string(), &bearer(&tok))
        .await
        .unwrap_err();
    assert_eq!(
        (st, text.contains("verifier_unavailable")),
        (503, true),
        "{text}"
    );
    assert_eq!(admin_get(proxy.admin_addr(), "/ready").await.0, 503);
}

#[tokio::test]
async fn idle_tunnels_are_closed() {
    let rig = Rig::new().await;
    let tls = echo_target().await;
    let proxy = rig
        .proxy(|c| c.idle_timeout = Duration::from_millis(400))
        .await;
    let (tok, _) = rig.spawn_token("run-idle", &[tls.to_string()], 300).await;
    let mut t = connect(proxy.proxy_addr(), &tls.to_string(), &bearer(&tok))
        .await
        .unwrap();
    // Traffic keeps it open past the idle limit...
    for _ in 0..6 {
        assert!(echo_round(&mut t, b"tick").await);
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    // ...silence closes it.
    assert!(closed_within(&mut t, Duration::from_secs(5)).await);
    assert_eq!(metric(&proxy, "egress_closed_total{reason=\"idle\"}"), 1);
}

#[tokio::test(flavor = "current_thread")]
async fn the_deny_log_names_folder_run_and_host_never_the_token() {
    let log = Captured::default();
    let sink = log.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || sink.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::DEBUG)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let rig = Rig::new().await;
    let proxy = rig.proxy(|_| {}).await;
    let (tok, _) = rig
        .spawn_token("run-logged", &["api.example.test".into()], 300)
        .await;
    let (st, _) = get(
        proxy.proxy_addr(),
        "http://evil.example.test/x",
        &basic(&tok),
    )
    .await;
    assert_eq!(st, 403);
    let (st, _) = get(
        proxy.proxy_addr(),
        "http://evil.example.test/x",
        &bearer("garbage.token.here"),
    )
    .await;
    assert_eq!(st, 407);
    let text = String::from_utf8(log.0.lock().unwrap().clone()).unwrap();
    let line = text
        .lines()
        .find(|l| l.contains("egress denied") && l.contains("host_not_allowed"))
        .unwrap_or_else(|| panic!("no deny line in\n{text}"));
    for part in [
        "folder=\"acme/support\"",
        "run=\"run-logged\"",
        "host=evil.example.test:80",
        "reason=\"host_not_allowed\"",
    ] {
        assert!(line.contains(part), "{part} in {line}");
    }
    assert!(text.contains("reason=\"bad_token\""), "{text}");
    for secret in [tok.as_str(), "garbage.token.here"] {
        assert!(!text.contains(secret), "the log holds a token:\n{text}");
    }
    // Nor a piece of one: the signature segment alone.
    let sig = tok.rsplit('.').next().unwrap();
    assert!(!text.contains(sig));
}
