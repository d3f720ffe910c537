//! MCP: the user's MCP tools (offered under provider-safe names, called through the client with
//! their own schemas) and their servers' resources (ListMcpResources, FetchMcpResource).

use std::fmt::Write as _;

use serde::Deserialize;

use crate::cursor::proto::agent::{self as pb, exec_server_message, tool_call};
use crate::model::conversation::{BlobId, ImageMime, ImageRef};
use crate::model::tool::McpTool;
use crate::tools::exec;
use crate::tools::tool_result::{
    Tool, ToolEnv, ToolImage, ToolOutcome, ToolStep, argument_text, card, done, failed, non_empty,
    on_exec_answer, parse_args, reason_suffix, truncate_for_model,
};

/// An MCP call: the tool it names and the model's arguments (a JSON object).
#[derive(Debug, Clone, PartialEq)]
pub struct McpInput {
    pub tool: McpTool,
    pub args: serde_json::Map<String, serde_json::Value>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct ListMcpResourcesInput {
    pub server: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct FetchMcpResourceInput {
    pub server: String,
    pub uri: String,
}

/// The OpenAI-style function definition offered to the model.
pub fn definition(tool: &McpTool) -> serde_json::Value {
    let parameters = if tool.input_schema.is_object() {
        tool.input_schema.clone()
    } else {
        serde_json::json!({"type": "object", "properties": {}})
    };
    serde_json::json!({
        "type": "function",
        "function": {
            "name": tool.model_name,
            "description": format!("{} (MCP tool `{}` of server `{}`)", tool.description.trim(), tool.tool_name, tool.server),
            "parameters": parameters,
        }
    })
}

/// Builds the request's MCP tool list from (server, Cursor name, tool name, description, schema)
/// entries, dropping exact duplicates and giving every tool a unique, provider-safe name.
pub fn mcp_tools(
    definitions: impl IntoIterator<Item = (String, String, String, String, serde_json::Value)>,
) -> Vec<McpTool> {
    let mut tools: Vec<McpTool> = Vec::new();
    for (server, name, tool_name, description, input_schema) in definitions {
        if tool_name.is_empty()
            || tools
                .iter()
                .any(|t| t.server == server && t.tool_name == tool_name)
        {
            continue;
        }
        let base = sanitize_tool_name(&format!("mcp_{server}_{tool_name}"));
        let mut model_name = base.clone();
        let mut n = 2;
        while tools.iter().any(|t| t.model_name == model_name) {
            let suffix = format!("_{n}");
            model_name = format!("{}{suffix}", &base[..base.len().min(64 - suffix.len())]);
            n += 1;
        }
        tools.push(McpTool {
            model_name,
            name,
            server,
            tool_name,
            description,
            input_schema,
        });
    }
    tools
}

/// `[A-Za-z0-9_-]{1,64}`: the common subset of OpenAI's and Anthropic's tool-name rules.
fn sanitize_tool_name(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .take(64)
        .collect()
}

/// Parses an MCP call's arguments: a JSON object holding every property the tool's schema requires.
pub fn parse_mcp_input(tool: &McpTool, arguments: &str) -> Result<McpInput, String> {
    let text = argument_text(arguments);
    let args: serde_json::Map<String, serde_json::Value> = serde_json::from_str(text)
        .map_err(|e| format!("invalid arguments for {}: {e}", tool.model_name))?;
    let missing: Vec<&str> = tool.input_schema["required"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| r.as_str())
        .filter(|r| !args.contains_key(*r))
        .collect();
    if !missing.is_empty() {
        return Err(format!(
            "invalid arguments for {}: missing required {}",
            tool.model_name,
            missing.join(", ")
        ));
    }
    Ok(McpInput {
        tool: tool.clone(),
        args,
    })
}

impl Tool for McpInput {
    type Result = pb::McpToolResult;

    /// Never matched by name: each MCP tool has its own, from the request.
    const NAME: &'static str = "mcp";
    /// Whatever the MCP server's own schema says; checked against its `required`.
    const ARGUMENTS: &'static [(&'static str, bool)] = &[];

    /// An MCP call is parsed with its tool's schema (`parse_mcp_input`), never by name alone.
    fn parse(_text: &str) -> Result<McpInput, String> {
        Err("internal error: MCP calls are parsed with their tool (parse_mcp_input)".to_owned())
    }

    fn card(args: Option<&Self>, call_id: &str, result: Option<Self::Result>) -> pb::ToolCall {
        card(tool_call::Tool::McpToolCall(pb::McpToolCall {
            args: args.map(|mcp| mcp_args(mcp, call_id)),
            result,
        }))
    }

    fn error(_args: Option<&Self>, _call_id: &str, message: &str) -> Self::Result {
        pb::McpToolResult {
            result: Some(pb::mcp_tool_result::Result::Error(pb::McpToolError {
                error: message.to_owned(),
                ..pb::McpToolError::default()
            })),
        }
    }

    fn start(&self, call_id: &str, _env: &ToolEnv) -> ToolStep {
        ToolStep::exec(exec_server_message::Message::McpArgs(mcp_args(
            self, call_id,
        )))
    }

    on_exec_answer!(McpResult => mcp_outcome);
}

impl Tool for ListMcpResourcesInput {
    type Result = pb::ListMcpResourcesExecResult;

    const NAME: &'static str = "ListMcpResources";
    const ARGUMENTS: &'static [(&'static str, bool)] = &[("server", false)];

    fn parse(text: &str) -> Result<ListMcpResourcesInput, String> {
        parse_args("ListMcpResources", text)
    }

    fn card(args: Option<&Self>, _call_id: &str, result: Option<Self::Result>) -> pb::ToolCall {
        card(tool_call::Tool::ListMcpResourcesToolCall(
            pb::ListMcpResourcesToolCall {
                args: args.map(list_mcp_resources_args),
                result,
            },
        ))
    }

    fn error(_args: Option<&Self>, _call_id: &str, message: &str) -> Self::Result {
        pb::ListMcpResourcesExecResult {
            result: Some(pb::list_mcp_resources_exec_result::Result::Error(
                pb::ListMcpResourcesError {
                    error: message.to_owned(),
                },
            )),
        }
    }

    fn start(&self, _call_id: &str, _env: &ToolEnv) -> ToolStep {
        ToolStep::exec(exec_server_message::Message::ListMcpResourcesExecArgs(
            list_mcp_resources_args(self),
        ))
    }

    on_exec_answer!(ListMcpResourcesExecResult => mcp_resources_outcome);
}

impl Tool for FetchMcpResourceInput {
    type Result = pb::ReadMcpResourceExecResult;

    const NAME: &'static str = "FetchMcpResource";
    const ARGUMENTS: &'static [(&'static str, bool)] = &[("server", true), ("uri", true)];

    fn parse(text: &str) -> Result<FetchMcpResourceInput, String> {
        let input: FetchMcpResourceInput = parse_args("FetchMcpResource", text)?;
        non_empty("FetchMcpResource", "server", &input.server)?;
        non_empty("FetchMcpResource", "uri", &input.uri)?;
        Ok(input)
    }

    fn card(args: Option<&Self>, _call_id: &str, result: Option<Self::Result>) -> pb::ToolCall {
        card(tool_call::Tool::ReadMcpResourceToolCall(
            pb::ReadMcpResourceToolCall {
                args: args.map(read_mcp_resource_args),
                result,
            },
        ))
    }

    fn error(args: Option<&Self>, _call_id: &str, message: &str) -> Self::Result {
        pb::ReadMcpResourceExecResult {
            result: Some(pb::read_mcp_resource_exec_result::Result::Error(
                pb::ReadMcpResourceError {
                    uri: args.map(|a| a.uri.clone()).unwrap_or_default(),
                    error: message.to_owned(),
                },
            )),
        }
    }

    fn start(&self, _call_id: &str, _env: &ToolEnv) -> ToolStep {
        ToolStep::exec(exec_server_message::Message::ReadMcpResourceExecArgs(
            read_mcp_resource_args(self),
        ))
    }

    on_exec_answer!(ReadMcpResourceExecResult => mcp_resource_outcome);
}

fn list_mcp_resources_args(list: &ListMcpResourcesInput) -> pb::ListMcpResourcesExecArgs {
    pb::ListMcpResourcesExecArgs {
        server: list.server.clone().filter(|s| !s.trim().is_empty()),
    }
}

fn read_mcp_resource_args(read: &FetchMcpResourceInput) -> pb::ReadMcpResourceExecArgs {
    pb::ReadMcpResourceExecArgs {
        server: read.server.clone(),
        uri: read.uri.clone(),
        download_path: None,
    }
}

/// `mcp_args` for an MCP call; also the MCP card's typed args.
pub fn mcp_args(mcp: &McpInput, call_id: &str) -> pb::McpArgs {
    pb::McpArgs {
        name: mcp.tool.name.clone(),
        args: mcp
            .args
            .iter()
            .map(|(k, v)| (k.clone(), exec::json_to_proto(v)))
            .collect(),
        tool_call_id: call_id.to_owned(),
        provider_identifier: mcp.tool.server.clone(),
        tool_name: mcp.tool.tool_name.clone(),
        ..pb::McpArgs::default()
    }
}

/// The images of a successful MCP call, in order, as the model is shown them; an image whose bytes
/// are not a format the providers take stays described in the text only.
fn success_images(success: &pb::McpSuccess, tool: &str) -> Vec<ToolImage> {
    let images = success
        .content
        .iter()
        .filter_map(|item| match &item.content {
            Some(pb::mcp_tool_result_content_item::Content::Image(image)) => Some(image),
            _ => None,
        });
    let mut out = Vec::new();
    for (n, image) in images.enumerate() {
        let Some(mime) = ImageMime::sniff(&image.data) else {
            tracing::warn!(tool, labelled = %image.mime_type, "an MCP tool returned an image that is not PNG, JPEG, GIF or WebP; described in text only");
            continue;
        };
        out.push(ToolImage {
            image: ImageRef {
                blob: BlobId::of(&image.data),
                mime,
                bytes: image.data.len() as u64,
                name: format!("image {} of {tool}", n + 1),
            },
            data: image.data.clone(),
        });
    }
    out
}

/// A successful MCP call's content as the model reads it: text items joined, images described (and
/// shown beside the text, `success_images`), structured content as JSON when there is no text; the
/// server's own `is_error` kept.
fn success_text(success: &pb::McpSuccess, tool: &str, env: &ToolEnv) -> String {
    let mut text = String::new();
    for item in &success.content {
        match &item.content {
            Some(pb::mcp_tool_result_content_item::Content::Text(t)) => {
                if !text.is_empty() {
                    text.push('\n');
                }
                text.push_str(&t.text);
            }
            Some(pb::mcp_tool_result_content_item::Content::Image(image)) => {
                let _ = write!(
                    text,
                    "{}[image: {}, {} bytes]",
                    if text.is_empty() { "" } else { "\n" },
                    image.mime_type,
                    image.data.len()
                );
            }
            None => {}
        }
    }
    if text.is_empty()
        && let Some(structured) = &success.structured_content
    {
        text = exec::proto_to_json(&prost_types::Value {
            kind: Some(prost_types::value::Kind::StructValue(structured.clone())),
        })
        .to_string();
    }
    match (success.is_error, text.is_empty()) {
        (true, _) => format!("Error from MCP tool {tool}: {text}"),
        (false, true) => format!("MCP tool {tool} returned no content."),
        (false, false) => truncate_for_model(&text, env.max_output_bytes, 0),
    }
}

/// An MCP tool's result: its text content for the model (images described, not inlined), the
/// server's own `is_error` honoured, and the card's typed result.
fn mcp_outcome(mcp: &McpInput, call_id: &str, result: pb::McpResult, env: &ToolEnv) -> ToolOutcome {
    use pb::mcp_result::Result as M;
    use pb::mcp_tool_result::Result as C;
    let tool = format!("{} ({})", mcp.tool.tool_name, mcp.tool.server);
    let mut images = Vec::new();
    let (card_result, text, is_error) = match result.result {
        Some(M::Success(success)) => {
            let text = success_text(&success, &tool, env);
            images = success_images(&success, &tool);
            let is_error = success.is_error;
            (C::Success(success), text, is_error)
        }
        Some(M::Error(error)) => (
            C::Error(pb::McpToolError {
                error: error.error.clone(),
                ..pb::McpToolError::default()
            }),
            format!("Error: MCP tool {tool} failed: {}", error.error),
            true,
        ),
        Some(M::Rejected(rejected)) => (
            C::Rejected(rejected.clone()),
            format!(
                "The user rejected running MCP tool {tool}{}.",
                reason_suffix(&rejected.reason)
            ),
            true,
        ),
        Some(M::PermissionDenied(denied)) => (
            C::PermissionDenied(denied.clone()),
            format!(
                "Error: permission denied for MCP tool {tool}: {}",
                denied.error
            ),
            true,
        ),
        Some(M::ToolNotFound(missing)) => {
            let message = format!(
                "MCP tool {} was not found (available: {})",
                missing.name,
                missing.available_tools.join(", ")
            );
            return failed(mcp, call_id, &message);
        }
        Some(M::ServerNotFound(missing)) => {
            let message = format!(
                "MCP server {} was not found (available: {})",
                missing.name,
                missing.available_servers.join(", ")
            );
            return failed(mcp, call_id, &message);
        }
        Some(M::Approved(_)) => {
            return failed(
                mcp,
                call_id,
                "the client approved the MCP call but sent no result",
            );
        }
        None => return failed(mcp, call_id, "the client sent an empty MCP result"),
    };
    ToolOutcome {
        images,
        ..done(
            mcp,
            call_id,
            pb::McpToolResult {
                result: Some(card_result),
            },
            text,
            is_error,
        )
    }
}

fn mcp_resources_outcome(
    list: &ListMcpResourcesInput,
    call_id: &str,
    result: pb::ListMcpResourcesExecResult,
    env: &ToolEnv,
) -> ToolOutcome {
    use pb::list_mcp_resources_exec_result::Result as L;
    let (text, is_error) = match &result.result {
        Some(L::Success(success)) if success.resources.is_empty() => {
            ("No MCP resources.".to_owned(), false)
        }
        Some(L::Success(success)) => {
            let mut text = String::from("MCP resources (server: uri — name, type: description):");
            for r in &success.resources {
                let _ = write!(
                    text,
                    "\n- {}: {} — {}, {}",
                    r.server,
                    r.uri,
                    r.name.as_deref().unwrap_or("unnamed"),
                    r.mime_type.as_deref().unwrap_or("unknown type")
                );
                if let Some(description) = r.description.as_deref().filter(|d| !d.is_empty()) {
                    let _ = write!(text, ": {description}");
                }
            }
            (truncate_for_model(&text, env.max_output_bytes, 0), false)
        }
        Some(L::Error(error)) => (format!("Error: {}", error.error), true),
        Some(L::Rejected(rejected)) => (
            format!(
                "The user rejected listing MCP resources{}.",
                reason_suffix(&rejected.reason)
            ),
            true,
        ),
        None => return failed(list, call_id, "the client sent an empty resource list"),
    };
    done(list, call_id, result, text, is_error)
}

fn mcp_resource_outcome(
    read: &FetchMcpResourceInput,
    call_id: &str,
    result: pb::ReadMcpResourceExecResult,
    env: &ToolEnv,
) -> ToolOutcome {
    use pb::read_mcp_resource_exec_result::Result as R;
    let (text, is_error) = match &result.result {
        Some(R::Success(success)) => match &success.content {
            Some(pb::read_mcp_resource_success::Content::Text(text)) => {
                (truncate_for_model(text, env.max_output_bytes, 0), false)
            }
            Some(pb::read_mcp_resource_success::Content::Blob(blob)) => (
                format!(
                    "{} is binary ({}, {} bytes){}.",
                    read.uri,
                    success.mime_type.as_deref().unwrap_or("unknown type"),
                    blob.len(),
                    success
                        .download_path
                        .as_deref()
                        .map(|p| format!("; saved to {p}"))
                        .unwrap_or_default()
                ),
                false,
            ),
            None => (format!("{} is empty.", read.uri), false),
        },
        Some(R::Error(error)) => (
            format!("Error: reading {} failed: {}", read.uri, error.error),
            true,
        ),
        Some(R::Rejected(rejected)) => (
            format!(
                "The user rejected reading {}{}.",
                read.uri,
                reason_suffix(&rejected.reason)
            ),
            true,
        ),
        Some(R::NotFound(_)) => (
            format!(
                "Error: MCP resource {} was not found on {}.",
                read.uri, read.server
            ),
            true,
        ),
        None => return failed(read, call_id, "the client sent an empty resource result"),
    };
    done(read, call_id, result, text, is_error)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cursor::proto::agent::exec_client_message;
    use crate::tools::tool_result::Stage;
    use crate::tools::tool_result::testing::{ended, env};

    fn call() -> McpInput {
        let tool = &mcp_tools([(
            "docs".to_owned(),
            "docs-search".to_owned(),
            "search".to_owned(),
            "Searches the docs".to_owned(),
            serde_json::json!({"type": "object", "required": ["q"]}),
        )])[0];
        parse_mcp_input(tool, r#"{"q":"tokio"}"#).unwrap()
    }

    #[test]
    fn an_mcp_result_gives_the_model_its_text_and_the_card_its_content() {
        let result = pb::McpResult {
            result: Some(pb::mcp_result::Result::Success(pb::McpSuccess {
                content: vec![pb::McpToolResultContentItem {
                    content: Some(pb::mcp_tool_result_content_item::Content::Text(
                        pb::McpTextContent {
                            text: "tokio is a runtime".into(),
                            ..Default::default()
                        },
                    )),
                }],
                ..Default::default()
            })),
        };
        let outcome = ended(call().on_result(
            "c1",
            exec_client_message::Message::McpResult(result),
            &mut Stage::default(),
            &env(),
        ));
        assert_eq!(
            (outcome.model_text.as_str(), outcome.is_error),
            ("tokio is a runtime", false)
        );
        let Some(tool_call::Tool::McpToolCall(card)) = outcome.card.tool else {
            panic!("an MCP card")
        };
        assert_eq!(card.args.map(|a| a.tool_name), Some("search".to_owned()));
        assert!(matches!(
            card.result.and_then(|r| r.result),
            Some(pb::mcp_tool_result::Result::Success(_))
        ));
    }

    #[test]
    fn a_failed_mcp_call_has_the_mcp_error_card() {
        let outcome = failed(&call(), "c1", "server down");
        assert_eq!(outcome.model_text, "Error: server down");
        let Some(tool_call::Tool::McpToolCall(card)) = outcome.card.tool else {
            panic!("an MCP card")
        };
        let Some(pb::mcp_tool_result::Result::Error(error)) = card.result.and_then(|r| r.result)
        else {
            panic!("an error")
        };
        assert_eq!(error.error, "server down");
    }

    #[test]
    fn mcp_tool_names_are_provider_safe_unique_and_stable() {
        let def = |server: &str, tool: &str| {
            (
                server.to_owned(),
                format!("{server}-{tool}"),
                tool.to_owned(),
                String::new(),
                serde_json::Value::Null,
            )
        };
        let long = "x".repeat(80);
        let tools = mcp_tools([
            def("my server", "search.code"),
            def("my server", "search.code"),
            def("my.server", "search code"),
            def("s", &long),
            def("s", &format!("{long}y")),
        ]);
        let names: Vec<&str> = tools.iter().map(|t| t.model_name.as_str()).collect();
        assert_eq!(names.len(), 4, "the exact duplicate is dropped: {names:?}");
        assert_eq!(names[0], "mcp_my_server_search_code");
        assert_eq!(names[1], "mcp_my_server_search_code_2");
        assert_eq!(names[2].len(), 64);
        assert_eq!(names[3].len(), 64);
        assert_ne!(names[2], names[3]);
        for name in names {
            assert!(
                name.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
            );
        }
    }
}
