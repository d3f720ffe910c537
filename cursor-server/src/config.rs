//! Server configuration: a TOML file plus environment overrides, validated once at start-up.
//!
//! Everything a run needs to know about providers (endpoint, key, models) is resolved here, so a bad
//! config fails the start with a precise message instead of failing the first user turn.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub mod auth;
pub mod cluster;
mod file;
mod routing;

pub use routing::{Alias, RouteRequest, Routed, RoutedBy, Routing};

pub const DEFAULT_CONFIG_PATH: &str = "cursor-byok.toml";
pub const DEFAULT_LISTEN: &str = "127.0.0.1:3000";
pub const DEFAULT_DATABASE_URL: &str = "sqlite://cursor-byok.db";
/// Largest Connect frame (and unary body) accepted from a client, in bytes.
pub const DEFAULT_MAX_FRAME_BYTES: usize = 16 * 1024 * 1024;
pub const DEFAULT_PROVIDER_IDLE_TIMEOUT_SECS: u64 = 120;
pub const DEFAULT_PROVIDER_CONNECT_TIMEOUT_SECS: u64 = 30;
pub const DEFAULT_RUN_REQUEST_TIMEOUT_SECS: u64 = 60;
pub const DEFAULT_TOOL_OUTPUT_MAX_BYTES: usize = 30_000;
pub const DEFAULT_COMPACT_AT_PERCENT: u8 = 85;
pub const DEFAULT_WEB_SEARCH_RESULTS: u32 = 5;
pub const DEFAULT_RECONNECT_GRACE_MS: u64 = 10_000;
pub const DEFAULT_INTERRUPT_WAIT_MS: u64 = 5_000;
/// PostgreSQL connections one process keeps open at most.
pub const DEFAULT_DATABASE_MAX_CONNECTIONS: u32 = 16;
/// How long a statement waits for a PostgreSQL connection before it fails as unavailable.
pub const DEFAULT_DATABASE_ACQUIRE_TIMEOUT_MS: u64 = 5_000;
/// Cursor's official backend, where routes this server does not implement are forwarded.
pub const DEFAULT_UPSTREAM_URL: &str = "https://api2.cursor.sh";
pub const DEFAULT_CLIENT_IDLE_TIMEOUT_SECS: u64 = 600;
pub const DEFAULT_PROVIDER_MAX_ATTEMPTS: u32 = 3;
pub const DEFAULT_HEARTBEAT_INTERVAL_MS: u64 = 5_000;
pub const DEFAULT_CHECKPOINT_ACK_TIMEOUT_MS: u64 = 10_000;
pub const DEFAULT_KV_RETRY_AFTER_MS: u64 = 5_000;
pub const DEFAULT_PROVIDER_RETRY_BASE_DELAY_MS: u64 = 500;
pub const DEFAULT_HEADER_READ_TIMEOUT_SECS: u64 = 30;
pub const DEFAULT_REQUEST_BODY_TIMEOUT_SECS: u64 = 60;
pub const DEFAULT_CONNECTION_IDLE_TIMEOUT_SECS: u64 = 300;
pub const DEFAULT_H2_PING_INTERVAL_SECS: u64 = 30;
pub const DEFAULT_H2_PING_TIMEOUT_SECS: u64 = 20;
pub const DEFAULT_MAX_RUNS: usize = 1024;
pub const DEFAULT_MAX_UNATTACHED_RUNS: usize = 64;
/// How long a BidiAppend whose new run is past `max_unattached_runs` waits for a place (its own
/// RunSSE arriving, or another run's) before it is refused.
pub const DEFAULT_UNATTACHED_WAIT_MS: u64 = 10_000;
/// How long a key that got HTTP 429 without `retry-after` is left out of the key choice.
pub const DEFAULT_KEY_COOLDOWN_SECS: u64 = 60;
/// How long a key the provider refused (HTTP 401) is left out of the key choice.
pub const DEFAULT_KEY_REFUSED_COOLDOWN_SECS: u64 = 300;

/// Environment variables that override the file (handy for containers and tests).
pub const ENV_LISTEN: &str = "CURSOR_BYOK_LISTEN";
pub const ENV_DATABASE_URL: &str = "CURSOR_BYOK_DATABASE_URL";
pub const ENV_DEFAULT_MODEL: &str = "CURSOR_BYOK_DEFAULT_MODEL";

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("reading config file {path}: {source} (copy cursor-byok.example.toml to start)")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("parsing config file {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error(
        "database_url must be sqlite://FILE (the default) or postgres://USER:PASSWORD@HOST:PORT/DB; {0} is neither"
    )]
    DatabaseUrl(&'static str),
    #[error("invalid listen address {value:?}: {message}")]
    Listen { value: String, message: String },
    #[error(
        "provider {provider:?}: unknown kind {kind:?} (expected one of: openai-chat, openai-responses, anthropic)"
    )]
    UnknownKind { provider: String, kind: String },
    #[error(
        "provider {provider:?}: no API key: set api_key, or api_key_env to the name of an environment variable"
    )]
    MissingKey { provider: String },
    #[error("provider {provider:?}: environment variable {var} ({field}) is not set or empty")]
    MissingKeyEnv {
        provider: String,
        var: String,
        field: &'static str,
    },
    #[error("provider {provider:?}: the key is given in more than one way ({given}); keep one")]
    AmbiguousKey { provider: String, given: String },
    #[error(
        "provider {provider:?}: {field} is an empty list; list at least one key (or use api_key / api_key_env)"
    )]
    EmptyKeyList {
        provider: String,
        field: &'static str,
    },
    #[error("provider {provider:?}: base_url {value:?} is not an http(s) URL")]
    BaseUrl { provider: String, value: String },
    #[error(
        "provider {provider:?}: proxy is not a usable proxy URL (http://, https:// or socks5://; not printed, as it may hold credentials)"
    )]
    Proxy { provider: String },
    #[error("provider {provider:?} has no models")]
    NoModels { provider: String },
    #[error("duplicate provider name {0:?}")]
    DuplicateProvider(String),
    #[error("duplicate model id {model:?} (in providers {first:?} and {second:?})")]
    DuplicateModel {
        model: String,
        first: String,
        second: String,
    },
    #[error("model {0:?}: id must not be empty")]
    EmptyModelId(String),
    #[error("no providers configured: add at least one [[providers]] table")]
    NoProviders,
    #[error("default_model {model:?} is not a configured model (configured: {configured})")]
    UnknownDefaultModel { model: String, configured: String },
    #[error(
        "model {model:?}: thinking_budget {budget} must be at least 1024 and below max_output_tokens ({max_output_tokens})"
    )]
    ThinkingBudget {
        model: String,
        budget: u32,
        max_output_tokens: u32,
    },
    #[error("model {model:?}: quirks.extra_body must be a table of JSON-representable values")]
    ExtraBody { model: String },
    #[error("compact_at_percent must be between 10 and 100, not {0}")]
    CompactAtPercent(u8),
    #[error("{field} must be greater than zero")]
    Zero { field: &'static str },
    #[error(
        "provider {provider:?}: api_key_env must name an environment variable (like OPENAI_API_KEY), but its value looks like a key itself (not printed); put the key in that variable, or use api_key"
    )]
    KeyInEnvName { provider: String },
    #[error("{0}")]
    Routing(String),
    #[error("[cluster]: {0}")]
    Cluster(String),
    #[error("[auth]: {0}")]
    Auth(String),
    #[error("{} problems in the configuration:\n{}", .0.len(), .0.iter().map(|e| format!("  - {e}")).collect::<Vec<_>>().join("\n"))]
    Several(Vec<ConfigError>),
}

/// An API key. Never printed: `Debug` and `Display` show a placeholder.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub(crate) fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }
    pub fn expose(&self) -> &str {
        &self.0
    }
}

/// For configurations built in code (tests, benches): the key is kept as given, still never printed.
impl From<String> for Secret {
    fn from(value: String) -> Self {
        Secret(value)
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

/// Declares the provider families a configuration may name: one line per family, its variant and
/// the `kind` it is written as. What a family does is its module behind `provider::family::Family`
/// (registered in `provider/family.rs`); the configuration, read by every layer, only names it.
macro_rules! provider_kinds {
    ($($kind:ident = $name:literal,)*) => {
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum ProviderKind {
            $($kind,)*
        }

        impl ProviderKind {
            pub const ALL: [ProviderKind; [$($name),*].len()] = [$(ProviderKind::$kind),*];

            /// The `kind` the configuration names this family by.
            pub fn name(self) -> &'static str {
                match self {
                    $(ProviderKind::$kind => $name,)*
                }
            }
        }
    };
}

provider_kinds! {
    OpenAiChat = "openai-chat",
    OpenAiResponses = "openai-responses",
    Anthropic = "anthropic",
}

impl ProviderKind {
    pub(crate) fn parse(kind: &str) -> Option<Self> {
        ProviderKind::ALL.into_iter().find(|k| k.name() == kind)
    }
}

#[derive(Debug, Clone)]
pub struct ModelConfig {
    pub id: String,
    /// The id sent to the provider; defaults to `id`.
    pub upstream_id: String,
    pub display_name: String,
    pub context_window: u32,
    pub reasoning: bool,
    /// The output token limit the configuration sets: Chat (`max_tokens`, or
    /// `max_completion_tokens` for reasoning models) and Responses (`max_output_tokens`) send it
    /// only when set; Anthropic, which requires one, sends `output_limit()`.
    pub max_output_tokens: Option<u32>,
    /// Anthropic: `Some(n)` = legacy `thinking.budget_tokens = n`; `None` = adaptive thinking.
    pub thinking_budget: Option<u32>,
    /// The model takes images. Configured per model (`vision`); by default true for the
    /// `anthropic` and `openai-responses` kinds (every current model there does) and false for
    /// `openai-chat` (many compatible servers run text-only models, which reject image parts).
    pub vision: bool,
    pub quirks: Quirks,
    /// Prices for the console's cost figures (`[providers.models.pricing]`); `None`: unknown.
    pub pricing: Option<Pricing>,
    /// Other names Cursor may send for this model (exact, or patterns with `*`).
    pub aliases: Vec<String>,
    /// Configured models a call goes to, in order, when it fails before streaming with a
    /// retryable error after its own retries.
    pub fallbacks: Vec<String>,
    /// A configured model with a larger context window that takes a request too large for this
    /// one, instead of compacting the history (`None`: compact).
    pub context_fallback: Option<String>,
}

/// A model's prices in US dollars per million tokens, per usage bucket. A bucket without a price
/// makes the cost of any usage with tokens in it unknown (never zero): set `reasoning = 0` where
/// reasoning tokens are billed inside `output` (OpenAI, Anthropic).
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pricing {
    pub input: Option<f64>,
    pub output: Option<f64>,
    pub cache_read: Option<f64>,
    pub cache_write: Option<f64>,
    pub reasoning: Option<f64>,
}

impl Pricing {
    /// What `usage` costs in US dollars, or `None` when a bucket with tokens has no price.
    pub fn cost(&self, usage: &crate::model::usage::Usage) -> Option<f64> {
        let buckets = [
            (usage.input_tokens, self.input),
            (usage.output_tokens, self.output),
            (usage.cache_read_tokens, self.cache_read),
            (usage.cache_write_tokens, self.cache_write),
            (usage.reasoning_tokens, self.reasoning),
        ];
        buckets.iter().try_fold(0.0, |sum, (tokens, price)| {
            match (tokens.unwrap_or(0), price) {
                (0, _) => Some(sum),
                (tokens, Some(price)) => Some(sum + tokens as f64 * price / 1_000_000.0),
                (_, None) => None,
            }
        })
    }
}

impl ModelConfig {
    /// The output limit for endpoints that require one (Anthropic's `max_tokens`).
    pub fn output_limit(&self) -> u32 {
        self.max_output_tokens.unwrap_or(DEFAULT_MAX_OUTPUT_TOKENS)
    }
}

/// Per-model differences between endpoints that claim the same API, in one place.
#[derive(Debug, Clone, PartialEq)]
pub struct Quirks {
    /// Chat: send `stream_options.include_usage` (some old servers reject the field).
    pub stream_usage: bool,
    /// Chat: send `reasoning_content` back on assistant tool-call messages even when empty
    /// (DeepSeek / Kimi thinking models reject the message without it). Defaults to `reasoning`.
    pub reasoning_content_on_tool_calls: bool,
    /// Extra top-level request fields merged into every request body (e.g. Qwen
    /// `enable_thinking`, GLM `tool_stream`).
    pub extra_body: serde_json::Map<String, serde_json::Value>,
}

#[derive(Debug, Clone)]
pub struct ProviderConfig {
    pub name: String,
    pub kind: ProviderKind,
    pub base_url: String,
    /// One or more keys, in the order the file lists them; calls are spread over them
    /// (`provider/keys.rs`).
    pub keys: Vec<ProviderKey>,
    pub models: Vec<ModelConfig>,
    /// How calls to `base_url` go out: directly or through which proxy.
    pub route: Route,
}

/// One API key of a provider, and where it came from (for `check` and the console, which name the
/// key's source, never the key).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderKey {
    pub secret: Secret,
    /// The environment variable it was read from; `None` for a key written in the file.
    pub env: Option<String>,
}

impl ProviderKey {
    /// `KEY_1` (the variable's name) or `inline`.
    pub fn source(&self) -> &str {
        self.env.as_deref().unwrap_or("inline")
    }
}

impl ProviderConfig {
    /// `host:port` of `base_url`, for messages that say where a call went (the URL itself when it
    /// does not parse).
    pub fn host(&self) -> String {
        url::Url::parse(&self.base_url)
            .ok()
            .and_then(|u| Some(format!("{}:{}", u.host_str()?, u.port_or_known_default()?)))
            .unwrap_or_else(|| self.base_url.clone())
    }
}

/// How requests to one address go out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// Straight to the host: it is on this machine or a private network (`local`), or no proxy is
    /// set for it.
    Direct { local: bool },
    /// Through `proxy` (which may carry credentials: shown only by `shown()`), set by `source`:
    /// the provider's `proxy` key or an environment variable.
    Proxy { proxy: String, source: String },
}

impl Route {
    /// The route chosen for `url`: a provider's own `proxy` key first; then a loopback or private
    /// host goes direct whatever the environment says (a set `http_proxy` must not send a local
    /// llama.cpp through a corporate proxy); then `HTTPS_PROXY` / `HTTP_PROXY` / `ALL_PROXY` (either
    /// case), unless `NO_PROXY` names the host.
    pub fn resolve(
        url: &str,
        configured: Option<&str>,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Route {
        if let Some(proxy) = configured {
            return Route::Proxy {
                proxy: proxy.to_owned(),
                source: "the provider's proxy key".to_owned(),
            };
        }
        if is_local_url(url) {
            return Route::Direct { local: true };
        }
        let Ok(parsed) = url::Url::parse(url) else {
            return Route::Direct { local: false };
        };
        let host = parsed.host_str().unwrap_or_default();
        let var = |name: &str| {
            [name.to_owned(), name.to_ascii_lowercase()]
                .into_iter()
                .find_map(|n| env(&n).filter(|v| !v.trim().is_empty()).map(|v| (n, v)))
        };
        if let Some((_, no_proxy)) = var("NO_PROXY")
            && no_proxy.split(',').map(str::trim).any(|entry| {
                let entry = entry.trim_start_matches('.');
                entry == "*"
                    || (!entry.is_empty()
                        && (host == entry || host.ends_with(&format!(".{entry}"))))
            })
        {
            return Route::Direct { local: false };
        }
        let scheme_var = if parsed.scheme() == "https" {
            "HTTPS_PROXY"
        } else {
            "HTTP_PROXY"
        };
        match var(scheme_var).or_else(|| var("ALL_PROXY")) {
            Some((source, proxy)) => Route::Proxy { proxy, source },
            None => Route::Direct { local: false },
        }
    }

    /// The proxy to hand the HTTP client, if any.
    pub fn proxy(&self) -> Option<&str> {
        match self {
            Route::Direct { .. } => None,
            Route::Proxy { proxy, .. } => Some(proxy),
        }
    }

    /// For logs and errors: `direct` or `via proxy host:port (source)`, credentials left out.
    pub fn shown(&self) -> String {
        match self {
            Route::Direct { local: true } => {
                "direct (a local address; no proxy applies)".to_owned()
            }
            Route::Direct { local: false } => "direct".to_owned(),
            Route::Proxy { proxy, source } => {
                let shown = url::Url::parse(proxy)
                    .ok()
                    .and_then(|u| {
                        Some(format!(
                            "{}://{}:{}",
                            u.scheme(),
                            u.host_str()?,
                            u.port_or_known_default()?
                        ))
                    })
                    .unwrap_or_else(|| "(an unparsable proxy URL)".to_owned());
                format!("via proxy {shown} ({source})")
            }
        }
    }
}

#[derive(Debug, Clone)]
pub struct Config {
    pub listen: SocketAddr,
    pub database_url: String,
    /// PostgreSQL: connections this process keeps open at most (SQLite keeps its one writer).
    pub database_max_connections: u32,
    /// PostgreSQL: how long a statement waits for a free connection (or for the database to
    /// answer a new one) before it fails as unavailable.
    pub database_acquire_timeout: Duration,
    pub default_model: String,
    pub max_frame_bytes: usize,
    pub provider_idle_timeout: Duration,
    pub provider_connect_timeout: Duration,
    /// How long a run session waits for its `run_request` before it is ended with an error.
    pub run_request_timeout: Duration,
    /// Tool output shown to the model is truncated (with a marker) past this many bytes.
    pub tool_output_max_bytes: usize,
    /// A heartbeat goes to the client after this long without any other frame.
    pub heartbeat_interval: Duration,
    /// How long a finished turn waits for the client to store the final checkpoint's blobs.
    pub checkpoint_ack_timeout: Duration,
    /// A blob whose `set_blob_result` has not come back after this long is sent again.
    pub kv_retry_after: Duration,
    /// Attempts for a provider call that fails before streaming (429, 5xx, 529, unreachable).
    pub provider_max_attempts: u32,
    /// First retry delay (doubled per attempt) unless the provider sends `retry-after`.
    pub provider_retry_base_delay: Duration,
    /// A directory of prompt assets (a copy of `prompt/`) used instead of the embedded ones.
    pub prompt_dir: Option<PathBuf>,
    /// History is summarized (compacted) before a provider call whose prompt would fill more than
    /// this share of the model's context window (100 = never).
    pub compact_at_percent: u8,
    /// A run whose RunSSE dropped waits this long for the client to reconnect (same request id)
    /// before it is canceled; zero cancels at once.
    pub reconnect_grace: Duration,
    /// How long a new run on a conversation waits for the run it interrupts to end before it goes
    /// on anyway (the store refuses the old run's appends from then on).
    pub interrupt_wait: Duration,
    /// A run waiting on a client tool that hears nothing from the client (not even a heartbeat)
    /// for this long is canceled (questions to the user are not timed).
    pub client_idle_timeout: Duration,
    /// Where routes this server does not implement go (`None`: pass-through is off and they get
    /// `unimplemented`), and the proxy to reach it through, if any.
    pub upstream: Option<UpstreamConfig>,
    /// The search backend behind WebSearch (`None`: WebSearch is not offered).
    pub web_search: Option<WebSearchConfig>,
    pub providers: Vec<ProviderConfig>,
    /// How long a connection may take to send what it must, and how long it may sit idle.
    pub connections: ConnectionLimits,
    /// Runs open at once; a new one past it is refused `resource_exhausted`.
    pub max_runs: usize,
    /// Runs opened by BidiAppend whose RunSSE has not come (yet); past it, `resource_exhausted`.
    pub max_unattached_runs: usize,
    /// How long a BidiAppend past `max_unattached_runs` waits for a place (its run's RunSSE, here
    /// or forwarded from another node, or another run's) before `resource_exhausted`; zero
    /// refuses at once.
    pub unattached_wait: Duration,
    /// How long a provider key is left out of the key choice after HTTP 429 without `retry-after`
    /// and after HTTP 401.
    pub key_cooldown: KeyCooldown,
    /// The console's and `/api/`'s token: required when set; without it they answer only on a
    /// loopback listener.
    pub console_token: Option<Secret>,
    /// What is valid but probably not what the user meant, said once at start-up (and by `check`).
    pub warnings: Vec<String>,
    /// Aliases, the model per mode and per subagent type (`config/routing.rs`).
    pub routing: Routing,
    /// `[cluster]`: several nodes on one database (`None`: a single node).
    pub cluster: Option<cluster::ClusterConfig>,
    /// `[auth]`, `[[teams]]`, `[[users]]`: people on a shared server (`None`: single-user, as
    /// before).
    pub auth: Option<auth::AuthConfig>,
}

/// Default cooldowns of a provider key the provider turned away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyCooldown {
    /// After HTTP 429 that does not say (`retry-after`) when to come back.
    pub rate_limited: Duration,
    /// After HTTP 401 (the key was refused).
    pub refused: Duration,
}

impl Default for KeyCooldown {
    fn default() -> Self {
        KeyCooldown {
            rate_limited: Duration::from_secs(DEFAULT_KEY_COOLDOWN_SECS),
            refused: Duration::from_secs(DEFAULT_KEY_REFUSED_COOLDOWN_SECS),
        }
    }
}

/// The bounds of one accepted connection.
#[derive(Debug, Clone, Copy)]
pub struct ConnectionLimits {
    /// From accept to the first byte, and for each HTTP/1 request's headers (also the keep-alive
    /// wait for the next request).
    pub header_read_timeout: Duration,
    /// A request body must arrive whole within this (not the bidi `Run` stream's).
    pub request_body_timeout: Duration,
    /// A connection with no request in flight for this long is closed (HTTP/1 and HTTP/2).
    pub idle_timeout: Duration,
    /// HTTP/2 pings this often; a ping unanswered within `h2_ping_timeout` closes the connection.
    pub h2_ping_interval: Duration,
    pub h2_ping_timeout: Duration,
}

/// A configured model Cursor's id resolved to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelChoice {
    /// Indexes into `Config::providers` and that provider's `models`.
    pub provider: usize,
    pub model: usize,
    /// Parameters the id implied (`-high` → reasoning effort high).
    pub implied: Vec<(String, String)>,
}

impl Config {
    /// Reads and validates the file at `path`, applying the process environment.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Config::from_toml(&text, path, &|name| std::env::var(name).ok())
    }

    /// Only the database URL of the file at `path` (with its environment override and default):
    /// what `gc` needs, without provider keys.
    pub fn load_database_url(path: &Path) -> Result<String, ConfigError> {
        if let Ok(url) = std::env::var(ENV_DATABASE_URL) {
            return Ok(url);
        }
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        let table: toml::Table = toml::from_str(&text).map_err(|e| ConfigError::Parse {
            path: path.to_owned(),
            message: e.to_string(),
        })?;
        Ok(table
            .get("database_url")
            .and_then(toml::Value::as_str)
            .unwrap_or(DEFAULT_DATABASE_URL)
            .to_owned())
    }

    /// Parses and validates `text`; `env` looks up environment variables (injectable for tests).
    pub fn from_toml(
        text: &str,
        path: &Path,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Config, ConfigError> {
        let file: file::FileConfig = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: path.to_owned(),
            message: e.to_string(),
        })?;
        let mut config = file.validate(env)?;
        // Like every path a user writes in the file, a relative prompt directory is relative to it.
        if let Some(dir) = config.prompt_dir.take() {
            config.prompt_dir = Some(match path.parent() {
                Some(base) if dir.is_relative() => base.join(dir),
                _ => dir,
            });
        }
        Ok(config)
    }

    /// The configured model Cursor's `model_id` names: exactly, or with a reasoning-effort or
    /// mode suffix Cursor's picker adds (`-high`, `-thinking`, `-fast`, ...), which becomes a
    /// request parameter; Auto (`default`) is the configured default. Aliases, modes and subagent
    /// types are `route`'s (`config/routing.rs`).
    pub fn resolve_model(&self, model_id: &str) -> Option<ModelChoice> {
        // Cursor's "Auto" is the configured default, unless a model is configured under that id.
        if model_id == AUTO_MODEL_ID && self.find_model(model_id).is_none() {
            return self.resolve_configured(&self.default_model);
        }
        self.resolve_configured(model_id)
    }

    /// A configured model by its id, or by its id with an effort suffix.
    pub(crate) fn resolve_configured(&self, model_id: &str) -> Option<ModelChoice> {
        if let Some((provider, model)) = self.find_model(model_id) {
            return Some(ModelChoice {
                provider,
                model,
                implied: Vec::new(),
            });
        }
        EFFORT_SUFFIXES
            .iter()
            .find_map(|(suffix, parameter, value)| {
                let base = model_id.strip_suffix(suffix)?;
                let (provider, model) = self.find_model(base)?;
                Some(ModelChoice {
                    provider,
                    model,
                    implied: vec![((*parameter).to_owned(), (*value).to_owned())],
                })
            })
    }

    /// Where model `id` is configured: (provider index, model index).
    pub(crate) fn find_model(&self, id: &str) -> Option<(usize, usize)> {
        self.providers
            .iter()
            .enumerate()
            .find_map(|(i, p)| p.models.iter().position(|m| m.id == id).map(|j| (i, j)))
    }

    /// The provider and model a choice names.
    pub fn chosen(&self, choice: &ModelChoice) -> (&ProviderConfig, &ModelConfig) {
        let provider = &self.providers[choice.provider];
        (provider, &provider.models[choice.model])
    }

    pub fn model_ids(&self) -> impl Iterator<Item = &str> {
        self.providers
            .iter()
            .flat_map(|p| p.models.iter().map(|m| m.id.as_str()))
    }
}

/// Suffixes Cursor's picker adds to a model id, and the request parameter each implies.
const EFFORT_SUFFIXES: [(&str, &str, &str); 8] = [
    ("-thinking", "reasoning_effort", "medium"),
    ("-minimal", "reasoning_effort", "minimal"),
    ("-low", "reasoning_effort", "low"),
    ("-medium", "reasoning_effort", "medium"),
    ("-high", "reasoning_effort", "high"),
    ("-xhigh", "reasoning_effort", "max"),
    ("-max", "reasoning_effort", "max"),
    ("-fast", "fast", "true"),
];

/// A model's context window when the configuration does not give one.
pub const DEFAULT_CONTEXT_WINDOW: u32 = 128_000;
const DEFAULT_MAX_OUTPUT_TOKENS: u32 = 32_000;

/// The model id Cursor sends when the user picks "Auto".
pub const AUTO_MODEL_ID: &str = "default";

/// Cursor's official backend for pass-through.
#[derive(Debug, Clone)]
pub struct UpstreamConfig {
    /// Scheme and host (and optional path prefix), without a trailing slash.
    pub url: String,
    /// An outbound proxy URL for upstream calls (`http://`, `https://` or `socks5://`).
    pub proxy: Option<String>,
}

/// The server-side search backend WebSearch uses; without one the tool is not offered.
#[derive(Debug, Clone)]
pub struct WebSearchConfig {
    pub kind: WebSearchKind,
    /// Up to the API root (`https://api.tavily.com`, `https://api.search.brave.com/res/v1`, a
    /// SearXNG instance).
    pub base_url: String,
    pub api_key: Option<Secret>,
    pub max_results: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WebSearchKind {
    /// A SearXNG instance's JSON API (`GET {base_url}/search?format=json`); no key.
    Searxng,
    /// Tavily (`POST {base_url}/search`, bearer key).
    Tavily,
    /// Brave Search (`GET {base_url}/web/search`, `X-Subscription-Token`).
    Brave,
}

/// Whether `url`'s host is this machine or a private network (a self-hosted server: llama.cpp,
/// vLLM, Ollama, LM Studio), where no proxy applies and small context windows are common.
pub fn is_local_url(url: &str) -> bool {
    let Some(host) = url::Url::parse(url)
        .ok()
        .and_then(|u| u.host().map(|h| h.to_owned()))
    else {
        return false;
    };
    match host {
        url::Host::Domain(name) => {
            name == "localhost" || name.ends_with(".localhost") || name.ends_with(".local")
        }
        url::Host::Ipv4(ip) => ip.is_loopback() || ip.is_private() || ip.is_link_local(),
        url::Host::Ipv6(ip) => {
            ip.is_loopback() || ip.is_unique_local() || ip.is_unicast_link_local()
        }
    }
}

#[cfg(test)]
mod tests;
