//! The three ways a run ends — success, error, canceled — and the frames each sends. Every path ends
//! with exactly one end-of-stream frame, after which nothing is sent.

use super::actor::Downlink;
use crate::cursor::connect::{self, ConnectCode, ConnectError};
use crate::cursor::interaction;
use crate::error::ServerError;
use crate::model::usage::Usage;

#[derive(Debug)]
pub enum RunEnd {
    /// The loop finished: the model answered without further tool calls.
    Success { usage: Usage },
    /// Provider, protocol or internal failure.
    Failed(ServerError),
    /// The user stopped it, the client went away, or the server is shutting down.
    Canceled { reason: String },
}

/// `turn_ended` with the summed usage, then end-of-stream `{}`.
pub async fn finish_success(downlink: &mut Downlink, usage: &Usage) {
    downlink.send_message(&interaction::turn_ended(usage)).await;
    downlink.end(connect::end_stream_ok()).await;
}

/// No `turn_ended`; end-of-stream carries the error (provider errors with `ErrorDetails`).
pub async fn finish_error(downlink: &mut Downlink, error: &ServerError) {
    downlink
        .end(connect::end_stream_error(&connect_error(error)))
        .await;
}

/// No `turn_ended`; end-of-stream `canceled`.
pub async fn finish_canceled(downlink: &mut Downlink, reason: &str) {
    let error = ConnectError::new(ConnectCode::Canceled, reason);
    downlink.end(connect::end_stream_error(&error)).await;
}

pub fn connect_error(error: &ServerError) -> ConnectError {
    match error {
        ServerError::Provider(provider) => {
            ConnectError::provider(provider.title(), provider.to_string())
        }
        other => ConnectError::new(other.connect_code(), other.to_string()),
    }
}
