//! State derived by folding history: the todo list. Nothing here is stored; the same history always
//! folds to the same state.

use std::collections::HashSet;

use serde::{Deserialize, Serialize};

use crate::model::message::CanonicalMessage;

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
