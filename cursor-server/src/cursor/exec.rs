//! Exec requests and results: the client-executed half of tools (`exec_server_message` ↔
//! `exec_client_message`), named by their oneof variant so a result can be matched to its request kind.

use super::proto::agent::exec_client_message::Message;

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
