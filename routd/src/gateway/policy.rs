//! What a call through the gateway may ask of the provider, checked before it is forwarded.
//!
//! The agent's network is the operator's choice (`none`, `allowlist`, `open`): the provider
//! must not become a way around it. So a request may not make the provider reach out on the
//! agent's behalf: no server-side tools (web search and fetch, code execution, anything the
//! provider runs itself), no remote MCP servers or containers, no image or document fetched
//! from a URL or read from the operator's file store. The model is the group's when it names
//! one. And what the budget needs is made sure of: `stream` is a boolean, an OpenAI stream
//! reports its usage, and an estimate of the call's size stands in for usage an answer never
//! reported (an agent that hangs up early is still charged).

use hako_shared::runs::LlmApi;
use serde_json::{Map, Value};

use super::usage::Usage;

/// Output tokens assumed for a call that names no limit (OpenAI's is optional).
pub const DEFAULT_MAX_OUTPUT: u64 = 4096;
/// The most any one call is charged, input and output each: a provider's absurd report
/// cannot wedge a group's sums.
pub const MAX_CHARGE: u64 = 1 << 32;

/// Why a request is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    /// A field has the wrong type.
    #[error("{0}")]
    Invalid(String),
    /// Something the provider would run or fetch itself.
    #[error("{0}: the provider would reach out on the agent's behalf, around its network policy")]
    NotAllowed(String),
    /// Not the group's model.
    #[error("this group uses the model {allowed:?}, not {asked:?} (group.llm.model)")]
    Model {
        /// The group's model.
        allowed: String,
        /// The one asked for.
        asked: String,
    },
}

impl PolicyError {
    /// The error code of the refusal.
    pub fn code(&self) -> &'static str {
        match self {
            PolicyError::Invalid(_) => "invalid_request",
            PolicyError::NotAllowed(_) => "not_allowed",
            PolicyError::Model { .. } => "model_not_allowed",
        }
    }
}

/// A request the gateway may forward.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checked {
    /// Whether the agent asked for a stream.
    pub streaming: bool,
    /// What the call is charged when its answer reports no usage.
    pub estimate: Usage,
}

/// Anthropic tool types the client runs itself (the model only asks for them).
const CLIENT_TOOL_PREFIXES: &[&str] = &["bash_", "text_editor_", "computer_", "memory_"];

/// The top-level fields a call may carry, per wire format: what each API needs to talk to a
/// model with client-side tools, and nothing that makes the provider act or fetch on the
/// agent's behalf (server tools, remote MCP, containers, plugins, web search, stored files).
/// Anything else is refused by name: a new field is allowed here, after a look at what it does.
const ANTHROPIC_FIELDS: &[&str] = &[
    "model",
    "messages",
    "system",
    "max_tokens",
    "metadata",
    "stop_sequences",
    "stream",
    "temperature",
    "top_k",
    "top_p",
    "tools",
    "tool_choice",
    "thinking",
    "service_tier",
    // Claude Code's: clearing old thinking blocks, the effort level.
    "context_management",
    "output_config",
];
const OPENAI_FIELDS: &[&str] = &[
    "model",
    "messages",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "n",
    "stream",
    "stream_options",
    "stop",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
    "logprobs",
    "top_logprobs",
    "user",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "response_format",
    "seed",
    "reasoning_effort",
    "verbosity",
    "metadata",
];

/// Content block types of Anthropic messages (at any depth: a tool result holds blocks).
const ANTHROPIC_CONTENT: &[&str] = &[
    "text",
    "image",
    "document",
    "tool_use",
    "tool_result",
    "thinking",
    "redacted_thinking",
    "search_result",
    "tool_reference",
];
/// Content part types of OpenAI messages.
const OPENAI_CONTENT: &[&str] = &["text", "image_url", "input_audio", "file", "refusal"];

/// Model names that browse the web for the agent (search-augmented models, OpenRouter's
/// `:online`): refused for groups without a network, whose agents must reach nothing.
fn fetches_for_the_agent(model: &str) -> bool {
    let m = model.to_ascii_lowercase();
    m.contains("search") || m.ends_with(":online") || m.starts_with("sonar") || m.contains("/sonar")
}

/// Checks and normalises `body` (a JSON object) for `path` in `api`'s format, `body_len`
/// bytes long; `model` is the group's model when it names one; `networked` whether the
/// group's agent may reach a network at all (`allowlist` or `open`).
pub fn check(
    api: LlmApi,
    path: &str,
    body: &mut Map<String, Value>,
    body_len: usize,
    model: Option<&str>,
    networked: bool,
) -> Result<Checked, PolicyError> {
    if let Some(allowed) = model.filter(|m| !m.is_empty()) {
        let asked = body.get("model").and_then(Value::as_str).unwrap_or("");
        if asked != allowed {
            return Err(PolicyError::Model {
                allowed: allowed.to_owned(),
                asked: asked.chars().take(128).collect(),
            });
        }
    }
    let asked = body.get("model").and_then(Value::as_str).unwrap_or("");
    if !networked && fetches_for_the_agent(asked) {
        return Err(PolicyError::NotAllowed(format!(
            "the model {:?} browses the web, and this group has no network",
            asked.chars().take(128).collect::<String>()
        )));
    }
    let streaming = match body.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(PolicyError::Invalid("stream must be true or false".into())),
    };
    let allowed = match api {
        LlmApi::Anthropic => ANTHROPIC_FIELDS,
        LlmApi::Openai => OPENAI_FIELDS,
    };
    if let Some(f) = body.keys().find(|k| !allowed.contains(&k.as_str())) {
        return Err(PolicyError::NotAllowed(format!(
            "the field {:?} (not one the gateway forwards)",
            f.chars().take(64).collect::<String>()
        )));
    }
    if let Some(tools) = body.get("tools") {
        let Some(tools) = tools.as_array() else {
            return Err(PolicyError::Invalid("tools must be an array".into()));
        };
        for t in tools {
            let ty = t.get("type").and_then(Value::as_str);
            let client = match api {
                LlmApi::Anthropic => ty.is_none_or(|ty| {
                    ty == "custom" || CLIENT_TOOL_PREFIXES.iter().any(|p| ty.starts_with(p))
                }),
                LlmApi::Openai => matches!(ty, Some("function" | "custom")),
            };
            if !client {
                return Err(PolicyError::NotAllowed(format!(
                    "the tool type {:?}",
                    ty.unwrap_or("")
                )));
            }
        }
    }
    for key in ["messages", "system"] {
        if let Some(v) = body.get(key) {
            fetched_content(api, v)?;
        }
    }
    content_types(api, body)?;
    if api == LlmApi::Openai && streaming {
        // An OpenAI stream reports usage only when asked: always ask, so the budget holds.
        let opts = body
            .entry("stream_options")
            .or_insert_with(|| Value::Object(Map::new()));
        if !opts.is_object() {
            *opts = Value::Object(Map::new());
        }
        if let Some(o) = opts.as_object_mut() {
            o.insert("include_usage".into(), Value::Bool(true));
        }
    }
    Ok(Checked {
        streaming,
        estimate: estimate(api, path, body, body_len),
    })
}

/// The type of every content block (of the system prompt, of each message, of each tool
/// result) must be one the format has for inline content: a block type the gateway does not
/// know (a server tool's result, a video or audio by URL) is refused. Only blocks are looked
/// at, never a tool call's own input, which is the model's data.
fn content_types(api: LlmApi, body: &Map<String, Value>) -> Result<(), PolicyError> {
    let known = match api {
        LlmApi::Anthropic => ANTHROPIC_CONTENT,
        LlmApi::Openai => OPENAI_CONTENT,
    };
    fn blocks(known: &[&str], list: &Value) -> Result<(), PolicyError> {
        let Some(items) = list.as_array() else {
            return Ok(());
        };
        for b in items {
            let ty = b.get("type").and_then(Value::as_str).unwrap_or("");
            if !known.contains(&ty) {
                return Err(PolicyError::NotAllowed(format!(
                    "{:?} content",
                    ty.chars().take(64).collect::<String>()
                )));
            }
            if ty == "tool_result" {
                blocks(known, b.get("content").unwrap_or(&Value::Null))?;
            }
        }
        Ok(())
    }
    if let Some(system) = body.get("system") {
        blocks(known, system)?;
    }
    for m in body
        .get("messages")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        blocks(known, m.get("content").unwrap_or(&Value::Null))?;
    }
    Ok(())
}

/// Refuses content the provider would fetch: an Anthropic `image`/`document` whose source is a URL
/// or a stored file, an OpenAI image, audio or file given by URL or stored. Nesting is
/// bounded by the JSON parser's own depth limit.
fn fetched_content(api: LlmApi, v: &Value) -> Result<(), PolicyError> {
    match v {
        Value::Array(items) => {
            for i in items {
                fetched_content(api, i)?;
            }
        }
        Value::Object(o) => {
            let ty = o.get("type").and_then(Value::as_str);
            match api {
                LlmApi::Anthropic => {
                    let ty = ty.unwrap_or("");
                    let source = o
                        .get("source")
                        .and_then(|s| s.get("type"))
                        .and_then(Value::as_str);
                    if matches!(ty, "image" | "document")
                        && !matches!(source, Some("base64" | "text" | "content"))
                    {
                        return Err(PolicyError::NotAllowed(format!(
                            "{ty} content from a {} (send it inline)",
                            source.unwrap_or("source of no type")
                        )));
                    }
                }
                LlmApi::Openai => {
                    let ty = ty.unwrap_or("");
                    if ty == "image_url" {
                        let url = o
                            .get("image_url")
                            .and_then(|u| u.get("url").or(Some(u)))
                            .and_then(Value::as_str)
                            .unwrap_or("");
                        if !url.starts_with("data:") {
                            return Err(PolicyError::NotAllowed(
                                "an image given by URL (send it inline as a data: URL)".into(),
                            ));
                        }
                    }
                    if ty == "file" {
                        let f = o.get("file");
                        if f.and_then(|f| f.get("file_id")).is_some()
                            || f.and_then(|f| f.get("file_data")).is_none()
                        {
                            return Err(PolicyError::NotAllowed(
                                "a file not given inline (file_data)".into(),
                            ));
                        }
                    }
                }
            }
            for (_, child) in o {
                if child.is_array() || child.is_object() {
                    fetched_content(api, child)?;
                }
            }
        }
        _ => {}
    }
    Ok(())
}

/// What the call would cost at most, roughly: its body's bytes / 4 in, its output limit
/// (times its choices) out. Counting tokens costs nothing.
fn estimate(api: LlmApi, path: &str, body: &Map<String, Value>, body_len: usize) -> Usage {
    if path.ends_with("/count_tokens") {
        return Usage::default();
    }
    let num = |k: &str| body.get(k).and_then(Value::as_u64);
    let out = match api {
        LlmApi::Anthropic => num("max_tokens"),
        LlmApi::Openai => num("max_completion_tokens").or_else(|| num("max_tokens")),
    }
    .unwrap_or(DEFAULT_MAX_OUTPUT);
    let choices = match api {
        LlmApi::Openai => num("n").unwrap_or(1).max(1),
        LlmApi::Anthropic => 1,
    };
    Usage {
        input: (body_len as u64 / 4).min(MAX_CHARGE),
        output: out.saturating_mul(choices).min(MAX_CHARGE),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn run(api: LlmApi, v: Value, model: Option<&str>) -> Result<(Checked, Value), PolicyError> {
        let len = v.to_string().len();
        let mut v = v;
        let c = check(api, "/v1/x", v.as_object_mut().unwrap(), len, model, false)?;
        Ok((c, v))
    }

    #[test]
    fn provider_side_reach_is_refused() {
        use LlmApi::{Anthropic, Openai};
        for (api, body) in [
            (
                Anthropic,
                json!({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}),
            ),
            (
                Anthropic,
                json!({"tools": [{"type": "web_fetch_20250910", "name": "web_fetch"}]}),
            ),
            (
                Anthropic,
                json!({"tools": [{"type": "code_execution_20250825", "name": "x"}]}),
            ),
            (
                Anthropic,
                json!({"mcp_servers": [{"type": "url", "url": "https://x"}]}),
            ),
            (Anthropic, json!({"container": "c"})),
            (
                Anthropic,
                json!({"messages": [{"role": "user", "content": [
                    {"type": "image", "source": {"type": "url", "url": "https://evil/?leak"}}]}]}),
            ),
            (
                Anthropic,
                json!({"messages": [{"role": "user", "content": [{"type": "tool_result",
                    "content": [{"type": "document", "source": {"type": "file", "file_id": "f"}}]}]}]}),
            ),
            (Openai, json!({"web_search_options": {}})),
            (Openai, json!({"tools": [{"type": "web_search_preview"}]})),
            (
                Openai,
                json!({"messages": [{"role": "user", "content": [
                    {"type": "image_url", "image_url": {"url": "https://evil/?leak"}}]}]}),
            ),
            (
                Openai,
                json!({"messages": [{"role": "user", "content": [
                    {"type": "file", "file": {"file_id": "f"}}]}]}),
            ),
            // What a deny-list let through: OpenRouter's plugins, a browsing model, audio and
            // video parts by URL, fields nobody vetted.
            (Openai, json!({"plugins": [{"id": "web"}]})),
            (Openai, json!({"model": "openai/gpt-4o:online"})),
            (Openai, json!({"model": "gpt-4o-search-preview"})),
            (Openai, json!({"model": "perplexity/sonar-pro"})),
            (
                Openai,
                json!({"messages": [{"role": "user", "content": [
                    {"type": "video_url", "video_url": {"url": "http://169.254.169.254/"}}]}]}),
            ),
            (
                Openai,
                json!({"messages": [{"role": "user", "content": [
                    {"type": "audio_url", "audio_url": {"url": "http://10.0.0.1/"}}]}]}),
            ),
            (Anthropic, json!({"unvetted_field": true})),
            (
                Anthropic,
                json!({"messages": [{"role": "user", "content": [
                    {"type": "web_fetch_tool_result", "content": {}}]}]}),
            ),
        ] {
            let e = run(api, body.clone(), None).unwrap_err();
            assert_eq!(e.code(), "not_allowed", "{body}: {e}");
        }
    }

    #[test]
    fn client_tools_and_inline_content_pass() {
        let (c, _) = run(
            LlmApi::Anthropic,
            json!({"model": "m", "max_tokens": 100, "stream": true,
                "tools": [{"name": "get_history", "input_schema": {}},
                          {"type": "custom", "name": "x", "input_schema": {}},
                          {"type": "bash_20250124", "name": "bash"}],
                "system": [{"type": "text", "text": "s"}],
                "messages": [{"role": "user", "content": [
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}},
                    {"type": "text", "text": "a url: https://example.com"}]}]}),
            Some("m"),
        )
        .unwrap();
        assert!(c.streaming);
        assert_eq!(c.estimate.output, 100);
        run(
            LlmApi::Openai,
            json!({"tools": [{"type": "function", "function": {"name": "f"}}],
                "messages": [{"role": "user", "content": [
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}]}]}),
            None,
        )
        .unwrap();
    }

    /// What Claude Code sends passes (the fields of a real request of Claude Code 2.1.327).
    #[test]
    fn claude_codes_requests_pass() {
        run(
            LlmApi::Anthropic,
            json!({"model": "m", "max_tokens": 32000, "stream": true,
                "metadata": {"user_id": "{}"},
                "thinking": {"type": "adaptive", "display": "updates"},
                "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
                "output_config": {"effort": "high"},
                "system": [{"type": "text", "text": "s", "cache_control": {"type": "ephemeral"}}],
                "tools": [{"name": "Bash", "description": "d", "input_schema": {"type": "object"}}],
                "messages": [
                    {"role": "user", "content": [{"type": "text", "text": "hi"}]},
                    {"role": "assistant", "content": [
                        {"type": "thinking", "thinking": "t", "signature": "s"},
                        {"type": "tool_use", "id": "t1", "name": "Bash", "input": {"command": "ls"}}]},
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                        "content": [{"type": "text", "text": "a"},
                                    {"type": "tool_reference", "tool_name": "Read"}]}]},
                    {"role": "system", "content": [{"type": "text", "text": "# Environment"}]}]}),
            Some("m"),
        )
        .unwrap();
    }

    #[test]
    fn a_browsing_model_passes_for_a_networked_group_only() {
        let mut v = json!({"model": "gpt-4o-search-preview"});
        let o = v.as_object_mut().unwrap();
        assert!(check(LlmApi::Openai, "/v1/x", o, 10, None, false).is_err());
        assert!(check(LlmApi::Openai, "/v1/x", o, 10, None, true).is_ok());
    }

    #[test]
    fn stream_and_usage_reporting_cannot_be_switched_off() {
        for bad in [json!(1), json!("true"), json!({})] {
            let e = run(LlmApi::Openai, json!({"stream": bad}), None).unwrap_err();
            assert_eq!(e.code(), "invalid_request");
        }
        for opts in [
            json!(null),
            json!(false),
            json!({"include_usage": false}),
            json!([]),
        ] {
            let (c, v) = run(
                LlmApi::Openai,
                json!({"stream": true, "stream_options": opts}),
                None,
            )
            .unwrap();
            assert!(c.streaming);
            assert_eq!(v["stream_options"]["include_usage"], true, "{v}");
        }
        let (c, v) = run(LlmApi::Openai, json!({"stream": null}), None).unwrap();
        assert!(!c.streaming);
        assert!(v.get("stream_options").is_none());
    }

    #[test]
    fn the_groups_model_is_the_only_one() {
        let e = run(LlmApi::Anthropic, json!({"model": "big"}), Some("small")).unwrap_err();
        assert_eq!(e.code(), "model_not_allowed");
        assert!(e.to_string().contains("small"), "{e}");
        run(LlmApi::Anthropic, json!({"model": "any"}), None).unwrap();
    }

    #[test]
    fn the_estimate_bounds_the_call() {
        let (c, _) = run(
            LlmApi::Openai,
            json!({"n": 3, "max_completion_tokens": 50, "messages": []}),
            None,
        )
        .unwrap();
        assert_eq!(c.estimate.output, 150);
        assert!(c.estimate.input > 0);
        let (c, _) = run(LlmApi::Openai, json!({"messages": []}), None).unwrap();
        assert_eq!(c.estimate.output, DEFAULT_MAX_OUTPUT);
        let (c, _) = run(
            LlmApi::Openai,
            json!({"n": u64::MAX, "max_tokens": u64::MAX}),
            None,
        )
        .unwrap();
        assert_eq!(c.estimate.output, MAX_CHARGE);
        let mut v = json!({"max_tokens": 10});
        let c = check(
            LlmApi::Anthropic,
            "/v1/messages/count_tokens",
            v.as_object_mut().unwrap(),
            1000,
            None,
            false,
        )
        .unwrap();
        assert_eq!(c.estimate, Usage::default());
    }
}
