//! The downlink: a run's outgoing `AgentServerMessage` frames (`Downlink`: backlog until a client
//! attaches, replay after a reconnect), the response body they travel in — shared by the RunSSE
//! route (the IDE's HTTP/1.1 mode) and the HTTP/2 `Run` route — and the stream-shaped error
//! response. The routes themselves are in `handlers.rs`; nothing here knows about runs, so `run/`
//! can hand its frames to these types without an import cycle.

use std::convert::Infallible;
use std::time::Duration;

use axum::body::Body;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures_util::StreamExt as _;
use prost::Message;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
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

/// The run's outgoing frames. Frames produced while no RunSSE is attached (before the first one,
/// or after a client dropped and until it reconnects) are kept and replayed to the next one in
/// order — including those the dropped body had queued but never delivered; after `end` nothing
/// more is sent.
#[derive(Debug)]
pub struct Downlink {
    sink: Option<DownlinkSink>,
    backlog: Vec<Bytes>,
    ended: bool,
    /// A RunSSE was attached once (so a missing one means the client went away).
    ever_attached: bool,
    /// Whether the client that went away can come back for the rest (RunSSE, not HTTP/2 `Run`).
    resumable: bool,
    /// When the last frame went out (for heartbeats while nothing else does).
    last_sent: Instant,
}

/// How long a dropped body gets to hand back its unread frames.
const RETURN_WAIT: Duration = Duration::from_secs(1);

impl Default for Downlink {
    fn default() -> Self {
        Downlink {
            sink: None,
            backlog: Vec::new(),
            ended: false,
            ever_attached: false,
            resumable: true,
            last_sent: Instant::now(),
        }
    }
}

impl Downlink {
    /// A RunSSE was attached once (so a missing one means the client went away).
    pub fn ever_attached(&self) -> bool {
        self.ever_attached
    }

    /// Whether the client that went away can come back for the rest.
    pub fn resumable(&self) -> bool {
        self.resumable
    }

    /// When the last frame went out.
    pub fn last_sent(&self) -> Instant {
        self.last_sent
    }

    pub fn is_attached(&self) -> bool {
        self.sink.is_some()
    }

    /// Attaches a RunSSE body and flushes the backlog into it.
    pub async fn attach(&mut self, sink: DownlinkSink) {
        let backlog = std::mem::take(&mut self.backlog);
        self.resumable = sink.resumable;
        self.sink = Some(sink);
        self.ever_attached = true;
        for frame in backlog {
            self.send_frame(frame).await;
        }
        if self.ended && self.backlog.is_empty() {
            self.sink = None;
        }
    }

    pub async fn send_message<M: Message>(&mut self, message: &M) {
        self.send(connect::encode_message(message)).await;
    }

    async fn send(&mut self, frame: Bytes) {
        if self.ended {
            tracing::error!("frame after end-of-stream dropped");
            return;
        }
        self.send_frame(frame).await;
    }

    async fn send_frame(&mut self, frame: Bytes) {
        let Some(sink) = &self.sink else {
            self.backlog.push(frame);
            return;
        };
        match sink.frames.send(frame).await {
            Ok(()) => self.last_sent = Instant::now(),
            Err(mpsc::error::SendError(frame)) => {
                self.detach().await;
                self.backlog.push(frame);
            }
        }
    }

    /// The attached client went away: what its body never delivered goes back to the backlog.
    pub async fn detach(&mut self) {
        let Some(sink) = self.sink.take() else {
            return;
        };
        let unread = tokio::time::timeout(RETURN_WAIT, sink.returned)
            .await
            .ok()
            .and_then(Result::ok)
            .unwrap_or_default();
        if !unread.is_empty() {
            tracing::debug!(
                frames = unread.len(),
                "kept frames a dropped client never read"
            );
        }
        let later = std::mem::replace(&mut self.backlog, unread);
        self.backlog.extend(later);
    }

    /// Sends the end-of-stream frame and closes the downlink.
    pub async fn end(&mut self, end_frame: Bytes) {
        self.send(end_frame).await;
        self.ended = true;
        if self.backlog.is_empty() {
            self.sink = None;
        }
    }

    /// Resolves when an attached client has gone away (RunSSE closed, HTTP/2 stream reset).
    pub async fn closed(&self) {
        match &self.sink {
            Some(sink) => sink.frames.closed().await,
            None => std::future::pending().await,
        }
    }

    /// Whether frames are still waiting for a RunSSE that never came.
    pub fn has_undelivered(&self) -> bool {
        !self.backlog.is_empty()
    }
}

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
