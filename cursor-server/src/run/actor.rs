//! One `RunActor` task per request id. It owns everything mutable about the run — the seqno inbox,
//! the downlink, the turn loop — and is reached only through its command channel.
//!
//! Length: one actor, one state machine — client input in seqno order, the three endings, the
//! settling after `turn_ended` and the answers owed to appends all touch the same fields and are
//! read together; cut apart they would pass the actor's state back and forth.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;

use super::inbox::{Accepted, Inbox, InboxError};
use super::lifecycle::{self, RunEnd};
use super::loop_engine::{LoopEvent, LoopStep, TurnLoop};
use super::opening;
use super::registry::{Lookup, Opener, RegistryError, RunControl, RunHandle};
use super::user_command::{Progress, UserCommand};
use crate::client::bidi_append;
use crate::client::command::{
    Applied, ClientInput, ExecControl, LiveAction, RunAction, RunCommand, RunRequestInput,
};
use crate::client::downlink::{Awaited, Downlink};
use crate::cursor::connect::{self, ConnectCode, ConnectError};
use crate::error::{ProtocolError, ServerError};
use crate::model::conversation::Mode;
use crate::model::usage::Usage;
use crate::ops::metrics::{self, Transport};
use crate::state::AppState;
use crate::store::runs::{self, RunOutcome, RunStatus};
use crate::tools::exec::ExecPayload;

enum State {
    AwaitingRunRequest,
    /// A user message came without its request context (a CLI client): the client was asked for it
    /// (exec `CONTEXT_EXEC_ID`) and nothing else happens until it answers, but the start's reads
    /// (`RunActor::read_ahead`).
    AwaitingContext {
        request: Box<RunRequestInput>,
        reads: Option<ReadAhead>,
    },
    /// The user's own command (`shell_command_action`) runs in the client's shell; its turn opens
    /// once it is over.
    UserCommand(Box<UserCommand>),
    Running(Box<TurnLoop>),
}

/// What a user's message's run start knows of the store before it opens (`RunActor::read_ahead`),
/// where its deferred opening commit checks that history did not move since.
enum ReadAhead {
    /// The start's reads, running in a task of their own while the client answers.
    Reading(tokio::task::JoinHandle<Result<opening::Prefetched, ServerError>>),
    /// Nothing to read: the client sends no state and the store has no message of the
    /// conversation, as this node knows, so it is taken as new
    /// (`opening::Prefetched::new_conversation`).
    New,
}

/// The exec id of the request-context exec: the first of the request (the turn's own go on after).
const CONTEXT_EXEC_ID: u32 = 1;

pub struct RunActor {
    app: Arc<AppState>,
    request_id: String,
    commands: mpsc::Receiver<RunCommand>,
    /// Its input gate (closed when the run ends) and its stop signal.
    control: Arc<RunControl>,
    /// Every client message of the run, in `append_seqno` order, for its whole life.
    inbox: Inbox<(ClientInput, Applied)>,
    downlink: Downlink,
    state: State,
    /// Set once the run is recorded in the store (a run_request was accepted).
    recorded: bool,
    transport: Transport,
}

/// The run for `request_id`, its actor started if this is the first message for it (RunSSE or
/// BidiAppend, whichever `opener` is). A BidiAppend's new run past `max_unattached_runs` waits
/// up to `unattached_wait` for a place (`RunRegistry::open_waiting`).
pub async fn get_or_start(
    app: &Arc<AppState>,
    request_id: &str,
    opener: Opener,
) -> Result<RunHandle, RegistryError> {
    let found = app
        .runs
        .open_waiting(
            request_id,
            opener,
            &app.shutdown,
            app.config.unattached_wait,
        )
        .await?;
    Ok(start(app, request_id, opener, found))
}

/// Starts a new run for a transport that owns its request id (HTTP/2 `Run`): an active run under
/// it is refused.
pub fn start_new(app: &Arc<AppState>, request_id: &str) -> Result<RunHandle, RegistryError> {
    let stop = app.shutdown.child_token();
    let found = app.runs.lookup(request_id, Opener::Http2Run, stop)?;
    Ok(start(app, request_id, Opener::Http2Run, found))
}

/// The run `found`: the one already there, or a new one whose actor starts here. A RunSSE run is
/// opened by whichever of its RunSSE and BidiAppend requests comes first.
fn start(app: &Arc<AppState>, request_id: &str, opener: Opener, found: Lookup) -> RunHandle {
    let transport = opener.transport();
    let (handle, commands) = match found {
        Lookup::Running(handle) => return handle,
        Lookup::New(handle, commands) => (handle, commands),
    };
    let control = Arc::clone(handle.control());
    let mut actor = RunActor::new(Arc::clone(app), request_id.to_owned(), commands, control);
    actor.transport = transport;
    let (done, tasks) = (handle.done().clone(), app.runs.tasks());
    let app = Arc::clone(app);
    let request_id = request_id.to_owned();
    tasks.spawn(async move {
        // The actor runs on its own task so that even a panic marks the run finished.
        // Every log line of the run carries its ids, provider and model (filled in once, as they
        // become known); a provider call's own lines add its model_call_id.
        let span = tracing::info_span!(
            "run",
            request_id = %request_id,
            conversation_id = tracing::field::Empty,
            provider = tracing::field::Empty,
            model = tracing::field::Empty,
        );
        let status = match tokio::spawn(tracing::Instrument::instrument(actor.run(), span)).await {
            Ok(status) => status.map_or("not_started", RunStatus::as_str),
            Err(panic) => {
                tracing::error!(request_id = %request_id, "run actor panicked: {panic}");
                "panicked"
            }
        };
        metrics::run_ended(transport, status);
        app.runs.mark_finished(&request_id);
        done.cancel();
    });
    handle
}

/// The first wait before the ending of a run is written again, doubled up to `END_RETRY_MAX`.
const END_RETRY_FIRST: Duration = Duration::from_millis(250);
const END_RETRY_MAX: Duration = Duration::from_secs(2);

/// The database could not take the run's ending (it is down or restarting): writes it again in
/// the background until it can, so the run is not left `running` in the record (the console, and
/// other nodes looking for the conversation's run, would take it as still working). Given up at
/// shutdown: the next start ends the runs a process left running.
fn record_end_later(
    app: &Arc<AppState>,
    request_id: &str,
    outcome: RunOutcome,
    kind: (Option<&'static str>, &'static str),
    first: crate::store::StoreError,
) {
    tracing::warn!("recording the run's end: {first}; trying again until the database is back");
    let (app, request_id) = (Arc::clone(app), request_id.to_owned());
    tokio::spawn(async move {
        let mut wait = END_RETRY_FIRST;
        loop {
            tokio::select! {
                _ = app.shutdown.cancelled() => return,
                _ = tokio::time::sleep(wait) => {}
            }
            match runs::finish(&app.store, &request_id, &outcome, kind).await {
                Ok(()) => {
                    tracing::info!(request_id = %request_id, "the run's end is recorded now that the database is back");
                    return;
                }
                Err(e) if e.is_unavailable() => wait = (wait * 2).min(END_RETRY_MAX),
                Err(e) => {
                    tracing::error!(request_id = %request_id, "recording the run's end: {e}");
                    return;
                }
            }
        }
    });
}

impl RunActor {
    pub fn new(
        app: Arc<AppState>,
        request_id: String,
        commands: mpsc::Receiver<RunCommand>,
        control: Arc<RunControl>,
    ) -> Self {
        let downlink = Downlink::new(control.stop().clone());
        RunActor {
            app,
            request_id,
            commands,
            control,
            inbox: Inbox::default(),
            downlink,
            state: State::AwaitingRunRequest,
            recorded: false,
            transport: Transport::RunSse,
        }
    }

    /// Drives the run to its end; how it ended, if it ever got a run request.
    pub async fn run(mut self) -> Option<RunStatus> {
        let started = Instant::now();
        let end = self.drive().await;
        let (provider_calls, usage, mode) = match &self.state {
            State::Running(turn) => (turn.provider_calls(), turn.usage(), Some(turn.mode())),
            State::AwaitingRunRequest | State::AwaitingContext { .. } | State::UserCommand(_) => {
                (0, Usage::default(), None)
            }
        };
        self.wind_down(&end).await;
        if let State::Running(turn) = &mut self.state {
            turn.keep_acks().await;
        }
        // Dropping the turn cancels its provider call before the client hears the ending.
        self.state = State::AwaitingRunRequest;
        // From here on the client's input is refused: a late result or ack gets `not_found`,
        // whether it beats the end-of-stream frame or not.
        self.control.close_input();
        let outcome = self.announce_end(&end, provider_calls, usage).await;
        self.answer_waiting_appends(&end);
        let kind = (mode.map(Mode::as_str), self.transport.as_str());
        if self.recorded
            && let Err(e) = runs::finish(&self.app.store, &self.request_id, &outcome, kind).await
        {
            if e.is_unavailable() {
                record_end_later(&self.app, &self.request_id, outcome.clone(), kind, e);
            } else {
                tracing::error!("recording the run's end: {e}");
            }
        }
        tracing::debug!(
            elapsed_ms = started.elapsed().as_millis() as u64,
            "run ended"
        );
        self.deliver_backlog().await;
        self.refuse_late_commands();
        self.recorded.then_some(outcome.status)
    }

    /// Brings the turn to its end: the final checkpoints of a success, terminal cards and the
    /// committed state of a failure, terminal cards of a cancel.
    async fn wind_down(&mut self, end: &RunEnd) {
        if let State::UserCommand(_) = &self.state
            && let State::UserCommand(command) =
                std::mem::replace(&mut self.state, State::AwaitingRunRequest)
        {
            let reason = match end {
                RunEnd::Canceled { reason } => reason.clone(),
                RunEnd::Failed(error) => format!("the run failed: {error}"),
                RunEnd::Success { .. } => "the run ended".to_owned(),
            };
            command.abandon(&reason, &mut self.downlink).await;
            return;
        }
        if let State::Running(turn) = &mut self.state {
            match end {
                RunEnd::Success { usage } => {
                    // SET the final blobs, turn_ended, the transitional checkpoint once the client
                    // has stored them, the final checkpoint, and it again (protocol.md §8).
                    self.close_successful_turn(usage).await;
                }
                RunEnd::Failed(error) => {
                    turn.abandon(&format!("the run failed: {error}"), &mut self.downlink)
                        .await;
                    // A provider failure keeps what was committed: publish that state first.
                    if error.provider().is_some() {
                        match turn.committed_checkpoint(&mut self.downlink).await {
                            Ok(()) => {
                                self.settle_checkpoints().await;
                            }
                            Err(e) => {
                                tracing::error!("checkpoint of committed state: {e}")
                            }
                        }
                    }
                }
                RunEnd::Canceled { reason } => turn.abandon(reason, &mut self.downlink).await,
            }
        }
    }

    /// Sends the ending's frames and says how the run ended, for its record.
    async fn announce_end(
        &mut self,
        end: &RunEnd,
        provider_calls: u32,
        usage: Usage,
    ) -> RunOutcome {
        match end {
            RunEnd::Success { usage } => {
                lifecycle::finish_success(&mut self.downlink).await;
                RunOutcome {
                    status: RunStatus::Succeeded,
                    provider_calls,
                    usage: *usage,
                    error: None,
                }
            }
            RunEnd::Failed(error) => {
                tracing::warn!("run failed: {error}");
                lifecycle::finish_error(&mut self.downlink, error).await;
                RunOutcome {
                    status: RunStatus::Failed,
                    provider_calls,
                    usage,
                    error: Some((error.connect_code().as_str().to_owned(), error.to_string())),
                }
            }
            RunEnd::Canceled { reason } => {
                tracing::info!("run canceled: {reason}");
                lifecycle::finish_canceled(&mut self.downlink, reason).await;
                RunOutcome {
                    status: RunStatus::Canceled,
                    provider_calls,
                    usage,
                    error: Some((ConnectCode::Canceled.as_str().to_owned(), reason.clone())),
                }
            }
        }
    }

    /// Appends still waiting behind a gap when the run ends are answered with its ending (never
    /// left to a connection reset): the run's own code for a failure or a cancel, `not_found` after
    /// a success.
    fn answer_waiting_appends(&mut self, end: &RunEnd) {
        let expected = self.inbox.expected();
        for (seqno, (_, applied)) in self.inbox.drain() {
            let (code, how) = match end {
                RunEnd::Success { .. } => (ConnectCode::NotFound, "finished".to_owned()),
                RunEnd::Failed(error) => (error.connect_code(), format!("failed: {error}")),
                RunEnd::Canceled { reason } => {
                    (ConnectCode::Canceled, format!("was canceled: {reason}"))
                }
            };
            let message = format!(
                "request {} {how}; append_seqno {seqno} was never applied (the run was still waiting for append_seqno {expected})",
                self.request_id
            );
            applied.refuse(ConnectError::new(code, message));
        }
    }

    /// Closes the command channel (later senders see the run as finished) and answers what was
    /// already queued: a RunSSE that raced the ending gets a clear error instead of a silent close.
    fn refuse_late_commands(&mut self) {
        self.commands.close();
        while let Ok(command) = self.commands.try_recv() {
            match command {
                RunCommand::AttachDownlink(sink) => {
                    let error = ConnectError::new(
                        ConnectCode::NotFound,
                        format!("request {} has already finished", self.request_id),
                    );
                    let _ = sink.frames.try_send(connect::end_stream_error(&error));
                }
                other => {
                    tracing::debug!("dropped after the run ended: {other:?}")
                }
            }
        }
    }

    /// Runs until one of the three endings.
    /// The success tail after the loop: the final blobs are SET, then `turn_ended`, then — once
    /// the client has stored them — the transitional checkpoint (the turn's complete history), the
    /// final checkpoint (adding the turn's timing), and the final checkpoint once more.
    async fn close_successful_turn(&mut self, usage: &Usage) {
        let State::Running(turn) = &mut self.state else {
            return;
        };
        let request_id = &self.request_id;
        if let Err(e) = turn.final_checkpoints(&mut self.downlink).await {
            tracing::error!(request_id, "building the final checkpoints: {e}");
        }
        for update in crate::client::interaction::summary(turn.summary()) {
            self.downlink.send_message(&update).await;
        }
        lifecycle::announce_turn_ended(&mut self.downlink, usage).await;
        if let Err(e) = turn.release_checkpoints(&mut self.downlink).await {
            tracing::error!(request_id, "publishing the final checkpoints: {e}");
        }
        if self.settle_checkpoints().await
            && let State::Running(turn) = &mut self.state
        {
            turn.republish_checkpoint(&mut self.downlink).await;
        }
    }

    async fn drive(&mut self) -> RunEnd {
        let run_request_deadline = Instant::now() + self.app.config.run_request_timeout;
        let heartbeat_every = self.app.config.heartbeat_interval;
        let mut resend = tokio::time::interval(self.app.config.kv_retry_after);
        resend.reset();
        let grace = self.app.config.reconnect_grace;
        let idle_timeout = self.app.config.client_idle_timeout;
        let mut reconnect_deadline: Option<Instant> = None;
        let mut last_client_traffic = Instant::now();
        loop {
            // A stop that interrupted a send (the client dropped for not reading) is the reason the
            // run ends, not the dropped client.
            if self.control.stop().is_cancelled() {
                return self.stopped();
            }
            let awaiting = matches!(self.state, State::AwaitingRunRequest);
            reconnect_deadline = match self.reconnect_deadline(reconnect_deadline, grace) {
                Ok(deadline) => deadline,
                Err(end) => return end,
            };
            let waiting_on_client = self.waiting_on_client();
            let idle_deadline = last_client_traffic + idle_timeout;
            let heartbeat_due = self.downlink.last_sent() + heartbeat_every;
            let beating = !awaiting && self.downlink.is_attached();
            tokio::select! {
                _ = self.control.stop().cancelled() => return self.stopped(),
                _ = self.downlink.closed() => self.downlink.detach(),
                _ = sleep_until_some(reconnect_deadline) => {
                    return RunEnd::Canceled {
                        reason: format!(
                            "the client disconnected and did not reconnect within {} ms",
                            grace.as_millis()
                        ),
                    };
                }
                _ = tokio::time::sleep_until(idle_deadline), if waiting_on_client => {
                    return RunEnd::Canceled {
                        reason: format!(
                            "no message from the client for {} s while waiting on it",
                            idle_timeout.as_secs()
                        ),
                    };
                }
                command = self.commands.recv() => {
                    let Some(command) = command else {
                        return RunEnd::Canceled { reason: "the run was dropped".to_owned() };
                    };
                    if matches!(command, RunCommand::Ordered(_) | RunCommand::Appended { .. }) {
                        last_client_traffic = Instant::now();
                    }
                    if let Some(end) = self.handle_command(command).await {
                        return end;
                    }
                }
                event = next_loop_event(&mut self.state) => {
                    if let Some(end) = self.on_loop_event(event).await {
                        return end;
                    }
                }
                _ = resend.tick(), if !awaiting => {
                    if let State::Running(turn) = &mut self.state {
                        turn.resend_overdue_blobs(&mut self.downlink).await;
                    }
                }
                // While the provider thinks or tools run, Cursor hears that the run is alive.
                _ = tokio::time::sleep_until(heartbeat_due), if beating => {
                    self.downlink.send_message(&crate::client::interaction::heartbeat()).await;
                }
                _ = tokio::time::sleep_until(run_request_deadline), if awaiting => {
                    let secs = self.app.config.run_request_timeout.as_secs();
                    return RunEnd::Failed(ServerError::InvalidRequest(format!(
                        "no run_request arrived within {secs} s of the run being opened"
                    )));
                }
            }
        }
    }

    /// A client that dropped its RunSSE has `grace` to come back for the rest: the deadline by
    /// which it must, or the run's end when it cannot come back.
    fn reconnect_deadline(
        &self,
        current: Option<Instant>,
        grace: Duration,
    ) -> Result<Option<Instant>, RunEnd> {
        match (self.downlink.is_attached(), self.downlink.ever_attached()) {
            (true, _) => Ok(None),
            (false, true) if current.is_none() => {
                if grace.is_zero() || !self.downlink.resumable() {
                    return Err(RunEnd::Canceled {
                        reason: "the client disconnected".to_owned(),
                    });
                }
                tracing::info!(
                    grace_ms = grace.as_millis() as u64,
                    "the client disconnected; waiting for it to reconnect"
                );
                Ok(Some(Instant::now() + grace))
            }
            _ => Ok(current),
        }
    }

    /// A provider event or finished search for the running turn.
    async fn on_loop_event(&mut self, event: LoopEvent) -> Option<RunEnd> {
        let State::Running(turn) = &mut self.state else {
            return None;
        };
        match turn.on_loop_event(event, &mut self.downlink).await {
            Ok(LoopStep::Continue) => None,
            Ok(LoopStep::TurnComplete { usage }) => Some(RunEnd::Success { usage }),
            Err(error) => Some(RunEnd::Failed(error)),
        }
    }

    async fn handle_command(&mut self, command: RunCommand) -> Option<RunEnd> {
        match command {
            RunCommand::Ordered(input) => self.handle_input(input).await,
            RunCommand::Appended {
                seqno,
                input,
                applied,
            } => match self.order(seqno, input, applied) {
                Ok(inputs) => {
                    for (input, applied) in inputs {
                        let end = self.handle_input(input).await;
                        applied.done();
                        if end.is_some() {
                            return end;
                        }
                    }
                    None
                }
                Err(error) => Some(RunEnd::Failed(
                    ProtocolError::Seqno {
                        seqno,
                        reason: error.to_string(),
                    }
                    .into(),
                )),
            },
            RunCommand::AttachDownlink(sink) => {
                if self.downlink.ever_attached() && (!sink.resumable || !self.downlink.resumable())
                {
                    // An HTTP/2 `Run` stream is the run's only downlink; nothing replaces it.
                    let error = ConnectError::new(
                        ConnectCode::InvalidArgument,
                        format!(
                            "request {} is already running on another stream",
                            self.request_id
                        ),
                    );
                    let _ = sink.frames.try_send(connect::end_stream_error(&error));
                } else {
                    // A RunSSE that arrives while one is open replaces it (the client reconnected
                    // before the old connection was seen to die); it gets the resync.
                    self.downlink.attach(sink).await;
                }
                None
            }
            RunCommand::UplinkFailed(error) => Some(RunEnd::Failed(error.into())),
            RunCommand::ClientGone => Some(RunEnd::Canceled {
                reason: "the client disconnected".to_owned(),
            }),
        }
    }

    /// The run's request: an action beside the turn ends it at once; a CLI client is asked for
    /// its request context first; the user's own command runs before its turn opens.
    async fn on_run_request(&mut self, request: Box<RunRequestInput>) -> Option<RunEnd> {
        if !matches!(self.state, State::AwaitingRunRequest) {
            return Some(RunEnd::Failed(ProtocolError::DuplicateRunRequest.into()));
        }
        tracing::Span::current().record(
            "conversation_id",
            tracing::field::display(&request.conversation_id),
        );
        tracing::info!("run_request");
        if let Some(end) = self.act_beside_the_turn(&request.action) {
            return Some(end);
        }
        if request.ask_context.is_some() {
            tracing::info!(
                "the run_request has no request context (a CLI client): asking the client for it first"
            );
            let ask = bidi_append::context_request().into_server_message(CONTEXT_EXEC_ID);
            self.downlink.send_message(&ask).await;
            let reads = self.read_ahead(&request, true);
            self.state = State::AwaitingContext { request, reads };
            return None;
        }
        let max_output = self.app.config.tool_output_max_bytes;
        match UserCommand::start(request, max_output, &mut self.downlink).await {
            Ok(command) => {
                self.state = State::UserCommand(Box::new(command));
                None
            }
            Err(request) => {
                let ahead = self.read_ahead(&request, false);
                self.start_turn(*request, ahead).await
            }
        }
    }

    async fn handle_input(&mut self, input: ClientInput) -> Option<RunEnd> {
        self.note_answer(&input);
        let protocol = |e: ProtocolError| Some(RunEnd::Failed(e.into()));
        match input {
            ClientInput::RunRequest(request) => self.on_run_request(request).await,
            ClientInput::ExecResult { id, payload } if self.awaits_context() => {
                self.context_arrived(id, Ok(payload)).await
            }
            ClientInput::ExecControl { id, control } if self.awaits_context() => {
                self.context_arrived(id, Err(control)).await
            }
            ClientInput::ExecResult { id, payload } if self.runs_user_command() => {
                let State::UserCommand(command) = &mut self.state else {
                    return None;
                };
                let progress = command.on_result(id, payload, &mut self.downlink).await;
                self.user_command_moved(id, progress).await
            }
            ClientInput::ExecControl { id, control } if self.runs_user_command() => {
                let State::UserCommand(command) = &mut self.state else {
                    return None;
                };
                let progress = command.on_control(id, control, &mut self.downlink).await;
                self.user_command_moved(id, progress).await
            }
            ClientInput::Cancel => Some(RunEnd::Canceled {
                reason: "canceled by the user".to_owned(),
            }),
            ClientInput::Heartbeat | ClientInput::Prewarm => None,
            ClientInput::ExecResult { id, payload } => {
                let State::Running(turn) = &mut self.state else {
                    return protocol(ProtocolError::BeforeRunRequest("exec result"));
                };
                LoopStep::run_end(turn.on_exec_result(id, payload, &mut self.downlink).await)
            }
            ClientInput::ExecControl { id, control } => {
                let State::Running(turn) = &mut self.state else {
                    return protocol(ProtocolError::BeforeRunRequest("exec control message"));
                };
                LoopStep::run_end(turn.on_exec_control(id, control, &mut self.downlink).await)
            }
            ClientInput::KvResult { id, payload } => {
                let State::Running(turn) = &mut self.state else {
                    return protocol(ProtocolError::Kv(format!(
                        "KV result for KV id {id}, which was never issued"
                    )));
                };
                LoopStep::run_end(turn.on_kv_result(id, payload, &mut self.downlink).await)
            }
            ClientInput::InteractionResponse { id, payload } => {
                let State::Running(turn) = &mut self.state else {
                    return protocol(ProtocolError::BeforeRunRequest("interaction response"));
                };
                LoopStep::run_end(
                    turn.on_interaction_response(id, payload, &mut self.downlink)
                        .await,
                )
            }
            ClientInput::LiveAction(action) => self.act_on_the_turn(action).await,
            ClientInput::NotApplicable(what) => {
                tracing::warn!("refused, the turn goes on: {what}");
                None
            }
            ClientInput::Unsupported(what) => protocol(ProtocolError::Unsupported(what)),
            ClientInput::Invalid(error) => protocol(error),
            ClientInput::Unknown(what) => {
                tracing::warn!("ignored {what}");
                None
            }
        }
    }

    /// Takes over the conversation and opens the turn.
    async fn start_turn(
        &mut self,
        request: RunRequestInput,
        reads: Option<ReadAhead>,
    ) -> Option<RunEnd> {
        let conversation_id = &request.conversation_id;
        let took_over = self.take_over_conversation(conversation_id).await;
        let prefetched = match reads {
            // Reads that failed are made again, where their error ends the run.
            Some(ReadAhead::Reading(reads)) if !took_over => reads.await.ok().and_then(Result::ok),
            // Still new: a run may have started and ended on it while a CLI client answered.
            Some(ReadAhead::New) if !took_over && self.app.history.surely_new(conversation_id) => {
                Some(opening::Prefetched::new_conversation())
            }
            // The run stopped may have written after them, or has written.
            Some(ReadAhead::Reading(reads)) => {
                reads.abort();
                None
            }
            Some(ReadAhead::New) | None => None,
        };
        self.recorded = true;
        match TurnLoop::start(
            Arc::clone(&self.app),
            &self.request_id,
            request,
            prefetched,
            &mut self.downlink,
        )
        .await
        {
            Ok((turn, step)) => {
                self.state = State::Running(Box::new(turn));
                LoopStep::run_end(Ok(step))
            }
            Err(error) => {
                if matches!(error, ServerError::NotFound(_)) {
                    // Nothing was recorded: the model was resolved before the run row.
                    self.recorded = false;
                }
                Some(RunEnd::Failed(error))
            }
        }
    }

    /// Actions that leave the conversation's running turn alone: a subagent the user canceled is
    /// stopped (if this server runs it); a call the user moved to the background is the client's
    /// to move, reported on the call's own stream. This request ends at once, with no turn.
    fn act_beside_the_turn(&self, action: &RunAction) -> Option<RunEnd> {
        let request_id = &self.request_id;
        match action {
            RunAction::CancelSubagent { subagent_id } => {
                let running = self.app.runs.stop_conversation(subagent_id, request_id);
                tracing::info!(
                    subagent_id,
                    running,
                    "the user canceled a subagent; its run (if running here) is stopped"
                );
            }
            RunAction::MoveToBackground { tool_call_id, kind } => {
                tracing::info!(
                    tool_call_id,
                    ?kind,
                    "the user moved a call to the background; the client reports it on the call's stream and the turn goes on"
                );
            }
            _ => return None,
        }
        let usage = Usage::default();
        Some(RunEnd::Success { usage })
    }

    /// What the user did to the running turn: a call moved to the background completes as
    /// backgrounded (its process goes on on the client); a canceled subagent's run is stopped.
    async fn act_on_the_turn(&mut self, action: LiveAction) -> Option<RunEnd> {
        match action {
            LiveAction::CancelSubagent { subagent_id } => {
                let running = self
                    .app
                    .runs
                    .stop_conversation(&subagent_id, &self.request_id);
                tracing::info!(
                    subagent_id,
                    running,
                    "the user canceled a subagent during the turn; its run (if running here) is stopped and the turn goes on"
                );
                None
            }
            LiveAction::MoveToBackground { tool_call_id, kind } => {
                let State::Running(turn) = &mut self.state else {
                    tracing::warn!(
                        tool_call_id,
                        ?kind,
                        "a call moved to the background before the turn began; nothing to move"
                    );
                    return None;
                };
                LoopStep::run_end(
                    turn.move_to_background(&tool_call_id, kind, &mut self.downlink)
                        .await,
                )
            }
        }
    }

    /// Whether the run waits on the client (an exec, an answer), so its silence counts.
    fn waiting_on_client(&self) -> bool {
        match &self.state {
            State::Running(turn) => turn.waiting_on_client(),
            State::AwaitingContext { .. } | State::UserCommand(_) => true,
            State::AwaitingRunRequest => false,
        }
    }

    fn awaits_context(&self) -> bool {
        matches!(self.state, State::AwaitingContext { .. })
    }

    fn runs_user_command(&self) -> bool {
        matches!(self.state, State::UserCommand(_))
    }

    /// Where a message for exec `id` left the user's command: still running, or over — then the
    /// run's turn opens with the command and its output as the user's action.
    async fn user_command_moved(&mut self, id: u32, progress: Option<Progress>) -> Option<RunEnd> {
        match progress {
            None => {
                let error =
                    ProtocolError::Exec(format!("exec id {id} was never issued in this run"));
                Some(RunEnd::Failed(error.into()))
            }
            Some(Progress::Running) => None,
            Some(Progress::Done(request)) => {
                self.state = State::AwaitingRunRequest;
                self.start_turn(*request, None).await
            }
        }
    }

    /// The client answered the request-context exec (a result, or a throw or close without one):
    /// the run request is read again with what it gave, and the turn opens. A client that gave
    /// nothing is logged, and the run goes on without a context.
    async fn context_arrived(
        &mut self,
        id: u32,
        answer: Result<ExecPayload, ExecControl>,
    ) -> Option<RunEnd> {
        if id != CONTEXT_EXEC_ID {
            let error = ProtocolError::Exec(format!("exec id {id} was never issued in this run"));
            return Some(RunEnd::Failed(error.into()));
        }
        let State::AwaitingContext { request, reads } =
            std::mem::replace(&mut self.state, State::AwaitingRunRequest)
        else {
            return None;
        };
        match opening::with_client_context(*request, answer, &self.request_id, CONTEXT_EXEC_ID) {
            Ok(request) => self.start_turn(request, reads).await,
            Err(error) => Some(RunEnd::Failed(error)),
        }
    }

    /// What a user's message's run start may know before it opens: only where the run may defer
    /// its opening commit (no `[auth]`: that commit checks that history did not move since, and
    /// opens the run again from the store if it did, `TurnLoop::start`), on one node, and when no
    /// run here works on the conversation (it is stopped first, and the reads must see what it
    /// wrote). A conversation the client sends no state of and the store has no message of, as
    /// this node knows (`HistoryCache::surely_new`), is taken as new, with nothing read: on this
    /// machine the reads were a third of a new conversation's time to first token over the
    /// provider's. Else, with `overlap` (a CLI client is being asked for its request context, one
    /// round trip about as long as the reads), the reads begin at once in a task of their own.
    fn read_ahead(&self, request: &RunRequestInput, overlap: bool) -> Option<ReadAhead> {
        let app = &self.app;
        let (conversation_id, history) = (&request.conversation_id, &app.history);
        let ahead = app.auth.is_none()
            && app.cluster.is_none()
            && matches!(request.action, RunAction::UserMessage { .. })
            && app.runs.conversation_run(conversation_id).is_none();
        if !ahead {
            return None;
        }
        if request.client_state.is_none() && history.surely_new(conversation_id) {
            return Some(ReadAhead::New);
        }
        overlap.then(|| {
            let app = Arc::clone(app);
            let conversation_id = conversation_id.clone();
            let reads = async move { opening::Prefetched::read(&app, &conversation_id).await };
            ReadAhead::Reading(tokio::spawn(tracing::Instrument::instrument(
                reads,
                tracing::Span::current(),
            )))
        })
    }

    /// Stops the run that still works on `conversation_id` (the user sent a new message while it
    /// ran) and waits for it to end, so the two never write the same history at once. The stop is
    /// a signal, not a queued command: it reaches a run whatever it waits on. Should the old run
    /// still not end in time, the store refuses its appends: this run owns the conversation.
    /// Whether there was such a run.
    async fn take_over_conversation(&mut self, conversation_id: &str) -> bool {
        if let Some(cluster) = &self.app.cluster {
            let wait = self.app.config.interrupt_wait;
            cluster
                .stop_elsewhere(&self.app.store, conversation_id, &self.request_id, wait)
                .await;
        }
        let Some((previous, handle)) = self
            .app
            .runs
            .claim_conversation(conversation_id, &self.request_id)
        else {
            return false;
        };
        tracing::info!(conversation_id, previous = %previous, "interrupting the conversation's running request");
        handle.supersede(&self.request_id);
        let wait = self.app.config.interrupt_wait;
        if tokio::time::timeout(wait, handle.done().cancelled())
            .await
            .is_err()
        {
            tracing::warn!(previous = %previous, "the interrupted run did not end in time; going on (the store refuses its appends)");
        }
        true
    }

    /// Why the run's stop signal fired.
    fn stopped(&self) -> RunEnd {
        let reason = match (self.control.superseded_by(), self.control.stopped_because()) {
            (Some(by), _) => format!("interrupted by a new run ({by}) on the same conversation"),
            (None, Some(why)) => why.to_owned(),
            (None, None) => "the server is shutting down".to_owned(),
        };
        RunEnd::Canceled { reason }
    }

    /// A run can end before its RunSSE arrives (a fast failure), or while its RunSSE is away: keep
    /// its frames for a while so the client still sees how it ended. Never for a client that
    /// cannot come back (HTTP/2 `Run`), and not once a newer run took the conversation.
    async fn deliver_backlog(&mut self) {
        if !self.downlink.awaits_client() || self.control.stop().is_cancelled() {
            return;
        }
        let wait = if self.downlink.ever_attached() {
            self.app.config.reconnect_grace
        } else {
            self.app
                .config
                .run_request_timeout
                .min(Duration::from_secs(30))
        };
        let deadline = Instant::now() + wait;
        loop {
            tokio::select! {
                command = self.commands.recv() => match command {
                    Some(RunCommand::AttachDownlink(sink)) => {
                        self.downlink.attach(sink).await;
                        return;
                    }
                    Some(other) => {
                        tracing::debug!("dropped after the run ended: {other:?}");
                    }
                    None => return,
                },
                _ = tokio::time::sleep_until(deadline) => return,
                _ = self.control.stop().cancelled() => return,
            }
        }
    }

    /// After the loop: keeps answering KV results until the built checkpoint is published (or the
    /// wait times out: the turn stays done, only the client's copy of the state is older). Client
    /// messages still go through the run's one ordered inbox (an ACK buffered behind a gap before
    /// `turn_ended` is applied when the gap fills). Returns whether it was published.
    async fn settle_checkpoints(&mut self) -> bool {
        let deadline = Instant::now() + self.app.config.checkpoint_ack_timeout;
        let mut resend = tokio::time::interval(self.app.config.kv_retry_after);
        resend.reset();
        loop {
            let State::Running(turn) = &mut self.state else {
                return false;
            };
            if turn.checkpoints_settled() {
                return true;
            }
            tokio::select! {
                _ = resend.tick() => turn.resend_overdue_blobs(&mut self.downlink).await,
                command = self.commands.recv() => match command {
                    Some(RunCommand::Ordered(input)) => self.after_turn_ended(input).await,
                    Some(RunCommand::Appended { seqno, input, applied }) => match self.order(seqno, input, applied) {
                        Ok(inputs) => {
                            for (input, applied) in inputs {
                                self.after_turn_ended(input).await;
                                applied.done();
                            }
                        }
                        Err(e) => {
                            tracing::warn!(seqno, "append after turn_ended: {e}");
                            return false;
                        }
                    },
                    Some(RunCommand::AttachDownlink(sink)) => self.downlink.attach(sink).await,
                    Some(other) => tracing::debug!("ignored after turn_ended: {other:?}"),
                    None => return false,
                },
                _ = tokio::time::sleep_until(deadline) => {
                    tracing::warn!("the client did not store the final checkpoint's blobs in time");
                    return false;
                }
                // A new run owns the conversation now, or the server stops: stop waiting.
                _ = self.control.stop().cancelled() => return false,
                _ = self.downlink.closed() => {
                    self.downlink.detach();
                    if !self.downlink.resumable() {
                        return false;
                    }
                }
            }
        }
    }

    /// Puts an append in `append_seqno` order; returns the inputs now ready, oldest first. One
    /// behind a gap waits in the inbox; a duplicate is answered (it was applied, or waits) and
    /// dropped; one too far ahead to wait is refused at once and the run goes on.
    fn order(
        &mut self,
        seqno: i64,
        input: ClientInput,
        applied: Applied,
    ) -> Result<Vec<(ClientInput, Applied)>, InboxError> {
        Ok(match self.inbox.push(seqno, (input, applied))? {
            Accepted::Ready(inputs) => inputs,
            Accepted::Buffered => {
                tracing::debug!(
                    seqno,
                    expected = self.inbox.expected(),
                    "append buffered behind a gap"
                );
                Vec::new()
            }
            Accepted::Duplicate((_, applied)) => {
                tracing::debug!(seqno, "duplicate append dropped");
                applied.done();
                Vec::new()
            }
            Accepted::Refused((_, applied), error) => {
                tracing::warn!(seqno, "append refused: {error}");
                let code = ConnectCode::InvalidArgument;
                applied.refuse(ConnectError::new(code, error.to_string()));
                Vec::new()
            }
        })
    }

    /// A request the client answers with `input` is not replayed to a reconnecting RunSSE.
    fn note_answer(&mut self, input: &ClientInput) {
        let answered = match input {
            ClientInput::ExecResult { id, .. }
            | ClientInput::ExecControl { id, .. }
            | ClientInput::InteractionResponse { id, .. } => Awaited::Exec(*id),
            ClientInput::KvResult { id, .. } => Awaited::Kv(*id),
            _ => return,
        };
        self.downlink.answered(answered);
    }

    /// A client message after `turn_ended`: the answers to our SETs count; the rest is logged.
    async fn after_turn_ended(&mut self, input: ClientInput) {
        self.note_answer(&input);
        let State::Running(turn) = &mut self.state else {
            return;
        };
        match input {
            ClientInput::KvResult { id, payload } => {
                if let Err(e) = turn.on_kv_result(id, payload, &mut self.downlink).await {
                    tracing::warn!("KV result after turn_ended: {e}");
                }
            }
            other => {
                tracing::debug!("ignored after turn_ended: {other:?}")
            }
        }
    }
}

async fn sleep_until_some(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

async fn next_loop_event(state: &mut State) -> LoopEvent {
    match state {
        State::Running(turn) => turn.next_event().await,
        State::AwaitingRunRequest | State::AwaitingContext { .. } | State::UserCommand(_) => {
            std::future::pending().await
        }
    }
}
