//! The debugger in front of a real cursor-server (its upstream) with the fake provider, driven by the
//! fake Cursor client on both transports: the turn completes as it does without the debugger, every
//! frame is recorded and decoded under its request id, and bad input or a dead upstream is shown, not
//! fatal.

#[path = "../../cursor-server/tests/support/browser.rs"]
mod browser;
#[path = "../../cursor-server/tests/support/fake_cursor.rs"]
mod fake_cursor;
#[path = "../../cursor-server/tests/support/fake_provider.rs"]
mod fake_provider;
#[path = "../../cursor-server/tests/support/fixtures.rs"]
mod fixtures;

use std::path::PathBuf;
use std::time::Duration;

use cursor_backend::schema::Schema;
use cursor_backend::{Debugger, Options};
use cursor_server::cursor::proto::agent::exec_server_message as args;
use fake_cursor::{FakeCursor, Session, Transcript, read_transcript};
use fake_provider::{FakeProvider, Reply, text_events, tool_call_events};
use fixtures::{TestServer, exec_result, read_success, run_request, run_request_with_env};
use serde_json::Value;

/// The schema the tests decode with: the one this build used (`CURSOR_PROTO_DIR` or `CURSOR_APP_DIR`),
/// else Cursor's standard install places.
fn schema() -> Schema {
    let named = std::env::var_os("CURSOR_PROTO_DIR").or_else(|| std::env::var_os("CURSOR_APP_DIR"));
    Schema::load(named.as_deref().map(std::path::Path::new)).expect("a Cursor schema for the tests")
}

async fn debugger(upstream: &str, db: PathBuf) -> Debugger {
    debugger_trusting(upstream, None, db).await
}

async fn debugger_trusting(upstream: &str, upstream_ca: Option<PathBuf>, db: PathBuf) -> Debugger {
    Debugger::start(Options {
        listen: "127.0.0.1:0".parse().expect("addr"),
        ui: "127.0.0.1:0".parse().expect("addr"),
        upstream: upstream.to_owned(),
        upstream_ca,
        db,
        schema: Some(schema()),
    })
    .await
    .expect("debugger starts")
}

struct Rig {
    provider: FakeProvider,
    server: TestServer,
    debugger: Debugger,
    /// Talks to cursor-server through the debugger.
    cursor: FakeCursor,
    /// Talks to cursor-server directly.
    direct: FakeCursor,
    http: reqwest::Client,
    _dir: tempfile::TempDir,
}

impl Rig {
    async fn new(replies: Vec<Vec<String>>) -> Rig {
        let provider = FakeProvider::start().await;
        for events in replies {
            provider.push(Reply::sse(events));
        }
        let server = TestServer::start(&provider.base_url()).await;
        let dir = tempfile::tempdir().expect("tempdir");
        let debugger = debugger(
            &format!("http://{}", server.addr),
            dir.path().join("captures.db"),
        )
        .await;
        Rig {
            cursor: FakeCursor::new(debugger.proxy_addr),
            direct: FakeCursor::new(server.addr),
            provider,
            server,
            debugger,
            http: reqwest::Client::new(),
            _dir: dir,
        }
    }

    fn ui(&self, path: &str) -> String {
        format!("http://{}{path}", self.debugger.ui_addr)
    }

    async fn get_text(&self, path: &str) -> String {
        let response = self
            .http
            .get(self.ui(path))
            .send()
            .await
            .expect("UI request");
        assert_eq!(response.status(), 200, "{path}");
        response.text().await.expect("text")
    }

    async fn get_json(&self, path: &str) -> Value {
        serde_json::from_str(&self.get_text(path).await).expect("JSON")
    }

    /// The run's frames once every exchange of it has ended and all that passed is recorded. The
    /// proxy reports a body's end as it sees it, a moment after the client read the last byte.
    async fn frames(&self, request_id: &str) -> Vec<Value> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            self.debugger.flush().await;
            let exchanges = self.get_json(&format!("/api/requests/{request_id}")).await;
            let open = exchanges
                .as_array()
                .expect("exchanges")
                .iter()
                .any(|e| e["duration_ms"].is_null());
            if !open {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "exchanges still open: {exchanges:#}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let frames = self
            .get_json(&format!("/api/requests/{request_id}/frames"))
            .await;
        frames.as_array().expect("frames").clone()
    }
}

fn types<'a>(frames: &'a [Value], direction: &str) -> Vec<&'a str> {
    frames
        .iter()
        .filter(|f| f["direction"] == direction)
        .map(|f| f["type"].as_str().expect("type"))
        .collect()
}

fn undecoded(frames: &[Value]) -> Vec<&Value> {
    frames
        .iter()
        .filter(|f| f["kind"] == "undecoded" || !f["error"].is_null())
        .collect()
}

/// A Read tool turn over RunSSE + BidiAppend, answered like the IDE does.
async fn read_turn(cursor: &FakeCursor, request_id: &str, conversation: &str) -> Transcript {
    let mut session = Session::start(
        cursor,
        request_id,
        &run_request_with_env(conversation, "what does main do?"),
    )
    .await;
    let exec = session.next_exec().await;
    let Some(args::Message::ReadArgs(read)) = &exec.message else {
        panic!("expected read_args, got {exec:?}");
    };
    assert_eq!(read.path, "src/main.rs");
    session
        .send(&exec_result(
            exec.id,
            read_success("src/main.rs", "fn main() {\n    println!(\"hello\");\n}\n"),
        ))
        .await;
    session.finish().await
}

fn read_script() -> Vec<Vec<String>> {
    vec![
        tool_call_events(
            Some("look first"),
            &[("call_r1", "Read", r#"{"path":"src/main.rs"}"#)],
            (100, 10, 0),
        ),
        text_events(&["It prints ", "hello."], (150, 5, 100)),
    ]
}

#[tokio::test]
async fn an_ide_turn_through_the_debugger_is_unchanged_and_every_frame_is_decoded_under_its_request_id()
 {
    let mut script = read_script();
    script.extend(read_script());
    let rig = Rig::new(script).await;

    let direct = read_turn(&rig.direct, "req-direct", "conv-direct").await;
    let captured = read_turn(&rig.cursor, "req-captured", "conv-captured").await;

    // The client's turn is the same with and without the debugger in between.
    assert!(captured.is_success(), "{:?}", captured.end);
    assert_eq!(captured.kinds_merged(), direct.kinds_merged());
    // Every other frame is there as often (KV requests and checkpoints, whose place among the
    // others depends on when the client's ACKs arrive).
    let others = |t: &Transcript| {
        let deltas = [
            "text_delta",
            "thinking_delta",
            "partial_tool_call",
            "token_delta",
        ];
        let mut kinds: Vec<_> = (t.all_kinds().into_iter())
            .filter(|k| !deltas.contains(k))
            .collect();
        kinds.sort_unstable();
        kinds
    };
    assert_eq!(others(&captured), others(&direct));
    assert_eq!(captured.text(), "It prints hello.");
    assert_eq!(captured.end, direct.end);
    assert_eq!(
        rig.provider.requests().len(),
        4,
        "each turn reached the provider twice"
    );

    let frames = rig.frames("req-captured").await;
    assert!(undecoded(&frames).is_empty(), "{:#?}", undecoded(&frames));
    // Every downlink message and the end of stream, in order.
    let server = types(&frames, "server");
    let downlink: Vec<&str> = frames
        .iter()
        .filter(|f| f["direction"] == "server" && f["route"] == "/agent.v1.AgentService/RunSSE")
        .map(|f| f["type"].as_str().expect("type"))
        .collect();
    assert_eq!(downlink.len(), captured.messages.len() + 1);
    assert_eq!(downlink.last(), Some(&"end_stream"));
    for expected in [
        "interaction_update.text_delta",
        "interaction_update.tool_call_started",
        "exec_server_message.read_args",
        "kv_server_message.set_blob_args",
        "conversation_checkpoint_update",
        "interaction_update.turn_ended",
    ] {
        assert!(
            server.contains(&expected),
            "{expected} missing in {server:?}"
        );
    }
    // The uplink: BidiAppend's hex opened into the AgentClientMessage it carries.
    let client = types(&frames, "client");
    assert_eq!(
        client.first(),
        Some(&"BidiRequestId"),
        "RunSSE's own request comes first"
    );
    for expected in [
        "run_request",
        "exec_client_message.read_result",
        "kv_client_message.set_blob_result",
    ] {
        assert!(
            client.contains(&expected),
            "{expected} missing in {client:?}"
        );
    }
    let text: String = frames
        .iter()
        .filter(|f| f["type"] == "interaction_update.text_delta")
        .map(|f| {
            f["json"]["interaction_update"]["text_delta"]["text"]
                .as_str()
                .expect("text")
        })
        .collect();
    assert_eq!(text, "It prints hello.");
    let read_args = frames
        .iter()
        .find(|f| f["type"] == "exec_server_message.read_args")
        .expect("read_args");
    assert_eq!(
        read_args["json"]["exec_server_message"]["read_args"]["path"],
        "src/main.rs"
    );
    let append = frames
        .iter()
        .find(|f| f["type"] == "run_request")
        .expect("run_request");
    assert_eq!(
        append["json"]["data"]["run_request"]["conversation_id"],
        "conv-captured"
    );
    assert_eq!(
        append["json"]["append_seqno"],
        Value::Null,
        "seqno 0 is proto3's default"
    );

    // Grouped: RunSSE and each BidiAppend under the request id, with the conversation.
    let listed = rig.get_json("/api/requests").await;
    let run = listed
        .as_array()
        .expect("requests")
        .iter()
        .find(|r| r["request_id"] == "req-captured")
        .expect("the run is listed");
    assert_eq!(run["route"], "/agent.v1.AgentService/RunSSE");
    assert_eq!(run["conversation_id"], "conv-captured");
    assert_eq!(run["outcome"], "ok");
    assert_eq!(run["status"], 200);
    let appends = client.len() - 1;
    assert_eq!(run["exchanges"], appends as u64 + 1);
    assert_eq!(run["frames"], frames.len() as u64);

    // Search by any id finds the run: the tool call, the conversation, a blob id (hex).
    let started = frames
        .iter()
        .find(|f| f["type"] == "interaction_update.tool_call_started")
        .expect("tool_call_started");
    let call_id = started["json"]["interaction_update"]["tool_call_started"]["call_id"]
        .as_str()
        .expect("call id")
        .to_owned();
    // A run found by an id one of its exchanges carries is listed whole.
    let by_conversation = rig.get_json("/api/requests?q=conv-captured").await;
    assert_eq!(by_conversation[0]["route"], "/agent.v1.AgentService/RunSSE");
    assert_eq!(by_conversation[0]["frames"], frames.len() as u64);
    for id in [call_id.as_str(), "conv-captured"] {
        let found = rig.get_json(&format!("/api/requests?q={id}")).await;
        let ids: Vec<&str> = found
            .as_array()
            .expect("list")
            .iter()
            .map(|r| r["request_id"].as_str().expect("id"))
            .collect();
        assert_eq!(ids, ["req-captured"], "search {id}");
    }
    let blob = frames
        .iter()
        .find(|f| f["type"] == "kv_server_message.set_blob_args")
        .expect("set_blob_args");
    let blob_b64 = blob["json"]["kv_server_message"]["set_blob_args"]["blob_id"]
        .as_str()
        .expect("blob id");
    use base64::Engine as _;
    let blob_hex = hex::encode(
        base64::engine::general_purpose::STANDARD
            .decode(blob_b64)
            .expect("base64"),
    );
    let found = rig.get_json(&format!("/api/requests?q={blob_hex}")).await;
    assert_eq!(found[0]["request_id"], "req-captured");

    // Each id of a frame is indexed once (a BidiAppend's too: the message it carries is in its JSON).
    let db = sqlx::SqlitePool::connect(&format!(
        "sqlite://{}",
        rig._dir.path().join("captures.db").display()
    ))
    .await
    .expect("captures.db");
    let repeated: Vec<(i64, String, String)> = sqlx::query_as(
        "SELECT frame_id, kind, value FROM frame_ids GROUP BY frame_id, kind, value HAVING COUNT(*) > 1",
    )
    .fetch_all(&db)
    .await
    .expect("query");
    assert!(repeated.is_empty(), "{repeated:?}");
    let appended: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM frame_ids i JOIN frames f ON f.id = i.frame_id
         WHERE f.type = 'exec_client_message.read_result' AND i.kind = 'exec_id'",
    )
    .fetch_one(&db)
    .await
    .expect("query");
    assert_eq!(appended, 1, "the read result's exec id");

    // The pages and the export.
    let page = rig.get_text("/").await;
    assert!(
        page.contains("req-captured") && page.contains("conv-captured"),
        "{page}"
    );
    let timeline = rig.get_text("/requests/req-captured").await;
    assert!(
        timeline.contains("interaction_update.text_delta") && timeline.contains("Export JSONL")
    );
    let export = rig
        .http
        .get(rig.ui("/requests/req-captured/export.jsonl"))
        .send()
        .await
        .expect("export");
    assert_eq!(export.headers()["content-type"], "application/x-ndjson");
    let lines: Vec<Value> = export
        .text()
        .await
        .expect("jsonl")
        .lines()
        .map(|l| serde_json::from_str(l).expect("each line is JSON"))
        .collect();
    assert_eq!(lines.len(), appends + 1 + frames.len());
    assert_eq!(
        lines.iter().filter(|l| l["record"] == "frame").count(),
        frames.len()
    );
    let missing = rig
        .http
        .get(rig.ui("/api/requests/no-such-run/frames"))
        .send()
        .await
        .expect("404");
    assert_eq!(missing.status(), 404);
    drop(rig.server);
}

#[tokio::test]
async fn a_cli_turn_over_http2_is_captured_under_its_request_id_with_the_uplink_decoded() {
    let rig = Rig::new(vec![
        text_events(&["Hi ", "CLI"], (50, 3, 0)),
        text_events(&["Hi ", "CLI"], (50, 3, 0)),
    ])
    .await;
    let mut transcripts = Vec::new();
    for (cursor, request_id) in [(&rig.direct, "req-h2-direct"), (&rig.cursor, "req-h2")] {
        let (uplink, response) = cursor.open_run_h2(request_id).await;
        assert_eq!(response.version(), reqwest::Version::HTTP_2);
        uplink.send(fixtures::heartbeat()).await.expect("send");
        uplink
            .send(run_request(
                &format!("conv-{request_id}"),
                "hello from the CLI",
            ))
            .await
            .expect("send");
        transcripts.push(read_transcript(response).await);
        drop(uplink);
    }
    let (direct, captured) = (&transcripts[0], &transcripts[1]);
    assert!(captured.is_success(), "{:?}", captured.end);
    assert_eq!(captured.text(), "Hi CLI");
    assert_eq!(captured.kinds_merged(), direct.kinds_merged());

    let frames = rig.frames("req-h2").await;
    assert!(undecoded(&frames).is_empty(), "{:#?}", undecoded(&frames));
    let client = types(&frames, "client");
    assert_eq!(client[..2], ["client_heartbeat", "run_request"]);
    let server = types(&frames, "server");
    assert_eq!(server.len(), captured.messages.len() + 1);
    assert!(
        server.contains(&"interaction_update.turn_ended"),
        "{server:?}"
    );
    assert_eq!(server.last(), Some(&"end_stream"));
    let exchanges = rig.get_json("/api/requests/req-h2").await;
    assert_eq!(exchanges.as_array().expect("exchanges").len(), 1);
    assert_eq!(exchanges[0]["http_version"], "HTTP/2.0");
    assert_eq!(exchanges[0]["outcome"], "ok");
    // The CLI never half-closes its request stream; its end after the response is not an error.
    assert_eq!(exchanges[0]["error"], Value::Null);
    let listed = rig.get_json("/api/requests?q=conv-req-h2").await;
    assert_eq!(listed[0]["request_id"], "req-h2");
}

#[tokio::test]
async fn malformed_frames_are_kept_raw_with_the_reason_and_the_proxy_goes_on() {
    let rig = Rig::new(vec![text_events(&["still here"], (10, 2, 0))]).await;

    // A BidiAppend whose data is not hex: forwarded, refused by the server, recorded with the reason.
    let bad = cursor_server::cursor::proto::aiserver::BidiAppendRequest {
        data: "zz-not-hex".to_owned(),
        request_id: Some(cursor_server::cursor::proto::aiserver::BidiRequestId {
            request_id: "req-bad-hex".to_owned(),
        }),
        append_seqno: 0,
    };
    use prost::Message as _;
    let refused = rig.cursor.append_body(bad.encode_to_vec(), None).await;
    assert_eq!(refused.status(), 400);
    let frames = rig.frames("req-bad-hex").await;
    let uplink = frames
        .iter()
        .find(|f| f["direction"] == "client")
        .expect("the append");
    assert_eq!(uplink["kind"], "undecoded");
    assert!(
        uplink["error"]
            .as_str()
            .expect("reason")
            .contains("not hex"),
        "{uplink:#}"
    );
    assert_eq!(
        uplink["json"]["data"], "zz-not-hex",
        "the outer message is still shown"
    );
    assert_eq!(uplink["raw_hex"], hex::encode(bad.encode_to_vec()));
    let answer = frames
        .iter()
        .find(|f| f["direction"] == "server")
        .expect("the refusal");
    assert_eq!(answer["type"], "error.invalid_argument");

    // A RunSSE body whose envelope claims 4 GiB: the bytes are kept and the reason given.
    let garbage = rig
        .http
        .post(format!(
            "http://{}/agent.v1.AgentService/RunSSE",
            rig.debugger.proxy_addr
        ))
        .header("content-type", "application/connect+proto")
        .header("x-request-id", "req-garbage")
        .body(vec![0u8, 0xff, 0xff, 0xff, 0xff, 1, 2, 3])
        .send()
        .await
        .expect("answered");
    let _ = garbage.bytes().await;
    let frames = rig.frames("req-garbage").await;
    let raw = frames
        .iter()
        .find(|f| f["direction"] == "client")
        .expect("kept");
    assert_eq!(raw["kind"], "undecoded");
    assert_eq!(raw["raw_hex"], "00ffffffff010203");
    assert!(
        raw["error"].as_str().expect("reason").contains("claims"),
        "{raw:#}"
    );

    // The proxy still carries a whole turn afterwards.
    let transcript = read_transcript({
        let sse = rig.cursor.open_run_sse("req-after").await;
        let accepted = rig
            .cursor
            .append("req-after", 0, &run_request("conv-after", "hi"))
            .await;
        assert_eq!(accepted.status(), 200);
        sse
    })
    .await;
    assert_eq!(transcript.text(), "still here");
}

#[tokio::test]
async fn an_unreachable_upstream_is_a_connect_error_to_cursor_and_a_recorded_failure() {
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.local_addr().expect("addr")
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let debugger = debugger(&format!("http://{closed}"), dir.path().join("captures.db")).await;
    let cursor = FakeCursor::new(debugger.proxy_addr);

    // A stream gets an end-of-stream error, as Cursor expects on a stream.
    let transcript = read_transcript(cursor.open_run_sse("req-nowhere").await).await;
    assert_eq!(transcript.error_code(), Some("unavailable"));
    assert!(
        transcript
            .error_message()
            .expect("message")
            .contains("unreachable"),
        "{:?}",
        transcript.end
    );
    // A unary call gets a 502 with a Connect error body.
    let unary = cursor
        .append("req-nowhere", 0, &run_request("c", "hi"))
        .await;
    assert_eq!(unary.status(), 502);
    let body: Value = unary.json().await.expect("JSON error");
    assert_eq!(body["code"], "unavailable");

    debugger.flush().await;
    let http = reqwest::Client::new();
    let listed: Value = http
        .get(format!("http://{}/api/requests", debugger.ui_addr))
        .send()
        .await
        .expect("list")
        .json()
        .await
        .expect("JSON");
    let run = &listed[0];
    assert_eq!(run["request_id"], "req-nowhere");
    assert_eq!(run["outcome"], "unavailable");
    assert!(
        run["error"]
            .as_str()
            .expect("error")
            .contains(&closed.to_string()),
        "{run:#}"
    );
    debugger.shutdown().await;
}

#[tokio::test]
async fn credentials_reach_the_upstream_unchanged_and_are_redacted_in_the_capture() {
    let provider = FakeProvider::start().await;
    provider.push(Reply::sse(text_events(&["ok"], (1, 1, 0))));
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("captures.db");
    let debugger = debugger(&format!("http://{}", provider.addr), db.clone()).await;
    let response = reqwest::Client::new()
        .post(format!(
            "http://{}/v1/chat/completions",
            debugger.proxy_addr
        ))
        .header("authorization", "Bearer sk-very-secret-42")
        .header("cookie", "session=cookie-secret-43")
        .header("x-cursor-checksum", "machine-checksum-44")
        .header("x-request-id", "req-secret")
        .json(&serde_json::json!({"model": "m", "stream": true, "messages": []}))
        .send()
        .await
        .expect("forwarded");
    assert_eq!(response.status(), 200);
    assert!(response.text().await.expect("SSE").contains("\"ok\""));
    assert_eq!(provider.authorizations(), ["Bearer sk-very-secret-42"]);
    assert_eq!(
        provider.headers()[0]["x-cursor-checksum"],
        "machine-checksum-44"
    );
    assert_eq!(provider.headers()[0]["cookie"], "session=cookie-secret-43");

    debugger.flush().await;
    let exchanges: Value = reqwest::get(format!(
        "http://{}/api/requests/req-secret",
        debugger.ui_addr
    ))
    .await
    .expect("exchanges")
    .json()
    .await
    .expect("JSON");
    let headers = exchanges[0]["request_headers"].to_string();
    assert!(headers.contains("Bearer [redacted]"), "{headers}");
    debugger.shutdown().await;
    let mut stored = Vec::new();
    for entry in std::fs::read_dir(dir.path()).expect("dir") {
        stored.extend(std::fs::read(entry.expect("entry").path()).expect("read"));
    }
    let stored = String::from_utf8_lossy(&stored);
    for secret in [
        "sk-very-secret-42",
        "cookie-secret-43",
        "machine-checksum-44",
    ] {
        assert!(!stored.contains(secret), "{secret} stored");
    }
}

#[tokio::test]
async fn diff_names_what_one_run_sent_and_the_other_did_not() {
    let mut script = vec![
        text_events(&["Hello"], (10, 2, 0)),
        text_events(&["Hello"], (10, 2, 0)),
    ];
    script.extend(read_script());
    let rig = Rig::new(script).await;
    for (request_id, conversation) in [("req-text-a", "conv-a"), ("req-text-b", "conv-b")] {
        let transcript = Session::start(&rig.cursor, request_id, &run_request(conversation, "hi"))
            .await
            .finish()
            .await;
        assert!(transcript.is_success());
    }
    let tools = read_turn(&rig.cursor, "req-tools", "conv-tools").await;
    assert!(tools.is_success());
    for id in ["req-text-a", "req-text-b", "req-tools"] {
        rig.frames(id).await;
    }
    let db = rig._dir.path().join("captures.db");
    let run = |a: &str, b: &str| {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_cursor-backend"))
            .args(["diff", "--db"])
            .arg(&db)
            .args([a, b])
            .output()
            .expect("diff runs");
        (
            output.status.code(),
            String::from_utf8_lossy(&output.stdout).into_owned(),
        )
    };
    let (code, same) = run("req-text-a", "req-text-a");
    assert_eq!(code, Some(0), "a run against itself: {same}");
    assert!(same.contains("no differences"), "{same}");
    // Two runs of one script send the same frames in the same order (a timing field such as
    // step_duration_ms may be 0, so unset, in one of them: that is reported, and is a real difference
    // on the wire).
    let (_, twins) = run("req-text-a", "req-text-b");
    assert!(
        !twins.contains("(only in") && !twins.contains("out of order"),
        "{twins}"
    );
    let (code, report) = run("req-text-a", &format!("{}#req-tools", db.display()));
    assert_eq!(code, Some(1), "{report}");
    assert!(
        report.contains("exec_server_message.read_args (only in B)"),
        "{report}"
    );
    assert!(
        report.contains("exec_client_message.read_result (only in B)"),
        "{report}"
    );
    let (code, missing) = run("req-text-a", "no-such-run");
    assert_eq!(code, Some(2), "{missing}");
}

#[tokio::test]
async fn unary_bodies_raw_enveloped_and_gzipped_decode_alike() {
    use prost::Message as _;
    use std::io::Write as _;
    let rig = Rig::new(vec![text_events(&["one"], (5, 1, 0))]).await;
    let sse = rig.cursor.open_run_sse("req-unary").await;
    let append = |seqno: i64, message: &cursor_server::cursor::proto::agent::AgentClientMessage| {
        cursor_server::cursor::proto::aiserver::BidiAppendRequest {
            data: hex::encode(message.encode_to_vec()),
            request_id: Some(cursor_server::cursor::proto::aiserver::BidiRequestId {
                request_id: "req-unary".to_owned(),
            }),
            append_seqno: seqno,
        }
        .encode_to_vec()
    };
    // seqno 0 raw and gzipped, seqno 1 in an envelope: the run takes the first of each seqno.
    let raw = append(0, &run_request("conv-unary", "hi"));
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&append(1, &fixtures::heartbeat()))
        .expect("gzip");
    let gzipped = gz.finish().expect("gzip");
    let mut enveloped = vec![0u8];
    let heartbeat = append(2, &fixtures::heartbeat());
    enveloped.extend_from_slice(&(heartbeat.len() as u32).to_be_bytes());
    enveloped.extend_from_slice(&heartbeat);
    assert_eq!(rig.cursor.append_body(raw, None).await.status(), 200);
    assert_eq!(
        rig.cursor.append_body(gzipped, Some("gzip")).await.status(),
        200
    );
    assert_eq!(rig.cursor.append_body(enveloped, None).await.status(), 200);
    let transcript = read_transcript(sse).await;
    assert_eq!(transcript.text(), "one");

    let frames = rig.frames("req-unary").await;
    assert!(undecoded(&frames).is_empty(), "{:#?}", undecoded(&frames));
    let uplink: Vec<(&str, Value)> = frames
        .iter()
        .filter(|f| {
            f["route"] == "/aiserver.v1.BidiService/BidiAppend" && f["direction"] == "client"
        })
        .map(|f| {
            (
                f["type"].as_str().expect("type"),
                f["json"]["append_seqno"].clone(),
            )
        })
        .collect();
    assert_eq!(
        uplink[..3],
        [
            ("run_request", Value::Null),
            ("client_heartbeat", Value::from(1)),
            ("client_heartbeat", Value::from(2)),
        ]
    );
}

/// A TLS front for cursor-server, as Cursor's backend is reached: it terminates TLS (ALPN `h2` or
/// `http/1.1`) and relays the bytes to the server's plain port, which tells HTTP/1.1 from h2c itself.
/// Returns its address and the protocol each connection negotiated.
async fn tls_front(
    server: std::net::SocketAddr,
    certified: &rcgen::CertifiedKey<rcgen::KeyPair>,
) -> (
    std::net::SocketAddr,
    std::sync::Arc<std::sync::Mutex<Vec<String>>>,
) {
    use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(
        certified.signing_key.serialize_der(),
    ));
    let provider = std::sync::Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_no_client_auth()
        .with_single_cert(
            vec![CertificateDer::from(certified.cert.der().to_vec())],
            key,
        )
        .expect("server certificate");
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let negotiated = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = negotiated.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let (acceptor, seen) = (acceptor.clone(), seen.clone());
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(stream).await else {
                    return;
                };
                let protocol = tls
                    .get_ref()
                    .1
                    .alpn_protocol()
                    .map(|p| String::from_utf8_lossy(p).into_owned());
                seen.lock()
                    .expect("lock")
                    .push(protocol.unwrap_or_default());
                if let Ok(mut plain) = tokio::net::TcpStream::connect(server).await {
                    let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
                }
            });
        }
    });
    (addr, negotiated)
}

#[tokio::test]
async fn a_tls_upstream_is_reached_in_the_clients_http_version_and_verified() {
    let provider = FakeProvider::start().await;
    provider.push(Reply::sse(text_events(&["over ", "TLS"], (5, 2, 0))));
    provider.push(Reply::sse(text_events(&["h2 ", "TLS"], (5, 2, 0))));
    let server = TestServer::start(&provider.base_url()).await;
    let certified =
        rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).expect("certificate");
    let (front, negotiated) = tls_front(server.addr, &certified).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = dir.path().join("upstream-ca.pem");
    std::fs::write(&ca, certified.cert.pem()).expect("CA written");
    let upstream = format!("https://localhost:{}", front.port());
    let trusting = debugger_trusting(&upstream, Some(ca), dir.path().join("captures.db")).await;
    let cursor = FakeCursor::new(trusting.proxy_addr);

    // The IDE's HTTP/1.1 transport goes out as HTTP/1.1 over TLS ...
    let transcript = Session::start(&cursor, "req-tls-sse", &run_request("conv-tls", "hi"))
        .await
        .finish()
        .await;
    assert!(transcript.is_success(), "{:?}", transcript.end);
    assert_eq!(transcript.text(), "over TLS");
    // ... and the CLI's HTTP/2 stream as HTTP/2, chosen by ALPN.
    let (uplink, response) = cursor.open_run_h2("req-tls-h2").await;
    uplink
        .send(run_request("conv-tls-h2", "hi"))
        .await
        .expect("send");
    let transcript = read_transcript(response).await;
    drop(uplink);
    assert_eq!(transcript.text(), "h2 TLS");
    let protocols = negotiated.lock().expect("lock").clone();
    // HTTP/1.1 offers no ALPN (TLS servers take that as HTTP/1.1); h2 asks for it.
    assert!(protocols.iter().any(String::is_empty), "{protocols:?}");
    assert!(protocols.iter().any(|p| p == "h2"), "{protocols:?}");
    trusting.flush().await;

    // Without the upstream's CA the certificate is refused, and that is what Cursor is told.
    let untrusting = debugger(&upstream, dir.path().join("other.db")).await;
    let refused = read_transcript(
        FakeCursor::new(untrusting.proxy_addr)
            .open_run_sse("req-untrusted")
            .await,
    )
    .await;
    assert_eq!(refused.error_code(), Some("unavailable"));
    let message = refused.error_message().expect("message").to_lowercase();
    assert!(message.contains("certificate"), "{message}");
    untrusting.shutdown().await;
    trusting.shutdown().await;
}

#[tokio::test]
async fn an_end_of_stream_error_is_recorded_with_its_error_details_decoded() {
    let rig = Rig::new(vec![]).await;
    rig.provider.push(Reply::Status {
        status: 400,
        body: r#"{"error":{"message":"model not found: nope"}}"#.to_owned(),
    });
    let transcript = Session::start(
        &rig.cursor,
        "req-failing",
        &run_request("conv-failing", "hi"),
    )
    .await
    .finish()
    .await;
    let code = transcript.error_code().expect("an error").to_owned();

    let frames = rig.frames("req-failing").await;
    let end = frames.last().expect("frames");
    assert_eq!(end["kind"], "end_stream");
    assert_eq!(end["type"], format!("end_stream.error.{code}"));
    let detail = &end["json"]["error"]["details"][0];
    assert_eq!(detail["type"], "aiserver.v1.ErrorDetails");
    let kind = detail["debug"]["error"]
        .as_str()
        .expect("ErrorDetails.error");
    assert!(kind.starts_with("ERROR_"), "{detail:#}");
    let text = detail["debug"]["details"]["detail"]
        .as_str()
        .expect("the provider's text");
    assert!(text.contains("model not found"), "{text}");
    let listed = rig.get_json("/api/requests?q=req-failing").await;
    assert_eq!(listed[0]["outcome"], code.as_str());
}

#[test]
fn the_schema_from_a_cursor_bundle_decodes_as_the_schema_directory_does() {
    let shared = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/reference");
    let from_dir = Schema::load(Some(&shared.join("proto"))).expect("schema directory");
    let from_bundle = Schema::load(Some(&shared.join("bundles/legacy/main.js"))).expect("bundle");
    let json = serde_json::json!({"exec_server_message": {"id": 4, "read_args": {"path": "a.rs"}}});
    for schema in [&from_dir, &from_bundle] {
        for route in [
            "/agent.v1.AgentService/Run",
            "/agent.v1.AgentService/RunSSE",
            "/aiserver.v1.BidiService/BidiAppend",
            "/aiserver.v1.AiService/AvailableModels",
        ] {
            assert!(
                schema.method(route).is_some(),
                "{route} in {}",
                schema.origin
            );
        }
        let message = schema
            .message("agent.v1.AgentServerMessage")
            .expect("AgentServerMessage");
        let bytes = cursor_backend::schema::encode_json(&message, &json).expect("encodes");
        let decoded = cursor_backend::schema::decode(&message, &bytes).expect("decodes");
        assert_eq!(decoded.type_path, "exec_server_message.read_args");
        assert_eq!(decoded.json, json);
        assert!(decoded.unknown.is_empty());
    }
    // A field this schema does not know (a newer Cursor) is named by number, never dropped silently.
    let message = from_dir
        .message("agent.v1.AgentServerMessage")
        .expect("AgentServerMessage");
    let mut bytes = cursor_backend::schema::encode_json(&message, &json).expect("encodes");
    bytes.extend([0xf8, 0xff, 0x03, 0x01]); // field 8191, varint 1
    let decoded = cursor_backend::schema::decode(&message, &bytes).expect("decodes");
    assert_eq!(decoded.unknown, ["#8191"]);
}

/// Polls the browser's page source until it holds `text` (bounded; the page changes by itself).
async fn page_shows(browser: &browser::Browser, text: &str) -> bool {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while tokio::time::Instant::now() < deadline {
        if browser
            .client
            .source()
            .await
            .expect("source")
            .contains(text)
        {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

#[tokio::test]
async fn in_a_real_browser_runs_appear_live_open_into_their_frames_and_search_finds_them() {
    let Some(browser) = browser::Browser::start().await else {
        return;
    };
    let rig = Rig::new(vec![
        text_events(&["first ", "answer"], (5, 2, 0)),
        text_events(&["second ", "answer"], (5, 2, 0)),
    ])
    .await;
    let first = Session::start(&rig.cursor, "req-ui-1", &run_request("conv-ui-1", "hi"))
        .await
        .finish()
        .await;
    assert!(first.is_success());
    rig.frames("req-ui-1").await;

    browser.open(&rig.ui("/"), "capture-requests").await;
    assert!(page_shows(&browser, "req-ui-1").await);
    // A run made while the page is open appears on it without a reload by the reader.
    let second = Session::start(&rig.cursor, "req-ui-2", &run_request("conv-ui-2", "hi"))
        .await
        .finish()
        .await;
    assert!(second.is_success());
    assert!(
        page_shows(&browser, "req-ui-2").await,
        "the live list did not update"
    );

    // The run's timeline: both directions, JSON to expand. (The list may be reloading itself as
    // the last batches land: the link is looked up again until the click takes.)
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let link = browser
            .client
            .find(fantoccini::Locator::Css("a[href='/requests/req-ui-1']"))
            .await;
        if let Ok(link) = link
            && link.click().await.is_ok()
            && page_shows(&browser, "interaction_update.text_delta").await
        {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the run's link never took"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(browser.client.current_url().await.expect("url").path() == "/requests/req-ui-1");
    let errors = browser.console_errors().await;
    assert!(errors.is_empty(), "{errors:#?}");
    assert!(browser.count("td.client").await >= 1 && browser.count("td.server").await >= 1);
    assert_eq!(browser.count("details[open]").await, 0);
    let text_row = browser
        .client
        .find(fantoccini::Locator::XPath(
            "//tr[td/code[text()='interaction_update.text_delta']]//details/summary",
        ))
        .await
        .expect("a text delta's JSON");
    text_row.click().await.expect("expand");
    assert_eq!(browser.count("details[open]").await, 1);
    let shown = browser
        .text_of(fantoccini::Locator::Css("details[open] pre"))
        .await;
    assert!(shown.contains("\"text_delta\""), "{shown}");
    browser.screenshot("capture-timeline").await;

    // Search by the conversation id through the form.
    browser.open(&rig.ui("/"), "capture-search").await;
    browser
        .client
        .form(fantoccini::Locator::Css("form"))
        .await
        .expect("the search form")
        .set_by_name("q", "conv-ui-2")
        .await
        .expect("typed")
        .submit()
        .await
        .expect("submitted");
    assert!(page_shows(&browser, "Runs with id").await);
    let source = browser.client.source().await.expect("source");
    assert!(
        source.contains("req-ui-2") && !source.contains("req-ui-1"),
        "{source}"
    );
    browser.close().await;
}
