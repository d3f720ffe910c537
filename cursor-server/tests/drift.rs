//! Drift seen at run time: a fake client on the real RunSSE + BidiAppend transport sends a field and an
//! enum value the schema lacks (as a newer Cursor would). Each is logged exactly once at WARN with the fix,
//! listed on the console overview and counted in `/metrics`, and the turn goes on as if they were not there.
//! A test binary of its own: the drift record and the log subscriber are process-wide.

#[path = "support/fake_cursor.rs"]
mod fake_cursor;
#[path = "support/fake_provider.rs"]
mod fake_provider;
#[path = "support/fixtures.rs"]
mod fixtures;

use std::sync::{Arc, Mutex};

use cursor_server::cursor::proto::agent::{
    AgentClientMessage, agent_client_message, conversation_action,
};
use cursor_server::cursor::proto::aiserver::{BidiAppendRequest, BidiRequestId};
use fake_cursor::{FakeCursor, read_transcript};
use fake_provider::{FakeProvider, Reply, text_events};
use fixtures::{TestServer, run_request};
use prost::Message as _;

/// Every log line the server writes, kept for the assertions.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn lines_with(&self, needle: &str) -> Vec<String> {
        String::from_utf8_lossy(&self.0.lock().unwrap())
            .lines()
            .filter(|l| l.contains(needle))
            .map(str::to_owned)
            .collect()
    }
}

/// Field 9999 (a varint) at the top of an `AgentClientMessage`: no schema declares it.
const UNKNOWN_FIELD: [u8; 4] = [0xF8, 0xF0, 0x04, 0x01];

/// A run request whose user message gives reason 77 (no `SimulatedMsgReason` has it), plus the unknown
/// field.
fn drifting_run_request(conversation: &str) -> Vec<u8> {
    let mut message = run_request(conversation, "hello from a newer client");
    if let Some(agent_client_message::Message::RunRequest(request)) = &mut message.message
        && let Some(conversation_action::Action::UserMessageAction(action)) =
            request.action.as_mut().and_then(|a| a.action.as_mut())
        && let Some(user) = action.user_message.as_mut()
    {
        user.simulated_msg_reason = Some(77);
    }
    with_unknown_field(&message)
}

fn with_unknown_field(message: &AgentClientMessage) -> Vec<u8> {
    let mut bytes = message.encode_to_vec();
    bytes.extend_from_slice(&UNKNOWN_FIELD);
    bytes
}

async fn append(server: &TestServer, request_id: &str, seqno: i64, bytes: &[u8]) {
    let body = BidiAppendRequest {
        data: hex::encode(bytes),
        request_id: Some(BidiRequestId {
            request_id: request_id.to_owned(),
        }),
        append_seqno: seqno,
    };
    let response = reqwest::Client::new()
        .post(format!(
            "http://{}/aiserver.v1.BidiService/BidiAppend",
            server.addr
        ))
        .header("content-type", "application/proto")
        .header("connect-protocol-version", "1")
        .header("x-cursor-client-version", "9.9.9")
        .body(body.encode_to_vec())
        .send()
        .await
        .expect("BidiAppend");
    assert_eq!(response.status(), 200);
}

async fn text(server: &TestServer, path: &str) -> String {
    let response = reqwest::get(format!("http://{}{path}", server.addr))
        .await
        .expect("request");
    assert_eq!(response.status(), 200, "{path}");
    response.text().await.expect("text")
}

#[tokio::test]
async fn a_field_and_an_enum_value_the_schema_lacks_are_reported_once_each_and_the_turn_is_unaffected()
 {
    let logs = Captured::default();
    let writer = logs.clone();
    tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::WARN)
        .init();
    cursor_server::ops::metrics::install();

    let provider = FakeProvider::start().await;
    provider.push(Reply::sse(text_events(&["fine"], (10, 2, 10))));
    provider.push(Reply::sse(text_events(&["again"], (10, 2, 10))));
    let server = TestServer::start(&provider.base_url()).await;
    let cursor = FakeCursor::new(server.addr);

    let sse = cursor.open_run_sse("req-drift").await;
    append(&server, "req-drift", 0, &drifting_run_request("conv-drift")).await;
    let transcript = read_transcript(sse).await;
    assert!(transcript.is_success(), "{:?}", transcript.error_message());
    assert_eq!(transcript.text(), "fine");
    // The same two again in a second turn: counted, not logged again.
    let sse = cursor.open_run_sse("req-drift-2").await;
    append(
        &server,
        "req-drift-2",
        0,
        &drifting_run_request("conv-drift"),
    )
    .await;
    let transcript = read_transcript(sse).await;
    assert!(transcript.is_success(), "{:?}", transcript.error_message());
    assert_eq!(transcript.text(), "again");

    let field = logs.lines_with("agent.v1.AgentClientMessage field 9999");
    assert_eq!(field.len(), 1, "{field:#?}");
    assert!(field[0].contains("WARN"), "{}", field[0]);
    assert!(
        field[0].contains("cursor-server schema-check"),
        "{}",
        field[0]
    );
    assert!(field[0].contains("9.9.9"), "{}", field[0]);
    let value = logs.lines_with("enum value out of range (agent.v1.SimulatedMsgReason: 77)");
    assert_eq!(value.len(), 1, "{value:#?}");
    assert!(
        value[0].contains("agent.v1.UserMessage field 9"),
        "{}",
        value[0]
    );

    let overview = text(&server, "/console").await;
    for expected in [
        "Schema drift",
        "agent.v1.AgentClientMessage",
        "9999",
        "9.9.9",
        "agent.v1.UserMessage",
    ] {
        assert!(
            overview.contains(expected),
            "{expected} not on the overview"
        );
    }
    let metrics = text(&server, "/metrics").await;
    let series: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("cursor_byok_schema_drift_total{"))
        .collect();
    assert_eq!(series.len(), 2, "{series:#?}");
    assert!(
        series
            .iter()
            .any(|l| l.contains("field=\"9999\"") && l.contains("kind=\"field\"")),
        "{series:#?}"
    );
    assert!(
        series
            .iter()
            .any(|l| l.contains("field=\"9\"") && l.contains("kind=\"enum_value\"")),
        "{series:#?}"
    );
    let seen = cursor_server::ops::drift::seen();
    let top = seen.iter().find(|s| s.number == 9999).expect("recorded");
    assert_eq!(top.count, 2, "both turns carried it");
}
