//! The downlink: a run's outgoing `AgentServerMessage` frames (`Downlink`: backlog until a client
//! attaches, a resync after a reconnect), the response body they travel in — shared by the RunSSE
//! route (the IDE's HTTP/1.1 mode) and the HTTP/2 `Run` route — and the stream-shaped error
//! response. The routes themselves are in `handlers.rs`; nothing here knows about runs, so `run/`
//! can hand its frames to these types without an import cycle.
//!
//! **What a reconnecting RunSSE gets.** Bytes the kernel accepted for a dropped connection may
//! never have reached the client, so "what was handed to the old body" says nothing about what
//! the client saw. But every answer the client sends (a KV result, an exec result or control
//! message, an interaction response) proves it read the stream at least up to the request it
//! answers: frames are delivered in order. A RunSSE that reattaches therefore gets a resync that
//! starts after the last frame the client provably received: every frame sent after it — text,
//! thinking, cards, in order — preceded by the last checkpoint published before the turn ended
//! when the client is not known to have read it (the committed state: the UI can be rebuilt from
//! it, so the frames the checkpoint covers are left out), and every request the client has not
//! answered yet (exec requests, interaction queries, `set_blob` / `get_blob` under their
//! original ids, even those sent before that point), then the live frames. Nothing the client is
//! known to have is sent again. From `turn_ended` on, checkpoints no longer shorten the replay:
//! `turn_ended`, the final checkpoints and the end of stream reach the new connection unless the
//! client provably read them. Requests the client already answered are not sent again (a tool
//! never runs twice because of a reconnect); a request the client received but had not answered
//! yet is, and whichever copy the client answers first is the one taken — later answers for the
//! same id are ignored as late.

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;

use axum::body::Body;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures_util::StreamExt as _;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;

use crate::cursor::connect::{self, ConnectError};
use crate::cursor::proto::agent::{AgentServerMessage, agent_server_message, interaction_update};

/// Frames buffered between a run's actor and a slow client before the actor waits.
pub const DOWNLINK_BUFFER: usize = 256;

/// The run's end of one response body: frames go in through `frames`.
#[derive(Debug)]
pub struct DownlinkSink {
    pub frames: mpsc::Sender<Bytes>,
    /// Whether a client can come back for the rest (RunSSE: a new RunSSE with the same request
    /// id). An HTTP/2 `Run` stream cannot be reopened: when it goes, the run is over.
    pub resumable: bool,
}

/// The response body's end: streams the frames.
pub struct DownlinkBody {
    frames: ReceiverStream<Bytes>,
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

/// A connected sink/body pair.
pub fn downlink_channel(resumable: bool) -> (DownlinkSink, DownlinkBody) {
    let (tx, rx) = mpsc::channel(DOWNLINK_BUFFER);
    (
        DownlinkSink {
            frames: tx,
            resumable,
        },
        DownlinkBody {
            frames: ReceiverStream::new(rx),
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

/// A request the server sent and the client answers under its id: exec requests and interaction
/// queries share one id sequence, KV requests have their own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Awaited {
    Exec(u32),
    Kv(u32),
}

/// How a frame takes part in a resync.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Replay {
    /// UI frames (text, thinking, cards, aborts, the end): replayed if sent since the checkpoint.
    Frame,
    /// A request: replayed until the client answers it.
    Request(Awaited),
    /// A checkpoint: the base of the next resync (until the turn ends).
    Checkpoint,
    /// `turn_ended`: from here on every frame is replayed.
    TurnEnded,
    /// Liveness only: never replayed.
    Heartbeat,
}

impl Replay {
    fn of(message: &AgentServerMessage) -> Replay {
        use agent_server_message::Message as M;
        match &message.message {
            Some(M::ExecServerMessage(exec)) => Replay::Request(Awaited::Exec(exec.id)),
            Some(M::InteractionQuery(query)) => Replay::Request(Awaited::Exec(query.id)),
            Some(M::KvServerMessage(kv)) => Replay::Request(Awaited::Kv(kv.id)),
            Some(M::ConversationCheckpointUpdate(_)) => Replay::Checkpoint,
            Some(M::InteractionUpdate(update)) => match &update.message {
                Some(interaction_update::Message::Heartbeat(_)) => Replay::Heartbeat,
                Some(interaction_update::Message::TurnEnded(_)) => Replay::TurnEnded,
                _ => Replay::Frame,
            },
            _ => Replay::Frame,
        }
    }
}

/// One journaled frame: its place in the run's sequence of frames, and how it takes part in a
/// resync.
#[derive(Debug)]
struct Entry {
    position: u64,
    replay: Replay,
    frame: Bytes,
}

/// What a reconnecting client is sent (see the module comment). Work per frame is O(1)
/// amortized: a checkpoint drops what it covers, and an answer drops what it proves was read.
#[derive(Debug, Default)]
struct Journal {
    /// The last checkpoint before `turn_ended`, with its position.
    checkpoint: Option<(u64, Bytes)>,
    /// Frames the client may not have, oldest first (unanswered requests among them).
    frames: VecDeque<Entry>,
    /// Requests the client provably read and has not answered yet: still replayed, in order.
    held: Vec<Entry>,
    /// Where each unanswered request's frame stands.
    requests: HashMap<Awaited, u64>,
    /// Every frame up to this position provably reached the client: it answered a request sent
    /// there or later. Zero: nothing proven yet (positions start at 1).
    read_through: u64,
    /// The position the next frame gets.
    next: u64,
    /// `turn_ended` went out: checkpoints no longer shorten the replay.
    closing: bool,
}

impl Journal {
    fn record(&mut self, replay: Replay, frame: &Bytes) {
        self.next += 1;
        let position = self.next;
        match replay {
            Replay::Heartbeat => {}
            Replay::Checkpoint if !self.closing => {
                self.checkpoint = Some((position, frame.clone()));
                // Unanswered requests outlive the checkpoint: the client still owes their answers.
                let requests = &self.requests;
                self.frames.retain(|entry| {
                    matches!(entry.replay, Replay::Request(awaited) if requests.contains_key(&awaited))
                });
            }
            _ => {
                if let Replay::Request(awaited) = replay {
                    self.requests.insert(awaited, position);
                }
                self.closing |= replay == Replay::TurnEnded;
                self.frames.push_back(Entry {
                    position,
                    replay,
                    frame: frame.clone(),
                });
            }
        }
    }

    /// The client answered `request`: it read the stream at least up to that request's frame.
    fn answered(&mut self, request: Awaited) {
        let Some(position) = self.requests.remove(&request) else {
            return;
        };
        self.read_through = self.read_through.max(position);
        while self
            .frames
            .front()
            .is_some_and(|entry| entry.position <= self.read_through)
        {
            let Some(entry) = self.frames.pop_front() else {
                break;
            };
            if matches!(entry.replay, Replay::Request(awaited) if self.requests.contains_key(&awaited))
            {
                self.held.push(entry);
            }
        }
        let requests = &self.requests;
        self.held.retain(
            |entry| matches!(entry.replay, Replay::Request(awaited) if requests.contains_key(&awaited)),
        );
    }

    /// The frames a reconnecting client gets, in the order they were first sent: requests still
    /// unanswered; the checkpoint unless the client provably read past it; every other frame the
    /// client is not known to have.
    fn replay(&self) -> Vec<Bytes> {
        let unanswered = |entry: &&Entry| match entry.replay {
            Replay::Request(awaited) => self.requests.contains_key(&awaited),
            _ => true,
        };
        let mut frames: Vec<(u64, &Bytes)> = self
            .held
            .iter()
            .chain(self.frames.iter())
            .filter(unanswered)
            .map(|entry| (entry.position, &entry.frame))
            .collect();
        if let Some((position, checkpoint)) = &self.checkpoint
            && *position > self.read_through
        {
            frames.push((*position, checkpoint));
        }
        frames.sort_by_key(|(position, _)| *position);
        frames.into_iter().map(|(_, frame)| frame.clone()).collect()
    }
}

/// The run's outgoing frames. Frames produced before the first RunSSE are kept and flushed to it
/// in order; a RunSSE that reattaches after a drop gets a resync (see the module comment); after
/// `end` nothing more is sent.
#[derive(Debug)]
pub struct Downlink {
    sink: Option<DownlinkSink>,
    /// Frames produced before any client attached.
    backlog: Vec<Bytes>,
    journal: Journal,
    ended: bool,
    /// A RunSSE was attached once (so a missing one means the client went away).
    ever_attached: bool,
    /// The attached client went away (or was dropped) and none has come back yet.
    lost: bool,
    /// Whether the client that went away can come back for the rest (RunSSE, not HTTP/2 `Run`).
    resumable: bool,
    /// When the last frame went out (for heartbeats while nothing else does).
    last_sent: Instant,
    /// The run must stop: a send to a client that does not read gives way at once.
    stop: CancellationToken,
}

impl Downlink {
    /// A downlink whose sends give way when `stop` fires.
    pub fn new(stop: CancellationToken) -> Self {
        Downlink {
            sink: None,
            backlog: Vec::new(),
            journal: Journal::default(),
            ended: false,
            ever_attached: false,
            lost: false,
            resumable: true,
            last_sent: Instant::now(),
            stop,
        }
    }

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

    /// Attaches a response body: the first one gets every frame so far, a reconnecting one (or one
    /// that replaces a body still attached) the resync.
    pub async fn attach(&mut self, sink: DownlinkSink) {
        // A body still attached is replaced: its client has reconnected.
        self.sink = None;
        let frames = if self.ever_attached {
            let frames = self.journal.replay();
            tracing::info!(frames = frames.len(), "a client reattached; resyncing it");
            frames
        } else {
            std::mem::take(&mut self.backlog)
        };
        self.resumable = sink.resumable;
        self.sink = Some(sink);
        self.ever_attached = true;
        self.lost = false;
        for frame in frames {
            self.send_frame(frame).await;
        }
        if self.ended {
            self.sink = None;
        }
    }

    /// The client answered `request` (its frame is not replayed after a reconnect).
    pub fn answered(&mut self, request: Awaited) {
        self.journal.answered(request);
    }

    pub async fn send_message(&mut self, message: &AgentServerMessage) {
        let frame = connect::encode_message(message);
        self.send(Replay::of(message), frame).await;
    }

    /// Sends two messages as one write (a text delta and its token count): half the channel hops
    /// and syscalls per streamed event. Journaled and replayed as two frames.
    pub async fn send_together(&mut self, first: &AgentServerMessage, second: &AgentServerMessage) {
        let (a, b) = (
            connect::encode_message(first),
            connect::encode_message(second),
        );
        if self.ended || !self.ever_attached {
            self.send(Replay::of(first), a).await;
            self.send(Replay::of(second), b).await;
            return;
        }
        self.journal.record(Replay::of(first), &a);
        self.journal.record(Replay::of(second), &b);
        let mut joined = bytes::BytesMut::with_capacity(a.len() + b.len());
        joined.extend_from_slice(&a);
        joined.extend_from_slice(&b);
        self.send_frame(joined.freeze()).await;
    }

    async fn send(&mut self, replay: Replay, frame: Bytes) {
        if self.ended {
            tracing::error!("frame after end-of-stream dropped");
            return;
        }
        self.journal.record(replay, &frame);
        if !self.ever_attached {
            if replay != Replay::Heartbeat {
                self.backlog.push(frame);
            }
            return;
        }
        self.send_frame(frame).await;
    }

    /// Hands `frame` to the attached client; a client that went away is detached (the journal
    /// keeps what it needs). Once the run must stop, a client that is not reading is dropped
    /// instead of waited for.
    async fn send_frame(&mut self, frame: Bytes) {
        let Some(sink) = &self.sink else {
            return;
        };
        let permit = tokio::select! {
            biased;
            permit = sink.frames.reserve() => permit.ok(),
            _ = self.stop.cancelled() => sink.frames.try_reserve().ok(),
        };
        let sent = permit.map(|permit| permit.send(frame)).is_some();
        if sent {
            self.last_sent = Instant::now();
        } else {
            self.detach();
        }
    }

    /// The attached client went away (or is dropped because it stopped reading).
    pub fn detach(&mut self) {
        if self.sink.take().is_some() {
            self.lost = true;
        }
    }

    /// Sends the end-of-stream frame and closes the downlink.
    pub async fn end(&mut self, end_frame: Bytes) {
        self.send(Replay::Frame, end_frame).await;
        self.ended = true;
        self.sink = None;
    }

    /// Resolves when an attached client has gone away (RunSSE closed, HTTP/2 stream reset).
    pub async fn closed(&self) {
        match &self.sink {
            Some(sink) => sink.frames.closed().await,
            None => std::future::pending().await,
        }
    }

    /// Whether the client has not seen everything yet and can still come for it: frames wait for a
    /// first RunSSE, or a RunSSE dropped and may reconnect.
    pub fn awaits_client(&self) -> bool {
        !self.backlog.is_empty() || (self.lost && self.resumable)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(n: u8) -> Bytes {
        Bytes::from(vec![n])
    }

    #[test]
    fn an_answer_proves_what_came_before_its_request_and_the_rest_is_replayed() {
        let mut journal = Journal::default();
        journal.record(Replay::Frame, &frame(1)); // text
        journal.record(Replay::Request(Awaited::Kv(0)), &frame(2)); // a blob, never answered
        journal.record(Replay::Frame, &frame(3)); // card started
        journal.record(Replay::Request(Awaited::Exec(1)), &frame(4)); // exec
        journal.record(Replay::Frame, &frame(5)); // text after it
        assert_eq!(journal.replay(), [1, 2, 3, 4, 5].map(frame));
        journal.answered(Awaited::Exec(1));
        // The unanswered blob request still goes out, under its id; nothing else before the exec.
        assert_eq!(journal.replay(), [2, 5].map(frame));
        journal.answered(Awaited::Kv(0));
        assert_eq!(journal.replay(), [5].map(frame));
        // A second answer for the same request proves nothing more.
        journal.answered(Awaited::Exec(1));
        assert_eq!(journal.replay(), [5].map(frame));
    }

    #[test]
    fn a_checkpoint_is_replayed_only_when_the_client_is_not_known_to_have_read_it() {
        let mut journal = Journal::default();
        journal.record(Replay::Request(Awaited::Kv(0)), &frame(1));
        journal.record(Replay::Frame, &frame(2));
        journal.record(Replay::Checkpoint, &frame(3));
        journal.record(Replay::Frame, &frame(4));
        assert_eq!(journal.replay(), [1, 3, 4].map(frame));
        journal.record(Replay::Request(Awaited::Kv(1)), &frame(5));
        journal.answered(Awaited::Kv(1));
        // Read past the checkpoint: neither it nor what it covers is sent; KV 0 still is.
        assert_eq!(journal.replay(), [1].map(frame));
        journal.record(Replay::TurnEnded, &frame(6));
        journal.record(Replay::Checkpoint, &frame(7));
        assert_eq!(journal.replay(), [1, 6, 7].map(frame));
    }
}
