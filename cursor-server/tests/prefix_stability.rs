//! M(n) is a prefix of M(n+1): on every endpoint, each provider request's projected messages start
//! with the previous request's, byte for byte, and the system prompt and tools never change —
//! across a multi-tool turn and a second user turn.

#[path = "support/fake_cursor.rs"]
mod fake_cursor;
#[path = "support/fake_provider.rs"]
mod fake_provider;
#[path = "support/fixtures.rs"]
mod fixtures;

use cursor_server::cursor::proto::agent::{
    self as pb, AgentClientMessage, AgentMode, agent_client_message, conversation_action,
};
use fake_cursor::{FakeCursor, Session};
use fake_provider::{FakeProvider, Reply, golden, text_events};
use fixtures::{
    TestServer, exec_result, offered_tools, read_success, run_request_in_mode, run_request_with_env,
};
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

/// The run_request of `mode` whose request context carries `rules` (always-applied rules).
fn request_with_rules(text: &str, mode: AgentMode, rules: &[&str]) -> AgentClientMessage {
    let mut message = run_request_in_mode("conv-modes", text, mode);
    if let Some(agent_client_message::Message::RunRequest(request)) = &mut message.message
        && let Some(conversation_action::Action::UserMessageAction(action)) =
            request.action.as_mut().and_then(|a| a.action.as_mut())
        && let Some(context) = action.request_context.as_mut()
    {
        context.rules = rules
            .iter()
            .enumerate()
            .map(|(i, rule)| pb::CursorRule {
                full_path: format!("/home/user/demo/.cursor/rules/r{i}.mdc"),
                content: (*rule).to_owned(),
                r#type: Some(pb::CursorRuleType {
                    r#type: Some(pb::cursor_rule_type::Type::Global(
                        pb::CursorRuleTypeGlobal {},
                    )),
                }),
                ..pb::CursorRule::default()
            })
            .collect();
    }
    message
}

#[tokio::test]
async fn mode_switches_and_new_context_only_replace_the_system_prompt_and_append_messages() {
    let provider = FakeProvider::start().await;
    for answer in ["one", "two", "three", "four"] {
        provider.push(Reply::sse(text_events(&[answer], (10, 1, 0))));
    }
    let server = TestServer::start(&provider.base_url()).await;
    let cursor = FakeCursor::new(server.addr);
    let turns = [
        ("req-m1", "start", AgentMode::Agent, &["Use tabs."][..]),
        ("req-m2", "plan it", AgentMode::Plan, &["Use tabs."][..]),
        ("req-m3", "ask it", AgentMode::Ask, &["Use tabs."][..]),
        (
            "req-m4",
            "do it",
            AgentMode::Agent,
            &["Use tabs.", "Write tests first."][..],
        ),
    ];
    for (request_id, text, mode, rules) in turns {
        let turn =
            Session::start(&cursor, request_id, &request_with_rules(text, mode, rules)).await;
        assert!(turn.finish().await.is_success(), "{request_id}");
    }
    let requests = provider.requests();
    assert_eq!(requests.len(), 4);
    let system = |r: &Value| r["messages"][0]["content"].as_str().unwrap().to_owned();
    assert!(system(&requests[0]).contains("# Mode: Agent"));
    assert!(system(&requests[1]).contains("# Mode: Plan"));
    assert!(system(&requests[2]).contains("# Mode: Ask"));
    assert_eq!(
        system(&requests[3]),
        system(&requests[0]),
        "back to the same Agent prompt"
    );
    assert_ne!(offered_tools(&requests[1]), offered_tools(&requests[0]));
    assert_eq!(offered_tools(&requests[3]), offered_tools(&requests[0]));
    // Below the system prompt every request extends the previous one byte for byte.
    let rest: Vec<Vec<String>> = requests
        .iter()
        .map(|r| {
            r["messages"].as_array().unwrap()[1..]
                .iter()
                .map(Value::to_string)
                .collect()
        })
        .collect();
    for n in 0..3 {
        assert_eq!(
            &rest[n + 1][..rest[n].len()],
            rest[n].as_slice(),
            "request {n} is a prefix"
        );
    }
    // The context was injected before the first message, and again only when a rule was added.
    let all = requests[3]["messages"].to_string();
    assert_eq!(all.matches("<user_info>").count(), 2);
    assert_eq!(all.matches("Use tabs.").count(), 2);
    assert_eq!(all.matches("Write tests first.").count(), 1);
    let injected = all.find("Write tests first.").unwrap();
    assert!(
        injected < all.find("do it").unwrap(),
        "context precedes the message"
    );
    assert!(
        all.find("four").is_none(),
        "the last answer is not in its own request"
    );
}
