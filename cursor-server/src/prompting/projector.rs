//! What every family's request body is projected from: history regrouped into user messages and
//! assistant exchanges, the request's images in the order it shows them, replayable arguments. Each
//! family's body is built by its module (`provider/<family>.rs`, `Family::request_body`) from these.
//! Pure: the same history always gives the same bytes, and appending to history only appends to the
//! projected messages.
//!
//! Tool calls are stored one record per call as each completes; the projection gathers them back
//! onto the assistant message of their model call, in call order, followed by their results in the
//! same order. A call without a stored result (a batch cut short) is left out, never sent unanswered.
//! Opaque reasoning is replayed only to the endpoint family (and, for Anthropic signatures, the
//! model) that produced it; from anywhere else it is dropped, never faked or turned into text.

use std::collections::HashMap;

use serde_json::{Value, json};

use super::compiler::ModelRequest;
use super::images::{Gallery, ImageLimits};
use crate::model::conversation::ImageRef;
use crate::model::message::{
    AssistantMessage, CanonicalMessage, ToolCallRecord, ToolResultRecord, UserMessage,
};

/// One assistant message with the calls that were answered and their results, in call order.
pub(crate) struct Exchange<'a> {
    pub assistant: &'a AssistantMessage,
    pub calls: Vec<(&'a ToolCallRecord, &'a ToolResultRecord)>,
}

pub(crate) enum Item<'a> {
    User(&'a UserMessage),
    Exchange(Exchange<'a>),
}

/// The images the items show, in the order the request shows them (for the family's limits).
pub(crate) fn gallery<'a>(
    limits: ImageLimits,
    request: &ModelRequest<'a>,
    items: &[Item<'_>],
) -> Gallery<'a> {
    let mut all: Vec<&ImageRef> = Vec::new();
    for item in items {
        match item {
            Item::User(user) => all.extend(&user.images),
            Item::Exchange(exchange) => {
                for (_, result) in &exchange.calls {
                    all.extend(&result.result.images);
                }
            }
        }
    }
    Gallery::new(limits, request.model, request.images, all.into_iter())
}

/// History regrouped into user messages and assistant exchanges.
pub(crate) fn items<'a>(history: &[&'a CanonicalMessage]) -> Vec<Item<'a>> {
    let mut calls: HashMap<&str, Vec<&ToolCallRecord>> = HashMap::new();
    let mut results: HashMap<(&str, u32), &ToolResultRecord> = HashMap::new();
    for message in history.iter().copied() {
        match message {
            CanonicalMessage::ToolCall(record) => {
                calls.entry(&record.model_call_id).or_default().push(record)
            }
            CanonicalMessage::ToolResult(record) => {
                results.insert((&record.model_call_id, record.index), record);
            }
            _ => {}
        }
    }
    let mut out = Vec::with_capacity(history.len());
    for message in history.iter().copied() {
        match message {
            CanonicalMessage::User(user) => out.push(Item::User(user)),
            CanonicalMessage::Assistant(assistant) => {
                let key = assistant.model_call_id.as_str();
                let mut answered: Vec<(&ToolCallRecord, &ToolResultRecord)> = calls
                    .get(key)
                    .into_iter()
                    .flatten()
                    .filter_map(|call| {
                        results
                            .get(&(key, call.index))
                            .map(|result| (*call, *result))
                    })
                    .collect();
                answered.sort_by_key(|(call, _)| call.index);
                out.push(Item::Exchange(Exchange {
                    assistant,
                    calls: answered,
                }));
            }
            CanonicalMessage::ToolCall(_) | CanonicalMessage::ToolResult(_) => {}
        }
    }
    out
}

pub(crate) fn arguments_text(record: &ToolCallRecord) -> String {
    replayable_arguments(&record.call.arguments)
}

/// A call's arguments as they can be sent back: as the model wrote them when they are a JSON
/// object (byte for byte, for prefix caches), `{}` when empty, and otherwise (arguments the output
/// limit cut off) wrapped as `{"invalid_arguments": "..."}`. Strict servers (llama.cpp, vLLM) parse
/// replayed arguments and refuse every later request over one that is not JSON.
pub(crate) fn replayable_arguments(raw: &str) -> String {
    if raw.trim().is_empty() {
        return "{}".to_owned();
    }
    match serde_json::from_str::<Value>(raw) {
        Ok(Value::Object(_)) => raw.to_owned(),
        _ => json!({ "invalid_arguments": raw }).to_string(),
    }
}

#[cfg(test)]
mod tests;
