//! The LLM gateway and hako-agent's LLM brain, end to end: a real authd, runed and routd, real
//! `hako-agent` containers whose model is a stub provider on loopback that speaks the Anthropic
//! Messages wire format (streaming). The stub alone holds what it checks: the real key arrives
//! there and nowhere else; the agent's tool calls take effect in the chat; usage is recorded;
//! a spent budget reaches the chat as an error.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::HeaderMap;
use common::*;
use futures_util::StreamExt as _;
use hako_client::authd::AuthdClient;
use hako_client::routd;
use hako_shared::auth::wire::MintRequest;
use hako_shared::chat::GroupConfig;
use serde_json::{Value, json};

const REAL_KEY: &str = "sk-ant-real-provider-key-0123456789";
/// Where the stub's stream pauses (between a text and a tool call).
const PAUSE: &str = "\u{0}pause\u{0}";

/// One request the stub provider got: its headers and body.
#[derive(Debug, Clone)]
struct Seen {
    headers: HeaderMap,
    body: Value,
}

/// A model on loopback that speaks Anthropic Messages: scripted by what the conversation's
/// last message is, streaming its answers as server-sent events.
#[derive(Clone, Default)]
struct Provider {
    seen: Arc<Mutex<Vec<Seen>>>,
}

/// An answer's events: text blocks, then tool calls, then the stop reason and usage.
fn answer(texts: &[&str], tools: &[(&str, &str, Value)], input_tokens: u64) -> String {
    let mut s = String::new();
    let mut ev = |name: &str, data: Value| {
        if name.is_empty() {
            s.push_str(PAUSE);
        } else {
            s.push_str(&format!("event: {name}\ndata: {data}\n\n"));
        }
    };
    ev(
        "message_start",
        json!({"type": "message_start", "message": {"id": "msg_1", "type": "message",
            "role": "assistant", "content": [], "model": "stub", "stop_reason": null,
            "usage": {"input_tokens": input_tokens, "output_tokens": 1}}}),
    );
    let mut index = 0;
    for t in texts {
        ev(
            "content_block_start",
            json!({"type": "content_block_start", "index": index,
                "content_block": {"type": "text", "text": ""}}),
        );
        // Split, as a real stream would.
        let (a, b) = t.split_at(t.len() / 2);
        for piece in [a, b] {
            ev(
                "content_block_delta",
                json!({"type": "content_block_delta", "index": index,
                    "delta": {"type": "text_delta", "text": piece}}),
            );
        }
        ev("ping", json!({"type": "ping"}));
        ev(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": index}),
        );
        index += 1;
    }
    // A real model takes a while to write a call's arguments after its text: the pause
    // (where the stub stream waits) lets the text the agent sent on reach the chat first.
    if !texts.is_empty() && !tools.is_empty() {
        ev("", Value::Null);
    }
    for (id, name, input) in tools {
        ev(
            "content_block_start",
            json!({"type": "content_block_start", "index": index,
                "content_block": {"type": "tool_use", "id": id, "name": name, "input": {}}}),
        );
        let args = input.to_string();
        let (a, b) = args.split_at(args.len() / 2);
        for piece in [a, b] {
            ev(
                "content_block_delta",
                json!({"type": "content_block_delta", "index": index,
                    "delta": {"type": "input_json_delta", "partial_json": piece}}),
            );
        }
        ev(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": index}),
        );
        index += 1;
    }
    let stop = if tools.is_empty() {
        "end_turn"
    } else {
        "tool_use"
    };
    ev(
        "message_delta",
        json!({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": null},
            "usage": {"output_tokens": 20}}),
    );
    ev("message_stop", json!({"type": "message_stop"}));
    s
}

/// A stub provider and a rig whose gateway calls it with the real key.
async fn with_provider() -> (Provider, Rig) {
    let (provider, url) = Provider::start().await;
    let rig = Rig::sim(
        &[],
        &[
            ("ANTHROPIC_API_KEY", REAL_KEY),
            ("ROUTD_ANTHROPIC_URL", url.as_str()),
        ],
    )
    .await;
    (provider, rig)
}

impl Provider {
    async fn start() -> (Provider, String) {
        let p = Provider::default();
        let state = p.clone();
        let app = axum::Router::new().route(
            "/v1/messages",
            axum::routing::post(move |headers: HeaderMap, body: axum::body::Bytes| {
                let st = state.clone();
                async move {
                    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                    st.seen.lock().unwrap().push(Seen {
                        headers: headers.clone(),
                        body: body.clone(),
                    });
                    // A provider that does not take routd's key (revoked, mistyped).
                    if body["model"] == "refuse-key" {
                        return axum::response::Response::builder()
                            .status(401)
                            .header("content-type", "application/json")
                            .body(axum::body::Body::from(
                                r#"{"type":"error","error":{"type":"authentication_error","message":"invalid x-api-key ...6789"}}"#,
                            ))
                            .unwrap();
                    }
                    // A provider having a bad day, on request.
                    if body["model"] == "overloaded" {
                        return axum::response::Response::builder()
                            .status(529)
                            .header("content-type", "application/json")
                            .body(axum::body::Body::from(
                                r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
                            ))
                            .unwrap();
                    }
                    let sse = Provider::script(&body);
                    if body["stream"] == true {
                        let parts: Vec<String> = sse.split(PAUSE).map(str::to_owned).collect();
                        let stream = futures_util::stream::iter(parts.into_iter().enumerate())
                            .then(|(i, part)| async move {
                                if i > 0 {
                                    tokio::time::sleep(Duration::from_millis(500)).await;
                                }
                                Ok::<_, std::io::Error>(axum::body::Bytes::from(part))
                            });
                        return axum::response::Response::builder()
                            .header("content-type", "text/event-stream")
                            .header("request-id", "req_stub")
                            .body(axum::body::Body::from_stream(stream))
                            .unwrap();
                    }
                    let sse = sse.replace(PAUSE, "");
                    // Not streamed: the same answer as one message.
                    let text = sse
                        .lines()
                        .filter_map(|l| l.strip_prefix("data: "))
                        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
                        .filter_map(|v| v["delta"]["text"].as_str().map(str::to_owned))
                        .collect::<String>();
                    let m = json!({"id": "msg_1", "type": "message", "role": "assistant",
                        "model": "stub", "content": [{"type": "text", "text": text}],
                        "stop_reason": "end_turn", "stop_sequence": null,
                        "usage": {"input_tokens": 50, "output_tokens": 20}});
                    axum::response::Response::builder()
                        .header("content-type", "application/json")
                        .body(axum::body::Body::from(m.to_string()))
                        .unwrap()
                }
            }),
        );
        let state = p.clone();
        let app = app.route(
            "/v1/chat/completions",
            axum::routing::post(move |headers: HeaderMap, body: axum::body::Bytes| {
                let st = state.clone();
                async move {
                    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                    st.seen.lock().unwrap().push(Seen {
                        headers: headers.clone(),
                        body: body.clone(),
                    });
                    axum::response::Response::builder()
                        .header("content-type", "text/event-stream")
                        .body(axum::body::Body::from(Provider::openai_script(&body)))
                        .unwrap()
                }
            }),
        );
        let state = p.clone();
        let app = app.route(
            "/v1/responses",
            axum::routing::post(move |headers: HeaderMap, body: axum::body::Bytes| {
                let st = state.clone();
                async move {
                    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                    st.seen.lock().unwrap().push(Seen {
                        headers: headers.clone(),
                        body: body.clone(),
                    });
                    Provider::responses(&body)
                }
            }),
        );
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", l.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(l, app).await });
        (p, url)
    }

    /// The Responses model: "You said: <the input's text>", streamed in two deltas or whole.
    fn responses(body: &Value) -> axum::response::Response {
        let said = match &body["input"] {
            Value::String(s) => s.clone(),
            v => v.to_string(),
        };
        let text = format!("You said: {said}");
        let message = json!({"type": "message", "id": "msg_1", "role": "assistant",
            "status": "completed", "content": [{"type": "output_text", "text": text, "annotations": []}]});
        let done = json!({"id": "resp_1", "object": "response", "created_at": 1, "status": "completed",
            "model": body["model"], "output": [message], "parallel_tool_calls": false,
            "tool_choice": "auto", "tools": [],
            "usage": {"input_tokens": 30, "input_tokens_details": {"cached_tokens": 10},
                "output_tokens": 12, "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 42}});
        if body["stream"] != true {
            return axum::response::Response::builder()
                .header("content-type", "application/json")
                .body(axum::body::Body::from(done.to_string()))
                .unwrap();
        }
        let mut created = done.clone();
        created["status"] = json!("in_progress");
        created["output"] = json!([]);
        created["usage"] = Value::Null;
        let (a, b) = text.split_at(9);
        let mut seq = 0;
        let mut ev = |v: Value| {
            let mut v = v;
            v["sequence_number"] = json!(seq);
            seq += 1;
            format!("event: {}\ndata: {v}\n\n", v["type"].as_str().unwrap())
        };
        let sse = [
            ev(json!({"type": "response.created", "response": created})),
            ev(json!({"type": "response.output_item.added", "output_index": 0,
                "item": {"type": "message", "id": "msg_1", "role": "assistant", "status": "in_progress", "content": []}})),
            ev(json!({"type": "response.content_part.added", "item_id": "msg_1", "output_index": 0,
                "content_index": 0, "part": {"type": "output_text", "text": "", "annotations": []}})),
            ev(json!({"type": "response.output_text.delta", "item_id": "msg_1", "output_index": 0,
                "content_index": 0, "delta": a, "logprobs": []})),
            ev(json!({"type": "response.output_text.delta", "item_id": "msg_1", "output_index": 0,
                "content_index": 0, "delta": b, "logprobs": []})),
            ev(json!({"type": "response.output_text.done", "item_id": "msg_1", "output_index": 0,
                "content_index": 0, "text": text, "logprobs": []})),
            ev(json!({"type": "response.output_item.done", "output_index": 0, "item": message})),
            ev(json!({"type": "response.completed", "response": done})),
        ]
        .concat();
        axum::response::Response::builder()
            .header("content-type", "text/event-stream")
            .body(axum::body::Body::from(sse))
            .unwrap()
    }

    /// What the model says next, from the conversation so far.
    fn script(body: &Value) -> String {
        let last = body["messages"]
            .as_array()
            .and_then(|m| m.last())
            .cloned()
            .unwrap_or(Value::Null);
        // Content is a string or a list of blocks.
        let first = match &last["content"] {
            Value::String(t) => json!({"type": "text", "text": t}),
            c => c[0].clone(),
        };
        match (first["type"].as_str(), first["text"].as_str()) {
            (Some("text"), Some(t)) if t.contains("use your tools") => answer(
                &["Let me look at the chat first."],
                &[("tu_1", "get_history", json!({"limit": 5}))],
                100,
            ),
            (Some("tool_result"), _) => {
                // Which call this answers: the assistant's turn before it says.
                let msgs = body["messages"].as_array().unwrap();
                let call = &msgs[msgs.len() - 2]["content"];
                let name = call
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|b| b["type"] == "tool_use")
                    .map(|b| b["name"].as_str().unwrap_or("").to_owned())
                    .unwrap_or_default();
                if name == "get_history" {
                    let seen_hello = first["content"]
                        .as_str()
                        .unwrap_or("")
                        .contains("use your tools");
                    answer(
                        &[],
                        &[(
                            "tu_2",
                            "send_message",
                            json!({"text": format!("a side note (history had my prompt: {seen_hello})")}),
                        )],
                        120,
                    )
                } else {
                    answer(&["Done, after two tools."], &[], 140)
                }
            }
            (_, Some(t)) => answer(&[&format!("You said: {t}")], &[], 50),
            _ => answer(&["?"], &[], 10),
        }
    }

    /// The OpenAI-compatible model: a tool call, then an answer naming what the tool said.
    fn openai_script(body: &Value) -> String {
        let last = body["messages"]
            .as_array()
            .and_then(|m| m.last())
            .cloned()
            .unwrap_or(Value::Null);
        let mut out = String::new();
        let mut chunk = |v: Value| out.push_str(&format!("data: {v}\n\n"));
        if last["role"] == "tool" {
            let saw = last["content"]
                .as_str()
                .unwrap_or("")
                .contains("use your tools");
            chunk(
                json!({"choices": [{"index": 0, "delta": {"role": "assistant", "content": "Done "}}]}),
            );
            chunk(
                json!({"choices": [{"index": 0, "delta": {"content": format!("via OpenAI (history had my prompt: {saw}).")}}]}),
            );
            chunk(json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}));
        } else {
            chunk(
                json!({"choices": [{"index": 0, "delta": {"role": "assistant", "content": "Checking."}}]}),
            );
            chunk(
                json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "call_1",
                "type": "function", "function": {"name": "get_history", "arguments": "{\"lim"}}]}}]}),
            );
            chunk(
                json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0,
                "function": {"arguments": "it\": 5}"}}]}}]}),
            );
            chunk(json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}));
        }
        if body["stream_options"]["include_usage"] == true {
            chunk(json!({"choices": [], "usage": {"prompt_tokens": 40, "completion_tokens": 10}}));
        }
        out.push_str("data: [DONE]\n\n");
        out
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

/// The text of an Anthropic event stream, its deltas put together.
fn streamed_text(body: &str) -> String {
    body.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter_map(|v| v["delta"]["text"].as_str().map(str::to_owned))
        .collect()
}

/// A group whose agent uses the model, and a route for `chat`.
async fn llm_group(rig: &Rig, folder: &str, chat: &str, daily_tokens: Option<u64>) {
    let mut llm = json!({"model": "claude-stub-1"});
    if let Some(n) = daily_tokens {
        llm["daily_tokens"] = json!(n);
    }
    let cfg: GroupConfig = serde_json::from_value(
        json!({"name": folder, "system_prompt": "You are a test.", "group": {"llm": llm}}),
    )
    .unwrap();
    let (s, v) = rig
        .send(&rig.operator, routd::put_group(folder, &cfg))
        .await;
    assert!(s == 201 || s == 200, "{v}");
    rig.route(chat, folder).await;
}

/// Every file under `dir`, read whole (the secret search).
fn files_containing(dir: &std::path::Path, needle: &str) -> (usize, Vec<String>) {
    let mut read = 0;
    let mut hits = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let ft = e.file_type().unwrap();
            if ft.is_dir() {
                stack.push(e.path());
            } else if ft.is_file() {
                let bytes = std::fs::read(e.path()).unwrap();
                read += 1;
                if bytes.windows(needle.len()).any(|w| w == needle.as_bytes()) {
                    hits.push(e.path().display().to_string());
                }
            }
        }
    }
    (read, hits)
}

/// The agent's LLM brain runs a multi-step tool-use conversation through the gateway: its
/// text before a tool call reaches the chat at once, its `send_message` call lands in the
/// chat, the model gets the tools' results, and its final answer is the last reply. The real
/// key is seen only by the provider; usage is recorded per turn and group.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_llm_brain_uses_tools_through_the_gateway() {
    let (provider, rig) = with_provider().await;
    let chat = "tg:llm-1";
    llm_group(&rig, "llm", chat, None).await;
    rig.say(chat, "q-1", "please use your tools").await;
    let h = rig
        .wait_for(chat, "three replies from the model", |h| {
            replies(h).len() >= 3
        })
        .await;
    // The text before the tool call travels with the run's output (stdout, runed, its event
    // stream); the tool's message goes straight to routd: the two are not ordered with each
    // other (on a busy machine the side note can land first). The final answer is last.
    let mut got = replies(&h);
    assert_eq!(got.len(), 3, "{h:#?}");
    assert_eq!(got.pop().unwrap(), "Done, after two tools.", "{h:#?}");
    got.sort();
    assert_eq!(
        got,
        vec![
            "Let me look at the chat first.".to_owned(),
            "a side note (history had my prompt: true)".to_owned(),
        ],
        "{h:#?}"
    );

    // What the provider saw: three streaming requests, each with the real key, the model,
    // the system prompt, and the turn's tools with their schemas.
    let seen = provider.seen();
    assert_eq!(seen.len(), 3, "{seen:#?}");
    for s in &seen {
        assert_eq!(s.headers["x-api-key"], REAL_KEY);
        assert!(s.headers.get("authorization").is_none());
        assert_eq!(s.headers["anthropic-version"], "2023-06-01");
        assert_eq!(s.body["model"], "claude-stub-1");
        assert_eq!(s.body["system"], "You are a test.");
        assert_eq!(s.body["stream"], true);
        let tools: Vec<&str> = s.body["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["name"].as_str().unwrap())
            .collect();
        assert!(
            tools.contains(&"send_message") && tools.contains(&"get_history"),
            "{tools:?}"
        );
        assert!(
            s.body["tools"][0]["input_schema"]["type"] == "object",
            "{}",
            s.body["tools"][0]
        );
    }
    let results: Vec<&Value> = seen[1..]
        .iter()
        .map(|s| {
            let m = s.body["messages"].as_array().unwrap();
            &m[m.len() - 1]["content"][0]
        })
        .collect();
    assert_eq!(results[0]["type"], "tool_result");
    assert_eq!(results[0]["tool_use_id"], "tu_1");
    assert_eq!(results[0]["is_error"], false);
    assert_eq!(results[1]["tool_use_id"], "tu_2");

    // Usage: 3 calls, 100 + 120 + 140 in, 3 × 20 out, for the group and the turn.
    let usage = eventually("three calls' usage recorded", LIMIT, || async {
        let (s, v) = rig.api().get(&rig.operator, "/v1/usage?folder=llm").await;
        assert_eq!(s, 200, "{v}");
        if v["calls"] == 3 { Ok(v) } else { Err(v) }
    })
    .await;
    assert_eq!(
        (&usage["input_tokens"], &usage["output_tokens"]),
        (&json!(360), &json!(60)),
        "{usage}"
    );
    assert_eq!(usage["rows"][0]["model"], "claude-stub-1");
    assert_eq!(usage["rows"][0]["api"], "anthropic");
    let metrics = rig.metrics().await;
    assert!(
        metrics.contains("routd_llm_tokens_total{api=\"anthropic\",kind=\"input\"} 360"),
        "{metrics}"
    );

    // The real key is nowhere on disk: not in the data directory (databases, logs, the
    // agent's home and session), and the socket is gone with the turn.
    let (read, hits) = files_containing(&rig.dir.path().join("data"), REAL_KEY);
    assert!(read > 5, "the search read {read} files");
    assert!(hits.is_empty(), "the key is in {hits:?}");
    let sock = rig.data().join("folders/llm/ipc/api.sock");
    // The last reply reaches the chat a moment before the turn's end closes its sockets.
    socket_gone(&sock).await;

    // A follow-up turn resumes the session: the model sees the earlier exchange.
    rig.say(chat, "q-2", "and now?").await;
    rig.wait_for(chat, "the fourth reply", |h| replies(h).len() >= 4)
        .await;
    let last = provider.seen().pop().unwrap();
    let msgs = last.body["messages"].as_array().unwrap();
    assert!(msgs.len() >= 6, "the session carried over: {msgs:#?}");
    assert_eq!(msgs[0]["content"][0]["text"], "please use your tools");
    rig.stop().await;
}

/// The LLM brain in the OpenAI-compatible format (`llm.api: openai`): the same tool-use loop
/// through the gateway's `/v1/chat/completions`, the key sent as a bearer, usage read from the
/// stream's last chunk (which the gateway asks for).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_llm_brain_speaks_the_openai_format_too() {
    let (provider, url) = Provider::start().await;
    let rig = Rig::sim(
        &[],
        &[
            ("OPENAI_API_KEY", "sk-openai-real-0123456789"),
            ("ROUTD_OPENAI_URL", url.as_str()),
        ],
    )
    .await;
    let chat = "tg:openai";
    rig.put_group(
        "oai",
        json!({"name": "oai", "group": {"llm": {"model": "gpt-stub", "api": "openai"}}}),
    )
    .await;
    rig.route(chat, "oai").await;
    rig.say(chat, "o-1", "please use your tools").await;
    let h = rig
        .wait_for(chat, "two replies", |h| replies(h).len() >= 2)
        .await;
    assert_eq!(
        replies(&h),
        vec![
            "Checking.".to_owned(),
            "Done via OpenAI (history had my prompt: true).".to_owned()
        ],
        "{h:#?}"
    );
    let seen = provider.seen();
    assert_eq!(seen.len(), 2);
    for s in &seen {
        assert_eq!(
            s.headers["authorization"],
            "Bearer sk-openai-real-0123456789"
        );
        assert_eq!(s.body["model"], "gpt-stub");
        assert_eq!(s.body["stream_options"]["include_usage"], true);
        assert!(
            s.body["tools"][0]["function"]["name"].is_string(),
            "{}",
            s.body
        );
    }
    let msgs = seen[1].body["messages"].as_array().unwrap();
    assert_eq!(
        msgs[msgs.len() - 2]["tool_calls"][0]["function"]["name"],
        "get_history"
    );
    assert_eq!(msgs[msgs.len() - 1]["role"], "tool");
    let v = eventually("two calls' usage recorded", LIMIT, || async {
        let (_, v) = rig.api().get(&rig.operator, "/v1/usage?folder=oai").await;
        if v["calls"] == 2 { Ok(v) } else { Err(v) }
    })
    .await;
    assert_eq!(
        (&v["input_tokens"], &v["output_tokens"]),
        (&json!(80), &json!(20)),
        "{v}"
    );
    assert_eq!(v["rows"][0]["api"], "openai");
    rig.stop().await;
}

/// A group's daily budget: once spent, the gateway answers 429 and the agent reports it as
/// an error the chat sees; the provider is not called.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_spent_budget_reaches_the_chat_as_an_error() {
    let (provider, rig) = with_provider().await;
    let chat = "tg:budget";
    llm_group(&rig, "thrifty", chat, Some(60)).await;
    rig.say(chat, "b-1", "hello").await;
    rig.wait_for(chat, "the first answer", |h| !replies(h).is_empty())
        .await;
    // 50 + 20 tokens: over the 60 of the day.
    rig.say(chat, "b-2", "hello again").await;
    let h = rig
        .wait_for(chat, "the budget error", |h| replies(h).len() >= 2)
        .await;
    let r = replies(&h);
    assert_eq!(r[0], "You said: hello");
    assert!(
        r[1].contains("429") && r[1].contains("70 of its 60 tokens"),
        "{r:?}"
    );
    assert_eq!(
        provider.seen().len(),
        1,
        "the provider was not called again"
    );
    let metrics = rig.metrics().await;
    assert!(
        metrics
            .contains("routd_llm_requests_total{api=\"anthropic\",result=\"budget_exhausted\"} 1"),
        "{metrics}"
    );
    rig.stop().await;
}

/// A tenant's sub-group spends its parent's budget: budgets hold for a group's whole subtree,
/// so making groups mints no tokens (each sub-group had a fresh daily budget before).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tenants_sub_group_spends_its_parents_budget() {
    let (provider, rig) = with_provider().await;
    llm_group(&rig, "parent", "tg:parent", Some(60)).await;
    let tenant = rig
        .mint(&["groups:write", "groups:read"], Some("parent"), 600)
        .await;
    let (s, v) = rig
        .api()
        .put(&tenant, "/v1/groups/parent%2Fkid", json!({"name": "kid"}))
        .await;
    assert_eq!(s, 201, "{v}");
    rig.route("tg:kid", "parent/kid").await;
    rig.say("tg:parent", "p-1", "hello").await;
    rig.wait_for("tg:parent", "the parent's answer", |h| {
        !replies(h).is_empty()
    })
    .await;
    // 70 tokens spent by the parent: the kid's turn finds the parent's budget spent.
    rig.say("tg:kid", "k-1", "hello").await;
    let h = rig
        .wait_for("tg:kid", "the budget error", |h| !replies(h).is_empty())
        .await;
    let r = replies(&h);
    assert!(
        r[0].contains("group parent has used 70 of its 60 tokens"),
        "{r:?}"
    );
    assert_eq!(
        provider.seen().len(),
        1,
        "the kid's call never reached the provider"
    );
    rig.stop().await;
}

/// A provider that refuses routd's key: no retry can fix that, so the turn ends at once, after
/// one provider call (it took 12 calls and 43 s of retries by the agent and by routd), and
/// the chat's notice and the turn's error name the variable the operator must fix. The next
/// message is a new turn that asks the provider once again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_refused_provider_key_ends_the_turn_at_once_naming_the_variable() {
    let (provider, rig) = with_provider().await;
    let chat = "tg:badkey";
    rig.put_group(
        "badkey",
        json!({"name": "badkey", "group": {"llm": {"model": "refuse-key"}}}),
    )
    .await;
    rig.route(chat, "badkey").await;
    rig.say(chat, "k-1", "hello").await;
    let h = rig
        .wait_for(chat, "the notice", |h| !notices(h).is_empty())
        .await;
    let n = notices(&h);
    assert_eq!(n.len(), 1, "{n:?}");
    assert!(
        n[0].contains("ANTHROPIC_API_KEY") && n[0].contains("refused"),
        "{n:?}"
    );
    assert!(!n[0].contains("6789"), "never the provider's words: {n:?}");
    assert_eq!(provider.seen().len(), 1, "one provider call");
    let turn = rig.turn(h[0].turn_id.as_deref().unwrap()).await;
    // Over after its first try (`done` when the agent's error reached the chat as a reply).
    assert!(
        matches!(turn["state"].as_str(), Some("done" | "failed")) && turn["attempt"] == 1,
        "ended at once, never tried again: {turn}"
    );
    assert!(
        turn["error"]
            .as_str()
            .is_some_and(|e| e.contains("ANTHROPIC_API_KEY")),
        "{turn}"
    );
    // One run on runed.
    let runed = hako_shared::testing::ApiClient::new(rig.runed_url());
    let (_, v) = runed.get(&rig.operator, "/v1/sessions?folder=badkey").await;
    assert_eq!(v["sessions"].as_array().unwrap().len(), 1, "{v}");
    // The cut-off is the turn's: the next message asks again (the operator may have fixed it).
    rig.wait_idle("badkey").await;
    rig.say(chat, "k-2", "again").await;
    rig.wait_for(chat, "the second notice", |h| notices(h).len() == 2)
        .await;
    assert_eq!(provider.seen().len(), 2, "one call per turn");
    rig.stop().await;
}

/// The gateway on a live turn's socket, called from outside: only this turn's spawn token
/// passes; another folder's, a user token, an expired one, a revoked one, none: 401; a
/// provider without a key: 503 naming the variable; a provider that is down: 502.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_gateway_lets_only_the_turns_token_through() {
    let (provider, url) = Provider::start().await;
    // The OpenAI side points at a port nobody listens on (port 1: a port freed by the test
    // could be taken by another test's server meanwhile).
    let dead_url = "http://127.0.0.1:1".to_owned();
    let rig = Rig::sim(
        LONG_RUNS,
        &[
            ("ANTHROPIC_API_KEY", REAL_KEY),
            ("ROUTD_ANTHROPIC_URL", url.as_str()),
            ("OPENAI_API_KEY", "sk-openai-real-0123456789"),
            ("ROUTD_OPENAI_URL", dead_url.as_str()),
            ("ROUTD_LLM_BODY_LIMIT", "64k"),
            ("ROUTD_LLM_MAX_CALLS", "2"),
        ],
    )
    .await;
    // A script-brain turn that stays live while the test calls its gateway.
    for f in ["live", "other"] {
        let cfg: GroupConfig = serde_json::from_value(json!({"name": f})).unwrap();
        let (s, v) = rig.send(&rig.operator, routd::put_group(f, &cfg)).await;
        assert_eq!(s, 201, "{v}");
    }
    let turn = rig.running_turn("live").await;
    let turn_id = turn["turn_id"].as_str().unwrap().to_owned();
    let run_id = turn["run_id"].as_str().unwrap().to_owned();
    let sock = rig.data().join("folders/live/ipc/api.sock");
    assert!(sock.exists());
    let try_id = format!("{turn_id}.1");
    let spawn = |folder: &'static str, ttl: u64| rig.spawn_token(folder, &try_id, &run_id, ttl);
    let http = reqwest::Client::builder()
        .no_proxy()
        .unix_socket(sock.clone())
        .build()
        .unwrap();
    let call = |path: &'static str, header: Option<(&'static str, String)>, body: Value| {
        let http = http.clone();
        async move {
            let mut r = http.post(format!("http://gateway{path}")).json(&body);
            if let Some((k, v)) = header {
                r = r.header(k, v);
            }
            let r = r.send().await.unwrap();
            let status = r.status().as_u16();
            let ct = r
                .headers()
                .get("content-type")
                .map(|v| v.to_str().unwrap().to_owned())
                .unwrap_or_default();
            (status, ct, r.text().await.unwrap())
        }
    };
    let msg = json!({"model": "m", "max_tokens": 10, "stream": true,
        "messages": [{"role": "user", "content": "hi"}]});

    // The turn's own spawn token, either header: the stream passes through.
    let own = spawn("live", 300).await;
    let (s, ct, body) = call(
        "/v1/messages",
        Some(("x-api-key", own.token.clone())),
        msg.clone(),
    )
    .await;
    assert_eq!((s, ct.as_str()), (200, "text/event-stream"), "{body}");
    assert_eq!(streamed_text(&body), "You said: hi", "{body}");
    assert!(body.contains("event: message_stop"), "{body}");
    let (s, _, body) = call(
        "/v1/messages",
        Some(("authorization", format!("Bearer {}", own.token))),
        msg.clone(),
    )
    .await;
    assert_eq!(s, 200, "{body}");

    let refused = |s: u16, body: &str, code: &str| {
        let v: Value = serde_json::from_str(body).unwrap_or(Value::Null);
        assert_eq!((s, v["error"].as_str()), (401, Some(code)), "{body}");
    };
    let (s, _, body) = call("/v1/messages", None, msg.clone()).await;
    refused(s, &body, "missing_token");
    let foreign = spawn("other", 300).await;
    let (s, _, body) = call(
        "/v1/messages",
        Some(("x-api-key", foreign.token)),
        msg.clone(),
    )
    .await;
    refused(s, &body, "wrong_turn");
    // Downscoped from runed's token without a run: the scope, the folder, but not a spawn
    // token of this turn.
    let client = AuthdClient::new(&rig.authd_url()).unwrap();
    let runed_token = rig.service_token("runed").await;
    let user = client
        .mint(
            &runed_token,
            &MintRequest {
                scope: vec!["llm:call".into()],
                folder: Some("live".into()),
                ttl_seconds: Some(300),
                ..Default::default()
            },
        )
        .await
        .unwrap()
        .token;
    let (s, _, body) = call("/v1/messages", Some(("x-api-key", user)), msg.clone()).await;
    refused(s, &body, "wrong_turn");
    let (s, _, body) = call(
        "/v1/messages",
        Some(("x-api-key", "not.a.jwt".into())),
        msg.clone(),
    )
    .await;
    refused(s, &body, "invalid_token");
    assert_eq!(
        provider.seen().len(),
        2,
        "no refused call reached the provider"
    );
    let short = spawn("live", 1).await;
    let (s, body) = eventually("the token expires", Duration::from_secs(10), || async {
        let key = Some(("x-api-key", short.token.clone()));
        let (s, _, body) = call("/v1/messages", key, msg.clone()).await;
        if s == 401 { Ok((s, body)) } else { Err(body) }
    })
    .await;
    refused(s, &body, "token_expired");
    let revoked = spawn("live", 300).await;
    client
        .revoke(&rig.operator, &revoked.jti)
        .await
        .expect("revoke");
    let (s, body) = eventually(
        "the revocation arrives",
        Duration::from_secs(15),
        || async {
            let key = Some(("x-api-key", revoked.token.clone()));
            let (s, _, body) = call("/v1/messages", key, msg.clone()).await;
            if s == 401 { Ok((s, body)) } else { Err(body) }
        },
    )
    .await;
    refused(s, &body, "token_revoked");

    // Bad bodies and a provider that is down.
    let before = provider.seen().len();
    let (s, _, body) = call(
        "/v1/messages",
        Some(("x-api-key", own.token.clone())),
        json!([1, 2]),
    )
    .await;
    assert_eq!(s, 400, "{body}");
    let (s, _, body) = call(
        "/v1/chat/completions",
        Some(("authorization", format!("Bearer {}", own.token))),
        json!({"model": "m", "messages": []}),
    )
    .await;
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (s, v["error"].as_str()),
        (502, Some("provider_unreachable")),
        "{body}"
    );
    let (s, _, body) = call(
        "/v1/nope",
        Some(("x-api-key", own.token.clone())),
        json!({}),
    )
    .await;
    assert_eq!(s, 404, "{body}");
    // Over ROUTD_LLM_BODY_LIMIT: 413, the provider never asked.
    let big = json!({"model": "m", "messages": [{"role": "user", "content": "x".repeat(100_000)}]});
    let (s, _, body) = call("/v1/messages", Some(("x-api-key", own.token.clone())), big).await;
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (s, v["error"].as_str()),
        (413, Some("body_too_large")),
        "{body}"
    );
    assert_eq!(
        provider.seen().len(),
        before,
        "none of these reached the provider"
    );
    // The provider's server error: 502 naming its status, which also rides in a header.
    let r = http
        .post("http://gateway/v1/messages")
        .header("x-api-key", &own.token)
        .json(&json!({"model": "overloaded", "max_tokens": 5, "messages": []}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 502);
    assert_eq!(r.headers()["x-hako-provider-status"], "529");
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"], "provider_error", "{v}");
    assert!(
        v["message"].as_str().unwrap().contains("529")
            && v["message"].as_str().unwrap().contains("Overloaded"),
        "{v}"
    );
    // Two calls in flight (streams the stub holds open): a third waits its turn, 429.
    let slow = json!({"model": "m", "max_tokens": 10, "stream": true,
        "messages": [{"role": "user", "content": "please use your tools"}]});
    let mut open = Vec::new();
    for _ in 0..2 {
        let r = http
            .post("http://gateway/v1/messages")
            .header("x-api-key", &own.token)
            .json(&slow)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        open.push(r);
    }
    let (s, _, body) = call(
        "/v1/messages",
        Some(("x-api-key", own.token.clone())),
        msg.clone(),
    )
    .await;
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (s, v["error"].as_str()),
        (429, Some("too_many_calls")),
        "{body}"
    );
    for r in open {
        r.text().await.unwrap();
    }
    // The gateway gives a call's place back as its answer's body ends on its side, which may
    // come just after the client has read the last byte: wait for the place to be free.
    eventually(
        "the calls' places come back",
        Duration::from_secs(30),
        || async {
            let key = Some(("x-api-key", own.token.clone()));
            let body = json!({"model": "m", "max_tokens": 10, "messages": [], "mcp_servers": []});
            let (s, _, body) = call("/v1/messages", key, body).await;
            if s != 429 { Ok(()) } else { Err(body) }
        },
    )
    .await;

    // What the provider would fetch or run for the agent, around its network policy (a
    // server-side tool, an image by URL): refused, never forwarded.
    let before = provider.seen().len();
    for body in [
        json!({"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}],
            "tools": [{"type": "web_fetch_20250910", "name": "web_fetch"}]}),
        json!({"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "url", "url": "http://evil.test/?leak=1"}}]}]}),
        json!({"model": "m", "max_tokens": 10, "messages": [], "mcp_servers": []}),
    ] {
        let (s, _, b) = call("/v1/messages", Some(("x-api-key", own.token.clone())), body).await;
        let v: Value = serde_json::from_str(&b).unwrap();
        assert_eq!((s, v["error"].as_str()), (403, Some("not_allowed")), "{b}");
    }
    assert_eq!(provider.seen().len(), before, "none reached the provider");

    // An agent that hangs up on a stream before its usage is reported is charged the call's
    // estimate (its max_tokens out), not nothing.
    let mut r = http
        .post("http://gateway/v1/messages")
        .header("x-api-key", &own.token)
        .json(
            &json!({"model": "hangup", "max_tokens": 777, "stream": true,
            "messages": [{"role": "user", "content": "please use your tools"}]}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.chunk().await.unwrap().is_some());
    drop(r);
    let row = eventually("the cut call's usage", LIMIT, || async {
        let (_, v) = rig.api().get(&rig.operator, "/v1/usage?folder=live").await;
        v["rows"]
            .as_array()
            .and_then(|rows| rows.iter().find(|r| r["model"] == "hangup"))
            .cloned()
            .ok_or(v)
    })
    .await;
    assert_eq!(
        (&row["calls"], &row["output_tokens"]),
        (&json!(1), &json!(777)),
        "{row}"
    );
    let before = provider.seen().len();

    // The official Anthropic SDK, as an agent would use it: plain and streamed messages, and
    // its authentication error for a bad key.
    let python = tokio::task::spawn_blocking(hako_shared::testing::conformance_python)
        .await
        .unwrap();
    let input = json!({"socket": sock, "token": own.token});
    let sdk = tokio::task::spawn_blocking(move || {
        hako_shared::testing::run_python(&python, include_str!("anthropic_sdk.py"), &input)
    })
    .await
    .unwrap();
    assert_eq!(sdk["plain"]["text"], "You said: from the sdk", "{sdk}");
    assert_eq!(sdk["plain"]["stop_reason"], "end_turn", "{sdk}");
    assert_eq!(
        sdk["stream"]["pieces"],
        json!(["You said:", " streamed"]),
        "the stream arrives in its pieces: {sdk}"
    );
    assert_eq!(sdk["stream"]["output_tokens"], 20, "{sdk}");
    assert_eq!(sdk["refused"]["status"], 401, "{sdk}");
    assert_eq!(sdk["refused"]["body"]["error"], "invalid_token", "{sdk}");
    assert_eq!(provider.seen().len(), before + 2);

    // The turn ends: the socket is gone.
    let (s, v) = rig
        .api()
        .post(
            &rig.operator,
            "/v1/messages",
            json!({"chat_jid": "web:live", "sender": "op", "content": "/stop"}),
        )
        .await;
    assert_eq!(s, 201, "{v}");
    socket_gone(&sock).await;
    rig.stop().await;
}

/// The gateway's Responses API (what Codex speaks) with the official OpenAI SDK as the
/// agent's client: plain and streamed answers pass through; the provider sees the real key,
/// the group's model and `store: false`; the usage of both calls is charged; a bad token is
/// 401, another model and a web search (the provider browsing for a group without network)
/// 403, none of them reaching the provider.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_responses_api_serves_the_official_openai_sdk() {
    const OPENAI_KEY: &str = "sk-openai-real-responses-0123456789";
    let (provider, url) = Provider::start().await;
    let rig = Rig::sim(
        LONG_RUNS,
        &[
            ("OPENAI_API_KEY", OPENAI_KEY),
            ("ROUTD_OPENAI_URL", url.as_str()),
        ],
    )
    .await;
    rig.put_group("resp", json!({"name": "resp"})).await;
    // A script-brain turn that stays live while the SDK calls its gateway; the group gets its
    // model afterwards (the gateway reads the group at each call, the box keeps its brain).
    let turn = rig.running_turn("resp").await;
    rig.put_group(
        "resp",
        json!({"name": "resp", "group": {"llm": {"model": "gpt-stub-1", "api": "openai"}}}),
    )
    .await;
    let turn_id = turn["turn_id"].as_str().unwrap().to_owned();
    let run_id = turn["run_id"].as_str().unwrap().to_owned();
    let sock = rig.data().join("folders/resp/ipc/api.sock");
    let own = rig
        .spawn_token("resp", &format!("{turn_id}.1"), &run_id, 300)
        .await;

    let python = tokio::task::spawn_blocking(hako_shared::testing::conformance_python)
        .await
        .unwrap();
    let input = json!({"socket": sock, "token": own.token, "model": "gpt-stub-1"});
    let sdk = tokio::task::spawn_blocking(move || {
        hako_shared::testing::run_python(&python, include_str!("openai_sdk.py"), &input)
    })
    .await
    .unwrap();
    assert_eq!(sdk["plain"]["text"], "You said: from the sdk", "{sdk}");
    assert_eq!(sdk["plain"]["status"], "completed", "{sdk}");
    assert_eq!(
        (
            &sdk["plain"]["input_tokens"],
            &sdk["plain"]["output_tokens"]
        ),
        (&json!(30), &json!(12)),
        "{sdk}"
    );
    assert_eq!(
        sdk["stream"]["deltas"],
        json!(["You said:", " streamed"]),
        "the stream arrives in its pieces: {sdk}"
    );
    assert_eq!(sdk["stream"]["text"], "You said: streamed", "{sdk}");
    assert_eq!(sdk["stream"]["output_tokens"], 12, "{sdk}");
    // The SDK's `body` of an error is the envelope's `error`: hako's code.
    assert_eq!(sdk["refused"]["status"], 401, "{sdk}");
    assert_eq!(sdk["refused"]["body"], "invalid_token", "{sdk}");
    assert_eq!(sdk["other_model"]["status"], 403, "{sdk}");
    assert_eq!(sdk["other_model"]["body"], "model_not_allowed", "{sdk}");
    assert_eq!(sdk["web_search"]["status"], 403, "{sdk}");
    assert_eq!(sdk["web_search"]["body"], "not_allowed", "{sdk}");

    let seen = provider.seen();
    assert_eq!(
        seen.len(),
        2,
        "only the two good calls reached the provider"
    );
    for s in &seen {
        assert_eq!(s.headers["authorization"], format!("Bearer {OPENAI_KEY}"));
        assert_eq!(s.body["model"], "gpt-stub-1");
        assert_eq!(s.body["store"], false, "nothing is stored at the provider");
    }
    // Both answers are charged from the usage they reported.
    let v = eventually("both calls charged", LIMIT, || async {
        let (_, v) = rig.api().get(&rig.operator, "/v1/usage?folder=resp").await;
        if v["calls"] == 2 { Ok(v) } else { Err(v) }
    })
    .await;
    assert_eq!(
        (&v["input_tokens"], &v["output_tokens"]),
        (&json!(60), &json!(24)),
        "{v}"
    );
    assert_eq!(v["rows"][0]["api"], "openai", "{v}");
    rig.stop().await;
}

/// Without a key for the provider, the gateway says which variable to set.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_provider_without_a_key_is_named() {
    let rig = Rig::sim(&[], &[]).await;
    let chat = "tg:nokey";
    llm_group(&rig, "nokey", chat, None).await;
    rig.say(chat, "n-1", "hello").await;
    let h = rig
        .wait_for(chat, "the configuration error", |h| !replies(h).is_empty())
        .await;
    let r = replies(&h);
    assert!(
        r[0].contains("503") && r[0].contains("ANTHROPIC_API_KEY"),
        "{r:?}"
    );
    rig.stop().await;
}

/// The watch page draws what a group spent: its bar for the day holds the tokens the usage API
/// counts (in real headless Chromium, like `web.rs`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watch_page_charts_the_tokens_a_group_spent() {
    let (_provider, rig) = with_provider().await;
    let chat = "tg:charted";
    llm_group(&rig, "charted", chat, None).await;
    rig.say(chat, "c-1", "hello").await;
    rig.wait_for(chat, "the answer", |h| !replies(h).is_empty())
        .await;
    let (s, u) = rig
        .api()
        .get(&rig.operator, "/v1/usage?folder=charted")
        .await;
    assert_eq!(s, 200, "{u}");
    let tokens = u["input_tokens"].as_u64().unwrap() + u["output_tokens"].as_u64().unwrap();
    assert!(tokens > 0, "{u}");
    let day = u["rows"][0]["day"].as_str().unwrap().to_owned();

    let b = common::browser::Browser::start().await;
    common::browser::sign_in(&rig, &b, None).await;
    b.goto(&format!("{}/web/watch", rig.base())).await;
    let drawn = b
        .wait(
            "the group's bar",
            &format!(
                "const t = [...document.querySelectorAll('#usage svg rect title')] \
                 .map(e => e.textContent).find(t => t.startsWith({})); \
                 return t ? Number(t.split(': ')[1].replace(/[^0-9]/g, '')) : null;",
                serde_json::to_string(&format!("charted {day}: ")).unwrap()
            ),
            LIMIT,
        )
        .await;
    assert_eq!(drawn, json!(tokens));
    let legend = b
        .js(
            "return [...document.querySelectorAll('#usage .legend li')].map(l => l.textContent.trim());",
            json!([]),
        )
        .await;
    assert_eq!(legend, json!(["charted"]));
    b.screenshot(
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../target/web-screenshots/usage.png"),
    )
    .await;
    drop(b);
    rig.stop().await;
}

/// Waits until the turn's gateway socket is removed (its turn ended).
async fn socket_gone(sock: &std::path::Path) {
    eventually(
        "the gateway socket is removed with its turn",
        LIMIT,
        || async { if sock.exists() { Err(()) } else { Ok(()) } },
    )
    .await
}

/// A held `send_message` of the LLM brain outlives routd: SIGKILLed while the person decides,
/// restarted; the brain's MCP client connects again and asks again under the call's name, so
/// the restarted routd waits on the same request; the Approve after the restart sends the
/// message once, and the turn goes on to its answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_held_call_of_the_llm_brain_outlives_a_routd_restart() {
    let (_provider, mut rig) = with_provider().await;
    rig.spawn_routd_binary().await;
    let chat = "tg:llm-hold";
    let (s, v) = rig
        .api()
        .put(
            &rig.operator,
            "/v1/groups/llmhold",
            json!({"name": "llmhold", "grants": ["*", "?send_message"],
                   "approvals": {"wait": "10m"},
                   "group": {"llm": {"model": "claude-stub-1"}}}),
        )
        .await;
    assert_eq!(s, 201, "{v}");
    rig.route(chat, "llmhold").await;
    rig.say(chat, "h-1", "please use your tools").await;
    let id = nth_request(&rig, chat, 1).await;
    rig.kill_and_restart_routd().await;
    let a = rig.approval(&id).await;
    assert_eq!(a["state"], "pending", "{a}");
    rig.decide(&id, true).await;
    rig.wait_for(chat, "the answer after the tools", |h| {
        replies(h).iter().any(|r| r == "Done, after two tools.")
    })
    .await;
    rig.wait_idle("llmhold").await;
    let h = rig.history(chat).await;
    let notes = replies(&h)
        .iter()
        .filter(|r| r.starts_with("a side note"))
        .count();
    assert_eq!(notes, 1, "sent once: {:?}", replies(&h));
    assert_eq!(requests(&h).len(), 1, "asked once in the chat");
    rig.stop().await;
}
