//! routd's turn logic against a scripted runed: the driver, following a run, settling it,
//! steering follow-ups, and what routd does when runed does not answer, is busy, refuses,
//! forgets a run or cuts its event stream. routd is real (its HTTP API on a loopback port, its
//! SQLite database); runed is [`Scripted`], behind the same [`Runs`] seam as the real client,
//! and the test decides each run's blocks and end. No runed, no Docker, no agent: each case
//! runs in about a second, and the cases that need the real pair stay in `routd.rs` and
//! `followups.rs`.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::BoxFuture;
use hako_client::{Client, Daemon, routd};
use hako_routd::runed::{EventStream, Readiness, RunedError, Runs};
use hako_shared::GroupFolder;
use hako_shared::chat::{
    Direction, GroupConfig, MessageKind, MessageState, MessageView, NewRoute, PostMessage,
    TurnState, TurnView,
};
use hako_shared::contract::{BlockStatus, OutputBlock};
use hako_shared::ids::{RunId, TurnId};
use hako_shared::media::MediaSaved;
use hako_shared::runs::{
    CreatedRun, Outcome, RunList, RunRequest, RunState, RunStatus, RunStreamEvent, SteerReply,
    SteerState, SteerStatus, StopReply,
};
use hako_shared::testing::eventually;
use tokio::sync::watch;

/// How long a case waits for what it expects (each takes about a second).
const LIMIT: Duration = Duration::from_secs(30);

// ---------------------------------------------------------------------------------------------
// The scripted runed
// ---------------------------------------------------------------------------------------------

/// One run as the scripted runed keeps it.
#[derive(Debug, Clone)]
struct Run {
    id: RunId,
    req: RunRequest,
    outputs: Vec<OutputBlock>,
    state: RunState,
    outcome: Option<Outcome>,
    /// Follow-ups placed in it: id, texts, where they are.
    steers: Vec<(String, Vec<String>, SteerState)>,
}

#[derive(Default)]
struct Script {
    runs: Vec<Run>,
    /// Every `create_run` call, in order, by the runed turn id it asked for.
    asked: Vec<TurnId>,
    /// What the next `create_run` calls answer instead of a run.
    create_fails: VecDeque<RunedError>,
    /// What the next `steer` calls answer instead of placing.
    steer_fails: VecDeque<RunedError>,
    /// Event streams end, cut, after this many output events (runed going away mid-stream).
    cut_after: Option<usize>,
    /// Runs runed no longer knows (its database was reset): 404 to every call about them.
    forgotten: Vec<RunId>,
    /// The next `create_run` call answers only once this is notified (runed slow to start).
    create_hold: Option<Arc<tokio::sync::Notify>>,
}

/// A runed whose runs the test moves by hand. Calls about runs behave as runed's: a turn id
/// asked again finds its run, events replay every block from index 0, a run only moves
/// forward, a follow-up to a run that is over is refused with 409.
#[derive(Clone)]
struct Scripted {
    script: Arc<Mutex<Script>>,
    /// Bumped on every change: event streams and the test wait on it.
    changed: Arc<watch::Sender<u64>>,
}

impl Default for Scripted {
    fn default() -> Self {
        Self {
            script: Arc::default(),
            changed: Arc::new(watch::channel(0).0),
        }
    }
}

impl Scripted {
    fn with<T>(&self, f: impl FnOnce(&mut Script) -> T) -> T {
        let out = f(&mut self.script.lock().unwrap());
        self.changed.send_modify(|n| *n += 1);
        out
    }

    fn read<T>(&self, f: impl FnOnce(&Script) -> T) -> T {
        f(&self.script.lock().unwrap())
    }

    fn not_found(run_id: &RunId) -> RunedError {
        RunedError::Refused {
            status: 404,
            code: "not_found".into(),
            message: format!("no run {run_id}"),
        }
    }

    /// The `n`th run created (from 0), once it is.
    async fn run(&self, n: usize) -> Run {
        let mut rx = self.changed.subscribe();
        let wait = async {
            loop {
                if let Some(r) = self.read(|s| s.runs.get(n).cloned()) {
                    return r;
                }
                rx.changed().await.unwrap();
            }
        };
        tokio::time::timeout(LIMIT, wait)
            .await
            .unwrap_or_else(|_| panic!("run {n} was never asked for"))
    }

    fn update(&self, id: &RunId, f: impl FnOnce(&mut Run)) {
        self.with(|s| f(s.runs.iter_mut().find(|r| &r.id == id).expect("a run")));
    }

    fn start(&self, id: &RunId) {
        self.update(id, |r| r.state = RunState::Running);
    }

    fn output(&self, id: &RunId, block: OutputBlock) {
        self.update(id, |r| r.outputs.push(block));
    }

    /// The run replies `text` and exits `ok`.
    fn answer(&self, id: &RunId, text: &str) {
        self.output(id, OutputBlock::ok(text));
        self.end(id, RunState::Exited, Outcome::Ok);
    }

    fn end(&self, id: &RunId, state: RunState, outcome: Outcome) {
        self.update(id, |r| {
            r.state = state;
            r.outcome = Some(outcome);
            // What the agent did not take goes back, as runed's rename at the end does.
            for s in &mut r.steers {
                if s.2 == SteerState::Placed {
                    s.2 = SteerState::Returned;
                }
            }
        });
    }

    /// The agent takes every follow-up placed in the run.
    fn take_steers(&self, id: &RunId) -> Vec<String> {
        let mut taken = Vec::new();
        self.update(id, |r| {
            for s in &mut r.steers {
                if s.2 == SteerState::Placed {
                    s.2 = SteerState::Taken;
                    taken.extend(s.1.iter().cloned());
                }
            }
        });
        taken
    }

    /// Waits until the run holds a placed follow-up; answers its texts.
    async fn placed(&self, id: &RunId) -> Vec<String> {
        let mut rx = self.changed.subscribe();
        let wait = async {
            loop {
                let placed = self.read(|s| {
                    s.runs.iter().find(|r| &r.id == id).and_then(|r| {
                        r.steers
                            .iter()
                            .find(|x| x.2 == SteerState::Placed)
                            .map(|x| x.1.clone())
                    })
                });
                if let Some(p) = placed {
                    return p;
                }
                rx.changed().await.unwrap();
            }
        };
        tokio::time::timeout(LIMIT, wait)
            .await
            .expect("no follow-up was placed in the run")
    }

    fn status(r: &Run) -> RunStatus {
        RunStatus {
            run_id: r.id.clone(),
            folder: r.req.folder.as_str().to_owned(),
            turn_id: r.req.turn_id.clone(),
            state: r.state,
            outcome: r.outcome,
            outputs: r.outputs.clone(),
            truncated: false,
            exit_code: None,
            error: None,
            created_at: String::new(),
            started_at: None,
            ended_at: None,
            steers: r
                .steers
                .iter()
                .map(|(id, _, state)| SteerStatus {
                    steer_id: id.clone(),
                    state: *state,
                })
                .collect(),
        }
    }
}

/// Where an event stream is: the next block to send, the last state sent, how many blocks it
/// sent (for the cut).
struct Cursor {
    sr: Scripted,
    rx: watch::Receiver<u64>,
    run_id: RunId,
    next: usize,
    state: Option<RunState>,
    sent: usize,
    done: bool,
}

impl Cursor {
    async fn step(mut self) -> Option<(Result<RunStreamEvent, RunedError>, Cursor)> {
        loop {
            if self.done {
                return None;
            }
            let (run, cut) = self.sr.read(|s| {
                (
                    s.runs.iter().find(|r| r.id == self.run_id).cloned(),
                    s.cut_after,
                )
            });
            let run = run?;
            if cut.is_some_and(|n| self.sent >= n) {
                return None;
            }
            if let Some(block) = run.outputs.get(self.next).cloned() {
                let index = self.next;
                self.next += 1;
                self.sent += 1;
                let event = RunStreamEvent::Output {
                    run_id: run.id.clone(),
                    index,
                    block: Some(block),
                };
                return Some((Ok(event), self));
            }
            if self.state != Some(run.state) {
                self.state = Some(run.state);
                self.done = run.state.is_terminal();
                let event = RunStreamEvent::State {
                    run_id: run.id.clone(),
                    state: run.state,
                };
                return Some((Ok(event), self));
            }
            self.rx.changed().await.ok()?;
        }
    }
}

impl Runs for Scripted {
    fn create_run<'a>(
        &'a self,
        req: &'a RunRequest,
    ) -> BoxFuture<'a, Result<CreatedRun, RunedError>> {
        Box::pin(async move {
            let hold = self.with(|s| {
                s.asked.push(req.turn_id.clone());
                s.create_hold.take()
            });
            if let Some(hold) = hold {
                hold.notified().await;
            }
            self.with(|s| {
                if let Some(e) = s.create_fails.pop_front() {
                    return Err(e);
                }
                if let Some(r) = s.runs.iter().find(|r| r.req.turn_id == req.turn_id) {
                    return Ok(CreatedRun {
                        run_id: r.id.clone(),
                        state: r.state,
                        existing: true,
                    });
                }
                let id = RunId::random("run-", 8);
                s.runs.push(Run {
                    id: id.clone(),
                    req: req.clone(),
                    outputs: Vec::new(),
                    state: RunState::Queued,
                    outcome: None,
                    steers: Vec::new(),
                });
                Ok(CreatedRun {
                    run_id: id,
                    state: RunState::Queued,
                    existing: false,
                })
            })
        })
    }

    fn run<'a>(
        &'a self,
        run_id: &'a RunId,
        _wait: Duration,
    ) -> BoxFuture<'a, Result<RunStatus, RunedError>> {
        Box::pin(async move {
            self.read(|s| {
                s.runs
                    .iter()
                    .find(|r| &r.id == run_id && !s.forgotten.contains(run_id))
                    .map(Scripted::status)
                    .ok_or_else(|| Scripted::not_found(run_id))
            })
        })
    }

    fn events<'a>(&'a self, run_id: &'a RunId) -> BoxFuture<'a, Result<EventStream, RunedError>> {
        Box::pin(async move {
            let known = self
                .read(|s| s.runs.iter().any(|r| &r.id == run_id) && !s.forgotten.contains(run_id));
            if !known {
                return Err(Scripted::not_found(run_id));
            }
            let cursor = Cursor {
                sr: self.clone(),
                rx: self.changed.subscribe(),
                run_id: run_id.clone(),
                next: 0,
                state: None,
                sent: 0,
                done: false,
            };
            Ok(EventStream::new(futures_util::stream::unfold(
                cursor,
                Cursor::step,
            )))
        })
    }

    fn steer<'a>(
        &'a self,
        run_id: &'a RunId,
        steer_id: &'a str,
        messages: Vec<String>,
    ) -> BoxFuture<'a, Result<SteerReply, RunedError>> {
        Box::pin(async move {
            self.with(|s| {
                if let Some(e) = s.steer_fails.pop_front() {
                    return Err(e);
                }
                let run = s
                    .runs
                    .iter_mut()
                    .find(|r| &r.id == run_id)
                    .ok_or_else(|| Scripted::not_found(run_id))?;
                // A repeat of a follow-up answers the first one's state.
                if let Some(x) = run.steers.iter().find(|x| x.0 == steer_id) {
                    return Ok(SteerReply {
                        run_id: run_id.clone(),
                        steer_id: steer_id.to_owned(),
                        state: x.2,
                    });
                }
                if run.state.is_terminal() {
                    return Err(RunedError::Refused {
                        status: 409,
                        code: "run_over".into(),
                        message: "the run is over".into(),
                    });
                }
                run.steers
                    .push((steer_id.to_owned(), messages, SteerState::Placed));
                Ok(SteerReply {
                    run_id: run_id.clone(),
                    steer_id: steer_id.to_owned(),
                    state: SteerState::Placed,
                })
            })
        })
    }

    fn put_media<'a>(
        &'a self,
        _folder: &'a GroupFolder,
        _name: &'a str,
        _data: axum::body::Bytes,
    ) -> BoxFuture<'a, Result<MediaSaved, RunedError>> {
        Box::pin(async { Err(RunedError::Unavailable("no media here".into())) })
    }

    fn stop<'a>(
        &'a self,
        folder: &'a GroupFolder,
        _retire: bool,
    ) -> BoxFuture<'a, Result<StopReply, RunedError>> {
        Box::pin(async move {
            let killed = self.with(|s| {
                let mut killed = Vec::new();
                for r in s.runs.iter_mut() {
                    if &r.req.folder == folder && !r.state.is_terminal() {
                        r.state = RunState::Killed;
                        r.outcome = Some(Outcome::Killed);
                        killed.push(r.id.clone());
                    }
                }
                killed
            });
            Ok(StopReply {
                folder: folder.as_str().to_owned(),
                killed,
            })
        })
    }

    fn runs(&self, state: RunState) -> BoxFuture<'_, Result<RunList, RunedError>> {
        let _ = state;
        Box::pin(async {
            Ok(RunList {
                runs: Vec::new(),
                next_before: None,
            })
        })
    }

    fn reachable(&self) -> BoxFuture<'_, Result<(), String>> {
        Box::pin(async { Ok(()) })
    }

    fn readiness(&self) -> BoxFuture<'_, Readiness> {
        Box::pin(async {
            Readiness {
                runed: Ok(()),
                authd: None,
            }
        })
    }
}

// ---------------------------------------------------------------------------------------------
// The rig: a real routd in open mode asking the scripted runed
// ---------------------------------------------------------------------------------------------

const CHAT: &str = "tg:42";
const FOLDER: &str = "team";

struct Rig {
    dir: tempfile::TempDir,
    routd: Option<hako_routd::Running>,
    api: Client,
    sr: Scripted,
}

impl Rig {
    /// routd with one group and a route from [`CHAT`] to it; a failed try is tried again
    /// after 100 ms (doubling), at most `retries` times.
    async fn new(retries: u32) -> Rig {
        Rig::new_with(|cfg| cfg.max_turn_retries = retries).await
    }

    /// [`Rig::new`], with `tune` setting what the case needs.
    async fn new_with(tune: impl FnOnce(&mut hako_routd::Config)) -> Rig {
        let rig = Rig::start_with(tempfile::tempdir().unwrap(), Scripted::default(), tune).await;
        let group = GroupConfig {
            name: FOLDER.into(),
            system_prompt: String::new(),
            grants: Vec::new(),
            group: Default::default(),
            approvals: Default::default(),
        };
        rig.api
            .call(routd::put_group(FOLDER, &group), None)
            .await
            .unwrap();
        let route = NewRoute {
            pattern: CHAT.into(),
            folder: GroupFolder::new(FOLDER).unwrap(),
            position: None,
        };
        rig.api.call(routd::add_route(&route), None).await.unwrap();
        rig
    }

    /// routd on the database in `dir`, asking `sr`.
    async fn start(dir: tempfile::TempDir, sr: Scripted, retries: u32) -> Rig {
        Rig::start_with(dir, sr, |cfg| cfg.max_turn_retries = retries).await
    }

    /// [`Rig::start`], with `tune` setting what the case needs.
    async fn start_with(
        dir: tempfile::TempDir,
        sr: Scripted,
        tune: impl FnOnce(&mut hako_routd::Config),
    ) -> Rig {
        let mut cfg = hako_routd::Config::new(dir.path());
        cfg.retry_base = Duration::from_millis(100);
        tune(&mut cfg);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let routd = hako_routd::start_with(cfg, listener, Arc::new(sr.clone()))
            .await
            .unwrap();
        let api = Client::new(Daemon::Routd, &routd.url(), Duration::from_secs(10)).unwrap();
        Rig {
            dir,
            routd: Some(routd),
            api,
            sr,
        }
    }

    async fn say(&self, id: &str, text: &str) {
        let m = PostMessage {
            id: Some(id.to_owned()),
            chat_jid: CHAT.into(),
            sender: "alice".into(),
            sender_name: None,
            content: text.to_owned(),
            timestamp: None,
            reply_to: None,
        };
        self.api
            .call(routd::post_message(&m), None)
            .await
            .expect("the message is taken");
    }

    async fn history(&self) -> Vec<MessageView> {
        let op = routd::chat_messages(CHAT).query("limit", 1000);
        self.api.call(op, None).await.unwrap().messages
    }

    /// Waits until the chat's history satisfies `done`.
    async fn wait_for(
        &self,
        what: &str,
        done: impl Fn(&[MessageView]) -> bool,
    ) -> Vec<MessageView> {
        eventually(what, LIMIT, || async {
            let h = self.history().await;
            if done(&h) { Ok(h) } else { Err(h) }
        })
        .await
    }

    async fn turn(&self, turn: &TurnId) -> TurnView {
        self.api
            .call(routd::turn(turn.as_str()), None)
            .await
            .unwrap()
    }

    /// Waits until the turn is over; answers it.
    async fn settled(&self, turn: &TurnId) -> TurnView {
        eventually("the turn settles", LIMIT, || async {
            let t = self.turn(turn).await;
            if t.state.is_over() { Ok(t) } else { Err(t) }
        })
        .await
    }

    /// Nothing more is asked for what was settled: after `n` runs, a probe message in the
    /// chat gets run `n` (the scheduler has been round since), and that run holds the probe
    /// alone (a message wrongly left uncovered would have joined its batch). Waits on the
    /// probe's run, never on a pause.
    async fn runs_stay(&self, n: usize) {
        self.say("probe", "probe").await;
        let probe = self.sr.run(n).await;
        let texts: Vec<_> = probe
            .req
            .messages
            .iter()
            .map(|m| m.content.as_str())
            .collect();
        assert_eq!(texts, ["probe"], "the probe's run holds it alone");
        assert_eq!(self.sr.read(|s| s.runs.len()), n + 1, "runs asked for");
    }

    async fn stop(mut self) {
        if let Some(r) = self.routd.take() {
            r.shutdown().await;
        }
    }
}

/// The turn a runed turn id (`<turn>.<try>`) is a try of.
fn turn_of(run: &Run) -> TurnId {
    let raw = run.req.turn_id.as_str();
    let (turn, _try) = raw.rsplit_once('.').expect("<turn>.<try>");
    TurnId::new(turn).unwrap()
}

fn replies(h: &[MessageView]) -> Vec<&str> {
    h.iter()
        .filter(|m| m.direction == Direction::Out && m.kind == MessageKind::Message)
        .map(|m| m.content.as_str())
        .collect()
}

fn notices(h: &[MessageView]) -> Vec<&str> {
    h.iter()
        .filter(|m| m.direction == Direction::Out && m.kind == MessageKind::Notice)
        .map(|m| m.content.as_str())
        .collect()
}

fn inbound_state(h: &[MessageView], id: &str) -> MessageState {
    h.iter()
        .find(|m| m.id == id)
        .unwrap_or_else(|| panic!("no message {id}"))
        .state
}

// ---------------------------------------------------------------------------------------------
// The cases
// ---------------------------------------------------------------------------------------------

/// The plain turn: one run with the message, its reply in the chat, the message answered,
/// the run's new session kept for the chat's next turn.
#[tokio::test]
async fn a_message_gets_one_run_and_its_reply() {
    let rig = Rig::new(3).await;
    rig.say("m1", "hello").await;
    let run = rig.sr.run(0).await;
    assert_eq!(run.req.messages.len(), 1);
    assert_eq!(run.req.messages[0].content, "hello");
    assert!(run.req.turn_id.as_str().ends_with(".1"), "the first try");
    rig.sr.start(&run.id);
    let mut block = OutputBlock::ok("hi alice");
    block.new_session_id = Some("sess-1".into());
    rig.sr.output(&run.id, block);
    rig.sr.end(&run.id, RunState::Exited, Outcome::Ok);
    let turn = rig.settled(&turn_of(&run)).await;
    assert_eq!(turn.state, TurnState::Done);
    assert_eq!(turn.replies, 1);
    let h = rig.history().await;
    assert_eq!(replies(&h), ["hi alice"]);
    assert_eq!(inbound_state(&h, "m1"), MessageState::Answered);

    // The next message's run resumes the session the first run handed back.
    rig.say("m2", "again").await;
    let next = rig.sr.run(1).await;
    assert_eq!(next.req.session_id, "sess-1");
    rig.stop().await;
}

/// runed not answering, then busy, then answering: the turn waits instead of failing, asks
/// again for the same try (runed finds the run by it, so nothing runs twice), and the
/// message is answered once.
#[tokio::test]
async fn runed_down_then_busy_then_back_answers_the_message_once() {
    let rig = Rig::new(3).await;
    rig.sr.with(|s| {
        s.create_fails
            .push_back(RunedError::Unavailable("connection refused".into()));
        s.create_fails.push_back(RunedError::Busy {
            code: "queue_full".into(),
            message: "runed's queue is full".into(),
        });
    });
    rig.say("m1", "hello").await;
    let run = rig.sr.run(0).await;
    let asked = rig.sr.read(|s| s.asked.clone());
    assert_eq!(asked.len(), 3, "two refusals, then the run: {asked:?}");
    assert!(
        asked.iter().all(|t| t == &run.req.turn_id),
        "every ask is for the same try: {asked:?}"
    );
    rig.sr.answer(&run.id, "here");
    let turn = rig.settled(&turn_of(&run)).await;
    assert_eq!(turn.state, TurnState::Done);
    assert_eq!(turn.attempt, 1, "an outage is not a failed try");
    assert_eq!(replies(&rig.history().await), ["here"]);
    assert!(notices(&rig.history().await).is_empty());
    rig.stop().await;
}

/// runed refusing the run (a 4xx other than 429) is final: the turn fails at once, the chat
/// is told, and nothing is asked again.
#[tokio::test]
async fn a_refused_run_fails_the_turn_with_a_notice_and_is_not_asked_again() {
    let rig = Rig::new(3).await;
    rig.sr.with(|s| {
        s.create_fails.push_back(RunedError::Refused {
            status: 400,
            code: "invalid_spec".into(),
            message: "the group's image is not allowed".into(),
        })
    });
    rig.say("m1", "hello").await;
    let h = rig
        .wait_for("the chat is told", |h| !notices(h).is_empty())
        .await;
    assert!(
        notices(&h)[0].contains("could not be started") && notices(&h)[0].contains("not allowed"),
        "{:?}",
        notices(&h)
    );
    assert_eq!(inbound_state(&h, "m1"), MessageState::Failed);
    // Never asked again: the next ask is the probe's, alone.
    rig.runs_stay(0).await;
    assert_eq!(
        rig.sr.read(|s| s.asked.len()),
        2,
        "the refused ask and the probe's"
    );
    rig.stop().await;
}

/// The event stream cut after the first block (runed restarting, a proxy timing out): routd
/// opens it again, runed replays from block 0, and each reply reaches the chat once.
#[tokio::test]
async fn a_stream_cut_mid_run_is_reopened_and_each_reply_goes_out_once() {
    let rig = Rig::new(3).await;
    rig.sr.with(|s| s.cut_after = Some(1));
    rig.say("m1", "two things").await;
    let run = rig.sr.run(0).await;
    rig.sr.start(&run.id);
    rig.sr.output(&run.id, OutputBlock::ok("first"));
    rig.wait_for("the first reply", |h| replies(h) == ["first"])
        .await;
    rig.sr.answer(&run.id, "second");
    // Every stream now ends after one block: routd reads the rest from the run's status.
    let turn = rig.settled(&turn_of(&run)).await;
    assert_eq!(turn.state, TurnState::Done);
    assert_eq!(turn.replies, 2);
    assert_eq!(replies(&rig.history().await), ["first", "second"]);
    rig.stop().await;
}

/// A run that ends without a reply is a failed try: a new run (try 2) with the same
/// messages, whose reply answers them. A fatal end after a reply is a success: the reply
/// stands and nothing runs again.
#[tokio::test]
async fn no_reply_is_tried_again_with_a_new_run_and_a_reply_then_fatal_stands() {
    let rig = Rig::new(3).await;
    rig.say("m1", "hello").await;
    let first = rig.sr.run(0).await;
    rig.sr.start(&first.id);
    rig.sr.output(
        &first.id,
        OutputBlock::failure(BlockStatus::Fatal, "the agent crashed"),
    );
    rig.sr.end(&first.id, RunState::Exited, Outcome::Fatal);
    let second = rig.sr.run(1).await;
    assert_eq!(turn_of(&second), turn_of(&first), "the same turn");
    assert!(second.req.turn_id.as_str().ends_with(".2"), "try 2");
    assert_eq!(second.req.messages[0].content, "hello");
    rig.sr.start(&second.id);
    rig.sr
        .output(&second.id, OutputBlock::ok("sorry, here it is"));
    rig.sr.end(&second.id, RunState::Exited, Outcome::Fatal);
    let turn = rig.settled(&turn_of(&first)).await;
    assert_eq!(turn.state, TurnState::Done);
    assert_eq!(turn.attempt, 2);
    let h = rig.history().await;
    assert_eq!(replies(&h), ["sorry, here it is"]);
    assert!(notices(&h).is_empty(), "{:?}", notices(&h));
    assert_eq!(inbound_state(&h, "m1"), MessageState::Answered);
    rig.runs_stay(2).await;
    rig.stop().await;
}

/// Every try ending without a reply: after the last one the messages fail and the chat is
/// told once, with the number of tries.
#[tokio::test]
async fn the_last_failed_try_fails_the_messages_with_one_notice() {
    let rig = Rig::new(1).await;
    rig.say("m1", "hello").await;
    for n in 0..2 {
        let run = rig.sr.run(n).await;
        rig.sr.end(&run.id, RunState::TimedOut, Outcome::TimedOut);
    }
    let first = rig.sr.run(0).await;
    let turn = rig.settled(&turn_of(&first)).await;
    assert_eq!(turn.state, TurnState::Failed);
    let h = rig.history().await;
    assert_eq!(notices(&h).len(), 1, "one notice: {:?}", notices(&h));
    assert!(
        notices(&h)[0].contains("after 2 tries"),
        "{:?}",
        notices(&h)
    );
    assert_eq!(inbound_state(&h, "m1"), MessageState::Failed);
    assert_eq!(rig.sr.read(|s| s.runs.len()), 2);
    rig.stop().await;
}

/// A killed run ends its turn with a notice and is never tried again.
#[tokio::test]
async fn a_killed_run_ends_the_turn_and_is_not_retried() {
    let rig = Rig::new(3).await;
    rig.say("m1", "hello").await;
    let run = rig.sr.run(0).await;
    rig.sr.start(&run.id);
    rig.sr.end(&run.id, RunState::Killed, Outcome::Killed);
    let turn = rig.settled(&turn_of(&run)).await;
    assert_eq!(turn.state, TurnState::Killed);
    assert_eq!(notices(&rig.history().await), ["The agent was stopped."]);
    rig.runs_stay(1).await;
    rig.stop().await;
}

/// runed forgetting a run (its database reset) mid-turn is a try without output: a new run.
#[tokio::test]
async fn a_run_runed_forgot_is_a_failed_try_and_runs_again() {
    let rig = Rig::new(3).await;
    rig.sr.with(|s| s.cut_after = Some(0));
    rig.say("m1", "hello").await;
    let first = rig.sr.run(0).await;
    rig.sr.with(|s| {
        s.forgotten.push(first.id.clone());
        s.cut_after = None;
    });
    let second = rig.sr.run(1).await;
    assert!(second.req.turn_id.as_str().ends_with(".2"));
    rig.sr.answer(&second.id, "back");
    let turn = rig.settled(&turn_of(&first)).await;
    assert_eq!(turn.state, TurnState::Done);
    assert_eq!(replies(&rig.history().await), ["back"]);
    rig.stop().await;
}

/// A follow-up while the run lives is steered into it; the agent takes it, and the same
/// run's reply answers both messages: no second run.
#[tokio::test]
async fn a_follow_up_the_agent_takes_is_answered_by_the_same_run() {
    let rig = Rig::new(3).await;
    rig.say("m1", "first question").await;
    let run = rig.sr.run(0).await;
    rig.sr.start(&run.id);
    rig.say("m2", "and also this").await;
    assert_eq!(rig.sr.placed(&run.id).await, ["and also this"]);
    assert_eq!(rig.sr.take_steers(&run.id), ["and also this"]);
    rig.sr.answer(&run.id, "both answered");
    let turn = rig.settled(&turn_of(&run)).await;
    assert_eq!(turn.state, TurnState::Done);
    assert_eq!(turn.messages, ["m1", "m2"]);
    let h = rig.history().await;
    assert_eq!(inbound_state(&h, "m1"), MessageState::Answered);
    assert_eq!(inbound_state(&h, "m2"), MessageState::Answered);
    rig.runs_stay(1).await;
    rig.stop().await;
}

/// A live turn leaves routd idle. Its chat counts the turn's messages as pending until the
/// turn ends, so every scheduler pass comes to the live turn; a steer that found nothing woke
/// the scheduler again, and routd kept a core busy for as long as any turn ran.
#[tokio::test]
async fn a_live_turn_leaves_routd_idle() {
    let rig = Rig::new(3).await;
    rig.say("m1", "a long question").await;
    let run = rig.sr.run(0).await;
    rig.sr.start(&run.id);
    // A follow-up placed: the turn's run has started, and steering has run.
    rig.say("m2", "and this").await;
    assert_eq!(rig.sr.placed(&run.id).await, ["and this"]);
    // This process is routd (and the scripted runed): what it spends over a window. The
    // window is what is measured, not a wait for something: it counts CPU time, which a
    // loaded machine does not add to (the spin spent the whole window).
    let window = Duration::from_secs(2);
    let before = cpu_of_this_process();
    tokio::time::sleep(window).await;
    let spent = cpu_of_this_process() - before;
    assert!(
        spent < window / 5,
        "routd spent {spent:?} of CPU in {window:?} with one live turn and nothing to do"
    );
    rig.sr.answer(&run.id, "done");
    assert_eq!(rig.settled(&turn_of(&run)).await.state, TurnState::Done);
    rig.stop().await;
}

/// The CPU time this process has used (user and system), from `/proc/self/stat`.
fn cpu_of_this_process() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("/proc/self/stat");
    // Fields after the command's closing parenthesis: utime and stime are the 12th and 13th.
    let rest = &stat[stat.rfind(')').expect("a command") + 2..];
    let f: Vec<u64> = rest
        .split(' ')
        .skip(11)
        .take(2)
        .map(|v| v.parse().expect("clock ticks"))
        .collect();
    // In USER_HZ ticks, which Linux fixes at 100 per second for /proc.
    Duration::from_millis((f[0] + f[1]) * 10)
}

/// A follow-up placed but not taken before the run ended goes back: it gets a turn (and a
/// run) of its own, and is answered there, once.
#[tokio::test]
async fn a_follow_up_the_run_did_not_take_gets_a_turn_of_its_own() {
    let rig = Rig::new(3).await;
    rig.say("m1", "first").await;
    let run = rig.sr.run(0).await;
    rig.sr.start(&run.id);
    rig.say("m2", "second").await;
    rig.sr.placed(&run.id).await;
    rig.sr.answer(&run.id, "answer to first");
    let next = rig.sr.run(1).await;
    assert_ne!(turn_of(&next), turn_of(&run), "a turn of its own");
    let texts: Vec<_> = next
        .req
        .messages
        .iter()
        .map(|m| m.content.as_str())
        .collect();
    assert_eq!(texts, ["second"]);
    rig.sr.answer(&next.id, "answer to second");
    rig.settled(&turn_of(&next)).await;
    let h = rig.history().await;
    assert_eq!(replies(&h), ["answer to first", "answer to second"]);
    assert_eq!(inbound_state(&h, "m2"), MessageState::Answered);
    rig.stop().await;
}

/// runed answering a follow-up with 409 (the run ended as it was handed over): nothing was
/// placed, the message waits for the next turn and is answered there.
#[tokio::test]
async fn a_follow_up_refused_as_too_late_waits_for_the_next_turn() {
    let rig = Rig::new(3).await;
    rig.say("m1", "first").await;
    let run = rig.sr.run(0).await;
    rig.sr.start(&run.id);
    rig.sr.with(|s| {
        s.steer_fails.push_back(RunedError::Refused {
            status: 409,
            code: "run_over".into(),
            message: "the run is over".into(),
        })
    });
    rig.say("m2", "second").await;
    eventually("the follow-up is refused", LIMIT, || async {
        let left = rig.sr.read(|s| s.steer_fails.len());
        if left == 0 { Ok(()) } else { Err(left) }
    })
    .await;
    rig.sr.answer(&run.id, "answer to first");
    let next = rig.sr.run(1).await;
    let texts: Vec<_> = next
        .req
        .messages
        .iter()
        .map(|m| m.content.as_str())
        .collect();
    assert_eq!(texts, ["second"]);
    assert!(
        rig.sr.read(|s| s.runs[0].steers.is_empty()),
        "nothing was placed in the first run"
    );
    rig.sr.answer(&next.id, "answer to second");
    rig.settled(&turn_of(&next)).await;
    assert_eq!(
        replies(&rig.history().await),
        ["answer to first", "answer to second"]
    );
    rig.stop().await;
}

/// A follow-up runed did not answer (down for a moment) is asked again with the same steer
/// id, so runed places it once; the agent takes it and one run answers both.
#[tokio::test]
async fn a_follow_up_runed_did_not_answer_is_asked_again_by_its_id_and_placed_once() {
    let rig = Rig::new(3).await;
    rig.say("m1", "first").await;
    let run = rig.sr.run(0).await;
    rig.sr.start(&run.id);
    rig.sr.with(|s| {
        s.steer_fails
            .push_back(RunedError::Unavailable("connection reset".into()))
    });
    rig.say("m2", "second").await;
    assert_eq!(rig.sr.placed(&run.id).await, ["second"]);
    let steers = rig.sr.read(|s| s.runs[0].steers.clone());
    assert_eq!(steers.len(), 1, "placed once: {steers:?}");
    rig.sr.take_steers(&run.id);
    rig.sr.answer(&run.id, "both");
    let turn = rig.settled(&turn_of(&run)).await;
    assert_eq!(turn.messages, ["m1", "m2"]);
    assert_eq!(replies(&rig.history().await), ["both"]);
    rig.stop().await;
}

/// An error block with text is the reply (the chat sees what went wrong), and the turn is
/// done: an `error` outcome is never retried.
#[tokio::test]
async fn an_error_outcome_is_told_once_and_not_retried() {
    let rig = Rig::new(3).await;
    rig.say("m1", "hello").await;
    let run = rig.sr.run(0).await;
    rig.sr.output(
        &run.id,
        OutputBlock::failure(BlockStatus::Error, "the tool failed"),
    );
    rig.sr.end(&run.id, RunState::Exited, Outcome::Error);
    let turn = rig.settled(&turn_of(&run)).await;
    assert_eq!(turn.state, TurnState::Done);
    assert_eq!(replies(&rig.history().await), ["Error: the tool failed"]);
    rig.runs_stay(1).await;
    rig.stop().await;
}

/// routd stopping mid-run and starting again on the same database resumes the turn: it
/// follows the same run (no second one) and each reply reaches the chat once.
#[tokio::test]
async fn a_restarted_routd_follows_the_same_run_and_says_nothing_twice() {
    let rig = Rig::new(3).await;
    let sr = rig.sr.clone();
    rig.say("m1", "hello").await;
    let run = sr.run(0).await;
    sr.start(&run.id);
    sr.output(&run.id, OutputBlock::ok("one"));
    rig.wait_for("the first reply", |h| replies(h) == ["one"])
        .await;
    // routd is down while the run goes on and ends.
    let Rig { dir, routd, sr, .. } = rig;
    routd.unwrap().shutdown().await;
    sr.answer(&run.id, "two");
    let rig = Rig::start(dir, sr.clone(), 3).await;
    let turn = rig.settled(&turn_of(&run)).await;
    assert_eq!(turn.state, TurnState::Done);
    assert_eq!(replies(&rig.history().await), ["one", "two"]);
    assert_eq!(sr.read(|s| s.runs.len()), 1, "the same run, followed again");
    rig.stop().await;
}

/// Waits until the scripted runed was asked for a run.
async fn asked(sr: &Scripted) {
    let mut changed = sr.changed.subscribe();
    while sr.read(|s| s.asked.is_empty()) {
        changed.changed().await.unwrap();
    }
}

/// Stops routd (`rig.routd`) and waits until it no longer answers; answers the stop under way.
async fn stop_routd(rig: &mut Rig) -> tokio::task::JoinHandle<()> {
    let stopping = tokio::spawn(rig.routd.take().unwrap().shutdown());
    eventually("routd stops answering", LIMIT, || async {
        match rig.api.call(routd::groups(), None).await {
            Err(e) => Ok(e),
            Ok(g) => Err(g),
        }
    })
    .await;
    stopping
}

/// routd shutting down lets each turn finish the step it is in: a run runed answers for
/// while the stop is under way is the turn's when `shutdown` returns (read at once from the
/// database, as the next process would), and the next routd follows that run.
#[tokio::test]
async fn shutdown_records_a_run_started_within_the_grace() {
    let mut rig = Rig::new(3).await;
    let release = Arc::new(tokio::sync::Notify::new());
    rig.sr.with(|s| s.create_hold = Some(release.clone()));
    rig.say("m1", "hello").await;
    asked(&rig.sr).await;
    let stopping = stop_routd(&mut rig).await;
    release.notify_one();
    stopping.await.unwrap();
    let db = rusqlite::Connection::open(rig.dir.path().join("routd.db")).unwrap();
    let (state, run_id): (String, Option<String>) = db
        .query_row("SELECT state, run_id FROM turns", [], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .unwrap();
    drop(db);
    let Rig { dir, sr, .. } = rig;
    let run = sr.read(|s| s.runs[0].clone());
    assert_eq!(
        (state.as_str(), run_id.as_deref()),
        ("running", Some(run.id.as_str())),
        "the started run is the turn's when shutdown returns"
    );
    let rig = Rig::start(dir, sr.clone(), 3).await;
    sr.answer(&run.id, "hi");
    assert_eq!(rig.settled(&turn_of(&run)).await.state, TurnState::Done);
    assert_eq!(replies(&rig.history().await), ["hi"]);
    assert_eq!(sr.read(|s| s.runs.len()), 1, "the same run, followed again");
    rig.stop().await;
}

/// A turn's step still busy when the shutdown grace ends (runed not answering the run's
/// start) is cut off: when `shutdown` returns, the turn's sockets are gone and nothing of
/// that routd acts on it again; the next routd asks for the same try, and the message is
/// answered once.
#[tokio::test]
async fn shutdown_cuts_off_a_step_still_busy_after_the_grace() {
    let mut rig = Rig::new_with(|cfg| cfg.shutdown_grace = Duration::from_millis(300)).await;
    let held = Arc::new(tokio::sync::Notify::new());
    rig.sr.with(|s| s.create_hold = Some(held.clone()));
    rig.say("m1", "hello").await;
    asked(&rig.sr).await;
    let socket = hako_shared::layout::DataLayout::new(rig.dir.path())
        .mcp_socket(&GroupFolder::new(FOLDER).unwrap());
    assert!(socket.exists(), "the live turn's tools are served");
    stop_routd(&mut rig).await.await.unwrap();
    assert!(
        !socket.exists(),
        "shutdown returned while the turn's driver still held its sockets"
    );
    // runed answers the cut-off start late: nobody is there to take it.
    held.notify_one();
    let Rig { dir, sr, .. } = rig;
    assert!(
        sr.read(|s| s.runs.is_empty()),
        "the cut-off start made no run"
    );
    let rig = Rig::start(dir, sr.clone(), 3).await;
    let run = sr.run(0).await;
    assert_eq!(
        sr.read(|s| s.asked.clone()),
        [run.req.turn_id.clone(), run.req.turn_id.clone()],
        "the same try, asked again"
    );
    sr.start(&run.id);
    sr.answer(&run.id, "hi");
    assert_eq!(rig.settled(&turn_of(&run)).await.state, TurnState::Done);
    assert_eq!(replies(&rig.history().await), ["hi"]);
    rig.stop().await;
}

/// Deleting a group mid-run stops its run through runed (which retires the folder), and the
/// turn ends killed.
#[tokio::test]
async fn deleting_the_group_stops_its_live_run() {
    let rig = Rig::new(3).await;
    rig.say("m1", "hello").await;
    let run = rig.sr.run(0).await;
    rig.sr.start(&run.id);
    rig.api
        .call(routd::delete_group(FOLDER), None)
        .await
        .unwrap();
    let turn = rig.settled(&turn_of(&run)).await;
    assert_eq!(turn.state, TurnState::Killed);
    let stopped: HashMap<RunId, RunState> = rig
        .sr
        .read(|s| s.runs.iter().map(|r| (r.id.clone(), r.state)).collect());
    assert_eq!(stopped[&run.id], RunState::Killed);
    rig.stop().await;
}
