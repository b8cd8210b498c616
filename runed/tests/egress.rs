//! The egress allowlist end to end, with real containers: a real authd and runed in-process,
//! the `hako-egress` proxy container runed starts and supervises, `allowlist` runs of the
//! test kit's agent on their own internal networks, and targets of our own (an HTTP server,
//! a TLS server, a "private" server and a metadata-style server at a link-local address) on
//! networks this test creates with names it gives them. Nothing is pulled from a registry;
//! everything a test made is removed when its rig drops, failed or not.

mod egress_rig;

use std::time::{Duration, Instant};

use egress_rig::{Rig, answer, rand_hex, status_of};
use hako_client::authd::AuthdClient;
use hako_shared::auth::wire::MintRequest;
use hako_shared::auth::{Signer, now_secs};
use hako_shared::testing::eventually;
use serde_json::json;

/// From an `allowlist` container: the allowed HTTP and HTTPS targets answer through the
/// proxy; a host or port not on the list, a direct connection, the host gateway, the
/// metadata-style address, names that resolve to link-local or private addresses, no token,
/// a forged token and an expired one are all refused. The container's environment holds the
/// proxy and no credential; its network's only peers are the agent and the proxy.
#[tokio::test]
async fn an_allowlist_run_reaches_exactly_its_list() {
    let rig = Rig::new().await;
    let ll = rig.ll.prefix.clone();
    let up = rig.uplink.prefix.clone();
    let authd_port = rig.authd_url.rsplit(':').next().unwrap().to_owned();
    let forged = {
        let c = hako_shared::auth::Claims {
            iss: hako_shared::auth::DEFAULT_ISSUER.into(),
            sub: "runed".into(),
            typ: hako_shared::auth::TokenType::Spawn,
            scope: vec!["egress:connect".into()],
            folder: Some("acme".into()),
            jti: "forged-jti-000000000000".into(),
            iat: now_secs(),
            nbf: now_secs(),
            exp: now_secs() + 600,
            run_id: Some("run-forged".into()),
            turn_id: Some("t".into()),
            parent_jti: None,
            egress: vec!["web.test".into()],
            secrets: vec![],
        };
        Signer::generate().unwrap().sign(&c).unwrap()
    };
    let expired = rig.spawn_token(&["web.test"], 1).await;
    let ca = rig.ca.clone();
    let allow: Vec<String> = [
        "web.test",
        "tls.test",
        "metadata.test",
        "private.test",
        &format!("{ll}.254:8080"),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    // The expired token is past its life plus the proxy's 1 s leeway by the time it is used.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let commands: Vec<String> = vec![
        "env".into(),
        "child-env".into(),
        "fetch http://web.test/hello".into(),
        format!("fetch https://tls.test/secure --ca {ca}"),
        "fetch http://evil.test/".into(),
        format!("fetch https://tls.test:8443/ --ca {ca}"),
        format!("fetch http://{up}.130:80/by-ip"),
        format!("direct http://{up}.130/bypass --timeout-ms 2000"),
        format!("tcp {up}.130:80 2000"),
        format!("tcp {up}.1:{authd_port} 2000"),
        format!("tcp-gateway {authd_port} 2000"),
        format!("fetch http://{up}.1:{authd_port}/health"),
        format!("fetch http://{ll}.254/latest/meta-data/"),
        "fetch http://metadata.test/latest/meta-data/".into(),
        format!("fetch http://{ll}.254:8080/explicit"),
        "fetch http://private.test/".into(),
        "fetch http://web.test/anonymous --token -".into(),
        format!("fetch http://web.test/forged --token {forged}"),
        format!("fetch http://web.test/expired --token {expired}"),
    ];
    let n = commands.len();
    let run = rig.run(&allow, &commands).await;
    let b = rig.blocks(&run, n).await;

    // What Docker holds: the proxy's address, no credential.
    let env = answer(&b, "env");
    for k in ["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"] {
        assert_eq!(env[k], "http://hako-egress:3128", "{env}");
    }
    assert_eq!(
        (env["NO_PROXY"].as_str(), env["no_proxy"].as_str()),
        (Some(""), Some(""))
    );
    // What the tools get: the token, put there by the agent from its stdin.
    let child = answer(&b, "child-env");
    assert_eq!(
        child["HTTPS_PROXY"], "http://hako:<token>@hako-egress:3128",
        "{child}"
    );

    let web = answer(&b, "fetch http://web.test/hello");
    assert_eq!(status_of(&web), (Some(200), None), "{web}");
    assert!(
        web["body"]
            .as_str()
            .unwrap()
            .starts_with("web http GET /hello proxy-authorization=false"),
        "{web}"
    );
    let tls = answer(&b, "fetch https://tls.test/secure");
    assert_eq!(
        status_of(&tls),
        (Some(200), None),
        "HTTPS through CONNECT: {tls}"
    );
    assert!(
        tls["body"]
            .as_str()
            .unwrap()
            .starts_with("tls https GET /secure"),
        "{tls}"
    );

    for (cmd, status, reason) in [
        ("fetch http://evil.test/", 403, "host_not_allowed"),
        ("fetch https://tls.test:8443/", 403, "host_not_allowed"),
        (
            &*format!("fetch http://{up}.130:80/by-ip"),
            403,
            "host_not_allowed",
        ),
        (
            &*format!("fetch http://{up}.1:{authd_port}/health"),
            403,
            "host_not_allowed",
        ),
        (
            &*format!("fetch http://{ll}.254/latest"),
            403,
            "host_not_allowed",
        ),
        ("fetch http://metadata.test/", 403, "private_address"),
        ("fetch http://private.test/", 403, "private_address"),
        ("fetch http://web.test/anonymous", 407, "no_token"),
        ("fetch http://web.test/forged", 407, "bad_token"),
        ("fetch http://web.test/expired", 407, "expired"),
    ] {
        let v = answer(&b, cmd);
        assert_eq!(status_of(&v), (Some(status), Some(reason)), "{cmd}: {v}");
        assert!(v["body"].as_str().unwrap().contains("denied"), "{cmd}: {v}");
    }
    // The proxy can reach the metadata-style server: only policy keeps it out. An entry that
    // names the address and port is the operator's explicit choice.
    let explicit = answer(&b, &format!("fetch http://{ll}.254:8080/explicit"));
    assert_eq!(status_of(&explicit), (Some(200), None), "{explicit}");
    // Around the proxy there is nothing: no route to the targets, the host or the gateway.
    for cmd in [
        format!("direct http://{up}.130/bypass"),
        format!("tcp {up}.130:80"),
        format!("tcp {up}.1:{authd_port}"),
        format!("tcp-gateway {authd_port}"),
    ] {
        let v = answer(&b, &cmd);
        assert!(v["error"].is_string(), "{cmd} must fail: {v}");
        assert!(
            v["status"].is_null() && v["connected"].is_null(),
            "{cmd}: {v}"
        );
    }

    let end = rig.wait_end(&run).await;
    assert_eq!(end["outcome"], "ok", "{end}");

    // Counted by reason, logged with folder, run and host, never a token.
    let m = rig.proxy_metrics().await;
    for (reason, at_least) in [
        ("host_not_allowed", 5),
        ("private_address", 2),
        ("no_token", 1),
        ("bad_token", 1),
        ("expired", 1),
    ] {
        let line = format!("egress_denied_total{{reason=\"{reason}\"}} ");
        let n: u64 = m
            .lines()
            .find_map(|l| l.strip_prefix(&line)?.parse().ok())
            .unwrap_or_else(|| panic!("{line} in {m}"));
        assert!(n >= at_least, "{reason}: {n}");
    }
    let logs = rig.proxy_logs().await;
    let deny = logs
        .lines()
        .find(|l| l.contains("egress denied") && l.contains("evil.test:80"))
        .unwrap_or_else(|| panic!("no deny line for evil.test in\n{logs}"));
    assert!(
        deny.contains("folder=\"acme\"") && deny.contains(&format!("run=\"{run}\"")),
        "{deny}"
    );
    for secret in [forged.as_str(), expired.as_str()] {
        let sig = secret.rsplit('.').next().unwrap();
        assert!(!logs.contains(sig), "a token in the proxy's log");
    }
    // The run's network goes with the run: removed right after the end is recorded (the
    // record comes first, so a slow daemon gets a little while).
    let suffix = run.replace("run-", "");
    eventually(
        "the run's network is removed",
        Duration::from_secs(60),
        || async {
            let nets = rig
                .docker
                .list_networks(None::<bollard::query_parameters::ListNetworksOptions>)
                .await
                .unwrap();
            let left: Vec<_> = nets
                .into_iter()
                .filter_map(|n| n.name)
                .filter(|x| x.contains(&suffix))
                .collect();
            if left.is_empty() { Ok(()) } else { Err(left) }
        },
    )
    .await
}

/// The container's network: internal, no address on the host, the agent and the proxy only;
/// only a service token chooses a group's network.
#[tokio::test]
async fn the_run_network_is_internal_its_only_peer_the_proxy_and_only_a_service_token_sets_it() {
    let rig = Rig::new().await;
    // Authority first: a folder-bound token and an unbound user token are refused.
    let c = AuthdClient::new(&rig.authd_url).unwrap();
    let mint = |parent: String, folder: Option<&str>| {
        let c = c.clone();
        let folder = folder.map(str::to_owned);
        async move {
            c.mint(
                &parent,
                &MintRequest {
                    scope: vec!["runs:run".into(), "runs:read".into()],
                    folder,
                    ttl_seconds: Some(300),
                    ..Default::default()
                },
            )
            .await
            .unwrap()
            .token
        }
    };
    let bound = mint(rig.routd.clone(), Some("acme")).await;
    let unbound = mint(rig.operator.clone(), None).await;
    for token in [&bound, &unbound] {
        for group in [
            json!({"network": "allowlist"}),
            json!({"network": "open"}),
            json!({"egress_allowlist": ["web.test"]}),
        ] {
            let (s, v) = rig
                .api()
                .post(
                    token,
                    "/v1/runs",
                    json!({"folder": "acme", "turn_id": format!("t-{}", rand_hex(3)), "group": group}),
                )
                .await;
            assert_eq!(
                (s, v["error"].as_str()),
                (403, Some("forbidden_group_setting")),
                "{v}"
            );
        }
    }
    let (s, v) = rig
        .api()
        .post(
            &rig.routd,
            "/v1/runs",
            json!({"folder": "acme", "turn_id": "t-bad", "group": {"network": "allowlist", "egress_allowlist": ["*.com"]}}),
        )
        .await;
    assert_eq!(
        (s, v["error"].as_str()),
        (400, Some("invalid_group")),
        "{v}"
    );

    let run = rig
        .run(&["web.test".into()], &["wait-file go 60000".into()])
        .await;
    let deadline = Instant::now() + Duration::from_secs(60);
    let cid = loop {
        let v = rig.status(&run).await;
        if v["state"] == "running" {
            break rig
                .docker
                .inspect_container(&format!("hako-{}-{run}", rig.install), None)
                .await
                .unwrap()
                .id
                .unwrap();
        }
        assert!(Instant::now() < deadline, "never running: {v}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let info = rig.docker.inspect_container(&cid, None).await.unwrap();
    let net = info.host_config.unwrap().network_mode.unwrap();
    assert!(
        net.starts_with(&format!("hako-{}-eg-", rig.install)),
        "{net}"
    );
    let env = info.config.unwrap().env.unwrap();
    assert!(
        env.iter()
            .filter(|e| e.to_ascii_lowercase().contains("proxy"))
            .all(|e| !e.contains('@')),
        "no credential in what Docker stores: {env:?}"
    );
    let n = rig.docker.inspect_network(&net, None).await.unwrap();
    assert_eq!(n.internal, Some(true));
    assert_eq!(
        n.options
            .unwrap_or_default()
            .get("com.docker.network.bridge.inhibit_ipv4")
            .map(String::as_str),
        Some("true")
    );
    let members: Vec<String> = n
        .containers
        .unwrap_or_default()
        .into_values()
        .filter_map(|c| c.name)
        .collect();
    let mut want = vec![format!("hako-{}-{run}", rig.install), rig.proxy_name()];
    want.sort();
    let mut got = members.clone();
    got.sort();
    assert_eq!(got, want, "the agent and the proxy, nothing else");
    rig.go("go");
    assert_eq!(rig.wait_end(&run).await["outcome"], "ok");
}

/// The proxy killed mid-run: the agent's requests fail (closed), runed recreates the proxy,
/// joins it to the live run's network, and the same run's requests pass again.
#[tokio::test]
async fn the_proxy_killed_mid_run_fails_closed_and_comes_back() {
    let rig = Rig::new().await;
    let commands: Vec<String> = vec![
        "fetch http://web.test/one".into(),
        "wait-file go1 90000".into(),
        "fetch http://web.test/two --timeout-ms 3000".into(),
        "wait-file go2 90000".into(),
        "fetch http://web.test/three".into(),
    ];
    let run = rig.run(&["web.test".into()], &commands).await;
    let b = rig.blocks(&run, 1).await;
    assert_eq!(
        status_of(&answer(&b, "fetch http://web.test/one")).0,
        Some(200),
        "{b:?}"
    );
    let old = rig.proxy_id().await.expect("proxy running");
    rig.docker
        .kill_container(
            &old,
            None::<bollard::query_parameters::KillContainerOptions>,
        )
        .await
        .unwrap();
    rig.go("go1");
    let b = rig.blocks(&run, 3).await;
    let two = answer(&b, "fetch http://web.test/two");
    assert!(
        two["status"].is_null() && two["error"].is_string(),
        "closed while down: {two}"
    );
    // runed notices, recreates, and says so on /ready once the new proxy is ready.
    eventually("the proxy comes back", Duration::from_secs(60), || async {
        let id = rig.proxy_id().await;
        if let Some(id) = &id
            && *id != old
            && rig.ready().await.0 == 200
        {
            return Ok(());
        }
        Err(id)
    })
    .await;
    let metrics = reqwest::Client::builder()
        .no_proxy()
        .build()
        .unwrap()
        .get(format!("{}/metrics", rig.runed.as_ref().unwrap().url()))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let restarts: u64 = metrics
        .lines()
        .find_map(|l| {
            l.strip_prefix("runed_egress_proxy_restarts_total ")?
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("{metrics}"));
    assert!(restarts >= 1, "{metrics}");
    assert!(metrics.contains("runed_egress_proxy_up 1"), "{metrics}");
    rig.go("go2");
    let b = rig.blocks(&run, 5).await;
    let three = answer(&b, "fetch http://web.test/three");
    assert_eq!(status_of(&three), (Some(200), None), "{three}");
    assert_eq!(rig.wait_end(&run).await["outcome"], "ok");
}

/// A token revoked mid-run: its open tunnel is cut and its next request refused.
#[tokio::test]
async fn a_token_revoked_mid_run_is_refused_and_its_tunnel_cut() {
    let rig = Rig::new().await;
    let commands: Vec<String> = vec![
        "jti".into(),
        "fetch http://web.test/before".into(),
        "hold web.test:80 60000".into(),
        "fetch http://web.test/after".into(),
    ];
    let run = rig.run(&["web.test".into()], &commands).await;
    // The `hold` tunnel is open (its own block) before the token is revoked.
    let b = rig.blocks(&run, 3).await;
    assert_eq!(
        status_of(&answer(&b, "fetch http://web.test/before")).0,
        Some(200),
        "{b:?}"
    );
    assert!(b[2].ends_with("open"), "{b:?}");
    let jti = answer(&b, "jti");
    let jti = jti.as_str().unwrap();
    let revoked_at = Instant::now();
    AuthdClient::new(&rig.authd_url)
        .unwrap()
        .revoke(&rig.operator, jti)
        .await
        .unwrap();
    let b = rig.blocks(&run, 5).await;
    let held = answer(&b, "hold web.test:80 60000");
    assert_eq!(held["end"], "closed by the proxy", "{held}");
    assert!(revoked_at.elapsed() < Duration::from_secs(30), "{held}");
    let after = answer(&b, "fetch http://web.test/after");
    assert_eq!(status_of(&after), (Some(407), Some("revoked")), "{after}");
    assert_eq!(rig.wait_end(&run).await["outcome"], "ok");
}

/// An `allowlist` run under gVisor (`RUNED_UNTRUSTED_RUNTIME=runsc`): its internal network
/// and the egress proxy work as under runc, reaching exactly its list.
#[tokio::test]
async fn an_allowlist_run_under_gvisor_reaches_exactly_its_list() {
    let rig = Rig::with_env(&[("RUNED_UNTRUSTED_RUNTIME", "runsc")]).await;
    let up = rig.uplink.prefix.clone();
    let commands: Vec<String> = vec![
        "fetch http://web.test/hello".into(),
        "fetch http://evil.test/".into(),
        format!("direct http://{up}.130/bypass --timeout-ms 2000"),
    ];
    let run = rig.run(&["web.test".to_owned()], &commands).await;
    let b = rig.blocks(&run, commands.len()).await;
    let web = answer(&b, "fetch http://web.test/hello");
    assert_eq!(status_of(&web), (Some(200), None), "{web}");
    let evil = answer(&b, "fetch http://evil.test/");
    assert_eq!(status_of(&evil).0, Some(403), "{evil}");
    let direct = answer(&b, &format!("direct http://{up}.130/bypass"));
    assert!(
        status_of(&direct).0.is_none(),
        "no way around the proxy: {direct}"
    );
    // It really ran under gVisor.
    let c = rig
        .docker
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
    let id = c[0].id.clone().unwrap();
    let i = rig
        .docker
        .inspect_container(
            &id,
            None::<bollard::query_parameters::InspectContainerOptions>,
        )
        .await
        .unwrap();
    assert_eq!(
        i.host_config.and_then(|h| h.runtime).as_deref(),
        Some("runsc-net")
    );
}
