//! The axum router: the served Connect routes (paths generated from the schema declarations), the
//! RunSSE and HTTP/2 bidi `Run` routes, BidiAppend, the model catalog's routes (in `catalog.rs`),
//! and pass-through to Cursor's backend for everything else.
//!
//! Unary routes fail with a `ConnectError` (a JSON error response); streaming routes fail with a
//! `StreamError` (one end-of-stream frame) once the request itself was understood.

use std::fmt::Display;
use std::sync::Arc;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use futures_util::StreamExt as _;

use crate::client::bidi_append;
use crate::client::command::{Applied, RunCommand};
use crate::client::downlink::{self, StreamError};
use crate::cluster::{self, Cluster, Placement, Via};
use crate::cursor::connect::{
    self, ConnectCode, ConnectError, Encoding, FrameDecoder, WireError, header_str,
};
use crate::cursor::proto::agent::{AgentClientMessage, agent_service_routes};
use crate::cursor::proto::aiserver::{
    BidiAppendResponse, BidiRequestId, ai_service_routes, bidi_service_routes,
};
use crate::error::ProtocolError;
use crate::run::actor;
use crate::run::registry::{Opener, RegistryError, RunHandle};
use crate::state::AppState;
use crate::wire::catalog;

pub fn router(state: Arc<AppState>) -> Router {
    // Bodies are limited by our own checks (max_frame_bytes), with a little room for envelopes.
    let body_limit = state.config.max_frame_bytes.saturating_add(1024);
    Router::new()
        .route(agent_service_routes::RUN_SSE, post(run_sse_route))
        .route(agent_service_routes::RUN, post(run_bidi))
        .route(bidi_service_routes::BIDI_APPEND, post(bidi_append_route))
        .route(
            ai_service_routes::AVAILABLE_MODELS,
            post(catalog::available_models_route),
        )
        // The two services declare the same messages (aiserver's are copies of agent.v1's).
        .route(
            ai_service_routes::GET_USABLE_MODELS,
            post(catalog::usable_models_route),
        )
        .route(
            agent_service_routes::GET_USABLE_MODELS,
            post(catalog::usable_models_route),
        )
        .route(
            ai_service_routes::GET_DEFAULT_MODEL_FOR_CLI,
            post(catalog::default_model_route),
        )
        .route(
            agent_service_routes::GET_DEFAULT_MODEL_FOR_CLI,
            post(catalog::default_model_route),
        )
        // Other nodes' forwards (`[cluster]`): refused without the shared secret.
        .route(cluster::INTERNAL_RUN_SSE, post(internal_run_sse))
        .route(cluster::INTERNAL_BIDI_APPEND, post(internal_bidi_append))
        .route(cluster::INTERNAL_STOP_RUN, post(internal_stop_run))
        .fallback(unknown_route)
        .layer(axum::extract::DefaultBodyLimit::max(body_limit))
        .with_state(state)
}

/// `invalid_argument` for a request `route` could not read, prefixed with the route's name.
fn invalid<E: Display>(route: &'static str) -> impl FnOnce(E) -> ConnectError {
    move |e| ConnectError::new(ConnectCode::InvalidArgument, format!("{route}: {e}"))
}

fn registry_error(error: RegistryError) -> ConnectError {
    let code = match error {
        RegistryError::Finished(_) => ConnectCode::NotFound,
        RegistryError::AlreadyRunning(_) => ConnectCode::InvalidArgument,
        RegistryError::Full { .. } => ConnectCode::ResourceExhausted,
    };
    ConnectError::new(code, error.to_string())
}

/// Every route this server does not implement: streamed unchanged to Cursor's backend (the
/// user's own credentials travel with it), or — with pass-through off — `unimplemented`.
async fn unknown_route(
    State(state): State<Arc<AppState>>,
    request: Request,
) -> Result<Response, ConnectError> {
    let (Some(client), Some(upstream)) = (&state.upstream, &state.config.upstream) else {
        return Err(ConnectError::new(
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
    let mut headers = connect::end_to_end_headers(&parts.headers);
    crate::auth::service::strip_own_headers(&mut headers);
    let outbound = client
        .request(parts.method.clone(), format!("{}{path}", upstream.url))
        .headers(headers)
        .body(reqwest::Body::wrap_stream(body.into_data_stream()));
    let response = outbound.send().await.map_err(|e| {
        let e = e.without_url();
        tracing::warn!(method = %parts.method, path = %parts.uri.path(), "pass-through failed: {e}");
        ConnectError::new(
            ConnectCode::Unavailable,
            format!(
                "{} could not be forwarded to {}: {}",
                parts.uri.path(),
                upstream.url,
                e
            ),
        )
    })?;
    tracing::debug!(method = %parts.method, path = %parts.uri.path(), status = response.status().as_u16(), "passed through");
    let status = response.status();
    let headers = connect::end_to_end_headers(response.headers());
    let mut reply = Body::from_stream(response.bytes_stream()).into_response();
    *reply.status_mut() = status;
    *reply.headers_mut() = headers;
    Ok(reply)
}

/// The header a Cursor client names its version in (kept with what it sent beyond the schema).
const CLIENT_VERSION_HEADER: &str = "x-cursor-client-version";

/// `POST /aiserver.v1.BidiService/BidiAppend`: one client message for a RunSSE run.
async fn bidi_append_route(
    State(state): State<Arc<AppState>>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ConnectError> {
    bidi_append(&state, (&headers, uri.query()), body, Via::Client).await
}

/// Another node's forward of a client's BidiAppend for a run of this node.
async fn internal_bidi_append(
    State(state): State<Arc<AppState>>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ConnectError> {
    peer(&state, &headers)?;
    bidi_append(&state, (&headers, uri.query()), body, Via::Peer).await
}

/// The cluster this node is part of, if the request carries its secret: internal routes are
/// never served without it.
fn peer<'a>(state: &'a AppState, headers: &HeaderMap) -> Result<&'a Arc<Cluster>, ConnectError> {
    let Some(cluster) = &state.cluster else {
        return Err(ConnectError::new(
            ConnectCode::Unauthenticated,
            "internal cluster route: this node is not part of a cluster",
        ));
    };
    cluster.authorize(headers)?;
    Ok(cluster)
}

/// Where run `request_id` is served: `None` here, or the owner's answer to the forwarded request
/// (`[cluster]`; a single node serves everything here).
async fn place(
    state: &AppState,
    request_id: &str,
    (headers, query): (&HeaderMap, Option<&str>),
    body: &Bytes,
    (via, route): (Via, &str),
) -> Result<Option<Response>, ConnectError> {
    let Some(cluster) = &state.cluster else {
        return Ok(None);
    };
    match cluster
        .place(&state.store, &state.runs, request_id, via)
        .await?
    {
        Placement::Local => Ok(None),
        Placement::Forward { node, url } => {
            let forwarded = cluster
                .forward((&node, &url), route, (headers, query), body.clone())
                .await;
            if forwarded.is_err() {
                cluster.forget_placement(request_id);
            }
            forwarded.map(Some)
        }
    }
}

/// A BidiAppend from a client or (`Via::Peer`) forwarded by another node.
async fn bidi_append(
    state: &Arc<AppState>,
    (headers, query): (&HeaderMap, Option<&str>),
    body: Bytes,
    via: Via,
) -> Result<Response, ConnectError> {
    let append = connect::unary_payload(headers, &body, state.config.max_frame_bytes)
        .map_err(bidi_append::BidiAppendError::from)
        .and_then(|payload| {
            bidi_append::decode_from(&payload, header_str(headers, CLIENT_VERSION_HEADER))
        })
        .map_err(invalid("BidiAppend"))?;
    let route = (via, cluster::INTERNAL_BIDI_APPEND);
    if let Some(forwarded) =
        place(state, &append.request_id, (headers, query), &body, route).await?
    {
        return Ok(forwarded);
    }
    crate::auth::runs::admit_run(state, headers, &append.request_id).await?;
    // From here on the append takes its seqno: a message the run cannot use is the run's to
    // answer (ignore or end with invalid_argument), never a 400 that leaves a gap.
    let mut input = bidi_append::input(append.message);
    bidi_append::link_parent(
        &mut input,
        header_str(headers, "x-parent-request-id"),
        header_str(headers, "x-parent-agent-tool-call-id"),
    );
    let handle = actor::get_or_start(state, &append.request_id, Opener::BidiAppend)
        .await
        .map_err(registry_error)?;
    let (applied, was_applied) = Applied::new();
    let command = RunCommand::Appended {
        seqno: append.seqno,
        input,
        applied,
    };
    // Queued under the run's input gate: once the run has decided to end, this is refused
    // (`not_found`). Answered once the run has applied it — a tool result is then in history, so
    // the 200 survives a crash; an input the run ended before applying is `not_found` too.
    if handle.send_input(command).await.is_err() {
        return Err(registry_error(RegistryError::Finished(append.request_id)));
    }
    match was_applied.await {
        Ok(Ok(())) => Ok(connect::unary_ok(&BidiAppendResponse {})),
        // Refused by the run: a seqno it cannot hold, or it ended with this one still waiting.
        Ok(Err(refused)) => Err(refused),
        Err(_) => Err(registry_error(RegistryError::Finished(append.request_id))),
    }
}

/// `POST /agent.v1.AgentService/RunSSE`: body = one enveloped `BidiRequestId`; the response
/// streams the run's downlink (a reconnecting client gets what the last one did not read).
async fn run_sse_route(
    State(state): State<Arc<AppState>>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ConnectError> {
    run_sse(&state, (&headers, uri.query()), body, Via::Client).await
}

/// Another node's forward of a client's RunSSE (a first one or a reconnect) for a run of this node.
async fn internal_run_sse(
    State(state): State<Arc<AppState>>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ConnectError> {
    peer(&state, &headers)?;
    run_sse(&state, (&headers, uri.query()), body, Via::Peer).await
}

/// A RunSSE from a client or (`Via::Peer`) forwarded by another node. Forwarded, the owner's
/// stream passes through as it comes, the request's headers and query unchanged.
async fn run_sse(
    state: &Arc<AppState>,
    (headers, query): (&HeaderMap, Option<&str>),
    body: Bytes,
    via: Via,
) -> Result<Response, ConnectError> {
    let encoding = Encoding::parse(header_str(headers, "connect-content-encoding"))
        .map_err(|e| ConnectError::new(ConnectCode::InvalidArgument, e.to_string()))?;
    let request = connect::decode_stream_request(&body, encoding, state.config.max_frame_bytes)
        .and_then(|payload| {
            connect::decode_message::<BidiRequestId>(&payload, "aiserver.v1.BidiRequestId")
        })
        .map_err(invalid("RunSSE"))?;
    if request.request_id.trim().is_empty() {
        return Err(invalid("RunSSE")("missing request_id"));
    }
    let route = (via, cluster::INTERNAL_RUN_SSE);
    match place(state, &request.request_id, (headers, query), &body, route).await {
        Ok(Some(forwarded)) => return Ok(forwarded),
        Ok(None) => {}
        // Once the request is understood, a stream route answers with an end-of-stream frame.
        Err(error) => return Ok(StreamError(error).into_response()),
    }
    if let Err(refused) = crate::auth::runs::admit_run(state, headers, &request.request_id).await {
        return Ok(StreamError(refused).into_response());
    }
    Ok(attach_run_sse(state, request.request_id)
        .await
        .into_response())
}

/// Another node's new run took over a conversation whose run is here: stop it (as a new run on
/// this node would) and answer once it ended, or once `interrupt_wait` is over.
async fn internal_stop_run(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ConnectError> {
    peer(&state, &headers)?;
    let stop: cluster::StopRun = serde_json::from_slice(&body).map_err(invalid("StopRun"))?;
    let Some(handle) = state.runs.running(&stop.request_id) else {
        return Err(registry_error(RegistryError::Finished(stop.request_id)));
    };
    tracing::info!(request_id = %stop.request_id, by = %stop.by, "another node took the conversation over: stopping its run here");
    handle.supersede(&stop.by);
    let ended = tokio::time::timeout(state.config.interrupt_wait, handle.done().cancelled())
        .await
        .is_ok();
    Ok(axum::Json(serde_json::json!({ "ended": ended })).into_response())
}

/// The RunSSE stream of run `request_id`, started here if this is its first RunSSE.
async fn attach_run_sse(
    state: &Arc<AppState>,
    request_id: String,
) -> Result<Response, StreamError> {
    let handle = actor::get_or_start(state, &request_id, Opener::RunSse)
        .await
        .map_err(|e| StreamError(registry_error(e)))?;
    let (sink, body) = downlink::downlink_channel(true);
    if handle.send(RunCommand::AttachDownlink(sink)).await.is_err() {
        return Err(StreamError(ConnectError::new(
            ConnectCode::NotFound,
            format!("request {request_id} has already finished"),
        )));
    }
    Ok(downlink::stream_response(body))
}

/// `POST /agent.v1.AgentService/Run`: the HTTP/2 bidi stream. The request body is a stream of
/// `AgentClientMessage` envelopes (never half-closed by CLI clients); the response streams the run's
/// downlink and ends when the run ends.
async fn run_bidi(
    State(state): State<Arc<AppState>>,
    request: Request,
) -> Result<Response, ConnectError> {
    let headers = request.headers();
    let encoding =
        Encoding::parse(header_str(headers, "connect-content-encoding")).map_err(invalid("Run"))?;
    let request_id = header_str(headers, "x-request-id")
        .filter(|id| !id.trim().is_empty())
        .map(str::to_owned)
        .unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
    if let Err(refused) = crate::auth::runs::admit_run(&state, headers, &request_id).await {
        return Ok(StreamError(refused).into_response());
    }
    Ok(start_run_bidi(state, request, encoding, &request_id)
        .await
        .into_response())
}

/// Starts run `request_id` with this stream as its downlink and its request body as its uplink.
async fn start_run_bidi(
    state: Arc<AppState>,
    request: Request,
    encoding: Encoding,
    request_id: &str,
) -> Result<Response, StreamError> {
    let handle = actor::start_new(&state, request_id).map_err(|e| {
        StreamError(ConnectError::new(
            ConnectCode::InvalidArgument,
            e.to_string(),
        ))
    })?;
    let (sink, body) = downlink::downlink_channel(false);
    if handle.send(RunCommand::AttachDownlink(sink)).await.is_err() {
        return Err(StreamError(ConnectError::new(
            ConnectCode::Internal,
            "the run ended before it started",
        )));
    }
    let max = state.config.max_frame_bytes;
    let client_version = header_str(request.headers(), CLIENT_VERSION_HEADER).map(str::to_owned);
    let uplink = Uplink {
        handle,
        encoding,
        max_frame_bytes: max,
        client_version,
    };
    tokio::spawn(forward_uplink(request.into_body(), uplink));
    Ok(downlink::stream_response(body))
}

/// Why the `Run` request stream could not be read: the run ends with it as a protocol error.
#[derive(Debug, thiserror::Error)]
enum UplinkError {
    #[error("{0}")]
    Wire(#[from] WireError),
    #[error("end-of-stream frame in a request stream")]
    EndStream,
    #[error("{0}")]
    Message(#[from] ProtocolError),
    #[error("the run has ended")]
    RunEnded,
}

/// Where a `Run` request stream's messages go and how they are read.
struct Uplink {
    handle: RunHandle,
    encoding: Encoding,
    max_frame_bytes: usize,
    /// The client's version (its `x-cursor-client-version` header), for the drift record.
    client_version: Option<String>,
}

/// Reads the `Run` request stream and hands each message to the run, until the run ends.
async fn forward_uplink(body: Body, uplink: Uplink) {
    let handle = &uplink.handle;
    let mut stream = body.into_data_stream();
    let mut decoder = FrameDecoder::new(uplink.max_frame_bytes);
    let done = handle.done().clone();
    let failure = loop {
        let chunk = tokio::select! {
            _ = done.cancelled() => return,
            chunk = stream.next() => chunk,
        };
        match chunk {
            None => match decoder.finish() {
                // A clean half-close: the run goes on; the response ends when the run does.
                Ok(()) => return,
                Err(e) => break UplinkError::from(e),
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
                if let Err(failure) = drain_frames(&mut decoder, &uplink).await {
                    break failure;
                }
            }
        }
    };
    let _ = handle
        .send(RunCommand::UplinkFailed(ProtocolError::Uplink(
            failure.to_string(),
        )))
        .await;
}

/// Hands every complete frame the decoder holds to the run, in order.
async fn drain_frames(decoder: &mut FrameDecoder, uplink: &Uplink) -> Result<(), UplinkError> {
    while let Some(frame) = decoder.next_frame()? {
        if frame.is_end_stream() {
            return Err(UplinkError::EndStream);
        }
        let payload = connect::payload_of(&frame, uplink.encoding, uplink.max_frame_bytes)?;
        let message: AgentClientMessage =
            connect::decode_message(&payload, "agent.v1.AgentClientMessage")?;
        crate::ops::drift::observe(&payload, uplink.client_version.as_deref());
        let input = bidi_append::input(message);
        if uplink
            .handle
            .send_input(RunCommand::Ordered(input))
            .await
            .is_err()
        {
            return Err(UplinkError::RunEnded);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uplink_failures_keep_their_texts() {
        assert_eq!(
            UplinkError::EndStream.to_string(),
            "end-of-stream frame in a request stream"
        );
        assert_eq!(UplinkError::RunEnded.to_string(), "the run has ended");
        assert_eq!(
            UplinkError::from(WireError::UnknownFlags(0x80)).to_string(),
            WireError::UnknownFlags(0x80).to_string()
        );
        assert_eq!(
            UplinkError::from(ProtocolError::MissingConversationId).to_string(),
            "run_request without conversation_id"
        );
    }

    #[test]
    fn registry_errors_map_to_connect_codes() {
        let finished = registry_error(RegistryError::Finished("r1".to_owned()));
        assert_eq!(finished.code, ConnectCode::NotFound);
        assert_eq!(finished.message, "request r1 has already finished");
        let running = registry_error(RegistryError::AlreadyRunning("r1".to_owned()));
        assert_eq!(running.code, ConnectCode::InvalidArgument);
    }
}
