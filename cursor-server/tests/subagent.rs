//! Subagents: the parent's Task call becomes `subagent_args`; the client runs the child as its own
//! run (own request and conversation, `subagent_type_name`) which this server answers with the
//! subagent prompt and tools; the child's final message comes back as `subagent_result` and
//! completes the parent's Task card. A backgrounded subagent's later completion starts a follow-up
//! turn on the parent, told to the model once.
//!
//! A file of its own because every scenario here spans two runs (parent and child, or a turn and
//! its background follow-up), unlike the single-run scenarios of `tool_loop.rs`.

#[path = "support/fake_cursor.rs"]
mod fake_cursor;
#[path = "support/fake_provider.rs"]
mod fake_provider;
#[path = "support/fixtures.rs"]
mod fixtures;

use cursor_server::cursor::proto::agent::{
    self as pb, AgentClientMessage, agent_client_message, conversation_action, exec_client_message,
    exec_server_message, tool_call,
};
use fake_cursor::{FakeCursor, Session, Transcript};
use fake_provider::{FakeProvider, Reply, text_events, tool_call_events};
use fixtures::{
    MODEL, TestServer, exec_result, offered_tools, run_request_with_env, tool_result_text,
};

fn task_card(transcript: &Transcript) -> pb::TaskToolCall {
    transcript
        .completed_cards()
        .into_iter()
        .find_map(|done| match done.tool_call.clone().and_then(|c| c.tool) {
            Some(tool_call::Tool::TaskToolCall(card)) => Some(card),
            _ => None,
        })
        .expect("a completed Task card")
}

fn subagent_success(
    agent_id: &str,
    final_message: &str,
    background: bool,
) -> exec_client_message::Message {
    exec_client_message::Message::SubagentResult(pb::SubagentResult {
        result: Some(pb::subagent_result::Result::Success(pb::SubagentSuccess {
            agent_id: agent_id.into(),
            final_message: Some(final_message.into()).filter(|m: &String| !m.is_empty()),
            tool_call_count: 3,
            background_reason: if background {
                pb::SubagentBackgroundReason::AgentRequest as i32
            } else {
                pb::SubagentBackgroundReason::Unspecified as i32
            },
            transcript_path: None,
        })),
    })
}

/// The run_request Cursor sends for a subagent's own run.
fn child_request(conversation_id: &str, prompt: &str, type_name: &str) -> AgentClientMessage {
    let mut message = run_request_with_env(conversation_id, prompt);
    if let Some(agent_client_message::Message::RunRequest(request)) = &mut message.message {
        request.subagent_type_name = Some(type_name.to_owned());
    }
    message
}

fn background_completion(conversation_id: &str, task_id: &str) -> AgentClientMessage {
    let mut message = run_request_with_env(conversation_id, "unused");
    if let Some(agent_client_message::Message::RunRequest(request)) = &mut message.message {
        request.action = Some(pb::ConversationAction {
            action: Some(conversation_action::Action::BackgroundTaskCompletionAction(
                pb::BackgroundTaskCompletionAction {
                    completions: vec![pb::BackgroundTaskCompletion {
                        task_id: task_id.into(),
                        kind: pb::BackgroundTaskKind::Subagent as i32,
                        status: pb::BackgroundTaskStatus::Success as i32,
                        title: "Audit the parsers".into(),
                        detail: Some("Found 3 parsers; none validate input.".into()),
                        ..pb::BackgroundTaskCompletion::default()
                    }],
                },
            )),
            ..pb::ConversationAction::default()
        });
    }
    message
}

fn run_status(transcript: &Transcript, call_id: &str) -> Option<i32> {
    transcript
        .checkpoints()
        .last()
        .and_then(|state| state.subagent_runs_by_parent_tool_call_id.get(call_id))
        .map(|run| run.status)
}

#[tokio::test]
async fn a_subagent_runs_with_its_own_prompt_and_tools_and_its_result_completes_the_parent_task_card()
 {
    let provider = FakeProvider::start().await;
    provider.push(Reply::sse(tool_call_events(
        None,
        &[(
            "call_t",
            "Task",
            r#"{"description":"Find the config parser","prompt":"Find where the config file is parsed and report the function.","subagent_type":"explore"}"#,
        )],
        (10, 1, 0),
    )));
    // The child's only answer, then the parent's after the Task result.
    provider.push(Reply::sse(text_events(
        &["Parsed by Config::from_toml in src/config.rs."],
        (5, 1, 0),
    )));
    provider.push(Reply::sse(text_events(
        &["It is Config::from_toml."],
        (20, 2, 0),
    )));
    let server = TestServer::start(&provider.base_url()).await;
    let cursor = FakeCursor::new(server.addr);

    let mut parent = Session::start(
        &cursor,
        "req-parent",
        &run_request_with_env("conv-parent", "where is the config parsed?"),
    )
    .await;
    let exec = parent.next_exec().await;
    let Some(exec_server_message::Message::SubagentArgs(args)) = &exec.message else {
        panic!("expected subagent_args, got {exec:?}");
    };
    assert_eq!(args.subagent_type, "explore");
    assert_eq!(args.model_id, MODEL);
    assert_eq!(args.parent_conversation_id.as_deref(), Some("conv-parent"));
    assert!(args.prompt.starts_with("Find where the config file"));
    assert!(args.tool_call_id.starts_with("tool_"));

    // The client runs the subagent as a run of its own.
    let child = Session::start(
        &cursor,
        "req-child",
        &child_request("conv-child", &args.prompt, "explore"),
    )
    .await
    .finish()
    .await;
    assert!(child.is_success(), "{:?}", child.end);
    let child_request_json = &provider.requests()[1];
    let system = child_request_json["messages"][0]["content"]
        .as_str()
        .unwrap();
    assert!(system.contains("Role: Subagent"), "{system}");
    let mut child_tools = offered_tools(child_request_json);
    child_tools.sort();
    assert_eq!(child_tools, ["Glob", "Grep", "LS", "Read"]);

    parent
        .send(&exec_result(
            exec.id,
            subagent_success("agent-1", &child.text(), false),
        ))
        .await;
    let transcript = parent.finish().await;
    assert!(transcript.is_success(), "{:?}", transcript.end);
    let card = task_card(&transcript);
    assert_eq!(
        card.args.as_ref().unwrap().description,
        "Find the config parser"
    );
    let Some(pb::task_result::Result::Success(success)) = card.result.and_then(|r| r.result) else {
        panic!("a successful Task card");
    };
    assert_eq!(success.agent_id.as_deref(), Some("agent-1"));
    assert!(!success.is_background);
    let seen = tool_result_text(&provider.requests()[2]);
    assert!(
        seen.starts_with("[subagent agent-1 finished after 3 tool calls"),
        "{seen}"
    );
    assert!(
        seen.ends_with("Parsed by Config::from_toml in src/config.rs."),
        "{seen}"
    );
    assert_eq!(
        run_status(&transcript, &args.tool_call_id),
        Some(pb::SubagentRunStatus::Success as i32)
    );
}

#[tokio::test]
async fn a_background_subagent_reports_later_and_the_parent_continues_once() {
    let provider = FakeProvider::start().await;
    provider.push(Reply::sse(tool_call_events(
        None,
        &[(
            "call_bg",
            "Task",
            r#"{"description":"Audit the parsers","prompt":"Audit every parser.","run_in_background":true}"#,
        )],
        (10, 1, 0),
    )));
    provider.push(Reply::sse(text_events(&["Started an audit."], (20, 2, 0))));
    provider.push(Reply::sse(text_events(
        &["The audit found 3 parsers."],
        (30, 3, 0),
    )));
    let server = TestServer::start(&provider.base_url()).await;
    let cursor = FakeCursor::new(server.addr);

    let mut turn = Session::start(
        &cursor,
        "req-bg-1",
        &run_request_with_env("conv-bg", "audit the parsers in the background"),
    )
    .await;
    let exec = turn.next_exec().await;
    let Some(exec_server_message::Message::SubagentArgs(args)) = &exec.message else {
        panic!("expected subagent_args, got {exec:?}");
    };
    assert_eq!(args.run_in_background, Some(true));
    assert_eq!(args.subagent_type, "generalPurpose");
    let call_id = args.tool_call_id.clone();
    turn.send(&exec_result(
        exec.id,
        subagent_success("agent-bg", "", true),
    ))
    .await;
    let first = turn.finish().await;
    assert!(first.is_success(), "{:?}", first.end);
    let Some(pb::task_result::Result::Success(success)) =
        task_card(&first).result.and_then(|r| r.result)
    else {
        panic!("a successful Task card");
    };
    assert!(success.is_background);
    assert!(
        tool_result_text(&provider.requests()[1]).contains("is running in the background"),
        "the model knows it will be told"
    );
    assert_eq!(
        run_status(&first, &call_id),
        Some(pb::SubagentRunStatus::Backgrounded as i32)
    );

    // The client reports the completion: a follow-up turn on the parent.
    let follow_up = Session::start(
        &cursor,
        "req-bg-2",
        &background_completion("conv-bg", "agent-bg"),
    )
    .await
    .finish()
    .await;
    assert!(follow_up.is_success(), "{:?}", follow_up.end);
    assert_eq!(follow_up.text(), "The audit found 3 parsers.");
    let request = &provider.requests()[2];
    let last_user = request["messages"]
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .find(|m| m["role"] == "user")
        .and_then(|m| m["content"].as_str())
        .unwrap()
        .to_owned();
    assert!(last_user.contains("<background_task_ended>"), "{last_user}");
    assert!(
        last_user.contains("Found 3 parsers; none validate input."),
        "{last_user}"
    );
    assert_eq!(
        run_status(&follow_up, &call_id),
        Some(pb::SubagentRunStatus::Success as i32)
    );

    // The same completion again is not news: no provider call, a clean end.
    let again = Session::start(
        &cursor,
        "req-bg-3",
        &background_completion("conv-bg", "agent-bg"),
    )
    .await
    .finish()
    .await;
    assert!(again.is_success(), "{:?}", again.end);
    assert_eq!(provider.requests().len(), 3);
    let stored = provider.requests()[2]["messages"].to_string();
    assert_eq!(stored.matches("<background_task_ended>").count(), 1);
}

/// A `conversation_action` sent on a run already going.
fn live_action(action: conversation_action::Action) -> AgentClientMessage {
    AgentClientMessage {
        message: Some(agent_client_message::Message::ConversationAction(
            pb::ConversationAction {
                action: Some(action),
                ..pb::ConversationAction::default()
            },
        )),
    }
}

const AUDIT_TASK: &str = r#"{"description":"Audit the parsers","prompt":"Audit every parser.","subagent_type":"general"}"#;

/// Issue 29 (3): the user moves a running subagent to the background while the parent's Task call
/// waits for it: the Task card completes as backgrounded, the model is told, and the turn goes on
/// (it used to end `invalid_argument: protocol error: unsupported: conversation_action`).
#[tokio::test]
async fn a_subagent_moved_to_the_background_mid_turn_completes_its_card_and_the_turn_goes_on() {
    let provider = FakeProvider::start().await;
    provider.push(Reply::sse(tool_call_events(
        None,
        &[("call_bg", "Task", AUDIT_TASK)],
        (10, 1, 0),
    )));
    provider.push(Reply::sse(text_events(
        &["It runs on its own."],
        (20, 2, 0),
    )));
    let server = TestServer::start(&provider.base_url()).await;
    let cursor = FakeCursor::new(server.addr);
    let mut parent = Session::start(
        &cursor,
        "req-live-bg",
        &run_request_with_env("conv-live-bg", "audit the parsers"),
    )
    .await;
    let exec = parent.next_exec().await;
    let Some(exec_server_message::Message::SubagentArgs(args)) = &exec.message else {
        panic!("expected subagent_args, got {exec:?}");
    };
    let call_id = args.tool_call_id.clone();
    parent
        .send(&live_action(
            conversation_action::Action::BackgroundSubagentAction(pb::BackgroundSubagentAction {
                tool_call_id: call_id,
            }),
        ))
        .await;
    let transcript = parent.finish().await;
    assert!(transcript.is_success(), "{:?}", transcript.end);
    assert_eq!(transcript.text(), "It runs on its own.");
    let Some(pb::task_result::Result::Success(success)) =
        task_card(&transcript).result.and_then(|r| r.result)
    else {
        panic!("a successful Task result");
    };
    assert!(success.is_background);
    let requests = provider.requests();
    assert_eq!(requests.len(), 2);
    let told = tool_result_text(&requests[1]);
    assert!(told.contains("is running in the background"), "{told}");
}

/// Issue 29 (3): the user cancels a subagent while the parent waits for it: the child's run on
/// this server is stopped, the parent's turn goes on and finishes when the client reports the
/// subagent's end.
#[tokio::test]
async fn a_subagent_canceled_mid_turn_stops_its_run_and_the_parent_goes_on() {
    let provider = FakeProvider::start().await;
    provider.push(Reply::sse(tool_call_events(
        None,
        &[("call_cx", "Task", AUDIT_TASK)],
        (10, 1, 0),
    )));
    let child_answer = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    provider.push(Reply::Hang {
        events: text_events(&["Auditing "], (5, 1, 0))
            .into_iter()
            .take(2)
            .collect(),
        sent: std::sync::Arc::clone(&child_answer),
    });
    provider.push(Reply::sse(text_events(&["Stopped it."], (20, 2, 0))));
    let server = TestServer::start(&provider.base_url()).await;
    let cursor = FakeCursor::new(server.addr);
    let mut parent = Session::start(
        &cursor,
        "req-live-cancel",
        &run_request_with_env("conv-live-cancel", "audit the parsers"),
    )
    .await;
    let exec = parent.next_exec().await;
    let mut child = Session::start(
        &cursor,
        "req-live-child",
        &child_request("conv-live-child", "Audit every parser.", "general"),
    )
    .await;
    while child.transcript.text().is_empty() {
        child.next().await.expect("the child streams");
    }
    parent
        .send(&live_action(
            conversation_action::Action::CancelSubagentAction(pb::CancelSubagentAction {
                subagent_id: "conv-live-child".into(),
            }),
        ))
        .await;
    let child = child.finish().await;
    assert_eq!(child.error_code(), Some("canceled"), "{:?}", child.end);
    parent
        .send(&exec_result(
            exec.id,
            exec_client_message::Message::SubagentResult(pb::SubagentResult {
                result: Some(pb::subagent_result::Result::Error(pb::SubagentError {
                    agent_id: Some("conv-live-child".into()),
                    error: "canceled by the user".into(),
                })),
            }),
        ))
        .await;
    let transcript = parent.finish().await;
    assert!(transcript.is_success(), "{:?}", transcript.end);
    assert_eq!(transcript.text(), "Stopped it.");
}

/// Issue 29 (3): an action that can only open a run (here a resume) sent on a run already going
/// is refused without ending the turn.
#[tokio::test]
async fn an_action_that_cannot_apply_mid_turn_is_refused_and_the_turn_goes_on() {
    let provider = FakeProvider::start().await;
    provider.push(Reply::sse(tool_call_events(
        None,
        &[("call_r", "Task", AUDIT_TASK)],
        (10, 1, 0),
    )));
    provider.push(Reply::sse(text_events(&["Done."], (20, 2, 0))));
    let server = TestServer::start(&provider.base_url()).await;
    let cursor = FakeCursor::new(server.addr);
    let mut parent = Session::start(
        &cursor,
        "req-live-resume",
        &run_request_with_env("conv-live-resume", "audit"),
    )
    .await;
    let exec = parent.next_exec().await;
    parent
        .send(&live_action(conversation_action::Action::ResumeAction(
            pb::ResumeAction::default(),
        )))
        .await;
    parent
        .send(&exec_result(
            exec.id,
            subagent_success("a9", "All fine.", false),
        ))
        .await;
    let transcript = parent.finish().await;
    assert!(transcript.is_success(), "{:?}", transcript.end);
    assert_eq!(transcript.text(), "Done.");
}
