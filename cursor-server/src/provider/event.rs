//! The canonical provider stream: every endpoint adapter maps its wire events onto `ResponseEvent`.
//! The loop sees only these.

use crate::model::message::ProviderReplay;
use crate::model::usage::Usage;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResponseEvent {
    /// Visible answer text.
    TextDelta(String),
    /// Reasoning text to show as thinking.
    ReasoningDelta(String),
    /// A tool call begins. `index` is the adapter's own dense ordinal (0, 1, 2 ...) within this call.
    ToolCallStart {
        index: usize,
        id: String,
        name: String,
    },
    /// A fragment of a tool call's JSON arguments.
    ToolArgsDelta { index: usize, fragment: String },
    /// Provider-reported usage for this call (may arrive more than once; the last one wins).
    Usage(Usage),
    /// Opaque data to store on the assistant message and replay to the same endpoint family.
    Replay(ProviderReplay),
    /// The stream ended properly. Always the last event of a successful call.
    Finished(FinishReason),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FinishReason {
    Stop,
    /// The output token limit cut the answer.
    Length,
    ToolCalls,
    ContentFilter,
    /// A value the adapter does not know, kept for logs.
    Other(String),
}

impl FinishReason {
    /// The reason as recorded (`stop`, `length`, `tool_calls`, `content_filter`, or the provider's).
    pub fn as_str(&self) -> &str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::ToolCalls => "tool_calls",
            FinishReason::ContentFilter => "content_filter",
            FinishReason::Other(other) => other,
        }
    }
}
