//! M(n) is a prefix of M(n+1): on every endpoint, each provider request's projected messages start
//! with the previous request's, byte for byte, and the system prompt and tools never change —
//! across a multi-tool turn and a second user turn. The one sanctioned break is a compaction: a
//! prompt that would fill the context window is replaced by a summary, and requests after it extend
//! the compacted one again.

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

fn messages_of(request: &Value) -> Vec<String> {
    request["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(Value::to_string)
        .collect()
}

fn user_in_mode(conversation_id: &str, text: &str) -> AgentClientMessage {
    run_request_in_mode(conversation_id, text, AgentMode::Agent)
}

#[tokio::test]
async fn a_prompt_near_the_context_window_is_compacted_into_a_summary_the_model_continues_from() {
    let provider = FakeProvider::start().await;
    // Usage 0 keeps the default size estimate (4 bytes per token).
    provider.push(Reply::sse(text_events(&["answer one"], (0, 0, 0))));
    provider.push(Reply::sse(text_events(
        &["SUMMARY: the user asked a question, then pasted a long build log."],
        (0, 0, 0),
    )));
    provider.push(Reply::sse(text_events(&["continuing"], (0, 0, 0))));
    provider.push(Reply::sse(text_events(&["you are welcome"], (0, 0, 0))));
    let server = TestServer::start_in(
        &provider.base_url(),
        tempfile::tempdir().unwrap(),
        // 10% of the default 128k window: about 51 kB of prompt.
        "compact_at_percent = 10",
    )
    .await;
    let cursor = FakeCursor::new(server.addr);
    let conversation = "conv-compact";
    let first = Session::start(
        &cursor,
        "req-c1",
        &user_in_mode(conversation, "first question"),
    )
    .await
    .finish()
    .await;
    assert!(first.is_success());
    let log = format!("BUILD LOG {}", "error: x\n".repeat(8_000));
    let second = Session::start(&cursor, "req-c2", &user_in_mode(conversation, &log))
        .await
        .finish()
        .await;
    assert!(second.is_success(), "{:?}", second.end);
    assert_eq!(
        second.text(),
        "continuing",
        "the summary is not shown as the answer"
    );
    let requests = provider.requests();
    assert_eq!(requests.len(), 3);

    // The compaction call: the compaction prompt, no tools, everything so far, then the request.
    let compaction = &requests[1];
    let system = compaction["messages"][0]["content"].as_str().unwrap();
    assert!(
        system.contains("Summarise the conversation so far"),
        "{system}"
    );
    assert!(offered_tools(compaction).is_empty());
    let all = compaction["messages"].to_string();
    assert!(
        all.contains("first question") && all.contains("answer one") && all.contains("BUILD LOG")
    );
    let last = compaction["messages"].as_array().unwrap().last().unwrap();
    assert!(
        last["content"]
            .as_str()
            .unwrap()
            .starts_with("Summarize the conversation above")
    );

    // The model continues from the summary alone, with its own prompt and tools.
    let continued = &requests[2];
    let messages = messages_of(continued);
    assert_eq!(messages.len(), 2, "{messages:?}");
    assert!(messages[1].contains("<conversation_summary>"));
    assert!(messages[1].contains("SUMMARY: the user asked a question"));
    assert!(!continued.to_string().contains("BUILD LOG"));
    assert_eq!(offered_tools(continued), offered_tools(&requests[0]));
    let state = second.checkpoints().last().cloned().cloned().unwrap();
    assert_eq!(state.self_summary_count, 1);

    // The next turn extends the compacted request and does not compact again.
    let third = Session::start(&cursor, "req-c3", &user_in_mode(conversation, "thanks"))
        .await
        .finish()
        .await;
    assert!(third.is_success());
    let requests = provider.requests();
    assert_eq!(requests.len(), 4);
    let next = messages_of(&requests[3]);
    assert_eq!(&next[..messages.len()], messages.as_slice());
    assert!(next.last().unwrap().contains("thanks"));
    assert_eq!(third.checkpoints().last().unwrap().self_summary_count, 1);
}

/// Cursor's summarize action on `conversation`.
fn summarize_action(conversation: &str) -> AgentClientMessage {
    let mut summarize = user_in_mode(conversation, "unused");
    if let Some(agent_client_message::Message::RunRequest(request)) = &mut summarize.message {
        request.action = Some(pb::ConversationAction {
            action: Some(conversation_action::Action::SummarizeAction(
                pb::SummarizeAction {},
            )),
            ..pb::ConversationAction::default()
        });
    }
    summarize
}

#[tokio::test]
async fn a_summarize_action_compacts_now_and_the_next_turn_starts_from_the_summary() {
    let provider = FakeProvider::start().await;
    provider.push(Reply::sse(text_events(&["the answer is 42"], (0, 0, 0))));
    provider.push(Reply::sse(text_events(
        &["SUMMARY: answered 42."],
        (0, 0, 0),
    )));
    provider.push(Reply::sse(text_events(&["ok"], (0, 0, 0))));
    let server = TestServer::start(&provider.base_url()).await;
    let cursor = FakeCursor::new(server.addr);
    let conversation = "conv-summarize";
    assert!(
        Session::start(
            &cursor,
            "req-s1",
            &user_in_mode(conversation, "what is the answer")
        )
        .await
        .finish()
        .await
        .is_success()
    );
    let summarize = summarize_action(conversation);
    let summarized = Session::start(&cursor, "req-s2", &summarize)
        .await
        .finish()
        .await;
    assert!(summarized.is_success(), "{:?}", summarized.end);
    assert_eq!(summarized.text(), "");
    assert_eq!(
        summarized.checkpoints().last().unwrap().self_summary_count,
        1
    );
    assert!(
        Session::start(&cursor, "req-s3", &user_in_mode(conversation, "and now?"))
            .await
            .finish()
            .await
            .is_success()
    );
    let requests = provider.requests();
    assert_eq!(requests.len(), 3);
    let after = requests[2]["messages"].to_string();
    assert!(after.contains("SUMMARY: answered 42."));
    assert!(!after.contains("what is the answer"), "{after}");
    assert!(after.contains("and now?"));
    assert!(
        after.contains("<user_info>"),
        "the workspace context was summarized away, so it is told again"
    );
}

/// A summarize action whose compaction call the provider refuses: the error says it was the
/// summary of older history that failed (not the user's turn), with the provider's reason.
#[tokio::test]
async fn a_failed_compaction_says_it_was_the_compaction() {
    let provider = FakeProvider::start().await;
    provider.push(Reply::sse(text_events(&["the answer is 42"], (0, 0, 0))));
    provider.push(Reply::Status {
        status: 400,
        body: r#"{"error":{"message":"the request exceeds the available context size"}}"#.into(),
    });
    let server = TestServer::start(&provider.base_url()).await;
    let cursor = FakeCursor::new(server.addr);
    let conversation = "conv-compaction-fails";
    assert!(
        Session::start(
            &cursor,
            "req-cf1",
            &user_in_mode(conversation, "what is it")
        )
        .await
        .finish()
        .await
        .is_success()
    );
    let summarize = summarize_action(conversation);
    let failed = Session::start(&cursor, "req-cf2", &summarize)
        .await
        .finish()
        .await;
    assert_eq!(failed.error_code(), Some("invalid_argument"));
    let message = failed.error_message().unwrap_or_default();
    assert!(
        message.contains("compaction") && message.contains("exceeds the available context size"),
        "{message}"
    );
}
