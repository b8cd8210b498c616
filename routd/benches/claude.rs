//! Claude Code through hako against Claude Code on the host: `cargo bench -p hako-routd
//! --bench claude`.
//!
//! The time to the first reply byte of a chat message answered by a `"agent": "claude"` group
//! (a cold turn: runed starts a `hako-claude` container, hako-agent starts Claude Code, Claude
//! Code calls the model through routd's gateway; the reply seen on the chat's event stream),
//! the same in a warm box (another group, whose next box runed started after its last turn,
//! with Claude Code already started in it and waiting for the turn),
//! against `claude -p` run directly on the host against the same stub provider (its first
//! stdout byte), interleaved, `BENCH_TURNS` (7) of each, medians. Where the time goes: from
//! the message to the model's first request (container start and Claude Code's start), and
//! from the model's answer to the reply in the chat. Target ratio ≤ 1.25.
//!
//! A real authd, runed and routd in-process; the stub answers at once, so what is measured is
//! hako and Claude Code, not a model.

mod cli_agent;

use cli_agent::{Agent, sse};
use serde_json::json;

const MODEL: &str = "claude-stub-1";

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let image = hako_deploy::ensure_claude_image().await.expect("image");
        let pipeline = hako_deploy::Pipeline::new(hako_deploy::connect_docker().unwrap());
        let claude = pipeline
            .fetch(&hako_deploy::CLAUDE_CODE)
            .await
            .expect("the claude binary");
        let answer = [
            ("message_start", json!({"type": "message_start", "message": {"id": "m", "type": "message", "role": "assistant", "content": [], "model": MODEL, "stop_reason": null, "stop_sequence": null, "usage": {"input_tokens": 10, "output_tokens": 1}}})),
            ("content_block_start", json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})),
            ("content_block_delta", json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "hello back"}})),
            ("content_block_stop", json!({"type": "content_block_stop", "index": 0})),
            ("message_delta", json!({"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": null}, "usage": {"output_tokens": 3}})),
            ("message_stop", json!({"type": "message_stop"})),
        ]
        .iter()
        .map(|(e, d)| sse(e, d))
        .collect();
        let agent = Agent {
            name: "claude code",
            container: "hako-claude",
            host: "claude -p",
            image: ("RUNED_CLAUDE_IMAGE", image),
            group: json!({"agent": "claude", "llm": {"model": MODEL}}),
            provider: |url| {
                vec![
                    ("ANTHROPIC_API_KEY", "sk-bench".into()),
                    ("ROUTD_ANTHROPIC_URL", url.to_owned()),
                ]
            },
            answer,
            targets: "target cold ≤ 1.25",
        };
        let home = tempfile::tempdir().unwrap();
        // The host: `claude -p` against the same stub.
        cli_agent::bench(agent, |i, url| {
            let mut c = tokio::process::Command::new(&claude);
            c.args(["-p", &format!("hello {i}"), "--model", MODEL])
                .env("HOME", home.path())
                .env("ANTHROPIC_BASE_URL", url)
                .env("ANTHROPIC_API_KEY", "sk-bench")
                .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1");
            c
        })
        .await;
    });
}
