//! State derived by folding history: the todo list and the subagents Task calls started. Nothing
//! here is stored; the same history always folds to the same state.

use std::collections::HashSet;

use crate::model::conversation::{SubagentRunState, SubagentStatus, TaskOutcome, Todo, TodoUpdate};
use crate::model::message::{CanonicalMessage, UserMessage};
use crate::model::runtime_tag::{BackgroundOutcome, RuntimeEvent};

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

/// Every Task call in `history` with its state, plus the `running` calls of the current batch.
/// `title` reads a call's arguments and `outcome` its result (both owned by the tool registry).
pub fn fold_subagent_runs<'a>(
    history: &[CanonicalMessage],
    running: impl IntoIterator<Item = (&'a str, &'a str)>,
    tool_name: &str,
    title: impl Fn(&str) -> Option<String>,
    outcome: impl Fn(&str, bool) -> TaskOutcome,
) -> Vec<SubagentRunState> {
    let mut runs: Vec<SubagentRunState> = Vec::new();
    for message in history {
        match message {
            CanonicalMessage::ToolCall(record) if record.call.name == tool_name => {
                runs.push(SubagentRunState {
                    parent_tool_call_id: record.call.call_id.clone(),
                    title: title(&record.call.arguments).unwrap_or_default(),
                    agent_id: None,
                    status: SubagentStatus::Running,
                });
            }
            CanonicalMessage::ToolResult(result) => {
                if let Some(run) = runs
                    .iter_mut()
                    .find(|r| r.parent_tool_call_id == result.result.call_id)
                {
                    (run.status, run.agent_id) =
                        outcome(&result.result.content, result.result.is_error);
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
    for (call_id, arguments) in running {
        runs.push(SubagentRunState {
            parent_tool_call_id: call_id.to_owned(),
            title: title(arguments).unwrap_or_default(),
            agent_id: None,
            status: SubagentStatus::Running,
        });
    }
    runs
}
