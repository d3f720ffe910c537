//! Downlink projection: domain events of a run → `AgentServerMessage` interaction updates.

use std::time::Duration;

use crate::cursor::proto::agent::{
    AgentServerMessage, EditToolCallDelta, HeartbeatUpdate, InteractionUpdate,
    PartialToolCallUpdate, StepCompletedUpdate, StepStartedUpdate, SummaryCompletedUpdate,
    SummaryStartedUpdate, SummaryUpdate, TextDeltaUpdate, ThinkingCompletedUpdate,
    ThinkingDeltaUpdate, ThinkingStyle, TokenDeltaUpdate, ToolCall, ToolCallCompletedUpdate,
    ToolCallDelta, ToolCallDeltaUpdate, ToolCallStartedUpdate, TurnEndedUpdate,
    agent_server_message, interaction_update, tool_call_delta,
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

/// A model step (one provider call) began answering.
pub fn step_started(step_id: u64) -> AgentServerMessage {
    update(interaction_update::Message::StepStarted(
        StepStartedUpdate { step_id },
    ))
}

/// A model step finished (its answer is complete), `elapsed` after it began.
pub fn step_completed(step_id: u64, elapsed: Duration) -> AgentServerMessage {
    update(interaction_update::Message::StepCompleted(
        StepCompletedUpdate {
            step_id,
            step_duration_ms: i64::try_from(elapsed.as_millis()).unwrap_or(i64::MAX),
        },
    ))
}

/// The UI's running output-token count for streamed `text`: an estimate (about four characters
/// a token, at least one), since providers report real usage only at the end — which is what
/// `turn_ended` and the run's record carry.
pub fn token_delta(text: &str) -> AgentServerMessage {
    let tokens = text.chars().count().div_ceil(4).max(1);
    update(interaction_update::Message::TokenDelta(TokenDeltaUpdate {
        tokens: i32::try_from(tokens).unwrap_or(i32::MAX),
    }))
}

/// The sidebar's summary of the turn, in its three updates (without them Cursor shows "No
/// summary available").
pub fn summary(text: String) -> [AgentServerMessage; 3] {
    [
        update(interaction_update::Message::SummaryStarted(
            SummaryStartedUpdate {},
        )),
        update(interaction_update::Message::Summary(SummaryUpdate {
            summary: text,
        })),
        update(interaction_update::Message::SummaryCompleted(
            SummaryCompletedUpdate { hook_message: None },
        )),
    ]
}

pub fn heartbeat() -> AgentServerMessage {
    update(interaction_update::Message::Heartbeat(HeartbeatUpdate {}))
}

pub fn partial_tool_call(
    call_id: &str,
    placeholder: ToolCall,
    args_text_delta: String,
    model_call_id: &str,
) -> AgentServerMessage {
    update(interaction_update::Message::PartialToolCall(
        PartialToolCallUpdate {
            call_id: call_id.to_owned(),
            tool_call: Some(placeholder),
            args_text_delta,
            model_call_id: model_call_id.to_owned(),
        },
    ))
}

/// An edit card's streamed content while the model writes a file.
pub fn edit_content_delta(call_id: &str, delta: String, model_call_id: &str) -> AgentServerMessage {
    tool_call_delta(
        call_id,
        ToolCallDelta {
            delta: Some(tool_call_delta::Delta::EditToolCallDelta(
                EditToolCallDelta {
                    stream_content_delta: delta,
                },
            )),
        },
        model_call_id,
    )
}

pub fn tool_call_started(
    call_id: &str,
    tool_call: ToolCall,
    model_call_id: &str,
) -> AgentServerMessage {
    update(interaction_update::Message::ToolCallStarted(
        ToolCallStartedUpdate {
            call_id: call_id.to_owned(),
            tool_call: Some(tool_call),
            model_call_id: model_call_id.to_owned(),
        },
    ))
}

pub fn tool_call_delta(
    call_id: &str,
    delta: ToolCallDelta,
    model_call_id: &str,
) -> AgentServerMessage {
    update(interaction_update::Message::ToolCallDelta(Box::new(
        ToolCallDeltaUpdate {
            call_id: call_id.to_owned(),
            tool_call_delta: Some(Box::new(delta)),
            model_call_id: model_call_id.to_owned(),
        },
    )))
}

/// The card's terminal state: typed args and typed result.
pub fn tool_call_completed(
    call_id: &str,
    tool_call: Box<ToolCall>,
    model_call_id: &str,
) -> AgentServerMessage {
    update(interaction_update::Message::ToolCallCompleted(
        ToolCallCompletedUpdate {
            call_id: call_id.to_owned(),
            tool_call: Some(*tool_call),
            model_call_id: model_call_id.to_owned(),
        },
    ))
}
