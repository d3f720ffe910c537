//! TodoWrite: the todo list, answered by the server at once (no client round trip) and folded
//! from history, never stored apart from it.

use std::fmt::Write as _;

use serde::Deserialize;

use crate::cursor::proto::agent::{self as pb, tool_call};
use crate::model::conversation::{Todo, TodoStatus, TodoUpdate};
use crate::tools::tool_result::{
    Tool, ToolEnv, ToolOutcome, ToolStep, Transport, argument_text, card, done, i32_of, parse_args,
};

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct TodoInput {
    pub id: String,
    pub content: Option<String>,
    pub status: TodoStatus,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct TodoWriteInput {
    pub todos: Vec<TodoInput>,
    pub merge: bool,
}

impl Tool for TodoWriteInput {
    type Result = pb::UpdateTodosResult;

    const NAME: &'static str = "TodoWrite";
    const TRANSPORT: Transport = Transport::Local;
    const ARGUMENTS: &'static [(&'static str, bool)] = &[("todos", true), ("merge", true)];

    fn parse(text: &str) -> Result<TodoWriteInput, String> {
        let input: TodoWriteInput = parse_args("TodoWrite", text)?;
        if let Some(todo) = input.todos.iter().find(|t| t.id.trim().is_empty()) {
            return Err(format!(
                "invalid arguments for TodoWrite: a todo has an empty id ({todo:?})"
            ));
        }
        if !input.merge
            && let Some(todo) = input
                .todos
                .iter()
                .find(|t| t.content.as_deref().is_none_or(|c| c.trim().is_empty()))
        {
            return Err(format!(
                "invalid arguments for TodoWrite: todo {:?} needs `content` when merge is false",
                todo.id
            ));
        }
        Ok(input)
    }

    fn card(args: Option<&Self>, _call_id: &str, result: Option<Self::Result>) -> pb::ToolCall {
        card(tool_call::Tool::UpdateTodosToolCall(
            pb::UpdateTodosToolCall {
                args: args.map(|todos| pb::UpdateTodosArgs {
                    todos: todos
                        .todos
                        .iter()
                        .map(|t| pb::TodoItem {
                            id: t.id.clone(),
                            content: t.content.clone().unwrap_or_default(),
                            status: todo_status(t.status) as i32,
                            ..pb::TodoItem::default()
                        })
                        .collect(),
                    merge: todos.merge,
                }),
                result,
            },
        ))
    }

    fn error(_args: Option<&Self>, _call_id: &str, message: &str) -> Self::Result {
        pb::UpdateTodosResult {
            result: Some(pb::update_todos_result::Result::Error(
                pb::UpdateTodosError {
                    error: message.to_owned(),
                },
            )),
        }
    }

    /// Answered locally, against the todos folded from history before this call.
    fn start(&self, _call_id: &str, env: &ToolEnv) -> ToolStep {
        ToolStep::Done(todo_write(self, &env.todos))
    }
}

fn todo_item(todo: &Todo) -> pb::TodoItem {
    pb::TodoItem {
        id: todo.id.clone(),
        content: todo.content.clone(),
        status: todo_status(todo.status) as i32,
        ..pb::TodoItem::default()
    }
}

fn todo_status(status: TodoStatus) -> pb::TodoStatus {
    match status {
        TodoStatus::Pending => pb::TodoStatus::Pending,
        TodoStatus::InProgress => pb::TodoStatus::InProgress,
        TodoStatus::Completed => pb::TodoStatus::Completed,
        TodoStatus::Cancelled => pb::TodoStatus::Cancelled,
    }
}

fn todo_update(input: &TodoWriteInput) -> TodoUpdate {
    TodoUpdate {
        merge: input.merge,
        items: input
            .todos
            .iter()
            .map(|t| (t.id.clone(), t.content.clone(), t.status))
            .collect(),
    }
}

/// Parses a stored TodoWrite argument text for the history fold.
pub fn parse_todo_update(arguments: &str) -> Option<TodoUpdate> {
    let text = argument_text(arguments);
    TodoWriteInput::parse(text)
        .ok()
        .map(|input| todo_update(&input))
}

/// TodoWrite, answered locally.
fn todo_write(input: &TodoWriteInput, current: &[Todo]) -> ToolOutcome {
    let todos = todo_update(input).apply(current);
    let mut text = format!("Todo list updated ({} items):\n", todos.len());
    for todo in &todos {
        let mark = match todo.status {
            TodoStatus::Pending => "[ ]",
            TodoStatus::InProgress => "[~]",
            TodoStatus::Completed => "[x]",
            TodoStatus::Cancelled => "[-]",
        };
        let _ = writeln!(text, "{mark} {} ({})", todo.content, todo.id);
    }
    let part = pb::UpdateTodosResult {
        result: Some(pb::update_todos_result::Result::Success(
            pb::UpdateTodosSuccess {
                total_count: i32_of(todos.len()),
                todos: todos.iter().map(todo_item).collect(),
                was_merge: input.merge,
            },
        )),
    };
    done(input, "", part, text, false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::tool_result::testing::{ended_step, env};

    #[test]
    fn todos_are_answered_at_once_with_the_whole_list() {
        let todos = TodoWriteInput::parse(
            r#"{"merge":false,"todos":[{"id":"t1","content":"ship","status":"in_progress"}]}"#,
        )
        .unwrap();
        let outcome = ended_step(todos.start("c1", &env()));
        assert_eq!(
            outcome.model_text,
            "Todo list updated (1 items):\n[~] ship (t1)\n"
        );
        let Some(tool_call::Tool::UpdateTodosToolCall(card)) = outcome.card.tool else {
            panic!("an UpdateTodos card")
        };
        let Some(pb::update_todos_result::Result::Success(success)) =
            card.result.and_then(|r| r.result)
        else {
            panic!("a success")
        };
        assert_eq!(success.total_count, 1);
    }

    #[test]
    fn failed_todos_have_the_todos_error_card() {
        let todos = TodoWriteInput::parse(r#"{"merge":true,"todos":[]}"#).unwrap();
        let outcome = crate::tools::tool_result::failed(&todos, "c1", "busy");
        assert_eq!(outcome.model_text, "Error: busy");
        let Some(tool_call::Tool::UpdateTodosToolCall(card)) = outcome.card.tool else {
            panic!("an UpdateTodos card")
        };
        assert!(matches!(
            card.result.and_then(|r| r.result),
            Some(pb::update_todos_result::Result::Error(_))
        ));
    }
}
