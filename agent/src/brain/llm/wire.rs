//! The conversation, and the two wire formats the gateway speaks: requests built from it, and
//! streamed answers assembled back into it.
//!
//! The conversation is kept in the Anthropic Messages shape (a list of turns, each a role and
//! content blocks: text, tool uses, tool results); the OpenAI format is rendered from it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use super::sse::Event;
use crate::mcp::ToolSpec;
use hako_shared::runs::LlmApi;

/// Who said it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// The user, or tool results.
    User,
    /// The model.
    Assistant,
}

/// A content block.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Part {
    /// Text.
    Text {
        /// The text.
        text: String,
    },
    /// The model calls a tool.
    ToolUse {
        /// The call's id.
        id: String,
        /// The tool.
        name: String,
        /// Its arguments.
        input: Value,
    },
    /// A tool's answer.
    ToolResult {
        /// The call it answers.
        tool_use_id: String,
        /// The answer's text.
        content: String,
        /// Whether the tool failed.
        #[serde(default)]
        is_error: bool,
    },
}

/// One turn of the conversation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Turn {
    /// Who.
    pub role: Role,
    /// What.
    pub content: Vec<Part>,
}

impl Turn {
    /// Whether this is a user's message (not tool results): where a conversation may be cut.
    pub fn is_user_text(&self) -> bool {
        self.role == Role::User && self.content.iter().all(|p| matches!(p, Part::Text { .. }))
    }
}

/// Why the model stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stop {
    /// It is done.
    EndTurn,
    /// It wants tool results.
    ToolUse,
    /// It ran out of output tokens.
    MaxTokens,
    /// Anything else (a stop sequence, a refusal), named.
    Other(String),
}

/// The request body for one step.
pub fn request(
    api: LlmApi,
    model: &str,
    max_tokens: u32,
    system: &str,
    turns: &[Turn],
    tools: &[ToolSpec],
) -> Value {
    match api {
        LlmApi::Anthropic => {
            let mut body = json!({
                "model": model,
                "max_tokens": max_tokens,
                "messages": turns,
                "stream": true,
            });
            if !system.is_empty() {
                body["system"] = json!(system);
            }
            if !tools.is_empty() {
                body["tools"] = tools
                    .iter()
                    .map(|t| {
                        json!({
                            "name": t.name,
                            "description": t.description,
                            "input_schema": t.input_schema,
                        })
                    })
                    .collect();
            }
            body
        }
        LlmApi::Openai => {
            let mut messages = Vec::new();
            if !system.is_empty() {
                messages.push(json!({"role": "system", "content": system}));
            }
            for t in turns {
                openai_messages(t, &mut messages);
            }
            let mut body = json!({
                "model": model,
                "max_tokens": max_tokens,
                "messages": messages,
                "stream": true,
                "stream_options": {"include_usage": true},
            });
            if !tools.is_empty() {
                body["tools"] = tools
                    .iter()
                    .map(|t| {
                        json!({"type": "function", "function": {
                            "name": t.name,
                            "description": t.description,
                            "parameters": t.input_schema,
                        }})
                    })
                    .collect();
            }
            body
        }
    }
}

fn openai_messages(t: &Turn, out: &mut Vec<Value>) {
    let text: Vec<&str> = t
        .content
        .iter()
        .filter_map(|p| match p {
            Part::Text { text } => Some(text.as_str()),
            _ => None,
        })
        .collect();
    match t.role {
        Role::User => {
            for p in &t.content {
                if let Part::ToolResult {
                    tool_use_id,
                    content,
                    ..
                } = p
                {
                    out.push(
                        json!({"role": "tool", "tool_call_id": tool_use_id, "content": content}),
                    );
                }
            }
            if !text.is_empty() {
                out.push(json!({"role": "user", "content": text.join("\n")}));
            }
        }
        Role::Assistant => {
            let calls: Vec<Value> = t
                .content
                .iter()
                .filter_map(|p| match p {
                    Part::ToolUse { id, name, input } => Some(json!({
                        "id": id,
                        "type": "function",
                        "function": {"name": name, "arguments": input.to_string()},
                    })),
                    _ => None,
                })
                .collect();
            let mut m = json!({
                "role": "assistant",
                "content": if text.is_empty() { Value::Null } else { json!(text.join("\n")) },
            });
            if !calls.is_empty() {
                m["tool_calls"] = Value::Array(calls);
            }
            out.push(m);
        }
    }
}

/// Something the brain acts on while a stream is still coming.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Signal {
    /// The model started a tool call: the text before it is complete.
    ToolStarted,
}

#[derive(Debug)]
enum Open {
    Text(String),
    Tool {
        id: String,
        name: String,
        args: String,
    },
}

/// Builds the model's turn from the events of its streamed answer.
#[derive(Debug)]
pub struct Assembly {
    api: LlmApi,
    /// Completed blocks.
    pub parts: Vec<Part>,
    open: Option<Open>,
    /// OpenAI: tool calls by index, as their pieces arrive.
    calls: BTreeMap<u64, (String, String, String)>,
    stop: Option<Stop>,
}

fn field<'a>(v: &'a Value, key: &str) -> &'a str {
    v.get(key).and_then(Value::as_str).unwrap_or("")
}

impl Assembly {
    /// An empty assembly for `api`'s events.
    pub fn new(api: LlmApi) -> Self {
        Self {
            api,
            parts: Vec::new(),
            open: None,
            calls: BTreeMap::new(),
            stop: None,
        }
    }

    /// Reads one event.
    pub fn event(&mut self, ev: &Event) -> Result<Option<Signal>, String> {
        match self.api {
            LlmApi::Anthropic => self.anthropic(ev),
            LlmApi::Openai => self.openai(ev),
        }
    }

    fn close(&mut self) {
        match self.open.take() {
            Some(Open::Text(text)) if !text.is_empty() => self.parts.push(Part::Text { text }),
            Some(Open::Tool { id, name, args }) => {
                let input = if args.trim().is_empty() {
                    Value::Object(Map::new())
                } else {
                    // A call whose arguments do not parse still goes back to the model, which
                    // then reads the tool's refusal instead of the turn failing.
                    serde_json::from_str(&args).unwrap_or_else(|_| json!({"_unparsed": args}))
                };
                self.parts.push(Part::ToolUse { id, name, input });
            }
            _ => {}
        }
    }

    fn anthropic(&mut self, ev: &Event) -> Result<Option<Signal>, String> {
        if ev.data.is_empty() {
            return Ok(None);
        }
        let v: Value = serde_json::from_str(&ev.data)
            .map_err(|e| format!("an event that is not JSON ({e})"))?;
        match field(&v, "type") {
            "content_block_start" => {
                self.close();
                let b = v.get("content_block").cloned().unwrap_or(Value::Null);
                match field(&b, "type") {
                    "text" => self.open = Some(Open::Text(field(&b, "text").to_owned())),
                    "tool_use" => {
                        self.open = Some(Open::Tool {
                            id: field(&b, "id").to_owned(),
                            name: field(&b, "name").to_owned(),
                            args: String::new(),
                        });
                        return Ok(Some(Signal::ToolStarted));
                    }
                    // Thinking and other blocks are not kept: without their signatures they
                    // cannot be sent back anyway.
                    _ => {}
                }
            }
            "content_block_delta" => {
                let d = v.get("delta").cloned().unwrap_or(Value::Null);
                match (&mut self.open, field(&d, "type")) {
                    (Some(Open::Text(t)), "text_delta") => t.push_str(field(&d, "text")),
                    (Some(Open::Tool { args, .. }), "input_json_delta") => {
                        args.push_str(field(&d, "partial_json"));
                    }
                    _ => {}
                }
            }
            "content_block_stop" => self.close(),
            "message_delta" => {
                if let Some(r) = v
                    .get("delta")
                    .and_then(|d| d.get("stop_reason"))
                    .and_then(Value::as_str)
                {
                    self.stop = Some(match r {
                        "end_turn" => Stop::EndTurn,
                        "tool_use" => Stop::ToolUse,
                        "max_tokens" => Stop::MaxTokens,
                        other => Stop::Other(other.to_owned()),
                    });
                }
            }
            "error" => {
                let e = v.get("error").cloned().unwrap_or(Value::Null);
                return Err(format!(
                    "the provider reported {}: {}",
                    field(&e, "type"),
                    field(&e, "message")
                ));
            }
            _ => {}
        }
        Ok(None)
    }

    fn openai(&mut self, ev: &Event) -> Result<Option<Signal>, String> {
        if ev.data.trim() == "[DONE]" || ev.data.is_empty() {
            return Ok(None);
        }
        let v: Value = serde_json::from_str(&ev.data)
            .map_err(|e| format!("an event that is not JSON ({e})"))?;
        if let Some(e) = v.get("error") {
            return Err(format!("the provider reported: {}", field(e, "message")));
        }
        let Some(choice) = v
            .get("choices")
            .and_then(Value::as_array)
            .and_then(|c| c.first())
        else {
            return Ok(None); // the usage chunk
        };
        let mut signal = None;
        if let Some(d) = choice.get("delta") {
            if let Some(t) = d.get("content").and_then(Value::as_str) {
                match &mut self.open {
                    Some(Open::Text(s)) => s.push_str(t),
                    _ => self.open = Some(Open::Text(t.to_owned())),
                }
            }
            for c in d
                .get("tool_calls")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                if matches!(self.open, Some(Open::Text(_))) {
                    self.close();
                }
                let index = c.get("index").and_then(Value::as_u64).unwrap_or(0);
                let f = c.get("function").cloned().unwrap_or(Value::Null);
                let entry = self.calls.entry(index).or_insert_with(|| {
                    signal = Some(Signal::ToolStarted);
                    Default::default()
                });
                entry.0.push_str(field(c, "id"));
                entry.1.push_str(field(&f, "name"));
                entry.2.push_str(field(&f, "arguments"));
            }
        }
        if let Some(r) = choice.get("finish_reason").and_then(Value::as_str) {
            self.stop = Some(match r {
                "stop" => Stop::EndTurn,
                "tool_calls" | "function_call" => Stop::ToolUse,
                "length" => Stop::MaxTokens,
                other => Stop::Other(other.to_owned()),
            });
        }
        Ok(signal)
    }

    /// The model's turn and why it stopped; an answer that never said why is cut short.
    pub fn finish(mut self) -> Result<(Vec<Part>, Stop), String> {
        self.close();
        for (_, (id, name, args)) in std::mem::take(&mut self.calls) {
            self.open = Some(Open::Tool { id, name, args });
            self.close();
        }
        let stop = self
            .stop
            .ok_or("the answer ended before the model said why it stopped")?;
        Ok((self.parts, stop))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::brain::llm::sse::Parser;

    fn events(text: &str) -> Vec<Event> {
        let mut p = Parser::new(1 << 20);
        let mut out = Vec::new();
        p.feed(text.as_bytes(), &mut out).unwrap();
        out
    }

    #[test]
    fn anthropic_text_then_a_tool_call() {
        let s = concat!(
            "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":3}}}\n\n",
            "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
            "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Let me \"}}\n\n",
            "event: ping\ndata: {\"type\":\"ping\"}\n\n",
            "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"look.\"}}\n\n",
            "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
            "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":1,\"content_block\":{\"type\":\"tool_use\",\"id\":\"tu_1\",\"name\":\"get_history\",\"input\":{}}}\n\n",
            "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{\\\"lim\"}}\n\n",
            "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"it\\\": 5}\"}}\n\n",
            "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":1}\n\n",
            "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"tool_use\"},\"usage\":{\"output_tokens\":9}}\n\n",
            "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
        );
        let mut a = Assembly::new(LlmApi::Anthropic);
        let mut signals = Vec::new();
        for e in events(s) {
            if let Some(sig) = a.event(&e).unwrap() {
                signals.push((sig, a.parts.len()));
            }
        }
        // The text block was complete when the tool call began.
        assert_eq!(signals, vec![(Signal::ToolStarted, 1)]);
        let (parts, stop) = a.finish().unwrap();
        assert_eq!(stop, Stop::ToolUse);
        assert_eq!(
            parts,
            vec![
                Part::Text {
                    text: "Let me look.".into()
                },
                Part::ToolUse {
                    id: "tu_1".into(),
                    name: "get_history".into(),
                    input: json!({"limit": 5})
                },
            ]
        );
    }

    #[test]
    fn anthropic_errors_and_cut_streams() {
        let mut a = Assembly::new(LlmApi::Anthropic);
        let e = a
            .event(&events("event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n")[0])
            .unwrap_err();
        assert!(
            e.contains("overloaded_error") && e.contains("Overloaded"),
            "{e}"
        );
        let mut a = Assembly::new(LlmApi::Anthropic);
        a.event(&events("data: {\"type\":\"content_block_start\",\"content_block\":{\"type\":\"text\",\"text\":\"hi\"}}\n\n")[0]).unwrap();
        assert!(
            a.finish()
                .unwrap_err()
                .contains("before the model said why")
        );
    }

    #[test]
    fn openai_content_and_tool_calls() {
        let s = concat!(
            "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"On \"}}]}\n\n",
            "data: {\"choices\":[{\"delta\":{\"content\":\"it.\"}}]}\n\n",
            "data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"send_message\",\"arguments\":\"{\\\"te\"}}]}}]}\n\n",
            "data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"xt\\\":\\\"hi\\\"}\"}}]}}]}\n\n",
            "data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"tool_calls\"}]}\n\n",
            "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":2}}\n\n",
            "data: [DONE]\n\n",
        );
        let mut a = Assembly::new(LlmApi::Openai);
        let mut signals = 0;
        for e in events(s) {
            if a.event(&e).unwrap().is_some() {
                signals += 1;
                assert_eq!(a.parts.len(), 1, "the text is closed when a call starts");
            }
        }
        assert_eq!(signals, 1);
        let (parts, stop) = a.finish().unwrap();
        assert_eq!(stop, Stop::ToolUse);
        assert_eq!(
            parts[1],
            Part::ToolUse {
                id: "c1".into(),
                name: "send_message".into(),
                input: json!({"text": "hi"})
            }
        );
    }

    #[test]
    fn requests_in_both_formats() {
        let turns = vec![
            Turn {
                role: Role::User,
                content: vec![Part::Text { text: "hi".into() }],
            },
            Turn {
                role: Role::Assistant,
                content: vec![Part::ToolUse {
                    id: "t1".into(),
                    name: "get_history".into(),
                    input: json!({}),
                }],
            },
            Turn {
                role: Role::User,
                content: vec![Part::ToolResult {
                    tool_use_id: "t1".into(),
                    content: "[]".into(),
                    is_error: false,
                }],
            },
        ];
        let tools = vec![ToolSpec {
            name: "get_history".into(),
            description: "d".into(),
            input_schema: json!({"type": "object"}).as_object().unwrap().clone(),
        }];
        let a = request(LlmApi::Anthropic, "m", 100, "sys", &turns, &tools);
        assert_eq!(a["system"], "sys");
        assert_eq!(a["messages"][1]["content"][0]["type"], "tool_use");
        assert_eq!(a["messages"][2]["content"][0]["tool_use_id"], "t1");
        assert_eq!(a["tools"][0]["input_schema"]["type"], "object");
        let o = request(LlmApi::Openai, "m", 100, "sys", &turns, &tools);
        let roles: Vec<&str> = o["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["role"].as_str().unwrap())
            .collect();
        assert_eq!(roles, ["system", "user", "assistant", "tool"]);
        assert_eq!(
            o["messages"][2]["tool_calls"][0]["function"]["arguments"],
            "{}"
        );
        assert_eq!(o["tools"][0]["function"]["name"], "get_history");
        assert!(turns[0].is_user_text() && !turns[2].is_user_text());
    }
}
