//! Conversation-level facts that are not messages: the mode a turn runs in, the id of the blobs the
//! conversation state is made of, and what a checkpoint states about the conversation besides its
//! history.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// A blob id: the SHA-256 of the blob's bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlobId(pub [u8; 32]);

impl BlobId {
    pub fn of(data: &[u8]) -> BlobId {
        BlobId(Sha256::digest(data).into())
    }

    pub fn from_slice(bytes: &[u8]) -> Option<BlobId> {
        <[u8; 32]>::try_from(bytes).ok().map(BlobId)
    }

    pub fn to_hex(self) -> String {
        hex::encode(self.0)
    }
}

/// Stored in history as lowercase hex (a card's or a state's id).
impl Serialize for BlobId {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.to_hex())
    }
}

impl<'de> Deserialize<'de> for BlobId {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<BlobId, D::Error> {
        let text = String::deserialize(deserializer)?;
        hex::decode(&text)
            .ok()
            .and_then(|bytes| BlobId::from_slice(&bytes))
            .ok_or_else(|| {
                serde::de::Error::custom(format!("{text:?} is not a 32-byte hex blob id"))
            })
    }
}

impl std::fmt::Display for BlobId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.to_hex())
    }
}

/// Cursor's agent modes this server runs. Each has its own system prompt and tool set
/// (`prompt/<mode>/`).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Default,
)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    #[default]
    Agent,
    Ask,
    Plan,
    Debug,
    Multitask,
}

impl Mode {
    pub const ALL: [Mode; 5] = [
        Mode::Agent,
        Mode::Ask,
        Mode::Plan,
        Mode::Debug,
        Mode::Multitask,
    ];

    /// The directory of the mode's prompt assets.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Agent => "agent",
            Mode::Ask => "ask",
            Mode::Plan => "plan",
            Mode::Debug => "debug",
            Mode::Multitask => "multitask",
        }
    }

    /// The mode's name as Cursor's picker shows it.
    pub fn title(self) -> &'static str {
        match self {
            Mode::Agent => "Agent",
            Mode::Ask => "Ask",
            Mode::Plan => "Plan",
            Mode::Debug => "Debug",
            Mode::Multitask => "Multitask",
        }
    }

    pub fn parse(name: &str) -> Option<Mode> {
        Mode::ALL.into_iter().find(|m| m.as_str() == name)
    }
}

/// A run started by another agent's Task call (`run_request.subagent_type_name`): it runs with the
/// subagent prompt, and its final message goes back to the parent instead of to the user.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SubagentRole {
    /// `explore`, `generalPurpose`, or the name of one of the user's custom subagents.
    pub type_name: String,
    /// The parent run (`x-parent-request-id`) and its Task call (`x-parent-agent-tool-call-id`),
    /// for the logs.
    pub parent_request_id: Option<String>,
    pub parent_tool_call_id: Option<String>,
    /// A custom subagent's own instructions, appended to the subagent system prompt.
    pub custom_prompt: Option<String>,
    /// A custom subagent's tool allow-list (empty: the subagent tools).
    pub custom_tools: Vec<String>,
}

impl SubagentRole {
    /// Explore subagents only read (Cursor gives them Glob, Grep, Read and LS).
    pub fn is_explore(&self) -> bool {
        self.type_name.eq_ignore_ascii_case("explore")
    }
}

/// Context-window use as the checkpoint reports it (`token_details`): the last provider call's
/// prompt plus its answer, against the model's window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ContextUse {
    pub used_tokens: u64,
    pub max_tokens: u64,
}

/// What the client says about the user's workspace with a message (`request_context`): rendered
/// into the injected-context message the model sees before the user's message.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct WorkspaceContext {
    pub os_version: String,
    pub shell: String,
    pub time_zone: String,
    pub workspace_paths: Vec<String>,
    pub rules: Vec<Rule>,
    /// Skills the model may use: (path, description).
    pub skills: Vec<(String, String)>,
    /// MCP servers' own instructions: (server, instructions).
    pub mcp_instructions: Vec<(String, String)>,
    /// Subagents the user defined: (name, description).
    pub subagents: Vec<(String, String)>,
}

/// A Cursor rule as the model should see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub path: String,
    pub applies: RuleScope,
    pub content: String,
}

/// When a rule applies (Cursor's rule types).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RuleScope {
    /// Always, or attached by the user to this message: the content is shown.
    Always,
    /// To files matching these globs: shown with its globs.
    Files(Vec<String>),
    /// When the model decides it is relevant: listed with its description, read on demand.
    OnRequest(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TodoStatus {
    Pending,
    InProgress,
    Completed,
    Cancelled,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Todo {
    pub id: String,
    pub content: String,
    pub status: TodoStatus,
}

/// One TodoWrite update: replace the list, or merge by id (new ids are appended in order).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TodoUpdate {
    pub merge: bool,
    /// (id, content if given, status)
    pub items: Vec<(String, Option<String>, TodoStatus)>,
}

impl TodoUpdate {
    /// The list after this update: replaced, or merged by id (new ids appended in order).
    pub fn apply(&self, current: &[Todo]) -> Vec<Todo> {
        let mut todos: Vec<Todo> = if self.merge {
            current.to_vec()
        } else {
            Vec::new()
        };
        for (id, content, status) in &self.items {
            match todos.iter_mut().find(|t| &t.id == id) {
                Some(todo) => {
                    todo.status = *status;
                    if let Some(content) = content {
                        todo.content.clone_from(content);
                    }
                }
                None => todos.push(Todo {
                    id: id.clone(),
                    content: content.clone().unwrap_or_default(),
                    status: *status,
                }),
            }
        }
        todos
    }
}

/// Where a subagent started by a Task call is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubagentStatus {
    Running,
    Backgrounded,
    Succeeded,
    Failed,
}

/// One subagent as the parent's checkpoint reports it (Cursor draws the Task card from it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubagentRunState {
    pub parent_tool_call_id: String,
    pub title: String,
    pub agent_id: Option<String>,
    pub status: SubagentStatus,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(
        id: &str,
        content: Option<&str>,
        status: TodoStatus,
    ) -> (String, Option<String>, TodoStatus) {
        (id.to_owned(), content.map(str::to_owned), status)
    }

    #[test]
    fn merge_updates_by_id_and_appends_new_ones_while_replace_starts_over() {
        let first = TodoUpdate {
            merge: false,
            items: vec![
                item("a", Some("write code"), TodoStatus::InProgress),
                item("b", Some("test it"), TodoStatus::Pending),
            ],
        }
        .apply(&[]);
        let merged = TodoUpdate {
            merge: true,
            items: vec![
                item("a", None, TodoStatus::Completed),
                item("c", Some("ship"), TodoStatus::Pending),
            ],
        }
        .apply(&first);
        assert_eq!(
            merged
                .iter()
                .map(|t| (t.id.as_str(), t.content.as_str(), t.status))
                .collect::<Vec<_>>(),
            [
                ("a", "write code", TodoStatus::Completed),
                ("b", "test it", TodoStatus::Pending),
                ("c", "ship", TodoStatus::Pending),
            ]
        );
        let replaced = TodoUpdate {
            merge: false,
            items: vec![item("z", Some("only"), TodoStatus::Pending)],
        }
        .apply(&merged);
        assert_eq!(replaced.len(), 1);
    }
}

/// Something the user attached to a message (Cursor's `SelectedContext`: @-mentions, selections,
/// rules, `/commands`, terminals, diffs...), in the terms the model reads it. Rendered once into a
/// runtime message stored with the user's message, so every later request replays the same bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "attached", rename_all = "snake_case")]
pub enum Attachment {
    /// A whole file (@-mentioned).
    File { path: String, content: String },
    /// Lines of a file the user selected; `lines` is 1-based and inclusive.
    Selection {
        path: String,
        lines: Option<(u32, u32)>,
        content: String,
    },
    /// A folder: its directory tree as the client listed it.
    Folder { path: String, tree: String },
    /// A terminal's content, or lines selected in it.
    Terminal {
        title: String,
        lines: Option<(u32, u32)>,
        content: String,
    },
    /// A rule the user picked: its text applies to this message.
    Rule { path: String, content: String },
    /// A `/command`: its content is the user's instruction.
    Command { name: String, content: String },
    /// A diff or commit (working tree, branch against main, a commit, a pull request).
    Diff { label: String, content: String },
    /// A link, with the text the client fetched for it if any.
    Link {
        url: String,
        content: Option<String>,
    },
    /// Any other text the client attached, under what it is.
    Text { label: String, content: String },
    /// Text the client holds as a blob (only its id was sent): fetched with a hash-checked KV GET
    /// before the message is committed, then shown as `Text`.
    Stored { label: String, blob: BlobId },
    /// Attached, but nothing of it can be shown to the model (a video, a browser tab, a docs
    /// index this server cannot search): the model is told its name and that it is not shown.
    Unshown { kind: String, name: String },
}

/// An image the user attached, as the client sent it: its bytes, or the id of a blob only the
/// client holds (fetched with a hash-checked KV GET before the message is stored).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttachedImage {
    /// The file's path or name (`""` for a pasted image).
    pub name: String,
    /// The MIME type the client labelled it with (checked against the bytes).
    pub labelled: String,
    pub source: ImageSource,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImageSource {
    Data(Vec<u8>),
    Blob(BlobId),
}

/// An image the model is shown: the user attached it or a tool returned it. The bytes are the blob
/// `blob` in the store; the MIME type is the one the bytes are (checked, not as labelled).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageRef {
    pub blob: BlobId,
    pub mime: ImageMime,
    pub bytes: u64,
    /// The file name or path the client gave (`""` when it gave none).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
}

impl ImageRef {
    /// How the image is named in text (notes, captions).
    pub fn label(&self) -> String {
        let name = if self.name.is_empty() {
            "image"
        } else {
            self.name.as_str()
        };
        format!(
            "{name} ({}, {} KB)",
            self.mime.as_str(),
            self.bytes.div_ceil(1024)
        )
    }
}

/// The image formats every supported provider family accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ImageMime {
    #[serde(rename = "image/png")]
    Png,
    #[serde(rename = "image/jpeg")]
    Jpeg,
    #[serde(rename = "image/gif")]
    Gif,
    #[serde(rename = "image/webp")]
    Webp,
}

impl ImageMime {
    pub fn as_str(self) -> &'static str {
        match self {
            ImageMime::Png => "image/png",
            ImageMime::Jpeg => "image/jpeg",
            ImageMime::Gif => "image/gif",
            ImageMime::Webp => "image/webp",
        }
    }

    /// The format the bytes are, from their magic numbers (a label can be wrong: a PNG sent as
    /// `image/jpeg` is rejected by providers that check). `None`: not one the providers take.
    pub fn sniff(data: &[u8]) -> Option<ImageMime> {
        if data.starts_with(b"\x89PNG\r\n\x1a\n") {
            Some(ImageMime::Png)
        } else if data.starts_with(&[0xFF, 0xD8, 0xFF]) {
            Some(ImageMime::Jpeg)
        } else if data.starts_with(b"GIF87a") || data.starts_with(b"GIF89a") {
            Some(ImageMime::Gif)
        } else if data.len() >= 12 && &data[..4] == b"RIFF" && &data[8..12] == b"WEBP" {
            Some(ImageMime::Webp)
        } else {
            None
        }
    }
}
