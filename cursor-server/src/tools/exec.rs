//! Exec requests and results: the client-executed half of tools (`exec_server_message` ↔
//! `exec_client_message`) and the interaction queries that share their id sequence, as envelopes;
//! `ExecKind` says which result answers which request. What each tool sends is its family's
//! business (`tools/`).

use crate::cursor::proto::agent::exec_client_message::Message;
use crate::cursor::proto::agent::{
    self as pb, exec_server_message, interaction_query, interaction_response,
};

/// What answers an exec request or an interaction query: the kind of the client's result (its oneof
/// variant). A request and its answer agree by this value, not by spelling a oneof name twice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ExecKind {
    ShellResult,
    WriteResult,
    DeleteResult,
    GrepResult,
    ReadResult,
    RedactedReadResult,
    LsResult,
    DiagnosticsResult,
    RequestContextResult,
    McpResult,
    ShellStream,
    BackgroundShellSpawnResult,
    ListMcpResourcesExecResult,
    ReadMcpResourceExecResult,
    McpStateExecResult,
    FetchResult,
    RecordScreenResult,
    ComputerUseResult,
    WriteShellStdinResult,
    ExecuteHookResult,
    SubagentResult,
    ForceBackgroundShellResult,
    ForceBackgroundSubagentResult,
    SubagentAwaitResult,
    SmartModeClassifierResult,
    WebSearchRequestResponse,
    AskQuestionInteractionResponse,
    SwitchModeRequestResponse,
    CreatePlanRequestResponse,
    SetupVmEnvironmentResult,
    WebFetchRequestResponse,
    PrManagementResult,
    McpAuthRequestResponse,
    GenerateImageRequestResponse,
    ReplaceEnvResult,
}

impl ExecKind {
    /// The schema name of the result's oneof variant (`read_result`, `shell_stream`, ...), for logs and
    /// error messages.
    pub fn name(self) -> &'static str {
        match self {
            ExecKind::ShellResult => "shell_result",
            ExecKind::WriteResult => "write_result",
            ExecKind::DeleteResult => "delete_result",
            ExecKind::GrepResult => "grep_result",
            ExecKind::ReadResult => "read_result",
            ExecKind::RedactedReadResult => "redacted_read_result",
            ExecKind::LsResult => "ls_result",
            ExecKind::DiagnosticsResult => "diagnostics_result",
            ExecKind::RequestContextResult => "request_context_result",
            ExecKind::McpResult => "mcp_result",
            ExecKind::ShellStream => "shell_stream",
            ExecKind::BackgroundShellSpawnResult => "background_shell_spawn_result",
            ExecKind::ListMcpResourcesExecResult => "list_mcp_resources_exec_result",
            ExecKind::ReadMcpResourceExecResult => "read_mcp_resource_exec_result",
            ExecKind::McpStateExecResult => "mcp_state_exec_result",
            ExecKind::FetchResult => "fetch_result",
            ExecKind::RecordScreenResult => "record_screen_result",
            ExecKind::ComputerUseResult => "computer_use_result",
            ExecKind::WriteShellStdinResult => "write_shell_stdin_result",
            ExecKind::ExecuteHookResult => "execute_hook_result",
            ExecKind::SubagentResult => "subagent_result",
            ExecKind::ForceBackgroundShellResult => "force_background_shell_result",
            ExecKind::ForceBackgroundSubagentResult => "force_background_subagent_result",
            ExecKind::SubagentAwaitResult => "subagent_await_result",
            ExecKind::SmartModeClassifierResult => "smart_mode_classifier_result",
            ExecKind::WebSearchRequestResponse => "web_search_request_response",
            ExecKind::AskQuestionInteractionResponse => "ask_question_interaction_response",
            ExecKind::SwitchModeRequestResponse => "switch_mode_request_response",
            ExecKind::CreatePlanRequestResponse => "create_plan_request_response",
            ExecKind::SetupVmEnvironmentResult => "setup_vm_environment_result",
            ExecKind::WebFetchRequestResponse => "web_fetch_request_response",
            ExecKind::PrManagementResult => "pr_management_result",
            ExecKind::McpAuthRequestResponse => "mcp_auth_request_response",
            ExecKind::GenerateImageRequestResponse => "generate_image_request_response",
            ExecKind::ReplaceEnvResult => "replace_env_result",
        }
    }

    /// The result kind that answers exec request `request`.
    pub fn answering(request: &exec_server_message::Message) -> ExecKind {
        use exec_server_message::Message as A;
        match request {
            A::ShellArgs(_) => ExecKind::ShellResult,
            A::WriteArgs(_) => ExecKind::WriteResult,
            A::DeleteArgs(_) => ExecKind::DeleteResult,
            A::GrepArgs(_) => ExecKind::GrepResult,
            A::ReadArgs(_) => ExecKind::ReadResult,
            A::RedactedReadArgs(_) => ExecKind::RedactedReadResult,
            A::LsArgs(_) => ExecKind::LsResult,
            A::DiagnosticsArgs(_) => ExecKind::DiagnosticsResult,
            A::RequestContextArgs(_) => ExecKind::RequestContextResult,
            A::McpArgs(_) => ExecKind::McpResult,
            A::ShellStreamArgs(_) => ExecKind::ShellStream,
            A::BackgroundShellSpawnArgs(_) => ExecKind::BackgroundShellSpawnResult,
            A::ListMcpResourcesExecArgs(_) => ExecKind::ListMcpResourcesExecResult,
            A::ReadMcpResourceExecArgs(_) => ExecKind::ReadMcpResourceExecResult,
            A::McpStateExecArgs(_) => ExecKind::McpStateExecResult,
            A::FetchArgs(_) => ExecKind::FetchResult,
            A::RecordScreenArgs(_) => ExecKind::RecordScreenResult,
            A::ComputerUseArgs(_) => ExecKind::ComputerUseResult,
            A::WriteShellStdinArgs(_) => ExecKind::WriteShellStdinResult,
            A::ExecuteHookArgs(_) => ExecKind::ExecuteHookResult,
            A::SubagentArgs(_) => ExecKind::SubagentResult,
            A::ForceBackgroundShellArgs(_) => ExecKind::ForceBackgroundShellResult,
            A::ForceBackgroundSubagentArgs(_) => ExecKind::ForceBackgroundSubagentResult,
            A::SubagentAwaitArgs(_) => ExecKind::SubagentAwaitResult,
            A::SmartModeClassifierArgs(_) => ExecKind::SmartModeClassifierResult,
        }
    }

    /// The kind of exec result `result`.
    pub fn of_result(result: &Message) -> ExecKind {
        match result {
            Message::ShellResult(_) => ExecKind::ShellResult,
            Message::WriteResult(_) => ExecKind::WriteResult,
            Message::DeleteResult(_) => ExecKind::DeleteResult,
            Message::GrepResult(_) => ExecKind::GrepResult,
            Message::ReadResult(_) => ExecKind::ReadResult,
            Message::RedactedReadResult(_) => ExecKind::RedactedReadResult,
            Message::LsResult(_) => ExecKind::LsResult,
            Message::DiagnosticsResult(_) => ExecKind::DiagnosticsResult,
            Message::RequestContextResult(_) => ExecKind::RequestContextResult,
            Message::McpResult(_) => ExecKind::McpResult,
            Message::ShellStream(_) => ExecKind::ShellStream,
            Message::BackgroundShellSpawnResult(_) => ExecKind::BackgroundShellSpawnResult,
            Message::ListMcpResourcesExecResult(_) => ExecKind::ListMcpResourcesExecResult,
            Message::ReadMcpResourceExecResult(_) => ExecKind::ReadMcpResourceExecResult,
            Message::McpStateExecResult(_) => ExecKind::McpStateExecResult,
            Message::FetchResult(_) => ExecKind::FetchResult,
            Message::RecordScreenResult(_) => ExecKind::RecordScreenResult,
            Message::ComputerUseResult(_) => ExecKind::ComputerUseResult,
            Message::WriteShellStdinResult(_) => ExecKind::WriteShellStdinResult,
            Message::ExecuteHookResult(_) => ExecKind::ExecuteHookResult,
            Message::SubagentResult(_) => ExecKind::SubagentResult,
            Message::ForceBackgroundShellResult(_) => ExecKind::ForceBackgroundShellResult,
            Message::ForceBackgroundSubagentResult(_) => ExecKind::ForceBackgroundSubagentResult,
            Message::SubagentAwaitResult(_) => ExecKind::SubagentAwaitResult,
            Message::SmartModeClassifierResult(_) => ExecKind::SmartModeClassifierResult,
        }
    }

    /// The response kind that answers interaction query `query`.
    fn answering_query(query: &interaction_query::Query) -> ExecKind {
        use interaction_query::Query as Q;
        match query {
            Q::WebSearchRequestQuery(_) => ExecKind::WebSearchRequestResponse,
            Q::AskQuestionInteractionQuery(_) => ExecKind::AskQuestionInteractionResponse,
            Q::SwitchModeRequestQuery(_) => ExecKind::SwitchModeRequestResponse,
            Q::CreatePlanRequestQuery(_) => ExecKind::CreatePlanRequestResponse,
            Q::SetupVmEnvironmentArgs(_) => ExecKind::SetupVmEnvironmentResult,
            Q::WebFetchRequestQuery(_) => ExecKind::WebFetchRequestResponse,
            Q::PrManagementRequestQuery(_) => ExecKind::PrManagementResult,
            Q::McpAuthRequestQuery(_) => ExecKind::McpAuthRequestResponse,
            Q::GenerateImageRequestQuery(_) => ExecKind::GenerateImageRequestResponse,
            Q::ReplaceEnvArgs(_) => ExecKind::ReplaceEnvResult,
        }
    }

    /// The kind of interaction response `response`.
    pub fn of_response(response: &interaction_response::Result) -> ExecKind {
        use interaction_response::Result as R;
        match response {
            R::WebSearchRequestResponse(_) => ExecKind::WebSearchRequestResponse,
            R::AskQuestionInteractionResponse(_) => ExecKind::AskQuestionInteractionResponse,
            R::SwitchModeRequestResponse(_) => ExecKind::SwitchModeRequestResponse,
            R::CreatePlanRequestResponse(_) => ExecKind::CreatePlanRequestResponse,
            R::SetupVmEnvironmentResult(_) => ExecKind::SetupVmEnvironmentResult,
            R::WebFetchRequestResponse(_) => ExecKind::WebFetchRequestResponse,
            R::PrManagementResult(_) => ExecKind::PrManagementResult,
            R::McpAuthRequestResponse(_) => ExecKind::McpAuthRequestResponse,
            R::GenerateImageRequestResponse(_) => ExecKind::GenerateImageRequestResponse,
            R::ReplaceEnvResult(_) => ExecKind::ReplaceEnvResult,
        }
    }
}

impl std::fmt::Display for ExecKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// An exec request to send, with the result kind its answer must have.
#[derive(Debug, Clone, PartialEq)]
pub struct ExecRequest {
    pub message: Box<exec_server_message::Message>,
}

impl ExecRequest {
    pub fn new(message: exec_server_message::Message) -> ExecRequest {
        ExecRequest {
            message: Box::new(message),
        }
    }

    /// The kind of `ExecClientMessage` result that answers this request.
    pub fn expected_result(&self) -> ExecKind {
        ExecKind::answering(&self.message)
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
        self.into_server_message_under(id, String::new())
    }

    /// The exec under `id` and the client's own `exec_id` for it (a user's command the client
    /// named in its action).
    pub fn into_server_message_under(self, id: u32, exec_id: String) -> pb::AgentServerMessage {
        pb::AgentServerMessage {
            message: Some(pb::agent_server_message::Message::ExecServerMessage(
                pb::ExecServerMessage {
                    id,
                    exec_id,
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
    /// The kind of `InteractionResponse` that answers this query.
    pub fn expected_result(&self) -> ExecKind {
        ExecKind::answering_query(&self.query)
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
    pub fn kind(&self) -> ExecKind {
        ExecKind::of_response(&self.0)
    }
}

/// A client's exec result, opaque to the loop.
#[derive(Debug, Clone, PartialEq)]
pub struct ExecPayload(pub Box<Message>);

impl ExecPayload {
    pub fn kind(&self) -> ExecKind {
        ExecKind::of_result(&self.0)
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
