//! The user's own command in the agent's shell (`shell_command_action`, the CLI's shell mode): it
//! runs through the client's shell exec under the client's `exec_id` before the run's turn opens,
//! streamed onto a Shell card like any Shell; its command and output then become the user's action
//! in history (told to the model once, on its next call), and the run ends without a model call.
//!
//! Its own file because it is neither a turn phase (no provider call, nothing of the model's) nor
//! the actor's bookkeeping: it is the one run action that executes on the client before history is
//! written, like the request-context exec a CLI client is asked first.

use serde_json::json;

use crate::client::command::{ExecControl, RunAction, RunRequestInput};
use crate::client::downlink::Downlink;
use crate::client::interaction;
use crate::model::runtime_tag::UserAction;
use crate::model::tool::ToolCall;
use crate::tools::ToolRun;
use crate::tools::exec::{ExecKind, ExecPayload, abort};
use crate::tools::tool_result::{ToolEnv, ToolOutcome, ToolStep};

/// The exec id of the user's command: the first of the request (the turn's own go on after).
pub const USER_COMMAND_EXEC_ID: u32 = 1;

/// The `model_call_id` on the command's card: no model made this call.
const USER_CALL: &str = "user-shell";

/// A user's command on its way through the client's shell.
pub struct UserCommand {
    /// The run request, opened as a turn once the command is over.
    request: Box<RunRequestInput>,
    run: ToolRun,
    call_id: String,
    env: ToolEnv,
}

/// What a client message did to the command.
pub enum Progress {
    /// Still running (output went onto the card).
    Running,
    /// Over: the run request, its action now carrying the command's output, ready to open.
    Done(Box<RunRequestInput>),
}

impl UserCommand {
    /// The command of `request`, if it is a `shell_command_action` not yet run: its card is drawn
    /// and the shell exec sent. `Err` gives the request back untouched.
    pub async fn start(
        request: Box<RunRequestInput>,
        max_output_bytes: usize,
        out: &mut Downlink,
    ) -> Result<UserCommand, Box<RunRequestInput>> {
        let RunAction::UserActed(UserAction::RanCommand {
            command,
            exec_id,
            output: None,
        }) = &request.action
        else {
            return Err(request);
        };
        let call = ToolCall {
            call_id: format!("user-shell-{exec_id}"),
            provider_call_id: String::new(),
            name: "Shell".to_owned(),
            arguments: json!({ "command": command }).to_string(),
        };
        let env = ToolEnv {
            terminals_folder: request.terminals_folder.clone(),
            max_output_bytes,
            todos: Vec::new(),
            mode: request.mode,
            mcp: Vec::new().into(),
            conversation_id: request.conversation_id.clone(),
            model_id: String::new(),
        };
        let (run, started, step) = match ToolRun::start(&call, &env) {
            Ok(started) => started,
            Err(rejected) => {
                tracing::warn!(
                    "the user's command could not start: {}",
                    rejected.model_text
                );
                return Err(request);
            }
        };
        out.send_message(&interaction::tool_call_started(
            &call.call_id,
            started,
            USER_CALL,
        ))
        .await;
        let ToolStep::Exec(exec) = step else {
            tracing::error!("a Shell call did not start with an exec");
            return Err(request);
        };
        // Under the client's own id for it, as the action named it.
        let message = exec.into_server_message_under(USER_COMMAND_EXEC_ID, exec_id.clone());
        tracing::info!(exec_id, "running the user's command in the client's shell");
        out.send_message(&message).await;
        Ok(UserCommand {
            request,
            run,
            call_id: call.call_id,
            env,
        })
    }

    /// A result for the command's exec: output onto the card, or its end.
    pub async fn on_result(
        &mut self,
        id: u32,
        payload: ExecPayload,
        out: &mut Downlink,
    ) -> Option<Progress> {
        if id != USER_COMMAND_EXEC_ID {
            return None;
        }
        if payload.kind() != ExecKind::ShellStream {
            let outcome = self
                .run
                .on_wrong_result(ExecKind::ShellStream, payload.kind());
            return Some(self.finish(outcome, out).await);
        }
        for step in self.run.on_result(payload, &self.env) {
            match step {
                ToolStep::Delta(delta) => {
                    out.send_message(&interaction::tool_call_delta(
                        &self.call_id,
                        delta,
                        USER_CALL,
                    ))
                    .await;
                }
                ToolStep::Done(outcome) => return Some(self.finish(outcome, out).await),
                other => tracing::warn!("the user's command asked for {other:?}; ignored"),
            }
        }
        Some(Progress::Running)
    }

    /// `throw` / `stream_close` for the command's exec.
    pub async fn on_control(
        &mut self,
        id: u32,
        control: ExecControl,
        out: &mut Downlink,
    ) -> Option<Progress> {
        if id != USER_COMMAND_EXEC_ID {
            return None;
        }
        let outcome = match control {
            ExecControl::Throw { error } => self.run.on_throw(&error),
            ExecControl::StreamClose => self.run.on_closed_without_result(&self.env),
        };
        Some(self.finish(outcome, out).await)
    }

    /// The run ends while the command runs: it is aborted on the client and its card ends.
    pub async fn abandon(self, reason: &str, out: &mut Downlink) {
        out.send_message(&abort(USER_COMMAND_EXEC_ID)).await;
        let outcome = self.run.abandon(reason);
        out.send_message(&interaction::tool_call_completed(
            &self.call_id,
            outcome.card,
            USER_CALL,
        ))
        .await;
    }

    /// The card completes; the request now carries what the model will be told.
    async fn finish(&mut self, outcome: ToolOutcome, out: &mut Downlink) -> Progress {
        out.send_message(&interaction::tool_call_completed(
            &self.call_id,
            outcome.card,
            USER_CALL,
        ))
        .await;
        let mut request = self.request.clone();
        if let RunAction::UserActed(UserAction::RanCommand { output, .. }) = &mut request.action {
            *output = Some(outcome.model_text);
        }
        request.execs_issued = USER_COMMAND_EXEC_ID;
        Progress::Done(request)
    }
}
