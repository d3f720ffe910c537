//! A complete text turn, end to end: the real server on a loopback port, a fake Cursor client on the
//! real transports, and a fake provider streaming real Chat SSE.

#[path = "support/fake_cursor.rs"]
mod fake_cursor;
#[path = "support/fake_provider.rs"]
mod fake_provider;
#[path = "support/fixtures.rs"]
mod fixtures;

use base64::Engine as _;
use cursor_server::cursor::proto::agent::interaction_update;
use cursor_server::cursor::proto::aiserver::{ErrorDetails, error_details};
use cursor_server::store::Store;
use cursor_server::store::runs::{self, RunStatus};
use fake_cursor::{FakeCursor, Transcript, read_transcript};
use fake_provider::{FakeProvider, Reply, text_events, thinking_then_text_events};
use fixtures::{TestServer, run_request};
use prost::Message as _;

/// Runs one turn over RunSSE + BidiAppend and returns what the client saw.
async fn sse_turn(
    cursor: &FakeCursor,
    request_id: &str,
    conversation: &str,
    text: &str,
) -> Transcript {
    let sse = cursor.open_run_sse(request_id).await;
    let accepted = cursor
        .append(request_id, 0, &run_request(conversation, text))
        .await;
    assert_eq!(accepted.status(), 200);
    assert!(
        accepted.bytes().await.expect("body").is_empty(),
        "empty BidiAppendResponse"
    );
    read_transcript(sse).await
}

fn turn_ended(
    transcript: &Transcript,
) -> Option<&cursor_server::cursor::proto::agent::TurnEndedUpdate> {
    transcript.updates().find_map(|u| match u {
        interaction_update::Message::TurnEnded(t) => Some(t),
        _ => None,
    })
}

#[tokio::test]
async fn a_user_message_yields_streamed_text_turn_ended_then_end_of_stream() {
    let provider = FakeProvider::start().await;
    provider.push(Reply::sse(text_events(
        &["Hel", "lo ", "world"],
        (120, 7, 100),
    )));
    let server = TestServer::start(&provider.base_url()).await;
    let cursor = FakeCursor::new(server.addr);

    let transcript = sse_turn(&cursor, "req-text-1", "conv-text", "say hello").await;

    // One model step around the answer; the sidebar's summary before turn_ended (protocol.md §6).
    // Deltas ready together leave in one frame (the provider may stream while the run's opening
    // commits), so the text's frames are compared as one run of deltas.
    assert_eq!(
        transcript.kinds_merged(),
        [
            "step_started",
            "text_delta",
            "step_completed",
            "summary_started",
            "summary",
            "summary_completed",
            "turn_ended"
        ]
    );
    assert_eq!(transcript.text(), "Hello world");
    let (mut started, mut completed, mut summary) = (None, None, None);
    for update in transcript.updates() {
        match update {
            interaction_update::Message::StepStarted(s) => started = Some(s.step_id),
            interaction_update::Message::StepCompleted(c) => completed = Some(c.step_id),
            interaction_update::Message::Summary(s) => summary = Some(s.summary.clone()),
            _ => {}
        }
    }
    assert_eq!(started, Some(1));
    assert_eq!(
        completed, started,
        "the step that started is the one that completed"
    );
    assert_eq!(summary.as_deref(), Some("Hello world"));
    // Every streamed text delta is followed by the UI's token-count hint (the CLI's counter).
    let all = transcript.all_kinds();
    let hints: Vec<usize> = all
        .iter()
        .enumerate()
        .filter(|(_, k)| **k == "token_delta")
        .map(|(i, _)| i)
        .collect();
    let deltas = all.iter().filter(|k| **k == "text_delta").count();
    assert!(deltas >= 1 && hints.len() == deltas, "{all:?}");
    assert!(hints.iter().all(|i| all[i - 1] == "text_delta"), "{all:?}");
    let tokens: i32 = transcript
        .updates()
        .filter_map(|u| match u {
            interaction_update::Message::TokenDelta(t) => Some(t.tokens),
            _ => None,
        })
        .sum();
    assert!(
        tokens >= i32::try_from(deltas).unwrap_or(i32::MAX),
        "at least one token per delta: {tokens}"
    );
    let usage = turn_ended(&transcript).expect("turn_ended");
    assert_eq!(usage.input_tokens, Some(120));
    assert_eq!(usage.output_tokens, Some(7));
    assert_eq!(usage.cache_read_tokens, Some(100));
    assert_eq!(
        usage.cache_write_tokens, None,
        "unreported usage is omitted"
    );
    assert_eq!(
        transcript.end_frame.as_deref(),
        Some(&[0x02, 0, 0, 0, 2, b'{', b'}'][..]),
        "success ends with exactly 02 00 00 00 02 7b 7d"
    );

    let requests = provider.requests();
    assert_eq!(requests.len(), 1);
    let request = &requests[0];
    assert_eq!(request["model"], "upstream-test-model");
    assert_eq!(request["stream"], true);
    assert_eq!(request["stream_options"]["include_usage"], true);
    let messages = request["messages"].as_array().expect("messages");
    assert_eq!(messages.len(), 2);
    assert_eq!(messages[0]["role"], "system");
    assert_eq!(
        messages[1],
        serde_json::json!({"role": "user", "content": "say hello"})
    );
    assert_eq!(
        provider.authorizations(),
        [format!("Bearer {}", fixtures::API_KEY)]
    );

    let db = server.stop().await;
    let store = Store::open(&fixtures::database_url(&db.path().join("test.db")))
        .await
        .expect("reopen");
    let record = runs::get(&store, "req-text-1")
        .await
        .expect("query")
        .expect("run recorded");
    assert_eq!(record.outcome.status, RunStatus::Succeeded);
    assert_eq!(record.outcome.provider_calls, 1);
    assert_eq!(record.outcome.usage.input_tokens, Some(120));
    assert_eq!(record.conversation_id, "conv-text");
}

#[tokio::test]
async fn thinking_streams_first_then_completes_before_text() {
    let provider = FakeProvider::start().await;
    provider.push(Reply::Sse {
        events: thinking_then_text_events(&["Let me ", "think."], &["Answer."], (50, 9, 0)),
        gap: std::time::Duration::from_millis(3),
    });
    let server = TestServer::start(&provider.base_url()).await;
    let cursor = FakeCursor::new(server.addr);

    let transcript = sse_turn(&cursor, "req-think", "conv-think", "why?").await;

    // Thinking deltas that arrive while the run's opening commits leave in one frame (on
    // PostgreSQL the commit outlasts the provider's 3 ms between events): compared as one run.
    assert_eq!(
        transcript.kinds_merged(),
        [
            "step_started",
            "thinking_delta",
            "thinking_completed",
            "text_delta",
            "step_completed",
            "summary_started",
            "summary",
            "summary_completed",
            "turn_ended"
        ]
    );
    assert_eq!(transcript.thinking(), "Let me think.");
    assert_eq!(transcript.text(), "Answer.");
    let duration = transcript
        .updates()
        .find_map(|u| match u {
            interaction_update::Message::ThinkingCompleted(t) => Some(t.thinking_duration_ms),
            _ => None,
        })
        .expect("thinking_completed");
    assert!(
        duration >= 1,
        "thinking duration is at least 1 ms, got {duration}"
    );
    assert!(transcript.is_success());
}

#[tokio::test]
async fn provider_http_500_ends_unavailable_with_error_details_and_no_turn_ended() {
    let provider = FakeProvider::start().await;
    // Retried before the first streamed byte (3 attempts by default), then reported.
    for _ in 0..3 {
        provider.push(Reply::Status {
            status: 500,
            body: r#"{"error":{"message":"upstream exploded","type":"server_error"}}"#.to_owned(),
        });
    }
    let server = TestServer::start(&provider.base_url()).await;
    let cursor = FakeCursor::new(server.addr);

    let transcript = sse_turn(&cursor, "req-500", "conv-500", "hi").await;

    assert!(
        transcript.kinds().is_empty(),
        "no turn_ended, no text: {:?}",
        transcript.kinds()
    );
    assert_eq!(
        provider.requests().len(),
        3,
        "a 500 before streaming is retried"
    );
    assert_eq!(transcript.error_code(), Some("unavailable"));
    let end = transcript.end.as_ref().expect("end");
    let detail = &end["error"]["details"][0];
    assert_eq!(detail["type"], "aiserver.v1.ErrorDetails");
    let value = detail["value"].as_str().expect("base64 value");
    assert!(!value.ends_with('='), "base64 without padding");
    let bytes = base64::engine::general_purpose::STANDARD_NO_PAD
        .decode(value)
        .expect("standard alphabet");
    let details = ErrorDetails::decode(bytes.as_slice()).expect("ErrorDetails");
    assert_eq!(details.error, error_details::Error::ProviderError as i32);
    assert_eq!(details.is_expected, Some(false));
    let custom = details.details.expect("custom details");
    assert!(
        custom.detail.contains("upstream exploded"),
        "{}",
        custom.detail
    );
    assert_eq!(custom.is_retryable, Some(true));
    assert_eq!(custom.show_request_id, Some(true));
    assert_eq!(custom.should_show_immediate_error, Some(false));

    let db = server.stop().await;
    let store = Store::open(&fixtures::database_url(&db.path().join("test.db")))
        .await
        .expect("reopen");
    let record = runs::get(&store, "req-500")
        .await
        .expect("query")
        .expect("run recorded");
    assert_eq!(record.outcome.status, RunStatus::Failed);
    let (code, message) = record.outcome.error.expect("error recorded");
    assert_eq!(code, "unavailable");
    assert!(message.contains("HTTP 500"), "{message}");
}

/// The provider's `ErrorDetails.is_retryable` of a transcript's error ending.
fn retryable(transcript: &Transcript) -> Option<bool> {
    let value = transcript.end.as_ref()?["error"]["details"][0]["value"].as_str()?;
    let bytes = base64::engine::general_purpose::STANDARD_NO_PAD
        .decode(value)
        .ok()?;
    ErrorDetails::decode(bytes.as_slice())
        .ok()?
        .details?
        .is_retryable
}

#[tokio::test]
async fn permanent_provider_errors_get_fitting_codes_and_are_not_retryable() {
    let provider = FakeProvider::start().await;
    let server = TestServer::start(&provider.base_url()).await;
    let cursor = FakeCursor::new(server.addr);
    let cases = [
        (400, "invalid_argument", false, "context length exceeded"),
        (401, "unauthenticated", false, "Incorrect API key provided"),
        (
            403,
            "permission_denied",
            false,
            "not allowed in your region",
        ),
        (404, "not_found", false, "The model does not exist"),
        (422, "invalid_argument", false, "unprocessable"),
    ];
    for (status, code, retry, message) in cases {
        provider.push(Reply::Status {
            status,
            body: format!(r#"{{"error":{{"message":"{message}"}}}}"#),
        });
        let transcript = sse_turn(
            &cursor,
            &format!("req-code-{status}"),
            &format!("conv-code-{status}"),
            "hi",
        )
        .await;
        assert_eq!(transcript.error_code(), Some(code), "HTTP {status}");
        assert_eq!(retryable(&transcript), Some(retry), "HTTP {status}");
        assert!(
            transcript
                .error_message()
                .is_some_and(|m| m.contains(message)),
            "HTTP {status}: {:?}",
            transcript.error_message()
        );
    }
    assert_eq!(provider.requests().len(), cases.len(), "none was retried");

    // A rate limit that outlasts the retries: resource_exhausted, and worth trying later.
    for _ in 0..3 {
        provider.push(Reply::RateLimited {
            retry_after_secs: 0,
            body: r#"{"error":{"message":"Rate limit reached"}}"#.to_owned(),
        });
    }
    let limited = sse_turn(&cursor, "req-code-429", "conv-code-429", "hi").await;
    assert_eq!(limited.error_code(), Some("resource_exhausted"));
    assert_eq!(retryable(&limited), Some(true));
}

#[tokio::test]
async fn a_provider_stream_cut_midway_is_an_error_not_a_success() {
    let provider = FakeProvider::start().await;
    let mut events = text_events(&["partial ", "answer"], (10, 2, 0));
    events.truncate(2); // role chunk + first text, no finish, no [DONE]
    provider.push(Reply::CutAfter { events });
    let server = TestServer::start(&provider.base_url()).await;
    let cursor = FakeCursor::new(server.addr);

    let transcript = sse_turn(&cursor, "req-cut", "conv-cut", "hi").await;

    assert!(
        !transcript.kinds().contains(&"turn_ended"),
        "{:?}",
        transcript.kinds()
    );
    assert_eq!(transcript.text(), "partial ");
    assert_eq!(transcript.error_code(), Some("unavailable"));
}

#[tokio::test]
async fn a_stream_that_closes_cleanly_without_done_is_an_error() {
    let provider = FakeProvider::start().await;
    let mut events = text_events(&["no done"], (10, 2, 0));
    events.pop(); // drop [DONE]; the body then ends normally
    provider.push(Reply::sse(events));
    let server = TestServer::start(&provider.base_url()).await;
    let cursor = FakeCursor::new(server.addr);

    let transcript = sse_turn(&cursor, "req-nodone", "conv-nodone", "hi").await;

    assert!(!transcript.kinds().contains(&"turn_ended"));
    assert_eq!(transcript.error_code(), Some("unavailable"));
    assert!(
        transcript
            .error_message()
            .is_some_and(|m| m.contains("[DONE]")),
        "{:?}",
        transcript.error_message()
    );
}

#[tokio::test]
async fn the_http2_run_transport_streams_the_same_turn_and_ends_the_stream_itself() {
    let provider = FakeProvider::start().await;
    provider.push(Reply::sse(thinking_then_text_events(
        &["hm"],
        &["Hi ", "CLI"],
        (30, 4, 0),
    )));
    let server = TestServer::start(&provider.base_url()).await;
    let cursor = FakeCursor::new(server.addr);

    let (uplink, response) = cursor.open_run_h2("req-h2").await;
    assert_eq!(response.version(), reqwest::Version::HTTP_2);
    uplink.send(fixtures::heartbeat()).await.expect("send");
    uplink
        .send(run_request("conv-h2", "hello from the CLI"))
        .await
        .expect("send");
    // The uplink stays open (never half-closed); the server must still end the response.
    let transcript = read_transcript(response).await;

    assert_eq!(
        transcript.kinds_merged(),
        [
            "step_started",
            "thinking_delta",
            "thinking_completed",
            "text_delta",
            "step_completed",
            "summary_started",
            "summary",
            "summary_completed",
            "turn_ended"
        ]
    );
    assert_eq!(transcript.text(), "Hi CLI");
    assert!(transcript.is_success());
    drop(uplink);
}

#[tokio::test]
async fn a_second_turn_sends_the_first_turn_as_an_exact_prefix() {
    let provider = FakeProvider::start().await;
    provider.push(Reply::sse(thinking_then_text_events(
        &["plan"],
        &["First answer."],
        (20, 3, 0),
    )));
    provider.push(Reply::sse(text_events(&["Second answer."], (40, 3, 20))));
    let server = TestServer::start(&provider.base_url()).await;
    let cursor = FakeCursor::new(server.addr);

    let first = sse_turn(&cursor, "req-turn-1", "conv-two", "first question").await;
    assert!(first.is_success());
    let second = sse_turn(&cursor, "req-turn-2", "conv-two", "second question").await;
    assert!(second.is_success());
    assert_eq!(second.text(), "Second answer.");

    let requests = provider.requests();
    assert_eq!(requests.len(), 2);
    let first_messages = requests[0]["messages"]
        .as_array()
        .expect("messages")
        .clone();
    let second_messages = requests[1]["messages"]
        .as_array()
        .expect("messages")
        .clone();
    assert_eq!(
        &second_messages[..first_messages.len()],
        first_messages.as_slice()
    );
    assert_eq!(
        &second_messages[first_messages.len()..],
        &[
            serde_json::json!({"role": "assistant", "content": "First answer.", "reasoning_content": "plan"}),
            serde_json::json!({"role": "user", "content": "second question"}),
        ]
    );
}

#[tokio::test]
async fn run_sse_may_arrive_after_the_first_bidi_append() {
    let provider = FakeProvider::start().await;
    provider.push(Reply::sse(text_events(&["late reader"], (5, 2, 0))));
    let server = TestServer::start(&provider.base_url()).await;
    let cursor = FakeCursor::new(server.addr);

    let accepted = cursor
        .append("req-late-sse", 0, &run_request("conv-late", "hi"))
        .await;
    assert_eq!(accepted.status(), 200);
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let transcript = read_transcript(cursor.open_run_sse("req-late-sse").await).await;

    assert_eq!(
        transcript.kinds(),
        [
            "step_started",
            "text_delta",
            "step_completed",
            "summary_started",
            "summary",
            "summary_completed",
            "turn_ended"
        ]
    );
    assert!(transcript.is_success());
}

#[tokio::test]
async fn late_traffic_for_a_finished_request_gets_a_clear_error() {
    let provider = FakeProvider::start().await;
    provider.push(Reply::sse(text_events(&["done"], (5, 1, 0))));
    let server = TestServer::start(&provider.base_url()).await;
    let cursor = FakeCursor::new(server.addr);
    assert!(
        sse_turn(&cursor, "req-finished", "conv-finished", "hi")
            .await
            .is_success()
    );

    let late_sse = read_transcript(cursor.open_run_sse("req-finished").await).await;
    assert!(late_sse.messages.is_empty());
    assert_eq!(late_sse.error_code(), Some("not_found"));
    assert!(
        late_sse
            .error_message()
            .is_some_and(|m| m.contains("req-finished"))
    );

    let late_append = cursor
        .append("req-finished", 1, &fixtures::heartbeat())
        .await;
    assert_eq!(late_append.status(), 404);
    let body: serde_json::Value = late_append.json().await.expect("JSON reason");
    assert_eq!(body["code"], "not_found");
}

#[tokio::test]
async fn an_unknown_model_is_not_found_and_names_the_configured_models() {
    let provider = FakeProvider::start().await;
    let server = TestServer::start(&provider.base_url()).await;
    let cursor = FakeCursor::new(server.addr);

    let sse = cursor.open_run_sse("req-unknown-model").await;
    let message = fixtures::run_request_for_model("conv-unknown", "hi", "no-such-model");
    assert_eq!(
        cursor
            .append("req-unknown-model", 0, &message)
            .await
            .status(),
        200
    );
    let transcript = read_transcript(sse).await;

    assert_eq!(transcript.error_code(), Some("not_found"));
    let message = transcript.error_message().expect("message");
    assert!(
        message.contains("no-such-model") && message.contains(fixtures::MODEL),
        "{message}"
    );
    assert!(
        provider.requests().is_empty(),
        "no provider call for an unknown model"
    );
}

#[tokio::test]
async fn cursors_auto_model_runs_on_the_configured_default() {
    let provider = FakeProvider::start().await;
    provider.push(Reply::sse(text_events(&["auto"], (3, 1, 0))));
    let server = TestServer::start(&provider.base_url()).await;
    let cursor = FakeCursor::new(server.addr);
    let transcript = fake_cursor::Session::start(
        &cursor,
        "req-auto",
        &fixtures::run_request_for_model("conv-auto", "hi", "default"),
    )
    .await
    .finish()
    .await;
    assert!(transcript.is_success(), "{:?}", transcript.end);
    assert_eq!(transcript.text(), "auto");
    let request = &provider.requests()[0];
    assert_eq!(
        request["model"],
        format!("upstream-{}", fixtures::MODEL),
        "the default model's upstream id"
    );
}

#[tokio::test]
async fn a_slow_provider_is_covered_by_heartbeats() {
    let provider = FakeProvider::start().await;
    provider.push(Reply::Sse {
        events: text_events(&["late"], (5, 1, 0)),
        gap: std::time::Duration::from_millis(150),
    });
    let db = tempfile::tempdir().expect("tempdir");
    let server = TestServer::start_in(&provider.base_url(), db, "heartbeat_interval_ms = 50").await;
    let cursor = FakeCursor::new(server.addr);

    let transcript = sse_turn(&cursor, "req-heartbeat", "conv-heartbeat", "hi").await;

    assert!(transcript.is_success());
    let kinds = transcript.kinds();
    let first_text = kinds.iter().position(|k| *k == "text_delta").expect("text");
    assert!(
        kinds[..first_text].contains(&"heartbeat"),
        "heartbeats while waiting for the provider: {kinds:?}"
    );
}

#[tokio::test]
async fn the_success_tail_is_turn_ended_transitional_final_final_again_then_end_of_stream() {
    let provider = FakeProvider::start().await;
    provider.push(Reply::sse(text_events(&["Done."], (30, 3, 0))));
    let server = TestServer::start(&provider.base_url()).await;
    let cursor = FakeCursor::new(server.addr);

    // A client that stores every blob it is given (and says so).
    let mut session =
        fake_cursor::Session::start(&cursor, "req-tail", &run_request("conv-tail", "finish")).await;
    while session.next().await.is_some() {}

    let kinds = session.transcript.all_kinds();
    let turn_ended_at = kinds
        .iter()
        .position(|k| *k == "turn_ended")
        .expect("turn_ended");
    assert_eq!(
        &kinds[turn_ended_at..],
        ["turn_ended", "checkpoint", "checkpoint", "checkpoint"],
        "{kinds:?}"
    );
    assert!(
        kinds[..turn_ended_at].iter().all(|k| *k != "checkpoint"),
        "no checkpoint before turn_ended in a text turn: {kinds:?}"
    );
    let checkpoints = session.transcript.checkpoints();
    let (transitional, last, again) = (checkpoints[0], checkpoints[1], checkpoints[2]);
    assert_ne!(
        transitional, last,
        "the transitional state is not the final one"
    );
    assert_eq!(last, again, "the final state is published twice, unchanged");
    assert_eq!(transitional.turns, last.turns);
    assert_eq!(
        (transitional.turn_timings.len(), last.turn_timings.len()),
        (0, 1)
    );
    assert_eq!(
        session.transcript.end_frame.as_deref(),
        Some(&[0x02, 0, 0, 0, 2, b'{', b'}'][..]),
        "then end-of-stream {{}}"
    );
}

#[tokio::test]
async fn each_provider_call_is_recorded_once_with_its_timing_usage_attempts_and_ending() {
    let provider = FakeProvider::start().await;
    // The first attempt of the first call is refused for a moment, then retried.
    provider.push(Reply::Status {
        status: 503,
        body: r#"{"error":{"message":"loading model"}}"#.into(),
    });
    provider.push(Reply::sse(text_events(&["Hello", " there"], (12, 3, 4))));
    provider.push(Reply::Status {
        status: 400,
        body: r#"{"error":{"message":"context too long"}}"#.into(),
    });
    let server = TestServer::start(&provider.base_url()).await;
    let cursor = FakeCursor::new(server.addr);
    assert!(
        sse_turn(&cursor, "req-rec-1", "conv-rec", "hi")
            .await
            .is_success()
    );
    let failed = sse_turn(&cursor, "req-rec-2", "conv-rec", "again").await;
    assert_eq!(failed.error_code(), Some("invalid_argument"));

    let db = server.stop().await;
    let store = Store::open(&fixtures::database_url(&db.path().join("test.db")))
        .await
        .expect("reopen");
    let ok = runs::provider_calls(&store, "req-rec-1").await.unwrap();
    assert_eq!(ok.len(), 1);
    let call = &ok[0];
    assert_eq!(call.purpose, runs::CallPurpose::Turn);
    assert_eq!(call.conversation_id, "conv-rec");
    assert_eq!(call.model_id, fixtures::MODEL);
    assert_eq!(call.finish_reason.as_deref(), Some("stop"));
    assert_eq!(call.usage.input_tokens, Some(12));
    assert_eq!(call.usage.output_tokens, Some(3));
    assert_eq!(call.usage.cache_read_tokens, Some(4));
    assert!(
        call.request_bytes > 1000,
        "the system prompt alone is larger"
    );
    let first = call.first_event_ms.expect("time to first event");
    assert!(first <= call.total_ms);
    assert!(call.error.is_none());
    assert_eq!(call.attempts(), 2, "the 503 and the attempt that streamed");
    assert_eq!(call.retries[0].status, Some(503));
    assert!(
        call.retries[0].error.contains("loading model"),
        "{:?}",
        call.retries
    );

    let bad = runs::provider_calls(&store, "req-rec-2").await.unwrap();
    assert_eq!(bad.len(), 1);
    assert!(bad[0].finish_reason.is_none());
    let error = bad[0].error.as_deref().unwrap();
    assert!(
        error.contains("400") && error.contains("context too long"),
        "{error}"
    );
    assert_eq!(bad[0].attempts(), 1, "a 400 is not retried");
}

/// A run_request whose user message carries `context` (what the user attached).
fn run_request_with_attachments(
    conversation_id: &str,
    text: &str,
    context: cursor_server::cursor::proto::agent::SelectedContext,
) -> cursor_server::cursor::proto::agent::AgentClientMessage {
    use cursor_server::cursor::proto::agent::{agent_client_message, conversation_action};
    let mut message = run_request(conversation_id, text);
    if let Some(agent_client_message::Message::RunRequest(request)) = &mut message.message
        && let Some(conversation_action::Action::UserMessageAction(action)) =
            request.action.as_mut().and_then(|a| a.action.as_mut())
        && let Some(user) = action.user_message.as_mut()
    {
        user.selected_context = Some(context);
    }
    message
}

#[tokio::test]
async fn what_the_user_attaches_reaches_the_model_once_and_is_replayed_byte_for_byte() {
    use cursor_server::cursor::proto::agent as pb;
    let provider = FakeProvider::start().await;
    provider.push(Reply::sse(text_events(&["seen"], (30, 1, 0))));
    provider.push(Reply::sse(text_events(&["again"], (40, 1, 0))));
    let server = TestServer::start(&provider.base_url()).await;
    let cursor = FakeCursor::new(server.addr);
    let position = |line| pb::Position { line, column: 1 };
    let context = pb::SelectedContext {
        files: vec![pb::SelectedFile {
            content: "fn main() {}\n".into(),
            path: "/home/user/demo/src/main.rs".into(),
            relative_path: Some("src/main.rs".into()),
        }],
        code_selections: vec![pb::SelectedCodeSelection {
            content: "let x = 1;".into(),
            path: "/home/user/demo/src/lib.rs".into(),
            relative_path: Some("src/lib.rs".into()),
            range: Some(pb::Range {
                start: Some(position(10)),
                end: Some(position(12)),
            }),
        }],
        cursor_rules: vec![pb::SelectedCursorRule {
            rule: Some(pb::CursorRule {
                full_path: ".cursor/rules/style.mdc".into(),
                content: "Always use tabs.".into(),
                ..Default::default()
            }),
        }],
        cursor_commands: vec![pb::SelectedCursorCommand {
            name: "review".into(),
            content: "Review the diff for bugs.".into(),
            ..Default::default()
        }],
        terminal_selections: vec![pb::SelectedTerminalSelection {
            content: "error[E0308]: mismatched types".into(),
            title: Some("cargo".into()),
            path: None,
            range: Some(pb::Range {
                start: Some(position(3)),
                end: Some(position(3)),
            }),
        }],
        selected_videos: vec![pb::SelectedVideo {
            filename: "demo.mp4".into(),
            ..Default::default()
        }],
        ..Default::default()
    };
    let mut first = fake_cursor::Session::start(
        &cursor,
        "req-attached-1",
        &run_request_with_attachments("conv-attached", "look", context),
    )
    .await;
    while first.next().await.is_some() {}
    assert!(first.transcript.is_success(), "{:?}", first.transcript.end);
    // The turn's user message keeps what was attached: Cursor shows the chips when the chat is
    // reopened.
    let state = *first.transcript.checkpoints().last().expect("a checkpoint");
    let turn = pb::ConversationTurnStructure::decode(first.blobs[&state.turns[0]].as_slice())
        .expect("turn blob");
    let Some(pb::conversation_turn_structure::Turn::AgentConversationTurn(turn)) = turn.turn else {
        panic!("an agent turn")
    };
    let shown = pb::UserMessage::decode(first.blobs[&turn.user_message].as_slice())
        .expect("user message blob");
    let chips = shown.selected_context.expect("selected_context kept");
    assert_eq!(
        (
            chips.files[0].relative_path.as_deref(),
            chips.cursor_commands[0].name.as_str()
        ),
        (Some("src/main.rs"), "review")
    );
    assert_eq!(shown.text, "look");
    let second = fake_cursor::Session::start(
        &cursor,
        "req-attached-2",
        &run_request("conv-attached", "and now?"),
    )
    .await
    .finish()
    .await;
    assert!(second.is_success(), "{:?}", second.end);

    let requests = provider.requests();
    let first_messages = requests[0]["messages"].as_array().unwrap();
    let text = serde_json::to_string(first_messages).unwrap();
    for expected in [
        r#"<file path=\"src/main.rs\">\nfn main() {}\n"#,
        r#"<code_selection path=\"src/lib.rs\" lines=\"10-12\">\nlet x = 1;"#,
        r#"<rule path=\".cursor/rules/style.mdc\">"#,
        "Always use tabs.",
        r#"<command name=\"/review\">"#,
        "Review the diff for bugs.",
        r#"<terminal title=\"cargo\" lines=\"3-3\">\nerror[E0308]"#,
        r#"<not_shown kind=\"video\" name=\"demo.mp4\">"#,
    ] {
        assert!(text.contains(expected), "{expected} missing from {text}");
    }
    let attached_at = first_messages
        .iter()
        .position(|m| {
            m["role"] == "user"
                && m["content"]
                    .as_str()
                    .is_some_and(|c| c.starts_with("<attached_context>"))
        })
        .expect("an attached-context message");
    assert_eq!(
        first_messages[attached_at + 1]["content"],
        "look",
        "the attachments come right before the message they belong to"
    );
    // The next turn replays them byte for byte, once.
    let second_messages = requests[1]["messages"].as_array().unwrap();
    assert_eq!(
        &second_messages[..first_messages.len()],
        first_messages.as_slice()
    );
    assert_eq!(
        serde_json::to_string(second_messages)
            .unwrap()
            .matches("<attached_context>\\nThe user attached")
            .count(),
        1
    );
}

#[tokio::test]
async fn messages_queued_while_the_agent_was_busy_reach_the_model_before_the_new_one() {
    use cursor_server::cursor::proto::agent::{
        UserMessage, agent_client_message, conversation_action,
    };
    let provider = FakeProvider::start().await;
    provider.push(Reply::sse(text_events(&["all three"], (20, 1, 0))));
    let server = TestServer::start(&provider.base_url()).await;
    let cursor = FakeCursor::new(server.addr);
    let mut message = run_request("conv-queued", "and this");
    if let Some(agent_client_message::Message::RunRequest(request)) = &mut message.message
        && let Some(conversation_action::Action::UserMessageAction(action)) =
            request.action.as_mut().and_then(|a| a.action.as_mut())
    {
        action.prepend_user_messages = ["first queued", "second queued"]
            .map(|text| UserMessage {
                text: text.into(),
                ..Default::default()
            })
            .to_vec();
    }
    let transcript = fake_cursor::Session::start(&cursor, "req-queued", &message)
        .await
        .finish()
        .await;
    assert!(transcript.is_success(), "{:?}", transcript.end);
    let contents: Vec<String> = provider.requests()[0]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "user")
        .filter_map(|m| m["content"].as_str().map(str::to_owned))
        .collect();
    let at = |text: &str| contents.iter().position(|c| c == text);
    assert!(
        at("first queued") < at("second queued") && at("second queued") < at("and this"),
        "{contents:?}"
    );
    assert!(at("first queued").is_some(), "{contents:?}");
}

#[tokio::test]
async fn attached_text_the_client_sends_by_blob_id_is_fetched_and_one_it_lacks_is_named() {
    use cursor_server::cursor::proto::agent as pb;
    use cursor_server::model::conversation::BlobId;
    let provider = FakeProvider::start().await;
    provider.push(Reply::sse(text_events(&["read them"], (20, 1, 0))));
    let server = TestServer::start(&provider.base_url()).await;
    let cursor = FakeCursor::new(server.addr);
    let notes = b"deploy notes: use the blue cluster".to_vec();
    let held = BlobId::of(&notes).0.to_vec();
    let lacking = BlobId::of(b"never stored").0.to_vec();
    let entry = |id: &Vec<u8>| pb::ExtraContextEntry {
        data_or_blob_id: Some(pb::extra_context_entry::DataOrBlobId::BlobId(id.clone())),
    };
    let context = pb::SelectedContext {
        extra_context_entries: vec![entry(&held), entry(&lacking)],
        ..Default::default()
    };
    let mut session = fake_cursor::Session::start_with_blobs(
        &cursor,
        "req-blob-attached",
        &run_request_with_attachments("conv-blob-attached", "deploy", context),
        [(held.clone(), notes)].into_iter().collect(),
    )
    .await;
    while session.next().await.is_some() {}
    assert!(
        session.transcript.is_success(),
        "{:?}",
        session.transcript.end
    );
    let request = provider.requests()[0]["messages"].to_string();
    assert!(
        request.contains(r#"<context of=\"extra context\">\ndeploy notes: use the blue cluster"#),
        "{request}"
    );
    assert!(
        request.contains(&format!(
            r#"<not_shown kind=\"extra context\" name=\"{}\">"#,
            hex::encode(&lacking)
        )),
        "{request}"
    );
}
