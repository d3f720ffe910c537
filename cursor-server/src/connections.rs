//! Accepted connections and their bounds: HTTP/1.1 and h2c (prior knowledge) on one port, each
//! connection served on its own task with a first-byte and header-read timeout, a deadline for
//! request bodies (except the bidi `Run` stream, whose body is the session), HTTP/2 keep-alive
//! pings, and an idle timeout that closes a connection with no request in flight — so slow or
//! silent clients cannot hold descriptors and memory for ever. Counts open connections.
//!
//! Its own file because `app.rs` wires the services together; how one connection is served and
//! bounded is a policy of its own that would double it.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt as _;

use crate::config::ConnectionLimits;
use crate::cursor::proto::agent::agent_service_routes;
use crate::ops::metrics;

/// Serves one accepted connection until the client closes it, it breaks a bound, or the server
/// shuts down (then in-flight requests finish and the connection closes).
pub async fn serve(
    tcp: TcpStream,
    router: Router,
    limits: ConnectionLimits,
    shutdown: CancellationToken,
) {
    let _open = OpenConnection::new();
    // A client that connects and sends nothing is never handed to the protocol detection (which
    // would wait for its first bytes for ever).
    let mut first = [0u8; 1];
    match tokio::time::timeout(limits.header_read_timeout, tcp.peek(&mut first)).await {
        Ok(Ok(n)) if n > 0 => {}
        Ok(_) => return,
        Err(_) => {
            tracing::debug!("closed a connection that sent nothing");
            return;
        }
    }
    // The peer's address, for `[auth]` trusted_header (which believes only configured proxies).
    let peer = tcp.peer_addr().ok();
    let (in_flight, watch_in_flight) = watch::channel(0usize);
    let body_deadline = limits.request_body_timeout;
    let service = hyper::service::service_fn(move |mut request: hyper::Request<Incoming>| {
        if let Some(peer) = peer {
            request
                .extensions_mut()
                .insert(axum::extract::ConnectInfo(peer));
        }
        let guard = InFlight::begin(&in_flight);
        let router = router.clone();
        let bounded = request.uri().path() != agent_service_routes::RUN;
        let request = request.map(|body| {
            if bounded {
                Body::new(Deadline::new(body, body_deadline))
            } else {
                Body::new(body)
            }
        });
        async move {
            let response = router.oneshot(request).await?;
            Ok::<_, Infallible>(response.map(|body| {
                Body::new(Guarded {
                    inner: body,
                    _guard: guard,
                })
            }))
        }
    });
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .keep_alive(true);
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(Some(limits.h2_ping_interval))
        .keep_alive_timeout(limits.h2_ping_timeout);
    let connection = builder.serve_connection(TokioIo::new(tcp), service);
    tokio::pin!(connection);
    let idle = idle_for(watch_in_flight, limits.idle_timeout);
    tokio::pin!(idle);
    let mut closing = false;
    loop {
        tokio::select! {
            result = connection.as_mut() => {
                if let Err(e) = result {
                    tracing::debug!("connection ended: {e}");
                }
                return;
            }
            _ = shutdown.cancelled(), if !closing => {
                closing = true;
                connection.as_mut().graceful_shutdown();
            }
            _ = &mut idle, if !closing => {
                tracing::debug!(idle_secs = limits.idle_timeout.as_secs(), "closing an idle connection");
                closing = true;
                connection.as_mut().graceful_shutdown();
            }
        }
    }
}

/// Resolves once no request has been in flight for `limit`.
async fn idle_for(mut in_flight: watch::Receiver<usize>, limit: Duration) {
    loop {
        if in_flight.wait_for(|n| *n == 0).await.is_err() {
            return;
        }
        match tokio::time::timeout(limit, in_flight.wait_for(|n| *n > 0)).await {
            Err(_) => return,
            Ok(Err(_)) => return,
            Ok(Ok(_)) => {}
        }
    }
}

/// Counts an open connection in the metrics for as long as it lives.
struct OpenConnection;

impl OpenConnection {
    fn new() -> Self {
        metrics::connection_opened();
        OpenConnection
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        metrics::connection_closed();
    }
}

/// One request in flight on a connection, from its arrival until its response body is done.
struct InFlight(watch::Sender<usize>);

impl InFlight {
    fn begin(count: &watch::Sender<usize>) -> Self {
        count.send_modify(|n| *n += 1);
        InFlight(count.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n = n.saturating_sub(1));
    }
}

/// A response body that keeps its request counted as in flight until it is dropped.
struct Guarded {
    inner: Body,
    _guard: InFlight,
}

impl HttpBody for Guarded {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A request body that must arrive whole within its deadline: a client trickling a unary body
/// (a BidiAppend, a RunSSE request) gets an error instead of holding the request open.
struct Deadline {
    inner: Incoming,
    limit: Duration,
    sleep: Pin<Box<tokio::time::Sleep>>,
}

impl Deadline {
    fn new(inner: Incoming, limit: Duration) -> Self {
        Deadline {
            inner,
            limit,
            sleep: Box::pin(tokio::time::sleep(limit)),
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive within {0} s")]
struct BodyTooSlow(u64);

impl HttpBody for Deadline {
    type Data = Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::BoxError>>> {
        if let Poll::Ready(frame) = Pin::new(&mut self.inner).poll_frame(cx) {
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        if self.sleep.as_mut().poll(cx).is_ready() {
            let secs = self.limit.as_secs();
            return Poll::Ready(Some(Err(Box::new(BodyTooSlow(secs)))));
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
