//! Typed tool results: turns client exec results into the card's typed `ToolCall` (args + result)
//! and the text the model reads. Success or failure is decided by the result's oneof variant only.

use std::fmt::Write as _;

use super::exec::{self, ExecPayload, QueryPayload, QueryRequest};
use super::proto::agent::{self as pb, exec_client_message, tool_call};
use super::tools::{
    AskQuestionInput, CreatePlanInput, FetchMcpResourceInput, GrepMode, McpInput, SwitchModeInput,
    TaskInput, TodoWriteInput, ToolEnv, ToolInput, ToolKind, ToolStep, WebFetchInput,
    WebSearchInput,
};
use crate::prompting::derived_state::{self, Todo, TodoStatus, TodoUpdate};
use crate::provider::web_search::SearchHit;

/// The end of one tool call.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolOutcome {
    /// The card's final typed args + typed result.
    pub card: Box<pb::ToolCall>,
    /// What the model gets back (always text).
    pub model_text: String,
    pub is_error: bool,
}

/// Per-call progress between exec results.
#[derive(Debug, Default)]
pub struct Stage {
    /// Shell output so far (bounded).
    stdout: Bounded,
    stderr: Bounded,
    /// StrReplace: the edited content waiting for its write result.
    pending_edit: Option<PendingEdit>,
    /// ReadLints: diagnostics collected so far, one entry per finished path.
    lints: Vec<pb::FileDiagnostics>,
}

#[derive(Debug)]
struct PendingEdit {
    before: String,
    after: String,
    replacements: usize,
}

/// Text kept up to a byte limit, counting what was dropped.
#[derive(Debug, Default)]
struct Bounded {
    text: String,
    dropped: usize,
}

/// Shell output kept in memory per stream, independent of what the model is shown.
const MAX_KEPT_OUTPUT: usize = 1024 * 1024;

impl Bounded {
    fn push(&mut self, data: &str) {
        let room = MAX_KEPT_OUTPUT.saturating_sub(self.text.len());
        if data.len() <= room {
            self.text.push_str(data);
        } else {
            let cut = floor_char_boundary(data, room);
            self.text.push_str(&data[..cut]);
            self.dropped += data.len() - cut;
        }
    }
}

fn floor_char_boundary(text: &str, max: usize) -> usize {
    let mut cut = max.min(text.len());
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    cut
}

/// Cuts `text` to `max` bytes with a marker saying how much was left out.
pub fn truncate_for_model(text: &str, max: usize, already_dropped: usize) -> String {
    if text.len() <= max && already_dropped == 0 {
        return text.to_owned();
    }
    let cut = floor_char_boundary(text, max);
    let omitted = text.len() - cut + already_dropped;
    format!(
        "{}\n[... output truncated: {omitted} more bytes not shown ...]",
        &text[..cut]
    )
}

fn card(tool: tool_call::Tool) -> pb::ToolCall {
    pb::ToolCall { tool: Some(tool) }
}

fn i32_of(value: usize) -> i32 {
    i32::try_from(value).unwrap_or(i32::MAX)
}

// ---- typed args -------------------------------------------------------------------------------

fn read_args(input: &super::tools::ReadInput) -> pb::ReadToolArgs {
    pb::ReadToolArgs {
        path: input.path.clone(),
        offset: input.offset,
        limit: input.limit.map(|l| i32::try_from(l).unwrap_or(i32::MAX)),
        include_line_numbers: Some(true),
    }
}

fn edit_args(path: &str) -> pb::EditArgs {
    pb::EditArgs {
        path: path.to_owned(),
        stream_content: None,
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
    match super::tools::parse_input(ToolKind::TodoWrite, arguments) {
        Ok(ToolInput::TodoWrite(input)) => Some(todo_update(&input)),
        _ => None,
    }
}

/// The result of the wanted card kind, if `part` is one.
macro_rules! part {
    ($part:expr, $variant:ident) => {
        match $part {
            Some(ResultPart::$variant(result)) => Some(result),
            _ => None,
        }
    };
}

/// The card with typed args and no result yet (`tool_call_started`).
pub fn args_card(input: &ToolInput, call_id: &str) -> pb::ToolCall {
    with_result(input, call_id, None)
}

/// The typed card for `input` with an optional result part.
fn with_result(input: &ToolInput, call_id: &str, result: Option<ResultPart>) -> pb::ToolCall {
    use tool_call::Tool;
    match (input, result) {
        (ToolInput::Read(read), result) => card(Tool::ReadToolCall(pb::ReadToolCall {
            args: Some(read_args(read)),
            result: part!(result, Read),
        })),
        (ToolInput::Write(write), result) => card(Tool::EditToolCall(pb::EditToolCall {
            args: Some(edit_args(&write.path)),
            result: part!(result, Edit),
        })),
        (ToolInput::StrReplace(edit), result) => card(Tool::EditToolCall(pb::EditToolCall {
            args: Some(edit_args(&edit.path)),
            result: part!(result, Edit),
        })),
        (ToolInput::Delete(delete), result) => card(Tool::DeleteToolCall(pb::DeleteToolCall {
            args: Some(pb::DeleteArgs {
                path: delete.path.clone(),
                tool_call_id: call_id.to_owned(),
            }),
            result: part!(result, Delete),
        })),
        (ToolInput::Grep(grep), result) => card(Tool::GrepToolCall(pb::GrepToolCall {
            args: Some(exec::grep_args(grep, call_id)),
            result: part!(result, Grep),
        })),
        (ToolInput::Glob(glob), result) => card(Tool::GlobToolCall(pb::GlobToolCall {
            args: Some(pb::GlobToolArgs {
                target_directory: glob.target_directory.clone(),
                glob_pattern: glob.glob_pattern.clone(),
            }),
            result: part!(result, Glob),
        })),
        (ToolInput::Ls(ls), result) => card(Tool::LsToolCall(pb::LsToolCall {
            args: Some(pb::LsArgs {
                path: ls.path.clone(),
                ignore: ls.ignore.clone(),
                tool_call_id: call_id.to_owned(),
                ..pb::LsArgs::default()
            }),
            result: part!(result, Ls),
        })),
        (ToolInput::ReadLints(lints), result) => {
            card(Tool::ReadLintsToolCall(pb::ReadLintsToolCall {
                args: Some(pb::ReadLintsToolArgs {
                    paths: lints.paths.clone(),
                }),
                result: part!(result, Lints),
            }))
        }
        (ToolInput::Shell(shell), result) => card(Tool::ShellToolCall(pb::ShellToolCall {
            args: Some(exec::shell_args(shell, call_id)),
            result: part!(result, Shell),
            description: shell.description.clone(),
        })),
        (ToolInput::TodoWrite(todos), result) => {
            let items = todos
                .todos
                .iter()
                .map(|t| pb::TodoItem {
                    id: t.id.clone(),
                    content: t.content.clone().unwrap_or_default(),
                    status: todo_status(t.status) as i32,
                    ..pb::TodoItem::default()
                })
                .collect();
            card(Tool::UpdateTodosToolCall(pb::UpdateTodosToolCall {
                args: Some(pb::UpdateTodosArgs {
                    todos: items,
                    merge: todos.merge,
                }),
                result: part!(result, Todos),
            }))
        }
        (ToolInput::AskQuestion(ask), result) => {
            card(Tool::AskQuestionToolCall(pb::AskQuestionToolCall {
                args: Some(ask_question_args(ask)),
                result: part!(result, Question),
            }))
        }
        (ToolInput::SwitchMode(switch), result) => {
            card(Tool::SwitchModeToolCall(pb::SwitchModeToolCall {
                args: Some(switch_mode_args(switch, call_id)),
                result: part!(result, SwitchMode),
            }))
        }
        (ToolInput::CreatePlan(plan), result) => {
            card(Tool::CreatePlanToolCall(pb::CreatePlanToolCall {
                args: Some(create_plan_args(plan)),
                result: part!(result, Plan),
            }))
        }
        (ToolInput::WebFetch(fetch), result) => {
            card(Tool::WebFetchToolCall(pb::WebFetchToolCall {
                args: Some(web_fetch_args(fetch, call_id)),
                result: part!(result, WebFetch),
            }))
        }
        (ToolInput::WebSearch(search), result) => {
            card(Tool::WebSearchToolCall(pb::WebSearchToolCall {
                args: Some(web_search_args(search, call_id)),
                result: part!(result, WebSearch),
            }))
        }
        (ToolInput::ListMcpResources(list), result) => card(Tool::ListMcpResourcesToolCall(
            pb::ListMcpResourcesToolCall {
                args: Some(exec::list_mcp_resources_args(list)),
                result: part!(result, McpResources),
            },
        )),
        (ToolInput::FetchMcpResource(read), result) => {
            card(Tool::ReadMcpResourceToolCall(pb::ReadMcpResourceToolCall {
                args: Some(exec::read_mcp_resource_args(read)),
                result: part!(result, McpResource),
            }))
        }
        (ToolInput::Mcp(mcp), result) => card(Tool::McpToolCall(pb::McpToolCall {
            args: Some(exec::mcp_args(mcp, call_id)),
            result: part!(result, Mcp),
        })),
        (ToolInput::Task(task), result) => card(Tool::TaskToolCall(pb::TaskToolCall {
            args: Some(task_args(task)),
            result: part!(result, Task),
        })),
    }
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

fn web_search_args(search: &WebSearchInput, call_id: &str) -> pb::WebSearchArgs {
    pb::WebSearchArgs {
        search_term: search.search_term.clone(),
        tool_call_id: call_id.to_owned(),
    }
}

fn web_fetch_args(fetch: &WebFetchInput, call_id: &str) -> pb::WebFetchArgs {
    pb::WebFetchArgs {
        url: fetch.url.clone(),
        tool_call_id: call_id.to_owned(),
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

/// The interaction query an interactive tool starts with (`None` for other tools).
pub fn query(input: &ToolInput, call_id: &str) -> Option<QueryRequest> {
    use pb::interaction_query::Query;
    let query = match input {
        ToolInput::AskQuestion(ask) => {
            Query::AskQuestionInteractionQuery(pb::AskQuestionInteractionQuery {
                args: Some(ask_question_args(ask)),
                tool_call_id: call_id.to_owned(),
            })
        }
        ToolInput::SwitchMode(switch) => {
            Query::SwitchModeRequestQuery(pb::SwitchModeRequestQuery {
                args: Some(switch_mode_args(switch, call_id)),
            })
        }
        ToolInput::CreatePlan(plan) => Query::CreatePlanRequestQuery(pb::CreatePlanRequestQuery {
            args: Some(create_plan_args(plan)),
            tool_call_id: call_id.to_owned(),
        }),
        ToolInput::WebSearch(search) => Query::WebSearchRequestQuery(pb::WebSearchRequestQuery {
            args: Some(web_search_args(search, call_id)),
        }),
        ToolInput::WebFetch(fetch) => Query::WebFetchRequestQuery(pb::WebFetchRequestQuery {
            args: Some(web_fetch_args(fetch, call_id)),
            skip_approval: false,
        }),
        _ => return None,
    };
    Some(QueryRequest {
        query: Box::new(query),
    })
}

/// The user's response to an interactive tool's query: its card result and the model's text, or
/// (an approved WebFetch) the exec that carries the call on. A rejection is the tool's (error)
/// result; it is never turned into anything else, and an approval is never itself a result.
pub fn on_response(
    input: &ToolInput,
    call_id: &str,
    payload: QueryPayload,
    env: &ToolEnv,
) -> ToolStep {
    use pb::interaction_response::Result as R;
    let (part, model_text, is_error) = match (input, *payload.0) {
        (ToolInput::WebSearch(search), R::WebSearchRequestResponse(response)) => {
            use pb::web_search_request_response::Result as W;
            match response.result {
                Some(W::Approved(_)) => return ToolStep::Search(search.search_term.clone()),
                Some(W::Rejected(rejected)) => (
                    ResultPart::WebSearch(pb::WebSearchResult {
                        result: Some(pb::web_search_result::Result::Rejected(
                            pb::WebSearchRejected {
                                reason: rejected.reason.clone(),
                            },
                        )),
                    }),
                    format!(
                        "The user rejected searching the web for {:?}{}.",
                        search.search_term,
                        reason_suffix(&rejected.reason)
                    ),
                    true,
                ),
                None => {
                    return ToolStep::Done(failed(
                        input,
                        call_id,
                        "the client sent an empty response to the search request",
                    ));
                }
            }
        }
        (ToolInput::WebFetch(fetch), R::WebFetchRequestResponse(response)) => {
            use pb::web_fetch_request_response::Result as W;
            match response.result {
                Some(W::Approved(_)) => {
                    return ToolStep::Exec(exec::fetch_request(&fetch.url, call_id));
                }
                Some(W::Rejected(rejected)) => (
                    ResultPart::WebFetch(pb::WebFetchResult {
                        result: Some(pb::web_fetch_result::Result::Rejected(
                            pb::WebFetchRejected {
                                reason: rejected.reason.clone(),
                            },
                        )),
                    }),
                    format!(
                        "The user rejected fetching {}{}.",
                        fetch.url,
                        reason_suffix(&rejected.reason)
                    ),
                    true,
                ),
                None => {
                    return ToolStep::Done(failed(
                        input,
                        call_id,
                        "the client sent an empty response to the fetch request",
                    ));
                }
            }
        }
        (ToolInput::AskQuestion(ask), R::AskQuestionInteractionResponse(response)) => {
            let result = response.result.unwrap_or_default();
            let (text, is_error) = match &result.result {
                Some(pb::ask_question_result::Result::Success(success)) => {
                    (answers_text(ask, success), false)
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
            (ResultPart::Question(result), text, is_error)
        }
        (ToolInput::SwitchMode(switch), R::SwitchModeRequestResponse(response)) => {
            use pb::switch_mode_request_response::Result as S;
            use pb::switch_mode_result::Result as SR;
            let (result, text, is_error) = match response.result {
                Some(S::Approved(_)) => (
                    SR::Success(pb::SwitchModeSuccess {
                        from_mode_id: env.mode.as_str().to_owned(),
                        to_mode_id: switch.target.as_str().to_owned(),
                    }),
                    format!(
                        "The user approved: the conversation is now in {} mode.",
                        crate::prompting::assets::mode_title(switch.target)
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
            (
                ResultPart::SwitchMode(pb::SwitchModeResult {
                    result: Some(result),
                }),
                text,
                is_error,
            )
        }
        (ToolInput::CreatePlan(_), R::CreatePlanRequestResponse(response)) => {
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
            (ResultPart::Plan(result), text, is_error)
        }
        (_, other) => {
            // `pending` matched the response kind to the query, so this is unreachable in
            // practice; still a terminal failed card rather than a panic.
            let kind = QueryPayload(Box::new(other)).kind();
            return ToolStep::Done(failed(
                input,
                call_id,
                &format!("unexpected response {kind}"),
            ));
        }
    };
    ToolStep::Done(outcome(input, call_id, part, model_text, is_error))
}

fn reason_suffix(reason: &str) -> String {
    if reason.trim().is_empty() {
        String::new()
    } else {
        format!(" ({})", reason.trim())
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

/// A typed result for one of the cards (short-lived: built and moved into a card at once).
#[allow(clippy::large_enum_variant)]
enum ResultPart {
    Read(pb::ReadToolResult),
    Edit(pb::EditResult),
    Delete(pb::DeleteResult),
    Grep(pb::GrepResult),
    Glob(pb::GlobToolResult),
    Ls(pb::LsResult),
    Lints(pb::ReadLintsToolResult),
    Shell(pb::ShellResult),
    Todos(pb::UpdateTodosResult),
    Question(pb::AskQuestionResult),
    SwitchMode(pb::SwitchModeResult),
    Plan(pb::CreatePlanResult),
    WebFetch(pb::WebFetchResult),
    WebSearch(pb::WebSearchResult),
    McpResources(pb::ListMcpResourcesExecResult),
    McpResource(pb::ReadMcpResourceExecResult),
    Mcp(pb::McpToolResult),
    Task(pb::TaskResult),
}

fn edit_error(path: &str, message: &str) -> pb::EditResult {
    pb::EditResult {
        result: Some(pb::edit_result::Result::Error(pb::EditError {
            path: path.to_owned(),
            error: message.to_owned(),
            model_visible_error: Some(message.to_owned()),
        })),
    }
}

/// Gives any card its kind's typed error result (paths and commands taken from the card's args).
fn set_error(card: &mut pb::ToolCall, message: &str) {
    use tool_call::Tool;
    let error = message.to_owned();
    let Some(tool) = &mut card.tool else {
        return;
    };
    match tool {
        Tool::ReadToolCall(c) => {
            c.result = Some(pb::ReadToolResult {
                result: Some(pb::read_tool_result::Result::Error(pb::ReadToolError {
                    error_message: error,
                })),
            })
        }
        Tool::EditToolCall(c) => {
            let path = c.args.as_ref().map(|a| a.path.as_str()).unwrap_or_default();
            c.result = Some(edit_error(path, &error));
        }
        Tool::DeleteToolCall(c) => {
            c.result = Some(pb::DeleteResult {
                result: Some(pb::delete_result::Result::Error(pb::DeleteError {
                    path: c.args.as_ref().map(|a| a.path.clone()).unwrap_or_default(),
                    error,
                })),
            })
        }
        Tool::GrepToolCall(c) => {
            c.result = Some(pb::GrepResult {
                result: Some(pb::grep_result::Result::Error(pb::GrepError { error })),
            })
        }
        Tool::GlobToolCall(c) => {
            c.result = Some(pb::GlobToolResult {
                result: Some(pb::glob_tool_result::Result::Error(pb::GlobToolError {
                    error,
                })),
            })
        }
        Tool::LsToolCall(c) => {
            c.result = Some(pb::LsResult {
                result: Some(pb::ls_result::Result::Error(pb::LsError {
                    path: c.args.as_ref().map(|a| a.path.clone()).unwrap_or_default(),
                    error,
                })),
            })
        }
        Tool::ReadLintsToolCall(c) => {
            c.result = Some(pb::ReadLintsToolResult {
                result: Some(pb::read_lints_tool_result::Result::Error(
                    pb::ReadLintsToolError {
                        error_message: error,
                    },
                )),
            })
        }
        Tool::ShellToolCall(c) => {
            let (command, working_directory) = c
                .args
                .as_ref()
                .map(|a| (a.command.clone(), a.working_directory.clone()))
                .unwrap_or_default();
            c.result = Some(pb::ShellResult {
                result: Some(pb::shell_result::Result::SpawnError(pb::ShellSpawnError {
                    command,
                    working_directory,
                    error,
                })),
                ..pb::ShellResult::default()
            })
        }
        Tool::UpdateTodosToolCall(c) => {
            c.result = Some(pb::UpdateTodosResult {
                result: Some(pb::update_todos_result::Result::Error(
                    pb::UpdateTodosError { error },
                )),
            })
        }
        Tool::AskQuestionToolCall(c) => {
            c.result = Some(pb::AskQuestionResult {
                result: Some(pb::ask_question_result::Result::Error(
                    pb::AskQuestionError {
                        error_message: error,
                    },
                )),
            })
        }
        Tool::SwitchModeToolCall(c) => {
            c.result = Some(pb::SwitchModeResult {
                result: Some(pb::switch_mode_result::Result::Error(pb::SwitchModeError {
                    error,
                })),
            })
        }
        Tool::CreatePlanToolCall(c) => {
            c.result = Some(pb::CreatePlanResult {
                result: Some(pb::create_plan_result::Result::Error(pb::CreatePlanError {
                    error,
                })),
                ..pb::CreatePlanResult::default()
            })
        }
        Tool::ListMcpResourcesToolCall(c) => {
            c.result = Some(pb::ListMcpResourcesExecResult {
                result: Some(pb::list_mcp_resources_exec_result::Result::Error(
                    pb::ListMcpResourcesError { error },
                )),
            })
        }
        Tool::ReadMcpResourceToolCall(c) => {
            c.result = Some(pb::ReadMcpResourceExecResult {
                result: Some(pb::read_mcp_resource_exec_result::Result::Error(
                    pb::ReadMcpResourceError {
                        uri: c.args.as_ref().map(|a| a.uri.clone()).unwrap_or_default(),
                        error,
                    },
                )),
            })
        }
        Tool::TaskToolCall(c) => {
            c.result = Some(pb::TaskResult {
                result: Some(pb::task_result::Result::Error(pb::TaskError { error })),
            })
        }
        Tool::McpToolCall(c) => {
            c.result = Some(pb::McpToolResult {
                result: Some(pb::mcp_tool_result::Result::Error(pb::McpToolError {
                    error,
                    ..pb::McpToolError::default()
                })),
            })
        }
        Tool::WebSearchToolCall(c) => {
            c.result = Some(pb::WebSearchResult {
                result: Some(pb::web_search_result::Result::Error(pb::WebSearchError {
                    error,
                })),
            })
        }
        Tool::WebFetchToolCall(c) => {
            c.result = Some(pb::WebFetchResult {
                result: Some(pb::web_fetch_result::Result::Error(pb::WebFetchError {
                    url: c.args.as_ref().map(|a| a.url.clone()).unwrap_or_default(),
                    error,
                })),
            })
        }
        // Only the registry's cards are ever built here (see `ToolKind::placeholder`).
        _ => {}
    }
}

/// A card for a known tool whose arguments did not validate: placeholder kind with an error result.
pub fn invalid_card(kind: ToolKind, message: &str) -> pb::ToolCall {
    let mut card = kind.placeholder();
    set_error(&mut card, message);
    card
}

/// A failed outcome for `input` with its typed error result.
pub fn failed(input: &ToolInput, call_id: &str, message: &str) -> ToolOutcome {
    let mut card = args_card(input, call_id);
    set_error(&mut card, message);
    ToolOutcome {
        card: Box::new(card),
        model_text: format!("Error: {message}"),
        is_error: true,
    }
}

fn outcome(
    input: &ToolInput,
    call_id: &str,
    part: ResultPart,
    model_text: String,
    is_error: bool,
) -> ToolOutcome {
    ToolOutcome {
        card: Box::new(with_result(input, call_id, Some(part))),
        model_text,
        is_error,
    }
}

// ---- results ----------------------------------------------------------------------------------

/// Maps one exec result for `input` to the next steps.
pub fn on_result(
    input: &ToolInput,
    call_id: &str,
    stage: &mut Stage,
    payload: ExecPayload,
    env: &ToolEnv,
) -> Vec<ToolStep> {
    use exec_client_message::Message as R;
    let done = |o: ToolOutcome| vec![ToolStep::Done(o)];
    match (input, *payload.0) {
        (ToolInput::Read(read), R::ReadResult(result)) => {
            done(read_outcome(input, call_id, read, result, env))
        }
        (ToolInput::StrReplace(edit), R::ReadResult(result)) => {
            str_replace_after_read(input, call_id, edit, stage, result)
        }
        (ToolInput::StrReplace(edit), R::WriteResult(result)) => {
            let pending = stage.pending_edit.take();
            done(edit_write_outcome(
                input, call_id, &edit.path, result, pending,
            ))
        }
        (ToolInput::Write(write), R::WriteResult(result)) => done(edit_write_outcome(
            input,
            call_id,
            &write.path,
            result,
            Some(PendingEdit {
                before: String::new(),
                after: write.contents.clone(),
                replacements: 0,
            }),
        )),
        (ToolInput::Delete(delete), R::DeleteResult(result)) => {
            done(delete_outcome(input, call_id, &delete.path, result))
        }
        (ToolInput::Grep(grep), R::GrepResult(result)) => {
            done(grep_outcome(input, call_id, grep, result, env))
        }
        (ToolInput::Glob(glob), R::GrepResult(result)) => {
            done(glob_outcome(input, call_id, glob, result, env))
        }
        (ToolInput::Ls(_), R::LsResult(result)) => done(ls_outcome(input, call_id, result, env)),
        (ToolInput::ReadLints(lints), R::DiagnosticsResult(result)) => {
            lints_step(input, call_id, &lints.paths, stage, result)
        }
        (ToolInput::Shell(shell), R::ShellStream(stream)) => {
            shell_step(input, call_id, shell, stage, stream, env)
        }
        (ToolInput::WebFetch(fetch), R::FetchResult(result)) => {
            done(fetch_outcome(input, call_id, fetch, result, env))
        }
        (ToolInput::Task(_), R::SubagentResult(result)) => {
            done(task_outcome(input, call_id, result))
        }
        (ToolInput::Mcp(mcp), R::McpResult(result)) => {
            done(mcp_outcome(input, call_id, mcp, result, env))
        }
        (ToolInput::ListMcpResources(_), R::ListMcpResourcesExecResult(result)) => {
            done(mcp_resources_outcome(input, call_id, result, env))
        }
        (ToolInput::FetchMcpResource(read), R::ReadMcpResourceExecResult(result)) => {
            done(mcp_resource_outcome(input, call_id, read, result, env))
        }
        (_, other) => done(failed(
            input,
            call_id,
            &format!(
                "internal error: unexpected {} for this tool",
                exec::result_kind(&other)
            ),
        )),
    }
}

/// The first line of a Task result the model reads; `subagent_state` reads it back for the
/// checkpoint's subagent list, so the two live side by side.
const SUBAGENT_TAG: &str = "[subagent ";
const SUBAGENT_BACKGROUND: &str = "is running in the background";

/// A subagent's result completes the parent's Task card; the model reads the subagent's final
/// message under a line naming the agent id (so it can `resume` it).
fn task_outcome(input: &ToolInput, call_id: &str, result: pb::SubagentResult) -> ToolOutcome {
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
            let part = ResultPart::Task(pb::TaskResult {
                result: Some(pb::task_result::Result::Success(pb::TaskSuccess {
                    agent_id: Some(success.agent_id.clone()),
                    is_background: background,
                    background_reason: success.background_reason,
                    transcript_path: success.transcript_path.clone(),
                    ..pb::TaskSuccess::default()
                })),
            });
            outcome(input, call_id, part, text, false)
        }
        Some(S::Error(error)) => failed(
            input,
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
        None => failed(input, call_id, "the client sent an empty subagent result"),
    }
}

/// The state of a finished Task call, read from the result text `task_outcome` wrote.
pub fn subagent_state(result_text: &str, is_error: bool) -> derived_state::TaskOutcome {
    use derived_state::SubagentStatus;
    if is_error {
        return (SubagentStatus::Failed, None);
    }
    let first_line = result_text.lines().next().unwrap_or_default();
    let agent_id = first_line
        .strip_prefix(SUBAGENT_TAG)
        .and_then(|rest| rest.split_whitespace().next())
        .map(str::to_owned);
    let status = if first_line.contains(SUBAGENT_BACKGROUND) {
        SubagentStatus::Backgrounded
    } else {
        SubagentStatus::Succeeded
    };
    (status, agent_id)
}

/// A Task call's title (its description), for the checkpoint's subagent list.
pub fn task_title(arguments: &str) -> Option<String> {
    match super::tools::parse_input(ToolKind::Task, arguments) {
        Ok(ToolInput::Task(task)) => Some(task.description),
        _ => None,
    }
}

/// An MCP tool's result: its text content for the model (images described, not inlined), the
/// server's own `is_error` honoured, and the card's typed result.
fn mcp_outcome(
    input: &ToolInput,
    call_id: &str,
    mcp: &McpInput,
    result: pb::McpResult,
    env: &ToolEnv,
) -> ToolOutcome {
    use pb::mcp_result::Result as M;
    use pb::mcp_tool_result::Result as C;
    let tool = format!("{} ({})", mcp.tool.tool_name, mcp.tool.server);
    let (card_result, text, is_error) = match result.result {
        Some(M::Success(success)) => {
            let mut text = String::new();
            for item in &success.content {
                match &item.content {
                    Some(pb::mcp_tool_result_content_item::Content::Text(t)) => {
                        if !text.is_empty() {
                            text.push('\n');
                        }
                        text.push_str(&t.text);
                    }
                    Some(pb::mcp_tool_result_content_item::Content::Image(image)) => {
                        let _ = write!(
                            text,
                            "{}[image: {}, {} bytes]",
                            if text.is_empty() { "" } else { "\n" },
                            image.mime_type,
                            image.data.len()
                        );
                    }
                    None => {}
                }
            }
            if text.is_empty()
                && let Some(structured) = &success.structured_content
            {
                text = exec::proto_to_json(&prost_types::Value {
                    kind: Some(prost_types::value::Kind::StructValue(structured.clone())),
                })
                .to_string();
            }
            let is_error = success.is_error;
            let text = match (is_error, text.is_empty()) {
                (true, _) => format!("Error from MCP tool {tool}: {text}"),
                (false, true) => format!("MCP tool {tool} returned no content."),
                (false, false) => truncate_for_model(&text, env.max_output_bytes, 0),
            };
            (C::Success(success), text, is_error)
        }
        Some(M::Error(error)) => (
            C::Error(pb::McpToolError {
                error: error.error.clone(),
                ..pb::McpToolError::default()
            }),
            format!("Error: MCP tool {tool} failed: {}", error.error),
            true,
        ),
        Some(M::Rejected(rejected)) => (
            C::Rejected(rejected.clone()),
            format!(
                "The user rejected running MCP tool {tool}{}.",
                reason_suffix(&rejected.reason)
            ),
            true,
        ),
        Some(M::PermissionDenied(denied)) => (
            C::PermissionDenied(denied.clone()),
            format!(
                "Error: permission denied for MCP tool {tool}: {}",
                denied.error
            ),
            true,
        ),
        Some(M::ToolNotFound(missing)) => {
            let message = format!(
                "MCP tool {} was not found (available: {})",
                missing.name,
                missing.available_tools.join(", ")
            );
            return failed(input, call_id, &message);
        }
        Some(M::ServerNotFound(missing)) => {
            let message = format!(
                "MCP server {} was not found (available: {})",
                missing.name,
                missing.available_servers.join(", ")
            );
            return failed(input, call_id, &message);
        }
        Some(M::Approved(_)) => {
            return failed(
                input,
                call_id,
                "the client approved the MCP call but sent no result",
            );
        }
        None => return failed(input, call_id, "the client sent an empty MCP result"),
    };
    outcome(
        input,
        call_id,
        ResultPart::Mcp(pb::McpToolResult {
            result: Some(card_result),
        }),
        text,
        is_error,
    )
}

fn mcp_resources_outcome(
    input: &ToolInput,
    call_id: &str,
    result: pb::ListMcpResourcesExecResult,
    env: &ToolEnv,
) -> ToolOutcome {
    use pb::list_mcp_resources_exec_result::Result as L;
    let (text, is_error) = match &result.result {
        Some(L::Success(success)) if success.resources.is_empty() => {
            ("No MCP resources.".to_owned(), false)
        }
        Some(L::Success(success)) => {
            let mut text = String::from("MCP resources (server: uri — name, type: description):");
            for r in &success.resources {
                let _ = write!(
                    text,
                    "\n- {}: {} — {}, {}",
                    r.server,
                    r.uri,
                    r.name.as_deref().unwrap_or("unnamed"),
                    r.mime_type.as_deref().unwrap_or("unknown type")
                );
                if let Some(description) = r.description.as_deref().filter(|d| !d.is_empty()) {
                    let _ = write!(text, ": {description}");
                }
            }
            (truncate_for_model(&text, env.max_output_bytes, 0), false)
        }
        Some(L::Error(error)) => (format!("Error: {}", error.error), true),
        Some(L::Rejected(rejected)) => (
            format!(
                "The user rejected listing MCP resources{}.",
                reason_suffix(&rejected.reason)
            ),
            true,
        ),
        None => return failed(input, call_id, "the client sent an empty resource list"),
    };
    outcome(
        input,
        call_id,
        ResultPart::McpResources(result),
        text,
        is_error,
    )
}

fn mcp_resource_outcome(
    input: &ToolInput,
    call_id: &str,
    read: &FetchMcpResourceInput,
    result: pb::ReadMcpResourceExecResult,
    env: &ToolEnv,
) -> ToolOutcome {
    use pb::read_mcp_resource_exec_result::Result as R;
    let (text, is_error) = match &result.result {
        Some(R::Success(success)) => match &success.content {
            Some(pb::read_mcp_resource_success::Content::Text(text)) => {
                (truncate_for_model(text, env.max_output_bytes, 0), false)
            }
            Some(pb::read_mcp_resource_success::Content::Blob(blob)) => (
                format!(
                    "{} is binary ({}, {} bytes){}.",
                    read.uri,
                    success.mime_type.as_deref().unwrap_or("unknown type"),
                    blob.len(),
                    success
                        .download_path
                        .as_deref()
                        .map(|p| format!("; saved to {p}"))
                        .unwrap_or_default()
                ),
                false,
            ),
            None => (format!("{} is empty.", read.uri), false),
        },
        Some(R::Error(error)) => (
            format!("Error: reading {} failed: {}", read.uri, error.error),
            true,
        ),
        Some(R::Rejected(rejected)) => (
            format!(
                "The user rejected reading {}{}.",
                read.uri,
                reason_suffix(&rejected.reason)
            ),
            true,
        ),
        Some(R::NotFound(_)) => (
            format!(
                "Error: MCP resource {} was not found on {}.",
                read.uri, read.server
            ),
            true,
        ),
        None => return failed(input, call_id, "the client sent an empty resource result"),
    };
    outcome(
        input,
        call_id,
        ResultPart::McpResource(result),
        text,
        is_error,
    )
}

/// The search backend's hits as the card's references and the model's numbered list.
pub fn search_outcome(
    input: &ToolInput,
    call_id: &str,
    hits: Result<Vec<SearchHit>, String>,
    env: &ToolEnv,
) -> ToolOutcome {
    let ToolInput::WebSearch(search) = input else {
        return failed(
            input,
            call_id,
            "internal error: search results for another tool",
        );
    };
    let hits = match hits {
        Ok(hits) => hits,
        Err(message) => {
            return failed(
                input,
                call_id,
                &format!(
                    "searching the web for {:?} failed: {message}",
                    search.search_term
                ),
            );
        }
    };
    let mut text = if hits.is_empty() {
        format!("No web results for {:?}.", search.search_term)
    } else {
        format!("Web results for {:?}:", search.search_term)
    };
    for (n, hit) in hits.iter().enumerate() {
        let _ = write!(text, "\n\n{}. {}\n{}", n + 1, hit.title, hit.url);
        if !hit.snippet.trim().is_empty() {
            let _ = write!(text, "\n{}", hit.snippet.trim());
        }
    }
    let references = hits
        .into_iter()
        .map(|hit| pb::WebSearchReference {
            title: hit.title,
            url: hit.url,
            chunk: hit.snippet,
        })
        .collect();
    outcome(
        input,
        call_id,
        ResultPart::WebSearch(pb::WebSearchResult {
            result: Some(pb::web_search_result::Result::Success(
                pb::WebSearchSuccess { references },
            )),
        }),
        truncate_for_model(&text, env.max_output_bytes, 0),
        false,
    )
}

/// A fetched page as the model reads it: HTML becomes Markdown (scripts, styles and navigation
/// chrome dropped), other text is kept as it is; binary content is refused rather than garbled.
fn fetch_outcome(
    input: &ToolInput,
    call_id: &str,
    fetch: &WebFetchInput,
    result: pb::FetchResult,
    env: &ToolEnv,
) -> ToolOutcome {
    let success = match result.result {
        Some(pb::fetch_result::Result::Success(success)) => success,
        Some(pb::fetch_result::Result::Error(error)) => {
            return failed(
                input,
                call_id,
                &format!("fetching {} failed: {}", fetch.url, error.error),
            );
        }
        None => return failed(input, call_id, "the client sent an empty fetch result"),
    };
    let url = if success.url.is_empty() {
        fetch.url.clone()
    } else {
        success.url.clone()
    };
    if success.status_code >= 400 {
        return failed(
            input,
            call_id,
            &format!("fetching {url} returned HTTP {}", success.status_code),
        );
    }
    let markdown = match page_markdown(&success.content, &success.content_type) {
        Ok(markdown) => markdown,
        Err(message) => return failed(input, call_id, &format!("{url}: {message}")),
    };
    let model_text = format!(
        "Contents of {url}:\n\n{}",
        truncate_for_model(&markdown, env.max_output_bytes, 0)
    );
    outcome(
        input,
        call_id,
        ResultPart::WebFetch(pb::WebFetchResult {
            result: Some(pb::web_fetch_result::Result::Success(pb::WebFetchSuccess {
                url,
                markdown,
                output_location: None,
            })),
        }),
        model_text,
        false,
    )
}

/// The page's text as Markdown, decided by its content type (and by a sniff when it has none).
fn page_markdown(content: &str, content_type: &str) -> Result<String, String> {
    let mime = content_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    let looks_html = || {
        let head = content.trim_start();
        let head = &head[..floor_char_boundary(head, 512)];
        let lower = head.to_ascii_lowercase();
        lower.starts_with("<!doctype html") || lower.starts_with("<html") || lower.contains("<body")
    };
    match mime.as_str() {
        "text/html" | "application/xhtml+xml" => html_to_markdown(content),
        "" if looks_html() => html_to_markdown(content),
        "" => Ok(content.to_owned()),
        m if m.starts_with("text/")
            || m.ends_with("json")
            || m.ends_with("xml")
            || m.ends_with("javascript")
            || m.ends_with("yaml") =>
        {
            Ok(content.to_owned())
        }
        other => Err(format!(
            "content type {other} is not text and cannot be shown to the model"
        )),
    }
}

fn html_to_markdown(html: &str) -> Result<String, String> {
    let converter = htmd::HtmlToMarkdown::builder()
        .skip_tags(vec![
            "script", "style", "noscript", "svg", "nav", "footer", "iframe", "head",
        ])
        .build();
    converter
        .convert(html)
        .map(|markdown| markdown.trim().to_owned())
        .map_err(|e| format!("the page could not be converted to Markdown: {e}"))
}

fn read_outcome(
    input: &ToolInput,
    call_id: &str,
    read: &super::tools::ReadInput,
    result: pb::ReadResult,
    env: &ToolEnv,
) -> ToolOutcome {
    use pb::read_result::Result as R;
    let error = |text: String| failed(input, call_id, &text);
    match result.result {
        Some(R::Success(success)) => {
            let content = match &success.output {
                Some(pb::read_success::Output::Content(text)) => text.clone(),
                Some(pb::read_success::Output::Data(bytes)) => {
                    let text = format!("(binary file, {} bytes; not shown)", bytes.len());
                    return outcome(
                        input,
                        call_id,
                        ResultPart::Read(read_success(&success, String::new(), None)),
                        text,
                        false,
                    );
                }
                None => String::new(),
            };
            let total = usize::try_from(success.total_lines.max(0)).unwrap_or(0);
            let (first_line, lines) = select_lines(
                &content,
                read.offset,
                read.limit,
                total,
                success.range_applied,
            );
            let mut text = String::new();
            for (i, line) in lines.iter().enumerate() {
                let _ = writeln!(text, "{:>6}|{line}", first_line + i);
            }
            if lines.is_empty() {
                text.push_str(if total == 0 {
                    "(the file is empty)"
                } else {
                    "(no lines in the requested range)"
                });
            }
            let shown_end = first_line + lines.len().saturating_sub(1);
            if success.truncated || (total > 0 && shown_end < total) {
                let _ = write!(
                    text,
                    "\n[showing lines {first_line}-{shown_end} of {total}; use offset and limit to read more]"
                );
            }
            let range = pb::ReadRange {
                start_line: u32::try_from(first_line).unwrap_or(u32::MAX),
                end_line: u32::try_from(shown_end).unwrap_or(u32::MAX),
            };
            let shown: String = lines.join("\n");
            let model_text = truncate_for_model(&text, env.max_output_bytes, 0);
            outcome(
                input,
                call_id,
                ResultPart::Read(read_success(&success, shown, Some(range))),
                model_text,
                false,
            )
        }
        Some(R::Error(e)) => error(format!("reading {}: {}", e.path, e.error)),
        Some(R::Rejected(r)) => error(format!("reading {} was rejected: {}", r.path, r.reason)),
        Some(R::FileNotFound(f)) => error(format!("file not found: {}", f.path)),
        Some(R::PermissionDenied(p)) => error(format!("permission denied: {}", p.path)),
        Some(R::InvalidFile(f)) => error(format!("cannot read {}: {}", f.path, f.reason)),
        None => error("the client returned an empty read result".to_owned()),
    }
}

fn read_success(
    success: &pb::ReadSuccess,
    content: String,
    range: Option<pb::ReadRange>,
) -> pb::ReadToolResult {
    pb::ReadToolResult {
        result: Some(pb::read_tool_result::Result::Success(pb::ReadToolSuccess {
            is_empty: success.total_lines == 0,
            exceeded_limit: success.truncated,
            total_lines: u32::try_from(success.total_lines.max(0)).unwrap_or(0),
            file_size: u32::try_from(success.file_size.max(0)).unwrap_or(u32::MAX),
            path: success.path.clone(),
            read_range: range,
            include_line_numbers: Some(true),
            output: Some(pb::read_tool_success::Output::Content(content)),
            ..pb::ReadToolSuccess::default()
        })),
    }
}

/// The 1-based number of the first line shown, and the lines, honouring offset/limit whether or
/// not the client already applied the range.
fn select_lines(
    content: &str,
    offset: Option<i32>,
    limit: Option<u32>,
    total: usize,
    range_applied: bool,
) -> (usize, Vec<&str>) {
    let all: Vec<&str> = if content.is_empty() {
        Vec::new()
    } else {
        content.lines().collect()
    };
    let total = total.max(if range_applied { 0 } else { all.len() });
    let start = match offset {
        Some(o) if o > 0 => o as usize,
        Some(o) if o < 0 => total.saturating_sub(o.unsigned_abs() as usize) + 1,
        _ => 1,
    };
    let limit = limit.map_or(usize::MAX, |l| l as usize);
    if range_applied {
        (start, all.into_iter().take(limit).collect())
    } else {
        (start, all.into_iter().skip(start - 1).take(limit).collect())
    }
}

fn str_replace_after_read(
    input: &ToolInput,
    call_id: &str,
    edit: &super::tools::StrReplaceInput,
    stage: &mut Stage,
    result: pb::ReadResult,
) -> Vec<ToolStep> {
    use pb::read_result::Result as R;
    let fail = |text: String| vec![ToolStep::Done(failed(input, call_id, &text))];
    let before = match result.result {
        Some(R::Success(success)) => match success.output {
            Some(pb::read_success::Output::Content(text)) => text,
            _ => return fail(format!("{} is not a text file", edit.path)),
        },
        Some(R::FileNotFound(_)) => return fail(format!("file not found: {}", edit.path)),
        Some(R::PermissionDenied(_)) => {
            return fail(format!("permission denied reading {}", edit.path));
        }
        Some(R::Error(e)) => return fail(format!("reading {}: {}", edit.path, e.error)),
        Some(R::Rejected(r)) => {
            return fail(format!("reading {} was rejected: {}", edit.path, r.reason));
        }
        Some(R::InvalidFile(f)) => return fail(format!("cannot edit {}: {}", edit.path, f.reason)),
        None => return fail("the client returned an empty read result".to_owned()),
    };
    let count = before.matches(edit.old_string.as_str()).count();
    if count == 0 {
        return fail(format!(
            "old_string was not found in {}; read the file again and copy the text exactly",
            edit.path
        ));
    }
    if count > 1 && !edit.replace_all {
        return fail(format!(
            "old_string occurs {count} times in {}; include more surrounding context to make it unique, or set replace_all",
            edit.path
        ));
    }
    let after = if edit.replace_all {
        before.replace(&edit.old_string, &edit.new_string)
    } else {
        before.replacen(&edit.old_string, &edit.new_string, 1)
    };
    let request = exec::write_request(&edit.path, &after, call_id);
    stage.pending_edit = Some(PendingEdit {
        before,
        after,
        replacements: count,
    });
    vec![ToolStep::Exec(request)]
}

fn edit_write_outcome(
    input: &ToolInput,
    call_id: &str,
    path: &str,
    result: pb::WriteResult,
    edit: Option<PendingEdit>,
) -> ToolOutcome {
    use pb::write_result::Result as W;
    let error = |text: String| {
        outcome(
            input,
            call_id,
            ResultPart::Edit(edit_error(path, &text)),
            format!("Error: {text}"),
            true,
        )
    };
    match result.result {
        Some(W::Success(success)) => {
            let edit = edit.unwrap_or(PendingEdit {
                before: String::new(),
                after: String::new(),
                replacements: 0,
            });
            let (added, removed) = line_delta(&edit.before, &edit.after);
            let text = match input {
                ToolInput::StrReplace(_) => format!(
                    "Edited {path}: replaced {} occurrence{}.",
                    edit.replacements,
                    if edit.replacements == 1 { "" } else { "s" }
                ),
                _ => format!("Wrote {} lines to {path}.", success.lines_created),
            };
            let part = ResultPart::Edit(pb::EditResult {
                result: Some(pb::edit_result::Result::Success(pb::EditSuccess {
                    path: if success.path.is_empty() {
                        path.to_owned()
                    } else {
                        success.path.clone()
                    },
                    lines_added: Some(i32_of(added)),
                    lines_removed: Some(i32_of(removed)),
                    before_full_file_content: Some(edit.before),
                    after_full_file_content: edit.after,
                    message: Some(text.clone()),
                    ..pb::EditSuccess::default()
                })),
            });
            outcome(input, call_id, part, text, false)
        }
        Some(W::PermissionDenied(p)) => {
            error(format!("permission denied writing {path}: {}", p.error))
        }
        Some(W::NoSpace(_)) => error(format!("no space left on device writing {path}")),
        Some(W::Error(e)) => error(format!("writing {path}: {}", e.error)),
        Some(W::Rejected(r)) => error(format!(
            "the user rejected the change to {path}: {}",
            r.reason
        )),
        None => error("the client returned an empty write result".to_owned()),
    }
}

/// Lines added and removed between two versions (common prefix and suffix excluded).
fn line_delta(before: &str, after: &str) -> (usize, usize) {
    let a: Vec<&str> = before.lines().collect();
    let b: Vec<&str> = after.lines().collect();
    let prefix = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    let suffix = a[prefix..]
        .iter()
        .rev()
        .zip(b[prefix..].iter().rev())
        .take_while(|(x, y)| x == y)
        .count();
    (b.len() - prefix - suffix, a.len() - prefix - suffix)
}

fn delete_outcome(
    input: &ToolInput,
    call_id: &str,
    path: &str,
    result: pb::DeleteResult,
) -> ToolOutcome {
    use pb::delete_result::Result as D;
    let (text, is_error) = match &result.result {
        Some(D::Success(_)) => (format!("Deleted {path}."), false),
        Some(D::FileNotFound(_)) => (format!("Error: file not found: {path}"), true),
        Some(D::NotFile(n)) => (
            format!("Error: {path} is not a file ({})", n.actual_type),
            true,
        ),
        Some(D::PermissionDenied(p)) => (
            format!(
                "Error: permission denied deleting {path}: {}",
                p.client_visible_error
            ),
            true,
        ),
        Some(D::FileBusy(_)) => (format!("Error: {path} is busy"), true),
        Some(D::Rejected(r)) => (
            format!("Error: the user rejected deleting {path}: {}", r.reason),
            true,
        ),
        Some(D::Error(e)) => (format!("Error: deleting {path}: {}", e.error), true),
        None => return failed(input, call_id, "the client returned an empty delete result"),
    };
    outcome(input, call_id, ResultPart::Delete(result), text, is_error)
}

fn sorted_workspaces(success: &pb::GrepSuccess) -> Vec<(&String, &pb::GrepUnionResult)> {
    let mut results: Vec<_> = success.workspace_results.iter().collect();
    results.sort_by(|a, b| a.0.cmp(b.0));
    results
}

fn grep_outcome(
    input: &ToolInput,
    call_id: &str,
    grep: &super::tools::GrepInput,
    result: pb::GrepResult,
    env: &ToolEnv,
) -> ToolOutcome {
    use pb::grep_result::Result as G;
    let text = match &result.result {
        Some(G::Success(success)) => {
            let mut text = String::new();
            let mut truncated = false;
            let unions = sorted_workspaces(success)
                .into_iter()
                .map(|(_, u)| u)
                .chain(success.active_editor_result.as_ref());
            for union in unions {
                match &union.result {
                    Some(pb::grep_union_result::Result::Content(content)) => {
                        truncated |= content.client_truncated || content.ripgrep_truncated;
                        for file in &content.matches {
                            for m in &file.matches {
                                let sep = if m.is_context_line { '-' } else { ':' };
                                let _ = writeln!(
                                    text,
                                    "{}{sep}{}{sep}{}",
                                    file.file, m.line_number, m.content
                                );
                            }
                        }
                    }
                    Some(pb::grep_union_result::Result::Files(files)) => {
                        truncated |= files.client_truncated || files.ripgrep_truncated;
                        for file in &files.files {
                            let _ = writeln!(text, "{file}");
                        }
                    }
                    Some(pb::grep_union_result::Result::Count(counts)) => {
                        truncated |= counts.client_truncated || counts.ripgrep_truncated;
                        for count in &counts.counts {
                            let _ = writeln!(text, "{}:{}", count.file, count.count);
                        }
                    }
                    None => {}
                }
            }
            if text.is_empty() {
                text = format!("No matches found for pattern {:?}.", grep.pattern);
            } else if truncated {
                text.push_str("[results truncated; narrow the search or use head_limit/offset]");
            }
            let mode = grep.output_mode.unwrap_or(GrepMode::Content);
            if mode == GrepMode::Count && !text.starts_with("No matches") {
                text.insert_str(0, "file:matches\n");
            }
            truncate_for_model(&text, env.max_output_bytes, 0)
        }
        Some(G::Error(e)) => {
            let text = format!("Error: grep failed: {}", e.error);
            return outcome(input, call_id, ResultPart::Grep(result), text, true);
        }
        None => return failed(input, call_id, "the client returned an empty grep result"),
    };
    outcome(input, call_id, ResultPart::Grep(result), text, false)
}

fn glob_outcome(
    input: &ToolInput,
    call_id: &str,
    glob: &super::tools::GlobInput,
    result: pb::GrepResult,
    env: &ToolEnv,
) -> ToolOutcome {
    use pb::grep_result::Result as G;
    match result.result {
        Some(G::Success(success)) => {
            let mut files = Vec::new();
            let mut client_truncated = false;
            let mut ripgrep_truncated = false;
            for (_, union) in sorted_workspaces(&success) {
                if let Some(pb::grep_union_result::Result::Files(found)) = &union.result {
                    files.extend(found.files.iter().cloned());
                    client_truncated |= found.client_truncated;
                    ripgrep_truncated |= found.ripgrep_truncated;
                }
            }
            let mut text = if files.is_empty() {
                format!("No files match {:?}.", glob.glob_pattern)
            } else {
                files.join("\n")
            };
            if client_truncated || ripgrep_truncated {
                text.push_str("\n[list truncated; use a narrower pattern]");
            }
            let part = ResultPart::Glob(pb::GlobToolResult {
                result: Some(pb::glob_tool_result::Result::Success(pb::GlobToolSuccess {
                    pattern: glob.glob_pattern.clone(),
                    path: success.path.clone(),
                    total_files: i32_of(files.len()),
                    files,
                    client_truncated,
                    ripgrep_truncated,
                })),
            });
            outcome(
                input,
                call_id,
                part,
                truncate_for_model(&text, env.max_output_bytes, 0),
                false,
            )
        }
        Some(G::Error(e)) => failed(input, call_id, &format!("glob failed: {}", e.error)),
        None => failed(input, call_id, "the client returned an empty glob result"),
    }
}

fn ls_outcome(
    input: &ToolInput,
    call_id: &str,
    result: pb::LsResult,
    env: &ToolEnv,
) -> ToolOutcome {
    use pb::ls_result::Result as L;
    let (text, is_error) = match &result.result {
        Some(L::Success(success)) => match &success.directory_tree_root {
            Some(root) => {
                let mut text = String::new();
                render_tree(root, 0, &mut text);
                (truncate_for_model(&text, env.max_output_bytes, 0), false)
            }
            None => ("(empty directory)".to_owned(), false),
        },
        Some(L::Timeout(timeout)) => {
            let mut text = String::from("[listing timed out; partial result]\n");
            if let Some(root) = &timeout.directory_tree_root {
                render_tree(root, 0, &mut text);
            }
            (truncate_for_model(&text, env.max_output_bytes, 0), false)
        }
        Some(L::Error(e)) => (format!("Error: listing {}: {}", e.path, e.error), true),
        Some(L::Rejected(r)) => (
            format!("Error: listing {} was rejected: {}", r.path, r.reason),
            true,
        ),
        None => return failed(input, call_id, "the client returned an empty ls result"),
    };
    outcome(input, call_id, ResultPart::Ls(result), text, is_error)
}

fn render_tree(node: &pb::LsDirectoryTreeNode, depth: usize, out: &mut String) {
    let indent = "  ".repeat(depth);
    if depth == 0 {
        let _ = writeln!(out, "{}/", node.abs_path.trim_end_matches('/'));
    } else {
        let name = node.abs_path.rsplit('/').next().unwrap_or(&node.abs_path);
        let _ = writeln!(out, "{indent}- {name}/");
    }
    if !node.children_were_processed
        && node.children_dirs.is_empty()
        && node.children_files.is_empty()
    {
        let _ = writeln!(
            out,
            "{indent}  ... ({} files, not expanded)",
            node.num_files
        );
        return;
    }
    for dir in &node.children_dirs {
        render_tree(dir, depth + 1, out);
    }
    for file in &node.children_files {
        let _ = writeln!(out, "{indent}  - {}", file.name);
    }
}

fn lints_step(
    input: &ToolInput,
    call_id: &str,
    paths: &[String],
    stage: &mut Stage,
    result: pb::DiagnosticsResult,
) -> Vec<ToolStep> {
    use pb::diagnostics_result::Result as D;
    let index = stage.lints.len();
    let path = paths.get(index).cloned().unwrap_or_default();
    let diagnostics = match result.result {
        Some(D::Success(success)) => success
            .diagnostics
            .into_iter()
            .map(|d| pb::DiagnosticItem {
                severity: d.severity,
                range: d.range.map(|r| pb::DiagnosticRange {
                    start: r.start,
                    end: r.end,
                }),
                message: d.message,
                source: d.source,
                code: d.code,
                is_stale: d.is_stale,
            })
            .collect::<Vec<_>>(),
        Some(D::FileNotFound(_)) => {
            return vec![ToolStep::Done(failed(
                input,
                call_id,
                &format!("file not found: {path}"),
            ))];
        }
        Some(D::PermissionDenied(_)) => {
            return vec![ToolStep::Done(failed(
                input,
                call_id,
                &format!("permission denied: {path}"),
            ))];
        }
        Some(D::Rejected(r)) => {
            return vec![ToolStep::Done(failed(
                input,
                call_id,
                &format!("reading diagnostics of {path} was rejected: {}", r.reason),
            ))];
        }
        Some(D::Error(e)) => {
            return vec![ToolStep::Done(failed(
                input,
                call_id,
                &format!("reading diagnostics of {path}: {}", e.error),
            ))];
        }
        None => {
            return vec![ToolStep::Done(failed(
                input,
                call_id,
                "the client returned an empty diagnostics result",
            ))];
        }
    };
    stage.lints.push(pb::FileDiagnostics {
        path,
        diagnostics_count: i32_of(diagnostics.len()),
        diagnostics,
    });
    if let Some(next) = paths.get(stage.lints.len()) {
        return vec![ToolStep::Exec(exec::diagnostics_request(next, call_id))];
    }
    let files = std::mem::take(&mut stage.lints);
    let total: usize = files.iter().map(|f| f.diagnostics.len()).sum();
    let mut text = String::new();
    for file in &files {
        for d in &file.diagnostics {
            let (line, column) = d
                .range
                .as_ref()
                .and_then(|r| r.start.as_ref())
                .map_or((0, 0), |p| (p.line, p.column));
            let severity =
                pb::DiagnosticSeverity::try_from(d.severity).map_or("unknown", |s| match s {
                    pb::DiagnosticSeverity::Error => "error",
                    pb::DiagnosticSeverity::Warning => "warning",
                    pb::DiagnosticSeverity::Information => "info",
                    pb::DiagnosticSeverity::Hint => "hint",
                    pb::DiagnosticSeverity::Unspecified => "unknown",
                });
            let _ = write!(
                text,
                "{}:{line}:{column}: {severity}: {}",
                file.path, d.message
            );
            if !d.source.is_empty() || !d.code.is_empty() {
                let _ = write!(text, " [{} {}]", d.source, d.code);
            }
            text.push('\n');
        }
    }
    if total == 0 {
        text = format!("No linter errors found in {}.", paths.join(", "));
    }
    let part = ResultPart::Lints(pb::ReadLintsToolResult {
        result: Some(pb::read_lints_tool_result::Result::Success(
            pb::ReadLintsToolSuccess {
                total_files: i32_of(files.len()),
                total_diagnostics: i32_of(total),
                file_diagnostics: files,
            },
        )),
    });
    vec![ToolStep::Done(outcome(input, call_id, part, text, false))]
}

fn shell_step(
    input: &ToolInput,
    call_id: &str,
    shell: &super::tools::ShellInput,
    stage: &mut Stage,
    stream: pb::ShellStream,
    env: &ToolEnv,
) -> Vec<ToolStep> {
    use pb::shell_stream::Event as E;
    let command = shell.command.clone();
    let working_directory = shell.working_directory.clone().unwrap_or_default();
    let delta = |delta: pb::shell_tool_call_delta::Delta| {
        ToolStep::Delta(pb::ToolCallDelta {
            delta: Some(pb::tool_call_delta::Delta::ShellToolCallDelta(
                pb::ShellToolCallDelta { delta: Some(delta) },
            )),
        })
    };
    match stream.event {
        Some(E::Start(_)) | Some(E::HookContext(_)) | None => Vec::new(),
        Some(E::Stdout(out)) => {
            stage.stdout.push(&out.data);
            vec![delta(pb::shell_tool_call_delta::Delta::Stdout(
                pb::ShellToolCallStdoutDelta { content: out.data },
            ))]
        }
        Some(E::Stderr(err)) => {
            stage.stderr.push(&err.data);
            vec![delta(pb::shell_tool_call_delta::Delta::Stderr(
                pb::ShellToolCallStderrDelta { content: err.data },
            ))]
        }
        Some(E::Exit(exit)) => {
            let code = i32::try_from(exit.code).unwrap_or(i32::MAX);
            let stdout = std::mem::take(&mut stage.stdout);
            let stderr = std::mem::take(&mut stage.stderr);
            let mut text = if exit.aborted {
                format!("The command was aborted (exit code {code}).\n")
            } else {
                format!("Exit code: {code}\n")
            };
            text.push_str(&model_output(&stdout, &stderr, env.max_output_bytes));
            if let Some(location) = &exit.output_location {
                let _ = write!(
                    text,
                    "\nFull output ({} bytes) is in {}",
                    location.size_bytes, location.file_path
                );
            }
            let wd = if exit.cwd.is_empty() {
                working_directory
            } else {
                exit.cwd.clone()
            };
            let result = if code == 0 && !exit.aborted {
                pb::shell_result::Result::Success(pb::ShellSuccess {
                    command,
                    working_directory: wd,
                    exit_code: code,
                    stdout: stdout.text,
                    stderr: stderr.text,
                    output_location: exit.output_location,
                    local_execution_time_ms: exit.local_execution_time_ms,
                    ..pb::ShellSuccess::default()
                })
            } else {
                pb::shell_result::Result::Failure(pb::ShellFailure {
                    command,
                    working_directory: wd,
                    exit_code: code,
                    stdout: stdout.text,
                    stderr: stderr.text,
                    output_location: exit.output_location,
                    abort_reason: exit.abort_reason,
                    aborted: exit.aborted,
                    local_execution_time_ms: exit.local_execution_time_ms,
                    ..pb::ShellFailure::default()
                })
            };
            let is_error = !matches!(result, pb::shell_result::Result::Success(_));
            let part = ResultPart::Shell(pb::ShellResult {
                result: Some(result),
                ..pb::ShellResult::default()
            });
            vec![ToolStep::Done(outcome(
                input, call_id, part, text, is_error,
            ))]
        }
        Some(E::Backgrounded(bg)) => {
            let stdout = std::mem::take(&mut stage.stdout);
            let stderr = std::mem::take(&mut stage.stderr);
            let mut text = format!(
                "The command is running in the background (shell id {}",
                bg.shell_id
            );
            if let Some(pid) = bg.pid {
                let _ = write!(text, ", pid {pid}");
            }
            text.push_str(").");
            if !env.terminals_folder.is_empty() {
                let _ = write!(
                    text,
                    " Its output is written to {}/{}.txt; read that file to check on it.",
                    env.terminals_folder.trim_end_matches('/'),
                    bg.shell_id
                );
            }
            let so_far = model_output(&stdout, &stderr, env.max_output_bytes);
            if !so_far.trim().is_empty() {
                let _ = write!(text, "\nOutput so far:\n{so_far}");
            }
            let part = ResultPart::Shell(pb::ShellResult {
                is_background: Some(true),
                terminals_folder: (!env.terminals_folder.is_empty())
                    .then(|| env.terminals_folder.clone()),
                pid: bg.pid,
                result: Some(pb::shell_result::Result::Success(pb::ShellSuccess {
                    command,
                    working_directory: if bg.working_directory.is_empty() {
                        working_directory
                    } else {
                        bg.working_directory
                    },
                    stdout: stdout.text,
                    stderr: stderr.text,
                    shell_id: Some(bg.shell_id),
                    pid: bg.pid,
                    ms_to_wait: bg.ms_to_wait,
                    background_reason: bg.reason,
                    ..pb::ShellSuccess::default()
                })),
                ..pb::ShellResult::default()
            });
            vec![ToolStep::Done(outcome(input, call_id, part, text, false))]
        }
        Some(E::Rejected(rejected)) => {
            let text = format!("Error: the user rejected the command: {}", rejected.reason);
            let part = ResultPart::Shell(pb::ShellResult {
                result: Some(pb::shell_result::Result::Rejected(rejected)),
                ..pb::ShellResult::default()
            });
            vec![ToolStep::Done(outcome(input, call_id, part, text, true))]
        }
        Some(E::PermissionDenied(denied)) => {
            let text = format!(
                "Error: permission denied running the command: {}",
                denied.error
            );
            let part = ResultPart::Shell(pb::ShellResult {
                result: Some(pb::shell_result::Result::PermissionDenied(denied)),
                ..pb::ShellResult::default()
            });
            vec![ToolStep::Done(outcome(input, call_id, part, text, true))]
        }
        Some(E::SandboxUnsupported(unsupported)) => vec![ToolStep::Done(failed(
            input,
            call_id,
            &format!(
                "the sandbox cannot run this command: {}",
                unsupported.reason
            ),
        ))],
    }
}

/// stdout then stderr, labelled, within the model's byte budget.
fn model_output(stdout: &Bounded, stderr: &Bounded, max: usize) -> String {
    let mut text = String::new();
    if !stdout.text.is_empty() || stdout.dropped > 0 {
        text.push_str(&truncate_for_model(&stdout.text, max, stdout.dropped));
    }
    if !stderr.text.is_empty() || stderr.dropped > 0 {
        if !text.is_empty() && !text.ends_with('\n') {
            text.push('\n');
        }
        text.push_str("[stderr]\n");
        text.push_str(&truncate_for_model(&stderr.text, max, stderr.dropped));
    }
    if text.is_empty() {
        text.push_str("(no output)");
    }
    text
}

/// The exec stream closed before a terminal result.
pub fn closed_without_result(
    input: &ToolInput,
    call_id: &str,
    stage: &mut Stage,
    env: &ToolEnv,
) -> ToolOutcome {
    let mut message = "the client closed the execution without a result".to_owned();
    if let ToolInput::Shell(_) = input {
        let stdout = std::mem::take(&mut stage.stdout);
        let stderr = std::mem::take(&mut stage.stderr);
        let _ = write!(
            message,
            "; output so far:\n{}",
            model_output(&stdout, &stderr, env.max_output_bytes)
        );
    }
    failed(input, call_id, &message)
}

/// TodoWrite, answered locally.
pub fn todo_write(input: &TodoWriteInput, current: &[Todo]) -> ToolOutcome {
    let todos = derived_state::apply(current, &todo_update(input));
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
    let input_ref = ToolInput::TodoWrite(input.clone());
    let part = ResultPart::Todos(pb::UpdateTodosResult {
        result: Some(pb::update_todos_result::Result::Success(
            pb::UpdateTodosSuccess {
                total_count: i32_of(todos.len()),
                todos: todos.iter().map(todo_item).collect(),
                was_merge: input.merge,
            },
        )),
    });
    outcome(&input_ref, "", part, text, false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_selection_honours_offsets_from_either_end() {
        let content = "a\nb\nc\nd\ne";
        assert_eq!(
            select_lines(content, None, None, 5, false),
            (1, vec!["a", "b", "c", "d", "e"])
        );
        assert_eq!(
            select_lines(content, Some(2), Some(2), 5, false),
            (2, vec!["b", "c"])
        );
        assert_eq!(
            select_lines(content, Some(-2), None, 5, false),
            (4, vec!["d", "e"])
        );
        assert_eq!(
            select_lines("d\ne", Some(-2), None, 5, true),
            (4, vec!["d", "e"])
        );
    }

    #[test]
    fn truncation_marks_what_was_left_out() {
        assert_eq!(truncate_for_model("short", 10, 0), "short");
        let cut = truncate_for_model("0123456789abc", 10, 0);
        assert!(
            cut.starts_with("0123456789\n[... output truncated: 3 more bytes"),
            "{cut}"
        );
        let multibyte = truncate_for_model("ééé", 3, 0);
        assert!(multibyte.starts_with('é'), "{multibyte}");
    }

    #[test]
    fn line_delta_counts_changed_lines_only() {
        assert_eq!(line_delta("a\nb\nc", "a\nx\ny\nc"), (2, 1));
        assert_eq!(line_delta("", "one\ntwo"), (2, 0));
    }
}
