//! The rig of runed's end-to-end suites: a real authd and a real runed in-process on
//! loopback ports, a real `runed.db`, and boxes either on Docker (`daemon.rs`: real
//! containers of the agent image) or on the simulated engine (`logic.rs`: no Docker).

#![allow(dead_code)]

use std::collections::HashSet;
use std::time::{Duration, Instant};

use hako_authd::testing::{RUNED_KEY, TestAuthd};
use hako_client::authd::AuthdClient;
use hako_client::runed;
use hako_client::testing::send;
use hako_runner::sim::SimEngine;
use hako_shared::auth::wire::MintRequest;
use hako_shared::config::Env;
use hako_shared::runs::RunRequest;
use hako_shared::testing::{ApiClient, eventually};
use serde_json::{Value, json};

/// The image the simulated engine knows.
pub const SIM_IMAGE: &str = "hako-agent:sim";

pub struct Rig {
    pub _dir: tempfile::TempDir,
    pub data: std::path::PathBuf,
    pub authd: Option<TestAuthd>,
    pub runed: Option<hako_runed::Running>,
    /// A `runed` process started from the binary (the SIGTERM test), instead of in-process.
    pub child: Option<(std::process::Child, String)>,
    pub extra_env: Vec<(String, String)>,
    /// The simulated engine runed runs on (`Rig::sim`); `None`: Docker.
    pub sim: Option<SimEngine>,
    pub http: reqwest::Client,
    pub routd: String,
    pub operator: String,
}

pub async fn image() -> String {
    hako_deploy::ensure_agent_image()
        .await
        .expect("agent image builds")
}

pub fn runed_config(
    rig_data: &std::path::Path,
    authd: &str,
    extra: &[(String, String)],
) -> hako_runed::Config {
    let mut pairs: Vec<(String, String)> = vec![
        (
            "DATA_DIR".into(),
            rig_data.join("runed").display().to_string(),
        ),
        ("AUTHD_URL".into(), authd.into()),
        ("AUTHD_SERVICE_KEY".into(), RUNED_KEY.into()),
        ("AUTHD_CLOCK_SKEW".into(), "1s".into()),
        ("AUTHD_REVOKED_POLL".into(), "1s".into()),
        ("MAX_CONTAINERS".into(), "4".into()),
        ("RUNED_RUN_TIMEOUT".into(), "60s".into()),
        ("RUNED_STOP_GRACE".into(), "1s".into()),
        // These tests count a run's containers; the warm-box tests turn warming on.
        ("RUNED_WARM_MAX".into(), "0".into()),
        ("RUNED_PROGRAM_COPIES".into(), "0".into()),
    ];
    pairs.extend(extra.iter().cloned());
    hako_runed::Config::from_env(&Env::from_pairs(pairs)).expect("config")
}

impl Rig {
    /// A rig whose runed runs real containers on Docker.
    pub async fn new(extra: &[(&str, &str)]) -> Rig {
        Self::build(extra, None).await
    }

    /// A rig whose runed runs boxes on the simulated engine: hako-agent's script language
    /// in part (`hako_runner::sim::agents::script_agent`), no Docker.
    pub async fn sim(extra: &[(&str, &str)]) -> Rig {
        let sim = SimEngine::new();
        sim.image(
            SIM_IMAGE,
            &[(hako_shared::contract::WARM_LABEL, "1")],
            hako_runner::sim::agents::script_agent(),
        );
        Self::build(extra, Some(sim)).await
    }

    async fn build(extra: &[(&str, &str)], sim: Option<SimEngine>) -> Rig {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().to_owned();
        let authd = TestAuthd::start(&data.join("authd")).await;
        let mut extra_env: Vec<(String, String)> = extra
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        let image = match &sim {
            Some(_) => SIM_IMAGE.to_owned(),
            None => image().await,
        };
        extra_env.push(("CONTAINER_IMAGE".into(), image));
        let routd = authd.token("routd").await;
        let operator = authd.token("operator").await;
        let mut rig = Rig {
            _dir: dir,
            data,
            authd: Some(authd),
            runed: None,
            child: None,
            extra_env,
            sim,
            http: reqwest::Client::builder().no_proxy().build().unwrap(),
            routd,
            operator,
        };
        rig.start_runed().await;
        rig
    }

    pub fn authd_url(&self) -> String {
        self.authd.as_ref().unwrap().url()
    }

    pub async fn start_runed(&mut self) {
        let mut cfg = runed_config(&self.data, &self.authd_url(), &self.extra_env);
        cfg.engine = self
            .sim
            .clone()
            .map(|s| hako_runner::engine::EngineRef(std::sync::Arc::new(s)));
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        self.runed = Some(hako_runed::start(cfg, l).await.unwrap());
    }

    pub fn url(&self, path: &str) -> String {
        match &self.child {
            Some((_, base)) => format!("{base}{path}"),
            None => format!("{}{path}", self.runed.as_ref().unwrap().url()),
        }
    }

    pub async fn mint(&self, scope: &[&str], folder: Option<&str>, ttl: u64) -> String {
        self.mint_from(&self.routd, scope, folder, ttl).await
    }

    pub async fn mint_from(
        &self,
        parent: &str,
        scope: &[&str],
        folder: Option<&str>,
        ttl: u64,
    ) -> String {
        let c = AuthdClient::new(&self.authd_url()).unwrap();
        c.mint(
            parent,
            &MintRequest {
                scope: scope.iter().map(|s| (*s).to_owned()).collect(),
                folder: folder.map(str::to_owned),
                ttl_seconds: Some(ttl),
                ..Default::default()
            },
        )
        .await
        .unwrap()
        .token
    }

    /// The strict test client for this rig's runed: any error answer that is not the JSON
    /// envelope fails the test.
    pub fn api(&self) -> ApiClient {
        ApiClient::new(self.url(""))
    }

    pub async fn post(&self, token: &str, path: &str, body: Value) -> (u16, Value) {
        self.api().post(token, path, body).await
    }

    pub async fn get(&self, token: &str, path: &str) -> (u16, Value) {
        self.api().get(token, path).await
    }

    /// A run's status, as routd's token reads it: the HTTP status and the body.
    pub async fn status(&self, run: &str) -> (u16, Value) {
        send(&self.api(), &self.routd, runed::run(run)).await
    }

    pub async fn run(&self, folder: &str, turn: &str, text: &str) -> String {
        let req: RunRequest = serde_json::from_value(json!({"folder": folder, "turn_id": turn,
                       "messages": [{"role": "user", "content": text}]}))
        .expect("a run request");
        let (s, v) = send(&self.api(), &self.routd, runed::create_run(&req)).await;
        assert_eq!(s, 202, "{v}");
        v["run_id"].as_str().unwrap().to_owned()
    }

    pub async fn wait(&self, run: &str) -> Value {
        let deadline = Instant::now() + Duration::from_secs(180);
        loop {
            let op = runed::run(run).query("wait", "30s");
            let (s, v) = send(&self.api(), &self.routd, op).await;
            assert_eq!(s, 200, "waiting for {run}: {v}");
            if ["exited", "error", "killed", "timed_out"].contains(&v["state"].as_str().unwrap()) {
                return v;
            }
            assert!(Instant::now() < deadline, "run {run} did not end: {v}");
        }
    }

    pub async fn wait_state(&self, run: &str, state: &str) {
        let what = format!("run {run} reaches {state}");
        eventually(&what, Duration::from_secs(60), || async {
            let (_, v) = self.status(run).await;
            if v["state"] == state { Ok(()) } else { Err(v) }
        })
        .await
    }

    /// How many runs runed.db holds.
    pub fn spawns(&self) -> i64 {
        self.db()
            .query_row("SELECT count(*) FROM spawns", [], |r| r.get(0))
            .unwrap()
    }

    pub fn db(&self) -> rusqlite::Connection {
        rusqlite::Connection::open(self.data.join("runed/runed.db")).unwrap()
    }

    /// This install's agent containers once removal has settled: a run's end is recorded
    /// before its container is removed, so a count right after the end may still see it.
    pub async fn containers(&self) -> usize {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let n = self.runner().list_agents().await.unwrap().len();
            if n == 0 || Instant::now() >= deadline {
                return n;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Stops runed (in process or the binary) and removes what it left of this install: a
    /// run's container is removed after its end is recorded, so a runed stopped right after
    /// an end can leave one.
    pub async fn stop(mut self) {
        let runner = self.runner();
        if let Some(r) = self.runed.take() {
            r.shutdown().await;
        }
        if let Some((mut c, _)) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = runner.cleanup_orphans(&HashSet::new()).await;
        if let Some(a) = self.authd.take() {
            let _ = a.shutdown().await;
        }
    }
}

/// runed's unlabelled metrics, by name.
pub async fn metrics(rig: &Rig) -> std::collections::HashMap<String, f64> {
    let r = rig.http.get(rig.url("/metrics")).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    r.text()
        .await
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (name, value) = l.split_once(' ')?;
            Some((name.to_owned(), value.trim().parse().ok()?))
        })
        .collect()
}

pub fn results(v: &Value) -> Vec<String> {
    v["outputs"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|b| b["result"].as_str().map(str::to_owned))
        .collect()
}

impl Rig {
    /// A runner on this rig's install (works whichever way runed runs).
    pub fn runner(&self) -> hako_runner::Runner {
        let cfg = runed_config(&self.data, &self.authd_url(), &self.extra_env);
        match &self.sim {
            Some(s) => {
                hako_runner::Runner::new(std::sync::Arc::new(s.clone()), cfg.runner).unwrap()
            }
            None => {
                let docker =
                    hako_runner::docker::DockerEngine::connect("/var/run/docker.sock").unwrap();
                hako_runner::Runner::on_docker(docker, cfg.runner).unwrap()
            }
        }
    }

    /// A Docker client, for what the test checks of Docker itself.
    pub fn docker(&self) -> bollard::Docker {
        hako_runner::docker::DockerEngine::connect("/var/run/docker.sock")
            .unwrap()
            .client()
            .clone()
    }

    pub async fn delete(&self, token: &str, path: &str) -> (u16, Value) {
        self.api().delete(token, path).await
    }

    /// Polls the run until it has at least `n` output blocks.
    pub async fn wait_outputs(&self, run: &str, n: usize) -> Value {
        let what = format!("run {run} has {n} blocks");
        eventually(&what, Duration::from_secs(60), || async {
            let (_, v) = self.status(run).await;
            if v["outputs"].as_array().map_or(0, Vec::len) >= n {
                Ok(v)
            } else {
                Err(v)
            }
        })
        .await
    }

    pub fn input_files(&self, folder: &str) -> Vec<String> {
        let dir = self.data.join("runed/ipc").join(folder).join("input");
        match std::fs::read_dir(&dir) {
            Ok(rd) => rd
                .filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect(),
            Err(_) => Vec::new(),
        }
    }
}

pub async fn ready(rig: &Rig) -> (u16, Value) {
    let r = rig
        .http
        .get(rig.url("/ready"))
        .timeout(Duration::from_secs(30))
        .send()
        .await
        .unwrap();
    let s = r.status().as_u16();
    (s, r.json().await.unwrap_or(Value::Null))
}

impl Rig {
    /// Starts the real `runed` binary on this rig's data directory, instead of in-process.
    pub async fn spawn_binary(&mut self) {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_runed"));
        cmd.env_remove("DOCKER_HOST")
            .env("DATA_DIR", self.data.join("runed"))
            .env("AUTHD_URL", self.authd_url())
            .env("AUTHD_SERVICE_KEY", RUNED_KEY)
            .env("AUTHD_CLOCK_SKEW", "1s")
            .env("AUTHD_REVOKED_POLL", "1s")
            .env("MAX_CONTAINERS", "4")
            .env("RUNED_RUN_TIMEOUT", "60s")
            .env("RUNED_STOP_GRACE", "1s")
            .env("RUNED_WARM_MAX", "0")
            .env("RUNED_LISTEN", format!("127.0.0.1:{port}"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::inherit());
        for (k, v) in &self.extra_env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().expect("runed starts");
        let base = format!("http://127.0.0.1:{port}");
        let health = format!("{base}/health");
        eventually("runed comes up", Duration::from_secs(20), || async {
            match self.http.get(&health).send().await {
                Ok(r) if r.status().is_success() => Ok(()),
                Ok(r) => Err(r.status().to_string()),
                Err(e) => Err(e.to_string()),
            }
        })
        .await;
        self.child = Some((child, base));
    }
}

impl Drop for Rig {
    /// A test that failed before `stop`: what its runed made still goes (a box made just
    /// after the failure too: swept three times, half a second apart).
    fn drop(&mut self) {
        let unstopped = self.runed.is_some() || self.child.is_some();
        if let Some((mut c, _)) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if !unstopped || self.sim.is_some() {
            return;
        }
        let install = self.runner().config().install_id.clone();
        for pass in 0..3 {
            if pass > 0 {
                std::thread::sleep(Duration::from_millis(500));
            }
            hako_deploy::remove_install_containers(&install);
        }
    }
}

impl Rig {
    /// The folder's warm boxes that run, once there are `n` (waits up to 60 s).
    pub async fn warm_boxes(&self, folder: &str, n: usize) -> Vec<hako_runner::engine::Listed> {
        let what = format!("{folder} has {n} warm boxes");
        eventually(&what, Duration::from_secs(60), || async {
            let boxes = self.warm_now(folder).await;
            if boxes.len() == n {
                Ok(boxes)
            } else {
                Err(boxes)
            }
        })
        .await
    }

    /// The folder's warm boxes that run now.
    pub async fn warm_now(&self, folder: &str) -> Vec<hako_runner::engine::Listed> {
        self.runner()
            .list_agents()
            .await
            .unwrap()
            .into_iter()
            .filter(|c| {
                hako_runner::warm::is_warm(c)
                    && c.state == "running"
                    && c.labels.get("io.hako.folder").map(String::as_str) == Some(folder)
            })
            .collect()
    }

    /// The container runed.db records for a run.
    pub fn container_of(&self, run: &str) -> String {
        self.db()
            .query_row(
                "SELECT container_id FROM spawns WHERE run_id = ?1",
                [run],
                |r| r.get(0),
            )
            .unwrap()
    }

    /// When Docker created a container, Unix ms.
    pub async fn created_ms(&self, id: &str) -> i64 {
        let c = self.docker().inspect_container(id, None).await.unwrap();
        hako_shared::time::parse_rfc3339(&c.created.unwrap()).unwrap()
    }

    /// Waits until Docker no longer has the container.
    pub async fn until_gone(&self, id: &str, limit: Duration) {
        eventually(&format!("container {id} is gone"), limit, || async {
            match self.docker().inspect_container(id, None).await {
                Ok(c) => Err(c.state),
                Err(_) => Ok(()),
            }
        })
        .await
    }

    /// A run's creation time, Unix ms.
    pub async fn run_created_ms(&self, run: &str) -> i64 {
        let (_, v) = self.status(run).await;
        hako_shared::time::parse_rfc3339(v["created_at"].as_str().unwrap()).unwrap()
    }
}

/// runed's metric `name` with the labels `labels` (`reason="spec"`), 0 when absent.
pub async fn metric(rig: &Rig, name: &str, labels: &str) -> f64 {
    let r = rig.http.get(rig.url("/metrics")).send().await.unwrap();
    let key = if labels.is_empty() {
        name.to_owned()
    } else {
        format!("{name}{{{labels}}}")
    };
    r.text()
        .await
        .unwrap()
        .lines()
        .find_map(|l| {
            let (n, v) = l.rsplit_once(' ')?;
            (n == key).then(|| v.parse().unwrap())
        })
        .unwrap_or(0.0)
}

/// Waits (up to 20 s) until authd lists `jti` as revoked.
pub async fn revoked(c: &AuthdClient, jti: &str, what: &str) {
    eventually(what, Duration::from_secs(20), || async {
        let list = c.revoked().await.unwrap().revoked;
        if list.iter().any(|e| e.jti == jti) {
            Ok(())
        } else {
            Err(list.len())
        }
    })
    .await
}

/// Waits (up to 10 s) for an unlabelled gauge to read `value`: gauges follow the scheduler's
/// tick.
pub async fn metric_becomes(rig: &Rig, name: &str, value: f64) {
    eventually(
        &format!("{name} reads {value}"),
        Duration::from_secs(10),
        || async {
            let now = metric(rig, name, "").await;
            if now == value { Ok(()) } else { Err(now) }
        },
    )
    .await
}
