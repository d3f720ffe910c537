//! State derived by folding history: the todo list and the subagents Task calls started. Nothing
//! here is stored; the same history always folds to the same state.

use std::collections::HashSet;

use serde::{Deserialize, Serialize};

use crate::model::message::{CanonicalMessage, UserMessage};
use crate::model::runtime_tag::{BackgroundOutcome, RuntimeEvent};

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

pub fn apply(current: &[Todo], update: &TodoUpdate) -> Vec<Todo> {
    let mut todos: Vec<Todo> = if update.merge {
        current.to_vec()
    } else {
        Vec::new()
    };
    for (id, content, status) in &update.items {
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
            todos = apply(&todos, &update);
        }
    }
    todos
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

/// What a finished Task call's result says: (status, agent id).
pub type TaskOutcome = (SubagentStatus, Option<String>);

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
        let first = apply(
            &[],
            &TodoUpdate {
                merge: false,
                items: vec![
                    item("a", Some("write code"), TodoStatus::InProgress),
                    item("b", Some("test it"), TodoStatus::Pending),
                ],
            },
        );
        let merged = apply(
            &first,
            &TodoUpdate {
                merge: true,
                items: vec![
                    item("a", None, TodoStatus::Completed),
                    item("c", Some("ship"), TodoStatus::Pending),
                ],
            },
        );
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
        let replaced = apply(
            &merged,
            &TodoUpdate {
                merge: false,
                items: vec![item("z", Some("only"), TodoStatus::Pending)],
            },
        );
        assert_eq!(replaced.len(), 1);
    }
}
