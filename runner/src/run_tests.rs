//! A run's whole life on the simulated engine (`sim.rs`): launch, supervision, the outcome,
//! the removal, warm boxes and re-adoption, with no Docker daemon. What only Docker can show
//! (mounts, the security profile, runtimes, egress) stays in runed's container tests.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use hako_shared::GroupFolder;
use hako_shared::contract::{BlockStatus, ContainerInput, Message, OutputBlock, WARM_LABEL};
use hako_shared::ids::{RunId, TurnId};
use hako_shared::runs::{GroupSpec, Outcome, RunState};

use crate::engine::labels;
use crate::sim::{Op, SimEngine, agents, script};
use crate::{
    Adoption, CloseWhen, EngineError, LiveRun, RunControl, RunEnd, RunEvent, RunReport, RunSpec,
    Runner, RunnerConfig, Start, WarmMiss,
};

const IMAGE: &str = "hako-agent:latest";

struct Rig {
    sim: SimEngine,
    runner: Runner,
    _tmp: tempfile::TempDir,
}

fn rig(edit: impl FnOnce(&mut RunnerConfig)) -> Rig {
    let tmp = tempfile::tempdir().unwrap();
    let mut cfg = RunnerConfig::new(tmp.path());
    cfg.install_id = "sim-1".into();
    edit(&mut cfg);
    let sim = SimEngine::new();
    let runner = Runner::new(Arc::new(sim.clone()), cfg).unwrap();
    Rig {
        sim,
        runner,
        _tmp: tmp,
    }
}

fn spec(run: &str, folder: &str, text: &str) -> RunSpec {
    RunSpec {
        run_id: RunId::new(run).unwrap(),
        turn_id: Some(TurnId::new(format!("t-{run}")).unwrap()),
        folder: GroupFolder::new(folder).unwrap(),
        input: ContainerInput {
            messages: vec![Message::user(text)],
            ..ContainerInput::default()
        },
        group: GroupSpec::default(),
        close: CloseWhen::Idle(Duration::from_secs(30)),
        bind: None,
        brokered: Vec::new(),
    }
}

/// Runs `spec` to its end and removes its boxes as runed does once the outcome is recorded;
/// returns the report and every event. Checks that the box no longer ran at the end.
async fn run(r: &Runner, spec: RunSpec, control: RunControl) -> (RunReport, Vec<RunEvent>) {
    let live = LiveRun::new(spec.run_id.clone(), spec.folder.clone());
    let (tx, mut rx) = mpsc::channel(64);
    let end = r.run(spec, tx, control, live.clone()).await;
    let mut events = Vec::new();
    while let Ok(e) = rx.try_recv() {
        events.push(e);
    }
    let report = end.report().expect("the run finished");
    assert!(live.has_ended());
    if let Some(id) = &report.container_id {
        let state = r.engine().state(id, Duration::from_secs(1)).await.unwrap();
        assert!(
            !state.running,
            "the run ended with its box running: {report:?}"
        );
    }
    let errors = r.remove_containers(&report).await;
    assert!(errors.is_empty(), "{errors:?}");
    (report, events)
}

fn texts(r: &RunReport) -> Vec<&str> {
    r.blocks
        .iter()
        .filter_map(|b| b.result.as_deref())
        .collect()
}

#[tokio::test]
async fn a_run_answers_through_its_box_and_the_box_is_removed() {
    let rig = rig(|_| {});
    rig.sim.image(IMAGE, &[], agents::echo());
    let (report, events) = run(&rig.runner, spec("r1", "main", "hi"), RunControl::default()).await;
    assert_eq!(report.outcome, Outcome::Ok, "{report:?}");
    assert_eq!(texts(&report), ["echo: hi"]);
    assert_eq!(report.exit_code, Some(0));
    let id = report.container_id.clone().unwrap();
    assert!(matches!(
        &events[0],
        RunEvent::Started { container_id, start: Start::Cold(None) } if *container_id == id
    ));
    assert!(matches!(&events[1], RunEvent::Block { index: 0, .. }));
    assert_eq!(rig.sim.removals(), [(id, None)], "removed by force, once");
    assert!(rig.sim.boxes().is_empty());
}

#[tokio::test]
async fn the_box_gets_the_runs_input_line_with_its_ids_and_labels() {
    let rig = rig(|_| {});
    let seen = Arc::new(std::sync::Mutex::new(None));
    let s = seen.clone();
    rig.sim.image(
        IMAGE,
        &[],
        script(move |mut io| {
            let s = s.clone();
            async move {
                let input = io.read_input().await;
                *s.lock().unwrap() = Some((input, io.spec.clone()));
                io.block(&OutputBlock::ok("done"));
                0
            }
        }),
    );
    let (report, _) = run(
        &rig.runner,
        spec("r2", "main", "hello"),
        RunControl::default(),
    )
    .await;
    assert_eq!(report.outcome, Outcome::Ok);
    let (input, made) = seen.lock().unwrap().take().unwrap();
    let input = input.expect("one JSON line on stdin");
    assert_eq!(
        (
            input.run_id.as_str(),
            input.turn_id.as_str(),
            input.folder.as_str()
        ),
        ("r2", "t-r2", "main")
    );
    assert_eq!(input.messages[0].content, "hello");
    assert_eq!(made.labels[labels::RUN], "r2");
    assert_eq!(made.labels[labels::INSTALL], "sim-1");
    assert_eq!(made.network, "none", "no network unless the group asks");
    assert!(
        made.env
            .iter()
            .any(|e| e.starts_with("ARIZUKO_QUERY_TIMEOUT_MS="))
    );
}

#[tokio::test]
async fn a_missing_image_fails_the_run_for_good_and_makes_no_box() {
    let rig = rig(|_| {});
    let (report, events) = run(&rig.runner, spec("r3", "main", "hi"), RunControl::default()).await;
    assert_eq!(report.outcome, Outcome::Error);
    assert!(report.terminal, "a retry cannot help: {report:?}");
    assert!(
        report
            .error
            .as_deref()
            .unwrap()
            .contains("hako-agent:latest"),
        "{report:?}"
    );
    assert!(events.is_empty());
    assert_eq!(rig.sim.created(), 0);
}

#[tokio::test]
async fn an_engine_failure_at_start_is_retryable_and_leaves_no_box() {
    let rig = rig(|_| {});
    rig.sim.image(IMAGE, &[], agents::echo());
    rig.sim.fail(
        Op::Start,
        None,
        EngineError::Api {
            status: Some(500),
            message: "failed to create shim task".into(),
        },
    );
    let (report, _) = run(&rig.runner, spec("r4", "main", "hi"), RunControl::default()).await;
    assert_eq!(report.outcome, Outcome::Fatal, "{report:?}");
    assert!(!report.terminal, "a 500 may pass: {report:?}");
    assert!(rig.sim.boxes().is_empty(), "the created box is removed");
    // The same run again goes through.
    let (report, _) = run(&rig.runner, spec("r4", "main", "hi"), RunControl::default()).await;
    assert_eq!(report.outcome, Outcome::Ok, "{report:?}");
}

#[tokio::test]
async fn a_box_that_dies_without_a_block_fails_with_its_stderr() {
    let rig = rig(|_| {});
    rig.sim.image(
        IMAGE,
        &[],
        agents::die(3, "panic: the model is unreachable\n"),
    );
    let (report, _) = run(&rig.runner, spec("r5", "main", "hi"), RunControl::default()).await;
    assert_eq!(report.outcome, Outcome::Fatal, "{report:?}");
    assert_eq!(report.exit_code, Some(3));
    assert!(
        report.log.contains("the model is unreachable"),
        "{}",
        report.log
    );
    assert!(rig.sim.boxes().is_empty());
}

#[tokio::test]
async fn a_box_past_its_ceiling_is_stopped_and_removed() {
    let rig = rig(|c| {
        c.run_timeout = Duration::from_secs(1);
        c.stop_grace = Duration::from_millis(200);
    });
    rig.sim.image(IMAGE, &[], agents::hang());
    let (report, _) = run(&rig.runner, spec("r6", "main", "hi"), RunControl::default()).await;
    assert_eq!(report.outcome, Outcome::TimedOut, "{report:?}");
    assert_eq!(report.state, RunState::TimedOut);
    assert!(rig.sim.boxes().is_empty(), "stopped and removed");
}

#[tokio::test]
async fn a_killed_run_is_killed_and_its_box_removed() {
    let rig = rig(|c| c.kill_grace = Duration::from_millis(100));
    rig.sim.image(IMAGE, &[], agents::hang());
    let control = RunControl::default();
    let kill = control.kill.clone();
    let sim = rig.sim.clone();
    tokio::spawn(async move {
        // Once the box runs, kill the run.
        while sim.running().is_empty() {
            tokio::task::yield_now().await;
        }
        kill.cancel();
    });
    let (report, _) = run(&rig.runner, spec("r7", "main", "hi"), control).await;
    assert_eq!(report.outcome, Outcome::Killed, "{report:?}");
    assert!(rig.sim.boxes().is_empty());
}

fn warm_rig() -> Rig {
    let rig = rig(|c| c.warm_max = 2);
    rig.sim.image(IMAGE, &[(WARM_LABEL, "1")], agents::echo());
    rig
}

#[tokio::test]
async fn a_warm_box_serves_the_folders_next_run_and_only_an_equal_one() {
    let rig = warm_rig();
    rig.runner.prestart(&spec("p", "main", "")).await.unwrap();
    assert_eq!(rig.runner.warm_boxes(), 1);
    let warm = rig.sim.running();
    assert_eq!(warm.len(), 1, "the box runs, blocked before its input");
    let (report, events) = run(&rig.runner, spec("r8", "main", "hi"), RunControl::default()).await;
    assert_eq!(texts(&report), ["echo: hi"]);
    assert!(matches!(
        &events[0],
        RunEvent::Started { container_id, start: Start::Warm { .. } } if *container_id == warm[0]
    ));
    assert_eq!(rig.sim.created(), 1, "no box made for the run itself");

    // A box made before the image was rebuilt is not taken.
    rig.runner.prestart(&spec("p", "main", "")).await.unwrap();
    rig.sim.image(IMAGE, &[(WARM_LABEL, "1")], agents::echo());
    let (report, events) = run(&rig.runner, spec("r9", "main", "hi"), RunControl::default()).await;
    assert_eq!(report.outcome, Outcome::Ok);
    assert!(matches!(
        &events[0],
        RunEvent::Started {
            start: Start::Cold(Some(WarmMiss::Image)),
            ..
        }
    ));

    // Another folder's run never takes it.
    rig.runner.prestart(&spec("p", "main", "")).await.unwrap();
    let (_, events) = run(
        &rig.runner,
        spec("r10", "other", "hi"),
        RunControl::default(),
    )
    .await;
    assert!(matches!(
        &events[0],
        RunEvent::Started {
            start: Start::Cold(Some(WarmMiss::Empty)),
            ..
        }
    ));
    assert_eq!(rig.runner.drain_warm().await, 1);
    assert!(rig.sim.boxes().is_empty(), "shutdown leaves no box");
}

#[tokio::test]
async fn an_image_that_does_not_say_it_waits_is_never_warmed() {
    let rig = rig(|c| c.warm_max = 2);
    rig.sim.image(IMAGE, &[], agents::echo());
    let e = rig
        .runner
        .prestart(&spec("p", "main", ""))
        .await
        .unwrap_err();
    assert!(matches!(e, crate::NotWarmed::Image(_)), "{e}");
    assert_eq!(rig.sim.created(), 0);
}

#[tokio::test]
async fn a_warm_box_that_stopped_while_it_waited_is_not_taken() {
    let rig = warm_rig();
    rig.runner.prestart(&spec("p", "main", "")).await.unwrap();
    let warm = rig.sim.running().pop().unwrap();
    crate::engine::BoxControl::signal(&rig.sim, &warm, "SIGKILL", Duration::from_secs(1))
        .await
        .unwrap();
    let (report, events) = run(
        &rig.runner,
        spec("r11", "main", "hi"),
        RunControl::default(),
    )
    .await;
    assert_eq!(report.outcome, Outcome::Ok);
    assert!(matches!(
        &events[0],
        RunEvent::Started {
            start: Start::Cold(Some(WarmMiss::Gone)),
            ..
        }
    ));
}

#[tokio::test]
async fn a_restarted_runner_adopts_a_box_from_its_log_and_resends_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let sim = SimEngine::new();
    let (go_tx, go_rx) = tokio::sync::watch::channel(false);
    sim.image(
        IMAGE,
        &[],
        script(move |mut io| {
            let mut go = go_rx.clone();
            async move {
                let _ = io.read_input().await;
                io.block(&OutputBlock::ok("first"));
                let _ = go.wait_for(|g| *g).await;
                io.block(&OutputBlock::ok("second"));
                0
            }
        }),
    );
    let cfg = || {
        let mut c = RunnerConfig::new(tmp.path());
        c.install_id = "sim-1".into();
        c
    };
    let first = Runner::new(Arc::new(sim.clone()), cfg()).unwrap();
    let s = spec("r12", "main", "hi");
    let live = LiveRun::new(s.run_id.clone(), s.folder.clone());
    let (tx, mut rx) = mpsc::channel(64);
    let control = RunControl::default();
    let detach = control.detach.clone();
    let running = tokio::spawn({
        let first = first.clone();
        async move { first.run(s, tx, control, live).await }
    });
    // The first block arrives; then the supervisor "dies" (detaches, as at a shutdown).
    let mut prior = Vec::new();
    while let Some(e) = rx.recv().await {
        if let RunEvent::Block { block, .. } = e {
            prior.push(block);
            break;
        }
    }
    detach.cancel();
    assert!(matches!(running.await.unwrap(), RunEnd::Detached));
    let container = sim
        .running()
        .pop()
        .expect("the box outlives its supervisor");

    let second = Runner::new(Arc::new(sim.clone()), cfg()).unwrap();
    let agents = second.list_agents().await.unwrap();
    assert_eq!(agents.len(), 1);
    assert_eq!(agents[0].run_id(), Some("r12"));
    let (tx, mut rx) = mpsc::channel(64);
    go_tx.send(true).unwrap();
    let end = second
        .adopt(
            Adoption {
                container_id: container,
                run_id: RunId::new("r12").unwrap(),
                folder: GroupFolder::new("main").unwrap(),
                prior,
                close: CloseWhen::Idle(Duration::from_secs(30)),
                deadline_ms: None,
            },
            tx,
            RunControl::default(),
            LiveRun::new(
                RunId::new("r12").unwrap(),
                GroupFolder::new("main").unwrap(),
            ),
        )
        .await;
    let report = end.report().unwrap();
    assert_eq!(report.outcome, Outcome::Ok, "{report:?}");
    assert_eq!(texts(&report), ["first", "second"]);
    let mut resent = Vec::new();
    while let Ok(RunEvent::Block { index, block }) = rx.try_recv() {
        resent.push((index, block.result));
    }
    assert_eq!(
        resent,
        [(1, Some("second".to_owned()))],
        "the replayed first block is not sent again"
    );
    assert!(second.remove_containers(&report).await.is_empty());
    assert!(sim.boxes().is_empty());
}

#[tokio::test]
async fn an_error_block_makes_an_error_outcome() {
    let rig = rig(|_| {});
    rig.sim.image(
        IMAGE,
        &[],
        script(|mut io| async move {
            let _ = io.read_input().await;
            io.block(&OutputBlock::failure(BlockStatus::Error, "the tool failed"));
            1
        }),
    );
    let (report, _) = run(
        &rig.runner,
        spec("r13", "main", "hi"),
        RunControl::default(),
    )
    .await;
    assert_eq!(report.outcome, Outcome::Error, "{report:?}");
}
