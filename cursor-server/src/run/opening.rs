//! Opening a turn: one opener per run action — a user message (commit it with its runtime
//! messages), a conversation only the client knows (import its roots first), a resume, a summary
//! request, background tasks that ended — each giving the stored history, the checkpoints it
//! continues and the turn's first step.
//!
//! Its own file because `run/loop_engine.rs` cannot hold the openers besides the turn's phases
//! within 800 lines; the import in progress is the turn's `Phase::Importing` data.
//!
//! Length: every opener and the one-commit start of a user's message (the run's record, the base,
//! the message and its blobs in one write transaction, re-read if history moved) share the
//! `Request` and read best together; cutting the openers apart would split one concept.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use super::lifecycle::{Checkpoints, Emission, StartReads, UnsetBase};
use super::turn::{
    ResolvedModel, Turn, default_bytes_per_token, fold_plan, fold_subagent_runs, fold_todos,
    load_images,
};
use crate::client::bidi_append;
use crate::client::command::{ClientInput, ExecControl, RunAction, RunRequestInput};
use crate::client::downlink::Downlink;
use crate::config::{AUTO_MODEL_ID, ModelConfig, ProviderKind};
use crate::error::ProtocolError;
use crate::error::ServerError;
use crate::model::conversation::{AttachedImage, Attachment, BlobId, ImageSource};
use crate::model::conversation::{ImageMime, ImageRef};
use crate::model::conversation::{Mode, SubagentRole, WorkspaceContext};
use crate::model::message::{CanonicalMessage, Origin, UserMessage};
use crate::model::message::{current_mode, latest_compaction};
use crate::model::runtime_tag::RuntimeTag;
use crate::model::usage::Usage;
use crate::prompting::compiler::{self, RequestParameters};
use crate::prompting::images::{self, ImageSet};
use crate::state::AppState;
use crate::store::blobs::Edge;
use crate::store::runs::RunStart;
use crate::store::{self, StoreError, messages, runs};
use crate::sync::blob_sync::KvOutcome;
use crate::sync::checkpoint::ConversationState;
use crate::sync::import;
use crate::sync::projection::Chips;
use crate::tools;
use crate::tools::exec::ExecPayload;
use crate::tools::pending::PendingExecs;
use crate::tools::tool_result::ToolEnv;

/// What every opener knows about the request.
struct Request<'a> {
    app: &'a Arc<AppState>,
    /// The model the run calls, and its provider's family (for the image limits).
    model: &'a ModelConfig,
    provider_kind: ProviderKind,
    request_id: &'a str,
    conversation_id: &'a str,
    mode: Mode,
    subagent: Option<&'a SubagentRole>,
    context: Option<&'a WorkspaceContext>,
    /// What the user attached to the message (empty for other actions), and as Cursor sent it.
    attached: &'a [Attachment],
    /// The images the user attached (an image sent by blob id has been fetched when committed).
    images: &'a [AttachedImage],
    selected_context: Option<&'a Chips>,
    /// Messages the user sent while the agent was busy, delivered with this one.
    prepended: &'a [String],
    /// Results of calls pending at an interrupt, delivered with this message.
    resolved: &'a [(String, String)],
    /// A user's message run's record, written with the message (`messages::append_opening`) so the
    /// run's start is one commit; `started` once it is written.
    start: Option<RunStart<'a>>,
    started: AtomicBool,
    /// Whether the run's opening commit may be left to the caller, to run while the first
    /// provider call is on its way (`PendingOpening`).
    defer: bool,
    /// The start's reads made while the client was asked for its request context: taken only by
    /// the opener of a user's message whose commit is deferred, the one commit that checks that
    /// history did not move since and opens the run again if it did (`open_user_message`).
    prefetched: std::sync::Mutex<Option<Prefetched>>,
}

impl<'a> Request<'a> {
    /// What the run request says, for the openers.
    fn of(
        app: &'a Arc<AppState>,
        (model, provider_kind): (&'a ModelConfig, ProviderKind),
        request_id: &'a str,
        input: &'a RunRequestInput,
    ) -> Request<'a> {
        let (attached, images, selected_context, prepended, resolved) = match &input.action {
            RunAction::UserMessage {
                attached,
                images,
                selected_context,
                prepended,
                resolved,
                ..
            } => (
                attached.as_slice(),
                images.as_slice(),
                selected_context.as_deref(),
                prepended.as_slice(),
                resolved.as_slice(),
            ),
            _ => (&[][..], &[][..], None, &[][..], &[][..]),
        };
        Request {
            app,
            model,
            provider_kind,
            request_id,
            conversation_id: &input.conversation_id,
            mode: input.mode,
            subagent: input.subagent.as_ref(),
            context: input.context.as_ref(),
            attached,
            images,
            selected_context,
            prepended,
            resolved,
            start: None,
            started: AtomicBool::new(false),
            defer: false,
            prefetched: std::sync::Mutex::new(None),
        }
    }

    /// Writes the run's record on its own when it waits for a user's message that will not be
    /// appended (an import, or a run that fails before its message is stored).
    async fn start_alone(&self) -> Result<(), ServerError> {
        if let Some(start) = self.start.filter(|_| !self.started.load(Ordering::Relaxed)) {
            runs::start_as(&self.app.store, &start).await?;
            self.started.store(true, Ordering::Relaxed);
        }
        Ok(())
    }

    /// The reads made ahead (`Prefetched`), once.
    fn take_prefetched(&self) -> Option<Prefetched> {
        let mut held = self
            .prefetched
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        held.take()
    }

    /// Blobs only the client holds that the message needs: attached text and images sent by id.
    fn client_blobs(&self) -> Vec<BlobId> {
        let images = self.images.iter().filter_map(|image| match image.source {
            ImageSource::Blob(id) => Some(id),
            ImageSource::Data(_) => None,
        });
        stored_attachments(self.attached)
            .into_iter()
            .chain(images)
            .collect()
    }
}

/// The blob ids of attached text the client sent by id.
fn stored_attachments(attached: &[Attachment]) -> Vec<BlobId> {
    attached
        .iter()
        .filter_map(|a| match a {
            Attachment::Stored { blob, .. } => Some(*blob),
            _ => None,
        })
        .collect()
}

/// What an opener found: the stored history, the checkpoints the turn continues, where the turn's
/// own messages start, and what the turn does first.
struct Opened {
    history: Vec<CanonicalMessage>,
    checkpoints: Checkpoints,
    turn_start: Option<usize>,
    first: First,
    /// The run's opening, not committed yet (its messages are in `history` already).
    pending: Option<PendingOpening>,
}

/// A turn's first step.
pub(super) enum First {
    /// Fetch blobs only the client has, then call the model.
    Import(Box<Import>),
    Call,
    Resume,
    Summarize,
    /// Nothing to do (every background completion was already told).
    Complete,
}

/// Blobs only the client holds, fetched before the turn starts: the roots of a conversation this
/// server has never seen, and the user's text when Cursor sent it as a blob (`text_blob_id`).
pub(super) struct Import {
    roots: Vec<BlobId>,
    text_blob: Option<BlobId>,
    /// Attached text and images the client sent as blob ids.
    attached_blobs: Vec<BlobId>,
    got: HashMap<BlobId, Option<Vec<u8>>>,
    user_text: String,
    user_message_id: String,
    context: Option<WorkspaceContext>,
    attached: Vec<Attachment>,
    images: Vec<AttachedImage>,
    selected_context: Option<Box<Chips>>,
    prepended: Vec<String>,
    resolved: Vec<(String, String)>,
}

/// The run request of a client that had to be asked for its request context, read again with its
/// answer (`context_exec` is the id the question used; the turn's ids go on after it). A client
/// that threw, refused or answered empty gets its run without a context, and the log says so.
pub(super) fn with_client_context(
    waiting: RunRequestInput,
    answer: Result<ExecPayload, ExecControl>,
    request_id: &str,
    context_exec: u32,
) -> Result<RunRequestInput, ServerError> {
    let context = match answer {
        Ok(payload) => bidi_append::answered_context(payload)?,
        Err(ExecControl::Throw { error }) => {
            tracing::warn!(request_id, %error, "the client threw on the request-context exec; the run goes on without a context");
            None
        }
        Err(ExecControl::StreamClose) => {
            tracing::warn!(
                request_id,
                "the client closed the request-context exec without a result; the run goes on without a context"
            );
            None
        }
    };
    let wait = waiting.ask_context.clone().ok_or_else(|| {
        ServerError::InvalidRequest(
            "a request-context answer for a request that did not ask".into(),
        )
    })?;
    let mut request = match bidi_append::with_context(*wait, context)? {
        ClientInput::RunRequest(request) => request,
        ClientInput::Unsupported(what) => return Err(ProtocolError::Unsupported(what).into()),
        other => {
            return Err(
                ProtocolError::Uplink(format!("the run_request read again as {other:?}")).into(),
            );
        }
    };
    // What the transport added (a subagent's parent) stays.
    if let (Some(role), Some(before)) = (request.subagent.as_mut(), waiting.subagent.as_ref()) {
        role.parent_request_id.clone_from(&before.parent_request_id);
        role.parent_tool_call_id
            .clone_from(&before.parent_tool_call_id);
    }
    request.ask_context = None;
    request.execs_issued = context_exec;
    Ok(*request)
}

/// The request again without the state the client sent: a user's message opened a second time
/// (`TurnLoop::start`) found stored history the first time, so the state is not needed (it only
/// imports a conversation this server has none of), and it is the request's largest part.
pub(super) fn without_client_state(input: &RunRequestInput) -> RunRequestInput {
    let RunRequestInput {
        conversation_id,
        action,
        model_id,
        terminals_folder,
        context,
        mode,
        tools,
        subagent,
        parameters,
        client_state: _,
        ask_context,
        execs_issued,
    } = input;
    RunRequestInput {
        conversation_id: conversation_id.clone(),
        action: action.clone(),
        model_id: model_id.clone(),
        terminals_folder: terminals_folder.clone(),
        context: context.clone(),
        mode: *mode,
        tools: tools.clone(),
        subagent: subagent.clone(),
        parameters: parameters.clone(),
        client_state: None,
        ask_context: ask_context.clone(),
        execs_issued: *execs_issued,
    }
}

/// What a run start may do ahead of its order: leave its opening commit to run while its first
/// provider call is on its way (`defer`, a user's message without `[auth]`), and use reads made
/// while the client was asked for its request context (`reads`).
#[derive(Default)]
pub(super) struct Ahead {
    pub defer: bool,
    pub reads: Option<Prefetched>,
}

/// Records the run and commits what the action brings; returns the run and the turn's first step.
pub(super) async fn open(
    app: Arc<AppState>,
    request_id: &str,
    input: RunRequestInput,
    out: &mut Downlink,
    ahead: Ahead,
) -> Result<(Turn, First, Option<PendingOpening>), ServerError> {
    let requested = input
        .model_id
        .clone()
        .unwrap_or_else(|| AUTO_MODEL_ID.to_owned());
    let ResolvedModel {
        provider,
        model,
        parameters,
        route,
    } = ResolvedModel::of(&app.config, &requested, &input)?;
    tracing::Span::current()
        .record("provider", tracing::field::display(&provider.name))
        .record("model", tracing::field::display(&model.id));
    let model_id = model.id.clone();
    let person =
        crate::auth::runs::person_for_conversation(&app, request_id, &input.conversation_id)
            .await?;
    let start = RunStart {
        request_id,
        conversation_id: &input.conversation_id,
        model_id: &model_id,
        requested_model: &requested,
        node: app.cluster.as_ref().map(|c| c.node_name()),
        person: person.as_deref(),
    };
    log_subagent(request_id, &input.conversation_id, input.subagent.as_ref());
    let mut request = Request::of(&app, (&model, provider.kind), request_id, &input);
    request.start = start_unless_with_message(&app, start, &input.action).await?;
    (request.defer, request.prefetched) = (ahead.defer, ahead.reads.into());
    let mut opened = open_first(&request, &input, out).await?;
    let pending = opened.pending.take();
    let mode = mode_of(&input, &opened);
    let (system, mode_tools) = compiler::prompt_for(&app.prompts, mode, input.subagent.as_ref());
    let mut tool_options = input.tools;
    tool_options.web_search &= app.config.web_search.is_some();
    let images = history_images(&app, &opened.history, pending.as_ref()).await?;
    let turn = Turn {
        images,
        request_id: request_id.to_owned(),
        parameters: RequestParameters::from_pairs(&parameters),
        pending: PendingExecs::after(input.execs_issued),
        tool_env: ToolEnv {
            terminals_folder: input.terminals_folder,
            max_output_bytes: app.config.tool_output_max_bytes,
            todos: fold_todos(&opened.history),
            mode,
            mcp: tool_options.mcp.clone().into(),
            conversation_id: input.conversation_id,
            model_id,
        },
        usage: Usage::default(),
        last_call_usage: None,
        system,
        offered_tools: tools::offered_tools(mode_tools, &tool_options),
        tool_options,
        subagent: input.subagent,
        subagent_runs: fold_subagent_runs(&opened.history),
        plan: fold_plan(&opened.history),
        turn_start: opened.turn_start.unwrap_or(opened.history.len()),
        compactions: latest_compaction(&opened.history).map_or(0, |(_, n, _)| n),
        last_body_bytes: 0,
        bytes_per_token: default_bytes_per_token(),
        provider_calls: 0,
        model_call_id: String::new(),
        history: opened.history,
        checkpoints: opened.checkpoints,
        provider,
        model,
        route,
        app,
    };
    Ok((turn, opened.first, pending))
}

/// The images `history` names, read from the store. A run whose opening is still pending is
/// recorded on its own when they cannot be read, so that its failure is.
async fn history_images(
    app: &AppState,
    history: &[CanonicalMessage],
    pending: Option<&PendingOpening>,
) -> Result<ImageSet, ServerError> {
    let mut images = ImageSet::default();
    if let Err(error) = load_images(&app.store, &mut images, history).await {
        if let Some(pending) = pending {
            pending.start.write_alone(&app.store).await?;
        }
        return Err(error);
    }
    Ok(images)
}

/// The run's mode: the user's message says it; any other action goes on in the mode history (or
/// the checkpoint) left, else the client's.
fn mode_of(input: &RunRequestInput, opened: &Opened) -> Mode {
    match input.action {
        RunAction::UserMessage { .. } => input.mode,
        _ => current_mode(&opened.history)
            .or(opened.checkpoints.previous_mode())
            .unwrap_or(input.mode),
    }
}

/// A user's message starts the run in the transaction that stores it (returned, to be written
/// then); any other action starts it here.
async fn start_unless_with_message<'a>(
    app: &AppState,
    start: RunStart<'a>,
    action: &RunAction,
) -> Result<Option<RunStart<'a>>, ServerError> {
    if matches!(action, RunAction::UserMessage { .. }) {
        return Ok(Some(start));
    }
    runs::start_as(&app.store, &start).await?;
    Ok(None)
}

/// Opens the run's action; a conversation another run wrote to while this one read it is read
/// again (the run's start and first messages were not stored).
async fn open_first(
    request: &Request<'_>,
    input: &RunRequestInput,
    out: &mut Downlink,
) -> Result<Opened, ServerError> {
    // From here the run may write the conversation's history: it is no longer new.
    request.app.history.started(request.conversation_id);
    let client_state = input.client_state.as_deref();
    let mut attempts = 0;
    loop {
        match open_action(request, &input.action, client_state, out).await {
            Err(ServerError::Store(StoreError::HistoryMoved { .. })) if attempts < 3 => {
                attempts += 1;
                tracing::info!(
                    request_id = request.request_id,
                    attempts,
                    "the conversation changed while the run opened; reading it again"
                );
            }
            Err(error) => {
                // The run is recorded, so its ending is.
                request.start_alone().await?;
                return Err(error);
            }
            Ok(opened) => return Ok(opened),
        }
    }
}

fn log_subagent(request_id: &str, conversation_id: &str, role: Option<&SubagentRole>) {
    if let Some(role) = role {
        tracing::info!(
            request_id,
            conversation_id,
            subagent_type = %role.type_name,
            parent_request_id = role.parent_request_id.as_deref().unwrap_or(""),
            parent_tool_call_id = role.parent_tool_call_id.as_deref().unwrap_or(""),
            "subagent run"
        );
    }
}

/// Picks the opener for the run's action.
async fn open_action(
    request: &Request<'_>,
    action: &RunAction,
    client_state: Option<&ConversationState>,
    out: &mut Downlink,
) -> Result<Opened, ServerError> {
    let (store, history) = (&request.app.store, &request.app.history);
    // A conversation the client holds a state of is imported when nothing of it is stored: the
    // history cache answers for a conversation it holds messages of (every IDE turn after the
    // first sends its state), without a read before the run start's reads.
    let importing = client_state.is_some()
        && !history.holds_messages(request.conversation_id)
        && !messages::any(store, request.conversation_id).await?;
    match action {
        RunAction::UserMessage {
            text,
            message_id,
            text_blob,
            ..
        } if text_blob.is_some() || importing || !request.client_blobs().is_empty() => {
            request.start_alone().await?;
            let state = client_state.filter(|_| importing);
            open_import(request, text, message_id, *text_blob, state, out).await
        }
        RunAction::UserMessage {
            text, message_id, ..
        } => open_user_message(request, text, message_id, out).await,
        RunAction::Resume => open_stored(request, First::Resume).await,
        RunAction::Summarize => open_stored(request, First::Summarize).await,
        RunAction::QuestionAnswered { call_id, answer } => {
            let tag = compiler::late_answer_tag(call_id, answer);
            open_background(request, std::slice::from_ref(&tag), out).await
        }
        RunAction::UserActed(action) => {
            let tag = compiler::user_action_tag(action);
            let opened = open_background(request, std::slice::from_ref(&tag), out).await?;
            // Told, not asked: the model is not called.
            Ok(Opened {
                first: First::Complete,
                ..opened
            })
        }
        RunAction::CancelSubagent { .. } | RunAction::MoveToBackground { .. } => {
            Err(ServerError::InvalidRequest(
                "a run action the run actor handles itself reached a turn".to_owned(),
            ))
        }
        RunAction::BackgroundTasksEnded(completions) => {
            let tags: Vec<RuntimeTag> = completions.iter().map(compiler::background_tag).collect();
            open_background(request, &tags, out).await
        }
    }
}

/// The conversation's stored history and the checkpoints projected from it (the mode's system
/// prompt is the first root of a conversation new to the graph).
async fn stored(
    request: &Request<'_>,
    client_state: Option<&ConversationState>,
) -> Result<(Vec<CanonicalMessage>, Checkpoints), ServerError> {
    stored_with(request, client_state, None, None).await
}

/// `stored`; with `unset_base`, a base the conversation lacks is left there to be stored with the
/// run's first messages; with `prefetched`, the reads are those made ahead.
async fn stored_with(
    request: &Request<'_>,
    client_state: Option<&ConversationState>,
    unset_base: Option<&mut Option<UnsetBase>>,
    prefetched: Option<Prefetched>,
) -> Result<(Vec<CanonicalMessage>, Checkpoints), ServerError> {
    let app = request.app;
    let Prefetched { rows, reads } = match prefetched {
        Some(prefetched) => prefetched,
        None => Prefetched::read(app, request.conversation_id).await?,
    };
    let (system, _) = compiler::prompt_for(&app.prompts, request.mode, request.subagent);
    let checkpoints = Checkpoints::open(
        (app.store.clone(), reads),
        request.conversation_id,
        request.request_id,
        client_state,
        (&rows, &app.history),
        &system,
        unset_base,
    )
    .await?;
    Ok((
        rows.into_iter().map(|row| row.message).collect(),
        checkpoints,
    ))
}

/// A run start's reads of the store: the conversation's history and the rest (`StartReads`), at
/// once. Made ahead (`Prefetched::read` in a task of its own) while a CLI client is asked for its
/// request context, they are as good as reads made after for a user's message whose opening
/// commit is deferred: that commit checks that history did not move since, and the run opens
/// again from the store if it did (`TurnLoop::start`). Other openers read afresh.
pub(super) struct Prefetched {
    rows: Vec<messages::Stored>,
    reads: StartReads,
}

impl Prefetched {
    /// What the reads give for a conversation the store has nothing of, not read: for a
    /// conversation taken as new (`RunActor::read_ahead`: the store had no row of it). The
    /// deferred opening commit is the check (`messages::append_opening`): it finds history moved
    /// when the conversation has a message or a base other than the one this run sets. A base
    /// with this one's id is what the reads would have given (it covers no message), and a
    /// checkpoint, blobs owed or acknowledged come only after a base. Runtime events are then new
    /// too (`commit_user_message`).
    pub(super) fn new_conversation() -> Prefetched {
        Prefetched {
            rows: Vec::new(),
            reads: StartReads::default(),
        }
    }

    pub(super) async fn read(
        app: &AppState,
        conversation_id: &str,
    ) -> Result<Prefetched, ServerError> {
        let (rows, reads) = tokio::try_join!(
            async {
                let rows = app.history.rows(&app.store, conversation_id).await;
                rows.map_err(ServerError::from)
            },
            StartReads::read(&app.store, &app.history, conversation_id),
        )?;
        Ok(Prefetched { rows, reads })
    }
}

/// A conversation (or a user text) only the client has: its roots become our history first.
async fn open_import(
    request: &Request<'_>,
    text: &str,
    message_id: &str,
    text_blob: Option<BlobId>,
    client_state: Option<&ConversationState>,
    out: &mut Downlink,
) -> Result<Opened, ServerError> {
    let (_, mut checkpoints) = stored(request, client_state).await?;
    let roots = if client_state.is_some() {
        checkpoints.fetch_roots(out).await
    } else {
        Vec::new()
    };
    if let Some(id) = text_blob {
        checkpoints.fetch(id, out).await;
    }
    let attached_blobs = request.client_blobs();
    for id in &attached_blobs {
        checkpoints.fetch(*id, out).await;
    }
    let import = Import {
        roots,
        text_blob,
        attached_blobs,
        got: HashMap::new(),
        user_text: text.to_owned(),
        user_message_id: message_id.to_owned(),
        context: request.context.cloned(),
        attached: request.attached.to_vec(),
        images: request.images.to_vec(),
        selected_context: request.selected_context.cloned().map(Box::new),
        prepended: request.prepended.to_vec(),
        resolved: request.resolved.to_vec(),
    };
    Ok(Opened {
        history: Vec::new(),
        checkpoints,
        turn_start: None,
        first: First::Import(Box::new(import)),
        pending: None,
    })
}

/// A new user message: committed with its runtime messages, and the model called (the commit may
/// be left to run while the call is on its way: `PendingOpening`).
async fn open_user_message(
    request: &Request<'_>,
    text: &str,
    message_id: &str,
    out: &mut Downlink,
) -> Result<Opened, ServerError> {
    let mut unset_base = None;
    let deferring = request.start.is_some().then_some(&mut unset_base);
    let prefetched = (request.defer && deferring.is_some())
        .then(|| request.take_prefetched())
        .flatten();
    let (mut history, mut checkpoints) = stored_with(request, None, deferring, prefetched).await?;
    let turn_start = Some(history.len());
    let user = UserMessage {
        images: Vec::new(),
        shown_as: None,
        state_before: checkpoints.previous_head(),
        origin: Origin::User,
        text: text.to_owned(),
        client_message_id: message_id.to_owned(),
        mode: Some(request.mode),
        runtime: None,
    };
    let (_, pending) = commit_user_message(
        request,
        (&mut history, &mut checkpoints),
        user,
        unset_base,
        out,
    )
    .await?;
    Ok(Opened {
        history,
        checkpoints,
        turn_start,
        first: First::Call,
        pending,
    })
}

/// Resume and summarize: the stored history and the checkpoints where the conversation stopped.
async fn open_stored(request: &Request<'_>, first: First) -> Result<Opened, ServerError> {
    let (history, checkpoints) = stored(request, None).await?;
    Ok(Opened {
        history,
        checkpoints,
        turn_start: None,
        first,
        pending: None,
    })
}

/// Background tasks ended: the model is told once per task (runtime messages) and continues.
async fn open_background(
    request: &Request<'_>,
    tags: &[RuntimeTag],
    out: &mut Downlink,
) -> Result<Opened, ServerError> {
    let app = request.app;
    let (conversation_id, request_id) = (request.conversation_id, request.request_id);
    let (mut history, mut checkpoints) = stored(request, None).await?;
    let turn_start = Some(history.len());
    let appended =
        messages::append_with_tags(&app.store, conversation_id, request_id, &[], &[], tags).await?;
    checkpoints.committed(&appended, out).await?;
    let told = !appended.is_empty();
    history.extend(appended);
    Ok(Opened {
        history,
        checkpoints,
        turn_start,
        // Every completion already told: nothing new for the model.
        first: if told { First::Call } else { First::Complete },
        pending: None,
    })
}

impl Import {
    /// Records one KV read; returns whether every blob is in.
    pub fn on_read(&mut self, read: Option<KvOutcome>, request_id: &str) -> bool {
        match read {
            Some(KvOutcome::Fetched { id, data }) => {
                self.got.insert(id, Some(data));
            }
            Some(KvOutcome::Missing(id)) => {
                tracing::warn!(request_id, blob = %id, "the client does not have a root it listed; left out");
                self.got.insert(id, None);
            }
            _ => {}
        }
        self.roots
            .iter()
            .chain(&self.text_blob)
            .chain(&self.attached_blobs)
            .all(|id| self.got.contains_key(id))
    }

    /// The attachments with the text of those the client sent as blobs; one it could not produce
    /// (or that is not text) stays `Stored` and is named to the model as not shown.
    fn resolve_attached(&self, request_id: &str) -> Vec<Attachment> {
        self.attached
            .iter()
            .map(|attachment| match attachment {
                Attachment::Stored { label, blob } => {
                    match self.got.get(blob).cloned().flatten().map(String::from_utf8) {
                        Some(Ok(content)) => Attachment::Text {
                            label: label.clone(),
                            content,
                        },
                        _ => {
                            tracing::warn!(request_id, %blob, "attached context the client could not send as text; named to the model");
                            attachment.clone()
                        }
                    }
                }
                other => other.clone(),
            })
            .collect()
    }

    /// The images with the bytes of those the client sent as blobs; one it could not produce is
    /// named to the model as not shown.
    fn resolve_images(
        &self,
        request_id: &str,
        attached: &mut Vec<Attachment>,
    ) -> Vec<AttachedImage> {
        let mut images = Vec::with_capacity(self.images.len());
        for image in &self.images {
            let ImageSource::Blob(blob) = image.source else {
                images.push(image.clone());
                continue;
            };
            match self.got.get(&blob).cloned().flatten() {
                Some(data) => images.push(AttachedImage {
                    source: ImageSource::Data(data),
                    ..image.clone()
                }),
                None => {
                    tracing::warn!(request_id, %blob, "an attached image the client could not send; named to the model");
                    attached.push(Attachment::Unshown {
                        kind: "image the client could not send".to_owned(),
                        name: image.name.clone(),
                    });
                }
            }
        }
        images
    }

    /// The user's text: as sent, or from its blob.
    fn user_text(&self) -> Result<String, ServerError> {
        let Some(id) = self.text_blob else {
            return Ok(self.user_text.clone());
        };
        match self.got.get(&id).cloned().flatten() {
            Some(data) => String::from_utf8(data).map_err(|_| {
                ProtocolError::Kv(format!("the user message's text blob {id} is not UTF-8")).into()
            }),
            None => Err(ProtocolError::Kv(format!(
                "the client does not have the user message's text blob {id}"
            ))
            .into()),
        }
    }

    /// The fetched roots as AI SDK JSON (roots that are not JSON are left out).
    fn root_values(&self, request_id: &str) -> Vec<serde_json::Value> {
        self.roots
            .iter()
            .filter_map(|id| self.got.get(id).cloned().flatten())
            .filter_map(|data| match serde_json::from_slice(&data) {
                Ok(json) => Some(json),
                Err(e) => {
                    tracing::warn!(request_id, "an imported root is not JSON ({e}); left out");
                    None
                }
            })
            .collect()
    }

    /// All roots are in: they become stored history, then the user's message is committed and the
    /// turn begins as usual.
    pub async fn finish(self, turn: &mut Turn, out: &mut Downlink) -> Result<(), ServerError> {
        let user_text = self.user_text()?;
        let roots = self.root_values(&turn.request_id);
        let missing: Vec<BlobId> = self
            .roots
            .iter()
            .filter(|id| matches!(self.got.get(id), Some(None)))
            .copied()
            .collect();
        let known = compiler::ImportKnown::new(&turn.app.prompts, self.context.as_ref());
        let imported = import::import_roots(&roots, &known);
        if !self.roots.is_empty() {
            tracing::info!(
                roots = roots.len(),
                messages = imported.len(),
                "imported a conversation from the client"
            );
        }
        turn.append(&imported).await?;
        turn.history = messages::load(&turn.app.store, turn.conversation_id()).await?;
        // The client's roots stand for the imported messages: they are the graph's base.
        turn.checkpoints
            .imported(&missing, turn.history.len(), &turn.system)
            .await?;
        turn.turn_start = turn.history.len();
        self.commit(turn, user_text, out).await
    }

    async fn commit(
        self,
        turn: &mut Turn,
        user_text: String,
        out: &mut Downlink,
    ) -> Result<(), ServerError> {
        let app = Arc::clone(&turn.app);
        let request_id = turn.request_id.clone();
        let conversation_id = turn.conversation_id().to_owned();
        let mut attached = self.resolve_attached(&request_id);
        let images = self.resolve_images(&request_id, &mut attached);
        let request = Request {
            app: &app,
            model: &turn.model,
            provider_kind: turn.provider.kind,
            request_id: &request_id,
            conversation_id: &conversation_id,
            mode: turn.mode(),
            subagent: None,
            context: self.context.as_ref(),
            attached: &attached,
            images: &images,
            selected_context: self.selected_context.as_deref(),
            prepended: &self.prepended,
            resolved: &self.resolved,
            start: None,
            started: AtomicBool::new(true),
            defer: false,
            prefetched: std::sync::Mutex::new(None),
        };
        let user = UserMessage {
            images: Vec::new(),
            shown_as: None,
            state_before: turn.checkpoints.previous_head(),
            origin: Origin::User,
            text: user_text,
            client_message_id: self.user_message_id.clone(),
            mode: Some(turn.mode()),
            runtime: None,
        };
        let (appended, _) = commit_user_message(
            &request,
            (&mut turn.history, &mut turn.checkpoints),
            user,
            None,
            out,
        )
        .await?;
        turn.tool_env.todos = fold_todos(&turn.history);
        turn.load_images(&appended).await?;
        Ok(())
    }
}

/// Appends the user's message with its runtime messages in one transaction: the workspace context
/// before it when the model has not seen that context yet, the mode notice and the mode's reminder
/// after it; what the user attached just before it, and the turn's user-message blob with the
/// attachments' chips first. `history` (the stored history before the message) is extended with
/// what was stored, which is returned; their blobs are stored and sent. A run that starts with the
/// message is recorded in the same transaction, with the base `unset_base` of a conversation new
/// to the graph and the messages' blobs: its start is one commit. That commit is returned instead,
/// not made, when the request may defer it (`PendingOpening`); `history` has the messages then too.
async fn commit_user_message(
    request: &Request<'_>,
    (history, checkpoints): (&mut Vec<CanonicalMessage>, &mut Checkpoints),
    mut user: UserMessage,
    unset_base: Option<UnsetBase>,
    out: &mut Downlink,
) -> Result<(Vec<CanonicalMessage>, Option<PendingOpening>), ServerError> {
    let (app, request_id) = (request.app, request.request_id);
    if let Some(selected) = request.selected_context {
        user.shown_as = Some(
            checkpoints
                .stash_user_message(&user, selected.clone())
                .await?,
        );
    }
    let mut attached = request.attached.to_vec();
    user.images = store_images(request, &mut attached).await?;
    let mode = user.mode.unwrap_or_default();
    let before: Vec<RuntimeTag> = request
        .context
        .and_then(|context| compiler::context_tag(history, context, request_id))
        .into_iter()
        .chain(compiler::resolved_call_tags(request.resolved))
        .chain(compiler::queued_message_tags(request.prepended, request_id))
        .chain(compiler::attachments_tag(&attached, request_id))
        .collect();
    let after = compiler::user_message_tags(&app.prompts, current_mode(history), mode, request_id);
    let user = [CanonicalMessage::User(user)];
    let Some(start) = request
        .start
        .filter(|_| !request.started.load(Ordering::Relaxed))
    else {
        let (conversation_id, store) = (request.conversation_id, &app.store);
        let appended =
            messages::append_with_tags(store, conversation_id, request_id, &before, &user, &after)
                .await?;
        history.extend_from_slice(&appended);
        checkpoints.committed(&appended, out).await?;
        return Ok((appended, None));
    };
    // Which runtime events are new is read before the run owns the conversation (none is consumed
    // in a history without messages); the write checks that history did not move since, so it
    // still holds.
    let (before, after) = if history.is_empty() {
        (before, after)
    } else {
        messages::unconsumed_around(&app.store, request.conversation_id, before, after).await?
    };
    let entering: Vec<CanonicalMessage> = before
        .iter()
        .map(RuntimeTag::message)
        .chain(user.iter().cloned())
        .chain(after.iter().map(RuntimeTag::message))
        .collect();
    let (_, emission) = checkpoints.entering(&entering).await?;
    let pending = PendingOpening {
        start: StartRecord::of(&start),
        base: unset_base,
        read: history.len(),
        emission,
        messages: (before, user, after),
    };
    // Not with `[auth]`: the commit is where the run takes the conversation for its person (a
    // call leaving before it could carry another person's history, read in between), and the
    // call's budget gate counts the person's runs in progress, this one's record among them.
    let deferred = request.defer && app.auth.is_none();
    history.extend_from_slice(&entering);
    if deferred {
        return Ok((entering, Some(pending)));
    }
    pending
        .commit(&app.store, checkpoints, out)
        .await
        .map_err(|(error, _)| error)?;
    request.started.store(true, Ordering::Relaxed);
    Ok((entering, None))
}

/// A run's opening (its record, the base, the user's message with its runtime messages and
/// their blobs: one write transaction) not committed yet. The run's first provider call is sent
/// first and the commit runs while the provider prepares its answer (`TurnLoop::start`): on this
/// machine the commit is ten statements, each a round trip to the database, and waiting for it
/// was about 0.9 ms of a new conversation's time to first token. Nothing reaches the client
/// before the commit: its blobs are sent after it, and the run reads no provider event before
/// then; a failed commit drops the call. Only without `[auth]` (`commit_user_message`).
pub(super) struct PendingOpening {
    pub(super) start: StartRecord,
    base: Option<UnsetBase>,
    /// The number of messages the run read (`messages::Opening::read`).
    read: usize,
    emission: Emission,
    /// The runtime messages before the user's message, the message, those after it.
    messages: (Vec<RuntimeTag>, [CanonicalMessage; 1], Vec<RuntimeTag>),
}

impl PendingOpening {
    /// Commits the opening, then sends its blobs to the client. On failure, the run's record to
    /// write on its own (so its failure is recorded).
    pub(super) async fn commit(
        self,
        store: &store::Store,
        checkpoints: &mut Checkpoints,
        out: &mut Downlink,
    ) -> Result<(), (ServerError, StartRecord)> {
        let (before, user, after) = &self.messages;
        let committed = {
            let edges = self.emission.edges();
            let opening = messages::Opening {
                start: self.start.as_start(),
                base: self.base.as_ref().map(UnsetBase::write),
                read: self.read,
                blobs: &self.emission.rows(&edges),
                sent: &self.emission.sent,
            };
            messages::append_opening(store, &opening, before, user, after).await
        };
        match committed {
            Ok(_) => {
                checkpoints.delivered(self.emission, out).await;
                Ok(())
            }
            Err(error) => Err((error.into(), self.start)),
        }
    }
}

/// A run's record (`RunStart`) owned, for a commit made after the request that named it is gone.
pub(super) struct StartRecord {
    request_id: String,
    conversation_id: String,
    model_id: String,
    requested_model: String,
    node: Option<String>,
    person: Option<String>,
}

impl StartRecord {
    fn of(start: &RunStart<'_>) -> StartRecord {
        StartRecord {
            request_id: start.request_id.to_owned(),
            conversation_id: start.conversation_id.to_owned(),
            model_id: start.model_id.to_owned(),
            requested_model: start.requested_model.to_owned(),
            node: start.node.map(str::to_owned),
            person: start.person.map(str::to_owned),
        }
    }

    fn as_start(&self) -> RunStart<'_> {
        RunStart {
            request_id: &self.request_id,
            conversation_id: &self.conversation_id,
            model_id: &self.model_id,
            requested_model: &self.requested_model,
            node: self.node.as_deref(),
            person: self.person.as_deref(),
        }
    }

    /// Records the run on its own: its opening was not committed.
    pub(super) async fn write_alone(&self, store: &store::Store) -> Result<(), ServerError> {
        runs::start_as(store, &self.as_start()).await?;
        Ok(())
    }
}

/// Stores the attached images' bytes as blobs and returns what the user message keeps of them. The
/// format is read from the bytes (the label can be wrong); one no provider takes is named to the
/// model instead; one too large (or too many) for the run's provider family is a clear error, before
/// anything is stored.
async fn store_images(
    request: &Request<'_>,
    attached: &mut Vec<Attachment>,
) -> Result<Vec<ImageRef>, ServerError> {
    let request_id = request.request_id;
    let mut refs = Vec::with_capacity(request.images.len());
    let mut blobs: Vec<(BlobId, &[u8])> = Vec::with_capacity(request.images.len());
    for image in request.images {
        let ImageSource::Data(data) = &image.source else {
            continue;
        };
        let Some(mime) = ImageMime::sniff(data) else {
            tracing::warn!(request_id, name = %image.name, labelled = %image.labelled, "an attached image is not PNG, JPEG, GIF or WebP; named to the model");
            attached.push(Attachment::Unshown {
                kind: format!("image ({}, not PNG, JPEG, GIF or WebP)", image.labelled),
                name: image.name.clone(),
            });
            continue;
        };
        if !image.labelled.is_empty() && !image.labelled.eq_ignore_ascii_case(mime.as_str()) {
            tracing::info!(request_id, name = %image.name, labelled = %image.labelled, actual = mime.as_str(), "an attached image's label does not match its bytes; sent as what it is");
        }
        let blob = BlobId::of(data);
        refs.push(ImageRef {
            blob,
            mime,
            bytes: data.len() as u64,
            name: image.name.clone(),
        });
        blobs.push((blob, data));
    }
    let (app, model) = (request.app, request.model);
    images::check_message(request.provider_kind.family().image_limits(), &refs).map_err(
        |reason| ServerError::InvalidRequest(format!("Cannot send the images: {reason}.")),
    )?;
    if !refs.is_empty() && !model.vision {
        tracing::warn!(request_id, model = %model.id, images = refs.len(), "the user attached images but the model is configured vision = false; it is told their names instead");
    }
    let rows: Vec<(BlobId, &[u8], &[Edge<'_>])> = blobs
        .iter()
        .map(|(id, data)| (*id, *data, &[][..]))
        .collect();
    store::blobs::put_all(&app.store, &rows).await?;
    Ok(refs)
}
