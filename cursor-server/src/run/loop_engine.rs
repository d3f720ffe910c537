//! The turn loop: commit the user message, project history, call the provider, stream its text and
//! thinking, run the model's tool calls as one parallel batch, and call the provider again once the
//! whole batch is complete — until the model answers without tool calls.
//!
//! A turn is `Turn` (what holds for the whole run) plus `Phase`, whose variants carry the data only
//! they need: the import in progress, the streaming call and its draft, the compaction call and its
//! summary, the tool batch. Opening a turn is `run/opening.rs`, the batch `run/batch.rs`, compaction
//! `run/compaction.rs`. It consumes only canonical `ResponseEvent`s and opaque exec payloads, and
//! emits only through `client::interaction` / `tools`; it never looks at provider JSON or
//! protobuf oneofs.
//!
//! Length: the phases and every transition between them (a provider event, an exec result, a
//! response, a control message, a call moved to the background, the endings) read as one state
//! machine; each transition is short and routes to the phase file that owns the work.

use std::sync::Arc;
use std::time::Instant;

use super::batch::{Batch, SearchDone};
use super::compaction::{self, AfterCompaction, Compaction};
use super::lifecycle::RunEnd;
use super::opening::{self, First, Import};
use super::turn::{CallEnd, ProviderCall, Turn};
use crate::client::command::{ExecControl, RunAction, RunRequestInput};
use crate::client::downlink::Downlink;
use crate::client::interaction;
use crate::error::ProtocolError;
use crate::error::ServerError;
use crate::model::conversation::Mode;
use crate::model::message::latest_compaction;
use crate::model::message::{AssistantMessage, CanonicalMessage, ProviderReplay, ThinkingSpan};
use crate::model::runtime_tag::BackgroundKind;
use crate::model::tool::ToolCall;
use crate::model::usage::Usage;
use crate::ops::metrics;
use crate::provider::{FinishReason, ProviderError, ResponseEvent};
use crate::state::AppState;
use crate::store::StoreError;
use crate::store::now_ms;
use crate::store::runs::CallPurpose;
use crate::sync::blob_sync::KvPayload;
use crate::tools::ToolKind;
use crate::tools::edit::FieldStreamer;
use crate::tools::exec::{ExecKind, ExecPayload, QueryPayload};
use crate::tools::pending::Match;

/// What the loop waits for besides client input.
#[derive(Debug)]
pub enum LoopEvent {
    /// The streaming provider call's next event (or how it failed).
    Provider(Result<ResponseEvent, ProviderError>),
    /// A web search the server ran for an approved WebSearch call.
    SearchDone(SearchDone),
}

/// What the loop wants after an event.
#[derive(Debug)]
pub enum LoopStep {
    Continue,
    /// The turn is over; `usage` is the sum over the run's provider calls.
    TurnComplete {
        usage: Usage,
    },
}

impl LoopStep {
    /// The run's end a loop step means, if it is one.
    pub fn run_end(step: Result<LoopStep, ServerError>) -> Option<RunEnd> {
        match step {
            Ok(LoopStep::Continue) => None,
            Ok(LoopStep::TurnComplete { usage }) => Some(RunEnd::Success { usage }),
            Err(error) => Some(RunEnd::Failed(error)),
        }
    }
}

/// A tool call as it streams in.
#[derive(Debug)]
struct DraftCall {
    call_id: String,
    provider_call_id: String,
    name: String,
    arguments: String,
    /// `None` for a name the registry does not know (no card is drawn for it).
    kind: Option<ToolKind>,
    /// Decodes file content out of the arguments as they stream (Write).
    content: Option<FieldStreamer>,
}

/// The assistant message being streamed by the current provider call.
#[derive(Debug, Default)]
struct Draft {
    text: String,
    thinking: String,
    replay: Option<ProviderReplay>,
    /// Set while a thinking segment is open (monotonic clock).
    thinking_since: Option<Instant>,
    /// The open thinking segment's length in bytes of `thinking`.
    thinking_segment_bytes: usize,
    /// The closed thinking segments (the committed message's thinking steps).
    thinking_spans: Vec<ThinkingSpan>,
    usage: Option<Usage>,
    calls: Vec<DraftCall>,
}

/// A provider call writing the assistant's answer.
pub(super) struct Streaming {
    call: ProviderCall,
    draft: Draft,
    /// The model step this call is (`step_started` went out with its id when the model began
    /// answering), and when it began.
    step: Option<(u64, Instant)>,
}

/// A provider call writing the summary of older history.
pub(super) struct Compacting {
    call: ProviderCall,
    compaction: Compaction,
}

/// Where the turn is, with the data only that phase has.
pub(super) enum Phase {
    /// Fetching blobs only the client holds before the turn can start.
    Importing(Import),
    Streaming(Streaming),
    Compacting(Compacting),
    /// Tool calls are running; the next provider call waits for all of them.
    Tools(Batch),
    /// Nothing more to do in this turn.
    Done,
}

pub struct TurnLoop {
    pub(super) turn: Turn,
    pub(super) phase: Phase,
    /// Model steps announced so far (`step_started` ids count from 1).
    steps: u64,
}

impl TurnLoop {
    /// Opens the run (`opening::open`: its record, the user's message) and takes its first step.
    /// A user's message's opening commit runs once its provider call has left
    /// (`opening::PendingOpening`): the provider prepares its answer meanwhile, and the run reads
    /// none of it before the commit ended. A commit that found the history moved (another run
    /// wrote meanwhile) drops that call and opens the run again from the store, committing before
    /// calling.
    pub(super) async fn start(
        app: Arc<AppState>,
        request_id: &str,
        input: RunRequestInput,
        prefetched: Option<opening::Prefetched>,
        out: &mut Downlink,
    ) -> Result<(TurnLoop, LoopStep), ServerError> {
        let again = matches!(input.action, RunAction::UserMessage { .. })
            .then(|| opening::without_client_state(&input));
        let ahead = opening::Ahead {
            defer: true,
            reads: prefetched,
        };
        let (turn, first, pending) =
            opening::open(Arc::clone(&app), request_id, input, out, ahead).await?;
        let mut turn = TurnLoop {
            turn,
            phase: Phase::Done,
            steps: 0,
        };
        let begun = turn.begin(first, out).await;
        let Some(pending) = pending else {
            return Ok((turn, begun?));
        };
        let step = match begun {
            Ok(step) => step,
            Err(error) => {
                pending.start.write_alone(&app.store).await?;
                return Err(error);
            }
        };
        let Err((error, start)) = pending
            .commit(&app.store, &mut turn.turn.checkpoints, out)
            .await
        else {
            return Ok((turn, step));
        };
        // The call (if any) is dropped unread: nothing of it reached the client.
        turn.phase = Phase::Done;
        match (error, again) {
            (ServerError::Store(StoreError::HistoryMoved { .. }), Some(input)) => {
                tracing::info!(
                    request_id,
                    "the conversation changed while the run opened; reading it again"
                );
                drop(turn);
                let ahead = opening::Ahead::default();
                let (turn, first, _) = opening::open(app, request_id, input, out, ahead).await?;
                let mut turn = TurnLoop {
                    turn,
                    phase: Phase::Done,
                    steps: 0,
                };
                let step = turn.begin(first, out).await?;
                Ok((turn, step))
            }
            (error, _) => {
                start.write_alone(&app.store).await?;
                Err(error)
            }
        }
    }

    pub(super) fn complete(&mut self) -> LoopStep {
        self.phase = Phase::Done;
        LoopStep::TurnComplete {
            usage: self.turn.usage,
        }
    }

    /// Calls the model with the history so far — first compacting it, if the prompt would fill
    /// more of the context window than the configured share.
    pub(super) fn start_provider_call(&mut self) {
        self.turn.use_primary();
        let turn = &self.turn;
        let mut body = turn.project(&turn.system, &turn.history, &turn.offered_tools);
        if compaction::due(turn, body.len()) && self.turn.use_context_fallback() {
            let turn = &self.turn;
            body = turn.project(&turn.system, &turn.history, &turn.offered_tools);
        }
        let turn = &self.turn;
        if compaction::due(turn, body.len())
            && let Some(through) = compaction::point(turn)
        {
            self.start_compaction(through, AfterCompaction::ProviderCall);
            return;
        }
        let call = self.turn.send(body, CallPurpose::Turn);
        self.phase = Phase::Streaming(Streaming {
            call,
            draft: Draft::default(),
            step: None,
        });
    }

    /// Asks the model (with the compaction prompt, no tools) to summarize `history[..through]`.
    pub(super) fn start_compaction(&mut self, through: usize, then: AfterCompaction) {
        let (compaction, body) = Compaction::request(&self.turn, through, then);
        let call = self.turn.send(body, CallPurpose::Compaction);
        self.phase = Phase::Compacting(Compacting { call, compaction });
    }

    /// Starts every call of a batch at once; results may come back in any order.
    pub(super) async fn start_batch(
        &mut self,
        calls: Vec<(u32, ToolCall)>,
        out: &mut Downlink,
    ) -> Result<LoopStep, ServerError> {
        let batch = Batch::start(&mut self.turn, calls, out).await?;
        self.phase = Phase::Tools(batch);
        Ok(self.after_completion())
    }

    /// Starts the next provider call once every call of the batch has its result.
    fn after_completion(&mut self) -> LoopStep {
        if matches!(&self.phase, Phase::Tools(batch) if batch.complete()) {
            self.start_provider_call();
        }
        LoopStep::Continue
    }

    /// The next provider event or finished server-side search.
    pub async fn next_event(&mut self) -> LoopEvent {
        let event = match &mut self.phase {
            Phase::Streaming(Streaming { call, .. })
            | Phase::Compacting(Compacting { call, .. }) => call.events.recv().await,
            Phase::Tools(batch) => return LoopEvent::SearchDone(batch.next_search().await),
            Phase::Importing(_) | Phase::Done => std::future::pending().await,
        };
        LoopEvent::Provider(event.unwrap_or_else(|| {
            Err(ProviderError::Truncated {
                provider: self.turn.provider.name.clone(),
                missing: "terminal event",
            })
        }))
    }

    /// Routes what `next_event` returned.
    pub async fn on_loop_event(
        &mut self,
        event: LoopEvent,
        out: &mut Downlink,
    ) -> Result<LoopStep, ServerError> {
        match event {
            LoopEvent::Provider(Ok(event)) => {
                if let Some(timing) = self.call_timing() {
                    timing.first_event.get_or_insert(timing.started.elapsed());
                }
                if let ResponseEvent::Finished(reason) = &event {
                    self.record_call(CallEnd::Finished(reason.as_str().to_owned()))
                        .await;
                }
                self.on_event(event, out).await
            }
            LoopEvent::Provider(Err(error)) => {
                let streamed = self
                    .call_timing()
                    .is_none_or(|timing| timing.first_event.is_some());
                self.record_call(CallEnd::Failed(&error)).await;
                if !streamed && error.falls_back() && self.fall_back(&error) {
                    return Ok(LoopStep::Continue);
                }
                if matches!(self.phase, Phase::Compacting(_)) {
                    return Err(ServerError::Compaction(error));
                }
                Err(error.into())
            }
            LoopEvent::SearchDone(done) => {
                if let Phase::Tools(batch) = &mut self.phase {
                    batch.on_search_done(&mut self.turn, done, out).await?;
                }
                Ok(self.after_completion())
            }
        }
    }

    /// A turn call that failed before streaming goes to the next fallback of the run's model,
    /// projected for that model's family (thinking another family cannot take stays in history
    /// and out of the request); `false` when there is none (the run fails with `error`).
    fn fall_back(&mut self, error: &ProviderError) -> bool {
        if !matches!(self.phase, Phase::Streaming(_)) || !self.turn.use_next_fallback() {
            return false;
        }
        let turn = &self.turn;
        tracing::warn!(
            from = turn.route.fallback_from.as_deref().unwrap_or_default(),
            to = %turn.model.id,
            "the call failed before streaming ({error}); trying the model's fallback"
        );
        metrics::fallback(
            turn.route.fallback_from.as_deref().unwrap_or_default(),
            &turn.model.id,
        );
        let body = turn.project(&turn.system, &turn.history, &turn.offered_tools);
        let call = self.turn.send(body, CallPurpose::Turn);
        self.phase = Phase::Streaming(Streaming {
            call,
            draft: Draft::default(),
            step: None,
        });
        true
    }

    fn call_timing(&mut self) -> Option<&mut super::turn::CallTiming> {
        match &mut self.phase {
            Phase::Streaming(Streaming { call, .. })
            | Phase::Compacting(Compacting { call, .. }) => call.timing.as_mut(),
            _ => None,
        }
    }

    /// Records the call in flight, ended by `finish_reason` or `error`.
    async fn record_call(&mut self, end: CallEnd<'_>) {
        let (call, usage) = match &mut self.phase {
            Phase::Streaming(s) => (&mut s.call, s.draft.usage),
            Phase::Compacting(c) => (&mut c.call, c.compaction.usage),
            _ => return,
        };
        self.turn.record_call(call, usage, end).await;
    }

    /// Whether the run is waiting on the client's machine (tool results, blobs) rather than on the
    /// provider, a server-side search or the user's answer to a question.
    pub fn waiting_on_client(&self) -> bool {
        match &self.phase {
            Phase::Importing(_) => true,
            Phase::Tools(_) => self.turn.pending.has_running_exec(),
            Phase::Streaming(_) | Phase::Compacting(_) | Phase::Done => false,
        }
    }

    pub fn provider_calls(&self) -> u32 {
        self.turn.provider_calls
    }

    /// The mode the turn is in now (it may have switched).
    pub fn mode(&self) -> Mode {
        self.turn.mode()
    }

    /// Usage summed over completed provider calls so far.
    pub fn usage(&self) -> Usage {
        self.turn.usage
    }

    pub async fn on_event(
        &mut self,
        event: ResponseEvent,
        out: &mut Downlink,
    ) -> Result<LoopStep, ServerError> {
        match &mut self.phase {
            Phase::Compacting(compacting) => {
                if compacting.compaction.on_event(event, &mut self.turn.usage) {
                    return self.finish_compaction(out).await;
                }
            }
            Phase::Streaming(streaming) => {
                if streaming.step.is_none() {
                    self.steps += 1;
                    streaming.step = Some((self.steps, Instant::now()));
                    out.send_message(&interaction::step_started(self.steps))
                        .await;
                }
                if let ResponseEvent::Finished(reason) = event {
                    streaming.close_thinking(out).await;
                    warn_unfinished(&self.turn, &reason);
                    return self.complete_call(out).await;
                }
                streaming.on_event(&mut self.turn, event, out).await?;
            }
            Phase::Importing(_) | Phase::Tools(_) | Phase::Done => {}
        }
        Ok(LoopStep::Continue)
    }

    /// Stores the summary and goes on with what the compaction was for.
    async fn finish_compaction(&mut self, out: &mut Downlink) -> Result<LoopStep, ServerError> {
        let Phase::Compacting(compacting) = std::mem::replace(&mut self.phase, Phase::Done) else {
            return Ok(LoopStep::Continue);
        };
        match compacting.compaction.finish(&mut self.turn, out).await? {
            AfterCompaction::ProviderCall => {
                self.start_provider_call();
                Ok(LoopStep::Continue)
            }
            AfterCompaction::EndTurn => Ok(self.complete()),
        }
    }

    /// Commits the streamed assistant message; ends the turn or starts its tool batch.
    async fn complete_call(&mut self, out: &mut Downlink) -> Result<LoopStep, ServerError> {
        let Phase::Streaming(streaming) = std::mem::replace(&mut self.phase, Phase::Done) else {
            return Ok(LoopStep::Continue);
        };
        if let Some((step, started)) = streaming.step {
            out.send_message(&interaction::step_completed(step, started.elapsed()))
                .await;
        }
        let draft = streaming.draft;
        if let Some(usage) = &draft.usage {
            self.turn.count_usage(usage);
        }
        let calls: Vec<ToolCall> = draft
            .calls
            .into_iter()
            .map(|call| ToolCall {
                call_id: call.call_id,
                provider_call_id: call.provider_call_id,
                name: call.name,
                arguments: call.arguments,
            })
            .collect();
        let turn = &mut self.turn;
        let assistant = AssistantMessage {
            thinking_spans: Vec::new(),
            text: draft.text,
            thinking: draft.thinking,
            model_id: turn.model_id().to_owned(),
            replay: draft.replay,
            model_call_id: turn.model_call_id.clone(),
            planned_calls: calls.clone(),
        };
        let message = CanonicalMessage::Assistant(assistant);
        turn.append(std::slice::from_ref(&message)).await?;
        turn.checkpoints
            .committed(std::slice::from_ref(&message), out)
            .await?;
        turn.history.push(message);
        if calls.is_empty() {
            return Ok(self.complete());
        }
        let indexed = calls
            .into_iter()
            .enumerate()
            .map(|(index, call)| (u32::try_from(index).unwrap_or(u32::MAX), call))
            .collect();
        self.start_batch(indexed, out).await
    }

    /// A client answer to a KV request.
    pub async fn on_kv_result(
        &mut self,
        id: u32,
        payload: KvPayload,
        out: &mut Downlink,
    ) -> Result<LoopStep, ServerError> {
        let turn = &mut self.turn;
        let read = turn.checkpoints.on_kv(id, payload, out).await?;
        let Phase::Importing(import) = &mut self.phase else {
            return Ok(LoopStep::Continue);
        };
        if import.on_read(read, &self.turn.request_id) {
            let Phase::Importing(import) = std::mem::replace(&mut self.phase, Phase::Done) else {
                return Ok(LoopStep::Continue);
            };
            import.finish(&mut self.turn, out).await?;
            self.start_provider_call();
        }
        Ok(LoopStep::Continue)
    }

    /// The batch slot an answer (exec result or interaction response) of `kind` for `id` belongs
    /// to; `None` for a late answer, ignored idempotently, or for one of the wrong kind, which
    /// fails its call (logged; the turn goes on); a protocol error for an unknown id.
    async fn active_slot(
        &mut self,
        id: u32,
        kind: ExecKind,
        out: &mut Downlink,
    ) -> Result<Option<usize>, ServerError> {
        match self.turn.pending.match_result(id, kind) {
            Ok(Match::Active { slot }) => Ok(Some(slot)),
            Ok(Match::Late) => {
                tracing::info!(id, %kind, "late answer ignored");
                Ok(None)
            }
            Ok(Match::WrongKind { slot, expected }) => {
                tracing::warn!(id, %expected, got = %kind, "the client answered with the wrong kind of result; the call fails and the turn goes on");
                self.turn.pending.finish(id);
                if let Phase::Tools(batch) = &mut self.phase {
                    batch
                        .on_wrong_result(&mut self.turn, slot, expected, kind, out)
                        .await?;
                }
                Ok(None)
            }
            Err(e) => Err(ProtocolError::Exec(e.to_string()).into()),
        }
    }

    /// A client result for exec `id`.
    pub async fn on_exec_result(
        &mut self,
        id: u32,
        payload: ExecPayload,
        out: &mut Downlink,
    ) -> Result<LoopStep, ServerError> {
        let Some(slot) = self.active_slot(id, payload.kind(), out).await? else {
            return Ok(self.after_completion());
        };
        if !self.turn.pending.is_streaming(id) {
            self.turn.pending.finish(id);
        }
        if let Phase::Tools(batch) = &mut self.phase {
            batch.on_result(&mut self.turn, slot, payload, out).await?;
        }
        Ok(self.after_completion())
    }

    /// The user's response to interaction query `id`.
    pub async fn on_interaction_response(
        &mut self,
        id: u32,
        payload: QueryPayload,
        out: &mut Downlink,
    ) -> Result<LoopStep, ServerError> {
        let Some(slot) = self.active_slot(id, payload.kind(), out).await? else {
            return Ok(self.after_completion());
        };
        self.turn.pending.finish(id);
        if let Phase::Tools(batch) = &mut self.phase {
            batch
                .on_response(&mut self.turn, slot, payload, out)
                .await?;
        }
        Ok(self.after_completion())
    }

    /// The user moved the running call `tool_call_id` to the background: it completes as
    /// backgrounded with what it produced so far, and the batch goes on without waiting for it.
    pub async fn move_to_background(
        &mut self,
        tool_call_id: &str,
        kind: BackgroundKind,
        out: &mut Downlink,
    ) -> Result<LoopStep, ServerError> {
        let Phase::Tools(batch) = &mut self.phase else {
            tracing::warn!(
                tool_call_id,
                ?kind,
                "moved to the background while no tool runs; nothing to move"
            );
            return Ok(LoopStep::Continue);
        };
        batch
            .move_to_background(&mut self.turn, tool_call_id, kind, out)
            .await?;
        Ok(self.after_completion())
    }

    /// `stream_close` / `throw` for exec `id`.
    pub async fn on_exec_control(
        &mut self,
        id: u32,
        control: ExecControl,
        out: &mut Downlink,
    ) -> Result<LoopStep, ServerError> {
        let slot = match self.turn.pending.match_control(id) {
            // A control message has no kind to mismatch: it is for the exec's call either way.
            Ok(Match::Active { slot } | Match::WrongKind { slot, .. }) => slot,
            Ok(Match::Late) => {
                // A stream_close after a shell's exit is the normal end of that exec.
                tracing::debug!(exec_id = id, ?control, "control for a finished exec");
                return Ok(LoopStep::Continue);
            }
            Err(e) => return Err(ProtocolError::Exec(e.to_string()).into()),
        };
        if let Phase::Tools(batch) = &mut self.phase {
            batch.on_control(&mut self.turn, slot, control, out).await?;
        }
        Ok(self.after_completion())
    }

    /// The run is ending early: abort running execs and bring every drawn card to a terminal
    /// (error) state. Completed tools stay in history; nothing unfinished is persisted.
    pub async fn abandon(&mut self, reason: &str, out: &mut Downlink) {
        self.record_call(CallEnd::Abandoned(reason)).await;
        let turn = &mut self.turn;
        for (id, _) in turn.pending.running() {
            out.send_message(&crate::tools::exec::abort(id)).await;
            turn.pending.finish(id);
        }
        match &mut self.phase {
            Phase::Tools(batch) => batch.abandon(turn, reason, out).await,
            Phase::Streaming(streaming) => {
                for call in std::mem::take(&mut streaming.draft.calls) {
                    if let Some(kind) = call.kind {
                        out.send_message(&interaction::tool_call_completed(
                            &call.call_id,
                            Box::new(kind.invalid_card(reason)),
                            &turn.model_call_id,
                        ))
                        .await;
                    }
                }
            }
            Phase::Importing(_) | Phase::Compacting(_) | Phase::Done => {}
        }
    }

    /// The turn is over: builds the transitional checkpoint (its complete history) and the final
    /// one (adding the turn's timing); both are published after `turn_ended`
    /// (`release_checkpoints`), once the client has stored their blobs.
    pub async fn final_checkpoints(&mut self, out: &mut Downlink) -> Result<(), ServerError> {
        let ended_at = u64::try_from(now_ms()).unwrap_or(0);
        let turn = &mut self.turn;
        let transitional = turn.state_details(Vec::new(), None);
        let last = turn.state_details(Vec::new(), Some(ended_at));
        turn.checkpoints
            .finish_turn(&transitional, &last, out)
            .await
    }

    pub async fn release_checkpoints(&mut self, out: &mut Downlink) -> Result<(), ServerError> {
        self.turn.checkpoints.release(out).await
    }

    /// A checkpoint of what is committed (a failed run publishes it before its error).
    pub async fn committed_checkpoint(&mut self, out: &mut Downlink) -> Result<(), ServerError> {
        let details = self.turn.state_details(Vec::new(), None);
        self.turn.checkpoints.checkpoint(&details, out).await
    }

    /// Sends again the blobs whose ACK is overdue.
    pub async fn resend_overdue_blobs(&mut self, out: &mut Downlink) {
        let after = self.turn.app.config.kv_retry_after;
        self.turn.checkpoints.resend_overdue(after, out).await;
    }

    /// Whether every checkpoint built so far has been published.
    pub fn checkpoints_settled(&self) -> bool {
        self.turn.checkpoints.settled()
    }

    /// The run is over, however it ended: what the client acknowledged and no publication
    /// recorded yet is recorded now, so the next run does not send those blobs again.
    ///
    /// What the client holds goes back to the history cache for the next run start: recorded or
    /// not, the client stored each of those blobs.
    pub async fn keep_acks(&mut self) {
        if let Err(e) = self.turn.checkpoints.keep_acks().await {
            tracing::warn!("recording the client's blob acknowledgements: {e}");
        }
        let acked = self.turn.checkpoints.take_acked();
        let turn = &self.turn;
        turn.app
            .history
            .keep_acked(&turn.tool_env.conversation_id, acked);
    }

    /// What the turn ended with, for the sidebar's summary: the model's last answer.
    pub fn summary(&self) -> String {
        self.turn
            .history
            .iter()
            .rev()
            .find_map(|message| match message {
                CanonicalMessage::Assistant(assistant) => Some(assistant.text.trim().to_owned()),
                _ => None,
            })
            .unwrap_or_default()
    }

    /// The final checkpoint once more.
    pub async fn republish_checkpoint(&self, out: &mut Downlink) {
        self.turn.checkpoints.republish(out).await;
    }
}

fn warn_unfinished(turn: &Turn, reason: &FinishReason) {
    match reason {
        FinishReason::Stop | FinishReason::ToolCalls => {}
        other => tracing::warn!(
            model_call_id = %turn.model_call_id,
            "provider finished with {other:?}; the answer may be incomplete"
        ),
    }
}

impl Streaming {
    /// One streamed event of the answer (`Finished` is the loop's).
    async fn on_event(
        &mut self,
        turn: &mut Turn,
        event: ResponseEvent,
        out: &mut Downlink,
    ) -> Result<(), ServerError> {
        match event {
            ResponseEvent::ReasoningDelta(text) => {
                let draft = &mut self.draft;
                draft.thinking_since.get_or_insert_with(Instant::now);
                draft.thinking.push_str(&text);
                draft.thinking_segment_bytes += text.len();
                let tokens = interaction::token_delta(&text);
                out.send_together(&interaction::thinking_delta(text), &tokens)
                    .await;
            }
            ResponseEvent::TextDelta(text) => {
                self.close_thinking(out).await;
                self.draft.text.push_str(&text);
                let tokens = interaction::token_delta(&text);
                out.send_together(&interaction::text_delta(text), &tokens)
                    .await;
            }
            ResponseEvent::ToolCallStart { index, id, name } => {
                self.close_thinking(out).await;
                self.on_tool_start(turn, index, id, name, out).await?;
            }
            ResponseEvent::ToolArgsDelta { index, fragment } => {
                self.on_args_delta(turn, index, fragment, out).await?;
            }
            ResponseEvent::Usage(usage) => self.draft.usage = Some(usage),
            ResponseEvent::Replay(replay) => self.draft.replay = Some(replay),
            ResponseEvent::Finished(_) => {}
        }
        Ok(())
    }

    async fn on_tool_start(
        &mut self,
        turn: &Turn,
        index: usize,
        id: String,
        name: String,
        out: &mut Downlink,
    ) -> Result<(), ServerError> {
        if index != self.draft.calls.len() {
            return Err(turn.provider_error(format!("tool call {index} started out of order")));
        }
        let kind = ToolKind::of(&name, &turn.tool_env);
        let call_id = format!("tool_{}_{index}", turn.model_call_id);
        if let Some(kind) = kind {
            let placeholder = interaction::partial_tool_call(
                &call_id,
                kind.placeholder(),
                String::new(),
                &turn.model_call_id,
            );
            out.send_message(&placeholder).await;
        }
        self.draft.calls.push(DraftCall {
            call_id,
            provider_call_id: id,
            name,
            arguments: String::new(),
            content: kind
                .and_then(ToolKind::streamed_content_field)
                .map(FieldStreamer::new),
            kind,
        });
        Ok(())
    }

    async fn on_args_delta(
        &mut self,
        turn: &Turn,
        index: usize,
        fragment: String,
        out: &mut Downlink,
    ) -> Result<(), ServerError> {
        let Some(call) = self.draft.calls.get_mut(index) else {
            return Err(turn.provider_error(format!(
                "arguments for tool call {index}, which never started"
            )));
        };
        call.arguments.push_str(&fragment);
        if let Some(streamer) = &mut call.content {
            // Edits show the file content being written, not the JSON around it.
            let content = streamer.feed(&fragment);
            if !content.is_empty() {
                let delta =
                    interaction::edit_content_delta(&call.call_id, content, &turn.model_call_id);
                out.send_message(&delta).await;
            }
        } else if let Some(kind) = call.kind {
            let delta = interaction::partial_tool_call(
                &call.call_id,
                kind.placeholder(),
                fragment,
                &turn.model_call_id,
            );
            out.send_message(&delta).await;
        }
        Ok(())
    }

    async fn close_thinking(&mut self, out: &mut Downlink) {
        if let Some(since) = self.draft.thinking_since.take() {
            let elapsed = since.elapsed().as_millis();
            out.send_message(&interaction::thinking_completed(elapsed))
                .await;
            // The segment becomes a thinking step when the message is committed, never before.
            let bytes = std::mem::take(&mut self.draft.thinking_segment_bytes);
            self.draft.thinking_spans.push(ThinkingSpan {
                bytes: u32::try_from(bytes).unwrap_or(u32::MAX),
                ms: u32::try_from(elapsed.max(1)).unwrap_or(u32::MAX),
            });
        }
    }
}

impl TurnLoop {
    /// The turn's first step, as its opener decided.
    async fn begin(&mut self, first: First, out: &mut Downlink) -> Result<LoopStep, ServerError> {
        match first {
            First::Import(import) => {
                self.phase = Phase::Importing(*import);
                Ok(LoopStep::Continue)
            }
            First::Call => {
                self.start_provider_call();
                Ok(LoopStep::Continue)
            }
            First::Resume => self.resume(out).await,
            First::Summarize => {
                let history = &self.turn.history;
                match latest_compaction(history) {
                    Some((at, _, _)) if at + 1 == history.len() => Ok(self.complete()),
                    _ if history.is_empty() => Ok(self.complete()),
                    _ => {
                        self.start_compaction(history.len(), AfterCompaction::EndTurn);
                        Ok(LoopStep::Continue)
                    }
                }
            }
            First::Complete => Ok(self.complete()),
        }
    }

    /// Continues where the conversation stopped: runs the calls of the last tool batch that have
    /// no stored result (completed ones never run twice), or asks the model again if the batch was
    /// complete or the last turn never got an answer; otherwise there is nothing to do.
    async fn resume(&mut self, out: &mut Downlink) -> Result<LoopStep, ServerError> {
        let history = &self.turn.history;
        let last_assistant = history.iter().rev().find_map(|m| match m {
            CanonicalMessage::Assistant(a) => Some(a.clone()),
            _ => None,
        });
        let answered_last = matches!(history.last(), Some(CanonicalMessage::Assistant(a)) if a.planned_calls.is_empty());
        match last_assistant {
            Some(assistant) if !assistant.planned_calls.is_empty() => {
                let unfinished = unfinished_calls(history, &assistant);
                tracing::info!(
                    unfinished = unfinished.len(),
                    of = assistant.planned_calls.len(),
                    "resuming a tool batch"
                );
                self.turn.model_call_id = assistant.model_call_id.clone();
                self.start_batch(unfinished, out).await
            }
            _ if answered_last || history.is_empty() => Ok(self.complete()),
            _ => {
                self.start_provider_call();
                Ok(LoopStep::Continue)
            }
        }
    }
}

/// The planned calls of `assistant` without a stored result, with their positions.
fn unfinished_calls(
    history: &[CanonicalMessage],
    assistant: &crate::model::message::AssistantMessage,
) -> Vec<(u32, ToolCall)> {
    assistant
        .planned_calls
        .iter()
        .enumerate()
        .map(|(i, call)| (u32::try_from(i).unwrap_or(u32::MAX), call.clone()))
        .filter(|(index, _)| {
            !history.iter().any(|m| {
                matches!(m, CanonicalMessage::ToolResult(r)
                    if r.model_call_id == assistant.model_call_id && r.index == *index)
            })
        })
        .collect()
}
