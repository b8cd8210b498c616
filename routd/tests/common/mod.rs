//! The rig of routd's end-to-end tests: a real authd, runed and routd (in-process on loopback
//! ports, or the `routd` binary where a test kills it) sharing one data directory, and
//! helpers that read what a chat sees. Boxes are real `hako-agent` containers on Docker
//! ([`Rig::new`]), or the real `hako-agent` as host processes on the simulated engine
//! ([`Rig::sim`]: routd's logic suites, no Docker).

#![allow(dead_code)] // each test file uses its own part of the rig

pub mod browser;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hako_authd::testing::TestAuthd;
#[allow(unused_imports)] // each test file uses its own keys
pub use hako_authd::testing::{CHANNEL_KEY, OPERATOR_KEY, ROUTD_KEY, RUNED_KEY};
use hako_client::authd::AuthdClient;
use hako_client::testing::send;
use hako_client::{Op, routd, runed};
use hako_shared::GroupFolder;
use hako_shared::auth::wire::MintRequest;
use hako_shared::chat::{GroupConfig, MessageKind, MessageView, NewRoute, PostMessage};
use hako_shared::config::Env;
use hako_shared::testing::ApiClient;
pub use hako_shared::testing::eventually;
use serde_json::{Value, json};

pub const LIMIT: Duration = Duration::from_secs(120);

pub struct Rig {
    pub dir: tempfile::TempDir,
    pub authd: Option<TestAuthd>,
    /// authd's base URL (kept when a test moves authd into a process of its own).
    pub authd_url: String,
    pub runed: Option<hako_runed::Running>,
    pub runed_addr: Option<std::net::SocketAddr>,
    pub routd: Option<hako_routd::Running>,
    /// The `routd` binary (tests that kill it), and its base URL.
    pub child: Option<(std::process::Child, String)>,
    /// runed in a process of its own (tests that kill it): see [`run_runed_child`].
    pub runed_child: Option<std::process::Child>,
    pub routd_port: u16,
    pub runed_env: Vec<(String, String)>,
    pub routd_env: Vec<(String, String)>,
    pub operator: String,
    pub channel: String,
    /// runed's install id: this rig's containers carry it, and are removed on drop.
    pub install: String,
    /// The simulated engine runed runs its boxes on ([`Rig::sim`]); `None`: Docker.
    pub sim: Option<hako_runner::sim::SimEngine>,
}

/// The agent image's name on the simulated engine.
pub const SIM_IMAGE: &str = "hako-agent:sim";

impl Drop for Rig {
    /// Whatever a test leaves (a failed assertion skips `stop`): the binary, and every
    /// container of this rig's install.
    fn drop(&mut self) {
        if let Some((mut c, _)) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if let Some(mut c) = self.runed_child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if self.sim.is_none() {
            hako_deploy::remove_install_containers(&self.install);
        }
    }
}

impl Rig {
    /// A rig whose runed runs real `hako-agent` containers on Docker.
    pub async fn new(runed_env: &[(&str, &str)], routd_env: &[(&str, &str)]) -> Rig {
        let image = hako_deploy::ensure_agent_image()
            .await
            .expect("agent image");
        Self::build(runed_env, routd_env, image, None).await
    }

    /// A rig whose runed runs its boxes on the simulated engine, each the real `hako-agent`
    /// binary as a host process (`hako_runner::sim::process`): routd's logic with the real
    /// pair and the real agent, and no Docker. Not for tests of isolation.
    pub async fn sim(runed_env: &[(&str, &str)], routd_env: &[(&str, &str)]) -> Rig {
        let agent = hako_deploy::agent_binary()
            .await
            .expect("hako-agent builds");
        let sim = hako_runner::sim::SimEngine::new();
        sim.image(
            SIM_IMAGE,
            &[(hako_shared::contract::WARM_LABEL, "1")],
            hako_runner::sim::process(agent),
        );
        Self::build(runed_env, routd_env, SIM_IMAGE.to_owned(), Some(sim)).await
    }

    async fn build(
        runed_env: &[(&str, &str)],
        routd_env: &[(&str, &str)],
        image: String,
        sim: Option<hako_runner::sim::SimEngine>,
    ) -> Rig {
        let dir = tempfile::tempdir().unwrap();
        let authd = TestAuthd::start(&dir.path().join("authd")).await;
        let operator = authd.token("operator").await;
        let channel = authd.token("channel").await;
        let own = |v: &[(&str, &str)]| -> Vec<(String, String)> {
            v.iter().map(|(k, v)| ((*k).into(), (*v).into())).collect()
        };
        // No program copies (runner/src/programs.rs) unless a test asks: each test's runed
        // would copy Claude Code's or Codex's binary again, load the suites do not need.
        let mut env = vec![("RUNED_PROGRAM_COPIES".into(), "0".into())];
        env.extend(own(runed_env));
        let mut runed_env = env;
        runed_env.push(("CONTAINER_IMAGE".into(), image));
        let install = {
            let mut b = [0u8; 6];
            getrandom::fill(&mut b).unwrap();
            let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
            format!("routd-test-{hex}")
        };
        runed_env.push(("HAKO_INSTALL_ID".into(), install.clone()));
        // Chosen by routd's first bind (port 0), then kept for its restarts: a port picked
        // here and bound later could be taken in between by another test's daemon.
        let routd_port = 0;
        let authd_url = authd.url();
        let mut rig = Rig {
            dir,
            authd: Some(authd),
            authd_url,
            runed: None,
            runed_addr: None,
            routd: None,
            child: None,
            runed_child: None,
            routd_port,
            runed_env,
            routd_env: own(routd_env),
            operator,
            channel,
            install,
            sim,
        };
        rig.start_runed().await;
        rig.start_routd().await;
        rig
    }

    /// The data directory runed and routd share.
    pub fn data(&self) -> std::path::PathBuf {
        self.dir.path().join("data")
    }

    pub fn authd_url(&self) -> String {
        self.authd_url.clone()
    }

    /// A service token of `identity` (`runed`, `routd`, `operator`, `channel`).
    pub async fn service_token(&self, identity: &str) -> String {
        let key = match identity {
            "runed" => RUNED_KEY,
            "routd" => ROUTD_KEY,
            "operator" => OPERATOR_KEY,
            "channel" => CHANNEL_KEY,
            other => panic!("the rig's authd has no key for {other}"),
        };
        AuthdClient::new(&self.authd_url)
            .unwrap()
            .service_token(identity, key)
            .await
            .unwrap_or_else(|e| panic!("{identity}'s service token: {e}"))
            .token
    }

    pub fn runed_url(&self) -> String {
        format!("http://{}", self.runed_addr.unwrap())
    }

    pub async fn start_runed(&mut self) {
        let mut cfg = hako_runed::Config::from_env(&Env::from_pairs(self.runed_pairs())).unwrap();
        cfg.engine = self
            .sim
            .clone()
            .map(|s| hako_runner::engine::EngineRef(Arc::new(s)));
        // The same port on a restart, so routd finds runed where it was.
        let addr = self
            .runed_addr
            .unwrap_or_else(|| "127.0.0.1:0".parse().unwrap());
        let l = tokio::net::TcpListener::bind(addr).await.unwrap();
        self.runed_addr = Some(l.local_addr().unwrap());
        self.runed = Some(hako_runed::start(cfg, l).await.unwrap());
    }

    /// Moves runed into a process of its own on the same port (this test binary again, in
    /// [`run_runed_child`]), so that a test can SIGKILL it; waits until it answers.
    pub async fn spawn_runed_process(&mut self) {
        assert!(
            self.sim.is_none(),
            "runed in a process of its own runs its boxes on Docker: this test needs Rig::new"
        );
        if let Some(r) = self.runed.take() {
            r.shutdown().await;
        }
        let addr = self.runed_addr.unwrap();
        let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
        cmd.args([RUNED_CHILD, "--exact", "--ignored", "--nocapture"])
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env(RUNED_CHILD_ENV, "1")
            .env("RUNED_LISTEN", addr.to_string())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::inherit());
        for (k, v) in self.runed_pairs() {
            cmd.env(k, v);
        }
        self.runed_child = Some(cmd.spawn().expect("runed's process starts"));
        let http = reqwest::Client::builder().no_proxy().build().unwrap();
        let ready = format!("{}/ready", self.runed_url());
        eventually("runed's process gets ready", LIMIT, || async {
            match http.get(&ready).send().await {
                Ok(r) if r.status().is_success() => Ok(()),
                Ok(r) => Err(r.status().to_string()),
                Err(e) => Err(e.to_string()),
            }
        })
        .await;
    }

    /// SIGKILLs runed's process: its containers keep running, nothing is detached cleanly.
    pub fn kill_runed_process(&mut self) {
        let mut c = self.runed_child.take().expect("runed runs in a process");
        c.kill().unwrap();
        c.wait().unwrap();
    }

    /// runed's environment in this rig.
    pub fn runed_pairs(&self) -> Vec<(String, String)> {
        let mut pairs: Vec<(String, String)> = vec![
            ("DATA_DIR".into(), self.data().display().to_string()),
            ("AUTHD_URL".into(), self.authd_url()),
            ("AUTHD_SERVICE_KEY".into(), RUNED_KEY.into()),
            ("AUTHD_CLOCK_SKEW".into(), "1s".into()),
            ("AUTHD_REVOKED_POLL".into(), "1s".into()),
            ("MAX_CONTAINERS".into(), "4".into()),
            ("RUNED_RUN_TIMEOUT".into(), "60s".into()),
            ("RUNED_STOP_GRACE".into(), "1s".into()),
        ];
        pairs.extend(self.runed_env.iter().cloned());
        pairs
    }

    pub fn routd_pairs(&self) -> Vec<(String, String)> {
        let mut pairs: Vec<(String, String)> = vec![
            // One data directory, as in production: routd binds the turn's sockets in the
            // folders' ipc/ directories that runed mounts.
            ("DATA_DIR".into(), self.data().display().to_string()),
            ("AUTHD_URL".into(), self.authd_url()),
            ("AUTHD_SERVICE_KEY".into(), ROUTD_KEY.into()),
            ("AUTHD_CLOCK_SKEW".into(), "1s".into()),
            ("RUNED_URL".into(), self.runed_url()),
            ("ROUTD_RETRY_BASE".into(), "200ms".into()),
            ("ROUTD_WEBHOOK_RETRY_BASE".into(), "100ms".into()),
            // The tests' webhook receivers listen on loopback.
            ("ROUTD_WEBHOOK_ALLOW_PRIVATE".into(), "1".into()),
            (
                "ROUTD_LISTEN".into(),
                format!("127.0.0.1:{}", self.routd_port),
            ),
        ];
        pairs.extend(self.routd_env.iter().cloned());
        pairs
    }

    pub async fn start_routd(&mut self) {
        let l = tokio::net::TcpListener::bind(("127.0.0.1", self.routd_port))
            .await
            .unwrap();
        self.routd_port = l.local_addr().unwrap().port();
        let cfg = hako_routd::Config::from_env(&Env::from_pairs(self.routd_pairs())).unwrap();
        self.routd = Some(hako_routd::start(cfg, l).await.unwrap());
    }

    /// Runs routd from its binary instead (a test that kills it with SIGKILL).
    /// SIGKILLs the routd binary this rig runs and starts it again.
    pub async fn kill_and_restart_routd(&mut self) {
        let (mut child, _) = self.child.take().expect("routd runs as a binary");
        child.kill().unwrap();
        child.wait().unwrap();
        self.spawn_routd_binary().await;
    }

    /// The operator's verdict on approval request `id`; asserts it was taken.
    pub async fn decide(&self, id: &str, approve: bool) -> Value {
        let (s, v) = self.send(&self.operator, routd::decide(id, approve)).await;
        assert_eq!(s, 200, "{v}");
        v
    }

    /// An approval request as the operator sees it.
    pub async fn approval(&self, id: &str) -> Value {
        self.send(&self.operator, routd::approval(id)).await.1
    }

    pub async fn spawn_routd_binary(&mut self) {
        if let Some(r) = self.routd.take() {
            r.shutdown().await;
        }
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_routd"));
        cmd.env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::inherit());
        for (k, v) in self.routd_pairs() {
            cmd.env(k, v);
        }
        let child = cmd.spawn().expect("routd starts");
        let base = format!("http://127.0.0.1:{}", self.routd_port);
        let http = reqwest::Client::builder().no_proxy().build().unwrap();
        let health = format!("{base}/health");
        eventually("routd comes up", Duration::from_secs(20), || async {
            match http.get(&health).send().await {
                Ok(r) if r.status().is_success() => Ok(()),
                Ok(r) => Err(r.status().to_string()),
                Err(e) => Err(e.to_string()),
            }
        })
        .await;
        self.child = Some((child, base));
    }

    pub fn base(&self) -> String {
        format!("http://127.0.0.1:{}", self.routd_port)
    }

    /// An operation of routd's API with `token`: the status and body.
    pub async fn send<R>(&self, token: &str, op: Op<R>) -> (u16, Value) {
        send(&self.api(), token, op).await
    }

    pub fn api(&self) -> ApiClient {
        ApiClient::new(self.base())
    }

    /// routd's `/metrics`, as text.
    pub async fn metrics(&self) -> String {
        reqwest::get(format!("{}/metrics", self.base()))
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    /// The value of the first sample whose line starts with `series` (a name followed by a
    /// space, or a name with its labels), if routd exports it yet.
    pub async fn metric_value(&self, series: &str) -> Option<f64> {
        let m = self.metrics().await;
        m.lines()
            .find(|l| l.starts_with(series))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
    }

    pub async fn mint(&self, scope: &[&str], folder: Option<&str>, ttl: u64) -> String {
        self.mint_full(scope, folder, ttl).await.token
    }

    /// A token downscoped from the operator's, with its id.
    pub async fn mint_full(
        &self,
        scope: &[&str],
        folder: Option<&str>,
        ttl: u64,
    ) -> hako_shared::auth::wire::MintResponse {
        AuthdClient::new(&self.authd_url())
            .unwrap()
            .mint(
                &self.operator,
                &MintRequest {
                    scope: scope.iter().map(|s| (*s).to_owned()).collect(),
                    folder: folder.map(str::to_owned),
                    ttl_seconds: Some(ttl),
                    ..Default::default()
                },
            )
            .await
            .unwrap()
    }

    /// Creates or replaces a group with the operator's token; answers its view.
    pub async fn put_group(&self, folder: &str, body: Value) -> Value {
        let cfg: GroupConfig = serde_json::from_value(body).expect("a group's settings");
        let (s, v) = self
            .send(&self.operator, routd::put_group(folder, &cfg))
            .await;
        assert!(s == 201 || s == 200, "{v}");
        v
    }

    /// Adds a route with the operator's token.
    pub async fn route(&self, pattern: &str, folder: &str) {
        let route = NewRoute {
            pattern: pattern.to_owned(),
            folder: GroupFolder::new(folder).expect("a folder"),
            position: None,
        };
        let (s, v) = self.send(&self.operator, routd::add_route(&route)).await;
        assert_eq!(s, 201, "{v}");
    }

    /// A group and a route for `chat` to it.
    pub async fn group_for(&self, folder: &str, chat: &str) {
        self.put_group(folder, json!({"name": folder})).await;
        self.route(chat, folder).await;
    }

    /// Posts a message as a person in `chat` would reach it: through the chat adapter (the
    /// `channel` identity), or, for a folder's `web:` chat, with the operator's token.
    pub async fn say(&self, chat: &str, id: &str, text: &str) -> Value {
        let token = if chat.starts_with("web:") {
            &self.operator
        } else {
            &self.channel
        };
        let m = PostMessage {
            id: Some(id.to_owned()),
            chat_jid: chat.to_owned(),
            sender: "alice".into(),
            sender_name: None,
            content: text.to_owned(),
            timestamp: None,
            reply_to: None,
        };
        let (s, v) = self.send(token, routd::post_message(&m)).await;
        assert_eq!(s, 201, "{v}");
        v
    }

    pub async fn history(&self, chat: &str) -> Vec<MessageView> {
        let op = routd::chat_messages(chat).query("limit", 1000);
        let (s, v) = self.send(&self.operator, op).await;
        assert_eq!(s, 200, "{v}");
        serde_json::from_value(v["messages"].clone()).unwrap()
    }

    /// Waits until the chat's history satisfies `done`; answers it.
    pub async fn wait_for(
        &self,
        chat: &str,
        what: &str,
        done: impl Fn(&[MessageView]) -> bool,
    ) -> Vec<MessageView> {
        eventually(what, LIMIT, || async {
            let h = self.history(chat).await;
            if done(&h) { Ok(h) } else { Err(h) }
        })
        .await
    }

    pub async fn turn(&self, turn_id: &str) -> Value {
        let (s, v) = self.send(&self.operator, routd::turn(turn_id)).await;
        assert_eq!(s, 200, "{v}");
        v
    }

    /// Starts a turn in `folder` that stays live (a script brain asleep) until the rig stops
    /// (`/sleep 600` in `web:<folder>`, a group that exists) and waits until it runs: a live
    /// turn to call the sockets of. Give the rig [`LONG_RUNS`], or the run's ceiling ends it
    /// within a minute.
    pub async fn running_turn(&self, folder: &str) -> Value {
        self.say(
            &format!("web:{folder}"),
            &format!("{folder}-sleep"),
            "/sleep 600",
        )
        .await;
        self.first_running(Some(folder)).await
    }

    /// The first running turn (of `folder`, or of any), once one runs.
    pub async fn first_running(&self, folder: Option<&str>) -> Value {
        let running = routd::turns()
            .query_opt("folder", folder)
            .query("state", "running");
        eventually("a turn runs", LIMIT, || async {
            let (_, v) = self.send(&self.operator, running.clone()).await;
            v["turns"]
                .as_array()
                .and_then(|t| t.first())
                .cloned()
                .ok_or(v)
        })
        .await
    }

    /// Waits until `folder`'s turn runs and its container has started; answers the turn's
    /// and the run's ids.
    pub async fn live_run(&self, folder: &str) -> (String, String) {
        let runed_api = ApiClient::new(self.runed_url());
        let running = routd::turns()
            .query("folder", folder)
            .query("state", "running");
        eventually(&format!("{folder}'s turn runs"), LIMIT, || async {
            let (_, v) = self.send(&self.operator, running.clone()).await;
            let Some(t) = v["turns"].as_array().and_then(|t| t.first()) else {
                return Err(v);
            };
            let run = t["run_id"].as_str().unwrap_or_default().to_owned();
            let (_, r) = send(&runed_api, &self.operator, runed::run(&run)).await;
            if r["state"] == "running" {
                Ok((t["turn_id"].as_str().unwrap().to_owned(), run))
            } else {
                Err(r)
            }
        })
        .await
    }

    /// Waits until `folder` has no live turn (a message sent now starts a new turn instead of
    /// being steered into the one that just replied).
    pub async fn wait_idle(&self, folder: &str) {
        eventually(&format!("{folder} goes idle"), LIMIT, || async {
            let mut live = Vec::new();
            for state in ["starting", "running", "waiting"] {
                let op = routd::turns().query("folder", folder).query("state", state);
                let (_, v) = self.send(&self.operator, op).await;
                live.extend(v["turns"].as_array().cloned().unwrap_or_default());
            }
            if live.is_empty() { Ok(()) } else { Err(live) }
        })
        .await
    }

    /// A spawn token as runed mints it for a run: the agent's scopes, bound to `folder`, the
    /// run and runed's turn id (`<turn>.<try>`).
    pub async fn spawn_token(
        &self,
        folder: &str,
        turn: &str,
        run_id: &str,
        ttl: u64,
    ) -> hako_shared::auth::wire::MintResponse {
        let runed = self.service_token("runed").await;
        AuthdClient::new(&self.authd_url())
            .unwrap()
            .mint(
                &runed,
                &MintRequest {
                    scope: vec!["turns:act".into(), "llm:call".into()],
                    folder: Some(folder.to_owned()),
                    ttl_seconds: Some(ttl),
                    run_id: Some(run_id.to_owned()),
                    turn_id: Some(turn.to_owned()),
                    ..Default::default()
                },
            )
            .await
            .unwrap()
    }

    pub async fn stop(mut self) {
        if let Some((mut c, _)) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if let Some(mut c) = self.runed_child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if let Some(r) = self.routd.take() {
            r.shutdown().await;
        }
        if let Some(r) = self.runed.take() {
            let runner = r.runner();
            r.shutdown().await;
            if let Some(runner) = runner {
                let _ = runner.cleanup_orphans(&Default::default()).await;
            }
        }
        if let Some(a) = self.authd.take() {
            let _ = a.shutdown().await;
        }
    }
}

/// The name of the test function that is runed's process in a test that kills it; a test
/// file using [`Rig::spawn_runed_process`] defines it as
/// `#[test] #[ignore] fn runed_child_process() { common::run_runed_child() }`.
pub const RUNED_CHILD: &str = "runed_child_process";
pub const RUNED_CHILD_ENV: &str = "HAKO_TEST_RUNED_CHILD";

/// runed's process: when this test binary was started by [`Rig::spawn_runed_process`], runs
/// runed from the environment until killed or stopped with SIGTERM. Run any other way (`--ignored` by hand), it
/// returns at once: it is a program, not a test.
pub fn run_runed_child() {
    if std::env::var(RUNED_CHILD_ENV).as_deref() != Ok("1") {
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    // Its log on the test's stderr (shown when the test fails), as the runed binary logs.
    let _ = hako_shared::telemetry::init();
    rt.block_on(async {
        let cfg = hako_runed::Config::from_env(&Env::from_process()).unwrap();
        let l = tokio::net::TcpListener::bind(cfg.listen_addr)
            .await
            .unwrap();
        let running = hako_runed::start(cfg, l).await.unwrap();
        // As the runed binary does: a SIGTERM is a shutdown (live runs detached, warm boxes
        // removed, none left half made), a SIGKILL is a crash.
        hako_shared::http::shutdown_signal().await;
        running.shutdown().await;
    });
}

/// runed settings for a rig whose test keeps a turn live for a while (a loaded machine makes
/// a test slow; the rig's stop removes the run anyway).
pub const LONG_RUNS: &[(&str, &str)] = &[("RUNED_RUN_TIMEOUT", "900s")];

pub fn enc(s: &str) -> String {
    s.replace('%', "%25").replace('/', "%2F")
}

/// The outbound replies (not notices) of a history, their texts.
pub fn replies(h: &[MessageView]) -> Vec<String> {
    h.iter()
        .filter(|m| {
            m.direction == hako_shared::chat::Direction::Out
                && m.kind == hako_shared::chat::MessageKind::Message
        })
        .map(|m| m.content.clone())
        .collect()
}

pub fn notices(h: &[MessageView]) -> Vec<String> {
    h.iter()
        .filter(|m| m.kind == hako_shared::chat::MessageKind::Notice)
        .map(|m| m.content.clone())
        .collect()
}

/// Reads server-sent events from `url` until `n` arrived (or the limit): (id, data).
pub async fn sse(
    url: &str,
    token: &str,
    last_event_id: Option<i64>,
    n: usize,
) -> Vec<(i64, Value)> {
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let mut req = http.get(url).bearer_auth(token);
    if let Some(id) = last_event_id {
        req = req.header("last-event-id", id.to_string());
    }
    let mut resp = req.send().await.unwrap();
    assert_eq!(resp.status(), 200, "{url}");
    let mut buf = String::new();
    let mut out = Vec::new();
    let deadline = tokio::time::Instant::now() + LIMIT;
    while out.len() < n {
        let chunk = tokio::time::timeout_at(deadline, resp.chunk())
            .await
            .unwrap_or_else(|_| panic!("{n} events within the limit; got {out:?}"))
            .unwrap()
            .expect("the stream stays open");
        buf.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(end) = buf.find("\n\n") {
            let ev: String = buf.drain(..end + 2).collect();
            let mut id = None;
            let mut data = None;
            for l in ev.lines() {
                if let Some(v) = l.strip_prefix("id:") {
                    id = v.trim().parse().ok();
                }
                if let Some(v) = l.strip_prefix("data:") {
                    data = serde_json::from_str(v.trim()).ok();
                }
            }
            if let (Some(id), Some(data)) = (id, data) {
                out.push((id, data));
            }
        }
    }
    out
}

/// One request a receiver got: its headers, its body, the status it answered.
pub type Got = (HashMap<String, String>, Vec<u8>, u16);

/// A webhook receiver on loopback: records every request, fails the first `fail_first`.
#[derive(Clone, Default)]
pub struct Receiver {
    pub got: Arc<Mutex<Vec<Got>>>,
    pub fail_first: Arc<AtomicUsize>,
}

impl Receiver {
    pub async fn start(fail_first: usize) -> (Receiver, String) {
        let r = Receiver::default();
        r.fail_first.store(fail_first, Ordering::SeqCst);
        let state = r.clone();
        let app = axum::Router::new().route(
            "/hook",
            axum::routing::post(
                move |headers: axum::http::HeaderMap, body: axum::body::Bytes| {
                    let st = state.clone();
                    async move {
                        let h = headers
                            .iter()
                            .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("").to_owned()))
                            .collect();
                        let fail = st
                            .fail_first
                            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                            .is_ok();
                        let status = if fail { 503 } else { 200 };
                        st.got.lock().unwrap().push((h, body.to_vec(), status));
                        axum::http::StatusCode::from_u16(status).unwrap()
                    }
                },
            ),
        );
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hook", l.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(l, app).await });
        (r, url)
    }

    pub fn requests(&self) -> Vec<Got> {
        self.got.lock().unwrap().clone()
    }
}

/// Checks a webhook signature with Python's hmac (an implementation routd does not share).
pub fn signature_ok(secret: &str, headers: &HashMap<String, String>, body: &[u8]) -> bool {
    const SCRIPT: &str = r#"
import hashlib, hmac, json, sys
i = json.load(sys.stdin)
mac = hmac.new(i["secret"].encode(), (i["ts"] + "." + i["body"]).encode(), hashlib.sha256).hexdigest()
print(json.dumps({"ok": hmac.compare_digest("v1=" + mac, i["sig"])}))
"#;
    let python = hako_shared::testing::conformance_python();
    let out = hako_shared::testing::run_python(
        &python,
        SCRIPT,
        &json!({
            "secret": secret,
            "ts": headers.get("x-hako-timestamp").cloned().unwrap_or_default(),
            "sig": headers.get("x-hako-signature").cloned().unwrap_or_default(),
            "body": String::from_utf8_lossy(body),
        }),
    );
    out["ok"] == true
}

/// The reply lines of the agent's answer to a `/mcp …` script (`mcp TOOL: …`), by tool, in
/// the order of the calls.
pub fn tool_lines(reply: &str) -> HashMap<String, Vec<String>> {
    let mut by_tool: HashMap<String, Vec<String>> = HashMap::new();
    for (tool, rest) in reply
        .lines()
        .filter_map(|l| l.strip_prefix("mcp "))
        .filter_map(|l| l.split_once(": "))
    {
        by_tool
            .entry(tool.to_owned())
            .or_default()
            .push(rest.to_owned());
    }
    by_tool
}

/// The approval requests a history shows, their ids (`ap-…`), oldest first.
pub fn requests(h: &[MessageView]) -> Vec<String> {
    h.iter()
        .filter(|m| m.kind == MessageKind::Approval)
        .filter_map(|m| m.id.rsplit('.').next().map(str::to_owned))
        .collect()
}

/// Waits for the `n`th approval request of `chat`; answers its id.
pub async fn nth_request(rig: &Rig, chat: &str, n: usize) -> String {
    let h = rig
        .wait_for(chat, "an approval request", |h| requests(h).len() >= n)
        .await;
    requests(&h)[n - 1].clone()
}

pub fn folder_dir(
    rig: &Rig,
    folder: &str,
    dir: hako_shared::layout::FolderDir,
) -> std::path::PathBuf {
    hako_shared::layout::DataLayout::new(rig.data())
        .dir(&hako_shared::GroupFolder::new(folder).unwrap(), dir)
}

/// Every file under `dir` holding `needle`.
pub fn files_containing(dir: &std::path::Path, needle: &str) -> Vec<String> {
    let mut hits = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let Ok(ft) = e.file_type() else { continue };
            if ft.is_dir() {
                stack.push(e.path());
            } else if ft.is_file()
                && std::fs::read(e.path())
                    .is_ok_and(|b| b.windows(needle.len()).any(|w| w == needle.as_bytes()))
            {
                hits.push(e.path().display().to_string());
            }
        }
    }
    hits
}

/// The containers (running or not) carrying every one of `labels`.
pub async fn labelled(
    docker: &bollard::Docker,
    labels: Vec<String>,
) -> Vec<bollard::models::ContainerSummary> {
    let filters = std::collections::HashMap::from([("label".to_owned(), labels)]);
    docker
        .list_containers(Some(
            bollard::query_parameters::ListContainersOptionsBuilder::new()
                .all(true)
                .filters(&filters)
                .build(),
        ))
        .await
        .unwrap()
}

/// The containers of this rig's install that are warm boxes (started before their turn).
pub async fn warm_boxes(docker: &bollard::Docker, rig: &Rig) -> Vec<String> {
    let labels = vec![
        format!("io.hako.install={}", rig.install),
        "io.hako.warm-box=1".to_owned(),
    ];
    labelled(docker, labels)
        .await
        .into_iter()
        .filter_map(|c| c.id)
        .collect()
}

/// Every process on the host: (pid, parent pid, arguments), from `/proc` (the tests run as
/// root).
pub fn host_processes() -> Vec<(u32, u32, Vec<String>)> {
    let mut all = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        let (Ok(stat), Ok(cmdline)) = (
            std::fs::read_to_string(format!("/proc/{pid}/stat")),
            std::fs::read(format!("/proc/{pid}/cmdline")),
        ) else {
            continue;
        };
        // `pid (comm) state ppid …`: the comm may hold spaces, so split after its ')'.
        let Some(ppid) = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        let args = cmdline
            .split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        all.push((pid, ppid, args));
    }
    all
}

/// What runed recorded of each run (its state and the agent's log), for a failure message.
pub fn run_logs(rig: &Rig) -> String {
    let db = rusqlite::Connection::open(rig.data().join("runed.db")).unwrap();
    let mut q = db
        .prepare(
            "SELECT s.run_id, s.state, COALESCE(l.log, '') FROM spawns s \
             LEFT JOIN spawn_logs l ON l.run_id = s.run_id ORDER BY s.rowid",
        )
        .unwrap();
    q.query_map([], |r| {
        Ok(format!(
            "\n{} {}:\n{}",
            r.get::<_, String>(0)?,
            r.get::<_, String>(1)?,
            r.get::<_, String>(2)?
        ))
    })
    .unwrap()
    .map(Result::unwrap)
    .collect()
}

/// The process in container `id` (a descendant of its init) whose arguments `matches`, as the
/// host sees it: its host pid, its arguments and its environment.
pub async fn process_in(
    docker: &bollard::Docker,
    id: &str,
    matches: impl Fn(&[String]) -> bool,
) -> Option<(u32, Vec<String>, String)> {
    let info = docker.inspect_container(id, None).await.ok()?;
    // A box not started yet has pid 0, whose descendants would be every process on the host.
    let init = u32::try_from(info.state?.pid?).ok().filter(|p| *p > 0)?;
    let all = host_processes();
    let mut inside = vec![init];
    let mut i = 0;
    while i < inside.len() {
        let parent = inside[i];
        inside.extend(all.iter().filter(|p| p.1 == parent).map(|p| p.0));
        i += 1;
    }
    let (pid, _, args) = all
        .into_iter()
        .find(|p| inside.contains(&p.0) && matches(&p.2))?;
    let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
    Some((pid, args, String::from_utf8_lossy(&env).replace('\0', "\n")))
}

/// One request a stub model got.
#[derive(Debug, Clone)]
pub struct Seen {
    pub headers: axum::http::HeaderMap,
    pub body: serde_json::Value,
}

/// What a stub model answers a request with.
pub enum Reply {
    /// This event stream, at once.
    Stream(String),
    /// This event stream, after a while (a slow model).
    After(Duration, String),
    /// Nothing, ever: the connection stays open, silent.
    Never,
}

/// A model provider on loopback (Anthropic's or OpenAI's wire, as `script` writes it): each
/// request is recorded and answered by `script` from its body.
#[derive(Clone, Default)]
pub struct ModelStub {
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl ModelStub {
    /// The stub and its URL.
    pub async fn start(script: fn(&Value) -> Reply) -> (ModelStub, String) {
        let stub = ModelStub::default();
        let st = stub.clone();
        let app = axum::Router::new().fallback(axum::routing::any(
            move |headers: axum::http::HeaderMap, body: axum::body::Bytes| {
                let st = st.clone();
                async move {
                    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                    st.seen.lock().unwrap().push(Seen {
                        headers,
                        body: body.clone(),
                    });
                    let stream = match script(&body) {
                        Reply::Stream(s) => s,
                        Reply::After(d, s) => {
                            tokio::time::sleep(d).await;
                            s
                        }
                        Reply::Never => std::future::pending().await,
                    };
                    axum::response::Response::builder()
                        .header("content-type", "text/event-stream")
                        .body(axum::body::Body::from(stream))
                        .unwrap()
                }
            },
        ));
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", l.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(l, app).await });
        (stub, url)
    }

    /// Every request so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

/// A CLI agent's (Claude Code's, Codex's) slow answer through a runed SIGKILL, then a
/// follow-up, in `web:<folder>`: the run's container holds neither the provider's key
/// (`key`, nor its variable `key_var`) nor a token in its environment or labels; runed killed
/// and started again re-adopts it and the answer reaches the chat once; a follow-up sent while
/// the agent answers is taken by the same turn.
pub async fn follow_up_through_a_runed_kill(rig: &mut Rig, folder: &str, key: &str, key_var: &str) {
    let chat = format!("web:{folder}");
    rig.say(&chat, "f-1", "answer slowly please").await;
    // The run is live: what Docker says of its container.
    let (_, run) = rig.live_run(folder).await;
    let docker = hako_deploy::connect_docker().unwrap();
    let containers = labelled(&docker, vec![format!("io.hako.run={run}")]).await;
    let id = containers[0].id.clone().unwrap();
    let inspect = docker.inspect_container(&id, None).await.unwrap();
    let config = serde_json::to_string(&inspect.config).unwrap();
    assert!(!config.contains(key), "the key in the container's config");
    assert!(
        !config.contains(key_var) && !config.contains("eyJ"),
        "no key variable and no token in the container's env or labels: {config}"
    );
    // runed dies while the model thinks; the container runs on, and is re-adopted.
    rig.kill_runed_process();
    rig.spawn_runed_process().await;
    let h = rig
        .wait_for(&chat, "the slow answer", |h| !replies(h).is_empty())
        .await;
    assert_eq!(replies(&h), ["You said: answer slowly please"]);
    // A follow-up into the same live process.
    rig.say(&chat, "f-2", "and one more thing").await;
    let h = rig
        .wait_for(&chat, "the follow-up's answer", |h| replies(h).len() == 2)
        .await;
    let r = replies(&h);
    assert_eq!(r[1], "You said: and one more thing", "{r:?}");
    let turn = |id: &str| {
        h.iter()
            .find(|m| m.id == id)
            .and_then(|m| m.turn_id.clone())
            .unwrap()
    };
    assert_eq!(turn("f-1"), turn("f-2"), "one turn, one run");
}
