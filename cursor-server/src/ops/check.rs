//! `cursor-server check`: the pre-flight a person runs before pointing Cursor at the server. The
//! configuration's every problem and warning; each provider's resolved URL and route (direct or
//! which proxy); each model probed with a minimal request, a failure explained in a person's words
//! (the key, the path, the model id, the address or the proxy). A provider with several keys has
//! each key listed by its source (`key 2 (KEY_2)`, never the key) and probed on its own. The probe
//! is also what the console calls to test a provider.

use std::time::{Duration, Instant};

use crate::config::{Config, KeyCooldown, ModelConfig, ProviderConfig};
use crate::provider;
use crate::store::StoreError;

/// How a model answered its probe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Probe {
    /// It answered; the call took this long.
    Ok { millis: u64 },
    /// It could not be used, and why, in words.
    Failed { cause: String },
}

impl Probe {
    pub fn is_ok(&self) -> bool {
        matches!(self, Probe::Ok { .. })
    }
}

/// How long one probe may take, connection included.
const PROBE_TIMEOUT: Duration = Duration::from_secs(30);

/// Sends `model` the smallest request its endpoint accepts, with the provider's first key, and says
/// what came of it.
pub async fn probe(
    http: &reqwest::Client,
    provider: &ProviderConfig,
    model: &ModelConfig,
) -> Probe {
    probe_key(http, provider, model, 0, KeyCooldown::default()).await
}

/// `probe` with the provider's key `key` (its index from 0); a key turned away (429, 401) is said
/// to cool down as a running server with `cooldown` would have it.
pub async fn probe_key(
    http: &reqwest::Client,
    provider: &ProviderConfig,
    model: &ModelConfig,
    key: usize,
    cooldown: KeyCooldown,
) -> Probe {
    let url = format!(
        "{}{}",
        provider.base_url,
        provider.kind.family().endpoint_path()
    );
    let body = provider.kind.family().probe(&model.upstream_id);
    let Some(secret) = provider.keys.get(key).map(|k| &k.secret) else {
        return Probe::Failed {
            cause: format!("provider {:?} has no key {}", provider.name, key + 1),
        };
    };
    let request = provider
        .kind
        .family()
        .authorize(http.post(&url).json(&body), secret);
    let started = Instant::now();
    match tokio::time::timeout(PROBE_TIMEOUT, request.send()).await {
        Err(_) => Probe::Failed {
            cause: format!(
                "no answer within {} s from {url} ({}): is the server up, and is it the right port?",
                PROBE_TIMEOUT.as_secs(),
                provider.route.shown()
            ),
        },
        Ok(Err(error)) => Probe::Failed {
            cause: unreachable(&error, provider),
        },
        Ok(Ok(response)) if response.status().is_success() => Probe::Ok {
            millis: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
        },
        Ok(Ok(response)) => {
            let status = response.status().as_u16();
            let retry_after = response
                .headers()
                .get(reqwest::header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            let text = response.text().await.unwrap_or_default();
            let mut cause = refused(status, &text, &url, provider, model, key);
            // What a running server does with this key: leaves it out for a while.
            let cooling = match (status, retry_after) {
                (429, Some(after)) => Some(format!("{after} s (its retry-after)")),
                (429, None) => Some(format!(
                    "{} s (key_cooldown_secs)",
                    cooldown.rate_limited.as_secs()
                )),
                (401, _) => Some(format!(
                    "{} s (key_refused_cooldown_secs)",
                    cooldown.refused.as_secs()
                )),
                _ => None,
            };
            if let Some(cooling) = cooling {
                cause.push_str(&format!(
                    "; a running server leaves this key out for {cooling}"
                ));
            }
            Probe::Failed { cause }
        }
    }
}

/// A connection that failed, in words: the address, the name, or the proxy.
fn unreachable(error: &reqwest::Error, provider: &ProviderConfig) -> String {
    let host = provider.host();
    let route = provider.route.shown();
    let detail = std::iter::successors(Some(error as &dyn std::error::Error), |e| e.source())
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(": ")
        .to_ascii_lowercase();
    let through_proxy = provider.route.proxy().is_some();
    if detail.contains("refused") {
        if through_proxy {
            format!(
                "connection refused ({route}): the proxy is not listening, or it refused {host}"
            )
        } else {
            format!(
                "connection refused: nothing listens at {host}; check base_url's address and port, and that the server is running"
            )
        }
    } else if detail.contains("dns") || detail.contains("resolve") || detail.contains("lookup") {
        format!("the host in base_url ({host}) could not be found ({route}): check its spelling")
    } else if detail.contains("certificate") || detail.contains("tls") {
        format!("the TLS connection to {host} failed ({route}): {detail}")
    } else {
        format!("{host} could not be reached ({route}): {detail}")
    }
}

/// A provider's refusal, in words.
fn refused(
    status: u16,
    body: &str,
    url: &str,
    provider: &ProviderConfig,
    model: &ModelConfig,
    key: usize,
) -> String {
    let said = provider_message(body);
    match status {
        401 => format!(
            "HTTP 401: the API key was refused: {} of provider {:?}; check it ({said})",
            key_name(provider, key),
            provider.name
        ),
        403 => format!(
            "HTTP 403: the key may not use model {:?} ({said})",
            model.upstream_id
        ),
        404 if said.to_ascii_lowercase().contains("model") => format!(
            "HTTP 404: the provider does not know the model id {:?}; check upstream_id (or id) ({said})",
            model.upstream_id
        ),
        404 => format!(
            "HTTP 404 at {url}: no such path; base_url should end where the API's version does (for example http://127.0.0.1:8080/v1), without {}",
            provider.kind.family().endpoint_path()
        ),
        429 => format!("HTTP 429: rate limited or out of quota ({said})"),
        _ => format!("HTTP {status}: {said}"),
    }
}

/// The provider's own error message from a JSON error body, else the body's start.
fn provider_message(body: &str) -> String {
    let parsed: Option<serde_json::Value> = serde_json::from_str(body).ok();
    let message = parsed.as_ref().and_then(|v| {
        v.pointer("/error/message")
            .or_else(|| v.get("message"))
            .or_else(|| v.get("error"))
            .and_then(serde_json::Value::as_str)
    });
    match message {
        Some(message) => message.to_owned(),
        None => body.chars().take(200).collect(),
    }
}

/// Runs the whole check and prints it; `true` when all is well.
pub async fn run(config: &Config) -> bool {
    for warning in &config.warnings {
        println!("warning: {warning}");
    }
    let http = match provider::http_client(config) {
        Ok(http) => http,
        Err(e) => {
            println!("the HTTP client could not be built: {e}");
            return false;
        }
    };
    let mut all_ok = check_database(&config.database_url).await;
    println!("routing:");
    for line in config.routing_table() {
        println!("  {line}");
    }
    for provider_config in &config.providers {
        println!(
            "provider {:?} ({}): {}{}, {}",
            provider_config.name,
            provider_config.kind.name(),
            provider_config.base_url,
            provider_config.kind.family().endpoint_path(),
            provider_config.route.shown()
        );
        let keys: Vec<String> = (0..provider_config.keys.len())
            .map(|i| key_name(provider_config, i))
            .collect();
        println!("  keys: {}", keys.join(", "));
        // Several keys: each is probed on its own (with the first model), and the models with
        // the first key that works.
        let mut model_key = 0;
        if provider_config.keys.len() > 1
            && let Some(first_model) = provider_config.models.first()
        {
            let mut working = None;
            for (i, name) in keys.iter().enumerate() {
                let result =
                    probe_key(&http, provider_config, first_model, i, config.key_cooldown).await;
                match &result {
                    Probe::Ok { millis } => println!("  {name}: ok ({millis} ms)"),
                    Probe::Failed { cause } => println!("  {name}: FAILED: {cause}"),
                }
                working = working.or(result.is_ok().then_some(i));
                all_ok &= result.is_ok();
            }
            model_key = working.unwrap_or(0);
        }
        for model in &provider_config.models {
            let result = probe_key(
                &http,
                provider_config,
                model,
                model_key,
                config.key_cooldown,
            )
            .await;
            match &result {
                Probe::Ok { millis } => println!("  model {:?}: ok ({millis} ms)", model.id),
                Probe::Failed { cause } => println!("  model {:?}: FAILED: {cause}", model.id),
            }
            all_ok &= result.is_ok();
        }
    }
    if let Some(cluster) = &config.cluster {
        all_ok &= check_cluster(config, cluster).await;
    }
    all_ok
}

/// Prints whether the database is reachable, which schema version it is at and what start-up will
/// do to it; `false` when the server could not use it (unreachable PostgreSQL, a schema newer than
/// this binary, a migration that failed part-way). A SQLite file not created yet is fine: the
/// server creates it.
async fn check_database(url: &str) -> bool {
    let shown = crate::store::postgres::redacted(url);
    let kind = crate::store::DatabaseKind::of_url(url);
    match crate::store::Store::inspect(url).await {
        Ok(status) if status.pending == 0 => {
            println!(
                "database {shown} ({}): reachable, migrated (schema version {})",
                status.kind.name(),
                status.applied
            );
            true
        }
        Ok(status) => {
            println!(
                "database {shown} ({}): reachable, schema version {}; {} migration(s) to version {} are applied at start",
                status.kind.name(),
                status.applied,
                status.pending,
                status.known
            );
            true
        }
        Err(e @ (StoreError::NewerSchema { .. } | StoreError::HalfMigrated { .. })) => {
            println!("database {shown}: FAILED: {e}");
            false
        }
        Err(e) if kind == Some(crate::store::DatabaseKind::Sqlite) => {
            println!("database {shown} (SQLite): not opened ({e}); it is created at start");
            true
        }
        Err(e) => {
            println!("database {shown}: FAILED: {e}");
            false
        }
    }
}

/// `[cluster]`: the nodes this one sees in the shared database, each with its lease's age.
async fn check_cluster(config: &Config, cluster: &crate::config::cluster::ClusterConfig) -> bool {
    println!(
        "cluster: node {:?} at {}, lease {} ms",
        cluster.node_name,
        cluster.internal_url,
        cluster.lease.as_millis()
    );
    let store = match crate::store::Store::open(&config.database_url).await {
        Ok(store) => store,
        Err(e) => {
            println!("  the database: FAILED: {e}");
            return false;
        }
    };
    let nodes = crate::store::nodes::list(&store).await;
    store.close().await;
    let nodes = match nodes {
        Ok(nodes) => nodes,
        Err(e) => {
            println!("  the node registry: FAILED: {e}");
            return false;
        }
    };
    let lease_ms = i64::try_from(cluster.lease.as_millis()).unwrap_or(i64::MAX);
    for node in &nodes {
        let state = match &node.stopped {
            Some(why) => format!("stopped ({why})"),
            None if node.lease_age_ms > lease_ms => "silent past its lease".to_owned(),
            None => "live".to_owned(),
        };
        let me = if node.name == cluster.node_name {
            " (this node)"
        } else {
            ""
        };
        println!(
            "  node {:?}{me} at {}: lease {} ms old, {state}",
            node.name, node.internal_url, node.lease_age_ms
        );
    }
    if nodes.is_empty() {
        println!("  no node has joined yet");
    }
    true
}

/// `key 2 (KEY_2)`: a key's number from 1 and where it comes from, never the key.
pub fn key_name(provider: &ProviderConfig, index: usize) -> String {
    let source = provider.keys.get(index).map_or("missing", |k| k.source());
    format!("key {} ({source})", index + 1)
}
