//! Tools the user decides: AskQuestion (questions with options), SwitchMode (approved or rejected;
//! an approval moves the conversation to the mode) and CreatePlan (a plan shown to the user). Each
//! is an `interaction_query` whose response is the tool's result. Plan mode's two actions — start
//! planning, and "Build" (execute the plan) — arrive as user messages of the family's own making.

use std::fmt::Write as _;

use serde::Deserialize;

use crate::cursor::proto::agent::{self as pb, interaction_query, interaction_response, tool_call};
use crate::model::conversation::Mode;
use crate::tools::tool_result::{
    Tool, ToolEnv, ToolStep, Transport, card, done, non_empty, parse_args, reason_suffix,
    unexpected_response,
};

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct QuestionOption {
    pub id: String,
    pub label: String,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Question {
    pub id: String,
    pub prompt: String,
    #[serde(default)]
    pub options: Vec<QuestionOption>,
    #[serde(default)]
    pub allow_multiple: bool,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct AskQuestionInput {
    #[serde(default)]
    pub title: String,
    pub questions: Vec<Question>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct SwitchModeInput {
    pub target_mode_id: String,
    pub explanation: Option<String>,
    /// Validated: the mode the id names.
    #[serde(skip)]
    pub target: Mode,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct PlanTodo {
    pub id: String,
    pub content: String,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct CreatePlanInput {
    pub name: String,
    pub overview: String,
    pub plan: String,
    #[serde(default)]
    pub todos: Vec<PlanTodo>,
}

impl Tool for AskQuestionInput {
    type Result = pb::AskQuestionResult;

    const NAME: &'static str = "AskQuestion";
    const TRANSPORT: Transport = Transport::Interaction;
    const ARGUMENTS: &'static [(&'static str, bool)] = &[("title", false), ("questions", true)];

    fn parse(text: &str) -> Result<AskQuestionInput, String> {
        let input: AskQuestionInput = parse_args("AskQuestion", text)?;
        if input.questions.is_empty() {
            return Err(
                "invalid arguments for AskQuestion: `questions` must not be empty".to_owned(),
            );
        }
        for question in &input.questions {
            non_empty("AskQuestion", "questions[].id", &question.id)?;
            non_empty("AskQuestion", "questions[].prompt", &question.prompt)?;
            if question.options.iter().any(|o| o.id.trim().is_empty()) {
                return Err(format!(
                    "invalid arguments for AskQuestion: question {:?} has an option without an id",
                    question.id
                ));
            }
        }
        Ok(input)
    }

    fn card(args: Option<&Self>, _call_id: &str, result: Option<Self::Result>) -> pb::ToolCall {
        card(tool_call::Tool::AskQuestionToolCall(
            pb::AskQuestionToolCall {
                args: args.map(ask_question_args),
                result,
            },
        ))
    }

    fn error(_args: Option<&Self>, _call_id: &str, message: &str) -> Self::Result {
        pb::AskQuestionResult {
            result: Some(pb::ask_question_result::Result::Error(
                pb::AskQuestionError {
                    error_message: message.to_owned(),
                },
            )),
        }
    }

    fn start(&self, call_id: &str, _env: &ToolEnv) -> ToolStep {
        ToolStep::query(interaction_query::Query::AskQuestionInteractionQuery(
            pb::AskQuestionInteractionQuery {
                args: Some(ask_question_args(self)),
                tool_call_id: call_id.to_owned(),
            },
        ))
    }

    fn on_response(
        &self,
        call_id: &str,
        response: interaction_response::Result,
        env: &ToolEnv,
    ) -> ToolStep {
        let interaction_response::Result::AskQuestionInteractionResponse(response) = response
        else {
            return unexpected_response(self, call_id, response, env);
        };
        let result = response.result.unwrap_or_default();
        let (text, is_error) = match &result.result {
            Some(pb::ask_question_result::Result::Success(success)) => {
                (answers_text(self, success), false)
            }
            Some(pb::ask_question_result::Result::Rejected(rejected)) => (
                format!(
                    "The user declined to answer{}.",
                    reason_suffix(&rejected.reason)
                ),
                true,
            ),
            Some(pb::ask_question_result::Result::Error(error)) => (
                format!(
                    "Error: the question could not be asked: {}",
                    error.error_message
                ),
                true,
            ),
            Some(pb::ask_question_result::Result::Async(_)) => (
                "The questions were shown to the user, who will answer in a later message."
                    .to_owned(),
                false,
            ),
            None => ("Error: the client sent an empty answer.".to_owned(), true),
        };
        ToolStep::Done(done(self, call_id, result, text, is_error))
    }
}

impl Tool for SwitchModeInput {
    type Result = pb::SwitchModeResult;

    const NAME: &'static str = "SwitchMode";
    const TRANSPORT: Transport = Transport::Interaction;
    const ARGUMENTS: &'static [(&'static str, bool)] =
        &[("target_mode_id", true), ("explanation", false)];

    fn parse(text: &str) -> Result<SwitchModeInput, String> {
        let mut input: SwitchModeInput = parse_args("SwitchMode", text)?;
        input.target = Mode::parse(input.target_mode_id.trim()).ok_or_else(|| {
            format!(
                "invalid arguments for SwitchMode: unknown mode {:?} (modes: {})",
                input.target_mode_id,
                Mode::ALL.map(Mode::as_str).join(", ")
            )
        })?;
        Ok(input)
    }

    fn card(args: Option<&Self>, call_id: &str, result: Option<Self::Result>) -> pb::ToolCall {
        card(tool_call::Tool::SwitchModeToolCall(
            pb::SwitchModeToolCall {
                args: args.map(|switch| switch_mode_args(switch, call_id)),
                result,
            },
        ))
    }

    fn error(_args: Option<&Self>, _call_id: &str, message: &str) -> Self::Result {
        pb::SwitchModeResult {
            result: Some(pb::switch_mode_result::Result::Error(pb::SwitchModeError {
                error: message.to_owned(),
            })),
        }
    }

    fn start(&self, call_id: &str, _env: &ToolEnv) -> ToolStep {
        ToolStep::query(interaction_query::Query::SwitchModeRequestQuery(
            pb::SwitchModeRequestQuery {
                args: Some(switch_mode_args(self, call_id)),
            },
        ))
    }

    fn on_response(
        &self,
        call_id: &str,
        response: interaction_response::Result,
        env: &ToolEnv,
    ) -> ToolStep {
        use pb::switch_mode_request_response::Result as S;
        use pb::switch_mode_result::Result as SR;
        let interaction_response::Result::SwitchModeRequestResponse(response) = response else {
            return unexpected_response(self, call_id, response, env);
        };
        let (result, text, is_error) = match response.result {
            Some(S::Approved(_)) => (
                SR::Success(pb::SwitchModeSuccess {
                    from_mode_id: env.mode.as_str().to_owned(),
                    to_mode_id: self.target.as_str().to_owned(),
                }),
                format!(
                    "The user approved: the conversation is now in {} mode.",
                    self.target.title()
                ),
                false,
            ),
            Some(S::Rejected(rejected)) => (
                SR::Rejected(pb::SwitchModeRejected {
                    reason: rejected.reason.clone(),
                }),
                format!(
                    "The user rejected the mode switch{}; stay in the current mode.",
                    reason_suffix(&rejected.reason)
                ),
                true,
            ),
            None => (
                SR::Error(pb::SwitchModeError {
                    error: "empty response".to_owned(),
                }),
                "Error: the client sent an empty response to the mode switch.".to_owned(),
                true,
            ),
        };
        let result = pb::SwitchModeResult {
            result: Some(result),
        };
        ToolStep::Done(done(self, call_id, result, text, is_error))
    }
}

impl Tool for CreatePlanInput {
    type Result = pb::CreatePlanResult;

    const NAME: &'static str = "CreatePlan";
    const TRANSPORT: Transport = Transport::Interaction;
    const ARGUMENTS: &'static [(&'static str, bool)] = &[
        ("name", true),
        ("overview", true),
        ("plan", true),
        ("todos", false),
    ];

    fn parse(text: &str) -> Result<CreatePlanInput, String> {
        let input: CreatePlanInput = parse_args("CreatePlan", text)?;
        non_empty("CreatePlan", "name", &input.name)?;
        non_empty("CreatePlan", "plan", &input.plan)?;
        if let Some(todo) = input.todos.iter().find(|t| t.id.trim().is_empty()) {
            return Err(format!(
                "invalid arguments for CreatePlan: a todo has an empty id ({todo:?})"
            ));
        }
        Ok(input)
    }

    fn card(args: Option<&Self>, _call_id: &str, result: Option<Self::Result>) -> pb::ToolCall {
        card(tool_call::Tool::CreatePlanToolCall(
            pb::CreatePlanToolCall {
                args: args.map(create_plan_args),
                result,
            },
        ))
    }

    fn error(_args: Option<&Self>, _call_id: &str, message: &str) -> Self::Result {
        pb::CreatePlanResult {
            result: Some(pb::create_plan_result::Result::Error(pb::CreatePlanError {
                error: message.to_owned(),
            })),
            ..pb::CreatePlanResult::default()
        }
    }

    fn start(&self, call_id: &str, _env: &ToolEnv) -> ToolStep {
        ToolStep::query(interaction_query::Query::CreatePlanRequestQuery(
            pb::CreatePlanRequestQuery {
                args: Some(create_plan_args(self)),
                tool_call_id: call_id.to_owned(),
            },
        ))
    }

    fn on_response(
        &self,
        call_id: &str,
        response: interaction_response::Result,
        env: &ToolEnv,
    ) -> ToolStep {
        let interaction_response::Result::CreatePlanRequestResponse(response) = response else {
            return unexpected_response(self, call_id, response, env);
        };
        let result = response.result.unwrap_or_default();
        let (text, is_error) = match &result.result {
            Some(pb::create_plan_result::Result::Success(_)) if result.plan_uri.is_empty() => (
                "The plan was created and shown to the user.".to_owned(),
                false,
            ),
            Some(pb::create_plan_result::Result::Success(_)) => (
                format!(
                    "The plan was created and shown to the user ({}).",
                    result.plan_uri
                ),
                false,
            ),
            Some(pb::create_plan_result::Result::Error(error)) => (
                format!("Error: the plan was not created: {}", error.error),
                true,
            ),
            None => (
                "Error: the client sent an empty plan result.".to_owned(),
                true,
            ),
        };
        ToolStep::Done(done(self, call_id, result, text, is_error))
    }
}

fn ask_question_args(ask: &AskQuestionInput) -> pb::AskQuestionArgs {
    pb::AskQuestionArgs {
        title: ask.title.clone(),
        questions: ask
            .questions
            .iter()
            .map(|q| pb::ask_question_args::Question {
                id: q.id.clone(),
                prompt: q.prompt.clone(),
                options: q
                    .options
                    .iter()
                    .map(|o| pb::ask_question_args::Option {
                        id: o.id.clone(),
                        label: o.label.clone(),
                    })
                    .collect(),
                allow_multiple: q.allow_multiple,
            })
            .collect(),
        ..pb::AskQuestionArgs::default()
    }
}

fn switch_mode_args(switch: &SwitchModeInput, call_id: &str) -> pb::SwitchModeArgs {
    pb::SwitchModeArgs {
        target_mode_id: switch.target.as_str().to_owned(),
        explanation: switch.explanation.clone(),
        tool_call_id: call_id.to_owned(),
    }
}

fn create_plan_args(plan: &CreatePlanInput) -> pb::CreatePlanArgs {
    pb::CreatePlanArgs {
        name: plan.name.clone(),
        overview: plan.overview.clone(),
        plan: plan.plan.clone(),
        todos: plan
            .todos
            .iter()
            .map(|t| pb::TodoItem {
                id: t.id.clone(),
                content: t.content.clone(),
                status: pb::TodoStatus::Pending as i32,
                ..pb::TodoItem::default()
            })
            .collect(),
        ..pb::CreatePlanArgs::default()
    }
}

/// The user's answers as the model reads them: each question with the labels picked and any text.
fn answers_text(ask: &AskQuestionInput, success: &pb::AskQuestionSuccess) -> String {
    let mut out = String::from("The user answered:");
    for question in &ask.questions {
        let answer = success
            .answers
            .iter()
            .find(|a| a.question_id == question.id);
        let mut picked: Vec<&str> = answer
            .map(|a| {
                a.selected_option_ids
                    .iter()
                    .map(|id| {
                        question
                            .options
                            .iter()
                            .find(|o| &o.id == id)
                            .map_or(id.as_str(), |o| o.label.as_str())
                    })
                    .collect()
            })
            .unwrap_or_default();
        if let Some(text) = answer
            .map(|a| a.freeform_text.trim())
            .filter(|t| !t.is_empty())
        {
            picked.push(text);
        }
        let shown = if picked.is_empty() {
            "(no answer)".to_owned()
        } else {
            picked.join("; ")
        };
        let _ = write!(out, "\n- {}: {shown}", question.prompt);
    }
    out
}

/// `async_ask_question_completion_action`: the user answered an AskQuestion after its run ended;
/// what the model is told (`None` when there is no answer to tell).
pub fn late_answer_text(action: &pb::AsyncAskQuestionCompletionAction) -> Option<String> {
    let args = action.original_args.as_ref()?;
    let ask = AskQuestionInput {
        title: args.title.clone(),
        questions: args
            .questions
            .iter()
            .map(|q| Question {
                id: q.id.clone(),
                prompt: q.prompt.clone(),
                options: q
                    .options
                    .iter()
                    .map(|o| QuestionOption {
                        id: o.id.clone(),
                        label: o.label.clone(),
                    })
                    .collect(),
                allow_multiple: q.allow_multiple,
            })
            .collect(),
    };
    match action.result.as_ref()?.result.as_ref()? {
        pb::ask_question_result::Result::Success(success) => Some(answers_text(&ask, success)),
        pb::ask_question_result::Result::Rejected(rejected) => Some(format!(
            "The user declined to answer{}.",
            reason_suffix(&rejected.reason)
        )),
        pb::ask_question_result::Result::Error(_) | pb::ask_question_result::Result::Async(_) => {
            None
        }
    }
}

/// `start_plan_action`: the user's message, in Plan mode, with its request context.
pub fn start_plan_message(action: pb::StartPlanAction) -> pb::UserMessageAction {
    let mut user = action.user_message.unwrap_or_default();
    user.mode = pb::AgentMode::Plan as i32;
    pb::UserMessageAction {
        user_message: Some(user),
        request_context: action.request_context,
        ..pb::UserMessageAction::default()
    }
}

/// `execute_plan_action` (the "Build" button): the plan — its text, or the plan file's content —
/// becomes the user's instruction, in the execution mode the client names (Agent when unset).
pub fn execute_plan_message(action: pb::ExecutePlanAction) -> pb::UserMessageAction {
    let plan = action
        .plan
        .map(|plan| plan.plan)
        .or(action.plan_file_content)
        .filter(|plan| !plan.trim().is_empty());
    let mut text = String::from("Implement the plan");
    if let Some(path) = action
        .plan_file_path
        .as_deref()
        .or(action.plan_file_uri.as_deref())
    {
        let _ = write!(text, " in {path}");
    }
    match plan {
        Some(plan) => {
            let _ = write!(text, ". Follow it step by step.\n\n<plan>\n{plan}\n</plan>");
        }
        None => text.push_str(" accepted in this conversation. Follow it step by step."),
    }
    let mode = match pb::AgentMode::try_from(action.execution_mode) {
        Ok(pb::AgentMode::Unspecified) | Err(_) => pb::AgentMode::Agent,
        Ok(mode) => mode,
    };
    let message_id = action
        .kickoff_message_id
        .or(action.plan_id.map(|id| format!("execute-plan-{id}")))
        .unwrap_or_default();
    pb::UserMessageAction {
        user_message: Some(pb::UserMessage {
            text,
            message_id,
            mode: mode as i32,
            ..pb::UserMessage::default()
        }),
        request_context: action.request_context,
        ..pb::UserMessageAction::default()
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn plan_mode_actions_are_user_messages_and_build_runs_the_plan_in_its_execution_mode() {
        let start = start_plan_message(pb::StartPlanAction {
            user_message: Some(pb::UserMessage {
                text: "plan the refactor".into(),
                ..Default::default()
            }),
            ..Default::default()
        });
        let user = start.user_message.expect("a user message");
        assert_eq!(
            (user.text.as_str(), user.mode),
            ("plan the refactor", pb::AgentMode::Plan as i32)
        );
        let build = execute_plan_message(pb::ExecutePlanAction {
            plan: Some(pb::ConversationPlan {
                plan: "1. Split the module\n2. Add tests".into(),
            }),
            plan_file_path: Some(".cursor/plans/refactor.md".into()),
            kickoff_message_id: Some("m-build".into()),
            ..Default::default()
        });
        let user = build.user_message.expect("a user message");
        assert_eq!(user.mode, pb::AgentMode::Agent as i32, "unset = Agent");
        assert_eq!(user.message_id, "m-build");
        assert!(
            user.text.contains(".cursor/plans/refactor.md"),
            "{}",
            user.text
        );
        assert!(
            user.text
                .contains("<plan>\n1. Split the module\n2. Add tests\n</plan>"),
            "{}",
            user.text
        );
        let from_file = execute_plan_message(pb::ExecutePlanAction {
            plan_file_content: Some("do it".into()),
            execution_mode: pb::AgentMode::Debug as i32,
            ..Default::default()
        });
        let user = from_file.user_message.expect("a user message");
        assert_eq!(user.mode, pb::AgentMode::Debug as i32);
        assert!(
            user.text.contains("<plan>\ndo it\n</plan>"),
            "{}",
            user.text
        );
    }
    use super::*;
    use crate::tools::tool_result::testing::{ended_step, env};

    #[test]
    fn an_approved_switch_moves_the_mode_and_says_so() {
        let switch = SwitchModeInput::parse(r#"{"target_mode_id":"plan"}"#).unwrap();
        let response = interaction_response::Result::SwitchModeRequestResponse(
            pb::SwitchModeRequestResponse {
                result: Some(pb::switch_mode_request_response::Result::Approved(
                    Default::default(),
                )),
            },
        );
        let outcome = ended_step(switch.on_response("c1", response, &env()));
        assert_eq!(
            outcome.model_text,
            "The user approved: the conversation is now in Plan mode."
        );
        let Some(tool_call::Tool::SwitchModeToolCall(card)) = outcome.card.tool else {
            panic!("a SwitchMode card")
        };
        assert_eq!(
            card.result.and_then(|r| r.result),
            Some(pb::switch_mode_result::Result::Success(
                pb::SwitchModeSuccess {
                    from_mode_id: "agent".into(),
                    to_mode_id: "plan".into(),
                }
            ))
        );
    }

    #[test]
    fn a_question_that_could_not_be_asked_has_the_question_error_card() {
        let ask = AskQuestionInput::parse(
            r#"{"questions":[{"id":"q","prompt":"Which?","options":[{"id":"a","label":"A"}]}]}"#,
        )
        .unwrap();
        let outcome = crate::tools::tool_result::failed(&ask, "c1", "no UI");
        assert_eq!(outcome.model_text, "Error: no UI");
        let Some(tool_call::Tool::AskQuestionToolCall(card)) = outcome.card.tool else {
            panic!("an AskQuestion card")
        };
        assert_eq!(card.args.map(|a| a.questions.len()), Some(1));
        assert!(matches!(
            card.result.and_then(|r| r.result),
            Some(pb::ask_question_result::Result::Error(_))
        ));
    }
}
