//! Cursor's official backend: every route this server does not implement is streamed to it
//! unchanged (exact bytes and headers, minus hop-by-hop ones) and its streamed answer comes back
//! unchanged; with the upstream unreachable the client gets a clear `unavailable`. The model
//! catalog: the configured models appear in every picker RPC, merged into Cursor's own list when
//! the user is signed in, on their own otherwise; the id Cursor sends back resolves (with effort
//! suffixes), an unknown one is a clear `not_found`.
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
    /// Unary answers by path (protobuf bytes).
    unary: Arc<Mutex<std::collections::HashMap<String, Vec<u8>>>>,
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
    if let Some(answer) = upstream
        .unary
        .lock()
        .unwrap()
        .get(parts.uri.path())
        .cloned()
    {
        return ([("content-type", "application/proto")], answer).into_response();
    }
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

/// A server whose pass-through goes to `upstream_addr`.
async fn server_with_upstream(provider: &FakeProvider, upstream_addr: SocketAddr) -> TestServer {
    TestServer::start_in(
        &provider.base_url(),
        tempfile::tempdir().unwrap(),
        &format!("upstream_url = \"http://{upstream_addr}\""),
    )
    .await
}

/// A loopback address nothing listens on.
async fn unreachable_addr() -> SocketAddr {
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    closed.local_addr().unwrap()
}

#[tokio::test]
async fn an_unknown_route_is_streamed_to_the_official_backend_and_back_unchanged() {
    let (upstream, upstream_addr) = start_upstream().await;
    let provider = FakeProvider::start().await;
    let server = server_with_upstream(&provider, upstream_addr).await;
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
    let server = server_with_upstream(&provider, upstream_addr).await;
    let missing = reqwest::get(format!("http://{}/missing", server.addr))
        .await
        .unwrap();
    assert_eq!(missing.status(), 404);
    assert_eq!(missing.text().await.unwrap(), "no such thing");

    // A backend nobody listens on.
    let closed_addr = unreachable_addr().await;
    let server = server_with_upstream(&provider, closed_addr).await;
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

mod catalog {
    use super::*;
    use cursor_server::cursor::proto::agent::{
        GetDefaultModelForCliRequest, GetDefaultModelForCliResponse, GetUsableModelsRequest,
        GetUsableModelsResponse, ModelDetails,
    };
    use cursor_server::cursor::proto::aiserver::{
        AvailableModelsRequest, AvailableModelsResponse, available_models_response,
    };
    use fake_cursor::{FakeCursor, Session};
    use fake_provider::{Reply, text_events};
    use fixtures::{MODEL, run_request_for_model};
    use prost::Message as _;

    async fn unary<Req: prost::Message, Resp: prost::Message + Default>(
        addr: SocketAddr,
        path: &str,
        request: &Req,
        signed_in: bool,
    ) -> Resp {
        let mut call = reqwest::Client::new()
            .post(format!("http://{addr}{path}"))
            .header("content-type", "application/proto")
            .header("connect-protocol-version", "1");
        if signed_in {
            call = call.header("authorization", "Bearer users-token");
        }
        let response = call.body(request.encode_to_vec()).send().await.unwrap();
        assert_eq!(response.status(), 200, "{path}");
        Resp::decode(response.bytes().await.unwrap()).unwrap()
    }

    fn official_list() -> Vec<u8> {
        AvailableModelsResponse {
            model_names: vec!["official-model".into(), MODEL.into()],
            models: vec![
                available_models_response::AvailableModel {
                    name: "official-model".into(),
                    default_on: true,
                    ..Default::default()
                },
                available_models_response::AvailableModel {
                    name: MODEL.into(),
                    client_display_name: Some("Cursor's idea of it".into()),
                    ..Default::default()
                },
            ],
            ..Default::default()
        }
        .encode_to_vec()
    }

    #[tokio::test]
    async fn the_picker_merges_our_models_into_cursors_list_when_signed_in() {
        let (upstream, upstream_addr) = start_upstream().await;
        upstream.unary.lock().unwrap().insert(
            "/aiserver.v1.AiService/AvailableModels".into(),
            official_list(),
        );
        upstream.unary.lock().unwrap().insert(
            "/agent.v1.AgentService/GetUsableModels".into(),
            GetUsableModelsResponse {
                models: vec![ModelDetails {
                    model_id: "official-model".into(),
                    ..Default::default()
                }],
            }
            .encode_to_vec(),
        );
        let provider = FakeProvider::start().await;
        let server = server_with_upstream(&provider, upstream_addr).await;
        let merged: AvailableModelsResponse = unary(
            server.addr,
            "/aiserver.v1.AiService/AvailableModels",
            &AvailableModelsRequest::default(),
            true,
        )
        .await;
        assert_eq!(merged.model_names, [MODEL, "official-model"]);
        let ours = &merged.models[0];
        assert_eq!(ours.is_user_added, Some(true));
        assert_eq!(ours.client_display_name.as_deref(), Some("Test Model"));
        assert_eq!(ours.supports_agent, Some(true));
        assert_eq!(ours.supports_thinking, Some(true));
        assert_eq!(
            merged.composer_model_config.unwrap().default_model,
            MODEL,
            "our default wins"
        );
        assert_eq!(
            upstream.received.lock().unwrap()[0].headers["authorization"],
            "Bearer users-token"
        );

        let usable: GetUsableModelsResponse = unary(
            server.addr,
            "/agent.v1.AgentService/GetUsableModels",
            &GetUsableModelsRequest::default(),
            true,
        )
        .await;
        let ids: Vec<&str> = usable.models.iter().map(|m| m.model_id.as_str()).collect();
        assert_eq!(ids, [MODEL, "official-model"]);
        assert!(usable.models[0].thinking_details.is_some());

        // Signed out: Cursor's backend is not asked, our models stand alone.
        let before = upstream.received.lock().unwrap().len();
        let alone: AvailableModelsResponse = unary(
            server.addr,
            "/aiserver.v1.AiService/AvailableModels",
            &AvailableModelsRequest::default(),
            false,
        )
        .await;
        assert_eq!(alone.model_names, [MODEL]);
        assert_eq!(upstream.received.lock().unwrap().len(), before);
    }

    #[tokio::test]
    async fn without_a_reachable_backend_the_catalog_is_our_own() {
        let closed_addr = unreachable_addr().await;
        let provider = FakeProvider::start().await;
        let server = server_with_upstream(&provider, closed_addr).await;
        for path in [
            "/aiserver.v1.AiService/GetUsableModels",
            "/agent.v1.AgentService/GetUsableModels",
        ] {
            let usable: GetUsableModelsResponse =
                unary(server.addr, path, &GetUsableModelsRequest::default(), true).await;
            assert_eq!(usable.models.len(), 1, "{path}");
            assert_eq!(usable.models[0].display_name, "Test Model");
        }
        for path in [
            "/aiserver.v1.AiService/GetDefaultModelForCli",
            "/agent.v1.AgentService/GetDefaultModelForCli",
        ] {
            let default: GetDefaultModelForCliResponse = unary(
                server.addr,
                path,
                &GetDefaultModelForCliRequest::default(),
                true,
            )
            .await;
            assert_eq!(default.model.unwrap().model_id, MODEL, "{path}");
        }
    }

    #[tokio::test]
    async fn a_requested_id_with_an_effort_suffix_resolves_and_an_unknown_one_is_not_found() {
        let provider = FakeProvider::start().await;
        provider.push(Reply::sse(text_events(&["ok"], (1, 1, 0))));
        let server = TestServer::start(&provider.base_url()).await;
        let cursor = FakeCursor::new(server.addr);
        let high = Session::start(
            &cursor,
            "req-high",
            &run_request_for_model("conv-cat", "hi", &format!("{MODEL}-high")),
        )
        .await
        .finish()
        .await;
        assert!(high.is_success(), "{:?}", high.end);
        let request = &provider.requests()[0];
        assert_eq!(request["model"], format!("upstream-{MODEL}"));
        assert_eq!(request["reasoning_effort"], "high");

        let unknown = Session::start(
            &cursor,
            "req-unknown",
            &run_request_for_model("conv-cat-2", "hi", "gpt-nonexistent"),
        )
        .await
        .finish()
        .await;
        assert_eq!(unknown.error_code(), Some("not_found"));
        let message = unknown.error_message().unwrap();
        assert!(
            message.contains("gpt-nonexistent") && message.contains(MODEL),
            "{message}"
        );
        assert_eq!(provider.requests().len(), 1);
    }
}
