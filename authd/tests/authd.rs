//! authd end to end: a real authd on a loopback port with a temporary data dir, driven over
//! HTTP, its tokens checked by the same `Verifier` every daemon uses (fetching the JWKS and
//! polling the revocation list over HTTP).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use hako_authd::config::ServiceKeys;
use hako_authd::{Config, Running};
use hako_client::authd::AuthdClient;
use hako_shared::auth::wire::{AuditList, MintRequest, RevokedList};
use hako_shared::auth::{
    AGENT_SCOPES, AuthError, Claims, ClientError, DEFAULT_ISSUER, Jwks, JwsError, Principal,
    SERVICE_GRANTS, Signer, TokenType, Verifier, VerifierConfig, jws, now_secs, scopes,
    service_grants,
};
use hako_shared::config::Env;
use hako_shared::testing::eventually;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

const RUNED_KEY: &str = "runed-key-0123456789abcdef";
const ROUTD_KEY: &str = "routd-key-0123456789abcdef";
const OPERATOR_KEY: &str = "operator-key-0123456789abcdef";
const CHANNEL_KEY: &str = "channel-test-key-0123456789";

fn service_keys(raw: &str) -> ServiceKeys {
    ServiceKeys::parse(raw).expect("test service keys parse")
}

fn config(dir: &Path) -> Config {
    Config {
        data_dir: dir.to_owned(),
        listen_addr: "127.0.0.1:0".parse().expect("addr"),
        service_keys: service_keys(&format!(
            "runed={RUNED_KEY},routd={ROUTD_KEY},operator={OPERATOR_KEY},channel={CHANNEL_KEY}"
        )),
        issuer: DEFAULT_ISSUER.into(),
        service_token_ttl: Duration::from_secs(600),
        max_token_ttl: Duration::from_secs(300),
        clock_skew: Duration::from_secs(5),
        audit_retention: Duration::from_secs(86_400),
        serve: Default::default(),
    }
}

/// One authd with its data dir and clients.
struct Authd {
    running: Option<Running>,
    dir: PathBuf,
    url: String,
    client: AuthdClient,
    http: reqwest::Client,
    _tmp: Option<tempfile::TempDir>,
}

impl Authd {
    async fn start(cfg: Config) -> Self {
        let dir = cfg.data_dir.clone();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind loopback");
        let running = hako_authd::start(cfg, listener)
            .await
            .expect("authd starts");
        let url = running.url();
        Self {
            client: AuthdClient::with_timeout(&url, Duration::from_secs(5)).expect("client"),
            http: reqwest::Client::builder()
                .no_proxy()
                .timeout(Duration::from_secs(5))
                .build()
                .expect("reqwest"),
            running: Some(running),
            dir,
            url,
            _tmp: None,
        }
    }

    /// A fresh authd in a fresh temporary directory, `tweak` applied to the default config.
    async fn new_with(tweak: impl FnOnce(&mut Config)) -> Self {
        let tmp = tempfile::tempdir().expect("tempdir");
        let data = tmp.path().join("data");
        let mut cfg = config(&data);
        tweak(&mut cfg);
        let mut a = Self::start(cfg).await;
        a._tmp = Some(tmp);
        a
    }

    async fn new() -> Self {
        Self::new_with(|_| {}).await
    }

    async fn stop(&mut self) {
        if let Some(r) = self.running.take() {
            r.shutdown().await.expect("clean shutdown");
        }
    }

    async fn service(&self, daemon: &str, key: &str) -> String {
        self.client
            .service_token(daemon, key)
            .await
            .unwrap_or_else(|e| panic!("service token for {daemon}: {e}"))
            .token
    }

    async fn runed(&self) -> String {
        self.service("runed", RUNED_KEY).await
    }

    async fn routd(&self) -> String {
        self.service("routd", ROUTD_KEY).await
    }

    async fn operator(&self) -> String {
        self.service("operator", OPERATOR_KEY).await
    }

    /// A remote verifier of this authd with quick timings.
    fn verifier(&self, tweak: impl FnOnce(&mut VerifierConfig)) -> Verifier {
        let mut cfg = VerifierConfig {
            leeway: Duration::from_secs(5),
            revoked_poll: Duration::from_millis(100),
            min_refetch_interval: Duration::from_millis(100),
            http_timeout: Duration::from_secs(2),
            ..VerifierConfig::remote(&self.url)
        };
        tweak(&mut cfg);
        Verifier::new(cfg).expect("verifier")
    }

    /// Raw request; answers status and JSON body (Null when the body is not JSON).
    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        bearer: Option<&str>,
        body: Option<(&str, &[u8])>,
    ) -> (u16, Value) {
        let mut req = self.http.request(method, format!("{}{path}", self.url));
        if let Some(b) = bearer {
            req = req.bearer_auth(b);
        }
        if let Some((ctype, bytes)) = body {
            req = req.header("content-type", ctype).body(bytes.to_vec());
        }
        let resp = req.send().await.expect("request reaches authd");
        let status = resp.status().as_u16();
        let ct = resp
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let bytes = resp.bytes().await.expect("body");
        // The strict client's rule: every error answer is the envelope.
        if let Err(why) = hako_shared::testing::check_envelope(status, ct.as_deref(), &bytes) {
            panic!("{path}: not the error envelope: {why}");
        }
        (
            status,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        )
    }

    async fn post_json(&self, path: &str, bearer: Option<&str>, body: &Value) -> (u16, Value) {
        let bytes = serde_json::to_vec(body).expect("json");
        self.call(
            reqwest::Method::POST,
            path,
            bearer,
            Some(("application/json", &bytes)),
        )
        .await
    }

    async fn jwks(&self) -> Jwks {
        self.client.jwks().await.expect("jwks")
    }

    async fn metric(&self, series: &str) -> u64 {
        let text = self
            .http
            .get(format!("{}/metrics", self.url))
            .send()
            .await
            .expect("metrics")
            .text()
            .await
            .expect("metrics text");
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or(0)
    }

    async fn audit(&self, token: &str) -> AuditList {
        self.client
            .audit(token, Some(1000), None)
            .await
            .expect("audit")
    }

    /// The active signing key, read from authd.db the way an attacker with the file would.
    fn stolen_signer(&self) -> Signer {
        let db = rusqlite::Connection::open(self.dir.join("authd.db")).expect("open authd.db");
        let secret: Vec<u8> = db
            .query_row(
                "SELECT secret FROM keys WHERE drop_after IS NULL",
                [],
                |r| r.get(0),
            )
            .expect("active key");
        Signer::from_secret(&secret.try_into().expect("32 bytes"))
    }
}

fn kid_of(token: &str) -> String {
    jws::parse(token).expect("parse").kid().to_owned()
}

fn claims_of(token: &str) -> Claims {
    let payload = token.split('.').nth(1).expect("payload");
    serde_json::from_slice(&B64.decode(payload).expect("b64")).expect("claims")
}

fn mint_req(scope: &[&str]) -> MintRequest {
    MintRequest {
        scope: scope.iter().map(|s| (*s).to_owned()).collect(),
        ..MintRequest::default()
    }
}

fn spawn_req(folder: &str, run: &str, egress: &[&str]) -> MintRequest {
    MintRequest {
        folder: Some(folder.into()),
        run_id: Some(run.into()),
        turn_id: Some(format!("{run}-turn")),
        egress: egress.iter().map(|s| (*s).to_owned()).collect(),
        ..mint_req(AGENT_SCOPES)
    }
}

fn api_code(e: &ClientError) -> (u16, &str) {
    (e.status().unwrap_or(0), e.code().unwrap_or("<no code>"))
}

async fn wait_until<F, Fut>(what: &str, limit: Duration, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    eventually(what, limit, || {
        let check = f();
        async move { if check.await { Ok(()) } else { Err("not yet") } }
    })
    .await
}

#[tokio::test]
async fn jwks_round_trip() {
    let a = Authd::new().await;
    let jwks = a.jwks().await;
    assert_eq!(jwks.keys.len(), 1, "one active key on a new database");
    let jwk = &jwks.keys[0];
    assert_eq!(
        (jwk.kty.as_str(), jwk.crv.as_str(), jwk.alg.as_deref()),
        ("OKP", "Ed25519", Some("EdDSA"))
    );
    let key = jwk.to_key().expect("the JWK is a usable Ed25519 key");

    let token = a.runed().await;
    assert_eq!(kid_of(&token), jwk.kid, "tokens name the published key");
    // Verifiable with nothing but the published key...
    let c: Claims = jws::verify(&token, &key).expect("verifies with the JWKS key");
    assert_eq!(c.sub, "runed");
    // ...and by the daemons' verifier, which fetches the JWKS itself.
    let v = a.verifier(|_| {});
    assert_eq!(*v.verify(&token).await.expect("verifier accepts"), c);
    assert_eq!(v.kids(), vec![jwk.kid.clone()]);
}

#[tokio::test]
async fn service_key_exchange() {
    let a = Authd::new().await;
    let now = now_secs();
    for (daemon, key) in [
        ("runed", RUNED_KEY),
        ("routd", ROUTD_KEY),
        ("operator", OPERATOR_KEY),
        ("channel", CHANNEL_KEY),
    ] {
        let r = a.client.service_token(daemon, key).await.expect("exchange");
        let want: Vec<String> = service_grants(daemon)
            .expect("in the table")
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
        assert_eq!(r.scope, want, "{daemon} gets exactly its grants");
        let c = a.verifier(|_| {}).verify(&r.token).await.expect("valid");
        assert_eq!(
            (c.sub.as_str(), c.typ, &c.scope, c.folder.as_deref()),
            (daemon, TokenType::Service, &want, None)
        );
        assert_eq!(c.jti, r.jti);
        assert_eq!(c.exp, r.expires_at);
        assert!(
            (c.exp - now - 600).abs() <= 2,
            "lives AUTHD_SERVICE_TOKEN_TTL"
        );
    }
    // Every table entry is what the tests above asked for: production grants, not test ones.
    assert_eq!(SERVICE_GRANTS.len(), 4);

    // Wrong key, a key of another daemon, unknown daemon, no key, a daemon in the grants
    // table that this install did not configure: one and the same 401.
    let body = |d: &str| json!({ "daemon": d });
    let cases: Vec<(Value, Option<&str>)> = vec![
        (body("runed"), Some("runed-key-0123456789abcdeX")),
        (body("runed"), Some(ROUTD_KEY)),
        (body("nobody"), Some(RUNED_KEY)),
        (body("runed"), None),
        (body(""), Some(RUNED_KEY)),
    ];
    let mut answers = Vec::new();
    for (b, key) in &cases {
        answers.push(a.post_json("/v1/service-token", *key, b).await);
    }
    let b = Authd::new_with(|c| c.service_keys = service_keys(&format!("runed={RUNED_KEY}"))).await;
    answers.push(
        b.post_json("/v1/service-token", Some(OPERATOR_KEY), &body("operator"))
            .await,
    );
    for (i, (status, v)) in answers.iter().enumerate() {
        assert_eq!(*status, 401, "case {i}: {v}");
        assert_eq!(v, &answers[0].1, "case {i}: same answer for every failure");
    }
    assert_eq!(answers[0].1["error"], "invalid_service_key");

    // Malformed body: a JSON envelope, not a token.
    let (s, v) = a
        .post_json("/v1/service-token", Some(RUNED_KEY), &json!({"daemon": 1}))
        .await;
    assert_eq!((s, v["error"].as_str()), (400, Some("invalid_json")));
}

#[tokio::test]
async fn empty_or_malformed_service_keys_refuse_to_start() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = tmp.path().join("d");
    let data_s = data.to_str().expect("utf-8 path");
    for raw in [
        "runed=",
        "runed",
        "runed=short",
        "runed=has whitespace in it 0123456",
        "ghost=0123456789abcdef0123",
        "runed=0123456789abcdef0123,runed=0123456789abcdef0124",
        ",",
    ] {
        let e = Config::from_env(&Env::from_pairs([
            ("DATA_DIR", data_s),
            ("AUTHD_SERVICE_KEYS", raw),
        ]))
        .expect_err(raw)
        .to_string();
        assert!(e.contains("AUTHD_SERVICE_KEYS"), "{raw:?}: {e}");
    }
    // The binary itself: exit status 2, a message naming the variable, never the key, and no
    // database created.
    for raw in ["", "runed=", "runed=short-canary-x"] {
        let out = tokio::time::timeout(
            Duration::from_secs(20),
            tokio::process::Command::new(env!("CARGO_BIN_EXE_authd"))
                .env_clear()
                .env("DATA_DIR", data_s)
                .env("LISTEN_ADDR", "127.0.0.1:0")
                .env("AUTHD_SERVICE_KEYS", raw)
                .kill_on_drop(true)
                .output(),
        )
        .await
        .expect("authd exits promptly")
        .expect("authd runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{raw:?}: {stderr}");
        assert!(stderr.contains("AUTHD_SERVICE_KEYS"), "{raw:?}: {stderr}");
        assert!(!stderr.contains("short-canary"), "echoes the key: {stderr}");
        assert!(!data.join("authd.db").exists());
    }
}

#[tokio::test]
async fn downscope_within_and_beyond_the_parent() {
    let a = Authd::new().await;
    let v = a.verifier(|_| {});
    let routd = a.routd().await;
    let routd_c = v.verify(&routd).await.expect("routd token");

    // Within: a folder-bound, read-only, one-minute child.
    let r = a
        .client
        .mint(
            &routd,
            &MintRequest {
                folder: Some("acme".into()),
                ttl_seconds: Some(60),
                ..mint_req(&[scopes::RUNS_READ, scopes::SESSIONS_READ])
            },
        )
        .await
        .expect("within the parent");
    let child = r.token;
    let c = v.verify(&child).await.expect("child verifies");
    assert_eq!(c.sub, "routd");
    assert_eq!(c.typ, TokenType::User);
    assert_eq!(c.parent_jti.as_deref(), Some(routd_c.jti.as_str()));
    assert_eq!(c.folder.as_deref(), Some("acme"));
    assert_eq!(c.scope, vec!["runs:read", "sessions:read"]);
    assert_eq!(c.exp - c.iat, 60);
    assert_eq!((c.jti.as_str(), c.exp), (r.jti.as_str(), r.expires_at));
    assert!(c.has_scope(scopes::RUNS_READ) && !c.has_scope(scopes::RUNS_RUN));
    assert!(c.covers_folder("acme/support") && !c.covers_folder("acmex"));

    // Default lifetime: capped by AUTHD_MAX_TOKEN_TTL (300 s) under the parent's 600 s.
    let d = a
        .client
        .mint(&routd, &mint_req(&[scopes::RUNS_READ]))
        .await
        .expect("default ttl");
    let dc = claims_of(&d.token);
    assert_eq!(dc.exp - dc.iat, 300);
    assert_eq!(
        dc.folder, None,
        "an unbound parent's child stays unbound by default"
    );

    // A sub-folder of the parent's folder is fine; the child inherits the folder by default.
    let sub = a
        .client
        .mint(
            &child,
            &MintRequest {
                folder: Some("acme/support".into()),
                ..mint_req(&[scopes::RUNS_READ])
            },
        )
        .await
        .expect("sub-folder");
    assert_eq!(
        claims_of(&sub.token).folder.as_deref(),
        Some("acme/support")
    );
    let inherit = a
        .client
        .mint(&child, &mint_req(&[scopes::RUNS_READ]))
        .await
        .expect("inherit");
    let ic = claims_of(&inherit.token);
    assert_eq!(ic.folder.as_deref(), Some("acme"));
    assert!(ic.exp <= c.exp, "never outlives the parent");

    // Beyond: each denial with its code.
    let cases: Vec<(&str, &str, MintRequest, u16, &str)> = vec![
        (
            "scope",
            "routd",
            mint_req(&["groups:read"]),
            403,
            "scope_exceeds_parent",
        ),
        (
            "verb wildcard",
            "routd",
            mint_req(&["runs:*"]),
            403,
            "scope_exceeds_parent",
        ),
        (
            "dropped scope",
            "child",
            mint_req(&[scopes::RUNS_RUN]),
            403,
            "scope_exceeds_parent",
        ),
        ("bare star", "routd", mint_req(&["*"]), 400, "invalid_scope"),
        ("no scope", "routd", mint_req(&[]), 400, "invalid_scope"),
        (
            "sibling folder",
            "child",
            MintRequest {
                folder: Some("other".into()),
                ..mint_req(&[scopes::RUNS_READ])
            },
            403,
            "folder_outside_parent",
        ),
        (
            "prefix folder",
            "child",
            MintRequest {
                folder: Some("acmex".into()),
                ..mint_req(&[scopes::RUNS_READ])
            },
            403,
            "folder_outside_parent",
        ),
        (
            "bad folder",
            "child",
            MintRequest {
                folder: Some("../acme".into()),
                ..mint_req(&[scopes::RUNS_READ])
            },
            400,
            "invalid_folder",
        ),
        (
            "longer than parent",
            "child",
            MintRequest {
                ttl_seconds: Some(61),
                ..mint_req(&[scopes::RUNS_READ])
            },
            403,
            "ttl_exceeds_parent",
        ),
        (
            "longer than maximum",
            "routd",
            MintRequest {
                ttl_seconds: Some(301),
                ..mint_req(&[scopes::RUNS_READ])
            },
            403,
            "ttl_exceeds_max",
        ),
        (
            "zero ttl",
            "routd",
            MintRequest {
                ttl_seconds: Some(0),
                ..mint_req(&[scopes::RUNS_READ])
            },
            400,
            "invalid_ttl",
        ),
        (
            "service typ",
            "routd",
            MintRequest {
                typ: Some(TokenType::Service),
                ..mint_req(&[scopes::RUNS_READ])
            },
            400,
            "invalid_request",
        ),
    ];
    for (what, parent, req, status, code) in &cases {
        let parent = if *parent == "routd" { &routd } else { &child };
        let e = a.client.mint(parent, req).await.expect_err(what);
        assert_eq!(api_code(&e), (*status, *code), "{what}: {e}");
    }

    // Every 403 is in the audit log with its code; 400s are malformed requests, not denials.
    let op = a.operator().await;
    let audit = a.audit(&op).await;
    for (what, _, _, status, code) in &cases {
        if *status == 403 {
            assert!(
                audit
                    .entries
                    .iter()
                    .any(|e| e.action == "mint" && e.outcome == *code),
                "{what}: no audit row for {code}"
            );
        }
    }
    let minted_ok = audit
        .entries
        .iter()
        .filter(|e| e.action == "mint" && e.outcome == "ok" && e.actor == "routd")
        .count();
    assert_eq!(minted_ok, 4);
}

/// An audit row names the request it was written for: a daemon minting for a request of its
/// own sends that request's id (`AuthdClient` carries it), and authd's row carries it, for a
/// mint and for a refused one alike.
#[tokio::test]
async fn audit_rows_name_the_request_that_minted() {
    let a = Authd::new().await;
    let routd = a.routd().await;
    hako_shared::http::with_request_id(
        Arc::from("req-mint-1"),
        a.client.mint(&routd, &mint_req(&[scopes::RUNS_READ])),
    )
    .await
    .expect("minted");
    let too_long = MintRequest {
        ttl_seconds: Some(301),
        ..mint_req(&[scopes::RUNS_READ])
    };
    hako_shared::http::with_request_id(Arc::from("req-mint-2"), a.client.mint(&routd, &too_long))
        .await
        .expect_err("beyond the maximum");
    let op = a.operator().await;
    let audit = a.audit(&op).await;
    let row = |id: &str| {
        audit
            .entries
            .iter()
            .find(|e| e.request_id.as_deref() == Some(id))
            .unwrap_or_else(|| panic!("no row of {id}: {:?}", audit.entries))
            .clone()
    };
    let minted = row("req-mint-1");
    assert_eq!(
        (minted.action.as_str(), minted.outcome.as_str()),
        ("mint", "ok")
    );
    let refused = row("req-mint-2");
    assert_eq!(
        (refused.action.as_str(), refused.outcome.as_str()),
        ("mint", "ttl_exceeds_max")
    );
}

#[tokio::test]
async fn a_parent_within_the_skew_window_past_expiry_cannot_mint() {
    let a = Authd::new_with(|c| {
        c.service_token_ttl = Duration::from_secs(1);
        c.clock_skew = Duration::from_secs(30);
    })
    .await;
    let routd = a.routd().await;
    let exp = claims_of(&routd).exp;
    wait_until("the token to expire", Duration::from_secs(5), || async {
        now_secs() >= exp
    })
    .await;
    // Still inside the verifiers' leeway...
    assert!(a.verifier(|_| {}).verify(&routd).await.is_ok());
    // ...but no longer good for minting.
    let e = a
        .client
        .mint(&routd, &mint_req(&[scopes::RUNS_READ]))
        .await
        .expect_err("expired parent");
    assert_eq!(api_code(&e), (401, "parent_expired"));
}

#[tokio::test]
async fn chains_of_downscopes_and_revocation() {
    let a = Authd::new().await;
    let v = a.verifier(|_| {});
    let runed = a.runed().await;
    let runed_c = v.verify(&runed).await.expect("runed");

    // Brokered secrets: runed chooses them, its token carries them as asked (canonical), a
    // spawn child keeps or drops entries, never changes one; a token over what verifiers
    // read is not minted.
    let gh = hako_shared::secrets::SecretClaim {
        name: hako_shared::secrets::SecretName::parse("GH_TOKEN").unwrap(),
        hosts: vec!["API.example.com".into()],
        placeholder: hako_shared::secrets::Placeholder::random().unwrap(),
    };
    let with_secret = a
        .client
        .mint(
            &runed,
            &MintRequest {
                secrets: vec![gh.clone()],
                ..spawn_req("acme/support", "run-s", &["api.example.com", "pypi.org"])
            },
        )
        .await
        .expect("a spawn token with a secret");
    let c = v.verify(&with_secret.token).await.expect("it verifies");
    assert_eq!(c.secrets.len(), 1);
    assert_eq!(c.secrets[0].hosts, vec!["api.example.com"]);
    assert_eq!(c.secrets[0].placeholder, gh.placeholder);
    let changed = hako_shared::secrets::SecretClaim {
        hosts: vec!["pypi.org".into()],
        ..gh.clone()
    };
    let e = a
        .client
        .mint(
            &with_secret.token,
            &MintRequest {
                secrets: vec![changed],
                ..spawn_req("acme/support", "run-s", &["api.example.com", "pypi.org"])
            },
        )
        .await
        .unwrap_err();
    assert_eq!(api_code(&e), (403, "secrets_exceed_parent"));
    let huge: Vec<String> = (0..64)
        .map(|i| {
            let label = "h".repeat(60);
            format!("{label}.{label}.{label}-{i}.example.com")
        })
        .collect();
    let huge: Vec<&str> = huge.iter().map(String::as_str).collect();
    let e = a
        .client
        .mint(&runed, &spawn_req("acme/support", "run-h", &huge))
        .await
        .unwrap_err();
    assert_eq!(api_code(&e), (400, "invalid_request"));

    // runed → spawn token for one run → narrower token for the same run → narrower still.
    let spawn = a
        .client
        .mint(
            &runed,
            &spawn_req("acme/support", "run-1", &["API.example.com", "pypi.org"]),
        )
        .await
        .expect("spawn token");
    let s1 = v.verify(&spawn.token).await.expect("spawn verifies");
    assert_eq!(s1.typ, TokenType::Spawn);
    assert_eq!(s1.sub, "runed");
    assert_eq!(s1.run_id.as_deref(), Some("run-1"));
    assert_eq!(s1.turn_id.as_deref(), Some("run-1-turn"));
    assert_eq!(s1.egress, vec!["api.example.com", "pypi.org"]);
    assert_eq!(s1.parent_jti.as_deref(), Some(runed_c.jti.as_str()));

    let mid = a
        .client
        .mint(
            &spawn.token,
            &MintRequest {
                scope: vec![scopes::LLM_CALL.into(), scopes::EGRESS_CONNECT.into()],
                folder: Some("acme/support/sub".into()),
                ttl_seconds: Some(120),
                ..spawn_req("acme/support/sub", "run-1", &["pypi.org"])
            },
        )
        .await
        .expect("narrower spawn token");
    let s2 = v.verify(&mid.token).await.expect("mid verifies");
    assert_eq!(s2.parent_jti.as_deref(), Some(s1.jti.as_str()));
    assert_eq!(s2.egress, vec!["pypi.org"]);
    assert_eq!(s2.folder.as_deref(), Some("acme/support/sub"));

    let leaf = a
        .client
        .mint(
            &mid.token,
            &MintRequest {
                scope: vec![scopes::LLM_CALL.into()],
                ttl_seconds: Some(60),
                ..spawn_req("acme/support/sub", "run-1", &[])
            },
        )
        .await
        .expect("leaf");
    let s3 = v.verify(&leaf.token).await.expect("leaf verifies");
    assert_eq!(s3.parent_jti.as_deref(), Some(s2.jti.as_str()));
    assert_eq!(s3.sub, "runed");

    // Deep in the chain nothing widens again.
    for (what, req, code) in [
        (
            "scope dropped upstream",
            MintRequest {
                scope: vec![scopes::TURNS_ACT.into()],
                ..spawn_req("acme/support/sub", "run-1", &[])
            },
            "scope_exceeds_parent",
        ),
        (
            "egress dropped upstream",
            spawn_req("acme/support/sub", "run-1", &["api.example.com"]),
            "egress_exceeds_parent",
        ),
        (
            "another run",
            spawn_req("acme/support/sub", "run-2", &[]),
            "run_outside_parent",
        ),
        (
            "a wider folder",
            spawn_req("acme/support", "run-1", &[]),
            "folder_outside_parent",
        ),
        (
            "a user token",
            MintRequest {
                typ: Some(TokenType::User),
                ..mint_req(&[scopes::LLM_CALL])
            },
            "typ_exceeds_parent",
        ),
        (
            "a longer life",
            MintRequest {
                ttl_seconds: Some(121),
                ..spawn_req("acme/support/sub", "run-1", &[])
            },
            "ttl_exceeds_parent",
        ),
    ] {
        let mut req = req;
        if req.scope.len() == AGENT_SCOPES.len() {
            req.scope = vec![scopes::LLM_CALL.into()];
        }
        let e = a.client.mint(&mid.token, &req).await.expect_err(what);
        assert_eq!(api_code(&e).1, code, "{what}: {e}");
        assert_eq!(api_code(&e).0, 403, "{what}: {e}");
    }

    // A sibling spawn token (same subject, another run) may not revoke; the chain's root may.
    let sibling = a
        .client
        .mint(&runed, &spawn_req("acme/support", "run-2", &[]))
        .await
        .expect("sibling");
    let e = a
        .client
        .revoke(&sibling.token, &mid.jti)
        .await
        .expect_err("sibling");
    assert_eq!(api_code(&e), (403, "not_token_issuer"));
    // The grandparent (the spawn token) revokes the middle; the leaf goes with it.
    let r = a
        .client
        .revoke(&spawn.token, &mid.jti)
        .await
        .expect("revoke");
    let mut revoked = r.revoked.clone();
    revoked.sort();
    let mut want = vec![s2.jti.clone(), s3.jti.clone()];
    want.sort();
    assert_eq!(revoked, want);
    // authd itself refuses them at once, as bearer and for minting.
    let e = a
        .client
        .mint(&leaf.token, &mint_req(&[scopes::LLM_CALL]))
        .await
        .expect_err("revoked leaf");
    assert_eq!(api_code(&e), (401, "token_revoked"));
    // The spawn token above them is untouched.
    assert!(
        a.client
            .mint(
                &spawn.token,
                &MintRequest {
                    scope: vec![scopes::LLM_CALL.into()],
                    ..spawn_req("acme/support", "run-1", &[])
                }
            )
            .await
            .is_ok()
    );
    let list: RevokedList = a.client.revoked().await.expect("revoked list");
    for j in &want {
        assert!(list.revoked.iter().any(|e| &e.jti == j), "{j} listed");
    }
    assert!(!list.revoked.iter().any(|e| e.jti == s1.jti));
}

#[tokio::test]
async fn revocation_is_seen_by_a_polling_verifier() {
    let a = Authd::new().await;
    let v = a.verifier(|c| c.revoked_poll = Duration::from_millis(200));
    let routd = a.routd().await;
    let child = a
        .client
        .mint(&routd, &mint_req(&[scopes::RUNS_READ]))
        .await
        .expect("child");
    assert!(v.verify(&child.token).await.is_ok(), "valid before");
    assert!(v.verify(&child.token).await.is_ok(), "valid again (cached)");

    // Someone unrelated may not revoke it; the operator (tokens:revoke) may revoke anything,
    // the issuer may revoke its child.
    let runed = a.runed().await;
    let e = a
        .client
        .revoke(&runed, &child.jti)
        .await
        .expect_err("unrelated");
    assert_eq!(api_code(&e), (403, "not_token_issuer"));
    let e = a
        .client
        .revoke(&routd, "no-such-jti")
        .await
        .expect_err("unknown");
    assert_eq!(api_code(&e).0, 404);
    a.client
        .revoke(&routd, &child.jti)
        .await
        .expect("issuer revokes");

    // The verifier learns it from its own polling, without being told.
    wait_until(
        "the verifier to see the revocation",
        Duration::from_secs(5),
        || {
            let v = v.clone();
            let t = child.token.clone();
            async move { v.verify(&t).await == Err(AuthError::Revoked) }
        },
    )
    .await;
    // The parent is not revoked.
    assert!(v.verify(&routd).await.is_ok());

    let op = a.operator().await;
    let other = a
        .client
        .mint(&routd, &mint_req(&[scopes::RUNS_READ]))
        .await
        .expect("another child");
    let r = a
        .client
        .revoke(&op, &other.jti)
        .await
        .expect("operator revokes");
    assert_eq!(r.revoked, vec![other.jti.clone()]);
    // A fresh verifier learns the list on its first poll.
    let fresh = a.verifier(|_| {});
    fresh.refresh_revoked().await.expect("poll");
    assert_eq!(fresh.verify(&other.token).await, Err(AuthError::Revoked));
}

#[tokio::test]
async fn rotation_keeps_old_tokens_valid_until_the_window_closes() {
    // Token lifetimes of 5 s and a 1 s skew: the old key verifies for 6 s after rotation.
    let a = Authd::new_with(|c| {
        c.service_token_ttl = Duration::from_secs(5);
        c.max_token_ttl = Duration::from_secs(5);
        c.clock_skew = Duration::from_secs(1);
    })
    .await;
    let v = a.verifier(|c| {
        c.leeway = Duration::from_secs(1);
        c.jwks_ttl = Duration::from_millis(300);
    });
    let old = a.runed().await;
    let op = a.operator().await;
    let old_kid = kid_of(&old);
    assert!(v.verify(&old).await.is_ok());

    // Rotation needs keys:rotate.
    let routd = a.routd().await;
    let e = a
        .client
        .rotate(&routd)
        .await
        .expect_err("routd cannot rotate");
    assert_eq!(api_code(&e), (403, "insufficient_scope"));
    let r = a.client.rotate(&op).await.expect("rotate");
    assert_eq!(r.previous_kid, old_kid);
    assert_ne!(r.kid, old_kid);
    let window = r.previous_drops_at - now_secs();
    assert!((1..=6).contains(&window), "window {window}s");

    let mut kids: Vec<String> = a.jwks().await.keys.into_iter().map(|k| k.kid).collect();
    kids.sort();
    let mut want = vec![old_kid.clone(), r.kid.clone()];
    want.sort();
    assert_eq!(kids, want, "JWKS holds the active and the retiring key");

    // New tokens use the new key and verify at once (an unknown kid triggers a refetch).
    let new = a.runed().await;
    assert_eq!(kid_of(&new), r.kid);
    assert!(v.verify(&new).await.is_ok());
    // The old token still works, at the verifier and at authd.
    assert!(v.verify(&old).await.is_ok());
    a.client
        .mint(
            &old,
            &MintRequest {
                ttl_seconds: Some(1),
                ..mint_req(&[scopes::LLM_CALL])
            },
        )
        .await
        .expect("old-key token still mints");

    // Once the window closes, the old key leaves the JWKS and verifies nothing.
    let drop_at = r.previous_drops_at;
    wait_until("the window to close", Duration::from_secs(10), || async {
        now_secs() >= drop_at
    })
    .await;
    let kids: Vec<String> = a.jwks().await.keys.into_iter().map(|k| k.kid).collect();
    assert_eq!(kids, vec![r.kid.clone()]);
    tokio::time::sleep(Duration::from_millis(400)).await; // past the verifier's JWKS TTL
    let fresh_new = a.runed().await;
    assert!(v.verify(&fresh_new).await.is_ok());
    assert!(v.verify(&old).await.is_err(), "old token after the window");
    assert!(!v.kids().contains(&old_kid), "verifier dropped the old key");
    let (s, _) = a
        .post_json("/v1/tokens", Some(&old), &json!({"scope": ["llm:call"]}))
        .await;
    assert_eq!(s, 401);
}

/// HMAC-SHA256, for forging an HS256 token keyed with the public key.
fn hmac_sha256(key: &[u8], msg: &[u8]) -> [u8; 32] {
    let mut k = [0u8; 64];
    if key.len() > 64 {
        k[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        k[..key.len()].copy_from_slice(key);
    }
    let mut inner = Sha256::new();
    inner.update(k.map(|b| b ^ 0x36));
    inner.update(msg);
    let mut outer = Sha256::new();
    outer.update(k.map(|b| b ^ 0x5c));
    outer.update(inner.finalize());
    outer.finalize().into()
}

fn b64j(v: &Value) -> String {
    B64.encode(serde_json::to_vec(v).expect("json"))
}

#[tokio::test]
async fn forged_tokens_are_rejected_by_authd_and_the_verifier() {
    let a = Authd::new().await;
    let v = a.verifier(|c| c.leeway = Duration::from_secs(5));
    let real = a.stolen_signer();
    let kid = real.kid().to_owned();
    let now = now_secs();
    let claims = |exp: i64, nbf: i64| Claims {
        iss: DEFAULT_ISSUER.into(),
        sub: "operator".into(),
        typ: TokenType::Service,
        scope: vec!["keys:rotate".into(), "runs:*".into()],
        folder: None,
        jti: format!("forged-{exp}-{nbf}"),
        iat: now,
        nbf,
        exp,
        run_id: None,
        turn_id: None,
        parent_jti: None,
        egress: vec![],
        secrets: vec![],
    };
    let good = claims(now + 300, now);
    let payload = b64j(&serde_json::to_value(&good).expect("claims"));

    // Control: the real key with sane claims passes both, so the checks below can fail.
    let control = real.sign(&good).expect("sign");
    assert!(v.verify(&control).await.is_ok());
    let (s, _) = a
        .post_json(
            "/v1/tokens",
            Some(&control),
            &json!({"scope": ["runs:read"]}),
        )
        .await;
    assert_eq!(s, 200);

    let mut forged: Vec<(&str, String)> = Vec::new();
    // Another key, under its own kid and under the real kid.
    let other = Signer::generate().expect("key");
    forged.push(("wrong key", other.sign(&good).expect("sign")));
    let h = b64j(&json!({"alg": "EdDSA", "typ": "JWT", "kid": kid}));
    let input = format!("{h}.{payload}");
    let sig = {
        use ed25519_dalek::Signer as _;
        let k = ed25519_dalek::SigningKey::from_bytes(&other.secret_bytes());
        B64.encode(k.sign(input.as_bytes()).to_bytes())
    };
    forged.push(("wrong key, real kid", format!("{input}.{sig}")));
    // alg none, with and without a signature segment.
    let h = b64j(&json!({"alg": "none", "typ": "JWT", "kid": kid}));
    forged.push(("alg none", format!("{h}.{payload}.")));
    forged.push((
        "alg none, junk sig",
        format!("{h}.{payload}.{}", B64.encode([0u8; 64])),
    ));
    // HS256 keyed with the public key, in each form an attacker might try.
    let jwk = &a.jwks().await.keys[0];
    let public_raw = real.verifying_key().to_bytes();
    let jwk_json = serde_json::to_vec(jwk).expect("jwk");
    for (what, secret) in [
        ("HS256 / raw public key", &public_raw[..]),
        ("HS256 / x", jwk.x.as_bytes()),
        ("HS256 / JWK JSON", &jwk_json[..]),
    ] {
        let h = b64j(&json!({"alg": "HS256", "typ": "JWT", "kid": kid}));
        let input = format!("{h}.{payload}");
        let mac = hmac_sha256(secret, input.as_bytes());
        forged.push((what, format!("{input}.{}", B64.encode(mac))));
    }
    let h = b64j(&json!({"alg": "RS256", "typ": "JWT", "kid": kid}));
    forged.push(("RS256", format!("{h}.{payload}.{}", B64.encode([7u8; 256]))));
    // Genuinely signed by the real key, refused by the envelope alone: no kid, a crit
    // header, more than the size cap.
    let signed_by_real = |header: &Value, claims: &Value| {
        use ed25519_dalek::Signer as _;
        let k = ed25519_dalek::SigningKey::from_bytes(&real.secret_bytes());
        let input = format!("{}.{}", b64j(header), b64j(claims));
        let sig = B64.encode(k.sign(input.as_bytes()).to_bytes());
        format!("{input}.{sig}")
    };
    let good_json = serde_json::to_value(&good).expect("claims");
    forged.push((
        "missing kid",
        signed_by_real(&json!({"alg": "EdDSA", "typ": "JWT"}), &good_json),
    ));
    forged.push((
        "crit",
        signed_by_real(
            &json!({"alg": "EdDSA", "typ": "JWT", "kid": kid, "crit": ["exp"]}),
            &good_json,
        ),
    ));
    let mut big = good_json.clone();
    big["scope"] = json!(vec!["runs:read"; 1000]);
    forged.push((
        "oversized",
        signed_by_real(&json!({"alg": "EdDSA", "typ": "JWT", "kid": kid}), &big),
    ));
    // The control for the three: the same hand-built signing passes with a sane header.
    assert!(
        v.verify(&signed_by_real(
            &json!({"alg": "EdDSA", "typ": "JWT", "kid": kid}),
            &good_json
        ))
        .await
        .is_ok()
    );
    // A real token with a widened payload.
    let runed = a.runed().await;
    let mut parts = runed.split('.');
    let (rh, rp, rs) = (
        parts.next().expect("h"),
        parts.next().expect("p"),
        parts.next().expect("s"),
    );
    let mut widened: Value = serde_json::from_slice(&B64.decode(rp).expect("b64")).expect("json");
    widened["scope"] = json!(["keys:rotate", "tokens:revoke"]);
    forged.push(("tampered payload", format!("{rh}.{}.{rs}", b64j(&widened))));
    // A flipped signature bit.
    let mut sig = B64.decode(rs).expect("b64");
    sig[10] ^= 1;
    forged.push((
        "tampered signature",
        format!("{rh}.{rp}.{}", B64.encode(sig)),
    ));
    // The real key, outside the time window (well past the 5 s leeway).
    forged.push((
        "expired",
        real.sign(&claims(now - 60, now - 600)).expect("sign"),
    ));
    forged.push((
        "not yet valid",
        real.sign(&claims(now + 600, now + 60)).expect("sign"),
    ));
    let mut future_iat = claims(now + 600, now);
    future_iat.iat = now + 60;
    forged.push((
        "issued in the future",
        real.sign(&future_iat).expect("sign"),
    ));
    let mut foreign = good.clone();
    foreign.iss = "someone-else".into();
    forged.push(("foreign issuer", real.sign(&foreign).expect("sign")));

    let before = a.metric("authd_denials_total{action=\"mint\"}").await;
    for (what, token) in &forged {
        let verdict = v.verify(token).await;
        assert!(verdict.is_err(), "{what}: the verifier accepted it");
        let (s, body) = a
            .post_json("/v1/tokens", Some(token), &json!({"scope": ["runs:read"]}))
            .await;
        assert_eq!(s, 401, "{what}: authd answered {s} {body}");
        assert!(body["error"].is_string(), "{what}: {body}");
        let (s, _) = a
            .call(reqwest::Method::POST, "/v1/keys/rotate", Some(token), None)
            .await;
        assert_eq!(s, 401, "{what}: rotate");
    }
    let named = |n: &str| forged.iter().find(|(w, _)| *w == n).expect(n).1.clone();
    assert_eq!(v.verify(&named("expired")).await, Err(AuthError::Expired));
    assert_eq!(
        v.verify(&named("not yet valid")).await,
        Err(AuthError::NotYetValid)
    );
    assert_eq!(
        v.verify(&named("tampered payload")).await,
        Err(AuthError::BadSignature)
    );
    assert_eq!(
        v.verify(&named("wrong key")).await,
        Err(AuthError::UnknownKey)
    );
    for (what, want) in [
        ("alg none", JwsError::Alg("none".into())),
        ("HS256 / raw public key", JwsError::Alg("HS256".into())),
        ("RS256", JwsError::Alg("RS256".into())),
        ("missing kid", JwsError::MissingKid),
        ("crit", JwsError::Header("crit is not supported".into())),
        ("oversized", JwsError::TooLong),
    ] {
        assert_eq!(
            v.verify(&named(what)).await,
            Err(AuthError::Malformed(want)),
            "{what}"
        );
    }
    assert_eq!(
        v.verify(&named("tampered signature")).await,
        Err(AuthError::BadSignature)
    );
    assert_eq!(
        v.verify(&named("foreign issuer")).await,
        Err(AuthError::WrongIssuer)
    );
    let after = a.metric("authd_denials_total{action=\"mint\"}").await;
    assert_eq!(
        after - before,
        forged.len() as u64,
        "every forgery is a recorded denial"
    );
}

#[tokio::test]
async fn restart_keeps_keys_and_revocations() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = tmp.path().join("data");
    let mut a = Authd::start(config(&data)).await;
    let kid = a.jwks().await.keys[0].kid.clone();
    let routd = a.routd().await;
    let child = a
        .client
        .mint(&routd, &mint_req(&[scopes::RUNS_READ]))
        .await
        .expect("child");
    let doomed = a
        .client
        .mint(&routd, &mint_req(&[scopes::RUNS_READ]))
        .await
        .expect("doomed");
    a.client.revoke(&routd, &doomed.jti).await.expect("revoke");
    let old_url = a.url.clone();
    a.stop().await;

    // The secrets never become readable by others.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &Path| std::fs::metadata(p).expect("stat").permissions().mode() & 0o777;
        assert_eq!(mode(&data), 0o700);
        assert_eq!(mode(&data.join("authd.db")), 0o600);
    }

    let b = Authd::start(config(&data)).await;
    assert_ne!(b.url, old_url);
    let kids: Vec<String> = b.jwks().await.keys.into_iter().map(|k| k.kid).collect();
    assert_eq!(kids, vec![kid], "same key after restart");
    let v = b.verifier(|_| {});
    assert!(v.verify(&routd).await.is_ok(), "old token verifies");
    assert!(v.verify(&child.token).await.is_ok());
    b.client
        .mint(&routd, &mint_req(&[scopes::RUNS_READ]))
        .await
        .expect("an old token still mints at the new authd");
    // The revocation survived too, at authd and at the verifier.
    let e = b
        .client
        .mint(&doomed.token, &mint_req(&[scopes::RUNS_READ]))
        .await
        .expect_err("revoked before restart");
    assert_eq!(api_code(&e), (401, "token_revoked"));
    v.refresh_revoked().await.expect("poll");
    assert_eq!(v.verify(&doomed.token).await, Err(AuthError::Revoked));
}

#[tokio::test]
async fn audit_log_records_everything_and_no_secret() {
    const CANARY: &str = "CANARY-runed-secret-9f8e7d6c5b4a";
    const WRONG: &str = "CANARY-wrong-secret-1a2b3c4d5e6f";
    let mut a = Authd::new_with(|c| {
        c.service_keys = service_keys(&format!("runed={CANARY},operator={OPERATOR_KEY}"));
    })
    .await;
    let runed = a.service("runed", CANARY).await;
    let (s, _) = a
        .post_json(
            "/v1/service-token",
            Some(WRONG),
            &json!({"daemon": "runed"}),
        )
        .await;
    assert_eq!(s, 401);
    // A client that put its key in the daemon field.
    let (s, _) = a
        .post_json(
            "/v1/service-token",
            Some(CANARY),
            &json!({"daemon": CANARY}),
        )
        .await;
    assert_eq!(s, 401);
    let spawn = a
        .client
        .mint(&runed, &spawn_req("acme", "run-9", &["pypi.org"]))
        .await
        .expect("mint");
    let e = a
        .client
        .mint(&runed, &mint_req(&["runs:kill"]))
        .await
        .expect_err("beyond");
    assert_eq!(api_code(&e), (403, "scope_exceeds_parent"));
    // A denial whose request carries a token in a free-text field.
    let _ = a
        .client
        .mint(
            &spawn.token,
            &MintRequest {
                folder: Some(runed.clone()),
                ..mint_req(&[&runed])
            },
        )
        .await
        .expect_err("garbage");
    let (s, _) = a
        .post_json(
            "/v1/tokens",
            Some("not.a.token"),
            &json!({"scope": ["llm:call"]}),
        )
        .await;
    assert_eq!(s, 401);
    a.client.revoke(&runed, &spawn.jti).await.expect("revoke");

    // audit:read is required.
    let e = a
        .client
        .audit(&runed, None, None)
        .await
        .expect_err("no scope");
    assert_eq!(api_code(&e), (403, "insufficient_scope"));
    let op = a.operator().await;
    a.client.rotate(&op).await.expect("rotate");
    let audit = a.audit(&op).await;
    let has = |action: &str, outcome: &str, actor: &str| {
        audit
            .entries
            .iter()
            .any(|e| e.action == action && e.outcome == outcome && e.actor == actor && e.at > 0)
    };
    assert!(has("key_created", "ok", "authd"));
    assert!(has("service_token", "ok", "runed"));
    assert!(has("service_token", "invalid_service_key", "runed"));
    assert!(has("service_token", "invalid_service_key", "unknown"));
    assert!(has("mint", "ok", "runed"));
    assert!(has("mint", "scope_exceeds_parent", "runed"));
    assert!(has("mint", "invalid_token", "anonymous"));
    assert!(has("revoke", "ok", "runed"));
    assert!(has("audit_read", "insufficient_scope", "runed"));
    assert!(has("rotate", "ok", "operator"));
    let ok_mint = audit
        .entries
        .iter()
        .find(|e| e.action == "mint" && e.outcome == "ok")
        .expect("mint row");
    assert!(ok_mint.detail.contains(&spawn.jti), "{}", ok_mint.detail);
    assert!(
        ok_mint.detail.contains("run_id=run-9"),
        "{}",
        ok_mint.detail
    );
    // Paging: newest first, `before` continues.
    let page = a.client.audit(&op, Some(2), None).await.expect("page");
    assert_eq!(page.entries.len(), 2);
    assert!(page.entries[0].id > page.entries[1].id);
    let next = a
        .client
        .audit(&op, Some(2), page.next_before)
        .await
        .expect("page 2");
    assert!(next.entries[0].id < page.entries[1].id);

    // Neither the audit answer nor the database files hold a secret or a token.
    let signature = |t: &str| t.rsplit('.').next().expect("sig").to_owned();
    let secrets = [
        CANARY.to_owned(),
        WRONG.to_owned(),
        OPERATOR_KEY.to_owned(),
        signature(&runed),
        signature(&spawn.token),
        signature(&op),
    ];
    let text = serde_json::to_string(&audit).expect("json");
    a.stop().await;
    let mut files = vec![text.into_bytes()];
    for suffix in ["authd.db", "authd.db-wal"] {
        if let Ok(bytes) = std::fs::read(a.dir.join(suffix)) {
            files.push(bytes);
        }
    }
    assert!(files.len() >= 2, "the database was read");
    for bytes in &files {
        for s in &secrets {
            assert!(
                !bytes.windows(s.len()).any(|w| w == s.as_bytes()),
                "found {s:.12}… in the audit answer or authd.db"
            );
        }
    }
}

#[tokio::test]
async fn http_conventions() {
    let a = Authd::new().await;
    let routd = a.routd().await;
    // Malformed JSON, wrong types, unknown fields: 400 envelopes.
    for body in [
        &b"{"[..],
        b"[]",
        b"{\"scope\": \"runs:read\"}",
        b"{\"scope\":[],\"x\":1}",
    ] {
        let (s, v) = a
            .call(
                reqwest::Method::POST,
                "/v1/tokens",
                Some(&routd),
                Some(("application/json", body)),
            )
            .await;
        assert_eq!((s, v["error"].as_str()), (400, Some("invalid_json")), "{v}");
        assert!(v["message"].is_string());
    }
    // Oversized: 413 envelope, for both JSON routes.
    let big = format!("{{\"scope\":[\"{}\"]}}", "a".repeat(100 * 1024));
    for path in ["/v1/tokens", "/v1/service-token"] {
        let (s, v) = a
            .call(
                reqwest::Method::POST,
                path,
                Some(&routd),
                Some(("application/json", big.as_bytes())),
            )
            .await;
        assert_eq!(
            (s, v["error"].as_str()),
            (413, Some("body_too_large")),
            "{path}: {v}"
        );
    }
    let (s, v) = a
        .call(
            reqwest::Method::POST,
            "/v1/tokens",
            Some(&routd),
            Some(("text/plain", b"{}")),
        )
        .await;
    assert_eq!(
        (s, v["error"].as_str()),
        (415, Some("unsupported_media_type"))
    );
    // No token: 401 envelope; unknown route: 404; wrong method: 405.
    let (s, v) = a
        .post_json("/v1/tokens", None, &json!({"scope": ["runs:read"]}))
        .await;
    assert_eq!((s, v["error"].as_str()), (401, Some("missing_token")));
    let (s, v) = a.call(reqwest::Method::GET, "/v1/nope", None, None).await;
    assert_eq!((s, v["error"].as_str()), (404, Some("not_found")));
    let (s, v) = a.call(reqwest::Method::GET, "/v1/tokens", None, None).await;
    assert_eq!((s, v["error"].as_str()), (405, Some("method_not_allowed")));
    let (s, v) = a
        .call(
            reqwest::Method::GET,
            "/v1/audit?limit=0",
            Some(&routd),
            None,
        )
        .await;
    assert_eq!(s, 403, "scope is checked before the query: {v}");
    let op = a.operator().await;
    let (s, v) = a
        .call(reqwest::Method::GET, "/v1/audit?limit=0", Some(&op), None)
        .await;
    assert_eq!((s, v["error"].as_str()), (400, Some("invalid_query")));

    // Ops routes.
    let (s, v) = a.call(reqwest::Method::GET, "/health", None, None).await;
    assert_eq!((s, v["status"].as_str()), (200, Some("ok")));
    let (s, v) = a.call(reqwest::Method::GET, "/ready", None, None).await;
    assert_eq!((s, v["status"].as_str()), (200, Some("ready")));
    assert!(a.metric("authd_tokens_issued_total{typ=\"service\"}").await >= 2);
    assert!(a.metric("authd_jwks_served_total").await == 0);
    a.jwks().await;
    assert_eq!(a.metric("authd_jwks_served_total").await, 1);

    // The served document is the generated one, and it is the committed one. (That every
    // documented operation is served is `every_route_answers_errors_as_envelopes`; that
    // nothing is served outside it, the lib's `the_openapi_document_is_generated_and_committed`.)
    let (s, doc) = a
        .call(reqwest::Method::GET, "/openapi.json", None, None)
        .await;
    assert_eq!(s, 200);
    assert_eq!(
        doc,
        serde_json::to_value(hako_authd::openapi()).expect("doc")
    );
    let committed: Value = serde_json::from_str(hako_authd::OPENAPI).expect("committed doc");
    assert_eq!(doc, committed);
}

#[tokio::test]
async fn unknown_kid_refetches_are_rate_limited() {
    const INTERVAL: Duration = Duration::from_millis(700);
    let a = Authd::new().await;
    let v = a.verifier(|c| {
        c.min_refetch_interval = INTERVAL;
        c.jwks_ttl = Duration::from_secs(600);
    });
    let runed = a.runed().await;
    assert!(v.verify(&runed).await.is_ok());
    let base = a.metric("authd_jwks_served_total").await;
    assert_eq!(base, 1, "one fetch for the first token");

    let now = now_secs();
    let bogus = |i: usize| {
        let h = b64j(&json!({"alg": "EdDSA", "typ": "JWT", "kid": format!("bogus-{i}")}));
        let p = b64j(
            &json!({"iss": DEFAULT_ISSUER, "sub": "x", "typ": "service", "jti": "j",
            "iat": now, "nbf": now, "exp": now + 60}),
        );
        format!("{h}.{p}.{}", B64.encode([1u8; 64]))
    };
    // A concurrent flood of 300 bogus kids shares one fetch.
    let started = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..300 {
        let v = v.clone();
        let t = bogus(i);
        tasks.push(tokio::spawn(async move { v.verify(&t).await }));
    }
    for t in tasks {
        assert_eq!(t.await.expect("join"), Err(AuthError::UnknownKey));
    }
    assert_eq!(a.metric("authd_jwks_served_total").await - base, 1);
    assert!(
        started.elapsed() < INTERVAL * 3,
        "the flood is not served one by one"
    );

    // A sequential flood: at most one fetch per interval.
    let started = Instant::now();
    let before = a.metric("authd_jwks_served_total").await;
    let mut n = 0;
    while started.elapsed() < INTERVAL * 3 {
        assert_eq!(v.verify(&bogus(1000 + n)).await, Err(AuthError::UnknownKey));
        n += 1;
    }
    let fetched = a.metric("authd_jwks_served_total").await - before;
    let allowed = (started.elapsed().as_millis() / INTERVAL.as_millis()) as u64 + 1;
    assert!(
        fetched <= allowed,
        "{fetched} fetches for {n} bogus kids, allowed {allowed}"
    );
    // Known keys keep verifying throughout, without fetching.
    let before = a.metric("authd_jwks_served_total").await;
    for _ in 0..20 {
        assert!(v.verify(&runed).await.is_ok());
    }
    assert_eq!(a.metric("authd_jwks_served_total").await, before);
}

/// A cold verifier (a daemon just started) given a burst of valid tokens fetches the JWKS once,
/// and no caller waits out the refetch interval: callers that arrived while the first fetch
/// was in flight used to take it for an earlier one, and waited the interval for a second
/// (runed's first burst after a start stalled 5 s on 32 of 40 runs).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cold_burst_shares_the_first_fetch() {
    const INTERVAL: Duration = Duration::from_secs(20);
    let a = Authd::new().await;
    let runed = a.runed().await;
    for round in 0..3 {
        let v = a.verifier(|c| {
            c.min_refetch_interval = INTERVAL;
            c.jwks_ttl = Duration::from_secs(600);
        });
        let before = a.metric("authd_jwks_served_total").await;
        let started = Instant::now();
        let mut tasks = Vec::new();
        for _ in 0..100 {
            let (v, t) = (v.clone(), runed.clone());
            tasks.push(tokio::spawn(async move { v.verify(&t).await.map(|_| ()) }));
        }
        for t in tasks {
            assert_eq!(t.await.expect("join"), Ok(()), "round {round}");
        }
        assert!(
            started.elapsed() < INTERVAL,
            "round {round}: a caller waited out the refetch interval"
        );
        assert_eq!(
            a.metric("authd_jwks_served_total").await - before,
            1,
            "round {round}: one fetch"
        );
    }
}

/// Collects formatted log lines.
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Logs {
    type Writer = Logs;
    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

#[tokio::test(flavor = "current_thread")]
async fn open_dev_mode_only_when_asked_for() {
    let logs = Logs::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(logs.clone())
        .with_ansi(false)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    // Without the explicit switch an unset AUTHD_URL is refused, never open.
    let env = Env::from_pairs([("AUTHD_ISSUER", "hako-authd")]);
    let e = VerifierConfig::from_env(&env).unwrap_err().to_string();
    assert!(e.contains("AUTHD_URL is required"), "{e}");
    let env = Env::from_pairs([("AUTHD_ISSUER", "hako-authd"), ("HAKO_OPEN_DEV", "1")]);
    let mut cfg = VerifierConfig::from_env(&env).expect("config");
    assert_eq!(cfg.authd_url, None);
    cfg.open_warn_interval = Duration::from_millis(100);
    let v = Verifier::new(cfg).expect("verifier");
    assert!(v.is_open());

    // Every request passes, whatever it carries.
    let mut headers = axum::http::HeaderMap::new();
    let p = Principal::from_headers(&v, &headers)
        .await
        .expect("no token");
    assert!(p.is_open() && p.has_scope(scopes::KEYS_ROTATE) && p.covers_folder("any/folder"));
    headers.insert("authorization", "Bearer forged".parse().expect("header"));
    assert!(
        Principal::from_headers(&v, &headers)
            .await
            .expect("garbage")
            .is_open()
    );

    // It says so at start and keeps saying so on a timer.
    let warnings = || {
        let text =
            String::from_utf8_lossy(&logs.0.lock().unwrap_or_else(|p| p.into_inner())).into_owned();
        text.lines()
            .filter(|l| l.contains("WARN") && l.contains("UNAUTHENTICATED"))
            .count()
    };
    assert!(warnings() >= 1, "no warning at start");
    wait_until("repeated warnings", Duration::from_secs(5), || async {
        warnings() >= 3
    })
    .await;

    // With AUTHD_URL set, the same code verifies for real.
    let cfg = VerifierConfig::from_env(&Env::from_pairs([("AUTHD_URL", "http://127.0.0.1:9")]))
        .expect("config");
    let v = Verifier::new(cfg).expect("verifier");
    assert!(!v.is_open());
    assert!(Principal::from_headers(&v, &headers).await.is_err());
}

/// The real `authd` binary on `data`, on a free loopback port; killed when dropped.
struct AuthdProcess {
    child: std::process::Child,
    url: String,
}

impl AuthdProcess {
    async fn spawn(data: &Path) -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .expect("free port")
            .local_addr()
            .expect("addr")
            .port();
        // Its log goes to a file beside the data dir, shown if it does not come up.
        let log = data.with_file_name(format!("authd-{port}.log"));
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_authd"))
            .env_clear()
            .env("DATA_DIR", data)
            .env("LISTEN_ADDR", format!("127.0.0.1:{port}"))
            .env("AUTHD_SERVICE_KEYS", format!("runed={RUNED_KEY}"))
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("authd starts");
        let url = format!("http://127.0.0.1:{port}");
        let http = reqwest::Client::new();
        let ready = format!("{url}/ready");
        eventually(
            &format!("authd up on {url}"),
            Duration::from_secs(20),
            || async {
                let answer = match http.get(&ready).send().await {
                    Ok(r) if r.status().is_success() => return Ok(()),
                    Ok(r) => r.status().to_string(),
                    Err(e) => e.to_string(),
                };
                // Its log says why it is not up: read at each miss, the last read is shown.
                let said = std::fs::read_to_string(&log).unwrap_or_default();
                Err(format!("{answer}; its log: {said}"))
            },
        )
        .await;
        Self { child, url }
    }
}

impl Drop for AuthdProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// SIGKILL in the middle of a stream of mints: every token a client was handed is on disk
/// (its `issued_tokens` row and its audit row), the database is intact, and the restarted
/// authd still trusts the old keys and the old service token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_under_load_loses_no_token_that_was_handed_out() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = tmp.path().join("data");
    let mut first = AuthdProcess::spawn(&data).await;
    let client = AuthdClient::new(&first.url).expect("client");
    let runed = client
        .service_token("runed", RUNED_KEY)
        .await
        .expect("service token")
        .token;

    // Eight clients mint as fast as they can, each recording the jtis it was answered with.
    let handed_out: Arc<Mutex<Vec<String>>> = Arc::default();
    let mut load = Vec::new();
    for i in 0..8 {
        let (client, runed, handed_out) = (client.clone(), runed.clone(), handed_out.clone());
        load.push(tokio::spawn(async move {
            let req = spawn_req("acme/support", &format!("run-{i}"), &["pypi.org"]);
            while let Ok(m) = client.mint(&runed, &req).await {
                handed_out.lock().expect("lock").push(m.jti);
            }
        }));
    }
    eventually("300 tokens handed out", Duration::from_secs(30), || async {
        let n = handed_out.lock().expect("lock").len();
        if n >= 300 { Ok(()) } else { Err(n) }
    })
    .await;
    first.child.kill().expect("SIGKILL");
    first.child.wait().expect("reaped");
    for t in load {
        tokio::time::timeout(Duration::from_secs(30), t)
            .await
            .expect("clients see the connection drop")
            .expect("client task");
    }
    let handed_out = std::mem::take(&mut *handed_out.lock().expect("lock"));
    assert!(handed_out.len() >= 300);

    // Read the files as the killed process left them (SQLite recovers from the WAL).
    {
        let db = rusqlite::Connection::open(data.join("authd.db")).expect("open authd.db");
        let check: String = db
            .query_row("PRAGMA integrity_check", [], |r| r.get(0))
            .expect("integrity_check");
        assert_eq!(check, "ok");
        let mut issued = db
            .prepare("SELECT count(*) FROM issued_tokens WHERE jti = ?1")
            .expect("prepare");
        let mut audited = db
            .prepare(
                "SELECT count(*) FROM audit_log WHERE action = 'mint' AND outcome = 'ok' \
                 AND detail LIKE 'jti=' || ?1 || ' %'",
            )
            .expect("prepare");
        for jti in &handed_out {
            let n: i64 = issued.query_row([jti], |r| r.get(0)).expect("query");
            assert_eq!(n, 1, "token {jti} was handed out but its row is lost");
            let n: i64 = audited.query_row([jti], |r| r.get(0)).expect("query");
            assert_eq!(n, 1, "token {jti} was handed out but its audit row is lost");
        }
    }

    let second = AuthdProcess::spawn(&data).await;
    let client = AuthdClient::new(&second.url).expect("client");
    let child = client
        .mint(&runed, &spawn_req("acme/support", "run-after", &[]))
        .await
        .expect("the old service token mints after the crash");
    let v = Verifier::new(VerifierConfig::remote(&second.url)).expect("verifier");
    assert!(v.verify(&child.token).await.is_ok());
    assert!(v.verify(&runed).await.is_ok(), "same keys after the crash");
}

/// Every error any route gives is the envelope: the strict client sends every kind of bad
/// input to every operation of authd's OpenAPI document; and the audit query is decoded, not
/// split by hand.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_answers_errors_as_envelopes() {
    let a = Authd::new().await;
    let op = a.operator().await;
    let api = hako_shared::testing::ApiClient::new(a.url.clone());
    let sent = api.sweep_errors(hako_authd::OPENAPI, &op).await;
    assert!(sent > 20, "{sent}");
    // raw on purpose: malformed, unknown and percent-encoded queries as they are sent.
    for (q, code) in [
        ("limit=x", 400),
        ("limit=0", 400),
        ("bogus=1", 400),
        ("limit=%35", 200),
    ] {
        let (s, v) = api.get(&op, &format!("/v1/audit?{q}")).await;
        assert_eq!(s, code, "{q}: {v}");
    }
    let (_, v) = api.get(&op, "/v1/audit?limit=%32").await;
    assert_eq!(
        v["entries"].as_array().unwrap().len(),
        2,
        "limit=%32 is 2, percent-decoded"
    );
}

/// schemathesis (an independent API tester) generates requests from authd's served document,
/// valid and invalid, and finds no answer the document does not describe: no 5xx, only
/// documented statuses and shapes, bad input and bad tokens refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schemathesis_finds_no_answer_the_document_does_not_describe() {
    let a = Authd::new().await;
    let op = a.operator().await;
    let url = a.url.clone();
    tokio::task::spawn_blocking(move || {
        hako_shared::testing::schemathesis(&url, &op, "examples,coverage,fuzzing,stateful")
    })
    .await
    .expect("schemathesis");
}

/// The committed OpenAPI document passes an independent validator (openapi-spec-validator).
#[test]
fn the_openapi_document_validates() {
    assert_eq!(
        hako_shared::testing::validate_openapi(hako_authd::OPENAPI),
        "3.1.0"
    );
}

/// A revoked token stays refused after its `exp` for as long as verifiers' leeway would
/// accept it (it was valid again between `exp` and `exp` + leeway: authd's list dropped it
/// at `exp`, and verifiers replaced their set with the list).
#[tokio::test]
async fn a_revoked_token_stays_refused_through_the_leeway() {
    let a = Authd::new().await;
    let v = a.verifier(|c| {
        c.leeway = Duration::from_secs(30);
        c.revoked_poll = Duration::from_millis(100);
    });
    let routd = a.routd().await;
    let mut req = mint_req(&[scopes::RUNS_READ]);
    req.ttl_seconds = Some(1);
    let child = a.client.mint(&routd, &req).await.expect("child");
    assert!(v.verify(&child.token).await.is_ok());
    a.client.revoke(&routd, &child.jti).await.expect("revoked");
    v.refresh_revoked().await.expect("list");
    assert!(
        v.verify(&child.token).await.is_err(),
        "refused once revoked"
    );
    // Past its exp (still inside the leeway), after fresh polls of the list.
    eventually(
        "the token's exp passing",
        Duration::from_secs(10),
        || async {
            let now = now_secs();
            if now > child.expires_at {
                Ok(())
            } else {
                Err(now)
            }
        },
    )
    .await;
    v.refresh_revoked().await.expect("list");
    let fresh = a.verifier(|c| c.leeway = Duration::from_secs(30));
    fresh.refresh_revoked().await.expect("list");
    for (who, verifier) in [
        ("the polling verifier", &v),
        ("a verifier started now", &fresh),
    ] {
        match verifier.verify(&child.token).await {
            Err(e) => assert_eq!(e.code(), "token_revoked", "{who}: {e}"),
            Ok(_) => panic!("{who} took a revoked token inside the leeway"),
        }
    }
}

/// A folder-bound token's `tokens:revoke` and `audit:read` stop at its folder: it cannot
/// revoke a daemon's service token or another folder's token, nor read authd's audit, which
/// spans every folder (a token bound to `acme` revoked routd's service token and read it all).
#[tokio::test]
async fn a_folder_bound_token_stays_in_its_folder_on_authds_own_scopes() {
    let a = Authd::new().await;
    let op = a.operator().await;
    let routd = a.client.service_token("routd", ROUTD_KEY).await.unwrap();
    let bound = |folder: &str, scope: &[&str]| MintRequest {
        folder: Some(folder.into()),
        ..mint_req(scope)
    };
    let acme = a
        .client
        .mint(
            &op,
            &bound("acme", &[scopes::TOKENS_REVOKE, scopes::AUDIT_READ]),
        )
        .await
        .expect("acme's token");
    let beta = a
        .client
        .mint(&op, &bound("beta", &[scopes::RUNS_READ]))
        .await
        .unwrap();
    let acme_sub = a
        .client
        .mint(&op, &bound("acme/bots", &[scopes::RUNS_READ]))
        .await
        .unwrap();
    let routd_jti = a
        .verifier(|_| {})
        .verify(&routd.token)
        .await
        .unwrap()
        .jti
        .clone();
    for (what, jti) in [("routd's service token", routd_jti), ("beta's", beta.jti)] {
        let e = a.client.revoke(&acme.token, &jti).await.expect_err(what);
        assert_eq!(api_code(&e), (403, "not_token_issuer"), "{what}");
    }
    a.client
        .revoke(&acme.token, &acme_sub.jti)
        .await
        .expect("a token of its own folder");
    let (s, v) = a
        .call(reqwest::Method::GET, "/v1/audit", Some(&acme.token), None)
        .await;
    assert_eq!(
        (s, v["error"].as_str()),
        (403, Some("folder_forbidden")),
        "{v}"
    );
    let (s, _) = a
        .call(reqwest::Method::GET, "/v1/audit", Some(&op), None)
        .await;
    assert_eq!(s, 200);
}
