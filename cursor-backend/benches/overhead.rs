//! What the debugger adds: a stream of N `text_delta` frames read straight from an upstream, then
//! through the debugger (wall time per frame, both on loopback), and how fast the recorder decodes and
//! stores them (from the first byte until everything is in captures.db).
//!
//! `cargo bench -p cursor-backend --bench overhead` (the schema from `CURSOR_PROTO_DIR`).

use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::routing::post;
use bytes::Bytes;
use cursor_backend::schema::{self, Schema};
use cursor_backend::{Debugger, Options};
use futures_util::StreamExt as _;

/// Frames per stream and rounds under `cargo bench`; `cargo test --all-targets` runs a small smoke
/// round of the same path.
const BENCH: (usize, usize) = (20_000, 5);
const SMOKE: (usize, usize) = (300, 1);

fn envelope(flags: u8, payload: &[u8]) -> Bytes {
    let mut out = vec![flags];
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(payload);
    Bytes::from(out)
}

fn frames(schema: &Schema, count: usize) -> Vec<Bytes> {
    let message = schema
        .message("agent.v1.AgentServerMessage")
        .expect("AgentServerMessage in the schema");
    let mut out: Vec<Bytes> = (0..count)
        .map(|i| {
            let json = serde_json::json!({"interaction_update": {"text_delta": {"text": format!("token {i} ")}}});
            envelope(0, &schema::encode_json(&message, &json).expect("encodes"))
        })
        .collect();
    out.push(envelope(2, b"{}"));
    out
}

async fn upstream(frames: Vec<Bytes>) -> std::net::SocketAddr {
    let app = Router::new().route(
        "/agent.v1.AgentService/RunSSE",
        post(move || {
            let frames = frames.clone();
            async move {
                let stream =
                    futures_util::stream::iter(frames.into_iter().map(Ok::<_, std::io::Error>));
                axum::response::Response::builder()
                    .header("content-type", "application/connect+proto")
                    .body(Body::from_stream(stream))
                    .expect("response")
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    addr
}

async fn read_stream(
    client: &reqwest::Client,
    addr: std::net::SocketAddr,
    request_id: &str,
) -> (Duration, usize) {
    let started = Instant::now();
    let response = client
        .post(format!("http://{addr}/agent.v1.AgentService/RunSSE"))
        .header("content-type", "application/connect+proto")
        .header("x-request-id", request_id)
        // BidiRequestId { request_id }: field 1, a string.
        .body(
            envelope(
                0,
                &[&[0x0a, request_id.len() as u8], request_id.as_bytes()].concat(),
            )
            .to_vec(),
        )
        .send()
        .await
        .expect("stream");
    let mut bytes = 0;
    let mut body = response.bytes_stream();
    while let Some(chunk) = body.next().await {
        bytes += chunk.expect("chunk").len();
    }
    (started.elapsed(), bytes)
}

fn median(mut values: Vec<Duration>) -> Duration {
    values.sort();
    values[values.len() / 2]
}

fn main() {
    let (frames_per_stream, rounds) = if std::env::args().any(|a| a == "--bench") {
        BENCH
    } else {
        SMOKE
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let named = std::env::var_os("CURSOR_PROTO_DIR");
        let schema = Schema::load(named.as_deref().map(std::path::Path::new)).expect("a Cursor schema");
        let upstream = upstream(frames(&schema, frames_per_stream)).await;
        let dir = tempfile::tempdir().expect("tempdir");
        let debugger = Debugger::start(Options {
            listen: "127.0.0.1:0".parse().expect("addr"),
            ui: "127.0.0.1:0".parse().expect("addr"),
            upstream: format!("http://{upstream}"),
            upstream_ca: None,
            db: dir.path().join("captures.db"),
            schema: Some(schema),
        })
        .await
        .expect("debugger");
        let client = reqwest::Client::builder().http1_only().build().expect("client");
        let (mut direct, mut proxied, mut recorded) = (Vec::new(), Vec::new(), Vec::new());
        for round in 0..rounds {
            let (time, direct_bytes) = read_stream(&client, upstream, "direct").await;
            direct.push(time);
            let started = Instant::now();
            let (time, proxied_bytes) = read_stream(&client, debugger.proxy_addr, &format!("bench-{round}")).await;
            assert_eq!(direct_bytes, proxied_bytes, "the stream passes unchanged");
            proxied.push(time);
            debugger.flush().await;
            recorded.push(started.elapsed());
            // Everything recorded: RunSSE's request, each frame and the end of stream.
            let stored = debugger.captures.frames(&format!("bench-{round}")).await.expect("frames");
            assert_eq!(stored.len(), frames_per_stream + 2);
        }
        let (direct, proxied, recorded) = (median(direct), median(proxied), median(recorded));
        let per_frame = |d: Duration| d.as_secs_f64() * 1e6 / frames_per_stream as f64;
        println!("{frames_per_stream} text_delta frames per stream, median of {rounds} rounds, loopback:");
        println!("  read directly from the upstream:     {:8.1} ms ({:.2} µs/frame)", direct.as_secs_f64() * 1e3, per_frame(direct));
        println!("  read through the debugger:           {:8.1} ms ({:.2} µs/frame)", proxied.as_secs_f64() * 1e3, per_frame(proxied));
        println!(
            "  added by the debugger:               {:8.2} µs/frame",
            per_frame(proxied.saturating_sub(direct))
        );
        println!(
            "  decoded and stored in captures.db:   {:8.1} ms after the first byte ({:.0} frames/s)",
            recorded.as_secs_f64() * 1e3,
            frames_per_stream as f64 / recorded.as_secs_f64()
        );
        debugger.shutdown().await;
    });
}
