//! State derived by folding history: the todo list, the accepted plan and the subagents Task calls
//! started. Nothing here is stored; the same history always folds to the same state.

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

/// The plan of the last CreatePlan call in `history` that did not fail (the user accepted it).
/// `plan_of` takes a CreatePlan call's argument text to its plan (owned by the tool registry).
pub fn fold_plan(
    history: &[CanonicalMessage],
    tool_name: &str,
    plan_of: impl Fn(&str) -> Option<String>,
) -> Option<String> {
    let mut calls: Vec<(&str, &str)> = Vec::new();
    let mut plan = None;
    for message in history {
        match message {
            CanonicalMessage::ToolCall(record) if record.call.name == tool_name => {
                calls.push((record.call.call_id.as_str(), record.call.arguments.as_str()));
            }
            CanonicalMessage::ToolResult(record) if !record.result.is_error => {
                if let Some((_, arguments)) =
                    calls.iter().find(|(id, _)| *id == record.result.call_id)
                {
                    plan = plan_of(arguments).or(plan);
                }
            }
            _ => {}
        }
    }
    plan
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::message::{ToolCallRecord, ToolResultRecord};
    use crate::model::tool::{ToolCall, ToolResult};

    fn plan_call(id: &str, plan: &str, accepted: bool) -> [CanonicalMessage; 2] {
        [
            CanonicalMessage::ToolCall(ToolCallRecord {
                model_call_id: "m".into(),
                index: 0,
                call: ToolCall {
                    call_id: id.into(),
                    provider_call_id: id.into(),
                    name: "CreatePlan".into(),
                    arguments: plan.into(),
                },
            }),
            CanonicalMessage::ToolResult(ToolResultRecord {
                card: None,
                model_call_id: "m".into(),
                index: 0,
                result: ToolResult {
                    images: Vec::new(),
                    call_id: id.into(),
                    content: String::new(),
                    is_error: !accepted,
                    meta: None,
                },
            }),
        ]
    }

    #[test]
    fn the_plan_is_the_last_one_the_user_accepted() {
        let plan_of = |arguments: &str| Some(arguments.to_owned());
        let mut history: Vec<CanonicalMessage> = Vec::new();
        assert_eq!(fold_plan(&history, "CreatePlan", plan_of), None);
        history.extend(plan_call("p1", "first", true));
        history.extend(plan_call("p2", "rejected", false));
        assert_eq!(
            fold_plan(&history, "CreatePlan", plan_of).as_deref(),
            Some("first")
        );
        history.extend(plan_call("p3", "second", true));
        assert_eq!(
            fold_plan(&history, "CreatePlan", plan_of).as_deref(),
            Some("second")
        );
        // Folding is a pure function of history: the same history, the same plan.
        assert_eq!(
            fold_plan(&history, "CreatePlan", plan_of),
            fold_plan(&history, "CreatePlan", plan_of)
        );
    }
}
