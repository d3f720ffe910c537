//! The turn loop: commit the user message, project history, call the provider, stream its text and
//! thinking to the client, and commit the assistant message when the call completes.
//!
//! It consumes only canonical `ResponseEvent`s and emits only through `cursor::interaction`; it never
//! looks at provider JSON or protobuf oneofs.

use std::sync::Arc;
use std::time::Instant;

use tokio_util::sync::CancellationToken;

use super::actor::Downlink;
use super::command::RunRequestInput;
use crate::app::AppState;
use crate::cursor::interaction;
use crate::error::ServerError;
use crate::model::message::{
    AssistantMessage, CanonicalMessage, Origin, ProviderReplay, UserMessage,
};
use crate::model::usage::Usage;
use crate::prompting::{compiler, projector};
use crate::provider::{
    self, CallLimits, EventReceiver, FinishReason, ProviderError, ResponseEvent,
};
use crate::store::{messages, runs};

/// What the loop wants after an event.
#[derive(Debug)]
pub enum LoopStep {
    Continue,
    /// The turn is over; `usage` is the sum over the run's provider calls.
    TurnComplete {
        usage: Usage,
    },
}

/// The assistant message being streamed by the current provider call.
#[derive(Debug, Default)]
struct Draft {
    text: String,
    thinking: String,
    replay: Option<ProviderReplay>,
    /// Set while a thinking segment is open (monotonic clock).
    thinking_since: Option<Instant>,
    usage: Option<Usage>,
}

pub struct TurnLoop {
    app: Arc<AppState>,
    request_id: String,
    conversation_id: String,
    model_id: String,
    provider_index: usize,
    upstream_model: String,
    history: Vec<CanonicalMessage>,
    events: EventReceiver,
    call_cancel: CancellationToken,
    draft: Draft,
    usage: Usage,
    provider_calls: u32,
}

impl TurnLoop {
    /// Records the run, commits the user message and starts the first provider call.
    pub async fn start(
        app: Arc<AppState>,
        request_id: &str,
        input: RunRequestInput,
    ) -> Result<TurnLoop, ServerError> {
        let config = &app.config;
        let model_id = input
            .model_id
            .clone()
            .unwrap_or_else(|| config.default_model.clone());
        let (provider_index, upstream_model) = config
            .providers
            .iter()
            .enumerate()
            .find_map(|(i, p)| {
                p.models
                    .iter()
                    .find(|m| m.id == model_id)
                    .map(|m| (i, m.upstream_id.clone()))
            })
            .ok_or_else(|| {
                ServerError::NotFound(format!(
                    "model {model_id:?} is not configured (configured models: {})",
                    config.model_ids().collect::<Vec<_>>().join(", ")
                ))
            })?;

        runs::start(&app.store, request_id, &input.conversation_id, &model_id).await?;
        let user = CanonicalMessage::User(UserMessage {
            origin: Origin::User,
            text: input.user_text,
            client_message_id: input.user_message_id,
        });
        messages::append(
            &app.store,
            &input.conversation_id,
            request_id,
            std::slice::from_ref(&user),
        )
        .await?;
        let history = messages::load(&app.store, &input.conversation_id).await?;

        let mut turn = TurnLoop {
            request_id: request_id.to_owned(),
            conversation_id: input.conversation_id,
            model_id,
            provider_index,
            upstream_model,
            history,
            events: tokio::sync::mpsc::channel(1).1,
            call_cancel: CancellationToken::new(),
            draft: Draft::default(),
            usage: Usage::default(),
            provider_calls: 0,
            app,
        };
        turn.start_provider_call();
        Ok(turn)
    }

    fn start_provider_call(&mut self) {
        let config = &self.app.config;
        let provider = &config.providers[self.provider_index];
        let request = compiler::compile(&self.history, &self.upstream_model);
        let body = projector::openai_chat(&request);
        self.call_cancel.cancel();
        self.call_cancel = CancellationToken::new();
        self.draft = Draft::default();
        self.provider_calls += 1;
        tracing::debug!(
            request_id = %self.request_id,
            conversation_id = %self.conversation_id,
            provider = %provider.name,
            model = %self.model_id,
            call = self.provider_calls,
            "provider call"
        );
        self.events = provider::call(
            &self.app.http,
            provider,
            body,
            CallLimits {
                headers_timeout: config.provider_connect_timeout,
                idle_timeout: config.provider_idle_timeout,
            },
            self.call_cancel.clone(),
        );
    }

    /// The next event of the running provider call. `None` means the adapter stopped without a
    /// terminal event, which is reported as a truncated stream.
    pub async fn next_event(&mut self) -> Result<ResponseEvent, ProviderError> {
        match self.events.recv().await {
            Some(event) => event,
            None => Err(ProviderError::Truncated {
                provider: self.app.config.providers[self.provider_index].name.clone(),
                missing: "terminal event",
            }),
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
        match event {
            ResponseEvent::ReasoningDelta(text) => {
                if self.draft.thinking_since.is_none() {
                    self.draft.thinking_since = Some(Instant::now());
                }
                self.draft.thinking.push_str(&text);
                out.send_message(&interaction::thinking_delta(text)).await;
            }
            ResponseEvent::TextDelta(text) => {
                self.close_thinking(out).await;
                self.draft.text.push_str(&text);
                out.send_message(&interaction::text_delta(text)).await;
            }
            ResponseEvent::ToolCallStart { name, .. } => {
                return Err(ProviderError::Unsupported(format!(
                    "the model called the tool {name:?}, but this server version executes no tools"
                ))
                .into());
            }
            ResponseEvent::ToolArgsDelta { .. } => {}
            ResponseEvent::Usage(usage) => self.draft.usage = Some(usage),
            ResponseEvent::Replay(replay) => self.draft.replay = Some(replay),
            ResponseEvent::Finished(reason) => {
                self.close_thinking(out).await;
                match &reason {
                    FinishReason::Stop | FinishReason::ToolCalls => {}
                    other => tracing::warn!(
                        request_id = %self.request_id,
                        "provider finished with {other:?}; the answer may be incomplete"
                    ),
                }
                return self.complete_call().await;
            }
        }
        Ok(LoopStep::Continue)
    }

    async fn close_thinking(&mut self, out: &mut Downlink) {
        if let Some(since) = self.draft.thinking_since.take() {
            out.send_message(&interaction::thinking_completed(
                since.elapsed().as_millis(),
            ))
            .await;
        }
    }

    async fn complete_call(&mut self) -> Result<LoopStep, ServerError> {
        let draft = std::mem::take(&mut self.draft);
        if let Some(usage) = &draft.usage {
            self.usage.accumulate(usage);
        }
        let assistant = CanonicalMessage::Assistant(AssistantMessage {
            text: draft.text,
            thinking: draft.thinking,
            model_id: self.model_id.clone(),
            replay: draft.replay,
        });
        messages::append(
            &self.app.store,
            &self.conversation_id,
            &self.request_id,
            std::slice::from_ref(&assistant),
        )
        .await?;
        self.history.push(assistant);
        Ok(LoopStep::TurnComplete { usage: self.usage })
    }
}

impl Drop for TurnLoop {
    /// Whatever ends the turn also ends its provider call.
    fn drop(&mut self) {
        self.call_cancel.cancel();
    }
}
