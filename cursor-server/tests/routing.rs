//! Model routing on the real transports with real provider HTTP: the names Cursor sends resolve
//! through aliases and patterns, a subagent or a mode runs on the model configured for it, a call
//! that fails before streaming goes to the model's fallback within the same turn (recorded as two
//! provider calls), a call that already streamed is never restarted elsewhere, and a fallback to
//! another provider family gets a request in that family's own form.

#[path = "support/fake_cursor.rs"]
mod fake_cursor;
#[path = "support/fake_provider.rs"]
mod fake_provider;
#[path = "support/fixtures.rs"]
mod fixtures;

use cursor_server::cursor::proto::agent::{self as pb, agent_client_message};
use cursor_server::store::Store;
use cursor_server::store::runs;
use fake_cursor::{FakeCursor, Session};
use fake_provider::{FakeProvider, Reply, golden, text_events};
use fixtures::{
    MODEL, TestServer, exec_result, read_success, run_request_for_model, run_request_in_mode,
    run_request_with_env,
};

/// The test configuration with `routing` added to the test model (aliases, fallbacks), a second
/// provider (`backup`, Chat) with model `backup-model`, and top-level `tables` ([modes], ...).
async fn server(
    primary: &FakeProvider,
    kind: &str,
    backup: &FakeProvider,
    routing: &str,
    tables: &str,
) -> TestServer {
    let (routing, tables, backup_url) = (routing.to_owned(), tables.to_owned(), backup.base_url());
    TestServer::start_edited(&primary.base_url(), kind, move |text| {
        let text = text.replace("vision = true\n", &format!("vision = true\n{routing}\n"));
        format!(
            r#"{text}
[[providers]]
name = "backup"
kind = "openai-chat"
base_url = "{backup_url}"
api_key = "sk-backup"

[[providers.models]]
id = "backup-model"
context_window = 200000

{tables}
"#
        )
    })
    .await
}

fn with_subagent(mut message: pb::AgentClientMessage, kind: &str) -> pb::AgentClientMessage {
    if let Some(agent_client_message::Message::RunRequest(request)) = &mut message.message {
        request.subagent_type_name = Some(kind.to_owned());
    }
    message
}

async fn open_store(server: &TestServer) -> Store {
    let url = format!(
        "sqlite://{}",
        server.db_dir.path().join("test.db").display()
    );
    Store::open(&url).await.expect("store")
}

#[tokio::test]
async fn aliases_and_patterns_resolve_and_an_unknown_name_is_not_found() {
    let (primary, backup) = (FakeProvider::start().await, FakeProvider::start().await);
    primary.push(Reply::sse(text_events(&["one"], (5, 1, 0))));
    primary.push(Reply::sse(text_events(&["two"], (5, 1, 0))));
    let server = server(
        &primary,
        "openai-chat",
        &backup,
        r#"aliases = ["composer-1", "claude-*-sonnet*"]"#,
        "",
    )
    .await;
    let cursor = FakeCursor::new(server.addr);
    for (request_id, name, text) in [
        ("req-alias", "composer-1", "one"),
        ("req-pattern", "claude-4.5-sonnet-thinking", "two"),
    ] {
        let transcript = Session::start(
            &cursor,
            request_id,
            &run_request_for_model(&format!("conv-{request_id}"), "hi", name),
        )
        .await
        .finish()
        .await;
        assert!(transcript.is_success(), "{name}: {:?}", transcript.end);
        assert_eq!(transcript.text(), text);
    }
    let requests = primary.requests();
    assert_eq!(requests[0]["model"], format!("upstream-{MODEL}"));
    assert_eq!(requests[1]["model"], format!("upstream-{MODEL}"));
    assert!(backup.requests().is_empty());

    let missing = Session::start(
        &cursor,
        "req-missing",
        &run_request_for_model("conv-missing", "hi", "gpt-4o"),
    )
    .await
    .finish()
    .await;
    assert_eq!(missing.error_code(), Some("not_found"));
    let message = missing.error_message().unwrap_or_default();
    assert!(
        message.contains("\"gpt-4o\"") && message.contains(MODEL),
        "{message}"
    );

    // The run record keeps both names.
    let store = open_store(&server).await;
    let listed = runs::list(
        &store,
        &runs::RunFilter {
            request_id: Some("req-pattern".into()),
            limit: 1,
            ..Default::default()
        },
    )
    .await
    .expect("runs");
    assert_eq!(listed[0].record.model_id, MODEL);
    assert_eq!(
        listed[0].record.requested_model.as_deref(),
        Some("claude-4.5-sonnet-thinking")
    );
}

#[tokio::test]
async fn a_subagent_asking_for_cursors_model_runs_on_its_configured_model_and_modes_pick_theirs() {
    let (primary, backup) = (FakeProvider::start().await, FakeProvider::start().await);
    backup.push(Reply::sse(text_events(&["explored"], (5, 1, 0))));
    backup.push(Reply::sse(text_events(&["planned"], (5, 1, 0))));
    primary.push(Reply::sse(text_events(&["asked"], (5, 1, 0))));
    let server = server(
        &primary,
        "openai-chat",
        &backup,
        r#"aliases = ["composer-*"]"#,
        "[subagents]\nexplore = \"backup-model\"\n\n[modes]\nplan = \"backup-model\"",
    )
    .await;
    let cursor = FakeCursor::new(server.addr);
    // A subagent asks for Cursor's own model, which is aliased: its type's model wins.
    let child = Session::start(
        &cursor,
        "req-child",
        &with_subagent(
            run_request_for_model("conv-child", "look around", "composer-2"),
            "explore",
        ),
    )
    .await
    .finish()
    .await;
    assert!(child.is_success(), "{:?}", child.end);
    assert_eq!(child.text(), "explored");
    // Plan mode with Auto runs on the model configured for Plan.
    let mut auto_plan = run_request_in_mode("conv-plan", "plan it", pb::AgentMode::Plan);
    if let Some(agent_client_message::Message::RunRequest(request)) = &mut auto_plan.message {
        request.requested_model = Some(pb::RequestedModel {
            model_id: "default".into(),
            ..Default::default()
        });
    }
    let plan = Session::start(&cursor, "req-plan", &auto_plan)
        .await
        .finish()
        .await;
    assert!(plan.is_success(), "{:?}", plan.end);
    assert_eq!(plan.text(), "planned");
    // A model named exactly wins over the mode's.
    let exact = Session::start(
        &cursor,
        "req-exact",
        &run_request_for_model("conv-exact", "ask", MODEL),
    )
    .await
    .finish()
    .await;
    assert!(exact.is_success(), "{:?}", exact.end);
    assert_eq!(backup.requests().len(), 2);
    assert_eq!(backup.requests()[0]["model"], "backup-model");
    assert_eq!(primary.requests().len(), 1);
}

#[tokio::test]
async fn a_429_storm_is_answered_by_the_fallback_within_the_same_turn() {
    let (primary, backup) = (FakeProvider::start().await, FakeProvider::start().await);
    for _ in 0..3 {
        primary.push(Reply::Status {
            status: 429,
            body: r#"{"error":{"message":"rate limited"}}"#.into(),
        });
    }
    backup.push(Reply::sse(text_events(&["from the backup"], (5, 2, 0))));
    let server = server(
        &primary,
        "openai-chat",
        &backup,
        r#"fallbacks = ["backup-model"]"#,
        "",
    )
    .await;
    let cursor = FakeCursor::new(server.addr);
    let transcript = Session::start(
        &cursor,
        "req-storm",
        &run_request_with_env("conv-storm", "hi"),
    )
    .await
    .finish()
    .await;
    assert!(transcript.is_success(), "{:?}", transcript.end);
    assert_eq!(transcript.text(), "from the backup");
    assert_eq!(
        primary.requests().len(),
        3,
        "the primary's own retries first"
    );
    let store = open_store(&server).await;
    let calls = runs::provider_calls(&store, "req-storm")
        .await
        .expect("calls");
    assert_eq!(calls.len(), 2, "{calls:?}");
    assert_eq!(
        (calls[0].model_id.as_str(), calls[0].attempts()),
        (MODEL, 3)
    );
    assert!(
        calls[0]
            .error
            .as_deref()
            .unwrap_or_default()
            .contains("429")
    );
    assert_eq!(calls[1].model_id, "backup-model");
    assert_eq!(calls[1].provider, "backup");
    assert_eq!(calls[1].fallback_from.as_deref(), Some(MODEL));
    assert!(calls[1].error.is_none());
}

#[tokio::test]
async fn a_call_that_already_streamed_is_not_restarted_on_the_fallback() {
    let (primary, backup) = (FakeProvider::start().await, FakeProvider::start().await);
    let mut events = text_events(&["half an answer"], (5, 2, 0));
    events.truncate(2);
    primary.push(Reply::CutAfter { events });
    backup.push(Reply::sse(text_events(&["never"], (5, 1, 0))));
    let server = server(
        &primary,
        "openai-chat",
        &backup,
        r#"fallbacks = ["backup-model"]"#,
        "",
    )
    .await;
    let cursor = FakeCursor::new(server.addr);
    let transcript = Session::start(&cursor, "req-cut", &run_request_with_env("conv-cut", "hi"))
        .await
        .finish()
        .await;
    assert_eq!(
        transcript.error_code(),
        Some("unavailable"),
        "{:?}",
        transcript.end
    );
    assert_eq!(transcript.text(), "half an answer");
    assert!(backup.requests().is_empty(), "never restarted elsewhere");
}

#[tokio::test]
async fn an_anthropic_to_chat_fallback_with_thinking_in_history_sends_a_valid_chat_request() {
    let (primary, backup) = (FakeProvider::start().await, FakeProvider::start().await);
    // Turn: thinking (signed) and a Read on Anthropic; the call after the tool result finds
    // Anthropic overloaded, and the Chat fallback answers.
    primary.push(golden("anthropic", "reasoning_tool"));
    for _ in 0..3 {
        primary.push(Reply::Status {
            status: 529,
            body: r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#
                .into(),
        });
    }
    backup.push(Reply::sse(text_events(&["It prints hello."], (30, 4, 0))));
    let server = server(
        &primary,
        "anthropic",
        &backup,
        r#"fallbacks = ["backup-model"]"#,
        "",
    )
    .await;
    let cursor = FakeCursor::new(server.addr);
    let mut session = Session::start(
        &cursor,
        "req-family",
        &run_request_with_env("conv-family", "what does main do?"),
    )
    .await;
    let exec = session.next_exec().await;
    session
        .send(&exec_result(
            exec.id,
            read_success("src/main.rs", "fn main() { println!(\"hello\"); }\n"),
        ))
        .await;
    let transcript = session.finish().await;
    assert!(transcript.is_success(), "{:?}", transcript.end);
    assert_eq!(transcript.text(), "It prints hello.");

    let chat = &backup.requests()[0];
    assert_eq!(chat["model"], "backup-model");
    let messages = chat["messages"].as_array().expect("Chat messages");
    assert_eq!(messages[0]["role"], "system");
    let text = chat.to_string();
    assert!(
        !text.contains("EsECsig==") && !text.contains("\"thinking\""),
        "Anthropic's signed thinking stays out of a Chat request: {text}"
    );
    let assistant = messages
        .iter()
        .find(|m| m["role"] == "assistant")
        .expect("the assistant's tool call");
    let call = &assistant["tool_calls"][0];
    assert_eq!(call["type"], "function");
    assert_eq!(call["function"]["name"], "Read");
    let tool = messages
        .iter()
        .find(|m| m["role"] == "tool")
        .expect("the tool result");
    assert_eq!(tool["tool_call_id"], call["id"]);
    assert!(tool["content"].is_string());
}

/// Issue 31 (4 with 3): a provider whose every key is cooling down (each answered 429 with a long
/// retry-after) sends the call down the fallback chain instead of failing the turn.
#[tokio::test]
async fn a_provider_whose_keys_all_cool_down_falls_back_to_the_next_model() {
    let (primary, backup) = (FakeProvider::start().await, FakeProvider::start().await);
    for _ in 0..2 {
        primary.push(Reply::RateLimited {
            retry_after_secs: 90,
            body: r#"{"error":{"message":"slow down"}}"#.into(),
        });
    }
    backup.push(Reply::sse(text_events(&["answered elsewhere"], (5, 2, 0))));
    let backup_url = backup.base_url();
    let server = TestServer::start_edited(&primary.base_url(), "openai-chat", move |text| {
        let text = text
            .replace(
                &format!("api_key = \"{}\"", fixtures::API_KEY),
                "api_keys = [\"sk-one\", \"sk-two\"]",
            )
            .replace(
                "vision = true\n",
                "vision = true\nfallbacks = [\"backup-model\"]\n",
            );
        format!(
            "{text}\n[[providers]]\nname = \"backup\"\nkind = \"openai-chat\"\nbase_url = \"{backup_url}\"\napi_key = \"sk-backup\"\n\n[[providers.models]]\nid = \"backup-model\"\n"
        )
    })
    .await;
    let cursor = FakeCursor::new(server.addr);
    let transcript = Session::start(
        &cursor,
        "req-cooling",
        &run_request_with_env("conv-cooling", "hi"),
    )
    .await
    .finish()
    .await;
    assert!(transcript.is_success(), "{:?}", transcript.end);
    assert_eq!(transcript.text(), "answered elsewhere");
    assert_eq!(primary.requests().len(), 2, "each key tried once");
    let store = open_store(&server).await;
    let calls = runs::provider_calls(&store, "req-cooling")
        .await
        .expect("calls");
    assert_eq!(calls.len(), 2, "{calls:?}");
    assert!(
        calls[0]
            .error
            .as_deref()
            .unwrap_or_default()
            .contains("cooling down"),
        "{:?}",
        calls[0].error
    );
    assert_eq!(calls[1].fallback_from.as_deref(), Some(MODEL));
}
