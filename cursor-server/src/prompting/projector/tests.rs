//! projector.rs's unit tests: each family's shape, replay rules, and that appending history only
//! appends to the request.

use super::*;
use crate::config::ProviderKind;
use crate::model::message::ProviderReplay;
use crate::prompting::compiler::Effort;
pub use crate::provider::family::project;
use crate::provider::{anthropic, openai_chat, openai_responses};
use serde_json::Map;

/// A body as the provider reads it.
fn tree(body: crate::provider::RequestBody) -> Value {
    serde_json::from_slice(body.as_bytes()).expect("a body is JSON")
}

fn openai_chat(request: &ModelRequest<'_>) -> Value {
    tree(openai_chat::request_body(request))
}

fn openai_responses(request: &ModelRequest<'_>) -> Value {
    tree(openai_responses::request_body(request))
}

fn anthropic(request: &ModelRequest<'_>) -> Value {
    tree(anthropic::request_body(request))
}
use crate::config::{ModelConfig, Quirks};
use crate::model::message::{Origin, UserMessage};
use crate::model::tool::{ToolCall, ToolResult};
use crate::prompting::compiler::{RequestParameters, compile};
use crate::prompting::images::ImageSet;

static NO_IMAGES: std::sync::LazyLock<ImageSet> = std::sync::LazyLock::new(ImageSet::default);

fn model(reasoning: bool) -> ModelConfig {
    ModelConfig {
        id: "m".into(),
        upstream_id: "up-m".into(),
        display_name: "M".into(),
        context_window: 1000,
        reasoning,
        max_output_tokens: Some(4096),
        thinking_budget: None,
        vision: true,
        quirks: Quirks {
            stream_usage: true,
            reasoning_content_on_tool_calls: reasoning,
            extra_body: Map::new(),
        },
        pricing: None,
        aliases: Vec::new(),
        fallbacks: Vec::new(),
        context_fallback: None,
    }
}

fn user(text: &str) -> CanonicalMessage {
    CanonicalMessage::User(UserMessage {
        images: Vec::new(),
        shown_as: None,
        state_before: None,
        origin: Origin::User,
        text: text.into(),
        client_message_id: String::new(),
        mode: None,
        runtime: None,
    })
}

/// A turn with two parallel calls whose results were stored in reverse order, one call left
/// unanswered (cut short), then a final answer.
fn history(replay: Option<ProviderReplay>) -> Vec<CanonicalMessage> {
    let call = |index: u32, id: &str| {
        CanonicalMessage::ToolCall(ToolCallRecord {
            model_call_id: "mc1".into(),
            index,
            call: ToolCall {
                call_id: format!("c{index}"),
                provider_call_id: id.into(),
                name: "Read".into(),
                arguments: format!(r#"{{"path":"f{index}"}}"#),
            },
        })
    };
    let result = |index: u32| {
        CanonicalMessage::ToolResult(ToolResultRecord {
            card: None,
            model_call_id: "mc1".into(),
            index,
            result: ToolResult {
                images: Vec::new(),
                call_id: format!("c{index}"),
                content: format!("content {index}"),
                is_error: false,
                meta: None,
            },
        })
    };
    vec![
        user("hi"),
        CanonicalMessage::Assistant(AssistantMessage {
            thinking_spans: Vec::new(),
            text: String::new(),
            thinking: "t".into(),
            model_id: "m".into(),
            replay,
            model_call_id: "mc1".into(),
            planned_calls: Vec::new(),
        }),
        call(1, "functions.Read:1"),
        result(1),
        call(0, "call_0"),
        result(0),
    ]
}

#[test]
fn chat_gathers_calls_in_order_and_sends_empty_reasoning_for_thinking_models() {
    let model = model(true);
    let history = history(None);
    let body = openai_chat(&compile(
        "system prompt",
        &history,
        &model,
        &[],
        RequestParameters::default(),
        &NO_IMAGES,
    ));
    let messages = body["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 5);
    assert_eq!(messages[2]["tool_calls"][0]["id"], "call_0");
    assert_eq!(messages[2]["tool_calls"][1]["id"], "functions.Read:1");
    assert_eq!(
        messages[2]["reasoning_content"], "",
        "placeholder, not invented thinking"
    );
    assert_eq!(messages[2]["content"], Value::Null);
    assert_eq!(messages[3]["tool_call_id"], "call_0");
    assert_eq!(messages[4]["content"], "content 1");
}

#[test]
fn output_limits_and_effort_go_where_each_family_and_model_takes_them() {
    let history = vec![user("hi")];
    let parameters = RequestParameters {
        effort: Some(Effort::High),
        ..RequestParameters::default()
    };
    let body = |model: &ModelConfig, project: fn(&ModelRequest<'_>) -> Value| {
        project(&compile("s", &history, model, &[], parameters, &NO_IMAGES))
    };
    let plain = model(false);
    let chat = body(&plain, openai_chat);
    assert_eq!(chat["max_tokens"], 4096);
    assert!(chat.get("max_completion_tokens").is_none());
    assert!(
        chat.get("reasoning_effort").is_none(),
        "effort only for reasoning models"
    );
    let thinking = body(&model(true), openai_chat);
    assert_eq!(thinking["max_completion_tokens"], 4096);
    assert!(thinking.get("max_tokens").is_none());
    assert_eq!(thinking["reasoning_effort"], "high");
    let responses = body(&plain, openai_responses);
    assert_eq!(responses["max_output_tokens"], 4096);
    assert!(responses.get("reasoning").is_none());
    let unset = ModelConfig {
        max_output_tokens: None,
        ..model(false)
    };
    assert!(body(&unset, openai_chat).get("max_tokens").is_none());
    assert!(
        body(&unset, openai_responses)
            .get("max_output_tokens")
            .is_none()
    );
    assert_eq!(
        body(&unset, anthropic)["max_tokens"],
        32_000,
        "Anthropic requires one"
    );
}

#[test]
fn responses_replays_items_verbatim_and_drops_unanswered_calls() {
    let items = vec![
        json!({"type":"reasoning","id":"rs_1","summary":[],"encrypted_content":"enc"}),
        json!({"type":"function_call","id":"fc_0","call_id":"call_0","name":"Read","arguments":"{\"path\":\"f0\"}"}),
        json!({"type":"function_call","id":"fc_1","call_id":"functions.Read:1","name":"Read","arguments":"{\"path\":\"f1\"}"}),
        json!({"type":"function_call","id":"fc_2","call_id":"call_2","name":"Read","arguments":"{}"}),
    ];
    let model = model(true);
    let history = history(Some(ProviderReplay::OpenAiResponses {
        items: items.clone(),
    }));
    let body = openai_responses(&compile(
        "system prompt",
        &history,
        &model,
        &[],
        RequestParameters::default(),
        &NO_IMAGES,
    ));
    let input = body["input"].as_array().unwrap();
    assert_eq!(&input[1..4], &items[..3]);
    assert_eq!(
        input[4],
        json!({"type":"function_call_output","call_id":"call_0","output":"content 0"})
    );
    assert_eq!(input[5]["call_id"], "functions.Read:1");
    assert_eq!(input.len(), 6);
    assert_eq!(body["store"], false);
    assert_eq!(body["include"], json!(["reasoning.encrypted_content"]));
}

#[test]
fn anthropic_replays_signed_thinking_first_and_sanitises_foreign_ids() {
    let thinking = vec![json!({"type":"thinking","thinking":"t","signature":"sig"})];
    let model = model(true);
    let history = history(Some(ProviderReplay::Anthropic {
        blocks: thinking.clone(),
    }));
    let body = anthropic(&compile(
        "system prompt",
        &history,
        &model,
        &[],
        RequestParameters::default(),
        &NO_IMAGES,
    ));
    let messages = body["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 3);
    let content = messages[1]["content"].as_array().unwrap();
    assert_eq!(content[0], thinking[0]);
    assert_eq!(content[1]["type"], "tool_use");
    assert_eq!(content[1]["input"], json!({"path":"f0"}));
    assert_eq!(content[2]["id"], "functions_Read_1");
    let results = messages[2]["content"].as_array().unwrap();
    assert_eq!(results[0]["tool_use_id"], "call_0");
    assert_eq!(results[1]["tool_use_id"], "functions_Read_1");
    assert_eq!(body["thinking"], json!({"type":"adaptive"}));

    // From another model, the signature is not ours to replay.
    let mut other = model.clone();
    other.id = "other".into();
    let body = anthropic(&compile(
        "system prompt",
        &history,
        &other,
        &[],
        RequestParameters::default(),
        &NO_IMAGES,
    ));
    let content = body["messages"][1]["content"].as_array().unwrap();
    assert_eq!(content[0]["type"], "tool_use");
}

#[test]
fn anthropic_uses_at_most_four_cache_breakpoints() {
    let model = model(false);
    let tools = crate::prompting::assets::PromptAssets::embedded()
        .unwrap()
        .mode(crate::model::conversation::Mode::Agent)
        .tools
        .clone();
    let mut history = history(None);
    history.push(user("next"));
    let body = tree(project(
        ProviderKind::Anthropic,
        &compile(
            "system prompt",
            &history,
            &model,
            &tools,
            RequestParameters::default(),
            &NO_IMAGES,
        ),
    ));
    let count = body.to_string().matches("cache_control").count();
    assert!(count <= 4 && count == 3, "{count} breakpoints");
    let messages = body["messages"].as_array().unwrap();
    // tool results and the next user text merge into one user turn, results first
    let last = messages.last().unwrap()["content"].as_array().unwrap();
    assert_eq!(last[0]["type"], "tool_result");
    assert_eq!(last.last().unwrap()["text"], "next");
    assert!(last.last().unwrap().get("cache_control").is_some());
}

#[test]
fn switching_families_drops_foreign_reasoning_instead_of_faking_it() {
    let model = model(false);
    let chat_history = history(Some(ProviderReplay::OpenAiChat {
        reasoning_content: "secret chain".into(),
        reasoning_details: Vec::new(),
    }));
    for body in [
        anthropic(&compile(
            "system prompt",
            &chat_history,
            &model,
            &[],
            RequestParameters::default(),
            &NO_IMAGES,
        )),
        openai_responses(&compile(
            "system prompt",
            &chat_history,
            &model,
            &[],
            RequestParameters::default(),
            &NO_IMAGES,
        )),
    ] {
        assert!(!body.to_string().contains("secret chain"), "{body}");
    }
    let anthropic_history = history(Some(ProviderReplay::Anthropic {
        blocks: vec![json!({"type":"thinking","thinking":"claude thoughts","signature":"s"})],
    }));
    let chat = openai_chat(&compile(
        "system prompt",
        &anthropic_history,
        &model,
        &[],
        RequestParameters::default(),
        &NO_IMAGES,
    ));
    assert!(!chat.to_string().contains("claude thoughts"));
    assert!(
        chat["messages"][2].get("reasoning_content").is_none(),
        "not a thinking model: no placeholder"
    );
}

#[test]
fn next_request_extends_the_previous_one() {
    let model = model(false);
    let mut history = vec![user("hi")];
    let first = openai_chat(&compile(
        "system prompt",
        &history,
        &model,
        &[],
        RequestParameters::default(),
        &NO_IMAGES,
    ));
    history.push(CanonicalMessage::Assistant(AssistantMessage {
        thinking_spans: Vec::new(),
        text: "hello".into(),
        thinking: "t".into(),
        model_id: "m".into(),
        model_call_id: "mc1".into(),
        planned_calls: Vec::new(),
        replay: Some(ProviderReplay::OpenAiChat {
            reasoning_content: "t".into(),
            reasoning_details: Vec::new(),
        }),
    }));
    history.push(user("again"));
    let second = openai_chat(&compile(
        "system prompt",
        &history,
        &model,
        &[],
        RequestParameters::default(),
        &NO_IMAGES,
    ));
    let first = first["messages"].as_array().expect("messages");
    let second = second["messages"].as_array().expect("messages");
    assert_eq!(&second[..first.len()], first.as_slice());
    assert_eq!(second[2]["reasoning_content"], "t");
    assert_eq!(second.len(), 4);
}

#[test]
fn a_tool_results_images_go_in_the_result_where_the_family_allows_it() {
    use crate::model::conversation::{BlobId, ImageMime, ImageRef};
    let shot = ImageRef {
        blob: BlobId([7; 32]),
        mime: ImageMime::Png,
        bytes: 4,
        name: "page".into(),
    };
    let mut history = history(None);
    for message in &mut history {
        if let CanonicalMessage::ToolResult(record) = message
            && record.index == 0
        {
            record.result.images = vec![shot.clone()];
        }
    }
    let mut images = ImageSet::default();
    images.insert(shot.blob, b"\x89PNG");
    let model = model(false);
    let request = compile(
        "s",
        &history,
        &model,
        &[],
        RequestParameters::default(),
        &images,
    );
    let encoded = "iVBORw==";

    let body = anthropic(&request);
    let result = body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|m| m["content"].as_array().unwrap())
        .find(|b| b["type"] == "tool_result" && b["tool_use_id"] == "call_0")
        .unwrap()
        .clone();
    assert_eq!(result["content"][0]["text"], "content 0");
    assert_eq!(result["content"][1]["source"]["data"], encoded);
    assert_eq!(result["content"][1]["source"]["media_type"], "image/png");

    let body = openai_responses(&request);
    let output = body["input"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["type"] == "function_call_output" && i["call_id"] == "call_0")
        .unwrap()["output"]
        .clone();
    assert_eq!(output[0]["type"], "input_text");
    assert_eq!(
        output[1]["image_url"],
        format!("data:image/png;base64,{encoded}")
    );

    let body = openai_chat(&request);
    let messages = body["messages"].as_array().unwrap();
    let last_tool = messages.iter().rposition(|m| m["role"] == "tool").unwrap();
    assert_eq!(messages[last_tool + 1]["role"], "user");
    assert_eq!(
        messages[last_tool + 1]["content"][1]["image_url"]["url"],
        format!("data:image/png;base64,{encoded}")
    );
}

#[test]
fn cut_off_arguments_are_replayed_as_valid_json_on_every_family() {
    let mut history = history(None);
    for message in &mut history {
        if let CanonicalMessage::ToolCall(record) = message
            && record.index == 0
        {
            record.call.arguments = r#"{"path": "no"#.into();
        }
    }
    let model = model(false);
    let request = compile(
        "s",
        &history,
        &model,
        &[],
        RequestParameters::default(),
        &NO_IMAGES,
    );
    let chat = openai_chat(&request);
    let sent = chat["messages"][2]["tool_calls"][0]["function"]["arguments"]
        .as_str()
        .unwrap()
        .to_owned();
    let responses = openai_responses(&request);
    let call = responses["input"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["type"] == "function_call" && i["call_id"] == "call_0")
        .unwrap()["arguments"]
        .as_str()
        .unwrap()
        .to_owned();
    for arguments in [sent, call] {
        let parsed: Value = serde_json::from_str(&arguments).expect("valid JSON");
        assert_eq!(parsed["invalid_arguments"], r#"{"path": "no"#);
    }
    // Valid arguments go back byte for byte.
    assert_eq!(
        chat["messages"][2]["tool_calls"][1]["function"]["arguments"],
        r#"{"path":"f1"}"#
    );
}

/// The bodies every family builds for a set of requests (a thinking model with parallel calls, a
/// plain model with effort, tools and a tool result's image, cut-off arguments, each family's own
/// replay), compared whole with the bodies recorded in `tests/golden/bodies/` — so a change in how
/// a body is built (typed structs instead of `json!`) cannot change what is sent. Recorded again
/// with `RECORD_GOLDEN_BODIES=1`.
#[test]
fn every_familys_bodies_match_the_recorded_bodies() {
    use crate::model::conversation::{BlobId, ImageMime, ImageRef};
    let shot = ImageRef {
        blob: BlobId([7; 32]),
        mime: ImageMime::Png,
        bytes: 4,
        name: "page".into(),
    };
    let mut with_image = history(None);
    let mut cut_off = history(None);
    for message in &mut with_image {
        if let CanonicalMessage::ToolResult(record) = message
            && record.index == 0
        {
            record.result.images = vec![shot.clone()];
        }
    }
    for message in &mut cut_off {
        if let CanonicalMessage::ToolCall(record) = message
            && record.index == 0
        {
            record.call.arguments = r#"{"path": "no"#.into();
        }
    }
    let mut images = ImageSet::default();
    images.insert(shot.blob, b"\x89PNG");
    let replays = [
        ProviderReplay::OpenAiChat {
            reasoning_content: "chat thoughts".into(),
            reasoning_details: vec![json!({"type":"reasoning.text","text":"d","index":0})],
        },
        ProviderReplay::OpenAiResponses {
            items: vec![
                json!({"type":"reasoning","id":"rs_1","summary":[],"encrypted_content":"enc"}),
                json!({"type":"function_call","id":"fc_0","call_id":"call_0","name":"Read","arguments":"{\"path\":\"f0\"}"}),
            ],
        },
        ProviderReplay::Anthropic {
            blocks: vec![json!({"type":"thinking","thinking":"t","signature":"sig"})],
        },
    ];
    let tools = [std::sync::Arc::new(
        json!({"name":"Read","description":"reads","parameters":{"type":"object"}}),
    )];
    let effort = RequestParameters {
        effort: Some(Effort::High),
        fast: true,
    };
    let (thinking, plain) = (model(true), model(false));
    type Project = fn(&ModelRequest<'_>) -> Value;
    let families: [(&str, Project); 3] = [
        ("openai_chat", openai_chat),
        ("openai_responses", openai_responses),
        ("anthropic", anthropic),
    ];
    for (name, project) in families {
        let mut bodies = vec![
            project(&compile(
                "system prompt",
                &history(None),
                &thinking,
                &[],
                RequestParameters::default(),
                &NO_IMAGES,
            )),
            project(&compile("s", &with_image, &plain, &tools, effort, &images)),
            project(&compile(
                "s", &cut_off, &thinking, &tools, effort, &NO_IMAGES,
            )),
        ];
        for replay in &replays {
            let history = history(Some(replay.clone()));
            bodies.push(project(&compile(
                "s", &history, &thinking, &tools, effort, &NO_IMAGES,
            )));
        }
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join(format!("tests/golden/bodies/{name}.json"));
        let recorded = serde_json::to_string_pretty(&bodies).unwrap() + "\n";
        if std::env::var_os("RECORD_GOLDEN_BODIES").is_some() {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, &recorded).unwrap();
        }
        let golden = std::fs::read_to_string(&path).unwrap_or_else(|e| {
            panic!(
                "{}: {e} (record with RECORD_GOLDEN_BODIES=1)",
                path.display()
            )
        });
        assert!(
            golden == recorded,
            "{name}: the bodies differ from {}",
            path.display()
        );
    }
}
