//! authd's tokens against an independent JWT implementation: PyJWT (with `cryptography` for
//! Ed25519), installed by `.ci/conformance-venv`, which this test runs itself so that it works
//! on a fresh machine. A real authd on a loopback port mints tokens; PyJWT verifies them with
//! nothing but the JWKS fetched from `GET /v1/keys` over HTTP, and the claims must round-trip.
//! The other way: tokens PyJWT signs are accepted by hako's verifier only when signed with
//! authd's own key; with a key authd does not know, or forged as HS256 keyed with the public
//! key, or `alg: none`, they are refused, by the verifier and by authd itself.

use std::path::Path;
use std::time::Duration;

use hako_authd::config::ServiceKeys;
use hako_authd::{Config, Running};
use hako_client::authd::AuthdClient;
use hako_shared::auth::wire::MintRequest;
use hako_shared::auth::{
    AGENT_SCOPES, AuthError, DEFAULT_ISSUER, JwsError, TokenType, Verifier, VerifierConfig, scopes,
};
use serde_json::{Value, json};

const RUNED_KEY: &str = "runed-key-0123456789abcdef";
const OPERATOR_KEY: &str = "operator-key-0123456789abcdef";

use hako_shared::testing::{conformance_python, run_python as python};

/// Verifies each token with PyJWT against the JWKS, exactly as a third party would: the key
/// is picked by the header's kid from the set, `EdDSA` is the only algorithm allowed, and
/// every time claim, the issuer, `sub` and `jti` are required. Also reports whether PyJWT
/// refuses a token whose payload was altered.
const PYJWT_VERIFY: &str = r#"
import json, sys, jwt
from jwt.exceptions import InvalidSignatureError

inp = json.load(sys.stdin)
jwks = jwt.PyJWKSet.from_dict(inp["jwks"])
def verify(token):
    kid = jwt.get_unverified_header(token)["kid"]
    [key] = [k for k in jwks.keys if k.key_id == kid]
    assert key.algorithm_name == "EdDSA", key.algorithm_name
    return jwt.decode(token, key.key, algorithms=["EdDSA"], issuer=inp["issuer"],
        options={"require": ["exp", "iat", "nbf", "iss", "sub", "jti"]})
out = {"claims": [verify(t) for t in inp["tokens"]]}
try:
    verify(inp["tampered"])
    out["tampered"] = "accepted"
except InvalidSignatureError:
    out["tampered"] = "refused"
print(json.dumps(out))
"#;

/// Signs `claims` with PyJWT: with authd's own key (its seed, read from authd.db), with a
/// fresh Ed25519 key under authd's kid and under its own, as HS256 keyed with the public key
/// (raw bytes and the JWK's `x` text), and as `alg: none`.
const PYJWT_SIGN: &str = r#"
import json, sys, base64, jwt
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

inp = json.load(sys.stdin)
claims, kid, x = inp["claims"], inp["kid"], inp["x"]
authd_key = Ed25519PrivateKey.from_private_bytes(bytes.fromhex(inp["seed_hex"]))
foreign = Ed25519PrivateKey.generate()
raw_public = base64.urlsafe_b64decode(x + "=" * (-len(x) % 4))
def hs256(secret):
    return jwt.encode(claims, secret, algorithm="HS256", headers={"kid": kid})
print(json.dumps({
    "authd_key": jwt.encode(claims, authd_key, algorithm="EdDSA", headers={"kid": kid}),
    "foreign_key_authd_kid": jwt.encode(claims, foreign, algorithm="EdDSA", headers={"kid": kid}),
    "foreign_key_own_kid": jwt.encode(claims, foreign, algorithm="EdDSA",
                                      headers={"kid": "pyjwt-" + kid[:8]}),
    "hs256_raw_public_key": hs256(raw_public),
    "hs256_x": hs256(x.encode()),
    "none": jwt.encode(claims, None, algorithm="none", headers={"kid": kid}),
}))
"#;

async fn start_authd(dir: &Path) -> Running {
    let cfg = Config {
        data_dir: dir.join("data"),
        listen_addr: "127.0.0.1:0".parse().expect("addr"),
        service_keys: ServiceKeys::parse(&format!("runed={RUNED_KEY},operator={OPERATOR_KEY}"))
            .expect("service keys"),
        issuer: DEFAULT_ISSUER.into(),
        service_token_ttl: Duration::from_secs(600),
        max_token_ttl: Duration::from_secs(300),
        clock_skew: Duration::from_secs(5),
        audit_retention: Duration::from_secs(86_400),
        serve: Default::default(),
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind loopback");
    hako_authd::start(cfg, listener)
        .await
        .expect("authd starts")
}

/// The active key's seed, read from authd.db as an attacker holding the file would.
fn authd_seed(dir: &Path) -> Vec<u8> {
    let db = rusqlite::Connection::open(dir.join("data/authd.db")).expect("open authd.db");
    db.query_row(
        "SELECT secret FROM keys WHERE drop_after IS NULL",
        [],
        |r| r.get(0),
    )
    .expect("active key")
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[tokio::test]
async fn tokens_interoperate_with_pyjwt() {
    let py = conformance_python();
    let tmp = tempfile::tempdir().expect("tempdir");
    let running = start_authd(tmp.path()).await;
    let url = running.url();
    let client = AuthdClient::with_timeout(&url, Duration::from_secs(5)).expect("client");
    let http = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(5))
        .build()
        .expect("reqwest");

    // Tokens of every kind authd issues, with every optional claim.
    let runed = client
        .service_token("runed", RUNED_KEY)
        .await
        .expect("exchange")
        .token;
    let operator = client
        .service_token("operator", OPERATOR_KEY)
        .await
        .expect("exchange")
        .token;
    let spawn = client
        .mint(
            &runed,
            &MintRequest {
                scope: AGENT_SCOPES.iter().map(|s| (*s).to_owned()).collect(),
                folder: Some("acme/support".into()),
                run_id: Some("run-1".into()),
                turn_id: Some("turn-1".into()),
                egress: vec!["pypi.org".into(), "crates.io".into()],
                ttl_seconds: Some(120),
                ..MintRequest::default()
            },
        )
        .await
        .expect("spawn token")
        .token;
    let user = client
        .mint(
            &operator,
            &MintRequest {
                scope: vec![scopes::RUNS_READ.into()],
                folder: Some("acme".into()),
                typ: Some(TokenType::User),
                ..MintRequest::default()
            },
        )
        .await
        .expect("user token")
        .token;
    let tokens = [runed.clone(), operator, spawn, user];

    // The JWKS as a third party sees it: raw JSON over HTTP.
    let jwks: Value = http
        .get(format!("{url}/v1/keys"))
        .send()
        .await
        .expect("GET /v1/keys")
        .json()
        .await
        .expect("JWKS JSON");
    let kid = jwks["keys"][0]["kid"].as_str().expect("kid").to_owned();
    let x = jwks["keys"][0]["x"].as_str().expect("x").to_owned();

    let verifier = Verifier::new(VerifierConfig {
        leeway: Duration::from_secs(5),
        // The unknown kid below refetches the JWKS once, after this interval.
        min_refetch_interval: Duration::from_millis(100),
        http_timeout: Duration::from_secs(2),
        ..VerifierConfig::remote(&url)
    })
    .expect("verifier");

    // authd -> PyJWT: every token verifies, with the claims hako's verifier sees.
    let (h, rest) = runed.split_once('.').expect("header");
    let (_, sig) = rest.split_once('.').expect("payload");
    let mut widened =
        serde_json::to_value(&*verifier.verify(&runed).await.expect("valid")).expect("claims json");
    widened["scope"] = json!(["keys:rotate"]);
    let tampered = format!(
        "{h}.{}.{sig}",
        base64_url(&serde_json::to_vec(&widened).expect("json"))
    );
    let out = python(
        &py,
        PYJWT_VERIFY,
        &json!({"jwks": jwks, "tokens": tokens, "issuer": DEFAULT_ISSUER, "tampered": tampered}),
    );
    let from_pyjwt = out["claims"].as_array().expect("claims list");
    assert_eq!(from_pyjwt.len(), tokens.len());
    for (token, theirs) in tokens.iter().zip(from_pyjwt) {
        let ours = verifier.verify(token).await.expect("hako verifies");
        assert_eq!(
            theirs,
            &serde_json::to_value(&*ours).expect("claims json"),
            "PyJWT and hako decode the same claims"
        );
    }
    let spawn_claims = &from_pyjwt[2];
    assert_eq!(spawn_claims["typ"], "spawn");
    assert_eq!(spawn_claims["folder"], "acme/support");
    assert_eq!(spawn_claims["run_id"], "run-1");
    assert_eq!(spawn_claims["egress"], json!(["pypi.org", "crates.io"]));
    assert_eq!(from_pyjwt[3]["typ"], "user");
    assert_eq!(
        out["tampered"], "refused",
        "PyJWT refuses a tampered token too"
    );

    // PyJWT -> hako: signed with authd's own key, PyJWT's token is accepted (so the refusals
    // below are the key's and the algorithm's doing, not PyJWT's encoding)...
    let now = hako_shared::auth::now_secs();
    let claims = json!({
        "iss": DEFAULT_ISSUER, "sub": "operator", "typ": "service",
        "scope": ["keys:rotate", "tokens:revoke", "runs:*"], "jti": "pyjwt-forged-0000000001",
        "iat": now, "nbf": now, "exp": now + 120,
    });
    let signed = python(
        &py,
        PYJWT_SIGN,
        &json!({"claims": claims, "kid": kid, "x": x, "seed_hex": hex(&authd_seed(tmp.path()))}),
    );
    let token = |name: &str| signed[name].as_str().expect(name).to_owned();
    let accepted = verifier
        .verify(&token("authd_key"))
        .await
        .expect("a PyJWT token signed with authd's key verifies");
    assert_eq!(serde_json::to_value(&*accepted).expect("json"), claims);

    // ...and with anything else it is refused, by the verifier and by authd.
    let refused = [
        ("foreign_key_authd_kid", AuthError::BadSignature),
        ("foreign_key_own_kid", AuthError::UnknownKey),
        (
            "hs256_raw_public_key",
            AuthError::Malformed(JwsError::Alg("HS256".into())),
        ),
        (
            "hs256_x",
            AuthError::Malformed(JwsError::Alg("HS256".into())),
        ),
        ("none", AuthError::Malformed(JwsError::Alg("none".into()))),
    ];
    for (name, want) in refused {
        let forged = token(name);
        assert_eq!(verifier.verify(&forged).await, Err(want), "{name}");
        let status = http
            .post(format!("{url}/v1/tokens"))
            .bearer_auth(&forged)
            .json(&json!({"scope": ["runs:read"]}))
            .send()
            .await
            .expect("POST /v1/tokens")
            .status();
        assert_eq!(status.as_u16(), 401, "{name}: authd answered {status}");
    }
    running.shutdown().await.expect("clean shutdown");
}

fn base64_url(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}
