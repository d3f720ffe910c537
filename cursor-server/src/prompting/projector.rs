//! Projects a `ModelRequest` into a provider's request body. Pure: the same history always gives the
//! same bytes, and appending to history only appends to the projection.

use std::collections::HashMap;

use serde_json::{Value, json};

use super::compiler::ModelRequest;
use crate::model::message::{CanonicalMessage, ProviderReplay, ToolCallRecord, ToolResultRecord};

/// The OpenAI Chat Completions body (without the streaming options the adapter adds).
///
/// Tool calls are stored one record per call as each completes; here they are gathered back onto
/// the assistant message of their model call, in call order, followed by their results in the same
/// order. A call without a stored result (a batch cut short) is left out, never sent unanswered.
pub fn openai_chat(request: &ModelRequest<'_>) -> Value {
    let history = request.history;
    let mut calls: HashMap<&str, Vec<&ToolCallRecord>> = HashMap::new();
    let mut results: HashMap<&str, Vec<&ToolResultRecord>> = HashMap::new();
    for message in history {
        match message {
            CanonicalMessage::ToolCall(record) => {
                calls.entry(&record.model_call_id).or_default().push(record)
            }
            CanonicalMessage::ToolResult(record) => results
                .entry(&record.model_call_id)
                .or_default()
                .push(record),
            _ => {}
        }
    }
    for list in calls.values_mut() {
        list.sort_by_key(|r| r.index);
    }
    for list in results.values_mut() {
        list.sort_by_key(|r| r.index);
    }

    let mut messages = Vec::with_capacity(history.len() + 1);
    messages.push(json!({ "role": "system", "content": request.system }));
    for message in history {
        match message {
            CanonicalMessage::User(user) => {
                messages.push(json!({ "role": "user", "content": user.text }))
            }
            CanonicalMessage::Assistant(assistant) => {
                let answered: Vec<&ToolResultRecord> = results
                    .get(assistant.model_call_id.as_str())
                    .cloned()
                    .unwrap_or_default();
                let tool_calls: Vec<Value> = calls
                    .get(assistant.model_call_id.as_str())
                    .into_iter()
                    .flatten()
                    .filter(|call| answered.iter().any(|r| r.index == call.index))
                    .map(|record| {
                        let arguments = if record.call.arguments.trim().is_empty() {
                            "{}".to_owned()
                        } else {
                            record.call.arguments.clone()
                        };
                        json!({
                            "id": record.call.provider_call_id,
                            "type": "function",
                            "function": { "name": record.call.name, "arguments": arguments },
                        })
                    })
                    .collect();
                let mut out = json!({ "role": "assistant" });
                out["content"] = if assistant.text.is_empty() && !tool_calls.is_empty() {
                    Value::Null
                } else {
                    Value::String(assistant.text.clone())
                };
                // Chat-family reasoning is replayed only when this message came from that family;
                // reasoning from another family is dropped, never faked. Thinking models reject
                // tool-call messages without the field, so it is sent even when empty.
                if let Some(ProviderReplay::OpenAiChat { reasoning_content }) = &assistant.replay
                    && (!reasoning_content.is_empty()
                        || (request.reasoning_model && !tool_calls.is_empty()))
                {
                    out["reasoning_content"] = Value::String(reasoning_content.clone());
                }
                let has_calls = !tool_calls.is_empty();
                if has_calls {
                    out["tool_calls"] = Value::Array(tool_calls);
                }
                messages.push(out);
                if has_calls {
                    let provider_ids: HashMap<u32, &str> = calls
                        .get(assistant.model_call_id.as_str())
                        .into_iter()
                        .flatten()
                        .map(|c| (c.index, c.call.provider_call_id.as_str()))
                        .collect();
                    for result in answered {
                        if let Some(id) = provider_ids.get(&result.index) {
                            messages.push(json!({
                                "role": "tool",
                                "tool_call_id": id,
                                "content": result.result.content,
                            }));
                        }
                    }
                }
            }
            // Projected together with their assistant message above.
            CanonicalMessage::ToolCall(_) | CanonicalMessage::ToolResult(_) => {}
        }
    }
    let mut body = json!({
        "model": request.upstream_model,
        "messages": messages,
    });
    if !request.tools.is_empty() {
        body["tools"] = Value::Array(request.tools.to_vec());
    }
    body
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::message::{AssistantMessage, Origin, UserMessage};
    use crate::prompting::compiler::compile;

    fn user(text: &str) -> CanonicalMessage {
        CanonicalMessage::User(UserMessage {
            origin: Origin::User,
            text: text.into(),
            client_message_id: String::new(),
        })
    }

    #[test]
    fn next_request_extends_the_previous_one() {
        let mut history = vec![user("hi")];
        let first = openai_chat(&compile(&history, "m", false, &[]));
        history.push(CanonicalMessage::Assistant(AssistantMessage {
            text: "hello".into(),
            thinking: "t".into(),
            model_id: "m".into(),
            model_call_id: "mc1".into(),
            replay: Some(ProviderReplay::OpenAiChat {
                reasoning_content: "t".into(),
            }),
        }));
        history.push(user("again"));
        let second = openai_chat(&compile(&history, "m", false, &[]));
        let first = first["messages"].as_array().expect("messages");
        let second = second["messages"].as_array().expect("messages");
        assert_eq!(&second[..first.len()], first.as_slice());
        assert_eq!(second[2]["reasoning_content"], "t");
        assert_eq!(second.len(), 4);
    }
}
