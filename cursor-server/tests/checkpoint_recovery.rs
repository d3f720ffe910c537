//! Checkpoints and durable history: the ACK barrier, the success tail, the blob graph the client
//! ends up holding, and continuing a conversation after a server restart.

#[path = "support/fake_cursor.rs"]
mod fake_cursor;
#[path = "support/fake_provider.rs"]
mod fake_provider;
#[path = "support/fixtures.rs"]
mod fixtures;

use cursor_server::cursor::proto::agent::{
    self as pb, ConversationStateStructure, ConversationStep, ConversationTurnStructure,
    agent_server_message, conversation_step, conversation_turn_structure,
};
use cursor_server::model::conversation::BlobId;
use cursor_server::model::message::{
    AssistantMessage, CanonicalMessage, ToolCallRecord, ToolResultRecord,
};
use cursor_server::model::tool::{ToolCall, ToolResult};
use cursor_server::store::Store;
use cursor_server::store::{conversations, messages};
use cursor_server::sync::checkpoint::ConversationGraph;
use cursor_server::sync::projection::{self, Base};
use fake_cursor::{FakeCursor, Session};
use fake_provider::{
    FakeProvider, Reply, text_events, thinking_then_text_events, tool_call_events,
};
use fixtures::{TestServer, exec_result, read_success, run_request_with_env};
use prost::Message as _;

fn blob<'a>(session: &'a Session<'_>, id: &[u8]) -> &'a [u8] {
    session.blobs.get(id).unwrap_or_else(|| {
        panic!(
            "the client was never asked to store blob {}",
            hex::encode(id)
        )
    })
}

#[tokio::test]
async fn a_text_turns_final_checkpoint_names_its_whole_blob_graph_and_conversation_state() {
    let provider = FakeProvider::start().await;
    provider.push(Reply::sse(thinking_then_text_events(
        &["hmm"],
        &["Hi!"],
        (10, 2, 0),
    )));
    let server = TestServer::start(&provider.base_url()).await;
    let cursor = FakeCursor::new(server.addr);

    let mut session = Session::start(
        &cursor,
        "req-tail",
        &run_request_with_env("conv-tail", "hello"),
    )
    .await;
    while session.next().await.is_some() {}

    assert!(session.transcript.is_success());
    let checkpoints = session.transcript.checkpoints();
    assert_eq!(checkpoints.len(), 3, "transitional, final, final again");
    let (transitional, state) = (checkpoints[0], checkpoints[1]);
    assert_eq!(checkpoints[1], checkpoints[2]);
    // The transitional checkpoint has the whole history; the final one adds the turn's timing.
    assert_eq!(
        transitional.root_prompt_messages_json,
        state.root_prompt_messages_json
    );
    assert_eq!(transitional.turns, state.turns);
    assert!(transitional.turn_timings.is_empty());
    assert_eq!(state.turn_timings.len(), 1);
    assert!(state.turn_timings[0].timestamp_ms > 0);
    // Conversation state: the mode the turn ran in, and the last call's context use (10 + 2)
    // against the model's window.
    assert_eq!(state.mode, Some(pb::AgentMode::Agent as i32));
    let tokens = state.token_details.as_ref().expect("token details");
    assert_eq!(tokens.used_tokens, 12);
    assert!(tokens.max_tokens > 0);
    assert!(state.pending_tool_calls.is_empty() && state.todos.is_empty());

    // Every blob the client was asked to keep is content-addressed.
    for (id, data) in &session.blobs {
        assert_eq!(BlobId::of(data).0.to_vec(), *id);
    }
    // Roots: system, user, assistant — all stored on the client.
    let roots: Vec<serde_json::Value> = state
        .root_prompt_messages_json
        .iter()
        .map(|id| serde_json::from_slice(blob(&session, id)).expect("JSON root"))
        .collect();
    // Roots: system, the injected workspace context, user, assistant.
    assert_eq!(roots.len(), 4);
    assert_eq!(roots[0]["role"], "system");
    assert!(
        roots[1]["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("Workspace: /home/user/demo")
    );
    assert_eq!(
        roots[2],
        serde_json::json!({"role":"user","content":[{"type":"text","text":"hello"}]})
    );
    assert_eq!(
        roots[3]["content"][0],
        serde_json::json!({"type":"reasoning","text":"hmm"})
    );
    assert_eq!(
        roots[3]["content"][1],
        serde_json::json!({"type":"text","text":"Hi!"})
    );
    // One turn: the user message, a thinking step, the assistant step.
    assert_eq!(state.turns.len(), 1);
    let turn = ConversationTurnStructure::decode(blob(&session, &state.turns[0])).expect("turn");
    let Some(conversation_turn_structure::Turn::AgentConversationTurn(turn)) = turn.turn else {
        panic!("agent turn");
    };
    assert_eq!(turn.request_id.as_deref(), Some("req-tail"));
    let user = pb::UserMessage::decode(blob(&session, &turn.user_message)).expect("user message");
    assert_eq!(user.text, "hello");
    let steps: Vec<conversation_step::Message> = turn
        .steps
        .iter()
        .map(|id| {
            ConversationStep::decode(blob(&session, id))
                .expect("step")
                .message
                .expect("step kind")
        })
        .collect();
    assert!(
        matches!(&steps[0], conversation_step::Message::ThinkingMessage(t) if t.text == "hmm" && t.duration_ms >= 1)
    );
    assert!(
        matches!(&steps[1], conversation_step::Message::AssistantMessage(a) if a.text == "Hi!")
    );
}

#[tokio::test]
async fn no_checkpoint_is_published_until_every_blob_it_references_is_acknowledged() {
    let provider = FakeProvider::start().await;
    provider.push(Reply::sse(tool_call_events(
        None,
        &[("call_1", "Read", r#"{"path":"a"}"#)],
        (10, 2, 0),
    )));
    provider.push(Reply::sse(text_events(&["done"], (12, 1, 0))));
    let db = tempfile::tempdir().expect("tempdir");
    let server =
        TestServer::start_in(&provider.base_url(), db, "checkpoint_ack_timeout_ms = 5000").await;
    let cursor = FakeCursor::new(server.addr);

    let mut session = Session::start(
        &cursor,
        "req-barrier",
        &run_request_with_env("conv-barrier", "read a"),
    )
    .await;
    session.withhold_acks = true;
    let exec = session.next_exec().await;
    session
        .send(&exec_result(exec.id, read_success("", "ay")))
        .await;
    // Read on to turn_ended: the tool checkpoint and the final one are built, but none may go out.
    while let Some(message) = session.next().await {
        if fake_cursor::kind(&message) == "turn_ended" {
            break;
        }
    }
    assert!(
        session.transcript.checkpoints().is_empty(),
        "published before the ACKs"
    );
    assert!(!session.withheld.is_empty());
    session.release_acks().await;
    while session.next().await.is_some() {}

    assert!(
        session.transcript.is_success(),
        "{:?}",
        session.transcript.end
    );
    let checkpoints = session.transcript.checkpoints();
    assert_eq!(
        checkpoints.len(),
        4,
        "the oldest waiting state (the tool's) and the newest (transitional, final) are published in order, then the final is repeated"
    );
    assert_eq!(
        checkpoints[0].root_prompt_messages_json.len(),
        5,
        "the tool's checkpoint comes first: system, context, user, tool-call, tool-result"
    );
    let state = checkpoints[1];
    assert!(state.pending_tool_calls.is_empty());
    for id in state.root_prompt_messages_json.iter().chain(&state.turns) {
        assert!(
            session.blobs.contains_key(id),
            "a published checkpoint references only stored blobs"
        );
    }
    // system, context, user, tool-call, tool-result, assistant(text)
    assert_eq!(
        state.root_prompt_messages_json.len(),
        6,
        "the first assistant had no text: no root"
    );
}

#[tokio::test]
async fn a_checkpoint_follows_each_completed_tool_naming_the_calls_still_running() {
    let provider = FakeProvider::start().await;
    provider.push(Reply::sse(tool_call_events(
        None,
        &[
            ("call_a", "Read", r#"{"path":"a"}"#),
            ("call_b", "Read", r#"{"path":"b"}"#),
        ],
        (10, 2, 0),
    )));
    provider.push(Reply::sse(text_events(&["both read"], (12, 1, 0))));
    let server = TestServer::start(&provider.base_url()).await;
    let cursor = FakeCursor::new(server.addr);

    let mut session = Session::start(
        &cursor,
        "req-per-tool",
        &run_request_with_env("conv-per-tool", "read"),
    )
    .await;
    let a = session.next_exec().await;
    let b = session.next_exec().await;
    session
        .send(&exec_result(a.id, read_success("", "ay")))
        .await;
    // Wait for the checkpoint of the first completion before answering the second.
    let first = loop {
        let message = session.next().await.expect("stream open");
        if let Some(agent_server_message::Message::ConversationCheckpointUpdate(state)) =
            message.message
        {
            break state;
        }
    };
    assert_eq!(first.pending_tool_calls.len(), 1, "call b is still running");
    let pending: serde_json::Value =
        serde_json::from_str(&first.pending_tool_calls[0]).expect("an AI SDK tool-call part");
    assert_eq!(
        (&pending["type"], &pending["toolName"], &pending["args"]),
        (
            &serde_json::json!("tool-call"),
            &serde_json::json!("Read"),
            &serde_json::json!({"path": "b"})
        )
    );
    session
        .send(&exec_result(b.id, read_success("", "bee")))
        .await;
    while session.next().await.is_some() {}

    assert!(session.transcript.is_success());
    let checkpoints = session.transcript.checkpoints();
    assert!(
        checkpoints.len() >= 3,
        "one per tool, then the final state twice"
    );
    assert!(checkpoints[1].pending_tool_calls.is_empty());
    let turn =
        ConversationTurnStructure::decode(blob(&session, &checkpoints.last().unwrap().turns[0]))
            .unwrap();
    let Some(conversation_turn_structure::Turn::AgentConversationTurn(turn)) = turn.turn else {
        panic!()
    };
    let tool_steps = turn
        .steps
        .iter()
        .filter(|id| {
            matches!(
                ConversationStep::decode(blob(&session, id))
                    .unwrap()
                    .message,
                Some(conversation_step::Message::ToolCall(_))
            )
        })
        .count();
    assert_eq!(
        tool_steps, 2,
        "each tool call is a step carrying its typed result"
    );
}

/// A conversation the store had no message of when the server started, and no run of it wrote,
/// is opened without reading the store. Should another process on the same database have written
/// it meanwhile, the run's opening commit finds its messages and the turn is made on the whole
/// history: every message once, in order, and only that call's answer reaches the client.
#[tokio::test]
async fn a_conversation_another_process_wrote_is_read_before_its_turn_is_made() {
    let provider = FakeProvider::start().await;
    // The call made on the empty history may reach the provider before it is dropped.
    for _ in 0..2 {
        provider.push(Reply::sse(text_events(&["Answer."], (10, 2, 0))));
    }
    let server = TestServer::start(&provider.base_url()).await;
    server.until_conversations_known().await;
    let elsewhere = fixtures::open_store(&server.db_dir.path().join("test.db")).await;
    let written = CanonicalMessage::User(cursor_server::model::message::UserMessage {
        images: Vec::new(),
        shown_as: None,
        state_before: None,
        origin: cursor_server::model::message::Origin::User,
        text: "written elsewhere".to_owned(),
        client_message_id: String::new(),
        mode: None,
        runtime: None,
    });
    messages::append_with_tags(
        &elsewhere,
        "conv-elsewhere",
        "req-other",
        &[],
        &[written],
        &[],
    )
    .await
    .expect("another process writes the conversation");

    let cursor = FakeCursor::new(server.addr);
    let session = Session::start(
        &cursor,
        "req-here",
        &run_request_with_env("conv-elsewhere", "written here"),
    )
    .await;
    let transcript = session.finish().await;
    assert!(transcript.is_success(), "{:?}", transcript.end);
    assert_eq!(transcript.text(), "Answer.");
    let requests = provider.requests();
    assert!(
        (1..=2).contains(&requests.len()),
        "{} calls",
        requests.len()
    );
    let sent = requests.last().unwrap()["messages"].to_string();
    let (first, second) = (
        sent.find("written elsewhere")
            .expect("the stored message is sent"),
        sent.find("written here").expect("the new message is sent"),
    );
    assert!(first < second, "in order: {sent}");
    assert_eq!(sent.matches("written here").count(), 1, "once: {sent}");
    let stored = messages::load(&elsewhere, "conv-elsewhere").await.unwrap();
    let users: Vec<&str> = stored
        .iter()
        .filter_map(|message| match message {
            CanonicalMessage::User(user) if user.runtime.is_none() => Some(user.text.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(users, ["written elsewhere", "written here"]);
    server.stop().await;
}

#[tokio::test]
async fn after_a_restart_the_second_turn_continues_from_the_servers_own_history() {
    let provider = FakeProvider::start().await;
    provider.push(Reply::sse(text_events(&["First answer."], (10, 2, 0))));
    provider.push(Reply::sse(text_events(&["Second answer."], (20, 2, 0))));
    let first_server = TestServer::start(&provider.base_url()).await;
    let cursor = FakeCursor::new(first_server.addr);
    let first = Session::start(
        &cursor,
        "req-r1",
        &run_request_with_env("conv-restart", "one"),
    )
    .await;
    let first = first.finish().await;
    assert!(first.is_success());
    let head_after_first = (*first.checkpoints().last().expect("checkpoint")).clone();

    // A new app instance on the same database.
    let db = first_server.stop().await;
    let db_path = db.path().join("test.db");
    let second_server = TestServer::start_in(&provider.base_url(), db, "").await;
    let cursor = FakeCursor::new(second_server.addr);
    let mut second = Session::start(
        &cursor,
        "req-r2",
        &run_request_with_env("conv-restart", "two"),
    )
    .await;
    while second.next().await.is_some() {}
    assert!(second.transcript.is_success());

    let requests = provider.requests();
    let first_messages = requests[0]["messages"].as_array().unwrap();
    let second_messages = requests[1]["messages"].as_array().unwrap();
    assert_eq!(
        &second_messages[..first_messages.len()],
        first_messages.as_slice()
    );
    assert_eq!(
        &second_messages[first_messages.len()..],
        &[
            serde_json::json!({"role":"assistant","content":"First answer."}),
            serde_json::json!({"role":"user","content":"two"}),
        ]
    );
    // The blob graph continues too: the new state extends the old roots and turns.
    let state: &ConversationStateStructure =
        second.transcript.checkpoints().last().expect("checkpoint");
    assert_eq!(
        &state.root_prompt_messages_json[..head_after_first.root_prompt_messages_json.len()],
        head_after_first.root_prompt_messages_json.as_slice()
    );
    assert_eq!(state.turns.len(), 2);
    assert_eq!(state.turns[0], head_after_first.turns[0]);
    // Blobs the client already acknowledged in this conversation are not sent again.
    let resent = second
        .blobs
        .keys()
        .filter(|id| head_after_first.root_prompt_messages_json.contains(id))
        .count();
    assert_eq!(resent, 0, "acknowledged roots are never sent twice");

    let _db = second_server.stop().await;
    let store = Store::open(&fixtures::database_url(&db_path))
        .await
        .unwrap();
    let (head, revision) = conversations::head(&store, "conv-restart")
        .await
        .unwrap()
        .expect("head");
    assert!(revision >= 2);
    let stored = cursor_server::store::blobs::get(&store, head)
        .await
        .unwrap()
        .expect("head blob stored");
    assert_eq!(
        ConversationStateStructure::decode(stored.as_slice()).unwrap(),
        *state
    );
    // Late events of an older run cannot move a newer head.
    assert!(
        !cursor_server::store::blobs::acknowledge_and_publish(
            &store,
            ("conv-restart", "req-older"),
            &[],
            BlobId::of(b"old"),
            1
        )
        .await
        .unwrap()
    );
    assert_eq!(
        conversations::head(&store, "conv-restart")
            .await
            .unwrap()
            .unwrap()
            .0,
        head
    );
}

#[tokio::test]
async fn a_blob_whose_ack_is_overdue_is_sent_again_under_a_new_kv_id() {
    let provider = FakeProvider::start().await;
    provider.push(Reply::sse(text_events(&["ok"], (3, 1, 0))));
    let db = tempfile::tempdir().expect("tempdir");
    let server = TestServer::start_in(
        &provider.base_url(),
        db,
        "kv_retry_after_ms = 100\ncheckpoint_ack_timeout_ms = 5000",
    )
    .await;
    let cursor = FakeCursor::new(server.addr);

    let mut session = Session::start(
        &cursor,
        "req-resend",
        &run_request_with_env("conv-resend", "hi"),
    )
    .await;
    session.withhold_acks = true;
    // Wait until some blob has been asked for twice.
    let resent = loop {
        assert!(
            session.next().await.is_some(),
            "stream ended before any resend"
        );
        let mut seen = std::collections::HashMap::new();
        let twice = session.withheld.iter().find_map(|(id, kv_id)| {
            seen.insert(id.clone(), *kv_id)
                .filter(|first| first != kv_id)
                .map(|_| id.clone())
        });
        if let Some(id) = twice {
            break id;
        }
    };
    let kv_ids: Vec<u32> = session
        .withheld
        .iter()
        .filter(|(id, _)| *id == resent)
        .map(|(_, k)| *k)
        .collect();
    assert!(
        kv_ids.len() >= 2 && kv_ids.windows(2).all(|w| w[0] < w[1]),
        "{kv_ids:?}"
    );
    assert!(session.transcript.checkpoints().is_empty());
    // Acknowledging every attempt (the stale ones are late and ignored) releases the checkpoint.
    session.release_acks().await;
    while session.next().await.is_some() {}
    assert!(
        session.transcript.is_success(),
        "{:?}",
        session.transcript.end
    );
    assert_eq!(session.transcript.checkpoints().len(), 3);
}

#[tokio::test]
async fn a_provider_failure_publishes_the_committed_state_then_the_error() {
    let provider = FakeProvider::start().await;
    for _ in 0..3 {
        provider.push(Reply::Status {
            status: 503,
            body: r#"{"error":{"message":"try later"}}"#.to_owned(),
        });
    }
    let server = TestServer::start(&provider.base_url()).await;
    let cursor = FakeCursor::new(server.addr);

    let mut session = Session::start(
        &cursor,
        "req-fail-cp",
        &run_request_with_env("conv-fail-cp", "hello"),
    )
    .await;
    while session.next().await.is_some() {}

    assert_eq!(session.transcript.error_code(), Some("unavailable"));
    let kinds = session.transcript.all_kinds();
    assert_eq!(kinds.last(), Some(&"checkpoint"), "{kinds:?}");
    assert!(!kinds.contains(&"turn_ended"));
    let state = session.transcript.checkpoints()[0];
    assert_eq!(
        state.root_prompt_messages_json.len(),
        3,
        "system, the injected context and the user's message"
    );
    let root: serde_json::Value =
        serde_json::from_slice(blob(&session, &state.root_prompt_messages_json[2])).unwrap();
    assert_eq!(root["content"][0]["text"], "hello");
    assert!(
        !root.to_string().contains("try later"),
        "errors never become history"
    );
}

#[tokio::test]
async fn a_run_killed_after_two_of_three_tools_resumes_without_running_them_again() {
    let provider = FakeProvider::start().await;
    provider.push(Reply::sse(tool_call_events(
        None,
        &[
            ("call_1", "Read", r#"{"path":"one.txt"}"#),
            ("call_2", "Read", r#"{"path":"two.txt"}"#),
            ("call_3", "Read", r#"{"path":"three.txt"}"#),
        ],
        (10, 3, 0),
    )));
    provider.push(Reply::sse(text_events(&["All three read."], (20, 2, 0))));
    let first_server = TestServer::start(&provider.base_url()).await;
    let cursor = FakeCursor::new(first_server.addr);
    let mut session = Session::start(
        &cursor,
        "req-kill",
        &run_request_with_env("conv-kill", "read three"),
    )
    .await;
    let execs = [
        session.next_exec().await,
        session.next_exec().await,
        session.next_exec().await,
    ];
    session
        .send(&exec_result(execs[0].id, read_success("", "one")))
        .await;
    session
        .send(&exec_result(execs[1].id, read_success("", "two")))
        .await;
    // Both results are committed: wait for the checkpoint that names only call 3 as running.
    loop {
        let message = tokio::time::timeout(std::time::Duration::from_secs(5), session.next())
            .await
            .unwrap_or_else(|_| panic!("no checkpoint; got {:?}", session.transcript.all_kinds()))
            .expect("stream open");
        if let Some(agent_server_message::Message::ConversationCheckpointUpdate(state)) =
            &message.message
            && state.pending_tool_calls.len() == 1
        {
            break;
        }
    }
    // The server dies with tool 3 still running.
    let db = tokio::time::timeout(std::time::Duration::from_secs(10), first_server.stop())
        .await
        .expect("the server stops");
    assert!(
        session.finish().await.error_code().is_some(),
        "the killed run does not succeed"
    );

    let second_server = TestServer::start_in(&provider.base_url(), db, "").await;
    let cursor = FakeCursor::new(second_server.addr);
    let mut resumed = Session::start(
        &cursor,
        "req-resume",
        &fixtures::resume_request("conv-kill"),
    )
    .await;
    let exec = resumed.next_exec().await;
    let Some(pb::exec_server_message::Message::ReadArgs(read)) = &exec.message else {
        panic!("expected the third read, got {exec:?}");
    };
    assert_eq!(
        read.path, "three.txt",
        "only the unfinished call runs again"
    );
    assert_eq!(
        provider.requests().len(),
        1,
        "the model is not asked again before the batch completes"
    );
    resumed
        .send(&exec_result(exec.id, read_success("", "three")))
        .await;
    while resumed.next().await.is_some() {}

    assert!(
        resumed.transcript.is_success(),
        "{:?}",
        resumed.transcript.end
    );
    assert_eq!(resumed.transcript.text(), "All three read.");
    assert_eq!(
        resumed
            .transcript
            .kinds()
            .iter()
            .filter(|k| **k == "exec")
            .count(),
        1,
        "exactly one exec in the resumed run"
    );
    let requests = provider.requests();
    assert_eq!(requests.len(), 2);
    let results: Vec<(&str, &str)> = requests[1]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| {
            (
                m["tool_call_id"].as_str().unwrap(),
                m["content"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        results.iter().map(|r| r.0).collect::<Vec<_>>(),
        ["call_1", "call_2", "call_3"]
    );
    assert!(results[2].1.contains("three"));
    // The resumed checkpoint continues the interrupted turn rather than starting a new one.
    let state = resumed
        .transcript
        .checkpoints()
        .last()
        .copied()
        .expect("checkpoint")
        .clone();
    assert_eq!(state.turns.len(), 1);
}

#[tokio::test]
async fn a_conversation_only_the_client_knows_is_imported_from_its_blobs() {
    let provider = FakeProvider::start().await;
    provider.push(Reply::sse(text_events(&["Continuing."], (30, 2, 0))));
    let server = TestServer::start(&provider.base_url()).await;
    let cursor = FakeCursor::new(server.addr);

    // The client's copy: roots in AI SDK JSON, stored under their SHA-256.
    let roots = [
        serde_json::json!({"role":"system","content":"Follow the client rules."}),
        serde_json::json!({"role":"user","content":[{"type":"text","text":"What is in a.txt?"}]}),
        serde_json::json!({"role":"assistant","content":[{"type":"text","text":"Let me look."},{"type":"tool-call","toolCallId":"t1","toolName":"Read","args":{"path":"a.txt"}}]}),
        serde_json::json!({"role":"tool","content":[{"type":"tool-result","toolCallId":"t1","toolName":"Read","result":"     1|ay"}]}),
        serde_json::json!({"role":"assistant","content":[{"type":"text","text":"It says ay."}]}),
    ];
    let mut blobs = std::collections::HashMap::new();
    let mut ids = Vec::new();
    for root in &roots {
        let data = root.to_string().into_bytes();
        let id = BlobId::of(&data).0.to_vec();
        blobs.insert(id.clone(), data);
        ids.push(id);
    }
    // One listed root the client no longer has: treated as missing, not as empty content.
    ids.push(BlobId::of(b"gone").0.to_vec());
    let mut request = run_request_with_env("conv-import", "And b.txt?");
    if let Some(pb::agent_client_message::Message::RunRequest(run)) = &mut request.message {
        run.conversation_state = Some(ConversationStateStructure {
            root_prompt_messages_json: ids.clone(),
            ..ConversationStateStructure::default()
        });
    }
    let mut session = Session::start_with_blobs(&cursor, "req-import", &request, blobs).await;
    while session.next().await.is_some() {}

    assert!(
        session.transcript.is_success(),
        "{:?}",
        session.transcript.end
    );
    let messages = provider.requests()[0]["messages"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(messages[0]["role"], "system");
    assert!(
        messages[1]["content"]
            .as_str()
            .unwrap()
            .contains("Follow the client rules.")
    );
    assert_eq!(
        messages[2],
        serde_json::json!({"role":"user","content":"What is in a.txt?"})
    );
    assert_eq!(messages[3]["content"], "Let me look.");
    assert_eq!(messages[3]["tool_calls"][0]["id"], "t1");
    assert_eq!(
        messages[3]["tool_calls"][0]["function"]["arguments"],
        r#"{"path":"a.txt"}"#
    );
    assert_eq!(
        messages[4],
        serde_json::json!({"role":"tool","tool_call_id":"t1","content":"     1|ay"})
    );
    assert_eq!(messages[5]["content"], "It says ay.");
    // The workspace context is new to this server: injected before the new message.
    assert!(
        messages[6]["content"]
            .as_str()
            .unwrap()
            .starts_with("<user_info>")
    );
    assert_eq!(
        messages[7],
        serde_json::json!({"role":"user","content":"And b.txt?"})
    );
    assert_eq!(messages.len(), 8);
    // The client's roots are not sent back to it; the new state extends them.
    let state = session.transcript.checkpoints()[0];
    let present = &ids[..ids.len() - 1];
    assert_eq!(
        &state.root_prompt_messages_json[..present.len()],
        present,
        "the missing root is not named"
    );
    assert!(
        !state
            .root_prompt_messages_json
            .contains(&ids[ids.len() - 1])
    );
    let gets = session
        .transcript
        .messages
        .iter()
        .filter(|m| {
            matches!(&m.message, Some(agent_server_message::Message::KvServerMessage(kv))
                if matches!(kv.message, Some(pb::kv_server_message::Message::GetBlobArgs(_))))
        })
        .count();
    assert_eq!(gets, ids.len(), "one hash-checked read per listed root");
}

/// `request` (a user message) carrying `state` as the client's conversation state.
fn with_client_state(
    mut request: pb::AgentClientMessage,
    state: &ConversationStateStructure,
) -> pb::AgentClientMessage {
    if let Some(pb::agent_client_message::Message::RunRequest(run)) = &mut request.message {
        run.conversation_state = Some(state.clone());
    }
    request
}

#[tokio::test]
async fn a_conversation_this_server_made_imported_by_a_server_without_it_keeps_one_system_prompt() {
    let provider = FakeProvider::start().await;
    provider.push(Reply::sse(text_events(&["First answer."], (10, 2, 0))));
    provider.push(Reply::sse(text_events(&["Second answer."], (20, 2, 0))));
    let first_server = TestServer::start(&provider.base_url()).await;
    let cursor = FakeCursor::new(first_server.addr);
    let mut first = Session::start(
        &cursor,
        "req-made-1",
        &run_request_with_env("conv-made", "one"),
    )
    .await;
    while first.next().await.is_some() {}
    assert!(first.transcript.is_success(), "{:?}", first.transcript.end);
    let state = (*first.transcript.checkpoints().last().expect("checkpoint")).clone();

    // Another node (or a lost database): the client's checkpoint and blobs are all it has.
    let other_server = TestServer::start(&provider.base_url()).await;
    let cursor = FakeCursor::new(other_server.addr);
    let request = with_client_state(run_request_with_env("conv-made", "two"), &state);
    let mut second =
        Session::start_with_blobs(&cursor, "req-made-2", &request, first.blobs.clone()).await;
    while second.next().await.is_some() {}
    assert!(
        second.transcript.is_success(),
        "{:?}",
        second.transcript.end
    );

    let requests = provider.requests();
    let first_messages = requests[0]["messages"].as_array().unwrap();
    let second_messages = requests[1]["messages"].as_array().unwrap();
    let system = first_messages[0]["content"].as_str().unwrap();
    let copies = second_messages
        .iter()
        .filter(|m| {
            m["content"]
                .as_str()
                .is_some_and(|c| c.contains(&system[..200]))
        })
        .count();
    assert_eq!(copies, 1, "the system prompt once: {second_messages:?}");
    // The imported conversation reads as the original did: the provider's cache still applies.
    assert_eq!(
        &second_messages[..first_messages.len()],
        first_messages.as_slice()
    );
    assert_eq!(
        &second_messages[first_messages.len()..],
        &[
            serde_json::json!({"role":"assistant","content":"First answer."}),
            serde_json::json!({"role":"user","content":"two"}),
        ]
    );
}

#[tokio::test]
async fn a_system_root_this_server_wrote_before_marking_its_roots_is_recognized_by_its_text() {
    let provider = FakeProvider::start().await;
    provider.push(Reply::sse(text_events(&["Again."], (10, 2, 0))));
    let server = TestServer::start(&provider.base_url()).await;
    let cursor = FakeCursor::new(server.addr);
    // An unmarked root holding another mode's prompt, as an earlier version wrote it.
    let assets = cursor_server::prompting::assets::PromptAssets::embedded().unwrap();
    let plan = &assets
        .mode(cursor_server::model::conversation::Mode::Plan)
        .system;
    let roots = [
        serde_json::json!({"role": "system", "content": plan}),
        serde_json::json!({"role": "user", "content": [{"type": "text", "text": "hi"}]}),
        serde_json::json!({"role": "assistant", "content": [{"type": "text", "text": "Hello."}]}),
    ];
    let blobs: std::collections::HashMap<Vec<u8>, Vec<u8>> = roots
        .iter()
        .map(|root| {
            let data = root.to_string().into_bytes();
            (BlobId::of(&data).0.to_vec(), data)
        })
        .collect();
    let state = ConversationStateStructure {
        root_prompt_messages_json: roots
            .iter()
            .map(|root| BlobId::of(root.to_string().as_bytes()).0.to_vec())
            .collect(),
        ..ConversationStateStructure::default()
    };
    let request = with_client_state(run_request_with_env("conv-unmarked", "again"), &state);
    let mut session = Session::start_with_blobs(&cursor, "req-unmarked", &request, blobs).await;
    while session.next().await.is_some() {}
    assert!(
        session.transcript.is_success(),
        "{:?}",
        session.transcript.end
    );

    let messages = provider.requests()[0]["messages"]
        .as_array()
        .unwrap()
        .clone();
    let plan_own = &plan[plan.len() - 200..];
    assert!(
        messages
            .iter()
            .all(|m| !m["content"].as_str().is_some_and(|c| c.contains(plan_own))),
        "{messages:?}"
    );
    assert_eq!(
        messages[1],
        serde_json::json!({"role":"user","content":"hi"})
    );
    assert_eq!(messages[2]["content"], "Hello.");
    assert_eq!(
        messages.len(),
        5,
        "system, the two imported, context, message"
    );
}

#[tokio::test]
async fn a_get_result_whose_hash_does_not_match_is_rejected() {
    let provider = FakeProvider::start().await;
    let server = TestServer::start(&provider.base_url()).await;
    let cursor = FakeCursor::new(server.addr);
    let claimed = BlobId::of(br#"{"role":"user","content":"real"}"#)
        .0
        .to_vec();
    let mut blobs = std::collections::HashMap::new();
    blobs.insert(
        claimed.clone(),
        br#"{"role":"user","content":"forged"}"#.to_vec(),
    );
    let mut request = run_request_with_env("conv-forged", "hi");
    if let Some(pb::agent_client_message::Message::RunRequest(run)) = &mut request.message {
        run.conversation_state = Some(ConversationStateStructure {
            root_prompt_messages_json: vec![claimed],
            ..ConversationStateStructure::default()
        });
    }
    let mut session = Session::start_with_blobs(&cursor, "req-forged", &request, blobs).await;
    while session.next().await.is_some() {}

    assert_eq!(session.transcript.error_code(), Some("invalid_argument"));
    let message = session.transcript.error_message().unwrap();
    assert!(message.contains("does not match its data"), "{message}");
    assert!(
        provider.requests().is_empty(),
        "nothing forged reaches the model"
    );
}

#[tokio::test]
async fn blobs_an_earlier_run_left_unacknowledged_are_sent_again_and_its_turn_is_kept() {
    let provider = FakeProvider::start().await;
    provider.push(Reply::sse(text_events(&["First."], (10, 2, 0))));
    provider.push(Reply::sse(text_events(&["Second."], (20, 2, 0))));
    let server = TestServer::start(&provider.base_url()).await;
    let cursor = FakeCursor::new(server.addr);

    // The first run's client never acknowledges anything: the run ends, nothing is published.
    let mut first = Session::start(
        &cursor,
        "req-owed-1",
        &run_request_with_env("conv-owed", "one"),
    )
    .await;
    first.withhold_acks = true;
    while first.next().await.is_some() {}
    assert!(first.transcript.is_success());
    assert!(first.transcript.checkpoints().is_empty());
    let owed: Vec<Vec<u8>> = first.withheld.iter().map(|(id, _)| id.clone()).collect();
    assert!(!owed.is_empty());

    let mut second = Session::start(
        &cursor,
        "req-owed-2",
        &run_request_with_env("conv-owed", "two"),
    )
    .await;
    while second.next().await.is_some() {}
    assert!(second.transcript.is_success());
    let state = *second.transcript.checkpoints().last().expect("published");
    // The first turn is part of the published state, and everything it names is stored now.
    assert_eq!(state.turns.len(), 2);
    let roots: Vec<serde_json::Value> = state
        .root_prompt_messages_json
        .iter()
        .map(|id| serde_json::from_slice(blob(&second, id)).expect("JSON root"))
        .collect();
    let texts: Vec<String> = roots.iter().map(|r| r["content"].to_string()).collect();
    assert_eq!(roots.len(), 6, "{texts:?}");
    assert!(
        texts[3].contains("First.") && texts[5].contains("Second."),
        "{texts:?}"
    );
    let first_turn = &state.turns[0];
    assert!(owed.contains(first_turn), "the first turn's blob was owed");
    assert!(second.blobs.contains_key(first_turn), "and is sent again");
    assert_eq!(state.turn_timings.len(), 2, "one timing per turn");
}

#[tokio::test]
async fn a_single_withheld_ack_holds_back_every_checkpoint_that_references_that_blob() {
    let provider = FakeProvider::start().await;
    provider.push(Reply::sse(tool_call_events(
        None,
        &[
            ("call_a", "Read", r#"{"path":"a"}"#),
            ("call_b", "Read", r#"{"path":"b"}"#),
        ],
        (10, 2, 0),
    )));
    provider.push(Reply::sse(text_events(&["both read"], (12, 1, 0))));
    let db = tempfile::tempdir().expect("tempdir");
    let server =
        TestServer::start_in(&provider.base_url(), db, "checkpoint_ack_timeout_ms = 5000").await;
    let cursor = FakeCursor::new(server.addr);

    let mut session = Session::start(
        &cursor,
        "req-one-ack",
        &run_request_with_env("conv-one-ack", "read both"),
    )
    .await;
    // Only the model-message root carrying a's result goes unacknowledged.
    session.withhold_matching = Some(|data: &[u8]| {
        let text = String::from_utf8_lossy(data);
        text.contains("tool-result") && text.contains("ay")
    });
    let a = session.next_exec().await;
    let b = session.next_exec().await;
    session
        .send(&exec_result(a.id, read_success("", "ay")))
        .await;
    session
        .send(&exec_result(b.id, read_success("", "bee")))
        .await;
    while let Some(message) = session.next().await {
        if fake_cursor::kind(&message) == "turn_ended" {
            break;
        }
    }
    assert_eq!(session.withheld.len(), 1, "exactly one ACK withheld");
    let withheld = session.withheld[0].0.clone();
    assert!(
        session
            .transcript
            .checkpoints()
            .iter()
            .all(|state| !state.root_prompt_messages_json.contains(&withheld)),
        "a checkpoint referenced the unacknowledged blob"
    );
    session.release_acks().await;
    while session.next().await.is_some() {}
    assert!(session.transcript.is_success());
    let last = session
        .transcript
        .checkpoints()
        .last()
        .copied()
        .expect("published");
    assert!(last.root_prompt_messages_json.contains(&withheld));
}

fn run_request_with_text_blob(conversation_id: &str, text_blob: &[u8]) -> pb::AgentClientMessage {
    let mut request = run_request_with_env(conversation_id, "");
    if let Some(pb::agent_client_message::Message::RunRequest(run)) = &mut request.message
        && let Some(pb::conversation_action::Action::UserMessageAction(action)) =
            run.action.as_mut().and_then(|a| a.action.as_mut())
    {
        action
            .user_message
            .as_mut()
            .expect("user message")
            .text_blob_id = Some(BlobId::of(text_blob).0.to_vec());
    }
    request
}

#[tokio::test]
async fn a_user_message_sent_as_a_blob_is_fetched_and_hash_checked_before_the_model_sees_it() {
    let provider = FakeProvider::start().await;
    provider.push(Reply::sse(text_events(&["Read it."], (30, 2, 0))));
    let server = TestServer::start(&provider.base_url()).await;
    let cursor = FakeCursor::new(server.addr);
    let long_text = "a very long pasted message ".repeat(200);
    let mut blobs = std::collections::HashMap::new();
    blobs.insert(
        BlobId::of(long_text.as_bytes()).0.to_vec(),
        long_text.clone().into_bytes(),
    );

    let request = run_request_with_text_blob("conv-text-blob", long_text.as_bytes());
    let mut session = Session::start_with_blobs(&cursor, "req-text-blob", &request, blobs).await;
    while session.next().await.is_some() {}
    assert!(
        session.transcript.is_success(),
        "{:?}",
        session.transcript.end
    );
    let messages = provider.requests()[0]["messages"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(
        messages.last().unwrap(),
        &serde_json::json!({"role": "user", "content": long_text})
    );
    // The user-message root the client keeps has the text too.
    let state = session.transcript.checkpoints()[0];
    let user_root: serde_json::Value =
        serde_json::from_slice(blob(&session, &state.root_prompt_messages_json[2])).unwrap();
    assert_eq!(user_root["content"][0]["text"], long_text.as_str());

    // A client that does not have the blob: a clear protocol error, and no model call.
    let mut missing = Session::start(
        &cursor,
        "req-text-blob-missing",
        &run_request_with_text_blob("conv-text-blob-2", b"never stored"),
    )
    .await;
    while missing.next().await.is_some() {}
    assert_eq!(missing.transcript.error_code(), Some("invalid_argument"));
    let message = missing.transcript.error_message().unwrap();
    assert!(message.contains("text blob"), "{message}");
    assert_eq!(provider.requests().len(), 1);
}

#[tokio::test]
async fn runs_a_killed_process_left_running_are_ended_with_a_reason_when_the_server_starts() {
    let provider = FakeProvider::start().await;
    // The answer never finishes while the process lives: one part, then a long silence.
    let mut events = text_events(&["started "], (5, 2, 0));
    events.truncate(2);
    provider.push(Reply::Hang {
        events,
        sent: Default::default(),
    });
    provider.push(Reply::sse(text_events(&["fresh"], (5, 1, 0))));
    let db_dir = tempfile::tempdir().expect("tempdir");
    let (mut process, addr) = fixtures::spawn_process(&provider.base_url(), db_dir.path()).await;
    let cursor = FakeCursor::new(addr);
    let mut session = Session::start(
        &cursor,
        "req-killed",
        &fixtures::run_request("conv-killed", "count"),
    )
    .await;
    // The run is recorded and streaming when the process dies.
    read_until(&mut session, |update| {
        matches!(update, pb::interaction_update::Message::TextDelta(_))
    })
    .await;
    process.kill().await.expect("SIGKILL");
    drop(session);

    let server = TestServer::start_in(&provider.base_url(), db_dir, "").await;
    let store = Store::open(&fixtures::database_url(
        &server.db_dir.path().join("test.db"),
    ))
    .await
    .expect("store");
    let record = cursor_server::store::runs::get(&store, "req-killed")
        .await
        .expect("query")
        .expect("the killed run is recorded");
    assert_eq!(record.outcome.status.as_str(), "failed");
    let (code, message) = record.outcome.error.expect("a reason");
    assert_eq!(code, "aborted");
    assert!(message.contains("server stopped"), "{message}");

    // The conversation goes on on the new process.
    let cursor = FakeCursor::new(server.addr);
    let next = Session::start(
        &cursor,
        "req-after-kill",
        &fixtures::run_request("conv-killed", "again"),
    )
    .await
    .finish()
    .await;
    assert!(next.is_success(), "{:?}", next.end);
    assert_eq!(next.text(), "fresh");
}

#[tokio::test]
async fn when_acks_lag_a_parallel_batch_still_shows_a_checkpoint_with_calls_pending_before_the_last()
 {
    let provider = FakeProvider::start().await;
    provider.push(Reply::sse(tool_call_events(
        None,
        &[
            ("call_a", "Read", r#"{"path":"a"}"#),
            ("call_b", "Read", r#"{"path":"b"}"#),
            ("call_c", "Read", r#"{"path":"c"}"#),
        ],
        (10, 2, 0),
    )));
    provider.push(Reply::sse(text_events(&["all read"], (12, 1, 0))));
    let server = TestServer::start_in(
        &provider.base_url(),
        tempfile::tempdir().expect("tempdir"),
        "checkpoint_ack_timeout_ms = 30000",
    )
    .await;
    let cursor = FakeCursor::new(server.addr);
    let mut session = Session::start(
        &cursor,
        "req-lagging",
        &run_request_with_env("conv-lagging", "read three"),
    )
    .await;
    // The client stores blobs slowly: no ACK until all three tools have finished.
    session.withhold_acks = true;
    let execs = [
        session.next_exec().await,
        session.next_exec().await,
        session.next_exec().await,
    ];
    for (exec, text) in execs.iter().zip(["ay", "bee", "sea"]) {
        session
            .send(&exec_result(exec.id, read_success("", text)))
            .await;
    }
    let mut completed = 0;
    while completed < 3 {
        let message = session.next().await.expect("stream open");
        if fake_cursor::kind(&message) == "tool_call_completed" {
            completed += 1;
        }
    }
    session.release_acks().await;
    while session.next().await.is_some() {}

    assert!(
        session.transcript.is_success(),
        "{:?}",
        session.transcript.end
    );
    let pending: Vec<usize> = session
        .transcript
        .checkpoints()
        .iter()
        .map(|c| c.pending_tool_calls.len())
        .collect();
    let first_pending = pending
        .iter()
        .position(|n| *n > 0)
        .unwrap_or_else(|| panic!("no checkpoint named a pending call: {pending:?}"));
    assert!(
        pending[first_pending..].contains(&0),
        "then one with none pending: {pending:?}"
    );
    // Every checkpoint comes after the cards of the tools whose results it holds.
    let mut cards = 0;
    for message in &session.transcript.messages {
        if fake_cursor::kind(message) == "tool_call_completed" {
            cards += 1;
        }
        if let Some(agent_server_message::Message::ConversationCheckpointUpdate(state)) =
            &message.message
        {
            let results = state
                .root_prompt_messages_json
                .iter()
                .filter(|id| {
                    let root: serde_json::Value =
                        serde_json::from_slice(blob(&session, id)).expect("root JSON");
                    root["role"] == "tool"
                })
                .count();
            assert!(
                results <= cards,
                "a checkpoint holds {results} tool results after {cards} completed cards"
            );
        }
    }
}

#[tokio::test]
async fn pending_tool_calls_names_every_unfinished_call_of_the_batch_even_one_not_started_yet() {
    let provider = FakeProvider::start().await;
    provider.push(Reply::sse(tool_call_events(
        None,
        &[
            (
                "call_todo",
                "TodoWrite",
                r#"{"merge":false,"todos":[{"id":"1","content":"Read a","status":"in_progress"}]}"#,
            ),
            ("call_read", "Read", r#"{"path":"a"}"#),
        ],
        (10, 2, 0),
    )));
    provider.push(Reply::sse(text_events(&["read"], (12, 1, 0))));
    let server = TestServer::start(&provider.base_url()).await;
    let cursor = FakeCursor::new(server.addr);
    let mut session = Session::start(
        &cursor,
        "req-not-started",
        &run_request_with_env("conv-not-started", "plan then read"),
    )
    .await;
    // TodoWrite completes on the server before the Read is even started: its checkpoint must still
    // name the Read as pending.
    let mut read_exec = None;
    let first = loop {
        let message = session.next().await.expect("stream open");
        match message.message {
            Some(agent_server_message::Message::ConversationCheckpointUpdate(state)) => {
                break state;
            }
            Some(agent_server_message::Message::ExecServerMessage(exec)) => read_exec = Some(exec),
            _ => {}
        }
    };
    let pending: Vec<String> = first
        .pending_tool_calls
        .iter()
        .map(|part| {
            let part: serde_json::Value = serde_json::from_str(part).expect("a tool-call part");
            part["toolName"].as_str().expect("toolName").to_owned()
        })
        .collect();
    assert_eq!(pending, ["Read"]);
    let exec = match read_exec {
        Some(exec) => exec,
        None => session.next_exec().await,
    };
    session
        .send(&exec_result(exec.id, read_success("a", "ay")))
        .await;
    assert!(session.finish().await.is_success());
}

#[tokio::test]
async fn parallel_tools_enter_the_checkpoint_in_call_order_whatever_order_they_finish_in() {
    let provider = FakeProvider::start().await;
    provider.push(Reply::sse(tool_call_events(
        None,
        &[
            ("call_first", "Read", r#"{"path":"first"}"#),
            ("call_second", "Read", r#"{"path":"second"}"#),
        ],
        (10, 2, 0),
    )));
    provider.push(Reply::sse(text_events(&["both"], (12, 1, 0))));
    let server = TestServer::start(&provider.base_url()).await;
    let cursor = FakeCursor::new(server.addr);
    let mut session = Session::start(
        &cursor,
        "req-call-order",
        &run_request_with_env("conv-call-order", "read two"),
    )
    .await;
    let first = session.next_exec().await;
    let second = session.next_exec().await;
    // The second call finishes first.
    session
        .send(&exec_result(second.id, read_success("second", "two")))
        .await;
    session
        .send(&exec_result(first.id, read_success("first", "one")))
        .await;
    while session.next().await.is_some() {}
    assert!(
        session.transcript.is_success(),
        "{:?}",
        session.transcript.end
    );

    let last = *session.transcript.checkpoints().last().expect("checkpoint");
    let tool_roots: Vec<(String, String)> = last
        .root_prompt_messages_json
        .iter()
        .filter_map(|id| {
            let root: serde_json::Value = serde_json::from_slice(blob(&session, id)).unwrap();
            let part = &root["content"][0];
            matches!(part["type"].as_str(), Some("tool-call" | "tool-result")).then(|| {
                (
                    part["type"].as_str().unwrap().to_owned(),
                    part["toolCallId"].as_str().unwrap().to_owned(),
                )
            })
        })
        .collect();
    let ids: Vec<&str> = tool_roots.iter().map(|(_, id)| id.as_str()).collect();
    // Cursor-side call ids end with the call's position in the model's answer.
    assert_eq!(ids.len(), 4, "{tool_roots:?}");
    assert!(
        ids[0].ends_with("_0") && ids[1].ends_with("_0"),
        "{tool_roots:?}"
    );
    assert!(
        ids[2].ends_with("_1") && ids[3].ends_with("_1"),
        "{tool_roots:?}"
    );
    assert_eq!(
        tool_roots
            .iter()
            .map(|(kind, _)| kind.as_str())
            .collect::<Vec<_>>(),
        ["tool-call", "tool-result", "tool-call", "tool-result"]
    );
    // The provider was sent the results in the same order.
    let request = provider.requests()[1]["messages"].to_string();
    assert!(
        request.find("1|one").unwrap() < request.find("1|two").unwrap(),
        "{request}"
    );
    // No checkpoint ever showed the second call without the first.
    for state in session.transcript.checkpoints() {
        let pending = state.pending_tool_calls.len();
        assert!(
            pending == 0 || pending == 2,
            "pending {pending}: calls enter in order"
        );
    }
    // Each card merged its result into the call as it started: its arguments, in call order.
    let turn = ConversationTurnStructure::decode(blob(&session, &last.turns[0])).unwrap();
    let Some(conversation_turn_structure::Turn::AgentConversationTurn(turn)) = turn.turn else {
        panic!("an agent turn")
    };
    let cards: Vec<(String, bool)> = turn
        .steps
        .iter()
        .filter_map(|id| {
            match ConversationStep::decode(blob(&session, id))
                .unwrap()
                .message
            {
                Some(conversation_step::Message::ToolCall(pb::ToolCall {
                    tool: Some(pb::tool_call::Tool::ReadToolCall(read)),
                })) => Some((
                    read.args.expect("started arguments").path,
                    read.result.is_some(),
                )),
                _ => None,
            }
        })
        .collect();
    assert_eq!(
        cards,
        [("first".to_owned(), true), ("second".to_owned(), true)]
    );

    // What the run published is what its stored history projects to.
    let db_path = server.db_dir.path().join("test.db");
    let store = Store::open(&fixtures::database_url(&db_path))
        .await
        .unwrap();
    let graph = projected(&store, "conv-call-order").await;
    assert_projects_to(&graph, last);

    // Garbage collection keeps all of it: what the head names, the turns' steps and the cards.
    let deleted = projection::collect_garbage(&store, std::time::Duration::ZERO)
        .await
        .unwrap();
    assert!(deleted > 0, "superseded states and turn versions go");
    let mut kept = last
        .root_prompt_messages_json
        .iter()
        .chain(&last.turns)
        .chain(&turn.steps)
        .map(|id| BlobId::from_slice(id).unwrap())
        .collect::<Vec<_>>();
    kept.push(BlobId::from_slice(&turn.user_message).unwrap());
    for id in kept {
        assert!(
            cursor_server::store::blobs::get(&store, id)
                .await
                .unwrap()
                .is_some(),
            "gc deleted {id}"
        );
    }
}

async fn first_acked(store: &Store, id: BlobId) -> bool {
    cursor_server::store::blobs::acked(store, "conv-gap")
        .await
        .unwrap()
        .contains(&id)
}

/// The graph a conversation's stored history projects to (from its recorded base).
async fn projected(store: &Store, conversation_id: &str) -> ConversationGraph {
    let (base, covers) = conversations::recorded(store, conversation_id)
        .await
        .unwrap()
        .base
        .expect("a recorded base");
    let base = cursor_server::store::blobs::get(store, base)
        .await
        .unwrap()
        .expect("base blob");
    let base = ConversationStateStructure::decode(base.as_slice()).unwrap();
    let rows = messages::load_rows(store, conversation_id).await.unwrap();
    let base = Base {
        graph: ConversationGraph::from_state(&base.into()),
        covers,
    };
    let rows = rows
        .iter()
        .map(|row| (row.request_id.as_str(), &row.message));
    projection::project(base, Vec::new(), rows)
        .0
        .graph()
        .clone()
}

fn assert_projects_to(graph: &ConversationGraph, state: &ConversationStateStructure) {
    let ids = |list: &[Vec<u8>]| -> Vec<BlobId> {
        list.iter()
            .map(|id| BlobId::from_slice(id).unwrap())
            .collect()
    };
    assert_eq!(
        graph.roots(),
        ids(&state.root_prompt_messages_json).as_slice()
    );
    let mut turns = graph.turns().to_vec();
    turns.extend(graph.turn_blob().map(|turn| turn.id));
    assert_eq!(turns, ids(&state.turns));
}

#[tokio::test]
async fn a_tool_pair_committed_just_before_a_crash_is_in_the_next_turns_checkpoint() {
    let provider = FakeProvider::start().await;
    provider.push(Reply::sse(text_events(&["First."], (10, 2, 0))));
    provider.push(Reply::sse(text_events(&["Second."], (12, 1, 0))));
    let server = TestServer::start(&provider.base_url()).await;
    let cursor = FakeCursor::new(server.addr);
    let first = Session::start(
        &cursor,
        "req-gap-1",
        &run_request_with_env("conv-gap", "one"),
    )
    .await
    .finish()
    .await;
    assert!(first.is_success(), "{:?}", first.end);
    let db = server.stop().await;

    // What a crash right after a tool batch's commit leaves: history with a call and its result
    // that no checkpoint names.
    let db_path = db.path().join("test.db");
    let store = Store::open(&fixtures::database_url(&db_path))
        .await
        .unwrap();
    let call = ToolCall {
        call_id: "call_gap".into(),
        provider_call_id: "p_gap".into(),
        name: "Read".into(),
        arguments: r#"{"path":"gap.txt"}"#.into(),
    };
    let crashed = [
        CanonicalMessage::Assistant(AssistantMessage {
            text: String::new(),
            thinking: String::new(),
            thinking_spans: Vec::new(),
            model_id: "test-model".into(),
            replay: None,
            model_call_id: "mc-gap".into(),
            planned_calls: vec![call.clone()],
        }),
        CanonicalMessage::ToolCall(ToolCallRecord {
            model_call_id: "mc-gap".into(),
            index: 0,
            call,
        }),
        CanonicalMessage::ToolResult(ToolResultRecord {
            model_call_id: "mc-gap".into(),
            index: 0,
            result: ToolResult {
                images: Vec::new(),
                call_id: "call_gap".into(),
                content: "the gap's line".into(),
                is_error: false,
                meta: None,
            },
            card: None,
        }),
    ];
    messages::append(&store, "conv-gap", "req-gap-1", &crashed)
        .await
        .unwrap();
    drop(store);

    let server = TestServer::start_in(&provider.base_url(), db, "").await;
    let cursor = FakeCursor::new(server.addr);
    let mut session = Session::start(
        &cursor,
        "req-gap-2",
        &run_request_with_env("conv-gap", "two"),
    )
    .await;
    while session.next().await.is_some() {}
    assert!(
        session.transcript.is_success(),
        "{:?}",
        session.transcript.end
    );
    let last = *session.transcript.checkpoints().last().expect("checkpoint");
    let db_path = server.db_dir.path().join("test.db");
    let store = Store::open(&fixtures::database_url(&db_path))
        .await
        .unwrap();
    let mut tool_roots = Vec::new();
    for id in &last.root_prompt_messages_json {
        let id = BlobId::from_slice(id).unwrap();
        let data = cursor_server::store::blobs::get(&store, id).await.unwrap();
        let root: serde_json::Value = serde_json::from_slice(&data.expect("root stored")).unwrap();
        if root["content"][0]["toolCallId"] == "call_gap" {
            // The client holds it, or was asked to store it in this run.
            assert!(session.blobs.contains_key(&id.0[..]) || first_acked(&store, id).await);
            tool_roots.push(root);
        }
    }
    assert_eq!(
        tool_roots.len(),
        2,
        "the call and its result are roots again"
    );
    assert_eq!(tool_roots[1]["content"][0]["result"], "the gap's line");
    assert_projects_to(&projected(&store, "conv-gap").await, last);
}

#[tokio::test]
async fn a_tool_result_answered_200_survives_a_sigkill_and_the_tool_never_runs_again() {
    let provider = FakeProvider::start().await;
    provider.push(Reply::sse(tool_call_events(
        None,
        &[("call_w", "Read", r#"{"path":"notes.txt"}"#)],
        (10, 2, 0),
    )));
    // The killed process's next call — if it gets that far before it dies — never completes; the
    // restarted process talks to a provider of its own, so which of them makes that call does
    // not matter.
    provider.push(Reply::Hang {
        events: Vec::new(),
        sent: Default::default(),
    });
    let after_restart = FakeProvider::start().await;
    after_restart.push(Reply::sse(text_events(&["resumed"], (12, 1, 0))));
    let db_dir = tempfile::tempdir().expect("tempdir");
    let (mut process, addr) = fixtures::spawn_process(&provider.base_url(), db_dir.path()).await;
    let cursor = FakeCursor::new(addr);
    let mut session = Session::start(
        &cursor,
        "req-durable",
        &run_request_with_env("conv-durable", "read notes"),
    )
    .await;
    let exec = session.next_exec().await;
    // The 200 for the result is the promise: the process dies right after it.
    session
        .send(&exec_result(
            exec.id,
            read_success("notes.txt", "kept line"),
        ))
        .await;
    process.kill().await.expect("SIGKILL");
    drop(session);

    // Should the read be asked for again, nobody answers it: fail fast rather than at 600 s.
    let server = TestServer::start_in(
        &after_restart.base_url(),
        db_dir,
        "client_idle_timeout_secs = 5",
    )
    .await;
    let cursor = FakeCursor::new(server.addr);
    let resumed = Session::start(
        &cursor,
        "req-durable-resume",
        &fixtures::resume_request("conv-durable"),
    )
    .await
    .finish()
    .await;
    assert!(resumed.is_success(), "{:?}", resumed.end);
    assert!(
        !resumed.kinds().contains(&"exec"),
        "the read ran again: {:?}",
        resumed.kinds()
    );
    assert_eq!(resumed.text(), "resumed");
    let last = after_restart
        .requests()
        .last()
        .expect("a request")
        .to_string();
    assert!(last.contains("kept line"), "{last}");
}

/// Reads the run's stream until an interaction update `wanted` accepts.
async fn read_until(
    session: &mut Session<'_>,
    wanted: fn(&pb::interaction_update::Message) -> bool,
) {
    loop {
        let message = session.next().await.expect("the stream goes on");
        if let Some(agent_server_message::Message::InteractionUpdate(update)) = &message.message
            && update.message.as_ref().is_some_and(wanted)
        {
            return;
        }
    }
}

/// The stored history of `conversation_id` and its run records, read from the database a killed
/// process left.
async fn stored_after_kill(
    db: &std::path::Path,
    conversation_id: &str,
) -> (Store, Vec<CanonicalMessage>) {
    let store = Store::open(&fixtures::database_url(&db.join("test.db")))
        .await
        .expect("the database opens after SIGKILL");
    let history = messages::load(&store, conversation_id)
        .await
        .expect("history decodes");
    (store, history)
}

/// How many tool results history holds (each call of these scenarios is the model's only one).
fn tool_results(history: &[CanonicalMessage]) -> usize {
    history
        .iter()
        .filter(|m| matches!(m, CanonicalMessage::ToolResult(_)))
        .count()
}

#[tokio::test]
async fn killed_with_a_tool_running_the_resume_runs_it_once_and_the_turn_completes() {
    let provider = FakeProvider::start().await;
    provider.push(Reply::sse(tool_call_events(
        None,
        &[("call_run", "Read", r#"{"path":"r.txt"}"#)],
        (10, 2, 0),
    )));
    provider.push(Reply::sse(text_events(&["read it"], (12, 1, 0))));
    let db_dir = tempfile::tempdir().expect("tempdir");
    let (mut process, addr) = fixtures::spawn_process(&provider.base_url(), db_dir.path()).await;
    let cursor = FakeCursor::new(addr);
    let mut session = Session::start(
        &cursor,
        "req-tool-running",
        &run_request_with_env("conv-tool-running", "read r"),
    )
    .await;
    let _never_answered = session.next_exec().await;
    process.kill().await.expect("SIGKILL");
    drop(session);

    let (store, history) = stored_after_kill(db_dir.path(), "conv-tool-running").await;
    assert_eq!(tool_results(&history), 0, "the call never completed");
    assert!(
        matches!(history.last(), Some(CanonicalMessage::Assistant(a)) if a.planned_calls.len() == 1),
        "the model's call is stored before it runs: {history:?}"
    );
    drop(store);

    let server = TestServer::start_in(&provider.base_url(), db_dir, "").await;
    let cursor = FakeCursor::new(server.addr);
    let mut resumed = Session::start(
        &cursor,
        "req-tool-running-2",
        &fixtures::resume_request("conv-tool-running"),
    )
    .await;
    let exec = resumed.next_exec().await;
    resumed
        .send(&exec_result(exec.id, read_success("r.txt", "the line")))
        .await;
    while resumed.next().await.is_some() {}
    assert!(
        resumed.transcript.is_success(),
        "{:?}",
        resumed.transcript.end
    );
    assert_eq!(resumed.transcript.text(), "read it");
    assert_eq!(
        provider.requests().len(),
        2,
        "the model was not asked again for the call"
    );
    let db = server.stop().await;
    let (store, history) = stored_after_kill(db.path(), "conv-tool-running").await;
    assert_eq!(tool_results(&history), 1);
    let last = *resumed.transcript.checkpoints().last().expect("checkpoint");
    assert_projects_to(&projected(&store, "conv-tool-running").await, last);
}

#[tokio::test]
async fn killed_while_the_model_reads_a_tool_result_the_resume_asks_it_again_without_the_tool() {
    let provider = FakeProvider::start().await;
    provider.push(Reply::sse(tool_call_events(
        None,
        &[("call_done", "Read", r#"{"path":"d.txt"}"#)],
        (10, 2, 0),
    )));
    let sent = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut partial = text_events(&["half "], (5, 1, 0));
    partial.truncate(2);
    provider.push(Reply::Hang {
        events: partial,
        sent: sent.clone(),
    });
    provider.push(Reply::sse(text_events(&["whole answer"], (12, 1, 0))));
    let db_dir = tempfile::tempdir().expect("tempdir");
    let (mut process, addr) = fixtures::spawn_process(&provider.base_url(), db_dir.path()).await;
    let cursor = FakeCursor::new(addr);
    let mut session = Session::start(
        &cursor,
        "req-second-call",
        &run_request_with_env("conv-second-call", "read d"),
    )
    .await;
    let exec = session.next_exec().await;
    session
        .send(&exec_result(exec.id, read_success("d.txt", "done line")))
        .await;
    // The second call is streaming when the process dies.
    read_until(&mut session, |update| {
        matches!(update, pb::interaction_update::Message::TextDelta(_))
    })
    .await;
    process.kill().await.expect("SIGKILL");
    drop(session);

    let (store, history) = stored_after_kill(db_dir.path(), "conv-second-call").await;
    assert_eq!(tool_results(&history), 1);
    assert!(
        matches!(history.last(), Some(CanonicalMessage::ToolResult(_))),
        "the half answer is not history: {:?}",
        history.last()
    );
    drop(store);

    let server =
        TestServer::start_in(&provider.base_url(), db_dir, "client_idle_timeout_secs = 5").await;
    let cursor = FakeCursor::new(server.addr);
    let resumed = Session::start(
        &cursor,
        "req-second-call-2",
        &fixtures::resume_request("conv-second-call"),
    )
    .await
    .finish()
    .await;
    assert!(resumed.is_success(), "{:?}", resumed.end);
    assert!(!resumed.kinds().contains(&"exec"), "{:?}", resumed.kinds());
    assert_eq!(resumed.text(), "whole answer");
    let last = provider.requests().last().expect("a request").to_string();
    assert!(last.contains("done line"), "{last}");
    assert!(!last.contains("half"), "{last}");
}

#[tokio::test]
async fn killed_after_turn_ended_before_the_final_checkpoint_the_next_turn_has_the_answer_once() {
    let provider = FakeProvider::start().await;
    provider.push(Reply::sse(text_events(&["Answer one."], (10, 2, 0))));
    provider.push(Reply::sse(text_events(&["Answer two."], (12, 1, 0))));
    let db_dir = tempfile::tempdir().expect("tempdir");
    let (mut process, addr) = fixtures::spawn_process(&provider.base_url(), db_dir.path()).await;
    let cursor = FakeCursor::new(addr);
    let mut session = Session::start(
        &cursor,
        "req-ended",
        &run_request_with_env("conv-ended", "one"),
    )
    .await;
    // No ACK reaches the server: the final checkpoint can never be published.
    session.withhold_acks = true;
    read_until(&mut session, |update| {
        matches!(update, pb::interaction_update::Message::TurnEnded(_))
    })
    .await;
    assert!(
        session.transcript.checkpoints().is_empty(),
        "nothing was published"
    );
    process.kill().await.expect("SIGKILL");
    drop(session);

    let server = TestServer::start_in(&provider.base_url(), db_dir, "").await;
    let cursor = FakeCursor::new(server.addr);
    let mut second = Session::start(
        &cursor,
        "req-ended-2",
        &run_request_with_env("conv-ended", "two"),
    )
    .await;
    while second.next().await.is_some() {}
    assert!(
        second.transcript.is_success(),
        "{:?}",
        second.transcript.end
    );
    let request = provider.requests()[1]["messages"].to_string();
    assert_eq!(request.matches("Answer one.").count(), 1, "{request}");
    let last = *second.transcript.checkpoints().last().expect("checkpoint");
    assert_eq!(last.turns.len(), 2, "the first turn is in the graph");
    let db = server.stop().await;
    let (store, _) = stored_after_kill(db.path(), "conv-ended").await;
    let run = cursor_server::store::runs::get(&store, "req-ended")
        .await
        .unwrap()
        .expect("recorded");
    assert_eq!(
        run.outcome.status.as_str(),
        "failed",
        "ended by the restart"
    );
    assert_projects_to(&projected(&store, "conv-ended").await, last);
}

/// A run's start is one commit: its record, the conversation's base, the user's message and the
/// blobs sent for it land together or not at all. Here the database refuses the outbox row of the
/// run's first blob (a trigger stands for a disk that fails mid-commit): the run ends with an
/// error, and nothing of its start is kept — no message, no base, no blob owed — so the message
/// sent again starts clean. (When the start was four commits, the message stayed without its
/// blobs and the base stayed behind.) The run's first provider call leaves before that commit
/// ends (the provider prepares its answer meanwhile): when the commit fails the call is dropped
/// unread, and nothing of it reaches the client.
#[tokio::test]
async fn a_run_start_that_cannot_store_its_first_blobs_keeps_nothing_of_it() {
    let provider = FakeProvider::start().await;
    // The same answer for the call the failed start may have sent and for the second try.
    for _ in 0..2 {
        provider.push(Reply::sse(text_events(&["hello"], (5, 1, 0))));
    }
    let server = TestServer::start(&provider.base_url()).await;
    let url = fixtures::database_url(&server.db_dir.path().join("test.db"));
    let failing_disk = FailingOutbox::install(&url, "conv-atomic").await;
    let cursor = FakeCursor::new(server.addr);
    let session = Session::start(
        &cursor,
        "req-atomic-1",
        &run_request_with_env("conv-atomic", "hello"),
    )
    .await;
    let transcript = session.finish().await;
    assert_eq!(
        transcript.error_code(),
        Some("internal"),
        "{:?}",
        transcript.error_message()
    );
    assert_eq!(
        transcript.text(),
        "",
        "nothing of the call reached the client"
    );
    let sent = provider.requests().len();
    assert!(sent <= 1, "at most the one call, dropped: {sent}");

    let store = Store::open(&url).await.unwrap();
    assert!(
        messages::load(&store, "conv-atomic")
            .await
            .unwrap()
            .is_empty(),
        "the user's message is not kept without its blobs"
    );
    assert_eq!(
        conversations::recorded(&store, "conv-atomic")
            .await
            .unwrap()
            .base,
        None
    );
    // The run's ending is recorded after its stream ends: wait for it (bounded).
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
    let run = loop {
        let run = cursor_server::store::runs::get(&store, "req-atomic-1")
            .await
            .unwrap()
            .expect("the failed run is recorded");
        if run.outcome.status != cursor_server::store::runs::RunStatus::Running {
            break run;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{run:?} never ended"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    assert_eq!(
        run.outcome.status,
        cursor_server::store::runs::RunStatus::Failed
    );
    assert!(run.outcome.error.is_some(), "{run:?}");

    // The disk is back: the same message starts the conversation as if the first try never was.
    failing_disk.remove().await;
    let again = Session::start(
        &cursor,
        "req-atomic-2",
        &run_request_with_env("conv-atomic", "hello"),
    )
    .await
    .finish()
    .await;
    assert!(again.is_success(), "{:?}", again.error_message());
    assert_eq!(again.text(), "hello");
    let history = messages::load(&store, "conv-atomic").await.unwrap();
    let users = history
        .iter()
        .filter(|m| matches!(m, CanonicalMessage::User(u) if u.text == "hello"))
        .count();
    assert_eq!(users, 1, "one user message: {history:?}");
}

/// A database that refuses every outbox row of one conversation (a trigger, in either dialect):
/// a write that fails part-way through a transaction.
enum FailingOutbox {
    Sqlite(sqlx::SqlitePool),
    Postgres(sqlx::PgPool),
}

impl FailingOutbox {
    async fn install(url: &str, conversation_id: &str) -> FailingOutbox {
        if fixtures::on_postgres() {
            let pool = sqlx::PgPool::connect(url).await.unwrap();
            let function = "CREATE FUNCTION refuse_outbox() RETURNS trigger LANGUAGE plpgsql
                 AS $$ BEGIN RAISE EXCEPTION 'injected: the disk failed'; END $$";
            let trigger = format!(
                "CREATE TRIGGER refuse_outbox BEFORE INSERT ON outbox FOR EACH ROW
                 WHEN (NEW.conversation_id = '{conversation_id}') EXECUTE FUNCTION refuse_outbox()"
            );
            for sql in [function.to_owned(), trigger] {
                sqlx::query(sqlx::AssertSqlSafe(sql))
                    .execute(&pool)
                    .await
                    .unwrap();
            }
            FailingOutbox::Postgres(pool)
        } else {
            let pool = sqlx::SqlitePool::connect(url).await.unwrap();
            let trigger = format!(
                "CREATE TRIGGER refuse_outbox BEFORE INSERT ON outbox
                 WHEN NEW.conversation_id = '{conversation_id}'
                 BEGIN SELECT RAISE(ABORT, 'injected: the disk failed'); END"
            );
            sqlx::query(sqlx::AssertSqlSafe(trigger))
                .execute(&pool)
                .await
                .unwrap();
            FailingOutbox::Sqlite(pool)
        }
    }

    async fn remove(self) {
        match self {
            FailingOutbox::Postgres(pool) => {
                sqlx::query("DROP TRIGGER refuse_outbox ON outbox")
                    .execute(&pool)
                    .await
                    .unwrap();
            }
            FailingOutbox::Sqlite(pool) => {
                sqlx::query("DROP TRIGGER refuse_outbox")
                    .execute(&pool)
                    .await
                    .unwrap();
            }
        }
    }
}
