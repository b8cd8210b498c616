//! The egress proxy's engine side (`specs/egress.md`): one proxy container per install
//! (`hako-<install>-egress`), kept running by runed, and one internal network per
//! `allowlist` run whose only other member is the proxy (alias `hako-egress`).
//!
//! A run's network is `internal` (no route out) and its bridge has no address on the host
//! (`inhibit_ipv4`): the agent reaches the proxy, and nothing else, not even the host. The
//! proxy reaches targets through the install's egress networks (`RUNED_EGRESS_NETWORKS`).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hako_shared::allowlist::{NO_PROXY_VARS, PROXY_VARS};
use hako_shared::config::{ConfigError, Env};
use hako_shared::ids::RunId;
use hako_shared::secrets::SecretClaim;
use sha2::{Digest, Sha256};

use super::engine::{
    BoxKind, ContainerSpec, Engine, EngineError, Inspected, Limits, NetworkSpec, labels,
};
use super::mounts::{CA_BUNDLE, Layout, MountEntry};
use super::secret_store::{SecretStore, proxy_owner};

/// The name every run network gives the proxy.
pub const PROXY_ALIAS: &str = "hako-egress";
/// The proxy's port.
pub const PROXY_PORT: u16 = 3128;
/// The proxy's ops port (`/ready`).
pub const ADMIN_PORT: u16 = 3129;
/// `io.hako.role` of the proxy container and of run networks.
pub const ROLE_PROXY: &str = "egress";
/// `io.hako.role` of a run's network.
pub const ROLE_NETWORK: &str = "egress-net";
/// Where the proxy finds the operator's secrets (read-only).
pub const SECRETS_TARGET: &str = "/var/lib/hako-egress/secrets";
/// Where the proxy keeps its CA (its own, read-write).
pub const CA_TARGET: &str = "/var/lib/hako-egress/ca";
/// A label on the proxy container: a digest of what it was made with (image aside), so that a
/// proxy made by another configuration (another runed, no store mounted) is made again.
const LABEL_SPEC: &str = "io.hako.egress.spec";
pub use hako_shared::secrets::CA_BUNDLE_VARS;

/// runed's egress settings; `None` in [`super::RunnerConfig`] (no `RUNED_EGRESS_IMAGE`) means
/// no proxy, and `allowlist` runs are refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EgressConfig {
    /// `RUNED_EGRESS_IMAGE`: the proxy's image (`hako-images build hako-egress`).
    pub image: String,
    /// `RUNED_EGRESS_NETWORKS` (default `bridge`): the networks the proxy reaches targets
    /// (and authd) through; runed reaches its `/ready` on the first.
    pub networks: Vec<String>,
    /// `RUNED_EGRESS_AUTHD_URL` (default `AUTHD_URL`): authd as the proxy's container sees it.
    pub authd_url: String,
    /// `RUNED_EGRESS_CHECK` (default 2s): how often the proxy is checked and, if gone,
    /// recreated.
    pub check: Duration,
    /// What the proxy container gets: every `EGRESS_*`, `AUTHD_ISSUER`, `AUTHD_CLOCK_SKEW`,
    /// `AUTHD_JWKS_*`, `AUTHD_REVOKED_POLL`, `LOG_FORMAT` and `RUST_LOG` of runed's own
    /// environment (none is a secret: the proxy has none).
    pub env: Vec<(String, String)>,
}

impl EgressConfig {
    /// Reads the settings; `None` without `RUNED_EGRESS_IMAGE`.
    pub fn from_env(env: &Env) -> Result<Option<Self>, ConfigError> {
        let Some(image) = env.get("RUNED_EGRESS_IMAGE") else {
            return Ok(None);
        };
        let authd_url = env
            .get("RUNED_EGRESS_AUTHD_URL")
            .or_else(|| env.get("AUTHD_URL"))
            .ok_or_else(|| ConfigError::Invalid {
                var: "RUNED_EGRESS_IMAGE".into(),
                value: image.into(),
                reason: "the egress proxy needs authd (AUTHD_URL or RUNED_EGRESS_AUTHD_URL): it has no open mode".into(),
            })?
            .to_owned();
        let networks: Vec<String> = env
            .string_or("RUNED_EGRESS_NETWORKS", "bridge")
            .split(',')
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty())
            .collect();
        if networks.is_empty() || networks.iter().any(|n| n == "none" || n == "host") {
            return Err(ConfigError::Invalid {
                var: "RUNED_EGRESS_NETWORKS".into(),
                value: networks.join(","),
                reason: "name one or more Docker networks (not none or host)".into(),
            });
        }
        let check = env.duration_or("RUNED_EGRESS_CHECK", Duration::from_secs(2))?;
        if check < Duration::from_millis(100) {
            return Err(ConfigError::Invalid {
                var: "RUNED_EGRESS_CHECK".into(),
                value: format!("{check:?}"),
                reason: "must be at least 100ms".into(),
            });
        }
        let passed = |k: &str| {
            k.starts_with("EGRESS_")
                || k.starts_with("AUTHD_JWKS_")
                || matches!(
                    k,
                    "AUTHD_ISSUER"
                        | "AUTHD_CLOCK_SKEW"
                        | "AUTHD_REVOKED_POLL"
                        | "LOG_FORMAT"
                        | "RUST_LOG"
                )
        };
        // The listeners and the broker's paths are the container's, set by runed; the extra
        // roots (a test's CA) pass.
        let own = [
            "EGRESS_LISTEN",
            "EGRESS_ADMIN_LISTEN",
            "EGRESS_SECRETS_DIR",
            "EGRESS_CA_DIR",
            "EGRESS_SYSTEM_ROOTS",
        ];
        let mut vars: Vec<(String, String)> = env
            .pairs()
            .filter(|(k, _)| passed(k) && !own.contains(k))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        vars.sort();
        Ok(Some(Self {
            image: image.to_owned(),
            networks,
            authd_url,
            check,
            env: vars,
        }))
    }
}

/// The install's proxy: its container and the run networks, on the runner's engine.
pub struct Egress {
    engine: Arc<dyn Engine>,
    cfg: EgressConfig,
    install: String,
    timeout: Duration,
    layout: Layout,
    /// The operator's secrets and the proxy's CA directory (its bind sources).
    store: SecretStore,
    /// One creation at a time.
    gate: tokio::sync::Mutex<()>,
    /// The last check's verdict, for `/ready`.
    status: Mutex<Result<(), String>>,
    http: reqwest::Client,
}

impl std::fmt::Debug for Egress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Egress")
            .field("image", &self.cfg.image)
            .field("networks", &self.cfg.networks)
            .finish_non_exhaustive()
    }
}

/// What a check found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Checked {
    /// Running and ready.
    Ready,
    /// Running, not ready (its `/ready` said why).
    NotReady,
    /// It was gone or stopped and has been created again.
    Recreated,
}

impl Egress {
    /// The proxy of `install`, as `cfg` describes it, its files under `layout`'s data root.
    pub fn new(
        engine: Arc<dyn Engine>,
        cfg: EgressConfig,
        install: String,
        timeout: Duration,
        layout: Layout,
    ) -> Self {
        let http = reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(2))
            .build()
            .unwrap_or_default();
        Self {
            engine,
            cfg,
            install,
            timeout,
            store: SecretStore::new(&layout.data_dir, proxy_owner()),
            layout,
            gate: tokio::sync::Mutex::new(()),
            status: Mutex::new(Err("the egress proxy has not been checked yet".into())),
            http,
        }
    }

    /// The settings.
    pub fn config(&self) -> &EgressConfig {
        &self.cfg
    }

    /// The proxy container's name.
    pub fn container_name(&self) -> String {
        format!("hako-{}-egress", self.install)
    }

    fn network_name(&self, run_id: &RunId) -> String {
        let clean: String = run_id
            .chars()
            .filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
            .take(64)
            .collect();
        format!("hako-{}-eg-{clean}", self.install)
    }

    /// The environment of an `allowlist` agent: the proxy in every proxy variable, no
    /// credentials (the agent adds its token from stdin: `specs/egress.md`), `NO_PROXY` empty.
    pub fn agent_env() -> Vec<String> {
        let url = format!("http://{PROXY_ALIAS}:{PROXY_PORT}");
        PROXY_VARS
            .iter()
            .map(|k| format!("{k}={url}"))
            .chain(NO_PROXY_VARS.iter().map(|k| format!("{k}=")))
            .collect()
    }

    /// A box's environment for its brokered secrets: each placeholder under the secret's
    /// name, and the CA bundle in every variable a common client reads.
    pub fn brokered_env(brokered: &[SecretClaim]) -> Vec<String> {
        if brokered.is_empty() {
            return Vec::new();
        }
        brokered
            .iter()
            .map(|c| format!("{}={}", c.name.as_str(), c.placeholder.as_str()))
            .chain(CA_BUNDLE_VARS.iter().map(|k| format!("{k}={CA_BUNDLE}")))
            .collect()
    }

    /// Whether the CA bundle boxes trust has been written.
    pub fn has_bundle(&self) -> bool {
        self.store.has_bundle()
    }

    /// The last check's verdict (`/ready`).
    pub fn status(&self) -> Result<(), String> {
        self.status
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn set_status(&self, s: Result<(), String>) {
        *self.status.lock().unwrap_or_else(|p| p.into_inner()) = s;
    }

    /// Makes sure the proxy runs (creating it, and joining it to every live run network, if
    /// it is gone or stopped), then asks its `/ready`. Called on a timer and before each
    /// `allowlist` run.
    pub async fn check(&self) -> Result<Checked, EngineError> {
        let result = self.check_inner().await;
        match &result {
            Ok(Checked::Ready | Checked::Recreated) => {}
            Ok(Checked::NotReady) => {}
            Err(e) => self.set_status(Err(format!("egress proxy: {e}"))),
        }
        result
    }

    async fn check_inner(&self) -> Result<Checked, EngineError> {
        let _one = self.gate.lock().await;
        let name = self.container_name();
        let t = self.timeout;
        let found: Option<Inspected> = match self.engine.inspect(&name, t).await {
            Ok(info) => Some(info),
            Err(EngineError::NotFound(_)) => None,
            Err(e) => return Err(e),
        };
        let running = found.as_ref().is_some_and(|i| i.state.running);
        let (spec, digest) = self.spec();
        // Made from another image, or by another configuration (another runed, no store
        // mounted): made again.
        let stale = found.as_ref().is_some_and(|i| {
            i.image != self.cfg.image || i.labels.get(LABEL_SPEC) != Some(&digest)
        });
        let mut recreated = false;
        if !running || stale {
            if found.is_some() {
                tracing::warn!(container = %name, running, stale, "the egress proxy is gone, stopped or stale: recreating it");
                self.engine.remove(&name, None, t).await?;
            }
            self.create(spec).await?;
            recreated = true;
        }
        let ip = self.admin_ip().await?;
        let ready = match ip {
            Some(ip) => match self.ready(&ip).await {
                Ok(()) => self.fetch_bundle(&ip).await,
                Err(e) => Err(e),
            },
            None => Err(format!(
                "the egress proxy has no address on {}",
                self.cfg.networks[0]
            )),
        };
        let up = ready.is_ok();
        self.set_status(ready.map_err(|e| format!("egress proxy: {e}")));
        Ok(match (recreated, up) {
            (true, _) => Checked::Recreated,
            (false, true) => Checked::Ready,
            (false, false) => Checked::NotReady,
        })
    }

    async fn ready(&self, ip: &str) -> Result<(), String> {
        let url = format!("http://{ip}:{ADMIN_PORT}/ready");
        let resp = self
            .http
            .get(&url)
            .send()
            .await
            .map_err(|e| format!("{url}: {}", e.without_url()))?;
        if resp.status().is_success() {
            Ok(())
        } else {
            let body = resp.text().await.unwrap_or_default();
            Err(format!(
                "{url} answered: {}",
                body.chars().take(300).collect::<String>()
            ))
        }
    }

    /// Fetches the proxy's CA bundle (system roots and the install's CA, public) and writes it
    /// where boxes with brokered secrets mount it from, if it changed.
    async fn fetch_bundle(&self, ip: &str) -> Result<(), String> {
        let url = format!("http://{ip}:{ADMIN_PORT}/v1/ca-bundle.pem");
        let resp = self
            .http
            .get(&url)
            .send()
            .await
            .map_err(|e| format!("{url}: {}", e.without_url()))?;
        if !resp.status().is_success() {
            return Err(format!("{url} answered {}", resp.status()));
        }
        let pem = resp
            .bytes()
            .await
            .map_err(|e| format!("{url}: {}", e.without_url()))?;
        if pem.len() > 16 << 20 || !pem.windows(27).any(|w| w == b"-----BEGIN CERTIFICATE-----") {
            return Err(format!("{url}: not a PEM bundle"));
        }
        let store = self.store.clone();
        let changed = tokio::task::spawn_blocking(move || store.write_bundle(&pem))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| format!("writing the CA bundle: {e}"))?;
        if changed {
            tracing::info!(path = %self.store.bundle_path().display(), "the egress proxy's CA bundle written");
        }
        Ok(())
    }

    /// The proxy's address on the first egress network (where runed reaches `/ready`).
    async fn admin_ip(&self) -> Result<Option<String>, EngineError> {
        let mut info = self
            .engine
            .inspect(&self.container_name(), self.timeout)
            .await?;
        Ok(info.addresses.remove(&self.cfg.networks[0]))
    }

    /// What the proxy container is made of, and a digest of it (its label).
    fn spec(&self) -> (ContainerSpec, String) {
        let mut env = vec![format!("AUTHD_URL={}", self.cfg.authd_url)];
        env.extend(self.cfg.env.iter().map(|(k, v)| format!("{k}={v}")));
        env.push(format!("EGRESS_SECRETS_DIR={SECRETS_TARGET}"));
        env.push(format!("EGRESS_CA_DIR={CA_TARGET}"));
        let owner = proxy_owner();
        let user = format!("{}:{}", owner.uid, owner.gid);
        let bind = |source: std::path::PathBuf, target: &str, readonly: bool| MountEntry {
            source: self.layout.host_path(&source),
            target: target.to_owned(),
            readonly,
        };
        // The store is read-only to the proxy; its CA directory is its own.
        let mounts = vec![
            bind(self.store.secrets_dir(), SECRETS_TARGET, true),
            bind(self.store.ca_dir(), CA_TARGET, false),
        ];
        let sources: Vec<String> = mounts
            .iter()
            .map(|m| m.source.display().to_string())
            .collect();
        let mut h = Sha256::new();
        for part in env.iter().chain([&user]).chain(&sources) {
            h.update(part.as_bytes());
            h.update(b"\0");
        }
        let digest: String = h
            .finalize()
            .iter()
            .take(8)
            .map(|b| format!("{b:02x}"))
            .collect();
        let spec = ContainerSpec {
            name: self.container_name(),
            image: self.cfg.image.clone(),
            user,
            env,
            cmd: None,
            mounts,
            network: self.cfg.networks[0].clone(),
            limits: Limits {
                memory: 256 << 20,
                cpus: 1.0,
                pids: 256,
            },
            labels: HashMap::from([
                (labels::INSTALL.to_owned(), self.install.clone()),
                (labels::ROLE.to_owned(), ROLE_PROXY.to_owned()),
                (LABEL_SPEC.to_owned(), digest.clone()),
            ]),
            stdin: false,
            runtime: None,
            kind: BoxKind::Service,
        };
        (spec, digest)
    }

    /// Creates and starts the proxy container, on the egress networks and every live run
    /// network of this install. Its directories are made first (owned by its user).
    async fn create(&self, spec: ContainerSpec) -> Result<(), EngineError> {
        let name = self.container_name();
        let t = self.timeout;
        let store = self.store.clone();
        tokio::task::spawn_blocking(move || store.ensure())
            .await
            .map_err(|e| EngineError::Api {
                status: None,
                message: e.to_string(),
            })?
            .map_err(|e| EngineError::Api {
                status: None,
                message: format!("the egress proxy's directories: {e}"),
            })?;
        let id = self.engine.create(&spec, t).await?;
        for net in self.cfg.networks.iter().skip(1) {
            self.join(net, &id, false).await?;
        }
        for net in self.run_networks().await? {
            self.join(&net, &id, true).await?;
        }
        self.engine.start(&id, t).await?;
        tracing::info!(container = %name, image = %self.cfg.image, "egress proxy started");
        Ok(())
    }

    async fn join(&self, net: &str, container: &str, alias: bool) -> Result<(), EngineError> {
        self.engine
            .connect(net, container, alias.then_some(PROXY_ALIAS), self.timeout)
            .await
    }

    /// This install's run networks, by name.
    async fn run_networks(&self) -> Result<Vec<String>, EngineError> {
        Ok(self
            .run_networks_labelled()
            .await?
            .into_iter()
            .map(|(name, _)| name)
            .collect())
    }

    /// This install's run networks: (name, run id).
    async fn run_networks_labelled(&self) -> Result<Vec<(String, String)>, EngineError> {
        let listed = self
            .engine
            .networks(labels::INSTALL, &self.install, self.timeout)
            .await?;
        Ok(listed
            .into_iter()
            .filter(|n| n.labels.get(labels::ROLE).map(String::as_str) == Some(ROLE_NETWORK))
            .map(|n| {
                let run = n.labels.get(labels::RUN).cloned().unwrap_or_default();
                (n.name, run)
            })
            .collect())
    }

    /// Creates `run_id`'s network (internal, no address on the host) and joins the proxy to
    /// it; returns the network's name, for the agent's `NetworkMode`. The proxy is checked
    /// (and recreated) first, so a run never starts against a dead proxy.
    pub async fn attach_run(&self, run_id: &RunId, folder: &str) -> Result<String, EngineError> {
        if self.check().await? == Checked::NotReady {
            // A proxy that runs but cannot check tokens refuses everything: the run may
            // start, its requests fail closed, and `/ready` says why.
            tracing::warn!(
                run = %run_id,
                "starting an allowlist run while the egress proxy is not ready"
            );
        }
        let name = self.network_name(run_id);
        let net = NetworkSpec {
            name: name.clone(),
            // No route out, and no address on the host: the agent reaches the proxy only.
            internal: true,
            host_unreachable: true,
            labels: HashMap::from([
                (labels::INSTALL.to_owned(), self.install.clone()),
                (labels::RUN.to_owned(), run_id.to_string()),
                (labels::FOLDER.to_owned(), folder.to_owned()),
                (labels::ROLE.to_owned(), ROLE_NETWORK.to_owned()),
            ]),
        };
        self.engine.create_network(&net, self.timeout).await?;
        let proxy = self.container_name();
        if let Err(e) = self.join(&name, &proxy, true).await {
            let _ = self.remove_network(&name).await;
            return Err(e);
        }
        Ok(name)
    }

    /// Removes `run_id`'s network (the proxy leaves it first). Nothing to do is fine.
    pub async fn detach_run(&self, run_id: &RunId) -> Result<(), EngineError> {
        self.remove_network(&self.network_name(run_id)).await
    }

    async fn remove_network(&self, name: &str) -> Result<(), EngineError> {
        let proxy = self.container_name();
        if let Err(e) = self.engine.disconnect(name, &proxy, self.timeout).await {
            tracing::debug!(network = name, error = %e, "disconnecting the proxy");
        }
        self.engine.remove_network(name, self.timeout).await
    }

    /// Removes the run networks of this install whose run is not in `live`; returns how many.
    pub async fn cleanup_networks(&self, live: &HashSet<String>) -> Result<usize, EngineError> {
        let mut removed = 0;
        for (name, run) in self.run_networks_labelled().await? {
            if live.contains(&run) {
                continue;
            }
            match self.remove_network(&name).await {
                Ok(()) => removed += 1,
                // Still in use by a container being removed: the next pass takes it.
                Err(e) => tracing::debug!(network = %name, error = %e, "orphaned run network"),
            }
        }
        Ok(removed)
    }

    /// Stops and removes the proxy container (an install being torn down).
    pub async fn remove(&self) -> Result<(), EngineError> {
        self.engine
            .remove(&self.container_name(), None, self.timeout)
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings() {
        let env = Env::from_pairs([
            ("RUNED_EGRESS_IMAGE", "hako-egress:abc"),
            ("AUTHD_URL", "http://127.0.0.1:8181"),
            ("RUNED_EGRESS_AUTHD_URL", "http://authd:8181"),
            ("RUNED_EGRESS_NETWORKS", "uplink, ll"),
            ("EGRESS_PRIVATE_TARGETS", "10.0.0.0/8"),
            ("EGRESS_LISTEN", "0.0.0.0:1"),
            ("EGRESS_SECRETS_DIR", "/host/path"),
            ("AUTHD_REVOKED_POLL", "1s"),
            ("AUTHD_SERVICE_KEY", "secret-secret-secret"),
        ]);
        let c = EgressConfig::from_env(&env).unwrap().unwrap();
        assert_eq!(c.authd_url, "http://authd:8181");
        assert_eq!(c.networks, vec!["uplink", "ll"]);
        assert_eq!(
            c.env,
            vec![
                ("AUTHD_REVOKED_POLL".to_owned(), "1s".to_owned()),
                ("EGRESS_PRIVATE_TARGETS".to_owned(), "10.0.0.0/8".to_owned()),
            ],
            "no listen override, and never runed's service key"
        );
        assert_eq!(
            EgressConfig::from_env(&Env::from_pairs([("X", "1")])).unwrap(),
            None
        );
        let open = Env::from_pairs([("RUNED_EGRESS_IMAGE", "i")]);
        assert!(
            EgressConfig::from_env(&open)
                .unwrap_err()
                .to_string()
                .contains("open mode")
        );
        let bad = Env::from_pairs([
            ("RUNED_EGRESS_IMAGE", "i"),
            ("AUTHD_URL", "http://a:1"),
            ("RUNED_EGRESS_NETWORKS", "host"),
        ]);
        assert!(EgressConfig::from_env(&bad).is_err());
    }

    #[test]
    fn a_box_with_brokered_secrets_gets_placeholders_and_the_bundle() {
        use hako_shared::secrets::{Placeholder, SecretName};
        assert!(Egress::brokered_env(&[]).is_empty());
        let c = SecretClaim {
            name: SecretName::parse("GH_TOKEN").unwrap(),
            hosts: vec!["github.com".into()],
            placeholder: Placeholder::random().unwrap(),
        };
        let env = Egress::brokered_env(std::slice::from_ref(&c));
        assert!(env.contains(&format!("GH_TOKEN={}", c.placeholder.as_str())));
        for v in CA_BUNDLE_VARS {
            assert!(env.contains(&format!("{v}={CA_BUNDLE}")), "{v}");
        }
    }

    /// On the simulated engine: the proxy is made once (a `Service` box), each run's network
    /// is internal, unreachable from the host and has the proxy on it under its alias, and a
    /// network goes when its run is not live.
    #[tokio::test]
    async fn a_runs_network_has_the_proxy_alone_and_goes_with_the_run() {
        use crate::sim::{SimEngine, agents};
        let sim = SimEngine::new();
        sim.image("hako-egress:t", &[], agents::hang());
        let tmp = tempfile::tempdir().unwrap();
        let mut cfg = crate::RunnerConfig::new(tmp.path());
        cfg.install_id = "i-1".into();
        cfg.egress = Some(EgressConfig {
            image: "hako-egress:t".into(),
            networks: vec!["uplink".into()],
            authd_url: "http://authd:8181".into(),
            check: Duration::from_secs(2),
            env: Vec::new(),
        });
        let runner = crate::Runner::new(Arc::new(sim.clone()), cfg).unwrap();
        let e = runner.egress().unwrap();
        let run = RunId::new("run-1").unwrap();
        let net = e.attach_run(&run, "team").await.unwrap();

        let [proxy] = sim.running().try_into().unwrap();
        let spec = sim.spec(&proxy).unwrap();
        assert_eq!(spec.name, "hako-i-1-egress");
        assert_eq!(
            (spec.kind, spec.network.as_str()),
            (BoxKind::Service, "uplink")
        );
        assert_eq!(spec.labels[labels::ROLE], ROLE_PROXY);
        let nets = sim.networks();
        let [(n, members)] = &nets[..] else {
            panic!("{nets:?}")
        };
        assert_eq!(n.name, net);
        assert!(n.internal && n.host_unreachable, "{n:?}");
        assert_eq!(
            (
                n.labels[labels::RUN].as_str(),
                n.labels[labels::ROLE].as_str()
            ),
            ("run-1", ROLE_NETWORK)
        );
        assert_eq!(members, &[(proxy.clone(), Some(PROXY_ALIAS.to_owned()))]);

        // The same run again (a retry) is the same network, and a running proxy is kept.
        assert_eq!(e.attach_run(&run, "team").await.unwrap(), net);
        assert_eq!(sim.created(), 1);

        // The sweep keeps a live run's network and removes the others'.
        let live = HashSet::from(["run-1".to_owned()]);
        assert_eq!(e.cleanup_networks(&live).await.unwrap(), 0);
        assert_eq!(e.cleanup_networks(&HashSet::new()).await.unwrap(), 1);
        assert!(sim.networks().is_empty());
        // Gone already is done.
        e.detach_run(&run).await.unwrap();
    }

    #[test]
    fn the_agent_gets_the_proxy_without_credentials() {
        let env = Egress::agent_env();
        assert!(env.contains(&"HTTPS_PROXY=http://hako-egress:3128".to_owned()));
        assert!(env.contains(&"http_proxy=http://hako-egress:3128".to_owned()));
        assert!(env.contains(&"NO_PROXY=".to_owned()) && env.contains(&"no_proxy=".to_owned()));
        assert!(env.iter().all(|v| !v.contains('@')));
    }
}
