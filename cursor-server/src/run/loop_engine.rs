//! The turn loop: commit the user message, project history, call the provider, stream its text and
//! thinking, run the model's tool calls as one parallel batch, and call the provider again once the
//! whole batch is complete — until the model answers without tool calls.
//!
//! A turn is `Turn` (what holds for the whole run) plus `Phase`, whose variants carry the data only
//! they need: the import in progress, the streaming call and its draft, the compaction call and its
//! summary, the tool batch. Opening a turn is `run/opening.rs`, the batch `run/batch.rs`, compaction
//! `run/compaction.rs`. It consumes only canonical `ResponseEvent`s and opaque exec payloads, and
//! emits only through `cursor::interaction` / `cursor::tools`; it never looks at provider JSON or
//! protobuf oneofs.

use std::sync::Arc;
use std::time::Instant;

use tokio_util::sync::{CancellationToken, DropGuard};

use super::batch::{Batch, SearchDone};
use super::command::{ExecControl, ProtocolError, RunRequestInput};
use super::compaction::{self, AfterCompaction, Compaction};
use super::lifecycle::Checkpoints;
use super::opening::{self, Import};
use crate::app::AppState;
use crate::config::{ModelConfig, ProviderConfig};
use crate::cursor::blob_sync::KvPayload;
use crate::cursor::checkpoint::StateDetails;
use crate::cursor::exec::{ExecKind, ExecPayload, QueryPayload};
use crate::cursor::interaction;
use crate::cursor::pending::{Match, PendingExecs};
use crate::cursor::run_sse::Downlink;
use crate::cursor::tool_result::ToolEnv;
use crate::cursor::tools::edit::FieldStreamer;
use crate::cursor::tools::{ToolKind, ToolOptions, task, todo};
use crate::error::ServerError;
use crate::model::conversation::{ContextUse, Mode, SubagentRole, SubagentRunState, Todo};
use crate::model::message::{AssistantMessage, CanonicalMessage, ProviderReplay};
use crate::model::tool::ToolCall;
use crate::model::usage::Usage;
use crate::prompting::compiler::{self, RequestParameters};
use crate::prompting::{derived_state, projector};
use crate::provider::{
    self, CallLimits, EventReceiver, FinishReason, ProviderError, RequestBody, ResponseEvent,
};
use crate::store::runs::{self, CallPurpose};
use crate::store::{messages, now_ms};

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

/// Bytes of projected request per token before a provider call has reported its real usage.
const DEFAULT_BYTES_PER_TOKEN: f64 = 4.0;

/// What holds for the whole run, whatever phase it is in.
pub(super) struct Turn {
    pub app: Arc<AppState>,
    pub request_id: String,
    /// The model this run calls, resolved once from Cursor's id.
    pub provider: ProviderConfig,
    pub model: ModelConfig,
    pub parameters: RequestParameters,
    pub history: Vec<CanonicalMessage>,
    /// Exec and query ids of the whole request (one sequence; late answers recognised).
    pub pending: PendingExecs,
    /// What tools see of the run — and the one place its mode, conversation id and model id are
    /// kept.
    pub tool_env: ToolEnv,
    pub checkpoints: Checkpoints,
    pub usage: Usage,
    /// The latest completed provider call's usage (the checkpoint's context use).
    pub last_call_usage: Option<Usage>,
    /// What this request allows beyond the mode's tools, and the resulting tool definitions for
    /// the current mode (recomputed only when the mode changes).
    pub tool_options: ToolOptions,
    pub system: String,
    pub offered_tools: Vec<serde_json::Value>,
    /// Set when another agent's Task call started this run (subagent prompt and tools).
    pub subagent: Option<SubagentRole>,
    /// The subagents this conversation's finished Task calls started (refolded when one ends).
    pub subagent_runs: Vec<SubagentRunState>,
    /// Where this run's messages start in `history` (a compaction keeps them verbatim).
    pub turn_start: usize,
    /// Compactions in this conversation so far (the checkpoint's `self_summary_count`).
    pub compactions: u32,
    /// The size of the last request sent, and bytes per prompt token as the last usage showed.
    pub last_body_bytes: usize,
    pub bytes_per_token: f64,
    pub provider_calls: u32,
    /// The latest provider call (cards and stored messages name it).
    pub model_call_id: String,
}

/// A provider call in flight: its events, its record, and its cancellation when dropped.
pub(super) struct ProviderCall {
    events: EventReceiver,
    timing: Option<CallTiming>,
    _cancel: DropGuard,
}

/// The timing of a provider call, for its record.
#[derive(Debug)]
struct CallTiming {
    purpose: CallPurpose,
    request_bytes: usize,
    started: Instant,
    started_at_ms: i64,
    first_event: Option<std::time::Duration>,
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
    /// The open thinking segment's text (for its checkpoint step).
    thinking_segment: String,
    usage: Option<Usage>,
    calls: Vec<DraftCall>,
}

/// A provider call writing the assistant's answer.
pub(super) struct Streaming {
    call: ProviderCall,
    draft: Draft,
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
}

impl Turn {
    pub fn conversation_id(&self) -> &str {
        &self.tool_env.conversation_id
    }

    pub fn mode(&self) -> Mode {
        self.tool_env.mode
    }

    pub fn model_id(&self) -> &str {
        &self.tool_env.model_id
    }

    pub fn project(
        &self,
        system: &str,
        history: &[CanonicalMessage],
        tools: &[serde_json::Value],
    ) -> RequestBody {
        let request = compiler::compile(system, history, &self.model, tools, self.parameters);
        RequestBody::from_json(&projector::project(self.provider.kind, &request))
    }

    pub fn provider_error(&self, message: String) -> ServerError {
        ProviderError::Decode {
            provider: self.provider.name.clone(),
            message,
        }
        .into()
    }

    /// Starts one streaming provider call with `body`.
    fn send(&mut self, body: RequestBody, purpose: CallPurpose) -> ProviderCall {
        let config = &self.app.config;
        self.last_body_bytes = body.len();
        self.model_call_id = uuid::Uuid::new_v4().to_string();
        tracing::Span::current().record("model_call_id", self.model_call_id.as_str());
        self.provider_calls += 1;
        tracing::debug!(
            request_id = %self.request_id,
            conversation_id = %self.conversation_id(),
            model_call_id = %self.model_call_id,
            provider = %self.provider.name,
            model = %self.model_id(),
            call = self.provider_calls,
            bytes = body.len(),
            purpose = purpose.as_str(),
            "provider call"
        );
        let timing = CallTiming {
            purpose,
            request_bytes: body.len(),
            started: Instant::now(),
            started_at_ms: now_ms(),
            first_event: None,
        };
        let cancel = CancellationToken::new();
        let events = provider::call(
            &self.app.http,
            &self.provider,
            body,
            CallLimits {
                headers_timeout: config.provider_connect_timeout,
                idle_timeout: config.provider_idle_timeout,
                max_attempts: config.provider_max_attempts,
                retry_base_delay: config.provider_retry_base_delay,
            },
            cancel.clone(),
        );
        ProviderCall {
            events,
            timing: Some(timing),
            _cancel: cancel.drop_guard(),
        }
    }

    /// Stores the record of `call` (once per call, when it ends).
    async fn record_call(
        &self,
        call: &mut ProviderCall,
        usage: Option<Usage>,
        finish_reason: Option<String>,
        error: Option<String>,
    ) {
        let Some(timing) = call.timing.take() else {
            return;
        };
        let millis = |d: std::time::Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        let record = runs::ProviderCallRecord {
            model_call_id: self.model_call_id.clone(),
            request_id: self.request_id.clone(),
            conversation_id: self.conversation_id().to_owned(),
            provider: self.provider.name.clone(),
            model_id: self.model_id().to_owned(),
            purpose: timing.purpose,
            request_bytes: timing.request_bytes as u64,
            started_at_ms: timing.started_at_ms,
            first_event_ms: timing.first_event.map(millis),
            total_ms: millis(timing.started.elapsed()),
            usage: usage.unwrap_or_default(),
            finish_reason,
            error,
        };
        tracing::info!(
            request_id = %record.request_id,
            conversation_id = %record.conversation_id,
            model_call_id = %record.model_call_id,
            purpose = record.purpose.as_str(),
            first_event_ms = record.first_event_ms,
            total_ms = record.total_ms,
            input_tokens = record.usage.input_tokens,
            output_tokens = record.usage.output_tokens,
            finish_reason = record.finish_reason.as_deref(),
            error = record.error.as_deref(),
            "provider call ended"
        );
        if let Err(e) = runs::record_provider_call(&self.app.store, &record).await {
            tracing::warn!(request_id = %self.request_id, "recording a provider call: {e}");
        }
    }

    pub async fn append(&self, messages_to_add: &[CanonicalMessage]) -> Result<(), ServerError> {
        messages::append(
            &self.app.store,
            self.conversation_id(),
            &self.request_id,
            messages_to_add,
        )
        .await?;
        Ok(())
    }

    /// What the checkpoint states besides the graph, folded from the run's own state.
    pub fn state_details(
        &self,
        pending_tool_calls: Vec<ToolCall>,
        turn_ended_at_ms: Option<u64>,
    ) -> StateDetails {
        let mut subagent_runs = self.subagent_runs.clone();
        subagent_runs.extend(fold_subagent_runs(
            &[],
            pending_tool_calls
                .iter()
                .filter(|c| c.name == ToolKind::Task.name())
                .map(|c| (c.call_id.as_str(), c.arguments.as_str())),
        ));
        StateDetails {
            subagent_runs,
            summaries: self.compactions,
            pending_tool_calls,
            todos: self.tool_env.todos.clone(),
            mode: Some(self.mode()),
            context: self.last_call_usage.map(|usage| ContextUse {
                used_tokens: usage.input_tokens.unwrap_or(0) + usage.output_tokens.unwrap_or(0),
                max_tokens: u64::from(self.model.context_window),
            }),
            turn_ended_at_ms,
        }
    }

    /// Counts a finished call's usage into the run and the bytes-per-token estimate.
    fn count_usage(&mut self, usage: &Usage) {
        if let Some(input_tokens) = usage.input_tokens.filter(|t| *t > 0) {
            self.bytes_per_token =
                (self.last_body_bytes as f64 / input_tokens as f64).clamp(1.0, 16.0);
        }
        self.last_call_usage = Some(*usage);
        self.usage.accumulate(usage);
    }
}

impl TurnLoop {
    /// Records the run, commits the user message and starts the first provider call.
    pub async fn start(
        app: Arc<AppState>,
        request_id: &str,
        input: RunRequestInput,
        out: &mut Downlink,
    ) -> Result<(TurnLoop, LoopStep), ServerError> {
        opening::open(app, request_id, input, out).await
    }

    pub(super) fn new(turn: Turn) -> TurnLoop {
        TurnLoop {
            turn,
            phase: Phase::Done,
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
        let turn = &self.turn;
        let body = turn.project(&turn.system, &turn.history, &turn.offered_tools);
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
                if let ResponseEvent::Finished(reason) = &event {
                    self.record_call(None, Some(reason.as_str().to_owned()))
                        .await;
                } else if let Some(timing) = self.call_timing() {
                    timing.first_event.get_or_insert(timing.started.elapsed());
                }
                self.on_event(event, out).await
            }
            LoopEvent::Provider(Err(error)) => {
                self.record_call(Some(error.to_string()), None).await;
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

    fn call_timing(&mut self) -> Option<&mut CallTiming> {
        match &mut self.phase {
            Phase::Streaming(Streaming { call, .. })
            | Phase::Compacting(Compacting { call, .. }) => call.timing.as_mut(),
            _ => None,
        }
    }

    /// Records the call in flight, ended by `finish_reason` or `error`.
    async fn record_call(&mut self, error: Option<String>, finish_reason: Option<String>) {
        if let Some(timing) = self.call_timing() {
            timing.first_event.get_or_insert(timing.started.elapsed());
        }
        let (call, usage) = match &mut self.phase {
            Phase::Streaming(s) => (&mut s.call, s.draft.usage),
            Phase::Compacting(c) => (&mut c.call, c.compaction.usage),
            _ => return,
        };
        self.turn
            .record_call(call, usage, finish_reason, error)
            .await;
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
                if let ResponseEvent::Finished(reason) = event {
                    streaming.close_thinking(&mut self.turn, out).await?;
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
            text: draft.text,
            thinking: draft.thinking,
            model_id: turn.model_id().to_owned(),
            replay: draft.replay,
            model_call_id: turn.model_call_id.clone(),
            planned_calls: calls.clone(),
        };
        let message = CanonicalMessage::Assistant(assistant);
        turn.append(std::slice::from_ref(&message)).await?;
        if let CanonicalMessage::Assistant(a) = &message {
            turn.checkpoints
                .assistant(&a.text, &a.thinking, out)
                .await?;
        }
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
    /// to; `None` for a late answer, ignored idempotently; a protocol error for an unknown id or
    /// the wrong kind.
    fn active_slot(&self, id: u32, kind: ExecKind) -> Result<Option<usize>, ServerError> {
        match self.turn.pending.match_result(id, kind) {
            Ok(Match::Active { slot }) => Ok(Some(slot)),
            Ok(Match::Late) => {
                tracing::info!(request_id = %self.turn.request_id, id, %kind, "late answer ignored");
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
        let Some(slot) = self.active_slot(id, payload.kind())? else {
            return Ok(LoopStep::Continue);
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
        let Some(slot) = self.active_slot(id, payload.kind())? else {
            return Ok(LoopStep::Continue);
        };
        self.turn.pending.finish(id);
        if let Phase::Tools(batch) = &mut self.phase {
            batch
                .on_response(&mut self.turn, slot, payload, out)
                .await?;
        }
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
            Ok(Match::Active { slot }) => slot,
            Ok(Match::Late) => {
                // A stream_close after a shell's exit is the normal end of that exec.
                tracing::debug!(request_id = %self.turn.request_id, exec_id = id, ?control, "control for a finished exec");
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
        self.record_call(Some(format!("abandoned: {reason}")), None)
            .await;
        let turn = &mut self.turn;
        for (id, _) in turn.pending.running() {
            out.send_message(&crate::cursor::exec::abort(id)).await;
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

    /// The final checkpoint once more.
    pub async fn republish_checkpoint(&self, out: &mut Downlink) {
        self.turn.checkpoints.republish(out).await;
    }
}

fn warn_unfinished(turn: &Turn, reason: &FinishReason) {
    match reason {
        FinishReason::Stop | FinishReason::ToolCalls => {}
        other => tracing::warn!(
            request_id = %turn.request_id,
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
                draft.thinking_segment.push_str(&text);
                out.send_message(&interaction::thinking_delta(text)).await;
            }
            ResponseEvent::TextDelta(text) => {
                self.close_thinking(turn, out).await?;
                self.draft.text.push_str(&text);
                out.send_message(&interaction::text_delta(text)).await;
            }
            ResponseEvent::ToolCallStart { index, id, name } => {
                self.close_thinking(turn, out).await?;
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

    async fn close_thinking(
        &mut self,
        turn: &mut Turn,
        out: &mut Downlink,
    ) -> Result<(), ServerError> {
        if let Some(since) = self.draft.thinking_since.take() {
            let elapsed = since.elapsed().as_millis();
            out.send_message(&interaction::thinking_completed(elapsed))
                .await;
            let text = std::mem::take(&mut self.draft.thinking_segment);
            let ms = u32::try_from(elapsed.max(1)).unwrap_or(u32::MAX);
            turn.checkpoints.thinking(&text, ms, out).await?;
        }
        Ok(())
    }
}

/// The subagents of `history`'s Task calls, plus the `running` Task calls (id, arguments) of the
/// current batch.
pub(super) fn fold_subagent_runs<'a>(
    history: &[CanonicalMessage],
    running: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> Vec<SubagentRunState> {
    derived_state::fold_subagent_runs(
        history,
        running,
        ToolKind::Task.name(),
        task::task_title,
        task::subagent_state,
    )
}

pub(super) fn fold_todos(history: &[CanonicalMessage]) -> Vec<Todo> {
    derived_state::fold_todos(history, ToolKind::TodoWrite.name(), todo::parse_todo_update)
}

/// The texts of the user-role messages among `appended` (runtime notices and the like), for the
/// checkpoint's roots.
pub(super) fn user_texts(appended: &[CanonicalMessage]) -> Vec<String> {
    appended
        .iter()
        .filter_map(|m| match m {
            CanonicalMessage::User(user) => Some(user.text.clone()),
            _ => None,
        })
        .collect()
}

/// A new mode's system prompt and tools for this run.
pub(super) fn switch_mode(turn: &mut Turn, to: Mode) {
    tracing::info!(request_id = %turn.request_id, from = ?turn.mode(), ?to, "mode switched");
    turn.tool_env.mode = to;
    let (system, mode_tools) = compiler::prompt_for(&turn.app.prompts, to, turn.subagent.as_ref());
    turn.system = system;
    turn.offered_tools = crate::cursor::tools::offered_tools(mode_tools, &turn.tool_options);
}

pub(super) const fn default_bytes_per_token() -> f64 {
    DEFAULT_BYTES_PER_TOKEN
}
