//! The Telegram adapter's test rig: a Bot API server of our own on loopback (it records
//! every call, can answer 429 and 5xx, and can replay updates), real authd, runed and routd
//! in-process, the real `hako-agent` as host processes on runed's simulated engine (the
//! adapter's logic needs no container: no Docker), and the `hako-telegram` binary pointed at
//! both.

#![allow(dead_code)]

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{Path, State};
use axum::routing::post;
use hako_authd::testing::{CHANNEL_KEY, ROUTD_KEY, RUNED_KEY, TestAuthd};
use hako_client::routd;
use hako_client::testing::send;
use hako_shared::GroupFolder;
use hako_shared::chat::{GroupConfig, NewRoute, NewWebhook};
use hako_shared::config::Env;
use hako_shared::testing::ApiClient;
pub use hako_shared::testing::eventually;
use serde_json::{Value, json};
use tokio::sync::Notify;

pub const LIMIT: Duration = Duration::from_secs(120);
/// The bot token the fake server accepts; it must appear in no log.
pub const TOKEN: &str = "4242424242:AAtest-SECRET_bot-token_0123456789";
pub const BOT_ID: u64 = 4242424242;
pub const BOT_NAME: &str = "hakobot";
pub const SECRET: &str = "webhook-secret-0123456789abcdef";

/// One call the adapter made to the fake Bot API.
#[derive(Debug, Clone)]
pub struct Call {
    pub method: String,
    pub body: Value,
    pub status: u16,
    pub at: Instant,
}

#[derive(Default)]
struct FakeState {
    updates: Vec<Value>,
    calls: Vec<Call>,
    /// Planned failures, per method, in order: (status, retry_after).
    fail: HashMap<String, VecDeque<(u16, Option<u64>)>>,
    /// Serve every update ever pushed, whatever the offset (a server that lost the
    /// acknowledgement).
    replay: bool,
    next_message_id: i64,
    /// Files by id: what `getFile` and the file URL serve.
    files: HashMap<String, Vec<u8>>,
    /// The paths downloaded, in order.
    downloads: Vec<String>,
}

/// The fake Bot API.
#[derive(Clone)]
pub struct FakeTelegram {
    state: Arc<Mutex<FakeState>>,
    pushed: Arc<Notify>,
    pub url: String,
}

impl FakeTelegram {
    pub async fn start() -> FakeTelegram {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let fake = FakeTelegram {
            state: Arc::new(Mutex::new(FakeState {
                next_message_id: 1000,
                ..Default::default()
            })),
            pushed: Arc::new(Notify::new()),
            url: format!("http://{}", l.local_addr().unwrap()),
        };
        let app = Router::new()
            .route("/{bot}/{method}", post(api))
            .route("/file/{bot}/{*path}", axum::routing::get(file))
            .with_state(fake.clone());
        tokio::spawn(async move { axum::serve(l, app).await });
        fake
    }

    /// Adds an update (its `update_id` is given here).
    pub fn push(&self, mut content: Value) -> i64 {
        let mut s = self.state.lock().unwrap();
        let id = s.updates.len() as i64 + 1;
        content["update_id"] = json!(id);
        s.updates.push(content);
        drop(s);
        self.pushed.notify_waiters();
        id
    }

    /// A text message from `user` in `chat` (private when they are equal).
    pub fn message(&self, chat: i64, user: u64, text: &str) -> i64 {
        let mid = {
            let mut s = self.state.lock().unwrap();
            s.next_message_id += 1;
            s.next_message_id
        };
        let kind = if chat > 0 { "private" } else { "supergroup" };
        self.push(json!({"message": {
            "message_id": mid, "date": 1_790_000_000,
            "chat": {"id": chat, "type": kind},
            "from": {"id": user, "is_bot": false, "first_name": format!("user{user}")},
            "text": text,
        }}))
    }

    /// The message id the next message pushed gets.
    pub fn peek_message_id(&self) -> i64 {
        self.state.lock().unwrap().next_message_id + 1
    }

    /// A message from `user` in `chat` carrying `media` (a `photo` array or a `document`,
    /// `voice`… object, whose `file_id`s `files` serves) and `caption`. Answers its message id.
    pub fn media(
        &self,
        chat: i64,
        user: u64,
        caption: &str,
        media: Value,
        files: &[(&str, &[u8])],
    ) -> i64 {
        let mid = {
            let mut s = self.state.lock().unwrap();
            s.next_message_id += 1;
            for (id, data) in files {
                s.files.insert((*id).to_owned(), data.to_vec());
            }
            s.next_message_id
        };
        let kind = if chat > 0 { "private" } else { "supergroup" };
        let mut m = json!({
            "message_id": mid, "date": 1_790_000_000,
            "chat": {"id": chat, "type": kind},
            "from": {"id": user, "is_bot": false, "first_name": format!("user{user}")},
        });
        if !caption.is_empty() {
            m["caption"] = json!(caption);
        }
        m.as_object_mut()
            .unwrap()
            .extend(media.as_object().unwrap().clone());
        self.push(json!({ "message": m }));
        mid
    }

    /// The file paths downloaded so far.
    pub fn downloads(&self) -> Vec<String> {
        self.state.lock().unwrap().downloads.clone()
    }

    /// A press of a button whose data is `data` on message `message` in `chat`.
    pub fn press(&self, chat: i64, message: i64, user: u64, data: &str) -> i64 {
        let n = self.state.lock().unwrap().updates.len();
        self.push(json!({"callback_query": {
            "id": format!("cq{n}"),
            "from": {"id": user, "is_bot": false, "first_name": format!("user{user}")},
            "message": {"message_id": message, "date": 1_790_000_000,
                        "chat": {"id": chat, "type": if chat > 0 {"private"} else {"supergroup"}},
                        "text": "approval"},
            "chat_instance": "ci",
            "data": data,
        }}))
    }

    /// The next call of `method` answers `status` (with `retry_after` for a 429).
    pub fn fail_next(&self, method: &str, status: u16, retry_after: Option<u64>) {
        self.state
            .lock()
            .unwrap()
            .fail
            .entry(method.into())
            .or_default()
            .push_back((status, retry_after));
    }

    pub fn set_replay(&self, on: bool) {
        self.state.lock().unwrap().replay = on;
    }

    pub fn calls(&self) -> Vec<Call> {
        self.state.lock().unwrap().calls.clone()
    }

    /// The texts of the `sendMessage` calls that succeeded to `chat`, in order.
    pub fn sent(&self, chat: i64) -> Vec<String> {
        self.calls()
            .into_iter()
            .filter(|c| c.method == "sendMessage" && c.status == 200 && c.body["chat_id"] == chat)
            .map(|c| c.body["text"].as_str().unwrap_or_default().to_owned())
            .collect()
    }

    /// The successful calls of `method`.
    pub fn ok_calls(&self, method: &str) -> Vec<Call> {
        self.calls()
            .into_iter()
            .filter(|c| c.method == method && c.status == 200)
            .collect()
    }

    /// Waits until a successful `sendMessage` to `chat` satisfies `f`; answers it.
    pub async fn wait_sent(&self, chat: i64, what: &str, f: impl Fn(&str) -> bool) -> String {
        eventually(what, LIMIT, || async {
            self.sent(chat)
                .into_iter()
                .find(|t| f(t))
                .ok_or_else(|| format!("sent so far: {:?}", self.sent(chat)))
        })
        .await
    }
}

async fn api(
    State(fake): State<FakeTelegram>,
    Path((bot, method)): Path<(String, String)>,
    body: axum::body::Bytes,
) -> (axum::http::StatusCode, axum::Json<Value>) {
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let status = |s: u16| axum::http::StatusCode::from_u16(s).unwrap();
    if bot != format!("bot{TOKEN}") {
        return (
            status(401),
            axum::Json(json!({"ok": false, "error_code": 401, "description": "Unauthorized"})),
        );
    }
    let record = |code: u16| {
        fake.state.lock().unwrap().calls.push(Call {
            method: method.clone(),
            body: body.clone(),
            status: code,
            at: Instant::now(),
        });
    };
    let planned = fake
        .state
        .lock()
        .unwrap()
        .fail
        .get_mut(&method)
        .and_then(VecDeque::pop_front);
    if let Some((code, after)) = planned {
        record(code);
        let mut err = json!({"ok": false, "error_code": code, "description": "planned failure"});
        if let Some(a) = after {
            err["parameters"] = json!({"retry_after": a});
        }
        return (status(code), axum::Json(err));
    }
    let ok = |result: Value| {
        (
            status(200),
            axum::Json(json!({"ok": true, "result": result})),
        )
    };
    match method.as_str() {
        "getMe" => {
            record(200);
            ok(json!({"id": BOT_ID, "is_bot": true, "first_name": "hako", "username": BOT_NAME}))
        }
        "getUpdates" => {
            let offset = body["offset"].as_i64().unwrap_or(0);
            let timeout = Duration::from_secs(body["timeout"].as_u64().unwrap_or(0).min(5));
            let deadline = tokio::time::Instant::now() + timeout;
            loop {
                let notified = fake.pushed.notified();
                let found: Vec<Value> = {
                    let s = fake.state.lock().unwrap();
                    s.updates
                        .iter()
                        .filter(|u| s.replay || u["update_id"].as_i64().unwrap() >= offset)
                        .cloned()
                        .collect()
                };
                if !found.is_empty() || tokio::time::Instant::now() >= deadline {
                    record(200);
                    return ok(json!(found));
                }
                tokio::select! {
                    () = notified => {}
                    () = tokio::time::sleep_until(deadline) => {}
                }
            }
        }
        "getFile" => {
            let id = body["file_id"].as_str().unwrap_or_default().to_owned();
            let size = fake.state.lock().unwrap().files.get(&id).map(Vec::len);
            match size {
                Some(n) => {
                    record(200);
                    ok(json!({"file_id": id, "file_unique_id": format!("u{id}"),
                              "file_size": n, "file_path": format!("documents/{id}")}))
                }
                None => {
                    record(400);
                    (
                        status(400),
                        axum::Json(
                            json!({"ok": false, "error_code": 400, "description": "Bad Request: invalid file_id"}),
                        ),
                    )
                }
            }
        }
        "sendMessage" | "editMessageText" => {
            record(200);
            let mid = {
                let mut s = fake.state.lock().unwrap();
                s.next_message_id += 1;
                s.next_message_id
            };
            ok(
                json!({"message_id": body["message_id"].as_i64().unwrap_or(mid), "date": 1_790_000_000,
                      "chat": {"id": body["chat_id"], "type": "private"},
                      "text": body["text"]}),
            )
        }
        _ => {
            record(200);
            ok(json!(true))
        }
    }
}

/// The Bot API's file URL: `/file/bot<token>/<file_path>`.
async fn file(
    State(fake): State<FakeTelegram>,
    Path((bot, path)): Path<(String, String)>,
) -> (axum::http::StatusCode, Vec<u8>) {
    if bot != format!("bot{TOKEN}") {
        return (axum::http::StatusCode::UNAUTHORIZED, Vec::new());
    }
    let mut s = fake.state.lock().unwrap();
    s.downloads.push(path.clone());
    let id = path.strip_prefix("documents/").unwrap_or_default();
    match s.files.get(id) {
        Some(d) => (axum::http::StatusCode::OK, d.clone()),
        None => (axum::http::StatusCode::NOT_FOUND, Vec::new()),
    }
}

/// The agent image's name on the simulated engine.
const SIM_IMAGE: &str = "hako-agent:sim";

/// authd, runed and routd in-process, sharing a data directory.
pub struct Stack {
    pub dir: tempfile::TempDir,
    authd: Option<TestAuthd>,
    runed: Option<hako_runed::Running>,
    routd: Option<hako_routd::Running>,
    pub routd_url: String,
    pub authd_url: String,
    pub operator: String,
    pub adapter_port: u16,
    /// The install's id; its containers (on Docker) are removed on drop.
    install: String,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Stack {
    /// The stack with runed's boxes on the simulated engine: the real `hako-agent` as host
    /// processes, no Docker.
    pub async fn start() -> Stack {
        let agent = hako_deploy::agent_binary()
            .await
            .expect("hako-agent builds");
        let sim = hako_runner::sim::SimEngine::new();
        sim.image(
            SIM_IMAGE,
            &[(hako_shared::contract::WARM_LABEL, "1")],
            hako_runner::sim::process(agent),
        );
        Self::build(SIM_IMAGE.to_owned(), Some(sim)).await
    }

    /// The stack with real agent containers on Docker (what the agent sees in its box).
    pub async fn start_on_docker() -> Stack {
        let image = hako_deploy::ensure_agent_image()
            .await
            .expect("agent image");
        Self::build(image, None).await
    }

    async fn build(image: String, sim: Option<hako_runner::sim::SimEngine>) -> Stack {
        let dir = tempfile::tempdir().unwrap();
        let authd = TestAuthd::start(&dir.path().join("authd")).await;
        let operator = authd.token("operator").await;
        let data = dir.path().join("data").display().to_string();
        let install = {
            let mut b = [0u8; 6];
            getrandom::fill(&mut b).unwrap();
            let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
            // Named for its engine: only Docker's leave containers to remove.
            let engine = if sim.is_some() { "sim" } else { "docker" };
            format!("tg-{engine}-{hex}")
        };
        let runed_cfg = hako_runed::Config::from_env(&Env::from_pairs([
            ("DATA_DIR", data.clone()),
            ("AUTHD_URL", authd.url()),
            ("AUTHD_SERVICE_KEY", RUNED_KEY.into()),
            ("AUTHD_CLOCK_SKEW", "1s".into()),
            ("MAX_CONTAINERS", "4".into()),
            ("RUNED_RUN_TIMEOUT", "60s".into()),
            ("RUNED_STOP_GRACE", "1s".into()),
            // Small, so that a test can fill a folder's media directory.
            ("RUNED_MEDIA_FOLDER_MAX", "64k".into()),
            ("CONTAINER_IMAGE", image),
            ("HAKO_INSTALL_ID", install.clone()),
        ]))
        .unwrap();
        let runed_cfg = hako_runed::Config {
            engine: sim.map(|s| hako_runner::engine::EngineRef(Arc::new(s) as _)),
            ..runed_cfg
        };
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let runed_url = format!("http://{}", l.local_addr().unwrap());
        let runed = hako_runed::start(runed_cfg, l).await.unwrap();
        let routd_cfg = hako_routd::Config::from_env(&Env::from_pairs([
            ("DATA_DIR", data),
            ("AUTHD_URL", authd.url()),
            ("AUTHD_SERVICE_KEY", ROUTD_KEY.into()),
            ("AUTHD_CLOCK_SKEW", "1s".into()),
            ("RUNED_URL", runed_url),
            ("ROUTD_RETRY_BASE", "200ms".into()),
            ("ROUTD_WEBHOOK_RETRY_BASE", "100ms".into()),
            ("ROUTD_WEBHOOK_ALLOW_PRIVATE", "1".into()),
            ("ROUTD_CHANNEL_CHATS", "tg:*".into()),
            ("ROUTD_LISTEN", "127.0.0.1:0".into()),
        ]))
        .unwrap();
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let routd_url = format!("http://{}", l.local_addr().unwrap());
        let routd = hako_routd::start(routd_cfg, l).await.unwrap();
        let stack = Stack {
            authd_url: authd.url(),
            dir,
            authd: Some(authd),
            runed: Some(runed),
            routd: Some(routd),
            routd_url,
            operator,
            adapter_port: free_port(),
            install,
        };
        // routd's deliveries for every tg: chat go to the adapter (the operator's one step).
        let hook = NewWebhook {
            prefix: "tg:".into(),
            url: format!("http://127.0.0.1:{}/v1/deliveries", stack.adapter_port),
            secret: SECRET.into(),
        };
        let (s, v) = send(&stack.api(), &stack.operator, routd::add_webhook(&hook)).await;
        assert_eq!(s, 201, "{v}");
        stack
    }

    pub fn api(&self) -> ApiClient {
        ApiClient::new(self.routd_url.clone())
    }

    /// A group `folder` with `extra` settings, and a route for `chat` to it.
    pub async fn group(&self, folder: &str, chat: &str, extra: Value) {
        let mut body = json!({"name": folder});
        if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
            b.extend(e.clone());
        }
        let cfg: GroupConfig = serde_json::from_value(body).expect("a group's settings");
        let (s, v) = send(&self.api(), &self.operator, routd::put_group(folder, &cfg)).await;
        assert!(s == 200 || s == 201, "{v}");
        let route = NewRoute {
            pattern: chat.to_owned(),
            folder: GroupFolder::new(folder).expect("a folder"),
            position: None,
        };
        let (s, v) = send(&self.api(), &self.operator, routd::add_route(&route)).await;
        assert_eq!(s, 201, "{v}");
    }

    /// The chat's log as the operator reads it.
    pub async fn history(&self, chat: &str) -> Vec<Value> {
        let op = routd::chat_messages(chat).query("limit", 200);
        let (s, v) = send(&self.api(), &self.operator, op).await;
        assert_eq!(s, 200, "{v}");
        v["messages"].as_array().cloned().unwrap_or_default()
    }

    /// Starts the adapter binary against `fake`, allowing `chats`; its stderr goes to
    /// `log` (appended).
    pub fn adapter(&self, fake: &FakeTelegram, chats: &[i64], log: &std::path::Path) -> Adapter {
        let dir = self.dir.path();
        let token = dir.join("bot-token");
        std::fs::write(&token, format!("{TOKEN}\n")).unwrap();
        let secret = dir.join("webhook-secret");
        std::fs::write(&secret, SECRET).unwrap();
        let key = dir.join("channel.key");
        std::fs::write(&key, CHANNEL_KEY).unwrap();
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .unwrap();
        let chats: Vec<String> = chats.iter().map(i64::to_string).collect();
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_hako-telegram"))
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("RUST_LOG", "debug")
            .env("TELEGRAM_TOKEN_FILE", &token)
            .env("TELEGRAM_API_URL", &fake.url)
            .env("TELEGRAM_CHATS", chats.join(","))
            .env(
                "TELEGRAM_LISTEN",
                format!("127.0.0.1:{}", self.adapter_port),
            )
            .env("TELEGRAM_DB", dir.join("telegram.db"))
            .env("TELEGRAM_WEBHOOK_SECRET_FILE", &secret)
            .env("TELEGRAM_POLL_TIMEOUT", "1s")
            .env("TELEGRAM_RETRY_BASE", "100ms")
            .env("ROUTD_URL", &self.routd_url)
            .env("AUTHD_URL", &self.authd_url)
            .env("AUTHD_SERVICE_KEY_FILE", &key)
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .expect("the adapter starts");
        Adapter {
            child,
            url: format!("http://127.0.0.1:{}", self.adapter_port),
        }
    }

    pub async fn stop(mut self) {
        if let Some(r) = self.routd.take() {
            r.shutdown().await;
        }
        if let Some(r) = self.runed.take() {
            r.shutdown().await;
        }
    }
}

impl Drop for Stack {
    /// Every container of this stack's install (on Docker), whatever the test left.
    fn drop(&mut self) {
        if self.install.starts_with("tg-docker-") {
            hako_deploy::remove_install_containers(&self.install);
        }
    }
}

/// The adapter's process; killed on drop.
pub struct Adapter {
    child: std::process::Child,
    pub url: String,
}

impl Adapter {
    /// SIGKILL: nothing is flushed or finished.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// The adapter's `/health`.
    pub async fn health(&self) -> Value {
        eventually("the adapter answers /health", LIMIT, || async {
            let r = reqwest::Client::builder()
                .no_proxy()
                .build()
                .unwrap()
                .get(format!("{}/health", self.url))
                .send()
                .await
                .map_err(|e| e.to_string())?;
            r.json::<Value>().await.map_err(|e| e.to_string())
        })
        .await
    }
}

impl Drop for Adapter {
    fn drop(&mut self) {
        self.kill();
    }
}
