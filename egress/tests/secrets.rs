//! Brokered secrets, in-process: a real authd, the proxy with a store and a CA in temporary
//! directories, HTTPS targets of our own on loopback (certificates from a test CA the proxy is
//! told to trust), and a box-side client that trusts only what the proxy's
//! `/v1/ca-bundle.pem` hands out. Each test asserts what the target received (from outside the
//! box), what the box got back, what was counted and what the log says. The containers are
//! `runed/tests/secrets.rs`.

mod common;

use std::sync::Arc;

use base64::Engine as _;
use common::brokered::*;
use common::*;
use hako_shared::testing::eventually;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::ServerName;

const GH_VALUE: &str = "ghp_the-real-value-0123456789";
const NPM_VALUE: &str = "npm_another-real-value-987654";

fn header_of(seen: &Seen, i: usize, name: &str) -> String {
    let s = seen.lock().unwrap();
    s[i].2
        .get(name)
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default()
}

fn b64(s: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(s)
}

#[tokio::test(flavor = "current_thread")]
async fn a_bound_placeholder_reaches_its_host_as_the_value_and_nowhere_else() {
    let log = Captured::default();
    let sink = log.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || sink.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::DEBUG)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let rig = Rig::new().await;
    let ca = TestCa::new();
    let (a, seen_a) = tls_target(&ca).await;
    let (b, seen_b) = tls_target(&ca).await;
    let web = http_target("web").await;
    let (proxy, _dirs) = broker_proxy(
        &rig,
        &[("GH_TOKEN", GH_VALUE), ("NPM_TOKEN", NPM_VALUE)],
        Some(&ca),
    )
    .await;
    let p = proxy.proxy_addr();
    let (ha, hb) = (
        format!("localhost:{}", a.port()),
        format!("localhost:{}", b.port()),
    );
    let egress = vec![ha.clone(), hb.clone(), web.to_string()];
    let gh = claim("GH_TOKEN", std::slice::from_ref(&ha));
    let npm = claim("NPM_TOKEN", std::slice::from_ref(&hb));
    let (token, _) = rig
        .spawn_token_with("run-a", &egress, &[gh.clone(), npm.clone()], 300)
        .await;
    let roots = box_roots(&proxy).await;
    let (gh_ph, npm_ph) = (gh.placeholder.as_str(), npm.placeholder.as_str());

    // A header, toward the bound host: the host gets the value, the box never sees it.
    let mut to_a = box_tls(p, &token, &ha, "localhost", &roots, &[b"h2", b"http/1.1"])
        .await
        .unwrap();
    let (st, headers, body) = call(
        &mut to_a,
        "/api/user",
        &[("authorization", format!("Bearer {gh_ph}"))],
    )
    .await
    .unwrap();
    assert_eq!((st, body.as_str()), (200, "ok /api/user"));
    assert_eq!(
        header_of(&seen_a, 0, "authorization"),
        format!("Bearer {GH_VALUE}")
    );
    assert_eq!(
        headers["x-echo-authorization"],
        format!("Bearer {gh_ph}").as_str(),
        "an echoed value goes back as the placeholder"
    );
    // git's way: https://x-access-token:<placeholder>@host/ as basic credentials.
    let (st, ..) = call(
        &mut to_a,
        "/acme/repo.git/info/refs?service=git-upload-pack",
        &[(
            "authorization",
            format!("Basic {}", b64(&format!("x-access-token:{gh_ph}"))),
        )],
    )
    .await
    .unwrap();
    assert_eq!(st, 200);
    assert_eq!(
        header_of(&seen_a, 1, "authorization"),
        format!("Basic {}", b64(&format!("x-access-token:{GH_VALUE}")))
    );
    // Smuggling: a placeholder as the Host (overwritten with the bound host), in the URL
    // (never replaced), in a proxy credential (removed).
    let (st, ..) = call(
        &mut to_a,
        &format!("/search?q={gh_ph}"),
        &[
            ("host", gh_ph.to_owned()),
            ("proxy-authorization", format!("Bearer {gh_ph}")),
        ],
    )
    .await
    .unwrap();
    assert_eq!(st, 200);
    {
        let s = seen_a.lock().unwrap();
        let (_, path, h) = &s[2];
        assert_eq!(h["host"], ha.as_str());
        assert!(path.contains(gh_ph) && !path.contains(GH_VALUE), "{path}");
        assert!(h.get("proxy-authorization").is_none());
    }

    // The same placeholder toward another allowed (and intercepted) host: left as it is,
    // while that host's own secret goes in.
    let mut to_b = box_tls(p, &token, &hb, "localhost", &roots, &[b"http/1.1"])
        .await
        .unwrap();
    let (st, ..) = call(
        &mut to_b,
        "/",
        &[
            ("authorization", format!("token {gh_ph}")),
            ("x-npm-token", npm_ph.to_owned()),
        ],
    )
    .await
    .unwrap();
    assert_eq!(st, 200);
    assert_eq!(
        header_of(&seen_b, 0, "authorization"),
        format!("token {gh_ph}")
    );
    assert_eq!(header_of(&seen_b, 0, "x-npm-token"), NPM_VALUE);

    // Plain HTTP, even toward an allowed host: never a value.
    let (st, text) = send(
        p,
        &format!(
            "GET http://{web}/plain HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {gh_ph}\r\n{}Connection: close\r\n\r\n",
            bearer(&token)
        ),
    )
    .await;
    assert_eq!(st, 200, "{text}");
    assert!(text.contains(gh_ph) && !text.contains(GH_VALUE), "{text}");

    // Run A's placeholder in run B's request, toward the host both runs' secret is bound to.
    let gh_b = claim("GH_TOKEN", std::slice::from_ref(&ha));
    let (token_b, _) = rig
        .spawn_token_with("run-b", &egress, std::slice::from_ref(&gh_b), 300)
        .await;
    let mut b_to_a = box_tls(p, &token_b, &ha, "localhost", &roots, &[b"http/1.1"])
        .await
        .unwrap();
    let (st, ..) = call(
        &mut b_to_a,
        "/other-run",
        &[
            ("authorization", format!("Bearer {gh_ph}")),
            ("x-own", gh_b.placeholder.as_str().to_owned()),
        ],
    )
    .await
    .unwrap();
    assert_eq!(st, 200);
    assert_eq!(
        header_of(&seen_a, 3, "authorization"),
        format!("Bearer {gh_ph}")
    );
    assert_eq!(
        header_of(&seen_a, 3, "x-own"),
        GH_VALUE,
        "run B's own is replaced"
    );

    // Counted, and recorded by run, secret and host.
    let refused = |r: &str| {
        metric(
            &proxy,
            &format!("egress_placeholders_refused_total{{reason=\"{r}\"}}"),
        )
    };
    assert_eq!(refused("unbound_host"), 1);
    assert_eq!(refused("in_url"), 1);
    assert_eq!(refused("plain_http"), 1);
    assert_eq!(refused("other_run"), 1);
    assert_eq!(metric(&proxy, "egress_secrets_replaced_total"), 4);
    assert_eq!(
        metric(&proxy, "egress_allowed_total{kind=\"intercept\"}"),
        3
    );
    let text = String::from_utf8(log.0.lock().unwrap().clone()).unwrap();
    let line = |reason: &str| {
        text.lines()
            .find(|l| l.contains("egress placeholder not replaced") && l.contains(reason))
            .unwrap_or_else(|| panic!("no {reason} line in\n{text}"))
            .to_owned()
    };
    let unbound = line("unbound_host");
    for part in [
        "run=\"run-a\"",
        "secret=\"GH_TOKEN\"",
        &format!("host={hb}"),
    ] {
        assert!(unbound.contains(part), "{part} in {unbound}");
    }
    let other = line("other_run");
    for part in [
        "run=\"run-b\"",
        "owner_run=\"run-a\"",
        "secret=\"GH_TOKEN\"",
    ] {
        assert!(other.contains(part), "{part} in {other}");
    }
    for value in [GH_VALUE, NPM_VALUE] {
        assert!(!text.contains(value), "a value in the proxy's log:\n{text}");
    }
    assert!(!text.contains(&token));
}

#[tokio::test]
async fn a_hostile_box_gets_nothing_from_a_bound_host() {
    let rig = Rig::new().await;
    let ca = TestCa::new();
    let (a, seen_a) = tls_target(&ca).await;
    let (proxy, _dirs) = broker_proxy(&rig, &[("GH_TOKEN", GH_VALUE)], Some(&ca)).await;
    let p = proxy.proxy_addr();
    let ha = format!("localhost:{}", a.port());
    let gh = claim("GH_TOKEN", std::slice::from_ref(&ha));
    let (token, _) = rig
        .spawn_token_with(
            "run-h",
            std::slice::from_ref(&ha),
            std::slice::from_ref(&gh),
            300,
        )
        .await;
    let roots = box_roots(&proxy).await;

    // Not TLS inside the CONNECT: closed, nothing relayed.
    let mut t = connect(p, &ha, &bearer(&token)).await.unwrap();
    t.write_all(
        format!(
            "GET / HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {}\r\n\r\n",
            gh.placeholder.as_str()
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let mut buf = Vec::new();
    let _ = tokio::time::timeout(LIMIT, t.read_to_end(&mut buf)).await;
    assert!(
        !String::from_utf8_lossy(&buf).contains("ok"),
        "no answer from the target"
    );
    // Another TLS name than the CONNECT's.
    let e = box_tls(p, &token, &ha, "evil.example", &roots, &[b"http/1.1"])
        .await
        .unwrap_err();
    assert!(e.starts_with("TLS"), "{e}");
    // h2 only: no protocol in common, no handshake.
    let e = box_tls(p, &token, &ha, "localhost", &roots, &[b"h2"])
        .await
        .unwrap_err();
    assert!(e.starts_with("TLS"), "{e}");
    // h2's preface inside TLS negotiated as HTTP/1.1: an error, nothing relayed.
    let tcp = connect(p, &ha, &bearer(&token)).await.unwrap();
    let cfg = rustls::ClientConfig::builder_with_provider(hako_egress::tls::provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots.clone())
        .with_no_client_auth();
    let mut tls = tokio_rustls::TlsConnector::from(Arc::new(cfg))
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .unwrap();
    tls.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        .await
        .unwrap();
    let mut buf = Vec::new();
    let _ = tokio::time::timeout(LIMIT, tls.read_to_end(&mut buf)).await;
    assert!(!String::from_utf8_lossy(&buf).contains("ok /"), "{buf:?}");
    // TRACE would have the target echo the request, value and all: refused by the proxy.
    let mut s = box_tls(p, &token, &ha, "localhost", &roots, &[b"http/1.1"])
        .await
        .unwrap();
    let req = hyper::Request::builder()
        .method("TRACE")
        .uri("/")
        .header("host", "localhost")
        .header(
            "authorization",
            format!("Bearer {}", gh.placeholder.as_str()),
        )
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .unwrap();
    let resp = s.send_request(req).await.unwrap();
    assert_eq!(resp.status(), 405);
    assert_eq!(resp.headers()["x-hako-egress-denied"], "trace_refused");
    assert!(seen_a.lock().unwrap().is_empty(), "the target got nothing");
    assert!(metric(&proxy, "egress_closed_total{reason=\"tls_handshake\"}") >= 2);
    assert_eq!(
        metric(&proxy, "egress_closed_total{reason=\"sni_mismatch\"}"),
        1
    );
    assert_eq!(metric(&proxy, "egress_secrets_replaced_total"), 0);
}

#[tokio::test]
async fn a_revoked_run_gets_no_value() {
    let rig = Rig::new().await;
    let ca = TestCa::new();
    let (a, seen_a) = tls_target(&ca).await;
    let (proxy, _dirs) = broker_proxy(&rig, &[("GH_TOKEN", GH_VALUE)], Some(&ca)).await;
    let p = proxy.proxy_addr();
    let ha = format!("localhost:{}", a.port());
    let gh = claim("GH_TOKEN", std::slice::from_ref(&ha));
    let (token, jti) = rig
        .spawn_token_with(
            "run-r",
            std::slice::from_ref(&ha),
            std::slice::from_ref(&gh),
            300,
        )
        .await;
    let roots = box_roots(&proxy).await;
    let auth = [(
        "authorization",
        format!("Bearer {}", gh.placeholder.as_str()),
    )];
    let s = box_tls(p, &token, &ha, "localhost", &roots, &[b"http/1.1"])
        .await
        .unwrap();
    let s = tokio::sync::Mutex::new(s);
    assert_eq!(
        call(&mut *s.lock().await, "/before", &auth)
            .await
            .unwrap()
            .0,
        200
    );
    rig.client.revoke(&token, &jti).await.unwrap();
    // The open connection is cut (or answers 407) once the proxy learns of it, and a new
    // CONNECT is refused.
    eventually("the revoked run is refused", LIMIT, || async {
        match call(&mut *s.lock().await, "/after", &auth).await {
            Ok((407, ..)) | Err(_) => Ok(()),
            Ok(other) => Err(other.0),
        }
    })
    .await;
    let reached = seen_a.lock().unwrap().len();
    let (st, text) = connect(p, &ha, &bearer(&token)).await.unwrap_err();
    assert!(st == 407 && text.contains("revoked"), "{text}");
    assert_eq!(
        seen_a.lock().unwrap().len(),
        reached,
        "nothing reaches the host once the revocation is known"
    );
    assert!(reached >= 1);
}

#[tokio::test]
async fn without_a_broker_a_value_or_a_trusted_target_the_request_is_refused() {
    let rig = Rig::new().await;
    let ca = TestCa::new();
    let (a, seen_a) = tls_target(&ca).await;
    let ha = format!("localhost:{}", a.port());
    let gh = claim("GH_TOKEN", std::slice::from_ref(&ha));
    let (token, _) = rig
        .spawn_token_with(
            "run-n",
            std::slice::from_ref(&ha),
            std::slice::from_ref(&gh),
            300,
        )
        .await;
    let auth = [(
        "authorization",
        format!("Bearer {}", gh.placeholder.as_str()),
    )];

    // A proxy that brokers nothing: the bound host is refused, not tunnelled.
    let plain = rig
        .proxy(|c| c.private_targets = vec![hako_egress::Cidr::parse("127.0.0.0/8").unwrap()])
        .await;
    let (st, text) = connect(plain.proxy_addr(), &ha, &bearer(&token))
        .await
        .unwrap_err();
    assert_eq!(st, 503, "{text}");
    assert!(text.contains("broker_unavailable"), "{text}");
    assert_eq!(
        admin_get(plain.admin_addr(), "/v1/ca-bundle.pem").await.0,
        404
    );

    // The secret not set: the request is refused, the target gets nothing.
    let (proxy, _dirs) = broker_proxy(&rig, &[], Some(&ca)).await;
    let roots = box_roots(&proxy).await;
    let mut s = box_tls(
        proxy.proxy_addr(),
        &token,
        &ha,
        "localhost",
        &roots,
        &[b"http/1.1"],
    )
    .await
    .unwrap();
    let (st, headers, body) = call(&mut s, "/", &auth).await.unwrap();
    assert_eq!(st, 503, "{body}");
    assert_eq!(headers["x-hako-egress-denied"], "secret_unavailable");
    assert!(
        body.contains("GH_TOKEN") || body.contains("not set"),
        "{body}"
    );

    // A target whose certificate the proxy does not trust: 502, nothing sent.
    let (untrusting, _dirs2) = broker_proxy(&rig, &[("GH_TOKEN", GH_VALUE)], None).await;
    let roots = box_roots(&untrusting).await;
    let mut s = box_tls(
        untrusting.proxy_addr(),
        &token,
        &ha,
        "localhost",
        &roots,
        &[b"http/1.1"],
    )
    .await
    .unwrap();
    let (st, ..) = call(&mut s, "/", &auth).await.unwrap();
    assert_eq!(st, 502);
    assert_eq!(
        metric(&untrusting, "egress_upstream_failures_total{step=\"tls\"}"),
        1
    );
    assert!(seen_a.lock().unwrap().is_empty());
}

#[tokio::test]
async fn unbound_hosts_are_still_tunnelled_untouched() {
    let rig = Rig::new().await;
    let ca = TestCa::new();
    let (a, _) = tls_target(&ca).await;
    let echo = echo_target().await;
    let (proxy, _dirs) = broker_proxy(&rig, &[("GH_TOKEN", GH_VALUE)], Some(&ca)).await;
    let ha = format!("localhost:{}", a.port());
    let gh = claim("GH_TOKEN", std::slice::from_ref(&ha));
    let (token, _) = rig
        .spawn_token_with("run-u", &[ha.clone(), echo.to_string()], &[gh], 300)
        .await;
    // Bytes that are not TLS pass both ways as before: no interception where nothing is bound.
    let mut t = connect(proxy.proxy_addr(), &echo.to_string(), &bearer(&token))
        .await
        .unwrap();
    assert!(echo_round(&mut t, b"\x16\x03\x01 not intercepted").await);
    assert_eq!(metric(&proxy, "egress_allowed_total{kind=\"connect\"}"), 1);
    assert_eq!(
        metric(&proxy, "egress_allowed_total{kind=\"intercept\"}"),
        0
    );
}
