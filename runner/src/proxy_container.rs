//! The egress proxy's Docker side (`specs/egress.md`): one proxy container per install
//! (`hako-<install>-egress`), kept running by runed, and one internal network per
//! `allowlist` run whose only other member is the proxy (alias `hako-egress`).
//!
//! A run's network is `internal` (no route out) and its bridge has no address on the host
//! (`inhibit_ipv4`): the agent reaches the proxy, and nothing else, not even the host. The
//! proxy reaches targets through the install's egress networks (`RUNED_EGRESS_NETWORKS`).

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::Duration;

use bollard::Docker;
use bollard::models::{
    ContainerCreateBody, EndpointSettings, HostConfig, Mount, MountType, NetworkConnectRequest,
    NetworkCreateRequest, NetworkDisconnectRequest,
};
use bollard::query_parameters::{CreateContainerOptionsBuilder, ListNetworksOptionsBuilder};

use hako_shared::allowlist::{NO_PROXY_VARS, PROXY_VARS};
use hako_shared::config::{ConfigError, Env};
use hako_shared::ids::RunId;
use hako_shared::secrets::SecretClaim;
use sha2::{Digest, Sha256};

use super::docker;
use super::engine::{EngineError, labels};
use super::mounts::{CA_BUNDLE, Layout};
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

/// The install's proxy: its container and the run networks.
pub struct Egress {
    docker: Docker,
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
        docker: Docker,
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
            docker,
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
        let found = match docker::bounded(
            "inspect",
            t,
            &name,
            self.docker.inspect_container(&name, None),
        )
        .await
        {
            Ok(info) => Some(info),
            Err(EngineError::NotFound(_)) => None,
            Err(e) => return Err(e),
        };
        let running = found
            .as_ref()
            .and_then(|i| i.state.as_ref())
            .and_then(|s| s.running)
            .unwrap_or(false);
        let stale_image = found
            .as_ref()
            .and_then(|i| i.config.as_ref())
            .and_then(|c| c.image.as_deref())
            .is_some_and(|img| img != self.cfg.image);
        let (body, digest) = self.body()?;
        let stale_spec = found
            .as_ref()
            .and_then(|i| i.config.as_ref())
            .and_then(|c| c.labels.as_ref())
            .is_some_and(|l| l.get(LABEL_SPEC) != Some(&digest));
        let stale_image = stale_image || stale_spec;
        let mut recreated = false;
        if !running || stale_image {
            if found.is_some() {
                tracing::warn!(container = %name, running, stale_image, "the egress proxy is gone or stopped: recreating it");
                docker::remove(&self.docker, &name, t).await?;
            }
            self.create(body).await?;
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
        let name = self.container_name();
        let info = docker::bounded(
            "inspect",
            self.timeout,
            &name,
            self.docker.inspect_container(&name, None),
        )
        .await?;
        Ok(info
            .network_settings
            .and_then(|n| n.networks)
            .and_then(|mut n| n.remove(&self.cfg.networks[0]))
            .and_then(|e| e.ip_address)
            .filter(|ip| !ip.is_empty()))
    }

    /// What the proxy container is made of, and a digest of it (its label).
    fn body(&self) -> Result<(ContainerCreateBody, String), EngineError> {
        let mut env = vec![format!("AUTHD_URL={}", self.cfg.authd_url)];
        env.extend(self.cfg.env.iter().map(|(k, v)| format!("{k}={v}")));
        env.push(format!("EGRESS_SECRETS_DIR={SECRETS_TARGET}"));
        env.push(format!("EGRESS_CA_DIR={CA_TARGET}"));
        let owner = proxy_owner();
        let user = format!("{}:{}", owner.uid, owner.gid);
        let bind = |source: std::path::PathBuf, target: &str, read_only: bool| Mount {
            source: Some(self.layout.host_path(&source).display().to_string()),
            target: Some(target.to_owned()),
            typ: Some(MountType::BIND),
            read_only: Some(read_only),
            ..Default::default()
        };
        // The store is read-only to the proxy; its CA directory is its own.
        let mounts = vec![
            bind(self.store.secrets_dir(), SECRETS_TARGET, true),
            bind(self.store.ca_dir(), CA_TARGET, false),
        ];
        let mut h = Sha256::new();
        for part in env
            .iter()
            .chain([&user])
            .chain(mounts.iter().filter_map(|m| m.source.as_ref()))
        {
            h.update(part.as_bytes());
            h.update(b"\0");
        }
        let digest: String = h
            .finalize()
            .iter()
            .take(8)
            .map(|b| format!("{b:02x}"))
            .collect();
        let body = ContainerCreateBody {
            image: Some(self.cfg.image.clone()),
            env: Some(env),
            user: Some(user),
            labels: Some(HashMap::from([
                (labels::INSTALL.to_owned(), self.install.clone()),
                (labels::ROLE.to_owned(), ROLE_PROXY.to_owned()),
                (LABEL_SPEC.to_owned(), digest.clone()),
            ])),
            host_config: Some(HostConfig {
                mounts: Some(mounts),
                cap_drop: Some(vec!["ALL".into()]),
                security_opt: Some(vec!["no-new-privileges:true".into()]),
                privileged: Some(false),
                readonly_rootfs: Some(true),
                memory: Some(256 << 20),
                memory_swap: Some(256 << 20),
                nano_cpus: Some(1_000_000_000),
                pids_limit: Some(256),
                network_mode: Some(self.cfg.networks[0].clone()),
                ipc_mode: Some("private".into()),
                init: Some(true),
                log_config: Some(docker::log_config()),
                ..Default::default()
            }),
            ..Default::default()
        };
        Ok((body, digest))
    }

    /// Creates and starts the proxy container, on the egress networks and every live run
    /// network of this install. Its directories are made first (owned by its user).
    async fn create(&self, body: ContainerCreateBody) -> Result<(), EngineError> {
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
        let opts = CreateContainerOptionsBuilder::new().name(&name).build();
        let id = match docker::bounded(
            "create",
            t,
            &self.cfg.image,
            self.docker.create_container(Some(opts), body),
        )
        .await
        {
            Ok(r) => r.id,
            Err(EngineError::NotFound(_)) => {
                return Err(EngineError::ImageMissing(self.cfg.image.clone()));
            }
            Err(e) => return Err(e),
        };
        for net in self.cfg.networks.iter().skip(1) {
            self.join(net, &id, false).await?;
        }
        for net in self.run_networks().await? {
            self.join(&net, &id, true).await?;
        }
        docker::bounded("start", t, &id, self.docker.start_container(&id, None)).await?;
        tracing::info!(container = %name, image = %self.cfg.image, "egress proxy started");
        Ok(())
    }

    async fn join(&self, net: &str, container: &str, alias: bool) -> Result<(), EngineError> {
        let req = NetworkConnectRequest {
            container: container.to_owned(),
            endpoint_config: Some(EndpointSettings {
                aliases: alias.then(|| vec![PROXY_ALIAS.to_owned()]),
                ..Default::default()
            }),
        };
        match docker::bounded(
            "network connect",
            self.timeout,
            net,
            self.docker.connect_network(net, req),
        )
        .await
        {
            Ok(()) => Ok(()),
            // Joined already (a retry after a partial failure).
            Err(EngineError::Api { message, .. }) if message.contains("already exists") => Ok(()),
            Err(e) => Err(e),
        }
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
        let filters = HashMap::from([(
            "label".to_owned(),
            vec![
                format!("{}={}", labels::INSTALL, self.install),
                format!("{}={ROLE_NETWORK}", labels::ROLE),
            ],
        )]);
        let opts = ListNetworksOptionsBuilder::new().filters(&filters).build();
        let list = docker::bounded(
            "network list",
            self.timeout,
            &self.install,
            self.docker.list_networks(Some(opts)),
        )
        .await?;
        Ok(list
            .into_iter()
            .filter_map(|n| {
                let l = n.labels.unwrap_or_default();
                // The filter is the daemon's; check it again.
                (l.get(labels::INSTALL) == Some(&self.install)
                    && l.get(labels::ROLE).map(String::as_str) == Some(ROLE_NETWORK))
                .then_some(())?;
                Some((n.name?, l.get(labels::RUN).cloned().unwrap_or_default()))
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
        let req = NetworkCreateRequest {
            name: name.clone(),
            driver: Some("bridge".into()),
            internal: Some(true),
            attachable: Some(false),
            options: Some(HashMap::from([
                // The host gets no address on this bridge: the agent cannot reach the host
                // (an internal network still routes to its gateway, which is the host).
                (
                    "com.docker.network.bridge.inhibit_ipv4".to_owned(),
                    "true".to_owned(),
                ),
                (
                    "com.docker.network.bridge.enable_ip_masquerade".to_owned(),
                    "false".to_owned(),
                ),
            ])),
            labels: Some(HashMap::from([
                (labels::INSTALL.to_owned(), self.install.clone()),
                (labels::RUN.to_owned(), run_id.to_string()),
                (labels::FOLDER.to_owned(), folder.to_owned()),
                (labels::ROLE.to_owned(), ROLE_NETWORK.to_owned()),
            ])),
            ..Default::default()
        };
        match docker::bounded(
            "network create",
            self.timeout,
            &name,
            self.docker.create_network(req),
        )
        .await
        {
            Ok(_) => {}
            // A retry of the same run after a partial failure: the network is there.
            Err(e @ EngineError::Api { .. })
                if e.is_status(409) || e.to_string().contains("already exists") => {}
            Err(e) => return Err(e),
        }
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
        let req = NetworkDisconnectRequest {
            container: self.container_name(),
            force: Some(true),
        };
        match docker::bounded(
            "network disconnect",
            self.timeout,
            name,
            self.docker.disconnect_network(name, req),
        )
        .await
        {
            Ok(()) | Err(EngineError::NotFound(_)) => {}
            // Not connected (the proxy was recreated without it, or never joined).
            Err(e @ EngineError::Api { .. })
                if e.is_status(403) || e.to_string().contains("not connected") => {}
            Err(e) => tracing::debug!(network = name, error = %e, "disconnecting the proxy"),
        }
        match docker::bounded(
            "network remove",
            self.timeout,
            name,
            self.docker.remove_network(name),
        )
        .await
        {
            Ok(()) | Err(EngineError::NotFound(_)) => Ok(()),
            Err(e) => Err(e),
        }
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
        docker::remove(&self.docker, &self.container_name(), self.timeout).await
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

    #[test]
    fn the_agent_gets_the_proxy_without_credentials() {
        let env = Egress::agent_env();
        assert!(env.contains(&"HTTPS_PROXY=http://hako-egress:3128".to_owned()));
        assert!(env.contains(&"http_proxy=http://hako-egress:3128".to_owned()));
        assert!(env.contains(&"NO_PROXY=".to_owned()) && env.contains(&"no_proxy=".to_owned()));
        assert!(env.iter().all(|v| !v.contains('@')));
    }
}
