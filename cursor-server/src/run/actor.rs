//! One `RunActor` task per request id. It owns everything mutable about the run — the seqno inbox,
//! the downlink, the turn loop — and is reached only through its command channel.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::command::{ClientInput, RunCommand};
use super::inbox::{Accepted, Inbox};
use super::lifecycle::{self, RunEnd};
use super::loop_engine::{LoopEvent, LoopStep, TurnLoop};
use super::registry::{Lookup, RegistryError, RunHandle};
use crate::cursor::connect::{self, ConnectCode, ConnectError};
use crate::cursor::run_sse::Downlink;
use crate::error::{ProtocolError, ServerError};
use crate::model::usage::Usage;
use crate::state::AppState;
use crate::store::runs::{self, RunOutcome, RunStatus};

/// How long a new run waits for the run it interrupts to end.
const SUPERSEDE_WAIT: Duration = Duration::from_secs(5);

enum State {
    AwaitingRunRequest,
    Running(Box<TurnLoop>),
}

pub struct RunActor {
    app: Arc<AppState>,
    request_id: String,
    commands: mpsc::Receiver<RunCommand>,
    /// Fired when the run ends: the routes refuse client input from then on.
    ended: CancellationToken,
    inbox: Inbox<ClientInput>,
    downlink: Downlink,
    state: State,
    /// Set once the run is recorded in the store (a run_request was accepted).
    recorded: bool,
}

/// The run for `request_id`, its actor started if this is the first message for it.
pub fn get_or_start(app: &Arc<AppState>, request_id: &str) -> Result<RunHandle, RegistryError> {
    start(app, request_id, false)
}

/// Starts a new run for a transport that owns its request id (HTTP/2 `Run`).
pub fn start_new(app: &Arc<AppState>, request_id: &str) -> Result<RunHandle, RegistryError> {
    start(app, request_id, true)
}

fn start(
    app: &Arc<AppState>,
    request_id: &str,
    must_be_new: bool,
) -> Result<RunHandle, RegistryError> {
    let (handle, commands) = match app.runs.lookup(request_id, must_be_new)? {
        Lookup::Running(handle) => return Ok(handle),
        Lookup::New(handle, commands) => (handle, commands),
    };
    let ended = handle.ended().clone();
    let actor = RunActor::new(Arc::clone(app), request_id.to_owned(), commands, ended);
    let done = handle.done().clone();
    let app = Arc::clone(app);
    let request_id = request_id.to_owned();
    tokio::spawn(async move {
        // The actor runs on its own task so that even a panic marks the run finished.
        // Every log line of the run carries its ids (conversation and model call are filled
        // in as they become known).
        let span = tracing::info_span!(
            "run",
            request_id = %request_id,
            conversation_id = tracing::field::Empty,
            model_call_id = tracing::field::Empty,
        );
        if let Err(panic) = tokio::spawn(tracing::Instrument::instrument(actor.run(), span)).await {
            tracing::error!(request_id = %request_id, "run actor panicked: {panic}");
        }
        app.runs.mark_finished(&request_id);
        done.cancel();
    });
    Ok(handle)
}

impl RunActor {
    pub fn new(
        app: Arc<AppState>,
        request_id: String,
        commands: mpsc::Receiver<RunCommand>,
        ended: CancellationToken,
    ) -> Self {
        RunActor {
            app,
            request_id,
            commands,
            ended,
            inbox: Inbox::default(),
            downlink: Downlink::default(),
            state: State::AwaitingRunRequest,
            recorded: false,
        }
    }

    pub async fn run(mut self) {
        let started = Instant::now();
        let end = self.drive().await;
        let (provider_calls, usage) = match &self.state {
            State::Running(turn) => (turn.provider_calls(), turn.usage()),
            State::AwaitingRunRequest => (0, Usage::default()),
        };
        self.wind_down(&end).await;
        // Dropping the turn cancels its provider call before the client hears the ending.
        self.state = State::AwaitingRunRequest;
        // From here on the client's input is refused: a late result or ack gets `not_found`,
        // whether it beats the end-of-stream frame or not.
        self.ended.cancel();
        let outcome = self.announce_end(&end, provider_calls, usage).await;
        if self.recorded
            && let Err(e) = runs::finish(&self.app.store, &self.request_id, &outcome).await
        {
            tracing::error!(request_id = %self.request_id, "recording the run's end: {e}");
        }
        tracing::debug!(request_id = %self.request_id, elapsed_ms = started.elapsed().as_millis() as u64, "run ended");
        self.deliver_backlog().await;
        self.refuse_late_commands();
    }

    /// Brings the turn to its end: the final checkpoints of a success, terminal cards and the
    /// committed state of a failure, terminal cards of a cancel.
    async fn wind_down(&mut self, end: &RunEnd) {
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
                    if matches!(error, ServerError::Provider(_)) {
                        match turn.committed_checkpoint(&mut self.downlink).await {
                            Ok(()) => {
                                settle_checkpoints(
                                    turn,
                                    &mut self.commands,
                                    &mut self.downlink,
                                    &self.app,
                                    &self.request_id,
                                )
                                .await;
                            }
                            Err(e) => {
                                tracing::error!(request_id = %self.request_id, "checkpoint of committed state: {e}")
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
                tracing::warn!(request_id = %self.request_id, "run failed: {error}");
                lifecycle::finish_error(&mut self.downlink, error).await;
                RunOutcome {
                    status: RunStatus::Failed,
                    provider_calls,
                    usage,
                    error: Some((error.connect_code().as_str().to_owned(), error.to_string())),
                }
            }
            RunEnd::Canceled { reason } => {
                tracing::info!(request_id = %self.request_id, "run canceled: {reason}");
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
                    tracing::debug!(request_id = %self.request_id, "dropped after the run ended: {other:?}")
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
        lifecycle::announce_turn_ended(&mut self.downlink, usage).await;
        if let Err(e) = turn.release_checkpoints(&mut self.downlink).await {
            tracing::error!(request_id, "publishing the final checkpoints: {e}");
        }
        let (commands, downlink, app) = (&mut self.commands, &mut self.downlink, &self.app);
        if settle_checkpoints(turn, commands, downlink, app, request_id).await {
            turn.republish_checkpoint(downlink).await;
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
            let awaiting = matches!(self.state, State::AwaitingRunRequest);
            reconnect_deadline = match self.reconnect_deadline(reconnect_deadline, grace) {
                Ok(deadline) => deadline,
                Err(end) => return end,
            };
            let waiting_on_client = match &self.state {
                State::Running(turn) => turn.waiting_on_client(),
                State::AwaitingRunRequest => false,
            };
            let idle_deadline = last_client_traffic + idle_timeout;
            let heartbeat_due = self.downlink.last_sent() + heartbeat_every;
            let beating = !awaiting && self.downlink.is_attached();
            tokio::select! {
                _ = self.app.shutdown.cancelled() => {
                    return RunEnd::Canceled { reason: "the server is shutting down".to_owned() };
                }
                _ = self.downlink.closed() => self.downlink.detach().await,
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
                    self.downlink.send_message(&crate::cursor::interaction::heartbeat()).await;
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
                tracing::info!(request_id = %self.request_id, grace_ms = grace.as_millis() as u64, "the client disconnected; waiting for it to reconnect");
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
            RunCommand::Appended { seqno, input } => match self.inbox.push(seqno, input) {
                Ok(Accepted::Ready(inputs)) => {
                    for input in inputs {
                        if let Some(end) = self.handle_input(input).await {
                            return Some(end);
                        }
                    }
                    None
                }
                Ok(Accepted::Buffered) => {
                    tracing::debug!(request_id = %self.request_id, seqno, expected = self.inbox.expected(), "append buffered behind a gap");
                    None
                }
                Ok(Accepted::Duplicate) => {
                    tracing::debug!(request_id = %self.request_id, seqno, "duplicate append dropped");
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
                if self.downlink.is_attached() {
                    let error = ConnectError::new(
                        ConnectCode::InvalidArgument,
                        format!(
                            "a RunSSE stream is already open for request {}",
                            self.request_id
                        ),
                    );
                    let _ = sink.frames.send(connect::end_stream_error(&error)).await;
                } else {
                    self.downlink.attach(sink).await;
                }
                None
            }
            RunCommand::UplinkFailed(error) => Some(RunEnd::Failed(error.into())),
            RunCommand::ClientGone => Some(RunEnd::Canceled {
                reason: "the client disconnected".to_owned(),
            }),
            RunCommand::Superseded { by } => Some(RunEnd::Canceled {
                reason: format!("interrupted by a new run ({by}) on the same conversation"),
            }),
        }
    }

    async fn handle_input(&mut self, input: ClientInput) -> Option<RunEnd> {
        let protocol = |e: ProtocolError| Some(RunEnd::Failed(e.into()));
        match input {
            ClientInput::RunRequest(request) => {
                if matches!(self.state, State::Running(_)) {
                    return protocol(ProtocolError::DuplicateRunRequest);
                }
                tracing::Span::current()
                    .record("conversation_id", request.conversation_id.as_str());
                tracing::info!(request_id = %self.request_id, conversation_id = %request.conversation_id, "run_request");
                self.take_over_conversation(&request.conversation_id).await;
                self.recorded = true;
                match TurnLoop::start(
                    Arc::clone(&self.app),
                    &self.request_id,
                    *request,
                    &mut self.downlink,
                )
                .await
                {
                    Ok((turn, step)) => {
                        self.state = State::Running(Box::new(turn));
                        step_end(Ok(step))
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
            ClientInput::Cancel => Some(RunEnd::Canceled {
                reason: "canceled by the user".to_owned(),
            }),
            ClientInput::Heartbeat | ClientInput::Prewarm => None,
            ClientInput::ExecResult { id, payload } => {
                let State::Running(turn) = &mut self.state else {
                    return protocol(ProtocolError::BeforeRunRequest("exec result"));
                };
                step_end(turn.on_exec_result(id, payload, &mut self.downlink).await)
            }
            ClientInput::ExecControl { id, control } => {
                let State::Running(turn) = &mut self.state else {
                    return protocol(ProtocolError::BeforeRunRequest("exec control message"));
                };
                step_end(turn.on_exec_control(id, control, &mut self.downlink).await)
            }
            ClientInput::KvResult { id, payload } => {
                let State::Running(turn) = &mut self.state else {
                    return protocol(ProtocolError::Kv(format!(
                        "KV result for KV id {id}, which was never issued"
                    )));
                };
                step_end(turn.on_kv_result(id, payload, &mut self.downlink).await)
            }
            ClientInput::InteractionResponse { id, payload } => {
                let State::Running(turn) = &mut self.state else {
                    return protocol(ProtocolError::BeforeRunRequest("interaction response"));
                };
                step_end(
                    turn.on_interaction_response(id, payload, &mut self.downlink)
                        .await,
                )
            }
            ClientInput::Unsupported(what) => protocol(ProtocolError::Unsupported(what)),
        }
    }

    /// Stops the run that still works on `conversation_id` (the user sent a new message while it
    /// ran) and waits for it to end, so the two never write the same history at once.
    async fn take_over_conversation(&mut self, conversation_id: &str) {
        let Some((previous, handle)) = self
            .app
            .runs
            .claim_conversation(conversation_id, &self.request_id)
        else {
            return;
        };
        tracing::info!(request_id = %self.request_id, conversation_id, previous = %previous, "interrupting the conversation's running request");
        let by = self.request_id.clone();
        if handle.send(RunCommand::Superseded { by }).await.is_ok()
            && tokio::time::timeout(SUPERSEDE_WAIT, handle.done().cancelled())
                .await
                .is_err()
        {
            tracing::warn!(request_id = %self.request_id, previous = %previous, "the interrupted run did not end in time; going on");
        }
    }

    /// A run can end before its RunSSE arrives (a fast failure); keep its frames for a while so the
    /// client still sees how it ended.
    async fn deliver_backlog(&mut self) {
        if !self.downlink.has_undelivered() {
            return;
        }
        let wait = self
            .app
            .config
            .run_request_timeout
            .min(Duration::from_secs(30));
        let deadline = Instant::now() + wait;
        loop {
            tokio::select! {
                command = self.commands.recv() => match command {
                    Some(RunCommand::AttachDownlink(sink)) => {
                        self.downlink.attach(sink).await;
                        return;
                    }
                    Some(_) => {}
                    None => return,
                },
                _ = tokio::time::sleep_until(deadline) => return,
                _ = self.app.shutdown.cancelled() => return,
            }
        }
    }
}

/// After the loop: keeps answering KV results until the built checkpoint is published (or the wait
/// times out: the turn stays done, only the client's copy of the state is older). Returns whether
/// it was published.
async fn settle_checkpoints(
    turn: &mut TurnLoop,
    commands: &mut mpsc::Receiver<RunCommand>,
    downlink: &mut Downlink,
    app: &AppState,
    request_id: &str,
) -> bool {
    let deadline = Instant::now() + app.config.checkpoint_ack_timeout;
    let mut resend = tokio::time::interval(app.config.kv_retry_after);
    resend.reset();
    while !turn.checkpoints_settled() {
        tokio::select! {
            _ = resend.tick() => turn.resend_overdue_blobs(downlink).await,
            command = commands.recv() => match command {
                Some(RunCommand::Ordered(ClientInput::KvResult { id, payload }))
                | Some(RunCommand::Appended { input: ClientInput::KvResult { id, payload }, .. }) => {
                    // Appends after turn_ended are answers to our SETs; their order does not matter.
                    if let Err(e) = turn.on_kv_result(id, payload, downlink).await {
                        tracing::warn!(request_id, "KV result after turn_ended: {e}");
                    }
                }
                Some(RunCommand::AttachDownlink(sink)) => downlink.attach(sink).await,
                // A new run owns the conversation now: stop waiting, it must not be held up.
                Some(RunCommand::Superseded { .. }) => return false,
                Some(other) => tracing::debug!(request_id, "ignored after turn_ended: {other:?}"),
                None => return false,
            },
            _ = tokio::time::sleep_until(deadline) => {
                tracing::warn!(request_id, "the client did not store the final checkpoint's blobs in time");
                return false;
            }
            _ = app.shutdown.cancelled() => return false,
            _ = downlink.closed() => return false,
        }
    }
    true
}

/// Maps a loop step to the run's end, if it is one.
fn step_end(step: Result<LoopStep, ServerError>) -> Option<RunEnd> {
    match step {
        Ok(LoopStep::Continue) => None,
        Ok(LoopStep::TurnComplete { usage }) => Some(RunEnd::Success { usage }),
        Err(error) => Some(RunEnd::Failed(error)),
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
        State::AwaitingRunRequest => std::future::pending().await,
    }
}
