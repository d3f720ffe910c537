//! OpenAI Chat Completions (and compatible endpoints): maps the SSE chunks of a streaming call onto
//! `ResponseEvent`s; the family's request body (`Family::request_body`), image limits and probe.
//!
//! A stream succeeds only if it reaches `data: [DONE]` after a `finish_reason`; an in-band
//! `{"error":...}` chunk, EOF before `[DONE]`, or an idle gap longer than the limit is an error.
//!
//! Length: one endpoint family whole, as each provider module is: its stream's wire types and
//! parser, its request body, and the transcript tests of both, a little over 800 lines.

use std::borrow::Cow;
use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use super::family::{self, Family};
use super::{Batch, FinishReason, ProviderError, RequestBody, ResponseEvent, StreamParser};
use crate::model::message::ProviderReplay;
use crate::model::usage::Usage;
use crate::prompting::compiler::{Effort, ModelRequest};
use crate::prompting::images::{self, ImageLimits, MB, Part};
use crate::prompting::projector::{Item, arguments_text, gallery, items};
use serde_json::{Value, json};

/// Turns Chat SSE `data` payloads into canonical events. Pure and synchronous, so it can be tested on
/// transcripts.
pub struct ChatStreamParser {
    provider: String,
    /// Provider tool index → (id, our dense ordinal). A new id on a used index opens a new ordinal.
    tool_slots: HashMap<u64, (String, usize)>,
    next_tool_ordinal: usize,
    reasoning: String,
    /// OpenRouter reasoning details, merged by their `index` as fragments arrive.
    reasoning_details: Vec<serde_json::Value>,
    finish: Option<FinishReason>,
    usage: Option<Usage>,
}

impl ChatStreamParser {
    pub fn new(provider: &str) -> Self {
        ChatStreamParser {
            provider: provider.to_owned(),
            tool_slots: HashMap::new(),
            next_tool_ordinal: 0,
            reasoning: String::new(),
            reasoning_details: Vec::new(),
            finish: None,
            usage: None,
        }
    }

    /// Feeds one SSE `data` payload, adding the events it yields to `out`. Returns whether the
    /// stream is complete.
    fn feed_data(&mut self, data: &str, out: &mut Batch) -> Result<bool, ProviderError> {
        let data = data.trim();
        if data == "[DONE]" {
            return self.done(out).map(|()| true);
        }
        if data.is_empty() {
            return Ok(false);
        }
        let chunk: Chunk = serde_json::from_str(data).map_err(|e| ProviderError::Decode {
            provider: self.provider.clone(),
            message: format!("{e} in chunk {}", truncate(data, 200)),
        })?;
        if let Some(error) = chunk.error {
            return Err(ProviderError::InBand {
                provider: self.provider.clone(),
                message: error.message(),
            });
        }
        if let Some(usage) = chunk.usage {
            self.usage = Some(usage.normalise());
        }
        for choice in chunk.choices {
            // Moonshot reports usage inside the finishing choice.
            if let Some(usage) = choice.usage {
                self.usage = Some(usage.normalise());
            }
            if let Some(delta) = choice.delta {
                self.delta(delta, out);
            }
            if let Some(Text(reason)) = choice.finish_reason {
                self.finish = Some(match &*reason {
                    "stop" => FinishReason::Stop,
                    "length" => FinishReason::Length,
                    "tool_calls" | "function_call" => FinishReason::ToolCalls,
                    "content_filter" => FinishReason::ContentFilter,
                    "error" => {
                        return Err(ProviderError::InBand {
                            provider: self.provider.clone(),
                            message: "finish_reason \"error\"".to_owned(),
                        });
                    }
                    other => FinishReason::Other(other.to_owned()),
                });
            }
        }
        Ok(false)
    }

    fn delta(&mut self, delta: Delta<'_>, out: &mut Batch) {
        for detail in delta.reasoning_details.unwrap_or_default() {
            merge_reasoning_detail(&mut self.reasoning_details, detail);
        }
        if let Some(Text(reasoning)) = delta.reasoning_content.or(delta.reasoning) {
            self.reasoning.push_str(&reasoning);
            out.reasoning(&reasoning);
        }
        if let Some(Text(text)) = delta.content {
            out.text(&text);
        }
        for call in delta.tool_calls.unwrap_or_default() {
            let index = call.index.unwrap_or(0);
            let id = call.id.map(|Text(id)| id).filter(|id| !id.is_empty());
            let function = call.function.unwrap_or_default();
            let ordinal = match (self.tool_slots.get(&index), &id) {
                (Some((known, ordinal)), Some(id)) if known == id => *ordinal,
                (Some((_, ordinal)), None) => *ordinal,
                _ => {
                    let ordinal = self.next_tool_ordinal;
                    self.next_tool_ordinal += 1;
                    let id = match id {
                        Some(id) => id.into_owned(),
                        None => format!("call_{ordinal}"),
                    };
                    self.tool_slots.insert(index, (id.clone(), ordinal));
                    out.push(ResponseEvent::ToolCallStart {
                        index: ordinal,
                        id,
                        name: function
                            .name
                            .map(|Text(name)| name.into_owned())
                            .unwrap_or_default(),
                    });
                    ordinal
                }
            };
            if let Some(Text(fragment)) = function.arguments {
                out.args(ordinal, &fragment);
            }
        }
    }

    fn done(&mut self, out: &mut Batch) -> Result<(), ProviderError> {
        let Some(finish) = self.finish.take() else {
            return Err(ProviderError::Truncated {
                provider: self.provider.clone(),
                missing: "finish_reason before [DONE]",
            });
        };
        if let Some(usage) = self.usage.take() {
            out.push(ResponseEvent::Usage(usage));
        }
        out.push(ResponseEvent::Replay(ProviderReplay::OpenAiChat {
            reasoning_content: std::mem::take(&mut self.reasoning),
            reasoning_details: std::mem::take(&mut self.reasoning_details),
        }));
        // Some servers say tool_calls without sending any: that is a plain stop.
        let finish = match finish {
            FinishReason::ToolCalls if self.next_tool_ordinal == 0 => FinishReason::Stop,
            other => other,
        };
        out.push(ResponseEvent::Finished(finish));
        Ok(())
    }
}

impl StreamParser for ChatStreamParser {
    fn feed(&mut self, _event: &str, data: &str, out: &mut Batch) -> Result<bool, ProviderError> {
        self.feed_data(data, out)
    }

    fn terminal(&self) -> &'static str {
        "data: [DONE]"
    }
}

pub(crate) fn truncate(text: &str, max: usize) -> &str {
    match text.char_indices().nth(max) {
        Some((i, _)) => &text[..i],
        None => text,
    }
}

// The chunk's strings are borrowed from the event's data where they have no escapes (`Text`): a
// fast stream's deltas are then copied once, into the event they continue.

#[derive(Deserialize)]
struct Chunk<'a> {
    #[serde(default, borrow)]
    choices: Vec<Choice<'a>>,
    usage: Option<ChatUsage>,
    error: Option<ChunkError>,
}

#[derive(Deserialize)]
struct ChunkError {
    message: Option<String>,
    #[serde(rename = "type")]
    kind: Option<String>,
    code: Option<serde_json::Value>,
}

impl ChunkError {
    fn message(&self) -> String {
        let mut text = self
            .message
            .clone()
            .unwrap_or_else(|| "unknown error".to_owned());
        if let Some(kind) = &self.kind {
            text.push_str(&format!(" ({kind})"));
        } else if let Some(code) = &self.code {
            text.push_str(&format!(" ({code})"));
        }
        text
    }
}

#[derive(Deserialize)]
struct Choice<'a> {
    #[serde(borrow)]
    delta: Option<Delta<'a>>,
    #[serde(borrow)]
    finish_reason: Option<Text<'a>>,
    usage: Option<ChatUsage>,
}

#[derive(Deserialize, Default)]
struct Delta<'a> {
    #[serde(borrow)]
    content: Option<Text<'a>>,
    #[serde(borrow)]
    reasoning_content: Option<Text<'a>>,
    /// OpenRouter's reasoning text.
    #[serde(borrow)]
    reasoning: Option<Text<'a>>,
    #[serde(borrow)]
    tool_calls: Option<Vec<ToolCallDelta<'a>>>,
    /// OpenRouter.
    reasoning_details: Option<Vec<serde_json::Value>>,
}

/// Streams carry `reasoning_details` in fragments keyed by `index`: text-like fields are
/// concatenated, everything else (type, id, format, signature, data) taken as sent.
fn merge_reasoning_detail(details: &mut Vec<serde_json::Value>, fragment: serde_json::Value) {
    let serde_json::Value::Object(fragment) = fragment else {
        return;
    };
    let index = fragment.get("index").and_then(serde_json::Value::as_u64);
    let existing = details
        .iter_mut()
        .find(|d| index.is_some() && d.get("index").and_then(serde_json::Value::as_u64) == index);
    let Some(serde_json::Value::Object(existing)) = existing else {
        details.push(serde_json::Value::Object(fragment));
        return;
    };
    for (key, value) in fragment {
        match (key.as_str(), existing.get_mut(&key), &value) {
            (
                "text" | "summary",
                Some(serde_json::Value::String(have)),
                serde_json::Value::String(more),
            ) => have.push_str(more),
            _ => {
                existing.insert(key, value);
            }
        }
    }
}

#[derive(Deserialize)]
struct ToolCallDelta<'a> {
    index: Option<u64>,
    #[serde(borrow)]
    id: Option<Text<'a>>,
    #[serde(borrow)]
    function: Option<FunctionDelta<'a>>,
}

#[derive(Deserialize, Default)]
struct FunctionDelta<'a> {
    #[serde(borrow)]
    name: Option<Text<'a>>,
    #[serde(borrow)]
    arguments: Option<Text<'a>>,
}

/// A JSON string, borrowed from the input when it has no escapes. (Serde's own `Cow<str>` is
/// always owned when it sits inside an `Option`.)
struct Text<'a>(Cow<'a, str>);

impl<'de: 'a, 'a> Deserialize<'de> for Text<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = Text<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E>(self, text: &'de str) -> Result<Text<'de>, E> {
                Ok(Text(Cow::Borrowed(text)))
            }
            fn visit_str<E>(self, text: &str) -> Result<Text<'de>, E> {
                Ok(Text(Cow::Owned(text.to_owned())))
            }
            fn visit_string<E>(self, text: String) -> Result<Text<'de>, E> {
                Ok(Text(Cow::Owned(text)))
            }
        }
        deserializer.deserialize_str(Visitor)
    }
}

#[derive(Deserialize)]
struct ChatUsage {
    prompt_tokens: Option<u64>,
    completion_tokens: Option<u64>,
    prompt_tokens_details: Option<PromptDetails>,
    completion_tokens_details: Option<CompletionDetails>,
    /// DeepSeek.
    prompt_cache_hit_tokens: Option<u64>,
}

#[derive(Deserialize)]
struct PromptDetails {
    cached_tokens: Option<u64>,
    /// OpenRouter.
    cache_write_tokens: Option<u64>,
}

#[derive(Deserialize)]
struct CompletionDetails {
    reasoning_tokens: Option<u64>,
}

impl ChatUsage {
    fn normalise(self) -> Usage {
        let details = self.prompt_tokens_details;
        Usage {
            input_tokens: self.prompt_tokens,
            output_tokens: self.completion_tokens,
            cache_read_tokens: details
                .as_ref()
                .and_then(|d| d.cached_tokens)
                .or(self.prompt_cache_hit_tokens),
            cache_write_tokens: details.and_then(|d| d.cache_write_tokens),
            reasoning_tokens: self
                .completion_tokens_details
                .and_then(|d| d.reasoning_tokens),
        }
    }
}

// ---- the family -------------------------------------------------------------------------------

/// OpenAI Chat Completions and the servers that speak it.
pub struct OpenAiChat;

/// OpenAI: 20 MB per image, 500 images and 50 MB of payload per request.
pub const IMAGE_LIMITS: ImageLimits = ImageLimits {
    family: "OpenAI",
    max_bytes: 20 * MB,
    max_count: 500,
    max_total_bytes: 36 * MB,
};

impl Family for OpenAiChat {
    fn endpoint_path(&self) -> &'static str {
        "/chat/completions"
    }

    fn request_body(&self, request: &ModelRequest<'_>) -> RequestBody {
        request_body(request)
    }

    fn parser(&self, provider: &str) -> Box<dyn StreamParser> {
        Box::new(ChatStreamParser::new(provider))
    }

    fn image_limits(&self) -> ImageLimits {
        IMAGE_LIMITS
    }

    fn probe(&self, model: &str) -> Value {
        let messages = json!([{"role": "user", "content": "Reply with OK."}]);
        json!({"model": model, "messages": messages, "max_tokens": 16, "stream": false})
    }
}

/// The Chat Completions request body, as the endpoint reads it.
#[derive(Debug, Serialize)]
struct ChatRequest<'a> {
    model: &'a str,
    messages: Vec<ChatMessage<'a>>,
    stream: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    stream_options: Option<StreamOptions>,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    tools: &'a [std::sync::Arc<Value>],
    /// Other servers' output limit.
    #[serde(skip_serializing_if = "Option::is_none")]
    max_tokens: Option<u32>,
    /// OpenAI's reasoning models take only this one.
    #[serde(skip_serializing_if = "Option::is_none")]
    max_completion_tokens: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reasoning_effort: Option<&'static str>,
}

#[derive(Debug, Serialize)]
struct StreamOptions {
    include_usage: bool,
}

/// One message of the conversation, by role.
#[derive(Debug, Serialize)]
#[serde(tag = "role", rename_all = "lowercase")]
enum ChatMessage<'a> {
    System {
        content: &'a str,
    },
    User {
        content: UserContent<'a>,
    },
    Assistant {
        /// `null` when the message is only tool calls.
        content: Option<&'a str>,
        #[serde(skip_serializing_if = "Option::is_none")]
        reasoning_content: Option<&'a str>,
        #[serde(skip_serializing_if = "<[_]>::is_empty")]
        reasoning_details: &'a [Value],
        #[serde(skip_serializing_if = "Vec::is_empty")]
        tool_calls: Vec<ChatToolCall<'a>>,
    },
    Tool {
        tool_call_id: &'a str,
        content: &'a str,
    },
}

/// A user message's content: its text alone, or parts (text, then images).
#[derive(Debug, Serialize)]
#[serde(untagged)]
enum UserContent<'a> {
    Text(&'a str),
    Parts(Vec<ChatPart<'a>>),
}

/// A content part: text, or an image as a data URL.
#[derive(Debug, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum ChatPart<'a> {
    Text { text: Cow<'a, str> },
    ImageUrl { image_url: ImageUrl },
}

#[derive(Debug, Serialize)]
struct ImageUrl {
    url: String,
}

impl<'a> ChatPart<'a> {
    fn text(text: impl Into<Cow<'a, str>>) -> Self {
        ChatPart::Text { text: text.into() }
    }

    /// An image the gallery shows, or the note it gives instead.
    fn image(part: Part<'_>) -> Self {
        match part {
            Part::Image { mime, base64 } => ChatPart::ImageUrl {
                image_url: ImageUrl {
                    url: images::data_url(mime, base64),
                },
            },
            Part::Note(text) => ChatPart::text(text),
        }
    }
}

#[derive(Debug, Serialize)]
struct ChatToolCall<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    function: ChatFunction<'a>,
}

#[derive(Debug, Serialize)]
struct ChatFunction<'a> {
    name: &'a str,
    arguments: String,
}

/// OpenAI Chat Completions.
pub fn request_body(request: &ModelRequest<'_>) -> RequestBody {
    let model = request.model;
    let mut messages = vec![ChatMessage::System {
        content: request.system,
    }];
    let items = items(&request.history);
    let mut gallery = gallery(IMAGE_LIMITS, request, &items);
    for item in &items {
        match item {
            Item::User(user) if user.images.is_empty() => messages.push(ChatMessage::User {
                content: UserContent::Text(&user.text),
            }),
            Item::User(user) => {
                let mut parts = vec![ChatPart::text(user.text.as_str())];
                parts.extend((user.images.iter()).map(|i| ChatPart::image(gallery.part(i))));
                messages.push(ChatMessage::User {
                    content: UserContent::Parts(parts),
                });
            }
            Item::Exchange(exchange) => {
                messages.push(assistant_message(model, exchange));
                for (call, result) in &exchange.calls {
                    messages.push(ChatMessage::Tool {
                        tool_call_id: &call.call.provider_call_id,
                        content: &result.result.content,
                    });
                }
                // A tool message is text only: the results' images follow as a user message, each
                // result's under a caption naming its call.
                let mut parts = Vec::new();
                for (call, result) in &exchange.calls {
                    if result.result.images.is_empty() {
                        continue;
                    }
                    let caption = format!(
                        "Images returned by the {} call {}:",
                        call.call.name, call.call.call_id
                    );
                    parts.push(ChatPart::text(caption));
                    parts.extend(
                        (result.result.images.iter()).map(|i| ChatPart::image(gallery.part(i))),
                    );
                }
                if !parts.is_empty() {
                    messages.push(ChatMessage::User {
                        content: UserContent::Parts(parts),
                    });
                }
            }
        }
    }
    let limit = model.max_output_tokens;
    let body = ChatRequest {
        model: &model.upstream_id,
        messages,
        stream: true,
        stream_options: (model.quirks.stream_usage).then_some(StreamOptions {
            include_usage: true,
        }),
        tools: request.tools,
        max_tokens: limit.filter(|_| !model.reasoning),
        max_completion_tokens: limit.filter(|_| model.reasoning),
        reasoning_effort: (request.parameters.effort)
            .filter(|_| model.reasoning)
            // DeepSeek-style servers know low..high; "minimal"/"max" are clamped to the nearest.
            .map(|effort| match effort {
                Effort::Minimal => "low",
                Effort::Max => "high",
                other => other.as_str(),
            }),
    };
    family::encode(&body, &model.quirks.extra_body)
}

/// The assistant's message of an exchange: its text (`null` when it only calls tools), the
/// reasoning to replay, its calls in order.
fn assistant_message<'a>(
    model: &crate::config::ModelConfig,
    exchange: &'a crate::prompting::projector::Exchange<'a>,
) -> ChatMessage<'a> {
    let assistant = exchange.assistant;
    let has_calls = !exchange.calls.is_empty();
    let (reasoning, details) = match &assistant.replay {
        Some(ProviderReplay::OpenAiChat {
            reasoning_content,
            reasoning_details,
        }) => (
            Some(reasoning_content.as_str()),
            reasoning_details.as_slice(),
        ),
        _ => (None, &[][..]),
    };
    let reasoning_content = match reasoning {
        Some(text) if !text.is_empty() => Some(text),
        // Thinking models reject tool-call messages without the field (even if empty); for
        // history from another family this is a placeholder, not invented thinking.
        _ if has_calls && model.quirks.reasoning_content_on_tool_calls => Some(""),
        _ => None,
    };
    ChatMessage::Assistant {
        content: (!(assistant.text.is_empty() && has_calls)).then_some(assistant.text.as_str()),
        reasoning_content,
        reasoning_details: details,
        tool_calls: (exchange.calls.iter())
            .map(|(call, _)| ChatToolCall {
                id: &call.call.provider_call_id,
                kind: "function",
                function: ChatFunction {
                    name: &call.call.name,
                    arguments: arguments_text(call),
                },
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each line fed alone, as if each came in its own read: deltas of different lines stay apart.
    fn feed_all(lines: &[&str]) -> Result<Vec<ResponseEvent>, ProviderError> {
        let mut parser = ChatStreamParser::new("test");
        let mut all = Vec::new();
        for line in lines {
            let mut out = Batch::new(usize::MAX);
            let done = parser.feed_data(line, &mut out)?;
            all.extend(out.drain());
            if done {
                return Ok(all);
            }
        }
        Err(ProviderError::Truncated {
            provider: "test".into(),
            missing: "data: [DONE]",
        })
    }

    #[test]
    fn text_with_usage_and_cached_tokens() {
        let events = feed_all(&[
            r#"{"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}"#,
            r#"{"choices":[{"index":0,"delta":{"content":"Hel"},"finish_reason":null}]}"#,
            r#"{"choices":[{"index":0,"delta":{"content":"lo"},"finish_reason":"stop"}]}"#,
            r#"{"choices":[],"usage":{"prompt_tokens":10,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":4},"completion_tokens_details":{"reasoning_tokens":1}}}"#,
            "[DONE]",
        ])
        .expect("complete stream");
        assert_eq!(
            events,
            vec![
                ResponseEvent::TextDelta("Hel".into()),
                ResponseEvent::TextDelta("lo".into()),
                ResponseEvent::Usage(Usage {
                    input_tokens: Some(10),
                    output_tokens: Some(2),
                    cache_read_tokens: Some(4),
                    cache_write_tokens: None,
                    reasoning_tokens: Some(1),
                }),
                ResponseEvent::Replay(ProviderReplay::OpenAiChat {
                    reasoning_content: String::new(),
                    reasoning_details: Vec::new(),
                }),
                ResponseEvent::Finished(FinishReason::Stop),
            ]
        );
    }

    #[test]
    fn strings_with_escapes_are_decoded_and_plain_ones_borrowed_alike() {
        let events = feed_all(&[
            r#"{"choices":[{"delta":{"content":"say \"hi\"\n\u00e9","tool_calls":[{"index":0,"id":"call\u005f1","function":{"name":"read","arguments":"{\"path\":"}}]}}]}"#,
            r#"{"choices":[{"delta":{"content":" plain","tool_calls":[{"index":0,"function":{"arguments":"\"a\tb\"}"}}]},"finish_reason":"tool_calls"}]}"#,
            "[DONE]",
        ])
        .expect("complete");
        assert_eq!(
            events[..5],
            [
                ResponseEvent::TextDelta("say \"hi\"\né".into()),
                ResponseEvent::ToolCallStart {
                    index: 0,
                    id: "call_1".into(),
                    name: "read".into(),
                },
                ResponseEvent::ToolArgsDelta {
                    index: 0,
                    fragment: "{\"path\":".into(),
                },
                ResponseEvent::TextDelta(" plain".into()),
                ResponseEvent::ToolArgsDelta {
                    index: 0,
                    fragment: "\"a\tb\"}".into(),
                },
            ]
        );
        assert_eq!(
            events.last(),
            Some(&ResponseEvent::Finished(FinishReason::ToolCalls))
        );
    }

    #[test]
    fn reasoning_and_content_in_one_delta_keep_their_order() {
        let events = feed_all(&[
            r#"{"choices":[{"delta":{"reasoning_content":"think","content":"say"}}]}"#,
            r#"{"choices":[{"delta":{},"finish_reason":"stop","usage":{"prompt_tokens":3,"completion_tokens":1}}]}"#,
            "[DONE]",
        ])
        .expect("complete stream");
        assert_eq!(events[0], ResponseEvent::ReasoningDelta("think".into()));
        assert_eq!(events[1], ResponseEvent::TextDelta("say".into()));
        assert_eq!(
            events[2],
            ResponseEvent::Usage(Usage {
                input_tokens: Some(3),
                output_tokens: Some(1),
                ..Usage::default()
            })
        );
        assert_eq!(
            events[3],
            ResponseEvent::Replay(ProviderReplay::OpenAiChat {
                reasoning_content: "think".into(),
                reasoning_details: Vec::new(),
            })
        );
    }

    #[test]
    fn openrouter_reasoning_details_are_merged_by_index_for_replay() {
        let events = feed_all(&[
            r#"{"choices":[{"delta":{"reasoning":"Let","reasoning_details":[{"type":"reasoning.text","text":"Let","index":0,"format":"anthropic-claude-v1"}]}}]}"#,
            r#"{"choices":[{"delta":{"reasoning":" me","reasoning_details":[{"type":"reasoning.text","text":" me","index":0}]}}]}"#,
            r#"{"choices":[{"delta":{"reasoning_details":[{"type":"reasoning.text","signature":"sig","index":0}]}}]}"#,
            r#"{"choices":[{"delta":{"content":"ok"},"finish_reason":"stop"}]}"#,
            "[DONE]",
        ])
        .expect("complete stream");
        let replay = events
            .iter()
            .find_map(|e| match e {
                ResponseEvent::Replay(r) => Some(r.clone()),
                _ => None,
            })
            .expect("replay");
        assert_eq!(
            replay,
            ProviderReplay::OpenAiChat {
                reasoning_content: "Let me".into(),
                reasoning_details: vec![serde_json::json!({
                    "type": "reasoning.text", "text": "Let me", "index": 0,
                    "format": "anthropic-claude-v1", "signature": "sig"
                })],
            }
        );
    }

    #[test]
    fn in_band_error_is_an_error() {
        let err = feed_all(&[
            r#"{"choices":[{"delta":{"content":"par"}}]}"#,
            r#"{"error":{"message":"The server had an error","type":"server_error"}}"#,
        ])
        .unwrap_err();
        assert!(
            matches!(&err, ProviderError::InBand { message, .. } if message.contains("The server had an error")),
            "{err}"
        );
    }

    #[test]
    fn done_without_finish_reason_is_truncated() {
        let err = feed_all(&[r#"{"choices":[{"delta":{"content":"x"}}]}"#, "[DONE]"]).unwrap_err();
        assert!(matches!(err, ProviderError::Truncated { .. }), "{err}");
    }

    #[test]
    fn parallel_tool_calls_get_dense_ordinals_by_index_and_id() {
        let events = feed_all(&[
            r#"{"choices":[{"delta":{"tool_calls":[{"index":1,"id":"a","function":{"name":"Read","arguments":""}}]}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"index":1,"id":"","function":{"arguments":"{\"p\":1}"}}]}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"index":1,"id":"b","function":{"name":"Grep","arguments":"{}"}}]}}]}"#,
            r#"{"choices":[{"delta":{},"finish_reason":"tool_calls"}]}"#,
            "[DONE]",
        ])
        .expect("complete stream");
        assert_eq!(
            &events[..4],
            &[
                ResponseEvent::ToolCallStart {
                    index: 0,
                    id: "a".into(),
                    name: "Read".into()
                },
                ResponseEvent::ToolArgsDelta {
                    index: 0,
                    fragment: "{\"p\":1}".into()
                },
                ResponseEvent::ToolCallStart {
                    index: 1,
                    id: "b".into(),
                    name: "Grep".into()
                },
                ResponseEvent::ToolArgsDelta {
                    index: 1,
                    fragment: "{}".into()
                },
            ]
        );
        assert_eq!(
            events.last(),
            Some(&ResponseEvent::Finished(FinishReason::ToolCalls))
        );
    }

    #[test]
    fn moonshot_and_deepseek_usage_variants() {
        let events = feed_all(&[
            r#"{"choices":[{"delta":{"content":"a"},"finish_reason":"stop","usage":{"prompt_tokens":7,"completion_tokens":1,"prompt_cache_hit_tokens":5}}]}"#,
            "[DONE]",
        ])
        .expect("complete stream");
        assert!(events.contains(&ResponseEvent::Usage(Usage {
            input_tokens: Some(7),
            output_tokens: Some(1),
            cache_read_tokens: Some(5),
            ..Usage::default()
        })));
    }
}
