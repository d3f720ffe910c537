//! cursor-backend: a protocol capture debugger for Cursor. A reverse proxy that Cursor talks to over
//! loopback (`CURSOR_API_ENDPOINT` / `CURSOR_API_BASE_URL`), forwarding to Cursor's backend or to
//! `cursor-server`, recording every Connect frame of both directions into SQLite, decoded with the schema
//! loaded at run time, with a UI on a second port and `diff` to compare two captured runs.
//!
//! Modules in dependency order: `wire` (bytes → envelopes) → `schema` (descriptors, protobuf → JSON) →
//! `decode` (frames of a route) → `store` (captures.db) → `record` (the recording task) → `proxy`
//! (forwarding) → `ui` (pages and API) and `diff` (comparison); this file wires them together.

pub mod decode;
pub mod diff;
pub mod proxy;
pub mod record;
pub mod schema;
pub mod store;
pub mod ui;
pub mod wire;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::record::Recorder;
use crate::schema::Schema;
use crate::store::Captures;

/// Cursor's official backend, the default upstream.
pub const DEFAULT_UPSTREAM: &str = "https://api2.cursor.sh";

/// How to run the debugger.
#[derive(Debug, Clone)]
pub struct Options {
    pub listen: SocketAddr,
    pub ui: SocketAddr,
    pub upstream: String,
    /// Extra root certificates (PEM) for a TLS upstream.
    pub upstream_ca: Option<PathBuf>,
    pub db: PathBuf,
    /// `None`: frames are kept raw, each with the reason.
    pub schema: Option<Schema>,
}

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Store(#[from] store::StoreError),
    #[error(transparent)]
    Proxy(#[from] proxy::ProxyError),
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

/// A running debugger.
pub struct Debugger {
    pub proxy_addr: SocketAddr,
    pub ui_addr: SocketAddr,
    pub captures: Captures,
    recorder: Recorder,
    shutdown: CancellationToken,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// A listener on `addr` and the address it got (a port 0 becomes the one assigned).
async fn bind(addr: SocketAddr) -> Result<(TcpListener, SocketAddr), StartError> {
    let error = |source| StartError::Listen { addr, source };
    let listener = TcpListener::bind(addr).await.map_err(error)?;
    let bound = listener.local_addr().map_err(error)?;
    Ok((listener, bound))
}

impl Debugger {
    pub async fn start(options: Options) -> Result<Debugger, StartError> {
        let captures = Captures::open(&options.db).await?;
        let schema_origin = options
            .schema
            .as_ref()
            .map(|s| s.origin.clone())
            .unwrap_or_else(|| "no schema (frames kept raw)".to_owned());
        let (recorder, recording) = Recorder::start(
            captures.clone(),
            options.schema,
            captures.next_exchange_id().await?,
        );
        let proxy = Arc::new(proxy::Proxy::new(
            &options.upstream,
            options.upstream_ca.as_deref(),
            recorder.clone(),
        )?);
        let (proxy_listener, proxy_addr) = bind(options.listen).await?;
        let (ui_listener, ui_addr) = bind(options.ui).await?;
        let shutdown = CancellationToken::new();
        let ui = ui::router(ui::UiState {
            captures: captures.clone(),
            upstream: options.upstream.clone(),
            schema: schema_origin,
            written: recorder.written(),
            shutdown: shutdown.clone(),
        });
        let ui_shutdown = shutdown.clone();
        let tasks = vec![
            tokio::spawn(proxy::serve(proxy_listener, proxy, shutdown.clone())),
            tokio::spawn(async move {
                let served = axum::serve(ui_listener, ui)
                    .with_graceful_shutdown(async move { ui_shutdown.cancelled().await })
                    .await;
                if let Err(error) = served {
                    tracing::error!(%error, "the UI stopped");
                }
            }),
            recording,
        ];
        Ok(Debugger {
            proxy_addr,
            ui_addr,
            captures,
            recorder,
            shutdown,
            tasks,
        })
    }

    /// Waits until everything that has passed so far is in the database.
    pub async fn flush(&self) {
        self.recorder.flush().await;
    }

    /// Stops accepting, records what is still queued and returns.
    pub async fn shutdown(self) {
        self.recorder.flush().await;
        self.shutdown.cancel();
        let Debugger {
            tasks, recorder, ..
        } = self;
        drop(recorder);
        // The recording task ends once the last connection's handles are gone; the listeners now.
        for task in tasks.into_iter().take(2) {
            let _ = task.await;
        }
    }
}
