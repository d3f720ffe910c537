//! The Prometheus metrics: every name, label and bucket in one place, and the one process-wide
//! recorder `/metrics` renders. Callers say what happened (a run ended, a provider call ended, a
//! blob was acknowledged); this file decides how it is counted. `docs/operations.md` lists each.
//!
//! Recording is a few atomic operations on the hot path (no allocation once a label set has been
//! seen, no I/O); rendering happens only when `/metrics` is scraped.

use std::sync::OnceLock;
use std::time::Duration;

use metrics::{counter, gauge, histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use crate::model::usage::Usage;

pub const RUNS_ACTIVE: &str = "cursor_byok_runs_active";
pub const RUNS_ENDED: &str = "cursor_byok_runs_ended_total";
pub const PROVIDER_CALLS: &str = "cursor_byok_provider_calls_total";
pub const PROVIDER_ATTEMPTS: &str = "cursor_byok_provider_attempts_total";
pub const FIRST_EVENT: &str = "cursor_byok_provider_first_event_seconds";
pub const CALL_DURATION: &str = "cursor_byok_provider_call_seconds";
pub const TOKENS: &str = "cursor_byok_tokens_total";
pub const TOOL_EXECS: &str = "cursor_byok_tool_execs_total";
pub const KV_BLOBS: &str = "cursor_byok_kv_blobs_total";
pub const CHECKPOINT_PUBLISH: &str = "cursor_byok_checkpoint_publish_seconds";
pub const CONNECTIONS_OPEN: &str = "cursor_byok_connections_open";
pub const RUNS_REFUSED: &str = "cursor_byok_runs_refused_total";
/// BidiAppends whose new run waits for a place under `max_unattached_runs` now.
pub const RUNS_WAITING: &str = "cursor_byok_runs_waiting";
pub const FALLBACKS: &str = "cursor_byok_provider_fallbacks_total";
pub const SCHEMA_DRIFT: &str = "cursor_byok_schema_drift_total";
pub const KEYS_COOLING: &str = "cursor_byok_provider_keys_cooling";
/// `[cluster]`: 1, labelled with this node's name. An info series rather than a `node` label on
/// every series (Prometheus's convention, as `build_info`): which process a scrape came from is
/// the target's identity (`instance`), and a query that wants the node's name joins it on
/// (`… * on(instance) group_left(node) cursor_byok_node_info`), so no series changes its labels
/// when a node is renamed and a single node's series stay as they were.
/// `[auth]`: requests refused by the identity layer, by Connect code (no user label: the series
/// stay bounded however many people use the server).
pub const AUTH_REFUSED: &str = "cursor_byok_auth_refused_total";
/// `[auth]` budgets: a limit refused a call or warned (soft), by team, kind (`refused`, `warned`)
/// and limit; no user label.
pub const BUDGET_EVENTS: &str = "cursor_byok_budget_events_total";
pub const NODE_INFO: &str = "cursor_byok_node_info";

/// Seconds: from a few milliseconds (a local model's first token) to ten minutes (a long
/// reasoning call).
const LATENCY_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
];

static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();

/// Installs the process-wide recorder (once; later calls reuse it). `None` when another recorder
/// was installed first (an embedding program's): `/metrics` then says so instead of lying.
pub fn install() -> Option<&'static PrometheusHandle> {
    HANDLE
        .get_or_init(|| {
            let builder = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Suffix("_seconds".to_owned()), LATENCY_BUCKETS)
                .ok()?;
            match builder.install_recorder() {
                Ok(handle) => Some(handle),
                Err(e) => {
                    tracing::warn!("metrics are off: {e}");
                    None
                }
            }
        })
        .as_ref()
}

/// The text `/metrics` answers with: every series in Prometheus exposition format. Gauges that are
/// a state now (open runs, each provider's keys cooling down) are read at the scrape, since a
/// cooldown ends by time, not by an event that could set them.
pub fn render(
    active_runs: usize,
    keys_cooling: &[(String, usize)],
    node: Option<&str>,
) -> Option<String> {
    let handle = install()?;
    if let Some(node) = node {
        gauge!(NODE_INFO, "node" => node.to_owned()).set(1.0);
    }
    gauge!(RUNS_ACTIVE).set(active_runs as f64);
    for (provider, cooling) in keys_cooling {
        gauge!(KEYS_COOLING, "provider" => provider.clone()).set(*cooling as f64);
    }
    Some(handle.render())
}

/// How a run reached the server: RunSSE with BidiAppend (IDE and CLI over HTTP/1.1), or the
/// HTTP/2 bidi `Run` stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    RunSse,
    Http2Run,
}

impl Transport {
    pub fn as_str(self) -> &'static str {
        match self {
            Transport::RunSse => "run_sse",
            Transport::Http2Run => "http2_run",
        }
    }
}

/// A run ended with `status`: `succeeded`, `failed`, `canceled` (as recorded), `not_started` (its
/// stream closed before a run request) or `panicked`.
pub fn run_ended(transport: Transport, status: &'static str) {
    counter!(RUNS_ENDED, "transport" => transport.as_str(), "status" => status).increment(1);
}

/// A new run was refused because a limit on open runs was reached (`limit` names which).
pub fn run_refused(limit: &'static str) {
    counter!(RUNS_REFUSED, "limit" => limit).increment(1);
}

/// A BidiAppend's new run started (`1.0`) or stopped (`-1.0`) waiting for a place under
/// `max_unattached_runs`.
pub fn run_waiting(delta: f64) {
    gauge!(RUNS_WAITING).increment(delta);
}

/// A request was refused by the identity layer with Connect code `code`.
pub fn auth_refused(code: &'static str) {
    counter!(AUTH_REFUSED, "code" => code).increment(1);
}

/// A budget limit refused a call or warned (`kind`), for a member of `team` (`none`: no team).
pub fn budget_event(team: &str, kind: &'static str, limit: &'static str) {
    counter!(BUDGET_EVENTS, "team" => team.to_owned(), "kind" => kind, "limit" => limit)
        .increment(1);
}

/// A call on model `from` failed before streaming and went to its fallback `to` (both configured
/// model ids: the labels stay bounded).
pub fn fallback(from: &str, to: &str) {
    counter!(FALLBACKS, "from" => from.to_owned(), "to" => to.to_owned()).increment(1);
}

/// What one provider call did, as recorded when it ended.
pub struct CallReport<'a> {
    pub provider: &'a str,
    pub model: &'a str,
    /// `success` or the error's kind (`http_4xx`, `idle`, `truncated`, ...).
    pub outcome: &'a str,
    pub attempts: u32,
    pub first_event: Option<Duration>,
    pub total: Duration,
    pub usage: &'a Usage,
}

pub fn provider_call(call: &CallReport<'_>) {
    let (provider, model) = (call.provider.to_owned(), call.model.to_owned());
    counter!(PROVIDER_CALLS, "provider" => provider.clone(), "model" => model.clone(), "outcome" => call.outcome.to_owned())
        .increment(1);
    counter!(PROVIDER_ATTEMPTS, "provider" => provider.clone(), "model" => model.clone())
        .increment(u64::from(call.attempts));
    if let Some(first) = call.first_event {
        histogram!(FIRST_EVENT, "provider" => provider.clone(), "model" => model.clone())
            .record(first.as_secs_f64());
    }
    histogram!(CALL_DURATION, "provider" => provider.clone(), "model" => model.clone())
        .record(call.total.as_secs_f64());
    let buckets = [
        ("input", call.usage.input_tokens),
        ("output", call.usage.output_tokens),
        ("cache_read", call.usage.cache_read_tokens),
        ("cache_write", call.usage.cache_write_tokens),
        ("reasoning", call.usage.reasoning_tokens),
    ];
    for (bucket, tokens) in buckets {
        if let Some(tokens) = tokens.filter(|t| *t > 0) {
            counter!(TOKENS, "provider" => provider.clone(), "model" => model.clone(), "bucket" => bucket)
                .increment(tokens);
        }
    }
}

/// A tool call's result was stored: `outcome` is `success` or `error`.
pub fn tool_exec(tool: &str, outcome: &'static str) {
    counter!(TOOL_EXECS, "tool" => tool.to_owned(), "outcome" => outcome).increment(1);
}

/// What happened to a blob on its way to the client's KV store.
#[derive(Debug, Clone, Copy)]
pub enum KvEvent {
    Sent,
    Acknowledged,
    Resent,
}

pub fn kv_blob(event: KvEvent) {
    let event = match event {
        KvEvent::Sent => "sent",
        KvEvent::Acknowledged => "acknowledged",
        KvEvent::Resent => "resent",
    };
    counter!(KV_BLOBS, "event" => event).increment(1);
}

/// A checkpoint was published `waited` after it was built (the wait is for its blobs' acks).
pub fn checkpoint_published(waited: Duration) {
    histogram!(CHECKPOINT_PUBLISH).record(waited.as_secs_f64());
}

pub fn connection_opened() {
    gauge!(CONNECTIONS_OPEN).increment(1.0);
}

pub fn connection_closed() {
    gauge!(CONNECTIONS_OPEN).decrement(1.0);
}

/// A client sent something the schema does not know, for the first time: one series per (message,
/// field number), `kind` `field` or `enum_value` (`ops/drift.rs`). Counted once per distinct field, so
/// the series' value is 1 and their number is how many distinct fields drifted.
pub fn schema_drift(message: &'static str, field: u32, kind: &'static str) {
    counter!(SCHEMA_DRIFT, "message" => message, "field" => field.to_string(), "kind" => kind)
        .increment(1);
}
