//! The canonical provider stream: every endpoint adapter maps its wire events onto `ResponseEvent`.
//! The loop sees only these; deltas of one stream that are ready together merge (`absorb`, and
//! `Batch`, which a parser writes into so that a delta it borrows from the provider's bytes is
//! copied once, into the event it continues).

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

/// The stream a delta belongs to: deltas of one stream may merge, of two never.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stream {
    Text,
    Reasoning,
    /// One tool call's arguments (its ordinal).
    Args(usize),
}

impl ResponseEvent {
    /// Appends `next` to this event when both continue the same stream (text, reasoning, or one
    /// tool call's arguments) and this one carries less than `limit` bytes; otherwise gives `next`
    /// back. What a client shows of a stream does not depend on where its deltas were cut, so
    /// deltas that are ready together leave together: one frame and one write instead of many.
    pub fn absorb(&mut self, next: ResponseEvent, limit: usize) -> Result<(), ResponseEvent> {
        let Some((stream, more)) = next.delta() else {
            return Err(next);
        };
        match self.continued(stream, limit) {
            Some(text) => {
                text.push_str(more);
                Ok(())
            }
            None => Err(next),
        }
    }

    /// A delta's stream and text.
    fn delta(&self) -> Option<(Stream, &str)> {
        match self {
            ResponseEvent::TextDelta(text) => Some((Stream::Text, text)),
            ResponseEvent::ReasoningDelta(text) => Some((Stream::Reasoning, text)),
            ResponseEvent::ToolArgsDelta { index, fragment } => {
                Some((Stream::Args(*index), fragment))
            }
            _ => None,
        }
    }

    /// This event's text, to append to, when it is a delta of `stream` carrying less than `limit`
    /// bytes: the one rule for merging deltas (`absorb`, `Batch`).
    fn continued(&mut self, stream: Stream, limit: usize) -> Option<&mut String> {
        let (own, text) = match self {
            ResponseEvent::TextDelta(text) => (Stream::Text, text),
            ResponseEvent::ReasoningDelta(text) => (Stream::Reasoning, text),
            ResponseEvent::ToolArgsDelta { index, fragment } => (Stream::Args(*index), fragment),
            _ => return None,
        };
        (own == stream && text.len() < limit).then_some(text)
    }

    /// A new delta of `stream`.
    fn new_delta(stream: Stream, text: String) -> ResponseEvent {
        match stream {
            Stream::Text => ResponseEvent::TextDelta(text),
            Stream::Reasoning => ResponseEvent::ReasoningDelta(text),
            Stream::Args(index) => ResponseEvent::ToolArgsDelta {
                index,
                fragment: text,
            },
        }
    }
}

/// The events parsed from what one read of a provider held, in order, each delta merged into the
/// event before it when both continue one stream (`ResponseEvent::absorb`'s rule and limit).
/// Parsers add deltas as borrowed text: a delta that continues the last event is appended to it,
/// so a provider streaming fast costs no allocation per chunk.
#[derive(Debug)]
pub struct Batch {
    events: Vec<ResponseEvent>,
    /// A delta is appended to the last event only while that one carries less than this.
    limit: usize,
}

impl Batch {
    pub fn new(limit: usize) -> Batch {
        Batch {
            events: Vec::new(),
            limit,
        }
    }

    /// Adds an event, merged into the last one when it continues it.
    pub fn push(&mut self, event: ResponseEvent) {
        let unmerged = match self.events.last_mut() {
            Some(last) => last.absorb(event, self.limit).err(),
            None => Some(event),
        };
        self.events.extend(unmerged);
    }

    /// Adds answer text (nothing when empty).
    pub fn text(&mut self, text: &str) {
        self.delta(Stream::Text, text);
    }

    /// Adds reasoning text (nothing when empty).
    pub fn reasoning(&mut self, text: &str) {
        self.delta(Stream::Reasoning, text);
    }

    /// Adds a fragment of tool call `index`'s arguments (nothing when empty).
    pub fn args(&mut self, index: usize, fragment: &str) {
        self.delta(Stream::Args(index), fragment);
    }

    /// Appends `text` to the last event when it continues `stream`, else adds it as a new one.
    fn delta(&mut self, stream: Stream, text: &str) {
        if text.is_empty() {
            return;
        }
        let limit = self.limit;
        match self
            .events
            .last_mut()
            .and_then(|last| last.continued(stream, limit))
        {
            Some(last) => last.push_str(text),
            None => (self.events).push(ResponseEvent::new_delta(stream, text.to_owned())),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    /// Takes the events out, oldest first, leaving the batch empty (its memory kept for the next
    /// read).
    pub fn drain(&mut self) -> std::vec::Drain<'_, ResponseEvent> {
        self.events.drain(..)
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
    use super::Batch;
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

    #[test]
    fn a_batch_merges_borrowed_deltas_by_the_same_rule_as_absorb() {
        let mut batch = Batch::new(5);
        batch.text("Hel");
        batch.text("");
        batch.text("lo");
        batch.text("!"); // "Hello" is at the limit: a new event
        batch.reasoning("hm");
        batch.push(ReasoningDelta("m".into()));
        batch.args(0, "{");
        batch.args(1, "{");
        batch.args(1, "}");
        batch.push(ResponseEvent::Finished(super::FinishReason::Stop));
        batch.text("after");
        assert_eq!(
            batch.drain().collect::<Vec<_>>(),
            [
                TextDelta("Hello".into()),
                TextDelta("!".into()),
                ReasoningDelta("hmm".into()),
                args(0, "{"),
                args(1, "{}"),
                ResponseEvent::Finished(super::FinishReason::Stop),
                TextDelta("after".into()),
            ]
        );
        assert!(batch.is_empty());
    }
}
