//! The uplink: `BidiAppendRequest` decoding (hex `data`, request id, `append_seqno`) and the translation
//! of an `AgentClientMessage` into the loop's `ClientInput`. Both transports use `translate`.
//!
//! Length: one translation per client message and per conversation action (opening a run or on a
//! run already going), with their unit tests beside them; about a third of the file is tests.

use crate::client::command::{
    ClientInput, ContextWait, ExecControl, LiveAction, RunAction, RunRequestInput,
};
use crate::cursor::connect::{WireError, decode_message};
use crate::cursor::proto::agent::{
    self as pb, AgentClientMessage, agent_client_message, conversation_action,
    exec_client_control_message, exec_client_message::Message, exec_server_message,
};
use crate::cursor::proto::aiserver::BidiAppendRequest;
use crate::error::ProtocolError;
use crate::model::conversation::BlobId;
use crate::model::conversation::{Mode, SubagentRole};
use crate::model::runtime_tag::{
    BackgroundCompletion, BackgroundKind, BackgroundOutcome, UserAction,
};
use crate::sync::blob_sync::KvPayload;
use crate::sync::checkpoint;
use crate::sync::checkpoint::ConversationState;
use crate::sync::projection::Chips;
use crate::tools::exec::{self, ExecPayload, ExecRequest};
use crate::tools::{ToolOptions, interactive};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BidiAppendError {
    #[error("{0}")]
    Wire(#[from] WireError),
    #[error("missing request_id")]
    EmptyRequestId,
    #[error("data is not valid hex: {0}")]
    BadHex(String),
    #[error("data does not decode as agent.v1.AgentClientMessage: {0}")]
    BadMessage(String),
    #[error("negative append_seqno {0}")]
    NegativeSeqno(i64),
}

/// A decoded, validated BidiAppend.
#[derive(Debug, Clone, PartialEq)]
pub struct Append {
    pub request_id: String,
    pub seqno: i64,
    pub message: AgentClientMessage,
}

/// Decodes the protobuf payload of a BidiAppend body.
pub fn decode(payload: &[u8]) -> Result<Append, BidiAppendError> {
    decode_from(payload, None)
}

/// [`decode`], noting what the client (of `client_version`, from its headers) sent that the schema does
/// not know (`ops/drift.rs`).
pub fn decode_from(
    payload: &[u8],
    client_version: Option<&str>,
) -> Result<Append, BidiAppendError> {
    let request: BidiAppendRequest = decode_message(payload, "aiserver.v1.BidiAppendRequest")?;
    let request_id = request
        .request_id
        .map(|id| id.request_id)
        .filter(|id| !id.trim().is_empty())
        .ok_or(BidiAppendError::EmptyRequestId)?;
    if request.append_seqno < 0 {
        return Err(BidiAppendError::NegativeSeqno(request.append_seqno));
    }
    let bytes = decode_hex(request.data.trim()).map_err(BidiAppendError::BadHex)?;
    let message = <AgentClientMessage as prost::Message>::decode(bytes.as_slice())
        .map_err(|e| BidiAppendError::BadMessage(e.to_string()))?;
    crate::ops::drift::observe(&bytes, client_version);
    Ok(Append {
        request_id,
        seqno: request.append_seqno,
        message,
    })
}

/// The value of each ASCII hex digit, `INVALID` for every other byte.
const HEX_VALUES: [u8; 256] = {
    let mut table = [INVALID; 256];
    let mut i = 0;
    while i < 10 {
        table[b'0' as usize + i] = i as u8;
        i += 1;
    }
    let mut i = 0;
    while i < 6 {
        table[b'a' as usize + i] = 10 + i as u8;
        table[b'A' as usize + i] = 10 + i as u8;
        i += 1;
    }
    table
};
const INVALID: u8 = 0xff;

/// Decodes BidiAppend `data` (hex, either case). One table lookup per digit: a run request
/// carries the conversation's whole state (34 KB at turn 300, 68 KB of hex), and the hex crate's
/// digit-by-digit `Result`s took about 3.5 ns a byte of it before the run could start.
fn decode_hex(text: &str) -> Result<Vec<u8>, String> {
    let digits = text.as_bytes();
    if !digits.len().is_multiple_of(2) {
        return Err(format!("odd number of digits ({})", digits.len()));
    }
    let mut bytes = vec![0; digits.len() / 2];
    for (i, (byte, pair)) in bytes.iter_mut().zip(digits.chunks_exact(2)).enumerate() {
        let (high, low) = (HEX_VALUES[pair[0] as usize], HEX_VALUES[pair[1] as usize]);
        // A digit's value is under 16; `INVALID` has its high bits set.
        if (high | low) & 0xf0 != 0 {
            let at = if high == INVALID { 2 * i } else { 2 * i + 1 };
            let found = text[at..].chars().next().unwrap_or_default();
            return Err(format!("invalid character {found:?} at position {at}"));
        }
        *byte = high << 4 | low;
    }
    Ok(bytes)
}

/// What the run gets for a client message that decoded: its translation, or — when the message
/// is one the run cannot use — `ClientInput::Invalid`, so that it still takes its place in the
/// run's ordered inbox (a BidiAppend answered 400 would leave a gap every later append waits
/// behind). Both transports use it; only wire and hex errors are refused at the door.
pub fn input(message: AgentClientMessage) -> ClientInput {
    translate(message).unwrap_or_else(ClientInput::Invalid)
}

/// Translates a client message into the loop's terms. Nothing is dropped silently: messages the
/// server does not handle become `ClientInput::Unsupported` with their name, a message whose
/// variant this schema does not know (a newer client's) becomes `ClientInput::Unknown`.
pub fn translate(message: AgentClientMessage) -> Result<ClientInput, ProtocolError> {
    use agent_client_message::Message;
    let Some(message) = message.message else {
        return Ok(ClientInput::Unknown(
            "an AgentClientMessage with no message this schema knows (a newer client's variant?)"
                .to_owned(),
        ));
    };
    match message {
        Message::RunRequest(request) => run_request(request),
        Message::ConversationAction(action) => Ok(conversation_action(action)),
        Message::ExecClientMessage(result) => exec_result(result),
        Message::ExecClientControlMessage(control) => exec_control(control),
        Message::KvClientMessage(kv) => kv_result(kv),
        Message::InteractionResponse(response) => interaction_response(response),
        Message::ClientHeartbeat(_) => Ok(ClientInput::Heartbeat),
        Message::PrewarmRequest(_) => Ok(ClientInput::Prewarm),
    }
}

/// What every run action takes from the `run_request` itself.
struct RequestBasics {
    conversation_id: String,
    model_id: Option<String>,
    parameters: Vec<(String, String)>,
    client_state: Option<Box<ConversationState>>,
}

impl RequestBasics {
    fn of(request: &pb::AgentRunRequest) -> Result<Self, ProtocolError> {
        let conversation_id = request
            .conversation_id
            .clone()
            .filter(|id| !id.is_empty())
            .ok_or(ProtocolError::MissingConversationId)?;
        let model_id = request
            .requested_model
            .as_ref()
            .map(|m| m.model_id.clone())
            .filter(|id| !id.is_empty())
            .or_else(|| {
                request
                    .model_details
                    .as_ref()
                    .map(|m| m.model_id.clone())
                    .filter(|id| !id.is_empty())
            });
        let client_state = request
            .conversation_state
            .clone()
            .filter(|state| !state.root_prompt_messages_json.is_empty())
            .map(|state| Box::new(ConversationState::from(state)));
        let parameters = request
            .requested_model
            .as_ref()
            .map(|m| {
                m.parameters
                    .iter()
                    .map(|p| (p.id.clone(), p.value.clone()))
                    .collect()
            })
            .unwrap_or_default();
        Ok(RequestBasics {
            conversation_id,
            model_id,
            parameters,
            client_state,
        })
    }
}

/// A `run_request`, by the action it carries.
fn run_request(mut request: pb::AgentRunRequest) -> Result<ClientInput, ProtocolError> {
    use conversation_action::Action;
    let basics = RequestBasics::of(&request)?;
    let subagent_type = request.subagent_type_name.as_deref();
    Ok(match request.action.take().and_then(|a| a.action) {
        Some(Action::UserMessageAction(action)) => user_message_run(&request, action, basics)?,
        Some(Action::BackgroundTaskCompletionAction(action)) => {
            match background_completions(&action) {
                Ok(completions) => contextless_run(
                    &request,
                    RunAction::BackgroundTasksEnded(completions),
                    None,
                    basics,
                ),
                Err(message) => ClientInput::Unsupported(message),
            }
        }
        Some(Action::SummarizeAction(_)) => contextless_run(
            &request,
            RunAction::Summarize,
            crate::client::selected_context::subagent_role(subagent_type, None),
            basics,
        ),
        Some(Action::ResumeAction(_)) => contextless_run(
            &request,
            RunAction::Resume,
            crate::client::selected_context::subagent_role(subagent_type, None),
            basics,
        ),
        Some(Action::CancelAction(_)) => ClientInput::Cancel,
        Some(Action::AsyncAskQuestionCompletionAction(action)) => {
            match interactive::late_answer_text(&action) {
                Some(answer) => contextless_run(
                    &request,
                    RunAction::QuestionAnswered {
                        call_id: action.original_tool_call_id.clone(),
                        answer,
                    },
                    None,
                    basics,
                ),
                None => ClientInput::Unsupported(
                    "async_ask_question_completion_action without an answer".to_owned(),
                ),
            }
        }
        Some(Action::ShellCommandAction(action)) => match ran_command(action) {
            Some(ran) => contextless_run(&request, ran, None, basics),
            None => ClientInput::Unsupported("shell_command_action without a command".to_owned()),
        },
        Some(Action::CancelSubagentAction(action)) => {
            let cancel = RunAction::CancelSubagent {
                subagent_id: action.subagent_id,
            };
            contextless_run(&request, cancel, None, basics)
        }
        Some(Action::BackgroundShellAction(action)) => contextless_run(
            &request,
            moved(action.tool_call_id, BackgroundKind::Shell),
            None,
            basics,
        ),
        Some(Action::BackgroundSubagentAction(action)) => {
            let moved = moved(action.tool_call_id, BackgroundKind::Subagent);
            contextless_run(&request, moved, None, basics)
        }
        Some(Action::StartPlanAction(action)) => {
            user_message_run(&request, interactive::start_plan_message(action), basics)?
        }
        Some(Action::ExecutePlanAction(action)) => {
            user_message_run(&request, interactive::execute_plan_message(action), basics)?
        }
        None => ClientInput::Unsupported("run_request without an action".to_owned()),
    })
}

/// A `shell_command_action`: the command the user ran (`None` without one).
fn ran_command(action: pb::ShellCommandAction) -> Option<RunAction> {
    let command = action.shell_command.map(|c| c.command)?;
    if command.trim().is_empty() {
        return None;
    }
    Some(RunAction::UserActed(UserAction::RanCommand {
        command,
        exec_id: action.exec_id,
        output: None,
    }))
}

/// A call the user moved to the background.
fn moved(tool_call_id: String, kind: BackgroundKind) -> RunAction {
    RunAction::MoveToBackground { tool_call_id, kind }
}

/// A `user_message_action`: a new turn, with the request context (workspace, rules, the client's
/// tool switches).
fn user_message_run(
    request: &pb::AgentRunRequest,
    action: pb::UserMessageAction,
    basics: RequestBasics,
) -> Result<ClientInput, ProtocolError> {
    let ask_context = action.request_context.is_none().then(|| {
        Box::new(ContextWait {
            request: Box::new(request.clone()),
            action: Box::new(action.clone()),
        })
    });
    let prepended = prepended_texts(&action);
    let resolved = action
        .interrupted_pending_tool_call_resolutions
        .as_ref()
        .map(crate::tools::shell::resolutions)
        .unwrap_or_default();
    let user = action.user_message.unwrap_or_default();
    let mode = match checkpoint::mode_of(user.mode) {
        Ok(mode) => mode,
        Err(message) => return Ok(ClientInput::Unsupported(message)),
    };
    // A text blob stands for the text only when the text itself is empty.
    let text_blob = text_blob_id(user.text_blob_id.as_deref())?.filter(|_| user.text.is_empty());
    let (mut attached, mut images) = (Vec::new(), Vec::new());
    if let Some(context) = &user.selected_context {
        attached = crate::client::selected_context::attachments(context);
        images = crate::client::selected_context::images(context, &mut attached);
    }
    let run_action = RunAction::UserMessage {
        text: user.text,
        message_id: user.message_id,
        text_blob,
        attached,
        images,
        selected_context: user
            .selected_context
            .map(|context| Box::new(Chips::from(context))),
        prepended,
        resolved,
    };
    let context = action.request_context.as_ref();
    let terminals_folder = context
        .and_then(|c| c.env.as_ref())
        .map(|env| env.terminals_folder.clone())
        .unwrap_or_default();
    let subagent = crate::client::selected_context::subagent_role(
        request.subagent_type_name.as_deref(),
        context,
    );
    let mut tools = crate::client::selected_context::user_message_tools(request, context);
    if let Some(role) = &subagent {
        tools.restrict_to(role);
    }
    Ok(ClientInput::RunRequest(Box::new(RunRequestInput {
        conversation_id: basics.conversation_id,
        action: run_action,
        model_id: basics.model_id,
        terminals_folder,
        context: context.map(crate::client::selected_context::workspace_context),
        mode,
        tools,
        subagent,
        parameters: basics.parameters,
        client_state: basics.client_state,
        ask_context,
        execs_issued: 0,
    })))
}

/// The exec that asks a client for its request context (not a tool: it adds no history).
pub fn context_request() -> ExecRequest {
    ExecRequest::new(exec_server_message::Message::RequestContextArgs(
        pb::RequestContextArgs::default(),
    ))
}

/// The request context in the client's answer; `None` (logged) when it reported an error, refused
/// or sent none. A result of another kind breaks the protocol.
pub fn answered_context(payload: ExecPayload) -> Result<Option<pb::RequestContext>, ProtocolError> {
    use pb::request_context_result::Result as R;
    let Message::RequestContextResult(result) = *payload.0 else {
        return Err(ProtocolError::Exec(format!(
            "the request-context exec got a {} result",
            payload.kind()
        )));
    };
    let context = match result.result {
        Some(R::Success(success)) => success.request_context,
        Some(R::Error(error)) => {
            tracing::warn!(error = %error.error, "the client could not give its request context; the run goes on without it");
            return Ok(None);
        }
        Some(R::Rejected(rejected)) => {
            tracing::warn!(reason = %rejected.reason, "the client refused to give its request context; the run goes on without it");
            return Ok(None);
        }
        None => None,
    };
    if context.is_none() {
        tracing::warn!(
            "the client answered the request-context exec empty; the run goes on without it"
        );
    }
    Ok(context)
}

/// The run request read again with the context the client gave (`None`: it gave none, and the run
/// goes on without one).
pub fn with_context(
    wait: ContextWait,
    context: Option<pb::RequestContext>,
) -> Result<ClientInput, ProtocolError> {
    let mut action = *wait.action;
    action.request_context = Some(context.unwrap_or_default());
    let basics = RequestBasics::of(&wait.request)?;
    user_message_run(&wait.request, action, basics)
}

/// The texts of `prepend_user_messages`; the action's fields this server does not act on are
/// logged, never dropped without a word.
fn prepended_texts(action: &pb::UserMessageAction) -> Vec<String> {
    if action.conversation_history.is_some() {
        tracing::warn!(
            "user_message_action.conversation_history is not used: the server's own history is the source of truth"
        );
    }
    action
        .prepend_user_messages
        .iter()
        .map(|m| m.text.clone())
        .filter(|t| !t.trim().is_empty())
        .collect()
}

/// `user_message.text_blob_id`, which must be a blob id when present.
fn text_blob_id(id: Option<&[u8]>) -> Result<Option<BlobId>, ProtocolError> {
    match id {
        None | Some([]) => Ok(None),
        Some(id) => BlobId::from_slice(id).map(Some).ok_or_else(|| {
            ProtocolError::Uplink(format!(
                "user_message.text_blob_id is {} bytes, not a 32-byte blob id",
                id.len()
            ))
        }),
    }
}

/// A run without a new user message (resume, summarize, background tasks ended): the client sends
/// no request context with these, so there is no workspace and no tool switches, and the
/// conversation keeps its mode.
fn contextless_run(
    request: &pb::AgentRunRequest,
    action: RunAction,
    subagent: Option<SubagentRole>,
    basics: RequestBasics,
) -> ClientInput {
    let mut tools = ToolOptions::without_context(crate::client::selected_context::mcp_tools(
        &request.mcp_tools,
        [request.mcp_file_system_options.as_ref(), None],
    ));
    if let Some(role) = &subagent {
        tools.restrict_to(role);
    }
    ClientInput::RunRequest(Box::new(RunRequestInput {
        conversation_id: basics.conversation_id,
        action,
        model_id: basics.model_id,
        terminals_folder: String::new(),
        context: None,
        mode: Mode::default(),
        tools,
        subagent,
        parameters: basics.parameters,
        client_state: basics.client_state,
        ask_context: None,
        execs_issued: 0,
    }))
}

/// A `conversation_action` outside a run request, i.e. on a run already going: stop, moving a
/// running call to the background and canceling a subagent apply to it; any other action is
/// refused without ending the turn.
fn conversation_action(action: pb::ConversationAction) -> ClientInput {
    use conversation_action::Action;
    match action.action {
        Some(Action::CancelAction(_)) => ClientInput::Cancel,
        Some(Action::BackgroundShellAction(action)) => {
            ClientInput::LiveAction(LiveAction::MoveToBackground {
                tool_call_id: action.tool_call_id,
                kind: BackgroundKind::Shell,
            })
        }
        Some(Action::BackgroundSubagentAction(action)) => {
            ClientInput::LiveAction(LiveAction::MoveToBackground {
                tool_call_id: action.tool_call_id,
                kind: BackgroundKind::Subagent,
            })
        }
        Some(Action::CancelSubagentAction(action)) => {
            ClientInput::LiveAction(LiveAction::CancelSubagent {
                subagent_id: action.subagent_id,
            })
        }
        Some(other) => ClientInput::NotApplicable(format!(
            "conversation_action {} on a run already going (it can only open a run)",
            action_name(&other)
        )),
        None => ClientInput::NotApplicable("conversation_action without an action".to_owned()),
    }
}

fn exec_result(result: pb::ExecClientMessage) -> Result<ClientInput, ProtocolError> {
    let payload = result.message.ok_or_else(|| {
        ProtocolError::Uplink(format!(
            "exec_client_message {} carries no result",
            result.id
        ))
    })?;
    Ok(ClientInput::ExecResult {
        id: result.id,
        payload: exec::ExecPayload(Box::new(payload)),
    })
}

fn exec_control(control: pb::ExecClientControlMessage) -> Result<ClientInput, ProtocolError> {
    use exec_client_control_message::Message;
    match control.message {
        Some(Message::StreamClose(close)) => Ok(ClientInput::ExecControl {
            id: close.id,
            control: ExecControl::StreamClose,
        }),
        Some(Message::Throw(throw)) => Ok(ClientInput::ExecControl {
            id: throw.id,
            control: ExecControl::Throw { error: throw.error },
        }),
        Some(Message::Heartbeat(_)) => Ok(ClientInput::Heartbeat),
        None => Err(ProtocolError::Uplink(
            "exec_client_control_message with no message set".to_owned(),
        )),
    }
}

fn kv_result(kv: pb::KvClientMessage) -> Result<ClientInput, ProtocolError> {
    let result = kv.message.ok_or_else(|| {
        ProtocolError::Uplink(format!("kv_client_message {} carries no result", kv.id))
    })?;
    Ok(ClientInput::KvResult {
        id: kv.id,
        payload: KvPayload(Box::new(result)),
    })
}

fn interaction_response(response: pb::InteractionResponse) -> Result<ClientInput, ProtocolError> {
    let result = response.result.ok_or_else(|| {
        ProtocolError::Uplink(format!(
            "interaction_response {} carries no result",
            response.id
        ))
    })?;
    Ok(ClientInput::InteractionResponse {
        id: response.id,
        payload: exec::QueryPayload(Box::new(result)),
    })
}

/// Records the parent run and Task call a subagent's BidiAppend names in its headers.
pub fn link_parent(
    input: &mut ClientInput,
    parent_request_id: Option<&str>,
    parent_tool_call_id: Option<&str>,
) {
    if let ClientInput::RunRequest(request) = input
        && let Some(role) = request.subagent.as_mut()
    {
        let present = |v: Option<&str>| {
            v.map(str::trim)
                .filter(|v| !v.is_empty())
                .map(str::to_owned)
        };
        role.parent_request_id = present(parent_request_id);
        role.parent_tool_call_id = present(parent_tool_call_id);
    }
}

fn background_completions(
    action: &pb::BackgroundTaskCompletionAction,
) -> Result<Vec<BackgroundCompletion>, String> {
    if action.completions.is_empty() {
        return Err("background_task_completion_action without completions".to_owned());
    }
    action
        .completions
        .iter()
        .map(|c| {
            let kind = match pb::BackgroundTaskKind::try_from(c.kind) {
                Ok(pb::BackgroundTaskKind::Subagent) => BackgroundKind::Subagent,
                Ok(pb::BackgroundTaskKind::Shell) => BackgroundKind::Shell,
                _ => {
                    return Err(format!(
                        "background task {} of unknown kind {}",
                        c.task_id, c.kind
                    ));
                }
            };
            let outcome = match pb::BackgroundTaskStatus::try_from(c.status) {
                Ok(pb::BackgroundTaskStatus::Success) => BackgroundOutcome::Succeeded,
                Ok(pb::BackgroundTaskStatus::Error) => BackgroundOutcome::Failed,
                Ok(pb::BackgroundTaskStatus::Aborted) => BackgroundOutcome::Aborted,
                _ => {
                    return Err(format!(
                        "background task {} with unknown status {}",
                        c.task_id, c.status
                    ));
                }
            };
            Ok(BackgroundCompletion {
                task_id: c.task_id.clone(),
                kind,
                outcome,
                title: c.title.clone(),
                detail: c.detail.clone().filter(|d| !d.trim().is_empty()),
                output_path: c.output_path.clone().filter(|p| !p.trim().is_empty()),
            })
        })
        .collect()
}

fn action_name(action: &conversation_action::Action) -> &'static str {
    use conversation_action::Action;
    match action {
        Action::UserMessageAction(_) => "user_message_action",
        Action::ResumeAction(_) => "resume_action",
        Action::CancelAction(_) => "cancel_action",
        Action::SummarizeAction(_) => "summarize_action",
        Action::ShellCommandAction(_) => "shell_command_action",
        Action::StartPlanAction(_) => "start_plan_action",
        Action::ExecutePlanAction(_) => "execute_plan_action",
        Action::AsyncAskQuestionCompletionAction(_) => "async_ask_question_completion_action",
        Action::CancelSubagentAction(_) => "cancel_subagent_action",
        Action::BackgroundTaskCompletionAction(_) => "background_task_completion_action",
        Action::BackgroundShellAction(_) => "background_shell_action",
        Action::BackgroundSubagentAction(_) => "background_subagent_action",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run_request(action: conversation_action::Action) -> AgentClientMessage {
        AgentClientMessage {
            message: Some(agent_client_message::Message::RunRequest(
                pb::AgentRunRequest {
                    conversation_id: Some("c1".to_owned()),
                    requested_model: Some(pb::RequestedModel {
                        model_id: "m1".to_owned(),
                        ..Default::default()
                    }),
                    subagent_type_name: Some("explore".to_owned()),
                    action: Some(pb::ConversationAction {
                        action: Some(action),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
            )),
        }
    }

    fn user_message(message: pb::UserMessage) -> AgentClientMessage {
        run_request(conversation_action::Action::UserMessageAction(
            pb::UserMessageAction {
                user_message: Some(message),
                ..Default::default()
            },
        ))
    }

    fn request_input(input: ClientInput) -> RunRequestInput {
        match input {
            ClientInput::RunRequest(request) => *request,
            other => panic!("not a run request: {other:?}"),
        }
    }

    #[test]
    fn a_user_message_starts_a_turn_with_the_request_basics() {
        let message = user_message(pb::UserMessage {
            text: "hi".to_owned(),
            message_id: "u1".to_owned(),
            ..Default::default()
        });
        let input = request_input(translate(message).expect("translates"));
        assert_eq!(input.conversation_id, "c1");
        assert_eq!(input.model_id.as_deref(), Some("m1"));
        assert_eq!(
            input.action,
            RunAction::UserMessage {
                text: "hi".to_owned(),
                message_id: "u1".to_owned(),
                text_blob: None,
                attached: Vec::new(),
                images: Vec::new(),
                selected_context: None,
                prepended: Vec::new(),
                resolved: Vec::new(),
            }
        );
        assert_eq!(input.mode, Mode::Agent);
        assert!(input.context.is_none());
        let role = input.subagent.expect("subagent role");
        assert_eq!(role.type_name, "explore");
    }

    #[test]
    fn a_text_blob_stands_for_the_text_only_when_the_text_is_empty() {
        let id = vec![7u8; 32];
        let with_text = user_message(pb::UserMessage {
            text: "hi".to_owned(),
            text_blob_id: Some(id.clone()),
            ..Default::default()
        });
        let input = request_input(translate(with_text).expect("translates"));
        assert!(matches!(
            input.action,
            RunAction::UserMessage {
                text_blob: None,
                ..
            }
        ));
        let blob_only = user_message(pb::UserMessage {
            text_blob_id: Some(id.clone()),
            ..Default::default()
        });
        let input = request_input(translate(blob_only).expect("translates"));
        assert!(matches!(
            input.action,
            RunAction::UserMessage { text_blob: Some(blob), .. } if blob == BlobId::from_slice(&id).expect("32 bytes")
        ));
        let short = user_message(pb::UserMessage {
            text_blob_id: Some(vec![1, 2, 3]),
            ..Default::default()
        });
        assert_eq!(
            translate(short).expect_err("not a blob id").to_string(),
            "request stream: user_message.text_blob_id is 3 bytes, not a 32-byte blob id"
        );
    }

    #[test]
    fn runs_without_a_user_message_have_no_context_and_keep_the_subagent_role() {
        let resume = run_request(conversation_action::Action::ResumeAction(
            pb::ResumeAction::default(),
        ));
        let input = request_input(translate(resume).expect("translates"));
        assert_eq!(input.action, RunAction::Resume);
        assert!(input.context.is_none());
        assert!(input.terminals_folder.is_empty());
        assert_eq!(input.subagent.expect("role").type_name, "explore");
        let summarize = run_request(conversation_action::Action::SummarizeAction(
            pb::SummarizeAction::default(),
        ));
        let input = request_input(translate(summarize).expect("translates"));
        assert_eq!(input.action, RunAction::Summarize);
    }

    #[test]
    fn background_completions_without_any_are_unsupported_and_drop_the_subagent_role() {
        let empty = run_request(conversation_action::Action::BackgroundTaskCompletionAction(
            pb::BackgroundTaskCompletionAction::default(),
        ));
        assert_eq!(
            translate(empty).expect("translates"),
            ClientInput::Unsupported(
                "background_task_completion_action without completions".to_owned()
            )
        );
        let one = run_request(conversation_action::Action::BackgroundTaskCompletionAction(
            pb::BackgroundTaskCompletionAction {
                completions: vec![pb::BackgroundTaskCompletion {
                    task_id: "t1".to_owned(),
                    kind: pb::BackgroundTaskKind::Shell as i32,
                    status: pb::BackgroundTaskStatus::Success as i32,
                    ..Default::default()
                }],
            },
        ));
        let input = request_input(translate(one).expect("translates"));
        assert!(matches!(input.action, RunAction::BackgroundTasksEnded(ref c) if c.len() == 1));
        assert!(input.subagent.is_none());
    }

    #[test]
    fn a_run_request_without_a_conversation_id_is_a_protocol_error() {
        let mut message = run_request(conversation_action::Action::CancelAction(
            pb::CancelAction::default(),
        ));
        if let Some(agent_client_message::Message::RunRequest(request)) = &mut message.message {
            request.conversation_id = None;
        }
        assert_eq!(
            translate(message).expect_err("no conversation"),
            ProtocolError::MissingConversationId
        );
    }

    #[test]
    fn a_command_without_text_is_unsupported_and_a_stray_cancel_is_a_cancel() {
        let shell = run_request(conversation_action::Action::ShellCommandAction(
            pb::ShellCommandAction::default(),
        ));
        assert_eq!(
            translate(shell).expect("translates"),
            ClientInput::Unsupported("shell_command_action without a command".to_owned())
        );
        let cancel = AgentClientMessage {
            message: Some(agent_client_message::Message::ConversationAction(
                pb::ConversationAction {
                    action: Some(conversation_action::Action::CancelAction(
                        pb::CancelAction::default(),
                    )),
                    ..Default::default()
                },
            )),
        };
        assert_eq!(translate(cancel).expect("translates"), ClientInput::Cancel);
    }

    #[test]
    fn results_without_a_payload_are_protocol_errors() {
        let exec = AgentClientMessage {
            message: Some(agent_client_message::Message::ExecClientMessage(
                pb::ExecClientMessage {
                    id: 4,
                    ..Default::default()
                },
            )),
        };
        assert_eq!(
            translate(exec).expect_err("empty").to_string(),
            "request stream: exec_client_message 4 carries no result"
        );
        let kv = AgentClientMessage {
            message: Some(agent_client_message::Message::KvClientMessage(
                pb::KvClientMessage {
                    id: 5,
                    ..Default::default()
                },
            )),
        };
        assert_eq!(
            translate(kv).expect_err("empty").to_string(),
            "request stream: kv_client_message 5 carries no result"
        );
        let control = AgentClientMessage {
            message: Some(agent_client_message::Message::ExecClientControlMessage(
                pb::ExecClientControlMessage::default(),
            )),
        };
        assert_eq!(
            translate(control).expect_err("empty").to_string(),
            "request stream: exec_client_control_message with no message set"
        );
    }

    #[test]
    fn data_decodes_as_hex_in_either_case_and_bad_digits_are_named_with_their_place() {
        let bytes: Vec<u8> = (0..=255u8).chain((0..=255u8).rev()).collect();
        let lower = hex::encode(&bytes);
        assert_eq!(decode_hex(&lower), Ok(bytes.clone()));
        assert_eq!(decode_hex(&lower.to_uppercase()), Ok(bytes));
        assert_eq!(decode_hex(""), Ok(Vec::new()));
        assert_eq!(
            decode_hex("0a1"),
            Err("odd number of digits (3)".to_owned())
        );
        assert_eq!(
            decode_hex("0a1g"),
            Err("invalid character 'g' at position 3".to_owned())
        );
        assert_eq!(
            decode_hex("x0"),
            Err("invalid character 'x' at position 0".to_owned())
        );
        assert_eq!(
            decode_hex("00é"),
            Err("invalid character 'é' at position 2".to_owned())
        );
    }
}
