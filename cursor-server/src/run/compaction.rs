//! Compaction: when a prompt would fill more of the model's context window than the configured
//! share (or the user asks for a summary), the model summarizes older history; the summary is a
//! runtime message and nothing stored is deleted.
//!
//! Its own file because `run/loop_engine.rs` cannot hold it besides the turn's phases within 800
//! lines; a compaction is the turn's `Phase::Compacting` data.

use super::turn::Turn;
use crate::client::downlink::Downlink;
use crate::error::ServerError;
use crate::model::message::latest_compaction;
use crate::model::message::{CanonicalMessage, Origin, UserMessage};
use crate::model::runtime_tag::RuntimeEvent;
use crate::model::usage::Usage;
use crate::prompting::assets::PromptKind;
use crate::prompting::compiler;
use crate::provider::{ProviderError, RequestBody, ResponseEvent};
use crate::store::messages;

/// The last message of a compaction request, after the history it covers.
const COMPACTION_REQUEST: &str =
    "Summarize the conversation above now, as your instructions say. Reply with the summary only.";

/// What follows a compaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum AfterCompaction {
    /// The provider call it was made for.
    ProviderCall,
    /// Nothing: the user asked for a summary (`summarize_action`).
    EndTurn,
}

/// A summary of older history being written.
#[derive(Debug)]
pub(super) struct Compaction {
    /// The summary covers `history[..through]`.
    through: usize,
    number: u32,
    summary: String,
    /// The usage the compaction call reported.
    pub usage: Option<Usage>,
    then: AfterCompaction,
}

/// The prompt's estimated size (bytes over the bytes-per-token ratio the last call showed) passes
/// the threshold, and the model has not just been given a fresh summary.
pub(super) fn due(turn: &Turn, body_bytes: usize) -> bool {
    let config = &turn.app.config;
    if config.compact_at_percent >= 100 || turn.history.is_empty() {
        return false;
    }
    if matches!(turn.history.last(), Some(CanonicalMessage::User(u)) if matches!(u.runtime, Some(RuntimeEvent::Compacted { .. })))
    {
        return false;
    }
    let estimated_tokens = body_bytes as f64 / turn.bytes_per_token;
    estimated_tokens
        > f64::from(turn.model.context_window) * f64::from(config.compact_at_percent) / 100.0
}

/// Where the summary ends: before the current turn when that turn alone fits comfortably (the
/// user's latest message stays verbatim), else at the end of history. `None` when there is nothing
/// a summary would replace.
pub(super) fn point(turn: &Turn) -> Option<usize> {
    let config = &turn.app.config;
    let budget =
        f64::from(turn.model.context_window) * f64::from(config.compact_at_percent) / 200.0;
    let history = &turn.history;
    let tail_bytes: usize = history[turn.turn_start.min(history.len())..]
        .iter()
        .map(|m| serde_json::to_string(m).map_or(0, |t| t.len()))
        .sum();
    let through = if (tail_bytes as f64 / turn.bytes_per_token) < budget {
        turn.turn_start.min(history.len())
    } else {
        history.len()
    };
    let already_summarized = latest_compaction(history).map_or(0, |(at, _, _)| at + 1);
    (through > already_summarized || (through > 0 && already_summarized == 0)).then_some(through)
}

impl Compaction {
    /// The compaction of `history[..through]` and its request (the compaction prompt, no tools).
    pub fn request(
        turn: &Turn,
        through: usize,
        then: AfterCompaction,
    ) -> (Compaction, RequestBody) {
        let number = latest_compaction(&turn.history).map_or(1, |(_, n, _)| n + 1);
        tracing::info!(
            through,
            of = turn.history.len(),
            number,
            "compacting history"
        );
        let mut covered = turn.history[..through].to_vec();
        covered.push(CanonicalMessage::User(UserMessage {
            images: Vec::new(),
            shown_as: None,
            state_before: None,
            origin: Origin::Runtime,
            text: COMPACTION_REQUEST.to_owned(),
            client_message_id: String::new(),
            mode: None,
            runtime: None,
        }));
        let system = &turn.app.prompts.set(PromptKind::Compaction).system;
        let body = turn.project(system, &covered, &[]);
        let compaction = Compaction {
            through,
            number,
            summary: String::new(),
            usage: None,
            then,
        };
        (compaction, body)
    }

    /// One event of the compaction call: its text is the summary (never shown as the assistant's).
    /// Returns whether the call finished.
    pub fn on_event(&mut self, event: ResponseEvent, run_usage: &mut Usage) -> bool {
        match event {
            ResponseEvent::TextDelta(text) => self.summary.push_str(&text),
            ResponseEvent::Usage(usage) => {
                run_usage.accumulate(&usage);
                self.usage = Some(usage);
            }
            // No tools are offered and reasoning is not part of the summary.
            ResponseEvent::ReasoningDelta(_)
            | ResponseEvent::Replay(_)
            | ResponseEvent::ToolCallStart { .. }
            | ResponseEvent::ToolArgsDelta { .. } => {}
            ResponseEvent::Finished(_) => return true,
        }
        false
    }

    /// Stores the summary (a runtime message: old messages stay) and adds it to the checkpoint's
    /// roots; says what comes next.
    pub async fn finish(
        self,
        turn: &mut Turn,
        out: &mut Downlink,
    ) -> Result<AfterCompaction, ServerError> {
        let summary = self.summary.trim();
        if summary.is_empty() {
            return Err(ServerError::Compaction(ProviderError::Decode {
                provider: turn.provider.name.clone(),
                message: "the summary came back empty".to_owned(),
            }));
        }
        let tag = compiler::compaction_tag(self.number, self.through, summary);
        let appended = messages::append_with_tags(
            &turn.app.store,
            turn.conversation_id(),
            &turn.request_id,
            &[],
            &[],
            std::slice::from_ref(&tag),
        )
        .await?;
        turn.checkpoints.committed(&appended, out).await?;
        turn.history.extend(appended);
        turn.compactions = self.number;
        Ok(self.then)
    }
}
