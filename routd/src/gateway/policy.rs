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
//!
//! The Responses format has state at the provider, and one key serves every group: nothing
//! may refer to it (`previous_response_id`, `conversation`, stored prompts, item
//! references), nothing may run in the background, and no response is stored
//! (`store: false`, whatever the agent sent), so that no group can read another's by id.

use serde_json::{Map, Value};

use super::format::Format;
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

const RESPONSES_FIELDS: &[&str] = &[
    "model",
    "input",
    "instructions",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "max_output_tokens",
    "max_tool_calls",
    "temperature",
    "top_p",
    "top_logprobs",
    "stream",
    "stream_options",
    "store",
    "include",
    "metadata",
    "reasoning",
    "text",
    "truncation",
    "user",
    "safety_identifier",
    "prompt_cache_key",
    "prompt_cache_retention",
    "service_tier",
    // Codex's: its thread and turn, for the provider's logs.
    "client_metadata",
];
/// What a Responses call may ask to have included in its answer: its own reasoning (Codex
/// keeps it encrypted across calls, since nothing is stored) and log probabilities. The other
/// values are server tools' outputs and stored images.
const RESPONSES_INCLUDE: &[&str] = &[
    "reasoning.encrypted_content",
    "message.output_text.logprobs",
];
/// Item types of a Responses `input`: messages, the client's own tool calls and their
/// outputs, reasoning (encrypted, the provider's own) and a compaction of earlier ones. Not:
/// references to stored items, server tools' calls (web and file search, code interpreter,
/// image generation, computer use, remote MCP).
const RESPONSES_ITEMS: &[&str] = &[
    "message",
    "function_call",
    "function_call_output",
    "custom_tool_call",
    "custom_tool_call_output",
    "local_shell_call",
    "local_shell_call_output",
    "reasoning",
    "compaction",
];
/// Content part types of a Responses message (or of a tool's output).
const RESPONSES_CONTENT: &[&str] = &[
    "input_text",
    "input_image",
    "input_file",
    "output_text",
    "refusal",
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

/// Checks and normalises `body` (a JSON object) in `format`, `body_len` bytes long; `model`
/// is the group's model when it names one; `networked` whether the group's agent may reach a
/// network at all (`allowlist` or `open`).
pub fn check(
    format: Format,
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
    let allowed = match format {
        Format::Messages | Format::CountTokens => ANTHROPIC_FIELDS,
        Format::ChatCompletions => OPENAI_FIELDS,
        Format::Responses => RESPONSES_FIELDS,
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
            client_tool(format, t)?;
        }
    }
    if format == Format::Responses {
        responses(body)?;
    } else {
        for key in ["messages", "system"] {
            if let Some(v) = body.get(key) {
                fetched_content(format, v)?;
            }
        }
        content_types(format, body)?;
    }
    if format == Format::ChatCompletions && streaming {
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
    if format == Format::Responses {
        // Nothing is kept at the provider: one key serves every group.
        body.insert("store".into(), Value::Bool(false));
    }
    Ok(Checked {
        streaming,
        estimate: estimate(format, body, body_len),
    })
}

/// A tool the client runs itself (the model only asks for it): Anthropic's custom and
/// client tools, OpenAI's functions, a Responses namespace of functions (Codex's MCP
/// servers). Anything else is a tool the provider would run.
fn client_tool(format: Format, t: &Value) -> Result<(), PolicyError> {
    let ty = t.get("type").and_then(Value::as_str);
    let client = match format {
        Format::Messages | Format::CountTokens => ty.is_none_or(|ty| {
            ty == "custom" || CLIENT_TOOL_PREFIXES.iter().any(|p| ty.starts_with(p))
        }),
        Format::ChatCompletions => matches!(ty, Some("function" | "custom")),
        Format::Responses => match ty {
            Some("function" | "custom") => true,
            Some("namespace") => {
                for inner in t
                    .get("tools")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    let ty = inner.get("type").and_then(Value::as_str);
                    if !matches!(ty, Some("function" | "custom")) {
                        return Err(PolicyError::NotAllowed(format!(
                            "the tool type {:?} in a namespace",
                            ty.unwrap_or("")
                        )));
                    }
                }
                true
            }
            _ => false,
        },
    };
    if client {
        Ok(())
    } else {
        Err(PolicyError::NotAllowed(format!(
            "the tool type {:?}",
            ty.unwrap_or("")
        )))
    }
}

/// A Responses call's input, tool choice and includes: only inline content of the client's
/// own items (see [`RESPONSES_ITEMS`]).
fn responses(body: &Map<String, Value>) -> Result<(), PolicyError> {
    if let Some(include) = body.get("include") {
        let Some(list) = include.as_array() else {
            return Err(PolicyError::Invalid("include must be an array".into()));
        };
        for v in list {
            let v = v.as_str().unwrap_or("");
            if !RESPONSES_INCLUDE.contains(&v) {
                return Err(PolicyError::NotAllowed(format!(
                    "include {:?}",
                    v.chars().take(64).collect::<String>()
                )));
            }
        }
    }
    if let Some(Value::Object(choice)) = body.get("tool_choice") {
        let ty = choice.get("type").and_then(Value::as_str).unwrap_or("");
        if !matches!(ty, "function" | "custom" | "allowed_tools") {
            return Err(PolicyError::NotAllowed(format!(
                "the tool choice {:?}",
                ty.chars().take(64).collect::<String>()
            )));
        }
    }
    let Some(input) = body.get("input") else {
        return Ok(());
    };
    let items = match input {
        Value::String(_) => return Ok(()),
        Value::Array(items) => items,
        _ => {
            return Err(PolicyError::Invalid(
                "input must be a string or an array".into(),
            ));
        }
    };
    for item in items {
        // A message may leave its type out.
        let ty = match item.get("type").and_then(Value::as_str) {
            Some(t) => t,
            None if item.get("role").is_some() => "message",
            None => "",
        };
        if !RESPONSES_ITEMS.contains(&ty) {
            return Err(PolicyError::NotAllowed(format!(
                "{:?} input",
                ty.chars().take(64).collect::<String>()
            )));
        }
        for key in ["content", "output"] {
            if let Some(Value::Array(parts)) = item.get(key) {
                responses_parts(parts)?;
            }
        }
    }
    Ok(())
}

/// The parts of a Responses message or tool output: known types, images and files inline.
fn responses_parts(parts: &[Value]) -> Result<(), PolicyError> {
    for p in parts {
        let ty = p.get("type").and_then(Value::as_str).unwrap_or("");
        if !RESPONSES_CONTENT.contains(&ty) {
            return Err(PolicyError::NotAllowed(format!(
                "{:?} content",
                ty.chars().take(64).collect::<String>()
            )));
        }
        let stored = p.get("file_id").is_some_and(|f| !f.is_null());
        match ty {
            "input_image" => {
                let url = p.get("image_url").and_then(Value::as_str).unwrap_or("");
                if stored || !url.starts_with("data:") {
                    return Err(PolicyError::NotAllowed(
                        "an image not given inline (send it as a data: URL)".into(),
                    ));
                }
            }
            "input_file" => {
                let by_url = p.get("file_url").is_some_and(|f| !f.is_null());
                if stored || by_url || p.get("file_data").is_none() {
                    return Err(PolicyError::NotAllowed(
                        "a file not given inline (file_data)".into(),
                    ));
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// The type of every content block (of the system prompt, of each message, of each tool
/// result) must be one the format has for inline content: a block type the gateway does not
/// know (a server tool's result, a video or audio by URL) is refused. Only blocks are looked
/// at, never a tool call's own input, which is the model's data.
fn content_types(format: Format, body: &Map<String, Value>) -> Result<(), PolicyError> {
    let known = match format {
        Format::ChatCompletions => OPENAI_CONTENT,
        _ => ANTHROPIC_CONTENT,
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
fn fetched_content(format: Format, v: &Value) -> Result<(), PolicyError> {
    match v {
        Value::Array(items) => {
            for i in items {
                fetched_content(format, i)?;
            }
        }
        Value::Object(o) => {
            let ty = o.get("type").and_then(Value::as_str);
            match format {
                Format::Messages | Format::CountTokens | Format::Responses => {
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
                Format::ChatCompletions => {
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
                    fetched_content(format, child)?;
                }
            }
        }
        _ => {}
    }
    Ok(())
}

/// What the call would cost at most, roughly: its body's bytes / 4 in, its output limit
/// (times its choices) out. Counting tokens costs nothing.
fn estimate(format: Format, body: &Map<String, Value>, body_len: usize) -> Usage {
    let num = |k: &str| body.get(k).and_then(Value::as_u64);
    let out = match format {
        Format::CountTokens => return Usage::default(),
        Format::Messages => num("max_tokens"),
        Format::ChatCompletions => num("max_completion_tokens").or_else(|| num("max_tokens")),
        Format::Responses => num("max_output_tokens"),
    }
    .unwrap_or(DEFAULT_MAX_OUTPUT);
    let choices = match format {
        Format::ChatCompletions => num("n").unwrap_or(1).max(1),
        _ => 1,
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

    fn run(api: Format, v: Value, model: Option<&str>) -> Result<(Checked, Value), PolicyError> {
        let len = v.to_string().len();
        let mut v = v;
        let c = check(api, v.as_object_mut().unwrap(), len, model, false)?;
        Ok((c, v))
    }

    #[test]
    fn provider_side_reach_is_refused() {
        use Format::{ChatCompletions as Openai, Messages as Anthropic};
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
            Format::Messages,
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
            Format::ChatCompletions,
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
            Format::Messages,
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
        assert!(check(Format::ChatCompletions, o, 10, None, false).is_err());
        assert!(check(Format::ChatCompletions, o, 10, None, true).is_ok());
    }

    #[test]
    fn stream_and_usage_reporting_cannot_be_switched_off() {
        for bad in [json!(1), json!("true"), json!({})] {
            let e = run(Format::ChatCompletions, json!({"stream": bad}), None).unwrap_err();
            assert_eq!(e.code(), "invalid_request");
        }
        for opts in [
            json!(null),
            json!(false),
            json!({"include_usage": false}),
            json!([]),
        ] {
            let (c, v) = run(
                Format::ChatCompletions,
                json!({"stream": true, "stream_options": opts}),
                None,
            )
            .unwrap();
            assert!(c.streaming);
            assert_eq!(v["stream_options"]["include_usage"], true, "{v}");
        }
        let (c, v) = run(Format::ChatCompletions, json!({"stream": null}), None).unwrap();
        assert!(!c.streaming);
        assert!(v.get("stream_options").is_none());
    }

    #[test]
    fn the_groups_model_is_the_only_one() {
        let e = run(Format::Messages, json!({"model": "big"}), Some("small")).unwrap_err();
        assert_eq!(e.code(), "model_not_allowed");
        assert!(e.to_string().contains("small"), "{e}");
        run(Format::Messages, json!({"model": "any"}), None).unwrap();
    }

    #[test]
    fn the_estimate_bounds_the_call() {
        let (c, _) = run(
            Format::ChatCompletions,
            json!({"n": 3, "max_completion_tokens": 50, "messages": []}),
            None,
        )
        .unwrap();
        assert_eq!(c.estimate.output, 150);
        assert!(c.estimate.input > 0);
        let (c, _) = run(Format::ChatCompletions, json!({"messages": []}), None).unwrap();
        assert_eq!(c.estimate.output, DEFAULT_MAX_OUTPUT);
        let (c, _) = run(
            Format::ChatCompletions,
            json!({"n": u64::MAX, "max_tokens": u64::MAX}),
            None,
        )
        .unwrap();
        assert_eq!(c.estimate.output, MAX_CHARGE);
        let mut v = json!({"max_tokens": 10});
        let c = check(
            Format::CountTokens,
            v.as_object_mut().unwrap(),
            1000,
            None,
            false,
        )
        .unwrap();
        assert_eq!(c.estimate, Usage::default());
    }

    /// What Codex 0.147 sends passes (the fields of its real requests, with an MCP server's
    /// tools as a namespace), and `store` is false whatever it said.
    #[test]
    fn codexs_requests_pass_and_store_nothing() {
        let (c, v) = run(
            Format::Responses,
            json!({"model": "m", "instructions": "i", "stream": true, "store": true,
                "tool_choice": "auto", "parallel_tool_calls": false,
                "reasoning": {"summary": "auto"}, "include": ["reasoning.encrypted_content"],
                "prompt_cache_key": "k", "client_metadata": {"turn_id": "t"},
                "tools": [{"type": "function", "name": "exec_command", "parameters": {}},
                          {"type": "namespace", "name": "mcp__arizuko", "description": "d",
                           "tools": [{"type": "function", "name": "send_message", "parameters": {}}]}],
                "input": [
                    {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "d"}]},
                    {"role": "user", "content": "hi"},
                    {"type": "reasoning", "summary": [], "encrypted_content": "x"},
                    {"type": "function_call", "call_id": "c", "name": "exec_command", "arguments": "{}"},
                    {"type": "function_call_output", "call_id": "c", "output": "ok"},
                    {"type": "message", "role": "user", "content": [
                        {"type": "input_image", "image_url": "data:image/png;base64,AA=="}]}]}),
            Some("m"),
        )
        .unwrap();
        assert!(c.streaming);
        assert_eq!(c.estimate.output, DEFAULT_MAX_OUTPUT);
        assert_eq!(v["store"], false, "{v}");
        let (c, v) = run(
            Format::Responses,
            json!({"model": "m", "input": "hi", "max_output_tokens": 77}),
            None,
        )
        .unwrap();
        assert_eq!((c.streaming, c.estimate.output), (false, 77));
        assert_eq!(v["store"], false, "{v}");
    }

    /// The Responses API's state at the provider and its server tools: refused.
    #[test]
    fn responses_reach_and_state_are_refused() {
        for body in [
            json!({"previous_response_id": "resp_of_another_group"}),
            json!({"conversation": "conv_1"}),
            json!({"background": true}),
            json!({"prompt": {"id": "pmpt_1"}}),
            json!({"tools": [{"type": "web_search"}]}),
            json!({"tools": [{"type": "web_search_preview"}]}),
            json!({"tools": [{"type": "file_search", "vector_store_ids": ["v"]}]}),
            json!({"tools": [{"type": "mcp", "server_url": "https://x"}]}),
            json!({"tools": [{"type": "code_interpreter"}]}),
            json!({"tools": [{"type": "image_generation"}]}),
            json!({"tools": [{"type": "namespace", "tools": [{"type": "web_search"}]}]}),
            json!({"tool_choice": {"type": "web_search_preview"}}),
            json!({"include": ["web_search_call.action.sources"]}),
            json!({"input": [{"type": "item_reference", "id": "msg_of_another_group"}]}),
            json!({"input": [{"type": "web_search_call", "id": "w"}]}),
            json!({"input": [{"role": "user", "content": [
                {"type": "input_image", "image_url": "https://evil/?leak"}]}]}),
            json!({"input": [{"role": "user", "content": [
                {"type": "input_image", "file_id": "file_1"}]}]}),
            json!({"input": [{"role": "user", "content": [
                {"type": "input_file", "file_url": "https://evil/x.pdf"}]}]}),
            json!({"input": [{"type": "function_call_output", "call_id": "c", "output": [
                {"type": "input_image", "image_url": "http://169.254.169.254/"}]}]}),
            json!({"input": [{"role": "user", "content": [{"type": "input_video", "url": "x"}]}]}),
        ] {
            let e = run(Format::Responses, body.clone(), None).unwrap_err();
            assert_eq!(e.code(), "not_allowed", "{body}: {e}");
        }
        for bad in [json!({"input": 5}), json!({"include": "x"})] {
            let e = run(Format::Responses, bad.clone(), None).unwrap_err();
            assert_eq!(e.code(), "invalid_request", "{bad}: {e}");
        }
    }
}
