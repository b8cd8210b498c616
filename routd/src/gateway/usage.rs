//! Tokens a provider's answer reports, read as the answer passes through the gateway: from the
//! JSON body of a plain answer, or from the events of a stream as they go by (the stream is
//! never held back for it).
//!
//! - Anthropic Messages: `usage` of the body; in a stream, `message_start`'s
//!   `message.usage` and each `message_delta`'s `usage` (cumulative counts: the latest wins).
//!   Input counts the cache reads and writes too: they are billed input.
//! - OpenAI chat completions: `usage.prompt_tokens` / `usage.completion_tokens` of the body,
//!   or of the stream's last chunk (the gateway asks for it with `stream_options`).
//! - OpenAI Responses: `usage.input_tokens` (cached ones included) / `usage.output_tokens`
//!   of the body, or of the stream's final event's `response` (`response.completed`, or
//!   `response.incomplete` / `response.failed`, which report what was used too).

use serde_json::Value;

use super::format::Format;

/// The longest SSE line (or plain body) read for usage; longer ones pass through unread.
const MAX_SCAN: usize = 8 << 20;

/// Tokens of one answer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Input (prompt) tokens, cache reads and writes included.
    pub input: u64,
    /// Output (completion) tokens.
    pub output: u64,
}

impl Usage {
    /// Input and output together: what the budget counts.
    #[cfg(test)]
    pub fn total(&self) -> u64 {
        self.input.saturating_add(self.output)
    }
}

/// Reads usage from an answer fed to it in chunks, as they pass.
#[derive(Debug)]
pub struct Meter {
    format: Format,
    stream: bool,
    /// The current line of a stream, or the whole of a plain body.
    buf: Vec<u8>,
    /// The line (or body) outgrew [`MAX_SCAN`]: skipped to its end.
    skipping: bool,
    usage: Usage,
    /// The answer's final usage was read (not just a stream's first counts).
    complete: bool,
}

fn count(v: &Value, key: &str) -> u64 {
    v.get(key).and_then(Value::as_u64).unwrap_or(0)
}

impl Meter {
    /// A meter for an answer in `format`; `stream` when it is `text/event-stream`.
    pub fn new(format: Format, stream: bool) -> Self {
        Self {
            format,
            stream,
            buf: Vec::new(),
            skipping: false,
            usage: Usage::default(),
            complete: false,
        }
    }

    /// Reads the next piece of the answer.
    pub fn feed(&mut self, mut chunk: &[u8]) {
        if !self.stream {
            if !self.skipping {
                if self.buf.len() + chunk.len() > MAX_SCAN {
                    self.skipping = true;
                    self.buf = Vec::new();
                } else {
                    self.buf.extend_from_slice(chunk);
                }
            }
            return;
        }
        while let Some(nl) = memchr::memchr(b'\n', chunk) {
            let (line, rest) = chunk.split_at(nl);
            if !self.skipping {
                if self.buf.is_empty() {
                    self.line(line);
                } else {
                    let mut whole = std::mem::take(&mut self.buf);
                    whole.extend_from_slice(line);
                    self.line(&whole);
                }
            }
            self.skipping = false;
            self.buf.clear();
            chunk = &rest[1..];
        }
        if !self.skipping {
            if self.buf.len() + chunk.len() > MAX_SCAN {
                self.skipping = true;
                self.buf = Vec::new();
            } else {
                self.buf.extend_from_slice(chunk);
            }
        }
    }

    /// Whether the answer reported its final usage (call after [`Meter::finish`]): a plain
    /// body's `usage`, an Anthropic stream's `message_delta`, an OpenAI stream's usage chunk,
    /// a Responses stream's final event.
    pub fn complete(&self) -> bool {
        self.complete
    }

    /// The usage read so far (a stream cut short reports what it had).
    pub fn finish(&mut self) -> Usage {
        if !self.stream && !self.skipping && !self.buf.is_empty() {
            if let Ok(v) = serde_json::from_slice::<Value>(&self.buf) {
                self.body(&v);
            }
            self.buf.clear();
        }
        self.usage
    }

    fn line(&mut self, line: &[u8]) {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let Some(data) = line.strip_prefix(b"data:") else {
            return;
        };
        // Cheap test first: most events carry no usage.
        if memchr::memmem::find(data, b"usage").is_none() {
            return;
        }
        let Ok(v) = serde_json::from_slice::<Value>(data.trim_ascii_start()) else {
            return;
        };
        match self.format {
            Format::Messages | Format::CountTokens => match v.get("type").and_then(Value::as_str) {
                Some("message_start") => {
                    if let Some(u) = v.get("message").and_then(|m| m.get("usage")) {
                        self.anthropic(u);
                    }
                }
                Some("message_delta") => {
                    if let Some(u) = v.get("usage") {
                        self.anthropic(u);
                        self.complete = true;
                    }
                }
                _ => {}
            },
            Format::ChatCompletions => self.body(&v),
            Format::Responses => {
                if matches!(
                    v.get("type").and_then(Value::as_str),
                    Some("response.completed" | "response.incomplete" | "response.failed")
                ) && let Some(r) = v.get("response")
                {
                    self.body(r);
                }
            }
        }
    }

    fn body(&mut self, v: &Value) {
        let Some(u) = v.get("usage").filter(|u| u.is_object()) else {
            return;
        };
        self.complete = true;
        match self.format {
            Format::Messages | Format::CountTokens => self.anthropic(u),
            Format::ChatCompletions => {
                self.usage.input = self.usage.input.max(count(u, "prompt_tokens"));
                self.usage.output = self.usage.output.max(count(u, "completion_tokens"));
            }
            Format::Responses => {
                self.usage.input = self.usage.input.max(count(u, "input_tokens"));
                self.usage.output = self.usage.output.max(count(u, "output_tokens"));
            }
        }
    }

    /// Anthropic's counts are cumulative within a message: the largest seen is the count.
    fn anthropic(&mut self, u: &Value) {
        let input = count(u, "input_tokens")
            .saturating_add(count(u, "cache_creation_input_tokens"))
            .saturating_add(count(u, "cache_read_input_tokens"));
        self.usage.input = self.usage.input.max(input);
        self.usage.output = self.usage.output.max(count(u, "output_tokens"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ANTHROPIC_STREAM: &str = concat!(
        "event: message_start\n",
        "data: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"usage\":{\"input_tokens\":25,\"cache_read_input_tokens\":5,\"output_tokens\":1}}}\n\n",
        "event: content_block_delta\n",
        "data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"the word usage in text\"}}\n\n",
        "event: message_delta\r\n",
        "data: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":15}}\r\n\r\n",
        "event: message_stop\n",
        "data: {\"type\":\"message_stop\"}\n\n",
    );

    fn fed_in_pieces(api: Format, stream: bool, text: &str, piece: usize) -> Usage {
        let mut m = Meter::new(api, stream);
        for c in text.as_bytes().chunks(piece) {
            m.feed(c);
        }
        m.finish()
    }

    #[test]
    fn anthropic_stream_usage_whatever_the_chunking() {
        for piece in [1, 2, 3, 7, 64, 4096] {
            assert_eq!(
                fed_in_pieces(Format::Messages, true, ANTHROPIC_STREAM, piece),
                Usage {
                    input: 30,
                    output: 15
                },
                "chunks of {piece}"
            );
        }
    }

    #[test]
    fn a_stream_cut_short_reports_what_it_saw() {
        let cut = &ANTHROPIC_STREAM[..ANTHROPIC_STREAM.find("event: message_delta").unwrap()];
        assert_eq!(
            fed_in_pieces(Format::Messages, true, cut, 5),
            Usage {
                input: 30,
                output: 1
            }
        );
    }

    #[test]
    fn plain_bodies() {
        let a = r#"{"id":"m","content":[],"usage":{"input_tokens":12,"output_tokens":34}}"#;
        assert_eq!(
            fed_in_pieces(Format::Messages, false, a, 5),
            Usage {
                input: 12,
                output: 34
            }
        );
        let o =
            r#"{"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":9,"total_tokens":16}}"#;
        assert_eq!(
            fed_in_pieces(Format::ChatCompletions, false, o, 3),
            Usage {
                input: 7,
                output: 9
            }
        );
        assert_eq!(
            fed_in_pieces(Format::ChatCompletions, false, "not json", 3),
            Usage::default()
        );
    }

    #[test]
    fn openai_stream_reads_the_usage_chunk() {
        let s = concat!(
            "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}],\"usage\":null}\n\n",
            "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2}}\n\n",
            "data: [DONE]\n\n",
        );
        assert_eq!(
            fed_in_pieces(Format::ChatCompletions, true, s, 4),
            Usage {
                input: 3,
                output: 2
            }
        );
    }

    #[test]
    fn an_endless_line_is_skipped_without_growing() {
        let mut m = Meter::new(Format::Messages, true);
        let junk = vec![b'x'; 1 << 20];
        for _ in 0..20 {
            m.feed(&junk);
        }
        assert!(m.buf.capacity() <= MAX_SCAN + (1 << 20));
        m.feed(b"\n");
        m.feed(ANTHROPIC_STREAM.as_bytes());
        assert_eq!(m.finish().total(), 45);
    }

    #[test]
    fn responses_usage_from_the_body_or_the_final_event() {
        let body = r#"{"id":"resp_1","output":[],"usage":{"input_tokens":11,"input_tokens_details":{"cached_tokens":4},"output_tokens":6,"total_tokens":17}}"#;
        assert_eq!(
            fed_in_pieces(Format::Responses, false, body, 3),
            Usage {
                input: 11,
                output: 6
            }
        );
        let s = concat!(
            "event: response.created\n",
            "data: {\"type\":\"response.created\",\"response\":{\"id\":\"r\",\"usage\":null}}\n\n",
            "event: response.output_text.delta\n",
            "data: {\"type\":\"response.output_text.delta\",\"delta\":\"the usage word\"}\n\n",
            "event: response.completed\n",
            "data: {\"type\":\"response.completed\",\"response\":{\"id\":\"r\",\"usage\":{\"input_tokens\":30,\"output_tokens\":9}}}\n\n",
        );
        for piece in [1, 5, 4096] {
            let mut m = Meter::new(Format::Responses, true);
            for c in s.as_bytes().chunks(piece) {
                m.feed(c);
            }
            assert_eq!(
                m.finish(),
                Usage {
                    input: 30,
                    output: 9
                }
            );
            assert!(m.complete(), "the final event reports the call's usage");
        }
        // Cut before the final event: nothing final was reported.
        let cut = &s[..s.find("event: response.completed").unwrap()];
        let mut m = Meter::new(Format::Responses, true);
        m.feed(cut.as_bytes());
        assert_eq!(m.finish(), Usage::default());
        assert!(!m.complete());
    }
}
