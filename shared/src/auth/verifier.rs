//! The offline token verifier every daemon uses.
//!
//! Keys come from authd's JWKS, fetched lazily and cached by `kid`. An unknown `kid` triggers
//! a refetch, but at most once per `min_refetch_interval`: inside the interval the request
//! waits for it to end (concurrent ones share the one fetch), so a flood of tokens with bogus
//! kids costs authd one request per interval, not one per token, and a key rotated in right
//! after a fetch is still learnt within one interval. A failed refetch keeps the keys
//! already known (verification stays offline while authd restarts). Revoked jtis are polled
//! from `GET /v1/revoked` in the background.
//!
//! Verified tokens are remembered by the SHA-256 of their exact text (bounded, successes
//! only), so a token presented again (runed's service token on every mint, an agent's spawn
//! token on every tool call) skips the signature check; time, key and revocation checks still
//! run on every call, and an entry counts only while its signing key is still trusted under
//! the same kid.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock, Weak};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use super::claims::{Claims, TokenType};
use super::client::{ClientError, KeysClient};
use super::jws::{self, VerifyingKey};
use super::{AuthError, now_secs};
use crate::config::{ConfigError, Env};

/// The issuer authd uses unless `AUTHD_ISSUER` says otherwise.
pub const DEFAULT_ISSUER: &str = "hako-authd";
/// Most keys taken from one JWKS.
const MAX_KEYS: usize = 64;
/// Most verified tokens remembered (a few MiB at most).
const CACHE_CAP: usize = 4096;

/// How a [`Verifier`] finds keys and how strict it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifierConfig {
    /// authd's base URL; `None` means open dev mode (every request passes).
    pub authd_url: Option<String>,
    /// The only `iss` accepted.
    pub issuer: String,
    /// Clock skew tolerated on `exp`, `nbf` and `iat`.
    pub leeway: Duration,
    /// After this long the JWKS is fetched again on the next verification.
    pub jwks_ttl: Duration,
    /// At most one JWKS fetch per this interval, however many unknown kids arrive.
    pub min_refetch_interval: Duration,
    /// How often the revocation list is polled.
    pub revoked_poll: Duration,
    /// Time limit of each call to authd.
    pub http_timeout: Duration,
    /// How often open mode repeats its warning.
    pub open_warn_interval: Duration,
}

impl Default for VerifierConfig {
    /// Open mode with the default timings.
    fn default() -> Self {
        Self {
            authd_url: None,
            issuer: DEFAULT_ISSUER.into(),
            leeway: Duration::from_secs(30),
            jwks_ttl: Duration::from_secs(300),
            min_refetch_interval: Duration::from_secs(5),
            revoked_poll: Duration::from_secs(5),
            http_timeout: super::client::DEFAULT_TIMEOUT,
            open_warn_interval: Duration::from_secs(60),
        }
    }
}

/// The variable that allows open local-dev mode.
pub const OPEN_DEV_ENV: &str = "HAKO_OPEN_DEV";

impl VerifierConfig {
    /// Refuses open mode on a listen address other than loopback: an open daemon answers any
    /// caller, so only the local machine may reach it.
    pub fn check_open_listen(
        &self,
        listen_var: &str,
        addr: std::net::SocketAddr,
    ) -> Result<(), ConfigError> {
        if self.authd_url.is_none() && !addr.ip().is_loopback() {
            return Err(ConfigError::Invalid {
                var: listen_var.into(),
                value: addr.to_string(),
                reason: format!(
                    "{OPEN_DEV_ENV}=1 (open mode: any caller, no tokens) is allowed on a loopback address only"
                ),
            });
        }
        Ok(())
    }

    /// Verification against the authd at `url`, default timings.
    pub fn remote(url: impl Into<String>) -> Self {
        Self {
            authd_url: Some(url.into()),
            ..Self::default()
        }
    }

    /// From `AUTHD_URL`, `AUTHD_ISSUER`, `AUTHD_CLOCK_SKEW`, `AUTHD_JWKS_TTL`,
    /// `AUTHD_JWKS_MIN_REFETCH` and `AUTHD_REVOKED_POLL`. Open mode (no tokens at all) only
    /// with `AUTHD_URL` unset *and* `HAKO_OPEN_DEV=1`: an unset or empty `AUTHD_URL` alone
    /// stops the daemon, naming the variable. The daemon must also refuse open mode on a
    /// listen address that is not loopback ([`VerifierConfig::check_open_listen`]).
    pub fn from_env(env: &Env) -> Result<Self, ConfigError> {
        let d = Self::default();
        env.reject_empty("AUTHD_URL")?;
        let authd_url = env.get("AUTHD_URL").map(str::to_owned);
        let open_dev = env.flag(OPEN_DEV_ENV)?;
        match (&authd_url, open_dev) {
            (None, false) => {
                return Err(ConfigError::Required {
                    var: "AUTHD_URL".into(),
                    hint: format!(
                        "set it to authd's address, or set {OPEN_DEV_ENV}=1 for open local-dev mode (any caller, no tokens; loopback only)"
                    ),
                });
            }
            (Some(_), true) => {
                return Err(ConfigError::Invalid {
                    var: OPEN_DEV_ENV.into(),
                    value: "1".into(),
                    reason: "open dev mode and AUTHD_URL exclude each other; unset one".into(),
                });
            }
            _ => {}
        }
        if let Some(url) = &authd_url {
            super::client::check_authd_url(url).map_err(|e| ConfigError::Invalid {
                var: "AUTHD_URL".into(),
                value: url.clone(),
                reason: e.to_string(),
            })?;
        }
        Ok(Self {
            authd_url,
            issuer: env.string_or("AUTHD_ISSUER", DEFAULT_ISSUER),
            leeway: env.duration_or("AUTHD_CLOCK_SKEW", d.leeway)?,
            jwks_ttl: env.duration_or("AUTHD_JWKS_TTL", d.jwks_ttl)?,
            min_refetch_interval: env
                .duration_or("AUTHD_JWKS_MIN_REFETCH", d.min_refetch_interval)?,
            revoked_poll: env.duration_or("AUTHD_REVOKED_POLL", d.revoked_poll)?,
            ..d
        })
    }
}

enum Mode {
    /// No authd: every request passes.
    Open,
    /// Keys and revocations from authd over HTTP.
    Remote(KeysClient),
    /// Keys and revocations pushed in by their owner (authd itself).
    Local,
}

#[derive(Clone)]
struct KeyEntry {
    key: VerifyingKey,
    /// Unix seconds after which the key no longer verifies (local keys being retired).
    drop_at: Option<i64>,
}

/// A token that passed the full check: its claims, and the key that verified it.
struct CachedToken {
    claims: Arc<Claims>,
    kid: Box<str>,
    /// The key that checked the signature. A hit counts only while `kid` still maps to this
    /// very key, so a key replaced under the same kid (or one cached in a race with a key
    /// change) never vouches for the entry.
    key: [u8; 32],
}

/// Cache key: the SHA-256 of the compact token, so the cache keeps no bearer tokens.
type TokenDigest = [u8; 32];

fn digest(token: &str) -> TokenDigest {
    Sha256::digest(token.as_bytes()).into()
}

struct Inner {
    mode: Mode,
    cfg: VerifierConfig,
    /// The claim checks jsonwebtoken applies (issuer and leeway from `cfg`), built once.
    validation: jsonwebtoken::Validation,
    keys: RwLock<HashMap<String, KeyEntry>>,
    /// When the JWKS was last fetched successfully.
    keys_fetched: Mutex<Option<Instant>>,
    /// When a JWKS fetch was last attempted; held across the wait and the fetch so that
    /// concurrent unknown kids share one request.
    fetch_gate: tokio::sync::Mutex<Option<Instant>>,
    /// JWKS fetches ended so far: a caller that queued behind another's fetch sees the count
    /// move and looks again instead of fetching (or waiting) itself.
    fetches: AtomicU64,
    revoked: RwLock<HashMap<String, i64>>,
    /// When the revocation list was last fetched from authd (remote mode).
    revoked_fetched: Mutex<Option<Instant>>,
    /// Verified tokens; held only for a lookup or an insert, never across an await.
    cache: Mutex<HashMap<TokenDigest, CachedToken>>,
    tasks_started: OnceLock<()>,
    tasks: Mutex<Vec<tokio::task::AbortHandle>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        for t in lock(&self.tasks).drain(..) {
            t.abort();
        }
    }
}

/// Counts one more when dropped: a JWKS fetch that ended, or whose caller went away.
struct Counted<'a>(&'a AtomicU64);

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::AcqRel);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn read<T>(m: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    m.read().unwrap_or_else(|p| p.into_inner())
}

fn write<T>(m: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    m.write().unwrap_or_else(|p| p.into_inner())
}

/// Verifies hako tokens offline. Cheap to clone (an `Arc` inside).
#[derive(Clone)]
pub struct Verifier {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Verifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mode = match &self.inner.mode {
            Mode::Open => "open",
            Mode::Remote(_) => "remote",
            Mode::Local => "local",
        };
        f.debug_struct("Verifier")
            .field("mode", &mode)
            .field("issuer", &self.inner.cfg.issuer)
            .finish_non_exhaustive()
    }
}

impl Verifier {
    /// A verifier for `cfg`. Background work (revocation polling, the open-mode warning) starts
    /// at once inside a tokio runtime, else on the first verification.
    ///
    /// With `authd_url: None` this is open dev mode, and it logs a WARN now and on a timer.
    pub fn new(cfg: VerifierConfig) -> Result<Self, ClientError> {
        let mode = match &cfg.authd_url {
            None => Mode::Open,
            Some(url) => Mode::Remote(KeysClient::with_timeout(url, cfg.http_timeout)?),
        };
        let v = Self::with_mode(mode, cfg);
        if v.is_open() {
            warn_open();
        }
        if tokio::runtime::Handle::try_current().is_ok() {
            v.ensure_tasks();
        }
        Ok(v)
    }

    /// A verifier whose keys and revocations its owner pushes in with
    /// [`Verifier::insert_key`] and [`Verifier::mark_revoked`]. authd uses this for its own
    /// routes, so that it checks tokens with exactly the code every other daemon uses.
    pub fn local(issuer: impl Into<String>, leeway: Duration) -> Self {
        Self::with_mode(
            Mode::Local,
            VerifierConfig {
                issuer: issuer.into(),
                leeway,
                ..VerifierConfig::default()
            },
        )
    }

    fn with_mode(mode: Mode, cfg: VerifierConfig) -> Self {
        Self {
            inner: Arc::new(Inner {
                mode,
                validation: jws::validation(&cfg.issuer, cfg.leeway),
                cfg,
                keys: RwLock::new(HashMap::new()),
                keys_fetched: Mutex::new(None),
                fetch_gate: tokio::sync::Mutex::new(None),
                fetches: AtomicU64::new(0),
                revoked: RwLock::new(HashMap::new()),
                revoked_fetched: Mutex::new(None),
                cache: Mutex::new(HashMap::new()),
                tasks_started: OnceLock::new(),
                tasks: Mutex::new(Vec::new()),
            }),
        }
    }

    /// Whether this is open dev mode (no authd; every request passes).
    pub fn is_open(&self) -> bool {
        matches!(self.inner.mode, Mode::Open)
    }

    /// The configuration.
    pub fn config(&self) -> &VerifierConfig {
        &self.inner.cfg
    }

    fn ensure_tasks(&self) {
        if self.inner.tasks_started.set(()).is_err() {
            return;
        }
        let weak = Arc::downgrade(&self.inner);
        let handle = match &self.inner.mode {
            Mode::Local => return,
            Mode::Open => {
                let every = self.inner.cfg.open_warn_interval;
                tokio::spawn(async move {
                    let mut tick = tokio::time::interval(every);
                    tick.tick().await; // the first tick is immediate; `new` already warned
                    loop {
                        tick.tick().await;
                        if weak.strong_count() == 0 {
                            return;
                        }
                        warn_open();
                    }
                })
            }
            Mode::Remote(_) => {
                let every = self.inner.cfg.revoked_poll;
                tokio::spawn(poll_revoked(weak, every))
            }
        };
        lock(&self.inner.tasks).push(handle.abort_handle());
    }

    /// Verifies `token` and returns its claims: EdDSA signature by a known key, issuer,
    /// `exp`/`nbf`/`iat` within leeway, not revoked. Fails in open mode (there are no keys);
    /// use [`super::Principal`] to let open mode pass. The claims are shared with the
    /// verified-token cache, so a repeat token costs no copy.
    pub async fn verify(&self, token: &str) -> Result<Arc<Claims>, AuthError> {
        self.ensure_tasks();
        if self.is_open() {
            return Err(AuthError::Unavailable(
                "open mode: this daemon has no authd to verify tokens with".into(),
            ));
        }
        self.verify_at(token, now_secs()).await
    }

    /// [`Verifier::verify`] as of `now` (Unix seconds).
    async fn verify_at(&self, token: &str, now: i64) -> Result<Arc<Claims>, AuthError> {
        let digest = digest(token);
        if let Some(claims) = self.cached(&digest, now) {
            self.check_live(&claims, now)?;
            return Ok(claims);
        }
        // hako's envelope first (size, shape, alg, kid, crit, small-order R), then the key,
        // then jsonwebtoken: signature, `exp`/`nbf` with the leeway, required claims, issuer,
        // no `aud`; then hako's own claim rules, and time again against `now` (as every cache
        // hit does; `iat` too, which jsonwebtoken does not check).
        let parsed = jws::parse(token)?;
        let key = self.key_for(parsed.kid(), now).await?;
        let claims: Claims = parsed.decode(&key, &self.inner.validation)?;
        self.check_static(&claims)?;
        self.check_live(&claims, now)?;
        let claims = Arc::new(claims);
        self.remember(digest, Arc::clone(&claims), parsed.kid(), key.to_bytes());
        Ok(claims)
    }

    /// The claims of a token verified before, if its signing key is still trusted under the
    /// same kid. Time and revocation are the caller's to check.
    fn cached(&self, digest: &TokenDigest, now: i64) -> Option<Arc<Claims>> {
        // A stale JWKS sends the call down the full path, whose key lookup refreshes it:
        // otherwise a stream of cache hits would keep trusting a key authd has dropped.
        if matches!(self.inner.mode, Mode::Remote(_)) && !self.jwks_fresh() {
            return None;
        }
        let (claims, kid, key) = {
            let cache = lock(&self.inner.cache);
            let hit = cache.get(digest)?;
            (Arc::clone(&hit.claims), hit.kid.clone(), hit.key)
        };
        // Not holding the cache lock while taking the keys lock: the two are never nested.
        self.key_is(&kid, now, &key).then_some(claims)
    }

    fn remember(&self, digest: TokenDigest, claims: Arc<Claims>, kid: &str, key: [u8; 32]) {
        let mut cache = lock(&self.inner.cache);
        if cache.len() >= CACHE_CAP && !cache.contains_key(&digest) {
            // Bounded, O(1) amortised: start over. Entries are only a shortcut.
            cache.clear();
        }
        cache.insert(
            digest,
            CachedToken {
                claims,
                kid: kid.into(),
                key,
            },
        );
    }

    #[cfg(test)]
    fn cache_len(&self) -> usize {
        lock(&self.inner.cache).len()
    }

    /// Checks that do not depend on time or revocation.
    fn check_static(&self, c: &Claims) -> Result<(), AuthError> {
        if c.iss != self.inner.cfg.issuer {
            return Err(AuthError::WrongIssuer);
        }
        if c.jti.is_empty() || c.sub.is_empty() {
            return Err(AuthError::BadClaims("jti and sub are required".into()));
        }
        if c.typ == TokenType::Spawn && (c.run_id.is_none() || c.turn_id.is_none()) {
            return Err(AuthError::BadClaims(
                "a spawn token must carry run_id and turn_id".into(),
            ));
        }
        Ok(())
    }

    /// Time and revocation checks, run on every call.
    fn check_live(&self, c: &Claims, now: i64) -> Result<(), AuthError> {
        let leeway = i64::try_from(self.inner.cfg.leeway.as_secs()).unwrap_or(i64::MAX / 4);
        if now >= c.exp.saturating_add(leeway) {
            return Err(AuthError::Expired);
        }
        if c.nbf > now.saturating_add(leeway) || c.iat > now.saturating_add(leeway) {
            return Err(AuthError::NotYetValid);
        }
        if read(&self.inner.revoked).contains_key(&c.jti) {
            return Err(AuthError::Revoked);
        }
        Ok(())
    }

    fn lookup(&self, kid: &str, now: i64) -> Option<VerifyingKey> {
        let keys = read(&self.inner.keys);
        let e = keys.get(kid)?;
        if e.drop_at.is_some_and(|d| now >= d) {
            return None;
        }
        Some(e.key.clone())
    }

    /// Whether `kid` is trusted at `now` and maps to the key `bytes`.
    fn key_is(&self, kid: &str, now: i64, bytes: &[u8; 32]) -> bool {
        let keys = read(&self.inner.keys);
        keys.get(kid)
            .is_some_and(|e| e.drop_at.is_none_or(|d| now < d) && e.key.as_bytes() == bytes)
    }

    /// Whether the JWKS was fetched within its TTL.
    fn jwks_fresh(&self) -> bool {
        lock(&self.inner.keys_fetched).is_some_and(|t| t.elapsed() < self.inner.cfg.jwks_ttl)
    }

    async fn key_for(&self, kid: &str, now: i64) -> Result<VerifyingKey, AuthError> {
        let Mode::Remote(client) = &self.inner.mode else {
            return self.lookup(kid, now).ok_or(AuthError::UnknownKey);
        };
        // Read before the keys: a fetch that ends after this is seen as one by `refetch`; one
        // that ended before it has its keys in the lookup below.
        let seen = self.inner.fetches.load(Ordering::Acquire);
        let fresh = self.jwks_fresh();
        let known = self.lookup(kid, now);
        if fresh && let Some(k) = known {
            return Ok(k);
        }
        // A known key with a stale JWKS: refresh if the rate limit allows, never wait for it.
        // An unknown kid: wait for the rate limit to allow one fetch, so that a key rotated in
        // moments after the last fetch is still learnt, while a flood of bogus kids costs authd
        // one request per interval.
        let fetched = self.refetch(client, seen, known.is_none()).await;
        match (self.lookup(kid, now).or(known), fetched) {
            (Some(k), _) => Ok(k),
            (None, Err(e)) => Err(AuthError::Unavailable(e.to_string())),
            // Another caller's fetch, shared, failed: no key is known yet, so none is unknown.
            (None, Ok(_)) if lock(&self.inner.keys_fetched).is_none() => Err(
                AuthError::Unavailable("authd's signing keys could not be fetched yet".into()),
            ),
            (None, Ok(_)) => Err(AuthError::UnknownKey),
        }
    }

    /// Fetches the JWKS, at most once per `min_refetch_interval`. Skips the fetch when another
    /// caller fetched since `seen` was read. Inside the interval it waits for the interval to
    /// end when `wait`, else skips. `Ok(true)`: fetched; `Ok(false)`: skipped; `Err`: the
    /// fetch failed.
    async fn refetch(
        &self,
        client: &KeysClient,
        seen: u64,
        wait: bool,
    ) -> Result<bool, ClientError> {
        let mut last = self.inner.fetch_gate.lock().await;
        if self.inner.fetches.load(Ordering::Acquire) != seen {
            return Ok(false);
        }
        let interval = self.inner.cfg.min_refetch_interval;
        if let Some(since) = last.map(|t| t.elapsed())
            && since < interval
        {
            if !wait {
                return Ok(false);
            }
            tokio::time::sleep(interval - since).await;
        }
        *last = Some(Instant::now());
        // Counted once it has ended, its keys stored (or once it was dropped mid-way, its caller
        // gone): a caller that arrived while it was in flight, and found no key, shares it
        // instead of waiting out the interval for another.
        let _ended = Counted(&self.inner.fetches);
        self.fetch_jwks(client).await
    }

    /// One JWKS fetch; its keys replace the known ones.
    async fn fetch_jwks(&self, client: &KeysClient) -> Result<bool, ClientError> {
        let jwks = match client.jwks().await {
            Ok(j) => j,
            Err(e) => {
                tracing::warn!(error = %e, "JWKS fetch from authd failed; keeping known keys");
                return Err(e);
            }
        };
        let mut fresh = HashMap::new();
        for jwk in jwks.keys.iter().take(MAX_KEYS) {
            match jwk.to_key() {
                Ok(k) => {
                    fresh.insert(
                        jwk.kid.clone(),
                        KeyEntry {
                            key: k,
                            drop_at: None,
                        },
                    );
                }
                Err(e) => tracing::warn!(kid = %jwk.kid, error = %e, "ignoring JWK"),
            }
        }
        let changed = {
            let mut keys = write(&self.inner.keys);
            // Same kids mapping to the same keys, else the cached tokens go.
            let changed = keys.len() != fresh.len()
                || fresh
                    .iter()
                    .any(|(kid, e)| keys.get(kid).is_none_or(|old| old.key != e.key));
            *keys = fresh;
            changed
        };
        if changed {
            lock(&self.inner.cache).clear();
        }
        *lock(&self.inner.keys_fetched) = Some(Instant::now());
        Ok(true)
    }

    /// Polls `GET /v1/revoked` now (the background task does this every `revoked_poll`).
    pub async fn refresh_revoked(&self) -> Result<(), AuthError> {
        let Mode::Remote(client) = &self.inner.mode else {
            return Ok(());
        };
        let list = client
            .revoked()
            .await
            .map_err(|e| AuthError::Unavailable(e.to_string()))?;
        let now = now_secs();
        let leeway = self.leeway_secs();
        let mut revoked = write(&self.inner.revoked);
        // A revocation is never taken back: what this verifier knew stays until the token's
        // `exp` plus the leeway has passed, even once authd's list (which ends at `exp`)
        // no longer names it; a token is valid up to `exp` + leeway otherwise.
        revoked.retain(|_, exp| *exp > now - leeway);
        revoked.extend(
            list.revoked
                .into_iter()
                .filter(|e| e.exp > now - leeway)
                .map(|e| (e.jti, e.exp)),
        );
        drop(revoked);
        *lock(&self.inner.revoked_fetched) = Some(Instant::now());
        Ok(())
    }

    /// How old this verifier's knowledge of revocations is: since the last successful poll
    /// of authd's list (remote mode; `None` before the first), zero for a verifier whose
    /// owner pushes revocations in, `None` in open mode. A caller that must fail closed (the
    /// egress proxy) refuses tokens while this is `None` or too old.
    pub fn revocations_age(&self) -> Option<Duration> {
        match self.inner.mode {
            Mode::Remote(_) => lock(&self.inner.revoked_fetched).map(|t| t.elapsed()),
            Mode::Local => Some(Duration::ZERO),
            Mode::Open => None,
        }
    }

    fn leeway_secs(&self) -> i64 {
        i64::try_from(self.inner.cfg.leeway.as_secs()).unwrap_or(i64::MAX / 4)
    }

    /// Trusts `key` under `kid`, until `drop_at` (Unix seconds) when given. (A small-order
    /// key, which would verify forgeries, cannot be a [`VerifyingKey`].)
    pub fn insert_key(&self, kid: &str, key: VerifyingKey, drop_at: Option<i64>) {
        let entry = KeyEntry {
            key: key.clone(),
            drop_at,
        };
        let old = write(&self.inner.keys).insert(kid.to_owned(), entry);
        // Another key under a known kid: tokens verified by the old one must not pass on a
        // cache hit (hits also compare the key; clearing frees the dead entries).
        if old.is_some_and(|o| o.key != key) {
            lock(&self.inner.cache).clear();
        }
    }

    /// Stops trusting `kid`.
    pub fn remove_key(&self, kid: &str) {
        write(&self.inner.keys).remove(kid);
        lock(&self.inner.cache).clear();
    }

    /// The kids currently trusted.
    pub fn kids(&self) -> Vec<String> {
        let now = now_secs();
        let mut v: Vec<String> = read(&self.inner.keys)
            .iter()
            .filter(|(_, e)| e.drop_at.is_none_or(|d| now < d))
            .map(|(k, _)| k.clone())
            .collect();
        v.sort();
        v
    }

    /// Treats `jti` as revoked until `exp` (plus leeway).
    pub fn mark_revoked(&self, jti: &str, exp: i64) {
        let now = now_secs();
        let leeway = self.leeway_secs();
        let mut r = write(&self.inner.revoked);
        // Expired entries are dropped here too, so the set stays bounded without a timer.
        r.retain(|_, e| *e > now - leeway);
        r.insert(jti.to_owned(), exp);
    }

    /// Whether `jti` is on the revocation list.
    pub fn is_revoked(&self, jti: &str) -> bool {
        read(&self.inner.revoked).contains_key(jti)
    }
}

fn warn_open() {
    tracing::warn!(
        "AUTHD_URL is not set: this daemon runs UNAUTHENTICATED (open dev mode); every request \
         passes. Set AUTHD_URL and AUTHD_SERVICE_KEY outside local development."
    );
}

async fn poll_revoked(weak: Weak<Inner>, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failing = false;
    loop {
        tick.tick().await;
        let Some(inner) = weak.upgrade() else { return };
        let v = Verifier { inner };
        match v.refresh_revoked().await {
            Ok(()) => {
                if failing {
                    tracing::info!("revocation list from authd is reachable again");
                }
                failing = false;
            }
            Err(e) => {
                // Log once per outage, not once per poll.
                if !failing {
                    tracing::warn!(error = %e, "cannot poll authd's revocation list");
                }
                failing = true;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::JwsError;
    use crate::auth::jws::Signer;

    fn claims(now: i64) -> Claims {
        Claims {
            iss: DEFAULT_ISSUER.into(),
            sub: "runed".into(),
            typ: TokenType::Service,
            scope: vec!["runs:read".into()],
            folder: None,
            jti: "j1".into(),
            iat: now,
            nbf: now,
            exp: now + 60,
            run_id: None,
            turn_id: None,
            parent_jti: None,
            egress: vec![],
            secrets: vec![],
        }
    }

    fn local(s: &Signer) -> Verifier {
        let v = Verifier::local(DEFAULT_ISSUER, Duration::from_secs(5));
        v.insert_key(s.kid(), s.verifying_key(), None);
        v
    }

    #[tokio::test]
    async fn verifies_and_checks_times() {
        let s = Signer::generate().unwrap();
        let v = local(&s);
        let now = now_secs();
        let t = s.sign(&claims(now)).unwrap();
        assert_eq!(v.verify(&t).await.unwrap().sub, "runed");
        // Cached path gives the same answer.
        assert_eq!(v.verify(&t).await.unwrap().sub, "runed");

        let mut c = claims(now);
        c.exp = now - 6;
        assert_eq!(
            v.verify(&s.sign(&c).unwrap()).await,
            Err(AuthError::Expired)
        );
        // Within leeway still passes.
        c.exp = now - 3;
        assert!(v.verify(&s.sign(&c).unwrap()).await.is_ok());
        let mut c = claims(now);
        c.nbf = now + 60;
        assert_eq!(
            v.verify(&s.sign(&c).unwrap()).await,
            Err(AuthError::NotYetValid)
        );
        let mut c = claims(now);
        c.iat = now + 60;
        assert_eq!(
            v.verify(&s.sign(&c).unwrap()).await,
            Err(AuthError::NotYetValid)
        );
        let mut c = claims(now);
        c.iss = "someone-else".into();
        assert_eq!(
            v.verify(&s.sign(&c).unwrap()).await,
            Err(AuthError::WrongIssuer)
        );
        let mut c = claims(now);
        c.typ = TokenType::Spawn;
        assert!(matches!(
            v.verify(&s.sign(&c).unwrap()).await,
            Err(AuthError::BadClaims(_))
        ));
    }

    #[tokio::test]
    async fn unknown_keys_dropped_keys_and_revocation() {
        let s = Signer::generate().unwrap();
        let other = Signer::generate().unwrap();
        let v = local(&s);
        let now = now_secs();
        let t = other.sign(&claims(now)).unwrap();
        assert_eq!(v.verify(&t).await, Err(AuthError::UnknownKey));
        let t = s.sign(&claims(now)).unwrap();
        assert!(v.verify(&t).await.is_ok());
        v.mark_revoked("j1", now + 60);
        assert_eq!(v.verify(&t).await, Err(AuthError::Revoked));
        let mut c = claims(now);
        c.jti = "j2".into();
        let t2 = s.sign(&c).unwrap();
        assert!(v.verify(&t2).await.is_ok());
        // A key past its drop time stops verifying, cached tokens included.
        v.insert_key(s.kid(), s.verifying_key(), Some(now - 1));
        assert_eq!(v.verify(&t2).await, Err(AuthError::UnknownKey));
        assert!(v.kids().is_empty());
    }

    #[tokio::test]
    async fn cached_token_still_checks_time() {
        let s = Signer::generate().unwrap();
        let v = local(&s); // 5 s leeway
        let now = now_secs();
        let t = s.sign(&claims(now)).unwrap();
        assert!(v.verify_at(&t, now).await.is_ok());
        assert_eq!(v.cache_len(), 1);
        // exp is now + 60: fine until the leeway runs out, then expired, from the cache.
        assert!(v.verify_at(&t, now + 64).await.is_ok());
        assert_eq!(v.verify_at(&t, now + 65).await, Err(AuthError::Expired));
        // nbf/iat are now: a clock more than the leeway behind sees it as not yet valid.
        assert_eq!(v.verify_at(&t, now - 6).await, Err(AuthError::NotYetValid));
        assert_eq!(v.cache_len(), 1);
        assert!(v.verify_at(&t, now).await.is_ok());
    }

    #[tokio::test]
    async fn cached_token_revoked_or_key_dropped() {
        let s = Signer::generate().unwrap();
        let v = local(&s);
        let now = now_secs();
        let t = s.sign(&claims(now)).unwrap();
        assert!(v.verify(&t).await.is_ok());
        v.mark_revoked("j1", now + 60);
        assert_eq!(v.verify(&t).await, Err(AuthError::Revoked));

        let mut c = claims(now);
        c.jti = "j2".into();
        let t2 = s.sign(&c).unwrap();
        assert!(v.verify(&t2).await.is_ok());
        v.remove_key(s.kid());
        assert_eq!(v.verify(&t2).await, Err(AuthError::UnknownKey));
        assert_eq!(v.cache_len(), 0);

        // Another key under the same kid: the entry cached under the old key does not pass.
        v.insert_key(s.kid(), s.verifying_key(), None);
        assert!(v.verify(&t2).await.is_ok());
        let other = Signer::generate().unwrap();
        v.insert_key(s.kid(), other.verifying_key(), None);
        assert_eq!(v.verify(&t2).await, Err(AuthError::BadSignature));
        // Back to the right key, then it retires: cached or not, it stops verifying.
        v.insert_key(s.kid(), s.verifying_key(), Some(now + 30));
        assert!(v.verify_at(&t2, now).await.is_ok());
        assert_eq!(v.cache_len(), 1);
        assert_eq!(v.verify_at(&t2, now + 30).await, Err(AuthError::UnknownKey));
    }

    #[tokio::test]
    async fn tampered_variant_of_cached_token_is_rejected() {
        let s = Signer::generate().unwrap();
        let v = local(&s);
        let now = now_secs();
        let t = s.sign(&claims(now)).unwrap();
        assert_eq!(v.verify(&t).await.unwrap().scope, vec!["runs:read"]);
        assert_eq!(v.cache_len(), 1);

        // The payload of another genuine token under this token's signature.
        let mut c = claims(now);
        c.scope = vec!["runs:*".into()];
        let wider = s.sign(&c).unwrap();
        let parts: Vec<&str> = t.split('.').collect();
        let wider_payload = wider.split('.').nth(1).unwrap();
        let spliced = format!("{}.{}.{}", parts[0], wider_payload, parts[2]);
        assert_eq!(v.verify(&spliced).await, Err(AuthError::BadSignature));

        // One signature character changed.
        let mut flipped = t.clone().into_bytes();
        let i = parts[0].len() + parts[1].len() + 5;
        flipped[i] = if flipped[i] == b'A' { b'B' } else { b'A' };
        let flipped = String::from_utf8(flipped).unwrap();
        assert!(v.verify(&flipped).await.is_err());
        assert!(v.verify(&format!("{t}A")).await.is_err());
        // Failures are not remembered; the genuine token still passes.
        assert_eq!(v.cache_len(), 1);
        assert!(v.verify(&t).await.is_ok());
    }

    #[tokio::test]
    async fn cache_stays_bounded() {
        let s = Signer::generate().unwrap();
        let v = local(&s);
        let now = now_secs();
        let mut c = claims(now);
        for i in 0..CACHE_CAP + 8 {
            c.jti = format!("j{i}");
            assert!(v.verify(&s.sign(&c).unwrap()).await.is_ok());
            assert!(v.cache_len() <= CACHE_CAP);
        }
        assert!(v.cache_len() >= 1);
    }

    /// HMAC-SHA256 (RFC 2104), to forge HS256 tokens keyed with the public key.
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

    /// Forged tokens, each built by hand, refused with the error that names what is wrong;
    /// those whose only fault is in the envelope carry a genuine signature by the trusted key,
    /// so the envelope alone refuses them.
    #[tokio::test]
    async fn forged_tokens_get_the_right_error() {
        use base64::Engine as _;
        use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
        use ed25519_dalek::Signer as _;
        use serde_json::json;

        let s = Signer::generate().unwrap();
        let v = local(&s); // 5 s leeway
        let dalek = ed25519_dalek::SigningKey::from_bytes(&s.secret_bytes());
        let enc = |v: &serde_json::Value| B64.encode(serde_json::to_vec(v).unwrap());
        // A token with this header and payload, signed by the trusted key.
        let signed = |h: &serde_json::Value, p: &serde_json::Value| {
            let input = format!("{}.{}", enc(h), enc(p));
            let sig = B64.encode(dalek.sign(input.as_bytes()).to_bytes());
            format!("{input}.{sig}")
        };
        let now = now_secs();
        let good = serde_json::to_value(claims(now)).unwrap();
        let header = json!({"alg": "EdDSA", "typ": "JWT", "kid": s.kid()});
        let payload = enc(&good);

        // Controls: the hand-built token and the signer's own pass, so each refusal below is
        // the forgery's doing.
        assert_eq!(
            v.verify(&signed(&header, &good)).await.unwrap().sub,
            "runed"
        );
        assert!(v.verify(&s.sign(&claims(now)).unwrap()).await.is_ok());

        let malformed = |e: JwsError| Err(AuthError::Malformed(e));
        let mut cases: Vec<(&str, String, Result<(), AuthError>)> = Vec::new();
        for sig in ["", "AAAA", &B64.encode([0u8; 64])] {
            let h = enc(&json!({"alg": "none", "typ": "JWT", "kid": s.kid()}));
            cases.push((
                "alg none",
                format!("{h}.{payload}.{sig}"),
                malformed(JwsError::Alg("none".into())),
            ));
        }
        let jwk = s.jwk();
        let jwk_json = serde_json::to_vec(&jwk).unwrap();
        for secret in [
            &s.verifying_key().to_bytes()[..],
            jwk.x.as_bytes(),
            &jwk_json,
        ] {
            let h = enc(&json!({"alg": "HS256", "typ": "JWT", "kid": s.kid()}));
            let input = format!("{h}.{payload}");
            let mac = B64.encode(hmac_sha256(secret, input.as_bytes()));
            cases.push((
                "HS256 keyed with the public key",
                format!("{input}.{mac}"),
                malformed(JwsError::Alg("HS256".into())),
            ));
        }
        let h = enc(&json!({"alg": "RS256", "typ": "JWT", "kid": s.kid()}));
        cases.push((
            "RS256",
            format!("{h}.{payload}.{}", B64.encode([7u8; 256])),
            malformed(JwsError::Alg("RS256".into())),
        ));
        let real = signed(&header, &good);
        let (h, rest) = real.split_once('.').unwrap();
        let (_, sig) = rest.split_once('.').unwrap();
        let mut wider = good.clone();
        wider["scope"] = json!(["runs:*"]);
        cases.push((
            "tampered payload",
            format!("{h}.{}.{sig}", enc(&wider)),
            Err(AuthError::BadSignature),
        ));
        let mut bits = B64.decode(sig).unwrap();
        bits[40] ^= 0x10;
        cases.push((
            "tampered signature",
            format!("{h}.{payload}.{}", B64.encode(&bits)),
            Err(AuthError::BadSignature),
        ));
        let mut small = [0u8; 64];
        small[0] = 1; // R = the identity, s = 0
        cases.push((
            "small-order R",
            format!("{h}.{payload}.{}", B64.encode(small)),
            Err(AuthError::BadSignature),
        ));
        let mut c = good.clone();
        (c["exp"], c["nbf"], c["iat"]) = (json!(now - 60), json!(now - 600), json!(now - 600));
        cases.push(("expired", signed(&header, &c), Err(AuthError::Expired)));
        let mut c = good.clone();
        (c["exp"], c["nbf"]) = (json!(now + 600), json!(now + 60));
        cases.push((
            "not yet valid",
            signed(&header, &c),
            Err(AuthError::NotYetValid),
        ));
        let mut c = good.clone();
        c["iat"] = json!(now + 60);
        cases.push((
            "issued in the future",
            signed(&header, &c),
            Err(AuthError::NotYetValid),
        ));
        cases.push((
            "missing kid",
            signed(&json!({"alg": "EdDSA", "typ": "JWT"}), &good),
            malformed(JwsError::MissingKid),
        ));
        cases.push((
            "crit",
            signed(
                &json!({"alg": "EdDSA", "typ": "JWT", "kid": s.kid(), "crit": ["exp"]}),
                &good,
            ),
            malformed(JwsError::Header("crit is not supported".into())),
        ));
        let mut c = good.clone();
        c["scope"] = json!(vec!["runs:read"; 1000]);
        let oversized = signed(&header, &c);
        assert!(oversized.len() > jws::MAX_TOKEN_LEN);
        cases.push(("oversized", oversized, malformed(JwsError::TooLong)));
        let mut c = good.clone();
        c["iss"] = json!("someone-else");
        cases.push((
            "foreign issuer",
            signed(&header, &c),
            Err(AuthError::WrongIssuer),
        ));
        let mut c = good.clone();
        c["aud"] = json!("runed");
        cases.push((
            "aud",
            signed(&header, &c),
            Err(AuthError::BadClaims("aud is not accepted".into())),
        ));
        let other = Signer::generate().unwrap();
        cases.push((
            "another key",
            other.sign(&claims(now)).unwrap(),
            Err(AuthError::UnknownKey),
        ));
        let forged_input = format!("{}.{payload}", enc(&header));
        let other_dalek = ed25519_dalek::SigningKey::from_bytes(&other.secret_bytes());
        let other_sig = B64.encode(other_dalek.sign(forged_input.as_bytes()).to_bytes());
        cases.push((
            "another key under the trusted kid",
            format!("{forged_input}.{other_sig}"),
            Err(AuthError::BadSignature),
        ));

        for (what, token, want) in &cases {
            let got = v.verify(token).await.map(|_| ());
            assert_eq!(&got, want, "{what}");
        }
        // Nothing forged was remembered; the controls were.
        assert_eq!(v.cache_len(), 2);
    }

    /// A JWKS fetch whose caller went away mid-way still counts as one: a caller that waited
    /// behind it shares its end instead of waiting out the refetch interval for another.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_fetch_dropped_mid_way_is_still_shared() {
        // An authd that takes every connection and never answers; it says when a JWKS request
        // came (the revocation poller's requests come to it too).
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", l.local_addr().unwrap());
        let (took, mut taken) = tokio::sync::mpsc::unbounded_channel();
        let held = tokio::spawn(async move {
            let mut conns = tokio::task::JoinSet::new();
            while let Ok((mut c, _)) = l.accept().await {
                let took = took.clone();
                conns.spawn(async move {
                    use tokio::io::AsyncReadExt;
                    let mut head = Vec::new();
                    let mut buf = [0u8; 512];
                    while let Ok(n @ 1..) = c.read(&mut buf).await {
                        head.extend_from_slice(&buf[..n]);
                        if head.starts_with(b"GET /v1/keys") {
                            let _ = took.send(());
                            break;
                        }
                        if head.windows(4).any(|w| w == b"\r\n\r\n") {
                            break;
                        }
                    }
                    // Held, never answered.
                    std::future::pending::<()>().await;
                });
            }
        });
        const INTERVAL: Duration = Duration::from_secs(30);
        let v = Verifier::new(VerifierConfig {
            min_refetch_interval: INTERVAL,
            revoked_poll: INTERVAL,
            http_timeout: INTERVAL,
            ..VerifierConfig::remote(url)
        })
        .unwrap();
        let s = Signer::generate().unwrap();
        let token = s.sign(&claims(now_secs())).unwrap();
        let first = tokio::spawn({
            let v = v.clone();
            async move { v.verify(&token).await }
        });
        // The first caller's fetch is on the wire (authd has its request). What a caller
        // arriving now reads (watching the gate instead raced: a test's `try_lock` could hand
        // the gate to the first caller still queued for it, before its fetch began):
        taken.recv().await.unwrap();
        let seen = v.inner.fetches.load(Ordering::Acquire);
        first.abort();
        assert!(first.await.unwrap_err().is_cancelled());
        assert_eq!(v.inner.fetches.load(Ordering::Acquire), seen + 1);
        let Mode::Remote(client) = &v.inner.mode else {
            unreachable!()
        };
        let shared = tokio::time::timeout(INTERVAL / 2, v.refetch(client, seen, true)).await;
        assert!(
            matches!(shared, Ok(Ok(false))),
            "the waiting caller shares the dropped fetch: {shared:?}"
        );
        held.abort();
    }

    #[tokio::test]
    async fn open_mode_cannot_verify() {
        let v = Verifier::new(VerifierConfig::default()).unwrap();
        assert!(v.is_open());
        assert!(matches!(
            v.verify("x").await,
            Err(AuthError::Unavailable(_))
        ));
    }

    #[test]
    fn config_from_env() {
        // No authd: refused unless open dev mode is asked for, and then on loopback only.
        let e = VerifierConfig::from_env(&Env::from_pairs([("X", "y")])).unwrap_err();
        assert!(e.to_string().contains("AUTHD_URL is required"), "{e}");
        assert!(e.to_string().contains("HAKO_OPEN_DEV=1"), "{e}");
        let e = VerifierConfig::from_env(&Env::from_pairs([("AUTHD_URL", "")])).unwrap_err();
        assert_eq!(
            e.to_string(),
            "AUTHD_URL is set but empty: give it a value or unset it"
        );
        let e = VerifierConfig::from_env(&Env::from_pairs([
            ("AUTHD_URL", ""),
            ("HAKO_OPEN_DEV", "1"),
        ]))
        .unwrap_err();
        assert!(
            e.to_string().contains("empty"),
            "an empty URL never means open: {e}"
        );
        let c = VerifierConfig::from_env(&Env::from_pairs([("HAKO_OPEN_DEV", "1")])).unwrap();
        assert!(c.authd_url.is_none());
        c.check_open_listen("LISTEN_ADDR", "127.0.0.1:1".parse().unwrap())
            .unwrap();
        let e = c
            .check_open_listen("LISTEN_ADDR", "0.0.0.0:8182".parse().unwrap())
            .unwrap_err();
        assert!(e.to_string().contains("LISTEN_ADDR"), "{e}");
        assert!(VerifierConfig::from_env(&Env::from_pairs([("HAKO_OPEN_DEV", "maybe")])).is_err());
        assert!(
            VerifierConfig::from_env(&Env::from_pairs([
                ("HAKO_OPEN_DEV", "1"),
                ("AUTHD_URL", "http://127.0.0.1:8181")
            ]))
            .is_err()
        );
        let c = VerifierConfig::from_env(&Env::from_pairs([
            ("AUTHD_URL", "http://127.0.0.1:8181"),
            ("AUTHD_CLOCK_SKEW", "5s"),
        ]))
        .unwrap();
        assert_eq!(c.leeway, Duration::from_secs(5));
        let e =
            VerifierConfig::from_env(&Env::from_pairs([("AUTHD_URL", "https://x")])).unwrap_err();
        assert!(e.to_string().contains("AUTHD_URL"));
    }
}
