//! The egress rig, shared by `tests/egress.rs` and `benches/egress.rs`: a real authd and
//! runed in-process, the `hako-egress` proxy runed starts, networks of our own (an uplink
//! whose gateway address is the host's, a link-local one) and targets on them (HTTP, TLS,
//! a "private" server, a metadata-style server). Everything it made goes when it drops.
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use bollard::Docker;
use bollard::models::{
    ContainerCreateBody, EndpointIpamConfig, EndpointSettings, HostConfig, Ipam, IpamConfig,
    NetworkCreateRequest, NetworkingConfig,
};
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, ListContainersOptionsBuilder, ListNetworksOptionsBuilder,
    LogsOptionsBuilder, RemoveContainerOptionsBuilder,
};
use futures_util::StreamExt;
pub use hako_authd::testing::RUNED_KEY;
use hako_authd::testing::TestAuthd;
use hako_client::authd::AuthdClient;
use hako_client::runed;
use hako_client::testing::send;
use hako_shared::auth::AGENT_SCOPES;
use hako_shared::auth::wire::MintRequest;
use hako_shared::config::Env;
use hako_shared::testing::{ApiClient, eventually};
use serde_json::{Value, json};

pub const TEST_LABEL: &str = "io.hako.test";

pub fn rand_hex(n: usize) -> String {
    let mut b = vec![0u8; n];
    getrandom::fill(&mut b).expect("rng");
    b.iter().map(|x| format!("{x:02x}")).collect()
}

pub fn rand_byte() -> u8 {
    let mut b = [0u8; 1];
    getrandom::fill(&mut b).expect("rng");
    b[0]
}

/// A network this test made: its name and the first three octets of its /24.
pub struct Net {
    pub name: String,
    pub prefix: String,
}

pub struct Rig {
    pub dir: tempfile::TempDir,
    pub docker: Docker,
    pub tag: String,
    pub install: String,
    pub uplink: Net,
    pub ll: Net,
    pub authd: Option<TestAuthd>,
    pub authd_url: String,
    pub runed: Option<hako_runed::Running>,
    pub routd: String,
    pub operator: String,
    pub runed_service: String,
    pub ca: String,
    pub testkit: String,
    /// Brokered secrets (`Rig::with_secrets`): the toolbox image, and each secret-server's
    /// container id by name.
    pub toolbox: String,
    pub forges: HashMap<String, String>,
}

/// The secret-servers of `Rig::with_secrets`: (container name, address .N on the uplink,
/// its names, the SHA-256 it expects).
pub struct Forge<'a> {
    pub name: &'a str,
    pub host: u8,
    pub aliases: &'a [&'a str],
    pub expect_sha256: String,
}

/// SHA-256 in hex (what a forge logs of a credential).
pub fn sha256_hex(data: &[u8]) -> String {
    use sha2::Digest as _;
    sha2::Sha256::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A certificate in base64 DER as PEM.
fn pem_of(b64_der: &str) -> String {
    let mut s = String::from("-----BEGIN CERTIFICATE-----\n");
    for chunk in b64_der.as_bytes().chunks(64) {
        s.push_str(std::str::from_utf8(chunk).unwrap());
        s.push('\n');
    }
    s.push_str("-----END CERTIFICATE-----\n");
    s
}

/// Creates a bridge network on a free /24 among `candidates` (another process may hold one).
pub async fn network(
    docker: &Docker,
    name: &str,
    tag: &str,
    candidates: impl Iterator<Item = String>,
) -> Net {
    let mut last = String::new();
    for prefix in candidates.take(40) {
        let req = NetworkCreateRequest {
            name: name.to_owned(),
            driver: Some("bridge".into()),
            ipam: Some(Ipam {
                config: Some(vec![IpamConfig {
                    subnet: Some(format!("{prefix}.0/24")),
                    // Dynamic addresses (the proxy) from the low half; targets sit above.
                    ip_range: Some(format!("{prefix}.0/25")),
                    gateway: Some(format!("{prefix}.1")),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            labels: Some(HashMap::from([(TEST_LABEL.to_owned(), tag.to_owned())])),
            ..Default::default()
        };
        match docker.create_network(req).await {
            Ok(_) => {
                return Net {
                    name: name.to_owned(),
                    prefix,
                };
            }
            Err(e) => last = e.to_string(),
        }
    }
    panic!("no free subnet for {name}: {last}");
}

impl Rig {
    pub async fn new() -> Rig {
        Rig::with_env(&[]).await
    }

    /// A rig whose runed has these settings too.
    pub async fn with_env(extra: &[(&str, &str)]) -> Rig {
        Rig::build(extra, &[]).await
    }

    /// A rig with the test forges of brokered secrets (`secret-server`s on the uplink, in
    /// the operator's range), whose CAs the proxy is told to trust (`EGRESS_EXTRA_ROOTS`:
    /// the only way a test CA is trusted), and the toolbox image for boxes.
    pub async fn with_secrets(forges: &[Forge<'_>]) -> Rig {
        Rig::build(&[], forges).await
    }

    async fn build(extra: &[(&str, &str)], forges: &[Forge<'_>]) -> Rig {
        let (egress_image, testkit, toolbox) = tokio::join!(
            hako_deploy::ensure_egress_image(),
            hako_deploy::ensure_testkit_image(),
            async {
                if forges.is_empty() {
                    Ok(String::new())
                } else {
                    hako_deploy::ensure_toolbox_image().await
                }
            }
        );
        let toolbox = toolbox.expect("toolbox image");
        let (egress_image, testkit) = (
            egress_image.expect("egress image"),
            testkit.expect("testkit image"),
        );
        let docker = hako_runner::docker::DockerEngine::connect_default()
            .expect("docker")
            .client()
            .clone();
        let tag = format!("eg{}", rand_hex(5));
        let uplink = network(
            &docker,
            &format!("hako-test-{tag}-up"),
            &tag,
            std::iter::repeat_with(|| format!("172.{}.{}", 20 + rand_byte() % 12, rand_byte())),
        )
        .await;
        // A metadata-style link-local network: 169.254.169.0/24 when free, else another.
        let ll = network(
            &docker,
            &format!("hako-test-{tag}-ll"),
            &tag,
            std::iter::once("169.254.169".to_owned()).chain(std::iter::repeat_with(|| {
                format!("169.254.{}", 1 + rand_byte() % 250)
            })),
        )
        .await;
        let dir = tempfile::tempdir().unwrap();
        let mut rig = Rig {
            install: format!("t{tag}"),
            dir,
            docker,
            tag,
            uplink,
            ll,
            authd: None,
            authd_url: String::new(),
            runed: None,
            routd: String::new(),
            operator: String::new(),
            runed_service: String::new(),
            ca: String::new(),
            testkit,
            toolbox,
            forges: HashMap::new(),
        };
        rig.targets().await;
        let mut roots = String::new();
        for f in forges {
            let mut cmd = vec!["secret-server", "--listen", "0.0.0.0:443"];
            for a in f.aliases {
                cmd.extend(["--san", a]);
            }
            cmd.extend(["--expect-sha256", f.expect_sha256.as_str()]);
            let id = rig
                .target_in(&rig.toolbox.clone(), f.name, f.host, f.aliases, &cmd)
                .await;
            let ca = rig.ca_of(&id).await;
            roots.push_str(&pem_of(&ca));
            rig.forges.insert(f.name.to_owned(), id);
        }
        // authd on the host's address on the uplink: runed and the proxy container reach it.
        let l = tokio::net::TcpListener::bind(format!("{}.1:0", rig.uplink.prefix))
            .await
            .expect("binding authd on the uplink's gateway address");
        let authd = TestAuthd::start_on(l, &rig.dir.path().join("authd")).await;
        rig.authd_url = authd.url();
        rig.routd = authd.token("routd").await;
        rig.operator = authd.token("operator").await;
        rig.runed_service = authd.token("runed").await;
        rig.authd = Some(authd);
        let mut pairs: Vec<(String, String)> = vec![
            ("DATA_DIR".into(), rig.data().display().to_string()),
            ("AUTHD_URL".into(), rig.authd_url.clone()),
            ("AUTHD_SERVICE_KEY".into(), RUNED_KEY.into()),
            ("AUTHD_CLOCK_SKEW".into(), "1s".into()),
            ("AUTHD_REVOKED_POLL".into(), "1s".into()),
            ("HAKO_INSTALL_ID".into(), rig.install.clone()),
            ("CONTAINER_IMAGE".into(), rig.testkit.clone()),
            ("MAX_CONTAINERS".into(), "4".into()),
            ("RUNED_RUN_TIMEOUT".into(), "120s".into()),
            ("RUNED_STOP_GRACE".into(), "1s".into()),
            ("RUNED_EGRESS_IMAGE".into(), egress_image),
            (
                "RUNED_EGRESS_NETWORKS".into(),
                format!("{},{}", rig.uplink.name, rig.ll.name),
            ),
            ("RUNED_EGRESS_CHECK".into(), "500ms".into()),
            // The operator's range: the web and TLS targets (.128/26), not .200 (private.test).
            (
                "EGRESS_PRIVATE_TARGETS".into(),
                format!("{}.128/26", rig.uplink.prefix),
            ),
            ("EGRESS_REVOCATION_MAX_AGE".into(), "5s".into()),
            ("EGRESS_RECHECK_INTERVAL".into(), "200ms".into()),
            // `open` runs (the bench's direct baseline) sit on the uplink with the targets.
            ("RUNED_OPEN_NETWORK".into(), rig.uplink.name.clone()),
        ];
        pairs.extend(
            extra
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
        );
        if !roots.is_empty() {
            pairs.push(("EGRESS_EXTRA_ROOTS".into(), roots));
        }
        let env = Env::from_pairs(pairs);
        let cfg = hako_runed::Config::from_env(&env).expect("runed config");
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        rig.runed = Some(hako_runed::start(cfg, l).await.unwrap());
        rig.wait_ready().await;
        rig
    }

    pub fn data(&self) -> PathBuf {
        self.dir.path().join("runed")
    }

    pub fn api(&self) -> ApiClient {
        ApiClient::new(self.runed.as_ref().unwrap().url())
    }

    pub async fn ready(&self) -> (u16, Value) {
        self.api().get(&self.routd, "/ready").await
    }

    /// runed's `/ready` (which includes the proxy's) answers 200.
    pub async fn wait_ready(&self) {
        eventually("runed gets ready", Duration::from_secs(60), || async {
            let (s, v) = self.ready().await;
            if s == 200 { Ok(()) } else { Err(v) }
        })
        .await
    }

    pub async fn target(
        &self,
        name: &str,
        net: &Net,
        host: u8,
        alias: &str,
        cmd: &[&str],
    ) -> String {
        self.target_on(&self.testkit.clone(), name, net, host, &[alias], cmd)
            .await
    }

    /// A target of `image` on the uplink at `.host`, under the names `aliases`.
    pub async fn target_in(
        &self,
        image: &str,
        name: &str,
        host: u8,
        aliases: &[&str],
        cmd: &[&str],
    ) -> String {
        let up = Net {
            name: self.uplink.name.clone(),
            prefix: self.uplink.prefix.clone(),
        };
        self.target_on(image, name, &up, host, aliases, cmd).await
    }

    async fn target_on(
        &self,
        image: &str,
        name: &str,
        net: &Net,
        host: u8,
        aliases: &[&str],
        cmd: &[&str],
    ) -> String {
        let ip = format!("{}.{host}", net.prefix);
        let body = ContainerCreateBody {
            image: Some(image.to_owned()),
            cmd: Some(cmd.iter().map(|s| (*s).to_owned()).collect()),
            user: Some("0:0".into()),
            labels: Some(HashMap::from([(TEST_LABEL.to_owned(), self.tag.clone())])),
            host_config: Some(HostConfig {
                network_mode: Some(net.name.clone()),
                cap_drop: Some(vec!["ALL".into()]),
                cap_add: Some(vec!["NET_BIND_SERVICE".into()]),
                ..Default::default()
            }),
            networking_config: Some(NetworkingConfig {
                endpoints_config: Some(HashMap::from([(
                    net.name.clone(),
                    EndpointSettings {
                        ipam_config: Some(EndpointIpamConfig {
                            ipv4_address: Some(ip.clone()),
                            ..Default::default()
                        }),
                        aliases: Some(aliases.iter().map(|a| (*a).to_owned()).collect()),
                        ..Default::default()
                    },
                )])),
            }),
            ..Default::default()
        };
        let opts = CreateContainerOptionsBuilder::new()
            .name(&format!("hako-test-{}-{name}", self.tag))
            .build();
        let id = self
            .docker
            .create_container(Some(opts), body)
            .await
            .expect("target create")
            .id;
        self.docker
            .start_container(&id, None)
            .await
            .expect("target start");
        id
    }

    pub async fn targets(&mut self) {
        let up = &self.uplink;
        self.target(
            "web",
            up,
            130,
            "web.test",
            &["http-server", "--name", "web"],
        )
        .await;
        let tls = self
            .target(
                "tls",
                up,
                131,
                "tls.test",
                &[
                    "tls-server",
                    "--listen",
                    "0.0.0.0:443",
                    "--name",
                    "tls",
                    "--san",
                    "tls.test",
                ],
            )
            .await;
        self.target(
            "private",
            up,
            200,
            "private.test",
            &["http-server", "--name", "private"],
        )
        .await;
        self.target(
            "meta",
            &self.ll,
            254,
            "metadata.test",
            &[
                "http-server",
                "--listen",
                "0.0.0.0:80",
                "--listen",
                "0.0.0.0:8080",
                "--name",
                "metadata",
            ],
        )
        .await;
        self.ca = self.ca_of(&tls).await;
    }

    /// What a container printed on stdout so far.
    pub async fn logs_of(&self, id: &str) -> String {
        let opts = LogsOptionsBuilder::new().stdout(true).stderr(true).build();
        let mut logs = self.docker.logs(id, Some(opts));
        let mut text = String::new();
        while let Some(Ok(chunk)) = logs.next().await {
            text.push_str(&chunk.to_string());
        }
        text
    }

    /// A TLS target's CA (base64 DER), from its first line of output.
    pub async fn ca_of(&self, id: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let text = self.logs_of(id).await;
            if let Some(ca) = text.lines().find_map(|l| l.strip_prefix("CA ")) {
                return ca.trim().to_owned();
            }
            assert!(Instant::now() < deadline, "no CA from {id}: {text}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Starts an `allowlist` run of folder `acme` whose agent runs `commands`.
    pub async fn run(&self, allow: &[String], commands: &[String]) -> String {
        self.run_group(
            json!({"network": "allowlist", "egress_allowlist": allow}),
            commands,
        )
        .await
    }

    /// Starts a run of folder `acme` with `group` whose agent runs `commands`.
    pub async fn run_group(&self, group: Value, commands: &[String]) -> String {
        let (s, v) = self
            .api()
            .post(
                &self.routd,
                "/v1/runs",
                json!({"folder": "acme", "turn_id": format!("turn-{}", rand_hex(4)),
                       "messages": [{"role": "user", "content": commands.join("\n")}],
                       "group": group}),
            )
            .await;
        assert_eq!(s, 202, "{v}");
        v["run_id"].as_str().unwrap().to_owned()
    }

    pub async fn status(&self, run: &str) -> Value {
        let (s, v) = send(&self.api(), &self.routd, runed::run(run)).await;
        assert_eq!(s, 200, "{v}");
        v
    }

    /// Waits for the run's `n`-th block (1-based) and returns every result so far.
    pub async fn blocks(&self, run: &str, n: usize) -> Vec<String> {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let v = self.status(run).await;
            let out: Vec<String> = v["outputs"]
                .as_array()
                .unwrap()
                .iter()
                .map(|b| b["result"].as_str().unwrap_or_default().to_owned())
                .collect();
            if out.len() >= n {
                return out;
            }
            let st = v["state"].as_str().unwrap();
            assert!(
                !["exited", "error", "killed", "timed_out"].contains(&st),
                "run ended with {} blocks, wanted {n}: {v}",
                out.len()
            );
            assert!(Instant::now() < deadline, "block {n} never came: {v}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub async fn wait_end(&self, run: &str) -> Value {
        eventually("the run ends", Duration::from_secs(120), || async {
            let v = self.status(run).await;
            let ended =
                ["exited", "error", "killed", "timed_out"].contains(&v["state"].as_str().unwrap());
            if ended { Ok(v) } else { Err(v) }
        })
        .await
    }

    /// Drops a file the agent's `wait-file` is waiting for.
    pub fn go(&self, name: &str) {
        let dir = self.data().join("folders/acme/input");
        let tmp = dir.join(format!(".{name}.tmp"));
        std::fs::write(&tmp, b"go").unwrap();
        std::fs::rename(&tmp, dir.join(name)).unwrap();
    }

    pub fn proxy_name(&self) -> String {
        format!("hako-{}-egress", self.install)
    }

    pub async fn proxy_id(&self) -> Option<String> {
        let info = self
            .docker
            .inspect_container(&self.proxy_name(), None)
            .await
            .ok()?;
        info.state?.running?.then_some(info.id?)
    }

    /// The proxy's `/metrics`, from its address on the uplink.
    pub async fn proxy_metrics(&self) -> String {
        let info = self
            .docker
            .inspect_container(&self.proxy_name(), None)
            .await
            .unwrap();
        let ip = info.network_settings.unwrap().networks.unwrap()[&self.uplink.name]
            .ip_address
            .clone()
            .unwrap();
        reqwest::Client::builder()
            .no_proxy()
            .build()
            .unwrap()
            .get(format!("http://{ip}:3129/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    pub async fn proxy_logs(&self) -> String {
        let opts = LogsOptionsBuilder::new().stdout(true).stderr(true).build();
        let mut logs = self.docker.logs(&self.proxy_name(), Some(opts));
        let mut text = String::new();
        while let Some(Ok(chunk)) = logs.next().await {
            text.push_str(&chunk.to_string());
        }
        text
    }

    /// A spawn token minted as runed mints them, living `ttl` seconds.
    pub async fn spawn_token(&self, egress: &[&str], ttl: u64) -> String {
        AuthdClient::new(&self.authd_url)
            .unwrap()
            .mint(
                &self.runed_service,
                &MintRequest {
                    scope: AGENT_SCOPES.iter().map(|s| (*s).to_owned()).collect(),
                    folder: Some("acme".into()),
                    ttl_seconds: Some(ttl),
                    run_id: Some(format!("run-{}", rand_hex(4))),
                    turn_id: Some("turn-x".into()),
                    egress: egress.iter().map(|s| (*s).to_owned()).collect(),
                    ..Default::default()
                },
            )
            .await
            .unwrap()
            .token
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        // Also when a test failed: runed first (no recreation behind our back), then every
        // container and network of this install and of this test.
        drop(self.runed.take());
        let (install, tag) = (self.install.clone(), self.tag.clone());
        let _ = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            rt.block_on(async {
                let Ok(docker) = hako_runner::docker::DockerEngine::connect_default()
                    .map(|d| d.client().clone())
                else {
                    return;
                };
                for label in [
                    format!("io.hako.install={install}"),
                    format!("{TEST_LABEL}={tag}"),
                ] {
                    let filters = HashMap::from([("label".to_owned(), vec![label.clone()])]);
                    let opts = ListContainersOptionsBuilder::new()
                        .all(true)
                        .filters(&filters)
                        .build();
                    for c in docker.list_containers(Some(opts)).await.unwrap_or_default() {
                        if let Some(id) = c.id {
                            let opts = RemoveContainerOptionsBuilder::new().force(true).build();
                            let _ = docker.remove_container(&id, Some(opts)).await;
                        }
                    }
                }
                for label in [
                    format!("io.hako.install={install}"),
                    format!("{TEST_LABEL}={tag}"),
                ] {
                    let filters = HashMap::from([("label".to_owned(), vec![label])]);
                    let opts = ListNetworksOptionsBuilder::new().filters(&filters).build();
                    for n in docker.list_networks(Some(opts)).await.unwrap_or_default() {
                        if let Some(name) = n.name {
                            let _ = docker.remove_network(&name).await;
                        }
                    }
                }
            });
        })
        .join();
    }
}

/// The JSON of the last reply line starting `prefix` (`<command …>: <json>`).
pub fn answer(blocks: &[String], prefix: &str) -> Value {
    let line = blocks
        .iter()
        .rev()
        .find(|b| b.starts_with(prefix))
        .unwrap_or_else(|| panic!("no block starting {prefix:?} in {blocks:#?}"));
    let rest = line[prefix.len()..]
        .split_once(": ")
        .map_or("", |(_, r)| r)
        .trim();
    serde_json::from_str(rest).unwrap_or_else(|_| json!(rest))
}

pub fn status_of(v: &Value) -> (Option<u64>, Option<&str>) {
    (v["status"].as_u64(), v["denied"].as_str())
}
