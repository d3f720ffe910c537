//! M(n) is a prefix of M(n+1): on every endpoint, each provider request's projected messages start
//! with the previous request's, byte for byte, and the system prompt and tools never change —
//! across a multi-tool turn and a second user turn.

#[path = "support/fake_cursor.rs"]
mod fake_cursor;
#[path = "support/fake_provider.rs"]
mod fake_provider;
#[path = "support/fixtures.rs"]
mod fixtures;

use fake_cursor::{FakeCursor, Session};
use fake_provider::{FakeProvider, golden};
use fixtures::{TestServer, exec_result, read_success, run_request_with_env};
use serde_json::Value;

/// Removes Anthropic cache breakpoints: they move to the newest message on every request by design
/// and are not part of the cached content.
fn without_cache_control(value: &Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(k, _)| k.as_str() != "cache_control")
                .map(|(k, v)| (k.clone(), without_cache_control(v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(without_cache_control).collect()),
        other => other.clone(),
    }
}

#[tokio::test]
async fn every_request_extends_the_previous_one_on_every_endpoint() {
    for (endpoint, kind, messages_key, fixed_keys) in [
        ("openai_chat", "openai-chat", "messages", &["tools"][..]),
        (
            "openai_responses",
            "openai-responses",
            "input",
            &["instructions", "tools"][..],
        ),
        (
            "anthropic",
            "anthropic",
            "messages",
            &["system", "tools"][..],
        ),
    ] {
        let provider = FakeProvider::start().await;
        provider.push(golden(endpoint, "parallel_tools"));
        provider.push(golden(endpoint, "text"));
        provider.push(golden(endpoint, "usage_cache"));
        let server = TestServer::start_kind(&provider.base_url(), kind).await;
        let cursor = FakeCursor::new(server.addr);

        let mut turn = Session::start(
            &cursor,
            "req-p1",
            &run_request_with_env("conv-prefix", "read both"),
        )
        .await;
        let first = turn.next_exec().await;
        let second = turn.next_exec().await;
        // Out of order on purpose: projection order is call order, not completion order.
        turn.send(&exec_result(second.id, read_success("", "bee")))
            .await;
        turn.send(&exec_result(first.id, read_success("", "ay")))
            .await;
        assert!(turn.finish().await.is_success(), "{endpoint}");
        let next = Session::start(
            &cursor,
            "req-p2",
            &run_request_with_env("conv-prefix", "and now?"),
        )
        .await;
        assert!(next.finish().await.is_success(), "{endpoint}");

        let requests = provider.requests();
        assert_eq!(requests.len(), 3, "{endpoint}");
        for key in fixed_keys {
            assert_eq!(
                requests[0][key], requests[1][key],
                "{endpoint}: {key} is stable"
            );
            assert_eq!(
                requests[1][key], requests[2][key],
                "{endpoint}: {key} is stable"
            );
        }
        let projected: Vec<Vec<String>> = requests
            .iter()
            .map(|r| {
                r[messages_key]
                    .as_array()
                    .expect("messages")
                    .iter()
                    .map(|m| without_cache_control(m).to_string())
                    .collect()
            })
            .collect();
        for n in 0..2 {
            let (before, after) = (&projected[n], &projected[n + 1]);
            assert!(
                after.len() > before.len(),
                "{endpoint}: request {} grows",
                n + 1
            );
            assert_eq!(
                &after[..before.len()],
                before.as_slice(),
                "{endpoint}: request {n} is a byte prefix of {}",
                n + 1
            );
        }
        // The multi-tool turn was replayed with both results, in call order.
        let added = &projected[1][projected[0].len()..].join("\n");
        let a = added.find("ay").expect("first result");
        let b = added.find("bee").expect("second result");
        assert!(a < b, "{endpoint}: results in call order");
    }
}
