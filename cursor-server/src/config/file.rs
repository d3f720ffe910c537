//! The configuration file as written (`cursor-byok.toml`) and its validation into `Config`: every
//! field's default, every rule. `config.rs` owns the validated types the server reads.
//!
//! A file of its own so that `config.rs` (the types, model resolution) and the validation rules
//! each stay readable; only `Config::from_toml` calls in here.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::*;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FileConfig {
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
    header_read_timeout_secs: Option<u64>,
    request_body_timeout_secs: Option<u64>,
    connection_idle_timeout_secs: Option<u64>,
    h2_ping_interval_secs: Option<u64>,
    h2_ping_timeout_secs: Option<u64>,
    max_runs: Option<usize>,
    max_unattached_runs: Option<usize>,
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
    /// An outbound proxy for this provider only (`http://`, `https://`, `socks5://`).
    proxy: Option<String>,
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

/// Anthropic's smallest allowed thinking budget.
const MIN_THINKING_BUDGET: u32 = 1024;

impl FileConfig {
    pub(super) fn validate(
        self,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Config, ConfigError> {
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

        let mut warnings = Vec::new();
        for provider in &self.providers {
            warnings.extend(provider.warnings());
        }
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
            connections: ConnectionLimits {
                header_read_timeout: positive_secs(
                    self.header_read_timeout_secs,
                    DEFAULT_HEADER_READ_TIMEOUT_SECS,
                    "header_read_timeout_secs",
                )?,
                request_body_timeout: positive_secs(
                    self.request_body_timeout_secs,
                    DEFAULT_REQUEST_BODY_TIMEOUT_SECS,
                    "request_body_timeout_secs",
                )?,
                idle_timeout: positive_secs(
                    self.connection_idle_timeout_secs,
                    DEFAULT_CONNECTION_IDLE_TIMEOUT_SECS,
                    "connection_idle_timeout_secs",
                )?,
                h2_ping_interval: positive_secs(
                    self.h2_ping_interval_secs,
                    DEFAULT_H2_PING_INTERVAL_SECS,
                    "h2_ping_interval_secs",
                )?,
                h2_ping_timeout: positive_secs(
                    self.h2_ping_timeout_secs,
                    DEFAULT_H2_PING_TIMEOUT_SECS,
                    "h2_ping_timeout_secs",
                )?,
            },
            max_runs: nonzero(self.max_runs, DEFAULT_MAX_RUNS, "max_runs")?,
            max_unattached_runs: nonzero(
                self.max_unattached_runs,
                DEFAULT_MAX_UNATTACHED_RUNS,
                "max_unattached_runs",
            )?,
            warnings,
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
    /// Settings that are valid but probably wrong.
    fn warnings(&self) -> Vec<String> {
        if !is_local_url(&self.base_url) {
            return Vec::new();
        }
        self.models
            .iter()
            .filter(|model| model.context_window.is_none())
            .map(|model| {
                format!(
                    "model {:?} (provider {:?}, a self-hosted server) has no context_window: assuming {DEFAULT_CONTEXT_WINDOW} tokens. A server started with a smaller window (llama.cpp -c 8192) refuses long conversations before compaction starts; set context_window to the server's",
                    model.id, self.name
                )
            })
            .collect()
    }

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
        let base_url = base_url.trim_end_matches('/').to_owned();
        let proxy = self.proxy.filter(|p| !p.trim().is_empty());
        if let Some(proxy) = &proxy
            && reqwest::Proxy::all(proxy.as_str()).is_err()
        {
            return Err(ConfigError::Proxy {
                provider: self.name,
            });
        }
        Ok(ProviderConfig {
            route: Route::resolve(&base_url, proxy.as_deref(), env),
            name: self.name,
            kind,
            base_url,
            api_key,
            models,
        })
    }
}
