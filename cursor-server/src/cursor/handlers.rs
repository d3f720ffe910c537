//! The axum router: the served Connect routes (paths generated from the schema declarations), the
//! HTTP/2 bidi `Run` route, BidiAppend, and a clear error for everything else.

use std::sync::Arc;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use futures_util::StreamExt as _;

use super::bidi_append;
use super::connect::{self, ConnectCode, ConnectError, Encoding, FrameDecoder, WireError};
use super::proto::agent::{
    AgentClientMessage, GetDefaultModelForCliRequest, GetDefaultModelForCliResponse,
    GetUsableModelsRequest, GetUsableModelsResponse, ModelDetails, ThinkingDetails,
    agent_service_routes,
};
use super::proto::aiserver::{
    AvailableModelsRequest, AvailableModelsResponse, BidiAppendResponse, BidiRequestId,
    ai_service_routes, available_models_response, bidi_service_routes,
};
use super::run_sse;
use crate::app::AppState;
use crate::run::command::{ProtocolError, RunCommand};
use crate::run::registry::{RegistryError, RunHandle, RunRegistry};

pub fn router(state: Arc<AppState>) -> Router {
    // Bodies are limited by our own checks (max_frame_bytes), with a little room for envelopes.
    let body_limit = state.config.max_frame_bytes.saturating_add(1024);
    Router::new()
        .route(
            agent_service_routes::RUN_SSE,
            post(
                |State(state): State<Arc<AppState>>, headers: HeaderMap, body: Bytes| {
                    run_sse_route(state, headers, body)
                },
            ),
        )
        .route(agent_service_routes::RUN, post(run_bidi))
        .route(bidi_service_routes::BIDI_APPEND, post(bidi_append_route))
        .route(
            ai_service_routes::AVAILABLE_MODELS,
            post(available_models_route),
        )
        // The two services declare the same messages (aiserver's are copies of agent.v1's).
        .route(
            ai_service_routes::GET_USABLE_MODELS,
            post(usable_models_route),
        )
        .route(
            agent_service_routes::GET_USABLE_MODELS,
            post(usable_models_route),
        )
        .route(
            ai_service_routes::GET_DEFAULT_MODEL_FOR_CLI,
            post(default_model_route),
        )
        .route(
            agent_service_routes::GET_DEFAULT_MODEL_FOR_CLI,
            post(default_model_route),
        )
        .fallback(unknown_route)
        .layer(axum::extract::DefaultBodyLimit::max(body_limit))
        .with_state(state)
}

/// A Connect unary error: HTTP status from the code, JSON `{"code","message","details"?}` body.
pub fn unary_error(error: &ConnectError) -> Response {
    let status = StatusCode::from_u16(error.code.http_status()).unwrap_or(StatusCode::BAD_REQUEST);
    (
        status,
        [(header::CONTENT_TYPE, connect::CONTENT_TYPE_JSON)],
        error.to_json().to_string(),
    )
        .into_response()
}

fn invalid(message: impl Into<String>) -> Response {
    unary_error(&ConnectError::new(ConnectCode::InvalidArgument, message))
}

/// Every route this server does not implement: streamed unchanged to Cursor's backend (the
/// user's own credentials travel with it), or — with pass-through off — `unimplemented`.
async fn unknown_route(State(state): State<Arc<AppState>>, request: Request) -> Response {
    let (Some(client), Some(upstream)) = (&state.upstream, &state.config.upstream) else {
        return unary_error(&ConnectError::new(
            ConnectCode::Unimplemented,
            format!(
                "{} is not served by cursor-server (pass-through is off)",
                request.uri().path()
            ),
        ));
    };
    let (parts, body) = request.into_parts();
    let path = parts
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_owned();
    let outbound = client
        .request(parts.method.clone(), format!("{}{path}", upstream.url))
        .headers(end_to_end_headers(&parts.headers))
        .body(reqwest::Body::wrap_stream(body.into_data_stream()));
    let response = match outbound.send().await {
        Ok(response) => response,
        Err(e) => {
            let e = e.without_url();
            tracing::warn!(method = %parts.method, path = %parts.uri.path(), "pass-through failed: {e}");
            return unary_error(&ConnectError::new(
                ConnectCode::Unavailable,
                format!(
                    "{} could not be forwarded to {}: {}",
                    parts.uri.path(),
                    upstream.url,
                    e
                ),
            ));
        }
    };
    tracing::debug!(method = %parts.method, path = %parts.uri.path(), status = response.status().as_u16(), "passed through");
    let status = response.status();
    let headers = end_to_end_headers(response.headers());
    let mut reply = Body::from_stream(response.bytes_stream()).into_response();
    *reply.status_mut() = status;
    *reply.headers_mut() = headers;
    reply
}

/// `headers` without those that belong to one connection rather than to the message (RFC 9110
/// §7.6.1): what is forwarded between the client and Cursor's backend, both ways.
fn end_to_end_headers(headers: &HeaderMap) -> HeaderMap {
    let hop_by_hop = hop_by_hop_headers(headers);
    let mut forwarded = headers.clone();
    for name in &hop_by_hop {
        forwarded.remove(name);
    }
    forwarded
}

/// Headers that belong to one connection, not to the message: never forwarded.
fn hop_by_hop_headers(headers: &HeaderMap) -> Vec<header::HeaderName> {
    let mut names = vec![
        header::CONNECTION,
        header::HOST,
        header::PROXY_AUTHENTICATE,
        header::PROXY_AUTHORIZATION,
        header::TE,
        header::TRAILER,
        header::TRANSFER_ENCODING,
        header::UPGRADE,
        header::HeaderName::from_static("keep-alive"),
        header::HeaderName::from_static("proxy-connection"),
    ];
    // Whatever `Connection` names is hop-by-hop too.
    for value in headers.get_all(header::CONNECTION) {
        if let Ok(list) = value.to_str() {
            names
                .extend(list.split(',').filter_map(|name| {
                    header::HeaderName::from_bytes(name.trim().as_bytes()).ok()
                }));
        }
    }
    names
}

/// `POST /aiserver.v1.BidiService/BidiAppend`: one client message for a RunSSE run.
async fn bidi_append_route(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let append = match unary_payload(&headers, &body, state.config.max_frame_bytes)
        .map_err(bidi_append::BidiAppendError::from)
        .and_then(|payload| bidi_append::decode(&payload))
    {
        Ok(append) => append,
        Err(e) => return invalid(format!("BidiAppend: {e}")),
    };
    let mut input = match bidi_append::translate(append.message) {
        Ok(input) => input,
        Err(e) => return invalid(format!("BidiAppend: {e}")),
    };
    bidi_append::link_parent(
        &mut input,
        header_str(&headers, "x-parent-request-id"),
        header_str(&headers, "x-parent-agent-tool-call-id"),
    );
    let handle = match RunRegistry::get_or_start(&state, &append.request_id) {
        Ok(handle) => handle,
        Err(e) => return registry_error(e),
    };
    let command = RunCommand::Appended {
        seqno: append.seqno,
        input,
    };
    if handle.send(command).await.is_err() {
        return registry_error(RegistryError::Finished(append.request_id));
    }
    unary_ok(&BidiAppendResponse {})
}

/// `POST /aiserver.v1.AiService/AvailableModels`: the configured models for Cursor's picker —
/// merged into Cursor's own list when the user is signed in and the backend answers, on their own
/// otherwise. Every run comes to this server, so a model it does not configure fails with a clear
/// `not_found` naming the configured ones.
async fn available_models_route(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if let Err(e) = decode_unary::<AvailableModelsRequest>(
        &headers,
        &body,
        state.config.max_frame_bytes,
        "aiserver.v1.AvailableModelsRequest",
    ) {
        return invalid(format!("AvailableModels: {e}"));
    }
    let ours = available_models(&state.config);
    let upstream = upstream_unary::<AvailableModelsResponse>(
        &state,
        ai_service_routes::AVAILABLE_MODELS,
        &headers,
        &body,
    )
    .await;
    unary_ok(&match upstream {
        Some(theirs) => merge_available_models(ours, theirs),
        None => ours,
    })
}

/// `GetUsableModels` (both services): the configured models, then Cursor's own when signed in.
async fn usable_models_route(
    State(state): State<Arc<AppState>>,
    uri: axum::http::Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if let Err(e) = decode_unary::<GetUsableModelsRequest>(
        &headers,
        &body,
        state.config.max_frame_bytes,
        "agent.v1.GetUsableModelsRequest",
    ) {
        return invalid(format!("GetUsableModels: {e}"));
    }
    let mut models: Vec<ModelDetails> = configured_models(&state.config).collect();
    if let Some(theirs) =
        upstream_unary::<GetUsableModelsResponse>(&state, uri.path(), &headers, &body).await
    {
        let ours: Vec<String> = models.iter().map(|m| m.model_id.clone()).collect();
        models.extend(
            theirs
                .models
                .into_iter()
                .filter(|m| !ours.contains(&m.model_id)),
        );
    }
    unary_ok(&GetUsableModelsResponse { models })
}

/// `GetDefaultModelForCli` (both services): the configured default model.
async fn default_model_route(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if let Err(e) = decode_unary::<GetDefaultModelForCliRequest>(
        &headers,
        &body,
        state.config.max_frame_bytes,
        "agent.v1.GetDefaultModelForCliRequest",
    ) {
        return invalid(format!("GetDefaultModelForCli: {e}"));
    }
    let default =
        configured_models(&state.config).find(|m| m.model_id == state.config.default_model);
    unary_ok(&GetDefaultModelForCliResponse { model: default })
}

/// How long the picker waits for Cursor's own list before answering with the configured models.
const CATALOG_UPSTREAM_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3);

/// Asks Cursor's backend the same unary question with the user's own headers, if pass-through is
/// on and the user is signed in (`authorization`); `None` when it cannot answer in time.
async fn upstream_unary<M: prost::Message + Default>(
    state: &AppState,
    path: &str,
    headers: &HeaderMap,
    body: &Bytes,
) -> Option<M> {
    let (client, upstream) = (state.upstream.as_ref()?, state.config.upstream.as_ref()?);
    headers.get(header::AUTHORIZATION)?;
    let request = client
        .post(format!("{}{path}", upstream.url))
        .timeout(CATALOG_UPSTREAM_TIMEOUT)
        .headers(end_to_end_headers(headers))
        .body(body.clone());
    let answer = async {
        let response = request
            .send()
            .await
            .map_err(|e| e.without_url().to_string())?;
        if !response.status().is_success() {
            return Err(format!("HTTP {}", response.status()));
        }
        let response_headers = response.headers().clone();
        let bytes = response
            .bytes()
            .await
            .map_err(|e| e.without_url().to_string())?;
        let payload = unary_payload(&response_headers, &bytes, state.config.max_frame_bytes)
            .map_err(|e| e.to_string())?;
        M::decode(payload).map_err(|e| e.to_string())
    };
    match answer.await {
        Ok(message) => Some(message),
        Err(e) => {
            tracing::info!(
                path,
                "Cursor's model list is unavailable ({e}); answering with the configured models only"
            );
            None
        }
    }
}

/// The configured models first (they are what this server runs), then Cursor's other models;
/// Cursor's other settings (feature model configs, ...) are kept, with our default model.
fn merge_available_models(
    ours: AvailableModelsResponse,
    mut theirs: AvailableModelsResponse,
) -> AvailableModelsResponse {
    let mut models = ours.models;
    let names: Vec<String> = models.iter().map(|m| m.name.clone()).collect();
    models.extend(
        theirs
            .models
            .into_iter()
            .filter(|m| !names.contains(&m.name)),
    );
    theirs.model_names = models.iter().map(|m| m.name.clone()).collect();
    theirs.models = models;
    theirs.composer_model_config = ours.composer_model_config;
    theirs
}

/// The configured models as the CLI's `ModelDetails`.
fn configured_models(config: &crate::config::Config) -> impl Iterator<Item = ModelDetails> + '_ {
    config
        .providers
        .iter()
        .flat_map(|provider| provider.models.iter())
        .map(|model| ModelDetails {
            model_id: model.id.clone(),
            display_model_id: model.id.clone(),
            display_name: model.display_name.clone(),
            display_name_short: model.display_name.clone(),
            thinking_details: model.reasoning.then(ThinkingDetails::default),
            max_mode: Some(false),
            ..ModelDetails::default()
        })
}

/// A unary request's message, whatever its `content-encoding` and framing.
fn decode_unary<M: prost::Message + Default>(
    headers: &HeaderMap,
    body: &[u8],
    max_bytes: usize,
    name: &'static str,
) -> Result<M, WireError> {
    unary_payload(headers, body, max_bytes)
        .and_then(|payload| connect::decode_message(&payload, name))
}

/// The protobuf payload of a unary request, whatever its `content-encoding` and framing.
fn unary_payload(headers: &HeaderMap, body: &[u8], max_bytes: usize) -> Result<Bytes, WireError> {
    let encoding = Encoding::parse(header_str(headers, header::CONTENT_ENCODING.as_str()))?;
    connect::decode_unary_body(body, encoding, max_bytes)
}

/// A successful unary response: 200, `application/proto`, the encoded message.
fn unary_ok<M: prost::Message>(message: &M) -> Response {
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, connect::CONTENT_TYPE_UNARY)],
        message.encode_to_vec(),
    )
        .into_response()
}

fn available_models(config: &crate::config::Config) -> AvailableModelsResponse {
    let models: Vec<available_models_response::AvailableModel> = config
        .providers
        .iter()
        .flat_map(|provider| provider.models.iter())
        .map(|model| available_models_response::AvailableModel {
            name: model.id.clone(),
            default_on: true,
            supports_agent: Some(true),
            supports_thinking: Some(model.reasoning),
            supports_max_mode: Some(false),
            supports_non_max_mode: Some(true),
            context_token_limit: Some(i32::try_from(model.context_window).unwrap_or(i32::MAX)),
            client_display_name: Some(model.display_name.clone()),
            server_model_name: Some(model.id.clone()),
            supports_plan_mode: Some(true),
            is_user_added: Some(true),
            inputbox_short_model_name: Some(model.display_name.clone()),
            ..Default::default()
        })
        .collect();
    AvailableModelsResponse {
        model_names: models.iter().map(|m| m.name.clone()).collect(),
        models,
        composer_model_config: Some(available_models_response::FeatureModelConfig {
            default_model: config.default_model.clone(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn registry_error(error: RegistryError) -> Response {
    let code = match error {
        RegistryError::Finished(_) => ConnectCode::NotFound,
        RegistryError::AlreadyRunning(_) => ConnectCode::InvalidArgument,
    };
    unary_error(&ConnectError::new(code, error.to_string()))
}

fn header_str<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// `POST /agent.v1.AgentService/Run`: the HTTP/2 bidi stream. The request body is a stream of
/// `AgentClientMessage` envelopes (never half-closed by CLI clients); the response streams the run's
/// downlink and ends when the run ends.
async fn run_bidi(State(state): State<Arc<AppState>>, request: Request) -> Response {
    let headers = request.headers();
    let encoding = match Encoding::parse(header_str(headers, "connect-content-encoding")) {
        Ok(encoding) => encoding,
        Err(e) => return invalid(format!("Run: {e}")),
    };
    let request_id = header_str(headers, "x-request-id")
        .filter(|id| !id.trim().is_empty())
        .map(str::to_owned)
        .unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
    let handle = match RunRegistry::start_new(&state, &request_id) {
        Ok(handle) => handle,
        Err(e) => {
            return run_sse::stream_error(&ConnectError::new(
                ConnectCode::InvalidArgument,
                e.to_string(),
            ));
        }
    };
    let (sink, body) = run_sse::downlink_channel(false);
    if handle.send(RunCommand::AttachDownlink(sink)).await.is_err() {
        return run_sse::stream_error(&ConnectError::new(
            ConnectCode::Internal,
            "the run ended before it started",
        ));
    }
    let max = state.config.max_frame_bytes;
    tokio::spawn(forward_uplink(request.into_body(), handle, encoding, max));
    run_sse::stream_response(body)
}

/// Reads the `Run` request stream and hands each message to the run, until the run ends.
async fn forward_uplink(body: Body, handle: RunHandle, encoding: Encoding, max_frame_bytes: usize) {
    let mut stream = body.into_data_stream();
    let mut decoder = FrameDecoder::new(max_frame_bytes);
    let done = handle.done().clone();
    loop {
        let chunk = tokio::select! {
            _ = done.cancelled() => return,
            chunk = stream.next() => chunk,
        };
        let failure = match chunk {
            None => match decoder.finish() {
                // A clean half-close: the run goes on; the response ends when the run does.
                Ok(()) => return,
                Err(e) => e.to_string(),
            },
            Some(Err(e)) => {
                // The stream was reset or the connection dropped: the client is gone, which is a
                // cancellation, not a protocol error.
                tracing::debug!("the Run request stream broke: {e}");
                let _ = handle.send(RunCommand::ClientGone).await;
                return;
            }
            Some(Ok(bytes)) => {
                decoder.push(&bytes);
                match drain_frames(&mut decoder, &handle, encoding, max_frame_bytes).await {
                    Ok(()) => continue,
                    Err(failure) => failure,
                }
            }
        };
        let _ = handle
            .send(RunCommand::UplinkFailed(ProtocolError::Uplink(failure)))
            .await;
        return;
    }
}

async fn drain_frames(
    decoder: &mut FrameDecoder,
    handle: &RunHandle,
    encoding: Encoding,
    max_frame_bytes: usize,
) -> Result<(), String> {
    while let Some(frame) = decoder.next_frame().map_err(|e| e.to_string())? {
        if frame.is_end_stream() {
            return Err("end-of-stream frame in a request stream".to_owned());
        }
        let payload =
            connect::payload_of(&frame, encoding, max_frame_bytes).map_err(|e| e.to_string())?;
        let message: AgentClientMessage =
            connect::decode_message(&payload, "agent.v1.AgentClientMessage")
                .map_err(|e| e.to_string())?;
        let input = bidi_append::translate(message).map_err(|e| e.to_string())?;
        if handle.send(RunCommand::Ordered(input)).await.is_err() {
            return Err("the run has ended".to_owned());
        }
    }
    Ok(())
}

/// `POST /agent.v1.AgentService/RunSSE`: body = one enveloped `BidiRequestId`.
async fn run_sse_route(state: Arc<AppState>, headers: HeaderMap, body: Bytes) -> Response {
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
            return run_sse::stream_error(&ConnectError::new(ConnectCode::NotFound, e.to_string()));
        }
        Err(e @ RegistryError::AlreadyRunning(_)) => {
            return run_sse::stream_error(&ConnectError::new(
                ConnectCode::InvalidArgument,
                e.to_string(),
            ));
        }
    };
    let (sink, body) = run_sse::downlink_channel(true);
    if handle.send(RunCommand::AttachDownlink(sink)).await.is_err() {
        return run_sse::stream_error(&ConnectError::new(
            ConnectCode::NotFound,
            format!("request {request_id} has already finished"),
        ));
    }
    run_sse::stream_response(body)
}
