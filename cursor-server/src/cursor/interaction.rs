//! Downlink projection: domain events of a run → `AgentServerMessage` interaction updates.

use super::proto::agent::{
    AgentServerMessage, HeartbeatUpdate, InteractionUpdate, TextDeltaUpdate,
    ThinkingCompletedUpdate, ThinkingDeltaUpdate, ThinkingStyle, TurnEndedUpdate,
    agent_server_message, interaction_update,
};
use crate::model::usage::Usage;

fn update(message: interaction_update::Message) -> AgentServerMessage {
    AgentServerMessage {
        message: Some(agent_server_message::Message::InteractionUpdate(
            InteractionUpdate {
                message: Some(message),
            },
        )),
    }
}

pub fn text_delta(text: String) -> AgentServerMessage {
    update(interaction_update::Message::TextDelta(TextDeltaUpdate {
        text,
    }))
}

pub fn thinking_delta(text: String) -> AgentServerMessage {
    update(interaction_update::Message::ThinkingDelta(
        ThinkingDeltaUpdate {
            text,
            thinking_style: Some(ThinkingStyle::Default as i32),
        },
    ))
}

/// `duration_ms` is clamped to at least 1: Cursor treats 0 as "no thinking happened".
pub fn thinking_completed(duration_ms: u128) -> AgentServerMessage {
    let ms = i32::try_from(duration_ms.max(1)).unwrap_or(i32::MAX);
    update(interaction_update::Message::ThinkingCompleted(
        ThinkingCompletedUpdate {
            thinking_duration_ms: ms,
        },
    ))
}

/// `turn_ended` with the run's summed usage; fields the provider never reported are omitted.
pub fn turn_ended(usage: &Usage) -> AgentServerMessage {
    let field = |v: Option<u64>| v.map(|v| i64::try_from(v).unwrap_or(i64::MAX));
    update(interaction_update::Message::TurnEnded(TurnEndedUpdate {
        input_tokens: field(usage.input_tokens),
        output_tokens: field(usage.output_tokens),
        cache_read_tokens: field(usage.cache_read_tokens),
        cache_write_tokens: field(usage.cache_write_tokens),
    }))
}

pub fn heartbeat() -> AgentServerMessage {
    update(interaction_update::Message::Heartbeat(HeartbeatUpdate {}))
}
