//! Test helpers for the daemons' integration tests (feature `testing`, dev-dependencies only).
//!
//! [`ApiClient`] is the strict test client: every answer with a 4xx or 5xx status must be the
//! JSON error envelope (`application/json`, exactly `{"error": "<snake_case code>",
//! "message": "<text>"}`), or the test fails right there, naming the request. So no route can
//! answer an error in another shape (axum's text/plain rejections, an empty 500) without a
//! test noticing. [`eventually`] is the one poller the suites wait with.

use std::time::Duration;

use serde_json::Value;

/// How often [`eventually`] looks again.
pub const POLL: Duration = Duration::from_millis(50);

/// The one poller of the test suites: calls `probe` until it answers `Ok(value)`, and
/// returns the value. Past `limit` the test fails, naming `what` and the last `Err` the probe
/// answered (what it saw instead). A probe looks at what the test claims (a row, a file, a
/// container, an answer), so a test waits exactly as long as the behaviour takes.
pub async fn eventually<T, E, F, Fut>(what: &str, limit: Duration, mut probe: F) -> T
where
    E: std::fmt::Debug,
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
{
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        match probe().await {
            Ok(v) => return v,
            Err(last) => assert!(
                tokio::time::Instant::now() < deadline,
                "{what}: not within {limit:?}; last seen: {last:?}"
            ),
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Checks an error answer against the envelope; `Ok` for any status below 400.
pub fn check_envelope(status: u16, content_type: Option<&str>, body: &[u8]) -> Result<(), String> {
    if status < 400 {
        return Ok(());
    }
    if content_type != Some("application/json") {
        return Err(format!(
            "{status} with content-type {content_type:?}, not application/json: {}",
            String::from_utf8_lossy(body)
        ));
    }
    let v: Value = serde_json::from_slice(body).map_err(|e| {
        format!(
            "{status} body is not JSON ({e}): {}",
            String::from_utf8_lossy(body)
        )
    })?;
    let obj = v
        .as_object()
        .ok_or_else(|| format!("{status} body is not an object: {v}"))?;
    let code = obj.get("error").and_then(Value::as_str).unwrap_or("");
    let snake = !code.is_empty()
        && code
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    if !snake {
        return Err(format!(
            "{status} error code {code:?} is not a snake_case code: {v}"
        ));
    }
    if !obj.get("message").is_some_and(Value::is_string) {
        return Err(format!("{status} has no message: {v}"));
    }
    if obj.len() != 2 {
        return Err(format!("{status} envelope has extra fields: {v}"));
    }
    Ok(())
}

/// An HTTP client that fails the test on any error answer that is not the envelope.
#[derive(Clone, Debug)]
pub struct ApiClient {
    http: reqwest::Client,
    base: String,
}

impl ApiClient {
    /// A client for the daemon at `base` (`http://127.0.0.1:port`); no proxy, 120 s timeout.
    pub fn new(base: impl Into<String>) -> Self {
        Self {
            http: reqwest::Client::builder()
                .no_proxy()
                .timeout(Duration::from_secs(120))
                .pool_idle_timeout(crate::http::CLIENT_POOL_IDLE)
                .build()
                .expect("http client"),
            base: base.into(),
        }
    }

    /// The base URL.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// Sends a request; returns the status and the body as JSON (`Null` when empty or not
    /// JSON, which is only allowed for successful answers).
    pub async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        token: Option<&str>,
        body: Option<&Value>,
    ) -> (u16, Value) {
        let mut req = self
            .http
            .request(method.clone(), format!("{}{path}", self.base));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        if let Some(b) = body {
            req = req.json(b);
        }
        let resp = req
            .send()
            .await
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
        let status = resp.status().as_u16();
        let ct = resp
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let bytes = resp.bytes().await.unwrap_or_default();
        if let Err(why) = check_envelope(status, ct.as_deref(), &bytes) {
            panic!("{method} {path}: not the error envelope: {why}");
        }
        (
            status,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        )
    }

    /// `GET`.
    pub async fn get(&self, token: &str, path: &str) -> (u16, Value) {
        self.call(reqwest::Method::GET, path, Some(token), None)
            .await
    }

    /// `POST` with a JSON body.
    pub async fn post(&self, token: &str, path: &str, body: Value) -> (u16, Value) {
        self.call(reqwest::Method::POST, path, Some(token), Some(&body))
            .await
    }

    /// `PUT` with a JSON body.
    pub async fn put(&self, token: &str, path: &str, body: Value) -> (u16, Value) {
        self.call(reqwest::Method::PUT, path, Some(token), Some(&body))
            .await
    }

    /// `DELETE`.
    pub async fn delete(&self, token: &str, path: &str) -> (u16, Value) {
        self.call(reqwest::Method::DELETE, path, Some(token), None)
            .await
    }

    /// Sends a raw body with a content type (malformed input); the answer must still be the
    /// envelope when it is an error.
    pub async fn raw(
        &self,
        method: reqwest::Method,
        path: &str,
        token: Option<&str>,
        content_type: &str,
        body: impl Into<reqwest::Body>,
    ) -> (u16, Value) {
        let mut req = self
            .http
            .request(method.clone(), format!("{}{path}", self.base))
            .header(reqwest::header::CONTENT_TYPE, content_type)
            .body(body);
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        let resp = req
            .send()
            .await
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
        let status = resp.status().as_u16();
        let ct = resp
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let bytes = resp.bytes().await.unwrap_or_default();
        if let Err(why) = check_envelope(status, ct.as_deref(), &bytes) {
            panic!("{method} {path}: not the error envelope: {why}");
        }
        (
            status,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        )
    }

    /// Sends every kind of bad input to every operation of an OpenAPI document (path
    /// parameters filled with `x`): no token, a forged token, `token` with a malformed query
    /// and, for methods with a body, malformed JSON, a wrong content type and a body of the
    /// wrong shape. Every answer that is an error must be the envelope (the client checks);
    /// a 5xx fails the sweep, and so does the router's 404/405 fallback (a documented
    /// operation that is not served). Returns how many requests were sent.
    pub async fn sweep_errors(&self, openapi: &str, token: &str) -> usize {
        let ops = crate::http::openapi_operations(openapi).expect("the OpenAPI document parses");
        let mut sent = 0;
        for (method, path) in ops {
            let path = fill_params(&path);
            let m = reqwest::Method::from_bytes(method.as_bytes()).expect("method");
            let mut answers = Vec::new();
            answers.push(self.call(m.clone(), &path, None, None).await);
            answers.push(self.call(m.clone(), &path, Some("not.a.token"), None).await);
            let q = format!("{path}?limit=x&wait=forever&before=%ZZ&bogus=1");
            answers.push(self.call(m.clone(), &q, Some(token), None).await);
            if m == reqwest::Method::POST || m == reqwest::Method::PUT {
                answers.push(
                    self.raw(
                        m.clone(),
                        &path,
                        Some(token),
                        "application/json",
                        "{not json",
                    )
                    .await,
                );
                answers.push(
                    self.raw(m.clone(), &path, Some(token), "text/plain", "{}")
                        .await,
                );
                answers.push(
                    self.call(m.clone(), &path, Some(token), Some(&Value::from(7)))
                        .await,
                );
            }
            for (status, body) in &answers {
                assert!(*status < 500, "{method} {path}: {status} {body}");
                // A documented operation is served: never the router's fallbacks.
                let fallback =
                    (*status == 404 && body["message"] == "no such route") || *status == 405;
                assert!(
                    !fallback,
                    "{method} {path} is documented but not served: {body}"
                );
            }
            sent += answers.len();
        }
        sent
    }
}

/// The repository's root (tests run from a crate directory one below it).
pub fn repo_root() -> std::path::PathBuf {
    let here = std::env::current_dir().expect("cwd");
    here.ancestors()
        .find(|d| d.join(".ci/conformance-venv").is_file())
        .unwrap_or_else(|| panic!("no .ci/conformance-venv above {}", here.display()))
        .to_owned()
}

/// The python of the conformance venv (independent implementations hako is checked
/// against: PyJWT, openapi-spec-validator, …): runs `.ci/conformance-venv`, which creates or
/// reuses it, so the tests work on a fresh machine too.
pub fn conformance_python() -> std::path::PathBuf {
    let root = repo_root();
    let out = std::process::Command::new(root.join(".ci/conformance-venv"))
        .current_dir(&root)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run .ci/conformance-venv");
    assert!(
        out.status.success(),
        ".ci/conformance-venv failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).expect("utf-8");
    let python = std::path::PathBuf::from(stdout.lines().last().expect("the venv's python").trim());
    assert!(python.is_file(), "{} is not a file", python.display());
    python
}

/// Runs `script` with `python`, `input` as JSON on stdin; answers its JSON stdout. A failing
/// script fails the test with its stderr.
pub fn run_python(python: &std::path::Path, script: &str, input: &Value) -> Value {
    use std::io::Write as _;
    let mut child = std::process::Command::new(python)
        .args(["-c", script])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start python");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(&serde_json::to_vec(input).expect("json"))
        .expect("write to python");
    let out = child.wait_with_output().expect("python runs");
    assert!(
        out.status.success(),
        "python failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "python printed no JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

/// Validates an OpenAPI document with openapi-spec-validator (an independent implementation
/// of the specification); answers the OpenAPI version it checked against.
pub fn validate_openapi(doc: &str) -> String {
    const SCRIPT: &str = r#"
import json, sys
from openapi_spec_validator import validate
doc = json.load(sys.stdin)
validate(doc)
print(json.dumps({"version": doc["openapi"], "paths": len(doc["paths"])}))
"#;
    let doc: Value = serde_json::from_str(doc).expect("the document is JSON");
    let out = run_python(&conformance_python(), SCRIPT, &doc);
    out["version"].as_str().unwrap_or_default().to_owned()
}

/// Runs schemathesis (an independent, property-based API tester) against a daemon's served
/// document at `base`: requests generated from it, valid and invalid, with `token`, in
/// `phases` (comma-separated: `examples,coverage,fuzzing,stateful`), and every answer checked
/// against the document: no 5xx, only documented statuses, content types, headers and body
/// schemas, invalid data refused, missing or bogus auth refused. Panics with schemathesis's
/// report when anything fails; answers the report otherwise.
///
/// Left out: `positive_data_acceptance` (the schemas do not yet state every bound the
/// handlers check: lengths, ranges, the folder grammar, so some schema-valid requests are
/// refused with 400) and `use_after_free` (runed's `DELETE /v1/runs/{id}` kills a run; its
/// record stays readable, by design). Event streams are left out (they never end). The seed
/// is fixed so that a failure reproduces; `HAKO_FUZZ_SEED` picks another.
pub fn schemathesis(base: &str, token: &str, phases: &str) -> String {
    let python = conformance_python();
    let st = python.with_file_name("schemathesis");
    // Hypothesis keeps a database in the working directory: a scratch one, not the repo.
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let cwd =
        std::env::temp_dir().join(format!("hako-schemathesis-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&cwd).expect("scratch dir");
    let seed = std::env::var("HAKO_FUZZ_SEED").unwrap_or_else(|_| "20261126".into());
    let out = std::process::Command::new(&st)
        .current_dir(&cwd)
        .env("NO_COLOR", "1")
        .env("COLUMNS", "120")
        .args([
            "run",
            &format!("{base}/openapi.json"),
            "--header",
            &format!("Authorization: Bearer {token}"),
            "--checks",
            "all",
            "--exclude-checks",
            "positive_data_acceptance,use_after_free",
            "--phases",
            phases,
            "--exclude-path-regex",
            "/events$",
            "--max-examples",
            "25",
            "--workers",
            "1",
            "--request-timeout",
            "30",
            "--seed",
            &seed,
        ])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", st.display()));
    let _ = std::fs::remove_dir_all(&cwd);
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "schemathesis found failures against {base} ({}, seed {seed}):\n{report}",
        out.status
    );
    // Every operation selected was exercised (none skipped as unreachable or unsupported).
    let count = |key: &str| {
        report
            .lines()
            .find_map(|l| l.trim().strip_prefix(key))
            .map(|v| v.trim().split('/').next().unwrap_or("").to_owned())
    };
    let (selected, tested) = (count("Selected:"), count("Tested:"));
    assert!(
        selected.is_some() && selected == tested,
        "schemathesis selected {selected:?} operations and tested {tested:?}:\n{report}"
    );
    report
}

/// `/v1/runs/{run_id}` → `/v1/runs/x`.
fn fill_params(path: &str) -> String {
    path.split('/')
        .map(|seg| {
            if seg.starts_with('{') && seg.ends_with('}') {
                "x"
            } else {
                seg
            }
        })
        .collect::<Vec<_>>()
        .join("/")
}

/// The module graph of the crate whose sources are in `src`: an edge `m -> x` for each
/// `crate::x` (also in a `use crate::{x, ..}` group) in module `m` outside its tests. Panics
/// naming a cycle, or naming an upward arrow: a module that uses an item of the crate root
/// (`lib.rs`), which declares every module. Answers the edges, for callers' own checks.
pub fn module_graph(
    src: &std::path::Path,
) -> std::collections::BTreeMap<String, std::collections::BTreeSet<String>> {
    use std::collections::{BTreeMap, BTreeSet};
    let mut files = Vec::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                files.push(p);
            }
        }
    }
    let module_of = |f: &std::path::Path| {
        let rel = f.strip_prefix(src).unwrap();
        let first = rel.iter().next().unwrap().to_string_lossy();
        first.trim_end_matches(".rs").to_owned()
    };
    let modules: BTreeSet<String> = files.iter().map(|f| module_of(f)).collect();
    let ident = |t: &str| -> String {
        t.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut upward = Vec::new();
    for f in &files {
        let module = module_of(f);
        if module == "lib" || module == "main" {
            continue;
        }
        let text = std::fs::read_to_string(f).unwrap();
        // Test modules may reach anywhere.
        let text = text.split("#[cfg(test)]").next().unwrap();
        let mut names = Vec::new();
        for (i, _) in text.match_indices("crate::") {
            let rest = &text[i + 7..];
            match rest.strip_prefix('{') {
                Some(group) => {
                    let group = &group[..group.find('}').unwrap_or(group.len())];
                    names.extend(group.split(',').map(|n| ident(n.trim())));
                }
                None => names.push(ident(rest)),
            }
        }
        let deps = edges.entry(module.clone()).or_default();
        for name in names {
            if name.is_empty() || name == module {
                continue;
            }
            if modules.contains(&name) {
                deps.insert(name);
            } else {
                upward.push(format!("{} uses crate::{name}", f.display()));
            }
        }
    }
    assert!(
        upward.is_empty(),
        "upward arrows (items of lib.rs used by its modules): {upward:#?}"
    );
    fn visit(
        m: &str,
        edges: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) {
        if let Some(at) = path.iter().position(|p| p == m) {
            panic!("module cycle: {} -> {m}", path[at..].join(" -> "));
        }
        if !done.insert(m.to_owned()) {
            return;
        }
        path.push(m.to_owned());
        for d in edges.get(m).into_iter().flatten() {
            visit(d, edges, path, done);
        }
        path.pop();
    }
    let mut done = BTreeSet::new();
    for m in edges.keys() {
        visit(m, &edges, &mut Vec::new(), &mut done);
    }
    edges
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_envelope_and_nothing_else() {
        let ok = br#"{"error":"not_found","message":"no run x"}"#;
        assert!(check_envelope(404, Some("application/json"), ok).is_ok());
        assert!(check_envelope(200, Some("text/plain"), b"hi").is_ok());
        for (ct, body) in [
            (
                Some("text/plain"),
                &b"Failed to deserialize query string"[..],
            ),
            (Some("application/json"), &b""[..]),
            (
                Some("application/json"),
                &br#"{"error":"Not Found","message":"x"}"#[..],
            ),
            (Some("application/json"), &br#"{"error":"x"}"#[..]),
            (
                Some("application/json"),
                &br#"{"error":"x","message":"m","extra":1}"#[..],
            ),
            (None, &ok[..]),
        ] {
            assert!(
                check_envelope(400, ct, body).is_err(),
                "{ct:?} {}",
                String::from_utf8_lossy(body)
            );
        }
        assert_eq!(fill_params("/v1/runs/{run_id}/events"), "/v1/runs/x/events");
    }
}
