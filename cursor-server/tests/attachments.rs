//! Everything the user gives reaches the model. What the user attaches, in each provider family's
//! own shape: files, a code selection, a rule, a `/command`, a terminal selection and images (sent
//! inline or by blob id, the format read from the bytes), replayed byte for byte on the next turn and
//! after a restart; an MCP tool's images follow its result; a model without vision is told the
//! image's name; an image too large for the family is a clear error that stores nothing. A CLI
//! client's request context, asked for first. And each conversation action: a plan started, a
//! command the user ran, a subagent canceled, a call moved to the background, calls resolved after
//! an interrupt.

#[path = "support/fake_cursor.rs"]
mod fake_cursor;
#[path = "support/fake_provider.rs"]
mod fake_provider;
#[path = "support/fixtures.rs"]
mod fixtures;

use base64::Engine as _;
use cursor_server::cursor::proto::agent::{self as pb, agent_client_message, conversation_action};
use cursor_server::model::conversation::BlobId;
use fake_cursor::{FakeCursor, Session};
use fake_provider::{FakeProvider, Reply, golden, text_events, tool_call_events};
use fixtures::{TestServer, cli_run_request, exec_result, run_request, run_request_with_env};
use serde_json::Value;

/// A PNG's signature and a little more: the server reads the format from these bytes.
fn png(tag: &str) -> Vec<u8> {
    let mut bytes = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR".to_vec();
    bytes.extend_from_slice(tag.as_bytes());
    bytes
}

fn base64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn image(path: &str, mime: &str, source: pb::selected_image::DataOrBlobId) -> pb::SelectedImage {
    pb::SelectedImage {
        uuid: format!("uuid-{path}"),
        path: path.into(),
        mime_type: mime.into(),
        data_or_blob_id: Some(source),
        ..Default::default()
    }
}

/// A run_request whose user message carries `context`.
fn with_context(
    mut message: pb::AgentClientMessage,
    context: pb::SelectedContext,
) -> pb::AgentClientMessage {
    if let Some(agent_client_message::Message::RunRequest(request)) = &mut message.message
        && let Some(conversation_action::Action::UserMessageAction(action)) =
            request.action.as_mut().and_then(|a| a.action.as_mut())
        && let Some(user) = action.user_message.as_mut()
    {
        user.selected_context = Some(context);
    }
    message
}

/// A file, a code selection, a rule, a `/command`, a terminal selection; a screenshot sent inline
/// and one (a PNG labelled as JPEG) that only the client holds.
fn everything(held: &[u8]) -> pb::SelectedContext {
    use pb::selected_image::DataOrBlobId;
    let position = |line| pb::Position { line, column: 1 };
    pb::SelectedContext {
        files: vec![pb::SelectedFile {
            content: "fn main() {}\n".into(),
            path: "/w/src/main.rs".into(),
            relative_path: Some("src/main.rs".into()),
        }],
        code_selections: vec![pb::SelectedCodeSelection {
            content: "let x = 1;".into(),
            path: "/w/src/lib.rs".into(),
            relative_path: Some("src/lib.rs".into()),
            range: Some(pb::Range {
                start: Some(position(4)),
                end: Some(position(6)),
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
        selected_images: vec![
            image("shot.png", "image/png", DataOrBlobId::Data(png("inline"))),
            image(
                "held.jpg",
                "image/jpeg",
                DataOrBlobId::BlobId(BlobId::of(held).0.to_vec()),
            ),
        ],
        ..Default::default()
    }
}

/// The image parts of a request, as `(mime, base64)`, in each family's shape.
fn images_in(kind: &str, request: &Value) -> Vec<(String, String)> {
    let text = request.to_string();
    let mut out = Vec::new();
    let data_url = |url: &str| {
        let (head, data) = url.split_once(";base64,").expect("a base64 data URL");
        (head.trim_start_matches("data:").to_owned(), data.to_owned())
    };
    let mut walk = vec![serde_json::from_str::<Value>(&text).unwrap()];
    while let Some(value) = walk.pop() {
        match &value {
            Value::Object(map) => {
                match (kind, map.get("type").and_then(Value::as_str)) {
                    ("openai-chat", Some("image_url")) => {
                        out.push(data_url(map["image_url"]["url"].as_str().unwrap()))
                    }
                    ("openai-responses", Some("input_image")) => {
                        out.push(data_url(map["image_url"].as_str().unwrap()))
                    }
                    ("anthropic", Some("image")) => out.push((
                        map["source"]["media_type"].as_str().unwrap().to_owned(),
                        map["source"]["data"].as_str().unwrap().to_owned(),
                    )),
                    _ => {}
                }
                walk.extend(map.values().rev().cloned());
            }
            Value::Array(items) => walk.extend(items.iter().rev().cloned()),
            _ => {}
        }
    }
    out
}

fn without_cache_control(value: &Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(k, _)| k.as_str() != "cache_control")
                .map(|(k, v)| (k.clone(), without_cache_control(v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(without_cache_control).collect()),
        other => other.clone(),
    }
}

#[tokio::test]
async fn attachments_and_images_reach_every_family_in_its_shape_and_replay_byte_for_byte() {
    for (endpoint, kind, key) in [
        ("openai_chat", "openai-chat", "messages"),
        ("openai_responses", "openai-responses", "input"),
        ("anthropic", "anthropic", "messages"),
    ] {
        let provider = FakeProvider::start().await;
        provider.push(golden(endpoint, "text"));
        provider.push(golden(endpoint, "text"));
        let server = TestServer::start_kind(&provider.base_url(), kind).await;
        let cursor = FakeCursor::new(server.addr);
        let held = png("held by the client");
        let mut first = Session::start_with_blobs(
            &cursor,
            "req-img-1",
            &with_context(run_request("conv-img", "what is wrong?"), everything(&held)),
            [(BlobId::of(&held).0.to_vec(), held.clone())]
                .into_iter()
                .collect(),
        )
        .await;
        while first.next().await.is_some() {}
        assert!(
            first.transcript.is_success(),
            "{kind}: {:?}",
            first.transcript.end
        );
        let second = Session::start(&cursor, "req-img-2", &run_request("conv-img", "and now?"))
            .await
            .finish()
            .await;
        assert!(second.is_success(), "{kind}: {:?}", second.end);

        let requests = provider.requests();
        let text = requests[0][key].to_string();
        for expected in [
            r#"<file path=\"src/main.rs\">"#,
            r#"<code_selection path=\"src/lib.rs\" lines=\"4-6\">"#,
            "Always use tabs.",
            r#"<command name=\"/review\">"#,
            r#"<terminal title=\"cargo\" lines=\"3-3\">"#,
        ] {
            assert!(
                text.contains(expected),
                "{kind}: {expected} missing from {text}"
            );
        }
        assert_eq!(
            images_in(kind, &requests[0][key]),
            [
                ("image/png".to_owned(), base64(&png("inline"))),
                // Labelled JPEG, but the bytes are a PNG: sent as what it is.
                ("image/png".to_owned(), base64(&held)),
            ],
            "{kind}"
        );
        let (before, after) = (
            without_cache_control(&requests[0][key]),
            without_cache_control(&requests[1][key]),
        );
        let (before, after) = (before.as_array().unwrap(), after.as_array().unwrap());
        assert_eq!(
            &after[..before.len()],
            before.as_slice(),
            "{kind}: replayed byte for byte"
        );
    }
}

#[tokio::test]
async fn images_are_stored_once_and_replayed_the_same_after_a_restart() {
    use pb::selected_image::DataOrBlobId;
    let provider = FakeProvider::start().await;
    provider.push(Reply::sse(text_events(&["a cat"], (30, 1, 0))));
    provider.push(Reply::sse(text_events(&["still a cat"], (40, 1, 0))));
    let server = TestServer::start(&provider.base_url()).await;
    let cursor = FakeCursor::new(server.addr);
    let context = pb::SelectedContext {
        selected_images: vec![image(
            "cat.png",
            "image/png",
            DataOrBlobId::Data(png("cat")),
        )],
        ..Default::default()
    };
    let first = Session::start(
        &cursor,
        "req-restart-1",
        &with_context(run_request("conv-restart", "what is it?"), context),
    )
    .await
    .finish()
    .await;
    assert!(first.is_success(), "{:?}", first.end);
    let db_dir = server.stop().await;
    let store = cursor_server::store::Store::open(&format!(
        "sqlite://{}",
        db_dir.path().join("test.db").display()
    ))
    .await
    .unwrap();
    let rows = cursor_server::store::messages::load(&store, "conv-restart")
        .await
        .unwrap();
    let body = serde_json::to_string(&rows).unwrap();
    assert!(
        !body.contains(&base64(&png("cat"))),
        "history keeps the image's blob id, not its bytes"
    );
    // Garbage collection keeps an image history shows.
    cursor_server::sync::projection::collect_garbage(&store, std::time::Duration::ZERO)
        .await
        .unwrap();
    let kept = cursor_server::store::blobs::get(&store, BlobId::of(&png("cat")))
        .await
        .unwrap();
    assert_eq!(kept, Some(png("cat")), "gc kept the image");
    drop(store);

    let server = TestServer::start_in(&provider.base_url(), db_dir, "").await;
    let cursor = FakeCursor::new(server.addr);
    let second = Session::start(
        &cursor,
        "req-restart-2",
        &run_request("conv-restart", "sure?"),
    )
    .await
    .finish()
    .await;
    assert!(second.is_success(), "{:?}", second.end);
    let requests = provider.requests();
    let before = requests[0]["messages"].as_array().unwrap();
    assert_eq!(
        &requests[1]["messages"].as_array().unwrap()[..before.len()],
        before.as_slice()
    );
    assert_eq!(images_in("openai-chat", &requests[1]["messages"]).len(), 1);
}

#[tokio::test]
async fn a_model_without_vision_is_told_the_images_name_instead() {
    use pb::selected_image::DataOrBlobId;
    let provider = FakeProvider::start().await;
    provider.push(Reply::sse(text_events(&["I cannot see it"], (30, 1, 0))));
    let server = TestServer::start_edited(&provider.base_url(), "openai-chat", |text| {
        text.replace("vision = true", "vision = false")
    })
    .await;
    let cursor = FakeCursor::new(server.addr);
    let context = pb::SelectedContext {
        selected_images: vec![image("ui.png", "image/png", DataOrBlobId::Data(png("ui")))],
        ..Default::default()
    };
    let transcript = Session::start(
        &cursor,
        "req-blind",
        &with_context(run_request("conv-blind", "look"), context),
    )
    .await
    .finish()
    .await;
    assert!(transcript.is_success(), "{:?}", transcript.end);
    let request = &provider.requests()[0]["messages"];
    assert!(images_in("openai-chat", request).is_empty());
    let text = request.to_string();
    assert!(
        text.contains("[Image ui.png (image/png, 1 KB): not shown, the model test-model is not configured to see images.]"),
        "{text}"
    );
}

#[tokio::test]
async fn an_image_too_large_for_the_family_is_a_clear_error_and_nothing_is_stored() {
    use pb::selected_image::DataOrBlobId;
    let provider = FakeProvider::start().await;
    provider.push(golden("anthropic", "text"));
    let server = TestServer::start_kind(&provider.base_url(), "anthropic").await;
    let cursor = FakeCursor::new(server.addr);
    let mut huge = png("huge");
    huge.resize(6 * 1024 * 1024, 0);
    let context = pb::SelectedContext {
        selected_images: vec![image("huge.png", "image/png", DataOrBlobId::Data(huge))],
        ..Default::default()
    };
    let refused = Session::start(
        &cursor,
        "req-huge",
        &with_context(run_request("conv-huge", "too big"), context),
    )
    .await
    .finish()
    .await;
    assert_eq!(
        refused.error_code(),
        Some("invalid_argument"),
        "{:?}",
        refused.end
    );
    let message = refused.end.as_ref().unwrap()["error"]["message"].to_string();
    assert!(
        message.contains("huge.png") && message.contains("5 MB") && message.contains("Anthropic"),
        "{message}"
    );
    assert!(provider.requests().is_empty(), "no provider call");
    // Nothing of the refused message was stored: the next turn starts clean.
    let next = Session::start(&cursor, "req-after-huge", &run_request("conv-huge", "hi"))
        .await
        .finish()
        .await;
    assert!(next.is_success(), "{:?}", next.end);
    assert!(!provider.requests()[0].to_string().contains("too big"));
}

#[tokio::test]
async fn an_mcp_tools_images_follow_its_result_as_a_user_message_on_chat() {
    let provider = FakeProvider::start().await;
    provider.push(Reply::sse(tool_call_events(
        None,
        &[("call_s", "mcp_browser_screenshot", "{}")],
        (10, 1, 0),
    )));
    provider.push(Reply::sse(text_events(&["The page is blank."], (20, 2, 0))));
    let server = TestServer::start(&provider.base_url()).await;
    let cursor = FakeCursor::new(server.addr);
    let mut message = run_request_with_env("conv-mcp-img", "screenshot it");
    if let Some(agent_client_message::Message::RunRequest(request)) = &mut message.message {
        request.mcp_tools = Some(pb::McpTools {
            mcp_tools: vec![pb::McpToolDefinition {
                name: "browser-screenshot".into(),
                provider_identifier: "browser".into(),
                tool_name: "screenshot".into(),
                description: "Takes a screenshot".into(),
                input_schema: Some(cursor_server::tools::exec::json_to_proto(
                    &serde_json::json!({"type": "object", "properties": {}}),
                )),
            }],
        });
    }
    let mut turn = Session::start(&cursor, "req-mcp-img", &message).await;
    let exec = turn.next_exec().await;
    let item = |content| pb::McpToolResultContentItem {
        content: Some(content),
    };
    turn.send(&exec_result(
        exec.id,
        pb::exec_client_message::Message::McpResult(pb::McpResult {
            result: Some(pb::mcp_result::Result::Success(pb::McpSuccess {
                content: vec![
                    item(pb::mcp_tool_result_content_item::Content::Text(
                        pb::McpTextContent {
                            text: "captured".into(),
                            output_location: None,
                        },
                    )),
                    item(pb::mcp_tool_result_content_item::Content::Image(
                        pb::McpImageContent {
                            data: png("page"),
                            mime_type: "image/png".into(),
                        },
                    )),
                ],
                ..pb::McpSuccess::default()
            })),
        }),
    ))
    .await;
    let transcript = turn.finish().await;
    assert!(transcript.is_success(), "{:?}", transcript.end);
    let messages = provider.requests()[1]["messages"]
        .as_array()
        .unwrap()
        .clone();
    let tool_at = messages
        .iter()
        .position(|m| m["role"] == "tool")
        .expect("the tool result");
    assert!(
        messages[tool_at]["content"]
            .as_str()
            .unwrap()
            .contains("captured")
    );
    let follow = &messages[tool_at + 1];
    assert_eq!(follow["role"], "user");
    assert!(
        follow["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("mcp_browser_screenshot"),
        "{follow}"
    );
    assert_eq!(
        images_in("openai-chat", follow),
        [("image/png".to_owned(), base64(&png("page")))]
    );
}

/// A CLI client's answer to `request_context_args`: its rules, environment and MCP tools.
fn cli_context() -> pb::RequestContext {
    pb::RequestContext {
        rules: vec![pb::CursorRule {
            full_path: "AGENTS.md".into(),
            content: "Run cargo fmt before you finish.".into(),
            ..Default::default()
        }],
        env: Some(pb::RequestContextEnv {
            os_version: "linux 6.8".into(),
            shell: "zsh".into(),
            workspace_paths: vec!["/home/user/cli-project".into()],
            ..Default::default()
        }),
        tools: vec![pb::McpToolDefinition {
            name: "db-query".into(),
            provider_identifier: "db".into(),
            tool_name: "query".into(),
            description: "Runs SQL".into(),
            input_schema: Some(cursor_server::tools::exec::json_to_proto(
                &serde_json::json!({"type": "object", "properties": {"sql": {"type": "string"}}}),
            )),
        }],
        ..Default::default()
    }
}

#[tokio::test]
async fn a_cli_run_request_without_context_asks_for_it_first_and_its_rules_reach_the_model() {
    let provider = FakeProvider::start().await;
    provider.push(Reply::sse(text_events(&["formatted"], (30, 1, 0))));
    provider.push(Reply::sse(text_events(&["again"], (40, 1, 0))));
    let server = TestServer::start(&provider.base_url()).await;
    let cursor = FakeCursor::new(server.addr);
    let mut turn = Session::start(&cursor, "req-cli", &cli_run_request("conv-cli", "fix it")).await;
    let ask = turn.next_exec().await;
    assert!(
        matches!(
            ask.message,
            Some(pb::exec_server_message::Message::RequestContextArgs(_))
        ),
        "{ask:?}"
    );
    assert!(
        provider.requests().is_empty(),
        "asked before any provider call"
    );
    turn.send(&context_answer(ask.id, cli_context())).await;
    let transcript = turn.finish().await;
    assert!(transcript.is_success(), "{:?}", transcript.end);
    assert!(
        transcript.completed_cards().is_empty(),
        "the exec is not a tool"
    );
    let request = &provider.requests()[0];
    let text = request["messages"].to_string();
    for expected in [
        "Run cargo fmt before you finish.",
        "/home/user/cli-project",
        "zsh",
    ] {
        assert!(text.contains(expected), "{expected} missing from {text}");
    }
    assert!(
        fixtures::offered_tools(request).contains(&"mcp_db_query".to_owned()),
        "{:?}",
        fixtures::offered_tools(request)
    );
    // The exec added no history: the next (IDE-style) turn replays the same messages, with no
    // tool call or result for it.
    let next = Session::start(&cursor, "req-cli-2", &run_request("conv-cli", "thanks"))
        .await
        .finish()
        .await;
    assert!(next.is_success(), "{:?}", next.end);
    let second = provider.requests()[1]["messages"]
        .as_array()
        .unwrap()
        .clone();
    assert!(
        second
            .iter()
            .all(|m| m["role"] != "tool" && m.get("tool_calls").is_none())
    );
}

/// A CLI client's answer to the server's request-context exec `id`.
fn context_answer(id: u32, context: pb::RequestContext) -> pb::AgentClientMessage {
    exec_result(
        id,
        pb::exec_client_message::Message::RequestContextResult(pb::RequestContextResult {
            result: Some(pb::request_context_result::Result::Success(
                pb::RequestContextSuccess {
                    request_context: Some(context),
                },
            )),
        }),
    )
}

/// A CLI client's own system prompt, which it sends both as a root and as a rule.
const CLI_INSTRUCTIONS: &str = "You are the terminal agent (marker cli-7f3e). Keep answers short; run tests before you finish.";

/// The request context a CLI client answers with when its instructions are also a rule.
fn cli_context_with_instructions() -> pb::RequestContext {
    let mut context = cli_context();
    context.rules.push(pb::CursorRule {
        full_path: "cli-instructions".into(),
        content: CLI_INSTRUCTIONS.into(),
        ..Default::default()
    });
    context
}

/// One CLI turn: the run request with `state` (its roots in `blobs`), the request context asked
/// for and answered; returns the session, ended.
async fn cli_turn<'a>(
    cursor: &'a FakeCursor,
    request_id: &str,
    text: &str,
    state: pb::ConversationStateStructure,
    blobs: std::collections::HashMap<Vec<u8>, Vec<u8>>,
) -> Session<'a> {
    let mut request = cli_run_request("conv-cli-twice", text);
    if let Some(agent_client_message::Message::RunRequest(run)) = &mut request.message {
        run.conversation_state = Some(state);
    }
    let mut turn = Session::start_with_blobs(cursor, request_id, &request, blobs).await;
    let ask = turn.next_exec().await;
    turn.send(&context_answer(ask.id, cli_context_with_instructions()))
        .await;
    while turn.next().await.is_some() {}
    assert!(turn.transcript.is_success(), "{:?}", turn.transcript.end);
    turn
}

#[tokio::test]
async fn a_cli_clients_instructions_sent_as_a_root_and_a_rule_reach_the_model_once() {
    let provider = FakeProvider::start().await;
    provider.push(Reply::sse(text_events(&["done"], (30, 1, 0))));
    provider.push(Reply::sse(text_events(&["again"], (40, 1, 0))));
    let server = TestServer::start(&provider.base_url()).await;
    let cursor = FakeCursor::new(server.addr);
    let root = serde_json::json!({"role": "system", "content": CLI_INSTRUCTIONS})
        .to_string()
        .into_bytes();
    let root_id = BlobId::of(&root).0.to_vec();
    let state = pb::ConversationStateStructure {
        root_prompt_messages_json: vec![root_id.clone()],
        ..Default::default()
    };
    let blobs = std::collections::HashMap::from([(root_id, root)]);
    let first = cli_turn(&cursor, "req-cli-x1", "fix it", state, blobs.clone()).await;
    let marker_count =
        |request: &Value| request["messages"].to_string().matches("cli-7f3e").count();
    assert_eq!(marker_count(&provider.requests()[0]), 1, "turn 1");

    // Its next turn reaches a server without the conversation: imported from its checkpoint.
    let state = (*first.transcript.checkpoints().last().expect("checkpoint")).clone();
    let mut held = first.blobs.clone();
    held.extend(blobs);
    let other = TestServer::start(&provider.base_url()).await;
    let cursor = FakeCursor::new(other.addr);
    cli_turn(&cursor, "req-cli-x2", "again", state, held).await;
    let requests = provider.requests();
    assert_eq!(marker_count(&requests[1]), 1, "turn 2");
    let first_messages = requests[0]["messages"].as_array().unwrap();
    let second_messages = requests[1]["messages"].as_array().unwrap();
    assert_eq!(
        &second_messages[..first_messages.len()],
        first_messages.as_slice(),
        "the import reads as the original: the provider's cache still applies"
    );
    assert_eq!(
        &second_messages[first_messages.len()..],
        &[
            serde_json::json!({"role":"assistant","content":"done"}),
            serde_json::json!({"role":"user","content":"again"}),
        ]
    );
}

#[tokio::test]
async fn a_cli_client_that_throws_on_the_context_request_proceeds_without_context() {
    let provider = FakeProvider::start().await;
    provider.push(Reply::sse(text_events(&["ok"], (30, 1, 0))));
    let server = TestServer::start(&provider.base_url()).await;
    let cursor = FakeCursor::new(server.addr);
    let mut turn = Session::start(
        &cursor,
        "req-cli-throw",
        &cli_run_request("conv-cli-throw", "go"),
    )
    .await;
    let ask = turn.next_exec().await;
    turn.send(&fixtures::throw(ask.id, "no workspace here"))
        .await;
    let transcript = turn.finish().await;
    assert!(transcript.is_success(), "{:?}", transcript.end);
    let messages = provider.requests()[0]["messages"]
        .as_array()
        .unwrap()
        .clone();
    let users: Vec<&Value> = messages.iter().filter(|m| m["role"] == "user").collect();
    assert_eq!(
        users,
        [&serde_json::json!({"role": "user", "content": "go"})],
        "no context message"
    );
}

/// A CLI client's run reads the conversation while the client gathers its request context. A
/// message another client sends on the same conversation meanwhile is in the history the CLI's
/// turn gives the model, once, before its own; nothing of a call made on the first reading
/// reaches the client, and the stored history has every message once.
#[tokio::test]
async fn a_message_sent_while_a_cli_client_gathers_its_context_is_in_the_history_its_turn_sends() {
    let provider = FakeProvider::start().await;
    for text in ["one", "two", "three", "three", "four"] {
        provider.push(Reply::sse(text_events(&[text], (30, 1, 0))));
    }
    let server = TestServer::start(&provider.base_url()).await;
    let cursor = FakeCursor::new(server.addr);
    let conversation = "conv-cli-moved";
    let ide_turn = |request_id: &'static str, text: &'static str| {
        let cursor = &cursor;
        async move {
            let request = run_request(conversation, text);
            let transcript = Session::start(cursor, request_id, &request)
                .await
                .finish()
                .await;
            assert!(
                transcript.is_success(),
                "{request_id}: {:?}",
                transcript.end
            );
            transcript
        }
    };
    ide_turn("req-moved-1", "first").await;
    let mut cli = Session::start(
        &cursor,
        "req-moved-3",
        &cli_run_request(conversation, "third"),
    )
    .await;
    let ask = cli.next_exec().await;
    // Another client's message, whole, while the CLI client has not answered yet.
    ide_turn("req-moved-2", "second").await;
    cli.send(&context_answer(ask.id, cli_context())).await;
    let third = cli.finish().await;
    assert!(third.is_success(), "{:?}", third.end);
    assert_eq!(
        third.text(),
        "three",
        "only the call made on the whole history reached the client"
    );
    let in_order = |request: &Value, texts: &[&str]| {
        let sent = request["messages"].to_string();
        let places: Vec<Option<usize>> =
            texts.iter().map(|t| sent.find(&format!("\"{t}"))).collect();
        assert!(
            places.iter().all(Option::is_some) && places.windows(2).all(|w| w[0] < w[1]),
            "{texts:?} in order in {sent}"
        );
        for text in texts {
            assert_eq!(
                sent.matches(&format!("\"{text}\"")).count(),
                1,
                "{text} once in {sent}"
            );
        }
    };
    let requests = provider.requests();
    // Turn 1, the other client's turn, at most one call dropped, the CLI's turn.
    assert!(
        (3..=4).contains(&requests.len()),
        "{} calls",
        requests.len()
    );
    in_order(
        &requests[requests.len() - 1],
        &["first", "one", "second", "two", "third"],
    );
    ide_turn("req-moved-4", "fourth").await;
    in_order(
        provider.requests().last().unwrap(),
        &["first", "one", "second", "two", "third", "three", "fourth"],
    );
}

/// A run_request on `conversation` carrying `action` (instead of a user message).
fn action_request(
    conversation: &str,
    action: conversation_action::Action,
) -> pb::AgentClientMessage {
    let mut message = run_request(conversation, "unused");
    if let Some(agent_client_message::Message::RunRequest(request)) = &mut message.message {
        request.action = Some(pb::ConversationAction {
            action: Some(action),
            ..Default::default()
        });
    }
    message
}

#[tokio::test]
async fn start_plan_action_runs_the_message_in_plan_mode() {
    let provider = FakeProvider::start().await;
    provider.push(Reply::sse(text_events(&["A plan."], (30, 1, 0))));
    let server = TestServer::start(&provider.base_url()).await;
    let cursor = FakeCursor::new(server.addr);
    let start = conversation_action::Action::StartPlanAction(pb::StartPlanAction {
        user_message: Some(pb::UserMessage {
            text: "plan the migration".into(),
            message_id: "m-plan".into(),
            ..Default::default()
        }),
        request_context: Some(Default::default()),
        ..Default::default()
    });
    let transcript = Session::start(&cursor, "req-start-plan", &action_request("conv-sp", start))
        .await
        .finish()
        .await;
    assert!(transcript.is_success(), "{:?}", transcript.end);
    let request = &provider.requests()[0];
    assert!(
        request["messages"]
            .to_string()
            .contains("plan the migration")
    );
    let tools = fixtures::offered_tools(request);
    assert!(tools.contains(&"CreatePlan".to_owned()), "{tools:?}");
    assert!(
        !tools.contains(&"StrReplace".to_owned()),
        "Plan mode does not edit: {tools:?}"
    );
}

/// Issue 29 (4): a command the user typed for the agent's shell (`shell_command_action`) runs
/// through the client's shell exec under the action's `exec_id`, streamed onto a Shell card; its
/// command and output are stored as the user's action and the next model call sees them, once.
#[tokio::test]
async fn a_command_the_user_ran_runs_in_the_clients_shell_and_the_next_call_sees_its_output() {
    let provider = FakeProvider::start().await;
    provider.push(Reply::sse(text_events(&["Noted."], (30, 1, 0))));
    let server = TestServer::start(&provider.base_url()).await;
    let cursor = FakeCursor::new(server.addr);
    let ran = conversation_action::Action::ShellCommandAction(pb::ShellCommandAction {
        shell_command: Some(pb::ShellCommand {
            command: "git stash".into(),
        }),
        exec_id: "exec-77".into(),
    });
    let mut session = Session::start(&cursor, "req-ran", &action_request("conv-ran", ran)).await;
    let exec = session.next_exec().await;
    assert_eq!(exec.exec_id, "exec-77", "under the client's own id");
    let Some(pb::exec_server_message::Message::ShellStreamArgs(args)) = &exec.message else {
        panic!("a shell exec: {exec:?}");
    };
    assert_eq!(args.command, "git stash");
    let stream = |event| {
        fixtures::exec_result(
            exec.id,
            pb::exec_client_message::Message::ShellStream(pb::ShellStream { event: Some(event) }),
        )
    };
    session
        .send(&stream(pb::shell_stream::Event::Stdout(
            pb::ShellStreamStdout {
                data: "Saved working directory and index state WIP on main\n".into(),
            },
        )))
        .await;
    session
        .send(&stream(pb::shell_stream::Event::Exit(
            pb::ShellStreamExit {
                code: 0,
                ..Default::default()
            },
        )))
        .await;
    let told = session.finish().await;
    assert!(told.is_success(), "{:?}", told.end);
    let kinds = told.kinds();
    for kind in [
        "tool_call_started",
        "tool_call_delta",
        "tool_call_completed",
    ] {
        assert!(kinds.contains(&kind), "the Shell card: {kinds:?}");
    }
    let Some(pb::tool_call::Tool::ShellToolCall(card)) = told.completed_cards()[0]
        .tool_call
        .clone()
        .and_then(|c| c.tool)
    else {
        panic!("a Shell card");
    };
    assert!(matches!(
        card.result.and_then(|r| r.result),
        Some(pb::shell_result::Result::Success(_))
    ));
    assert!(
        provider.requests().is_empty(),
        "no model call for the user's command"
    );
    let next = Session::start(
        &cursor,
        "req-after-ran",
        &run_request("conv-ran", "what now?"),
    )
    .await
    .finish()
    .await;
    assert!(next.is_success(), "{:?}", next.end);
    let text = provider.requests()[0]["messages"].to_string();
    assert_eq!(text.matches("<user_ran_command>").count(), 1, "{text}");
    assert!(text.contains("git stash"), "{text}");
    assert!(text.contains("Saved working directory"), "{text}");
}

#[tokio::test]
async fn canceling_a_subagent_stops_its_run_and_leaves_the_parent_alone() {
    let provider = FakeProvider::start().await;
    // The subagent's run is mid-call when the user cancels it.
    provider.push(Reply::sse(tool_call_events(
        None,
        &[("call_r", "Read", r#"{"path":"a.rs"}"#)],
        (10, 1, 0),
    )));
    let server = TestServer::start(&provider.base_url()).await;
    let cursor = FakeCursor::new(server.addr);
    let mut subagent = Session::start(
        &cursor,
        "req-sub",
        &run_request_with_env("agent-42", "explore the code"),
    )
    .await;
    let _read = subagent.next_exec().await;
    let cancel = conversation_action::Action::CancelSubagentAction(pb::CancelSubagentAction {
        subagent_id: "agent-42".into(),
    });
    let canceled = Session::start(
        &cursor,
        "req-cancel",
        &action_request("conv-parent", cancel),
    )
    .await
    .finish()
    .await;
    assert!(canceled.is_success(), "{:?}", canceled.end);
    let stopped = subagent.finish().await;
    assert!(
        !stopped.is_success(),
        "the subagent's run was stopped: {:?}",
        stopped.end
    );
    assert_eq!(
        provider.requests().len(),
        1,
        "no provider call for the cancel"
    );
}

#[tokio::test]
async fn moving_a_running_shell_to_the_background_does_not_interrupt_the_turn() {
    let provider = FakeProvider::start().await;
    provider.push(Reply::sse(tool_call_events(
        None,
        &[("call_s", "Shell", r#"{"command":"npm test"}"#)],
        (10, 1, 0),
    )));
    provider.push(Reply::sse(text_events(
        &["Tests run in the background."],
        (20, 1, 0),
    )));
    let server = TestServer::start(&provider.base_url()).await;
    let cursor = FakeCursor::new(server.addr);
    let mut turn = Session::start(
        &cursor,
        "req-shell",
        &run_request_with_env("conv-bg", "test"),
    )
    .await;
    let exec = turn.next_exec().await;
    let moved = conversation_action::Action::BackgroundShellAction(pb::BackgroundShellAction {
        tool_call_id: "call_s".into(),
    });
    let acknowledged = Session::start(&cursor, "req-move", &action_request("conv-bg", moved))
        .await
        .finish()
        .await;
    assert!(acknowledged.is_success(), "{:?}", acknowledged.end);
    // The client moves the process and says so on the call's own stream; the turn goes on.
    turn.send(&exec_result(
        exec.id,
        pb::exec_client_message::Message::ShellStream(pb::ShellStream {
            event: Some(pb::shell_stream::Event::Backgrounded(
                pb::ShellStreamBackgrounded {
                    shell_id: 3,
                    command: "npm test".into(),
                    ..Default::default()
                },
            )),
        }),
    ))
    .await;
    let transcript = turn.finish().await;
    assert!(transcript.is_success(), "{:?}", transcript.end);
    assert_eq!(provider.requests().len(), 2);
}

#[tokio::test]
async fn results_of_calls_pending_at_an_interrupt_reach_the_model_before_the_next_message() {
    let provider = FakeProvider::start().await;
    provider.push(Reply::sse(text_events(&["The build passed."], (30, 1, 0))));
    let server = TestServer::start(&provider.base_url()).await;
    let cursor = FakeCursor::new(server.addr);
    let mut message = run_request("conv-resolved", "did it pass?");
    if let Some(agent_client_message::Message::RunRequest(request)) = &mut message.message
        && let Some(conversation_action::Action::UserMessageAction(action)) =
            request.action.as_mut().and_then(|a| a.action.as_mut())
    {
        action.interrupted_pending_tool_call_resolutions =
            Some(pb::InterruptedPendingToolCallResolutions {
                resolutions: vec![pb::InterruptedPendingToolCallResolution {
                    tool_call_id: "call_build".into(),
                    resolution: Some(
                        pb::interrupted_pending_tool_call_resolution::Resolution::ShellResult(
                            pb::ShellResult {
                                result: Some(pb::shell_result::Result::Success(pb::ShellSuccess {
                                    command: "cargo build".into(),
                                    exit_code: 0,
                                    stdout: "Finished release".into(),
                                    ..Default::default()
                                })),
                                ..Default::default()
                            },
                        ),
                    ),
                }],
            });
    }
    let transcript = Session::start(&cursor, "req-resolved", &message)
        .await
        .finish()
        .await;
    assert!(transcript.is_success(), "{:?}", transcript.end);
    let users: Vec<String> = provider.requests()[0]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "user")
        .map(|m| m["content"].as_str().unwrap_or_default().to_owned())
        .collect();
    let told = users
        .iter()
        .position(|u| u.contains("<interrupted_call_result>") && u.contains("call_build"))
        .expect("the resolution is told");
    assert!(users[told].contains("exit code 0") && users[told].contains("Finished release"));
    assert_eq!(users[told + 1], "did it pass?");
}
