//! Builds the provider-neutral `ModelRequest` of one provider call from the committed history.
//!
//! The system prompt is byte-stable across calls so that request N stays an exact prefix of N+1.

use crate::model::message::CanonicalMessage;

/// The shared system prompt, from the repository's `prompt/` assets.
pub const COMMON_PREFIX: &str = include_str!("../../../prompt/common_prefix.md");

/// The Agent mode's tools, in OpenAI function format (names must exist in `cursor/tools.rs`).
pub const AGENT_TOOLS: &str = include_str!("../../../prompt/agent/tools.json");

/// What one provider call is asked, before any provider-specific shaping.
#[derive(Debug, Clone, Copy)]
pub struct ModelRequest<'a> {
    pub system: &'a str,
    pub history: &'a [CanonicalMessage],
    /// The id the provider knows the model by.
    pub upstream_model: &'a str,
    /// Whether the model thinks (its replay rules are stricter).
    pub reasoning_model: bool,
    /// Tool definitions, OpenAI function format.
    pub tools: &'a [serde_json::Value],
}

pub fn compile<'a>(
    history: &'a [CanonicalMessage],
    upstream_model: &'a str,
    reasoning_model: bool,
    tools: &'a [serde_json::Value],
) -> ModelRequest<'a> {
    ModelRequest {
        system: COMMON_PREFIX,
        history,
        upstream_model,
        reasoning_model,
        tools,
    }
}

/// Parses the embedded Agent tool list once (at start-up); a malformed asset is a start-up error.
pub fn agent_tools() -> Result<Vec<serde_json::Value>, String> {
    serde_json::from_str(AGENT_TOOLS).map_err(|e| format!("prompt/agent/tools.json: {e}"))
}
