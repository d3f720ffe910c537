//! The reverse proxy: Cursor talks to it over loopback (HTTP/1.1 or h2c on one port) and it forwards
//! every request unchanged to the upstream (TLS or plain), in the client's own HTTP version, streaming
//! both bodies as their chunks arrive. Each chunk is handed to the recorder as it passes (a `Bytes`
//! clone); nothing here waits on decoding or the database.

use std::convert::Infallible;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt as _;
use http_body_util::combinators::BoxBody;
use http_body_util::{Either, Full};
use hyper::body::Incoming;
use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper::{Request, Response, StatusCode, Uri, Version};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject as _;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::decode::Direction;
use crate::record::Recorder;
use crate::wire::{FLAG_END_STREAM, Framing};

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
pub type ProxyResponse = Response<BoxBody<Bytes, BoxError>>;
type ForwardBody = Either<TeeBody<Incoming>, Full<Bytes>>;
type Upstream = Client<HttpsConnector<HttpConnector>, ForwardBody>;

/// HTTP/1.1 request bodies that declare at most this length are read whole before forwarding.
const WHOLE_REQUEST_BYTES: u64 = 1024 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("upstream {0:?} is not an http:// or https:// URL")]
    UpstreamUrl(String),
    #[error("TLS setup: {0}")]
    Tls(String),
}

/// Where requests go and how.
pub struct Proxy {
    base: Uri,
    /// The upstream as given, for messages.
    shown: String,
    http1: Upstream,
    http2: Upstream,
    recorder: Recorder,
}

impl Proxy {
    pub fn new(
        upstream: &str,
        upstream_ca: Option<&Path>,
        recorder: Recorder,
    ) -> Result<Proxy, ProxyError> {
        let base: Uri = upstream
            .trim_end_matches('/')
            .parse()
            .map_err(|_| ProxyError::UpstreamUrl(upstream.to_owned()))?;
        if !matches!(base.scheme_str(), Some("http" | "https")) || base.authority().is_none() {
            return Err(ProxyError::UpstreamUrl(upstream.to_owned()));
        }
        let tls = tls_config(upstream_ca)?;
        let http1 = Client::builder(TokioExecutor::new()).build(connector(tls.clone(), false));
        let http2 = Client::builder(TokioExecutor::new())
            .http2_only(true)
            .timer(TokioTimer::new())
            .http2_keep_alive_interval(Some(Duration::from_secs(20)))
            .build(connector(tls, true));
        Ok(Proxy {
            base,
            shown: upstream.to_owned(),
            http1,
            http2,
            recorder,
        })
    }

    /// Forwards one request and tees both bodies into the recorder.
    pub async fn handle(
        self: Arc<Self>,
        request: Request<Incoming>,
    ) -> Result<ProxyResponse, Infallible> {
        let (mut parts, body) = request.into_parts();
        let path_and_query = parts
            .uri
            .path_and_query()
            .map(|p| p.as_str().to_owned())
            .unwrap_or_else(|| "/".to_owned());
        let id = self.recorder.open(
            parts.method.as_str(),
            parts.uri.path(),
            &format!("{:?}", parts.version),
            &parts.headers,
        );
        let content_type = parts
            .headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        parts.uri = match self.upstream_uri(&path_and_query) {
            Ok(uri) => uri,
            Err(reason) => return Ok(self.failed(id, content_type.as_deref(), reason)),
        };
        strip_hop_by_hop(&mut parts.headers);
        parts.headers.remove(header::HOST);
        let version = parts.version;
        let client = if version == Version::HTTP_2 {
            &self.http2
        } else {
            &self.http1
        };
        // The client picks the upstream's version by its own: h2 in, h2 out; HTTP/1.1 in, HTTP/1.1 out.
        parts.version = Version::default();
        let body = match self.forward_body(id, version, body).await {
            Ok(body) => body,
            Err(reason) => return Ok(self.failed(id, content_type.as_deref(), reason)),
        };
        match client.request(Request::from_parts(parts, body)).await {
            Ok(response) => {
                let (mut parts, body) = response.into_parts();
                self.recorder
                    .response(id, parts.status.as_u16(), &parts.headers);
                strip_hop_by_hop(&mut parts.headers);
                let body =
                    TeeBody::new(body, Tap::new(self.recorder.clone(), id, Direction::Server));
                Ok(Response::from_parts(
                    parts,
                    body.map_err(BoxError::from).boxed(),
                ))
            }
            Err(error) => {
                let reason = format!("upstream {} unreachable: {}", self.shown, chain(&error));
                tracing::warn!(exchange = id, %reason, "forwarding failed");
                Ok(self.failed(id, content_type.as_deref(), reason))
            }
        }
    }

    /// The request body to forward. Over HTTP/1.1, Cursor's requests are whole messages (unary calls,
    /// RunSSE's request), so a body of a small declared length is read first: it is then recorded, and
    /// its run known, even when the upstream cannot be reached. Anything else streams as it arrives.
    async fn forward_body(
        &self,
        id: i64,
        version: Version,
        body: Incoming,
    ) -> Result<ForwardBody, String> {
        let tap = Tap::new(self.recorder.clone(), id, Direction::Client);
        let small = body
            .size_hint()
            .exact()
            .is_some_and(|n| n <= WHOLE_REQUEST_BYTES);
        if version == Version::HTTP_2 || !small {
            return Ok(Either::Left(TeeBody::new(body, tap)));
        }
        let mut tee = TeeBody::new(body, tap);
        let mut whole = bytes::BytesMut::new();
        while let Some(frame) = tee.frame().await {
            let frame = frame.map_err(|e| format!("reading the request body: {e}"))?;
            if let Ok(data) = frame.into_data() {
                whole.extend_from_slice(&data);
            }
        }
        Ok(Either::Right(Full::new(whole.freeze())))
    }

    fn upstream_uri(&self, path_and_query: &str) -> Result<Uri, String> {
        let prefix = self.base.path().trim_end_matches('/');
        let scheme = self.base.scheme_str().unwrap_or("https");
        let authority = self.base.authority().map(|a| a.as_str()).unwrap_or("");
        format!("{scheme}://{authority}{prefix}{path_and_query}")
            .parse()
            .map_err(|e| format!("cannot build the upstream URL for {path_and_query}: {e}"))
    }

    /// The answer when the upstream cannot be reached: a Connect error Cursor shows as one (an
    /// end-of-stream error on a stream, a 502 JSON error otherwise), and the reason recorded.
    fn failed(&self, id: i64, content_type: Option<&str>, reason: String) -> ProxyResponse {
        let message = format!("cursor-backend: {reason}");
        self.recorder.upstream_failed(id, reason);
        let error = serde_json::json!({"code": "unavailable", "message": message});
        let (status, content_type, body) = match Framing::of(content_type) {
            Framing::Envelopes { json } => {
                let payload = serde_json::json!({ "error": error }).to_string();
                let mut frame = vec![FLAG_END_STREAM];
                frame.extend_from_slice(&(payload.len() as u32).to_be_bytes());
                frame.extend_from_slice(payload.as_bytes());
                let ct = if json {
                    "application/connect+json"
                } else {
                    "application/connect+proto"
                };
                (StatusCode::OK, ct, frame)
            }
            _ => (
                StatusCode::BAD_GATEWAY,
                "application/json",
                error.to_string().into_bytes(),
            ),
        };
        let mut response = Response::new(
            Full::new(Bytes::from(body))
                .map_err(|never| match never {})
                .boxed(),
        );
        *response.status_mut() = status;
        response
            .headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
        response
    }
}

/// The TLS client configuration: the system's root certificates, plus those in `extra_ca` (a
/// corporate TLS-inspecting proxy's, or a self-signed upstream's).
pub fn tls_config(extra_ca: Option<&Path>) -> Result<rustls::ClientConfig, ProxyError> {
    let mut roots = rustls::RootCertStore::empty();
    let native = rustls_native_certs::load_native_certs();
    for error in &native.errors {
        tracing::warn!(%error, "a system root certificate could not be read");
    }
    roots.add_parsable_certificates(native.certs);
    if let Some(path) = extra_ca {
        let shown = path.display();
        let certs = CertificateDer::pem_file_iter(path)
            .map_err(|e| ProxyError::Tls(format!("{shown}: {e}")))?;
        let mut added = 0;
        for cert in certs {
            let cert = cert.map_err(|e| ProxyError::Tls(format!("{shown}: {e}")))?;
            roots
                .add(cert)
                .map_err(|e| ProxyError::Tls(format!("{shown}: {e}")))?;
            added += 1;
        }
        if added == 0 {
            return Err(ProxyError::Tls(format!(
                "{shown}: no PEM certificate in it"
            )));
        }
    }
    if roots.is_empty() {
        // Plain-HTTP upstreams (this project's server) still work; TLS ones will say why not.
        tracing::warn!(
            "no root certificates: TLS upstreams cannot be verified (see --upstream-ca)"
        );
    }
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| ProxyError::Tls(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

/// The upstream connector of one HTTP version: h2 is asked for by ALPN; HTTP/1.1 offers no ALPN,
/// which TLS servers take as HTTP/1.1.
fn connector(tls: rustls::ClientConfig, http2: bool) -> HttpsConnector<HttpConnector> {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(Some(Duration::from_secs(10)));
    let builder = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http();
    if http2 {
        builder.enable_http2().wrap_connector(http)
    } else {
        builder.enable_http1().wrap_connector(http)
    }
}

/// The error and its sources, for a message a person can act on.
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// Headers that belong to one connection, not to the message.
fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in [
        "connection",
        "keep-alive",
        "proxy-connection",
        "transfer-encoding",
        "upgrade",
        "te",
    ] {
        headers.remove(name);
    }
}

/// Accepts connections until `shutdown`; each speaks HTTP/1.1 or h2c (prior knowledge), detected.
pub async fn serve(listener: TcpListener, proxy: Arc<Proxy>, shutdown: CancellationToken) {
    loop {
        let (stream, peer) = tokio::select! {
            _ = shutdown.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    tracing::warn!(%error, "accept failed");
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let proxy = proxy.clone();
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request| proxy.clone().handle(request));
            let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            let connection = builder.serve_connection(TokioIo::new(stream), service);
            tokio::select! {
                result = connection => if let Err(error) = result {
                    tracing::debug!(%peer, error = %chain(&*error), "connection ended with an error");
                },
                _ = shutdown.cancelled() => {}
            }
        });
    }
}

/// Reports one body's chunks and its end to the recorder.
struct Tap {
    recorder: Recorder,
    id: i64,
    direction: Direction,
    ended: bool,
}

impl Tap {
    fn new(recorder: Recorder, id: i64, direction: Direction) -> Tap {
        Tap {
            recorder,
            id,
            direction,
            ended: false,
        }
    }

    fn end(&mut self, cut: Option<String>) {
        if !self.ended {
            self.ended = true;
            self.recorder.end(self.id, self.direction, cut);
        }
    }
}

impl Drop for Tap {
    fn drop(&mut self) {
        self.end(Some("the body was dropped before its end".to_owned()));
    }
}

/// A body forwarded frame by frame, each data frame also handed to the tap.
pub struct TeeBody<B> {
    inner: B,
    tap: Tap,
}

impl<B: Body> TeeBody<B> {
    fn new(inner: B, mut tap: Tap) -> TeeBody<B> {
        // An empty body (a GET) may never be polled: it has ended already.
        if inner.is_end_stream() {
            tap.end(None);
        }
        TeeBody { inner, tap }
    }
}

impl<B> Body for TeeBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Display,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        match ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    this.tap
                        .recorder
                        .chunk(this.tap.id, this.tap.direction, data.clone());
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Some(Err(error)) => {
                this.tap.end(Some(error.to_string()));
                Poll::Ready(Some(Err(error)))
            }
            None => {
                this.tap.end(None);
                Poll::Ready(None)
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
