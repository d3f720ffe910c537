//! Each endpoint adapter against golden SSE transcripts served over real HTTP: canonical events,
//! usage normalisation, opaque replay data, in-band errors, truncation, retry and no-retry.

#[path = "support/fake_provider.rs"]
mod fake_provider;
#[path = "support/fixtures.rs"]
mod fixtures;

use std::time::Duration;

use cursor_server::config::{KeyCooldown, ProviderConfig};
use cursor_server::model::message::ProviderReplay;
use cursor_server::model::usage::Usage;
use cursor_server::provider::keys::KeyPool;
use cursor_server::provider::{
    self, CallLimits, FinishReason, ProviderError, RequestBody, ResponseEvent,
};
use fake_provider::{FakeProvider, Reply, golden};
use serde_json::json;
use tokio_util::sync::CancellationToken;

const ENDPOINTS: [(&str, &str); 3] = [
    ("openai_chat", "openai-chat"),
    ("openai_responses", "openai-responses"),
    ("anthropic", "anthropic"),
];

fn provider_config(provider: &FakeProvider, kind: &str) -> ProviderConfig {
    let dir = std::env::temp_dir();
    fixtures::config_for_kind(&provider.base_url(), &dir.join("unused.db"), "", kind)
        .providers
        .remove(0)
}

/// A key pool of its own for `config` (a server shares one per provider across runs).
fn pool(config: &ProviderConfig) -> std::sync::Arc<KeyPool> {
    KeyPool::new(config, KeyCooldown::default())
}

/// Runs one call to its end: the events, and the error it ended with (if any).
async fn run(provider: &FakeProvider, kind: &str) -> (Vec<ResponseEvent>, Option<ProviderError>) {
    let config = provider_config(provider, kind);
    let mut rx = provider::call(
        &reqwest::Client::new(),
        &config,
        &pool(&config),
        RequestBody::from_json(&json!({"model": "m", "stream": true})),
        CallLimits {
            headers_timeout: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(5),
            max_attempts: 3,
            retry_base_delay: Duration::from_millis(10),
        },
        CancellationToken::new(),
    );
    let mut events = Vec::new();
    while let Some(item) = rx.recv().await {
        match item {
            Ok(event) => events.push(event),
            Err(error) => return (events, Some(error)),
        }
    }
    (events, None)
}

async fn golden_run(
    endpoint: &str,
    kind: &str,
    scenario: &str,
) -> (FakeProvider, Vec<ResponseEvent>, Option<ProviderError>) {
    let provider = FakeProvider::start().await;
    provider.push(golden(endpoint, scenario));
    let (events, error) = run(&provider, kind).await;
    (provider, events, error)
}

fn text(events: &[ResponseEvent]) -> String {
    events
        .iter()
        .filter_map(|e| match e {
            ResponseEvent::TextDelta(t) => Some(t.as_str()),
            _ => None,
        })
        .collect()
}

fn reasoning(events: &[ResponseEvent]) -> String {
    events
        .iter()
        .filter_map(|e| match e {
            ResponseEvent::ReasoningDelta(t) => Some(t.as_str()),
            _ => None,
        })
        .collect()
}

fn usage(events: &[ResponseEvent]) -> Usage {
    events
        .iter()
        .rev()
        .find_map(|e| match e {
            ResponseEvent::Usage(u) => Some(*u),
            _ => None,
        })
        .expect("usage reported")
}

fn replay(events: &[ResponseEvent]) -> ProviderReplay {
    events
        .iter()
        .find_map(|e| match e {
            ResponseEvent::Replay(r) => Some(r.clone()),
            _ => None,
        })
        .expect("replay data")
}

fn tool_calls(events: &[ResponseEvent]) -> Vec<(usize, String, String, String)> {
    let mut calls: Vec<(usize, String, String, String)> = Vec::new();
    for event in events {
        match event {
            ResponseEvent::ToolCallStart { index, id, name } => {
                calls.push((*index, id.clone(), name.clone(), String::new()))
            }
            ResponseEvent::ToolArgsDelta { index, fragment } => calls
                .iter_mut()
                .find(|c| c.0 == *index)
                .expect("delta after start")
                .3
                .push_str(fragment),
            _ => {}
        }
    }
    calls
}

fn finish(events: &[ResponseEvent]) -> &FinishReason {
    match events.last() {
        Some(ResponseEvent::Finished(reason)) => reason,
        other => panic!("the last event must be Finished, got {other:?}"),
    }
}

#[tokio::test]
async fn text_streams_and_finishes_on_every_endpoint() {
    for (endpoint, kind) in ENDPOINTS {
        let (provider, events, error) = golden_run(endpoint, kind, "text").await;
        assert!(error.is_none(), "{endpoint}: {error:?}");
        assert_eq!(text(&events), "Hello there", "{endpoint}");
        assert_eq!(finish(&events), &FinishReason::Stop, "{endpoint}");
        let usage = usage(&events);
        assert_eq!(
            usage.input_tokens,
            Some(20),
            "{endpoint}: input includes cached input"
        );
        assert_eq!(usage.output_tokens, Some(2), "{endpoint}");
        let path = &provider.paths()[0];
        let expected_path = match kind {
            "openai-chat" => "/v1/chat/completions",
            "openai-responses" => "/v1/responses",
            _ => "/v1/messages",
        };
        assert_eq!(path, expected_path);
        let headers = &provider.headers()[0];
        if kind == "anthropic" {
            assert_eq!(headers["x-api-key"], fixtures::API_KEY);
            assert_eq!(headers["anthropic-version"], "2023-06-01");
            assert!(headers.get("authorization").is_none());
        } else {
            assert_eq!(
                headers["authorization"],
                format!("Bearer {}", fixtures::API_KEY)
            );
        }
    }
}

#[tokio::test]
async fn parallel_tool_calls_with_interleaved_arguments_are_kept_apart() {
    for (endpoint, kind) in ENDPOINTS {
        let (_, events, error) = golden_run(endpoint, kind, "parallel_tools").await;
        assert!(error.is_none(), "{endpoint}: {error:?}");
        let calls = tool_calls(&events);
        let prefix = if kind == "anthropic" { "toolu" } else { "call" };
        assert_eq!(
            calls,
            [
                (
                    0,
                    format!("{prefix}_a"),
                    "Read".to_owned(),
                    r#"{"path":"a.txt"}"#.to_owned()
                ),
                (
                    1,
                    format!("{prefix}_b"),
                    "Read".to_owned(),
                    r#"{"path":"b.txt"}"#.to_owned()
                ),
            ],
            "{endpoint}"
        );
        assert_eq!(finish(&events), &FinishReason::ToolCalls, "{endpoint}");
    }
}

#[tokio::test]
async fn reasoning_is_streamed_and_its_replay_data_kept_verbatim() {
    for (endpoint, kind) in ENDPOINTS {
        let (_, events, error) = golden_run(endpoint, kind, "reasoning_tool").await;
        assert!(error.is_none(), "{endpoint}: {error:?}");
        assert_eq!(reasoning(&events), "I should read the file.", "{endpoint}");
        let expected = match kind {
            "openai-chat" => ProviderReplay::OpenAiChat {
                reasoning_content: "I should read the file.".into(),
                reasoning_details: Vec::new(),
            },
            "openai-responses" => ProviderReplay::OpenAiResponses {
                items: vec![
                    json!({"type":"reasoning","id":"rs_1","summary":[{"type":"summary_text","text":"I should read the file."}],"encrypted_content":"gAAAA-final"}),
                    json!({"type":"function_call","id":"fc_r","call_id":"call_r","name":"Read","arguments":"{\"path\":\"src/main.rs\"}","status":"completed"}),
                ],
            },
            _ => ProviderReplay::Anthropic {
                blocks: vec![
                    json!({"type":"thinking","thinking":"I should read the file.","signature":"EsECsig=="}),
                ],
            },
        };
        assert_eq!(replay(&events), expected, "{endpoint}");
        assert_eq!(usage(&events).reasoning_tokens, Some(5), "{endpoint}");
        assert_eq!(finish(&events), &FinishReason::ToolCalls);
    }
}

#[tokio::test]
async fn cached_input_and_reasoning_tokens_are_normalised() {
    for (endpoint, kind) in ENDPOINTS {
        let (_, events, error) = golden_run(endpoint, kind, "usage_cache").await;
        assert!(error.is_none(), "{endpoint}: {error:?}");
        let usage = usage(&events);
        assert_eq!(usage.input_tokens, Some(1000), "{endpoint}");
        assert_eq!(usage.cache_read_tokens, Some(800), "{endpoint}");
        assert_eq!(usage.output_tokens, Some(50), "{endpoint}");
        assert_eq!(usage.reasoning_tokens, Some(20), "{endpoint}");
        let cache_write = if kind == "anthropic" { Some(100) } else { None };
        assert_eq!(usage.cache_write_tokens, cache_write, "{endpoint}");
    }
}

#[tokio::test]
async fn an_error_event_after_http_200_is_an_error() {
    for (endpoint, kind) in ENDPOINTS {
        let (_, events, error) = golden_run(endpoint, kind, "inband_error").await;
        assert_eq!(text(&events), "Part", "{endpoint}");
        let Some(ProviderError::InBand { message, .. }) = &error else {
            panic!("{endpoint}: expected an in-band error, got {error:?}");
        };
        let expected = match kind {
            "openai-chat" => "The server had an error",
            "openai-responses" => "You exceeded your current quota. (insufficient_quota)",
            _ => "Overloaded (overloaded_error)",
        };
        assert!(message.contains(expected), "{endpoint}: {message}");
        assert!(
            !events
                .iter()
                .any(|e| matches!(e, ResponseEvent::Finished(_)))
        );
    }
}

/// llama.cpp reports a failure mid-stream in its own shape: on Responses a bare
/// `data: {"error":{...}}` without a type, on Anthropic an `event: error` whose data's `type` is
/// `server_error`. The provider's reason reaches the user, not "ended without its terminal event".
#[tokio::test]
async fn llama_cpp_in_band_errors_keep_their_message() {
    for (endpoint, kind) in [
        ("openai_responses", "openai-responses"),
        ("anthropic", "anthropic"),
    ] {
        let (_, events, error) = golden_run(endpoint, kind, "inband_error_llamacpp").await;
        assert_eq!(text(&events), "Part", "{endpoint}");
        let Some(ProviderError::InBand { message, .. }) = &error else {
            panic!("{endpoint}: expected an in-band error, got {error:?}");
        };
        assert_eq!(
            message, "Failed to parse tool call arguments as JSON (server_error)",
            "{endpoint}"
        );
    }
}

#[tokio::test]
async fn a_stream_without_its_terminal_event_is_truncated() {
    for (endpoint, kind) in ENDPOINTS {
        let (_, events, error) = golden_run(endpoint, kind, "truncated").await;
        assert_eq!(text(&events), "Half an ans", "{endpoint}");
        let Some(ProviderError::Truncated { missing, .. }) = &error else {
            panic!("{endpoint}: expected truncation, got {error:?}");
        };
        let expected = match kind {
            "openai-chat" => "data: [DONE]",
            "openai-responses" => "response.completed",
            _ => "message_stop",
        };
        assert_eq!(*missing, expected);
    }
}

#[tokio::test]
async fn a_tool_without_arguments_has_no_argument_text() {
    for (endpoint, kind) in ENDPOINTS {
        let (_, events, error) = golden_run(endpoint, kind, "tool_no_args").await;
        assert!(error.is_none(), "{endpoint}: {error:?}");
        let calls = tool_calls(&events);
        assert_eq!(calls.len(), 1, "{endpoint}");
        assert_eq!(calls[0].2, "TodoWrite");
        assert_eq!(
            calls[0].3, "",
            "{endpoint}: empty fragments are not forwarded"
        );
        assert_eq!(finish(&events), &FinishReason::ToolCalls, "{endpoint}");
    }
}

#[tokio::test]
async fn a_429_is_retried_and_the_retry_succeeds() {
    for (endpoint, kind) in ENDPOINTS {
        let provider = FakeProvider::start().await;
        provider.push(Reply::RateLimited {
            retry_after_secs: 0,
            body: r#"{"error":{"message":"slow down","type":"rate_limit_error"}}"#.to_owned(),
        });
        provider.push(golden(endpoint, "text"));
        let (events, error) = run(&provider, kind).await;
        assert!(error.is_none(), "{endpoint}: {error:?}");
        assert_eq!(text(&events), "Hello there");
        assert_eq!(provider.requests().len(), 2, "{endpoint}");
    }
}

#[tokio::test]
async fn a_400_is_not_retried_and_carries_the_providers_message() {
    for (endpoint, kind) in ENDPOINTS {
        let provider = FakeProvider::start().await;
        let body = if kind == "anthropic" {
            r#"{"type":"error","error":{"type":"invalid_request_error","message":"messages: text content blocks must be non-empty"},"request_id":"req_1"}"#
        } else {
            r#"{"error":{"message":"Invalid value for 'model'","type":"invalid_request_error","param":"model","code":null}}"#
        };
        provider.push(Reply::Status {
            status: 400,
            body: body.to_owned(),
        });
        let (events, error) = run(&provider, kind).await;
        assert!(events.is_empty());
        let Some(ProviderError::Http {
            status, message, ..
        }) = &error
        else {
            panic!("{endpoint}: {error:?}");
        };
        assert_eq!(*status, 400);
        let expected = if kind == "anthropic" {
            "messages: text content blocks must be non-empty"
        } else {
            "Invalid value for 'model'"
        };
        assert_eq!(message, expected, "{endpoint}");
        assert_eq!(
            provider.requests().len(),
            1,
            "{endpoint}: a 400 is not retried"
        );
    }
}

#[tokio::test]
async fn canceling_a_call_drops_the_connection_and_sends_nothing_more() {
    let provider = FakeProvider::start().await;
    provider.push(Reply::Sse {
        events: fake_provider::text_events(&["a", "b", "c", "d", "e"], (1, 1, 0)),
        gap: Duration::from_millis(200),
    });
    let config = provider_config(&provider, "openai-chat");
    let cancel = CancellationToken::new();
    let mut rx = provider::call(
        &reqwest::Client::new(),
        &config,
        &pool(&config),
        RequestBody::from_json(&json!({"model": "m"})),
        CallLimits {
            headers_timeout: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(5),
            max_attempts: 1,
            retry_base_delay: Duration::from_millis(10),
        },
        cancel.clone(),
    );
    let first = rx.recv().await;
    assert!(
        matches!(first, Some(Ok(ResponseEvent::TextDelta(_)))),
        "{first:?}"
    );
    cancel.cancel();
    let rest = tokio::time::timeout(Duration::from_secs(2), async {
        let mut count = 0;
        while rx.recv().await.is_some() {
            count += 1;
        }
        count
    })
    .await
    .expect("the channel closes promptly after cancel");
    assert!(
        rest <= 1,
        "at most an in-flight event after cancel, got {rest}"
    );
}

/// OpenRouter sends `: OPENROUTER PROCESSING` while a model reasons: any byte from the provider is
/// life, so comments forty times inside the idle limit keep a call going past that limit.
#[tokio::test]
async fn keep_alive_comments_reset_the_idle_timer() {
    let provider = FakeProvider::start().await;
    let mut chunks = vec![": OPENROUTER PROCESSING\n\n".to_owned(); 60];
    chunks.extend(
        fake_provider::text_events(&["still ", "here"], (3, 2, 0))
            .into_iter()
            .map(|event| format!("data: {event}\n\n")),
    );
    provider.push(Reply::Chunks {
        chunks,
        gap: Duration::from_millis(50),
    });
    let config = provider_config(&provider, "openai-chat");
    let mut rx = provider::call(
        &reqwest::Client::new(),
        &config,
        &pool(&config),
        RequestBody::from_json(&json!({"model": "m"})),
        CallLimits {
            headers_timeout: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(2),
            max_attempts: 1,
            retry_base_delay: Duration::from_millis(10),
        },
        CancellationToken::new(),
    );
    let mut events = Vec::new();
    while let Some(item) = rx.recv().await {
        events.push(item.expect("comments keep the call alive"));
    }
    assert_eq!(text(&events), "still here");
}
