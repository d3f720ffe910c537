//! Exec requests and results: the client-executed half of tools (`exec_server_message` ↔
//! `exec_client_message`), named by their oneof variant so a result can be matched to its request kind.

use super::proto::agent::exec_client_message::Message;
use super::proto::agent::{
    self as pb, exec_server_message, interaction_query, interaction_response,
};
use super::tools::{
    FetchMcpResourceInput, GrepMode, ListMcpResourcesInput, McpInput, ShellInput, TaskInput,
    ToolEnv, ToolInput,
};
use crate::model::conversation::Mode;

/// Shell defaults the official backend sends (protocol.md §6).
pub const SHELL_DEFAULT_BLOCK_MS: u32 = 30_000;
pub const SHELL_HARD_TIMEOUT_MS: i32 = 86_400_000;
pub const SHELL_FILE_OUTPUT_THRESHOLD_BYTES: u64 = 40_000;

/// An exec request to send, with the result kind its answer must have.
#[derive(Debug, Clone, PartialEq)]
pub struct ExecRequest {
    pub message: Box<exec_server_message::Message>,
}

impl ExecRequest {
    /// The `ExecClientMessage` oneof name that answers this request.
    pub fn expected_result(&self) -> &'static str {
        use exec_server_message::Message as A;
        match self.message.as_ref() {
            A::ShellArgs(_) => "shell_result",
            A::WriteArgs(_) => "write_result",
            A::DeleteArgs(_) => "delete_result",
            A::GrepArgs(_) => "grep_result",
            A::ReadArgs(_) => "read_result",
            A::RedactedReadArgs(_) => "redacted_read_result",
            A::LsArgs(_) => "ls_result",
            A::DiagnosticsArgs(_) => "diagnostics_result",
            A::RequestContextArgs(_) => "request_context_result",
            A::McpArgs(_) => "mcp_result",
            A::ShellStreamArgs(_) => "shell_stream",
            A::BackgroundShellSpawnArgs(_) => "background_shell_spawn_result",
            A::ListMcpResourcesExecArgs(_) => "list_mcp_resources_exec_result",
            A::ReadMcpResourceExecArgs(_) => "read_mcp_resource_exec_result",
            A::McpStateExecArgs(_) => "mcp_state_exec_result",
            A::FetchArgs(_) => "fetch_result",
            A::RecordScreenArgs(_) => "record_screen_result",
            A::ComputerUseArgs(_) => "computer_use_result",
            A::WriteShellStdinArgs(_) => "write_shell_stdin_result",
            A::ExecuteHookArgs(_) => "execute_hook_result",
            A::SubagentArgs(_) => "subagent_result",
            A::ForceBackgroundShellArgs(_) => "force_background_shell_result",
            A::ForceBackgroundSubagentArgs(_) => "force_background_subagent_result",
            A::SubagentAwaitArgs(_) => "subagent_await_result",
            A::SmartModeClassifierArgs(_) => "smart_mode_classifier_result",
        }
    }

    /// Whether the client answers with several messages (then `stream_close`).
    pub fn is_streaming(&self) -> bool {
        matches!(
            *self.message,
            exec_server_message::Message::ShellStreamArgs(_)
        )
    }

    /// The wire message with the exec id assigned by the run.
    pub fn into_server_message(self, id: u32) -> pb::AgentServerMessage {
        pb::AgentServerMessage {
            message: Some(pb::agent_server_message::Message::ExecServerMessage(
                pb::ExecServerMessage {
                    id,
                    message: Some(*self.message),
                    ..pb::ExecServerMessage::default()
                },
            )),
        }
    }
}

/// An interaction query (the user decides: a question, a plan, a mode switch), with the response
/// kind its answer must have. It shares the exec id sequence of the request.
#[derive(Debug, Clone, PartialEq)]
pub struct QueryRequest {
    pub query: Box<interaction_query::Query>,
}

impl QueryRequest {
    /// The `InteractionResponse` oneof name that answers this query.
    pub fn expected_result(&self) -> &'static str {
        use interaction_query::Query as Q;
        match self.query.as_ref() {
            Q::WebSearchRequestQuery(_) => "web_search_request_response",
            Q::AskQuestionInteractionQuery(_) => "ask_question_interaction_response",
            Q::SwitchModeRequestQuery(_) => "switch_mode_request_response",
            Q::CreatePlanRequestQuery(_) => "create_plan_request_response",
            Q::SetupVmEnvironmentArgs(_) => "setup_vm_environment_result",
            Q::WebFetchRequestQuery(_) => "web_fetch_request_response",
            Q::PrManagementRequestQuery(_) => "pr_management_result",
            Q::McpAuthRequestQuery(_) => "mcp_auth_request_response",
            Q::GenerateImageRequestQuery(_) => "generate_image_request_response",
            Q::ReplaceEnvArgs(_) => "replace_env_result",
        }
    }

    /// The wire message with the id assigned by the run.
    pub fn into_server_message(self, id: u32) -> pb::AgentServerMessage {
        pb::AgentServerMessage {
            message: Some(pb::agent_server_message::Message::InteractionQuery(
                pb::InteractionQuery {
                    id,
                    query: Some(*self.query),
                },
            )),
        }
    }
}

/// A client's answer to an interaction query, opaque to the loop.
#[derive(Debug, Clone, PartialEq)]
pub struct QueryPayload(pub Box<interaction_response::Result>);

impl QueryPayload {
    pub fn kind(&self) -> &'static str {
        use interaction_response::Result as R;
        match self.0.as_ref() {
            R::WebSearchRequestResponse(_) => "web_search_request_response",
            R::AskQuestionInteractionResponse(_) => "ask_question_interaction_response",
            R::SwitchModeRequestResponse(_) => "switch_mode_request_response",
            R::CreatePlanRequestResponse(_) => "create_plan_request_response",
            R::SetupVmEnvironmentResult(_) => "setup_vm_environment_result",
            R::WebFetchRequestResponse(_) => "web_fetch_request_response",
            R::PrManagementResult(_) => "pr_management_result",
            R::McpAuthRequestResponse(_) => "mcp_auth_request_response",
            R::GenerateImageRequestResponse(_) => "generate_image_request_response",
            R::ReplaceEnvResult(_) => "replace_env_result",
        }
    }
}

/// A client's exec result, opaque to the loop.
#[derive(Debug, Clone, PartialEq)]
pub struct ExecPayload(pub Box<Message>);

impl ExecPayload {
    pub fn kind(&self) -> &'static str {
        result_kind(&self.0)
    }
}

/// `exec_server_control_message.abort{id}`.
pub fn abort(id: u32) -> pb::AgentServerMessage {
    pb::AgentServerMessage {
        message: Some(pb::agent_server_message::Message::ExecServerControlMessage(
            pb::ExecServerControlMessage {
                message: Some(pb::exec_server_control_message::Message::Abort(
                    pb::ExecServerAbort { id },
                )),
            },
        )),
    }
}

pub fn read_request(
    path: &str,
    offset: Option<i32>,
    limit: Option<u32>,
    call_id: &str,
) -> ExecRequest {
    ExecRequest {
        message: Box::new(exec_server_message::Message::ReadArgs(pb::ReadArgs {
            path: path.to_owned(),
            tool_call_id: call_id.to_owned(),
            offset,
            limit,
            encoding_hint: None,
        })),
    }
}

pub fn write_request(path: &str, text: &str, call_id: &str) -> ExecRequest {
    ExecRequest {
        message: Box::new(exec_server_message::Message::WriteArgs(pb::WriteArgs {
            path: path.to_owned(),
            file_text: text.to_owned(),
            tool_call_id: call_id.to_owned(),
            return_file_content_after_write: false,
            ..pb::WriteArgs::default()
        })),
    }
}

pub fn diagnostics_request(path: &str, call_id: &str) -> ExecRequest {
    ExecRequest {
        message: Box::new(exec_server_message::Message::DiagnosticsArgs(
            pb::DiagnosticsArgs {
                path: path.to_owned(),
                tool_call_id: call_id.to_owned(),
            },
        )),
    }
}

/// `ShellArgs` as the official backend fills them; also the Shell card's typed args.
pub fn shell_args(input: &ShellInput, call_id: &str) -> pb::ShellArgs {
    let block = input.block_until_ms.unwrap_or(SHELL_DEFAULT_BLOCK_MS);
    pb::ShellArgs {
        command: input.command.clone(),
        working_directory: input.working_directory.clone().unwrap_or_default(),
        timeout: i32::try_from(block).unwrap_or(i32::MAX),
        tool_call_id: call_id.to_owned(),
        // The server does not parse shell syntax: say so instead of faking a parse.
        parsing_result: Some(pb::ShellCommandParsingResult {
            parsing_failed: true,
            ..pb::ShellCommandParsingResult::default()
        }),
        file_output_threshold_bytes: Some(SHELL_FILE_OUTPUT_THRESHOLD_BYTES),
        is_background: block == 0,
        timeout_behavior: pb::TimeoutBehavior::Background as i32,
        hard_timeout: Some(SHELL_HARD_TIMEOUT_MS),
        description: input.description.clone(),
        close_stdin: true,
        ..pb::ShellArgs::default()
    }
}

/// `GrepArgs` for a Grep call; also the Grep card's typed args.
pub fn grep_args(input: &super::tools::GrepInput, call_id: &str) -> pb::GrepArgs {
    let signed = |v: Option<u32>| v.map(|v| i32::try_from(v).unwrap_or(i32::MAX));
    pb::GrepArgs {
        pattern: input.pattern.clone(),
        path: input.path.clone(),
        glob: input.glob.clone(),
        output_mode: Some(
            input
                .output_mode
                .unwrap_or(GrepMode::Content)
                .as_str()
                .to_owned(),
        ),
        context_before: signed(input.before),
        context_after: signed(input.after),
        context: signed(input.context),
        case_insensitive: input.case_insensitive,
        r#type: input.file_type.clone(),
        head_limit: signed(input.head_limit),
        multiline: input.multiline,
        tool_call_id: call_id.to_owned(),
        offset: signed(input.offset),
        ..pb::GrepArgs::default()
    }
}

/// The first exec request of an exec-transport tool; `None` for local tools.
pub fn first_request(input: &ToolInput, call_id: &str, env: &ToolEnv) -> Option<ExecRequest> {
    use exec_server_message::Message as A;
    let message = match input {
        ToolInput::Read(read) => {
            return Some(read_request(&read.path, read.offset, read.limit, call_id));
        }
        ToolInput::Write(write) => {
            return Some(write_request(&write.path, &write.contents, call_id));
        }
        // An exact replacement needs the current content first.
        ToolInput::StrReplace(edit) => return Some(read_request(&edit.path, None, None, call_id)),
        ToolInput::Delete(delete) => A::DeleteArgs(pb::DeleteArgs {
            path: delete.path.clone(),
            tool_call_id: call_id.to_owned(),
        }),
        ToolInput::Grep(grep) => A::GrepArgs(grep_args(grep, call_id)),
        ToolInput::Glob(glob) => A::GrepArgs(glob_args(glob, call_id)),
        ToolInput::Ls(ls) => A::LsArgs(pb::LsArgs {
            path: ls.path.clone(),
            ignore: ls.ignore.clone(),
            tool_call_id: call_id.to_owned(),
            ..pb::LsArgs::default()
        }),
        // One diagnostics exec per path, in order; the first here, the rest as results come in.
        ToolInput::ReadLints(lints) => {
            return lints.paths.first().map(|p| diagnostics_request(p, call_id));
        }
        ToolInput::Shell(shell) => A::ShellStreamArgs(shell_args(shell, call_id)),
        // Answered by the server or by the user, never executed by the client.
        ToolInput::TodoWrite(_)
        | ToolInput::AskQuestion(_)
        | ToolInput::SwitchMode(_)
        | ToolInput::CreatePlan(_)
        | ToolInput::WebFetch(_)
        | ToolInput::WebSearch(_) => return None,
        ToolInput::ListMcpResources(list) => {
            A::ListMcpResourcesExecArgs(list_mcp_resources_args(list))
        }
        ToolInput::FetchMcpResource(read) => {
            A::ReadMcpResourceExecArgs(read_mcp_resource_args(read))
        }
        ToolInput::Mcp(mcp) => A::McpArgs(mcp_args(mcp, call_id)),
        ToolInput::Task(task) => A::SubagentArgs(subagent_args(task, call_id, env)),
    };
    Some(ExecRequest {
        message: Box::new(message),
    })
}

pub fn list_mcp_resources_args(list: &ListMcpResourcesInput) -> pb::ListMcpResourcesExecArgs {
    pb::ListMcpResourcesExecArgs {
        server: list.server.clone().filter(|s| !s.trim().is_empty()),
    }
}

pub fn read_mcp_resource_args(read: &FetchMcpResourceInput) -> pb::ReadMcpResourceExecArgs {
    pb::ReadMcpResourceExecArgs {
        server: read.server.clone(),
        uri: read.uri.clone(),
        download_path: None,
    }
}

/// `mcp_args` for an MCP call; also the MCP card's typed args.
pub fn mcp_args(mcp: &McpInput, call_id: &str) -> pb::McpArgs {
    pb::McpArgs {
        name: mcp.tool.name.clone(),
        args: mcp
            .args
            .iter()
            .map(|(k, v)| (k.clone(), json_to_proto(v)))
            .collect(),
        tool_call_id: call_id.to_owned(),
        provider_identifier: mcp.tool.server.clone(),
        tool_name: mcp.tool.tool_name.clone(),
        ..pb::McpArgs::default()
    }
}

/// JSON → `google.protobuf.Value` (numbers become doubles, as in protobuf's own JSON mapping).
pub fn json_to_proto(value: &serde_json::Value) -> prost_types::Value {
    use prost_types::value::Kind;
    use serde_json::Value as J;
    let kind = match value {
        J::Null => Kind::NullValue(0),
        J::Bool(b) => Kind::BoolValue(*b),
        J::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or_default()),
        J::String(s) => Kind::StringValue(s.clone()),
        J::Array(items) => Kind::ListValue(prost_types::ListValue {
            values: items.iter().map(json_to_proto).collect(),
        }),
        J::Object(fields) => Kind::StructValue(prost_types::Struct {
            fields: fields
                .iter()
                .map(|(k, v)| (k.clone(), json_to_proto(v)))
                .collect(),
        }),
    };
    prost_types::Value { kind: Some(kind) }
}

/// `google.protobuf.Value` → JSON (whole doubles become integers, so schemas read naturally).
pub fn proto_to_json(value: &prost_types::Value) -> serde_json::Value {
    use prost_types::value::Kind;
    use serde_json::Value as J;
    match &value.kind {
        None | Some(Kind::NullValue(_)) => J::Null,
        Some(Kind::BoolValue(b)) => J::Bool(*b),
        Some(Kind::NumberValue(n)) if n.fract() == 0.0 && n.abs() < 9.0e15 => J::from(*n as i64),
        Some(Kind::NumberValue(n)) => serde_json::Number::from_f64(*n).map_or(J::Null, J::Number),
        Some(Kind::StringValue(s)) => J::String(s.clone()),
        Some(Kind::ListValue(list)) => J::Array(list.values.iter().map(proto_to_json).collect()),
        Some(Kind::StructValue(object)) => J::Object(
            object
                .fields
                .iter()
                .map(|(k, v)| (k.clone(), proto_to_json(v)))
                .collect(),
        ),
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

/// The fetch a WebFetch call runs once the user approved it.
pub fn fetch_request(url: &str, call_id: &str) -> ExecRequest {
    ExecRequest {
        message: Box::new(exec_server_message::Message::FetchArgs(pb::FetchArgs {
            url: url.to_owned(),
            tool_call_id: call_id.to_owned(),
        })),
    }
}

/// Glob runs as a files-mode grep with no pattern.
pub fn glob_args(glob: &super::tools::GlobInput, call_id: &str) -> pb::GrepArgs {
    pb::GrepArgs {
        glob: Some(glob.glob_pattern.clone()),
        path: glob.target_directory.clone(),
        output_mode: Some(GrepMode::FilesWithMatches.as_str().to_owned()),
        tool_call_id: call_id.to_owned(),
        ..pb::GrepArgs::default()
    }
}
/// The schema name of a result's oneof variant (`read_result`, `shell_stream`, ...).
pub fn result_kind(result: &Message) -> &'static str {
    match result {
        Message::ShellResult(_) => "shell_result",
        Message::WriteResult(_) => "write_result",
        Message::DeleteResult(_) => "delete_result",
        Message::GrepResult(_) => "grep_result",
        Message::ReadResult(_) => "read_result",
        Message::RedactedReadResult(_) => "redacted_read_result",
        Message::LsResult(_) => "ls_result",
        Message::DiagnosticsResult(_) => "diagnostics_result",
        Message::RequestContextResult(_) => "request_context_result",
        Message::McpResult(_) => "mcp_result",
        Message::ShellStream(_) => "shell_stream",
        Message::BackgroundShellSpawnResult(_) => "background_shell_spawn_result",
        Message::ListMcpResourcesExecResult(_) => "list_mcp_resources_exec_result",
        Message::ReadMcpResourceExecResult(_) => "read_mcp_resource_exec_result",
        Message::McpStateExecResult(_) => "mcp_state_exec_result",
        Message::FetchResult(_) => "fetch_result",
        Message::RecordScreenResult(_) => "record_screen_result",
        Message::ComputerUseResult(_) => "computer_use_result",
        Message::WriteShellStdinResult(_) => "write_shell_stdin_result",
        Message::ExecuteHookResult(_) => "execute_hook_result",
        Message::SubagentResult(_) => "subagent_result",
        Message::ForceBackgroundShellResult(_) => "force_background_shell_result",
        Message::ForceBackgroundSubagentResult(_) => "force_background_subagent_result",
        Message::SubagentAwaitResult(_) => "subagent_await_result",
        Message::SmartModeClassifierResult(_) => "smart_mode_classifier_result",
    }
}
