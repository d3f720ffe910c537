//! The canonical conversation message: the one form history is stored in and projected from.
//!
//! Messages are append-only. Provider-specific opaque data (reasoning to replay) rides along on the
//! assistant message that produced it, tagged with its endpoint family, so it is replayed only there.

use serde::{Deserialize, Serialize};

use super::conversation::{BlobId, ImageRef, Mode};
use super::runtime_tag::{RuntimeEvent, RuntimeTag};
use super::tool::{ToolCall, ToolResult};

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
    /// One tool call of an assistant message; stored together with its `ToolResult` as each call
    /// completes, and projected onto the assistant message of the same `model_call_id`.
    ToolCall(ToolCallRecord),
    ToolResult(ToolResultRecord),
}

impl CanonicalMessage {
    pub fn role(&self) -> Role {
        match self {
            CanonicalMessage::User(_) => Role::User,
            CanonicalMessage::Assistant(_) | CanonicalMessage::ToolCall(_) => Role::Assistant,
            CanonicalMessage::ToolResult(_) => Role::Tool,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    User,
    Assistant,
    Tool,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
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
    /// The mode the conversation is in from this message on: the mode the user picked for it, or
    /// the new mode of a mode-change notice (`None` for other runtime messages and old rows).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<super::conversation::Mode>,
    /// For a runtime message: the event it tells (absent for the user's own messages).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime: Option<super::runtime_tag::RuntimeEvent>,
    /// For the user's own message: the checkpoint the client held when it sent it (Cursor's
    /// `conversation_state_blob_id`, the state "restore checkpoint" returns to).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_before: Option<BlobId>,
    /// For the user's own message sent with attachments: the `UserMessage` blob the checkpoint's
    /// turn shows (it keeps Cursor's `selected_context`, the chips), stored before this message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shown_as: Option<BlobId>,
    /// Images the user attached (pasted screenshots, image files), in the order attached: their
    /// bytes are blobs, so a row stays small and every request replays the same images.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub images: Vec<ImageRef>,
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
    /// The provider call that produced it; its tool calls carry the same id.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub model_call_id: String,
    /// Every tool call of this response, in order, stored before any runs: after a crash the calls
    /// without a stored result are known, and only those run again (`resume_action`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub planned_calls: Vec<ToolCall>,
    /// How `thinking` was shown: one span per thinking segment, in order (the checkpoint's
    /// thinking steps are projected from these).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub thinking_spans: Vec<ThinkingSpan>,
}

/// One thinking segment of an assistant message: its length in bytes of `thinking` and how long
/// the model thought.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ThinkingSpan {
    pub bytes: u32,
    pub ms: u32,
}

impl AssistantMessage {
    /// The thinking segments as shown: (text, duration). A message stored before segments were
    /// recorded shows its thinking as one segment of unknown (1 ms) duration.
    pub fn thinking_segments(&self) -> Vec<(&str, u32)> {
        if self.thinking_spans.is_empty() {
            return if self.thinking.is_empty() {
                Vec::new()
            } else {
                vec![(self.thinking.as_str(), 1)]
            };
        }
        let mut at = 0usize;
        let mut out = Vec::with_capacity(self.thinking_spans.len());
        for span in &self.thinking_spans {
            let end = (at + span.bytes as usize).min(self.thinking.len());
            out.push((self.thinking.get(at..end).unwrap_or_default(), span.ms));
            at = end;
        }
        out
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCallRecord {
    pub model_call_id: String,
    /// Position of the call in the model's response (0-based); projection order.
    pub index: u32,
    pub call: ToolCall,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolResultRecord {
    pub model_call_id: String,
    pub index: u32,
    pub result: ToolResult,
    /// The call's finished card (a `ConversationStep` blob, stored before this record): the
    /// checkpoint's tool step. `None` for calls that never showed a card.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub card: Option<BlobId>,
}

/// Endpoint-family-specific replay data, kept byte for byte.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "family", rename_all = "snake_case")]
pub enum ProviderReplay {
    /// OpenAI Chat Completions and compatibles: the `reasoning_content` the model streamed.
    OpenAiChat {
        reasoning_content: String,
        /// OpenRouter's `reasoning_details`, merged from the stream, sent back as received.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        reasoning_details: Vec<serde_json::Value>,
    },
    /// OpenAI Responses: the response's output items exactly as received (reasoning items with
    /// `encrypted_content`, messages, function calls), in output order.
    OpenAiResponses { items: Vec<serde_json::Value> },
    /// Anthropic Messages: the thinking / redacted_thinking blocks exactly as received, in order.
    Anthropic { blocks: Vec<serde_json::Value> },
}

impl RuntimeTag {
    /// The runtime-origin message stored for it.
    pub fn message(&self) -> CanonicalMessage {
        CanonicalMessage::User(UserMessage {
            shown_as: None,
            origin: Origin::Runtime,
            text: self.text.clone(),
            client_message_id: String::new(),
            mode: self.event.new_mode(),
            runtime: Some(self.event.clone()),
            state_before: None,
            images: Vec::new(),
        })
    }
}

/// The latest compaction in `history`: (its position, its compaction number, the index it summarized
/// up to).
pub fn latest_compaction(history: &[CanonicalMessage]) -> Option<(usize, u32, usize)> {
    history
        .iter()
        .enumerate()
        .rev()
        .find_map(|(at, m)| match m {
            CanonicalMessage::User(UserMessage {
                runtime: Some(RuntimeEvent::Compacted { number, through }),
                ..
            }) => Some((at, *number, (*through).min(at))),
            _ => None,
        })
}

/// The digest of the workspace context the model saw last (`None` if it never saw one).
pub fn current_context_digest(history: &[CanonicalMessage]) -> Option<&str> {
    history.iter().rev().find_map(|message| match message {
        CanonicalMessage::User(UserMessage {
            runtime: Some(RuntimeEvent::WorkspaceContext { digest }),
            ..
        }) => Some(digest.as_str()),
        _ => None,
    })
}

/// The mode the conversation is in after `history`: the latest user message's mode or mode change
/// (`None` when no stored message states one, e.g. an imported conversation).
pub fn current_mode(history: &[CanonicalMessage]) -> Option<Mode> {
    history.iter().rev().find_map(|message| match message {
        CanonicalMessage::User(user) => user.mode,
        _ => None,
    })
}
