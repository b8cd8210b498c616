//! The wire formats the gateway forwards, each to its provider.

use hako_shared::runs::LlmApi;

/// One wire format: what a call's body and answer look like, and which provider (key, URL)
/// it reaches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Anthropic Messages (`POST /v1/messages`).
    Messages,
    /// Anthropic's token count (`POST /v1/messages/count_tokens`): free, never charged.
    CountTokens,
    /// OpenAI-compatible chat completions (`POST /v1/chat/completions`).
    ChatCompletions,
    /// OpenAI Responses (`POST /v1/responses`): what Codex speaks.
    Responses,
}

impl Format {
    /// Every format, with its route.
    pub const ALL: [Format; 4] = [
        Format::Messages,
        Format::CountTokens,
        Format::ChatCompletions,
        Format::Responses,
    ];

    /// The provider it reaches (its key and URL, and the label of metrics and usage rows).
    pub fn api(self) -> LlmApi {
        match self {
            Format::Messages | Format::CountTokens => LlmApi::Anthropic,
            Format::ChatCompletions | Format::Responses => LlmApi::Openai,
        }
    }

    /// The route, the same on the gateway and at the provider.
    pub fn path(self) -> &'static str {
        match self {
            Format::Messages => "/v1/messages",
            Format::CountTokens => "/v1/messages/count_tokens",
            Format::ChatCompletions => "/v1/chat/completions",
            Format::Responses => "/v1/responses",
        }
    }
}
