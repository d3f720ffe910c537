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
