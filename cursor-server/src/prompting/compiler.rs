//! Builds the provider-neutral `ModelRequest` of one provider call from the committed history, the
//! model's configuration and the run's requested parameters.
//!
//! The system prompt and tools are byte-stable across calls so that request N stays an exact prefix
//! of request N+1; a mode change replaces only them, and is told to the model by runtime messages
//! (decided here, stored once by `store/messages.rs`).

use super::assets::{PromptAssets, mode_title};
use crate::config::ModelConfig;
use crate::model::conversation::Mode;
use crate::model::message::CanonicalMessage;
use crate::model::runtime_tag::{RuntimeEvent, RuntimeTag};

/// The runtime messages a user message in `mode` brings, anchored to the run that carries it: a
/// notice when the conversation was in another mode, then the mode's reminder if it has one.
pub fn user_message_tags(
    assets: &PromptAssets,
    previous: Option<Mode>,
    mode: Mode,
    anchor: &str,
) -> Vec<RuntimeTag> {
    let mut tags = Vec::new();
    if let Some(from) = previous.filter(|from| *from != mode) {
        tags.push(RuntimeTag::new(
            RuntimeEvent::ModeChosen { from, to: mode },
            anchor,
            assets.mode_change(from, mode),
        ));
    }
    if let Some(reminder) = &assets.mode(mode).reminder {
        tags.push(RuntimeTag::new(
            RuntimeEvent::ModeReminder { mode },
            anchor,
            reminder.render(&[("mode", mode_title(mode))]),
        ));
    }
    tags
}

/// The notice for a SwitchMode call the user approved (anchored to that call).
pub fn mode_switch_tag(assets: &PromptAssets, from: Mode, to: Mode, call_id: &str) -> RuntimeTag {
    RuntimeTag::new(
        RuntimeEvent::ModeSwitched { from, to },
        call_id,
        assets.mode_change(from, to),
    )
}

/// Reasoning effort levels Cursor can request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effort {
    Minimal,
    Low,
    Medium,
    High,
    Max,
}

impl Effort {
    pub fn parse(value: &str) -> Option<Effort> {
        match value.trim().to_ascii_lowercase().as_str() {
            "minimal" | "none" => Some(Effort::Minimal),
            "low" => Some(Effort::Low),
            "medium" => Some(Effort::Medium),
            "high" => Some(Effort::High),
            "max" | "xhigh" => Some(Effort::Max),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Effort::Minimal => "minimal",
            Effort::Low => "low",
            Effort::Medium => "medium",
            Effort::High => "high",
            Effort::Max => "max",
        }
    }
}

/// What the client asked for beyond the model id (`requested_model.parameters`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RequestParameters {
    pub effort: Option<Effort>,
    /// Cursor's "fast" toggle: a priority tier where the endpoint has one.
    pub fast: bool,
}

impl RequestParameters {
    /// Maps Cursor's `(id, value)` parameters; unknown ones are logged and ignored, never fatal.
    pub fn from_pairs(pairs: &[(String, String)]) -> RequestParameters {
        let mut parameters = RequestParameters::default();
        for (id, value) in pairs {
            match id.as_str() {
                "reasoning" | "reasoning_effort" | "effort" | "thinking" => {
                    match Effort::parse(value) {
                        Some(effort) => parameters.effort = Some(effort),
                        None => tracing::debug!("ignoring reasoning parameter value {value:?}"),
                    }
                }
                "fast" => parameters.fast = matches!(value.as_str(), "true" | "1" | "on"),
                other => tracing::debug!("ignoring unknown model parameter {other:?}={value:?}"),
            }
        }
        parameters
    }
}

/// What one provider call is asked, before any provider-specific shaping.
#[derive(Debug, Clone, Copy)]
pub struct ModelRequest<'a> {
    pub system: &'a str,
    pub history: &'a [CanonicalMessage],
    pub model: &'a ModelConfig,
    /// Tool definitions, OpenAI Chat function format.
    pub tools: &'a [serde_json::Value],
    pub parameters: RequestParameters,
}

pub fn compile<'a>(
    system: &'a str,
    history: &'a [CanonicalMessage],
    model: &'a ModelConfig,
    tools: &'a [serde_json::Value],
    parameters: RequestParameters,
) -> ModelRequest<'a> {
    ModelRequest {
        system,
        history,
        model,
        tools,
        parameters,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_map_effort_and_fast_and_ignore_the_rest() {
        let pairs = [
            ("reasoning".to_owned(), "high".to_owned()),
            ("fast".to_owned(), "true".to_owned()),
            ("something_new".to_owned(), "x".to_owned()),
        ];
        assert_eq!(
            RequestParameters::from_pairs(&pairs),
            RequestParameters {
                effort: Some(Effort::High),
                fast: true
            }
        );
    }
}
