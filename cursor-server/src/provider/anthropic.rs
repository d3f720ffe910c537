//! Anthropic Messages: maps content-block SSE events (keyed by block index) onto `ResponseEvent`s,
//! keeps thinking blocks (text + signature, redacted data) verbatim for replay, and normalises
//! usage (Anthropic's `input_tokens` excludes cached input); the family's request body
//! (`Family::request_body`, with its prompt-cache breakpoints), image limits and probe.
//!
//! A stream succeeds only with `message_stop`; an `error` event after HTTP 200, or EOF before
//! `message_stop`, is an error.

use std::borrow::Cow;
use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::{Value, json};

use super::family::{self, Family};
use super::{
    Batch, FinishReason, ProviderError, RequestBody, ResponseEvent, StreamParser, str_field,
};
use crate::config::Secret;
use crate::model::message::ProviderReplay;
use crate::model::usage::Usage;
use crate::prompting::compiler::{Effort, ModelRequest};
use crate::prompting::images::{ImageLimits, MB, Part};
use crate::prompting::projector::{Item, arguments_text, gallery, items};

pub const API_VERSION: &str = "2023-06-01";

#[derive(Debug)]
enum Block {
    Text,
    Thinking { thinking: String, signature: String },
    Redacted { data: String },
    ToolUse { ordinal: usize },
}

pub struct AnthropicStreamParser {
    provider: String,
    blocks: BTreeMap<u64, Block>,
    next_ordinal: usize,
    input_tokens: Option<u64>,
    cache_read: Option<u64>,
    cache_write: Option<u64>,
    output_tokens: Option<u64>,
    thinking_tokens: Option<u64>,
    stop_reason: Option<String>,
}

impl AnthropicStreamParser {
    pub fn new(provider: &str) -> Self {
        AnthropicStreamParser {
            provider: provider.to_owned(),
            blocks: BTreeMap::new(),
            next_ordinal: 0,
            input_tokens: None,
            cache_read: None,
            cache_write: None,
            output_tokens: None,
            thinking_tokens: None,
            stop_reason: None,
        }
    }

    fn decode_error(&self, message: String) -> ProviderError {
        ProviderError::Decode {
            provider: self.provider.clone(),
            message,
        }
    }

    /// `message_start` and `message_delta` usage: the later, cumulative numbers win.
    fn take_usage(&mut self, usage: &Value) {
        let number = |field: &str| usage.get(field).and_then(Value::as_u64);
        if let Some(v) = number("input_tokens") {
            self.input_tokens = Some(v);
        }
        if let Some(v) = number("cache_read_input_tokens") {
            self.cache_read = Some(v);
        }
        if let Some(v) = number("cache_creation_input_tokens") {
            self.cache_write = Some(v);
        }
        if let Some(v) = number("output_tokens") {
            self.output_tokens = Some(v);
        }
        if let Some(v) = usage
            .pointer("/output_tokens_details/thinking_tokens")
            .and_then(Value::as_u64)
        {
            self.thinking_tokens = Some(v);
        }
    }

    fn usage(&self) -> Usage {
        let input = self
            .input_tokens
            .map(|input| input + self.cache_read.unwrap_or(0) + self.cache_write.unwrap_or(0));
        Usage {
            input_tokens: input,
            output_tokens: self.output_tokens,
            cache_read_tokens: self.cache_read,
            cache_write_tokens: self.cache_write,
            reasoning_tokens: self.thinking_tokens,
        }
    }

    fn stop(&mut self, out: &mut Batch) {
        let blocks: Vec<Value> = self
            .blocks
            .values()
            .filter_map(|block| match block {
                Block::Thinking {
                    thinking,
                    signature,
                } => {
                    Some(json!({"type": "thinking", "thinking": thinking, "signature": signature}))
                }
                Block::Redacted { data } => {
                    Some(json!({"type": "redacted_thinking", "data": data}))
                }
                Block::Text | Block::ToolUse { .. } => None,
            })
            .collect();
        let reason = match self.stop_reason.as_deref() {
            Some("end_turn") | Some("stop_sequence") | None => FinishReason::Stop,
            Some("tool_use") => FinishReason::ToolCalls,
            Some("max_tokens") | Some("model_context_window_exceeded") => FinishReason::Length,
            Some("refusal") => FinishReason::ContentFilter,
            Some(other) => FinishReason::Other(other.to_owned()),
        };
        let reason = match reason {
            FinishReason::Stop | FinishReason::Other(_) if self.next_ordinal > 0 => {
                FinishReason::ToolCalls
            }
            other => other,
        };
        out.push(ResponseEvent::Usage(self.usage()));
        out.push(ResponseEvent::Replay(ProviderReplay::Anthropic { blocks }));
        out.push(ResponseEvent::Finished(reason));
    }
}

impl StreamParser for AnthropicStreamParser {
    fn feed(
        &mut self,
        event_name: &str,
        data: &str,
        out: &mut Batch,
    ) -> Result<bool, ProviderError> {
        let Some((kind, event)) = super::typed_event(&self.provider, event_name, data)? else {
            return Ok(false);
        };
        match kind.as_str() {
            "message_start" => {
                if let Some(usage) = event.pointer("/message/usage") {
                    self.take_usage(usage);
                }
            }
            "content_block_start" => {
                let index = event.get("index").and_then(Value::as_u64).ok_or_else(|| {
                    self.decode_error("content_block_start without index".to_owned())
                })?;
                let block = &event["content_block"];
                let parsed = match block["type"].as_str() {
                    Some("text") => {
                        let text = str_field(block, "text");
                        out.text(text);
                        Block::Text
                    }
                    Some("thinking") => {
                        let thinking = str_field(block, "thinking");
                        out.reasoning(thinking);
                        Block::Thinking {
                            thinking: thinking.to_owned(),
                            signature: str_field(block, "signature").to_owned(),
                        }
                    }
                    Some("redacted_thinking") => Block::Redacted {
                        data: str_field(block, "data").to_owned(),
                    },
                    Some("tool_use") => {
                        let ordinal = self.next_ordinal;
                        self.next_ordinal += 1;
                        out.push(ResponseEvent::ToolCallStart {
                            index: ordinal,
                            id: str_field(block, "id").to_owned(),
                            name: str_field(block, "name").to_owned(),
                        });
                        Block::ToolUse { ordinal }
                    }
                    other => {
                        tracing::debug!(provider = %self.provider, "ignoring content block type {other:?}");
                        Block::Text
                    }
                };
                self.blocks.insert(index, parsed);
            }
            "content_block_delta" => {
                let index = event
                    .get("index")
                    .and_then(Value::as_u64)
                    .unwrap_or(u64::MAX);
                let delta = &event["delta"];
                let Some(block) = self.blocks.get_mut(&index) else {
                    return Err(
                        self.decode_error(format!("delta for block {index}, which never started"))
                    );
                };
                match (delta["type"].as_str(), block) {
                    (Some("text_delta"), _) => {
                        let text = str_field(delta, "text");
                        out.text(text);
                    }
                    (Some("thinking_delta"), Block::Thinking { thinking, .. }) => {
                        let text = str_field(delta, "thinking");
                        thinking.push_str(text);
                        out.reasoning(text);
                    }
                    (Some("signature_delta"), Block::Thinking { signature, .. }) => {
                        signature.push_str(str_field(delta, "signature"));
                    }
                    (Some("input_json_delta"), Block::ToolUse { ordinal }) => {
                        let fragment = str_field(delta, "partial_json");
                        out.args(*ordinal, fragment);
                    }
                    (other, block) => {
                        let message = format!("delta {other:?} does not fit block {block:?}");
                        return Err(ProviderError::Decode {
                            provider: self.provider.clone(),
                            message,
                        });
                    }
                }
            }
            "message_delta" => {
                if let Some(reason) = event.pointer("/delta/stop_reason").and_then(Value::as_str) {
                    self.stop_reason = Some(reason.to_owned());
                }
                if let Some(usage) = event.get("usage") {
                    self.take_usage(usage);
                }
            }
            "message_stop" => {
                self.stop(out);
                return Ok(true);
            }
            "error" => {
                return Err(ProviderError::InBand {
                    provider: self.provider.clone(),
                    message: super::in_band_error(&event),
                });
            }
            // ping, content_block_stop
            _ => {}
        }
        Ok(false)
    }

    fn terminal(&self) -> &'static str {
        "message_stop"
    }
}

// ---- the family -------------------------------------------------------------------------------

/// Anthropic Messages.
pub struct Anthropic;

/// Anthropic: 5 MB per image and 100 images per request through the API, in a request of at most
/// 32 MB.
pub const IMAGE_LIMITS: ImageLimits = ImageLimits {
    family: "Anthropic",
    max_bytes: 5 * MB,
    max_count: 100,
    max_total_bytes: 20 * MB,
};

impl Family for Anthropic {
    fn endpoint_path(&self) -> &'static str {
        "/messages"
    }

    fn authorize(&self, request: reqwest::RequestBuilder, key: &Secret) -> reqwest::RequestBuilder {
        request
            .header("x-api-key", key.expose())
            .header("anthropic-version", API_VERSION)
    }

    fn request_body(&self, request: &ModelRequest<'_>) -> RequestBody {
        request_body(request)
    }

    fn parser(&self, provider: &str) -> Box<dyn StreamParser> {
        Box::new(AnthropicStreamParser::new(provider))
    }

    fn image_limits(&self) -> ImageLimits {
        IMAGE_LIMITS
    }

    fn probe(&self, model: &str) -> Value {
        let messages = json!([{"role": "user", "content": "Reply with OK."}]);
        json!({"model": model, "messages": messages, "max_tokens": 16})
    }
}

/// Anthropic requires tool ids matching `^[a-zA-Z0-9_-]+$`; ids from other families are mapped
/// deterministically, the same way on the call and on its result.
fn anthropic_tool_id(id: &str) -> String {
    let mapped: String = id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if mapped.is_empty() {
        "tool".to_owned()
    } else {
        mapped
    }
}

/// The Messages request body, as the endpoint reads it.
#[derive(Debug, Serialize)]
struct MessagesRequest<'a> {
    model: &'a str,
    max_tokens: u32,
    system: [ContentBlock<'a>; 1],
    messages: Vec<Turn<'a>>,
    stream: bool,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<Tool<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    thinking: Option<Thinking>,
    #[serde(skip_serializing_if = "Option::is_none")]
    output_config: Option<OutputConfig>,
}

/// A prompt-cache breakpoint: everything up to it is reused by the next request.
#[derive(Debug, Clone, Copy, Serialize)]
struct CacheControl {
    #[serde(rename = "type")]
    kind: &'static str,
}

const EPHEMERAL: CacheControl = CacheControl { kind: "ephemeral" };

/// One turn of the conversation: consecutive same-role turns are merged into one.
#[derive(Debug, Serialize)]
struct Turn<'a> {
    role: &'static str,
    content: Vec<ContentBlock<'a>>,
}

/// A content block of the system prompt or a turn, with the prompt-cache breakpoint the system
/// prompt and the request's last block carry.
#[derive(Debug, Serialize)]
struct ContentBlock<'a> {
    #[serde(flatten)]
    content: Content<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cache_control: Option<CacheControl>,
}

/// What a content block holds, by its `type`.
#[derive(Debug, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Content<'a> {
    Text {
        text: Cow<'a, str>,
    },
    Image {
        source: ImageSource<'a>,
    },
    ToolUse {
        id: String,
        name: &'a str,
        /// The call's arguments as an object (unparseable ones wrapped as `invalid_arguments`).
        input: Value,
    },
    ToolResult {
        tool_use_id: String,
        content: ToolResultContent<'a>,
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        is_error: bool,
    },
    /// A thinking or redacted-thinking block, replayed exactly as the model sent it (its
    /// signature covers its bytes).
    #[serde(untagged)]
    Replayed(&'a Value),
}

#[derive(Debug, Serialize)]
#[serde(tag = "type", rename = "base64")]
struct ImageSource<'a> {
    media_type: &'static str,
    data: &'a str,
}

/// A tool result's content: its text alone, or its text and the images it returned.
#[derive(Debug, Serialize)]
#[serde(untagged)]
enum ToolResultContent<'a> {
    Text(&'a str),
    Blocks(Vec<ContentBlock<'a>>),
}

impl<'a> ContentBlock<'a> {
    fn new(content: Content<'a>) -> Self {
        ContentBlock {
            content,
            cache_control: None,
        }
    }

    fn text(text: impl Into<Cow<'a, str>>) -> Self {
        ContentBlock::new(Content::Text { text: text.into() })
    }

    /// An image the gallery shows, or the note it gives instead.
    fn image(part: Part<'a>) -> Self {
        match part {
            Part::Image { mime, base64 } => ContentBlock::new(Content::Image {
                source: ImageSource {
                    media_type: mime.as_str(),
                    data: base64,
                },
            }),
            Part::Note(text) => ContentBlock::text(text),
        }
    }
}

#[derive(Debug, Serialize)]
struct Tool<'a> {
    name: &'a Value,
    description: &'a Value,
    input_schema: &'a Value,
    #[serde(skip_serializing_if = "Option::is_none")]
    cache_control: Option<CacheControl>,
}

#[derive(Debug, Serialize)]
#[serde(tag = "type", rename_all = "lowercase")]
enum Thinking {
    Enabled { budget_tokens: u32 },
    Adaptive,
}

#[derive(Debug, Serialize)]
struct OutputConfig {
    effort: &'static str,
}

/// Anthropic Messages, with prompt-cache breakpoints on the system prompt, the tools and the last
/// message (3 of the 4 allowed): everything before the newest message is reused next time.
pub fn request_body(request: &ModelRequest<'_>) -> RequestBody {
    let model = request.model;
    let mut messages: Vec<Turn<'_>> = Vec::new();
    let items = items(&request.history);
    let mut gallery = gallery(IMAGE_LIMITS, request, &items);
    for item in items {
        match item {
            Item::User(user) => {
                // Images first: Claude reads an image best before the text about it.
                let mut blocks: Vec<ContentBlock<'_>> = (user.images.iter())
                    .map(|i| ContentBlock::image(gallery.part(i)))
                    .collect();
                if !user.text.is_empty() {
                    blocks.push(ContentBlock::text(user.text.as_str()));
                }
                push(&mut messages, "user", blocks);
            }
            Item::Exchange(exchange) => {
                push(
                    &mut messages,
                    "assistant",
                    assistant_blocks(model, &exchange),
                );
                let results = (exchange.calls.iter())
                    .map(|(call, result)| {
                        let text = if result.result.content.is_empty() {
                            "(no output)"
                        } else {
                            result.result.content.as_str()
                        };
                        let content = if result.result.images.is_empty() {
                            ToolResultContent::Text(text)
                        } else {
                            let shown = (result.result.images.iter())
                                .map(|i| ContentBlock::image(gallery.part(i)));
                            ToolResultContent::Blocks(
                                std::iter::once(ContentBlock::text(text))
                                    .chain(shown)
                                    .collect(),
                            )
                        };
                        ContentBlock::new(Content::ToolResult {
                            tool_use_id: anthropic_tool_id(&call.call.provider_call_id),
                            content,
                            is_error: result.result.is_error,
                        })
                    })
                    .collect();
                push(&mut messages, "user", results);
            }
        }
    }
    if let Some(last) = messages.last_mut().and_then(|m| m.content.last_mut()) {
        last.cache_control = Some(EPHEMERAL);
    }
    let mut tools: Vec<Tool<'_>> = (request.tools.iter())
        .map(|tool| {
            let function = &tool["function"];
            Tool {
                name: &function["name"],
                description: &function["description"],
                input_schema: &function["parameters"],
                cache_control: None,
            }
        })
        .collect();
    if let Some(last) = tools.last_mut() {
        last.cache_control = Some(EPHEMERAL);
    }
    let (thinking, output_config) = match (model.reasoning, model.thinking_budget) {
        (false, _) => (None, None),
        (true, Some(budget)) => (
            Some(Thinking::Enabled {
                budget_tokens: budget,
            }),
            None,
        ),
        (true, None) => (
            Some(Thinking::Adaptive),
            request.parameters.effort.map(|effort| OutputConfig {
                effort: match effort {
                    Effort::Minimal => "low",
                    other => other.as_str(),
                },
            }),
        ),
    };
    let body = MessagesRequest {
        model: &model.upstream_id,
        max_tokens: model.output_limit(),
        system: [ContentBlock {
            cache_control: Some(EPHEMERAL),
            ..ContentBlock::text(request.system)
        }],
        messages,
        stream: true,
        tools,
        thinking,
        output_config,
    };
    family::encode(&body, &model.quirks.extra_body)
}

/// Adds a turn's blocks, merged into the previous turn when it has the same role (a failed turn
/// followed by a new message).
fn push<'a>(messages: &mut Vec<Turn<'a>>, role: &'static str, blocks: Vec<ContentBlock<'a>>) {
    if blocks.is_empty() {
        return;
    }
    match messages.last_mut() {
        Some(last) if last.role == role => last.content.extend(blocks),
        _ => messages.push(Turn {
            role,
            content: blocks,
        }),
    }
}

/// The assistant's blocks of an exchange: its signed thinking (replayed only to the model that
/// produced it), its text, its calls with their arguments as an object.
fn assistant_blocks<'a>(
    model: &crate::config::ModelConfig,
    exchange: &crate::prompting::projector::Exchange<'a>,
) -> Vec<ContentBlock<'a>> {
    let assistant = exchange.assistant;
    let mut blocks = Vec::new();
    if let Some(ProviderReplay::Anthropic { blocks: thinking }) = &assistant.replay
        && assistant.model_id == model.id
    {
        blocks.extend(
            thinking
                .iter()
                .map(|b| ContentBlock::new(Content::Replayed(b))),
        );
    }
    if !assistant.text.is_empty() {
        blocks.push(ContentBlock::text(assistant.text.as_str()));
    }
    for (call, _) in &exchange.calls {
        let input: Value = serde_json::from_str(&arguments_text(call))
            .ok()
            .filter(Value::is_object)
            .unwrap_or_else(|| json!({ "invalid_arguments": call.call.arguments }));
        blocks.push(ContentBlock::new(Content::ToolUse {
            id: anthropic_tool_id(&call.call.provider_call_id),
            name: call.call.name.as_str(),
            input,
        }));
    }
    blocks
}
