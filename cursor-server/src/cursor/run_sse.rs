//! The downlink: the response body that streams a run's `AgentServerMessage` envelopes, shared by
//! the RunSSE route (the IDE's HTTP/1.1 mode) and the HTTP/2 `Run` route, and the stream-shaped
//! error response. The routes themselves are in `handlers.rs`; nothing here knows about runs, so
//! `run/` can hand its frames to these types without an import cycle.

use std::convert::Infallible;

use axum::body::Body;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures_util::StreamExt as _;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;

use super::connect::{self, ConnectError};

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

/// A stream that consists of one end-of-stream error (HTTP 200, as Connect streams always are):
/// how a streaming route fails once the request itself was understood.
#[derive(Debug)]
pub struct StreamError(pub ConnectError);

impl IntoResponse for StreamError {
    fn into_response(self) -> Response {
        (
            StatusCode::OK,
            [(header::CONTENT_TYPE, connect::CONTENT_TYPE_STREAM)],
            connect::end_stream_error(&self.0),
        )
            .into_response()
    }
}
