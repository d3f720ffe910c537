//! The canonical provider stream: every endpoint adapter maps its wire events onto `ResponseEvent`.
//! The loop sees only these; deltas of one stream that are ready together merge (`absorb`).

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

impl ResponseEvent {
    /// Appends `next` to this event when both continue the same stream (text, reasoning, or one
    /// tool call's arguments) and this one carries less than `limit` bytes; otherwise gives `next`
    /// back. What a client shows of a stream does not depend on where its deltas were cut, so
    /// deltas that are ready together leave together: one frame and one write instead of many.
    pub fn absorb(&mut self, next: ResponseEvent, limit: usize) -> Result<(), ResponseEvent> {
        match (self, next) {
            (ResponseEvent::TextDelta(text), ResponseEvent::TextDelta(more))
            | (ResponseEvent::ReasoningDelta(text), ResponseEvent::ReasoningDelta(more))
                if text.len() < limit =>
            {
                text.push_str(&more);
                Ok(())
            }
            (
                ResponseEvent::ToolArgsDelta { index, fragment },
                ResponseEvent::ToolArgsDelta {
                    index: next_index,
                    fragment: more,
                },
            ) if *index == next_index && fragment.len() < limit => {
                fragment.push_str(&more);
                Ok(())
            }
            (_, next) => Err(next),
        }
    }
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

#[cfg(test)]
mod tests {
    use super::ResponseEvent::{self, ReasoningDelta, TextDelta, ToolArgsDelta};

    fn args(index: usize, fragment: &str) -> ResponseEvent {
        ToolArgsDelta {
            index,
            fragment: fragment.into(),
        }
    }

    #[test]
    fn only_deltas_of_the_same_stream_merge_and_only_under_the_limit() {
        let mut text = TextDelta("Hel".into());
        assert_eq!(text.absorb(TextDelta("lo".into()), 64), Ok(()));
        assert_eq!(text, TextDelta("Hello".into()));
        assert_eq!(
            text.absorb(ReasoningDelta("hm".into()), 64),
            Err(ReasoningDelta("hm".into())),
            "text and reasoning are two streams"
        );
        assert_eq!(
            text.absorb(TextDelta("!".into()), 5),
            Err(TextDelta("!".into()))
        );

        let mut call = args(0, "{\"pa");
        assert_eq!(call.absorb(args(0, "th\":1}"), 64), Ok(()));
        assert_eq!(call, args(0, "{\"path\":1}"));
        assert_eq!(
            call.absorb(args(1, "{"), 64),
            Err(args(1, "{")),
            "another call's arguments"
        );
    }
}
