//! Runtime events: things the server tells the model that nobody typed (mode notices, mode
//! reminders). Each becomes one runtime-origin user message, appended exactly once: its event id is
//! unique per conversation (`UNIQUE(conversation_id, runtime_event_id)` in the store) and it is
//! written in the same transaction as the message that caused it, so provider retries, tool
//! rounds, later turns and restarts replay the stored message and never append it again.

use serde::{Deserialize, Serialize};

use super::conversation::Mode;

/// What happened.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum RuntimeEvent {
    /// The workspace context (environment, rules, skills, MCP, subagents) differs from the one the
    /// model saw last; `digest` identifies the rendered text.
    WorkspaceContext { digest: String },
    /// The user sent a message in another mode than the conversation's previous one.
    ModeChosen { from: Mode, to: Mode },
    /// The user approved the model's SwitchMode call; the run continues in `to`.
    ModeSwitched { from: Mode, to: Mode },
    /// The mode's standing reminder, once for each user message sent in it.
    ModeReminder { mode: Mode },
    /// A background task (a subagent or shell the model started) ended; the client reported it
    /// with a background-completion action on this conversation.
    BackgroundTaskEnded {
        task_id: String,
        outcome: BackgroundOutcome,
    },
    /// The conversation neared the model's context window: the messages before index `through`
    /// were summarized into this message, which the model sees in their place (compaction
    /// `number` of the conversation, counting from 1). Nothing is deleted.
    Compacted { number: u32, through: usize },
    /// What the user attached to the message of this run (files, selections, rules, commands,
    /// terminals, diffs...), rendered once.
    Attached,
    /// The user answered an AskQuestion after the run that asked it had ended.
    QuestionAnswered { call_id: String },
    /// A message the user sent while the agent was busy, delivered ahead of the next one
    /// (`prepend_user_messages`); `index` orders them.
    QueuedMessage { index: usize },
    /// The user did something outside a turn the model should know of (ran a command themselves).
    UserActed { action: UserAction },
    /// A tool call that was pending when the user interrupted the run finished after all; the
    /// client sent its result with the next message (`interrupted_pending_tool_call_resolutions`).
    InterruptedCallResolved { call_id: String },
}

/// Something the user did that the model is told of.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "snake_case")]
pub enum UserAction {
    /// The user ran a command in the agent's shell (`shell_command_action`): the server ran it
    /// through the client's shell exec under `exec_id`; `output` is what it printed, as the model
    /// reads a Shell result (`None` in records made before commands were run).
    RanCommand {
        command: String,
        exec_id: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        output: Option<String>,
    },
}

/// One ended background task, as the client reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackgroundCompletion {
    pub task_id: String,
    pub kind: BackgroundKind,
    pub outcome: BackgroundOutcome,
    pub title: String,
    pub detail: Option<String>,
    pub output_path: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BackgroundKind {
    Subagent,
    Shell,
}

/// How a background task ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BackgroundOutcome {
    Succeeded,
    Failed,
    Aborted,
}

impl RuntimeEvent {
    fn kind(&self) -> &'static str {
        match self {
            RuntimeEvent::WorkspaceContext { .. } => "workspace_context",
            RuntimeEvent::ModeChosen { .. } => "mode_chosen",
            RuntimeEvent::ModeSwitched { .. } => "mode_switched",
            RuntimeEvent::ModeReminder { .. } => "mode_reminder",
            RuntimeEvent::BackgroundTaskEnded { .. } => "background_task_ended",
            RuntimeEvent::Compacted { .. } => "compacted",
            RuntimeEvent::Attached => "attached",
            RuntimeEvent::QuestionAnswered { .. } => "question_answered",
            RuntimeEvent::QueuedMessage { .. } => "queued_message",
            RuntimeEvent::UserActed { .. } => "user_acted",
            RuntimeEvent::InterruptedCallResolved { .. } => "interrupted_call_resolved",
        }
    }

    /// The mode the conversation is in from this event on, if the event changes it.
    pub fn new_mode(&self) -> Option<Mode> {
        match self {
            RuntimeEvent::ModeChosen { to, .. } | RuntimeEvent::ModeSwitched { to, .. } => {
                Some(*to)
            }
            RuntimeEvent::ModeReminder { .. }
            | RuntimeEvent::WorkspaceContext { .. }
            | RuntimeEvent::BackgroundTaskEnded { .. }
            | RuntimeEvent::Compacted { .. }
            | RuntimeEvent::Attached
            | RuntimeEvent::QuestionAnswered { .. }
            | RuntimeEvent::QueuedMessage { .. }
            | RuntimeEvent::UserActed { .. }
            | RuntimeEvent::InterruptedCallResolved { .. } => None,
        }
    }
}

/// One runtime event with the text the model sees for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeTag {
    /// Unique within the conversation: the event's kind and what it is anchored to (the run that
    /// carried the user's message, or the tool call that switched modes).
    pub event_id: String,
    pub event: RuntimeEvent,
    pub text: String,
}

impl RuntimeTag {
    pub fn new(event: RuntimeEvent, anchor: &str, text: String) -> RuntimeTag {
        RuntimeTag {
            event_id: format!("{}:{anchor}", event.kind()),
            event,
            text,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::message::{CanonicalMessage, Origin, UserMessage, current_mode};

    #[test]
    fn event_ids_name_the_kind_and_anchor_and_mode_changes_are_folded() {
        let chosen = RuntimeTag::new(
            RuntimeEvent::ModeChosen {
                from: Mode::Agent,
                to: Mode::Plan,
            },
            "req-1",
            "now plan".into(),
        );
        let reminder = RuntimeTag::new(
            RuntimeEvent::ModeReminder { mode: Mode::Plan },
            "req-1",
            "plan only".into(),
        );
        assert_eq!(chosen.event_id, "mode_chosen:req-1");
        assert_ne!(chosen.event_id, reminder.event_id);
        let history = vec![
            CanonicalMessage::User(UserMessage {
                images: Vec::new(),
                shown_as: None,
                state_before: None,
                origin: Origin::User,
                text: "hi".into(),
                client_message_id: String::new(),
                mode: Some(Mode::Agent),
                runtime: None,
            }),
            chosen.message(),
            reminder.message(),
        ];
        assert_eq!(current_mode(&history), Some(Mode::Plan));
        assert_eq!(current_mode(&history[..1]), Some(Mode::Agent));
        assert_eq!(current_mode(&[]), None);
    }
}
