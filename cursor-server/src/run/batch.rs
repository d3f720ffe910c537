//! One tool batch: every call of a model answer started at once, their exec results, questions and
//! searches routed back by slot, and each completed call committed as one unit of work — its card
//! and images, its record, the call and result, the mode notice an approved switch brings, the
//! graph's blobs and the checkpoint showing it: one write transaction (`store/commit.rs`).
//!
//! Its own file because `run/loop_engine.rs` (the plan's "LLM → Tool → LLM main loop") cannot hold
//! the batch's transitions besides the turn's phases within 800 lines; the batch is the turn's
//! `Phase::Tools` data.

use tokio::sync::mpsc;
use tokio_util::sync::{CancellationToken, DropGuard};

use super::lifecycle::{Building, Emission};
use super::turn::{Turn, fold_plan, fold_subagent_runs, fold_todos, switch_mode};
use crate::client::command::ExecControl;
use crate::client::downlink::Downlink;
use crate::client::interaction;
use crate::error::ServerError;
use crate::model::conversation::{BlobId, Mode};
use crate::model::message::{CanonicalMessage, ToolCallRecord, ToolResultRecord};
use crate::model::runtime_tag::{BackgroundKind, RuntimeTag};
use crate::model::tool::{ToolCall, ToolMeta, ToolResult};
use crate::ops::metrics;
use crate::prompting::compiler;
use crate::provider::web_search::{self, SearchHit};
use crate::store::{StoreError, commit, messages, now_ms, runs};
use crate::sync::checkpoint::StepBlob;
use crate::tools::exec::{ExecKind, ExecPayload, QueryPayload};
use crate::tools::tool_result::{ToolImage, ToolOutcome, ToolStep};
use crate::tools::{ToolKind, ToolRun, task};

/// A finished server-side search for the call in `slot`.
#[derive(Debug)]
pub struct SearchDone {
    slot: usize,
    call_id: String,
    hits: Result<Vec<SearchHit>, String>,
}

/// One tool call of the batch.
#[derive(Debug)]
struct Slot {
    call: ToolCall,
    index: u32,
    /// The running call; `None` before it starts and once it has its outcome.
    run: Option<ToolRun>,
    /// When the batch took the call (for its record's duration).
    started_at_ms: i64,
}

/// How one call ended: its final card (when one was drawn), what the model reads, and the typed
/// facts stored with the result.
struct Ending {
    outcome: Option<ToolOutcome>,
    model_text: String,
    is_error: bool,
    meta: Option<ToolMeta>,
    images: Vec<ToolImage>,
}

pub(super) struct Batch {
    slots: Vec<Slot>,
    /// How many calls have their result stored.
    finished: usize,
    /// Server-side searches report back here (the sender is cloned into each search task).
    searches: (mpsc::Sender<SearchDone>, mpsc::Receiver<SearchDone>),
    /// Cancels the batch's searches when the batch is gone.
    cancel: CancellationToken,
    _cancel_on_drop: DropGuard,
}

impl Batch {
    /// Starts every call; calls that cannot start end at once with their error.
    pub async fn start(
        turn: &mut Turn,
        calls: Vec<(u32, ToolCall)>,
        out: &mut Downlink,
    ) -> Result<Batch, ServerError> {
        let cancel = CancellationToken::new();
        let mut batch = Batch {
            slots: calls
                .into_iter()
                .map(|(index, call)| Slot {
                    call,
                    index,
                    run: None,
                    started_at_ms: now_ms(),
                })
                .collect(),
            finished: 0,
            searches: mpsc::channel(4),
            _cancel_on_drop: cancel.clone().drop_guard(),
            cancel,
        };
        for slot in 0..batch.slots.len() {
            batch.start_slot(turn, slot, out).await?;
        }
        Ok(batch)
    }

    async fn start_slot(
        &mut self,
        turn: &mut Turn,
        slot: usize,
        out: &mut Downlink,
    ) -> Result<(), ServerError> {
        match ToolRun::start(&self.slots[slot].call, &turn.tool_env) {
            Ok((run, started, step)) => {
                let call_id = &self.slots[slot].call.call_id;
                out.send_message(&interaction::tool_call_started(
                    call_id,
                    started,
                    &turn.model_call_id,
                ))
                .await;
                self.slots[slot].run = Some(run);
                self.apply_step(turn, slot, step, out).await
            }
            Err(rejected) => {
                tracing::info!(
                    tool = %self.slots[slot].call.name,
                    "tool call rejected: {}",
                    rejected.model_text
                );
                let outcome = rejected.card.map(|card| ToolOutcome {
                    images: Vec::new(),
                    card,
                    model_text: rejected.model_text.clone(),
                    is_error: true,
                    meta: None,
                });
                let ending = Ending {
                    images: Vec::new(),
                    outcome,
                    model_text: rejected.model_text,
                    is_error: true,
                    meta: None,
                };
                self.finish_slot(turn, slot, ending, out).await
            }
        }
    }

    /// Whether every call has its result.
    pub fn complete(&self) -> bool {
        self.finished == self.slots.len()
    }

    /// The next finished search (the batch holds a sender, so this waits rather than ends).
    pub async fn next_search(&mut self) -> SearchDone {
        match self.searches.1.recv().await {
            Some(done) => done,
            None => std::future::pending().await,
        }
    }

    async fn apply_step(
        &mut self,
        turn: &mut Turn,
        slot: usize,
        step: ToolStep,
        out: &mut Downlink,
    ) -> Result<(), ServerError> {
        match step {
            ToolStep::Exec(request) => {
                let id = turn.pending.register(slot, &request);
                out.send_message(&request.into_server_message(id)).await;
            }
            ToolStep::Query(request) => {
                let id = turn.pending.register_query(slot, &request);
                out.send_message(&request.into_server_message(id)).await;
            }
            ToolStep::Search(query) => self.start_search(turn, slot, query),
            ToolStep::Delta(delta) => {
                let call_id = &self.slots[slot].call.call_id;
                out.send_message(&interaction::tool_call_delta(
                    call_id,
                    delta,
                    &turn.model_call_id,
                ))
                .await;
            }
            ToolStep::Done(mut outcome) => {
                let ending = Ending {
                    images: std::mem::take(&mut outcome.images),
                    model_text: outcome.model_text.clone(),
                    is_error: outcome.is_error,
                    meta: outcome.meta.clone(),
                    outcome: Some(outcome),
                };
                self.finish_slot(turn, slot, ending, out).await?;
            }
        }
        Ok(())
    }

    /// A client result for the call in `slot`.
    pub async fn on_result(
        &mut self,
        turn: &mut Turn,
        slot: usize,
        payload: ExecPayload,
        out: &mut Downlink,
    ) -> Result<(), ServerError> {
        let Some(run) = self.slots[slot].run.as_mut() else {
            return Ok(());
        };
        for step in run.on_result(payload, &turn.tool_env) {
            self.apply_step(turn, slot, step, out).await?;
        }
        Ok(())
    }

    /// The user's response to the question of the call in `slot`.
    pub async fn on_response(
        &mut self,
        turn: &mut Turn,
        slot: usize,
        payload: QueryPayload,
        out: &mut Downlink,
    ) -> Result<(), ServerError> {
        let Some(run) = self.slots[slot].run.as_mut() else {
            return Ok(());
        };
        let step = run.on_response(payload, &turn.tool_env);
        self.apply_step(turn, slot, step, out).await
    }

    /// The client answered the call in `slot` with a result of another kind than its request
    /// asks for: the call fails, and the model is told what happened.
    pub async fn on_wrong_result(
        &mut self,
        turn: &mut Turn,
        slot: usize,
        expected: ExecKind,
        got: ExecKind,
        out: &mut Downlink,
    ) -> Result<(), ServerError> {
        let Some(run) = self.slots[slot].run.as_mut() else {
            return Ok(());
        };
        let outcome = run.on_wrong_result(expected, got);
        self.apply_step(turn, slot, ToolStep::Done(outcome), out)
            .await
    }

    /// The user moved the running call `call_id` to the background: its execs are over for this
    /// turn (later messages for them are late), and it completes as backgrounded. A call that is
    /// not running, or not of that kind, is left alone (logged).
    pub async fn move_to_background(
        &mut self,
        turn: &mut Turn,
        call_id: &str,
        kind: BackgroundKind,
        out: &mut Downlink,
    ) -> Result<(), ServerError> {
        let found = self
            .slots
            .iter()
            .position(|slot| slot.call.call_id == call_id && slot.run.is_some());
        let Some(slot) = found else {
            tracing::warn!(
                call_id,
                ?kind,
                "moved to the background, but no such call is running; ignored"
            );
            return Ok(());
        };
        let Some(outcome) = self.slots[slot]
            .run
            .as_mut()
            .and_then(|run| run.moved_to_background(kind, &turn.tool_env))
        else {
            tracing::warn!(
                call_id,
                ?kind,
                "moved to the background, but the call is not of that kind; ignored"
            );
            return Ok(());
        };
        tracing::info!(
            call_id,
            ?kind,
            "the user moved a running call to the background; the turn goes on"
        );
        turn.pending.finish_slot(slot);
        self.apply_step(turn, slot, ToolStep::Done(outcome), out)
            .await
    }

    /// `stream_close` / `throw` for the exec of the call in `slot`.
    pub async fn on_control(
        &mut self,
        turn: &mut Turn,
        slot: usize,
        control: ExecControl,
        out: &mut Downlink,
    ) -> Result<(), ServerError> {
        let Some(run) = self.slots[slot].run.as_mut() else {
            return Ok(());
        };
        let outcome = match &control {
            ExecControl::Throw { error } => run.on_throw(error),
            ExecControl::StreamClose => run.on_closed_without_result(&turn.tool_env),
        };
        self.apply_step(turn, slot, ToolStep::Done(outcome), out)
            .await
    }

    /// A search result for a call still waiting on it; anything else is dropped.
    pub async fn on_search_done(
        &mut self,
        turn: &mut Turn,
        done: SearchDone,
        out: &mut Downlink,
    ) -> Result<(), ServerError> {
        let Some(slot) = self.slots.get_mut(done.slot) else {
            return Ok(());
        };
        if slot.call.call_id != done.call_id {
            return Ok(());
        }
        let Some(run) = slot.run.as_mut() else {
            return Ok(());
        };
        let outcome = run.on_search(done.hits, &turn.tool_env);
        self.apply_step(turn, done.slot, ToolStep::Done(outcome), out)
            .await
    }

    /// Runs an approved search on the configured backend, off the actor's task.
    fn start_search(&self, turn: &Turn, slot: usize, query: String) {
        let sender = self.searches.0.clone();
        let call_id = self.slots[slot].call.call_id.clone();
        let http = turn.app.http.clone();
        let backend = turn.app.config.web_search.clone();
        let cancel = self.cancel.clone();
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

    /// A call ended: its card completes, then its result is committed as one unit of work (one
    /// write transaction: `commit`), then what the result changes follows from history (mode,
    /// todos, plan, subagents) and the checkpoint publishes it.
    async fn finish_slot(
        &mut self,
        turn: &mut Turn,
        slot: usize,
        ending: Ending,
        out: &mut Downlink,
    ) -> Result<(), ServerError> {
        turn.pending.finish_slot(slot);
        let entry = &mut self.slots[slot];
        let execution = record(turn, entry, ending.is_error);
        let run = entry.run.take();
        let switched_to = match (&run, &ending.outcome) {
            (Some(run), Some(outcome)) => run.switched_mode(outcome),
            _ => None,
        }
        .filter(|to| *to != turn.mode());
        // The card's blob is stored with the result that names it, in `commit`.
        let card = (ending.outcome.as_ref()).map(|o| {
            turn.checkpoints
                .stage(StepBlob::tool_card((*o.card).clone()))
        });
        if let Some(outcome) = ending.outcome {
            out.send_message(&interaction::tool_call_completed(
                &entry.call.call_id,
                outcome.card,
                &turn.model_call_id,
            ))
            .await;
        }
        let call = entry.call.clone();
        let result = result_of(
            &call,
            ending.model_text,
            ending.is_error,
            ending.meta,
            &ending.images,
        );
        let mut blobs: Vec<(BlobId, &[u8])> = (card.iter())
            .map(|card| (card.id, card.data.as_ref()))
            .collect();
        blobs.extend(
            ending
                .images
                .iter()
                .map(|i| (i.image.blob, i.data.as_slice())),
        );
        let card_id = card.as_ref().map(|card| card.id);
        let (messages, notice) =
            result_messages(turn, &call, result, (entry.index, card_id), switched_to).await?;
        let kind = run.as_ref().map(ToolRun::kind);
        let expected: Vec<CanonicalMessage> = (messages.iter().cloned())
            .chain(notice.iter().map(RuntimeTag::message))
            .collect();
        let (entered, building) = project(turn, &expected, switched_to, kind, &call).await?;
        let staged = Staged {
            blobs: &blobs,
            messages: &messages,
            notice: &notice,
            execution: &execution,
        };
        commit(turn, staged, (&entered, building.as_ref()), expected.len()).await?;
        self.finished += 1;
        turn.load_images(&expected).await?;
        turn.checkpoints.delivered(entered, out).await;
        if let Some(building) = building {
            turn.checkpoints.built(building, out).await?;
        }
        Ok(())
    }

    /// Ends every running call with `reason` on its card (nothing is persisted).
    pub async fn abandon(&mut self, turn: &Turn, reason: &str, out: &mut Downlink) {
        for slot in &mut self.slots {
            if let Some(run) = slot.run.take() {
                let outcome = run.abandon(reason);
                out.send_message(&interaction::tool_call_completed(
                    &slot.call.call_id,
                    outcome.card,
                    &turn.model_call_id,
                ))
                .await;
            }
        }
    }
}

/// The call's metric, and the console's record of it (stored with its result).
fn record(turn: &Turn, entry: &Slot, is_error: bool) -> runs::ToolExecution {
    let outcome = if is_error { "error" } else { "success" };
    metrics::tool_exec(&entry.call.name, outcome);
    runs::ToolExecution {
        request_id: turn.request_id.clone(),
        call_id: entry.call.call_id.clone(),
        tool: entry.call.name.clone(),
        summary: runs::summarize_arguments(&entry.call.arguments),
        started_at_ms: entry.started_at_ms,
        duration_ms: now_ms() - entry.started_at_ms,
        outcome,
    }
}

/// What the model reads of the call's ending, with its images and typed facts.
fn result_of(
    call: &ToolCall,
    content: String,
    is_error: bool,
    meta: Option<ToolMeta>,
    images: &[ToolImage],
) -> ToolResult {
    ToolResult {
        images: images.iter().map(|i| i.image.clone()).collect(),
        call_id: call.call_id.clone(),
        content,
        is_error,
        meta: meta.or_else(|| {
            // A Task that ended without its subagent's result still lists (as failed).
            (call.name == ToolKind::Task.name()).then(|| task::untold_meta(&call.arguments))
        }),
    }
}

/// What the result changes follows from history before it is committed — the mode an approved
/// switch brings, the todos, plan and subagent runs, the graph and the checkpoint showing it —
/// so the checkpoint is stored by the result's own transaction. The graph adds the batch in call
/// order, the order the model's requests project it in (protocol.md §7), whatever order the calls
/// finish in; a checkpoint names every call not in it yet as pending, started or not.
async fn project(
    turn: &mut Turn,
    expected: &[CanonicalMessage],
    switched_to: Option<Mode>,
    kind: Option<ToolKind>,
    call: &ToolCall,
) -> Result<(Emission, Option<Building>), ServerError> {
    turn.history.extend_from_slice(expected);
    if let Some(to) = switched_to {
        switch_mode(turn, to);
    }
    refold(turn, kind, call);
    let (grew, entered) = turn.checkpoints.entering(expected).await?;
    if !grew {
        return Ok((entered, None));
    }
    let details = turn.state_details(turn.checkpoints.pending_calls(), None);
    Ok((entered, turn.checkpoints.building(&details).await?))
}

/// What a result's commit writes besides the graph: the card's and the images' blobs, the call
/// and its result, the notice, the call's record.
struct Staged<'a> {
    blobs: &'a [(BlobId, &'a [u8])],
    messages: &'a [CanonicalMessage],
    notice: &'a [RuntimeTag],
    execution: &'a runs::ToolExecution,
}

/// The call and its result (naming its card), and the notice of an approved mode switch the
/// conversation has not been told yet: the model is told in the result's transaction.
async fn result_messages(
    turn: &Turn,
    call: &ToolCall,
    result: ToolResult,
    (index, card): (u32, Option<BlobId>),
    switched_to: Option<Mode>,
) -> Result<(Vec<CanonicalMessage>, Vec<RuntimeTag>), ServerError> {
    let pair = vec![
        CanonicalMessage::ToolCall(ToolCallRecord {
            model_call_id: turn.model_call_id.clone(),
            index,
            call: call.clone(),
        }),
        CanonicalMessage::ToolResult(ToolResultRecord {
            card,
            model_call_id: turn.model_call_id.clone(),
            index,
            result,
        }),
    ];
    let notice: Vec<_> = switched_to
        .map(|to| compiler::mode_switch_tag(&turn.app.prompts, turn.mode(), to, &call.call_id))
        .into_iter()
        .collect();
    let notice = messages::unconsumed(&turn.app.store, turn.conversation_id(), &notice).await?;
    Ok((pair, notice))
}

/// Commits the result in one write transaction: `staged`, the graph's blobs `entered` adds and
/// the checkpoint `building` made (the blobs sent recorded as owed, the state as the unpublished
/// checkpoint). `expected` is how many messages the graph and history took in: a notice told
/// meanwhile would make them differ, so that is refused rather than published.
async fn commit(
    turn: &Turn,
    staged: Staged<'_>,
    (entered, building): (&Emission, Option<&Building>),
    expected: usize,
) -> Result<(), ServerError> {
    let edges = entered.edges();
    let mut graph = entered.rows(&edges);
    let mut sent = entered.sent.clone();
    let checkpoint_edges = building.map(|b| b.emission().edges()).unwrap_or_default();
    if let Some(building) = building {
        graph.extend(building.emission().rows(&checkpoint_edges));
        sent.extend_from_slice(&building.emission().sent);
    }
    let rows: Vec<(BlobId, &[u8])> = staged.blobs.to_vec();
    let unit = commit::ToolResultCommit {
        conversation_id: turn.conversation_id(),
        request_id: &turn.request_id,
        blobs: &rows,
        messages: staged.messages,
        after: staged.notice,
        execution: staged.execution,
        graph: &graph,
        sent: &sent,
        built: building.map(Building::state_id),
    };
    let appended = commit::tool_result(&turn.app.store, &unit).await?;
    if appended.len() != expected {
        return Err(StoreError::HistoryMoved {
            conversation_id: turn.conversation_id().to_owned(),
            request_id: turn.request_id.clone(),
        }
        .into());
    }
    Ok(())
}

/// Folds again what the finished call may have changed: the todo list, the subagent runs.
fn refold(turn: &mut Turn, kind: Option<ToolKind>, call: &ToolCall) {
    if kind == Some(ToolKind::TodoWrite) {
        turn.tool_env.todos = fold_todos(&turn.history);
    }
    if call.name == ToolKind::Task.name() {
        turn.subagent_runs = fold_subagent_runs(&turn.history);
    }
    if kind == Some(ToolKind::CreatePlan) {
        turn.plan = fold_plan(&turn.history);
    }
}
