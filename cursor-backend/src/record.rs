//! The recorder: one task owns every live exchange's decoders and the captures database. The proxy only
//! hands it what passed (`Bytes` clones and a timestamp taken as the bytes went by), so forwarding never
//! waits on decoding or SQLite; the task decodes, groups by run and writes in batches, one transaction
//! per batch.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use hyper::HeaderMap;
use tokio::sync::{mpsc, oneshot, watch};

use crate::decode::{Direction, FrameKind, FrameRecord, RouteKind, Side, StreamDecoder};
use crate::schema::Schema;
use crate::store::{Captures, NewExchange, Write};

/// At most this many events go into one transaction.
const BATCH: usize = 2048;

/// Headers whose values are credentials or identify the machine: stored as `[redacted]`.
fn is_secret(name: &str) -> bool {
    matches!(
        name,
        "authorization" | "proxy-authorization" | "cookie" | "set-cookie"
    ) || ["token", "secret", "key", "password", "checksum"]
        .iter()
        .any(|part| name.contains(part))
}

/// Headers as a JSON array of `[name, value]`, credentials redacted (an auth scheme is kept).
pub fn redacted_headers(headers: &HeaderMap) -> String {
    let pairs: Vec<[String; 2]> = headers
        .iter()
        .map(|(name, value)| {
            let name = name.as_str().to_owned();
            let value = String::from_utf8_lossy(value.as_bytes()).into_owned();
            let value = if is_secret(&name) {
                match value.split_once(' ') {
                    Some((scheme, _)) if name.ends_with("authorization") => {
                        format!("{scheme} [redacted]")
                    }
                    _ => "[redacted]".to_owned(),
                }
            } else {
                value
            };
            [name, value]
        })
        .collect();
    serde_json::to_string(&pairs).unwrap_or_else(|_| "[]".to_owned())
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// The decoder of one direction's body, framed and compressed as its headers say.
fn decoder(
    schema: Option<&Schema>,
    direction: Direction,
    path: &str,
    headers: &HeaderMap,
) -> StreamDecoder {
    StreamDecoder::new(
        schema,
        Side {
            direction,
            path,
            content_type: header(headers, "content-type"),
            content_encoding: header(headers, "content-encoding"),
            connect_content_encoding: header(headers, "connect-content-encoding"),
        },
    )
}

/// What the proxy tells the recorder.
#[derive(Debug)]
enum Event {
    Open(Box<Opening>),
    Response {
        id: i64,
        status: u16,
        headers: HeaderMap,
    },
    Chunk {
        id: i64,
        direction: Direction,
        t_us: i64,
        data: Bytes,
    },
    End {
        id: i64,
        direction: Direction,
        t_us: i64,
        /// The body stopped before its end (a peer went away, or an error).
        cut: Option<String>,
    },
    UpstreamFailed {
        id: i64,
        t_us: i64,
        reason: String,
    },
    Flush(oneshot::Sender<()>),
}

/// An exchange as the proxy saw it arrive; the recording task makes its row (grouping, redaction).
#[derive(Debug)]
struct Opening {
    id: i64,
    method: String,
    path: String,
    http_version: String,
    headers: HeaderMap,
    started_at_ms: i64,
    started_us: i64,
}

/// The proxy's handle on the recorder.
#[derive(Debug, Clone)]
pub struct Recorder {
    tx: mpsc::UnboundedSender<Event>,
    clock: Instant,
    next_id: Arc<AtomicI64>,
    written: watch::Sender<u64>,
}

impl Recorder {
    /// Starts the recording task; exchange ids continue from `first_id`.
    pub fn start(
        captures: Captures,
        schema: Option<Schema>,
        first_id: i64,
    ) -> (Recorder, tokio::task::JoinHandle<()>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let (written, _) = watch::channel(0);
        let recorder = Recorder {
            tx,
            clock: Instant::now(),
            next_id: Arc::new(AtomicI64::new(first_id)),
            written: written.clone(),
        };
        let task = tokio::spawn(
            Actor {
                captures,
                schema,
                live: HashMap::new(),
                written,
            }
            .run(rx),
        );
        (recorder, task)
    }

    /// Changes each time a batch is in the database (the UI's live list waits on it).
    pub fn written(&self) -> watch::Receiver<u64> {
        self.written.subscribe()
    }

    /// Monotonic microseconds since the recorder started.
    pub fn now_us(&self) -> i64 {
        i64::try_from(self.clock.elapsed().as_micros()).unwrap_or(i64::MAX)
    }

    /// A new exchange; its request line and headers are recorded now.
    pub fn open(&self, method: &str, path: &str, version: &str, headers: &HeaderMap) -> i64 {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let started_at_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0);
        self.send(Event::Open(Box::new(Opening {
            id,
            method: method.to_owned(),
            path: path.to_owned(),
            http_version: version.to_owned(),
            headers: headers.clone(),
            started_at_ms,
            started_us: self.now_us(),
        })));
        id
    }

    pub fn response(&self, id: i64, status: u16, headers: &HeaderMap) {
        self.send(Event::Response {
            id,
            status,
            headers: headers.clone(),
        });
    }

    pub fn chunk(&self, id: i64, direction: Direction, data: Bytes) {
        let t_us = self.now_us();
        self.send(Event::Chunk {
            id,
            direction,
            t_us,
            data,
        });
    }

    pub fn end(&self, id: i64, direction: Direction, cut: Option<String>) {
        let t_us = self.now_us();
        self.send(Event::End {
            id,
            direction,
            t_us,
            cut,
        });
    }

    pub fn upstream_failed(&self, id: i64, reason: String) {
        let t_us = self.now_us();
        self.send(Event::UpstreamFailed { id, t_us, reason });
    }

    /// Waits until everything handed over so far is in the database.
    pub async fn flush(&self) {
        let (tx, rx) = oneshot::channel();
        self.send(Event::Flush(tx));
        let _ = rx.await;
    }

    fn send(&self, event: Event) {
        // The task ends only when every handle is gone; a send can fail only during shutdown.
        let _ = self.tx.send(event);
    }
}

/// One exchange still in flight.
#[derive(Debug)]
struct Live {
    route: RouteKind,
    path: String,
    client: StreamDecoder,
    server: Option<StreamDecoder>,
    grouped: bool,
    has_conversation: bool,
    saw_end_stream: bool,
    streaming_response: bool,
    client_done: bool,
    server_done: bool,
}

struct Actor {
    captures: Captures,
    schema: Option<Schema>,
    live: HashMap<i64, Live>,
    /// Batches written so far.
    written: watch::Sender<u64>,
}

impl Actor {
    async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Event>) {
        let mut batch = Vec::new();
        let mut flushes = Vec::new();
        while let Some(event) = rx.recv().await {
            self.apply(event, &mut batch, &mut flushes);
            while batch.len() < BATCH {
                match rx.try_recv() {
                    Ok(event) => self.apply(event, &mut batch, &mut flushes),
                    Err(_) => break,
                }
            }
            if !batch.is_empty() {
                let writes = batch.len();
                match self.captures.write(std::mem::take(&mut batch)).await {
                    Ok(()) => self.written.send_modify(|n| *n += 1),
                    Err(error) => {
                        tracing::error!(%error, writes, "could not record a batch of the capture")
                    }
                }
            }
            for flush in flushes.drain(..) {
                let _ = flush.send(());
            }
        }
    }

    fn apply(
        &mut self,
        event: Event,
        batch: &mut Vec<Write>,
        flushes: &mut Vec<oneshot::Sender<()>>,
    ) {
        match event {
            Event::Open(opening) => {
                let Opening {
                    id,
                    method,
                    path,
                    http_version,
                    headers,
                    started_at_ms,
                    started_us,
                } = *opening;
                // A run's request id comes from its body on RunSSE/BidiAppend (see `group`); `Run`
                // carries it in a header.
                let request_id = header(&headers, "x-request-id")
                    .filter(|v| !v.trim().is_empty())
                    .map(str::to_owned)
                    .unwrap_or_else(|| format!("exchange-{id}"));
                let client = decoder(self.schema.as_ref(), Direction::Client, &path, &headers);
                self.live.insert(
                    id,
                    Live {
                        route: RouteKind::of(&path),
                        path: path.clone(),
                        client,
                        server: None,
                        grouped: false,
                        has_conversation: false,
                        saw_end_stream: false,
                        streaming_response: false,
                        client_done: false,
                        server_done: false,
                    },
                );
                batch.push(Write::Exchange(NewExchange {
                    id,
                    request_id,
                    method,
                    path,
                    http_version,
                    request_headers: redacted_headers(&headers),
                    started_at_ms,
                    started_us,
                }));
            }
            Event::Response {
                id,
                status,
                headers,
            } => {
                if let Some(live) = self.live.get_mut(&id) {
                    let server = decoder(
                        self.schema.as_ref(),
                        Direction::Server,
                        &live.path,
                        &headers,
                    );
                    live.streaming_response = server.is_streaming();
                    live.server = Some(server);
                }
                batch.push(Write::Response {
                    id,
                    status,
                    headers: redacted_headers(&headers),
                });
            }
            Event::Chunk {
                id,
                direction,
                t_us,
                data,
            } => {
                let Some(live) = self.live.get_mut(&id) else {
                    return;
                };
                let records = match direction {
                    Direction::Client => live.client.push(&data),
                    Direction::Server => live
                        .server
                        .as_mut()
                        .map(|d| d.push(&data))
                        .unwrap_or_default(),
                };
                Self::frames(id, live, t_us, records, batch);
            }
            Event::End {
                id,
                direction,
                t_us,
                cut,
            } => self.end(id, direction, t_us, cut, batch),
            Event::UpstreamFailed { id, t_us, reason } => {
                batch.push(Write::Outcome {
                    id,
                    outcome: "unavailable".to_owned(),
                });
                batch.push(Write::Ended {
                    id,
                    ended_us: t_us,
                    error: Some(reason),
                });
                if let Some(live) = self.live.get_mut(&id) {
                    live.server_done = true;
                    if live.client_done {
                        self.live.remove(&id);
                    }
                }
            }
            Event::Flush(done) => flushes.push(done),
        }
    }

    fn end(
        &mut self,
        id: i64,
        direction: Direction,
        t_us: i64,
        cut: Option<String>,
        batch: &mut Vec<Write>,
    ) {
        let Some(live) = self.live.get_mut(&id) else {
            return;
        };
        let records = match direction {
            Direction::Client => live.client.finish(),
            Direction::Server => live
                .server
                .as_mut()
                .map(StreamDecoder::finish)
                .unwrap_or_default(),
        };
        Self::frames(id, live, t_us, records, batch);
        match direction {
            Direction::Client => live.client_done = true,
            Direction::Server => live.server_done = true,
        }
        // A CLI never half-closes Run's request stream: it is cut once the response has ended, which
        // is how that transport ends, not a failure.
        let error = match (direction, cut) {
            (_, None) => None,
            (Direction::Client, Some(_)) if live.server_done => None,
            (Direction::Client, Some(reason)) => Some(format!("request body cut off: {reason}")),
            // The client may stop reading once it has the end-of-stream frame, before the proxy sees
            // the upstream's body end: the stream was whole.
            (Direction::Server, Some(_)) if live.saw_end_stream => None,
            (Direction::Server, Some(reason)) => Some(format!("response body cut off: {reason}")),
        };
        if direction == Direction::Server && live.streaming_response && !live.saw_end_stream {
            batch.push(Write::Outcome {
                id,
                outcome: "no_end_stream".to_owned(),
            });
        }
        batch.push(Write::Ended {
            id,
            ended_us: t_us,
            error,
        });
        if live.client_done && live.server_done {
            self.live.remove(&id);
        }
    }

    /// Frames of one exchange: their run and conversation noted the first time a body names them.
    fn frames(
        id: i64,
        live: &mut Live,
        t_us: i64,
        records: Vec<FrameRecord>,
        batch: &mut Vec<Write>,
    ) {
        for record in records {
            if record.direction == Direction::Client {
                Self::group(id, live, &record, batch);
            } else if matches!(record.kind, FrameKind::EndStream | FrameKind::Error) {
                live.saw_end_stream = true;
                let outcome = record
                    .type_path
                    .rsplit_once('.')
                    .map(|(_, code)| code.to_owned())
                    .filter(|_| record.type_path != "end_stream")
                    .unwrap_or_else(|| "ok".to_owned());
                batch.push(Write::Outcome { id, outcome });
            }
            batch.push(Write::Frame {
                exchange_id: id,
                t_us,
                record,
            });
        }
    }

    fn group(id: i64, live: &mut Live, record: &FrameRecord, batch: &mut Vec<Write>) {
        let pointer = match live.route {
            RouteKind::RunSse => "/request_id",
            RouteKind::BidiAppend => "/request_id/request_id",
            RouteKind::Run | RouteKind::Other => "",
        };
        let request_id = (!live.grouped && live.route.request_id_in_body())
            .then(|| record.json.as_ref()?.pointer(pointer)?.as_str())
            .flatten()
            .filter(|v| !v.is_empty())
            .map(str::to_owned);
        let conversation_id = (!live.has_conversation
            && record.type_path.starts_with("run_request"))
        .then(|| {
            record
                .ids
                .iter()
                .find(|(kind, _)| *kind == "conversation_id")
                .map(|(_, v)| v.clone())
        })
        .flatten();
        live.grouped |= request_id.is_some();
        live.has_conversation |= conversation_id.is_some();
        if request_id.is_some() || conversation_id.is_some() {
            batch.push(Write::Group {
                id,
                request_id,
                conversation_id,
            });
        }
    }
}
