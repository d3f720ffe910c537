//! OpenAI Responses: maps the typed SSE events of a streaming, stateless (`store: false`) call onto
//! `ResponseEvent`s, and keeps the response's output items verbatim for replay; the family's request
//! body (`Family::request_body`), image limits and probe.
//!
//! A stream succeeds only with `response.completed` or `response.incomplete`; `error`,
//! `response.failed`, or EOF before a terminal event is an error.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};

use serde::Serialize;
use serde_json::Value;

use super::family::{self, Family};
use super::{
    Batch, FinishReason, ProviderError, RequestBody, ResponseEvent, StreamParser, str_field,
};
use crate::model::message::ProviderReplay;
use crate::model::usage::Usage;
use crate::prompting::compiler::{Effort, ModelRequest};
use crate::prompting::images::{self, ImageLimits, Part};
use crate::prompting::projector::{Item, arguments_text, gallery, items, replayable_arguments};
use serde_json::json;

pub struct ResponsesStreamParser {
    provider: String,
    /// `output_index` and item id of each function call → our dense ordinal.
    by_output_index: HashMap<u64, usize>,
    by_item_id: HashMap<String, usize>,
    next_ordinal: usize,
    /// Items from `response.output_item.done`, by output index (the final form: a reasoning item's
    /// `encrypted_content` differs from the one in `.added`).
    items: BTreeMap<u64, Value>,
}

impl ResponsesStreamParser {
    pub fn new(provider: &str) -> Self {
        ResponsesStreamParser {
            provider: provider.to_owned(),
            by_output_index: HashMap::new(),
            by_item_id: HashMap::new(),
            next_ordinal: 0,
            items: BTreeMap::new(),
        }
    }

    fn error(&self, message: String) -> ProviderError {
        ProviderError::InBand {
            provider: self.provider.clone(),
            message,
        }
    }

    fn ordinal(&self, event: &Value) -> Option<usize> {
        event
            .get("item_id")
            .and_then(Value::as_str)
            .and_then(|id| self.by_item_id.get(id))
            .or_else(|| {
                event
                    .get("output_index")
                    .and_then(Value::as_u64)
                    .and_then(|i| self.by_output_index.get(&i))
            })
            .copied()
    }

    fn finish(&mut self, response: &Value, reason: FinishReason, out: &mut Batch) {
        if let Some(usage) = response.get("usage").filter(|u| !u.is_null()) {
            out.push(ResponseEvent::Usage(usage_of(usage)));
        }
        let items: Vec<Value> = match response.get("output").and_then(Value::as_array) {
            Some(output) if !output.is_empty() => output.clone(),
            _ => std::mem::take(&mut self.items).into_values().collect(),
        };
        out.push(ResponseEvent::Replay(ProviderReplay::OpenAiResponses {
            items,
        }));
        out.push(ResponseEvent::Finished(reason));
    }
}

fn usage_of(usage: &Value) -> Usage {
    let number = |pointer: &str| usage.pointer(pointer).and_then(Value::as_u64);
    Usage {
        input_tokens: number("/input_tokens"),
        output_tokens: number("/output_tokens"),
        cache_read_tokens: number("/input_tokens_details/cached_tokens"),
        cache_write_tokens: None,
        reasoning_tokens: number("/output_tokens_details/reasoning_tokens"),
    }
}

impl StreamParser for ResponsesStreamParser {
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
            "response.output_item.added" => {
                let item = &event["item"];
                if item["type"] == "function_call" {
                    let ordinal = self.next_ordinal;
                    self.next_ordinal += 1;
                    if let Some(index) = event.get("output_index").and_then(Value::as_u64) {
                        self.by_output_index.insert(index, ordinal);
                    }
                    if let Some(id) = item.get("id").and_then(Value::as_str) {
                        self.by_item_id.insert(id.to_owned(), ordinal);
                    }
                    out.push(ResponseEvent::ToolCallStart {
                        index: ordinal,
                        id: str_field(item, "call_id").to_owned(),
                        name: str_field(item, "name").to_owned(),
                    });
                    let arguments = str_field(item, "arguments");
                    out.args(ordinal, arguments);
                }
            }
            "response.function_call_arguments.delta" => {
                let ordinal = self.ordinal(&event).ok_or_else(|| ProviderError::Decode {
                    provider: self.provider.clone(),
                    message: "function call arguments for an unknown item".to_owned(),
                })?;
                let delta = str_field(&event, "delta");
                out.args(ordinal, delta);
            }
            "response.output_text.delta" | "response.refusal.delta" => {
                let delta = str_field(&event, "delta");
                out.text(delta);
            }
            "response.reasoning_summary_text.delta" | "response.reasoning_text.delta" => {
                let delta = str_field(&event, "delta");
                out.reasoning(delta);
            }
            // Separate summary parts the way they are shown elsewhere: as paragraphs.
            "response.reasoning_summary_part.added"
                if event
                    .get("summary_index")
                    .and_then(Value::as_u64)
                    .is_some_and(|i| i > 0) =>
            {
                out.push(ResponseEvent::ReasoningDelta("\n\n".to_owned()));
            }
            "response.output_item.done" => {
                if let Some(index) = event.get("output_index").and_then(Value::as_u64) {
                    self.items.insert(index, event["item"].clone());
                }
            }
            "response.completed" => {
                let reason = if self.next_ordinal > 0 {
                    FinishReason::ToolCalls
                } else {
                    FinishReason::Stop
                };
                self.finish(&event["response"], reason, out);
                return Ok(true);
            }
            "response.incomplete" => {
                let response = &event["response"];
                let reason = match response
                    .pointer("/incomplete_details/reason")
                    .and_then(Value::as_str)
                {
                    Some("max_output_tokens") => FinishReason::Length,
                    Some("content_filter") => FinishReason::ContentFilter,
                    Some(other) => FinishReason::Other(other.to_owned()),
                    None => FinishReason::Other("incomplete".to_owned()),
                };
                self.finish(response, reason, out);
                return Ok(true);
            }
            "response.failed" => {
                let response = &event["response"];
                let message = response
                    .pointer("/error/message")
                    .and_then(Value::as_str)
                    .unwrap_or("response.failed");
                let code = response.pointer("/error/code").and_then(Value::as_str);
                return Err(self.error(match code {
                    Some(code) => format!("{message} ({code})"),
                    None => message.to_owned(),
                }));
            }
            "error" => return Err(self.error(super::in_band_error(&event))),
            // Lifecycle and `.done` echoes carry nothing the deltas did not.
            _ => {}
        }
        Ok(false)
    }

    fn terminal(&self) -> &'static str {
        "response.completed"
    }
}

// ---- the family -------------------------------------------------------------------------------

/// OpenAI Responses, called statelessly.
pub struct OpenAiResponses;

/// OpenAI's limits, as for Chat Completions.
pub const IMAGE_LIMITS: ImageLimits = super::openai_chat::IMAGE_LIMITS;

impl Family for OpenAiResponses {
    fn endpoint_path(&self) -> &'static str {
        "/responses"
    }

    fn request_body(&self, request: &ModelRequest<'_>) -> RequestBody {
        request_body(request)
    }

    fn parser(&self, provider: &str) -> Box<dyn StreamParser> {
        Box::new(ResponsesStreamParser::new(provider))
    }

    fn image_limits(&self) -> ImageLimits {
        IMAGE_LIMITS
    }

    fn probe(&self, model: &str) -> Value {
        json!({"model": model, "input": "Reply with OK.", "max_output_tokens": 16, "stream": false})
    }
}

/// The Responses request body, as the endpoint reads it.
#[derive(Debug, Serialize)]
struct ResponsesRequest<'a> {
    model: &'a str,
    instructions: &'a str,
    input: Vec<InputItem<'a>>,
    stream: bool,
    /// Stateless: nothing is kept on the provider's side; reasoning is replayed.
    store: bool,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<ResponsesTool<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_output_tokens: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reasoning: Option<Reasoning>,
    #[serde(skip_serializing_if = "Option::is_none")]
    include: Option<[&'static str; 1]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    service_tier: Option<&'static str>,
}

/// One item of the input.
#[derive(Debug, Serialize)]
#[serde(untagged)]
enum InputItem<'a> {
    Message(InputMessage<'a>),
    Typed(TypedItem<'a>),
    /// A replayed item, exactly as the provider sent it (arguments normalised).
    Verbatim(Value),
}

#[derive(Debug, Serialize)]
struct InputMessage<'a> {
    role: &'static str,
    content: Content<'a>,
}

/// A message's content or a call's output: its text, or parts (text, then images).
#[derive(Debug, Serialize)]
#[serde(untagged)]
enum Content<'a> {
    Text(&'a str),
    Parts(Vec<InputPart<'a>>),
}

/// A content part: text, or an image as a data URL.
#[derive(Debug, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum InputPart<'a> {
    InputText { text: Cow<'a, str> },
    InputImage { image_url: String },
}

impl<'a> InputPart<'a> {
    fn text(text: impl Into<Cow<'a, str>>) -> Self {
        InputPart::InputText { text: text.into() }
    }

    /// An image the gallery shows, or the note it gives instead.
    fn image(part: Part<'_>) -> Self {
        match part {
            Part::Image { mime, base64 } => InputPart::InputImage {
                image_url: images::data_url(mime, base64),
            },
            Part::Note(text) => InputPart::text(text),
        }
    }
}

#[derive(Debug, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum TypedItem<'a> {
    FunctionCall {
        call_id: &'a str,
        name: &'a str,
        arguments: String,
    },
    FunctionCallOutput {
        call_id: &'a str,
        output: Content<'a>,
    },
}

/// A tool of the request in the Responses shape (flat, not under `function`).
#[derive(Debug, Serialize)]
struct ResponsesTool<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    name: &'a Value,
    description: &'a Value,
    parameters: &'a Value,
    strict: bool,
}

#[derive(Debug, Serialize)]
struct Reasoning {
    summary: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    effort: Option<&'static str>,
}

/// OpenAI Responses, stateless: `store: false`, reasoning replayed from its encrypted content.
pub fn request_body(request: &ModelRequest<'_>) -> RequestBody {
    let model = request.model;
    let mut input = Vec::new();
    let items = items(&request.history);
    let mut gallery = gallery(IMAGE_LIMITS, request, &items);
    for item in &items {
        match item {
            Item::User(user) if user.images.is_empty() => {
                input.push(InputItem::Message(InputMessage {
                    role: "user",
                    content: Content::Text(&user.text),
                }))
            }
            Item::User(user) => {
                let mut parts = vec![InputPart::text(user.text.as_str())];
                parts.extend((user.images.iter()).map(|i| InputPart::image(gallery.part(i))));
                input.push(InputItem::Message(InputMessage {
                    role: "user",
                    content: Content::Parts(parts),
                }));
            }
            Item::Exchange(exchange) => {
                assistant_items(exchange, &mut input);
                for (call, result) in &exchange.calls {
                    let output = if result.result.images.is_empty() {
                        Content::Text(&result.result.content)
                    } else {
                        let shown = (result.result.images.iter())
                            .map(|i| InputPart::image(gallery.part(i)));
                        let text = InputPart::text(result.result.content.as_str());
                        Content::Parts(std::iter::once(text).chain(shown).collect())
                    };
                    input.push(InputItem::Typed(TypedItem::FunctionCallOutput {
                        call_id: &call.call.provider_call_id,
                        output,
                    }));
                }
            }
        }
    }
    let tools = (request.tools.iter())
        .map(|tool| {
            let function = &tool["function"];
            ResponsesTool {
                kind: "function",
                name: &function["name"],
                description: &function["description"],
                parameters: &function["parameters"],
                strict: false,
            }
        })
        .collect();
    let reasoning = model.reasoning.then(|| Reasoning {
        summary: "auto",
        effort: request.parameters.effort.map(|effort| match effort {
            Effort::Max => "high",
            other => other.as_str(),
        }),
    });
    let body = ResponsesRequest {
        model: &model.upstream_id,
        instructions: request.system,
        input,
        stream: true,
        store: false,
        tools,
        max_output_tokens: model.max_output_tokens,
        reasoning,
        include: model.reasoning.then_some(["reasoning.encrypted_content"]),
        service_tier: request.parameters.fast.then_some("priority"),
    };
    family::encode(&body, &model.quirks.extra_body)
}

/// What the model said in an exchange: its own items replayed (this family produced them), or its
/// text and calls rebuilt.
fn assistant_items<'a>(
    exchange: &'a crate::prompting::projector::Exchange<'a>,
    input: &mut Vec<InputItem<'a>>,
) {
    let answered: Vec<&str> = (exchange.calls.iter())
        .map(|(call, _)| call.call.provider_call_id.as_str())
        .collect();
    match &exchange.assistant.replay {
        Some(ProviderReplay::OpenAiResponses { items }) => {
            // Verbatim and in order, so each reasoning item keeps the item after it; a function
            // call that never got its result is the only thing left out.
            for item in items {
                let unanswered = item["type"] == "function_call"
                    && !answered.contains(&item["call_id"].as_str().unwrap_or_default());
                if unanswered {
                    continue;
                }
                let mut item = item.clone();
                // Arguments are normalised like everywhere else (empty, cut off).
                if item["type"] == "function_call"
                    && let Some(raw) = item["arguments"].as_str()
                {
                    item["arguments"] = replayable_arguments(raw).into();
                }
                input.push(InputItem::Verbatim(item));
            }
        }
        _ => {
            if !exchange.assistant.text.is_empty() {
                input.push(InputItem::Message(InputMessage {
                    role: "assistant",
                    content: Content::Text(&exchange.assistant.text),
                }));
            }
            for (call, _) in &exchange.calls {
                input.push(InputItem::Typed(TypedItem::FunctionCall {
                    call_id: &call.call.provider_call_id,
                    name: &call.call.name,
                    arguments: arguments_text(call),
                }));
            }
        }
    }
}
