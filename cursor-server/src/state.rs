//! The services every route and every run shares, read-only (run state lives in actors): the
//! configuration, the store, the HTTP clients, each provider's key pool (whose load and cooldowns
//! every run shares), the validated prompts, the run registry and the shutdown signal. `app.rs`
//! assembles them.
//!
//! Its own file because `app.rs` also serves the routes (it imports `wire/handlers.rs`), and the
//! routes and the runs import these services: kept in `app.rs`, they would make every layer import
//! the file that imports it.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::cluster::Cluster;
use crate::config::Config;
use crate::prompting::assets::PromptAssets;
use crate::provider::keys::KeyPools;
use crate::run::registry::RunRegistry;
use crate::store::Store;

/// Everything a request handler or run actor needs, shared read-only (run state lives in actors).
pub struct AppState {
    pub config: Arc<Config>,
    pub store: Store,
    /// The single HTTP client for every provider call (connection pooling, TLS sessions).
    pub http: reqwest::Client,
    /// Each provider's keys: which is in use and which is cooling down, shared by every run.
    pub keys: KeyPools,
    /// The client for pass-through to Cursor's backend (its own proxy setting, no redirects
    /// followed, bodies never decoded), when pass-through is on.
    pub upstream: Option<reqwest::Client>,
    pub runs: RunRegistry,
    /// Every mode's system prompt, tools and reminders, validated once at start-up.
    pub prompts: PromptAssets,
    /// Fires on shutdown: runs end `canceled`, the server stops accepting.
    pub shutdown: CancellationToken,
    /// This node among others on the same database (`[cluster]`); `None`: a single node.
    pub cluster: Option<Arc<Cluster>>,
    /// `[auth]`: who is asking, and whose each run is (`None`: single-user, as before).
    pub auth: Option<crate::auth::service::Auth>,
    /// Each recent conversation's history and fold, so a run start reads and folds only what is
    /// new.
    pub history: crate::sync::history::HistoryCache,
}
