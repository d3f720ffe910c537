//! What the transports tell a run: client inputs (already translated from protobuf by `cursor/`),
//! downlink attachment, and transport-level failures.

use tokio::sync::oneshot;

use crate::client::downlink::DownlinkSink;
use crate::cursor::connect::ConnectError;
use crate::cursor::proto::agent::{AgentRunRequest, UserMessageAction};
use crate::error::ProtocolError;
use crate::model::conversation::{AttachedImage, Attachment, BlobId};
use crate::model::conversation::{Mode, SubagentRole, WorkspaceContext};
use crate::model::runtime_tag::{BackgroundCompletion, BackgroundKind, UserAction};
use crate::sync::blob_sync::KvPayload;
use crate::sync::checkpoint::ConversationState;
use crate::sync::projection::Chips;
use crate::tools::ToolOptions;
use crate::tools::exec::{ExecPayload, QueryPayload};

/// One client message, in protocol terms the loop understands.
#[derive(Debug, Clone, PartialEq)]
pub enum ClientInput {
    /// `run_request` with a user message: starts the turn.
    RunRequest(Box<RunRequestInput>),
    /// `conversation_action.cancel_action`: the user pressed stop.
    Cancel,
    /// `client_heartbeat` / exec control heartbeats: liveness only.
    Heartbeat,
    /// `prewarm_request`: a hint that a run is coming; nothing to do.
    Prewarm,
    /// A result for exec `id` (`ExecClientMessage`), opaque to the loop.
    ExecResult { id: u32, payload: ExecPayload },
    /// `stream_close` / `throw` for exec `id`.
    ExecControl { id: u32, control: ExecControl },
    /// A KV answer (`kv_client_message`) for KV request `id`, opaque to the loop.
    KvResult { id: u32, payload: KvPayload },
    /// An `interaction_response` for query `id`, opaque to the loop.
    InteractionResponse { id: u32, payload: QueryPayload },
    /// A `conversation_action` on a run already going (not its opening run_request): the user
    /// moved a call to the background or canceled a subagent; the turn goes on.
    LiveAction(LiveAction),
    /// A conversation action that cannot apply to a run already going (a user message, a
    /// resume): refused with a WARN, and the turn goes on.
    NotApplicable(String),
    /// A client message or action this server does not handle yet; ends the run with a clear error.
    Unsupported(String),
    /// A message that decoded but breaks the protocol (an exec message without a result, a
    /// run_request without a conversation): ends the run with `invalid_argument`.
    Invalid(ProtocolError),
    /// A message whose variant this schema does not know (a newer client's): logged and ignored.
    Unknown(String),
}

/// What the user does to a run while it goes on (`conversation_action` on its uplink).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LiveAction {
    /// `background_shell_action` / `background_subagent_action`: the running call `tool_call_id`
    /// goes on in the background; its card completes as backgrounded and the turn goes on.
    MoveToBackground {
        tool_call_id: String,
        kind: BackgroundKind,
    },
    /// `cancel_subagent_action`: that subagent's run stops; the parent's turn goes on.
    CancelSubagent { subagent_id: String },
}

/// Exec control messages from the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecControl {
    /// The exec's stream is over (after a terminal result, or instead of one).
    StreamClose,
    /// The client failed to execute it.
    Throw { error: String },
}

/// What a `run_request` asks for.
#[derive(Debug, Clone, PartialEq)]
pub enum RunAction {
    /// A new user message starts a turn.
    UserMessage {
        text: String,
        message_id: String,
        /// Cursor sent the text as a blob (`text_blob_id`): fetched with KV GET first.
        text_blob: Option<BlobId>,
        /// What the user attached (`selected_context`), as the model reads it.
        attached: Vec<Attachment>,
        /// The images the user attached (`selected_context.selected_images`).
        images: Vec<AttachedImage>,
        /// The same, as Cursor sent it: the turn's user message keeps it (the chips).
        selected_context: Option<Box<Chips>>,
        /// Messages the user sent while the agent was busy (`prepend_user_messages`): the model
        /// reads them, in order, before this one.
        prepended: Vec<String>,
        /// Tool calls pending at an interrupt that finished after all
        /// (`interrupted_pending_tool_call_resolutions`): (call id, the result as text).
        resolved: Vec<(String, String)>,
    },
    /// Continue the conversation where it stopped (an interrupted tool batch) without a new message.
    Resume,
    /// Background tasks the model started (subagents, shells) ended: the model is told, once per
    /// task, and continues.
    BackgroundTasksEnded(Vec<BackgroundCompletion>),
    /// The user answered an AskQuestion (call `call_id`) after its run ended: the model is told,
    /// once, and continues.
    QuestionAnswered { call_id: String, answer: String },
    /// The user asked to summarize the conversation now (`summarize_action`): compact its history.
    Summarize,
    /// The user did something the model is told of once, without a model call.
    UserActed(UserAction),
    /// The user canceled a subagent (`cancel_subagent_action`): its run, if this server has it
    /// running, is stopped; the turn running on this conversation is left alone.
    CancelSubagent { subagent_id: String },
    /// The user moved a running Shell or Task call to the background (`background_shell_action`,
    /// `background_subagent_action`). The client moves the process and reports it on the call's
    /// own stream; the turn running on the conversation is left alone.
    MoveToBackground {
        tool_call_id: String,
        kind: BackgroundKind,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub struct RunRequestInput {
    pub conversation_id: String,
    pub action: RunAction,
    /// `requested_model.model_id`, else `model_details.model_id`; `None` = the configured default.
    pub model_id: Option<String>,
    /// `request_context.env.terminals_folder`: where backgrounded shell output goes.
    pub terminals_folder: String,
    /// The rest of `request_context` the model should know (`None`: the client sent none).
    pub context: Option<WorkspaceContext>,
    /// The mode the user picked (`user_message.mode`); a resumed run keeps the conversation's.
    pub mode: Mode,
    /// Tools this request allows beyond the mode's own (client switches, MCP tools).
    pub tools: ToolOptions,
    /// Set when another agent's Task call started this run.
    pub subagent: Option<SubagentRole>,
    /// `requested_model.parameters` as (id, value) pairs (reasoning effort, fast, ...).
    pub parameters: Vec<(String, String)>,
    /// The checkpoint the client holds for this conversation, used only to import a conversation
    /// this server has never seen (its own history is the source of truth otherwise).
    pub client_state: Option<Box<ConversationState>>,
    /// Set when a user message came without `request_context` (a CLI client): the run asks the
    /// client for it (`request_context_args`) before anything else, then reads the request again.
    pub ask_context: Option<Box<ContextWait>>,
    /// Exec ids the request used before its turn began (the request-context exec).
    pub execs_issued: u32,
}

/// A user message's run_request that came without `request_context` (a CLI client), kept as sent
/// until the client has answered `request_context_args`; `client::bidi_append::with_context` then
/// reads it again, with the context.
#[derive(Debug, Clone, PartialEq)]
pub struct ContextWait {
    pub request: Box<AgentRunRequest>,
    pub action: Box<UserMessageAction>,
}

/// Fired once the client input it travels with has been applied — a tool result persisted, an ACK
/// recorded — so the BidiAppend that carried it is answered only then: a 200 survives a crash.
/// `refuse` answers it with an error instead (a seqno the inbox cannot hold, or the run ended with
/// the append still waiting behind a gap); dropped unfired, the append is answered `not_found`.
#[derive(Debug, Default)]
pub struct Applied(Option<oneshot::Sender<Result<(), ConnectError>>>);

impl Applied {
    pub fn new() -> (Applied, oneshot::Receiver<Result<(), ConnectError>>) {
        let (tx, rx) = oneshot::channel();
        (Applied(Some(tx)), rx)
    }

    pub fn done(self) {
        if let Some(tx) = self.0 {
            let _ = tx.send(Ok(()));
        }
    }

    pub fn refuse(self, error: ConnectError) {
        if let Some(tx) = self.0 {
            let _ = tx.send(Err(error));
        }
    }
}

/// Messages to a run's actor.
#[derive(Debug)]
pub enum RunCommand {
    /// A client message from the HTTP/2 `Run` stream, already in protocol order.
    Ordered(ClientInput),
    /// A client message from `BidiAppend`, to be ordered by its `append_seqno`; `applied` fires
    /// once the run has applied it.
    Appended {
        seqno: i64,
        input: ClientInput,
        applied: Applied,
    },
    /// A RunSSE response body wants the run's downlink frames.
    AttachDownlink(DownlinkSink),
    /// The uplink broke (malformed frame); the run ends with this protocol error.
    UplinkFailed(ProtocolError),
    /// The client's request stream broke (HTTP/2 reset, dropped connection): the run is canceled.
    ClientGone,
}
