//! Shell: a command the client runs with its output streamed live onto the card; blocking up to
//! `block_until_ms`, then moved to the background with its output in the terminals folder.

use std::fmt::Write as _;

use serde::Deserialize;

use crate::cursor::proto::agent::{self as pb, exec_server_message, tool_call};
use crate::tools::tool_result::{
    Bounded, CLOSED_WITHOUT_RESULT, Stage, Tool, ToolEnv, ToolOutcome, ToolStep, card, done,
    failed, non_empty, on_exec_answer, parse_args, truncate_for_model,
};

/// Shell defaults the official backend sends (protocol.md §6).
pub const SHELL_DEFAULT_BLOCK_MS: u32 = 30_000;
pub const SHELL_HARD_TIMEOUT_MS: i32 = 86_400_000;
pub const SHELL_FILE_OUTPUT_THRESHOLD_BYTES: u64 = 40_000;

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct ShellInput {
    pub command: String,
    pub working_directory: Option<String>,
    pub block_until_ms: Option<u32>,
    pub description: Option<String>,
}

impl Tool for ShellInput {
    type Result = pb::ShellResult;

    const NAME: &'static str = "Shell";
    const ARGUMENTS: &'static [(&'static str, bool)] = &[
        ("command", true),
        ("working_directory", false),
        ("block_until_ms", false),
        ("description", false),
    ];

    fn parse(text: &str) -> Result<ShellInput, String> {
        let input: ShellInput = parse_args("Shell", text)?;
        non_empty("Shell", "command", &input.command)?;
        Ok(input)
    }

    fn card(args: Option<&Self>, call_id: &str, result: Option<Self::Result>) -> pb::ToolCall {
        card(tool_call::Tool::ShellToolCall(pb::ShellToolCall {
            args: args.map(|shell| shell_args(shell, call_id)),
            result,
            description: args.and_then(|shell| shell.description.clone()),
        }))
    }

    fn error(args: Option<&Self>, call_id: &str, message: &str) -> Self::Result {
        let (command, working_directory) = args
            .map(|shell| shell_args(shell, call_id))
            .map(|a| (a.command, a.working_directory))
            .unwrap_or_default();
        pb::ShellResult {
            result: Some(pb::shell_result::Result::SpawnError(pb::ShellSpawnError {
                command,
                working_directory,
                error: message.to_owned(),
            })),
            ..pb::ShellResult::default()
        }
    }

    /// A command stopped with the run (the user's stop, a new message) is an aborted failure with
    /// the output it had produced, as Cursor shows a command the user aborted.
    fn aborted(args: Option<&Self>, call_id: &str, stage: &Stage, message: &str) -> Self::Result {
        let Some(shell) = args else {
            return Self::error(None, call_id, message);
        };
        let args = shell_args(shell, call_id);
        pb::ShellResult {
            result: Some(pb::shell_result::Result::Failure(pb::ShellFailure {
                command: args.command,
                working_directory: args.working_directory,
                stdout: stage.stdout.text.clone(),
                stderr: stage.stderr.text.clone(),
                aborted: true,
                abort_reason: Some(pb::ShellAbortReason::UserAbort as i32),
                ..pb::ShellFailure::default()
            })),
            ..pb::ShellResult::default()
        }
    }

    fn start(&self, call_id: &str, _env: &ToolEnv) -> ToolStep {
        ToolStep::exec(exec_server_message::Message::ShellStreamArgs(shell_args(
            self, call_id,
        )))
    }

    on_exec_answer!(ShellStream => steps shell_step);

    /// The output so far goes to the model with the failure.
    fn on_closed(&self, call_id: &str, stage: &mut Stage, env: &ToolEnv) -> ToolOutcome {
        let stdout = std::mem::take(&mut stage.stdout);
        let stderr = std::mem::take(&mut stage.stderr);
        let message = format!(
            "{CLOSED_WITHOUT_RESULT}; output so far:\n{}",
            model_output(&stdout, &stderr, env.max_output_bytes)
        );
        failed(self, call_id, &message)
    }
}

/// `ShellArgs` as the official backend fills them; also the Shell card's typed args.
fn shell_args(input: &ShellInput, call_id: &str) -> pb::ShellArgs {
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

fn shell_step(
    shell: &ShellInput,
    call_id: &str,
    stream: pb::ShellStream,
    stage: &mut Stage,
    env: &ToolEnv,
) -> Vec<ToolStep> {
    use pb::shell_stream::Event as E;
    use pb::shell_tool_call_delta::Delta;
    let result = |part: pb::shell_result::Result, text: String| {
        let part = pb::ShellResult {
            result: Some(part),
            ..pb::ShellResult::default()
        };
        vec![ToolStep::Done(done(shell, call_id, part, text, true))]
    };
    match stream.event {
        Some(E::Start(_)) | Some(E::HookContext(_)) | None => Vec::new(),
        Some(E::Stdout(out)) => {
            stage.stdout.push(&out.data);
            vec![delta(Delta::Stdout(pb::ShellToolCallStdoutDelta {
                content: out.data,
            }))]
        }
        Some(E::Stderr(err)) => {
            stage.stderr.push(&err.data);
            vec![delta(Delta::Stderr(pb::ShellToolCallStderrDelta {
                content: err.data,
            }))]
        }
        Some(E::Exit(exit)) => vec![ToolStep::Done(exited(shell, call_id, stage, exit, env))],
        Some(E::Backgrounded(bg)) => {
            vec![ToolStep::Done(backgrounded(shell, call_id, stage, bg, env))]
        }
        Some(E::Rejected(rejected)) => {
            let text = format!("Error: the user rejected the command: {}", rejected.reason);
            result(pb::shell_result::Result::Rejected(rejected), text)
        }
        Some(E::PermissionDenied(denied)) => {
            let text = format!(
                "Error: permission denied running the command: {}",
                denied.error
            );
            result(pb::shell_result::Result::PermissionDenied(denied), text)
        }
        Some(E::SandboxUnsupported(unsupported)) => vec![ToolStep::Done(failed(
            shell,
            call_id,
            &format!(
                "the sandbox cannot run this command: {}",
                unsupported.reason
            ),
        ))],
    }
}

/// Live output on the card.
fn delta(delta: pb::shell_tool_call_delta::Delta) -> ToolStep {
    ToolStep::Delta(pb::ToolCallDelta {
        delta: Some(pb::tool_call_delta::Delta::ShellToolCallDelta(
            pb::ShellToolCallDelta { delta: Some(delta) },
        )),
    })
}

/// The command exited: its exit code and output (or where the full output went).
fn exited(
    shell: &ShellInput,
    call_id: &str,
    stage: &mut Stage,
    exit: pb::ShellStreamExit,
    env: &ToolEnv,
) -> ToolOutcome {
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
    let command = shell.command.clone();
    let working_directory = if exit.cwd.is_empty() {
        shell.working_directory.clone().unwrap_or_default()
    } else {
        exit.cwd.clone()
    };
    let result = if code == 0 && !exit.aborted {
        pb::shell_result::Result::Success(pb::ShellSuccess {
            command,
            working_directory,
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
            working_directory,
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
    let part = pb::ShellResult {
        result: Some(result),
        ..pb::ShellResult::default()
    };
    done(shell, call_id, part, text, is_error)
}

/// The command moved to the background: where its output goes, and what it printed so far.
fn backgrounded(
    shell: &ShellInput,
    call_id: &str,
    stage: &mut Stage,
    bg: pb::ShellStreamBackgrounded,
    env: &ToolEnv,
) -> ToolOutcome {
    let stdout = std::mem::take(&mut stage.stdout);
    let stderr = std::mem::take(&mut stage.stderr);
    let folder = env.terminals_folder.trim_end_matches('/');
    // Shell id 0: the user moved the command (`background_shell_action`) and the client has not
    // said which shell holds it.
    let mut text = if bg.shell_id == 0 {
        let mut text = "The user moved the command to the background; it keeps running.".to_owned();
        if !folder.is_empty() {
            let _ = write!(
                text,
                " Its output is written to a file in {folder}; read it to check on the command."
            );
        }
        text
    } else {
        let mut text = format!(
            "The command is running in the background (shell id {}",
            bg.shell_id
        );
        if let Some(pid) = bg.pid {
            let _ = write!(text, ", pid {pid}");
        }
        text.push_str(").");
        if !folder.is_empty() {
            let _ = write!(
                text,
                " Its output is written to {folder}/{}.txt; read that file to check on it.",
                bg.shell_id
            );
        }
        text
    };
    let so_far = model_output(&stdout, &stderr, env.max_output_bytes);
    if !so_far.trim().is_empty() {
        let _ = write!(text, "\nOutput so far:\n{so_far}");
    }
    let working_directory = if bg.working_directory.is_empty() {
        shell.working_directory.clone().unwrap_or_default()
    } else {
        bg.working_directory
    };
    let part = pb::ShellResult {
        is_background: Some(true),
        terminals_folder: (!env.terminals_folder.is_empty()).then(|| env.terminals_folder.clone()),
        pid: bg.pid,
        result: Some(pb::shell_result::Result::Success(pb::ShellSuccess {
            command: shell.command.clone(),
            working_directory,
            stdout: stdout.text,
            stderr: stderr.text,
            shell_id: Some(bg.shell_id),
            pid: bg.pid,
            ms_to_wait: bg.ms_to_wait,
            background_reason: bg.reason,
            ..pb::ShellSuccess::default()
        })),
        ..pb::ShellResult::default()
    };
    done(shell, call_id, part, text, false)
}

/// The user moved the running command to the background mid-turn (`background_shell_action`):
/// the card completes as backgrounded with what it printed so far; the client keeps it running.
pub fn moved_by_user(
    shell: &ShellInput,
    call_id: &str,
    stage: &mut Stage,
    env: &ToolEnv,
) -> ToolOutcome {
    let bg = pb::ShellStreamBackgrounded {
        command: shell.command.clone(),
        reason: Some(pb::ShellBackgroundReason::UserRequest as i32),
        ..pb::ShellStreamBackgrounded::default()
    };
    backgrounded(shell, call_id, stage, bg, env)
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

/// The results the client sent for calls that were pending when the user interrupted the run
/// (`interrupted_pending_tool_call_resolutions`): (call id, the result as the model reads it).
pub fn resolutions(list: &pb::InterruptedPendingToolCallResolutions) -> Vec<(String, String)> {
    use pb::interrupted_pending_tool_call_resolution::Resolution as R;
    use pb::shell_result::Result as S;
    let max = crate::config::DEFAULT_TOOL_OUTPUT_MAX_BYTES;
    let run = |exit: i32, stdout: &str, stderr: &str| {
        let mut text = format!("exit code {exit}");
        for (name, out) in [("stdout", stdout), ("stderr", stderr)] {
            if !out.trim().is_empty() {
                let _ = write!(text, "\n{name}:\n{}", truncate_for_model(out, max, 0));
            }
        }
        text
    };
    list.resolutions
        .iter()
        .filter_map(|resolution| {
            let text = match resolution.resolution.as_ref()? {
                R::ShellResult(shell) => match shell.result.as_ref()? {
                    S::Success(ok) => run(ok.exit_code, &ok.stdout, &ok.stderr),
                    S::Failure(failed) => run(failed.exit_code, &failed.stdout, &failed.stderr),
                    other => format!("the command did not run to completion: {other:?}"),
                },
                R::TaskResult(task) => match task.result.as_ref()? {
                    pb::task_result::Result::Success(done) => format!(
                        "the subagent finished{}",
                        done.agent_id
                            .as_deref()
                            .map(|id| format!(" (agent {id})"))
                            .unwrap_or_default()
                    ),
                    pb::task_result::Result::Error(error) => {
                        format!("the subagent failed: {}", error.error)
                    }
                },
            };
            Some((resolution.tool_call_id.clone(), text))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cursor::proto::agent::exec_client_message;
    use crate::tools::tool_result::Stage;
    use crate::tools::tool_result::testing::{ended, env};

    fn shell() -> ShellInput {
        ShellInput::parse(r#"{"command":"echo hi"}"#).unwrap()
    }

    #[test]
    fn output_streams_onto_the_card_and_the_exit_ends_the_call() {
        let (shell, mut stage) = (shell(), Stage::default());
        let stream = |event| {
            exec_client_message::Message::ShellStream(pb::ShellStream { event: Some(event) })
        };
        let out = pb::shell_stream::Event::Stdout(pb::ShellStreamStdout {
            data: "hi\n".into(),
        });
        let steps = shell.on_result("c1", stream(out), &mut stage, &env());
        assert!(matches!(steps.as_slice(), [ToolStep::Delta(_)]));
        let exit = pb::shell_stream::Event::Exit(pb::ShellStreamExit::default());
        let outcome = ended(shell.on_result("c1", stream(exit), &mut stage, &env()));
        assert_eq!(outcome.model_text, "Exit code: 0\nhi\n");
        let Some(tool_call::Tool::ShellToolCall(card)) = outcome.card.tool else {
            panic!("a Shell card")
        };
        let Some(pb::shell_result::Result::Success(success)) = card.result.and_then(|r| r.result)
        else {
            panic!("a success")
        };
        assert_eq!(
            (success.command.as_str(), success.stdout.as_str()),
            ("echo hi", "hi\n")
        );
    }

    #[test]
    fn a_failed_command_is_a_spawn_error_naming_the_command() {
        let outcome = failed(&shell(), "c1", "no shell");
        assert_eq!(outcome.model_text, "Error: no shell");
        let Some(tool_call::Tool::ShellToolCall(card)) = outcome.card.tool else {
            panic!("a Shell card")
        };
        let Some(pb::shell_result::Result::SpawnError(error)) = card.result.and_then(|r| r.result)
        else {
            panic!("a spawn error")
        };
        assert_eq!(
            (error.command.as_str(), error.error.as_str()),
            ("echo hi", "no shell")
        );
    }
}
