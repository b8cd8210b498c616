//! Brokered secrets (`specs/egress.md`, Secrets): where the values are read from (the
//! operator's store, a read-only directory only the proxy's user can read), and how a
//! request's headers get them: a run's placeholder becomes the value only in a header of a
//! request toward a host the secret is bound to; every other placeholder stays as it is and is
//! reported (its run, the secret's name and the host, never a value).

use std::collections::HashMap;
use std::io::Read as _;
use std::path::PathBuf;
use std::sync::Mutex;

use base64::Engine as _;
use hako_shared::allowlist::TargetHost;
use hako_shared::secrets::{self, MAX_VALUE, Placeholder, SecretClaim, SecretName};
use hyper::header::{self, HeaderMap, HeaderValue};

/// A secret's value, only ever in memory here: no `Debug` of it, wiped when dropped.
pub struct SecretValue(Vec<u8>);

impl SecretValue {
    /// The bytes (printable ASCII, checked when read).
    pub fn bytes(&self) -> &[u8] {
        &self.0
    }
}

impl Drop for SecretValue {
    fn drop(&mut self) {
        self.0.fill(0);
        // Kept observable, so the wipe is not optimised away.
        std::hint::black_box(&mut self.0);
    }
}

impl std::fmt::Debug for SecretValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SecretValue(..)")
    }
}

/// Why a value could not be read (never the value).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// No such secret (never set, or removed).
    #[error("secret {0} is not set (hako secrets set {0})")]
    Missing(String),
    /// The file is there but cannot be used (a link, unreadable, not a valid value).
    #[error("secret {0} cannot be read: {1}")]
    Unusable(String, String),
}

/// The operator's store as the proxy sees it: one file per secret, named after it, each 0600
/// and owned by the proxy's user, in a directory mounted read-only into the proxy alone.
#[derive(Debug, Clone)]
pub struct Store {
    dir: PathBuf,
}

impl Store {
    /// The store in `dir`.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }

    /// Reads `name`'s value now (a removed secret is gone at once; a changed one is used from
    /// the next request on). Links are not followed.
    pub fn read(&self, name: &SecretName) -> Result<SecretValue, StoreError> {
        let path = self.dir.join(name.as_str());
        let unusable = |why: String| StoreError::Unusable(name.to_string(), why);
        let fd = match rustix::fs::open(
            &path,
            rustix::fs::OFlags::RDONLY
                | rustix::fs::OFlags::NOFOLLOW
                | rustix::fs::OFlags::CLOEXEC
                | rustix::fs::OFlags::NONBLOCK,
            rustix::fs::Mode::empty(),
        ) {
            Ok(fd) => fd,
            Err(rustix::io::Errno::NOENT) => return Err(StoreError::Missing(name.to_string())),
            Err(e) => return Err(unusable(e.to_string())),
        };
        let file = std::fs::File::from(fd);
        match file.metadata() {
            Ok(m) if m.is_file() => {}
            _ => return Err(unusable("not a regular file".into())),
        }
        let mut buf = Vec::with_capacity(64);
        file.take(MAX_VALUE as u64 + 1)
            .read_to_end(&mut buf)
            .map_err(|e| unusable(e.to_string()))?;
        let value = SecretValue(buf);
        secrets::check_value(value.bytes()).map_err(|e| unusable(e.to_string()))?;
        Ok(value)
    }
}

/// Why a placeholder was left as it was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Misuse {
    /// This run's placeholder, toward a host its secret is not bound to.
    UnboundHost,
    /// A placeholder that is not this run's (another run's, or made up).
    OtherRun,
    /// Over plain HTTP, where the value would cross the network unencrypted.
    PlainHttp,
    /// In the request line, where values are never put (URLs end up in logs).
    InUrl,
}

impl Misuse {
    /// Every reason, for metrics created at zero.
    pub const ALL: [Misuse; 4] = [
        Misuse::UnboundHost,
        Misuse::OtherRun,
        Misuse::PlainHttp,
        Misuse::InUrl,
    ];

    /// The metric label and the log's `reason`.
    pub fn code(self) -> &'static str {
        match self {
            Misuse::UnboundHost => "unbound_host",
            Misuse::OtherRun => "other_run",
            Misuse::PlainHttp => "plain_http",
            Misuse::InUrl => "in_url",
        }
    }
}

/// One placeholder left unreplaced, for the record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// Why.
    pub reason: Misuse,
    /// The secret it stands for, when known.
    pub secret: Option<SecretName>,
    /// The run it belongs to, when known (another run's for [`Misuse::OtherRun`]).
    pub owner_run: Option<String>,
    /// Where it was: `header <name>` or `url`.
    pub place: String,
}

/// Most placeholders remembered from other tokens (full: forgotten at once).
const KNOWN_CAP: usize = 16_384;

/// Placeholders the proxy has seen in verified tokens, so that one turning up in another
/// run's request can be named (its run and secret) in the record.
#[derive(Default)]
pub struct Known {
    map: Mutex<HashMap<String, (String, SecretName)>>,
}

impl Known {
    /// Remembers the placeholders of a verified token of `run`.
    pub fn learn(&self, run: Option<&str>, claims: &[SecretClaim]) {
        let (Some(run), false) = (run, claims.is_empty()) else {
            return;
        };
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        if claims
            .iter()
            .all(|c| map.contains_key(c.placeholder.as_str()))
        {
            return;
        }
        if map.len() + claims.len() > KNOWN_CAP {
            map.clear();
        }
        for c in claims {
            map.insert(
                c.placeholder.as_str().to_owned(),
                (run.to_owned(), c.name.clone()),
            );
        }
    }

    fn owner(&self, placeholder: &str) -> Option<(String, SecretName)> {
        self.map
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(placeholder)
            .cloned()
    }
}

/// What [`substitute`] did to one request.
#[derive(Debug, Default)]
pub struct Outcome {
    /// The secrets whose values went in, each with the placeholder it replaced (to take the
    /// value back out of the answer's headers).
    pub replaced: Vec<(SecretName, Placeholder, SecretValue)>,
    /// Placeholders left as they were.
    pub refused: Vec<Refused>,
}

/// What a request is going to.
#[derive(Debug, Clone, Copy)]
pub struct Toward<'a> {
    /// The target host.
    pub host: &'a TargetHost,
    /// Its port.
    pub port: u16,
    /// Whether the values may go at all: the proxy terminated TLS and re-originates it (plain
    /// HTTP: never).
    pub tls: bool,
}

/// A request's view of placeholders: the run's own claims, the proxy's memory of others'.
pub struct Substituter<'a> {
    /// The run's `secrets` claim (verified token).
    pub claims: &'a [SecretClaim],
    /// The run, for the record.
    pub run: Option<&'a str>,
    /// Others' placeholders.
    pub known: &'a Known,
    /// Where values come from (none: a proxy without a broker, which never replaces).
    pub store: Option<&'a Store>,
}

impl Substituter<'_> {
    fn classify(
        &self,
        ph: &str,
        to: Toward<'_>,
        place: &str,
    ) -> Result<Option<&SecretClaim>, Refused> {
        let own = self.claims.iter().find(|c| c.placeholder.as_str() == ph);
        let refused = |reason, secret: Option<SecretName>, owner: Option<String>| Refused {
            reason,
            secret,
            owner_run: owner,
            place: place.to_owned(),
        };
        match own {
            Some(c) if !to.tls => Err(refused(
                Misuse::PlainHttp,
                Some(c.name.clone()),
                self.run.map(str::to_owned),
            )),
            Some(c) if place == "url" => Err(refused(
                Misuse::InUrl,
                Some(c.name.clone()),
                self.run.map(str::to_owned),
            )),
            Some(c) if c.bound_to(to.host, to.port) => Ok(Some(c)),
            Some(c) => Err(refused(
                Misuse::UnboundHost,
                Some(c.name.clone()),
                self.run.map(str::to_owned),
            )),
            None => {
                let (owner, secret) = self.known.owner(ph).unzip();
                Err(refused(Misuse::OtherRun, secret, owner))
            }
        }
    }

    /// Replaces this run's placeholders in `headers` (raw, and inside `Authorization: Basic`
    /// credentials, which is how git sends a token) where `to` allows, and reports every
    /// placeholder it leaves, in the headers or in `uri` (never replaced there). A bound
    /// secret whose value cannot be read is an error: the request must not go half-done.
    pub fn substitute(
        &self,
        headers: &mut HeaderMap,
        uri: &str,
        to: Toward<'_>,
    ) -> Result<Outcome, StoreError> {
        let mut out = Outcome::default();
        for ph in secrets::placeholders_in(uri.as_bytes()) {
            if let Err(r) = self.classify(ph, to, "url") {
                out.refused.push(r);
            }
        }
        let names: Vec<header::HeaderName> = headers.keys().cloned().collect();
        for name in names {
            let values: Vec<HeaderValue> = headers.get_all(&name).iter().cloned().collect();
            let mut changed = false;
            let mut new_values = Vec::with_capacity(values.len());
            for v in values {
                let place = format!("header {name}");
                match self.rewrite(v.as_bytes(), &name, to, &place, &mut out)? {
                    Some(bytes) => {
                        changed = true;
                        // Values are printable ASCII (checked when read), so this holds.
                        let mut nv = HeaderValue::from_bytes(&bytes).map_err(|_| {
                            StoreError::Unusable(name.to_string(), "not a header value".into())
                        })?;
                        nv.set_sensitive(true);
                        new_values.push(nv);
                    }
                    None => new_values.push(v),
                }
            }
            if changed {
                headers.remove(&name);
                for v in new_values {
                    headers.append(&name, v);
                }
            }
        }
        Ok(out)
    }

    /// One header value with this run's bound placeholders replaced, or `None` if nothing
    /// changed. `Authorization: Basic` is decoded, rewritten and encoded again.
    fn rewrite(
        &self,
        value: &[u8],
        name: &header::HeaderName,
        to: Toward<'_>,
        place: &str,
        out: &mut Outcome,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        if *name == header::AUTHORIZATION
            && value.len() > 6
            && value[..6].eq_ignore_ascii_case(b"basic ")
            && let Ok(decoded) =
                base64::engine::general_purpose::STANDARD.decode(value[6..].trim_ascii())
        {
            let place = format!("{place} (basic credentials)");
            return Ok(self.replace(&decoded, to, &place, out)?.map(|plain| {
                let mut v = value[..6].to_vec();
                v.extend_from_slice(
                    base64::engine::general_purpose::STANDARD
                        .encode(&plain)
                        .as_bytes(),
                );
                v
            }));
        }
        self.replace(value, to, place, out)
    }

    fn replace(
        &self,
        text: &[u8],
        to: Toward<'_>,
        place: &str,
        out: &mut Outcome,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        let found: Vec<&str> = secrets::placeholders_in(text).collect();
        if found.is_empty() {
            return Ok(None);
        }
        let mut result = text.to_vec();
        let mut changed = false;
        for ph in found {
            match self.classify(ph, to, place) {
                Ok(Some(claim)) => {
                    let store = self.store.ok_or_else(|| {
                        StoreError::Unusable(claim.name.to_string(), "no store".into())
                    })?;
                    let value = store.read(&claim.name)?;
                    result = replace_all(&result, ph.as_bytes(), value.bytes());
                    changed = true;
                    if !out.replaced.iter().any(|(n, ..)| *n == claim.name) {
                        out.replaced
                            .push((claim.name.clone(), claim.placeholder.clone(), value));
                    }
                }
                Ok(None) => {}
                Err(r) => out.refused.push(r),
            }
        }
        Ok(changed.then_some(result))
    }
}

fn replace_all(text: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len() + to.len());
    let mut rest = text;
    while let Some(i) = memchr::memmem::find(rest, from) {
        out.extend_from_slice(&rest[..i]);
        out.extend_from_slice(to);
        rest = &rest[i + from.len()..];
    }
    out.extend_from_slice(rest);
    out
}

/// Takes every value [`Substituter::substitute`] put in back out of an answer's headers (a
/// target that echoes a credential must not hand it to the box), putting the placeholder in
/// its place.
pub fn redact_answer(headers: &mut HeaderMap, replaced: &[(SecretName, Placeholder, SecretValue)]) {
    if replaced.is_empty() {
        return;
    }
    for v in headers.values_mut() {
        let mut bytes = v.as_bytes().to_vec();
        let mut changed = false;
        for (_, ph, value) in replaced {
            if memchr::memmem::find(&bytes, value.bytes()).is_some() {
                bytes = replace_all(&bytes, value.bytes(), ph.as_str().as_bytes());
                changed = true;
            }
        }
        if changed && let Ok(nv) = HeaderValue::from_bytes(&bytes) {
            *v = nv;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(name: &str, hosts: &[&str]) -> SecretClaim {
        SecretClaim {
            name: SecretName::parse(name).unwrap(),
            hosts: hosts.iter().map(|h| (*h).to_owned()).collect(),
            placeholder: Placeholder::random().unwrap(),
        }
    }

    fn store(values: &[(&str, &str)]) -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        for (k, v) in values {
            std::fs::write(dir.path().join(k), v).unwrap();
        }
        let s = Store::new(dir.path());
        (dir, s)
    }

    fn host(h: &str) -> TargetHost {
        TargetHost::Name(h.into())
    }

    #[test]
    fn bound_placeholders_become_values_in_headers_and_basic_auth() {
        let gh = claim("GH_TOKEN", &["github.com", "api.github.com"]);
        let npm = claim("NPM_TOKEN", &["registry.npmjs.org"]);
        let (_d, st) = store(&[("GH_TOKEN", "ghp_real"), ("NPM_TOKEN", "npm_real")]);
        let known = Known::default();
        let claims = [gh.clone(), npm.clone()];
        let s = Substituter {
            claims: &claims,
            run: Some("run-a"),
            known: &known,
            store: Some(&st),
        };
        let api = host("api.github.com");
        let to = Toward {
            host: &api,
            port: 443,
            tls: true,
        };
        let mut h = HeaderMap::new();
        let ph = gh.placeholder.as_str();
        h.insert("authorization", format!("Bearer {ph}").parse().unwrap());
        h.insert("x-npm", npm.placeholder.as_str().parse().unwrap());
        let o = s.substitute(&mut h, "/repos?x=1", to).unwrap();
        assert_eq!(h["authorization"], "Bearer ghp_real");
        assert!(h["authorization"].is_sensitive());
        assert_eq!(h["x-npm"], npm.placeholder.as_str(), "not bound here");
        assert_eq!(o.replaced.len(), 1);
        assert_eq!(o.refused.len(), 1);
        assert_eq!(o.refused[0].reason, Misuse::UnboundHost);
        assert_eq!(o.refused[0].secret.as_ref().unwrap().as_str(), "NPM_TOKEN");
        // git: https://x-access-token:<ph>@github.com/… is sent as Basic credentials.
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        let mut h = HeaderMap::new();
        h.insert(
            "authorization",
            format!("Basic {}", b64(&format!("x-access-token:{ph}")))
                .parse()
                .unwrap(),
        );
        s.substitute(&mut h, "/", to).unwrap();
        assert_eq!(
            h["authorization"],
            format!("Basic {}", b64("x-access-token:ghp_real")).as_str()
        );
        // The answer's headers never carry the value back.
        let mut answer = HeaderMap::new();
        answer.insert("x-echo", "token ghp_real seen".parse().unwrap());
        redact_answer(&mut answer, &o.replaced);
        assert_eq!(answer["x-echo"], format!("token {ph} seen").as_str());
    }

    #[test]
    fn everything_else_is_left_and_reported() {
        let mine = claim("GH_TOKEN", &["github.com"]);
        let theirs = claim("GH_TOKEN", &["github.com"]);
        let known = Known::default();
        known.learn(Some("run-b"), std::slice::from_ref(&theirs));
        let (_d, st) = store(&[("GH_TOKEN", "ghp_real")]);
        let claims = [mine.clone()];
        let s = Substituter {
            claims: &claims,
            run: Some("run-a"),
            known: &known,
            store: Some(&st),
        };
        let gh = host("github.com");
        let tls = Toward {
            host: &gh,
            port: 443,
            tls: true,
        };
        // Another run's placeholder toward the very host: left, named.
        let mut h = HeaderMap::new();
        h.insert(
            "authorization",
            format!("token {}", theirs.placeholder.as_str())
                .parse()
                .unwrap(),
        );
        let o = s.substitute(&mut h, "/", tls).unwrap();
        assert!(o.replaced.is_empty());
        assert_eq!(o.refused[0].reason, Misuse::OtherRun);
        assert_eq!(o.refused[0].owner_run.as_deref(), Some("run-b"));
        // Made up: reported without an owner.
        let mut h = HeaderMap::new();
        h.insert(
            "x",
            "hako_ph_0123456789abcdef0123456789abcdef".parse().unwrap(),
        );
        let o = s.substitute(&mut h, "/", tls).unwrap();
        assert_eq!(o.refused[0].reason, Misuse::OtherRun);
        assert_eq!(o.refused[0].owner_run, None);
        // In the URL: never replaced.
        let mut h = HeaderMap::new();
        let url = format!("/x?token={}", mine.placeholder.as_str());
        let o = s.substitute(&mut h, &url, tls).unwrap();
        assert_eq!(o.refused[0].reason, Misuse::InUrl);
        // Plain HTTP: never replaced, even toward the bound host.
        let plain = Toward { tls: false, ..tls };
        let mut h = HeaderMap::new();
        h.insert("authorization", mine.placeholder.as_str().parse().unwrap());
        let o = s.substitute(&mut h, "/", plain).unwrap();
        assert_eq!(h["authorization"], mine.placeholder.as_str());
        assert_eq!(o.refused[0].reason, Misuse::PlainHttp);
        // Another port of the bound host: not bound.
        let other_port = Toward { port: 8443, ..tls };
        let mut h = HeaderMap::new();
        h.insert("authorization", mine.placeholder.as_str().parse().unwrap());
        let o = s.substitute(&mut h, "/", other_port).unwrap();
        assert_eq!(o.refused[0].reason, Misuse::UnboundHost);
    }

    #[test]
    fn a_missing_or_unusable_value_stops_the_request() {
        let c = claim("GH_TOKEN", &["github.com"]);
        let (dir, st) = store(&[]);
        let known = Known::default();
        let claims = [c.clone()];
        let s = Substituter {
            claims: &claims,
            run: None,
            known: &known,
            store: Some(&st),
        };
        let gh = host("github.com");
        let to = Toward {
            host: &gh,
            port: 443,
            tls: true,
        };
        let mut h = HeaderMap::new();
        h.insert("authorization", c.placeholder.as_str().parse().unwrap());
        let e = s.substitute(&mut h.clone(), "/", to).unwrap_err();
        assert_eq!(e, StoreError::Missing("GH_TOKEN".into()));
        // A link in the store is not followed; a value with a line break is refused.
        let outside = dir.path().join("outside");
        std::fs::write(&outside, "ghp_real").unwrap();
        std::os::unix::fs::symlink(&outside, dir.path().join("GH_TOKEN")).unwrap();
        assert!(matches!(
            s.substitute(&mut h.clone(), "/", to),
            Err(StoreError::Unusable(..))
        ));
        std::fs::remove_file(dir.path().join("GH_TOKEN")).unwrap();
        std::fs::write(dir.path().join("GH_TOKEN"), "ghp\r\nX-Evil: 1").unwrap();
        let e = s.substitute(&mut h, "/", to).unwrap_err();
        assert!(matches!(e, StoreError::Unusable(..)));
        assert!(!e.to_string().contains("ghp"), "{e}");
    }
}
