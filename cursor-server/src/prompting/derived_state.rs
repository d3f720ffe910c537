//! State derived by folding history: the todo list and the subagents Task calls started. Nothing
//! here is stored; the same history always folds to the same state.

use std::collections::HashSet;

use crate::model::conversation::{SubagentRunState, SubagentStatus, Todo, TodoUpdate};
use crate::model::message::{CanonicalMessage, UserMessage};
use crate::model::runtime_tag::{BackgroundOutcome, RuntimeEvent};
use crate::model::tool::ToolMeta;

/// The todo list after every successful TodoWrite call in `history`, in order.
/// `parse` turns a TodoWrite call's argument text into an update (owned by the tool registry).
pub fn fold_todos(
    history: &[CanonicalMessage],
    tool_name: &str,
    parse: impl Fn(&str) -> Option<TodoUpdate>,
) -> Vec<Todo> {
    let failed: HashSet<&str> = history
        .iter()
        .filter_map(|m| match m {
            CanonicalMessage::ToolResult(r) if r.result.is_error => Some(r.result.call_id.as_str()),
            _ => None,
        })
        .collect();
    let mut todos = Vec::new();
    for message in history {
        if let CanonicalMessage::ToolCall(record) = message
            && record.call.name == tool_name
            && !failed.contains(record.call.call_id.as_str())
            && let Some(update) = parse(&record.call.arguments)
        {
            todos = update.apply(&todos);
        }
    }
    todos
}

/// Every Task call in `history` with its state, folded from the typed metadata stored with each
/// Task result and the background completions told since, then the `running` calls of the current
/// batch.
pub fn fold_subagent_runs(
    history: &[CanonicalMessage],
    running: impl IntoIterator<Item = SubagentRunState>,
) -> Vec<SubagentRunState> {
    let mut runs: Vec<SubagentRunState> = Vec::new();
    for message in history {
        match message {
            CanonicalMessage::ToolResult(record) => {
                if let Some(ToolMeta::Subagent {
                    title,
                    agent_id,
                    backgrounded,
                }) = &record.result.meta
                {
                    let failed = record.result.is_error;
                    runs.push(SubagentRunState {
                        parent_tool_call_id: record.result.call_id.clone(),
                        title: title.clone(),
                        agent_id: agent_id.clone().filter(|_| !failed),
                        status: match (failed, backgrounded) {
                            (true, _) => SubagentStatus::Failed,
                            (false, true) => SubagentStatus::Backgrounded,
                            (false, false) => SubagentStatus::Succeeded,
                        },
                    });
                }
            }
            CanonicalMessage::User(UserMessage {
                runtime:
                    Some(RuntimeEvent::BackgroundTaskEnded {
                        task_id,
                        outcome: ended,
                    }),
                ..
            }) => {
                if let Some(run) = runs
                    .iter_mut()
                    .find(|r| r.agent_id.as_deref() == Some(task_id.as_str()))
                {
                    run.status = match ended {
                        BackgroundOutcome::Succeeded => SubagentStatus::Succeeded,
                        BackgroundOutcome::Failed | BackgroundOutcome::Aborted => {
                            SubagentStatus::Failed
                        }
                    };
                }
            }
            _ => {}
        }
    }
    runs.extend(running);
    runs
}
