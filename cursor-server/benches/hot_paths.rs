//! Bench binary for the per-event and per-checkpoint hot paths, as history grows.
//!
//! `cargo bench --bench hot_paths` prints, for conversations of 10, 100 and 1,000 messages:
//! - the time to add one step and build the next checkpoint (step + turn + state blobs) and the
//!   bytes of new blobs it sends — both must stay flat as history grows;
//! - at turn 300: one checkpoint's encoding (the state names every root and turn), a run
//!   start's fold of the whole history beside the fold kept from the last run start, continued,
//!   and decoding a BidiAppend as large as that turn's run request (hex of the 34 KB state);
//! - a provider read's time per chunk: 256 chunks decoded as server-sent events, parsed by the
//!   Chat parser and their deltas merged (independent of history by construction);
//! - the projection time of a full provider request (O(history), once per provider call);
//! - the key choice of a provider with 1, 2, 16 and 64 keys (O(keys), once per call attempt;
//!   nothing per streamed event): take the least-loaded key and give it back;
//! - over real sockets, a real server and the test suite's fake provider: the time from
//!   `turn_ended` to the end of stream of an HTTP/2 `Run` turn (40 ms when the accepted socket
//!   runs with Nagle's algorithm and the client delays its ACKs; about 1 ms with TCP_NODELAY).
//!
//! - routing a run's model through a 30-model table of aliases and patterns (once per run start);
//! - over real sockets, the time from a `run_request` to the first text of a new conversation
//!   (the run's start: one write transaction, then the provider call), and the cost per chunk of
//!   a provider streaming 50,000 text deltas as fast as it can;
//! - over real sockets, time to first token of HTTP/2 `Run` turns on a server without `[auth]` and
//!   on one with tokens and every budget limit set (identity, run admission, conversation claim,
//!   the budget check before the call and the charge after it): p50 and p99 of each.
//!
//! Under `cargo test` it runs one quick iteration of each as a smoke test.

#[path = "../tests/support/fake_cursor.rs"]
mod fake_cursor;
#[path = "../tests/support/fake_provider.rs"]
mod fake_provider;
#[path = "../tests/support/fixtures.rs"]
mod fixtures;

use std::hint::black_box;
use std::time::{Duration, Instant};

use cursor_server::client::bidi_append;
use cursor_server::config::KeyCooldown;
use cursor_server::config::{ModelConfig, Quirks};
use cursor_server::cursor::proto::agent::{self as pb, conversation_step};
use cursor_server::cursor::proto::aiserver;
use cursor_server::model::message::{AssistantMessage, CanonicalMessage, Origin, UserMessage};
use cursor_server::prompting::compiler::{RequestParameters, compile};
use cursor_server::provider::Batch;
use cursor_server::provider::StreamParser;
use cursor_server::provider::keys::KeyPool;
use cursor_server::provider::openai_chat;
use cursor_server::provider::openai_chat::ChatStreamParser;
use cursor_server::provider::sse::SseDecoder;
use cursor_server::sync::checkpoint::{ConversationGraph, StateDetails, roots};
use cursor_server::sync::projection::{self, Base};

fn graph_with_history(messages: usize) -> ConversationGraph {
    let mut graph = ConversationGraph::default();
    graph.push_root(&roots::system("system prompt"));
    for i in 0..messages {
        graph.push_root(&roots::user(&format!(
            "message {i} with some realistic length of text"
        )));
        if i % 10 == 0 {
            graph.begin_turn(&format!("req-{i}"), &pb::UserMessage::default(), 0);
            graph.close_turn(pb::StepTiming::default());
        }
    }
    graph.begin_turn("req-now", &pb::UserMessage::default(), 0);
    graph
}

fn history(messages: usize) -> Vec<CanonicalMessage> {
    (0..messages)
        .map(|i| {
            if i % 2 == 0 {
                CanonicalMessage::User(UserMessage {
                    images: Vec::new(),
                    shown_as: None,
                    origin: Origin::User,
                    text: format!("question {i} with some realistic length of text"),
                    client_message_id: String::new(),
                    mode: None,
                    runtime: None,
                    state_before: None,
                })
            } else {
                CanonicalMessage::Assistant(AssistantMessage {
                    text: format!("answer {i} with a few more words than the question had"),
                    thinking: String::new(),
                    model_id: "m".into(),
                    replay: None,
                    model_call_id: format!("mc{i}"),
                    planned_calls: Vec::new(),
                    thinking_spans: Vec::new(),
                })
            }
        })
        .collect()
}

fn time<F: FnMut()>(iterations: u32, mut f: F) -> Duration {
    let start = Instant::now();
    for _ in 0..iterations {
        f();
    }
    start.elapsed() / iterations
}

fn main() {
    let benching = std::env::args().any(|a| a == "--bench");
    let iterations = if benching { 2_000 } else { 1 };
    let model = ModelConfig {
        id: "m".into(),
        upstream_id: "m".into(),
        display_name: "m".into(),
        context_window: 128_000,
        reasoning: false,
        max_output_tokens: None,
        thinking_budget: None,
        vision: false,
        quirks: Quirks {
            stream_usage: true,
            reasoning_content_on_tool_calls: false,
            extra_body: Default::default(),
        },
        pricing: None,
        aliases: Vec::new(),
        fallbacks: Vec::new(),
        context_fallback: None,
    };
    println!(
        "{:>8} {:>16} {:>14} {:>18} {:>18}",
        "messages", "checkpoint (µs)", "new bytes", "projection (µs)", "re-project (µs)"
    );
    for size in [10, 100, 1_000] {
        let base = graph_with_history(size);
        let mut new_bytes = 0;
        let per_checkpoint = time(iterations, || {
            let mut graph = base.clone();
            let step = graph.push_step(conversation_step::Message::AssistantMessage(
                pb::AssistantMessage {
                    text: "a step".into(),
                },
            ));
            let turn = graph.turn_blob().expect("turn");
            let (_, state, _) = graph.state(Some(&turn), &StateDetails::default());
            new_bytes = step.data.len() + turn.data.len() + state.data.len();
            black_box(state);
        });
        let messages = history(size);
        let no_images = cursor_server::prompting::images::ImageSet::default();
        let projection = time(iterations.min(200), || {
            black_box(openai_chat::request_body(&compile(
                "system prompt",
                &messages,
                &model,
                &[],
                RequestParameters::default(),
                &no_images,
            )));
        });
        // A run's start: the whole graph projected from stored history.
        let rows: Vec<(String, CanonicalMessage)> = messages
            .iter()
            .enumerate()
            .map(|(i, m)| (format!("req-{}", i / 2), m.clone()))
            .collect();
        let reproject = time(iterations.min(200), || {
            let rows = rows.iter().map(|(r, m)| (r.as_str(), m));
            black_box(projection::project(Base::default(), Vec::new(), rows));
        });
        println!(
            "{size:>8} {:>16.2} {new_bytes:>14} {:>18.2} {:>18.2}",
            per_checkpoint.as_secs_f64() * 1e6,
            projection.as_secs_f64() * 1e6,
            reproject.as_secs_f64() * 1e6
        );
    }
    turn_300(iterations);
    // One read from a provider that streams fast: 256 chunks as an OpenAI-compatible server
    // sends them, decoded as server-sent events, parsed, and their deltas merged.
    let one = r#"data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1700000000,"model":"m","choices":[{"index":0,"delta":{"content":"token "},"finish_reason":null}]}"#;
    let read = format!("{one}\n\n").repeat(256);
    let mut parser = ChatStreamParser::new("bench");
    let mut decoder = SseDecoder::default();
    let per_read = time(iterations, || {
        decoder.push(read.as_bytes());
        let mut batch = Batch::new(64 * 1024);
        while decoder.advance().expect("event") {
            let event = decoder.event();
            parser
                .feed(event.event, event.data, &mut batch)
                .expect("chunk");
        }
        black_box(batch);
    });
    let per_decode = time(iterations, || {
        decoder.push(read.as_bytes());
        while decoder.advance().expect("event") {
            black_box(decoder.event());
        }
    });
    println!(
        "provider read (SSE, chat parser, merge): {:.3} µs per chunk, of which SSE decoding {:.3} µs",
        per_read.as_secs_f64() * 1e6 / 256.0,
        per_decode.as_secs_f64() * 1e6 / 256.0
    );
    route_per_run_start(iterations * 10);
    for keys in [1, 2, 16, 64] {
        let provider = cursor_server::config::ProviderConfig {
            name: "bench".into(),
            kind: cursor_server::config::ProviderKind::OpenAiChat,
            base_url: "http://127.0.0.1:9/v1".into(),
            keys: (0..keys)
                .map(|i| cursor_server::config::ProviderKey {
                    secret: cursor_server::config::Secret::from(format!("k{i}")),
                    env: None,
                })
                .collect(),
            models: Vec::new(),
            route: cursor_server::config::Route::Direct { local: true },
        };
        let pool = KeyPool::new(&provider, KeyCooldown::default());
        // Half the keys busy, so the choice compares loads rather than taking the first.
        let _busy: Vec<_> = (0..keys / 2).filter_map(|_| pool.acquire_free()).collect();
        let per_choice = time(iterations * 10, || {
            black_box(pool.acquire_free().expect("a free key"));
        });
        println!(
            "key choice, {keys:>2} keys: {:.3} µs per call attempt",
            per_choice.as_secs_f64() * 1e6
        );
    }
    let turns = if benching { 200 } else { 2 };
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let (mut starts, mut tails) = runtime.block_on(turn_tails(turns));
    let at = |list: &mut Vec<Duration>, q: f64| {
        list.sort();
        list[((list.len() - 1) as f64 * q).round() as usize].as_secs_f64() * 1e3
    };
    println!(
        "HTTP/2 Run, run start (run_request -> first text, a new conversation each) over {turns} runs: p50 {:.2} ms, p99 {:.2} ms",
        at(&mut starts, 0.5),
        at(&mut starts, 0.99)
    );
    println!(
        "HTTP/2 Run, turn_ended -> end of stream over {turns} turns: p50 {:.2} ms, p99 {:.2} ms",
        at(&mut tails, 0.5),
        at(&mut tails, 0.99)
    );
    let chunks = if benching { 50_000 } else { 100 };
    let per_chunk = runtime.block_on(streamed_chunks(chunks));
    println!(
        "HTTP/2 Run, {chunks} unpaced text chunks through the server: {:.2} µs per chunk (wall, client and fake provider in the same process)",
        per_chunk.as_secs_f64() * 1e6 / chunks as f64
    );
    let turns = if benching { 300 } else { 2 };
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let mut plain = runtime.block_on(first_tokens(turns, false));
    let mut shared = runtime.block_on(first_tokens(turns, true));
    plain.sort();
    shared.sort();
    let q =
        |v: &[Duration], q: f64| v[((v.len() - 1) as f64 * q).round() as usize].as_secs_f64() * 1e3;
    println!(
        "HTTP/2 Run, time to first token over {turns} turns: without [auth] p50 {:.2} ms, p99 {:.2} ms; with tokens and budgets p50 {:.2} ms, p99 {:.2} ms",
        q(&plain, 0.5),
        q(&plain, 0.99),
        q(&shared, 0.5),
        q(&shared, 0.99)
    );
    if !benching {
        // Under `cargo test` this binary is a smoke test; say so in the plain summary form.
        println!("smoke: 1 passed, 0 failed");
    }
}

/// A conversation at turn 300 (a user message and a one-step answer per turn): the cost of one
/// checkpoint (the turn's structure and the state naming every root and turn, encoded and hashed,
/// then encoded again as the `conversation_checkpoint_update`), and of a run start's fold: the whole
/// history folded, or the fold kept from the last run start continued over the new turn.
fn turn_300(iterations: u32) {
    use prost::Message as _;
    let turns = 300;
    let rows: Vec<(String, CanonicalMessage)> = history(turns * 2)
        .into_iter()
        .enumerate()
        .map(|(i, m)| (format!("req-{}", i / 2), m))
        .collect();
    let mut base = ConversationGraph::default();
    base.push_root(&roots::system("system prompt"));
    let fold = |rows: &[(String, CanonicalMessage)]| {
        projection::project(
            Base {
                graph: base.clone(),
                covers: 0,
            },
            Vec::new(),
            rows.iter().map(|(r, m)| (r.as_str(), m)),
        )
        .0
    };
    let at_300 = fold(&rows);
    let mut state_bytes = 0;
    let per_checkpoint = time(iterations, || {
        let graph = at_300.graph();
        let turn = graph.turn_blob().expect("turn");
        let (state, blob, _) = graph.state(Some(&turn), &StateDetails::default());
        state_bytes = blob.data.len();
        black_box(state.update_message().encode_to_vec());
    });
    let whole = time(iterations.min(200), || {
        black_box(fold(&rows));
    });
    let earlier = fold(&rows[..rows.len() - 2]);
    let continued = time(iterations.min(200), || {
        let mut projection = earlier.clone();
        assert!(projection.continue_with(Vec::new()));
        let mut out = projection::NewBlobs::default();
        for (request_id, message) in &rows[rows.len() - 2..] {
            projection.apply(request_id, message, &mut out);
        }
        black_box(projection);
    });
    println!(
        "turn {turns}: checkpoint encoding {:.1} µs ({state_bytes} state bytes); run start fold: whole history {:.1} µs, continued over the new turn {:.1} µs",
        per_checkpoint.as_secs_f64() * 1e6,
        whole.as_secs_f64() * 1e6,
        continued.as_secs_f64() * 1e6
    );
    // A BidiAppend as large as a turn-300 run request (which carries the conversation's state):
    // the state blob, sent back as a KV answer.
    let graph = at_300.graph();
    let (_, blob, _) = graph.state(graph.turn_blob().as_ref(), &StateDetails::default());
    let message = pb::AgentClientMessage {
        message: Some(pb::agent_client_message::Message::KvClientMessage(
            pb::KvClientMessage {
                id: 1,
                message: Some(pb::kv_client_message::Message::GetBlobResult(
                    pb::GetBlobResult {
                        blob_data: Some(blob.data.to_vec()),
                    },
                )),
            },
        )),
    };
    let append = aiserver::BidiAppendRequest {
        data: hex::encode(message.encode_to_vec()),
        request_id: Some(aiserver::BidiRequestId {
            request_id: "r".into(),
        }),
        append_seqno: 0,
    }
    .encode_to_vec();
    let decode = time(iterations.min(500), || {
        black_box(bidi_append::decode(&append).expect("decodes"));
    });
    println!(
        "turn {turns}: a BidiAppend carrying the state ({} bytes) decodes in {:.1} µs",
        append.len(),
        decode.as_secs_f64() * 1e6
    );
}

/// Routing a run's model (once per run start): 30 models with 3 aliases each (one a pattern), a
/// catch-all, models per mode and subagent type; names that hit an exact id, a pattern near the end
/// of the table, Auto in a mode, and the catch-all.
fn route_per_run_start(iterations: u32) {
    use cursor_server::config::{Config, RouteRequest};
    use cursor_server::model::conversation::Mode;
    let mut text = String::from(
        "default_model = \"m0\"\n[[providers]]\nname = \"p\"\nkind = \"openai-chat\"\nbase_url = \"http://127.0.0.1:9/v1\"\napi_key = \"k\"\n",
    );
    for i in 0..30 {
        let catch_all = if i == 29 { ", \"*\"" } else { "" };
        text.push_str(&format!(
            "[[providers.models]]\nid = \"m{i}\"\naliases = [\"alias-{i}\", \"cursor-{i}-x\", \"family-{i}-*\"{catch_all}]\nfallbacks = [\"m{}\"]\n",
            (i + 1) % 30
        ));
    }
    text = text.replace("fallbacks = [\"m0\"]", "fallbacks = []");
    text.push_str("[modes]\nplan = \"m3\"\n[subagents]\nexplore = \"m4\"\n");
    let config = Config::from_toml(&text, std::path::Path::new("bench.toml"), &|_| None)
        .expect("bench config");
    for (label, name, mode, subagent) in [
        ("exact id", "m17", Mode::Agent, None),
        (
            "pattern near the end",
            "family-28-pro-high",
            Mode::Agent,
            None,
        ),
        ("Auto in a mode", "default", Mode::Plan, None),
        (
            "alias for a subagent",
            "cursor-9-x",
            Mode::Agent,
            Some("explore"),
        ),
        ("catch-all", "unheard-of", Mode::Agent, None),
    ] {
        let per_route = time(iterations, || {
            black_box(config.route(RouteRequest {
                name,
                mode,
                subagent,
            }))
            .expect("routed");
        });
        println!(
            "routing ({label}): {:.3} µs per run start",
            per_route.as_secs_f64() * 1e6
        );
    }
}

/// For each of `turns` HTTP/2 `Run` turns (one after another, a fresh connection each): the time
/// from the `turn_ended` frame to the end-of-stream frame, as the client reads them.
/// Run starts and turn ends over real sockets: for each turn, the time from sending the
/// `run_request` to the first text update (the run's start: its record, the user's message and
/// first blobs committed, the provider called), and from `turn_ended` to the end of stream.
async fn turn_tails(turns: usize) -> (Vec<Duration>, Vec<Duration>) {
    use cursor_server::cursor::connect::FrameDecoder;
    use futures_util::StreamExt as _;
    use prost::Message as _;

    let provider = fake_provider::FakeProvider::start().await;
    for _ in 0..turns {
        provider.push(fake_provider::Reply::sse(fake_provider::text_events(
            &["a short ", "answer"],
            (5, 2, 0),
        )));
    }
    let server = fixtures::TestServer::start(&provider.base_url()).await;
    let mut tails = Vec::with_capacity(turns);
    let mut starts = Vec::with_capacity(turns);
    for turn in 0..turns {
        let cursor = fake_cursor::FakeCursor::new(server.addr);
        let (uplink, response) = cursor.open_run_h2(&format!("bench-{turn}")).await;
        let sent = Instant::now();
        let mut first_text = None;
        uplink
            .send(fixtures::run_request(&format!("bench-conv-{turn}"), "hi"))
            .await
            .expect("send");
        let mut body = response.bytes_stream();
        let mut decoder = FrameDecoder::new(1 << 24);
        let mut turn_ended = None;
        'read: while let Some(chunk) = body.next().await {
            decoder.push(&chunk.expect("read"));
            while let Some(frame) = decoder.next_frame().expect("frame") {
                if frame.is_end_stream() {
                    let since = turn_ended.expect("turn_ended before the end");
                    tails.push(Instant::now().duration_since(since));
                    break 'read;
                }
                let message =
                    pb::AgentServerMessage::decode(frame.payload.as_ref()).expect("message");
                match &message.message {
                    // The client stores every blob, as Cursor does: the checkpoints are not held.
                    Some(pb::agent_server_message::Message::KvServerMessage(kv)) => {
                        uplink.send(fixtures::kv_ack(kv.id)).await.expect("ack")
                    }
                    _ if fake_cursor::kind(&message) == "turn_ended" => {
                        turn_ended = Some(Instant::now());
                    }
                    _ if fake_cursor::kind(&message) == "text_delta" && first_text.is_none() => {
                        first_text = Some(Instant::now());
                        starts.push(Instant::now().duration_since(sent));
                    }
                    _ => {}
                }
            }
        }
        drop(uplink);
    }
    server.stop().await;
    (starts, tails)
}

/// One run whose provider streams `chunks` text deltas as fast as it can: the wall time from the
/// first text update to `turn_ended`, the server's per-chunk cost plus what the in-process client
/// and provider spend.
async fn streamed_chunks(chunks: usize) -> Duration {
    use cursor_server::cursor::connect::FrameDecoder;
    use futures_util::StreamExt as _;
    use prost::Message as _;

    let provider = fake_provider::FakeProvider::start().await;
    let parts: Vec<String> = (0..chunks).map(|i| format!("t{i} ")).collect();
    let parts: Vec<&str> = parts.iter().map(String::as_str).collect();
    // Unpaced: the provider sends the next chunk at once (`Reply::sse` waits 1 ms between).
    provider.push(fake_provider::Reply::Sse {
        events: fake_provider::text_events(&parts, (5, chunks as u64, 0)),
        gap: Duration::ZERO,
    });
    let server = fixtures::TestServer::start(&provider.base_url()).await;
    let cursor = fake_cursor::FakeCursor::new(server.addr);
    let (uplink, response) = cursor.open_run_h2("bench-chunks").await;
    uplink
        .send(fixtures::run_request("bench-chunks", "stream"))
        .await
        .expect("send");
    let mut body = response.bytes_stream();
    let mut decoder = FrameDecoder::new(1 << 24);
    let (mut first, mut took) = (None, Duration::ZERO);
    'read: while let Some(chunk) = body.next().await {
        decoder.push(&chunk.expect("read"));
        while let Some(frame) = decoder.next_frame().expect("frame") {
            if frame.is_end_stream() {
                break 'read;
            }
            let message = pb::AgentServerMessage::decode(frame.payload.as_ref()).expect("message");
            match &message.message {
                Some(pb::agent_server_message::Message::KvServerMessage(kv)) => {
                    uplink.send(fixtures::kv_ack(kv.id)).await.expect("ack")
                }
                _ if fake_cursor::kind(&message) == "text_delta" && first.is_none() => {
                    first = Some(Instant::now());
                }
                _ if fake_cursor::kind(&message) == "turn_ended" => {
                    took = first.expect("text before turn_ended").elapsed();
                }
                _ => {}
            }
        }
    }
    drop(uplink);
    server.stop().await;
    took
}

/// Time from sending a run request to the first text delta, over `turns` HTTP/2 `Run` turns each
/// in its own conversation; with `auth`, as a person with a token and every budget limit set.
async fn first_tokens(turns: usize, auth: bool) -> Vec<Duration> {
    use cursor_server::auth::admin::{self, UsersAction};
    use cursor_server::cursor::connect::FrameDecoder;
    use futures_util::StreamExt as _;
    use prost::Message as _;

    let provider = fake_provider::FakeProvider::start().await;
    for _ in 0..turns {
        provider.push(fake_provider::Reply::sse(fake_provider::text_events(
            &["a short ", "answer"],
            (5, 2, 0),
        )));
    }
    let limits = "\n[providers.models.pricing]\ninput = 1.0\noutput = 1.0\n\n[auth]\nmode = \"tokens\"\n\
        [[teams]]\nname = \"t\"\nmembers = [\"a@example.com\"]\nmodels = [\"test-*\"]\n\
        daily_cost_usd = 1000.0\nmonthly_cost_usd = 10000.0\ndaily_tokens = 100000000\n\
        soft_daily_cost_usd = 900.0\nrequests_per_minute = 1000000\nconcurrent_runs = 1000\n";
    let server = fixtures::TestServer::start_edited(&provider.base_url(), "openai-chat", |text| {
        if auth {
            format!("{text}{limits}")
        } else {
            text
        }
    })
    .await;
    let cursor = if auth {
        let store = fixtures::open_store(&server.db_dir.path().join("test.db")).await;
        let add = UsersAction::Add {
            email: "a@example.com".to_owned(),
        };
        let printed = admin::run(&store, add).await.expect("users add");
        store.close().await;
        let token = printed.lines().last().expect("token").to_owned();
        fake_cursor::FakeCursor::with_headers(server.addr, &[("x-cursor-byok-token", &token)])
    } else {
        fake_cursor::FakeCursor::new(server.addr)
    };
    let mut firsts = Vec::with_capacity(turns);
    for turn in 0..turns {
        let (uplink, response) = cursor.open_run_h2(&format!("ttft-{turn}")).await;
        let sent = Instant::now();
        uplink
            .send(fixtures::run_request(&format!("ttft-conv-{turn}"), "hi"))
            .await
            .expect("send");
        let mut body = response.bytes_stream();
        let mut decoder = FrameDecoder::new(1 << 24);
        let mut first = None;
        'read: while let Some(chunk) = body.next().await {
            decoder.push(&chunk.expect("read"));
            while let Some(frame) = decoder.next_frame().expect("frame") {
                if frame.is_end_stream() {
                    break 'read;
                }
                let message =
                    pb::AgentServerMessage::decode(frame.payload.as_ref()).expect("message");
                match &message.message {
                    Some(pb::agent_server_message::Message::KvServerMessage(kv)) => {
                        uplink.send(fixtures::kv_ack(kv.id)).await.expect("ack")
                    }
                    _ if fake_cursor::kind(&message) == "text_delta" && first.is_none() => {
                        first = Some(sent.elapsed());
                    }
                    _ => {}
                }
            }
        }
        firsts.push(first.expect("a text delta"));
        drop(uplink);
    }
    server.stop().await;
    firsts
}
