//! The kill sweep: for every failpoint (`hako_shared::failpoint::ALL`), one scripted
//! conversation (a message, a follow-up into its live run, a tool call held for approval and
//! approved, every outbound message delivered to a webhook) runs against real authd, runed
//! and routd, each in a process of its own, while that failpoint is armed in its daemon. The
//! daemon dies right after that durable step (SIGKILL, from inside), is started again, and the
//! conversation finishes. Asserted after each, from outside: every message answered exactly
//! once, the approved call run once and every request decided at most once, every outbound
//! message delivered at least once under one idempotency key, no container left but a warm
//! box, no unrevoked token of a finished run, and the failpoint reached.

mod common;

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use hako_client::authd::AuthdClient;
use hako_client::{Body, Op, routd};
use hako_shared::chat::{Direction, MessageKind, MessageView, PostMessage};
use serde_json::{Value, json};

/// runed's process (a program, not a test: see [`common::run_runed_child`]).
#[test]
#[ignore = "runed's process in tests that SIGKILL it; started by the sweep"]
fn runed_child_process() {
    run_runed_child();
}

/// authd's process, on the rig's port and data directory (a program, not a test).
#[test]
#[ignore = "authd's process in tests that SIGKILL it; started by the sweep"]
fn authd_child_process() {
    if std::env::var(AUTHD_CHILD_ENV).as_deref() != Ok("1") {
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let addr = std::env::var("SWEEP_AUTHD_LISTEN").unwrap();
        let dir = PathBuf::from(std::env::var("SWEEP_AUTHD_DIR").unwrap());
        let l = tokio::net::TcpListener::bind(addr).await.unwrap();
        let _authd = hako_authd::testing::TestAuthd::start_on(l, &dir).await;
        std::future::pending::<()>().await;
    });
}

const AUTHD_CHILD: &str = "authd_child_process";
const AUTHD_CHILD_ENV: &str = "HAKO_TEST_AUTHD_CHILD";

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Daemon {
    Authd,
    Runed,
    Routd,
}

impl Daemon {
    fn of(failpoint: &str) -> Daemon {
        match failpoint.split('.').next() {
            Some("authd") => Daemon::Authd,
            Some("runed") => Daemon::Runed,
            Some("routd") => Daemon::Routd,
            _ => panic!("failpoint {failpoint} names no daemon"),
        }
    }
}

/// The three daemons as processes, each restarted when it dies; the failpoint armed in its
/// daemon's first process only.
struct Daemons {
    envs: HashMap<Daemon, Vec<(String, String)>>,
    armed: Mutex<Option<(Daemon, String)>>,
    log: PathBuf,
    pids: Mutex<HashMap<Daemon, u32>>,
    deaths: Mutex<Vec<Daemon>>,
    stop: tokio_util::sync::CancellationToken,
}

impl Daemons {
    fn command(&self, d: Daemon) -> tokio::process::Command {
        let mut cmd = match d {
            Daemon::Routd => tokio::process::Command::new(env!("CARGO_BIN_EXE_routd")),
            Daemon::Runed | Daemon::Authd => {
                let mut c = tokio::process::Command::new(std::env::current_exe().unwrap());
                let name = if d == Daemon::Runed {
                    RUNED_CHILD
                } else {
                    AUTHD_CHILD
                };
                c.args([name, "--exact", "--ignored", "--nocapture"]);
                c
            }
        };
        cmd.env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::inherit())
            .kill_on_drop(true);
        if let Ok(filter) = std::env::var("RUST_LOG") {
            cmd.env("RUST_LOG", filter);
        }
        for (k, v) in &self.envs[&d] {
            cmd.env(k, v);
        }
        // Armed once: the process started again after the kill runs clean.
        let mut armed = self.armed.lock().unwrap();
        if let Some((a, name)) = armed.as_ref()
            && *a == d
        {
            cmd.env("HAKO_FAILPOINT", name)
                .env("HAKO_FAILPOINT_LOG", &self.log);
            *armed = None;
        }
        cmd
    }

    /// Keeps daemon `d` running until the sweep stops.
    async fn supervise(self: Arc<Self>, d: Daemon) {
        loop {
            let mut child = self.command(d).spawn().expect("a daemon starts");
            if let Some(pid) = child.id() {
                self.pids.lock().unwrap().insert(d, pid);
            }
            tokio::select! {
                _ = child.wait() => {
                    if self.stop.is_cancelled() {
                        return;
                    }
                    eprintln!("[sweep] {d:?} died; starting it again");
                    self.deaths.lock().unwrap().push(d);
                }
                () = self.stop.cancelled() => {
                    // SIGTERM, as a real shutdown: runed removes its warm boxes.
                    if let Some(pid) = child.id().and_then(|p| rustix::process::Pid::from_raw(p as i32)) {
                        let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
                    }
                    let _ = tokio::time::timeout(Duration::from_secs(60), child.wait()).await;
                    let _ = child.kill().await;
                    return;
                }
            }
        }
    }

    fn deaths(&self) -> Vec<Daemon> {
        self.deaths.lock().unwrap().clone()
    }
}

/// Kills every daemon of the sweep when the test ends, a failed one too (before the rig
/// removes the install's containers, so no runed makes one after).
struct KillOnDrop(Arc<Daemons>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        self.0.stop.cancel();
        for pid in self.0.pids.lock().unwrap().values() {
            if let Some(pid) = rustix::process::Pid::from_raw(*pid as i32) {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
            }
        }
    }
}

/// An operation on the daemon at `base` that may meet it down (`Err`: try again).
async fn call<R>(
    http: &reqwest::Client,
    base: &str,
    op: &Op<R>,
    token: &str,
) -> Result<(u16, Value), String> {
    let url = format!("{base}{}", op.path);
    let mut req = http.request(op.method.clone(), &url).bearer_auth(token);
    match &op.body {
        Body::None => {}
        Body::Json(b) => {
            req = req
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(b.clone());
        }
        Body::Bytes(_) | Body::Invalid(_) => panic!("{}: not a JSON call", op.path),
    }
    let resp = req.send().await.map_err(|e| format!("{url}: {e}"))?;
    let status = resp.status().as_u16();
    let bytes = resp.bytes().await.map_err(|e| format!("{url}: {e}"))?;
    Ok((
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    ))
}

struct Conversation<'a> {
    rig: &'a Rig,
    http: reqwest::Client,
    chat: &'static str,
    folder: &'static str,
}

/// How long one step of a conversation may take, a daemon's restart included.
const STEP: Duration = Duration::from_secs(180);

impl Conversation<'_> {
    /// Posts a message until routd has it (a repeat after a kill is a duplicate, not a second
    /// message: the same id).
    async fn say(&self, id: &str, text: &str) {
        let m: PostMessage = serde_json::from_value(
            json!({"id": id, "chat_jid": self.chat, "sender": "alice", "content": text}),
        )
        .unwrap();
        let op = routd::post_message(&m);
        eventually(&format!("message {id} taken"), STEP, || async {
            match call(&self.http, &self.rig.base(), &op, &self.rig.channel).await? {
                (200 | 201, v) => Ok(v),
                (s, v) => Err(format!("{s} {v}")),
            }
        })
        .await;
    }

    async fn get<R>(&self, op: &Op<R>) -> Result<Value, String> {
        match call(&self.http, &self.rig.base(), op, &self.rig.operator).await? {
            (200, v) => Ok(v),
            (s, v) => Err(format!("{s} {v}")),
        }
    }

    async fn history(&self) -> Result<Vec<MessageView>, String> {
        let v = self
            .get(&routd::chat_messages(self.chat).query("limit", 1000))
            .await?;
        serde_json::from_value(v["messages"].clone()).map_err(|e| e.to_string())
    }

    async fn wait_history(
        &self,
        what: &str,
        done: impl Fn(&[MessageView]) -> bool,
    ) -> Vec<MessageView> {
        eventually(what, STEP, || async {
            let h = self.history().await?;
            if done(&h) {
                Ok(h)
            } else {
                Err(format!("{:?}", replies(&h)))
            }
        })
        .await
    }

    /// Waits until the folder's turn runs (a message now is a follow-up into its run).
    async fn running(&self) {
        let op = routd::turns()
            .query("folder", self.folder)
            .query("state", "running");
        eventually("the first turn runs", STEP, || async {
            let v = self.get(&op).await?;
            match v["turns"].as_array() {
                Some(t) if !t.is_empty() => Ok(()),
                _ => Err(v.to_string()),
            }
        })
        .await;
    }

    /// Waits until the folder has no live turn and the chat nothing pending.
    async fn idle(&self) {
        eventually(&format!("{} goes idle", self.folder), STEP, || async {
            for state in ["starting", "running", "waiting"] {
                let op = routd::turns()
                    .query("folder", self.folder)
                    .query("state", state);
                let v = self.get(&op).await?;
                if v["turns"].as_array().is_some_and(|t| !t.is_empty()) {
                    return Err(format!("a {state} turn"));
                }
            }
            Ok(())
        })
        .await;
    }

    /// The first request asked in the chat, once asked; then the operator's Approve, given
    /// until routd has taken it (`already_decided` after a kill that came after the verdict
    /// was stored is the same verdict).
    async fn approve(&self) -> String {
        let id = eventually("the call is held", STEP, || async {
            let op = routd::approvals().query("all", true).query("limit", 100);
            let v = self.get(&op).await?;
            v["approvals"]
                .as_array()
                .and_then(|a| a.iter().find(|r| r["chat_jid"] == self.chat))
                .and_then(|r| r["id"].as_str().map(str::to_owned))
                .ok_or(v.to_string())
        })
        .await;
        eventually("the Approve taken", STEP, || async {
            let op = routd::decide(&id, true);
            match call(&self.http, &self.rig.base(), &op, &self.rig.operator).await? {
                (200, _) => Ok(()),
                (409, v) if v["error"] == "already_decided" => Ok(()),
                (s, v) => Err(format!("{s} {v}")),
            }
        })
        .await;
        id
    }
}

/// The first message's reply, whether its follow-up came while it waited or not.
fn first_reply(c: &str) -> bool {
    c == "a follow-up is waiting" || c == "no follow-up within 5 s"
}

fn count(h: &[MessageView], pred: impl Fn(&str) -> bool) -> usize {
    h.iter()
        .filter(|m| m.direction == Direction::Out && m.kind == MessageKind::Message)
        .filter(|m| pred(&m.content))
        .count()
}

async fn sweep(failpoint: &'static str) {
    let target = Daemon::of(failpoint);
    let mut rig = Rig::new(
        &[("RUNED_RUN_TIMEOUT", "600s"), ("RUNED_WARM_MAX", "2")],
        &[],
    )
    .await;
    // Names of this failpoint's own: container names derive from the folder and the turn,
    // and the turn from the chat and message ids; other sweeps run beside this one.
    let folder: &'static str = failpoint.replace('.', "-").leak();
    let chat: &'static str = format!("tg:{folder}").leak();
    rig.put_group(
        folder,
        json!({"name": folder, "grants": ["*", "?send_message"], "approvals": {"wait": "10m"}}),
    )
    .await;
    rig.route(chat, folder).await;
    let (hook, hook_url) = Receiver::start(0).await;
    let (s, v) = rig
        .api()
        .post(
            &rig.operator,
            "/v1/webhooks",
            json!({"prefix": "tg:", "url": hook_url, "secret": "sweep-secret-0123456789"}),
        )
        .await;
    assert_eq!(s, 201, "{v}");

    // The three daemons move into processes of their own, on the same ports and data.
    if let Some(r) = rig.routd.take() {
        r.shutdown().await;
    }
    if let Some(r) = rig.runed.take() {
        r.shutdown().await;
    }
    if let Some(a) = rig.authd.take() {
        let _ = a.shutdown().await;
    }
    let authd_addr = rig.authd_url.trim_start_matches("http://").to_owned();
    let mut runed_env = rig.runed_pairs();
    runed_env.push(("RUNED_LISTEN".into(), rig.runed_addr.unwrap().to_string()));
    runed_env.push((RUNED_CHILD_ENV.into(), "1".into()));
    let log = rig.dir.path().join("failpoints.log");
    let daemons = Arc::new(Daemons {
        envs: HashMap::from([
            (
                Daemon::Authd,
                vec![
                    (AUTHD_CHILD_ENV.to_owned(), "1".to_owned()),
                    ("SWEEP_AUTHD_LISTEN".to_owned(), authd_addr),
                    (
                        "SWEEP_AUTHD_DIR".to_owned(),
                        rig.dir.path().join("authd").display().to_string(),
                    ),
                ],
            ),
            (Daemon::Runed, runed_env),
            (Daemon::Routd, rig.routd_pairs()),
        ]),
        armed: Mutex::new(Some((target, failpoint.to_owned()))),
        log: log.clone(),
        pids: Mutex::new(HashMap::new()),
        deaths: Mutex::new(Vec::new()),
        stop: tokio_util::sync::CancellationToken::new(),
    });
    let mut supervisors = Vec::new();
    for d in [Daemon::Authd, Daemon::Runed, Daemon::Routd] {
        supervisors.push(tokio::spawn(daemons.clone().supervise(d)));
    }
    let guard = KillOnDrop(daemons.clone());

    let talk = Conversation {
        rig: &rig,
        http: reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(30))
            .build()
            .unwrap(),
        chat,
        folder,
    };
    // A message whose run lives until its follow-up lands (at most 5 s), and the follow-up.
    talk.say("m-1", "/await-followup 5").await;
    talk.running().await;
    talk.say("m-2", "second").await;
    talk.wait_history("both answered", |h| {
        count(h, first_reply) >= 1 && count(h, |c| c == "second") >= 1
    })
    .await;
    if failpoint == "runed.warm.taken" {
        // The next run takes the folder's warm box: wait until there is one.
        let docker = hako_deploy::connect_docker().unwrap();
        eventually("a warm box for the folder", STEP, || async {
            let w = warm_boxes(&docker, &rig).await;
            if w.is_empty() { Err(()) } else { Ok(()) }
        })
        .await;
    }
    // A call held for approval, approved by the operator.
    talk.idle().await;
    talk.say("m-3", r#"/mcp send_message {"text":"held"}"#)
        .await;
    let request = talk.approve().await;
    talk.wait_history("the approved call's effect and its reply", |h| {
        count(h, |c| c == "held") >= 1 && count(h, |c| c.starts_with("mcp send_message")) >= 1
    })
    .await;
    talk.idle().await;

    // Every message answered exactly once, the approved call run once.
    let h = talk.history().await.unwrap();
    assert_eq!(count(&h, first_reply), 1, "{:?}", replies(&h));
    assert_eq!(count(&h, |c| c == "second"), 1, "{:?}", replies(&h));
    assert_eq!(count(&h, |c| c == "held"), 1, "{:?}", replies(&h));
    assert_eq!(
        count(&h, |c| c.starts_with("mcp send_message")),
        1,
        "{:?}",
        replies(&h)
    );
    // Every request decided, and at most once: one verdict applied per request.
    let v = talk
        .get(&routd::approvals().query("all", true).query("limit", 100))
        .await
        .unwrap();
    let mine: Vec<&Value> = v["approvals"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["chat_jid"] == chat)
        .collect();
    assert!(mine.iter().any(|r| r["id"] == request.as_str()), "{v}");
    for r in &mine {
        assert_ne!(r["state"], "pending", "{r}");
    }
    let audit = talk
        .get(&routd::audit().query("limit", 1000))
        .await
        .unwrap();
    let mut verdicts: HashMap<String, usize> = HashMap::new();
    for row in audit["entries"].as_array().into_iter().flatten() {
        if row["action"] == "approval.verdict" && row["outcome"] == "approved" {
            let detail = row["detail"].as_str().unwrap_or_default();
            let target = detail.split(' ').next().unwrap_or_default().to_owned();
            *verdicts.entry(target).or_default() += 1;
        }
    }
    assert!(verdicts.values().all(|n| *n <= 1), "{verdicts:?}");

    // Every outbound message delivered, each under one idempotency key.
    let outbound: Vec<&MessageView> = h.iter().filter(|m| m.direction == Direction::Out).collect();
    eventually("every outbound message delivered", STEP, || async {
        let got = hook.requests();
        let delivered: HashSet<String> = got
            .iter()
            .filter(|(_, _, s)| *s == 200)
            .filter_map(|(_, b, _)| serde_json::from_slice::<Value>(b).ok())
            .filter_map(|b| b["message"]["id"].as_str().map(str::to_owned))
            .collect();
        let missing: Vec<&str> = outbound
            .iter()
            .map(|m| m.id.as_str())
            .filter(|id| !delivered.contains(*id))
            .collect();
        if missing.is_empty() {
            Ok(())
        } else {
            Err(missing.join(","))
        }
    })
    .await;
    let mut keys: HashMap<(String, i64), HashSet<String>> = HashMap::new();
    for (headers, body, _) in hook.requests() {
        let b: Value = serde_json::from_slice(&body).unwrap();
        let id = b["message"]["id"].as_str().unwrap().to_owned();
        let version = b["message"]["version"].as_i64().unwrap_or(0);
        keys.entry((id, version))
            .or_default()
            .insert(headers.get("idempotency-key").cloned().unwrap_or_default());
    }
    for (m, k) in &keys {
        assert_eq!(k.len(), 1, "{m:?} delivered under keys {k:?}");
    }

    // No container but a warm box; no unrevoked token of a finished run.
    let docker = hako_deploy::connect_docker().unwrap();
    eventually("no container left but a warm box", STEP, || async {
        let all = labelled(&docker, vec![format!("io.hako.install={}", rig.install)]).await;
        let warm: HashSet<String> = warm_boxes(&docker, &rig).await.into_iter().collect();
        let left: Vec<String> = all
            .into_iter()
            .filter_map(|c| c.id)
            .filter(|id| !warm.contains(id))
            .collect();
        if left.is_empty() { Ok(()) } else { Err(left) }
    })
    .await;
    let runed_db = rig.data().join("runed.db");
    let ended_tokens = || -> Vec<String> {
        let c = rusqlite::Connection::open_with_flags(
            &runed_db,
            rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
        )
        .unwrap();
        let mut st = c
            .prepare(
                "SELECT t.jti FROM mcp_tokens t JOIN spawns s ON s.run_id = t.run_id \
                 WHERE s.state IN ('exited', 'error', 'killed', 'timed_out')",
            )
            .unwrap();
        st.query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    };
    eventually(
        "every finished run's token revoked at authd",
        STEP,
        || async {
            let list = AuthdClient::new(&rig.authd_url)
                .unwrap()
                .revoked()
                .await
                .map_err(|e| format!("authd's revocation list: {e}"))?;
            let revoked: HashSet<String> = list.revoked.into_iter().map(|r| r.jti).collect();
            let live: Vec<String> = ended_tokens()
                .into_iter()
                .filter(|j| !revoked.contains(j))
                .collect();
            if live.is_empty() {
                Ok(())
            } else {
                Err(format!("live: {live:?}"))
            }
        },
    )
    .await;

    // The failpoint was reached, and its daemon (only it) died there.
    let reached = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        reached.lines().any(|l| l == failpoint),
        "{failpoint} was never reached (deaths: {:?})",
        daemons.deaths()
    );
    assert_eq!(daemons.deaths(), vec![target]);

    daemons.stop.cancel();
    for s in supervisors {
        let _ = s.await;
    }
    drop(guard);
    rig.stop().await;
}

/// One test per failpoint; the list is checked against `failpoint::ALL` below, so a new
/// failpoint without its sweep fails the build of this file's checks.
macro_rules! sweeps {
    ($($test:ident => $name:literal,)*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $test() {
                sweep($name).await;
            }
        )*
        /// Every failpoint is swept, and nothing else.
        #[test]
        fn every_failpoint_is_swept() {
            let swept: HashSet<&str> = [$($name),*].into_iter().collect();
            let all: HashSet<&str> = hako_shared::failpoint::ALL.iter().copied().collect();
            let missing: Vec<_> = all.difference(&swept).collect();
            let unknown: Vec<_> = swept.difference(&all).collect();
            assert!(missing.is_empty() && unknown.is_empty(), "not swept: {missing:?}; unknown: {unknown:?}");
        }
    };
}

sweeps! {
    routd_message_ingested => "routd.message.ingested",
    routd_turn_created => "routd.turn.created",
    routd_run_requested => "routd.run.requested",
    routd_block_appended => "routd.block.appended",
    routd_webhook_delivered => "routd.webhook.delivered",
    routd_turn_settled => "routd.turn.settled",
    routd_followup_staged => "routd.followup.staged",
    routd_followup_placed => "routd.followup.placed",
    routd_followup_resolved => "routd.followup.resolved",
    routd_approval_requested => "routd.approval.requested",
    routd_approval_decided => "routd.approval.decided",
    runed_run_queued => "runed.run.queued",
    runed_token_minted => "runed.token.minted",
    runed_container_created => "runed.container.created",
    runed_container_started => "runed.container.started",
    runed_output_recorded => "runed.output.recorded",
    runed_run_ended => "runed.run.ended",
    runed_container_removed => "runed.container.removed",
    runed_warm_recorded => "runed.warm.recorded",
    runed_warm_taken => "runed.warm.taken",
    authd_token_minted => "authd.token.minted",
    authd_token_revoked => "authd.token.revoked",
}
