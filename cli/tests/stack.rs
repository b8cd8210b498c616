//! The compose stack end to end: `hako up`'s own code builds the images and brings authd,
//! runed and routd up with the compose tool, on a project name and ports of this test run;
//! a message goes in over HTTP and the agent's reply comes out on routd's event stream; the
//! runed container restarted mid-turn still gives exactly one reply; routd restarted gives no
//! duplicate. Everything (containers, networks, agents, the home) is torn down even when an
//! assertion fails.

use std::time::Duration;

use bollard::query_parameters::{ListContainersOptionsBuilder, RestartContainerOptionsBuilder};
use hako_cli::daemons::{CallError, Daemons, Endpoints};
use hako_cli::stack::{self, StackArgs};
use hako_client::{Op, routd};
use hako_shared::chat::PostMessage;
use hako_shared::testing::eventually;
use serde_json::{Value, json};

const LIMIT: Duration = Duration::from_secs(120);

/// A stack of this test run, taken down on drop.
struct Stack {
    args: StackArgs,
    home: std::path::PathBuf,
}

impl Drop for Stack {
    fn drop(&mut self) {
        let args = self.args.clone();
        let home = self.home.clone();
        // Off the test's runtime: a runtime of its own for `hako down`'s code.
        let _ = std::thread::spawn(move || {
            if let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                if let Err(e) = rt.block_on(stack::down(&args)) {
                    eprintln!("teardown: {e:#}");
                }
                // Whatever `down` could not take (it failed half way): by label.
                let _ = rt.block_on(stack::remove_agents(&args.project));
            }
            let _ = std::fs::remove_dir_all(&home);
        })
        .join();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn unique() -> String {
    let mut b = [0u8; 4];
    getrandom::fill(&mut b).unwrap();
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The container of `service` in the stack.
async fn container(project: &str, service: &str) -> String {
    let docker = hako_deploy::connect_docker().unwrap();
    let filters = std::collections::HashMap::from([(
        "label".to_owned(),
        vec![
            format!("com.docker.compose.project={project}"),
            format!("com.docker.compose.service={service}"),
        ],
    )]);
    let list = docker
        .list_containers(Some(
            ListContainersOptionsBuilder::new()
                .all(true)
                .filters(&filters)
                .build(),
        ))
        .await
        .unwrap();
    list.into_iter()
        .next()
        .and_then(|c| c.id)
        .unwrap_or_else(|| panic!("no {service} container in {project}"))
}

async fn restart(project: &str, service: &str) {
    let docker = hako_deploy::connect_docker().unwrap();
    let id = container(project, service).await;
    docker
        .restart_container(
            &id,
            Some(RestartContainerOptionsBuilder::new().t(10).build()),
        )
        .await
        .unwrap();
}

/// One GET on routd, as a probe of [`eventually`]: a call that gets no answer (a transport
/// error or a timeout) is logged and answered as `Err`, so the poll tries it again; a refusal
/// fails the test at once. On a loaded 2-core CI machine the stack's containers have stalled
/// past one call's 15 s.
async fn routd_get<R>(d: &Daemons, op: &Op<R>, token: &str) -> Result<Value, String> {
    let path = &op.path;
    match d.call(op.clone().as_value(), token).await {
        Ok(v) => Ok(v),
        Err(e)
            if e.downcast_ref::<CallError>()
                .is_none_or(|e| e.status().is_none()) =>
        {
            eprintln!("routd GET {path}: {e}; trying again");
            Err(format!("routd GET {path}: {e}"))
        }
        Err(e) => panic!("routd GET {path}: {e}"),
    }
}

/// The operator's token, tried again while authd does not answer (as [`routd_get`]).
async fn operator_token(d: &Daemons) -> String {
    eventually("the operator's token", LIMIT, || async {
        match d.operator_token().await {
            Ok(t) => Ok(t),
            Err(e) if e.to_string().contains("does not answer") => {
                eprintln!("the operator's token: {e}; trying again");
                Err(e)
            }
            Err(e) => panic!("the operator's token: {e}"),
        }
    })
    .await
}

async fn history(d: &Daemons, token: &str, chat: &str) -> Vec<Value> {
    let op = routd::chat_messages(chat).query("limit", 1000);
    let v = eventually("the chat's history", LIMIT, || routd_get(d, &op, token)).await;
    v["messages"].as_array().cloned().unwrap_or_default()
}

fn replies_with(h: &[Value], text: &str) -> usize {
    h.iter()
        .filter(|m| {
            m["direction"] == "out"
                && m["kind"] == "message"
                && m["content"].as_str().is_some_and(|c| c.contains(text))
        })
        .count()
}

async fn wait_ready(d: &Daemons) {
    eventually("the daemons ready again", LIMIT, || async {
        let r = d.ready_all().await;
        if r.iter().all(|(_, r)| r.is_ok()) {
            Ok(())
        } else {
            Err(r)
        }
    })
    .await;
}

/// Waits until the turn that covers message `id` of `folder` runs; answers it.
async fn running_turn(d: &Daemons, token: &str, folder: &str, id: &str) -> Value {
    let op = routd::turns()
        .query("folder", folder)
        .query("state", "running");
    eventually(
        &format!("a running turn for {id} in {folder}"),
        LIMIT,
        || async {
            let v = routd_get(d, &op, token).await?;
            let covering = v["turns"].as_array().and_then(|ts| {
                ts.iter().find(|t| {
                    t["messages"]
                        .as_array()
                        .is_some_and(|m| m.contains(&json!(id)))
                })
            });
            covering.cloned().ok_or_else(|| v.to_string())
        },
    )
    .await
}

/// Waits until `folder` has no live turn, so that the next message starts a turn of its own
/// (a message arriving during a turn is steered into it).
async fn wait_idle(d: &Daemons, token: &str, folder: &str) {
    eventually(&format!("{folder} going idle"), LIMIT, || async {
        let mut live = Vec::new();
        for state in ["starting", "running", "waiting"] {
            let op = routd::turns().query("folder", folder).query("state", state);
            let v = routd_get(d, &op, token).await?;
            live.extend(v["turns"].as_array().cloned().unwrap_or_default());
        }
        if live.is_empty() {
            Ok(())
        } else {
            Err(format!("live turns: {live:?}"))
        }
    })
    .await;
}

async fn turn_done(d: &Daemons, token: &str, turn_id: &str) -> Value {
    let op = routd::turn(turn_id);
    eventually("the turn's end", LIMIT, || async {
        let v = routd_get(d, &op, token).await?;
        if matches!(
            v["state"].as_str(),
            Some("starting" | "running" | "waiting")
        ) {
            Err(v.to_string())
        } else {
            Ok(v)
        }
    })
    .await
}

/// Stacks of earlier runs of this test that were killed before their teardown (a timeout
/// kills without unwinding): containers of `hakotest*` projects created over an hour ago.
async fn sweep_stale_stacks() {
    use bollard::query_parameters::{ListContainersOptionsBuilder, RemoveContainerOptionsBuilder};
    let docker = hako_deploy::connect_docker().unwrap();
    let filters = std::collections::HashMap::from([(
        "label".to_owned(),
        vec!["com.docker.compose.project".to_owned()],
    )]);
    let list = docker
        .list_containers(Some(
            ListContainersOptionsBuilder::new()
                .all(true)
                .filters(&filters)
                .build(),
        ))
        .await
        .unwrap_or_default();
    let hour_ago = hako_shared::time::unix_millis(std::time::SystemTime::now()) / 1000 - 3600;
    let mut projects = std::collections::BTreeSet::new();
    for c in list {
        let project = c
            .labels
            .as_ref()
            .and_then(|l| l.get("com.docker.compose.project"))
            .cloned()
            .unwrap_or_default();
        if project.starts_with("hakotest") && c.created.unwrap_or(i64::MAX) < hour_ago {
            if let Some(id) = c.id {
                let opts = RemoveContainerOptionsBuilder::new().force(true).build();
                let _ = docker.remove_container(&id, Some(opts)).await;
            }
            projects.insert(project);
        }
    }
    for p in projects {
        let _ = stack::remove_agents(&p).await;
        let _ = docker.remove_network(&format!("{p}-net")).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stack_answers_survives_restarts_and_never_answers_twice() {
    sweep_stale_stacks().await;
    let home = std::env::temp_dir().join(format!("hako-stack-{}", unique()));
    let args = StackArgs {
        home: Some(home.clone()),
        project: format!("hakotest{}", unique()),
        routd_port: free_port(),
        authd_port: free_port(),
        runed_port: free_port(),
        bind: "127.0.0.1".into(),
    };
    let guard = Stack {
        args: args.clone(),
        home: home.clone(),
    };
    let ep: Endpoints = stack::up(&args).await.expect("the stack comes up");

    // The keys: 0600 files in a 0700 directory; none of them in the compose file or env file.
    let secrets = home.join("secrets");
    let mode = |p: &std::path::Path| {
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(p).unwrap().permissions())
            & 0o777
    };
    assert_eq!(mode(&secrets), 0o700);
    let routd_key = std::fs::read_to_string(secrets.join("routd.key")).unwrap();
    assert_eq!(mode(&secrets.join("routd.key")), 0o600);
    let env_file = std::fs::read_to_string(home.join("compose.env")).unwrap();
    assert!(!env_file.contains(routd_key.trim()));

    // A message in over HTTP, the agent's reply on routd's event stream.
    let reply = stack::demo(&ep, "hello from the stack test").await.unwrap();
    assert_eq!(reply, "hello from the stack test");

    let d = Daemons::new(&ep).unwrap();
    let token = operator_token(&d).await;
    // runed restarted mid-turn: the run is re-adopted and answers exactly once.
    let chat = "web:demo";
    wait_idle(&d, &token, "demo").await;
    let slow = PostMessage {
        id: Some("slow-1".into()),
        chat_jid: chat.into(),
        sender: "t".into(),
        sender_name: None,
        content: "/sleep 4\nafter the runed restart".into(),
        timestamp: None,
        reply_to: None,
    };
    d.call(routd::post_message(&slow), &token).await.unwrap();
    let turn = running_turn(&d, &token, "demo", "slow-1").await;
    restart(&args.project, "runed").await;
    let done = turn_done(&d, &token, turn["turn_id"].as_str().unwrap()).await;
    assert_eq!(done["state"], "done", "{done}");
    let h = history(&d, &token, chat).await;
    assert_eq!(
        replies_with(&h, "after the runed restart"),
        1,
        "exactly one reply: {h:#?}"
    );

    // routd restarted: nothing delivered twice, and it answers again.
    restart(&args.project, "routd").await;
    wait_ready(&d).await;
    let token = operator_token(&d).await;
    let h = history(&d, &token, chat).await;
    assert_eq!(replies_with(&h, "after the runed restart"), 1, "{h:#?}");
    assert_eq!(replies_with(&h, "hello from the stack test"), 1, "{h:#?}");
    let reply = stack::demo(&ep, "after the routd restart").await.unwrap();
    assert_eq!(reply, "after the routd restart");

    // `hako up` again: safe, and the keys are kept.
    stack::up(&args).await.expect("up again");
    assert_eq!(
        std::fs::read_to_string(secrets.join("routd.key")).unwrap(),
        routd_key
    );
    drop(guard);
    assert!(!home.exists(), "the home is gone");
    // Nothing of the stack is left: containers (the daemons', runed's) and the network.
    let docker = hako_deploy::connect_docker().unwrap();
    let filters = std::collections::HashMap::from([(
        "label".to_owned(),
        vec![format!("com.docker.compose.project={}", args.project)],
    )]);
    let left = docker
        .list_containers(Some(
            ListContainersOptionsBuilder::new()
                .all(true)
                .filters(&filters)
                .build(),
        ))
        .await
        .unwrap();
    assert!(left.is_empty(), "{left:?}");
    assert!(
        docker
            .inspect_network(&format!("{}-net", args.project), None)
            .await
            .is_err(),
        "the network is gone"
    );
}
