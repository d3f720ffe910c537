//! The context a user message arrives with, in domain terms: what the user attached
//! (`agent.v1.SelectedContext`) as `Attachment`s — every field is read, and a kind whose content
//! cannot be shown to the model is named (`Unshown`) and logged, never dropped without a word — and
//! the workspace the client describes (`RequestContext`) as a `WorkspaceContext`.
//!
//! Its own file because `client/bidi_append.rs` holds the uplink's decoding within 800 lines, and
//! the context's two dozen kinds are one translation of their own.

use crate::cursor::proto::agent as pb;
use crate::model::conversation::{
    AttachedImage, Attachment, BlobId, ImageSource, Rule, RuleScope, SubagentRole, WorkspaceContext,
};
use crate::model::tool::McpTool;
use crate::tools::ToolOptions;
use crate::tools::exec;
use crate::tools::search::render_tree;

/// The attachments of one user message, in the order Cursor's fields list them.
pub fn attachments(context: &pb::SelectedContext) -> Vec<Attachment> {
    let mut out = Vec::new();
    for file in &context.files {
        out.push(Attachment::File {
            path: shown_path(&file.path, file.relative_path.as_deref()),
            content: file.content.clone(),
        });
    }
    for selection in &context.code_selections {
        out.push(Attachment::Selection {
            path: shown_path(&selection.path, selection.relative_path.as_deref()),
            lines: lines(selection.range.as_ref()),
            content: selection.content.clone(),
        });
    }
    for folder in &context.folders {
        let mut tree = String::new();
        if let Some(root) = &folder.directory_tree {
            render_tree(root, 0, &mut tree);
        }
        out.push(Attachment::Folder {
            path: shown_path(&folder.path, folder.relative_path.as_deref()),
            tree,
        });
    }
    for terminal in &context.terminals {
        out.push(Attachment::Terminal {
            title: terminal_title(terminal.title.as_deref(), terminal.path.as_deref()),
            lines: None,
            content: terminal.content.clone(),
        });
    }
    for selection in &context.terminal_selections {
        out.push(Attachment::Terminal {
            title: terminal_title(selection.title.as_deref(), selection.path.as_deref()),
            lines: lines(selection.range.as_ref()),
            content: selection.content.clone(),
        });
    }
    for rule in context.cursor_rules.iter().filter_map(|r| r.rule.as_ref()) {
        out.push(Attachment::Rule {
            path: rule.full_path.clone(),
            content: rule.content.clone(),
        });
    }
    for command in &context.cursor_commands {
        out.push(Attachment::Command {
            name: command.name.clone(),
            content: command.content.clone(),
        });
    }
    diffs(context, &mut out);
    links_and_text(context, &mut out);
    named_only(context, &mut out);
    out
}

/// The images the user attached, with their bytes or the blob the client holds them in. An image
/// that brings neither is named to the model as not shown.
pub fn images(context: &pb::SelectedContext, out: &mut Vec<Attachment>) -> Vec<AttachedImage> {
    use pb::selected_image::DataOrBlobId;
    let mut images = Vec::with_capacity(context.selected_images.len());
    for image in &context.selected_images {
        let name = if image.path.is_empty() {
            image.uuid.clone()
        } else {
            image.path.clone()
        };
        let source = match &image.data_or_blob_id {
            Some(DataOrBlobId::Data(data)) => Some(ImageSource::Data(data.clone())),
            Some(DataOrBlobId::BlobIdWithData(both)) if !both.data.is_empty() => {
                Some(ImageSource::Data(both.data.clone()))
            }
            Some(DataOrBlobId::BlobIdWithData(both)) => {
                BlobId::from_slice(&both.blob_id).map(ImageSource::Blob)
            }
            Some(DataOrBlobId::BlobId(id)) => BlobId::from_slice(id).map(ImageSource::Blob),
            None => None,
        };
        match source {
            Some(source) => images.push(AttachedImage {
                name,
                labelled: image.mime_type.clone(),
                source,
            }),
            None => out.push(unshown("image without data or a valid blob id", &name)),
        }
    }
    images
}

/// The workspace-relative path when the client sent one.
fn shown_path(path: &str, relative: Option<&str>) -> String {
    relative
        .filter(|r| !r.is_empty())
        .unwrap_or(path)
        .to_owned()
}

fn terminal_title(title: Option<&str>, path: Option<&str>) -> String {
    title
        .or(path)
        .filter(|t| !t.is_empty())
        .unwrap_or("terminal")
        .to_owned()
}

/// A range's lines, 1-based and inclusive (Cursor's positions are 1-based lines).
fn lines(range: Option<&pb::Range>) -> Option<(u32, u32)> {
    let range = range?;
    let start = range.start.as_ref()?.line;
    let end = range.end.as_ref().map_or(start, |end| end.line);
    Some((start, end.max(start)))
}

fn diffs(context: &pb::SelectedContext, out: &mut Vec<Attachment>) {
    if let Some(diff) = &context.git_diff {
        out.push(diff_of("uncommitted changes", &diff.content));
    }
    if let Some(diff) = &context.git_diff_from_branch_to_main {
        out.push(diff_of("this branch against main", &diff.content));
    }
    for commit in &context.git_commits {
        let mut content = commit.message.clone();
        if let Some(description) = commit.description.as_deref().filter(|d| !d.is_empty()) {
            content.push_str("\n\n");
            content.push_str(description);
        }
        content.push_str("\n\n");
        content.push_str(&commit.diff);
        out.push(diff_of(&format!("commit {}", commit.sha), &content));
    }
    for selection in &context.git_pr_diff_selections {
        let label = format!(
            "{} {} lines {}-{}",
            selection.pr_url, selection.file_path, selection.start_line, selection.end_line
        );
        match (
            selection.diff_content.as_deref(),
            selection.blob_id.as_deref(),
        ) {
            (Some(content), _) => out.push(diff_of(&label, content)),
            (None, Some(id)) => out.push(stored(&label, id)),
            (None, None) => out.push(unshown("pull request diff (no content sent)", &label)),
        }
    }
    for pr in &context.selected_pull_requests {
        let title = pr.title.as_deref().unwrap_or_default();
        let mut content = format!("#{} {title}\n{}", pr.number, pr.url);
        for text in [pr.description.as_deref(), pr.summary_json.as_deref()]
            .into_iter()
            .flatten()
            .filter(|t| !t.is_empty())
        {
            content.push_str("\n\n");
            content.push_str(text);
        }
        out.push(Attachment::Text {
            label: format!("pull request #{}", pr.number),
            content,
        });
    }
}

fn diff_of(label: &str, content: &str) -> Attachment {
    Attachment::Diff {
        label: label.to_owned(),
        content: content.to_owned(),
    }
}

fn links_and_text(context: &pb::SelectedContext, out: &mut Vec<Attachment>) {
    for link in &context.external_links {
        let content = link.pdf_content.clone().filter(|c| !c.is_empty());
        match (&content, link.blob_id.as_deref()) {
            (None, Some(id)) => out.push(stored(&format!("link {}", link.url), id)),
            _ => out.push(Attachment::Link {
                url: link.url.clone(),
                content,
            }),
        }
    }
    for text in context.extra_context.iter().filter(|t| !t.is_empty()) {
        out.push(Attachment::Text {
            label: "extra context".to_owned(),
            content: text.clone(),
        });
    }
    for entry in &context.extra_context_entries {
        match &entry.data_or_blob_id {
            Some(pb::extra_context_entry::DataOrBlobId::Data(data)) => out.push(Attachment::Text {
                label: "extra context".to_owned(),
                content: data.clone(),
            }),
            Some(pb::extra_context_entry::DataOrBlobId::BlobId(id)) => {
                out.push(stored("extra context", id))
            }
            None => {}
        }
    }
    for log in &context.console_logs {
        out.push(Attachment::Text {
            label: format!("console {} ({})", log.level, log.client_name),
            content: log.message.clone(),
        });
    }
    for element in &context.ui_elements {
        out.push(Attachment::Text {
            label: format!("UI element {}", element.xpath),
            content: format!(
                "{}\n{}\n{}",
                element.element, element.text_content, element.extra
            )
            .trim()
            .to_owned(),
        });
    }
    for skill in &context.selected_skills {
        out.push(Attachment::Rule {
            path: skill.full_path.clone(),
            content: skill.content.clone(),
        });
    }
    if let Some(invocation) = &context.invocation_context {
        out.push(Attachment::Text {
            label: "where the user invoked the agent".to_owned(),
            content: format!("{invocation:?}"),
        });
    }
    if let Some(action) = &context.selected_agentic_git_action {
        out.push(Attachment::Text {
            label: "git action the user asked for".to_owned(),
            content: format!("{action:?}"),
        });
    }
    if let Some(recent) = &context.recent_agents_context {
        out.push(Attachment::Text {
            label: "recent agents".to_owned(),
            content: format!("{recent:?}"),
        });
    }
}

/// A document: shown when it is text (by its MIME type and its bytes), fetched first when only its
/// blob id was sent; any other document (a PDF, an office file) is named as not shown.
fn document_of(document: &pb::SelectedDocument) -> Attachment {
    use pb::selected_document::DataOrBlobId;
    let name = if document.path.is_empty() {
        &document.filename
    } else {
        &document.path
    };
    let mime = document.mime_type.to_ascii_lowercase();
    let textual = mime.starts_with("text/")
        || ["json", "xml", "yaml", "toml", "markdown", "csv"]
            .iter()
            .any(|kind| mime.contains(kind));
    if !textual {
        return unshown(&format!("document ({})", document.mime_type), name);
    }
    let label = format!("document {name}");
    match &document.data_or_blob_id {
        Some(DataOrBlobId::Data(data)) => text_of(&label, data, name),
        Some(DataOrBlobId::BlobIdWithData(with)) => text_of(&label, &with.data, name),
        Some(DataOrBlobId::BlobId(id)) => stored(&label, id),
        None => unshown("document (no content sent)", name),
    }
}

fn text_of(label: &str, data: &[u8], name: &str) -> Attachment {
    match std::str::from_utf8(data) {
        Ok(text) => Attachment::Text {
            label: label.to_owned(),
            content: text.to_owned(),
        },
        Err(_) => unshown("document (not UTF-8 text)", name),
    }
}

/// Text the client sent as a blob id: fetched before the message is committed.
fn stored(label: &str, id: &[u8]) -> Attachment {
    match BlobId::from_slice(id) {
        Some(blob) => Attachment::Stored {
            label: label.to_owned(),
            blob,
        },
        None => unshown(&format!("{label} (not a blob id)"), &hex::encode(id)),
    }
}

fn unshown(kind: &str, name: &str) -> Attachment {
    tracing::info!(
        kind,
        name,
        "attached context the model is told of but not shown"
    );
    Attachment::Unshown {
        kind: kind.to_owned(),
        name: name.to_owned(),
    }
}

/// Kinds whose content this server does not show the model (yet): named, never dropped.
fn named_only(context: &pb::SelectedContext, out: &mut Vec<Attachment>) {
    for video in &context.selected_videos {
        out.push(unshown("video", &video.filename));
    }
    for browser in &context.selected_browsers {
        out.push(unshown("browser tab", &browser.url));
    }
    for document in &context.selected_documents {
        out.push(document_of(document));
    }
    for docs in &context.documentations {
        out.push(unshown("documentation index", &docs.name));
    }
    for chat in &context.past_chats {
        out.push(unshown("past chat", &chat.name));
    }
    for subagent in &context.selected_subagents {
        out.push(unshown("subagent", &subagent.name));
    }
}

/// The parts of Cursor's `request_context` the model is told about.
pub fn workspace_context(context: &pb::RequestContext) -> WorkspaceContext {
    use pb::cursor_rule_type::Type as RuleType;
    let env = context.env.clone().unwrap_or_default();
    let rules = context
        .rules
        .iter()
        .chain(&context.non_file_rules)
        .filter(|rule| rule.parse_error.is_none() && !rule.content.trim().is_empty())
        .map(|rule| Rule {
            path: rule.full_path.clone(),
            applies: match rule.r#type.as_ref().and_then(|t| t.r#type.as_ref()) {
                Some(RuleType::FileGlobbed(globs)) => RuleScope::Files(globs.globs.clone()),
                Some(RuleType::AgentFetched(fetched)) => {
                    RuleScope::OnRequest(fetched.description.clone())
                }
                Some(RuleType::Global(_)) | Some(RuleType::ManuallyAttached(_)) | None => {
                    RuleScope::Always
                }
            },
            content: rule.content.clone(),
        })
        .collect();
    WorkspaceContext {
        os_version: env.os_version,
        shell: env.shell,
        time_zone: env.time_zone,
        workspace_paths: env.workspace_paths,
        rules,
        skills: context
            .agent_skills
            .iter()
            .filter(|skill| skill.parse_error.is_none() && !skill.disable_model_invocation)
            .map(|skill| (skill.full_path.clone(), skill.description.clone()))
            .collect(),
        mcp_instructions: context
            .mcp_instructions
            .iter()
            .filter(|m| !m.instructions.trim().is_empty())
            .map(|m| (m.server_name.clone(), m.instructions.clone()))
            .collect(),
        subagents: context
            .custom_subagents
            .iter()
            .map(|agent| (agent.name.clone(), agent.description.clone()))
            .collect(),
    }
}

/// The tools a user message's request allows beyond the mode's: the client's web switches, its
/// MCP tools and the MCP servers that sent instructions.
pub fn user_message_tools(
    request: &pb::AgentRunRequest,
    context: Option<&pb::RequestContext>,
) -> ToolOptions {
    // A CLI client lists its MCP tools in the request context it is asked for, not in the request.
    let listed = match (&request.mcp_tools, context) {
        (Some(listed), _) if !listed.mcp_tools.is_empty() => Some(listed.clone()),
        (_, Some(context)) if !context.tools.is_empty() => Some(pb::McpTools {
            mcp_tools: context.tools.clone(),
        }),
        (listed, _) => listed.clone(),
    };
    let mut tools = ToolOptions {
        web_fetch: context.is_none_or(|c| c.web_fetch_enabled != Some(false)),
        web_search: context.is_none_or(|c| c.web_search_enabled != Some(false)),
        mcp: mcp_tools(
            &listed,
            [
                request.mcp_file_system_options.as_ref(),
                context.and_then(|c| c.mcp_file_system_options.as_ref()),
            ],
        ),
        mcp_servers: Vec::new(),
        only: None,
    };
    tools.add_servers(
        context
            .into_iter()
            .flat_map(|c| &c.mcp_instructions)
            .map(|m| server_of(&m.server_identifier, &m.server_name)),
    );
    tools
}

/// The user's MCP tools: `run_request.mcp_tools`, then tools described by the request's and the
/// request context's MCP descriptors (those that carry a schema), each (server, tool) once.
pub fn mcp_tools(
    listed: &Option<pb::McpTools>,
    file_system_options: [Option<&pb::McpFileSystemOptions>; 2],
) -> Vec<McpTool> {
    let from_list = listed.iter().flat_map(|l| &l.mcp_tools).map(|t| {
        (
            t.provider_identifier.clone(),
            t.name.clone(),
            t.tool_name.clone(),
            t.description.clone(),
            t.input_schema
                .as_ref()
                .map(exec::proto_to_json)
                .unwrap_or(serde_json::Value::Null),
        )
    });
    let from_descriptors = file_system_options
        .into_iter()
        .flatten()
        .flat_map(|o| &o.mcp_descriptors)
        .flat_map(|d| {
            let server = server_of(&d.server_identifier, &d.server_name);
            d.tools.iter().filter_map(move |t| {
                let schema = t.input_schema.as_ref()?;
                Some((
                    server.clone(),
                    format!("{}-{}", server, t.tool_name),
                    t.tool_name.clone(),
                    t.description.clone().unwrap_or_default(),
                    exec::proto_to_json(schema),
                ))
            })
        });
    crate::tools::mcp::mcp_tools(from_list.chain(from_descriptors))
}

/// The role of a run another agent's Task call started (`subagent_type_name`), with the custom
/// subagent's own prompt and tools when the request context defines one of that name.
pub fn subagent_role(
    type_name: Option<&str>,
    context: Option<&pb::RequestContext>,
) -> Option<SubagentRole> {
    let type_name = type_name.map(str::trim).filter(|t| !t.is_empty())?;
    let custom = context
        .into_iter()
        .flat_map(|c| &c.custom_subagents)
        .find(|agent| agent.name == type_name);
    Some(SubagentRole {
        type_name: type_name.to_owned(),
        parent_request_id: None,
        parent_tool_call_id: None,
        custom_prompt: custom
            .map(|agent| agent.prompt.trim().to_owned())
            .filter(|p| !p.is_empty()),
        custom_tools: custom.map(|agent| agent.tools.clone()).unwrap_or_default(),
    })
}

pub fn server_of(identifier: &str, name: &str) -> String {
    if identifier.is_empty() {
        name
    } else {
        identifier
    }
    .to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_documents_are_shown_and_others_are_named() {
        use pb::selected_document::DataOrBlobId;
        let document = |mime: &str, data: Option<DataOrBlobId>| pb::SelectedDocument {
            filename: "notes.md".into(),
            mime_type: mime.into(),
            data_or_blob_id: data,
            ..Default::default()
        };
        let context = pb::SelectedContext {
            selected_documents: vec![
                document(
                    "text/markdown",
                    Some(DataOrBlobId::Data(b"# Notes".to_vec())),
                ),
                document(
                    "application/pdf",
                    Some(DataOrBlobId::Data(vec![0x25, 0x50])),
                ),
                document("text/plain", Some(DataOrBlobId::BlobId(vec![9; 32]))),
                document("text/plain", Some(DataOrBlobId::Data(vec![0xff, 0xfe]))),
            ],
            ..Default::default()
        };
        let attached = attachments(&context);
        assert_eq!(
            attached[0],
            Attachment::Text {
                label: "document notes.md".into(),
                content: "# Notes".into()
            }
        );
        assert!(
            matches!(&attached[1], Attachment::Unshown { kind, .. } if kind.contains("application/pdf"))
        );
        assert_eq!(
            attached[2],
            Attachment::Stored {
                label: "document notes.md".into(),
                blob: BlobId([9; 32])
            }
        );
        assert!(matches!(&attached[3], Attachment::Unshown { kind, .. } if kind.contains("UTF-8")));
    }
}
