//! The configuration file as written (`cursor-byok.toml`) and its validation into `Config`: every
//! field's default, every rule. `config.rs` owns the validated types the server reads.
//!
//! A file of its own so that `config.rs` (the types, model resolution) and the validation rules
//! each stay readable; only `Config::from_toml` calls in here.
//!
//! Length: one field and one rule per top-level setting, read together; split, a setting's
//! default and its rule would sit in different files.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::*;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FileConfig {
    listen: Option<String>,
    database_url: Option<String>,
    database_max_connections: Option<u32>,
    database_acquire_timeout_ms: Option<u64>,
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
    unattached_wait_ms: Option<u64>,
    key_cooldown_secs: Option<u64>,
    key_refused_cooldown_secs: Option<u64>,
    console_token: Option<String>,
    console_token_env: Option<String>,
    #[serde(default)]
    providers: Vec<FileProvider>,
    /// The model each mode runs on when Cursor sends Auto or an aliased name.
    #[serde(default)]
    modes: routing::FileModes,
    /// The model each subagent type runs on (`default`: any other type), likewise.
    #[serde(default)]
    subagents: BTreeMap<String, String>,
    cluster: Option<cluster::FileCluster>,
    auth: Option<auth::FileAuth>,
    #[serde(default)]
    teams: Vec<auth::FileTeam>,
    #[serde(default)]
    users: Vec<auth::FileUser>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileProvider {
    name: String,
    kind: String,
    base_url: String,
    api_key: Option<String>,
    api_key_env: Option<String>,
    /// Several keys written in the file (calls are spread over them).
    api_keys: Option<Vec<String>>,
    /// Several environment variables, one key each.
    api_key_envs: Option<Vec<String>>,
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
    pricing: Option<Pricing>,
    #[serde(default)]
    aliases: Vec<String>,
    #[serde(default)]
    fallbacks: Vec<String>,
    context_fallback: Option<String>,
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
        let mut problems = Problems::default();
        let listen_text = env(ENV_LISTEN)
            .or(self.listen)
            .unwrap_or_else(|| DEFAULT_LISTEN.to_owned());
        let listen = listen_text
            .parse::<SocketAddr>()
            .map_err(|e| ConfigError::Listen {
                value: listen_text.clone(),
                message: e.to_string(),
            })
            .map(Some)
            .report(&mut problems);
        let database_url = env(ENV_DATABASE_URL)
            .or(self.database_url)
            .unwrap_or_else(|| DEFAULT_DATABASE_URL.to_owned());
        // The value may hold a password: the error names the problem, not the value.
        let supported = ["sqlite:", "postgres://", "postgresql://"];
        if !supported
            .iter()
            .any(|scheme| database_url.starts_with(scheme))
        {
            problems.push(ConfigError::DatabaseUrl("the value given (not printed)"));
        }

        let mut warnings = Vec::new();
        for provider in &self.providers {
            warnings.extend(provider.warnings());
        }
        let providers = validate_providers(self.providers, env, &mut problems);
        let routing =
            routing::validate_file(&providers, self.modes, self.subagents, &mut problems.0);
        // Without a valid provider there is no model to check the default against.
        let default_model = if providers.is_empty() {
            String::new()
        } else {
            default_model(env(ENV_DEFAULT_MODEL).or(self.default_model), &providers)
                .report(&mut problems)
        };

        let tool_output_max_bytes = nonzero(
            self.tool_output_max_bytes,
            DEFAULT_TOOL_OUTPUT_MAX_BYTES,
            "tool_output_max_bytes",
        )
        .report(&mut problems);
        let compact_at_percent = self
            .compact_at_percent
            .unwrap_or(DEFAULT_COMPACT_AT_PERCENT);
        if !(10..=100).contains(&compact_at_percent) {
            problems.push(ConfigError::CompactAtPercent(compact_at_percent));
        }
        let max_frame_bytes = nonzero(
            self.max_frame_bytes,
            DEFAULT_MAX_FRAME_BYTES,
            "max_frame_bytes",
        )
        .report(&mut problems);
        let config = Config {
            // A placeholder when the address is wrong: the configuration is then not used.
            listen: listen.unwrap_or(SocketAddr::from(([127, 0, 0, 1], 0))),
            database_url,
            database_max_connections: nonzero(
                self.database_max_connections,
                DEFAULT_DATABASE_MAX_CONNECTIONS,
                "database_max_connections",
            )
            .report(&mut problems),
            database_acquire_timeout: Duration::from_millis(
                nonzero(
                    self.database_acquire_timeout_ms,
                    DEFAULT_DATABASE_ACQUIRE_TIMEOUT_MS,
                    "database_acquire_timeout_ms",
                )
                .report(&mut problems),
            ),
            default_model,
            max_frame_bytes,
            provider_idle_timeout: positive_secs(
                self.provider_idle_timeout_secs,
                DEFAULT_PROVIDER_IDLE_TIMEOUT_SECS,
                "provider_idle_timeout_secs",
            )
            .report(&mut problems),
            provider_connect_timeout: positive_secs(
                self.provider_connect_timeout_secs,
                DEFAULT_PROVIDER_CONNECT_TIMEOUT_SECS,
                "provider_connect_timeout_secs",
            )
            .report(&mut problems),
            run_request_timeout: positive_secs(
                self.run_request_timeout_secs,
                DEFAULT_RUN_REQUEST_TIMEOUT_SECS,
                "run_request_timeout_secs",
            )
            .report(&mut problems),
            tool_output_max_bytes,
            compact_at_percent,
            web_search: self
                .web_search
                .map(|w| w.validate(env))
                .transpose()
                .report(&mut problems),
            upstream: upstream(self.pass_through, self.upstream_url, self.upstream_proxy)
                .report(&mut problems),
            reconnect_grace: millis(self.reconnect_grace_ms, DEFAULT_RECONNECT_GRACE_MS),
            interrupt_wait: Duration::from_millis(
                nonzero(
                    self.interrupt_wait_ms,
                    DEFAULT_INTERRUPT_WAIT_MS,
                    "interrupt_wait_ms",
                )
                .report(&mut problems),
            ),
            client_idle_timeout: positive_secs(
                self.client_idle_timeout_secs,
                DEFAULT_CLIENT_IDLE_TIMEOUT_SECS,
                "client_idle_timeout_secs",
            )
            .report(&mut problems),
            heartbeat_interval: Duration::from_millis(
                nonzero(
                    self.heartbeat_interval_ms,
                    DEFAULT_HEARTBEAT_INTERVAL_MS,
                    "heartbeat_interval_ms",
                )
                .report(&mut problems),
            ),
            checkpoint_ack_timeout: millis(
                self.checkpoint_ack_timeout_ms,
                DEFAULT_CHECKPOINT_ACK_TIMEOUT_MS,
            ),
            kv_retry_after: Duration::from_millis(
                nonzero(
                    self.kv_retry_after_ms,
                    DEFAULT_KV_RETRY_AFTER_MS,
                    "kv_retry_after_ms",
                )
                .report(&mut problems),
            ),
            provider_max_attempts: nonzero(
                self.provider_max_attempts,
                DEFAULT_PROVIDER_MAX_ATTEMPTS,
                "provider_max_attempts",
            )
            .report(&mut problems),
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
                )
                .report(&mut problems),
                request_body_timeout: positive_secs(
                    self.request_body_timeout_secs,
                    DEFAULT_REQUEST_BODY_TIMEOUT_SECS,
                    "request_body_timeout_secs",
                )
                .report(&mut problems),
                idle_timeout: positive_secs(
                    self.connection_idle_timeout_secs,
                    DEFAULT_CONNECTION_IDLE_TIMEOUT_SECS,
                    "connection_idle_timeout_secs",
                )
                .report(&mut problems),
                h2_ping_interval: positive_secs(
                    self.h2_ping_interval_secs,
                    DEFAULT_H2_PING_INTERVAL_SECS,
                    "h2_ping_interval_secs",
                )
                .report(&mut problems),
                h2_ping_timeout: positive_secs(
                    self.h2_ping_timeout_secs,
                    DEFAULT_H2_PING_TIMEOUT_SECS,
                    "h2_ping_timeout_secs",
                )
                .report(&mut problems),
            },
            max_runs: nonzero(self.max_runs, DEFAULT_MAX_RUNS, "max_runs").report(&mut problems),
            max_unattached_runs: nonzero(
                self.max_unattached_runs,
                DEFAULT_MAX_UNATTACHED_RUNS,
                "max_unattached_runs",
            )
            .report(&mut problems),
            unattached_wait: millis(self.unattached_wait_ms, DEFAULT_UNATTACHED_WAIT_MS),
            key_cooldown: KeyCooldown {
                rate_limited: positive_secs(
                    self.key_cooldown_secs,
                    DEFAULT_KEY_COOLDOWN_SECS,
                    "key_cooldown_secs",
                )
                .report(&mut problems),
                refused: positive_secs(
                    self.key_refused_cooldown_secs,
                    DEFAULT_KEY_REFUSED_COOLDOWN_SECS,
                    "key_refused_cooldown_secs",
                )
                .report(&mut problems),
            },
            console_token: resolve_key(
                "console_token",
                self.console_token,
                self.console_token_env,
                env,
            )
            .report(&mut problems),
            warnings,
            routing,
            cluster: self
                .cluster
                .map(|c| c.validate(env))
                .transpose()
                .report(&mut problems),
            auth: auth::validate_section(
                (self.auth, self.teams, self.users),
                self.pass_through != Some(false),
                &mut problems.0,
            ),
        };
        if !problems.0.is_empty() {
            return Err(problems.into_error());
        }
        Ok(config)
    }
}

/// Every problem found in the file, so one run of `check` (or one failed start) names them all.
#[derive(Default)]
pub(super) struct Problems(pub(super) Vec<ConfigError>);

impl Problems {
    fn push(&mut self, error: ConfigError) {
        self.0.push(error);
    }

    fn into_error(mut self) -> ConfigError {
        if self.0.len() == 1 {
            self.0.remove(0)
        } else {
            ConfigError::Several(self.0)
        }
    }
}

/// Keeps a validation going past a problem: the problem is noted and a placeholder stands in (the
/// configuration is not used when any problem was noted).
trait Report<T> {
    fn report(self, problems: &mut Problems) -> T;
}

impl<T: Default> Report<T> for Result<T, ConfigError> {
    fn report(self, problems: &mut Problems) -> T {
        self.unwrap_or_else(|error| {
            problems.push(error);
            T::default()
        })
    }
}

/// Every provider, validated; provider names and model ids are unique across the file. Each
/// problem is noted and the rest still checked; a provider with a problem is left out.
fn validate_providers(
    file: Vec<FileProvider>,
    env: &dyn Fn(&str) -> Option<String>,
    problems: &mut Problems,
) -> Vec<ProviderConfig> {
    if file.is_empty() {
        problems.push(ConfigError::NoProviders);
        return Vec::new();
    }
    let mut providers = Vec::with_capacity(file.len());
    let mut provider_names = HashSet::new();
    for provider in file {
        if !provider_names.insert(provider.name.clone()) {
            problems.push(ConfigError::DuplicateProvider(provider.name));
            continue;
        }
        if let Some(provider) = provider.validate(env, problems) {
            providers.push(provider);
        }
    }
    let mut model_owner: HashMap<&str, &str> = HashMap::new();
    for provider in &providers {
        for model in &provider.models {
            if let Some(first) = model_owner.insert(&model.id, &provider.name) {
                problems.push(ConfigError::DuplicateModel {
                    model: model.id.clone(),
                    first: first.to_owned(),
                    second: provider.name.clone(),
                });
            }
        }
    }
    providers
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
            given: "api_key, api_key_env".to_owned(),
        }),
        (Some(key), None) if !key.is_empty() => Ok(Some(Secret::new(key))),
        (Some(_), None) => Err(ConfigError::MissingKey {
            provider: owner.to_owned(),
        }),
        (None, None) => Ok(None),
        (None, Some(var)) if looks_like_a_key(&var) => Err(ConfigError::KeyInEnvName {
            provider: owner.to_owned(),
        }),
        (None, Some(var)) => match env(&var) {
            Some(key) if !key.is_empty() => Ok(Some(Secret::new(key))),
            _ => Err(ConfigError::MissingKeyEnv {
                provider: owner.to_owned(),
                var,
                field: "api_key_env",
            }),
        },
    }
}

/// A provider's keys, from exactly one of `api_key`, `api_key_env`, `api_keys`, `api_key_envs`;
/// every problem is noted (each unset variable of a list, not only the first), and an empty list
/// comes back with them.
fn resolve_keys(
    provider: &FileProvider,
    env: &dyn Fn(&str) -> Option<String>,
    problems: &mut Problems,
) -> Vec<ProviderKey> {
    let owner = || provider.name.clone();
    let given: Vec<&str> = [
        ("api_key", provider.api_key.is_some()),
        ("api_key_env", provider.api_key_env.is_some()),
        ("api_keys", provider.api_keys.is_some()),
        ("api_key_envs", provider.api_key_envs.is_some()),
    ]
    .into_iter()
    .filter_map(|(field, set)| set.then_some(field))
    .collect();
    if given.len() > 1 {
        problems.push(ConfigError::AmbiguousKey {
            provider: owner(),
            given: given.join(", "),
        });
        return Vec::new();
    }
    let listed = |field: &'static str, list: &Vec<String>, problems: &mut Problems| {
        if list.is_empty() {
            problems.push(ConfigError::EmptyKeyList {
                provider: owner(),
                field,
            });
        }
    };
    let mut keys = Vec::new();
    if let Some(list) = &provider.api_keys {
        listed("api_keys", list, problems);
        for key in list {
            match resolve_key(&provider.name, Some(key.clone()), None, env) {
                Ok(Some(secret)) => keys.push(ProviderKey { secret, env: None }),
                Ok(None) => {}
                Err(error) => problems.push(error),
            }
        }
    } else if let Some(list) = &provider.api_key_envs {
        listed("api_key_envs", list, problems);
        for var in list {
            match resolve_key(&provider.name, None, Some(var.clone()), env) {
                Ok(Some(secret)) => keys.push(ProviderKey {
                    secret,
                    env: Some(var.clone()),
                }),
                Ok(None) => {}
                Err(ConfigError::MissingKeyEnv { provider, var, .. }) => {
                    problems.push(ConfigError::MissingKeyEnv {
                        provider,
                        var,
                        field: "api_key_envs",
                    })
                }
                Err(error) => problems.push(error),
            }
        }
    } else {
        let single = resolve_key(
            &provider.name,
            provider.api_key.clone(),
            provider.api_key_env.clone(),
            env,
        );
        match single {
            Ok(Some(secret)) => keys.push(ProviderKey {
                secret,
                env: provider.api_key_env.clone(),
            }),
            Ok(None) => problems.push(ConfigError::MissingKey { provider: owner() }),
            Err(error) => problems.push(error),
        }
    }
    keys
}

/// Whether a value given as a variable *name* is a key pasted in the wrong place: not a variable
/// name at all, a key's prefix, or a long mix of lower case and digits no one names a variable.
fn looks_like_a_key(name: &str) -> bool {
    let is_name = !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    let prefixed = ["sk-", "sk_", "sk-ant-", "gsk_", "xai-", "AIza"]
        .iter()
        .any(|prefix| name.starts_with(prefix));
    let random = name.len() >= 32
        && name.chars().any(|c| c.is_ascii_lowercase())
        && name.chars().any(|c| c.is_ascii_digit());
    !is_name || prefixed || random
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
        let mut warnings = Vec::new();
        // The same key twice doubles its share of the calls and hides that it is one rate limit.
        for (field, list) in [
            ("api_keys", &self.api_keys),
            ("api_key_envs", &self.api_key_envs),
        ] {
            let list = list.as_deref().unwrap_or_default();
            if list.iter().collect::<HashSet<_>>().len() < list.len() {
                warnings.push(format!(
                    "provider {:?} lists the same entry twice in {field}: that key gets twice the calls, and its rate limit is still one",
                    self.name
                ));
            }
        }
        if !is_local_url(&self.base_url) {
            return warnings;
        }
        warnings.extend(self.models
            .iter()
            .filter(|model| model.context_window.is_none())
            .map(|model| {
                format!(
                    "model {:?} (provider {:?}, a self-hosted server) has no context_window: assuming {DEFAULT_CONTEXT_WINDOW} tokens. A server started with a smaller window (llama.cpp -c 8192) refuses long conversations before compaction starts; set context_window to the server's",
                    model.id, self.name
                )
            }));
        warnings
    }

    /// The provider, or `None` with each of its problems noted.
    fn validate(
        self,
        env: &dyn Fn(&str) -> Option<String>,
        problems: &mut Problems,
    ) -> Option<ProviderConfig> {
        let before = problems.0.len();
        let name = self.name.clone();
        let kind = ProviderKind::parse(&self.kind);
        if kind.is_none() {
            problems.push(ConfigError::UnknownKind {
                provider: name.clone(),
                kind: self.kind.clone(),
            });
        }
        let keys = resolve_keys(&self, env, problems);
        let base_url = http_url(&name, self.base_url).report(problems);
        if self.models.is_empty() {
            problems.push(ConfigError::NoModels {
                provider: name.clone(),
            });
        }
        let proxy = self.proxy.filter(|p| !p.trim().is_empty());
        if let Some(proxy) = &proxy
            && reqwest::Proxy::all(proxy.as_str()).is_err()
        {
            problems.push(ConfigError::Proxy {
                provider: name.clone(),
            });
        }
        let models: Vec<ModelConfig> = self
            .models
            .into_iter()
            .filter_map(|model| model.validate(&name, kind, problems))
            .collect();
        let (Some(kind), true) = (kind, problems.0.len() == before) else {
            return None;
        };
        let base_url = base_url.trim_end_matches('/').to_owned();
        Some(ProviderConfig {
            route: Route::resolve(&base_url, proxy.as_deref(), env),
            name,
            kind,
            base_url,
            keys,
            models,
        })
    }
}

impl FileModel {
    /// The model, or `None` with its problem noted.
    fn validate(
        self,
        provider: &str,
        kind: Option<ProviderKind>,
        problems: &mut Problems,
    ) -> Option<ModelConfig> {
        let model = self;
        if model.id.trim().is_empty() {
            problems.push(ConfigError::EmptyModelId(provider.to_owned()));
            return None;
        }
        let max_output_tokens = model.max_output_tokens.unwrap_or(DEFAULT_MAX_OUTPUT_TOKENS);
        if let Some(budget) = model.thinking_budget
            && (budget < MIN_THINKING_BUDGET || budget >= max_output_tokens)
        {
            problems.push(ConfigError::ThinkingBudget {
                model: model.id,
                budget,
                max_output_tokens,
            });
            return None;
        }
        let Ok(serde_json::Value::Object(extra_body)) =
            serde_json::to_value(&model.quirks.extra_body)
        else {
            problems.push(ConfigError::ExtraBody { model: model.id });
            return None;
        };
        Some(ModelConfig {
            upstream_id: model.upstream_id.unwrap_or_else(|| model.id.clone()),
            display_name: model.display_name.unwrap_or_else(|| model.id.clone()),
            context_window: model.context_window.unwrap_or(DEFAULT_CONTEXT_WINDOW),
            reasoning: model.reasoning,
            max_output_tokens: model.max_output_tokens,
            thinking_budget: model.thinking_budget,
            vision: model
                .vision
                .unwrap_or(!matches!(kind, Some(ProviderKind::OpenAiChat))),
            quirks: Quirks {
                stream_usage: model.quirks.stream_usage.unwrap_or(true),
                reasoning_content_on_tool_calls: model
                    .quirks
                    .reasoning_content_on_tool_calls
                    .unwrap_or(model.reasoning),
                extra_body,
            },
            pricing: model.pricing,
            aliases: model.aliases,
            fallbacks: model.fallbacks,
            context_fallback: model.context_fallback,
            id: model.id,
        })
    }
}
