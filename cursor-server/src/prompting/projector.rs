//! Projects a `ModelRequest` into a provider's request body. Pure: the same history always gives the
//! same bytes, and appending to history only appends to the projected messages.
//!
//! Tool calls are stored one record per call as each completes; the projection gathers them back
//! onto the assistant message of their model call, in call order, followed by their results in the
//! same order. A call without a stored result (a batch cut short) is left out, never sent unanswered.
//! Opaque reasoning is replayed only to the endpoint family (and, for Anthropic signatures, the
//! model) that produced it; from anywhere else it is dropped, never faked or turned into text.

use std::collections::HashMap;

use serde_json::{Map, Value, json};

use super::compiler::{Effort, ModelRequest};
use super::images::{self, Gallery};
use crate::config::ProviderKind;
use crate::model::conversation::ImageRef;
use crate::model::message::{
    AssistantMessage, CanonicalMessage, ProviderReplay, ToolCallRecord, ToolResultRecord,
    UserMessage,
};

/// The request body for `kind`.
pub fn project(kind: ProviderKind, request: &ModelRequest<'_>) -> Value {
    let mut body = match kind {
        ProviderKind::OpenAiChat => openai_chat(request),
        ProviderKind::OpenAiResponses => openai_responses(request),
        ProviderKind::Anthropic => anthropic(request),
    };
    if let Some(object) = body.as_object_mut() {
        for (key, value) in &request.model.quirks.extra_body {
            object.insert(key.clone(), value.clone());
        }
    }
    body
}

/// One assistant message with the calls that were answered and their results, in call order.
struct Exchange<'a> {
    assistant: &'a AssistantMessage,
    calls: Vec<(&'a ToolCallRecord, &'a ToolResultRecord)>,
}

enum Item<'a> {
    User(&'a UserMessage),
    Exchange(Exchange<'a>),
}

/// The images the items show, in the order the request shows them (for the family's limits).
fn gallery<'a>(kind: ProviderKind, request: &ModelRequest<'a>, items: &[Item<'_>]) -> Gallery<'a> {
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
    Gallery::new(kind, request.model, request.images, all.into_iter())
}

/// History regrouped into user messages and assistant exchanges.
fn items<'a>(history: &[&'a CanonicalMessage]) -> Vec<Item<'a>> {
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

fn arguments_text(record: &ToolCallRecord) -> String {
    replayable_arguments(&record.call.arguments)
}

/// A call's arguments as they can be sent back: as the model wrote them when they are a JSON
/// object (byte for byte, for prefix caches), `{}` when empty, and otherwise (arguments the output
/// limit cut off) wrapped as `{"invalid_arguments": "..."}`. Strict servers (llama.cpp, vLLM) parse
/// replayed arguments and refuse every later request over one that is not JSON.
fn replayable_arguments(raw: &str) -> String {
    if raw.trim().is_empty() {
        return "{}".to_owned();
    }
    match serde_json::from_str::<Value>(raw) {
        Ok(Value::Object(_)) => raw.to_owned(),
        _ => json!({ "invalid_arguments": raw }).to_string(),
    }
}

/// OpenAI Chat Completions.
pub fn openai_chat(request: &ModelRequest<'_>) -> Value {
    let model = request.model;
    let mut messages = vec![json!({ "role": "system", "content": request.system })];
    let items = items(&request.history);
    let mut gallery = gallery(ProviderKind::OpenAiChat, request, &items);
    for item in items {
        match item {
            Item::User(user) if user.images.is_empty() => {
                messages.push(json!({ "role": "user", "content": user.text }))
            }
            Item::User(user) => {
                let mut parts = vec![json!({ "type": "text", "text": user.text })];
                parts.extend(
                    user.images
                        .iter()
                        .map(|i| images::chat_part(gallery.part(i))),
                );
                messages.push(json!({ "role": "user", "content": parts }));
            }
            Item::Exchange(exchange) => {
                let assistant = exchange.assistant;
                let mut out = Map::new();
                out.insert("role".into(), "assistant".into());
                let has_calls = !exchange.calls.is_empty();
                out.insert(
                    "content".into(),
                    if assistant.text.is_empty() && has_calls {
                        Value::Null
                    } else {
                        Value::String(assistant.text.clone())
                    },
                );
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
                if !details.is_empty() {
                    out.insert("reasoning_details".into(), Value::Array(details.to_vec()));
                }
                match reasoning {
                    Some(text) if !text.is_empty() => {
                        out.insert("reasoning_content".into(), text.into());
                    }
                    // Thinking models reject tool-call messages without the field (even if empty);
                    // for history from another family this is a placeholder, not invented thinking.
                    _ if has_calls && model.quirks.reasoning_content_on_tool_calls => {
                        out.insert("reasoning_content".into(), "".into());
                    }
                    _ => {}
                }
                if has_calls {
                    let calls: Vec<Value> = exchange
                        .calls
                        .iter()
                        .map(|(call, _)| {
                            json!({
                                "id": call.call.provider_call_id,
                                "type": "function",
                                "function": { "name": call.call.name, "arguments": arguments_text(call) },
                            })
                        })
                        .collect();
                    out.insert("tool_calls".into(), Value::Array(calls));
                }
                messages.push(Value::Object(out));
                for (call, result) in &exchange.calls {
                    messages.push(json!({
                        "role": "tool",
                        "tool_call_id": call.call.provider_call_id,
                        "content": result.result.content,
                    }));
                }
                // A tool message is text only: the results' images follow as a user message.
                let mut parts = Vec::new();
                for (call, result) in &exchange.calls {
                    if result.result.images.is_empty() {
                        continue;
                    }
                    let caption = images::tool_images_caption(&call.call.name, &call.call.call_id);
                    parts.push(json!({ "type": "text", "text": caption }));
                    parts.extend(
                        (result.result.images.iter()).map(|i| images::chat_part(gallery.part(i))),
                    );
                }
                if !parts.is_empty() {
                    messages.push(json!({ "role": "user", "content": parts }));
                }
            }
        }
    }
    let mut body = json!({
        "model": model.upstream_id,
        "messages": messages,
        "stream": true,
    });
    if model.quirks.stream_usage {
        body["stream_options"] = json!({ "include_usage": true });
    }
    if !request.tools.is_empty() {
        body["tools"] = Value::Array(request.tools.to_vec());
    }
    if let Some(limit) = model.max_output_tokens {
        // OpenAI's reasoning models take only `max_completion_tokens`; other servers `max_tokens`.
        let field = if model.reasoning {
            "max_completion_tokens"
        } else {
            "max_tokens"
        };
        body[field] = limit.into();
    }
    if let Some(effort) = request.parameters.effort.filter(|_| model.reasoning) {
        // DeepSeek-style servers know low..high; "minimal"/"max" are clamped to the nearest.
        let value = match effort {
            Effort::Minimal => "low",
            Effort::Max => "high",
            other => other.as_str(),
        };
        body["reasoning_effort"] = value.into();
    }
    body
}

/// OpenAI Responses, stateless: `store: false`, reasoning replayed from its encrypted content.
pub fn openai_responses(request: &ModelRequest<'_>) -> Value {
    let model = request.model;
    let mut input = Vec::new();
    let items = items(&request.history);
    let mut gallery = gallery(ProviderKind::OpenAiResponses, request, &items);
    for item in items {
        match item {
            Item::User(user) if user.images.is_empty() => {
                input.push(json!({ "role": "user", "content": user.text }))
            }
            Item::User(user) => {
                let mut parts = vec![json!({ "type": "input_text", "text": user.text })];
                parts.extend(
                    user.images
                        .iter()
                        .map(|i| images::responses_part(gallery.part(i))),
                );
                input.push(json!({ "role": "user", "content": parts }));
            }
            Item::Exchange(exchange) => {
                let answered: Vec<&str> = exchange
                    .calls
                    .iter()
                    .map(|(call, _)| call.call.provider_call_id.as_str())
                    .collect();
                match &exchange.assistant.replay {
                    Some(ProviderReplay::OpenAiResponses { items }) => {
                        // Verbatim and in order, so each reasoning item keeps the item after it; a
                        // function call that never got its result is the only thing left out.
                        for item in items {
                            let unanswered = item["type"] == "function_call"
                                && !answered
                                    .contains(&item["call_id"].as_str().unwrap_or_default());
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
                            input.push(item);
                        }
                    }
                    _ => {
                        if !exchange.assistant.text.is_empty() {
                            input.push(
                                json!({ "role": "assistant", "content": exchange.assistant.text }),
                            );
                        }
                        for (call, _) in &exchange.calls {
                            input.push(json!({
                                "type": "function_call",
                                "call_id": call.call.provider_call_id,
                                "name": call.call.name,
                                "arguments": arguments_text(call),
                            }));
                        }
                    }
                }
                for (call, result) in &exchange.calls {
                    let output = if result.result.images.is_empty() {
                        Value::String(result.result.content.clone())
                    } else {
                        let text = json!({ "type": "input_text", "text": result.result.content });
                        let shown = (result.result.images.iter())
                            .map(|i| images::responses_part(gallery.part(i)));
                        Value::Array(std::iter::once(text).chain(shown).collect())
                    };
                    input.push(json!({
                        "type": "function_call_output",
                        "call_id": call.call.provider_call_id,
                        "output": output,
                    }));
                }
            }
        }
    }
    let tools: Vec<Value> = request
        .tools
        .iter()
        .map(|tool| {
            let function = &tool["function"];
            json!({
                "type": "function",
                "name": function["name"],
                "description": function["description"],
                "parameters": function["parameters"],
                "strict": false,
            })
        })
        .collect();
    let mut body = json!({
        "model": model.upstream_id,
        "instructions": request.system,
        "input": input,
        "stream": true,
        "store": false,
    });
    if !tools.is_empty() {
        body["tools"] = Value::Array(tools);
    }
    if let Some(limit) = model.max_output_tokens {
        body["max_output_tokens"] = limit.into();
    }
    if model.reasoning {
        let mut reasoning = json!({ "summary": "auto" });
        if let Some(effort) = request.parameters.effort {
            let value = match effort {
                Effort::Max => "high",
                other => other.as_str(),
            };
            reasoning["effort"] = value.into();
        }
        body["reasoning"] = reasoning;
        body["include"] = json!(["reasoning.encrypted_content"]);
    }
    if request.parameters.fast {
        body["service_tier"] = "priority".into();
    }
    body
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

/// Anthropic Messages, with prompt-cache breakpoints on the system prompt, the tools and the last
/// message (3 of the 4 allowed): everything before the newest message is reused next time.
pub fn anthropic(request: &ModelRequest<'_>) -> Value {
    let model = request.model;
    let mut messages: Vec<Value> = Vec::new();
    let mut push = |role: &str, blocks: Vec<Value>| {
        if blocks.is_empty() {
            return;
        }
        // Consecutive same-role turns (a failed turn followed by a new message) are merged.
        if let Some(last) = messages.last_mut()
            && last["role"] == role
            && let Some(content) = last["content"].as_array_mut()
        {
            content.extend(blocks);
            return;
        }
        messages.push(json!({ "role": role, "content": blocks }));
    };
    let items = items(&request.history);
    let mut gallery = gallery(ProviderKind::Anthropic, request, &items);
    for item in items {
        match item {
            Item::User(user) => {
                // Images first: Claude reads an image best before the text about it.
                let mut blocks: Vec<Value> = (user.images.iter())
                    .map(|i| images::anthropic_part(gallery.part(i)))
                    .collect();
                if !user.text.is_empty() {
                    blocks.push(json!({ "type": "text", "text": user.text }));
                }
                push("user", blocks);
            }
            Item::Exchange(exchange) => {
                let assistant = exchange.assistant;
                let mut blocks = Vec::new();
                if let Some(ProviderReplay::Anthropic { blocks: thinking }) = &assistant.replay
                    && assistant.model_id == model.id
                {
                    blocks.extend(thinking.iter().cloned());
                }
                if !assistant.text.is_empty() {
                    blocks.push(json!({ "type": "text", "text": assistant.text }));
                }
                for (call, _) in &exchange.calls {
                    let input: Value = serde_json::from_str(&arguments_text(call))
                        .ok()
                        .filter(Value::is_object)
                        .unwrap_or_else(|| json!({ "invalid_arguments": call.call.arguments }));
                    blocks.push(json!({
                        "type": "tool_use",
                        "id": anthropic_tool_id(&call.call.provider_call_id),
                        "name": call.call.name,
                        "input": input,
                    }));
                }
                push("assistant", blocks);
                let results: Vec<Value> = exchange
                    .calls
                    .iter()
                    .map(|(call, result)| {
                        let text = if result.result.content.is_empty() {
                            "(no output)"
                        } else {
                            result.result.content.as_str()
                        };
                        let content = if result.result.images.is_empty() {
                            Value::String(text.to_owned())
                        } else {
                            let text = json!({ "type": "text", "text": text });
                            let shown = (result.result.images.iter())
                                .map(|i| images::anthropic_part(gallery.part(i)));
                            Value::Array(std::iter::once(text).chain(shown).collect())
                        };
                        let mut block = json!({
                            "type": "tool_result",
                            "tool_use_id": anthropic_tool_id(&call.call.provider_call_id),
                            "content": content,
                        });
                        if result.result.is_error {
                            block["is_error"] = true.into();
                        }
                        block
                    })
                    .collect();
                push("user", results);
            }
        }
    }
    let cache = json!({ "type": "ephemeral" });
    if let Some(last) = messages
        .last_mut()
        .and_then(|m| m["content"].as_array_mut())
        .and_then(|c| c.last_mut())
    {
        last["cache_control"] = cache.clone();
    }
    let mut tools: Vec<Value> = request
        .tools
        .iter()
        .map(|tool| {
            let function = &tool["function"];
            json!({
                "name": function["name"],
                "description": function["description"],
                "input_schema": function["parameters"],
            })
        })
        .collect();
    if let Some(last) = tools.last_mut() {
        last["cache_control"] = cache.clone();
    }
    let mut body = json!({
        "model": model.upstream_id,
        "max_tokens": model.output_limit(),
        "system": [{ "type": "text", "text": request.system, "cache_control": cache }],
        "messages": messages,
        "stream": true,
    });
    if !tools.is_empty() {
        body["tools"] = Value::Array(tools);
    }
    if model.reasoning {
        match model.thinking_budget {
            Some(budget) => {
                body["thinking"] = json!({ "type": "enabled", "budget_tokens": budget })
            }
            None => {
                body["thinking"] = json!({ "type": "adaptive" });
                if let Some(effort) = request.parameters.effort {
                    let value = match effort {
                        Effort::Minimal => "low",
                        other => other.as_str(),
                    };
                    body["output_config"] = json!({ "effort": value });
                }
            }
        }
    }
    body
}

#[cfg(test)]
mod tests;
