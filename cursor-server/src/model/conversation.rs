//! Conversation-level facts that are not messages: the mode a turn runs in, and what a checkpoint
//! states about the conversation besides its history.

use serde::{Deserialize, Serialize};

/// Cursor's agent modes this server runs. Each has its own system prompt and tool set
/// (`prompt/<mode>/`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
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

    pub fn parse(name: &str) -> Option<Mode> {
        Mode::ALL.into_iter().find(|m| m.as_str() == name)
    }
}

/// Context-window use as the checkpoint reports it (`token_details`): the last provider call's
/// prompt plus its answer, against the model's window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ContextUse {
    pub used_tokens: u64,
    pub max_tokens: u64,
}
