//! The turn loop: commit the user message, project history, call the provider, stream its text and
//! thinking, run the model's tool calls as one parallel batch, and call the provider again once the
//! whole batch is complete — until the model answers without tool calls.
//!
//! It consumes only canonical `ResponseEvent`s and opaque exec payloads, and emits only through
//! `cursor::interaction` / `cursor::tools`; it never looks at provider JSON or protobuf oneofs.

use std::sync::Arc;
use std::time::Instant;

use tokio_util::sync::CancellationToken;

use super::actor::Downlink;
use super::command::{ExecControl, RunAction, RunRequestInput};
use super::lifecycle::{Checkpoints, TurnOpening};
use crate::app::AppState;
use crate::cursor::blob_sync::{KvOutcome, KvPayload};
use crate::cursor::checkpoint::{self, StateDetails};
use crate::cursor::exec::{self, ExecPayload, QueryPayload};
use crate::cursor::pending::{Match, PendingExecs};
use crate::cursor::tool_result::{self, ToolOutcome};
use crate::cursor::tools::{
    self, FieldStreamer, ToolEnv, ToolKind, ToolOptions, ToolRun, ToolStep,
};
use crate::cursor::{interaction, tool_result::parse_todo_update};
use crate::error::{ProtocolError, ServerError};
use crate::model::conversation::{ContextUse, Mode, SubagentRole, WorkspaceContext};
use crate::model::message::{
    AssistantMessage, CanonicalMessage, Origin, ProviderReplay, ToolCallRecord, ToolResultRecord,
    UserMessage,
};
use crate::model::runtime_tag::{RuntimeEvent, RuntimeTag, current_mode, latest_compaction};
use crate::model::tool::{ToolCall, ToolResult};
use crate::model::usage::Usage;
use crate::prompting::assets::PromptKind;
use crate::prompting::compiler::{self, RequestParameters};
use crate::prompting::{derived_state, projector};
use crate::provider::web_search::{self, SearchHit};
use crate::provider::{
    self, CallLimits, EventReceiver, FinishReason, ProviderError, RequestBody, ResponseEvent,
};
use crate::store::blobs::BlobId;
use crate::store::runs::CallPurpose;
use crate::store::{messages, runs};
use std::collections::HashMap;

/// What the loop waits for besides client input.
#[derive(Debug)]
pub enum LoopEvent {
    /// The streaming provider call's next event (or how it failed).
    Provider(Result<ResponseEvent, ProviderError>),
    /// A web search the server ran for an approved WebSearch call.
    SearchDone(SearchDone),
}

#[derive(Debug)]
pub struct SearchDone {
    slot: usize,
    call_id: String,
    hits: Result<Vec<SearchHit>, String>,
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

/// One tool call of the running batch.
#[derive(Debug)]
struct Slot {
    call: ToolCall,
    index: u32,
    /// `None` once the call has its outcome.
    run: Option<ToolRun>,
}

/// Blobs only the client holds, fetched before the turn starts: the roots of a conversation this
/// server has never seen, and the user's text when Cursor sent it as a blob (`text_blob_id`).
#[derive(Debug)]
struct Import {
    roots: Vec<BlobId>,
    text_blob: Option<BlobId>,
    got: HashMap<BlobId, Option<Vec<u8>>>,
    user_text: String,
    user_message_id: String,
    context: Option<WorkspaceContext>,
}

impl Import {
    fn complete(&self) -> bool {
        self.roots
            .iter()
            .chain(&self.text_blob)
            .all(|id| self.got.contains_key(id))
    }
}

/// Where the turn is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Fetching the roots of a conversation only the client knows.
    Importing,
    /// A provider call is streaming.
    Streaming,
    /// Tool calls are running; the next provider call waits for all of them.
    Tools,
    /// A compaction call is writing the summary of older history.
    Compacting,
}

/// A summary of older history being written.
#[derive(Debug)]
struct Compaction {
    /// The summary covers `history[..through]`.
    through: usize,
    number: u32,
    summary: String,
    then: AfterCompaction,
}

/// What follows a compaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AfterCompaction {
    /// The provider call it was made for.
    ProviderCall,
    /// Nothing: the user asked for a summary (`summarize_action`).
    EndTurn,
}

/// The last message of a compaction request, after the history it covers.
const COMPACTION_REQUEST: &str =
    "Summarize the conversation above now, as your instructions say. Reply with the summary only.";

/// The timing of the provider call in flight.
#[derive(Debug)]
struct CallTiming {
    purpose: CallPurpose,
    request_bytes: usize,
    started: Instant,
    started_at_ms: i64,
    first_event: Option<std::time::Duration>,
}

/// Bytes of projected request per token before a provider call has reported its real usage.
const DEFAULT_BYTES_PER_TOKEN: f64 = 4.0;

pub struct TurnLoop {
    app: Arc<AppState>,
    request_id: String,
    conversation_id: String,
    model_id: String,
    provider_index: usize,
    model_index: usize,
    parameters: RequestParameters,
    history: Vec<CanonicalMessage>,
    events: EventReceiver,
    call_cancel: CancellationToken,
    model_call_id: String,
    phase: Phase,
    draft: Draft,
    batch: Vec<Slot>,
    pending: PendingExecs,
    tool_env: ToolEnv,
    checkpoints: Checkpoints,
    import: Option<Import>,
    usage: Usage,
    /// The latest completed provider call's usage (the checkpoint's context use).
    last_call_usage: Option<Usage>,
    mode: Mode,
    /// What this request allows beyond the mode's tools, and the resulting tool definitions for
    /// the current mode (recomputed only when the mode changes).
    tool_options: ToolOptions,
    system: String,
    offered_tools: Vec<serde_json::Value>,
    /// Set when another agent's Task call started this run (subagent prompt and tools).
    subagent: Option<SubagentRole>,
    /// The subagents this conversation's finished Task calls started (refolded when one ends).
    subagent_runs: Vec<derived_state::SubagentRunState>,
    /// Where this run's messages start in `history` (a compaction keeps them verbatim).
    turn_start: usize,
    compaction: Option<Compaction>,
    /// Compactions in this conversation so far (the checkpoint's `self_summary_count`).
    compactions: u32,
    /// The size of the last request sent, and bytes per prompt token as the last usage showed.
    last_body_bytes: usize,
    bytes_per_token: f64,
    /// The provider call in flight, for its record.
    call: Option<CallTiming>,
    /// The usage the compaction call in flight reported.
    compaction_usage: Option<Usage>,
    /// Server-side searches report back here (the sender is cloned into each search task).
    searches: (
        tokio::sync::mpsc::Sender<SearchDone>,
        tokio::sync::mpsc::Receiver<SearchDone>,
    ),
    provider_calls: u32,
}

impl TurnLoop {
    /// Records the run, commits the user message and starts the first provider call.
    pub async fn start(
        app: Arc<AppState>,
        request_id: &str,
        input: RunRequestInput,
        out: &mut Downlink,
    ) -> Result<(TurnLoop, LoopStep), ServerError> {
        let config = &app.config;
        let model_id = input
            .model_id
            .clone()
            .unwrap_or_else(|| config.default_model.clone());
        let choice = config.resolve_model(&model_id).ok_or_else(|| {
            ServerError::NotFound(format!(
                "model {model_id:?} is not configured (configured models: {})",
                config.model_ids().collect::<Vec<_>>().join(", ")
            ))
        })?;
        // A suffix in the id (`-high`) counts unless Cursor also sent the parameter explicitly.
        let (provider_index, model_index) = (choice.provider, choice.model);
        let mut parameter_pairs = choice.implied;
        parameter_pairs.extend(input.parameters.iter().cloned());
        runs::start(&app.store, request_id, &input.conversation_id, &model_id).await?;
        let mut import = None;
        let mut background_already_told = false;
        if let Some(role) = &input.subagent {
            tracing::info!(
                request_id,
                conversation_id = %input.conversation_id,
                subagent_type = %role.type_name,
                parent_request_id = role.parent_request_id.as_deref().unwrap_or(""),
                parent_tool_call_id = role.parent_tool_call_id.as_deref().unwrap_or(""),
                "subagent run"
            );
        }
        let importing = input.client_state.is_some()
            && !messages::any(&app.store, &input.conversation_id).await?;
        let mut turn_start = None;
        let (history, checkpoints) = match &input.action {
            RunAction::UserMessage {
                text,
                message_id,
                text_blob,
            } if text_blob.is_some() || importing => {
                // Unknown here, known to the client: its roots become our history first.
                let mut checkpoints = Checkpoints::open(
                    &app.store,
                    &input.conversation_id,
                    request_id,
                    input.client_state.as_deref().filter(|_| importing),
                )
                .await?;
                let roots = if importing {
                    checkpoints.fetch_roots(out).await
                } else {
                    Vec::new()
                };
                if let Some(id) = text_blob {
                    checkpoints.fetch(*id, out).await;
                }
                import = Some(Import {
                    roots,
                    text_blob: *text_blob,
                    got: HashMap::new(),
                    user_text: text.clone(),
                    user_message_id: message_id.clone(),
                    context: input.context.clone(),
                });
                (Vec::new(), checkpoints)
            }
            RunAction::UserMessage {
                text, message_id, ..
            } => {
                let mut history = messages::load(&app.store, &input.conversation_id).await?;
                turn_start = Some(history.len());
                let committed = commit_user_message(
                    &app,
                    &input.conversation_id,
                    request_id,
                    &mut history,
                    UserMessage {
                        origin: Origin::User,
                        text: text.clone(),
                        client_message_id: message_id.clone(),
                        mode: Some(input.mode),
                        runtime: None,
                    },
                    input.context.as_ref(),
                )
                .await?;
                let (system, _) =
                    compiler::prompt_for(&app.prompts, input.mode, input.subagent.as_ref());
                let mut checkpoints = Checkpoints::start(
                    &app.store,
                    &input.conversation_id,
                    request_id,
                    TurnOpening {
                        system: &system,
                        context: committed.context.as_deref(),
                        mode: input.mode,
                        user_text: text,
                        user_message_id: message_id,
                    },
                    out,
                )
                .await?;
                checkpoints
                    .runtime_messages(&app.store, &committed.after, out)
                    .await?;
                (history, checkpoints)
            }
            RunAction::Resume | RunAction::Summarize => {
                let history = messages::load(&app.store, &input.conversation_id).await?;
                let checkpoints =
                    Checkpoints::resume(&app.store, &input.conversation_id, request_id).await?;
                (history, checkpoints)
            }
            RunAction::BackgroundTasksEnded(completions) => {
                let mut history = messages::load(&app.store, &input.conversation_id).await?;
                turn_start = Some(history.len());
                let tags: Vec<RuntimeTag> =
                    completions.iter().map(compiler::background_tag).collect();
                let appended = messages::append_with_tags(
                    &app.store,
                    &input.conversation_id,
                    request_id,
                    &[],
                    &[],
                    &tags,
                )
                .await?;
                let notices: Vec<String> = appended
                    .iter()
                    .filter_map(|m| match m {
                        CanonicalMessage::User(user) => Some(user.text.clone()),
                        _ => None,
                    })
                    .collect();
                history.extend(appended);
                let checkpoints = if notices.is_empty() {
                    // Every completion was already told: nothing new for the model.
                    background_already_told = true;
                    Checkpoints::resume(&app.store, &input.conversation_id, request_id).await?
                } else {
                    let mode = current_mode(&history).unwrap_or(input.mode);
                    let (system, _) = compiler::prompt_for(&app.prompts, mode, None);
                    Checkpoints::start(
                        &app.store,
                        &input.conversation_id,
                        request_id,
                        TurnOpening {
                            system: &system,
                            context: None,
                            mode,
                            user_text: &notices.join("\n\n"),
                            user_message_id: "",
                        },
                        out,
                    )
                    .await?
                };
                (history, checkpoints)
            }
        };
        let mode = match input.action {
            RunAction::Resume | RunAction::Summarize | RunAction::BackgroundTasksEnded(_) => {
                current_mode(&history)
                    .or(checkpoints.previous_mode())
                    .unwrap_or(input.mode)
            }
            RunAction::UserMessage { .. } => input.mode,
        };
        let (system, mode_tools) =
            compiler::prompt_for(&app.prompts, mode, input.subagent.as_ref());
        let mut tool_options = input.tools;
        tool_options.web_search &= app.config.web_search.is_some();
        let offered_tools = tools::offered_tools(mode_tools, &tool_options);
        let subagent_runs = fold_subagent_runs(&history, []);
        let turn_start = turn_start.unwrap_or(history.len());
        let compactions = latest_compaction(&history).map_or(0, |(_, n, _)| n);
        let tool_env = ToolEnv {
            terminals_folder: input.terminals_folder,
            max_output_bytes: config.tool_output_max_bytes,
            todos: fold_todos(&history),
            mode,
            mcp: tool_options.mcp.clone().into(),
            conversation_id: input.conversation_id.clone(),
            model_id: model_id.clone(),
        };

        let mut turn = TurnLoop {
            request_id: request_id.to_owned(),
            conversation_id: input.conversation_id,
            model_id,
            provider_index,
            model_index,
            parameters: RequestParameters::from_pairs(&parameter_pairs),
            history,
            events: tokio::sync::mpsc::channel(1).1,
            call_cancel: CancellationToken::new(),
            model_call_id: String::new(),
            phase: Phase::Streaming,
            draft: Draft::default(),
            batch: Vec::new(),
            pending: PendingExecs::default(),
            tool_env,
            checkpoints,
            import,
            usage: Usage::default(),
            last_call_usage: None,
            mode,
            system,
            offered_tools,
            tool_options,
            subagent: input.subagent,
            subagent_runs,
            turn_start,
            compaction: None,
            compactions,
            last_body_bytes: 0,
            bytes_per_token: DEFAULT_BYTES_PER_TOKEN,
            searches: tokio::sync::mpsc::channel(4),
            call: None,
            compaction_usage: None,
            provider_calls: 0,
            app,
        };
        let step = match input.action {
            RunAction::UserMessage { .. } if turn.import.is_some() => {
                turn.phase = Phase::Importing;
                LoopStep::Continue
            }
            RunAction::UserMessage { .. } => {
                turn.start_provider_call();
                LoopStep::Continue
            }
            RunAction::Resume => turn.resume(out).await?,
            RunAction::Summarize => match latest_compaction(&turn.history) {
                Some((at, _, _)) if at + 1 == turn.history.len() => {
                    LoopStep::TurnComplete { usage: turn.usage }
                }
                _ if turn.history.is_empty() => LoopStep::TurnComplete { usage: turn.usage },
                _ => {
                    turn.start_compaction(turn.history.len(), AfterCompaction::EndTurn);
                    LoopStep::Continue
                }
            },
            RunAction::BackgroundTasksEnded(_) if background_already_told => {
                LoopStep::TurnComplete { usage: turn.usage }
            }
            RunAction::BackgroundTasksEnded(_) => {
                turn.start_provider_call();
                LoopStep::Continue
            }
        };
        Ok((turn, step))
    }

    /// Continues where the conversation stopped: runs the calls of the last tool batch that have no
    /// stored result (completed ones never run twice), or asks the model again if the batch was
    /// complete or the last turn never got an answer; otherwise there is nothing to do.
    async fn resume(&mut self, out: &mut Downlink) -> Result<LoopStep, ServerError> {
        let last_assistant = self.history.iter().rev().find_map(|m| match m {
            CanonicalMessage::Assistant(a) => Some(a.clone()),
            _ => None,
        });
        let answered_last = matches!(self.history.last(), Some(CanonicalMessage::Assistant(a)) if a.planned_calls.is_empty());
        match last_assistant {
            Some(assistant) if !assistant.planned_calls.is_empty() => {
                let unfinished: Vec<(u32, ToolCall)> = assistant
                    .planned_calls
                    .iter()
                    .enumerate()
                    .map(|(i, call)| (u32::try_from(i).unwrap_or(u32::MAX), call.clone()))
                    .filter(|(index, _)| {
                        !self.history.iter().any(|m| {
                            matches!(m, CanonicalMessage::ToolResult(r)
                                if r.model_call_id == assistant.model_call_id && r.index == *index)
                        })
                    })
                    .collect();
                tracing::info!(
                    request_id = %self.request_id,
                    unfinished = unfinished.len(),
                    of = assistant.planned_calls.len(),
                    "resuming a tool batch"
                );
                self.model_call_id = assistant.model_call_id.clone();
                self.start_batch(unfinished, out).await
            }
            _ if answered_last || self.history.is_empty() => {
                Ok(LoopStep::TurnComplete { usage: self.usage })
            }
            _ => {
                self.start_provider_call();
                Ok(LoopStep::Continue)
            }
        }
    }

    /// Calls the model with the history so far — first compacting it, if the prompt would fill
    /// more of the context window than the configured share.
    fn start_provider_call(&mut self) {
        let body = self.project(&self.system, &self.history, &self.offered_tools);
        if self.compaction_due(body.len())
            && let Some(through) = self.compaction_point()
        {
            self.start_compaction(through, AfterCompaction::ProviderCall);
            return;
        }
        self.send_to_provider(body, Phase::Streaming);
    }

    fn project(
        &self,
        system: &str,
        history: &[CanonicalMessage],
        tools: &[serde_json::Value],
    ) -> RequestBody {
        let provider = &self.app.config.providers[self.provider_index];
        let model = &provider.models[self.model_index];
        let request = compiler::compile(system, history, model, tools, self.parameters);
        RequestBody::from_json(&projector::project(provider.kind, &request))
    }

    /// The prompt's estimated size (bytes over the bytes-per-token ratio the last call showed)
    /// passes the threshold, and the model has not just been given a fresh summary.
    fn compaction_due(&self, body_bytes: usize) -> bool {
        let config = &self.app.config;
        if config.compact_at_percent >= 100 || self.history.is_empty() {
            return false;
        }
        if matches!(self.history.last(), Some(CanonicalMessage::User(u)) if matches!(u.runtime, Some(RuntimeEvent::Compacted { .. })))
        {
            return false;
        }
        let model = &config.providers[self.provider_index].models[self.model_index];
        let estimated_tokens = body_bytes as f64 / self.bytes_per_token;
        estimated_tokens
            > f64::from(model.context_window) * f64::from(config.compact_at_percent) / 100.0
    }

    /// Where the summary ends: before the current turn when that turn alone fits comfortably (the
    /// user's latest message stays verbatim), else at the end of history. `None` when there is
    /// nothing a summary would replace.
    fn compaction_point(&self) -> Option<usize> {
        let config = &self.app.config;
        let model = &config.providers[self.provider_index].models[self.model_index];
        let budget = f64::from(model.context_window) * f64::from(config.compact_at_percent) / 200.0;
        let tail_bytes: usize = self.history[self.turn_start.min(self.history.len())..]
            .iter()
            .map(|m| serde_json::to_string(m).map_or(0, |t| t.len()))
            .sum();
        let through = if (tail_bytes as f64 / self.bytes_per_token) < budget {
            self.turn_start.min(self.history.len())
        } else {
            self.history.len()
        };
        let already_summarized = latest_compaction(&self.history).map_or(0, |(at, _, _)| at + 1);
        (through > already_summarized || (through > 0 && already_summarized == 0))
            .then_some(through)
    }

    /// Asks the model (with the compaction prompt, no tools) to summarize `history[..through]`.
    fn start_compaction(&mut self, through: usize, then: AfterCompaction) {
        let number = latest_compaction(&self.history).map_or(1, |(_, n, _)| n + 1);
        tracing::info!(
            request_id = %self.request_id,
            conversation_id = %self.conversation_id,
            through,
            of = self.history.len(),
            number,
            "compacting history"
        );
        self.compaction_usage = None;
        let mut covered = self.history[..through].to_vec();
        covered.push(CanonicalMessage::User(UserMessage {
            origin: Origin::Runtime,
            text: COMPACTION_REQUEST.to_owned(),
            client_message_id: String::new(),
            mode: None,
            runtime: None,
        }));
        let system = self.app.prompts.set(PromptKind::Compaction).system.clone();
        let body = self.project(&system, &covered, &[]);
        self.compaction = Some(Compaction {
            through,
            number,
            summary: String::new(),
            then,
        });
        self.send_to_provider(body, Phase::Compacting);
    }

    fn send_to_provider(&mut self, body: RequestBody, phase: Phase) {
        let config = &self.app.config;
        let provider = &config.providers[self.provider_index];
        self.last_body_bytes = body.len();
        self.call = Some(CallTiming {
            purpose: match phase {
                Phase::Compacting => CallPurpose::Compaction,
                _ => CallPurpose::Turn,
            },
            request_bytes: body.len(),
            started: Instant::now(),
            started_at_ms: crate::store::now_ms(),
            first_event: None,
        });
        self.call_cancel.cancel();
        self.call_cancel = CancellationToken::new();
        self.draft = Draft::default();
        self.batch.clear();
        self.phase = phase;
        self.model_call_id = uuid::Uuid::new_v4().to_string();
        tracing::Span::current().record("model_call_id", self.model_call_id.as_str());
        self.provider_calls += 1;
        tracing::debug!(
            request_id = %self.request_id,
            conversation_id = %self.conversation_id,
            model_call_id = %self.model_call_id,
            provider = %provider.name,
            model = %self.model_id,
            call = self.provider_calls,
            bytes = body.len(),
            ?phase,
            "provider call"
        );
        self.events = provider::call(
            &self.app.http,
            provider,
            body,
            CallLimits {
                headers_timeout: config.provider_connect_timeout,
                idle_timeout: config.provider_idle_timeout,
                max_attempts: config.provider_max_attempts,
                retry_base_delay: config.provider_retry_base_delay,
            },
            self.call_cancel.clone(),
        );
    }

    /// A compaction call's stream: its text is the summary (never shown as the assistant's).
    async fn on_compaction_event(
        &mut self,
        event: ResponseEvent,
        out: &mut Downlink,
    ) -> Result<LoopStep, ServerError> {
        let Some(compaction) = self.compaction.as_mut() else {
            return Ok(LoopStep::Continue);
        };
        match event {
            ResponseEvent::TextDelta(text) => compaction.summary.push_str(&text),
            ResponseEvent::Usage(usage) => {
                self.usage.accumulate(&usage);
                self.compaction_usage = Some(usage);
            }
            // No tools are offered and reasoning is not part of the summary.
            ResponseEvent::ReasoningDelta(_)
            | ResponseEvent::Replay(_)
            | ResponseEvent::ToolCallStart { .. }
            | ResponseEvent::ToolArgsDelta { .. } => {}
            ResponseEvent::Finished(_) => return self.finish_compaction(out).await,
        }
        Ok(LoopStep::Continue)
    }

    /// Stores the summary (a runtime message: old messages stay), adds it to the checkpoint's
    /// roots, and goes on.
    async fn finish_compaction(&mut self, out: &mut Downlink) -> Result<LoopStep, ServerError> {
        let Some(compaction) = self.compaction.take() else {
            return Ok(LoopStep::Continue);
        };
        let summary = compaction.summary.trim();
        if summary.is_empty() {
            return Err(ProviderError::Decode {
                provider: self.provider_name(),
                message: "the compaction call returned no summary".to_owned(),
            }
            .into());
        }
        let tag = compiler::compaction_tag(compaction.number, compaction.through, summary);
        let appended = messages::append_with_tags(
            &self.app.store,
            &self.conversation_id,
            &self.request_id,
            &[],
            &[],
            std::slice::from_ref(&tag),
        )
        .await?;
        self.history.extend(appended);
        self.compactions = compaction.number;
        self.checkpoints
            .runtime_messages(&self.app.store, std::slice::from_ref(&tag.text), out)
            .await?;
        match compaction.then {
            AfterCompaction::ProviderCall => {
                self.start_provider_call();
                Ok(LoopStep::Continue)
            }
            AfterCompaction::EndTurn => {
                self.phase = Phase::Tools;
                Ok(LoopStep::TurnComplete { usage: self.usage })
            }
        }
    }

    /// The next provider event or finished server-side search.
    pub async fn next_event(&mut self) -> LoopEvent {
        let streaming = matches!(self.phase, Phase::Streaming | Phase::Compacting);
        let (events, searches) = (&mut self.events, &mut self.searches.1);
        let provider_event = tokio::select! {
            Some(done) = searches.recv() => return LoopEvent::SearchDone(done),
            event = events.recv(), if streaming => event,
        };
        LoopEvent::Provider(provider_event.unwrap_or_else(|| {
            Err(ProviderError::Truncated {
                provider: self.provider_name(),
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
                if let Some(call) = self.call.as_mut()
                    && call.first_event.is_none()
                {
                    call.first_event = Some(call.started.elapsed());
                }
                if let ResponseEvent::Finished(reason) = &event {
                    let usage = match self.phase {
                        Phase::Compacting => self.compaction_usage,
                        _ => self.draft.usage,
                    };
                    self.record_call(usage, Some(reason.as_str().to_owned()), None)
                        .await;
                }
                self.on_event(event, out).await
            }
            LoopEvent::Provider(Err(error)) => {
                self.record_call(None, None, Some(error.to_string())).await;
                Err(error.into())
            }
            LoopEvent::SearchDone(done) => self.on_search_done(done, out).await,
        }
    }

    /// Stores the record of the call in flight (once per call, when it ends).
    async fn record_call(
        &mut self,
        usage: Option<Usage>,
        finish_reason: Option<String>,
        error: Option<String>,
    ) {
        let Some(call) = self.call.take() else {
            return;
        };
        let millis = |d: std::time::Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        let record = runs::ProviderCallRecord {
            model_call_id: self.model_call_id.clone(),
            request_id: self.request_id.clone(),
            conversation_id: self.conversation_id.clone(),
            provider: self.provider_name(),
            model_id: self.model_id.clone(),
            purpose: call.purpose,
            request_bytes: call.request_bytes as u64,
            started_at_ms: call.started_at_ms,
            first_event_ms: call.first_event.map(millis),
            total_ms: millis(call.started.elapsed()),
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

    /// A search result for a call still waiting on it; anything else (a batch that ended) is
    /// dropped.
    async fn on_search_done(
        &mut self,
        done: SearchDone,
        out: &mut Downlink,
    ) -> Result<LoopStep, ServerError> {
        let Some(slot) = self.batch.get_mut(done.slot) else {
            return Ok(LoopStep::Continue);
        };
        if slot.call.call_id != done.call_id {
            return Ok(LoopStep::Continue);
        }
        let Some(run) = slot.run.as_mut() else {
            return Ok(LoopStep::Continue);
        };
        let outcome = run.on_search(done.hits, &self.tool_env);
        self.apply_step(done.slot, ToolStep::Done(outcome), out)
            .await?;
        self.after_completion()
    }

    /// Runs an approved search on the configured backend, off the actor's task.
    fn start_search(&self, slot: usize, query: String) {
        let sender = self.searches.0.clone();
        let call_id = self.batch[slot].call.call_id.clone();
        let http = self.app.http.clone();
        let backend = self.app.config.web_search.clone();
        let cancel = self.call_cancel.clone();
        tokio::spawn(async move {
            let search = async {
                match &backend {
                    Some(backend) => web_search::search(&http, backend, &query)
                        .await
                        .map_err(|e| e.to_string()),
                    None => Err("no web search backend is configured".to_owned()),
                }
            };
            let hits = tokio::select! {
                _ = cancel.cancelled() => return,
                hits = search => hits,
            };
            let _ = sender
                .send(SearchDone {
                    slot,
                    call_id,
                    hits,
                })
                .await;
        });
    }

    /// Whether the run is waiting on the client's machine (tool results, blobs) rather than on the
    /// provider, a server-side search or the user's answer to a question.
    pub fn waiting_on_client(&self) -> bool {
        match self.phase {
            Phase::Importing => true,
            Phase::Tools => self.pending.has_running_exec(),
            Phase::Streaming | Phase::Compacting => false,
        }
    }

    pub fn provider_calls(&self) -> u32 {
        self.provider_calls
    }

    /// Usage summed over completed provider calls so far.
    pub fn usage(&self) -> Usage {
        self.usage
    }

    pub async fn on_event(
        &mut self,
        event: ResponseEvent,
        out: &mut Downlink,
    ) -> Result<LoopStep, ServerError> {
        if self.phase == Phase::Compacting {
            return self.on_compaction_event(event, out).await;
        }
        match event {
            ResponseEvent::ReasoningDelta(text) => {
                if self.draft.thinking_since.is_none() {
                    self.draft.thinking_since = Some(Instant::now());
                }
                self.draft.thinking.push_str(&text);
                self.draft.thinking_segment.push_str(&text);
                out.send_message(&interaction::thinking_delta(text)).await;
            }
            ResponseEvent::TextDelta(text) => {
                self.close_thinking(out).await?;
                self.draft.text.push_str(&text);
                out.send_message(&interaction::text_delta(text)).await;
            }
            ResponseEvent::ToolCallStart { index, id, name } => {
                self.close_thinking(out).await?;
                if index != self.draft.calls.len() {
                    return Err(ProviderError::Decode {
                        provider: self.provider_name(),
                        message: format!("tool call {index} started out of order"),
                    }
                    .into());
                }
                let kind = self.tool_env.kind_of(&name);
                let call_id = format!("tool_{}_{index}", self.model_call_id);
                if let Some(kind) = kind {
                    let placeholder = interaction::partial_tool_call(
                        &call_id,
                        kind.placeholder(),
                        String::new(),
                        &self.model_call_id,
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
            }
            ResponseEvent::ToolArgsDelta { index, fragment } => {
                let Some(call) = self.draft.calls.get_mut(index) else {
                    return Err(ProviderError::Decode {
                        provider: self.provider_name(),
                        message: format!("arguments for tool call {index}, which never started"),
                    }
                    .into());
                };
                call.arguments.push_str(&fragment);
                if let Some(streamer) = &mut call.content {
                    // Edits show the file content being written, not the JSON around it.
                    let content = streamer.feed(&fragment);
                    if !content.is_empty() {
                        let delta = interaction::edit_content_delta(
                            &call.call_id,
                            content,
                            &self.model_call_id,
                        );
                        out.send_message(&delta).await;
                    }
                } else if let Some(kind) = call.kind {
                    let delta = interaction::partial_tool_call(
                        &call.call_id,
                        kind.placeholder(),
                        fragment,
                        &self.model_call_id,
                    );
                    out.send_message(&delta).await;
                }
            }
            ResponseEvent::Usage(usage) => self.draft.usage = Some(usage),
            ResponseEvent::Replay(replay) => self.draft.replay = Some(replay),
            ResponseEvent::Finished(reason) => {
                self.close_thinking(out).await?;
                match &reason {
                    FinishReason::Stop | FinishReason::ToolCalls => {}
                    other => tracing::warn!(
                        request_id = %self.request_id,
                        model_call_id = %self.model_call_id,
                        "provider finished with {other:?}; the answer may be incomplete"
                    ),
                }
                return self.complete_call(out).await;
            }
        }
        Ok(LoopStep::Continue)
    }

    fn provider_name(&self) -> String {
        self.app.config.providers[self.provider_index].name.clone()
    }

    async fn close_thinking(&mut self, out: &mut Downlink) -> Result<(), ServerError> {
        if let Some(since) = self.draft.thinking_since.take() {
            let elapsed = since.elapsed().as_millis();
            out.send_message(&interaction::thinking_completed(elapsed))
                .await;
            let text = std::mem::take(&mut self.draft.thinking_segment);
            let ms = u32::try_from(elapsed.max(1)).unwrap_or(u32::MAX);
            self.checkpoints
                .thinking(&self.app.store, &text, ms, out)
                .await?;
        }
        Ok(())
    }

    /// Commits the streamed assistant message; ends the turn or starts its tool batch.
    async fn complete_call(&mut self, out: &mut Downlink) -> Result<LoopStep, ServerError> {
        let draft = std::mem::take(&mut self.draft);
        if let Some(usage) = &draft.usage {
            if let Some(input_tokens) = usage.input_tokens.filter(|t| *t > 0) {
                self.bytes_per_token =
                    (self.last_body_bytes as f64 / input_tokens as f64).clamp(1.0, 16.0);
            }
            self.last_call_usage = Some(*usage);
            self.usage.accumulate(usage);
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
        let assistant = CanonicalMessage::Assistant(AssistantMessage {
            text: draft.text,
            thinking: draft.thinking,
            model_id: self.model_id.clone(),
            replay: draft.replay,
            model_call_id: self.model_call_id.clone(),
            planned_calls: calls.clone(),
        });
        self.append(std::slice::from_ref(&assistant)).await?;
        if let CanonicalMessage::Assistant(a) = &assistant {
            self.checkpoints
                .assistant(&self.app.store, &a.text, &a.thinking, out)
                .await?;
        }
        self.history.push(assistant);
        if calls.is_empty() {
            return Ok(LoopStep::TurnComplete { usage: self.usage });
        }
        let indexed = calls
            .into_iter()
            .enumerate()
            .map(|(index, call)| (u32::try_from(index).unwrap_or(u32::MAX), call))
            .collect();
        self.start_batch(indexed, out).await
    }

    /// Starts every call of a batch at once; results may come back in any order.
    async fn start_batch(
        &mut self,
        calls: Vec<(u32, ToolCall)>,
        out: &mut Downlink,
    ) -> Result<LoopStep, ServerError> {
        self.phase = Phase::Tools;
        self.batch = calls
            .into_iter()
            .map(|(index, call)| Slot {
                call,
                index,
                run: None,
            })
            .collect();
        for slot in 0..self.batch.len() {
            match ToolRun::start(&self.batch[slot].call, &self.tool_env) {
                Ok((run, started, step)) => {
                    let call_id = self.batch[slot].call.call_id.clone();
                    out.send_message(&interaction::tool_call_started(
                        &call_id,
                        started,
                        &self.model_call_id,
                    ))
                    .await;
                    self.batch[slot].run = Some(run);
                    self.apply_step(slot, step, out).await?;
                }
                Err(rejected) => {
                    tracing::info!(
                        request_id = %self.request_id,
                        tool = %self.batch[slot].call.name,
                        "tool call rejected: {}",
                        rejected.model_text
                    );
                    let outcome = rejected.card.map(|card| ToolOutcome {
                        card,
                        model_text: rejected.model_text.clone(),
                        is_error: true,
                    });
                    self.finish_slot(slot, outcome, rejected.model_text, true, out)
                        .await?;
                }
            }
        }
        self.after_completion()
    }

    async fn apply_step(
        &mut self,
        slot: usize,
        step: ToolStep,
        out: &mut Downlink,
    ) -> Result<(), ServerError> {
        match step {
            ToolStep::Exec(request) => {
                let id = self.pending.register(slot, &request);
                out.send_message(&request.into_server_message(id)).await;
            }
            ToolStep::Query(request) => {
                let id = self.pending.register_query(slot, &request);
                out.send_message(&request.into_server_message(id)).await;
            }
            ToolStep::Search(query) => self.start_search(slot, query),
            ToolStep::Delta(delta) => {
                let call_id = &self.batch[slot].call.call_id;
                out.send_message(&interaction::tool_call_delta(
                    call_id,
                    delta,
                    &self.model_call_id,
                ))
                .await;
            }
            ToolStep::Done(outcome) => {
                let text = outcome.model_text.clone();
                let is_error = outcome.is_error;
                self.finish_slot(slot, Some(outcome), text, is_error, out)
                    .await?;
            }
        }
        Ok(())
    }

    /// Completes the card and persists the call with its result, atomically.
    async fn finish_slot(
        &mut self,
        slot: usize,
        card: Option<ToolOutcome>,
        model_text: String,
        is_error: bool,
        out: &mut Downlink,
    ) -> Result<(), ServerError> {
        self.pending.finish_slot(slot);
        let entry = &mut self.batch[slot];
        let run = entry.run.take();
        let was_todo_write = run.as_ref().map(ToolRun::kind) == Some(ToolKind::TodoWrite);
        let was_task = entry.call.name == ToolKind::Task.name();
        let switched_to = match (&run, &card) {
            (Some(run), Some(outcome)) => run.switched_mode(outcome),
            _ => None,
        }
        .filter(|to| *to != self.mode);
        let final_card = card.as_ref().map(|outcome| (*outcome.card).clone());
        if let Some(outcome) = card {
            out.send_message(&interaction::tool_call_completed(
                &entry.call.call_id,
                outcome.card,
                &self.model_call_id,
            ))
            .await;
        }
        let pair = [
            CanonicalMessage::ToolCall(ToolCallRecord {
                model_call_id: self.model_call_id.clone(),
                index: entry.index,
                call: entry.call.clone(),
            }),
            CanonicalMessage::ToolResult(ToolResultRecord {
                model_call_id: self.model_call_id.clone(),
                index: entry.index,
                result: ToolResult {
                    call_id: entry.call.call_id.clone(),
                    content: model_text,
                    is_error,
                },
            }),
        ];
        // An approved mode switch is told to the model in the same transaction as its result.
        let notice: Vec<_> = switched_to
            .map(|to| {
                compiler::mode_switch_tag(&self.app.prompts, self.mode, to, &entry.call.call_id)
            })
            .into_iter()
            .collect();
        let appended = messages::append_with_tags(
            &self.app.store,
            &self.conversation_id,
            &self.request_id,
            &[],
            &pair,
            &notice,
        )
        .await?;
        let notice_text: Vec<String> = appended[pair.len()..]
            .iter()
            .filter_map(|m| match m {
                CanonicalMessage::User(user) => Some(user.text.clone()),
                _ => None,
            })
            .collect();
        self.history.extend(appended);
        if let Some(to) = switched_to {
            tracing::info!(request_id = %self.request_id, from = ?self.mode, ?to, "mode switched");
            self.mode = to;
            self.tool_env.mode = to;
            let (system, mode_tools) =
                compiler::prompt_for(&self.app.prompts, to, self.subagent.as_ref());
            self.system = system;
            self.offered_tools = tools::offered_tools(mode_tools, &self.tool_options);
        }
        if was_todo_write {
            self.tool_env.todos = fold_todos(&self.history);
        }
        if was_task {
            self.subagent_runs = fold_subagent_runs(&self.history, []);
        }
        if let [
            CanonicalMessage::ToolCall(call),
            CanonicalMessage::ToolResult(result),
        ] = &pair
        {
            let still_running: Vec<ToolCall> = self
                .batch
                .iter()
                .filter(|slot| slot.run.is_some())
                .map(|slot| slot.call.clone())
                .collect();
            let details = self.state_details(still_running, None);
            self.checkpoints
                .tool_completed(
                    &self.app.store,
                    &call.call,
                    &result.result,
                    final_card,
                    &details,
                    out,
                )
                .await?;
        }
        if !notice_text.is_empty() {
            self.checkpoints
                .runtime_messages(&self.app.store, &notice_text, out)
                .await?;
        }
        Ok(())
    }

    /// Starts the next provider call once every call of the batch has its result.
    fn after_completion(&mut self) -> Result<LoopStep, ServerError> {
        if self.phase == Phase::Tools && self.batch.iter().all(|slot| slot.run.is_none()) {
            self.start_provider_call();
        }
        Ok(LoopStep::Continue)
    }

    async fn append(&self, messages_to_add: &[CanonicalMessage]) -> Result<(), ServerError> {
        messages::append(
            &self.app.store,
            &self.conversation_id,
            &self.request_id,
            messages_to_add,
        )
        .await?;
        Ok(())
    }

    /// A client answer to a KV request.
    pub async fn on_kv_result(
        &mut self,
        id: u32,
        payload: KvPayload,
        out: &mut Downlink,
    ) -> Result<LoopStep, ServerError> {
        let read = self
            .checkpoints
            .on_kv(&self.app.store, id, payload, out)
            .await?;
        let Some(import) = &mut self.import else {
            return Ok(LoopStep::Continue);
        };
        match read {
            Some(KvOutcome::Fetched { id, data }) => {
                import.got.insert(id, Some(data));
            }
            Some(KvOutcome::Missing(id)) => {
                tracing::warn!(request_id = %self.request_id, blob = %id, "the client does not have a root it listed; left out");
                import.got.insert(id, None);
            }
            _ => {}
        }
        if import.complete() {
            self.finish_import(out).await?;
        }
        Ok(LoopStep::Continue)
    }

    /// All roots are in: they become stored history, then the turn starts as usual.
    async fn finish_import(&mut self, out: &mut Downlink) -> Result<(), ServerError> {
        let Some(import) = self.import.take() else {
            return Ok(());
        };
        let user_text = match import.text_blob {
            None => import.user_text.clone(),
            Some(id) => match import.got.get(&id).cloned().flatten() {
                Some(data) => String::from_utf8(data).map_err(|_| {
                    ProtocolError::Kv(format!("the user message's text blob {id} is not UTF-8"))
                })?,
                None => {
                    return Err(ProtocolError::Kv(format!(
                        "the client does not have the user message's text blob {id}"
                    ))
                    .into());
                }
            },
        };
        let roots: Vec<serde_json::Value> = import
            .roots
            .iter()
            .filter_map(|id| import.got.get(id).cloned().flatten())
            .filter_map(|data| match serde_json::from_slice(&data) {
                Ok(json) => Some(json),
                Err(e) => {
                    tracing::warn!(request_id = %self.request_id, "an imported root is not JSON ({e}); left out");
                    None
                }
            })
            .collect();
        let missing: Vec<BlobId> = import
            .roots
            .iter()
            .filter(|id| matches!(import.got.get(id), Some(None)))
            .copied()
            .collect();
        self.checkpoints.forget_missing_roots(&missing);
        let imported = checkpoint::import_roots(&roots);
        if !import.roots.is_empty() {
            tracing::info!(request_id = %self.request_id, roots = roots.len(), messages = imported.len(), "imported a conversation from the client");
        }
        self.append(&imported).await?;
        self.history = messages::load(&self.app.store, &self.conversation_id).await?;
        self.turn_start = self.history.len();
        let committed = commit_user_message(
            &self.app,
            &self.conversation_id,
            &self.request_id,
            &mut self.history,
            UserMessage {
                origin: Origin::User,
                text: user_text.clone(),
                client_message_id: import.user_message_id.clone(),
                mode: Some(self.mode),
                runtime: None,
            },
            import.context.as_ref(),
        )
        .await?;
        self.tool_env.todos = fold_todos(&self.history);
        self.checkpoints
            .begin_turn(
                &self.app.store,
                &self.request_id,
                TurnOpening {
                    system: &self.system,
                    context: committed.context.as_deref(),
                    mode: self.mode,
                    user_text: &user_text,
                    user_message_id: &import.user_message_id,
                },
                out,
            )
            .await?;
        self.checkpoints
            .runtime_messages(&self.app.store, &committed.after, out)
            .await?;
        self.start_provider_call();
        Ok(())
    }

    /// What the checkpoint states besides the graph, folded from the loop's own state.
    fn state_details(
        &self,
        pending_tool_calls: Vec<ToolCall>,
        turn_ended_at_ms: Option<u64>,
    ) -> StateDetails {
        let model = &self.app.config.providers[self.provider_index].models[self.model_index];
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
            mode: Some(self.mode),
            context: self.last_call_usage.map(|usage| ContextUse {
                used_tokens: usage.input_tokens.unwrap_or(0) + usage.output_tokens.unwrap_or(0),
                max_tokens: u64::from(model.context_window),
            }),
            turn_ended_at_ms,
        }
    }

    /// The turn is over: builds the transitional checkpoint (its complete history) and the final
    /// one (adding the turn's timing); both are published after `turn_ended`
    /// (`release_checkpoints`), once the client has stored their blobs.
    pub async fn final_checkpoints(&mut self, out: &mut Downlink) -> Result<(), ServerError> {
        let ended_at = u64::try_from(crate::store::now_ms()).unwrap_or(0);
        let transitional = self.state_details(Vec::new(), None);
        let last = self.state_details(Vec::new(), Some(ended_at));
        self.checkpoints
            .finish_turn(&self.app.store, &transitional, &last, out)
            .await
    }

    pub async fn release_checkpoints(&mut self, out: &mut Downlink) -> Result<(), ServerError> {
        self.checkpoints.release(&self.app.store, out).await
    }

    /// A checkpoint of what is committed (a failed run publishes it before its error).
    pub async fn committed_checkpoint(&mut self, out: &mut Downlink) -> Result<(), ServerError> {
        let details = self.state_details(Vec::new(), None);
        self.checkpoints
            .checkpoint(&self.app.store, &details, out)
            .await
    }

    /// Sends again the blobs whose ACK is overdue.
    pub async fn resend_overdue_blobs(&mut self, out: &mut Downlink) {
        let after = self.app.config.kv_retry_after;
        self.checkpoints.resend_overdue(after, out).await;
    }

    /// Whether every checkpoint built so far has been published.
    pub fn checkpoints_settled(&self) -> bool {
        self.checkpoints.settled()
    }

    /// The final checkpoint once more.
    pub async fn republish_checkpoint(&self, out: &mut Downlink) {
        self.checkpoints.republish(out).await;
    }

    /// The batch slot an answer (exec result or interaction response) of `kind` for `id` belongs
    /// to; `None` for a late answer, ignored idempotently; a protocol error for an unknown id or
    /// the wrong kind.
    fn active_slot(&self, id: u32, kind: &'static str) -> Result<Option<usize>, ServerError> {
        match self.pending.match_result(id, kind) {
            Ok(Match::Active { slot }) => Ok(Some(slot)),
            Ok(Match::Late) => {
                tracing::info!(request_id = %self.request_id, id, kind, "late answer ignored");
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
        if !self.pending.is_streaming(id) {
            self.pending.finish(id);
        }
        let Some(run) = self.batch[slot].run.as_mut() else {
            return Ok(LoopStep::Continue);
        };
        let steps = run.on_result(payload, &self.tool_env);
        for step in steps {
            self.apply_step(slot, step, out).await?;
        }
        self.after_completion()
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
        self.pending.finish(id);
        let Some(run) = self.batch[slot].run.as_mut() else {
            return Ok(LoopStep::Continue);
        };
        let step = run.on_response(payload, &self.tool_env);
        self.apply_step(slot, step, out).await?;
        self.after_completion()
    }

    /// `stream_close` / `throw` for exec `id`.
    pub async fn on_exec_control(
        &mut self,
        id: u32,
        control: ExecControl,
        out: &mut Downlink,
    ) -> Result<LoopStep, ServerError> {
        let slot = match self.pending.match_control(id) {
            Ok(Match::Active { slot }) => slot,
            Ok(Match::Late) => {
                // A stream_close after a shell's exit is the normal end of that exec.
                tracing::debug!(request_id = %self.request_id, exec_id = id, ?control, "control for a finished exec");
                return Ok(LoopStep::Continue);
            }
            Err(e) => return Err(ProtocolError::Exec(e.to_string()).into()),
        };
        let Some(run) = self.batch[slot].run.as_mut() else {
            return Ok(LoopStep::Continue);
        };
        let outcome = match &control {
            ExecControl::Throw { error } => run.on_throw(error),
            ExecControl::StreamClose => run.on_closed_without_result(&self.tool_env),
        };
        self.apply_step(slot, ToolStep::Done(outcome), out).await?;
        self.after_completion()
    }

    /// The run is ending early: abort running execs and bring every drawn card to a terminal
    /// (error) state. Completed tools stay in history; nothing unfinished is persisted.
    pub async fn abandon(&mut self, reason: &str, out: &mut Downlink) {
        if matches!(self.phase, Phase::Streaming | Phase::Compacting) {
            self.record_call(self.draft.usage, None, Some(format!("abandoned: {reason}")))
                .await;
        }
        for (id, _) in self.pending.running() {
            out.send_message(&exec::abort(id)).await;
            self.pending.finish(id);
        }
        for slot in &mut self.batch {
            if let Some(run) = slot.run.take() {
                let outcome = run.abandon(reason);
                out.send_message(&interaction::tool_call_completed(
                    &slot.call.call_id,
                    outcome.card,
                    &self.model_call_id,
                ))
                .await;
            }
        }
        for call in std::mem::take(&mut self.draft.calls) {
            if let Some(kind) = call.kind {
                out.send_message(&interaction::tool_call_completed(
                    &call.call_id,
                    Box::new(tool_result::invalid_card(kind, reason)),
                    &self.model_call_id,
                ))
                .await;
            }
        }
    }
}

/// The runtime texts a committed user message brought, for the checkpoint roots.
struct CommittedUserMessage {
    /// The injected-context message before it, if the context was new.
    context: Option<String>,
    /// Notices and reminders after it.
    after: Vec<String>,
}

/// Appends the user's message with its runtime messages in one transaction: the workspace context
/// before it when the model has not seen that context yet, the mode notice and the mode's reminder
/// after it. `history` (the stored history before the message) is extended with what was stored.
async fn commit_user_message(
    app: &AppState,
    conversation_id: &str,
    request_id: &str,
    history: &mut Vec<CanonicalMessage>,
    user: UserMessage,
    context: Option<&WorkspaceContext>,
) -> Result<CommittedUserMessage, ServerError> {
    let mode = user.mode.unwrap_or_default();
    let before: Vec<RuntimeTag> = context
        .and_then(|context| compiler::context_tag(history, context, request_id))
        .into_iter()
        .collect();
    let after = compiler::user_message_tags(&app.prompts, current_mode(history), mode, request_id);
    let appended = messages::append_with_tags(
        &app.store,
        conversation_id,
        request_id,
        &before,
        &[CanonicalMessage::User(user)],
        &after,
    )
    .await?;
    let user_at = appended
        .iter()
        .position(|m| matches!(m, CanonicalMessage::User(u) if u.origin == Origin::User))
        .unwrap_or(0);
    let text = |m: &CanonicalMessage| match m {
        CanonicalMessage::User(user) => Some(user.text.clone()),
        _ => None,
    };
    let committed = CommittedUserMessage {
        context: appended[..user_at].iter().find_map(text),
        after: appended[user_at + 1..].iter().filter_map(text).collect(),
    };
    history.extend(appended);
    Ok(committed)
}

/// The subagents of `history`'s Task calls, plus the `running` Task calls (id, arguments) of the
/// current batch.
fn fold_subagent_runs<'a>(
    history: &[CanonicalMessage],
    running: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> Vec<derived_state::SubagentRunState> {
    derived_state::fold_subagent_runs(
        history,
        running,
        ToolKind::Task.name(),
        tool_result::task_title,
        tool_result::subagent_state,
    )
}

fn fold_todos(history: &[CanonicalMessage]) -> Vec<derived_state::Todo> {
    derived_state::fold_todos(history, ToolKind::TodoWrite.name(), parse_todo_update)
}

impl Drop for TurnLoop {
    /// Whatever ends the turn also ends its provider call.
    fn drop(&mut self) {
        self.call_cancel.cancel();
    }
}
