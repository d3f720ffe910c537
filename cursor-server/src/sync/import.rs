//! Importing a conversation only the client holds: its model-message roots (AI SDK JSON, as
//! Cursor, a CLI client or this server wrote them) read back into canonical history, so the
//! provider request reads as the conversation's original did — nothing the model is told anyway
//! (this server's own system prompt, instructions the run's context repeats) told twice.
//!
//! Its own file because `sync/checkpoint.rs` holds the graph's building blocks and the state
//! within 800 lines; reading roots back, and what counts as told already, is one concern.

use std::collections::HashMap;

use serde_json::Value;

use crate::model::message::{
    AssistantMessage, CanonicalMessage, Origin, ToolCallRecord, ToolResultRecord, UserMessage,
};
use crate::model::runtime_tag::RuntimeEvent;
use crate::model::tool::{ToolCall, ToolResult};
use crate::sync::checkpoint::OWN_SYSTEM_PROMPT;
use crate::tools::{ToolKind, task};

/// What the run knows that a client's roots may repeat; the prompting layer answers (it owns the
/// prompts and how the workspace context is told).
pub trait Known {
    /// Whether a system root's text reaches the model without the import: one of this server's
    /// own system prompts (any mode's; roots written before the marker), or instructions the
    /// run's request context tells (a CLI client sends its own prompt as a rule too).
    fn told(&self, instructions: &str) -> bool;
    /// The runtime event a user root stands for, when this server wrote it (the workspace
    /// context: read back as such, the model is not told the same context again).
    fn runtime(&self, text: &str) -> Option<RuntimeEvent>;
}

/// Whether a system root is this server's own (its marker, in the AI SDK `providerOptions`).
fn marked_as_own(root: &Value) -> bool {
    root["providerOptions"][OWN_SYSTEM_PROMPT]["systemPrompt"] == true
}

/// Reads model-message roots (AI SDK JSON, as Cursor or this server wrote them) back into canonical
/// history, for conversations this server has never seen. Tool calls are grouped onto the assistant
/// message they follow (this server writes one root per call; AI SDK writes them together); each
/// call becomes a stored call/result pair when its result is found.
pub fn import_roots(roots: &[Value], known: &dyn Known) -> Vec<CanonicalMessage> {
    let mut import = Import::default();
    for root in roots {
        let content = &root["content"];
        match root["role"].as_str() {
            Some("system") if marked_as_own(root) => import.current_assistant = None,
            Some("system") => import.system(content, known),
            Some("user") => import.user(content, known),
            Some("assistant") => import.assistant(content),
            Some("tool") => import.tool_results(content),
            other => tracing::warn!("imported root with role {other:?} left out"),
        }
    }
    import.out
}

/// The state of one `import_roots` pass.
#[derive(Default)]
struct Import {
    out: Vec<CanonicalMessage>,
    /// toolCallId → (model_call_id, index, call), until its result is found.
    calls: HashMap<String, (String, u32, ToolCall)>,
    /// The assistant message later tool-call-only roots add their calls to.
    current_assistant: Option<usize>,
    imported: usize,
}

impl Import {
    fn text_of(content: &Value, kind: &str) -> String {
        match content {
            Value::String(text) if kind == "text" => text.clone(),
            Value::Array(parts) => parts
                .iter()
                .filter(|p| p["type"] == kind)
                .filter_map(|p| p["text"].as_str())
                .collect::<Vec<_>>()
                .join(""),
            _ => String::new(),
        }
    }

    fn user_message(origin: Origin, text: String) -> CanonicalMessage {
        CanonicalMessage::User(UserMessage {
            images: Vec::new(),
            shown_as: None,
            state_before: None,
            origin,
            text,
            client_message_id: String::new(),
            mode: None,
            runtime: None,
        })
    }

    /// The client's own instructions: kept, as a runtime message, never dropped — unless the model
    /// is told them anyway (this server's own system prompt, the run's rules).
    fn system(&mut self, content: &Value, known: &dyn Known) {
        let text = Self::text_of(content, "text");
        if !text.is_empty() && !known.told(&text) {
            self.out.push(Self::user_message(
                Origin::Runtime,
                format!("<client_instructions>\n{text}\n</client_instructions>"),
            ));
        }
        self.current_assistant = None;
    }

    /// The user's message, or a runtime message this server wrote that the run must recognize.
    fn user(&mut self, content: &Value, known: &dyn Known) {
        let text = Self::text_of(content, "text");
        let message = match known.runtime(&text) {
            Some(event) => {
                let mut message = Self::user_message(Origin::Runtime, text);
                if let CanonicalMessage::User(user) = &mut message {
                    user.runtime = Some(event);
                }
                message
            }
            None => Self::user_message(Origin::User, text),
        };
        self.out.push(message);
        self.current_assistant = None;
    }

    fn assistant(&mut self, content: &Value) {
        let text = Self::text_of(content, "text");
        let thinking = Self::text_of(content, "reasoning");
        let parts: Vec<&Value> = content
            .as_array()
            .map(|p| p.iter().filter(|p| p["type"] == "tool-call").collect())
            .unwrap_or_default();
        let continues = self.current_assistant.is_some()
            && text.is_empty()
            && thinking.is_empty()
            && !parts.is_empty();
        let slot = match (continues, self.current_assistant) {
            (true, Some(slot)) => slot,
            _ => {
                self.imported += 1;
                self.out.push(CanonicalMessage::Assistant(AssistantMessage {
                    thinking_spans: Vec::new(),
                    text,
                    thinking,
                    model_id: String::new(),
                    replay: None,
                    model_call_id: format!("import-{}", self.imported),
                    planned_calls: Vec::new(),
                }));
                self.out.len() - 1
            }
        };
        self.current_assistant = Some(slot);
        if let CanonicalMessage::Assistant(assistant) = &mut self.out[slot] {
            for part in parts {
                let id = part["toolCallId"].as_str().unwrap_or_default().to_owned();
                let call = ToolCall {
                    call_id: id.clone(),
                    provider_call_id: id.clone(),
                    name: part["toolName"].as_str().unwrap_or_default().to_owned(),
                    arguments: part
                        .get("args")
                        .or_else(|| part.get("input"))
                        .map_or_else(|| "{}".to_owned(), Value::to_string),
                };
                let index = u32::try_from(assistant.planned_calls.len()).unwrap_or(u32::MAX);
                assistant.planned_calls.push(call.clone());
                self.calls
                    .insert(id, (assistant.model_call_id.clone(), index, call));
            }
        }
    }

    fn tool_results(&mut self, content: &Value) {
        for part in content
            .as_array()
            .into_iter()
            .flatten()
            .filter(|p| p["type"] == "tool-result")
        {
            let id = part["toolCallId"].as_str().unwrap_or_default();
            let Some((model_call_id, index, call)) = self.calls.get(id).cloned() else {
                tracing::warn!("imported tool result {id:?} has no call; left out");
                continue;
            };
            let result = match &part["result"] {
                Value::String(text) => text.clone(),
                other => other.to_string(),
            };
            // The client's record of a Task says only whether it failed.
            let meta =
                (call.name == ToolKind::Task.name()).then(|| task::untold_meta(&call.arguments));
            self.out.push(CanonicalMessage::ToolCall(ToolCallRecord {
                model_call_id: model_call_id.clone(),
                index,
                call,
            }));
            self.out
                .push(CanonicalMessage::ToolResult(ToolResultRecord {
                    card: None,
                    model_call_id,
                    index,
                    result: ToolResult {
                        images: Vec::new(),
                        call_id: id.to_owned(),
                        content: result,
                        is_error: part["isError"].as_bool().unwrap_or(false),
                        meta,
                    },
                }));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sync::checkpoint::roots;

    /// Knows the system prompt "ours" and the rule "rule text"; a user root starting with
    /// `<ctx>` is a runtime message.
    struct Knows;

    impl Known for Knows {
        fn told(&self, instructions: &str) -> bool {
            ["ours", "rule text"].contains(&instructions.trim())
        }

        fn runtime(&self, text: &str) -> Option<RuntimeEvent> {
            text.starts_with("<ctx>")
                .then(|| RuntimeEvent::WorkspaceContext { digest: "d".into() })
        }
    }

    #[test]
    fn imported_roots_become_canonical_history_with_paired_tool_calls() {
        use crate::model::message::CanonicalMessage;
        let roots = vec![
            serde_json::json!({"role": "system", "content": "client rules"}),
            roots::user("read it"),
            roots::assistant("Reading.", "plan"),
            roots::tool_call("t1", "Read", r#"{"path":"a"}"#),
            roots::tool_result("t1", "Read", "     1|ay", false),
            roots::assistant("Done.", ""),
        ];
        let history = import_roots(&roots, &Knows);
        assert!(
            matches!(&history[0], CanonicalMessage::User(u) if u.text.contains("client rules"))
        );
        assert!(matches!(&history[1], CanonicalMessage::User(u) if u.text == "read it"));
        let CanonicalMessage::Assistant(first) = &history[2] else {
            panic!("{history:?}")
        };
        assert_eq!(
            (first.text.as_str(), first.thinking.as_str()),
            ("Reading.", "plan")
        );
        assert_eq!(
            first.planned_calls.len(),
            1,
            "the call root joins the assistant it follows"
        );
        assert!(
            matches!(&history[3], CanonicalMessage::ToolCall(c) if c.call.arguments == r#"{"path":"a"}"# && c.model_call_id == first.model_call_id)
        );
        assert!(
            matches!(&history[4], CanonicalMessage::ToolResult(r) if r.result.content == "     1|ay")
        );
        assert!(matches!(&history[5], CanonicalMessage::Assistant(a) if a.text == "Done."));
        assert_eq!(history.len(), 6);
    }

    #[test]
    fn instructions_the_model_is_told_anyway_are_not_imported_and_a_foreign_clients_are() {
        let history = import_roots(
            &[
                roots::system("any text at all"),
                serde_json::json!({"role": "system", "content": "ours"}),
                serde_json::json!({"role": "system", "content": [{"type": "text", "text": "rule text\n"}]}),
                serde_json::json!({"role": "system", "content": "foreign rules"}),
                roots::user("<ctx>the workspace"),
                roots::user("hello"),
            ],
            &Knows,
        );
        let users: Vec<(&str, Origin, bool)> = history
            .iter()
            .map(|m| match m {
                CanonicalMessage::User(u) => (u.text.as_str(), u.origin, u.runtime.is_some()),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(
            users,
            [
                (
                    "<client_instructions>\nforeign rules\n</client_instructions>",
                    Origin::Runtime,
                    false
                ),
                ("<ctx>the workspace", Origin::Runtime, true),
                ("hello", Origin::User, false),
            ]
        );
    }
}
