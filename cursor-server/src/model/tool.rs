//! Tool calls and their results as history stores them, independent of Cursor and providers.

use serde::{Deserialize, Serialize};

/// One tool call the model made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The id Cursor sees (unique within the conversation: derived from the model call).
    pub call_id: String,
    /// The id the provider gave the call; sent back to that provider unchanged.
    pub provider_call_id: String,
    pub name: String,
    /// The arguments exactly as the model wrote them (a JSON object text).
    pub arguments: String,
}

/// The model-facing result of one tool call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolResult {
    pub call_id: String,
    /// Always text: JSON values are serialised once, before they get here.
    pub content: String,
    pub is_error: bool,
    /// Images the tool returned (an MCP tool's image content), shown to the model with the result
    /// where its provider family allows it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub images: Vec<super::conversation::ImageRef>,
    /// Typed facts later state is folded from (stored in its own column, never shown to the
    /// model; not part of the message body).
    #[serde(skip)]
    pub meta: Option<ToolMeta>,
}

/// What a result states for the conversation's derived state, as data rather than as the text the
/// model was shown.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolMeta {
    /// A Task call's subagent: its title (the call's description), the agent the client started
    /// (when it said), and whether it went on in the background.
    Subagent {
        title: String,
        agent_id: Option<String>,
        backgrounded: bool,
    },
}

/// One of the user's MCP tools as the model is offered it.
#[derive(Debug, Clone, PartialEq)]
pub struct McpTool {
    /// The model-facing name: `mcp_<server>_<tool>`, sanitized to what every provider accepts
    /// (`[A-Za-z0-9_-]`, at most 64 characters) and unique within the request.
    pub model_name: String,
    /// Cursor's name for the tool (`McpToolDefinition.name`), echoed in `mcp_args.name`.
    pub name: String,
    /// The server (`provider_identifier`).
    pub server: String,
    /// The tool's name on its server.
    pub tool_name: String,
    pub description: String,
    /// The tool's JSON schema, passed through to the model unchanged.
    pub input_schema: serde_json::Value,
}
