//! What holds for a whole run, whatever phase its turn is in: the app's services, the model
//! resolved once, history, exec ids, the tools' view of the run (mode, conversation and model ids,
//! kept once), checkpoints, usage; and the provider calls it starts and records.
//!
//! Its own file because the turn's phases (`run/loop_engine.rs`), its openers (`run/opening.rs`),
//! its tool batch (`run/batch.rs`) and its compaction (`run/compaction.rs`) all act on it: in
//! `loop_engine.rs` those files and it would import each other.

use std::sync::Arc;
use std::time::Instant;

use tokio_util::sync::{CancellationToken, DropGuard};

use super::lifecycle::Checkpoints;
use crate::client::command::RunRequestInput;
use crate::config::{Config, ModelChoice, ModelConfig, ProviderConfig, RouteRequest, RoutedBy};
use crate::error::ServerError;
use crate::model::conversation::{ContextUse, Mode, SubagentRole, SubagentRunState, Todo};
use crate::model::message::CanonicalMessage;
use crate::model::tool::ToolCall;
use crate::model::usage::Usage;
use crate::ops::metrics;
use crate::prompting::compiler::{self, RequestParameters};
use crate::prompting::derived_state;
use crate::prompting::images::ImageSet;
use crate::provider::{self, CallLimits, EventReceiver, ProviderError, RequestBody, family};
use crate::state::AppState;
use crate::store::runs::{self, CallPurpose};
use crate::store::{blobs, messages, now_ms};
use crate::sync::checkpoint::StateDetails;
use crate::tools::pending::PendingExecs;
use crate::tools::tool_result::{Tool, ToolEnv};
use crate::tools::{ToolKind, ToolOptions, interactive, task, todo};

/// Loads into `set` the bytes of the images in `messages` it does not hold yet. An image whose blob
/// is gone is left out of `set` (the model is told it is no longer stored).
pub(super) async fn load_images(
    store: &crate::store::Store,
    set: &mut ImageSet,
    messages: &[CanonicalMessage],
) -> Result<(), ServerError> {
    let refs = messages.iter().flat_map(|message| match message {
        CanonicalMessage::User(user) => user.images.as_slice(),
        CanonicalMessage::ToolResult(record) => record.result.images.as_slice(),
        _ => &[],
    });
    for image in refs {
        if set.contains(image.blob) {
            continue;
        }
        match blobs::get(store, image.blob).await? {
            Some(data) => set.insert(image.blob, &data),
            None => tracing::warn!(blob = %image.blob, "an image in history is no longer stored"),
        }
    }
    Ok(())
}

/// Bytes of projected request per token before a provider call has reported its real usage.
const DEFAULT_BYTES_PER_TOKEN: f64 = 4.0;

/// What holds for the whole run, whatever phase it is in.
pub(super) struct Turn {
    pub app: Arc<AppState>,
    pub request_id: String,
    /// The model this call goes to: the run's model (resolved once from Cursor's name), or one of
    /// its fallbacks while the run's model fails.
    pub provider: ProviderConfig,
    pub model: ModelConfig,
    /// The run's model and its fallbacks; `fallback_from` names the model whose failure made the
    /// current call go to a fallback.
    pub route: CallRoute,
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
    pub offered_tools: Vec<std::sync::Arc<serde_json::Value>>,
    /// Set when another agent's Task call started this run (subagent prompt and tools).
    pub subagent: Option<SubagentRole>,
    /// The subagents this conversation's finished Task calls started (refolded when one ends).
    pub subagent_runs: Vec<SubagentRunState>,
    /// The plan folded from history (the last CreatePlan the user accepted).
    pub plan: Option<String>,
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
    /// The bytes of the images history shows (loaded when the run opens and as results bring more).
    pub images: ImageSet,
}

/// Where a run's provider calls go: each call starts on the run's model and moves down its
/// fallbacks, in order, when it fails before streaming with an error another provider may not
/// have (`ProviderError::falls_back`).
#[derive(Debug, Clone)]
pub(super) struct CallRoute {
    pub primary: ModelChoice,
    pub fallbacks: Vec<ModelChoice>,
    /// How many fallbacks the current call has used.
    pub used: usize,
    pub fallback_from: Option<String>,
}

/// The configured model a run calls, and where its calls fall back to.
pub(super) struct ResolvedModel {
    pub provider: ProviderConfig,
    pub model: ModelConfig,
    pub parameters: Vec<(String, String)>,
    pub route: CallRoute,
}

/// The configured model for Cursor's name (routed: an alias, Auto, the model of the run's mode or
/// subagent type), with the parameters the name implies (a suffix such as `-high` counts unless
/// Cursor also sent the parameter) followed by those Cursor sent.
impl ResolvedModel {
    pub fn of(
        config: &Config,
        requested: &str,
        input: &RunRequestInput,
    ) -> Result<ResolvedModel, ServerError> {
        let routed = config
            .route(RouteRequest {
                name: requested,
                mode: input.mode,
                subagent: input.subagent.as_ref().map(|role| role.type_name.as_str()),
            })
            .ok_or_else(|| {
                ServerError::NotFound(format!(
                    "model {requested:?} is not configured (configured models: {})",
                    config.model_ids().collect::<Vec<_>>().join(", ")
                ))
            })?;
        let (provider, model) = config.chosen(&routed.choice);
        if routed.by != RoutedBy::Exact {
            tracing::info!(requested, model = %model.id, by = ?routed.by, "model routed");
        }
        let mut parameters = routed.choice.implied.clone();
        parameters.extend(input.parameters.iter().cloned());
        Ok(ResolvedModel {
            route: CallRoute {
                fallbacks: config.fallbacks_of(&model.id),
                primary: routed.choice.clone(),
                used: 0,
                fallback_from: None,
            },
            provider: provider.clone(),
            model: model.clone(),
            parameters,
        })
    }
}

/// A provider call in flight: its events, its record, and its cancellation when dropped.
pub(super) struct ProviderCall {
    pub events: EventReceiver,
    pub timing: Option<CallTiming>,
    /// `[auth]`: the call's place among its person's calls in flight, released once charged.
    budget: Option<crate::auth::budget::CallSlot>,
    _cancel: DropGuard,
}

/// How a provider call ended, for its record.
pub(super) enum CallEnd<'a> {
    /// Its terminal event came, with this finish reason.
    Finished(String),
    Failed(&'a ProviderError),
    /// The run stopped it (a cancel, a failure elsewhere), for this reason.
    Abandoned(&'a str),
}

/// The timing of a provider call, for its record.
#[derive(Debug)]
pub(super) struct CallTiming {
    purpose: CallPurpose,
    request_bytes: usize,
    pub started: Instant,
    started_at_ms: i64,
    pub first_event: Option<std::time::Duration>,
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
        tools: &[std::sync::Arc<serde_json::Value>],
    ) -> RequestBody {
        let request = compiler::compile(
            system,
            history,
            &self.model,
            tools,
            self.parameters,
            &self.images,
        );
        family::project(self.provider.kind, &request)
    }

    /// A new provider call starts on the run's own model.
    pub fn use_primary(&mut self) {
        if self.route.used > 0 {
            let (provider, model) = self.app.config.chosen(&self.route.primary);
            (self.provider, self.model) = (provider.clone(), model.clone());
        }
        self.route.used = 0;
        self.route.fallback_from = None;
    }

    /// A request too large for the run's model goes to its `context_fallback` (a configured
    /// model with a larger window) instead of being compacted; `false` when it has none.
    pub fn use_context_fallback(&mut self) -> bool {
        let Some(larger) = self.model.context_fallback.clone() else {
            return false;
        };
        let Some(choice) = self.app.config.resolve_configured(&larger) else {
            return false;
        };
        let (provider, model) = self.app.config.chosen(&choice);
        tracing::info!(from = %self.model.id, to = %model.id, "the request does not fit the model's context window; sending it to its context fallback");
        self.route.fallback_from = Some(std::mem::replace(&mut self.model, model.clone()).id);
        self.provider = provider.clone();
        // Its failures fall back along the larger model's own chain.
        self.route.fallbacks = self.app.config.fallbacks_of(&larger);
        self.route.used = 0;
        true
    }

    /// Moves the current call to the next fallback; `false` when none is left.
    pub fn use_next_fallback(&mut self) -> bool {
        let Some(next) = self.route.fallbacks.get(self.route.used) else {
            return false;
        };
        let (provider, model) = self.app.config.chosen(next);
        self.route.fallback_from = Some(std::mem::replace(&mut self.model, model.clone()).id);
        self.provider = provider.clone();
        self.route.used += 1;
        true
    }

    /// Loads the bytes of the images in `messages` this run does not hold yet.
    pub async fn load_images(&mut self, messages: &[CanonicalMessage]) -> Result<(), ServerError> {
        load_images(&self.app.store, &mut self.images, messages).await
    }

    pub fn provider_error(&self, message: String) -> ServerError {
        ProviderError::Decode {
            provider: self.provider.name.clone(),
            message,
        }
        .into()
    }

    /// Starts one streaming provider call with `body`.
    pub fn send(&mut self, body: RequestBody, purpose: CallPurpose) -> ProviderCall {
        let config = &self.app.config;
        self.last_body_bytes = body.len();
        self.model_call_id = uuid::Uuid::new_v4().to_string();
        self.provider_calls += 1;
        tracing::debug!(
            model_call_id = %self.model_call_id,
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
        // The call's own lines (its retries) carry its model_call_id; the run's lines do not.
        let span = tracing::info_span!("call", model_call_id = %self.model_call_id);
        // `[auth]`: the person's budget and limits are checked before the call is sent.
        let (gate, budget) =
            crate::auth::budget::gate(&self.app, &self.request_id, &self.model.id).unzip();
        let events = span.in_scope(|| {
            provider::call_gated(
                &self.app.http,
                &self.provider,
                (&self.app.keys.get(&self.provider), gate),
                body,
                CallLimits {
                    headers_timeout: config.provider_connect_timeout,
                    idle_timeout: config.provider_idle_timeout,
                    max_attempts: config.provider_max_attempts,
                    retry_base_delay: config.provider_retry_base_delay,
                },
                cancel.clone(),
            )
        });
        ProviderCall {
            events,
            timing: Some(timing),
            budget,
            _cancel: cancel.drop_guard(),
        }
    }

    /// Stores the record of `call` (once per call, when it ends) and counts it in the metrics.
    pub async fn record_call(
        &self,
        call: &mut ProviderCall,
        usage: Option<Usage>,
        end: CallEnd<'_>,
    ) {
        let Some(timing) = call.timing.take() else {
            return;
        };
        let (outcome, finish_reason, error) = match end {
            CallEnd::Finished(reason) => ("success", Some(reason), None),
            CallEnd::Failed(error) => (error.kind(), None, Some(error.to_string())),
            CallEnd::Abandoned(reason) => ("abandoned", None, Some(format!("abandoned: {reason}"))),
        };
        let usage = usage.unwrap_or_default();
        let retries = call.events.retries();
        metrics::provider_call(&metrics::CallReport {
            provider: &self.provider.name,
            model: &self.model.id,
            outcome,
            attempts: u32::try_from(retries.len())
                .unwrap_or(u32::MAX)
                .saturating_add(1),
            first_event: timing.first_event,
            total: timing.started.elapsed(),
            usage: &usage,
        });
        let millis = |d: std::time::Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        let record = runs::ProviderCallRecord {
            model_call_id: self.model_call_id.clone(),
            request_id: self.request_id.clone(),
            conversation_id: self.conversation_id().to_owned(),
            provider: self.provider.name.clone(),
            model_id: self.model.id.clone(),
            purpose: timing.purpose,
            request_bytes: timing.request_bytes as u64,
            started_at_ms: timing.started_at_ms,
            first_event_ms: timing.first_event.map(millis),
            total_ms: millis(timing.started.elapsed()),
            usage,
            finish_reason,
            error,
            retries,
            fallback_from: self.route.fallback_from.clone(),
            key_index: call.events.key_index().and_then(|i| u32::try_from(i).ok()),
        };
        tracing::info!(
            model_call_id = %record.model_call_id,
            purpose = record.purpose.as_str(),
            first_event_ms = record.first_event_ms,
            total_ms = record.total_ms,
            input_tokens = record.usage.input_tokens,
            output_tokens = record.usage.output_tokens,
            finish_reason = record.finish_reason.as_deref(),
            error = record.error.as_deref(),
            attempts = record.attempts(),
            "provider call ended"
        );
        // `[auth]`: what the call spent, charged to its person with the record.
        let charge =
            crate::auth::budget::charge_of(&self.app, &self.request_id, &self.model, &record.usage)
                .await;
        let recorded = match &charge {
            Some(charge) => {
                crate::store::budgets::record_charged_call(&self.app.store, &record, charge).await
            }
            None => runs::record_provider_call(&self.app.store, &record).await,
        };
        if let Err(e) = recorded {
            tracing::warn!("recording a provider call: {e}");
        }
        if let Some(budget) = call.budget.take() {
            budget.release();
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
        subagent_runs.extend(
            pending_tool_calls
                .iter()
                .filter(|c| c.name == ToolKind::Task.name())
                .map(|c| task::running(&c.call_id, &c.arguments)),
        );
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
            plan: self.plan.clone(),
        }
    }

    /// Counts a finished call's usage into the run and the bytes-per-token estimate.
    pub fn count_usage(&mut self, usage: &Usage) {
        if let Some(input_tokens) = usage.input_tokens.filter(|t| *t > 0) {
            self.bytes_per_token =
                (self.last_body_bytes as f64 / input_tokens as f64).clamp(1.0, 16.0);
        }
        self.last_call_usage = Some(*usage);
        self.usage.accumulate(usage);
    }
}

/// The subagents of `history`'s Task calls.
pub(super) fn fold_subagent_runs(history: &[CanonicalMessage]) -> Vec<SubagentRunState> {
    derived_state::fold_subagent_runs(history, [])
}

/// The plan of `history`'s last accepted CreatePlan.
pub(super) fn fold_plan(history: &[CanonicalMessage]) -> Option<String> {
    derived_state::fold_plan(history, ToolKind::CreatePlan.name(), |arguments| {
        interactive::CreatePlanInput::parse(arguments)
            .ok()
            .map(|input| input.plan)
    })
}

pub(super) fn fold_todos(history: &[CanonicalMessage]) -> Vec<Todo> {
    derived_state::fold_todos(history, ToolKind::TodoWrite.name(), todo::parse_todo_update)
}

/// A new mode's system prompt and tools for this run.
pub(super) fn switch_mode(turn: &mut Turn, to: Mode) {
    tracing::info!(from = ?turn.mode(), ?to, "mode switched");
    turn.tool_env.mode = to;
    let (system, mode_tools) = compiler::prompt_for(&turn.app.prompts, to, turn.subagent.as_ref());
    turn.system = system;
    turn.offered_tools = crate::tools::offered_tools(mode_tools, &turn.tool_options);
}

pub(super) const fn default_bytes_per_token() -> f64 {
    DEFAULT_BYTES_PER_TOKEN
}
