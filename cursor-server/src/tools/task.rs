//! Task: a subagent the client runs as its own conversation (explore subagents read-only; Ask and
//! Plan mode start read-only ones), reported back on the parent's Task card; background subagents
//! report in a follow-up turn.

use serde::Deserialize;

use crate::cursor::proto::agent::{self as pb, exec_server_message, tool_call};
use crate::model::conversation::{Mode, SubagentRunState, SubagentStatus};
use crate::model::tool::ToolMeta;
use crate::tools::tool_result::{
    Tool, ToolEnv, ToolOutcome, ToolStep, argument_text, card, done, failed, non_empty,
    on_exec_answer, parse_args,
};

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct TaskInput {
    pub description: String,
    pub prompt: String,
    pub subagent_type: Option<String>,
    pub model: Option<String>,
    #[serde(default)]
    pub readonly: bool,
    pub resume: Option<String>,
    #[serde(default)]
    pub run_in_background: bool,
    #[serde(default)]
    pub attachments: Vec<String>,
}

impl TaskInput {
    /// The subagent type the client is asked to start (`generalPurpose` when the model names none).
    pub fn subagent_type(&self) -> &str {
        self.subagent_type
            .as_deref()
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .unwrap_or("generalPurpose")
    }
}

impl Tool for TaskInput {
    type Result = pb::TaskResult;

    const NAME: &'static str = "Task";
    const ARGUMENTS: &'static [(&'static str, bool)] = &[
        ("description", true),
        ("prompt", true),
        ("subagent_type", false),
        ("model", false),
        ("readonly", false),
        ("resume", false),
        ("run_in_background", false),
        ("attachments", false),
    ];

    fn parse(text: &str) -> Result<TaskInput, String> {
        let input: TaskInput = parse_args("Task", text)?;
        non_empty("Task", "description", &input.description)?;
        non_empty("Task", "prompt", &input.prompt)?;
        Ok(input)
    }

    fn card(args: Option<&Self>, _call_id: &str, result: Option<Self::Result>) -> pb::ToolCall {
        card(tool_call::Tool::TaskToolCall(pb::TaskToolCall {
            args: args.map(task_args),
            result,
        }))
    }

    fn error(_args: Option<&Self>, _call_id: &str, message: &str) -> Self::Result {
        pb::TaskResult {
            result: Some(pb::task_result::Result::Error(pb::TaskError {
                error: message.to_owned(),
            })),
        }
    }

    fn start(&self, call_id: &str, env: &ToolEnv) -> ToolStep {
        ToolStep::exec(exec_server_message::Message::SubagentArgs(subagent_args(
            self, call_id, env,
        )))
    }

    on_exec_answer!(SubagentResult => task_outcome);
}

fn task_args(task: &TaskInput) -> pb::TaskArgs {
    use pb::subagent_type::Type;
    let kind = match task.subagent_type() {
        t if t.eq_ignore_ascii_case("explore") => Type::Explore(pb::SubagentTypeExplore {}),
        "generalPurpose" => Type::Unspecified(pb::SubagentTypeUnspecified {}),
        name => Type::Custom(pb::SubagentTypeCustom {
            name: name.to_owned(),
        }),
    };
    pb::TaskArgs {
        description: task.description.clone(),
        prompt: task.prompt.clone(),
        subagent_type: Some(pb::SubagentType { r#type: Some(kind) }),
        model: task.model.clone(),
        resume: task.resume.clone(),
        attachments: task.attachments.clone(),
        environment: pb::SubagentExecutionEnvironment::Local as i32,
        ..pb::TaskArgs::default()
    }
}

/// `subagent_args` for a Task call: the client starts the child run (its own request and
/// conversation) and answers with the subagent's result. Ask and Plan mode only start read-only
/// subagents.
pub fn subagent_args(task: &TaskInput, call_id: &str, env: &ToolEnv) -> pb::SubagentArgs {
    let read_only_mode = matches!(env.mode, Mode::Ask | Mode::Plan);
    pb::SubagentArgs {
        tool_call_id: call_id.to_owned(),
        subagent_type: task.subagent_type().to_owned(),
        model_id: task
            .model
            .clone()
            .filter(|m| !m.trim().is_empty())
            .unwrap_or_else(|| env.model_id.clone()),
        prompt: task.prompt.clone(),
        readonly: task.readonly || read_only_mode,
        resume_agent_id: task.resume.clone().filter(|r| !r.trim().is_empty()),
        run_in_background: Some(task.run_in_background),
        parent_conversation_id: Some(env.conversation_id.clone()),
        mode: task_mode(env.mode) as i32,
        environment: pb::SubagentExecutionEnvironment::Local as i32,
        ..pb::SubagentArgs::default()
    }
}

fn task_mode(mode: Mode) -> pb::TaskMode {
    match mode {
        Mode::Plan => pb::TaskMode::Plan,
        _ => pb::TaskMode::Agent,
    }
}

/// The first line of a Task result the model reads (it names the agent, so the model can resume
/// it); the checkpoint's subagent list is folded from the result's `ToolMeta`, not from this text.
const SUBAGENT_TAG: &str = "[subagent ";
const SUBAGENT_BACKGROUND: &str = "is running in the background";

/// A subagent's result completes the parent's Task card; the model reads the subagent's final
/// message under a line naming the agent id (so it can `resume` it).
fn task_outcome(
    task: &TaskInput,
    call_id: &str,
    result: pb::SubagentResult,
    _env: &ToolEnv,
) -> ToolOutcome {
    let (agent_id, backgrounded) = match &result.result {
        Some(pb::subagent_result::Result::Success(success)) => (
            Some(success.agent_id.clone()),
            success.background_reason != pb::SubagentBackgroundReason::Unspecified as i32,
        ),
        _ => (None, false),
    };
    let mut outcome = subagent_outcome(task, call_id, result);
    outcome.meta = Some(ToolMeta::Subagent {
        title: task.description.clone(),
        agent_id: agent_id.filter(|_| !outcome.is_error),
        backgrounded: backgrounded && !outcome.is_error,
    });
    outcome
}

fn subagent_outcome(task: &TaskInput, call_id: &str, result: pb::SubagentResult) -> ToolOutcome {
    use pb::subagent_result::Result as S;
    match result.result {
        Some(S::Success(success)) => {
            let background =
                success.background_reason != pb::SubagentBackgroundReason::Unspecified as i32;
            let text = if background {
                format!(
                    "{SUBAGENT_TAG}{} {SUBAGENT_BACKGROUND}; you will be told when it finishes]",
                    success.agent_id
                )
            } else {
                format!(
                    "{SUBAGENT_TAG}{} finished after {} tool calls; call Task with resume: {:?} to continue it]\n\n{}",
                    success.agent_id,
                    success.tool_call_count,
                    success.agent_id,
                    success
                        .final_message
                        .as_deref()
                        .filter(|m| !m.trim().is_empty())
                        .unwrap_or("(the subagent ended without a final message)")
                )
            };
            let part = pb::TaskResult {
                result: Some(pb::task_result::Result::Success(pb::TaskSuccess {
                    agent_id: Some(success.agent_id.clone()),
                    is_background: background,
                    background_reason: success.background_reason,
                    transcript_path: success.transcript_path.clone(),
                    ..pb::TaskSuccess::default()
                })),
            };
            done(task, call_id, part, text, false)
        }
        Some(S::Error(error)) => failed(
            task,
            call_id,
            &format!(
                "the subagent{} failed: {}",
                error
                    .agent_id
                    .as_deref()
                    .map(|id| format!(" {id}"))
                    .unwrap_or_default(),
                error.error
            ),
        ),
        None => failed(task, call_id, "the client sent an empty subagent result"),
    }
}

/// The user moved the Task's subagent to the background mid-turn (`background_subagent_action`):
/// the card completes as backgrounded and the model hears it will be told when the subagent ends.
pub fn moved_by_user(task: &TaskInput, call_id: &str) -> ToolOutcome {
    let part = pb::TaskResult {
        result: Some(pb::task_result::Result::Success(pb::TaskSuccess {
            is_background: true,
            background_reason: pb::SubagentBackgroundReason::UserRequest as i32,
            ..pb::TaskSuccess::default()
        })),
    };
    let text = format!(
        "{SUBAGENT_TAG}{:?} {SUBAGENT_BACKGROUND} (moved there by the user); you will be told when it finishes]",
        task.description
    );
    let mut outcome = done(task, call_id, part, text, false);
    outcome.meta = Some(ToolMeta::Subagent {
        title: task.description.clone(),
        agent_id: None,
        backgrounded: true,
    });
    outcome
}

/// A Task call's title (its description), for the checkpoint's subagent list.
fn task_title(arguments: &str) -> Option<String> {
    let text = argument_text(arguments);
    TaskInput::parse(text).ok().map(|task| task.description)
}

/// What a Task call whose subagent result the server never read (bad arguments, a client error,
/// a conversation imported from the client) states for the subagent list: its title, no agent.
pub fn untold_meta(arguments: &str) -> ToolMeta {
    ToolMeta::Subagent {
        title: task_title(arguments).unwrap_or_default(),
        agent_id: None,
        backgrounded: false,
    }
}

/// A Task call still running, as the checkpoint's subagent list shows it.
pub fn running(call_id: &str, arguments: &str) -> SubagentRunState {
    SubagentRunState {
        parent_tool_call_id: call_id.to_owned(),
        title: task_title(arguments).unwrap_or_default(),
        agent_id: None,
        status: SubagentStatus::Running,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cursor::proto::agent::exec_client_message;
    use crate::tools::tool_result::Stage;
    use crate::tools::tool_result::testing::{ended, env};

    fn task() -> TaskInput {
        TaskInput::parse(r#"{"description":"Find the parser","prompt":"look"}"#).unwrap()
    }

    #[test]
    fn a_backgrounded_subagent_is_named_for_the_model_and_typed_for_the_checkpoint() {
        let result = pb::SubagentResult {
            result: Some(pb::subagent_result::Result::Success(pb::SubagentSuccess {
                agent_id: "a1".into(),
                background_reason: pb::SubagentBackgroundReason::UserRequest as i32,
                ..Default::default()
            })),
        };
        let outcome = ended(task().on_result(
            "c1",
            exec_client_message::Message::SubagentResult(result),
            &mut Stage::default(),
            &env(),
        ));
        assert_eq!(
            outcome.model_text,
            "[subagent a1 is running in the background; you will be told when it finishes]"
        );
        assert_eq!(
            outcome.meta,
            Some(ToolMeta::Subagent {
                title: "Find the parser".into(),
                agent_id: Some("a1".into()),
                backgrounded: true,
            })
        );
        let Some(tool_call::Tool::TaskToolCall(card)) = outcome.card.tool else {
            panic!("a Task card")
        };
        let Some(pb::task_result::Result::Success(success)) = card.result.and_then(|r| r.result)
        else {
            panic!("a success")
        };
        assert!(success.is_background);
    }

    #[test]
    fn a_failed_subagent_has_the_task_error_card_and_no_agent() {
        let result = pb::SubagentResult {
            result: Some(pb::subagent_result::Result::Error(pb::SubagentError {
                agent_id: Some("a2".into()),
                error: "crashed".into(),
            })),
        };
        let outcome = ended(task().on_result(
            "c1",
            exec_client_message::Message::SubagentResult(result),
            &mut Stage::default(),
            &env(),
        ));
        assert_eq!(outcome.model_text, "Error: the subagent a2 failed: crashed");
        assert!(matches!(
            outcome.meta,
            Some(ToolMeta::Subagent { agent_id: None, .. })
        ));
        let Some(tool_call::Tool::TaskToolCall(card)) = outcome.card.tool else {
            panic!("a Task card")
        };
        assert!(matches!(
            card.result.and_then(|r| r.result),
            Some(pb::task_result::Result::Error(_))
        ));
    }
}
