//! Wiring: opens the store, builds the one shared HTTP client, binds the listener and serves the
//! router (HTTP/1.1 and h2c prior knowledge on one port) until the shutdown token fires.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::cluster::{Cluster, lease};
use crate::config::Config;
use crate::connections;
use crate::console;
use crate::error::ServerError;
use crate::ops;
use crate::prompting::assets::{AssetError, PromptAssets, PromptKind};
use crate::run::registry::RunRegistry;
use crate::state::AppState;
use crate::store::{Store, runs};
use crate::tools::ToolKind;
use crate::wire::handlers;

pub struct App {
    state: Arc<AppState>,
    listener: TcpListener,
}

impl App {
    /// Opens the database (running migrations) and binds the configured address.
    pub async fn bind(config: Config) -> Result<App, ServerError> {
        let prompts = match &config.prompt_dir {
            Some(dir) => PromptAssets::from_dir(dir),
            None => PromptAssets::embedded(),
        }
        .and_then(|assets| {
            check_prompt_tools(&assets)?;
            Ok(assets)
        })
        .map_err(|e| ServerError::Assets(e.to_string()))?;
        ops::metrics::install();
        let pool = crate::store::PoolSettings {
            max_connections: config.database_max_connections,
            acquire_timeout: config.database_acquire_timeout,
        };
        let store = Store::open_with(&config.database_url, pool).await?;
        let cluster = match &config.cluster {
            Some(settings) => Some(Arc::new(
                Cluster::new(settings.clone()).map_err(ServerError::HttpClient)?,
            )),
            None => None,
        };
        // A node of a cluster ends only the runs it left itself: the others' are theirs.
        let orphans = match &cluster {
            Some(cluster) => {
                lease::join(&store, cluster)
                    .await
                    .map_err(|e| ServerError::Join(e.to_string()))?;
                0
            }
            None => runs::reconcile_interrupted(&store).await?,
        };
        if orphans > 0 {
            tracing::warn!(
                runs = orphans,
                "runs a previous process left running were marked failed (the server stopped while they ran)"
            );
        }
        let http = crate::provider::http_client(&config)
            .map_err(|e| ServerError::HttpClient(e.to_string()))?;
        let upstream = match &config.upstream {
            None => None,
            Some(upstream) => {
                let mut builder = reqwest::Client::builder()
                    .connect_timeout(config.provider_connect_timeout)
                    .redirect(reqwest::redirect::Policy::none());
                if let Some(proxy) = &upstream.proxy {
                    // The proxy URL may carry credentials: it is never printed.
                    builder = builder.proxy(reqwest::Proxy::all(proxy).map_err(|e| {
                        ServerError::HttpClient(format!(
                            "upstream_proxy is not a usable proxy URL: {e}"
                        ))
                    })?);
                }
                Some(
                    builder
                        .build()
                        .map_err(|e| ServerError::HttpClient(e.to_string()))?,
                )
            }
        };
        let listener =
            TcpListener::bind(config.listen)
                .await
                .map_err(|source| ServerError::Bind {
                    addr: config.listen.to_string(),
                    source,
                })?;
        let auth = config.auth.clone().map(crate::auth::service::Auth::new);
        if let Some(auth) = &auth {
            auth.seed(&store).await?;
            tracing::info!(
                mode = auth.config.mode.name(),
                "[auth]: every request is tied to a person"
            );
        }
        let runs = RunRegistry::new(config.max_runs, config.max_unattached_runs);
        let state = Arc::new(AppState {
            keys: crate::provider::keys::KeyPools::new(&config),
            config: Arc::new(config),
            store,
            http,
            upstream,
            runs,
            prompts,
            shutdown: CancellationToken::new(),
            cluster,
            auth,
            history: Default::default(),
        });
        if state.cluster.is_none() && state.auth.is_none() {
            state.history.begin_learning();
            tokio::spawn(learn_stored_conversations(Arc::clone(&state)));
        }
        Ok(App { state, listener })
    }

    pub fn local_addr(&self) -> Result<SocketAddr, ServerError> {
        self.listener.local_addr().map_err(ServerError::Serve)
    }

    pub fn state(&self) -> &Arc<AppState> {
        &self.state
    }

    /// Cancel this token to stop the server gracefully.
    pub fn shutdown_token(&self) -> CancellationToken {
        self.state.shutdown.clone()
    }

    /// Serves until shutdown, then waits for open connections to finish and closes the store.
    pub async fn serve(self) -> Result<(), ServerError> {
        tokio::spawn(lease::keep(Arc::clone(&self.state)));
        tokio::spawn(checkpoint_in_background(Arc::clone(&self.state)));
        // The operator's routes are merged before the Cursor routes' pass-through fallback, so they
        // are always answered here.
        // `[auth]`: the identity layer goes in front of the console's and the Cursor routes (not
        // their pass-through fallback, nor health and metrics).
        let identity = || {
            axum::middleware::from_fn_with_state(
                Arc::clone(&self.state),
                crate::auth::identify::layer,
            )
        };
        let router = ops::router(Arc::clone(&self.state))
            .merge(console::router(Arc::clone(&self.state)).route_layer(identity()))
            .merge(handlers::router(Arc::clone(&self.state)).route_layer(identity()));
        let shutdown = self.state.shutdown.clone();
        let limits = self.state.config.connections;
        // Every connection's task is tracked: shutdown waits for their in-flight requests.
        let connections = tokio_util::task::TaskTracker::new();
        let result = loop {
            let (tcp, _) = tokio::select! {
                _ = shutdown.cancelled() => break Ok(()),
                accepted = self.listener.accept() => match accepted {
                    Ok(accepted) => accepted,
                    Err(e) if is_fatal_accept_error(&e) => break Err(ServerError::Serve(e)),
                    Err(e) => {
                        // Out of descriptors (EMFILE) and the like: wait for some to close.
                        tracing::warn!("accepting a connection failed: {e}");
                        tokio::time::sleep(ACCEPT_BACKOFF).await;
                        continue;
                    }
                },
            };
            // Every accepted connection sends its frames at once: with Nagle's algorithm on, a
            // small frame written while the previous one is unacknowledged waits for the client's
            // delayed ACK (40 ms per HTTP/2 turn, measured; issue 15).
            if let Err(e) = tcp.set_nodelay(true) {
                tracing::warn!("could not set TCP_NODELAY on an accepted connection: {e}");
            }
            connections.spawn(connections::serve(
                tcp,
                router.clone(),
                limits,
                shutdown.clone(),
            ));
        };
        connections.close();
        connections.wait().await;
        // Runs end `canceled` on shutdown (or have just ended); each records its ending after its
        // end-of-stream frame, so the store closes only once they have.
        if !self.state.runs.wind_down(RUNS_GRACE).await {
            tracing::warn!(
                "runs still recording their endings after {RUNS_GRACE:?}; closing the store"
            );
        }
        if let Some(cluster) = &self.state.cluster {
            lease::leave(&self.state.store, cluster).await;
        }
        self.state.store.close().await;
        result
    }
}

/// How long a shutdown waits for runs to record their endings.
const RUNS_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

/// How long the accept loop waits after a failed accept (out of descriptors) before trying again.
const ACCEPT_BACKOFF: std::time::Duration = std::time::Duration::from_millis(50);

/// Errors of `accept` that will not go away by waiting.
fn is_fatal_accept_error(error: &std::io::Error) -> bool {
    matches!(
        error.kind(),
        std::io::ErrorKind::InvalidInput | std::io::ErrorKind::PermissionDenied
    )
}

/// Checkpoints SQLite's WAL every `CHECKPOINT_EVERY` until shutdown, off every request's path
/// (closing the store at shutdown checkpoints what is left); a store with nothing to checkpoint
/// (PostgreSQL) ends it at the first tick.
async fn checkpoint_in_background(state: Arc<AppState>) {
    let mut tick = tokio::time::interval(crate::store::CHECKPOINT_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = state.shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        match state.store.checkpoint().await {
            Ok(Some(_)) => {}
            Ok(None) => return,
            Err(e) => tracing::warn!("checkpointing the database: {e}"),
        }
    }
}

/// Reads which conversations the store has a row of, so that a run start of one it has none of
/// reads nothing (`HistoryCache::surely_new`): only where this node is the store's one writer (no
/// `[cluster]`) and a run may take a conversation as new (no `[auth]`, `RunActor::read_ahead`).
/// In the background: until it is done, or if it fails, every run start reads the store.
async fn learn_stored_conversations(state: Arc<AppState>) {
    match state.history.learn_stored(&state.store).await {
        Ok(conversations) => {
            tracing::debug!(conversations, "the stored conversations are known")
        }
        Err(e) => tracing::warn!(
            "listing the stored conversations failed (every run start reads the store): {e}"
        ),
    }
}

/// Checks every prompt set's `tools.json` against the tool registry: each tool is one this server
/// implements, with exactly the arguments it validates. Done here, at start-up, where the assets
/// and the registry are both visible (neither imports the other).
pub fn check_prompt_tools(assets: &PromptAssets) -> Result<(), AssetError> {
    for kind in PromptKind::ALL {
        let path = format!("{}/tools.json", kind.dir());
        for tool in &assets.set(kind).tools {
            check_tool(&path, tool)?;
        }
    }
    Ok(())
}

fn check_tool(path: &str, tool: &serde_json::Value) -> Result<(), AssetError> {
    use std::collections::BTreeSet;
    let invalid = |message: String| AssetError::Invalid {
        path: path.to_owned(),
        message,
    };
    let function = &tool["function"];
    let name = function["name"].as_str().unwrap_or_default();
    let kind = ToolKind::from_name(name)
        .ok_or_else(|| invalid(format!("{name} is not a tool this server implements")))?;
    let parameters = &function["parameters"];
    let properties: BTreeSet<&str> = parameters["properties"]
        .as_object()
        .map(|p| p.keys().map(String::as_str).collect())
        .unwrap_or_default();
    let required: BTreeSet<&str> = parameters["required"]
        .as_array()
        .map(|r| r.iter().filter_map(serde_json::Value::as_str).collect())
        .unwrap_or_default();
    let accepted: BTreeSet<&str> = kind.arguments().iter().map(|(n, _)| *n).collect();
    let must: BTreeSet<&str> = kind
        .arguments()
        .iter()
        .filter(|(_, required)| *required)
        .map(|(n, _)| *n)
        .collect();
    if properties != accepted {
        return Err(invalid(format!(
            "{name}: parameters {properties:?} differ from the arguments the server accepts {accepted:?}"
        )));
    }
    if required != must {
        return Err(invalid(format!(
            "{name}: required {required:?} differs from what the server requires {must:?}"
        )));
    }
    Ok(())
}
