//! Runtime messages are appended exactly once per event: a mode notice and a Plan-mode reminder
//! produced for one user message appear once in every later provider request — across a provider
//! retry, a tool round, later turns and a server restart — while a new user message in Plan mode
//! brings its own reminder and a switch back to Agent mode its own notice.

#[path = "support/fake_cursor.rs"]
mod fake_cursor;
#[path = "support/fake_provider.rs"]
mod fake_provider;
#[path = "support/fixtures.rs"]
mod fixtures;

use cursor_server::cursor::proto::agent::AgentMode;
use fake_cursor::{FakeCursor, Session};
use fake_provider::{FakeProvider, Reply, text_events, tool_call_events};
use fixtures::{TestServer, exec_result, offered_tools, read_success, run_request_in_mode};

const TO_PLAN: &str = "from Agent mode to Plan mode";
const BACK_TO_AGENT: &str = "from Plan mode to Agent mode";
const PLAN_REMINDER: &str = "Plan mode is active for this message";

fn count(request: &serde_json::Value, needle: &str) -> usize {
    request["messages"].to_string().matches(needle).count()
}

#[tokio::test]
async fn a_reminder_produced_once_appears_once_across_retries_tool_rounds_turns_and_restarts() {
    let provider = FakeProvider::start().await;
    let server = TestServer::start(&provider.base_url()).await;
    let cursor = FakeCursor::new(server.addr);

    // Turn 1 in Agent mode: no runtime messages at all.
    provider.push(Reply::sse(text_events(&["hi"], (10, 1, 0))));
    let turn = Session::start(
        &cursor,
        "req-r1",
        &run_request_in_mode("conv-tags", "hello", AgentMode::Agent),
    )
    .await;
    assert!(turn.finish().await.is_success());

    // Turn 2 in Plan mode: the provider fails once (retried), then reads a file, then answers.
    provider.push(Reply::Status {
        status: 500,
        body: r#"{"error":{"message":"overloaded"}}"#.into(),
    });
    provider.push(Reply::sse(tool_call_events(
        None,
        &[("call_1", "Read", r#"{"path":"src/lib.rs"}"#)],
        (20, 2, 0),
    )));
    provider.push(Reply::sse(text_events(&["the plan"], (30, 3, 0))));
    let mut turn = Session::start(
        &cursor,
        "req-r2",
        &run_request_in_mode("conv-tags", "plan a refactor", AgentMode::Plan),
    )
    .await;
    let read = turn.next_exec().await;
    turn.send(&exec_result(
        read.id,
        read_success("src/lib.rs", "fn main() {}"),
    ))
    .await;
    assert!(turn.finish().await.is_success());

    let requests = provider.requests();
    assert_eq!(
        requests.len(),
        4,
        "turn 1, a failed attempt, its retry, the follow-up"
    );
    assert_eq!(
        count(&requests[0], TO_PLAN) + count(&requests[0], PLAN_REMINDER),
        0
    );
    for (n, request) in requests[1..].iter().enumerate() {
        assert_eq!(
            count(request, TO_PLAN),
            1,
            "plan request {n}: one mode notice"
        );
        assert_eq!(
            count(request, PLAN_REMINDER),
            1,
            "plan request {n}: one reminder"
        );
        let tools = offered_tools(request);
        assert!(tools.contains(&"Read".to_owned()), "{tools:?}");
        assert!(!tools.contains(&"Write".to_owned()) && !tools.contains(&"Shell".to_owned()));
        assert!(
            request["messages"][0]["content"]
                .as_str()
                .unwrap()
                .contains("# Mode: Plan")
        );
    }
    // The notice and reminder follow the user's message they belong to.
    let plan_messages = requests[3]["messages"].to_string();
    let asked = plan_messages.find("plan a refactor").expect("user message");
    assert!(asked < plan_messages.find(TO_PLAN).unwrap());
    assert!(plan_messages.find(TO_PLAN).unwrap() < plan_messages.find(PLAN_REMINDER).unwrap());

    // Restart on the same database.
    let db_dir = server.stop().await;
    let server = TestServer::start_in(&provider.base_url(), db_dir, "").await;
    let cursor = FakeCursor::new(server.addr);

    // Turn 3, Plan again: its own reminder, no new notice.
    provider.push(Reply::sse(text_events(&["step 1"], (40, 4, 0))));
    let turn = Session::start(
        &cursor,
        "req-r3",
        &run_request_in_mode("conv-tags", "go on", AgentMode::Plan),
    )
    .await;
    assert!(turn.finish().await.is_success());
    // Turn 4, back to Agent: one notice for the switch back, reminders unchanged.
    provider.push(Reply::sse(text_events(&["done"], (50, 5, 0))));
    let turn = Session::start(
        &cursor,
        "req-r4",
        &run_request_in_mode("conv-tags", "implement it", AgentMode::Agent),
    )
    .await;
    assert!(turn.finish().await.is_success());

    let requests = provider.requests();
    assert_eq!(requests.len(), 6);
    let (third, fourth) = (&requests[4], &requests[5]);
    assert_eq!(count(third, TO_PLAN), 1);
    assert_eq!(
        count(third, PLAN_REMINDER),
        2,
        "one reminder per Plan message"
    );
    assert_eq!(count(third, BACK_TO_AGENT), 0);
    assert_eq!(count(fourth, TO_PLAN), 1);
    assert_eq!(count(fourth, PLAN_REMINDER), 2);
    assert_eq!(count(fourth, BACK_TO_AGENT), 1);
    assert!(
        offered_tools(fourth).contains(&"Write".to_owned()),
        "Agent tools again"
    );
    // Every request extends the previous one: runtime messages never move or repeat.
    let messages = |r: &serde_json::Value| r["messages"].as_array().unwrap()[1..].to_vec();
    for pair in requests[2..].windows(2) {
        let (before, after) = (messages(&pair[0]), messages(&pair[1]));
        assert_eq!(&after[..before.len()], before.as_slice());
    }
}
