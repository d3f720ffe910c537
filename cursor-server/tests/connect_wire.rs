//! Connect binary compatibility: envelopes, end-of-stream bytes, error JSON, BidiAppend decoding,
//! append_seqno ordering, and precise rejection of malformed input — as functions and over HTTP.

#[path = "support/fake_cursor.rs"]
mod fake_cursor;
#[path = "support/fake_provider.rs"]
mod fake_provider;
#[path = "support/fixtures.rs"]
mod fixtures;

use std::io::Write as _;

use base64::Engine as _;
use cursor_server::client::bidi_append::{self, BidiAppendError};
use cursor_server::client::command::ClientInput;
use cursor_server::cursor::connect::{
    self, ConnectCode, ConnectError, Encoding, FrameDecoder, WireError,
};
use cursor_server::cursor::proto::agent::{
    AgentClientMessage, agent_client_message, kv_client_message,
};
use cursor_server::cursor::proto::aiserver::{BidiAppendRequest, BidiRequestId, ErrorDetails};
use cursor_server::run::inbox::{Accepted, Inbox, InboxError, MAX_BUFFERED};
use fake_cursor::{FakeCursor, read_transcript};
use fake_provider::{FakeProvider, Reply, text_events};
use fixtures::TestServer;
use prost::Message as _;

const MAX: usize = 1024 * 1024;

fn append_request(request_id: &str, seqno: i64, data: &str) -> Vec<u8> {
    BidiAppendRequest {
        data: data.to_owned(),
        request_id: Some(BidiRequestId {
            request_id: request_id.to_owned(),
        }),
        append_seqno: seqno,
    }
    .encode_to_vec()
}

#[test]
fn envelopes_round_trip_through_the_incremental_decoder() {
    let message = fixtures::run_request("conv", "hello");
    let frame = connect::encode_message(&message);
    assert_eq!(frame[0], 0x00, "data frame flags");
    assert_eq!(
        u32::from_be_bytes([frame[1], frame[2], frame[3], frame[4]]) as usize,
        frame.len() - 5
    );

    let mut stream = frame.to_vec();
    stream.extend_from_slice(&connect::end_stream_ok());
    let mut decoder = FrameDecoder::new(MAX);
    let mut frames = Vec::new();
    for byte in &stream {
        // One byte at a time: frames must survive any chunking.
        decoder.push(std::slice::from_ref(byte));
        while let Some(frame) = decoder.next_frame().expect("valid") {
            frames.push(frame);
        }
    }
    decoder.finish().expect("nothing left over");
    assert_eq!(frames.len(), 2);
    assert_eq!(
        AgentClientMessage::decode(frames[0].payload.as_ref()).expect("decodes"),
        message
    );
    assert!(frames[1].is_end_stream());
    assert_eq!(frames[1].payload.as_ref(), b"{}");
}

#[test]
fn success_end_of_stream_is_exactly_these_bytes() {
    assert_eq!(
        connect::end_stream_ok().as_ref(),
        &[0x02, 0x00, 0x00, 0x00, 0x02, 0x7b, 0x7d]
    );
}

#[test]
fn error_end_of_stream_is_json_with_unpadded_base64_error_details() {
    let error = ConnectError::provider(
        ConnectCode::Unavailable,
        "Provider unavailable",
        "boom: quota",
        true,
    );
    let frame = connect::end_stream_error(&error);
    assert_eq!(frame[0], connect::FLAG_END_STREAM);
    let json: serde_json::Value = serde_json::from_slice(&frame[5..]).expect("JSON payload");
    assert_eq!(json["error"]["code"], "unavailable");
    assert_eq!(json["error"]["message"], "boom: quota");
    let detail = &json["error"]["details"][0];
    assert_eq!(detail["type"], "aiserver.v1.ErrorDetails");
    let value = detail["value"].as_str().expect("string");
    assert!(!value.contains('='));
    let bytes = base64::engine::general_purpose::STANDARD_NO_PAD
        .decode(value)
        .expect("standard alphabet, no padding");
    let details = ErrorDetails::decode(bytes.as_slice()).expect("ErrorDetails");
    assert_eq!(
        details.details.expect("custom").title,
        "Provider unavailable"
    );

    let plain = connect::end_stream_error(&ConnectError::new(ConnectCode::Canceled, "stop"));
    let json: serde_json::Value = serde_json::from_slice(&plain[5..]).expect("JSON");
    assert_eq!(
        json,
        serde_json::json!({"error": {"code": "canceled", "message": "stop"}})
    );
}

#[test]
fn bidi_append_decodes_a_hex_agent_client_message() {
    let body = append_request("req-1", 3, "1a0408011a00");
    let append = bidi_append::decode(&body).expect("valid append");
    assert_eq!(append.request_id, "req-1");
    assert_eq!(append.seqno, 3);
    let Some(agent_client_message::Message::KvClientMessage(kv)) = &append.message.message else {
        panic!("expected kv_client_message, got {:?}", append.message);
    };
    assert_eq!(kv.id, 1);
    assert!(matches!(
        kv.message,
        Some(kv_client_message::Message::SetBlobResult(_))
    ));
    assert!(matches!(
        bidi_append::translate(append.message).expect("translates"),
        ClientInput::KvResult { id: 1, .. }
    ));
}

#[test]
fn unary_bodies_may_be_raw_enveloped_or_gzipped() {
    let raw = append_request("req-1", 0, "1a0408011a00");
    let payload =
        |body: &[u8], encoding| connect::decode_unary_body(body, encoding, MAX).expect("decodes");
    assert_eq!(payload(&raw, Encoding::Identity).as_ref(), raw.as_slice());
    let enveloped = connect::encode_frame(0, &raw);
    assert_eq!(
        payload(&enveloped, Encoding::Identity).as_ref(),
        raw.as_slice()
    );
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&raw).expect("gzip");
    let gzipped = gz.finish().expect("gzip");
    assert_eq!(payload(&gzipped, Encoding::Gzip).as_ref(), raw.as_slice());
    assert!(matches!(
        Encoding::parse(Some("br")),
        Err(WireError::UnsupportedEncoding(e)) if e == "br"
    ));
}

#[test]
fn append_seqno_orders_buffers_gaps_and_drops_duplicates() {
    let mut inbox = Inbox::default();
    assert_eq!(inbox.push(2, "c"), Ok(Accepted::Buffered));
    assert_eq!(inbox.push(1, "b"), Ok(Accepted::Buffered));
    assert_eq!(inbox.push(2, "c-again"), Ok(Accepted::Duplicate("c-again")));
    assert_eq!(inbox.push(0, "a"), Ok(Accepted::Ready(vec!["a", "b", "c"])));
    assert_eq!(inbox.push(1, "b-again"), Ok(Accepted::Duplicate("b-again")));
    assert_eq!(inbox.push(3, "d"), Ok(Accepted::Ready(vec!["d"])));
    assert_eq!(inbox.expected(), 4);
    assert_eq!(inbox.push(-1, "x"), Err(InboxError::Negative(-1)));

    // The window: the MAX_BUFFERED seqnos after the expected one may wait; one past it is
    // handed back to be refused, and the inbox goes on as before.
    let mut flooded = Inbox::default();
    for seqno in 1..=MAX_BUFFERED as i64 {
        assert_eq!(flooded.push(seqno, ()), Ok(Accepted::Buffered));
    }
    for far in [MAX_BUFFERED as i64 + 1, 1 << 62, i64::MAX] {
        assert_eq!(
            flooded.push(far, ()),
            Ok(Accepted::Refused(
                (),
                InboxError::TooFarAhead {
                    seqno: far,
                    expected: 0,
                    window: MAX_BUFFERED
                }
            ))
        );
    }
    assert!(
        matches!(flooded.push(0, ()), Ok(Accepted::Ready(ready)) if ready.len() == MAX_BUFFERED + 1)
    );
    assert!(flooded.drain().is_empty());
    let mut waiting = Inbox::default();
    assert_eq!(waiting.push(50, "late"), Ok(Accepted::Buffered));
    assert_eq!(waiting.drain(), vec![(50, "late")]);
    assert_eq!(waiting.expected(), 0);
}

/// Issue 29 (9): an append far ahead of its run is refused at once with `invalid_argument` naming
/// the seqno expected, and the run goes on; an append still waiting behind a gap when its run
/// ends is answered with the run's ending — never left to a connection reset.
#[tokio::test]
async fn appends_far_ahead_are_refused_at_once_and_waiting_ones_get_the_runs_ending() {
    let provider = FakeProvider::start().await;
    // Slow enough that the run is still streaming when the appends arrive.
    provider.push(Reply::Sse {
        events: text_events(&["a ", "b ", "c ", "d ", "e "], (3, 5, 0)),
        gap: std::time::Duration::from_millis(200),
    });
    let server = TestServer::start(&provider.base_url()).await;
    let cursor = FakeCursor::new(server.addr);
    let sse = cursor.open_run_sse("req-far").await;
    let run = cursor
        .append("req-far", 0, &fixtures::run_request("conv-far", "hi"))
        .await;
    assert_eq!(run.status(), 200);
    for far in [1 << 62, i64::MAX, 1 + MAX_BUFFERED as i64 + 1] {
        let refused = tokio::time::timeout(
            std::time::Duration::from_secs(10),
            cursor.append("req-far", far, &fixtures::heartbeat()),
        )
        .await
        .expect("answered at once, not held");
        assert_eq!(refused.status(), 400, "seqno {far}");
        let body: serde_json::Value = refused.json().await.expect("Connect error JSON");
        assert_eq!(body["code"], "invalid_argument", "{body}");
        let message = body["message"].as_str().unwrap_or_default();
        assert!(
            message.contains(&format!("append_seqno {far}"))
                && message.contains("expects append_seqno 1 next"),
            "{message}"
        );
    }
    let heartbeat = cursor.append("req-far", 1, &fixtures::heartbeat()).await;
    assert_eq!(
        heartbeat.status(),
        200,
        "the run went on after the refusals"
    );
    // 50 past a gap that never fills: held, then answered when the user stops the run. Sent
    // twice: whichever copy arrives second is a duplicate, answered at once, which proves the
    // other is waiting in the inbox.
    let spawn = |cursor: FakeCursor| {
        tokio::spawn(async move { cursor.append("req-far", 51, &fixtures::heartbeat()).await })
    };
    let (mut first, mut second) = (spawn(cursor.clone()), spawn(cursor.clone()));
    let (duplicate, waiting) = tokio::select! {
        answered = &mut first => (answered, second),
        answered = &mut second => (answered, first),
    };
    assert_eq!(duplicate.expect("append task").status(), 200);
    assert!(
        !waiting.is_finished(),
        "the other copy waits behind the gap"
    );
    let cancel = AgentClientMessage {
        message: Some(agent_client_message::Message::ConversationAction(
            cursor_server::cursor::proto::agent::ConversationAction {
                action: Some(
                    cursor_server::cursor::proto::agent::conversation_action::Action::CancelAction(
                        Default::default(),
                    ),
                ),
                ..Default::default()
            },
        )),
    };
    assert_eq!(cursor.append("req-far", 2, &cancel).await.status(), 200);
    let answered = tokio::time::timeout(std::time::Duration::from_secs(10), waiting)
        .await
        .expect("the waiting append is answered when the run ends")
        .expect("append task");
    let body: serde_json::Value = answered.json().await.expect("Connect error JSON");
    assert_eq!(body["code"], "canceled", "{body}");
    let message = body["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("append_seqno 51 was never applied")
            && message.contains("waiting for append_seqno 3"),
        "{message}"
    );
    let transcript = read_transcript(sse).await;
    assert_eq!(transcript.error_code(), Some("canceled"));
}

#[test]
fn malformed_input_is_rejected_with_a_specific_error() {
    // Short frame: header promises 10 bytes, 3 arrive.
    let short = [0u8, 0, 0, 0, 10, 1, 2, 3];
    assert_eq!(
        connect::decode_frames(&short, MAX),
        Err(WireError::ShortFrame { have: 8, need: 15 })
    );
    // Oversized length prefix.
    let huge = [0u8, 0x7f, 0xff, 0xff, 0xff];
    assert_eq!(
        connect::decode_frames(&huge, MAX),
        Err(WireError::FrameTooLarge {
            len: 0x7fff_ffff,
            max: MAX
        })
    );
    // Unknown flag bits.
    assert_eq!(
        connect::decode_frames(&[0x80, 0, 0, 0, 0], MAX),
        Err(WireError::UnknownFlags(0x80))
    );
    // Bad hex.
    assert!(matches!(
        bidi_append::decode(&append_request("r", 0, "zz")),
        Err(BidiAppendError::BadHex(_))
    ));
    // Hex of bytes that are not an AgentClientMessage (a truncated length-delimited field).
    assert!(matches!(
        bidi_append::decode(&append_request("r", 0, "1a05")),
        Err(BidiAppendError::BadMessage(_))
    ));
    // Bytes that are not a BidiAppendRequest.
    assert!(matches!(
        bidi_append::decode(&[0x0a, 0x05, 0x01]),
        Err(BidiAppendError::Wire(WireError::Protobuf { .. }))
    ));
    // Empty request id.
    assert_eq!(
        bidi_append::decode(&append_request("", 0, "1a0408011a00")),
        Err(BidiAppendError::EmptyRequestId)
    );
    assert_eq!(
        bidi_append::decode(&append_request("r", -4, "1a0408011a00")),
        Err(BidiAppendError::NegativeSeqno(-4))
    );
    // A message with no oneof set (a newer client's variant) is not silently accepted: the run
    // logs and ignores it, in its place in the append order.
    assert!(matches!(
        bidi_append::translate(AgentClientMessage::default()),
        Ok(ClientInput::Unknown(_))
    ));
}

#[tokio::test]
async fn malformed_bidi_appends_get_400_with_a_json_reason() {
    let provider = FakeProvider::start().await;
    let server = TestServer::start(&provider.base_url()).await;
    let cursor = FakeCursor::new(server.addr);

    let cases: Vec<(Vec<u8>, &str)> = vec![
        (append_request("r", 0, "not hex!"), "not valid hex"),
        (append_request("r", 0, "1a05"), "AgentClientMessage"),
        (append_request("", 0, "1a0408011a00"), "missing request_id"),
        (vec![0x00, 0x00, 0x00, 0x00, 0x09, 0x01], "truncated frame"),
        (vec![0x0a, 0xff], "BidiAppendRequest"),
    ];
    for (body, reason) in cases {
        let response = cursor.append_body(body, None).await;
        assert_eq!(response.status(), 400, "{reason}");
        let json: serde_json::Value = response.json().await.expect("JSON body");
        assert_eq!(json["code"], "invalid_argument");
        let message = json["message"].as_str().expect("message");
        assert!(
            message.contains(reason),
            "{message:?} should mention {reason:?}"
        );
    }
}

#[tokio::test]
async fn out_of_order_and_duplicate_appends_are_applied_in_seqno_order() {
    let provider = FakeProvider::start().await;
    provider.push(Reply::sse(text_events(&["ordered"], (3, 1, 0))));
    let server = TestServer::start(&provider.base_url()).await;
    let cursor = FakeCursor::new(server.addr);

    let sse = cursor.open_run_sse("req-order").await;
    // seqno 1 arrives first and must wait for 0 (its answer too: an append is answered once
    // applied); a duplicate 0 is dropped.
    let early = cursor.clone();
    let heartbeat = tokio::spawn(async move {
        early
            .append("req-order", 1, &fixtures::heartbeat())
            .await
            .status()
    });
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    assert!(!heartbeat.is_finished(), "seqno 1 is not applied before 0");
    assert!(
        provider.requests().is_empty(),
        "nothing runs before seqno 0"
    );
    let run = cursor
        .append("req-order", 0, &fixtures::run_request("conv-order", "hi"))
        .await;
    assert_eq!(run.status(), 200);
    let duplicate = cursor
        .append("req-order", 0, &fixtures::run_request("conv-order", "hi"))
        .await;
    assert_eq!(duplicate.status(), 200);
    assert_eq!(heartbeat.await.expect("append task"), 200);
    let transcript = read_transcript(sse).await;

    assert!(transcript.is_success(), "{:?}", transcript.end);
    assert_eq!(transcript.text(), "ordered");
    assert_eq!(
        provider.requests().len(),
        1,
        "the duplicate did not start a second call"
    );
}

#[tokio::test]
async fn gzip_bidi_append_bodies_are_accepted() {
    let provider = FakeProvider::start().await;
    provider.push(Reply::sse(text_events(&["zipped"], (3, 1, 0))));
    let server = TestServer::start(&provider.base_url()).await;
    let cursor = FakeCursor::new(server.addr);

    let sse = cursor.open_run_sse("req-gzip").await;
    let message = fixtures::run_request("conv-gzip", "hi");
    let body = append_request("req-gzip", 0, &hex::encode(message.encode_to_vec()));
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&connect::encode_frame(0, &body))
        .expect("gzip");
    let response = cursor
        .append_body(gz.finish().expect("gzip"), Some("gzip"))
        .await;
    assert_eq!(response.status(), 200);
    let transcript = read_transcript(sse).await;
    assert_eq!(transcript.text(), "zipped");
}

#[tokio::test]
async fn a_kv_result_nobody_asked_for_ends_the_run_with_a_protocol_error() {
    let provider = FakeProvider::start().await;
    let server = TestServer::start(&provider.base_url()).await;
    let cursor = FakeCursor::new(server.addr);

    let sse = cursor.open_run_sse("req-unknown-kv").await;
    let kv_result =
        AgentClientMessage::decode(hex::decode("1a0408011a00").expect("hex").as_slice())
            .expect("kv result");
    assert_eq!(
        cursor
            .append("req-unknown-kv", 0, &kv_result)
            .await
            .status(),
        200
    );
    let transcript = read_transcript(sse).await;

    assert_eq!(transcript.error_code(), Some("invalid_argument"));
    let message = transcript.error_message().expect("message");
    assert!(
        message.starts_with("protocol error: ") && message.contains("KV id 1"),
        "{message}"
    );
}

#[tokio::test]
async fn unknown_routes_get_a_connect_error_not_a_hang() {
    let provider = FakeProvider::start().await;
    let server = TestServer::start(&provider.base_url()).await;
    let response = reqwest::Client::new()
        .post(format!(
            "http://{}/aiserver.v1.SomethingElse/Method",
            server.addr
        ))
        .body(Vec::new())
        .send()
        .await
        .expect("request");
    assert_eq!(response.status(), 501);
    let json: serde_json::Value = response.json().await.expect("JSON");
    assert_eq!(json["code"], "unimplemented");
}

#[tokio::test]
async fn the_model_picker_lists_the_configured_models() {
    use cursor_server::cursor::proto::aiserver::{AvailableModelsRequest, AvailableModelsResponse};
    let provider = FakeProvider::start().await;
    let server = TestServer::start(&provider.base_url()).await;
    let response = reqwest::Client::new()
        .post(format!(
            "http://{}/aiserver.v1.AiService/AvailableModels",
            server.addr
        ))
        .header("content-type", "application/proto")
        .header("connect-protocol-version", "1")
        .body(AvailableModelsRequest::default().encode_to_vec())
        .send()
        .await
        .expect("request");
    assert_eq!(response.status(), 200);
    let body = response.bytes().await.expect("body");
    let models = AvailableModelsResponse::decode(body.as_ref()).expect("AvailableModelsResponse");
    assert_eq!(models.model_names, [fixtures::MODEL]);
    let model = &models.models[0];
    assert_eq!(model.name, fixtures::MODEL);
    assert_eq!(model.client_display_name.as_deref(), Some("Test Model"));
    assert_eq!(model.supports_agent, Some(true));
    assert_eq!(model.supports_thinking, Some(true));
    assert_eq!(model.is_user_added, Some(true));
    assert_eq!(model.context_token_limit, Some(128_000));
    assert_eq!(
        models
            .composer_model_config
            .map(|c| c.default_model)
            .as_deref(),
        Some(fixtures::MODEL)
    );
}

/// Every accepted connection of this process listening on `server`: the server's ends, found
/// through `/proc/self/fd` (the server runs in this test process).
fn accepted_sockets(
    server: std::net::SocketAddr,
) -> Vec<std::mem::ManuallyDrop<std::net::TcpStream>> {
    use std::os::fd::FromRawFd as _;
    let mut sockets = Vec::new();
    for entry in std::fs::read_dir("/proc/self/fd").expect("/proc/self/fd") {
        let entry = entry.expect("fd entry");
        let is_socket = std::fs::read_link(entry.path())
            .is_ok_and(|target| target.to_string_lossy().starts_with("socket:"));
        let Some(fd) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        if !is_socket {
            continue;
        }
        // Borrowed, never closed: ManuallyDrop keeps the fd open when this goes out of scope.
        // SAFETY: `fd` is an open socket of this process for the whole test; it is only queried.
        let socket = std::mem::ManuallyDrop::new(unsafe { std::net::TcpStream::from_raw_fd(fd) });
        if socket.local_addr().ok() == Some(server) && socket.peer_addr().is_ok() {
            sockets.push(socket);
        }
    }
    sockets
}

#[tokio::test]
async fn every_accepted_connection_sends_its_frames_without_delay() {
    let provider = FakeProvider::start().await;
    provider.push(Reply::sse(text_events(&["fast"], (3, 1, 0))));
    let server = TestServer::start(&provider.base_url()).await;
    let cursor = FakeCursor::new(server.addr);
    // An HTTP/2 `Run` turn and an HTTP/1.1 request: both clients keep their connection open.
    let (uplink, response) = cursor.open_run_h2("req-nodelay").await;
    uplink
        .send(fixtures::run_request("conv-nodelay", "hi"))
        .await
        .expect("send");
    let transcript = read_transcript(response).await;
    assert!(transcript.is_success(), "{:?}", transcript.end);
    assert_eq!(
        cursor.append_body(vec![0x0a, 0xff], None).await.status(),
        400
    );

    let sockets = accepted_sockets(server.addr);
    assert!(
        sockets.len() >= 2,
        "found {} accepted sockets",
        sockets.len()
    );
    for socket in &sockets {
        // Without TCP_NODELAY a small frame written while the previous one is unacknowledged
        // waits for the client's delayed ACK: 40 ms between turn_ended and the end of stream.
        assert!(
            socket.nodelay().unwrap_or(true),
            "an accepted connection from {:?} runs with Nagle's algorithm",
            socket.peer_addr()
        );
    }
    drop(uplink);
}

#[tokio::test]
async fn a_blob_ack_buffered_behind_a_gap_before_turn_ended_is_applied_when_the_gap_fills() {
    let provider = FakeProvider::start().await;
    provider.push(Reply::sse(fake_provider::tool_call_events(
        None,
        &[("call_1", "Read", r#"{"path":"a.txt"}"#)],
        (10, 2, 0),
    )));
    provider.push(Reply::sse(text_events(&["read it"], (12, 2, 0))));
    // A lost ACK would only be noticed by a resend far beyond the test's patience.
    let server = TestServer::start_in(
        &provider.base_url(),
        tempfile::tempdir().expect("tempdir"),
        "kv_retry_after_ms = 600000\ncheckpoint_ack_timeout_ms = 600000",
    )
    .await;
    let cursor = FakeCursor::new(server.addr);
    let mut session = fake_cursor::Session::start(
        &cursor,
        "req-gap",
        &fixtures::run_request_with_env("conv-gap", "read a"),
    )
    .await;
    session.withhold_acks = true;
    let exec = session.next_exec().await;
    assert!(
        session.withheld.len() >= 2,
        "two blobs were sent before the exec: {:?}",
        session.withheld
    );
    let (_, first) = session.withheld.remove(0);
    let (_, second) = session.withheld.remove(0);
    // The IDE's concurrent appends: the second ACK overtakes the first, and the exec result
    // overtakes both. The run buffers the second ACK behind the gap, then the loop ends.
    let s = session.seqno();
    // Sent first; answered only once applied, i.e. once the gap before it fills.
    let overtaking = session.send_at_concurrently(s + 2, &fixtures::kv_ack(second));
    tokio::task::yield_now().await;
    session
        .send_at(
            s,
            &fixtures::exec_result(exec.id, fixtures::read_success("a.txt", "ay")),
        )
        .await;
    while let Some(message) = session.next().await {
        if fake_cursor::kind(&message) == "turn_ended" {
            break;
        }
    }
    // The first ACK arrives only after turn_ended and fills the gap: both count.
    session.send_at(s + 1, &fixtures::kv_ack(first)).await;
    assert_eq!(overtaking.await.expect("append task"), 200);
    session.release_acks().await;
    let transcript = session.finish().await;

    assert!(transcript.is_success(), "{:?}", transcript.end);
    assert!(
        !transcript.checkpoints().is_empty(),
        "the final checkpoint is published"
    );
    let mut sets = std::collections::HashSet::new();
    for message in &transcript.messages {
        if let Some(
            cursor_server::cursor::proto::agent::agent_server_message::Message::KvServerMessage(kv),
        ) = &message.message
            && let Some(
                cursor_server::cursor::proto::agent::kv_server_message::Message::SetBlobArgs(set),
            ) = &kv.message
        {
            assert!(sets.insert(set.blob_id.clone()), "a blob was sent twice");
        }
    }
}

#[tokio::test]
async fn a_decodable_append_the_run_cannot_use_takes_its_seqno_instead_of_a_400() {
    let provider = FakeProvider::start().await;
    provider.push(Reply::sse(text_events(&["still here"], (3, 1, 0))));
    let server = TestServer::start(&provider.base_url()).await;
    let cursor = FakeCursor::new(server.addr);

    // A newer client's message variant (no oneof this schema knows) at seqno 1: accepted, logged
    // and ignored; every later append (the ACKs at 2, 3, ...) is applied.
    let mut session = fake_cursor::Session::start(
        &cursor,
        "req-unknown-variant",
        &fixtures::run_request("conv-unknown-variant", "hi"),
    )
    .await;
    session.send(&AgentClientMessage::default()).await;
    let transcript = session.finish().await;
    assert!(transcript.is_success(), "{:?}", transcript.end);
    assert_eq!(transcript.text(), "still here");
    assert!(
        !transcript.checkpoints().is_empty(),
        "the ACKs after it counted"
    );
}

#[tokio::test]
async fn an_exec_message_without_a_result_ends_the_run_with_invalid_argument() {
    use cursor_server::cursor::proto::agent::ExecClientMessage;
    let provider = FakeProvider::start().await;
    provider.push(Reply::sse(fake_provider::tool_call_events(
        None,
        &[("call_1", "Read", r#"{"path":"a.txt"}"#)],
        (10, 2, 0),
    )));
    let server = TestServer::start(&provider.base_url()).await;
    let cursor = FakeCursor::new(server.addr);
    let mut session = fake_cursor::Session::start(
        &cursor,
        "req-empty-exec",
        &fixtures::run_request_with_env("conv-empty-exec", "read a"),
    )
    .await;
    let exec = session.next_exec().await;
    let empty = AgentClientMessage {
        message: Some(agent_client_message::Message::ExecClientMessage(
            ExecClientMessage {
                id: exec.id,
                ..ExecClientMessage::default()
            },
        )),
    };
    // Accepted on the wire (it decodes); the run answers it in its place in the order.
    session.send(&empty).await;
    let transcript = session.finish().await;
    assert_eq!(transcript.error_code(), Some("invalid_argument"));
    let message = transcript.error_message().expect("message");
    assert!(message.starts_with("protocol error: "), "{message}");
}
