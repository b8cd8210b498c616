//! Brokered secrets end to end, with real containers (`specs/egress.md`, Secrets): the
//! operator sets a secret at runed, a group names it for its hosts, and boxes of the toolbox
//! image (curl, git, Python's requests and httpx, node) use it by its placeholder through the
//! `hako-egress` proxy that runed runs. The hosts are HTTPS servers of our own on a network
//! this test creates (the test kit's `secret-server`: a certificate from a CA of its own, which
//! the proxy trusts only because `EGRESS_EXTRA_ROOTS` says so, a smart-HTTP git forge, and a
//! log of a digest of every credential it received). Everything is asserted from outside the
//! box: the forges' logs, runed's API, the proxy's metrics and log, Docker's inspect, the data
//! directory and the databases on disk.

mod egress_rig;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use egress_rig::{Forge, Rig, answer, rand_hex, sha256_hex};
use hako_client::authd::AuthdClient;
use hako_client::runed;
use hako_client::testing::send;
use hako_shared::auth::wire::MintRequest;
use hako_shared::secrets::SecretValueRequest;
use hako_shared::testing::eventually;
use serde_json::{Value, json};

/// What `hello.txt` of the forge's repository holds (`testkit/src/secret_server.rs`).
const HELLO: &str = "hello from the hako test forge";

/// A writer that keeps what this process logs (runed runs in it).
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    /// Captures every log line of this process, at every level.
    fn install() -> Captured {
        let log = Captured::default();
        let sink = log.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || sink.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::TRACE)
            .finish();
        tracing::subscriber::set_global_default(subscriber).expect("one subscriber per process");
        log
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

/// A value as the operator would have one: high entropy, printable.
fn value(prefix: &str) -> String {
    format!("{prefix}_{}", rand_hex(20))
}

/// The group every run here uses: the toolbox image, the forges on its list, `GH_TOKEN` for
/// `api.test` and `git.test`, `NPM_TOKEN` for `other.test` (so that the proxy terminates TLS
/// there too and sees what else goes there).
fn group(rig: &Rig) -> Value {
    json!({
        "network": "allowlist",
        "image": rig.toolbox,
        "egress_allowlist": ["api.test", "git.test", "other.test", "web.test"],
        "secrets": [
            {"name": "GH_TOKEN", "hosts": ["api.test", "git.test"]},
            {"name": "NPM_TOKEN", "hosts": ["other.test"]}
        ]
    })
}

async fn put_secret(rig: &Rig, name: &str, v: &str) {
    let req = SecretValueRequest { value: v.into() };
    let (s, b) = send(&rig.api(), &rig.operator, runed::put_secret(name, &req)).await;
    assert_eq!(s, 204, "{b}");
}

/// The forge's `REQ` lines for `path`: (auth verdict, digest).
async fn forge_saw(rig: &Rig, forge: &str, path: &str) -> Vec<(String, String)> {
    let logs = rig.logs_of(&rig.forges[forge]).await;
    logs.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("REQ ")?;
            let mut words = rest.split_whitespace();
            let (_method, p) = (words.next()?, words.next()?);
            if p != path {
                return None;
            }
            let auth = rest.split(" auth=").nth(1)?.split_whitespace().next()?;
            let sha = rest.split(" sha256=").nth(1)?.split_whitespace().next()?;
            Some((auth.to_owned(), sha.to_owned()))
        })
        .collect()
}

/// The answer to exactly `command` (`<command>: <JSON>`; the command may hold `: ` itself).
fn reply(blocks: &[String], command: &str) -> Value {
    let head = format!("{command}: ");
    let rest = blocks
        .iter()
        .rev()
        .find_map(|b| b.strip_prefix(&head))
        .unwrap_or_else(|| panic!("no answer to {command:?} in {blocks:#?}"));
    serde_json::from_str(rest).unwrap_or_else(|_| json!(rest))
}

/// `sh …` answer to exactly `command`: (exit code, stdout, stderr).
fn shell(blocks: &[String], command: &str) -> (i64, String, String) {
    let v = reply(blocks, command);
    (
        v["code"].as_i64().unwrap_or(-1),
        v["stdout"].as_str().unwrap_or_default().to_owned(),
        v["stderr"].as_str().unwrap_or_default().to_owned(),
    )
}

/// Every file under `dir`, but the store itself (`egress/secrets/`, where values live).
fn files_without_the_store(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.ends_with("egress/secrets") {
            continue;
        }
        match e.file_type() {
            Ok(t) if t.is_dir() => files_without_the_store(&p, out),
            Ok(t) if t.is_file() => out.push(p),
            _ => {}
        }
    }
}

/// From boxes of an `allowlist` group with brokered secrets: `curl` with a header, `git clone`
/// over smart HTTP with the token in the URL, Python's `requests` and `httpx`, and node's TLS
/// through a `CONNECT` each reach the bound host with the real value, while the box holds only
/// placeholders. The same placeholder toward another intercepted host, over plain HTTP, and in
/// another run arrives as it was, and the proxy records each. The value is nowhere in the box
/// (its environment, `/proc/*/environ`), the data directory, runed's database, runed's log or
/// the proxy's log.
#[tokio::test]
async fn a_brokered_secret_reaches_its_hosts_from_real_clients_and_nowhere_else() {
    let log = Captured::install();
    let (gh, npm) = (value("ghp"), value("npm"));
    let rig = Rig::with_secrets(&[
        Forge {
            name: "forge",
            host: 132,
            aliases: &["api.test", "git.test"],
            expect_sha256: sha256_hex(gh.as_bytes()),
        },
        Forge {
            name: "other",
            host: 133,
            aliases: &["other.test"],
            expect_sha256: sha256_hex(npm.as_bytes()),
        },
    ])
    .await;
    put_secret(&rig, "GH_TOKEN", &gh).await;
    put_secret(&rig, "NPM_TOKEN", &npm).await;

    let node = r#"node -e 'const http=require("http"),tls=require("tls");const p=new URL(process.env.HTTPS_PROXY);const a="Basic "+Buffer.from(decodeURIComponent(p.username)+":"+decodeURIComponent(p.password)).toString("base64");http.request({host:p.hostname,port:p.port,method:"CONNECT",path:"api.test:443",headers:{"proxy-authorization":a}}).on("connect",(r,sock)=>{const s=tls.connect({socket:sock,servername:"api.test"},()=>s.write("GET /node HTTP/1.1\r\nHost: api.test\r\nAuthorization: Bearer "+process.env.GH_TOKEN+"\r\nConnection: close\r\n\r\n"));let d="";s.on("data",c=>d+=c);s.on("end",()=>console.log(d.split("\r\n\r\n")[1].trim()));s.on("error",e=>console.log("error "+e.message))}).on("error",e=>console.log("error "+e.message)).end()'"#;
    let env_cmd = "sh env".to_owned();
    let environ_cmd = "sh cat /proc/[0-9]*/environ | tr '\\0' '\\n'".to_owned();
    let curl_cmd =
        r#"sh curl -sS -H "Authorization: Bearer $GH_TOKEN" https://api.test/curl"#.to_owned();
    let git_cmd = r#"sh git clone -q "https://x-access-token:$GH_TOKEN@git.test/git/repo.git" /tmp/repo && cat /tmp/repo/hello.txt"#.to_owned();
    let requests_cmd = r#"sh python3 -c "import os, requests; print(requests.get('https://api.test/requests', headers={'Authorization': 'Bearer ' + os.environ['GH_TOKEN']}).text.strip())""#.to_owned();
    let httpx_cmd = r#"sh python3 -c "import os, httpx; print(httpx.get('https://api.test/httpx', headers={'Authorization': 'Bearer ' + os.environ['GH_TOKEN']}).text.strip())""#.to_owned();
    let node_cmd = format!("sh {node}");
    let npm_cmd = r#"sh curl -sS -H "X-Api-Key: $NPM_TOKEN" https://other.test/npm"#.to_owned();
    let unbound_cmd =
        r#"sh curl -sS -H "Authorization: Bearer $GH_TOKEN" https://other.test/unbound"#.to_owned();
    let plain_cmd =
        r#"sh curl -sS -H "Authorization: Bearer $GH_TOKEN" http://web.test/plain"#.to_owned();
    let print_cmd = "sh printf %s \"$GH_TOKEN\"".to_owned();
    let commands: Vec<String> = vec![
        env_cmd.clone(),
        environ_cmd.clone(),
        curl_cmd.clone(),
        git_cmd.clone(),
        requests_cmd.clone(),
        httpx_cmd.clone(),
        node_cmd.clone(),
        npm_cmd.clone(),
        unbound_cmd.clone(),
        plain_cmd.clone(),
        print_cmd.clone(),
    ];
    let n = commands.len();
    let run_a = rig.run_group(group(&rig), &commands).await;
    let b = rig.blocks(&run_a, n).await;
    let (_, placeholder, _) = shell(&b, &print_cmd);
    assert!(placeholder.starts_with("hako_ph_"), "{placeholder}");

    // The box holds the placeholder and the CA bundle, never the value.
    let (_, env, _) = shell(&b, &env_cmd);
    assert!(env.contains(&format!("GH_TOKEN={placeholder}")), "{env}");
    for var in [
        "SSL_CERT_FILE",
        "REQUESTS_CA_BUNDLE",
        "NODE_EXTRA_CA_CERTS",
        "GIT_SSL_CAINFO",
        "CURL_CA_BUNDLE",
    ] {
        assert!(
            env.contains(&format!("{var}=/etc/ssl/certs/ca-certificates.crt")),
            "{var}: {env}"
        );
    }
    let (_, environ, _) = shell(&b, &environ_cmd);
    assert!(environ.contains(&placeholder), "{environ}");
    for v in [&gh, &npm] {
        assert!(!env.contains(v.as_str()) && !environ.contains(v.as_str()));
        assert!(
            !b.iter().any(|x| x.contains(v.as_str())),
            "a value in the run's output"
        );
    }

    // Each client reached its host with the value (the forge's digest matches it), and got
    // its answer back.
    for (cmd, want) in [
        (&curl_cmd, "auth=ok"),
        (&git_cmd, HELLO),
        (&requests_cmd, "auth=ok"),
        (&httpx_cmd, "auth=ok"),
        (&node_cmd, "auth=ok"),
        (&npm_cmd, "auth=ok"),
    ] {
        let (code, out, err) = shell(&b, cmd);
        assert_eq!((code, out.trim()), (0, want), "{cmd}: {err}");
    }
    let gh_sha = sha256_hex(gh.as_bytes());
    for path in ["/curl", "/requests", "/httpx", "/node"] {
        assert_eq!(
            forge_saw(&rig, "forge", path).await,
            vec![("ok".to_owned(), gh_sha.clone())],
            "{path}"
        );
    }
    let git = forge_saw(
        &rig,
        "forge",
        "/git/repo.git/info/refs?service=git-upload-pack",
    )
    .await;
    assert!(git.contains(&("ok".to_owned(), gh_sha.clone())), "{git:?}");

    // Toward a host GH_TOKEN is not bound to, and over plain HTTP: the placeholder arrives as
    // it was sent.
    let ph_sha = sha256_hex(placeholder.as_bytes());
    assert_eq!(
        forge_saw(&rig, "other", "/unbound").await,
        vec![("other".to_owned(), ph_sha.clone())]
    );
    let (code, out, err) = shell(&b, &unbound_cmd);
    assert_eq!((code, out.trim()), (0, "auth=other"), "{err}");
    let (_, plain, _) = shell(&b, &plain_cmd);
    assert!(plain.starts_with("web http GET /plain"), "{plain}");

    // Another run, the first run's placeholder: not replaced.
    let other_cmd = format!(
        "sh curl -sS -H \"Authorization: Bearer {placeholder}\" https://api.test/other-run"
    );
    let run_b = rig
        .run_group(group(&rig), std::slice::from_ref(&other_cmd))
        .await;
    let bb = rig.blocks(&run_b, 1).await;
    let (code, out, _) = shell(&bb, &other_cmd);
    assert_eq!((code, out.trim()), (0, "auth=other"));
    assert_eq!(
        forge_saw(&rig, "forge", "/other-run").await,
        vec![("other".to_owned(), ph_sha.clone())]
    );
    rig.wait_end(&run_a).await;
    rig.wait_end(&run_b).await;

    // The proxy counted and recorded each: run, secret, host, never the value.
    let m = rig.proxy_metrics().await;
    let count = |series: &str| -> u64 {
        m.lines()
            .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
            .unwrap_or_else(|| panic!("{series} in {m}"))
    };
    assert!(count("egress_secrets_replaced_total") >= 6);
    assert_eq!(
        count("egress_placeholders_refused_total{reason=\"unbound_host\"}"),
        1
    );
    assert_eq!(
        count("egress_placeholders_refused_total{reason=\"plain_http\"}"),
        1
    );
    assert_eq!(
        count("egress_placeholders_refused_total{reason=\"other_run\"}"),
        1
    );
    let proxy_log = rig.proxy_logs().await;
    let line = |reason: &str| {
        proxy_log
            .lines()
            .find(|l| l.contains("egress placeholder not replaced") && l.contains(reason))
            .unwrap_or_else(|| panic!("no {reason} record in\n{proxy_log}"))
            .to_owned()
    };
    let unbound = line("unbound_host");
    for part in [
        format!("run=\"{run_a}\""),
        "secret=\"GH_TOKEN\"".to_owned(),
        "host=other.test:443".to_owned(),
    ] {
        assert!(unbound.contains(&part), "{part} in {unbound}");
    }
    let other = line("other_run");
    for part in [
        &format!("run=\"{run_b}\""),
        &format!("owner_run=\"{run_a}\""),
    ] {
        assert!(other.contains(part.as_str()), "{part} in {other}");
    }

    // Nowhere else: the proxy's log, runed's log, every file under the data directory but the
    // store (runed.db, the run logs, the env files, the bundle), authd's database.
    let runed_log = log.text();
    assert!(
        runed_log.contains("brokered secret set"),
        "runed logs the name"
    );
    let mut files = Vec::new();
    files_without_the_store(&rig.data(), &mut files);
    files_without_the_store(&rig.dir.path().join("authd"), &mut files);
    assert!(files.iter().any(|f| f.ends_with("runed.db")), "{files:?}");
    for v in [&gh, &npm] {
        assert!(
            !proxy_log.contains(v.as_str()),
            "a value in the proxy's log"
        );
        assert!(!runed_log.contains(v.as_str()), "a value in runed's log");
        for f in &files {
            let data = std::fs::read(f).unwrap_or_default();
            assert!(
                memchr::memmem::find(&data, v.as_bytes()).is_none(),
                "a value in {}",
                f.display()
            );
        }
    }
    // The store holds it, 0600, for the proxy's user alone.
    let stored = rig.data().join("egress/secrets/GH_TOKEN");
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let meta = std::fs::metadata(&stored).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    assert_eq!(
        meta.uid(),
        65534,
        "the proxy's user (runed runs as root here)"
    );
    assert_eq!(std::fs::read_to_string(&stored).unwrap(), gh);
}

/// A run whose token was revoked gets no value (its next connection is refused), and with the
/// proxy down nothing leaves the box at all. While a box waits, Docker's view of it (inspect:
/// environment, labels, mounts) holds the placeholder and the bundle, never the value.
#[tokio::test]
async fn a_revoked_run_or_a_dead_proxy_gets_no_value() {
    let gh = value("ghp");
    let mut rig = Rig::with_secrets(&[Forge {
        name: "forge",
        host: 132,
        aliases: &["api.test", "git.test"],
        expect_sha256: sha256_hex(gh.as_bytes()),
    }])
    .await;
    put_secret(&rig, "GH_TOKEN", &gh).await;
    put_secret(&rig, "NPM_TOKEN", &value("npm")).await;
    let curl = |path: &str| {
        format!(
            r#"sh curl -sS -o /dev/null -w %{{http_code}} -H "Authorization: Bearer $GH_TOKEN" https://api.test{path}; echo " exit=$?""#
        )
    };

    // Revoked: a tunnel of the run is cut when the proxy learns of it; then no request passes.
    let (before, after) = (curl("/before"), curl("/after-revoke"));
    let run = rig
        .run_group(
            group(&rig),
            &[
                "jti".into(),
                before.clone(),
                "hold web.test:80 60000".into(),
                after.clone(),
            ],
        )
        .await;
    let b = rig.blocks(&run, 3).await;
    let jti = answer(&b, "jti");
    assert_eq!(shell(&b, &before).1.trim(), "200 exit=0");
    assert_eq!(forge_saw(&rig, "forge", "/before").await.len(), 1);
    AuthdClient::new(&rig.authd_url)
        .unwrap()
        .revoke(&rig.runed_service, jti.as_str().unwrap())
        .await
        .unwrap();
    // The hold's end: the proxy cut the run's tunnel, so it knows.
    let b = rig.blocks(&run, 5).await;
    let refused = shell(&b, &after).1;
    assert!(refused.contains("000"), "refused at CONNECT: {refused}");
    assert!(forge_saw(&rig, "forge", "/after-revoke").await.is_empty());
    rig.wait_end(&run).await;

    // The proxy down: refused, never tunnelled around it. runed is stopped first, so that it
    // cannot make the proxy again meanwhile; the box runs on (a daemon's shutdown detaches).
    let down = curl("/while-down");
    let run = rig
        .run_group(group(&rig), &["wait-file go 90000".into(), down.clone()])
        .await;
    let id = eventually("the box runs", Duration::from_secs(60), || async {
        let v = rig.status(&run).await;
        if v["state"] != "running" {
            return Err(v);
        }
        let filters = std::collections::HashMap::from([(
            "label".to_owned(),
            vec![format!("io.hako.run={run}")],
        )]);
        let opts = bollard::query_parameters::ListContainersOptionsBuilder::new()
            .filters(&filters)
            .build();
        let list = rig.docker.list_containers(Some(opts)).await.unwrap();
        list.into_iter().find_map(|c| c.id).ok_or(v)
    })
    .await;
    // What Docker holds of the box while it waits.
    let inspect = rig.docker.inspect_container(&id, None).await.unwrap();
    let seen = serde_json::to_string(&inspect).unwrap();
    assert!(
        seen.contains("GH_TOKEN=hako_ph_"),
        "the placeholder is in its environment"
    );
    assert!(seen.contains("ca-bundle.pem"), "the bundle is mounted");
    assert!(
        !seen.contains(&gh),
        "the value is not in Docker's view of the box"
    );
    rig.runed.take().unwrap().shutdown().await;
    rig.docker
        .kill_container(
            &rig.proxy_name(),
            None::<bollard::query_parameters::KillContainerOptions>,
        )
        .await
        .unwrap();
    rig.go("go");
    let head = format!("{down}: ");
    let out = eventually("the box answers", Duration::from_secs(60), || async {
        let logs = rig.logs_of(&id).await;
        logs.lines()
            .filter_map(|l| serde_json::from_str::<Value>(l.trim()).ok())
            .filter_map(|v| v["result"].as_str().map(str::to_owned))
            .find_map(|r| r.strip_prefix(&head).map(str::to_owned))
            .ok_or(())
    })
    .await;
    let v: Value = serde_json::from_str(&out).unwrap();
    let stdout = v["stdout"].as_str().unwrap();
    assert!(stdout.contains("000") && !stdout.contains("exit=0"), "{v}");
    assert!(forge_saw(&rig, "forge", "/while-down").await.is_empty());
}

/// Only the operator sets, lists and removes secrets (a folder-bound token and a daemon are
/// refused); a value is never echoed back; a group that names a secret never set fails its
/// run naming the secret; only a service token may send a group with secrets.
#[tokio::test]
async fn only_the_operator_handles_secrets_and_a_missing_one_is_named() {
    let rig = Rig::with_secrets(&[]).await;
    let api = rig.api();
    let c = AuthdClient::new(&rig.authd_url).unwrap();
    let tenant = c
        .mint(
            &rig.operator,
            &MintRequest {
                scope: vec![
                    "secrets:read".into(),
                    "secrets:write".into(),
                    "runs:run".into(),
                ],
                folder: Some("acme".into()),
                ttl_seconds: Some(300),
                ..Default::default()
            },
        )
        .await
        .unwrap()
        .token;
    let secret = value("ghp");
    for token in [&tenant, &rig.routd] {
        let (s, v) = api
            .put(token, "/v1/secrets/GH_TOKEN", json!({"value": secret}))
            .await;
        assert_eq!(s, 403, "{v}");
        let (s, _) = api.get(token, "/v1/secrets").await;
        assert_eq!(s, 403);
    }
    for (path, body, code) in [
        (
            "/v1/secrets/gh_token",
            json!({"value": secret}),
            "invalid_secret_name",
        ),
        (
            "/v1/secrets/HTTPS_PROXY",
            json!({"value": secret}),
            "invalid_secret_name",
        ),
        (
            "/v1/secrets/GH_TOKEN",
            json!({"value": format!("{secret}\r\nX-Evil: 1")}),
            "invalid_secret_value",
        ),
        (
            "/v1/secrets/GH_TOKEN",
            json!({"value": secret, "more": 1}),
            "invalid_json",
        ),
        ("/v1/secrets/GH_TOKEN", json!({"value": 5}), "invalid_json"),
    ] {
        let (s, v) = api.put(&rig.operator, path, body).await;
        assert_eq!((s, v["error"].as_str()), (400, Some(code)), "{path}: {v}");
        assert!(!v.to_string().contains(&secret), "the value is echoed: {v}");
    }
    put_secret(&rig, "GH_TOKEN", &secret).await;
    let (s, v) = api.get(&rig.operator, "/v1/secrets").await;
    assert_eq!(s, 200);
    assert_eq!(v["secrets"][0]["name"], "GH_TOKEN", "{v}");
    assert!(!v.to_string().contains(&secret));

    // A group naming a secret that is not set: the run fails, naming it.
    let mut g = group(&rig);
    g["image"] = json!(rig.testkit);
    let run = rig.run_group(g.clone(), &["jti".into()]).await;
    let end = rig.wait_end(&run).await;
    assert_eq!(end["state"], "error", "{end}");
    assert!(
        end["error"].as_str().unwrap().contains("NPM_TOKEN"),
        "{end}"
    );
    // Only a service token sends a group with secrets.
    let user = c
        .mint(
            &rig.operator,
            &MintRequest {
                scope: vec!["runs:run".into()],
                ttl_seconds: Some(300),
                ..Default::default()
            },
        )
        .await
        .unwrap()
        .token;
    let (s, v) = api
        .post(
            &user,
            "/v1/runs",
            json!({"folder": "acme", "turn_id": format!("t-{}", rand_hex(3)),
                   "group": {"secrets": [{"name": "GH_TOKEN", "hosts": ["api.test"]}],
                             "network": "allowlist", "egress_allowlist": ["api.test"]}}),
        )
        .await;
    assert_eq!(s, 403, "{v}");
    assert!(v["message"].as_str().unwrap().contains("secrets"), "{v}");
    let (s, _) = api.delete(&rig.operator, "/v1/secrets/GH_TOKEN").await;
    assert_eq!(s, 204);
    let (s, v) = api.delete(&rig.operator, "/v1/secrets/GH_TOKEN").await;
    assert_eq!((s, v["error"].as_str()), (404, Some("not_found")));
}
