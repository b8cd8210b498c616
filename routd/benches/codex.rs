//! Codex through hako against Codex on the host: `cargo bench -p hako-routd --bench codex`.
//!
//! The time to the first reply byte of a chat message answered by a `"agent": "codex"` group
//! (a cold turn: runed starts a `hako-codex` container, hako-agent starts Codex's app server,
//! Codex calls the model through routd's gateway; the reply seen on the chat's event stream),
//! the same in a warm box (another group, whose next box runed started after its last turn,
//! with Codex already started in it, its thread open, waiting for the turn), against `codex
//! exec` run directly on the host against the same stub provider (its first stdout byte: the
//! answer), interleaved, `BENCH_TURNS` (7) of each, medians. Where the time goes: from the
//! message to the model's first request (container start and Codex's start), and from the
//! model's answer to the reply in the chat. Targets: warm ≤ 0.5, cold ≤ 1.25 of the host's.
//!
//! A real authd, runed and routd in-process; the stub answers at once, so what is measured is
//! hako and Codex, not a model.

mod cli_agent;

use cli_agent::{Agent, sse};
use serde_json::json;

const MODEL: &str = "gpt-stub-bench";

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let image = hako_deploy::ensure_codex_image().await.expect("image");
        let pipeline = hako_deploy::Pipeline::new(hako_deploy::connect_docker().unwrap());
        let codex = pipeline
            .fetch(&hako_deploy::CODEX_CLI)
            .await
            .expect("the codex binary");
        // The Responses API's stream.
        let item = json!({"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": "hello back", "annotations": []}]});
        let answer = [
            json!({"type": "response.created", "sequence_number": 0, "response": {"id": "r", "object": "response", "status": "in_progress", "output": []}}),
            json!({"type": "response.output_text.delta", "sequence_number": 1, "item_id": "msg_1", "output_index": 0, "content_index": 0, "delta": "hello back"}),
            json!({"type": "response.output_item.done", "sequence_number": 2, "output_index": 0, "item": item}),
            json!({"type": "response.completed", "sequence_number": 3, "response": {"id": "r", "object": "response", "status": "completed", "output": [item],
                "usage": {"input_tokens": 10, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 3, "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 13}}}),
        ]
        .iter()
        .map(|d| sse(d["type"].as_str().unwrap(), d))
        .collect();
        let agent = Agent {
            name: "codex",
            container: "hako-codex",
            host: "codex exec",
            image: ("RUNED_CODEX_IMAGE", image),
            group: json!({"agent": "codex", "llm": {"model": MODEL, "api": "openai"}}),
            provider: |url| {
                vec![
                    ("OPENAI_API_KEY", "sk-bench".into()),
                    ("ROUTD_OPENAI_URL", url.to_owned()),
                ]
            },
            answer,
            targets: "targets cold ≤ 1.25, warm ≤ 0.5",
        };
        let home = tempfile::tempdir().unwrap();
        let work = tempfile::tempdir().unwrap();
        // The host: `codex exec` against the same stub (its first stdout byte is the answer).
        cli_agent::bench(agent, |i, url| {
            let provider = format!(
                "model_providers.bench={{name = \"bench\", base_url = \"{url}/v1\", wire_api = \"responses\", env_key = \"BENCH_KEY\"}}"
            );
            let mut c = tokio::process::Command::new(&codex);
            c.args(["exec", "--skip-git-repo-check", "-m", MODEL])
                .args(["-c", "model_provider=\"bench\"", "-c", &provider])
                .arg("-C")
                .arg(work.path())
                .arg(format!("hello {i}"))
                .env("CODEX_HOME", home.path())
                .env("BENCH_KEY", "sk-bench")
                .stdin(std::process::Stdio::null());
            c
        })
        .await;
    });
}
