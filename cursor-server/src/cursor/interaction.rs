//! Downlink projection: domain events of a run → `AgentServerMessage` interaction updates.

use super::proto::agent::{
    AgentServerMessage, EditToolCallDelta, HeartbeatUpdate, InteractionUpdate,
    PartialToolCallUpdate, TextDeltaUpdate, ThinkingCompletedUpdate, ThinkingDeltaUpdate,
    ThinkingStyle, ToolCall, ToolCallCompletedUpdate, ToolCallDelta, ToolCallDeltaUpdate,
    ToolCallStartedUpdate, TurnEndedUpdate, agent_server_message, interaction_update,
    tool_call_delta,
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
