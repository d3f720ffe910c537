//! A fake OpenAI-compatible Chat Completions endpoint on 127.0.0.1: answers each call with the next
//! scripted reply (real SSE over HTTP), records every request body, and notices when a client drops
//! a stream it was still sending.
#![allow(dead_code)]

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use bytes::Bytes;
use tokio::net::TcpListener;

/// One scripted answer to one provider call.
#[derive(Debug, Clone)]
pub enum Reply {
    /// SSE `data:` payloads (without the `data: ` prefix), each sent after `gap`.
    Sse { events: Vec<String>, gap: Duration },
    /// An HTTP error status with a body.
    Status { status: u16, body: String },
    /// SSE payloads, then the connection is cut without `[DONE]`.
    CutAfter { events: Vec<String> },
    /// A complete SSE body served byte for byte (a golden transcript).
    Raw(String),
    /// Raw body pieces (SSE comments, events), each sent after `gap`: a provider that keeps a
    /// slow call alive with `: keep-alive` comments.
    Chunks { chunks: Vec<String>, gap: Duration },
    /// HTTP 429 with a `retry-after` header.
    RateLimited { retry_after_secs: u64, body: String },
    /// SSE payloads, then silence with the connection open until the caller goes away. `sent`
    /// counts the payloads the connection has taken so far.
    Hang {
        events: Vec<String>,
        sent: Arc<std::sync::atomic::AtomicUsize>,
    },
    /// SSE payloads `before`, then nothing until `release` is notified, then `after`.
    Held {
        before: Vec<String>,
        after: Vec<String>,
        release: Arc<tokio::sync::Notify>,
    },
}

/// A golden transcript from `tests/golden/<endpoint>/<scenario>.sse`.
pub fn golden(endpoint: &str, scenario: &str) -> Reply {
    let path = format!(
        "{}/tests/golden/{endpoint}/{scenario}.sse",
        env!("CARGO_MANIFEST_DIR")
    );
    Reply::Raw(std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}")))
}

impl Reply {
    pub fn sse(events: Vec<String>) -> Reply {
        Reply::Sse {
            events,
            gap: Duration::from_millis(1),
        }
    }
}

#[derive(Default)]
struct Shared {
    replies: VecDeque<Reply>,
    requests: Vec<serde_json::Value>,
    authorizations: Vec<String>,
    paths: Vec<String>,
    headers: Vec<HeaderMap>,
    /// Streams the client dropped before they were finished.
    disconnects: Arc<std::sync::atomic::AtomicUsize>,
}

#[derive(Clone)]
pub struct FakeProvider {
    shared: Arc<Mutex<Shared>>,
    pub addr: SocketAddr,
}

impl FakeProvider {
    pub async fn start() -> FakeProvider {
        let shared = Arc::new(Mutex::new(Shared::default()));
        let app = Router::new()
            .route("/v1/chat/completions", post(chat))
            .route("/v1/responses", post(chat))
            .route("/v1/messages", post(chat))
            // A Tavily-style search backend (WebSearch), answered like any other scripted call.
            .route("/v1/search", post(chat))
            .with_state(Arc::clone(&shared));
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind fake provider");
        let addr = listener.local_addr().expect("addr");
        // Without TCP_NODELAY, a streamed reply's small writes wait on Nagle's algorithm for the
        // client's delayed ACK (about 40 ms on Linux): a latency no real provider adds.
        let listener = axum::serve::ListenerExt::tap_io(listener, |socket| {
            let _ = socket.set_nodelay(true);
        });
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        FakeProvider { shared, addr }
    }

    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    pub fn push(&self, reply: Reply) {
        self.shared.lock().unwrap().replies.push_back(reply);
    }

    /// The JSON bodies received so far, in order.
    pub fn requests(&self) -> Vec<serde_json::Value> {
        self.shared.lock().unwrap().requests.clone()
    }

    pub fn authorizations(&self) -> Vec<String> {
        self.shared.lock().unwrap().authorizations.clone()
    }

    /// Request paths received, in order.
    pub fn paths(&self) -> Vec<String> {
        self.shared.lock().unwrap().paths.clone()
    }

    /// How many streamed replies the client abandoned mid-way.
    pub fn disconnects(&self) -> usize {
        self.shared
            .lock()
            .unwrap()
            .disconnects
            .load(std::sync::atomic::Ordering::SeqCst)
    }

    pub fn headers(&self) -> Vec<HeaderMap> {
        self.shared.lock().unwrap().headers.clone()
    }
}

async fn chat(
    State(shared): State<Arc<Mutex<Shared>>>,
    uri: axum::http::Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let json: serde_json::Value = serde_json::from_slice(&body).expect("provider request is JSON");
    let reply = {
        let mut shared = shared.lock().unwrap();
        shared.requests.push(json);
        shared.paths.push(uri.path().to_owned());
        shared.headers.push(headers.clone());
        shared.authorizations.push(
            headers
                .get("authorization")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned(),
        );
        (shared.replies.pop_front(), Arc::clone(&shared.disconnects))
    };
    let (reply, disconnects) = reply;
    let Some(reply) = reply else {
        return (
            StatusCode::INTERNAL_SERVER_ERROR,
            "fake provider: no reply scripted",
        )
            .into_response();
    };
    match reply {
        Reply::Status { status, body } => (
            StatusCode::from_u16(status).expect("status"),
            [("content-type", "application/json")],
            body,
        )
            .into_response(),
        Reply::Sse { events, gap } => {
            let stream = async_stream(events, gap, false, disconnects);
            sse_response(stream)
        }
        Reply::Raw(body) => (
            StatusCode::OK,
            [("content-type", "text/event-stream")],
            body,
        )
            .into_response(),
        Reply::RateLimited {
            retry_after_secs,
            body,
        } => (
            StatusCode::TOO_MANY_REQUESTS,
            [
                ("content-type", "application/json".to_owned()),
                ("retry-after", retry_after_secs.to_string()),
            ],
            body,
        )
            .into_response(),
        Reply::Chunks { chunks, gap } => {
            let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(16);
            tokio::spawn(async move {
                for chunk in chunks {
                    pause(gap).await;
                    if tx.send(Ok(Bytes::from(chunk))).await.is_err() {
                        return;
                    }
                }
            });
            sse_response(tokio_stream::wrappers::ReceiverStream::new(rx))
        }
        Reply::Hang { events, sent } => {
            let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(16);
            tokio::spawn(async move {
                for event in events {
                    let frame = Bytes::from(format!("data: {event}\n\n"));
                    if tx.send(Ok(frame)).await.is_err() {
                        return;
                    }
                    sent.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                }
                tx.closed().await;
            });
            sse_response(tokio_stream::wrappers::ReceiverStream::new(rx))
        }
        Reply::Held {
            before,
            after,
            release,
        } => {
            let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(16);
            tokio::spawn(async move {
                let frame = |event: String| Ok(Bytes::from(format!("data: {event}\n\n")));
                for event in before {
                    if tx.send(frame(event)).await.is_err() {
                        return;
                    }
                }
                release.notified().await;
                for event in after {
                    if tx.send(frame(event)).await.is_err() {
                        return;
                    }
                }
            });
            sse_response(tokio_stream::wrappers::ReceiverStream::new(rx))
        }
        Reply::CutAfter { events } => sse_response(async_stream(
            events,
            Duration::from_millis(1),
            true,
            disconnects,
        )),
    }
}

fn sse_response(
    stream: impl futures_util::Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static,
) -> Response {
    (
        StatusCode::OK,
        [("content-type", "text/event-stream")],
        Body::from_stream(stream),
    )
        .into_response()
}

/// Waits `gap` between two pieces of a reply; a zero gap sends the next piece at once (no timer).
async fn pause(gap: Duration) {
    if !gap.is_zero() {
        tokio::time::sleep(gap).await;
    }
}

/// Yields `data: <event>\n\n` frames with a gap between them; when `cut`, ends with an I/O error so
/// the connection is aborted mid-body.
fn async_stream(
    events: Vec<String>,
    gap: Duration,
    cut: bool,
    disconnects: Arc<std::sync::atomic::AtomicUsize>,
) -> impl futures_util::Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static {
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(16);
    tokio::spawn(async move {
        for event in events {
            pause(gap).await;
            if tx
                .send(Ok(Bytes::from(format!("data: {event}\n\n"))))
                .await
                .is_err()
            {
                disconnects.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                return;
            }
        }
        if cut {
            tokio::time::sleep(Duration::from_millis(20)).await;
            let _ = tx
                .send(Err(std::io::Error::new(
                    std::io::ErrorKind::ConnectionReset,
                    "cut",
                )))
                .await;
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}

/// Chat SSE payloads for a plain text answer split into `parts`, with usage.
pub fn text_events(parts: &[&str], usage: (u64, u64, u64)) -> Vec<String> {
    let mut events = vec![
        r#"{"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}"#.to_owned(),
    ];
    for part in parts {
        events.push(
            serde_json::json!({"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":part},"finish_reason":null}]})
                .to_string(),
        );
    }
    events.push(
        r#"{"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#.to_owned(),
    );
    events.push(usage_event(usage));
    events.push("[DONE]".to_owned());
    events
}

/// Reasoning deltas first, then text.
pub fn thinking_then_text_events(
    thinking: &[&str],
    text: &[&str],
    usage: (u64, u64, u64),
) -> Vec<String> {
    let mut events = Vec::new();
    for part in thinking {
        events.push(
            serde_json::json!({"choices":[{"index":0,"delta":{"reasoning_content":part},"finish_reason":null}]})
                .to_string(),
        );
    }
    let mut rest = text_events(text, usage);
    events.append(&mut rest);
    events
}

/// The usage chunk: (prompt, completion, cached).
pub fn usage_event((prompt, completion, cached): (u64, u64, u64)) -> String {
    serde_json::json!({"choices":[],"usage":{"prompt_tokens":prompt,"completion_tokens":completion,"total_tokens":prompt+completion,"prompt_tokens_details":{"cached_tokens":cached}}})
        .to_string()
}

/// Chat SSE payloads for a response that calls tools: each `(id, name, arguments)` streams its
/// arguments in two fragments, optional reasoning first, then `finish_reason: tool_calls`.
pub fn tool_call_events(
    reasoning: Option<&str>,
    calls: &[(&str, &str, &str)],
    usage: (u64, u64, u64),
) -> Vec<String> {
    let mut events = Vec::new();
    if let Some(reasoning) = reasoning {
        events.push(
            serde_json::json!({"choices":[{"index":0,"delta":{"reasoning_content":reasoning},"finish_reason":null}]})
                .to_string(),
        );
    }
    for (index, (id, name, arguments)) in calls.iter().enumerate() {
        let split = arguments.len() / 2;
        let split = (0..=split)
            .rev()
            .find(|i| arguments.is_char_boundary(*i))
            .unwrap_or(0);
        events.push(
            serde_json::json!({"choices":[{"index":0,"delta":{"tool_calls":[{"index":index,"id":id,"type":"function","function":{"name":name,"arguments":&arguments[..split]}}]},"finish_reason":null}]})
                .to_string(),
        );
        events.push(
            serde_json::json!({"choices":[{"index":0,"delta":{"tool_calls":[{"index":index,"function":{"arguments":&arguments[split..]}}]},"finish_reason":null}]})
                .to_string(),
        );
    }
    events.push(r#"{"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}"#.to_owned());
    events.push(usage_event(usage));
    events.push("[DONE]".to_owned());
    events
}
