//! LLM endpoint adapters. `call` starts one streaming provider call and hands back its canonical
//! events: the HTTP, timeouts, keys and the one retry policy (`retry`) every family shares. What
//! differs by family (path, authorization, body, parser, images, probe) is its module behind
//! `family::Family`, chosen from the configured kind by the registry below (`ProviderKind::family`),
//! nowhere else.
//!
//! Length: one call's life is one concept here — request, retries, keys, the SSE read and the
//! receiver that merges ready deltas — and about half the lines are its tests (retry timing,
//! delta merging), which read best beside the code they pin down.

pub mod anthropic;
pub mod event;
pub mod family;
pub mod keys;
pub mod openai_chat;
pub mod openai_responses;
pub mod sse;
pub mod web_search;

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use futures_util::StreamExt as _;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::config::{Config, ProviderConfig, ProviderKind, Route, Secret};
pub use crate::store::runs::FailedAttempt;
pub use event::{Batch, FinishReason, ResponseEvent};
use keys::{KeyLease, KeyPool};

impl ProviderKind {
    /// The registry: one line per family (its module is declared above).
    pub fn family(self) -> &'static dyn family::Family {
        match self {
            ProviderKind::OpenAiChat => &openai_chat::OpenAiChat,
            ProviderKind::OpenAiResponses => &openai_responses::OpenAiResponses,
            ProviderKind::Anthropic => &anthropic::Anthropic,
        }
    }
}

/// How many canonical events may wait between the adapter task and the loop.
const EVENT_BUFFER: usize = 256;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProviderError {
    #[error("{provider} answered HTTP {status}: {message}")]
    Http {
        provider: String,
        status: u16,
        message: String,
    },
    #[error("{provider} could not be reached: {message}")]
    Connect { provider: String, message: String },
    #[error("{provider} sent no response headers within {secs} s")]
    HeadersTimeout { provider: String, secs: u64 },
    #[error("{provider} sent nothing for {secs} s (idle timeout)")]
    Idle { provider: String, secs: u64 },
    #[error("{provider} stream failed: {message}")]
    Stream { provider: String, message: String },
    #[error("{provider} stream ended without its terminal event ({missing})")]
    Truncated {
        provider: String,
        missing: &'static str,
    },
    #[error("{provider} sent an undecodable event: {message}")]
    Decode { provider: String, message: String },
    #[error("{provider} reported an error: {message}")]
    InBand { provider: String, message: String },
    #[error("{0}")]
    Unsupported(String),
    /// Every key of the provider is cooling down (rate limited or refused); none may be used
    /// before `retry_at` (an HTTP date), `retry_in_secs` from when the error was made.
    #[error(
        "all {keys} keys of {provider} are cooling down (rate limited or refused); the first is usable again in {retry_in_secs} s, at {retry_at}"
    )]
    KeysCoolingDown {
        provider: String,
        keys: usize,
        retry_in_secs: u64,
        retry_at: String,
    },
    /// `[auth]`: the person (or their model choice) is over a limit; the call was never sent. The
    /// message names the limit, when it resets and whom to ask.
    #[error("{0}")]
    OverBudget(String),
}

/// The one retry policy: which failures are tried again, by whom. Two questions, answered here
/// together so they stay consistent: what a call retries itself before its first streamed byte,
/// and what the client is told may succeed if it sends the request again.
pub mod retry {
    use super::ProviderError;

    /// A call retries (with backoff, or on another key) an HTTP status that may pass on its own
    /// moments later: 429 (rate limit), 5xx and Anthropic's 529 (overloaded).
    pub fn in_call(status: u16) -> bool {
        status == 429 || status == 529 || (500..=599).contains(&status)
    }

    /// Whether sending the same request again can succeed: a provider that is down, slow, rate
    /// limiting or cut the stream, yes (also 408, 409, 425: the request was fine, its moment was
    /// not, which the call itself does not wait out); a rejected request, key or model, no.
    pub fn by_client(error: &ProviderError) -> bool {
        match error {
            ProviderError::Http { status, .. } => {
                matches!(status, 408 | 409 | 425 | 429) || *status >= 500
            }
            ProviderError::Unsupported(_) | ProviderError::OverBudget(_) => false,
            _ => true,
        }
    }
}

impl ProviderError {
    /// A short, fixed name of the failure (a metrics label).
    pub fn kind(&self) -> &'static str {
        match self {
            ProviderError::Http { status: 429, .. } => "http_429",
            ProviderError::Http { status, .. } if *status >= 500 => "http_5xx",
            ProviderError::Http { .. } => "http_4xx",
            ProviderError::Connect { .. } => "connect",
            ProviderError::HeadersTimeout { .. } => "headers_timeout",
            ProviderError::Idle { .. } => "idle",
            ProviderError::Stream { .. } => "stream",
            ProviderError::Truncated { .. } => "truncated",
            ProviderError::Decode { .. } => "decode",
            ProviderError::InBand { .. } => "in_band",
            ProviderError::Unsupported(_) => "unsupported",
            ProviderError::KeysCoolingDown { .. } => "keys_cooling_down",
            ProviderError::OverBudget(_) => "over_budget",
        }
    }

    /// Whether a call that failed this way before its first streamed event may go to the model's
    /// fallback: the provider was rate limited, down or unreachable (429, 5xx, 529, connection,
    /// no headers or no first byte in time, every key of it cooling down). A request it refused
    /// (4xx) would be refused elsewhere too, and a stream that broke mid-way is never restarted on
    /// another model.
    pub fn falls_back(&self) -> bool {
        match self {
            ProviderError::Http { status, .. } => *status == 429 || *status >= 500,
            // Every key of the provider is cooling down: another provider's model may answer.
            ProviderError::Connect { .. }
            | ProviderError::HeadersTimeout { .. }
            | ProviderError::Idle { .. }
            | ProviderError::KeysCoolingDown { .. } => true,
            ProviderError::Stream { .. }
            | ProviderError::Truncated { .. }
            | ProviderError::Decode { .. }
            | ProviderError::InBand { .. }
            | ProviderError::Unsupported(_)
            | ProviderError::OverBudget(_) => false,
        }
    }

    /// Short title for Cursor's error card.
    pub fn title(&self) -> &'static str {
        match self {
            ProviderError::Http { status: 429, .. } => "Provider rate limit",
            ProviderError::Http { status, .. } if *status >= 500 => "Provider unavailable",
            ProviderError::Http { .. } => "Provider rejected the request",
            ProviderError::Connect { .. } | ProviderError::HeadersTimeout { .. } => {
                "Provider unreachable"
            }
            ProviderError::Idle { .. } | ProviderError::Truncated { .. } => {
                "Provider stream interrupted"
            }
            ProviderError::Stream { .. }
            | ProviderError::Decode { .. }
            | ProviderError::InBand { .. } => "Provider error",
            ProviderError::Unsupported(_) => "Unsupported model output",
            ProviderError::KeysCoolingDown { .. } => "Provider rate limit",
            ProviderError::OverBudget(_) => "Budget reached",
        }
    }
}

/// Timing limits of one provider call.
#[derive(Debug, Clone, Copy)]
pub struct CallLimits {
    /// Waiting for the response headers.
    pub headers_timeout: Duration,
    /// Between two streamed events (not a total limit).
    pub idle_timeout: Duration,
    /// Attempts for a call that fails before its first streamed byte (429, 5xx, 529, unreachable).
    pub max_attempts: u32,
    /// First retry delay; doubled per attempt unless the provider sends `retry-after`.
    pub retry_base_delay: Duration,
}

/// The one HTTP client every provider call (and web search) shares: connection pooling, TLS
/// sessions, and each provider's route (its proxy, or direct).
pub fn http_client(config: &Config) -> Result<reqwest::Client, reqwest::Error> {
    reqwest::Client::builder()
        .no_proxy()
        .proxy(provider_proxies(config))
        .connect_timeout(config.provider_connect_timeout)
        // Enough kept-alive connections per provider for steady traffic; after a burst of
        // runs the rest close instead of holding their buffers (and the memory they pin).
        .pool_max_idle_per_host(IDLE_PROVIDER_CONNECTIONS)
        .pool_idle_timeout(Duration::from_secs(30))
        .build()
}

/// Idle connections kept open per provider host.
const IDLE_PROVIDER_CONNECTIONS: usize = 32;

/// The proxy of each outbound call of the shared client: a provider's URL takes its route (its
/// `proxy` key, direct for local addresses, else the environment's proxy); any other URL (a web
/// search backend) is resolved the same way from the environment.
fn provider_proxies(config: &Config) -> reqwest::Proxy {
    // The client asks per destination (scheme, host and port, no path): providers are matched
    // by origin.
    let origin = |url: &url::Url| url.origin().ascii_serialization();
    let routes: Vec<(String, Route)> = config
        .providers
        .iter()
        .filter_map(|p| Some((origin(&url::Url::parse(&p.base_url).ok()?), p.route.clone())))
        .collect();
    reqwest::Proxy::custom(move |url| {
        let destination = origin(url);
        let route = match routes.iter().find(|(o, _)| *o == destination) {
            Some((_, route)) => route.clone(),
            None => Route::resolve(url.as_str(), None, &|name| std::env::var(name).ok()),
        };
        route.proxy().map(str::to_owned)
    })
}

/// Longest `retry-after` honoured; beyond it the error goes to the user instead.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(30);

/// Largest text one coalesced delta carries: past it the rest waits for the next `recv`, so a
/// client far behind still gets frames of a bounded size.
const COALESCE_LIMIT: usize = 64 * 1024;

/// A call's canonical events, and the attempts that failed before it streamed and the key that
/// served it (for its record).
pub struct EventReceiver {
    events: mpsc::Receiver<Result<ResponseEvent, ProviderError>>,
    /// An event taken from the channel while coalescing that was not a delta of the same kind: the
    /// next `recv` returns it first.
    held: Option<Result<ResponseEvent, ProviderError>>,
    log: Arc<Mutex<CallLog>>,
}

/// What a call's task tells its record besides events.
#[derive(Default)]
struct CallLog {
    retries: Vec<FailedAttempt>,
    /// The index (from 0) of the key whose attempt answered, once one did.
    key_index: Option<usize>,
}

impl EventReceiver {
    /// The next event; an error is the last item; `None` once the call is over. Deltas (text,
    /// reasoning, one call's arguments) already waiting behind the first come merged into it: when the
    /// run is behind the provider (a slow client, a busy machine), one frame and one write carry
    /// what several would have, and a run that keeps up gets every delta as it comes. Only deltas
    /// already received are merged, so nothing waits for the next one.
    pub async fn recv(&mut self) -> Option<Result<ResponseEvent, ProviderError>> {
        let mut first = match self.held.take() {
            Some(event) => event,
            None => self.events.recv().await?,
        };
        if let Ok(
            event @ (ResponseEvent::TextDelta(_)
            | ResponseEvent::ReasoningDelta(_)
            | ResponseEvent::ToolArgsDelta { .. }),
        ) = &mut first
        {
            self.merge_ready(event);
        }
        Some(first)
    }

    /// Appends to `event` every delta of the same stream already waiting in the channel, up to
    /// `COALESCE_LIMIT`; the first other event is held for the next `recv`.
    fn merge_ready(&mut self, event: &mut ResponseEvent) {
        while let Ok(next) = self.events.try_recv() {
            match next {
                Ok(next) => {
                    if let Err(other) = event.absorb(next, COALESCE_LIMIT) {
                        self.held = Some(Ok(other));
                        return;
                    }
                }
                Err(error) => {
                    self.held = Some(Err(error));
                    return;
                }
            }
        }
    }

    /// The attempts that failed and were retried so far, oldest first.
    pub fn retries(&self) -> Vec<FailedAttempt> {
        lock(&self.log).retries.clone()
    }

    /// The index (from 0) of the provider key that answered the call, once one did.
    pub fn key_index(&self) -> Option<usize> {
        lock(&self.log).key_index
    }
}

fn lock(log: &Mutex<CallLog>) -> std::sync::MutexGuard<'_, CallLog> {
    log.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Turns one endpoint's SSE events into canonical events.
pub trait StreamParser: Send {
    /// Feeds one SSE event (`event:` name, possibly empty, and `data:`), adding the events it
    /// yields to `out` (deltas as borrowed text: `Batch::text`, `reasoning`, `args`). Returns
    /// whether the stream has properly ended.
    fn feed(&mut self, event: &str, data: &str, out: &mut Batch) -> Result<bool, ProviderError>;
    /// The terminal event a complete stream ends with (for the truncation error).
    fn terminal(&self) -> &'static str;
}

/// A projected request body, serialized once: its size feeds the context-window estimate and
/// retries resend the same bytes.
#[derive(Debug, Clone)]
pub struct RequestBody(bytes::Bytes);

impl RequestBody {
    pub fn from_json(body: &serde_json::Value) -> RequestBody {
        RequestBody(bytes::Bytes::from(body.to_string()))
    }

    /// Bytes already serialized (`family::encode`).
    pub fn from_vec(body: Vec<u8>) -> RequestBody {
        RequestBody(bytes::Bytes::from(body))
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Starts a streaming call with an already projected request `body`. The call runs on its own task
/// until it finishes, fails (the error is the last item) or `cancel` fires (then nothing more is sent
/// and the HTTP connection is dropped, which the provider observes as a disconnect). Each attempt
/// takes a key from `keys` (the provider's shared pool), held until the call ends.
pub fn call(
    http: &reqwest::Client,
    provider: &ProviderConfig,
    keys: &Arc<KeyPool>,
    body: RequestBody,
    limits: CallLimits,
    cancel: CancellationToken,
) -> EventReceiver {
    call_gated(http, provider, (keys, None), body, limits, cancel)
}

/// What must pass before a call is sent (`[auth]` budgets): its error ends the call unsent.
pub type Gate =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), ProviderError>> + Send>>;

/// `call`, sent only once `gate` (if any) passes; a refused gate is the call's one event.
pub fn call_gated(
    http: &reqwest::Client,
    provider: &ProviderConfig,
    (keys, gate): (&Arc<KeyPool>, Option<Gate>),
    body: RequestBody,
    limits: CallLimits,
    cancel: CancellationToken,
) -> EventReceiver {
    let (tx, rx) = mpsc::channel(EVENT_BUFFER);
    let family = provider.kind.family();
    let path = family.endpoint_path();
    let parser = family.parser(&provider.name);
    let call = HttpCall {
        http: http.clone(),
        provider: provider.name.clone(),
        family,
        url: format!("{}{path}", provider.base_url),
        keys: Arc::clone(keys),
        body,
        limits,
        log: Arc::default(),
        route: format!("{}, {}", provider.host(), provider.route.shown()),
    };
    let log = Arc::clone(&call.log);
    // The task's lines (retries) carry the caller's span: the run's ids and the call's.
    // A gate may wait (a budget's calls in flight): canceling the call ends the wait too.
    let task = async move {
        let sent = async {
            if let Some(gate) = gate
                && let Err(refused) = gate.await
            {
                let _ = tx.send(Err(refused)).await;
                return;
            }
            call.run(parser, &tx).await
        };
        tokio::select! {
            _ = cancel.cancelled() => {}
            _ = sent => {}
        }
    };
    tokio::spawn(tracing::Instrument::instrument(
        task,
        tracing::Span::current(),
    ));
    EventReceiver {
        events: rx,
        held: None,
        log,
    }
}

struct HttpCall {
    http: reqwest::Client,
    provider: String,
    family: &'static dyn family::Family,
    url: String,
    keys: Arc<KeyPool>,
    body: RequestBody,
    limits: CallLimits,
    log: Arc<Mutex<CallLog>>,
    /// The host and how it is reached (direct or through which proxy), for connection errors.
    route: String,
}

impl HttpCall {
    async fn run(
        self,
        parser: Box<dyn StreamParser>,
        tx: &mpsc::Sender<Result<ResponseEvent, ProviderError>>,
    ) {
        if let Err(error) = self.stream(parser, tx).await {
            let _ = tx.send(Err(error)).await;
        }
    }

    fn request(&self, key: &Secret) -> reqwest::RequestBuilder {
        let request = self
            .http
            .post(&self.url)
            .header(reqwest::header::ACCEPT, "text/event-stream")
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(self.body.0.clone());
        self.family.authorize(request, key)
    }

    /// One attempt with `key`: the response, or why it failed and the `retry-after` it carried.
    async fn attempt(
        &self,
        key: &Secret,
    ) -> Result<reqwest::Response, (ProviderError, Option<Duration>)> {
        match tokio::time::timeout(self.limits.headers_timeout, self.request(key).send()).await {
            Err(_) => Err((
                ProviderError::HeadersTimeout {
                    provider: self.provider.clone(),
                    secs: self.limits.headers_timeout.as_secs(),
                },
                None,
            )),
            Ok(Err(e)) => Err((
                ProviderError::Connect {
                    provider: self.provider.clone(),
                    message: format!("{} ({})", without_url(&e), self.route),
                },
                None,
            )),
            Ok(Ok(response)) if response.status().is_success() => Ok(response),
            Ok(Ok(response)) => {
                let status = response.status().as_u16();
                let retry_after = response
                    .headers()
                    .get(reqwest::header::RETRY_AFTER)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| retry_after(v, SystemTime::now()));
                let error = ProviderError::Http {
                    provider: self.provider.clone(),
                    status,
                    message: error_message(response).await,
                };
                Err((error, retry_after))
            }
        }
    }

    /// The key of a call's first attempt: a free one; else (every key cooling down) the first back,
    /// waited for when that is soon, or the error that says when. A provider with one key always
    /// tries it, as it did before keys had cooldowns.
    async fn first_key(&self) -> Result<KeyLease, ProviderError> {
        if self.keys.is_empty() {
            // Validation refuses a provider without a key; a configuration built in code may not.
            return Err(ProviderError::Unsupported(format!(
                "provider {} has no API key",
                self.provider
            )));
        }
        if let Some(lease) = self.keys.acquire_free() {
            return Ok(lease);
        }
        if self.keys.len() > 1 {
            let wait = self
                .keys
                .earliest()
                .map_or(Duration::ZERO, |(_, wait)| wait);
            if wait > MAX_RETRY_AFTER {
                return Err(self.keys.cooling_error());
            }
            tracing::info!(provider = %self.provider, wait_ms = wait.as_millis() as u64, "every provider key is cooling down; waiting for the first back");
            tokio::time::sleep(wait).await;
        }
        Ok(self.keys.acquire_any())
    }

    /// Sends the request, retrying what may be retried before any byte was streamed. A key the
    /// provider turned away (429, 401) cools down and the retry goes to another key at once; with
    /// none free, the retry waits as it always did (`retry-after`, else the backoff).
    async fn connect(&self) -> Result<(reqwest::Response, KeyLease), ProviderError> {
        let mut lease = self.first_key().await?;
        let mut attempt = 1;
        loop {
            let (error, retry_after) = match self.attempt(lease.secret()).await {
                Ok(response) => {
                    self.keys.succeeded(lease.index());
                    lock(&self.log).key_index = Some(lease.index());
                    return Ok((response, lease));
                }
                Err(failure) => failure,
            };
            let status = match &error {
                ProviderError::Http { status, .. } => Some(*status),
                _ => None,
            };
            let key_refused = matches!(status, Some(429 | 401));
            if key_refused {
                self.keys
                    .cool(lease.index(), status.unwrap_or(429), retry_after);
            }
            if attempt >= self.limits.max_attempts {
                // Out of attempts with every key turned away: say when the first is back.
                if key_refused && self.keys.len() > 1 && self.keys.all_cooling() {
                    return Err(self.keys.cooling_error());
                }
                return Err(error);
            }
            let failed_key = lease.index();
            drop(lease);
            // Only a key the provider turned away is worth leaving at once; a 5xx or an
            // unreachable host waits its backoff whatever the key.
            let free = if key_refused {
                self.keys.acquire_free()
            } else {
                None
            };
            let (next, delay) = match free {
                Some(next) => (Some(next), Duration::ZERO),
                None if key_refused && self.keys.len() > 1 => {
                    let wait = self
                        .keys
                        .earliest()
                        .map_or(Duration::ZERO, |(_, wait)| wait);
                    if wait > MAX_RETRY_AFTER {
                        return Err(self.keys.cooling_error());
                    }
                    (None, wait)
                }
                None if status.is_some_and(|s| !retry::in_call(s))
                    || retry_after.is_some_and(|d| d > MAX_RETRY_AFTER) =>
                {
                    return Err(error);
                }
                None => (
                    None,
                    retry_after
                        .unwrap_or(self.limits.retry_base_delay * 2u32.saturating_pow(attempt - 1)),
                ),
            };
            let delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
            tracing::warn!(provider = %self.provider, attempt, key = failed_key + 1, delay_ms, "provider call failed before streaming, retrying: {error}");
            lock(&self.log).retries.push(FailedAttempt {
                status,
                error: error.to_string(),
                delay_ms,
                key_index: Some(failed_key),
            });
            lease = match next {
                Some(next) => next,
                None => {
                    tokio::time::sleep(delay).await;
                    self.keys.acquire_any()
                }
            };
            attempt += 1;
        }
    }

    async fn stream(
        &self,
        mut parser: Box<dyn StreamParser>,
        tx: &mpsc::Sender<Result<ResponseEvent, ProviderError>>,
    ) -> Result<(), ProviderError> {
        // The lease counts the call in flight on its key until the stream ends or is dropped.
        let (response, _lease) = self.connect().await?;
        let mut events = SseBody {
            body: idle_limited(response.bytes_stream(), self.limits.idle_timeout),
            decoder: sse::SseDecoder::default(),
        };
        let mut batch = Batch::new(COALESCE_LIMIT);
        loop {
            // One event is waited for; those already read behind it (a read from a provider that
            // streams fast holds tens of them) are parsed without waiting and leave with it, their
            // deltas merged: the run then handles, frames and writes one event where there were
            // many, and a provider that streams slowly still has each delta sent as it comes.
            let mut next = events.next().await;
            let mut parsed = 0;
            let ended = loop {
                parsed += 1;
                match self.feed(&mut *parser, next, &mut batch) {
                    Ok(false) if parsed < BATCH_EVENTS => {}
                    outcome => break outcome,
                }
                next = match futures_util::FutureExt::now_or_never(events.next()) {
                    Some(event) => event,
                    None => {
                        // The HTTP client decodes a body's next chunk in its connection's own
                        // task, which runs only once this one yields: one turn for it before
                        // taking nothing more as ready.
                        tokio::task::yield_now().await;
                        match futures_util::FutureExt::now_or_never(events.next()) {
                            Some(event) => event,
                            None => break Ok(false),
                        }
                    }
                };
            };
            for item in batch.drain() {
                if tx.send(Ok(item)).await.is_err() {
                    // The loop stopped listening (canceled); drop the connection.
                    return Ok(());
                }
            }
            if ended? {
                return Ok(());
            }
        }
    }

    /// Parses one SSE event (or the stream's end) into `batch`, merging deltas into its last
    /// event; `true` once the call's terminal event came.
    fn feed(
        &self,
        parser: &mut dyn StreamParser,
        event: Option<Result<sse::SseEvent<'_>, BodyError>>,
        batch: &mut Batch,
    ) -> Result<bool, ProviderError> {
        let Some(event) = event else {
            return Err(ProviderError::Truncated {
                provider: self.provider.clone(),
                missing: parser.terminal(),
            });
        };
        let event = event.map_err(|e| match e {
            BodyError::Idle => ProviderError::Idle {
                provider: self.provider.clone(),
                secs: self.limits.idle_timeout.as_secs(),
            },
            other => ProviderError::Stream {
                provider: self.provider.clone(),
                message: other.to_string(),
            },
        })?;
        parser.feed(event.event, event.data, batch)
    }
}

/// A provider's response body read as server-sent events, under the idle limit.
struct SseBody<S> {
    body: IdleLimited<S>,
    decoder: sse::SseDecoder,
}

impl<S> SseBody<S>
where
    S: futures_util::Stream<Item = Result<bytes::Bytes, reqwest::Error>> + Unpin,
{
    /// The next event; `None` once the body ended. Cancel-safe: bytes read are kept in the
    /// decoder, so a call dropped while waiting loses nothing.
    /// The event is borrowed from the decoder until the next call.
    async fn next(&mut self) -> Option<Result<sse::SseEvent<'_>, BodyError>> {
        loop {
            match self.decoder.advance() {
                Ok(true) => break,
                Ok(false) => {}
                Err(error) => return Some(Err(BodyError::Sse(error))),
            }
            match self.body.next().await? {
                Ok(bytes) => self.decoder.push(&bytes),
                Err(error) => return Some(Err(error)),
            }
        }
        Some(Ok(self.decoder.event()))
    }
}

/// Most SSE events parsed ahead of sending: a bound on how long the first of them waits for the
/// others to be parsed.
const BATCH_EVENTS: usize = 256;

/// A `retry-after` value: delay seconds (RFC 9110; a decimal like `1.5` is honoured too, as some
/// providers send it) or an HTTP date, as a delay from `now`. A date in the past is no delay.
fn retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if let Ok(secs) = value.parse::<f64>() {
        return (secs.is_finite() && secs >= 0.0).then(|| Duration::from_secs_f64(secs));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// Why a provider's response body stopped.
#[derive(Debug, thiserror::Error)]
enum BodyError {
    #[error("idle")]
    Idle,
    #[error("{0}")]
    Read(String),
    #[error("{0}")]
    Sse(sse::SseError),
}

/// The body's bytes, ending with `BodyError::Idle` when none arrive for `idle`. Any byte is life:
/// the limit applies between reads, not between SSE events, so keep-alive comments (OpenRouter's
/// `: OPENROUTER PROCESSING` while a model reasons) keep a call alive.
fn idle_limited<S>(body: S, idle: Duration) -> IdleLimited<S>
where
    S: futures_util::Stream<Item = Result<bytes::Bytes, reqwest::Error>> + Unpin,
{
    let tick = idle / IDLE_TICKS;
    IdleLimited {
        body: Some(body),
        tick,
        timer: Box::pin(tokio::time::sleep(tick)),
        read_since_tick: false,
        quiet_ticks: 0,
    }
}

/// Quarters of the idle limit a body is checked at: silence is declared after four quarters with
/// no byte, between `idle` and `1.25 × idle` after the last one.
const IDLE_TICKS: u32 = 4;

/// A body under an idle limit. A chunk only sets a flag: one timer, re-armed each quarter of the
/// limit, counts the quarters without a byte. (A timeout per read cost a clock read and a timer
/// per chunk, several percent of a fast stream's CPU.)
struct IdleLimited<S> {
    /// `None` once the body ended, failed or went silent.
    body: Option<S>,
    tick: Duration,
    timer: std::pin::Pin<Box<tokio::time::Sleep>>,
    read_since_tick: bool,
    quiet_ticks: u32,
}

impl<S> futures_util::Stream for IdleLimited<S>
where
    S: futures_util::Stream<Item = Result<bytes::Bytes, reqwest::Error>> + Unpin,
{
    type Item = Result<bytes::Bytes, BodyError>;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        use std::task::Poll;
        let this = &mut *self;
        let Some(body) = &mut this.body else {
            return Poll::Ready(None);
        };
        match body.poll_next_unpin(cx) {
            Poll::Ready(Some(Ok(bytes))) => {
                this.read_since_tick = true;
                return Poll::Ready(Some(Ok(bytes)));
            }
            Poll::Ready(Some(Err(error))) => {
                this.body = None;
                return Poll::Ready(Some(Err(BodyError::Read(without_url(&error)))));
            }
            Poll::Ready(None) => {
                this.body = None;
                return Poll::Ready(None);
            }
            Poll::Pending => {}
        }
        while this.timer.as_mut().poll(cx).is_ready() {
            if std::mem::take(&mut this.read_since_tick) {
                this.quiet_ticks = 0;
            } else {
                this.quiet_ticks += 1;
            }
            if this.quiet_ticks >= IDLE_TICKS {
                this.body = None;
                return Poll::Ready(Some(Err(BodyError::Idle)));
            }
            let next = tokio::time::Instant::now() + this.tick;
            this.timer.as_mut().reset(next);
        }
        Poll::Pending
    }
}

/// Parses the JSON `data` of a typed SSE event (Responses, Anthropic) and names its type: the
/// `type` field, else the SSE event name. `None` for an empty keep-alive.
pub(crate) fn typed_event(
    provider: &str,
    event_name: &str,
    data: &str,
) -> Result<Option<(String, serde_json::Value)>, ProviderError> {
    let data = data.trim();
    if data.is_empty() {
        return Ok(None);
    }
    let event: serde_json::Value =
        serde_json::from_str(data).map_err(|e| ProviderError::Decode {
            provider: provider.to_owned(),
            message: format!("{e} in event {}", openai_chat::truncate(data, 200)),
        })?;
    // An `event: error` is an error whatever its data's `type` says (llama.cpp sends
    // `"type":"server_error"` there), and so is a bare `{"error":{...}}` without a type.
    let kind = if event_name == "error" {
        "error"
    } else {
        match event.get("type").and_then(serde_json::Value::as_str) {
            Some(kind) => kind,
            None if event.get("error").is_some_and(serde_json::Value::is_object) => "error",
            None => event_name,
        }
    }
    .to_owned();
    Ok(Some((kind, event)))
}

/// The provider's own words of an in-band error event, in any of the shapes seen: OpenAI's
/// (`message`, `code` at the top), Anthropic's and llama.cpp's (inside `error`, with a `type`), a
/// code that is a number. Reads `message (code or type)`.
pub(crate) fn in_band_error(event: &serde_json::Value) -> String {
    let field = |name: &str| {
        let value = event
            .pointer(&format!("/error/{name}"))
            .or_else(|| event.get(name))?;
        match value {
            serde_json::Value::String(text) if !text.is_empty() => Some(text.clone()),
            serde_json::Value::Number(number) => Some(number.to_string()),
            _ => None,
        }
    };
    let message = field("message").unwrap_or_else(|| "unknown error".to_owned());
    let kind = field("code")
        .filter(|code| code.parse::<u16>().is_err())
        .or_else(|| field("type").filter(|kind| kind != "error"));
    match kind {
        Some(kind) => format!("{message} ({kind})"),
        None => message,
    }
}

/// A string field of a JSON event, empty when absent.
pub(crate) fn str_field<'a>(value: &'a serde_json::Value, field: &str) -> &'a str {
    value
        .get(field)
        .and_then(serde_json::Value::as_str)
        .unwrap_or_default()
}

/// reqwest errors print the URL; keep logs and user-facing errors free of query strings and paths.
fn without_url(error: &reqwest::Error) -> String {
    let mut text = error.to_string();
    if let Some(url) = error.url() {
        text = text.replace(url.as_str(), "<provider url>");
    }
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// Reads an error body (bounded) and extracts the provider's message from the usual
/// `{"error":{"message":...}}` shape, else returns the raw text.
pub(crate) async fn error_message(response: reqwest::Response) -> String {
    const MAX_ERROR_BODY: usize = 16 * 1024;
    let bytes = match tokio::time::timeout(Duration::from_secs(10), response.bytes()).await {
        Ok(Ok(bytes)) => bytes,
        Ok(Err(e)) => return format!("(error body unreadable: {e})"),
        Err(_) => return "(error body not received in time)".to_owned(),
    };
    let text = String::from_utf8_lossy(&bytes[..bytes.len().min(MAX_ERROR_BODY)]).into_owned();
    match serde_json::from_str::<serde_json::Value>(&text) {
        Ok(json) => json
            .pointer("/error/message")
            .and_then(|m| m.as_str())
            .or_else(|| json.pointer("/error/type").and_then(|m| m.as_str()))
            .or_else(|| json.get("message").and_then(|m| m.as_str()))
            .map(str::to_owned)
            .unwrap_or(text),
        Err(_) => text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_takes_seconds_decimals_and_http_dates() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        assert_eq!(retry_after("7", now), Some(Duration::from_secs(7)));
        assert_eq!(retry_after(" 1.5 ", now), Some(Duration::from_millis(1500)));
        let in_twenty = httpdate::fmt_http_date(now + Duration::from_secs(20));
        assert_eq!(retry_after(&in_twenty, now), Some(Duration::from_secs(20)));
        let past = httpdate::fmt_http_date(now - Duration::from_secs(20));
        assert_eq!(retry_after(&past, now), Some(Duration::ZERO));
        assert_eq!(retry_after("-3", now), None);
        assert_eq!(retry_after("soon", now), None);
    }

    #[tokio::test]
    async fn deltas_already_waiting_come_merged_and_nothing_else_moves() {
        use ResponseEvent::{ReasoningDelta, TextDelta, ToolCallStart, Usage as UsageEvent};
        let (tx, rx) = mpsc::channel(16);
        let mut events = EventReceiver {
            events: rx,
            held: None,
            log: Arc::default(),
        };
        for event in [
            ReasoningDelta("think ".into()),
            ReasoningDelta("more".into()),
            TextDelta("Hel".into()),
            TextDelta("lo".into()),
            TextDelta(", ".into()),
            ToolCallStart {
                index: 0,
                id: "c".into(),
                name: "Read".into(),
            },
            TextDelta("after".into()),
            UsageEvent(Default::default()),
        ] {
            tx.send(Ok(event)).await.expect("room");
        }
        tx.send(Err(ProviderError::Truncated {
            provider: "p".into(),
            missing: "terminal event",
        }))
        .await
        .expect("room");
        drop(tx);
        let mut got = Vec::new();
        while let Some(event) = events.recv().await {
            got.push(event.map_err(|e| e.to_string()));
        }
        assert_eq!(
            got,
            [
                Ok(ReasoningDelta("think more".into())),
                Ok(TextDelta("Hello, ".into())),
                Ok(ToolCallStart {
                    index: 0,
                    id: "c".into(),
                    name: "Read".into(),
                }),
                Ok(TextDelta("after".into())),
                Ok(UsageEvent(Default::default())),
                Err(ProviderError::Truncated {
                    provider: "p".into(),
                    missing: "terminal event",
                }
                .to_string()),
            ]
        );
    }

    #[tokio::test]
    async fn a_delta_that_waits_for_the_next_is_sent_alone_and_an_error_behind_it_is_kept() {
        let (tx, rx) = mpsc::channel(16);
        let mut events = EventReceiver {
            events: rx,
            held: None,
            log: Arc::default(),
        };
        tx.send(Ok(ResponseEvent::TextDelta("one".into())))
            .await
            .expect("room");
        // Nothing else is ready: the delta comes at once, alone.
        assert_eq!(
            events.recv().await.map(|e| e.map_err(|e| e.to_string())),
            Some(Ok(ResponseEvent::TextDelta("one".into())))
        );
        tx.send(Ok(ResponseEvent::TextDelta("two".into())))
            .await
            .expect("room");
        tx.send(Err(ProviderError::Truncated {
            provider: "p".into(),
            missing: "[DONE]",
        }))
        .await
        .expect("room");
        assert_eq!(
            events.recv().await.map(|e| e.map_err(|e| e.to_string())),
            Some(Ok(ResponseEvent::TextDelta("two".into())))
        );
        assert!(matches!(
            events.recv().await,
            Some(Err(ProviderError::Truncated { .. }))
        ));
    }

    #[tokio::test]
    async fn a_merged_delta_stops_growing_at_the_limit() {
        let (tx, rx) = mpsc::channel(64);
        let mut events = EventReceiver {
            events: rx,
            held: None,
            log: Arc::default(),
        };
        let piece = "x".repeat(COALESCE_LIMIT / 4);
        for _ in 0..6 {
            tx.send(Ok(ResponseEvent::TextDelta(piece.clone())))
                .await
                .expect("room");
        }
        drop(tx);
        let mut sizes = Vec::new();
        while let Some(Ok(ResponseEvent::TextDelta(text))) = events.recv().await {
            sizes.push(text.len());
        }
        assert_eq!(sizes, [COALESCE_LIMIT, COALESCE_LIMIT / 2]);
    }

    /// A provider on loopback that answers one call with `head` (a Chat stream's chunks) in one
    /// write, then each of `then` once the test has taken the previous events from the channel.
    async fn chat_provider(
        head: String,
        then: Vec<String>,
        taken: Arc<tokio::sync::Notify>,
    ) -> ProviderConfig {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("addr").port();
        tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.expect("accept");
            let mut request = Vec::new();
            let mut buf = [0u8; 4096];
            while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = socket.read(&mut buf).await.expect("read");
                request.extend_from_slice(&buf[..n]);
            }
            let chunk = |data: &str| format!("{:x}\r\n{data}\r\n", data.len());
            let head = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n{}",
                chunk(&head)
            );
            socket.write_all(head.as_bytes()).await.expect("write");
            for data in then {
                taken.notified().await;
                socket
                    .write_all(chunk(&data).as_bytes())
                    .await
                    .expect("write");
            }
            socket.write_all(b"0\r\n\r\n").await.expect("end");
        });
        ProviderConfig {
            name: "p".to_owned(),
            kind: ProviderKind::OpenAiChat,
            base_url: format!("http://127.0.0.1:{port}/v1"),
            keys: vec![crate::config::ProviderKey {
                secret: Secret::new("k".to_owned()),
                env: None,
            }],
            models: Vec::new(),
            route: Route::Direct { local: true },
        }
    }

    fn text_chunk(text: &str) -> String {
        format!("data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{text}\"}}}}]}}\n\n")
    }

    fn limits() -> CallLimits {
        CallLimits {
            headers_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(10),
            max_attempts: 1,
            retry_base_delay: Duration::from_millis(10),
        }
    }

    #[tokio::test]
    async fn deltas_read_together_leave_the_call_as_one_and_a_slow_stream_goes_as_it_comes() {
        let head: String = (0..40).map(|n| text_chunk(&format!("w{n} "))).collect();
        let then = vec![
            text_chunk("late"),
            format!(
                "{}data: {{\"choices\":[{{\"index\":0,\"delta\":{{}},\"finish_reason\":\"stop\"}}]}}\n\ndata: [DONE]\n\n",
                text_chunk(" end")
            ),
        ];
        let taken = Arc::new(tokio::sync::Notify::new());
        let provider = chat_provider(head, then, Arc::clone(&taken)).await;
        let keys = KeyPool::new(&provider, crate::config::KeyCooldown::default());
        let body = RequestBody::from_json(&serde_json::json!({"model": "m", "stream": true}));
        let mut receiver = call(
            &reqwest::Client::new(),
            &provider,
            &keys,
            body,
            limits(),
            CancellationToken::new(),
        );
        // The raw channel, without `recv`'s merging: what the call's task sent.
        let channel = &mut receiver.events;
        let expected: String = (0..40).map(|n| format!("w{n} ")).collect();
        let first = channel.recv().await.expect("an event").expect("no error");
        assert_eq!(
            first,
            ResponseEvent::TextDelta(expected),
            "forty deltas of one read are sent as one"
        );
        // Only after the test took them does the provider send the next delta: it is sent
        // without waiting for more.
        taken.notify_one();
        let late = channel.recv().await.expect("an event").expect("no error");
        assert_eq!(late, ResponseEvent::TextDelta("late".into()));
        taken.notify_one();
        let mut rest = Vec::new();
        while let Some(event) = channel.recv().await {
            rest.push(event.expect("no error"));
        }
        assert_eq!(rest[0], ResponseEvent::TextDelta(" end".into()));
        assert_eq!(
            rest.last(),
            Some(&ResponseEvent::Finished(FinishReason::Stop))
        );
    }

    /// A stream of `chunks` byte chunks, one every `gap`, then silence.
    fn trickle(
        chunks: usize,
        gap: Duration,
    ) -> impl futures_util::Stream<Item = Result<bytes::Bytes, reqwest::Error>> + Unpin {
        Box::pin(futures_util::stream::unfold(0, move |sent| async move {
            if sent == chunks {
                std::future::pending::<()>().await;
            }
            tokio::time::sleep(gap).await;
            Some((Ok(bytes::Bytes::from_static(b": ping\n\n")), sent + 1))
        }))
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_is_idle_after_the_limit_without_a_byte_and_alive_while_bytes_come() {
        let idle = Duration::from_secs(8);
        // A byte every 6 s (inside the limit) for a minute: alive throughout.
        let started = tokio::time::Instant::now();
        let mut body = idle_limited(trickle(10, Duration::from_secs(6)), idle);
        for _ in 0..10 {
            assert!(matches!(body.next().await, Some(Ok(_))));
        }
        assert_eq!(started.elapsed(), Duration::from_secs(60));
        // Then silence: idle between the limit and a quarter more after the last byte.
        let silent = tokio::time::Instant::now();
        assert!(matches!(body.next().await, Some(Err(BodyError::Idle))));
        let waited = silent.elapsed();
        assert!(
            waited >= idle && waited <= idle + idle / IDLE_TICKS,
            "idle after {waited:?}"
        );
        assert!(body.next().await.is_none(), "nothing after the idle error");
    }
}
