//! Several keys per provider, on the real transport against the fake provider: calls spread evenly
//! (least in flight, round-robin on ties), a key the provider turns away cools down and the retry
//! goes to the other key at once, every key cooling ends the run `resource_exhausted` naming when
//! the first key is back, and the run's record says which key answered (never the key).

#[path = "support/fake_cursor.rs"]
mod fake_cursor;
#[path = "support/fake_provider.rs"]
mod fake_provider;
#[path = "support/fixtures.rs"]
mod fixtures;

use std::sync::Arc;
use std::time::{Duration, Instant};

use cursor_server::config::{Config, KeyCooldown, ProviderConfig};
use cursor_server::provider::keys::KeyPool;
use cursor_server::provider::{
    self, CallLimits, EventReceiver, ProviderError, RequestBody, ResponseEvent,
};
use fake_cursor::{FakeCursor, Session};
use fake_provider::{FakeProvider, Reply, golden, text_events};
use fixtures::TestServer;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

/// The test configuration with two keys in place of its one key.
fn two_key_text(base_url: &str, db: &std::path::Path) -> String {
    two_key_text_kind(base_url, db, "openai-chat")
}

fn two_key_text_kind(base_url: &str, db: &std::path::Path, kind: &str) -> String {
    fixtures::config_text(base_url, db, "", kind).replace(
        &format!("api_key = \"{}\"", fixtures::API_KEY),
        "api_keys = [\"key-a\", \"key-b\"]",
    )
}

fn two_key_provider(provider: &FakeProvider) -> ProviderConfig {
    two_key_provider_kind(provider, "openai-chat")
}

fn two_key_provider_kind(provider: &FakeProvider, kind: &str) -> ProviderConfig {
    let text = two_key_text_kind(
        &provider.base_url(),
        &std::env::temp_dir().join("unused.db"),
        kind,
    );
    Config::from_toml(&text, std::path::Path::new("test.toml"), &|_| None)
        .expect("two keys are a valid configuration")
        .providers
        .remove(0)
}

fn start(
    provider: &ProviderConfig,
    pool: &Arc<KeyPool>,
    cancel: CancellationToken,
) -> EventReceiver {
    provider::call(
        &reqwest::Client::new(),
        provider,
        pool,
        RequestBody::from_json(&json!({"model": "m", "stream": true})),
        CallLimits {
            headers_timeout: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(5),
            max_attempts: 3,
            retry_base_delay: Duration::from_millis(10),
        },
        cancel,
    )
}

/// Runs a call to its end: its text, or the error it ended with.
async fn finish(mut rx: EventReceiver) -> Result<String, ProviderError> {
    let mut text = String::new();
    while let Some(item) = rx.recv().await {
        if let ResponseEvent::TextDelta(delta) = item? {
            text.push_str(&delta);
        }
    }
    Ok(text)
}

fn count(authorizations: &[String], key: &str) -> usize {
    let wanted = format!("Bearer {key}");
    authorizations.iter().filter(|a| **a == wanted).count()
}

#[tokio::test]
async fn a_two_key_provider_spreads_100_calls_evenly_and_routes_around_a_key_in_cooldown() {
    let fake = FakeProvider::start().await;
    let provider = two_key_provider(&fake);
    let pool = KeyPool::new(&provider, KeyCooldown::default());
    for _ in 0..100 {
        fake.push(Reply::sse(text_events(&["ok"], (1, 1, 0))));
    }
    let started = Instant::now();
    for _ in 0..100 {
        let rx = start(&provider, &pool, CancellationToken::new());
        assert_eq!(finish(rx).await.as_deref(), Ok("ok"));
    }
    eprintln!(
        "100 sequential calls over two keys: {:?}",
        started.elapsed()
    );
    let sent = fake.authorizations();
    assert_eq!((count(&sent, "key-a"), count(&sent, "key-b")), (50, 50));
    assert!(
        pool.status().iter().all(|k| k.in_flight == 0),
        "every finished call released its key"
    );

    // The next call's key (key-a, round-robin) is rate limited: the retry takes key-b at once,
    // with no backoff, and key-a is left out for the minute the provider asked.
    fake.push(Reply::RateLimited {
        retry_after_secs: 60,
        body: r#"{"error":{"message":"slow down"}}"#.into(),
    });
    for _ in 0..11 {
        fake.push(Reply::sse(text_events(&["ok"], (1, 1, 0))));
    }
    let mut rx = start(&provider, &pool, CancellationToken::new());
    let first = rx.recv().await;
    assert!(matches!(first, Some(Ok(_))), "{first:?}");
    let retries = rx.retries();
    assert_eq!(retries.len(), 1, "{retries:?}");
    assert_eq!(
        (retries[0].status, retries[0].key_index, retries[0].delay_ms),
        (Some(429), Some(0), 0)
    );
    assert_eq!(rx.key_index(), Some(1), "key-b answered");
    finish(rx)
        .await
        .expect("the retry on key-b streams to its end");
    for _ in 0..10 {
        let rx = start(&provider, &pool, CancellationToken::new());
        assert_eq!(finish(rx).await.as_deref(), Ok("ok"));
    }
    let sent = fake.authorizations();
    assert_eq!(
        (count(&sent[100..], "key-a"), count(&sent[100..], "key-b")),
        (1, 11),
        "only the rate-limited attempt went to key-a"
    );
    let cooling = pool.status()[0].cooling.expect("key-a cools down");
    assert_eq!(cooling.1, 429);
    assert!(cooling.0 > Duration::from_secs(50), "{cooling:?}");
}

#[tokio::test]
async fn concurrent_calls_take_the_least_loaded_key_and_release_it_on_end_and_on_cancel() {
    let fake = FakeProvider::start().await;
    let provider = two_key_provider(&fake);
    let pool = KeyPool::new(&provider, KeyCooldown::default());
    // One release per call: `notify_one` keeps its permit for a reply not yet waiting.
    let releases: Vec<Arc<tokio::sync::Notify>> = (0..6)
        .map(|_| Arc::new(tokio::sync::Notify::new()))
        .collect();
    let mut calls = Vec::new();
    let events = text_events(&["first"], (1, 1, 0));
    for release in &releases {
        fake.push(Reply::Held {
            before: events[..2].to_vec(),
            after: events[2..].to_vec(),
            release: Arc::clone(release),
        });
    }
    for _ in 0..6 {
        let cancel = CancellationToken::new();
        let mut rx = start(&provider, &pool, cancel.clone());
        // Its first event came: the call holds its key.
        assert!(matches!(rx.recv().await, Some(Ok(_))));
        calls.push((rx, cancel));
    }
    let loads: Vec<u32> = pool.status().iter().map(|k| k.in_flight).collect();
    assert_eq!(loads, [3, 3]);
    let sent = fake.authorizations();
    assert_eq!((count(&sent, "key-a"), count(&sent, "key-b")), (3, 3));

    // Canceling one call gives its key back.
    let (rx, cancel) = calls.remove(0);
    let canceled_key = rx.key_index().expect("a key answered");
    cancel.cancel();
    drop(rx);
    wait_until(|| pool.status()[canceled_key].in_flight == 2).await;

    // The rest end normally and give theirs back.
    for release in &releases {
        release.notify_one();
    }
    for (rx, _cancel) in calls {
        finish(rx).await.expect("the held calls finish");
    }
    assert!(pool.status().iter().all(|k| k.in_flight == 0));
}

/// The key each request carried, however its kind sends it (a bearer token, or `x-api-key`).
fn keys_sent(fake: &FakeProvider) -> Vec<String> {
    fake.headers()
        .iter()
        .map(|h| {
            let value = h
                .get("x-api-key")
                .or_else(|| h.get("authorization"))
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default();
            value.trim_start_matches("Bearer ").to_owned()
        })
        .collect()
}

#[tokio::test]
async fn a_refused_key_is_left_out_and_the_retry_takes_the_other_key_on_every_endpoint() {
    for (endpoint, kind) in [
        ("openai_chat", "openai-chat"),
        ("openai_responses", "openai-responses"),
        ("anthropic", "anthropic"),
    ] {
        let fake = FakeProvider::start().await;
        let provider = two_key_provider_kind(&fake, kind);
        let pool = KeyPool::new(
            &provider,
            KeyCooldown {
                rate_limited: Duration::from_secs(60),
                refused: Duration::from_secs(120),
            },
        );
        fake.push(Reply::Status {
            status: 401,
            body: r#"{"error":{"message":"invalid key"}}"#.into(),
        });
        fake.push(golden(endpoint, "text"));
        fake.push(golden(endpoint, "text"));
        let rx = start(&provider, &pool, CancellationToken::new());
        assert_eq!(finish(rx).await.as_deref(), Ok("Hello there"), "{endpoint}");
        let rx = start(&provider, &pool, CancellationToken::new());
        assert_eq!(finish(rx).await.as_deref(), Ok("Hello there"), "{endpoint}");
        assert_eq!(keys_sent(&fake), ["key-a", "key-b", "key-b"], "{endpoint}");
        let (left, status) = pool.status()[0].cooling.expect("key-a cools down");
        assert_eq!(status, 401);
        assert!(
            left > Duration::from_secs(110) && left <= Duration::from_secs(120),
            "{endpoint}: the configured refused cooldown: {left:?}"
        );
    }
}

#[tokio::test]
async fn a_provider_with_one_key_always_tries_it_as_before() {
    let fake = FakeProvider::start().await;
    let provider = fixtures::config_for(
        &fake.base_url(),
        &std::env::temp_dir().join("unused.db"),
        "",
    )
    .providers
    .remove(0);
    let pool = KeyPool::new(&provider, KeyCooldown::default());
    // 429s without retry-after: the call retries its one key after the usual backoff each time
    // (the key cooling for the default minute meanwhile)...
    for _ in 0..3 {
        fake.push(Reply::Status {
            status: 429,
            body: r#"{"error":{"message":"slow down"}}"#.into(),
        });
    }
    fake.push(Reply::sse(text_events(&["next"], (1, 1, 0))));
    let rx = start(&provider, &pool, CancellationToken::new());
    match finish(rx).await {
        Err(ProviderError::Http { status: 429, .. }) => {}
        other => panic!("{other:?}"),
    }
    assert!(pool.status()[0].cooling.is_some(), "the key cools down");
    // ...and the next call tries it anyway: with one key there is nothing to route around.
    let rx = start(&provider, &pool, CancellationToken::new());
    assert_eq!(finish(rx).await.as_deref(), Ok("next"));
    assert_eq!(fake.requests().len(), 4);
    assert!(pool.status()[0].cooling.is_none(), "an answer ends it");

    // A refused key is not retried (nothing else to try) and keeps its own error.
    fake.push(Reply::Status {
        status: 401,
        body: r#"{"error":{"message":"invalid key"}}"#.into(),
    });
    let rx = start(&provider, &pool, CancellationToken::new());
    match finish(rx).await {
        Err(ProviderError::Http { status: 401, .. }) => {}
        other => panic!("{other:?}"),
    }
    assert_eq!(fake.requests().len(), 5);
}

#[tokio::test]
async fn with_every_key_back_within_seconds_the_call_waits_for_the_first_and_goes_on() {
    let fake = FakeProvider::start().await;
    let provider = two_key_provider(&fake);
    let pool = KeyPool::new(&provider, KeyCooldown::default());
    for _ in 0..2 {
        fake.push(Reply::RateLimited {
            retry_after_secs: 1,
            body: r#"{"error":{"message":"slow down"}}"#.into(),
        });
    }
    fake.push(Reply::sse(text_events(&["waited"], (1, 1, 0))));
    let started = Instant::now();
    let mut rx = start(&provider, &pool, CancellationToken::new());
    let first = rx.recv().await;
    assert!(matches!(first, Some(Ok(_))), "{first:?}");
    assert!(started.elapsed() >= Duration::from_millis(900));
    let retries = rx.retries();
    assert_eq!(
        retries
            .iter()
            .map(|r| (r.key_index, r.delay_ms > 900))
            .collect::<Vec<_>>(),
        [(Some(0), false), (Some(1), true)],
        "key-a refused, key-b at once, then a wait for the first key back: {retries:?}"
    );
    assert_eq!(rx.key_index(), Some(0));
    finish(rx).await.expect("the call goes on");
}

#[tokio::test]
async fn out_of_attempts_with_every_key_refused_names_the_first_key_back() {
    let fake = FakeProvider::start().await;
    let provider = two_key_provider(&fake);
    let pool = KeyPool::new(&provider, KeyCooldown::default());
    // Two attempts in all (the call's limit), both keys rate limited for seconds only: the call
    // may not wait, and says when to come back rather than the last 429.
    for _ in 0..2 {
        fake.push(Reply::RateLimited {
            retry_after_secs: 20,
            body: r#"{"error":{"message":"slow down"}}"#.into(),
        });
    }
    let rx = provider::call(
        &reqwest::Client::new(),
        &provider,
        &pool,
        RequestBody::from_json(&json!({"model": "m", "stream": true})),
        CallLimits {
            headers_timeout: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(5),
            max_attempts: 2,
            retry_base_delay: Duration::from_millis(10),
        },
        CancellationToken::new(),
    );
    match finish(rx).await {
        Err(ProviderError::KeysCoolingDown {
            keys: 2,
            retry_in_secs: 20,
            ..
        }) => {}
        other => panic!("{other:?}"),
    }
    assert_eq!(fake.requests().len(), 2);
}

/// Waits (bounded) for something another task does.
async fn wait_until(condition: impl Fn() -> bool) {
    tokio::time::timeout(Duration::from_secs(5), async {
        while !condition() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the condition came true");
}

async fn get(server: &TestServer, path: &str) -> Value {
    reqwest::get(format!("http://{}{path}", server.addr))
        .await
        .expect("api answers")
        .json()
        .await
        .expect("json")
}

async fn turn(server: &TestServer, request_id: &str) -> fake_cursor::Transcript {
    let cursor = FakeCursor::new(server.addr);
    Session::start(
        &cursor,
        request_id,
        &fixtures::run_request(&format!("conv-{request_id}"), "hi"),
    )
    .await
    .finish()
    .await
}

/// The provider calls of a run, once its record is written (after its stream closed).
async fn provider_calls(server: &TestServer, request_id: &str) -> Vec<Value> {
    for _ in 0..1500 {
        let run = get(server, &format!("/api/runs/{request_id}")).await;
        if let Some(calls) = run["provider_calls"].as_array()
            && !calls.is_empty()
        {
            return calls.clone();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("run {request_id} never recorded its provider calls");
}

#[tokio::test]
async fn every_key_cooling_ends_the_run_resource_exhausted_naming_the_earliest_retry() {
    let fake = FakeProvider::start().await;
    let db_dir = tempfile::tempdir().unwrap();
    let text = two_key_text(&fake.base_url(), &db_dir.path().join("test.db"));
    let config = Config::from_toml(&text, std::path::Path::new("test.toml"), &|_| None).unwrap();
    let server = TestServer::start_with(config, db_dir).await;

    fake.push(Reply::sse(text_events(&["hello"], (5, 1, 0))));
    assert!(turn(&server, "req-keys-1").await.is_success());
    let calls = provider_calls(&server, "req-keys-1").await;
    assert_eq!(calls[0]["key_index"], 0);
    assert_eq!(calls[0]["key"], "key 1 of 2");

    // Both keys are rate limited, for two minutes and for 90 s: nothing is usable within the
    // longest wait a call honours, so the run ends at once naming the first key back.
    fake.push(Reply::RateLimited {
        retry_after_secs: 120,
        body: r#"{"error":{"message":"slow down"}}"#.into(),
    });
    fake.push(Reply::RateLimited {
        retry_after_secs: 90,
        body: r#"{"error":{"message":"slow down"}}"#.into(),
    });
    let started = Instant::now();
    let transcript = turn(&server, "req-keys-2").await;
    assert_eq!(transcript.error_code(), Some("resource_exhausted"));
    let message = transcript.error_message().unwrap_or_default();
    assert!(
        message.contains("all 2 keys of fake are cooling down")
            && message.contains("usable again in 90 s"),
        "{message}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "no waiting for a key that is minutes away"
    );
    let sent = fake.authorizations();
    assert_eq!(
        sent[1..],
        ["Bearer key-b", "Bearer key-a"],
        "one attempt per key"
    );

    // A new run while both cool does not call the provider at all.
    let transcript = turn(&server, "req-keys-3").await;
    assert_eq!(transcript.error_code(), Some("resource_exhausted"));
    assert_eq!(fake.requests().len(), 3);

    // The console shows each key by its source, and its cooldown (never the key).
    let providers = get(&server, "/api/providers").await;
    let keys = providers["providers"][0]["keys"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(keys.len(), 2);
    assert_eq!(keys[0]["name"], "key 1 (inline)");
    assert_eq!(keys[0]["cooling_status"], 429);
    assert!(keys[1]["cooling_secs"].as_u64().unwrap() > 100);
    assert!(!providers.to_string().contains("key-a"), "{providers}");
    let page = |path: &str| {
        let url = format!("http://{}{path}", server.addr);
        async move { reqwest::get(url).await.unwrap().text().await.unwrap() }
    };
    let overview = page("/console").await;
    assert!(
        overview.contains("key 1 (inline): <span class=\"failed\">cooling")
            && overview.contains("(HTTP 429)"),
        "{overview}"
    );
    let run_page = page("/console/runs/req-keys-1").await;
    assert!(run_page.contains("1 (key 1 of 2)"), "{run_page}");
    let metrics = page("/metrics").await;
    assert!(
        metrics.contains("cursor_byok_provider_keys_cooling{provider=\"fake\"} 2"),
        "{metrics}"
    );
    let retries = provider_calls(&server, "req-keys-2").await[0]["retries"].clone();
    assert_eq!(retries[0]["key_index"], 1, "{retries}");
    server.stop().await;
}
