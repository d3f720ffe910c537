//! The drift detector's cost on the hot path (`ops/drift.rs`): the time `observe` adds to each client
//! message, which must stay under 1 µs for the messages a turn is made of.
//!
//! `cargo bench --bench drift` prints, per message, its size and the time per `observe` call (median of 11
//! rounds of 20,000 calls). Under `cargo test` it runs one call of each as a smoke test.

use std::hint::black_box;
use std::time::Instant;

use cursor_server::cursor::proto::agent::{
    self as pb, AgentClientMessage, agent_client_message, conversation_action,
};
use cursor_server::ops::drift;
use prost::Message as _;

fn run_request(text: &str) -> AgentClientMessage {
    AgentClientMessage {
        message: Some(agent_client_message::Message::RunRequest(
            pb::AgentRunRequest {
                conversation_id: Some("conv-1".into()),
                action: Some(pb::ConversationAction {
                    action: Some(conversation_action::Action::UserMessageAction(
                        pb::UserMessageAction {
                            user_message: Some(pb::UserMessage {
                                text: text.into(),
                                message_id: "msg-1".into(),
                                ..Default::default()
                            }),
                            request_context: Some(pb::RequestContext::default()),
                            ..Default::default()
                        },
                    )),
                    ..Default::default()
                }),
                requested_model: Some(pb::RequestedModel {
                    model_id: "gpt".into(),
                    ..Default::default()
                }),
                ..Default::default()
            },
        )),
    }
}

fn main() {
    let benching = std::env::args().any(|a| a == "--bench");
    let (rounds, calls) = if benching { (11, 20_000) } else { (1, 1) };
    let mut unknown = AgentClientMessage {
        message: Some(agent_client_message::Message::ClientHeartbeat(
            Default::default(),
        )),
    }
    .encode_to_vec();
    unknown.extend_from_slice(&[0xF8, 0xF0, 0x04, 0x01]);
    let cases: Vec<(&str, Vec<u8>)> = vec![
        (
            "heartbeat",
            AgentClientMessage {
                message: Some(agent_client_message::Message::ClientHeartbeat(
                    Default::default(),
                )),
            }
            .encode_to_vec(),
        ),
        ("user message", run_request("say hello").encode_to_vec()),
        (
            "user message, 64 KiB text",
            run_request(&"x".repeat(64 << 10)).encode_to_vec(),
        ),
        ("with an unknown field (seen)", unknown),
    ];
    println!(
        "{:<32} {:>8} {:>12}",
        "client message", "bytes", "ns/observe"
    );
    for (name, bytes) in &cases {
        let mut times: Vec<f64> = (0..rounds)
            .map(|_| {
                let start = Instant::now();
                for _ in 0..calls {
                    drift::observe(black_box(bytes), Some("bench"));
                }
                start.elapsed().as_nanos() as f64 / f64::from(calls)
            })
            .collect();
        times.sort_by(f64::total_cmp);
        println!(
            "{name:<32} {:>8} {:>12.0}",
            bytes.len(),
            times[times.len() / 2]
        );
    }
}
