//! Builds the provider-neutral `ModelRequest` of one provider call from the committed history.
//!
//! The system prompt is byte-stable across calls so that request N stays an exact prefix of N+1.

use crate::model::message::CanonicalMessage;

/// The shared system prompt, from the repository's `prompt/` assets.
pub const COMMON_PREFIX: &str = include_str!("../../../prompt/common_prefix.md");

/// What one provider call is asked, before any provider-specific shaping.
#[derive(Debug, Clone, Copy)]
pub struct ModelRequest<'a> {
    pub system: &'a str,
    pub history: &'a [CanonicalMessage],
    /// The id the provider knows the model by.
    pub upstream_model: &'a str,
}

pub fn compile<'a>(history: &'a [CanonicalMessage], upstream_model: &'a str) -> ModelRequest<'a> {
    ModelRequest {
        system: COMMON_PREFIX,
        history,
        upstream_model,
    }
}
