//! Projects a `ModelRequest` into a provider's request body. Pure: the same history always gives the
//! same bytes, and appending to history only appends to the projection.

use serde_json::{Value, json};

use super::compiler::ModelRequest;
use crate::model::message::{CanonicalMessage, ProviderReplay};

/// The OpenAI Chat Completions body (without the streaming options the adapter adds).
pub fn openai_chat(request: &ModelRequest<'_>) -> Value {
    let mut messages = Vec::with_capacity(request.history.len() + 1);
    messages.push(json!({ "role": "system", "content": request.system }));
    for message in request.history {
        messages.push(match message {
            CanonicalMessage::User(user) => json!({ "role": "user", "content": user.text }),
            CanonicalMessage::Assistant(assistant) => {
                let mut out = json!({ "role": "assistant", "content": assistant.text });
                // Chat-family reasoning is replayed only when this message came from that family;
                // reasoning from another family is dropped, never faked.
                if let Some(ProviderReplay::OpenAiChat { reasoning_content }) = &assistant.replay
                    && !reasoning_content.is_empty()
                {
                    out["reasoning_content"] = Value::String(reasoning_content.clone());
                }
                out
            }
        });
    }
    json!({
        "model": request.upstream_model,
        "messages": messages,
    })
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
        let first = openai_chat(&compile(&history, "m"));
        history.push(CanonicalMessage::Assistant(AssistantMessage {
            text: "hello".into(),
            thinking: "t".into(),
            model_id: "m".into(),
            replay: Some(ProviderReplay::OpenAiChat {
                reasoning_content: "t".into(),
            }),
        }));
        history.push(user("again"));
        let second = openai_chat(&compile(&history, "m"));
        let first = first["messages"].as_array().expect("messages");
        let second = second["messages"].as_array().expect("messages");
        assert_eq!(&second[..first.len()], first.as_slice());
        assert_eq!(second[2]["reasoning_content"], "t");
        assert_eq!(second.len(), 4);
    }
}
