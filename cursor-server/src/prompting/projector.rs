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
use crate::config::ProviderKind;
use crate::model::message::{
    AssistantMessage, CanonicalMessage, ProviderReplay, ToolCallRecord, ToolResultRecord,
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
    User(&'a str),
    Exchange(Exchange<'a>),
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
            CanonicalMessage::User(user) => out.push(Item::User(&user.text)),
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
    if record.call.arguments.trim().is_empty() {
        "{}".to_owned()
    } else {
        record.call.arguments.clone()
    }
}

/// OpenAI Chat Completions.
pub fn openai_chat(request: &ModelRequest<'_>) -> Value {
    let model = request.model;
    let mut messages = vec![json!({ "role": "system", "content": request.system })];
    for item in items(&request.history) {
        match item {
            Item::User(text) => messages.push(json!({ "role": "user", "content": text })),
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
    for item in items(&request.history) {
        match item {
            Item::User(text) => input.push(json!({ "role": "user", "content": text })),
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
                            // An empty argument string is normalised like everywhere else.
                            if item["type"] == "function_call"
                                && item["arguments"]
                                    .as_str()
                                    .is_some_and(|a| a.trim().is_empty())
                            {
                                item["arguments"] = "{}".into();
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
                    input.push(json!({
                        "type": "function_call_output",
                        "call_id": call.call.provider_call_id,
                        "output": result.result.content,
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
    for item in items(&request.history) {
        match item {
            Item::User(text) => {
                if !text.is_empty() {
                    push("user", vec![json!({ "type": "text", "text": text })]);
                }
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
                        let mut block = json!({
                            "type": "tool_result",
                            "tool_use_id": anthropic_tool_id(&call.call.provider_call_id),
                            "content": if result.result.content.is_empty() { "(no output)" } else { result.result.content.as_str() },
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
mod tests {
    use super::*;
    use crate::config::{ModelConfig, Quirks};
    use crate::model::message::{Origin, UserMessage};
    use crate::model::tool::{ToolCall, ToolResult};
    use crate::prompting::compiler::{RequestParameters, compile};

    fn model(reasoning: bool) -> ModelConfig {
        ModelConfig {
            id: "m".into(),
            upstream_id: "up-m".into(),
            display_name: "M".into(),
            context_window: 1000,
            reasoning,
            max_output_tokens: Some(4096),
            thinking_budget: None,
            quirks: Quirks {
                stream_usage: true,
                reasoning_content_on_tool_calls: reasoning,
                extra_body: Map::new(),
            },
        }
    }

    fn user(text: &str) -> CanonicalMessage {
        CanonicalMessage::User(UserMessage {
            shown_as: None,
            state_before: None,
            origin: Origin::User,
            text: text.into(),
            client_message_id: String::new(),
            mode: None,
            runtime: None,
        })
    }

    /// A turn with two parallel calls whose results were stored in reverse order, one call left
    /// unanswered (cut short), then a final answer.
    fn history(replay: Option<ProviderReplay>) -> Vec<CanonicalMessage> {
        let call = |index: u32, id: &str| {
            CanonicalMessage::ToolCall(ToolCallRecord {
                model_call_id: "mc1".into(),
                index,
                call: ToolCall {
                    call_id: format!("c{index}"),
                    provider_call_id: id.into(),
                    name: "Read".into(),
                    arguments: format!(r#"{{"path":"f{index}"}}"#),
                },
            })
        };
        let result = |index: u32| {
            CanonicalMessage::ToolResult(ToolResultRecord {
                card: None,
                model_call_id: "mc1".into(),
                index,
                result: ToolResult {
                    call_id: format!("c{index}"),
                    content: format!("content {index}"),
                    is_error: false,
                    meta: None,
                },
            })
        };
        vec![
            user("hi"),
            CanonicalMessage::Assistant(AssistantMessage {
                thinking_spans: Vec::new(),
                text: String::new(),
                thinking: "t".into(),
                model_id: "m".into(),
                replay,
                model_call_id: "mc1".into(),
                planned_calls: Vec::new(),
            }),
            call(1, "functions.Read:1"),
            result(1),
            call(0, "call_0"),
            result(0),
        ]
    }

    #[test]
    fn chat_gathers_calls_in_order_and_sends_empty_reasoning_for_thinking_models() {
        let model = model(true);
        let history = history(None);
        let body = openai_chat(&compile(
            "system prompt",
            &history,
            &model,
            &[],
            RequestParameters::default(),
        ));
        let messages = body["messages"].as_array().unwrap();
        assert_eq!(messages.len(), 5);
        assert_eq!(messages[2]["tool_calls"][0]["id"], "call_0");
        assert_eq!(messages[2]["tool_calls"][1]["id"], "functions.Read:1");
        assert_eq!(
            messages[2]["reasoning_content"], "",
            "placeholder, not invented thinking"
        );
        assert_eq!(messages[2]["content"], Value::Null);
        assert_eq!(messages[3]["tool_call_id"], "call_0");
        assert_eq!(messages[4]["content"], "content 1");
    }

    #[test]
    fn output_limits_and_effort_go_where_each_family_and_model_takes_them() {
        let history = vec![user("hi")];
        let parameters = RequestParameters {
            effort: Some(Effort::High),
            ..RequestParameters::default()
        };
        let body = |model: &ModelConfig, project: fn(&ModelRequest<'_>) -> Value| {
            project(&compile("s", &history, model, &[], parameters))
        };
        let plain = model(false);
        let chat = body(&plain, openai_chat);
        assert_eq!(chat["max_tokens"], 4096);
        assert!(chat.get("max_completion_tokens").is_none());
        assert!(
            chat.get("reasoning_effort").is_none(),
            "effort only for reasoning models"
        );
        let thinking = body(&model(true), openai_chat);
        assert_eq!(thinking["max_completion_tokens"], 4096);
        assert!(thinking.get("max_tokens").is_none());
        assert_eq!(thinking["reasoning_effort"], "high");
        let responses = body(&plain, openai_responses);
        assert_eq!(responses["max_output_tokens"], 4096);
        assert!(responses.get("reasoning").is_none());
        let unset = ModelConfig {
            max_output_tokens: None,
            ..model(false)
        };
        assert!(body(&unset, openai_chat).get("max_tokens").is_none());
        assert!(
            body(&unset, openai_responses)
                .get("max_output_tokens")
                .is_none()
        );
        assert_eq!(
            body(&unset, anthropic)["max_tokens"],
            32_000,
            "Anthropic requires one"
        );
    }

    #[test]
    fn responses_replays_items_verbatim_and_drops_unanswered_calls() {
        let items = vec![
            json!({"type":"reasoning","id":"rs_1","summary":[],"encrypted_content":"enc"}),
            json!({"type":"function_call","id":"fc_0","call_id":"call_0","name":"Read","arguments":"{\"path\":\"f0\"}"}),
            json!({"type":"function_call","id":"fc_1","call_id":"functions.Read:1","name":"Read","arguments":"{\"path\":\"f1\"}"}),
            json!({"type":"function_call","id":"fc_2","call_id":"call_2","name":"Read","arguments":"{}"}),
        ];
        let model = model(true);
        let history = history(Some(ProviderReplay::OpenAiResponses {
            items: items.clone(),
        }));
        let body = openai_responses(&compile(
            "system prompt",
            &history,
            &model,
            &[],
            RequestParameters::default(),
        ));
        let input = body["input"].as_array().unwrap();
        assert_eq!(&input[1..4], &items[..3]);
        assert_eq!(
            input[4],
            json!({"type":"function_call_output","call_id":"call_0","output":"content 0"})
        );
        assert_eq!(input[5]["call_id"], "functions.Read:1");
        assert_eq!(input.len(), 6);
        assert_eq!(body["store"], false);
        assert_eq!(body["include"], json!(["reasoning.encrypted_content"]));
    }

    #[test]
    fn anthropic_replays_signed_thinking_first_and_sanitises_foreign_ids() {
        let thinking = vec![json!({"type":"thinking","thinking":"t","signature":"sig"})];
        let model = model(true);
        let history = history(Some(ProviderReplay::Anthropic {
            blocks: thinking.clone(),
        }));
        let body = anthropic(&compile(
            "system prompt",
            &history,
            &model,
            &[],
            RequestParameters::default(),
        ));
        let messages = body["messages"].as_array().unwrap();
        assert_eq!(messages.len(), 3);
        let content = messages[1]["content"].as_array().unwrap();
        assert_eq!(content[0], thinking[0]);
        assert_eq!(content[1]["type"], "tool_use");
        assert_eq!(content[1]["input"], json!({"path":"f0"}));
        assert_eq!(content[2]["id"], "functions_Read_1");
        let results = messages[2]["content"].as_array().unwrap();
        assert_eq!(results[0]["tool_use_id"], "call_0");
        assert_eq!(results[1]["tool_use_id"], "functions_Read_1");
        assert_eq!(body["thinking"], json!({"type":"adaptive"}));

        // From another model, the signature is not ours to replay.
        let mut other = model.clone();
        other.id = "other".into();
        let body = anthropic(&compile(
            "system prompt",
            &history,
            &other,
            &[],
            RequestParameters::default(),
        ));
        let content = body["messages"][1]["content"].as_array().unwrap();
        assert_eq!(content[0]["type"], "tool_use");
    }

    #[test]
    fn anthropic_uses_at_most_four_cache_breakpoints() {
        let model = model(false);
        let tools = crate::prompting::assets::PromptAssets::embedded()
            .unwrap()
            .mode(crate::model::conversation::Mode::Agent)
            .tools
            .clone();
        let mut history = history(None);
        history.push(user("next"));
        let body = project(
            ProviderKind::Anthropic,
            &compile(
                "system prompt",
                &history,
                &model,
                &tools,
                RequestParameters::default(),
            ),
        );
        let count = body.to_string().matches("cache_control").count();
        assert!(count <= 4 && count == 3, "{count} breakpoints");
        let messages = body["messages"].as_array().unwrap();
        // tool results and the next user text merge into one user turn, results first
        let last = messages.last().unwrap()["content"].as_array().unwrap();
        assert_eq!(last[0]["type"], "tool_result");
        assert_eq!(last.last().unwrap()["text"], "next");
        assert!(last.last().unwrap().get("cache_control").is_some());
    }

    #[test]
    fn switching_families_drops_foreign_reasoning_instead_of_faking_it() {
        let model = model(false);
        let chat_history = history(Some(ProviderReplay::OpenAiChat {
            reasoning_content: "secret chain".into(),
            reasoning_details: Vec::new(),
        }));
        for body in [
            anthropic(&compile(
                "system prompt",
                &chat_history,
                &model,
                &[],
                RequestParameters::default(),
            )),
            openai_responses(&compile(
                "system prompt",
                &chat_history,
                &model,
                &[],
                RequestParameters::default(),
            )),
        ] {
            assert!(!body.to_string().contains("secret chain"), "{body}");
        }
        let anthropic_history = history(Some(ProviderReplay::Anthropic {
            blocks: vec![json!({"type":"thinking","thinking":"claude thoughts","signature":"s"})],
        }));
        let chat = openai_chat(&compile(
            "system prompt",
            &anthropic_history,
            &model,
            &[],
            RequestParameters::default(),
        ));
        assert!(!chat.to_string().contains("claude thoughts"));
        assert!(
            chat["messages"][2].get("reasoning_content").is_none(),
            "not a thinking model: no placeholder"
        );
    }

    #[test]
    fn next_request_extends_the_previous_one() {
        let model = model(false);
        let mut history = vec![user("hi")];
        let first = openai_chat(&compile(
            "system prompt",
            &history,
            &model,
            &[],
            RequestParameters::default(),
        ));
        history.push(CanonicalMessage::Assistant(AssistantMessage {
            thinking_spans: Vec::new(),
            text: "hello".into(),
            thinking: "t".into(),
            model_id: "m".into(),
            model_call_id: "mc1".into(),
            planned_calls: Vec::new(),
            replay: Some(ProviderReplay::OpenAiChat {
                reasoning_content: "t".into(),
                reasoning_details: Vec::new(),
            }),
        }));
        history.push(user("again"));
        let second = openai_chat(&compile(
            "system prompt",
            &history,
            &model,
            &[],
            RequestParameters::default(),
        ));
        let first = first["messages"].as_array().expect("messages");
        let second = second["messages"].as_array().expect("messages");
        assert_eq!(&second[..first.len()], first.as_slice());
        assert_eq!(second[2]["reasoning_content"], "t");
        assert_eq!(second.len(), 4);
    }
}
