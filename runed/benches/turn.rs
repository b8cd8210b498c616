//! One trivial turn through the runner vs `docker run -i --rm --network none` of the same
//! image with the same input line, measured in the same process:
//! `cargo bench -p hako-runed --bench turn` (`TURN_ITERS` to change the count, default 10).
//! Prints the medians and the ratio runner/cli (target <= 1.0). Then the same turn in a warm
//! box (`Runner::prestart` between turns, not timed: it happens after a folder's run, while
//! nobody waits), with its ratio to the CLI (target <= 0.25). Where the Docker daemon lists
//! gVisor's `runsc`, the same turn of an untrusted group under it too
//! (`RUNED_UNTRUSTED_RUNTIME=runsc`), with its ratios to runc and to the CLI.

use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

use hako_runner::{CloseWhen, LiveRun, RunControl, RunEvent, RunSpec, Runner, RunnerConfig, Start};
use hako_shared::GroupFolder;
use hako_shared::contract::{ContainerInput, Message, OUTPUT_START};
use hako_shared::runs::{GroupSpec, Outcome};

fn input() -> ContainerInput {
    ContainerInput {
        messages: vec![Message {
            role: "user".into(),
            content: "hello".into(),
            extra: Default::default(),
        }],
        folder: "bench".into(),
        turn_id: "turn".into(),
        run_id: "run".into(),
        ..Default::default()
    }
}

fn spec(i: usize) -> RunSpec {
    RunSpec {
        run_id: hako_shared::ids::RunId::new(format!("bench-{i}")).expect("id"),
        turn_id: Some(hako_shared::ids::TurnId::new("turn").expect("id")),
        folder: GroupFolder::new("bench").expect("folder"),
        input: input(),
        group: GroupSpec::default(),
        close: CloseWhen::Idle(Duration::ZERO),
        bind: None,
        brokered: Vec::new(),
    }
}

async fn runner_turn(runner: &Runner, i: usize) -> Duration {
    let spec = spec(i);
    let (tx, mut rx) = mpsc::channel(16);
    let live = LiveRun::new(spec.run_id.clone(), spec.folder.clone());
    let drain = tokio::spawn(async move {
        let mut v = Vec::new();
        while let Some(e) = rx.recv().await {
            v.push(e);
        }
        v
    });
    let t = Instant::now();
    let end = runner.run(spec, tx, RunControl::default(), live).await;
    let dt = t.elapsed();
    let events = drain.await.expect("events");
    let r = end.report().expect("finished");
    let warm = matches!(
        events.first(),
        Some(RunEvent::Started {
            start: Start::Warm { .. },
            ..
        })
    );
    assert_eq!(warm, runner.config().warm_max > 0, "{events:?}");
    assert_eq!(r.outcome, Outcome::Ok, "{r:?}");
    runner.remove_containers(&r).await;
    dt
}

async fn cli_turn(image: &str, line: &[u8]) -> Duration {
    let t = Instant::now();
    let mut child = tokio::process::Command::new("docker")
        .args(["run", "-i", "--rm", "--network", "none", image])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("docker CLI");
    let mut stdin = child.stdin.take().expect("stdin");
    stdin.write_all(line).await.expect("write");
    drop(stdin);
    let mut out = Vec::new();
    child
        .stdout
        .take()
        .expect("stdout")
        .read_to_end(&mut out)
        .await
        .expect("read");
    let status = child.wait().await.expect("wait");
    let dt = t.elapsed();
    assert!(status.success(), "docker run failed: {status}");
    assert!(
        String::from_utf8_lossy(&out).contains(OUTPUT_START),
        "no block from the CLI run"
    );
    dt
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    let iters: usize = std::env::var("TURN_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10);
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let image = hako_deploy::ensure_agent_image().await.expect("agent image");
        let tmp = tempfile::tempdir().expect("tempdir");
        let mut cfg = RunnerConfig::new(tmp.path().join("data"));
        cfg.default_image = image.clone();
        let docker = hako_runner::docker::DockerEngine::connect_default().expect("docker");
        let runtimes = hako_runner::engine::Engine::runtimes(&docker, Duration::from_secs(10))
            .await
            .unwrap_or_default();
        let gvisor = runtimes.iter().any(|r| r == "runsc").then(|| {
            let mut g = cfg.clone();
            g.layout.data_dir = tmp.path().join("data-gvisor");
            g.untrusted_runtime = Some("runsc".into());
            g.install_id = format!("{}-gv", g.install_id);
            Runner::on_docker(docker.clone(), g).expect("gvisor runner")
        });
        let warm = {
            let mut w = cfg.clone();
            w.layout.data_dir = tmp.path().join("data-warm");
            w.install_id = format!("{}-warm", w.install_id);
            w.warm_max = 1;
            Runner::on_docker(docker.clone(), w).expect("warm runner")
        };
        let runner = Runner::on_docker(docker, cfg).expect("runner");
        let mut line = serde_json::to_vec(&input()).expect("json");
        line.push(b'\n');
        // Warm-up, then interleave so that both paths see the same machine load.
        runner_turn(&runner, 0).await;
        cli_turn(&image, &line).await;
        warm.prestart(&spec(0)).await.expect("a warm box");
        runner_turn(&warm, 0).await;
        if let Some(g) = &gvisor {
            runner_turn(g, 0).await;
        }
        let (mut ours, mut cli, mut gv, mut warmed) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for i in 1..=iters {
            ours.push(runner_turn(&runner, i).await);
            cli.push(cli_turn(&image, &line).await);
            // The box is made after the folder's last run, while nobody waits.
            warm.prestart(&spec(i)).await.expect("a warm box");
            // The gap before the folder's next message (minutes, in a chat).
            tokio::time::sleep(Duration::from_millis(300)).await;
            warmed.push(runner_turn(&warm, i).await);
            if let Some(g) = &gvisor {
                gv.push(runner_turn(g, i).await);
            }
        }
        let (a, b) = (median(ours.clone()), median(cli.clone()));
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        println!(
            "one trivial turn, median of {iters}: runner {:.1} ms (min {:.1}), docker run -i --rm {:.1} ms (min {:.1})",
            ms(a),
            ms(*ours.iter().min().expect("runs")),
            ms(b),
            ms(*cli.iter().min().expect("runs"))
        );
        println!(
            "ratio runner/cli: {:.2} (target <= 1.00)",
            a.as_secs_f64() / b.as_secs_f64()
        );
        let w = median(warmed.clone());
        println!(
            "in a warm box: {:.1} ms (min {:.1}); ratio warm/cli: {:.2} (target <= 0.25), warm/cold {:.2}",
            ms(w),
            ms(*warmed.iter().min().expect("runs")),
            w.as_secs_f64() / b.as_secs_f64(),
            w.as_secs_f64() / a.as_secs_f64()
        );
        if !gv.is_empty() {
            let g = median(gv);
            println!(
                "under gVisor (runsc-nonet): {:.1} ms; ratio to runc {:.2}, to docker run {:.2}",
                ms(g),
                g.as_secs_f64() / a.as_secs_f64(),
                g.as_secs_f64() / b.as_secs_f64()
            );
        }
    });
}
