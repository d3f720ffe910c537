//! Anthropic Messages: maps content-block SSE events (keyed by block index) onto `ResponseEvent`s,
//! keeps thinking blocks (text + signature, redacted data) verbatim for replay, and normalises
//! usage (Anthropic's `input_tokens` excludes cached input).
//!
//! A stream succeeds only with `message_stop`; an `error` event after HTTP 200, or EOF before
//! `message_stop`, is an error.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::{FinishReason, ProviderError, ResponseEvent, StreamParser, str_field};
use crate::model::message::ProviderReplay;
use crate::model::usage::Usage;

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

    fn stop(&mut self) -> Vec<ResponseEvent> {
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
        vec![
            ResponseEvent::Usage(self.usage()),
            ResponseEvent::Replay(ProviderReplay::Anthropic { blocks }),
            ResponseEvent::Finished(reason),
        ]
    }
}

impl StreamParser for AnthropicStreamParser {
    fn feed(
        &mut self,
        event_name: &str,
        data: &str,
    ) -> Result<(Vec<ResponseEvent>, bool), ProviderError> {
        let Some((kind, event)) = super::typed_event(&self.provider, event_name, data)? else {
            return Ok((Vec::new(), false));
        };
        let mut out = Vec::new();
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
                        if !text.is_empty() {
                            out.push(ResponseEvent::TextDelta(text.to_owned()));
                        }
                        Block::Text
                    }
                    Some("thinking") => {
                        let thinking = str_field(block, "thinking").to_owned();
                        if !thinking.is_empty() {
                            out.push(ResponseEvent::ReasoningDelta(thinking.clone()));
                        }
                        Block::Thinking {
                            thinking,
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
                        if !text.is_empty() {
                            out.push(ResponseEvent::TextDelta(text.to_owned()));
                        }
                    }
                    (Some("thinking_delta"), Block::Thinking { thinking, .. }) => {
                        let text = str_field(delta, "thinking");
                        thinking.push_str(text);
                        if !text.is_empty() {
                            out.push(ResponseEvent::ReasoningDelta(text.to_owned()));
                        }
                    }
                    (Some("signature_delta"), Block::Thinking { signature, .. }) => {
                        signature.push_str(str_field(delta, "signature"));
                    }
                    (Some("input_json_delta"), Block::ToolUse { ordinal }) => {
                        let fragment = str_field(delta, "partial_json");
                        if !fragment.is_empty() {
                            out.push(ResponseEvent::ToolArgsDelta {
                                index: *ordinal,
                                fragment: fragment.to_owned(),
                            });
                        }
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
            "message_stop" => return Ok((self.stop(), true)),
            "error" => {
                return Err(ProviderError::InBand {
                    provider: self.provider.clone(),
                    message: super::in_band_error(&event),
                });
            }
            // ping, content_block_stop
            _ => {}
        }
        Ok((out, false))
    }

    fn terminal(&self) -> &'static str {
        "message_stop"
    }
}
