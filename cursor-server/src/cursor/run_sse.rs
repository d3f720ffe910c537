//! The downlink transports: the RunSSE route (a server stream of `AgentServerMessage` envelopes for
//! the IDE's HTTP/1.1 mode) and the streaming response body shared with the HTTP/2 `Run` route.

use std::convert::Infallible;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures_util::StreamExt as _;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;

use super::connect::{self, ConnectCode, ConnectError, Encoding};
use super::handlers::unary_error;
use super::proto::aiserver::BidiRequestId;
use crate::app::AppState;
use crate::run::command::RunCommand;
use crate::run::registry::{RegistryError, RunRegistry};

/// Frames buffered between a run's actor and a slow client before the actor waits.
pub const DOWNLINK_BUFFER: usize = 256;

/// The run's end of one response body: frames go in through `frames`; if the client goes away,
/// the frames it never read come back on `returned` (so a reconnecting client loses none).
#[derive(Debug)]
pub struct DownlinkSink {
    pub frames: mpsc::Sender<Bytes>,
    pub returned: oneshot::Receiver<Vec<Bytes>>,
    /// Whether a client can come back for the rest (RunSSE: a new RunSSE with the same request
    /// id). An HTTP/2 `Run` stream cannot be reopened: when it goes, the run is over.
    pub resumable: bool,
}

/// The response body's end: streams the frames and, when dropped before the end, hands back what
/// was still queued.
pub struct DownlinkBody {
    frames: ReceiverStream<Bytes>,
    returned: Option<oneshot::Sender<Vec<Bytes>>>,
}

impl futures_util::Stream for DownlinkBody {
    type Item = Result<Bytes, Infallible>;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        self.frames.poll_next_unpin(cx).map(|frame| frame.map(Ok))
    }
}

impl Drop for DownlinkBody {
    fn drop(&mut self) {
        let Some(returned) = self.returned.take() else {
            return;
        };
        let receiver = self.frames.as_mut();
        receiver.close();
        let mut unread = Vec::new();
        while let Ok(frame) = receiver.try_recv() {
            unread.push(frame);
        }
        let _ = returned.send(unread);
    }
}

/// A connected sink/body pair.
pub fn downlink_channel(resumable: bool) -> (DownlinkSink, DownlinkBody) {
    let (tx, rx) = mpsc::channel(DOWNLINK_BUFFER);
    let (returned_tx, returned_rx) = oneshot::channel();
    (
        DownlinkSink {
            frames: tx,
            returned: returned_rx,
            resumable,
        },
        DownlinkBody {
            frames: ReceiverStream::new(rx),
            returned: Some(returned_tx),
        },
    )
}

/// A 200 `application/connect+proto` response streaming the run's frames.
pub fn stream_response(body: DownlinkBody) -> Response {
    let body = Body::from_stream(body);
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, connect::CONTENT_TYPE_STREAM)],
        body,
    )
        .into_response()
}

/// A stream that consists of one end-of-stream error (HTTP 200, as Connect streams always are).
pub fn stream_error(error: &ConnectError) -> Response {
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, connect::CONTENT_TYPE_STREAM)],
        connect::end_stream_error(error),
    )
        .into_response()
}

/// `POST /agent.v1.AgentService/RunSSE`: body = one enveloped `BidiRequestId`.
pub async fn handle(state: Arc<AppState>, headers: HeaderMap, body: Bytes) -> Response {
    let encoding = match Encoding::parse(
        headers
            .get("connect-content-encoding")
            .and_then(|v| v.to_str().ok()),
    ) {
        Ok(encoding) => encoding,
        Err(e) => {
            return unary_error(&ConnectError::new(
                ConnectCode::InvalidArgument,
                e.to_string(),
            ));
        }
    };
    let request_id =
        match connect::decode_stream_request(&body, encoding, state.config.max_frame_bytes)
            .and_then(|payload| {
                connect::decode_message::<BidiRequestId>(&payload, "aiserver.v1.BidiRequestId")
            }) {
            Ok(id) if !id.request_id.trim().is_empty() => id.request_id,
            Ok(_) => {
                return unary_error(&ConnectError::new(
                    ConnectCode::InvalidArgument,
                    "RunSSE: missing request_id",
                ));
            }
            Err(e) => {
                return unary_error(&ConnectError::new(
                    ConnectCode::InvalidArgument,
                    format!("RunSSE: {e}"),
                ));
            }
        };
    let handle = match RunRegistry::get_or_start(&state, &request_id) {
        Ok(handle) => handle,
        Err(e @ RegistryError::Finished(_)) => {
            return stream_error(&ConnectError::new(ConnectCode::NotFound, e.to_string()));
        }
        Err(e @ RegistryError::AlreadyRunning(_)) => {
            return stream_error(&ConnectError::new(
                ConnectCode::InvalidArgument,
                e.to_string(),
            ));
        }
    };
    let (sink, body) = downlink_channel(true);
    if handle.send(RunCommand::AttachDownlink(sink)).await.is_err() {
        return stream_error(&ConnectError::new(
            ConnectCode::NotFound,
            format!("request {request_id} has already finished"),
        ));
    }
    stream_response(body)
}
