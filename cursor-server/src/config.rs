//! Server configuration: a TOML file plus environment overrides, validated once at start-up.
//!
//! Everything a run needs to know about providers (endpoint, key, models) is resolved here, so a bad
//! config fails the start with a precise message instead of failing the first user turn.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

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
/// Cursor's official backend, where routes this server does not implement are forwarded.
pub const DEFAULT_UPSTREAM_URL: &str = "https://api2.cursor.sh";
pub const DEFAULT_CLIENT_IDLE_TIMEOUT_SECS: u64 = 600;
pub const DEFAULT_PROVIDER_MAX_ATTEMPTS: u32 = 3;
pub const DEFAULT_HEARTBEAT_INTERVAL_MS: u64 = 5_000;
pub const DEFAULT_CHECKPOINT_ACK_TIMEOUT_MS: u64 = 10_000;
pub const DEFAULT_KV_RETRY_AFTER_MS: u64 = 5_000;
pub const DEFAULT_PROVIDER_RETRY_BASE_DELAY_MS: u64 = 500;

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
    #[error("provider {provider:?}: environment variable {var} (api_key_env) is not set or empty")]
    MissingKeyEnv { provider: String, var: String },
    #[error("provider {provider:?}: both api_key and api_key_env are set; keep one")]
    AmbiguousKey { provider: String },
    #[error("provider {provider:?}: base_url {value:?} is not an http(s) URL")]
    BaseUrl { provider: String, value: String },
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
}

/// An API key. Never printed: `Debug` and `Display` show a placeholder.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }
    pub fn expose(&self) -> &str {
        &self.0
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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProviderKind {
    OpenAiChat,
    OpenAiResponses,
    Anthropic,
}

impl ProviderKind {
    fn parse(kind: &str) -> Option<Self> {
        match kind {
            "openai-chat" => Some(ProviderKind::OpenAiChat),
            "openai-responses" => Some(ProviderKind::OpenAiResponses),
            "anthropic" => Some(ProviderKind::Anthropic),
            _ => None,
        }
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
    pub api_key: Secret,
    pub models: Vec<ModelConfig>,
}

#[derive(Debug, Clone)]
pub struct Config {
    pub listen: SocketAddr,
    pub database_url: String,
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

    /// Parses and validates `text`; `env` looks up environment variables (injectable for tests).
    pub fn from_toml(
        text: &str,
        path: &Path,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Config, ConfigError> {
        let file: FileConfig = toml::from_str(text).map_err(|e| ConfigError::Parse {
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
    /// request parameter.
    pub fn resolve_model(&self, model_id: &str) -> Option<ModelChoice> {
        // Cursor's "Auto" is the configured default, unless a model is configured under that id.
        let configured = |id: &str| {
            self.providers
                .iter()
                .any(|p| p.models.iter().any(|m| m.id == id))
        };
        let model_id = if model_id == AUTO_MODEL_ID && !configured(model_id) {
            self.default_model.as_str()
        } else {
            model_id
        };
        let find = |id: &str| {
            self.providers
                .iter()
                .enumerate()
                .find_map(|(i, p)| p.models.iter().position(|m| m.id == id).map(|j| (i, j)))
        };
        if let Some((provider, model)) = find(model_id) {
            return Some(ModelChoice {
                provider,
                model,
                implied: Vec::new(),
            });
        }
        const SUFFIXES: [(&str, &str, &str); 8] = [
            ("-thinking", "reasoning_effort", "medium"),
            ("-minimal", "reasoning_effort", "minimal"),
            ("-low", "reasoning_effort", "low"),
            ("-medium", "reasoning_effort", "medium"),
            ("-high", "reasoning_effort", "high"),
            ("-xhigh", "reasoning_effort", "max"),
            ("-max", "reasoning_effort", "max"),
            ("-fast", "fast", "true"),
        ];
        SUFFIXES.iter().find_map(|(suffix, parameter, value)| {
            let base = model_id.strip_suffix(suffix)?;
            let (provider, model) = find(base)?;
            Some(ModelChoice {
                provider,
                model,
                implied: vec![((*parameter).to_owned(), (*value).to_owned())],
            })
        })
    }

    pub fn model_ids(&self) -> impl Iterator<Item = &str> {
        self.providers
            .iter()
            .flat_map(|p| p.models.iter().map(|m| m.id.as_str()))
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    listen: Option<String>,
    database_url: Option<String>,
    default_model: Option<String>,
    max_frame_bytes: Option<usize>,
    provider_idle_timeout_secs: Option<u64>,
    provider_connect_timeout_secs: Option<u64>,
    run_request_timeout_secs: Option<u64>,
    tool_output_max_bytes: Option<usize>,
    heartbeat_interval_ms: Option<u64>,
    checkpoint_ack_timeout_ms: Option<u64>,
    kv_retry_after_ms: Option<u64>,
    provider_max_attempts: Option<u32>,
    provider_retry_base_delay_ms: Option<u64>,
    prompt_dir: Option<PathBuf>,
    compact_at_percent: Option<u8>,
    web_search: Option<FileWebSearch>,
    reconnect_grace_ms: Option<u64>,
    interrupt_wait_ms: Option<u64>,
    pass_through: Option<bool>,
    upstream_url: Option<String>,
    upstream_proxy: Option<String>,
    client_idle_timeout_secs: Option<u64>,
    #[serde(default)]
    providers: Vec<FileProvider>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileProvider {
    name: String,
    kind: String,
    base_url: String,
    api_key: Option<String>,
    api_key_env: Option<String>,
    #[serde(default)]
    models: Vec<FileModel>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileModel {
    id: String,
    upstream_id: Option<String>,
    display_name: Option<String>,
    context_window: Option<u32>,
    #[serde(default)]
    reasoning: bool,
    max_output_tokens: Option<u32>,
    thinking_budget: Option<u32>,
    vision: Option<bool>,
    #[serde(default)]
    quirks: FileQuirks,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileQuirks {
    stream_usage: Option<bool>,
    reasoning_content_on_tool_calls: Option<bool>,
    #[serde(default)]
    extra_body: toml::Table,
}

const DEFAULT_CONTEXT_WINDOW: u32 = 128_000;
const DEFAULT_MAX_OUTPUT_TOKENS: u32 = 32_000;

/// The model id Cursor sends when the user picks "Auto".
pub const AUTO_MODEL_ID: &str = "default";
/// Anthropic's smallest allowed thinking budget.
const MIN_THINKING_BUDGET: u32 = 1024;

impl FileConfig {
    fn validate(self, env: &dyn Fn(&str) -> Option<String>) -> Result<Config, ConfigError> {
        let listen_text = env(ENV_LISTEN)
            .or(self.listen)
            .unwrap_or_else(|| DEFAULT_LISTEN.to_owned());
        let listen = listen_text
            .parse::<SocketAddr>()
            .map_err(|e| ConfigError::Listen {
                value: listen_text.clone(),
                message: e.to_string(),
            })?;
        let database_url = env(ENV_DATABASE_URL)
            .or(self.database_url)
            .unwrap_or_else(|| DEFAULT_DATABASE_URL.to_owned());

        let providers = validate_providers(self.providers, env)?;
        let default_model =
            default_model(env(ENV_DEFAULT_MODEL).or(self.default_model), &providers)?;

        let tool_output_max_bytes = nonzero(
            self.tool_output_max_bytes,
            DEFAULT_TOOL_OUTPUT_MAX_BYTES,
            "tool_output_max_bytes",
        )?;
        let compact_at_percent = self
            .compact_at_percent
            .unwrap_or(DEFAULT_COMPACT_AT_PERCENT);
        if !(10..=100).contains(&compact_at_percent) {
            return Err(ConfigError::CompactAtPercent(compact_at_percent));
        }
        let max_frame_bytes = nonzero(
            self.max_frame_bytes,
            DEFAULT_MAX_FRAME_BYTES,
            "max_frame_bytes",
        )?;
        Ok(Config {
            listen,
            database_url,
            default_model,
            max_frame_bytes,
            provider_idle_timeout: positive_secs(
                self.provider_idle_timeout_secs,
                DEFAULT_PROVIDER_IDLE_TIMEOUT_SECS,
                "provider_idle_timeout_secs",
            )?,
            provider_connect_timeout: positive_secs(
                self.provider_connect_timeout_secs,
                DEFAULT_PROVIDER_CONNECT_TIMEOUT_SECS,
                "provider_connect_timeout_secs",
            )?,
            run_request_timeout: positive_secs(
                self.run_request_timeout_secs,
                DEFAULT_RUN_REQUEST_TIMEOUT_SECS,
                "run_request_timeout_secs",
            )?,
            tool_output_max_bytes,
            compact_at_percent,
            web_search: self.web_search.map(|w| w.validate(env)).transpose()?,
            upstream: upstream(self.pass_through, self.upstream_url, self.upstream_proxy)?,
            reconnect_grace: millis(self.reconnect_grace_ms, DEFAULT_RECONNECT_GRACE_MS),
            interrupt_wait: Duration::from_millis(nonzero(
                self.interrupt_wait_ms,
                DEFAULT_INTERRUPT_WAIT_MS,
                "interrupt_wait_ms",
            )?),
            client_idle_timeout: positive_secs(
                self.client_idle_timeout_secs,
                DEFAULT_CLIENT_IDLE_TIMEOUT_SECS,
                "client_idle_timeout_secs",
            )?,
            heartbeat_interval: Duration::from_millis(nonzero(
                self.heartbeat_interval_ms,
                DEFAULT_HEARTBEAT_INTERVAL_MS,
                "heartbeat_interval_ms",
            )?),
            checkpoint_ack_timeout: millis(
                self.checkpoint_ack_timeout_ms,
                DEFAULT_CHECKPOINT_ACK_TIMEOUT_MS,
            ),
            kv_retry_after: Duration::from_millis(nonzero(
                self.kv_retry_after_ms,
                DEFAULT_KV_RETRY_AFTER_MS,
                "kv_retry_after_ms",
            )?),
            provider_max_attempts: nonzero(
                self.provider_max_attempts,
                DEFAULT_PROVIDER_MAX_ATTEMPTS,
                "provider_max_attempts",
            )?,
            provider_retry_base_delay: millis(
                self.provider_retry_base_delay_ms,
                DEFAULT_PROVIDER_RETRY_BASE_DELAY_MS,
            ),
            prompt_dir: self.prompt_dir,
            providers,
        })
    }
}

/// Every provider, validated; provider names and model ids are unique across the file.
fn validate_providers(
    file: Vec<FileProvider>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Vec<ProviderConfig>, ConfigError> {
    if file.is_empty() {
        return Err(ConfigError::NoProviders);
    }
    let mut providers = Vec::with_capacity(file.len());
    let mut provider_names = HashSet::new();
    for provider in file {
        if !provider_names.insert(provider.name.clone()) {
            return Err(ConfigError::DuplicateProvider(provider.name));
        }
        providers.push(provider.validate(env)?);
    }
    let mut model_owner: HashMap<&str, &str> = HashMap::new();
    for provider in &providers {
        for model in &provider.models {
            if let Some(first) = model_owner.insert(&model.id, &provider.name) {
                return Err(ConfigError::DuplicateModel {
                    model: model.id.clone(),
                    first: first.to_owned(),
                    second: provider.name.clone(),
                });
            }
        }
    }
    Ok(providers)
}

/// The model a run without one uses: `chosen` if it is configured, else the first configured one.
fn default_model(
    chosen: Option<String>,
    providers: &[ProviderConfig],
) -> Result<String, ConfigError> {
    let all_models: Vec<&str> = providers
        .iter()
        .flat_map(|p| p.models.iter().map(|m| m.id.as_str()))
        .collect();
    let default_model = chosen.unwrap_or_else(|| all_models[0].to_owned());
    if !all_models.contains(&default_model.as_str()) {
        return Err(ConfigError::UnknownDefaultModel {
            model: default_model,
            configured: all_models.join(", "),
        });
    }
    Ok(default_model)
}

/// Where pass-through goes (`None`: pass-through is off).
fn upstream(
    pass_through: Option<bool>,
    url: Option<String>,
    proxy: Option<String>,
) -> Result<Option<UpstreamConfig>, ConfigError> {
    if !pass_through.unwrap_or(true) {
        return Ok(None);
    }
    let url = url
        .unwrap_or_else(|| DEFAULT_UPSTREAM_URL.to_owned())
        .trim_end_matches('/')
        .to_owned();
    Ok(Some(UpstreamConfig {
        url: http_url("upstream_url", url)?,
        proxy: proxy.filter(|p| !p.trim().is_empty()),
    }))
}

/// `value` (or `default` when unset), which must not be zero.
fn nonzero<T: Default + PartialEq>(
    value: Option<T>,
    default: T,
    field: &'static str,
) -> Result<T, ConfigError> {
    let value = value.unwrap_or(default);
    if value == T::default() {
        return Err(ConfigError::Zero { field });
    }
    Ok(value)
}

fn millis(value: Option<u64>, default: u64) -> Duration {
    Duration::from_millis(value.unwrap_or(default))
}

fn positive_secs(
    value: Option<u64>,
    default: u64,
    field: &'static str,
) -> Result<Duration, ConfigError> {
    nonzero(value, default, field).map(Duration::from_secs)
}

/// `url` if it is an http(s) URL; `owner` names the setting in the error.
fn http_url(owner: &str, url: String) -> Result<String, ConfigError> {
    if !(url.starts_with("http://") || url.starts_with("https://")) {
        return Err(ConfigError::BaseUrl {
            provider: owner.to_owned(),
            value: url,
        });
    }
    Ok(url)
}

/// `api_key` or the variable `api_key_env` names (never both); `None` when neither is set.
fn resolve_key(
    owner: &str,
    api_key: Option<String>,
    api_key_env: Option<String>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<Secret>, ConfigError> {
    match (api_key, api_key_env) {
        (Some(_), Some(_)) => Err(ConfigError::AmbiguousKey {
            provider: owner.to_owned(),
        }),
        (Some(key), None) if !key.is_empty() => Ok(Some(Secret::new(key))),
        (Some(_), None) => Err(ConfigError::MissingKey {
            provider: owner.to_owned(),
        }),
        (None, None) => Ok(None),
        (None, Some(var)) => match env(&var) {
            Some(key) if !key.is_empty() => Ok(Some(Secret::new(key))),
            _ => Err(ConfigError::MissingKeyEnv {
                provider: owner.to_owned(),
                var,
            }),
        },
    }
}

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

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileWebSearch {
    kind: String,
    base_url: Option<String>,
    api_key: Option<String>,
    api_key_env: Option<String>,
    max_results: Option<u32>,
}

impl FileWebSearch {
    fn validate(
        self,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<WebSearchConfig, ConfigError> {
        const OWNER: &str = "web_search";
        let (kind, default_url) = match self.kind.as_str() {
            "searxng" => (WebSearchKind::Searxng, None),
            "tavily" => (WebSearchKind::Tavily, Some("https://api.tavily.com")),
            "brave" => (
                WebSearchKind::Brave,
                Some("https://api.search.brave.com/res/v1"),
            ),
            other => {
                return Err(ConfigError::UnknownKind {
                    provider: OWNER.to_owned(),
                    kind: format!("{other} (web_search kinds: searxng, tavily, brave)"),
                });
            }
        };
        let base_url = self
            .base_url
            .or(default_url.map(str::to_owned))
            .ok_or_else(|| ConfigError::BaseUrl {
                provider: OWNER.to_owned(),
                value: "(missing: a SearXNG instance needs base_url)".to_owned(),
            })?
            .trim_end_matches('/')
            .to_owned();
        let base_url = http_url(OWNER, base_url)?;
        let api_key = resolve_key(OWNER, self.api_key, self.api_key_env, env)?;
        if api_key.is_none() && kind != WebSearchKind::Searxng {
            return Err(ConfigError::MissingKey {
                provider: OWNER.to_owned(),
            });
        }
        let max_results = nonzero(
            self.max_results,
            DEFAULT_WEB_SEARCH_RESULTS,
            "web_search.max_results",
        )?;
        Ok(WebSearchConfig {
            kind,
            base_url,
            api_key,
            max_results,
        })
    }
}

impl FileProvider {
    fn validate(self, env: &dyn Fn(&str) -> Option<String>) -> Result<ProviderConfig, ConfigError> {
        let kind = ProviderKind::parse(&self.kind).ok_or_else(|| ConfigError::UnknownKind {
            provider: self.name.clone(),
            kind: self.kind.clone(),
        })?;
        let base_url = http_url(&self.name, self.base_url)?;
        let Some(api_key) = resolve_key(&self.name, self.api_key, self.api_key_env, env)? else {
            return Err(ConfigError::MissingKey {
                provider: self.name,
            });
        };
        if self.models.is_empty() {
            return Err(ConfigError::NoModels {
                provider: self.name,
            });
        }
        let mut models = Vec::with_capacity(self.models.len());
        for model in self.models {
            if model.id.trim().is_empty() {
                return Err(ConfigError::EmptyModelId(self.name));
            }
            let max_output_tokens = model.max_output_tokens.unwrap_or(DEFAULT_MAX_OUTPUT_TOKENS);
            if let Some(budget) = model.thinking_budget
                && (budget < MIN_THINKING_BUDGET || budget >= max_output_tokens)
            {
                return Err(ConfigError::ThinkingBudget {
                    model: model.id,
                    budget,
                    max_output_tokens,
                });
            }
            let Ok(serde_json::Value::Object(extra_body)) =
                serde_json::to_value(&model.quirks.extra_body)
            else {
                return Err(ConfigError::ExtraBody { model: model.id });
            };
            models.push(ModelConfig {
                upstream_id: model.upstream_id.unwrap_or_else(|| model.id.clone()),
                display_name: model.display_name.unwrap_or_else(|| model.id.clone()),
                context_window: model.context_window.unwrap_or(DEFAULT_CONTEXT_WINDOW),
                reasoning: model.reasoning,
                max_output_tokens: model.max_output_tokens,
                thinking_budget: model.thinking_budget,
                vision: model
                    .vision
                    .unwrap_or(!matches!(kind, ProviderKind::OpenAiChat)),
                quirks: Quirks {
                    stream_usage: model.quirks.stream_usage.unwrap_or(true),
                    reasoning_content_on_tool_calls: model
                        .quirks
                        .reasoning_content_on_tool_calls
                        .unwrap_or(model.reasoning),
                    extra_body,
                },
                id: model.id,
            });
        }
        Ok(ProviderConfig {
            name: self.name,
            kind,
            base_url: base_url.trim_end_matches('/').to_owned(),
            api_key,
            models,
        })
    }
}

#[cfg(test)]
mod tests;
