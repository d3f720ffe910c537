//! Cursor's official backend: every route this server does not implement is streamed to it
//! unchanged (exact bytes and headers, minus hop-by-hop ones) and its streamed answer comes back
//! unchanged; with the upstream unreachable the client gets a clear `unavailable`.
//!
//! A file of its own because these scenarios need a fake of Cursor's backend, not of a provider.

#[path = "support/fake_cursor.rs"]
mod fake_cursor;
#[path = "support/fake_provider.rs"]
mod fake_provider;
#[path = "support/fixtures.rs"]
mod fixtures;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use fake_provider::FakeProvider;
use fixtures::TestServer;
use futures_util::StreamExt as _;
use tokio::sync::Notify;

/// What the fake backend received.
#[derive(Debug, Clone)]
struct Received {
    method: String,
    path_and_query: String,
    headers: HeaderMap,
    body: Bytes,
}

#[derive(Clone, Default)]
struct Upstream {
    received: Arc<Mutex<Vec<Received>>>,
    /// The streamed answer's last chunk waits for this (so the test can see the first one first).
    release: Arc<Notify>,
}

async fn backend(State(upstream): State<Upstream>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let body = axum::body::to_bytes(body, usize::MAX).await.unwrap();
    upstream.received.lock().unwrap().push(Received {
        method: parts.method.to_string(),
        path_and_query: parts.uri.path_and_query().unwrap().to_string(),
        headers: parts.headers,
        body,
    });
    if parts.uri.path() == "/missing" {
        return (axum::http::StatusCode::NOT_FOUND, "no such thing").into_response();
    }
    let release = Arc::clone(&upstream.release);
    let stream = async_stream_chunks(release);
    (
        [
            ("content-type", "application/connect+proto"),
            ("x-upstream", "official"),
        ],
        Body::from_stream(stream),
    )
        .into_response()
}

fn async_stream_chunks(
    release: Arc<Notify>,
) -> impl futures_util::Stream<Item = Result<Bytes, std::io::Error>> {
    futures_util::stream::unfold(0u8, move |step| {
        let release = Arc::clone(&release);
        async move {
            match step {
                0 => Some((Ok(Bytes::from_static(b"\x00\x00\x00\x00\x02hi")), 1)),
                1 => {
                    release.notified().await;
                    Some((Ok(Bytes::from_static(b"\x02\x00\x00\x00\x02{}")), 2))
                }
                _ => None,
            }
        }
    })
}

async fn start_upstream() -> (Upstream, SocketAddr) {
    let upstream = Upstream::default();
    let app = Router::new().fallback(backend).with_state(upstream.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (upstream, addr)
}

#[tokio::test]
async fn an_unknown_route_is_streamed_to_the_official_backend_and_back_unchanged() {
    let (upstream, upstream_addr) = start_upstream().await;
    let provider = FakeProvider::start().await;
    let server = TestServer::start_in(
        &provider.base_url(),
        tempfile::tempdir().unwrap(),
        &format!("upstream_url = \"http://{upstream_addr}\""),
    )
    .await;
    let body: Vec<u8> = (0..=255u8).chain(0..=255u8).collect();
    let response = reqwest::Client::new()
        .post(format!(
            "http://{}/aiserver.v1.DashboardService/GetTeams?team=7&x=%20y",
            server.addr
        ))
        .header("authorization", "Bearer the-users-own-token")
        .header("content-type", "application/proto")
        .header("x-cursor-client-version", "2.1.0")
        .header("proxy-authorization", "Basic not-for-upstream")
        .header("connection", "keep-alive, x-hop")
        .header("x-hop", "only for this connection")
        .body(body.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["x-upstream"], "official");
    assert_eq!(
        response.headers()["content-type"],
        "application/connect+proto"
    );
    let mut stream = response.bytes_stream();
    // The first chunk arrives while the backend is still holding the rest: it is streamed.
    let first = tokio::time::timeout(Duration::from_secs(5), stream.next())
        .await
        .expect("the first chunk is streamed through")
        .unwrap()
        .unwrap();
    let mut received = first.to_vec();
    upstream.release.notify_one();
    while let Some(chunk) = stream.next().await {
        received.extend_from_slice(&chunk.unwrap());
    }
    assert_eq!(received, b"\x00\x00\x00\x00\x02hi\x02\x00\x00\x00\x02{}");

    let seen = upstream.received.lock().unwrap().clone();
    assert_eq!(seen.len(), 1);
    let request = &seen[0];
    assert_eq!(request.method, "POST");
    assert_eq!(
        request.path_and_query,
        "/aiserver.v1.DashboardService/GetTeams?team=7&x=%20y"
    );
    assert_eq!(request.body.as_ref(), body.as_slice());
    assert_eq!(
        request.headers["authorization"],
        "Bearer the-users-own-token"
    );
    assert_eq!(request.headers["content-type"], "application/proto");
    assert_eq!(request.headers["x-cursor-client-version"], "2.1.0");
    assert_eq!(request.headers["content-length"], "512");
    for hop in ["proxy-authorization", "x-hop"] {
        assert!(!request.headers.contains_key(hop), "{hop} was forwarded");
    }
    assert_eq!(
        request.headers["host"],
        upstream_addr.to_string(),
        "the upstream's own host"
    );
}

#[tokio::test]
async fn the_backends_status_comes_back_and_an_unreachable_backend_is_unavailable() {
    let (_upstream, upstream_addr) = start_upstream().await;
    let provider = FakeProvider::start().await;
    let server = TestServer::start_in(
        &provider.base_url(),
        tempfile::tempdir().unwrap(),
        &format!("upstream_url = \"http://{upstream_addr}\""),
    )
    .await;
    let missing = reqwest::get(format!("http://{}/missing", server.addr))
        .await
        .unwrap();
    assert_eq!(missing.status(), 404);
    assert_eq!(missing.text().await.unwrap(), "no such thing");

    // A backend nobody listens on.
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let closed_addr = closed.local_addr().unwrap();
    drop(closed);
    let server = TestServer::start_in(
        &provider.base_url(),
        tempfile::tempdir().unwrap(),
        &format!("upstream_url = \"http://{closed_addr}\""),
    )
    .await;
    let response = reqwest::Client::new()
        .post(format!(
            "http://{}/aiserver.v1.AuthService/GetEmail",
            server.addr
        ))
        .header("authorization", "Bearer secret-token")
        .body(Vec::new())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 503);
    let json: serde_json::Value = response.json().await.unwrap();
    assert_eq!(json["code"], "unavailable");
    let message = json["message"].as_str().unwrap();
    assert!(
        message.contains("/aiserver.v1.AuthService/GetEmail"),
        "{message}"
    );
    assert!(!message.contains("secret-token"));
}
