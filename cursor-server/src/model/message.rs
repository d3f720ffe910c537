//! The canonical conversation message: the one form history is stored in and projected from.
//!
//! Messages are append-only. Provider-specific opaque data (reasoning to replay) rides along on the
//! assistant message that produced it, tagged with its endpoint family, so it is replayed only there.

use serde::{Deserialize, Serialize};

/// Who caused a user-role message to exist.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Origin {
    /// Typed by the user in Cursor.
    User,
    /// Written by the server (reminders, notices); appended exactly once per runtime event.
    Runtime,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "role", rename_all = "snake_case")]
pub enum CanonicalMessage {
    User(UserMessage),
    Assistant(AssistantMessage),
}

impl CanonicalMessage {
    pub fn role(&self) -> Role {
        match self {
            CanonicalMessage::User(_) => Role::User,
            CanonicalMessage::Assistant(_) => Role::Assistant,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    User,
    Assistant,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::User => "user",
            Role::Assistant => "assistant",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserMessage {
    pub origin: Origin,
    pub text: String,
    /// Cursor's id for the message (`UserMessage.message_id`), empty for runtime messages.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub client_message_id: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AssistantMessage {
    /// Visible answer text.
    pub text: String,
    /// Thinking shown to the user, as streamed (never mixed into `text`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub thinking: String,
    /// The configured model id that produced the message.
    pub model_id: String,
    /// Opaque data the producing endpoint needs to see again; replayed only to the same family.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay: Option<ProviderReplay>,
}

/// Endpoint-family-specific replay data, kept byte for byte.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "family", rename_all = "snake_case")]
pub enum ProviderReplay {
    /// OpenAI Chat Completions and compatibles: the `reasoning_content` the model streamed.
    OpenAiChat { reasoning_content: String },
}
