//! Follow-ups sent while a chat's turn runs: each reaches the chat's answer exactly once,
//! whatever the timing and whichever daemon dies. Real authd, runed and routd, the real
//! `hako-agent` on the simulated engine (no Docker), or in real containers where runed is a
//! process of its own that a test SIGKILLs (the container must outlive it).
//! Every assertion is what the chat's history shows.

mod common;

use common::*;
use hako_shared::GroupFolder;
use hako_shared::chat::{Direction, MessageState, MessageView};
use hako_shared::layout::{DataLayout, FolderDir};

/// runed's process for the tests that kill it (a program, not a test: see
/// [`common::run_runed_child`]).
#[test]
#[ignore = "runed's process in tests that SIGKILL it; started by the rig"]
fn runed_child_process() {
    run_runed_child();
}

/// Waits until the folder's turn runs and its container has started (a follow-up sent now
/// goes into the live run); answers the turn's id.
async fn running(rig: &Rig, folder: &str) -> String {
    rig.live_run(folder).await.0
}

/// Waits until a follow-up file lies in the folder's drop: runed placed it, the agent (busy)
/// has not taken it yet.
async fn placed(rig: &Rig, folder: &str) {
    let dir = DataLayout::new(rig.data()).dir(&GroupFolder::new(folder).unwrap(), FolderDir::Input);
    let what = format!("a follow-up is placed in {}", dir.display());
    eventually(&what, LIMIT, || async {
        let names: Vec<String> = std::fs::read_dir(&dir)
            .map(|rd| {
                rd.filter_map(Result::ok)
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.ends_with(".json") && !n.starts_with('.'))
                    .collect()
            })
            .unwrap_or_default();
        if names.is_empty() { Err(()) } else { Ok(()) }
    })
    .await
}

/// Waits until every inbound message of the chat is answered; answers the history.
async fn all_answered(rig: &Rig, chat: &str) -> Vec<MessageView> {
    rig.wait_for(chat, "every message answered", |h| {
        h.iter()
            .filter(|m| m.direction == Direction::In)
            .all(|m| m.state == MessageState::Answered)
    })
    .await
}

/// The chat's history says `nonce` was answered exactly once, and by the turn that was live
/// when it came (the busy agent took it in the same run).
fn answered_once_by(h: &[MessageView], nonce: &str, turn: &str) {
    let with: Vec<&MessageView> = h
        .iter()
        .filter(|m| m.direction == Direction::Out && m.content.contains(nonce))
        .collect();
    assert_eq!(
        with.len(),
        1,
        "{nonce} answered exactly once: {:#?}",
        replies(h)
    );
    assert!(
        with[0].id.starts_with(&format!("{turn}.")),
        "answered by the live turn {turn}: {:?}",
        with[0].id
    );
}

/// A follow-up sent while the agent is busy for longer than routd's call to runed may take:
/// routd's call gives up, runed's placement stands, the busy agent takes it when it can, and
/// the turn's end learns that from runed. Once answered, by the same run (it was answered a
/// second time by a new turn when the caller's timeout dropped runed's handler half-way).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_follow_up_during_a_turn_longer_than_every_timeout_is_answered_once() {
    let rig = Rig::sim(&[], &[("ROUTD_RUNED_TIMEOUT", "2s")]).await;
    let chat = "tg:700";
    rig.group_for("longturn", chat).await;
    rig.say(chat, "l-1", "/sleep 6\nfirst").await;
    let turn = running(&rig, "longturn").await;
    rig.say(chat, "l-2", "nonce-7a1").await;
    let h = all_answered(&rig, chat).await;
    answered_once_by(&h, "nonce-7a1", &turn);
    assert_eq!(
        replies(&h).iter().filter(|r| r.contains("first")).count(),
        1
    );
    rig.stop().await;
}

/// runed SIGKILLed while a follow-up waits in the busy agent's drop: the container runs on,
/// the agent takes the follow-up, and the restarted runed re-adopts the run and records that
/// the agent took it. Answered once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn runed_killed_with_a_follow_up_placed_answers_it_once() {
    // Docker: the container must outlive the runed process that is killed.
    let mut rig = Rig::new(LONG_RUNS, &[]).await;
    rig.spawn_runed_process().await;
    let chat = "tg:710";
    rig.group_for("runedkill", chat).await;
    rig.say(chat, "r-1", "/sleep 8\nfirst").await;
    let turn = running(&rig, "runedkill").await;
    rig.say(chat, "r-2", "nonce-4c2").await;
    placed(&rig, "runedkill").await;
    rig.kill_runed_process();
    rig.spawn_runed_process().await;
    let h = all_answered(&rig, chat).await;
    answered_once_by(&h, "nonce-4c2", &turn);
    rig.stop().await;
}

/// routd SIGKILLed while a follow-up waits in the busy agent's drop: the restarted routd
/// keeps it with the live turn (it was delivered a second time into the same run by the
/// restart's hand-back), and the run's end says the agent took it. Answered once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn routd_killed_with_a_follow_up_placed_answers_it_once() {
    let mut rig = Rig::sim(LONG_RUNS, &[]).await;
    rig.spawn_routd_binary().await;
    let chat = "tg:720";
    rig.group_for("routdkill", chat).await;
    rig.say(chat, "k-1", "/sleep 8\nfirst").await;
    let turn = running(&rig, "routdkill").await;
    rig.say(chat, "k-2", "nonce-9e5").await;
    placed(&rig, "routdkill").await;
    let (mut child, _) = rig.child.take().unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    rig.spawn_routd_binary().await;
    let h = all_answered(&rig, chat).await;
    answered_once_by(&h, "nonce-9e5", &turn);
    rig.stop().await;
}
