//! A fake Cursor client speaking the real wire: RunSSE + BidiAppend over HTTP/1.1 (the IDE) and the
//! HTTP/2 bidi `Run` stream (the CLI), decoding every downlink envelope.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use cursor_server::cursor::connect::{self, FrameDecoder};
use cursor_server::cursor::proto::agent::{
    AgentClientMessage, AgentServerMessage, agent_server_message, interaction_update,
};
use cursor_server::cursor::proto::aiserver::{BidiAppendRequest, BidiRequestId};
use futures_util::StreamExt as _;
use prost::Message as _;
use tokio::sync::mpsc;

const READ_TIMEOUT: Duration = Duration::from_secs(20);

#[derive(Clone)]
pub struct FakeCursor {
    base: String,
    /// Where BidiAppends go, in turn (one server, or the nodes of a cluster behind a round-robin
    /// balancer); RunSSE and `Run` go to `base`.
    append_bases: Vec<String>,
    next_append: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    http1: reqwest::Client,
    h2: reqwest::Client,
}

/// Everything a run sent down, and how its stream ended.
#[derive(Debug)]
pub struct Transcript {
    pub messages: Vec<AgentServerMessage>,
    /// The JSON of the end-of-stream frame; `None` if the stream closed without one.
    pub end: Option<serde_json::Value>,
    /// Raw bytes of the end-of-stream frame (header included).
    pub end_frame: Option<Bytes>,
}

impl Transcript {
    /// Short names of the messages in order (`text_delta`, `exec`, `turn_ended`, ...), leaving out
    /// blob sync, checkpoints and the token-count hints (see `all_kinds`).
    pub fn kinds(&self) -> Vec<&'static str> {
        self.all_kinds()
            .into_iter()
            .filter(|k| !matches!(*k, "kv" | "checkpoint" | "token_delta"))
            .collect()
    }

    /// `kinds` with each run of consecutive deltas of one stream (text, thinking, a tool card's
    /// streamed arguments) counted once: a server merges deltas that are ready together, so how
    /// many frames carry them depends on timing, not on what the client is shown.
    pub fn kinds_merged(&self) -> Vec<&'static str> {
        let mut kinds = self.kinds();
        kinds.dedup_by(|a, b| {
            a == b && matches!(*a, "text_delta" | "thinking_delta" | "partial_tool_call")
        });
        kinds
    }

    /// Every message's short name, KV and checkpoints included.
    pub fn all_kinds(&self) -> Vec<&'static str> {
        self.messages.iter().map(kind).collect()
    }

    /// The published checkpoints, in order.
    pub fn checkpoints(
        &self,
    ) -> Vec<&cursor_server::cursor::proto::agent::ConversationStateStructure> {
        self.messages
            .iter()
            .filter_map(|m| match &m.message {
                Some(agent_server_message::Message::ConversationCheckpointUpdate(state)) => {
                    Some(state)
                }
                _ => None,
            })
            .collect()
    }

    pub fn text(&self) -> String {
        self.updates()
            .filter_map(|u| match u {
                interaction_update::Message::TextDelta(d) => Some(d.text.as_str()),
                _ => None,
            })
            .collect()
    }

    pub fn thinking(&self) -> String {
        self.updates()
            .filter_map(|u| match u {
                interaction_update::Message::ThinkingDelta(d) => Some(d.text.as_str()),
                _ => None,
            })
            .collect()
    }

    pub fn updates(&self) -> impl Iterator<Item = &interaction_update::Message> {
        self.messages.iter().filter_map(|m| match &m.message {
            Some(agent_server_message::Message::InteractionUpdate(u)) => u.message.as_ref(),
            _ => None,
        })
    }

    /// Every `tool_call_completed` update, in order.
    pub fn completed_cards(
        &self,
    ) -> Vec<&cursor_server::cursor::proto::agent::ToolCallCompletedUpdate> {
        self.updates()
            .filter_map(|u| match u {
                interaction_update::Message::ToolCallCompleted(c) => Some(c),
                _ => None,
            })
            .collect()
    }

    pub fn is_success(&self) -> bool {
        self.end
            .as_ref()
            .is_some_and(|end| end == &serde_json::json!({}))
    }

    pub fn error_code(&self) -> Option<&str> {
        self.end.as_ref()?.pointer("/error/code")?.as_str()
    }

    pub fn error_message(&self) -> Option<&str> {
        self.end.as_ref()?.pointer("/error/message")?.as_str()
    }
}

pub fn kind(message: &AgentServerMessage) -> &'static str {
    use interaction_update::Message as U;
    match &message.message {
        Some(agent_server_message::Message::InteractionUpdate(update)) => match &update.message {
            Some(U::TextDelta(_)) => "text_delta",
            Some(U::ThinkingDelta(_)) => "thinking_delta",
            Some(U::ThinkingCompleted(_)) => "thinking_completed",
            Some(U::TurnEnded(_)) => "turn_ended",
            Some(U::Heartbeat(_)) => "heartbeat",
            Some(U::PartialToolCall(_)) => "partial_tool_call",
            Some(U::ToolCallStarted(_)) => "tool_call_started",
            Some(U::ToolCallCompleted(_)) => "tool_call_completed",
            Some(U::ToolCallDelta(_)) => "tool_call_delta",
            Some(U::StepStarted(_)) => "step_started",
            Some(U::StepCompleted(_)) => "step_completed",
            Some(U::TokenDelta(_)) => "token_delta",
            Some(U::SummaryStarted(_)) => "summary_started",
            Some(U::Summary(_)) => "summary",
            Some(U::SummaryCompleted(_)) => "summary_completed",
            Some(_) => "other_update",
            None => "empty_update",
        },
        Some(agent_server_message::Message::ConversationCheckpointUpdate(_)) => "checkpoint",
        Some(agent_server_message::Message::KvServerMessage(_)) => "kv",
        Some(agent_server_message::Message::ExecServerMessage(_)) => "exec",
        Some(agent_server_message::Message::ExecServerControlMessage(_)) => "exec_control",
        Some(agent_server_message::Message::InteractionQuery(_)) => "interaction_query",
        None => "empty",
    }
}

impl FakeCursor {
    pub fn new(addr: SocketAddr) -> FakeCursor {
        FakeCursor::alternating(&[addr])
    }

    /// A client whose RunSSE and `Run` go to `addrs[0]` and whose BidiAppends go to each of
    /// `addrs` in turn, starting with the last (as a round-robin balancer would spread them).
    pub fn alternating(addrs: &[SocketAddr]) -> FakeCursor {
        let bases: Vec<String> = addrs.iter().map(|a| format!("http://{a}")).collect();
        FakeCursor {
            base: bases[0].clone(),
            next_append: std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(bases.len() - 1)),
            append_bases: bases,
            http1: reqwest::Client::builder()
                .http1_only()
                .build()
                .expect("client"),
            h2: reqwest::Client::builder()
                .http2_prior_knowledge()
                .build()
                .expect("client"),
        }
    }

    /// A client that sends `headers` on every request (a person's token or sign-in, `[auth]`).
    pub fn with_headers(addr: SocketAddr, headers: &[(&str, &str)]) -> FakeCursor {
        FakeCursor::alternating_with_headers(&[addr], headers)
    }

    /// `alternating`, sending `headers` on every request.
    pub fn alternating_with_headers(addrs: &[SocketAddr], headers: &[(&str, &str)]) -> FakeCursor {
        let mut map = reqwest::header::HeaderMap::new();
        for (name, value) in headers {
            map.insert(
                reqwest::header::HeaderName::from_bytes(name.as_bytes()).expect("header name"),
                reqwest::header::HeaderValue::from_str(value).expect("header value"),
            );
        }
        let mut cursor = FakeCursor::alternating(addrs);
        cursor.http1 = reqwest::Client::builder()
            .http1_only()
            .default_headers(map.clone())
            .build()
            .expect("client");
        cursor.h2 = reqwest::Client::builder()
            .http2_prior_knowledge()
            .default_headers(map)
            .build()
            .expect("client");
        cursor
    }

    /// Opens RunSSE for `request_id` (the response is streaming; read it with `read_transcript`).
    pub async fn open_run_sse(&self, request_id: &str) -> reqwest::Response {
        let body = connect::encode_message(&BidiRequestId {
            request_id: request_id.to_owned(),
        });
        self.http1
            .post(format!("{}/agent.v1.AgentService/RunSSE", self.base))
            .header("content-type", "application/connect+proto")
            .header("connect-protocol-version", "1")
            .body(body)
            .send()
            .await
            .expect("RunSSE request")
    }

    /// Posts one BidiAppend carrying `message` (hex inside a raw `application/proto` body).
    pub async fn append(
        &self,
        request_id: &str,
        seqno: i64,
        message: &AgentClientMessage,
    ) -> reqwest::Response {
        let request = BidiAppendRequest {
            data: hex::encode(message.encode_to_vec()),
            request_id: Some(BidiRequestId {
                request_id: request_id.to_owned(),
            }),
            append_seqno: seqno,
        };
        self.append_body(request.encode_to_vec(), None).await
    }

    /// Posts an arbitrary BidiAppend body, optionally with a `content-encoding`.
    pub async fn append_body(
        &self,
        body: Vec<u8>,
        content_encoding: Option<&str>,
    ) -> reqwest::Response {
        let turn = self
            .next_append
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let base = &self.append_bases[turn % self.append_bases.len()];
        let mut request = self
            .http1
            .post(format!("{base}/aiserver.v1.BidiService/BidiAppend"))
            .header("content-type", "application/proto")
            .header("connect-protocol-version", "1");
        if let Some(encoding) = content_encoding {
            request = request.header("content-encoding", encoding);
        }
        request.body(body).send().await.expect("BidiAppend request")
    }

    /// Opens the HTTP/2 `Run` stream. Messages go into the returned sender; the request stream is
    /// never half-closed while the sender lives (as the CLI behaves).
    pub async fn open_run_h2(
        &self,
        request_id: &str,
    ) -> (mpsc::Sender<AgentClientMessage>, reqwest::Response) {
        let (tx, rx) = mpsc::channel::<AgentClientMessage>(16);
        let body = tokio_stream::wrappers::ReceiverStream::new(rx)
            .map(|m| Ok::<_, std::io::Error>(connect::encode_message(&m)));
        let response = self
            .h2
            .post(format!("{}/agent.v1.AgentService/Run", self.base))
            .header("content-type", "application/connect+proto")
            .header("connect-protocol-version", "1")
            .header("x-request-id", request_id)
            .body(reqwest::Body::wrap_stream(body))
            .send()
            .await
            .expect("Run request");
        (tx, response)
    }
}

/// Reads a downlink to its end-of-stream frame (or until the body closes).
pub async fn read_transcript(response: reqwest::Response) -> Transcript {
    assert_eq!(response.status(), 200, "stream responses are 200");
    let mut stream = response.bytes_stream();
    let mut decoder = FrameDecoder::new(64 * 1024 * 1024);
    let mut transcript = Transcript {
        messages: Vec::new(),
        end: None,
        end_frame: None,
    };
    loop {
        let chunk = tokio::time::timeout(READ_TIMEOUT, stream.next())
            .await
            .expect("downlink stalled");
        let Some(chunk) = chunk else {
            decoder.finish().expect("downlink ended mid-frame");
            return transcript;
        };
        decoder.push(&chunk.expect("downlink read"));
        while let Some(frame) = decoder.next_frame().expect("downlink frame") {
            assert!(
                transcript.end.is_none(),
                "a frame arrived after end-of-stream"
            );
            if frame.is_end_stream() {
                transcript.end =
                    Some(serde_json::from_slice(&frame.payload).expect("end-of-stream JSON"));
                transcript.end_frame = Some(connect::encode_frame(frame.flags, &frame.payload));
            } else {
                transcript.messages.push(
                    AgentServerMessage::decode(frame.payload.as_ref()).expect("AgentServerMessage"),
                );
            }
        }
    }
}

/// An interactive RunSSE session: reads the downlink message by message and answers on BidiAppend
/// with increasing `append_seqno`, like the IDE does while it executes tools.
pub struct Session<'a> {
    cursor: &'a FakeCursor,
    pub request_id: String,
    seqno: i64,
    /// Blobs the client stored (acknowledged `set_blob_args`).
    pub blobs: std::collections::HashMap<Vec<u8>, Vec<u8>>,
    /// While set, `set_blob_args` are not acknowledged but kept here (id, KV id).
    pub withhold_acks: bool,
    /// Withholds only the `set_blob_args` whose data matches (while `withhold_acks` is off).
    pub withhold_matching: Option<fn(&[u8]) -> bool>,
    pub withheld: Vec<(Vec<u8>, u32)>,
    stream: futures_util::stream::BoxStream<'static, reqwest::Result<Bytes>>,
    decoder: FrameDecoder,
    pub transcript: Transcript,
}

impl<'a> Session<'a> {
    /// Opens RunSSE and sends `first` (normally the run_request) as seqno 0.
    pub async fn start(
        cursor: &'a FakeCursor,
        request_id: &str,
        first: &AgentClientMessage,
    ) -> Session<'a> {
        Self::start_with_blobs(cursor, request_id, first, std::collections::HashMap::new()).await
    }

    /// Like `start`, with `blobs` already in the client's blob store (a conversation the client
    /// had before, e.g. with another backend).
    pub async fn start_with_blobs(
        cursor: &'a FakeCursor,
        request_id: &str,
        first: &AgentClientMessage,
        blobs: std::collections::HashMap<Vec<u8>, Vec<u8>>,
    ) -> Session<'a> {
        let mut session = Self::open(cursor, request_id, 0, blobs).await;
        session.send(first).await;
        session
    }

    /// Opens a new RunSSE for a run this client already talks to (a reconnect), continuing its
    /// append sequence at `seqno`.
    pub async fn reattach(cursor: &'a FakeCursor, request_id: &str, seqno: i64) -> Session<'a> {
        Self::open(cursor, request_id, seqno, std::collections::HashMap::new()).await
    }

    async fn open(
        cursor: &'a FakeCursor,
        request_id: &str,
        seqno: i64,
        blobs: std::collections::HashMap<Vec<u8>, Vec<u8>>,
    ) -> Session<'a> {
        let response = cursor.open_run_sse(request_id).await;
        assert_eq!(response.status(), 200);
        Session {
            cursor,
            request_id: request_id.to_owned(),
            seqno,
            blobs,
            withhold_acks: false,
            withhold_matching: None,
            withheld: Vec::new(),
            stream: response.bytes_stream().boxed(),
            decoder: FrameDecoder::new(64 * 1024 * 1024),
            transcript: Transcript {
                messages: Vec::new(),
                end: None,
                end_frame: None,
            },
        }
    }

    /// The next append sequence number this session would use.
    pub fn seqno(&self) -> i64 {
        self.seqno
    }

    pub async fn send(&mut self, message: &AgentClientMessage) {
        let response = self
            .cursor
            .append(&self.request_id, self.seqno, message)
            .await;
        assert_eq!(response.status(), 200, "BidiAppend accepted");
        self.seqno += 1;
    }

    /// Posts `message` at an explicit `seqno` (out of order, as the IDE's concurrent appends
    /// arrive); later `send`s continue after the highest seqno used.
    pub async fn send_at(&mut self, seqno: i64, message: &AgentClientMessage) {
        let response = self.cursor.append(&self.request_id, seqno, message).await;
        assert_eq!(response.status(), 200, "BidiAppend accepted");
        self.seqno = self.seqno.max(seqno + 1);
    }

    /// Posts `message` at `seqno` without waiting for its answer, as the IDE's concurrent appends
    /// do (an append is answered once the run has applied it, so one that overtook an earlier
    /// seqno is answered after that one arrives). The handle yields its HTTP status.
    pub fn send_at_concurrently(
        &mut self,
        seqno: i64,
        message: &AgentClientMessage,
    ) -> tokio::task::JoinHandle<u16> {
        let (cursor, request_id, message) = (
            self.cursor.clone(),
            self.request_id.clone(),
            message.clone(),
        );
        self.seqno = self.seqno.max(seqno + 1);
        tokio::spawn(async move {
            cursor
                .append(&request_id, seqno, &message)
                .await
                .status()
                .as_u16()
        })
    }

    /// The next downlink message; `None` once the end-of-stream frame has arrived.
    pub async fn next(&mut self) -> Option<AgentServerMessage> {
        loop {
            if self.transcript.end.is_some() {
                return None;
            }
            if let Some(frame) = self.decoder.next_frame().expect("downlink frame") {
                if frame.is_end_stream() {
                    self.transcript.end =
                        Some(serde_json::from_slice(&frame.payload).expect("end JSON"));
                    self.transcript.end_frame =
                        Some(connect::encode_frame(frame.flags, &frame.payload));
                    return None;
                }
                let message =
                    AgentServerMessage::decode(frame.payload.as_ref()).expect("AgentServerMessage");
                self.transcript.messages.push(message.clone());
                self.store_blob(&message).await;
                return Some(message);
            }
            let chunk = tokio::time::timeout(READ_TIMEOUT, self.stream.next())
                .await
                .expect("downlink stalled");
            match chunk {
                Some(chunk) => self.decoder.push(&chunk.expect("downlink read")),
                None => {
                    self.decoder.finish().expect("downlink ended mid-frame");
                    return None;
                }
            }
        }
    }

    /// Acts as Cursor's blob store: keeps every `set_blob_args` and acknowledges it (unless
    /// withholding).
    async fn store_blob(&mut self, message: &AgentServerMessage) {
        use cursor_server::cursor::proto::agent::{
            AgentClientMessage, KvClientMessage, SetBlobResult, agent_client_message,
            kv_client_message, kv_server_message,
        };
        let Some(agent_server_message::Message::KvServerMessage(kv)) = &message.message else {
            return;
        };
        let set = match &kv.message {
            Some(kv_server_message::Message::SetBlobArgs(set)) => set,
            Some(kv_server_message::Message::GetBlobArgs(get)) => {
                use cursor_server::cursor::proto::agent::GetBlobResult;
                // An unknown id is answered with an empty result, as Cursor does.
                let reply = AgentClientMessage {
                    message: Some(agent_client_message::Message::KvClientMessage(
                        KvClientMessage {
                            id: kv.id,
                            message: Some(kv_client_message::Message::GetBlobResult(
                                GetBlobResult {
                                    blob_data: self.blobs.get(&get.blob_id).cloned(),
                                },
                            )),
                        },
                    )),
                };
                self.send(&reply).await;
                return;
            }
            None => return,
        };
        self.blobs
            .insert(set.blob_id.clone(), set.blob_data.clone());
        if self.withhold_acks || self.withhold_matching.is_some_and(|m| m(&set.blob_data)) {
            self.withheld.push((set.blob_id.clone(), kv.id));
            return;
        }
        let ack = AgentClientMessage {
            message: Some(agent_client_message::Message::KvClientMessage(
                KvClientMessage {
                    id: kv.id,
                    message: Some(kv_client_message::Message::SetBlobResult(SetBlobResult {
                        error: None,
                    })),
                },
            )),
        };
        // An ack races the end of a run that was stopped (its end frame is already on the way):
        // the server has then forgotten the request and answers `not_found`, which Cursor ignores.
        // Any other refusal is a failure.
        let response = self.cursor.append(&self.request_id, self.seqno, &ack).await;
        assert!(
            matches!(response.status().as_u16(), 200 | 404),
            "BidiAppend of a blob ack: {}",
            response.status()
        );
        self.seqno += 1;
    }

    /// Acknowledges the withheld `set_blob_args` now.
    pub async fn release_acks(&mut self) {
        use cursor_server::cursor::proto::agent::{
            AgentClientMessage, KvClientMessage, SetBlobResult, agent_client_message,
            kv_client_message,
        };
        self.withhold_acks = false;
        self.withhold_matching = None;
        for (_, id) in std::mem::take(&mut self.withheld) {
            let ack = AgentClientMessage {
                message: Some(agent_client_message::Message::KvClientMessage(
                    KvClientMessage {
                        id,
                        message: Some(kv_client_message::Message::SetBlobResult(SetBlobResult {
                            error: None,
                        })),
                    },
                )),
            };
            self.send(&ack).await;
        }
    }

    /// Reads until the next exec request and returns it (panics if the stream ends first).
    pub async fn next_exec(&mut self) -> cursor_server::cursor::proto::agent::ExecServerMessage {
        while let Some(message) = self.next().await {
            if let Some(agent_server_message::Message::ExecServerMessage(exec)) = message.message {
                return exec;
            }
        }
        panic!(
            "stream ended while waiting for an exec request: {:?}",
            self.transcript.end
        );
    }

    /// Reads until the next interaction query and returns it (panics if the stream ends first).
    pub async fn next_query(&mut self) -> cursor_server::cursor::proto::agent::InteractionQuery {
        while let Some(message) = self.next().await {
            if let Some(agent_server_message::Message::InteractionQuery(query)) = message.message {
                return query;
            }
        }
        panic!(
            "stream ended while waiting for an interaction query: {:?}",
            self.transcript.end
        );
    }

    /// Reads the rest of the stream.
    pub async fn finish(mut self) -> Transcript {
        while self.next().await.is_some() {}
        self.transcript
    }
}
