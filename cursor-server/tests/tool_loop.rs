//! LLM → tool → LLM: the fake provider asks for tools, the fake Cursor client executes them through
//! the real exec protocol, and the next provider request carries the calls and their results.

#[path = "support/fake_cursor.rs"]
mod fake_cursor;
#[path = "support/fake_provider.rs"]
mod fake_provider;
#[path = "support/fixtures.rs"]
mod fixtures;

use cursor_server::cursor::proto::agent::{
    self as pb, exec_client_message as result, exec_server_message as args, interaction_update,
    tool_call,
};
use fake_cursor::{FakeCursor, Session, Transcript};
use fake_provider::{FakeProvider, Reply, text_events, tool_call_events};
use fixtures::{TestServer, exec_result, read_success, run_request_with_env};
use serde_json::Value;

struct Harness {
    provider: FakeProvider,
    _server: TestServer,
    cursor: FakeCursor,
}

impl Harness {
    async fn new(replies: Vec<Vec<String>>) -> Harness {
        let provider = FakeProvider::start().await;
        for events in replies {
            provider.push(Reply::sse(events));
        }
        let server = TestServer::start(&provider.base_url()).await;
        let cursor = FakeCursor::new(server.addr);
        Harness {
            provider,
            _server: server,
            cursor,
        }
    }

    async fn session(&self, request_id: &str, text: &str) -> Session<'_> {
        Session::start(
            &self.cursor,
            request_id,
            &run_request_with_env("conv-tools", text),
        )
        .await
    }

    /// The messages array of provider request `n`.
    fn request_messages(&self, n: usize) -> Vec<Value> {
        self.provider.requests()[n]["messages"]
            .as_array()
            .expect("messages")
            .clone()
    }
}

fn shell_event(event: pb::shell_stream::Event) -> result::Message {
    result::Message::ShellStream(pb::ShellStream { event: Some(event) })
}

/// Every terminal card must carry a typed result, or Cursor spins it forever.
fn assert_every_completed_card_has_a_typed_result(transcript: &Transcript) {
    for card in transcript.completed_cards() {
        let tool = card
            .tool_call
            .as_ref()
            .and_then(|t| t.tool.as_ref())
            .expect("typed tool call");
        let has_result = match tool {
            tool_call::Tool::ReadToolCall(c) => {
                c.result.as_ref().and_then(|r| r.result.as_ref()).is_some()
            }
            tool_call::Tool::EditToolCall(c) => {
                c.result.as_ref().and_then(|r| r.result.as_ref()).is_some()
            }
            tool_call::Tool::DeleteToolCall(c) => {
                c.result.as_ref().and_then(|r| r.result.as_ref()).is_some()
            }
            tool_call::Tool::GrepToolCall(c) => {
                c.result.as_ref().and_then(|r| r.result.as_ref()).is_some()
            }
            tool_call::Tool::GlobToolCall(c) => {
                c.result.as_ref().and_then(|r| r.result.as_ref()).is_some()
            }
            tool_call::Tool::LsToolCall(c) => {
                c.result.as_ref().and_then(|r| r.result.as_ref()).is_some()
            }
            tool_call::Tool::ReadLintsToolCall(c) => {
                c.result.as_ref().and_then(|r| r.result.as_ref()).is_some()
            }
            tool_call::Tool::ShellToolCall(c) => {
                c.result.as_ref().and_then(|r| r.result.as_ref()).is_some()
            }
            tool_call::Tool::UpdateTodosToolCall(c) => {
                c.result.as_ref().and_then(|r| r.result.as_ref()).is_some()
            }
            tool_call::Tool::McpToolCall(c) => {
                c.result.as_ref().and_then(|r| r.result.as_ref()).is_some()
            }
            tool_call::Tool::ListMcpResourcesToolCall(c) => {
                c.result.as_ref().and_then(|r| r.result.as_ref()).is_some()
            }
            tool_call::Tool::ReadMcpResourceToolCall(c) => {
                c.result.as_ref().and_then(|r| r.result.as_ref()).is_some()
            }
            other => panic!("unexpected card kind {other:?}"),
        };
        assert!(
            has_result,
            "tool_call_completed {} lacks a typed result: {tool:?}",
            card.call_id
        );
    }
}

fn tool_messages(messages: &[Value]) -> Vec<(&str, &str)> {
    messages
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| {
            (
                m["tool_call_id"].as_str().unwrap(),
                m["content"].as_str().unwrap(),
            )
        })
        .collect()
}

#[tokio::test]
async fn a_read_tool_call_runs_on_the_client_and_its_result_reaches_the_next_request() {
    let h = Harness::new(vec![
        tool_call_events(
            Some("look first"),
            &[("call_r1", "Read", r#"{"path":"src/main.rs"}"#)],
            (100, 10, 0),
        ),
        text_events(&["It prints hello."], (150, 5, 100)),
    ])
    .await;
    let mut session = h.session("req-read", "what does main do?").await;

    let exec = session.next_exec().await;
    let Some(args::Message::ReadArgs(read)) = &exec.message else {
        panic!("expected read_args, got {exec:?}");
    };
    assert_eq!(read.path, "src/main.rs");
    assert!(exec.id >= 1);
    session
        .send(&exec_result(
            exec.id,
            read_success("src/main.rs", "fn main() {\n    println!(\"hello\");\n}\n"),
        ))
        .await;
    let transcript = session.finish().await;

    assert!(transcript.is_success(), "{:?}", transcript.end);
    assert_eq!(transcript.text(), "It prints hello.");
    let kinds = transcript.kinds();
    let position = |k: &str| {
        kinds
            .iter()
            .position(|x| *x == k)
            .unwrap_or_else(|| panic!("{k} missing in {kinds:?}"))
    };
    assert!(position("partial_tool_call") < position("tool_call_started"));
    assert!(position("tool_call_started") < position("exec"));
    assert!(position("exec") < position("tool_call_completed"));
    assert!(position("tool_call_completed") < position("text_delta"));
    assert_eq!(kinds.last(), Some(&"turn_ended"));
    assert_every_completed_card_has_a_typed_result(&transcript);
    let cards = transcript.completed_cards();
    assert_eq!(cards.len(), 1);
    assert!(!cards[0].model_call_id.is_empty());
    let Some(tool_call::Tool::ReadToolCall(card)) =
        cards[0].tool_call.as_ref().and_then(|t| t.tool.as_ref())
    else {
        panic!("read card");
    };
    assert_eq!(card.args.as_ref().unwrap().path, "src/main.rs");
    assert!(matches!(
        card.result.as_ref().and_then(|r| r.result.as_ref()),
        Some(pb::read_tool_result::Result::Success(_))
    ));
    let usage = transcript
        .updates()
        .find_map(|u| match u {
            interaction_update::Message::TurnEnded(t) => Some(*t),
            _ => None,
        })
        .expect("turn_ended");
    assert_eq!(
        usage.input_tokens,
        Some(250),
        "usage sums both provider calls"
    );
    assert_eq!(usage.output_tokens, Some(15));

    let first = h.request_messages(0);
    let second = h.request_messages(1);
    assert_eq!(
        &second[..first.len()],
        first.as_slice(),
        "request 1 is a prefix of request 2"
    );
    let added = &second[first.len()..];
    assert_eq!(added.len(), 2);
    assert_eq!(added[0]["role"], "assistant");
    assert_eq!(added[0]["content"], Value::Null);
    assert_eq!(added[0]["reasoning_content"], "look first");
    assert_eq!(added[0]["tool_calls"][0]["id"], "call_r1");
    assert_eq!(added[0]["tool_calls"][0]["function"]["name"], "Read");
    assert_eq!(
        added[0]["tool_calls"][0]["function"]["arguments"],
        r#"{"path":"src/main.rs"}"#
    );
    assert_eq!(added[1]["role"], "tool");
    assert_eq!(added[1]["tool_call_id"], "call_r1");
    let content = added[1]["content"]
        .as_str()
        .expect("tool content is a string");
    assert!(content.contains("     1|fn main() {"), "{content}");
    assert!(
        content.contains("     2|    println!(\"hello\");"),
        "{content}"
    );
    // Agent mode offers the ten workspace tools plus AskQuestion, SwitchMode, WebFetch and Task
    // (no MCP servers: no MCP resource tools).
    assert!(
        h.provider.requests()[0]["tools"]
            .as_array()
            .is_some_and(|t| t.len() == 14)
    );
}

#[tokio::test]
async fn three_parallel_calls_completed_in_reverse_order_are_replayed_in_call_order_once() {
    let h = Harness::new(vec![
        tool_call_events(
            None,
            &[
                ("call_a", "Read", r#"{"path":"a.txt"}"#),
                ("call_b", "Read", r#"{"path":"b.txt"}"#),
                ("call_c", "LS", r#"{"path":"/home/user/demo"}"#),
            ],
            (10, 3, 0),
        ),
        text_events(&["done"], (20, 1, 0)),
    ])
    .await;
    let mut session = h.session("req-parallel", "look around").await;

    let mut execs = Vec::new();
    for _ in 0..3 {
        execs.push(session.next_exec().await);
    }
    // All three start before any result exists.
    assert!(h.provider.requests().len() == 1);
    let ids: Vec<u32> = execs.iter().map(|e| e.id).collect();
    assert!(
        ids.windows(2).all(|w| w[0] < w[1]),
        "exec ids are monotonic: {ids:?}"
    );
    let Some(args::Message::LsArgs(_)) = &execs[2].message else {
        panic!("ls_args")
    };
    let tree = pb::LsDirectoryTreeNode {
        abs_path: "/home/user/demo".into(),
        children_dirs: vec![pb::LsDirectoryTreeNode {
            abs_path: "/home/user/demo/src".into(),
            children_files: vec![pb::ls_directory_tree_node::File {
                name: "main.rs".into(),
                ..Default::default()
            }],
            children_were_processed: true,
            ..Default::default()
        }],
        children_files: vec![pb::ls_directory_tree_node::File {
            name: "Cargo.toml".into(),
            ..Default::default()
        }],
        children_were_processed: true,
        ..Default::default()
    };
    session
        .send(&exec_result(
            ids[2],
            result::Message::LsResult(pb::LsResult {
                result: Some(pb::ls_result::Result::Success(pb::LsSuccess {
                    directory_tree_root: Some(tree),
                })),
            }),
        ))
        .await;
    session
        .send(&exec_result(ids[1], read_success("b.txt", "bee\n")))
        .await;
    session
        .send(&exec_result(ids[0], read_success("a.txt", "ay\n")))
        .await;
    let transcript = session.finish().await;

    assert!(transcript.is_success(), "{:?}", transcript.end);
    assert_every_completed_card_has_a_typed_result(&transcript);
    assert_eq!(transcript.completed_cards().len(), 3);
    let second = h.request_messages(1);
    let assistant: Vec<&Value> = second.iter().filter(|m| m["role"] == "assistant").collect();
    assert_eq!(assistant.len(), 1);
    let call_ids: Vec<&str> = assistant[0]["tool_calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["id"].as_str().unwrap())
        .collect();
    assert_eq!(call_ids, ["call_a", "call_b", "call_c"]);
    let results = tool_messages(&second);
    assert_eq!(
        results.iter().map(|r| r.0).collect::<Vec<_>>(),
        ["call_a", "call_b", "call_c"]
    );
    assert!(results[0].1.contains("1|ay"));
    assert!(results[1].1.contains("1|bee"));
    assert!(
        results[2].1.contains("- src/")
            && results[2].1.contains("- main.rs")
            && results[2].1.contains("Cargo.toml"),
        "{}",
        results[2].1
    );
}

#[tokio::test]
async fn a_shell_streams_stdout_then_exits_non_zero() {
    let h = Harness::new(vec![
        tool_call_events(
            None,
            &[(
                "call_sh",
                "Shell",
                r#"{"command":"cargo build","description":"Build"}"#,
            )],
            (10, 3, 0),
        ),
        text_events(&["It failed."], (20, 1, 0)),
    ])
    .await;
    let mut session = h.session("req-shell", "build it").await;

    let exec = session.next_exec().await;
    let Some(args::Message::ShellStreamArgs(shell)) = &exec.message else {
        panic!("expected shell_stream_args, got {exec:?}");
    };
    assert_eq!(shell.command, "cargo build");
    assert_eq!(shell.timeout, 30_000);
    assert_eq!(
        shell.timeout_behavior,
        pb::TimeoutBehavior::Background as i32
    );
    assert_eq!(shell.hard_timeout, Some(86_400_000));
    assert_eq!(shell.file_output_threshold_bytes, Some(40_000));
    assert!(shell.close_stdin);
    assert!(
        shell
            .parsing_result
            .as_ref()
            .is_some_and(|p| p.parsing_failed)
    );
    assert_eq!(shell.description.as_deref(), Some("Build"));
    use pb::shell_stream::Event as E;
    for event in [
        E::Start(pb::ShellStreamStart::default()),
        E::Stdout(pb::ShellStreamStdout {
            data: "Compiling demo\n".into(),
        }),
        E::Stderr(pb::ShellStreamStderr {
            data: "error[E0425]: oops\n".into(),
        }),
        E::Exit(pb::ShellStreamExit {
            code: 101,
            cwd: "/home/user/demo".into(),
            ..Default::default()
        }),
    ] {
        session
            .send(&exec_result(exec.id, shell_event(event)))
            .await;
    }
    session.send(&fixtures::stream_close(exec.id)).await;
    let transcript = session.finish().await;

    assert!(transcript.is_success(), "{:?}", transcript.end);
    let deltas: Vec<&pb::ToolCallDeltaUpdate> = transcript
        .updates()
        .filter_map(|u| match u {
            interaction_update::Message::ToolCallDelta(d) => Some(d.as_ref()),
            _ => None,
        })
        .collect();
    assert_eq!(deltas.len(), 2, "stdout and stderr deltas");
    assert!(deltas.iter().all(|d| !d.model_call_id.is_empty()));
    assert_every_completed_card_has_a_typed_result(&transcript);
    let Some(tool_call::Tool::ShellToolCall(card)) = transcript.completed_cards()[0]
        .tool_call
        .as_ref()
        .and_then(|t| t.tool.as_ref())
    else {
        panic!("shell card");
    };
    let Some(pb::shell_result::Result::Failure(failure)) =
        card.result.as_ref().and_then(|r| r.result.as_ref())
    else {
        panic!("a non-zero exit is a failure result: {card:?}");
    };
    assert_eq!(failure.exit_code, 101);
    assert_eq!(failure.stdout, "Compiling demo\n");
    let text = tool_messages(&h.request_messages(1))[0].1.to_owned();
    assert!(text.starts_with("Exit code: 101"), "{text}");
    assert!(
        text.contains("Compiling demo") && text.contains("[stderr]\nerror[E0425]: oops"),
        "{text}"
    );
}

#[tokio::test]
async fn a_shell_with_block_until_zero_backgrounds_and_tells_the_model_where_output_goes() {
    let h = Harness::new(vec![
        tool_call_events(
            None,
            &[(
                "call_bg",
                "Shell",
                r#"{"command":"npm run dev","block_until_ms":0}"#,
            )],
            (10, 3, 0),
        ),
        text_events(&["Server started."], (20, 1, 0)),
    ])
    .await;
    let mut session = h.session("req-bg", "start the dev server").await;
    let exec = session.next_exec().await;
    let Some(args::Message::ShellStreamArgs(shell)) = &exec.message else {
        panic!("shell")
    };
    assert_eq!(shell.timeout, 0);
    assert!(shell.is_background);
    session
        .send(&exec_result(
            exec.id,
            shell_event(pb::shell_stream::Event::Backgrounded(
                pb::ShellStreamBackgrounded {
                    shell_id: 7,
                    command: "npm run dev".into(),
                    pid: Some(4242),
                    ..Default::default()
                },
            )),
        ))
        .await;
    let transcript = session.finish().await;

    assert!(transcript.is_success());
    assert_every_completed_card_has_a_typed_result(&transcript);
    let text = tool_messages(&h.request_messages(1))[0].1.to_owned();
    assert!(
        text.contains("shell id 7") && text.contains("pid 4242"),
        "{text}"
    );
    assert!(
        text.contains(&format!("{}/7.txt", fixtures::TERMINALS_FOLDER)),
        "{text}"
    );
}

#[tokio::test]
async fn a_thrown_exec_is_a_failed_result_the_model_sees() {
    let h = Harness::new(vec![
        tool_call_events(None, &[("call_t", "Read", r#"{"path":"x"}"#)], (10, 3, 0)),
        text_events(&["Could not read it."], (20, 1, 0)),
    ])
    .await;
    let mut session = h.session("req-throw", "read x").await;
    let exec = session.next_exec().await;
    session
        .send(&fixtures::throw(exec.id, "disk on fire"))
        .await;
    session.send(&fixtures::stream_close(exec.id)).await;
    let transcript = session.finish().await;

    assert!(transcript.is_success(), "{:?}", transcript.end);
    assert_every_completed_card_has_a_typed_result(&transcript);
    let text = tool_messages(&h.request_messages(1))[0].1.to_owned();
    assert!(
        text.starts_with("Error:") && text.contains("disk on fire"),
        "{text}"
    );
}

/// Cursor counts a file's lines as its newline-separated parts: "one\n" is two.
#[tokio::test]
async fn a_whole_one_line_file_ending_in_a_newline_is_not_reported_as_truncated() {
    let h = Harness::new(vec![
        tool_call_events(
            None,
            &[("call_one", "Read", r#"{"path":"one.txt"}"#)],
            (10, 3, 0),
        ),
        text_events(&["It says one."], (20, 1, 0)),
    ])
    .await;
    let mut session = h.session("req-one-line", "read one.txt").await;
    let exec = session.next_exec().await;
    let answer = result::Message::ReadResult(pb::ReadResult {
        result: Some(pb::read_result::Result::Success(pb::ReadSuccess {
            path: "one.txt".into(),
            total_lines: 2,
            file_size: 4,
            output: Some(pb::read_success::Output::Content("one\n".into())),
            ..Default::default()
        })),
    });
    session.send(&exec_result(exec.id, answer)).await;
    let transcript = session.finish().await;

    assert!(transcript.is_success(), "{:?}", transcript.end);
    let text = tool_messages(&h.request_messages(1))[0].1.to_owned();
    assert_eq!(text, "     1|one\n", "nothing more to read, so no note");
}

#[tokio::test]
async fn an_unknown_tool_and_invalid_arguments_become_errors_the_model_can_fix() {
    let h = Harness::new(vec![
        tool_call_events(
            None,
            &[
                ("call_u", "Teleport", r#"{"to":"mars"}"#),
                (
                    "call_i",
                    "Shell",
                    r#"{"command":"sleep 1","block_until_ms":1.5}"#,
                ),
            ],
            (10, 3, 0),
        ),
        text_events(&["Sorry."], (20, 1, 0)),
    ])
    .await;
    let session = h.session("req-invalid", "go").await;
    let transcript = session.finish().await;

    assert!(transcript.is_success(), "{:?}", transcript.end);
    assert!(!transcript.kinds().contains(&"exec"), "nothing is executed");
    // Only the known tool drew a card, and that card reached a terminal state.
    let cards = transcript.completed_cards();
    assert_eq!(cards.len(), 1);
    assert_every_completed_card_has_a_typed_result(&transcript);
    let messages = h.request_messages(1);
    let results = tool_messages(&messages);
    assert_eq!(results[0].0, "call_u");
    assert!(
        results[0].1.contains("no tool named \"Teleport\""),
        "{}",
        results[0].1
    );
    assert_eq!(results[1].0, "call_i");
    assert!(
        results[1].1.contains("invalid arguments for Shell"),
        "{}",
        results[1].1
    );
}

#[tokio::test]
async fn a_late_duplicate_result_is_ignored_and_nothing_is_duplicated() {
    let h = Harness::new(vec![
        tool_call_events(
            None,
            &[("call_d", "Read", r#"{"path":"d.txt"}"#)],
            (10, 3, 0),
        ),
        tool_call_events(
            None,
            &[("call_e", "Read", r#"{"path":"e.txt"}"#)],
            (10, 3, 0),
        ),
        text_events(&["ok"], (20, 1, 0)),
    ])
    .await;
    let mut session = h.session("req-late", "read twice").await;
    let first = session.next_exec().await;
    session
        .send(&exec_result(first.id, read_success("d.txt", "dee\n")))
        .await;
    // The same result again, after the batch finished: ignored, never attached to the next batch.
    session
        .send(&exec_result(first.id, read_success("d.txt", "dee\n")))
        .await;
    session.send(&fixtures::stream_close(first.id)).await;
    let second = session.next_exec().await;
    assert!(second.id > first.id);
    session
        .send(&exec_result(second.id, read_success("e.txt", "ee\n")))
        .await;
    let transcript = session.finish().await;

    assert!(transcript.is_success(), "{:?}", transcript.end);
    let last = h.request_messages(2);
    let results = tool_messages(&last);
    assert_eq!(
        results.iter().map(|r| r.0).collect::<Vec<_>>(),
        ["call_d", "call_e"]
    );
}

/// Issue 29 (7): a result that does not fit its request (an LS result for a Read, a one-shot
/// `shell_result` for a streamed Shell) fails that call with a message the model can act on; the
/// turn goes on and the model sees both failures.
#[tokio::test]
async fn a_result_of_the_wrong_kind_fails_its_call_and_the_turn_goes_on() {
    let h = Harness::new(vec![
        tool_call_events(
            None,
            &[
                ("call_w", "Read", r#"{"path":"w"}"#),
                ("call_s", "Shell", r#"{"command":"ls"}"#),
            ],
            (10, 3, 0),
        ),
        text_events(&["both failed"], (20, 2, 0)),
    ])
    .await;
    let mut session = h.session("req-wrong", "read w").await;
    let read = session.next_exec().await;
    let shell = session.next_exec().await;
    session
        .send(&exec_result(
            read.id,
            result::Message::LsResult(pb::LsResult::default()),
        ))
        .await;
    session
        .send(&exec_result(
            shell.id,
            result::Message::ShellResult(pb::ShellResult::default()),
        ))
        .await;
    let transcript = session.finish().await;

    assert!(transcript.is_success(), "{:?}", transcript.end);
    assert_eq!(transcript.text(), "both failed");
    assert_eq!(transcript.completed_cards().len(), 2);
    assert_every_completed_card_has_a_typed_result(&transcript);
    let last = h.request_messages(1);
    let results = tool_messages(&last);
    assert_eq!(results.len(), 2, "{results:?}");
    let (read_text, shell_text) = (results[0].1, results[1].1);
    assert!(
        read_text.starts_with("Error:")
            && read_text.contains("ls_result where a read_result was expected"),
        "{read_text}"
    );
    assert!(
        shell_text.contains("shell_result where a shell_stream was expected"),
        "{shell_text}"
    );
}

#[tokio::test]
async fn str_replace_reads_edits_and_writes_the_file() {
    let h = Harness::new(vec![
        tool_call_events(
            None,
            &[
                (
                    "call_ok",
                    "StrReplace",
                    r#"{"path":"lib.rs","old_string":"fn old()","new_string":"fn new()"}"#,
                ),
                (
                    "call_amb",
                    "StrReplace",
                    r#"{"path":"dup.rs","old_string":"x","new_string":"y"}"#,
                ),
            ],
            (10, 3, 0),
        ),
        text_events(&["Renamed."], (20, 1, 0)),
    ])
    .await;
    let mut session = h.session("req-edit", "rename").await;
    let read_ok = session.next_exec().await;
    let read_amb = session.next_exec().await;
    let Some(args::Message::ReadArgs(read)) = &read_ok.message else {
        panic!("read first")
    };
    assert_eq!(read.path, "lib.rs");
    session
        .send(&exec_result(read_amb.id, read_success("dup.rs", "x x\n")))
        .await;
    session
        .send(&exec_result(
            read_ok.id,
            read_success("lib.rs", "// lib\nfn old() {}\n"),
        ))
        .await;
    let write = session.next_exec().await;
    let Some(args::Message::WriteArgs(w)) = &write.message else {
        panic!("write after read: {write:?}")
    };
    assert_eq!(w.path, "lib.rs");
    assert_eq!(w.file_text, "// lib\nfn new() {}\n");
    session
        .send(&exec_result(
            write.id,
            result::Message::WriteResult(pb::WriteResult {
                result: Some(pb::write_result::Result::Success(pb::WriteSuccess {
                    path: "lib.rs".into(),
                    lines_created: 2,
                    ..Default::default()
                })),
            }),
        ))
        .await;
    let transcript = session.finish().await;

    assert!(transcript.is_success(), "{:?}", transcript.end);
    assert_every_completed_card_has_a_typed_result(&transcript);
    let messages = h.request_messages(1);
    let results = tool_messages(&messages);
    assert!(
        results[0]
            .1
            .contains("Edited lib.rs: replaced 1 occurrence"),
        "{}",
        results[0].1
    );
    assert!(
        results[1].1.contains("occurs 2 times in dup.rs"),
        "{}",
        results[1].1
    );
    let cards = transcript.completed_cards();
    let edit = cards
        .iter()
        .find_map(
            |c| match c.tool_call.as_ref().and_then(|t| t.tool.as_ref()) {
                Some(tool_call::Tool::EditToolCall(e))
                    if e.args.as_ref().is_some_and(|a| a.path == "lib.rs") =>
                {
                    Some(e)
                }
                _ => None,
            },
        )
        .expect("edit card");
    let Some(pb::edit_result::Result::Success(success)) =
        edit.result.as_ref().and_then(|r| r.result.as_ref())
    else {
        panic!("edit success");
    };
    assert_eq!(success.after_full_file_content, "// lib\nfn new() {}\n");
    assert_eq!(
        (success.lines_added, success.lines_removed),
        (Some(1), Some(1))
    );
}

#[tokio::test]
async fn grep_glob_write_delete_and_read_lints_map_to_their_execs_and_cards() {
    let h = Harness::new(vec![
        tool_call_events(
            None,
            &[
                (
                    "call_g",
                    "Grep",
                    r#"{"pattern":"TODO","-C":1,"-i":true,"glob":"*.rs"}"#,
                ),
                ("call_gl", "Glob", r#"{"glob_pattern":"**/*.toml"}"#),
                (
                    "call_w",
                    "Write",
                    r#"{"path":"new.txt","contents":"one\ntwo\n"}"#,
                ),
                ("call_del", "Delete", r#"{"path":"old.txt"}"#),
                ("call_l", "ReadLints", r#"{"paths":["a.rs","b.rs"]}"#),
            ],
            (10, 3, 0),
        ),
        text_events(&["Done."], (20, 1, 0)),
    ])
    .await;
    let mut session = h.session("req-mixed", "do things").await;
    let mut execs = Vec::new();
    for _ in 0..5 {
        execs.push(session.next_exec().await);
    }
    let Some(args::Message::GrepArgs(grep)) = &execs[0].message else {
        panic!("grep")
    };
    assert_eq!(grep.pattern, "TODO");
    assert_eq!(grep.context, Some(1));
    assert_eq!(grep.case_insensitive, Some(true));
    assert_eq!(grep.output_mode.as_deref(), Some("content"));
    let Some(args::Message::GrepArgs(glob)) = &execs[1].message else {
        panic!("glob runs as grep")
    };
    assert_eq!(glob.glob.as_deref(), Some("**/*.toml"));
    assert_eq!(glob.output_mode.as_deref(), Some("files_with_matches"));
    assert!(glob.pattern.is_empty());
    let Some(args::Message::WriteArgs(write)) = &execs[2].message else {
        panic!("write")
    };
    assert_eq!(write.file_text, "one\ntwo\n");
    let Some(args::Message::DeleteArgs(delete)) = &execs[3].message else {
        panic!("delete")
    };
    assert_eq!(delete.path, "old.txt");
    let Some(args::Message::DiagnosticsArgs(lint_a)) = &execs[4].message else {
        panic!("diagnostics")
    };
    assert_eq!(lint_a.path, "a.rs");

    let content = pb::GrepUnionResult {
        result: Some(pb::grep_union_result::Result::Content(
            pb::GrepContentResult {
                matches: vec![pb::GrepFileMatch {
                    file: "src/lib.rs".into(),
                    matches: vec![
                        pb::GrepContentMatch {
                            line_number: 3,
                            content: "// context".into(),
                            is_context_line: true,
                            ..Default::default()
                        },
                        pb::GrepContentMatch {
                            line_number: 4,
                            content: "// TODO: fix".into(),
                            ..Default::default()
                        },
                    ],
                }],
                ..Default::default()
            },
        )),
    };
    session
        .send(&exec_result(
            execs[0].id,
            result::Message::GrepResult(pb::GrepResult {
                result: Some(pb::grep_result::Result::Success(pb::GrepSuccess {
                    pattern: "TODO".into(),
                    workspace_results: [("/home/user/demo".to_owned(), content)].into(),
                    ..Default::default()
                })),
            }),
        ))
        .await;
    let files = pb::GrepUnionResult {
        result: Some(pb::grep_union_result::Result::Files(pb::GrepFilesResult {
            files: vec!["Cargo.toml".into(), "crates/x/Cargo.toml".into()],
            total_files: 2,
            ..Default::default()
        })),
    };
    session
        .send(&exec_result(
            execs[1].id,
            result::Message::GrepResult(pb::GrepResult {
                result: Some(pb::grep_result::Result::Success(pb::GrepSuccess {
                    workspace_results: [("/home/user/demo".to_owned(), files)].into(),
                    ..Default::default()
                })),
            }),
        ))
        .await;
    session
        .send(&exec_result(
            execs[2].id,
            result::Message::WriteResult(pb::WriteResult {
                result: Some(pb::write_result::Result::Success(pb::WriteSuccess {
                    path: "new.txt".into(),
                    lines_created: 2,
                    ..Default::default()
                })),
            }),
        ))
        .await;
    session
        .send(&exec_result(
            execs[3].id,
            result::Message::DeleteResult(pb::DeleteResult {
                result: Some(pb::delete_result::Result::FileNotFound(
                    pb::DeleteFileNotFound {
                        path: "old.txt".into(),
                    },
                )),
            }),
        ))
        .await;
    let diagnostics = |path: &str, items: Vec<pb::Diagnostic>| {
        result::Message::DiagnosticsResult(pb::DiagnosticsResult {
            result: Some(pb::diagnostics_result::Result::Success(
                pb::DiagnosticsSuccess {
                    path: path.into(),
                    total_diagnostics: i32::try_from(items.len()).unwrap(),
                    diagnostics: items,
                },
            )),
        })
    };
    session
        .send(&exec_result(execs[4].id, diagnostics("a.rs", vec![])))
        .await;
    let lint_b = session.next_exec().await;
    let Some(args::Message::DiagnosticsArgs(b)) = &lint_b.message else {
        panic!("second diagnostics")
    };
    assert_eq!(b.path, "b.rs");
    session
        .send(&exec_result(
            lint_b.id,
            diagnostics(
                "b.rs",
                vec![pb::Diagnostic {
                    severity: pb::DiagnosticSeverity::Error as i32,
                    range: Some(pb::Range {
                        start: Some(pb::Position { line: 9, column: 4 }),
                        end: None,
                    }),
                    message: "unused variable".into(),
                    source: "rustc".into(),
                    ..Default::default()
                }],
            ),
        ))
        .await;
    let transcript = session.finish().await;

    assert!(transcript.is_success(), "{:?}", transcript.end);
    assert_every_completed_card_has_a_typed_result(&transcript);
    let messages = h.request_messages(1);
    let results = tool_messages(&messages);
    assert_eq!(results.len(), 5);
    assert!(
        results[0].1.contains("src/lib.rs-3-// context")
            && results[0].1.contains("src/lib.rs:4:// TODO: fix"),
        "{}",
        results[0].1
    );
    assert_eq!(results[1].1, "Cargo.toml\ncrates/x/Cargo.toml");
    assert_eq!(results[2].1, "Wrote 2 lines to new.txt.");
    let streamed: String = transcript
        .updates()
        .filter_map(|u| match u {
            interaction_update::Message::ToolCallDelta(d) => {
                match d.tool_call_delta.as_ref()?.delta.as_ref()? {
                    pb::tool_call_delta::Delta::EditToolCallDelta(e) => {
                        Some(e.stream_content_delta.clone())
                    }
                    _ => None,
                }
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        streamed, "one\ntwo\n",
        "the Write card streams the decoded file content"
    );
    assert!(
        results[3].1.starts_with("Error: file not found: old.txt"),
        "{}",
        results[3].1
    );
    assert_eq!(results[4].1, "b.rs:9:4: error: unused variable [rustc ]\n");
    let glob_card = transcript
        .completed_cards()
        .into_iter()
        .find_map(
            |c| match c.tool_call.as_ref().and_then(|t| t.tool.as_ref()) {
                Some(tool_call::Tool::GlobToolCall(g)) => Some(g.clone()),
                _ => None,
            },
        )
        .expect("Glob is shown as a glob card");
    assert!(matches!(
        glob_card.result.and_then(|r| r.result),
        Some(pb::glob_tool_result::Result::Success(s)) if s.total_files == 2
    ));
}

#[tokio::test]
async fn todo_write_is_answered_locally_and_merges_with_the_list_folded_from_history() {
    let h = Harness::new(vec![
        tool_call_events(
            None,
            &[(
                "call_t1",
                "TodoWrite",
                r#"{"merge":false,"todos":[{"id":"1","content":"Write code","status":"in_progress"},{"id":"2","content":"Test","status":"pending"}]}"#,
            )],
            (10, 3, 0),
        ),
        tool_call_events(
            None,
            &[("call_t2", "TodoWrite", r#"{"merge":true,"todos":[{"id":"1","status":"completed"}]}"#)],
            (10, 3, 0),
        ),
        text_events(&["Planned."], (20, 1, 0)),
    ])
    .await;
    let session = h.session("req-todo", "plan it").await;
    let transcript = session.finish().await;

    assert!(transcript.is_success(), "{:?}", transcript.end);
    assert!(
        !transcript.kinds().contains(&"exec"),
        "TodoWrite needs no client round trip"
    );
    assert_every_completed_card_has_a_typed_result(&transcript);
    let cards = transcript.completed_cards();
    let Some(tool_call::Tool::UpdateTodosToolCall(second)) =
        cards[1].tool_call.as_ref().and_then(|t| t.tool.as_ref())
    else {
        panic!("todo card");
    };
    let Some(pb::update_todos_result::Result::Success(success)) =
        second.result.as_ref().and_then(|r| r.result.as_ref())
    else {
        panic!("todo success");
    };
    assert!(success.was_merge);
    let statuses: Vec<(String, i32)> = success
        .todos
        .iter()
        .map(|t| (t.content.clone(), t.status))
        .collect();
    assert_eq!(
        statuses,
        [
            ("Write code".to_owned(), pb::TodoStatus::Completed as i32),
            ("Test".to_owned(), pb::TodoStatus::Pending as i32),
        ]
    );
    let text = tool_messages(&h.request_messages(2))[1].1.to_owned();
    assert!(
        text.contains("[x] Write code (1)") && text.contains("[ ] Test (2)"),
        "{text}"
    );
}

/// The main scenario (reasoning, a Read call, its result, a final answer) on every endpoint, with the
/// exact JSON each one gets back on the next request.
#[tokio::test]
async fn the_read_scenario_replays_exactly_on_every_endpoint() {
    for (endpoint, kind) in [
        ("openai_chat", "openai-chat"),
        ("openai_responses", "openai-responses"),
        ("anthropic", "anthropic"),
    ] {
        let provider = FakeProvider::start().await;
        provider.push(fake_provider::golden(endpoint, "reasoning_tool"));
        provider.push(fake_provider::golden(endpoint, "text"));
        let server = TestServer::start_kind(&provider.base_url(), kind).await;
        let cursor = FakeCursor::new(server.addr);
        let mut session = Session::start(
            &cursor,
            &format!("req-{endpoint}"),
            &run_request_with_env("conv-ep", "read main"),
        )
        .await;
        let exec = session.next_exec().await;
        let Some(args::Message::ReadArgs(read)) = &exec.message else {
            panic!("{endpoint}: read_args expected, got {exec:?}");
        };
        assert_eq!(read.path, "src/main.rs");
        session
            .send(&exec_result(
                exec.id,
                read_success("src/main.rs", "fn main() {}\n"),
            ))
            .await;
        let transcript = session.finish().await;

        assert!(transcript.is_success(), "{endpoint}: {:?}", transcript.end);
        assert_eq!(transcript.text(), "Hello there", "{endpoint}");
        assert_eq!(
            transcript.thinking(),
            "I should read the file.",
            "{endpoint}"
        );
        assert_every_completed_card_has_a_typed_result(&transcript);
        let second = &provider.requests()[1];
        let result_text = "     1|fn main() {}\n";
        match kind {
            "openai-chat" => {
                let messages = second["messages"].as_array().unwrap();
                assert_eq!(
                    messages[messages.len() - 2..],
                    [
                        serde_json::json!({"role":"assistant","content":null,"reasoning_content":"I should read the file.","tool_calls":[{"id":"call_r","type":"function","function":{"name":"Read","arguments":"{\"path\":\"src/main.rs\"}"}}]}),
                        serde_json::json!({"role":"tool","tool_call_id":"call_r","content":result_text}),
                    ]
                );
            }
            "openai-responses" => {
                let input = second["input"].as_array().unwrap();
                assert_eq!(
                    input[input.len() - 3..],
                    [
                        serde_json::json!({"type":"reasoning","id":"rs_1","summary":[{"type":"summary_text","text":"I should read the file."}],"encrypted_content":"gAAAA-final"}),
                        serde_json::json!({"type":"function_call","id":"fc_r","call_id":"call_r","name":"Read","arguments":"{\"path\":\"src/main.rs\"}","status":"completed"}),
                        serde_json::json!({"type":"function_call_output","call_id":"call_r","output":result_text}),
                    ]
                );
                assert_eq!(second["store"], false);
                assert_eq!(
                    second["include"],
                    serde_json::json!(["reasoning.encrypted_content"])
                );
            }
            _ => {
                let messages = second["messages"].as_array().unwrap();
                assert_eq!(
                    messages[messages.len() - 2..],
                    [
                        serde_json::json!({"role":"assistant","content":[
                            {"type":"thinking","thinking":"I should read the file.","signature":"EsECsig=="},
                            {"type":"tool_use","id":"toolu_r","name":"Read","input":{"path":"src/main.rs"}}
                        ]}),
                        serde_json::json!({"role":"user","content":[
                            {"type":"tool_result","tool_use_id":"toolu_r","content":result_text,"cache_control":{"type":"ephemeral"}}
                        ]}),
                    ]
                );
                assert_eq!(second["max_tokens"], 32000);
                assert_eq!(second["thinking"], serde_json::json!({"type":"adaptive"}));
            }
        }
    }
}

/// A request carrying the user's MCP tools (`run_request.mcp_tools`), as the IDE sends them.
fn run_request_with_mcp(conversation_id: &str, text: &str) -> pb::AgentClientMessage {
    use cursor_server::tools::exec::json_to_proto;
    let mut message = run_request_with_env(conversation_id, text);
    let tool = |server: &str, name: &str, schema: Value| pb::McpToolDefinition {
        name: format!("{server}-{name}"),
        provider_identifier: server.to_owned(),
        tool_name: name.to_owned(),
        description: format!("{name} on {server}"),
        input_schema: Some(json_to_proto(&schema)),
    };
    if let Some(pb::agent_client_message::Message::RunRequest(request)) = &mut message.message {
        request.mcp_tools = Some(pb::McpTools {
            mcp_tools: vec![
                tool(
                    "user-github",
                    "create_issue",
                    serde_json::json!({
                        "type": "object",
                        "properties": {"title": {"type": "string"}, "labels": {"type": "array", "items": {"type": "string"}}},
                        "required": ["title"]
                    }),
                ),
                tool(
                    "my server",
                    "search.code",
                    serde_json::json!({"type": "object", "properties": {"q": {"type": "string"}}}),
                ),
            ],
        });
    }
    message
}

#[tokio::test]
async fn an_mcp_tool_is_offered_under_a_safe_name_runs_as_mcp_args_and_its_content_reaches_the_model()
 {
    let h = Harness::new(vec![
        tool_call_events(
            None,
            &[
                (
                    "call_m1",
                    "mcp_user-github_create_issue",
                    r#"{"title":"Crash on start","labels":["bug"]}"#,
                ),
                (
                    "call_m2",
                    "mcp_user-github_create_issue",
                    r#"{"labels":[]}"#,
                ),
            ],
            (10, 1, 0),
        ),
        text_events(&["Filed."], (20, 2, 0)),
    ])
    .await;
    let mut turn = Session::start(
        &h.cursor,
        "req-mcp",
        &run_request_with_mcp("conv-mcp", "file it"),
    )
    .await;
    let exec = turn.next_exec().await;
    let Some(args::Message::McpArgs(mcp)) = &exec.message else {
        panic!("expected mcp_args, got {exec:?}");
    };
    assert_eq!(mcp.name, "user-github-create_issue");
    assert_eq!(mcp.provider_identifier, "user-github");
    assert_eq!(mcp.tool_name, "create_issue");
    assert_eq!(
        cursor_server::tools::exec::proto_to_json(&mcp.args["title"]),
        "Crash on start"
    );
    assert_eq!(
        cursor_server::tools::exec::proto_to_json(&mcp.args["labels"]),
        serde_json::json!(["bug"])
    );
    turn.send(&exec_result(
        exec.id,
        result::Message::McpResult(pb::McpResult {
            result: Some(pb::mcp_result::Result::Success(pb::McpSuccess {
                content: vec![pb::McpToolResultContentItem {
                    content: Some(pb::mcp_tool_result_content_item::Content::Text(
                        pb::McpTextContent {
                            text: "Created issue #42".into(),
                            output_location: None,
                        },
                    )),
                }],
                ..pb::McpSuccess::default()
            })),
        }),
    ))
    .await;
    let transcript = turn.finish().await;
    assert!(transcript.is_success(), "{:?}", transcript.end);
    assert_every_completed_card_has_a_typed_result(&transcript);
    let cards = transcript.completed_cards();
    assert_eq!(cards.len(), 2);
    let card_of = |id: &str| {
        cards
            .iter()
            .find(|c| c.call_id.ends_with(id))
            .and_then(|c| c.tool_call.clone())
            .and_then(|c| c.tool)
    };
    let Some(tool_call::Tool::McpToolCall(ok)) = card_of("_0") else {
        panic!("an MCP card for the first call");
    };
    assert!(matches!(
        ok.result.and_then(|r| r.result),
        Some(pb::mcp_tool_result::Result::Success(_))
    ));
    // The second call lacks the schema's required `title`: an error result, never executed.
    let Some(tool_call::Tool::McpToolCall(bad)) = card_of("_1") else {
        panic!("an MCP card for the second call");
    };
    assert!(matches!(
        bad.result.and_then(|r| r.result),
        Some(pb::mcp_tool_result::Result::Error(_))
    ));
    let first = &h.provider.requests()[0];
    let offered: Vec<&Value> = first["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["function"]["name"].as_str().unwrap().starts_with("mcp_"))
        .collect();
    let names: Vec<&str> = offered
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["mcp_user-github_create_issue", "mcp_my_server_search_code"]
    );
    assert_eq!(
        offered[0]["function"]["parameters"]["required"],
        serde_json::json!(["title"])
    );
    let tools = first["tools"].to_string();
    assert!(
        tools.contains("\"ListMcpResources\""),
        "resources are offered with MCP servers"
    );
    let messages = h.request_messages(1);
    let results: Vec<&str> = tool_messages(&messages)
        .into_iter()
        .map(|(_, content)| content)
        .collect();
    assert_eq!(results[0], "Created issue #42");
    assert!(
        results[1].contains("missing required title"),
        "{}",
        results[1]
    );
}

#[tokio::test]
async fn mcp_resources_are_listed_and_read_through_the_client() {
    let h = Harness::new(vec![
        tool_call_events(
            None,
            &[
                ("call_l", "ListMcpResources", "{}"),
                (
                    "call_r",
                    "FetchMcpResource",
                    r#"{"server":"user-github","uri":"repo://readme"}"#,
                ),
            ],
            (10, 1, 0),
        ),
        text_events(&["Read."], (20, 2, 0)),
    ])
    .await;
    let mut turn = Session::start(
        &h.cursor,
        "req-res",
        &run_request_with_mcp("conv-res", "what is there"),
    )
    .await;
    let mut pending = Vec::new();
    for _ in 0..2 {
        pending.push(turn.next_exec().await);
    }
    for exec in pending {
        let answer = match &exec.message {
            Some(args::Message::ListMcpResourcesExecArgs(list)) => {
                assert_eq!(list.server, None);
                result::Message::ListMcpResourcesExecResult(pb::ListMcpResourcesExecResult {
                    result: Some(pb::list_mcp_resources_exec_result::Result::Success(
                        pb::ListMcpResourcesSuccess {
                            resources: vec![pb::list_mcp_resources_exec_result::McpResource {
                                uri: "repo://readme".into(),
                                name: Some("README".into()),
                                mime_type: Some("text/markdown".into()),
                                server: "user-github".into(),
                                ..Default::default()
                            }],
                        },
                    )),
                })
            }
            Some(args::Message::ReadMcpResourceExecArgs(read)) => {
                assert_eq!(
                    (read.server.as_str(), read.uri.as_str()),
                    ("user-github", "repo://readme")
                );
                result::Message::ReadMcpResourceExecResult(pb::ReadMcpResourceExecResult {
                    result: Some(pb::read_mcp_resource_exec_result::Result::Success(
                        pb::ReadMcpResourceSuccess {
                            uri: "repo://readme".into(),
                            content: Some(pb::read_mcp_resource_success::Content::Text(
                                "# Demo\nA demo repository.".into(),
                            )),
                            ..Default::default()
                        },
                    )),
                })
            }
            other => panic!("unexpected exec {other:?}"),
        };
        turn.send(&exec_result(exec.id, answer)).await;
    }
    let transcript = turn.finish().await;
    assert!(transcript.is_success(), "{:?}", transcript.end);
    let messages = h.request_messages(1);
    let results: Vec<&str> = tool_messages(&messages)
        .into_iter()
        .map(|(_, content)| content)
        .collect();
    assert!(
        results[0].contains("- user-github: repo://readme — README, text/markdown"),
        "{}",
        results[0]
    );
    assert_eq!(results[1], "# Demo\nA demo repository.");
    assert_every_completed_card_has_a_typed_result(&transcript);
    assert!(transcript.completed_cards().iter().all(|c| matches!(
        c.tool_call.as_ref().and_then(|t| t.tool.as_ref()),
        Some(
            tool_call::Tool::ListMcpResourcesToolCall(_)
                | tool_call::Tool::ReadMcpResourceToolCall(_)
        )
    )));
}
