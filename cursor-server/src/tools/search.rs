//! Search: Grep (ripgrep on the client, content / files / counts), Glob (a files-only grep with no
//! pattern) and LS (a directory tree).

use std::fmt::Write as _;

use serde::Deserialize;

use crate::cursor::proto::agent::{self as pb, exec_server_message, tool_call};
use crate::tools::tool_result::{
    Tool, ToolEnv, ToolOutcome, ToolStep, card, done, failed, i32_of, non_empty, on_exec_answer,
    parse_args, truncate_for_model,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GrepMode {
    Content,
    FilesWithMatches,
    Count,
}

impl GrepMode {
    pub fn as_str(self) -> &'static str {
        match self {
            GrepMode::Content => "content",
            GrepMode::FilesWithMatches => "files_with_matches",
            GrepMode::Count => "count",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct GrepInput {
    pub pattern: String,
    pub path: Option<String>,
    pub glob: Option<String>,
    #[serde(rename = "type")]
    pub file_type: Option<String>,
    pub output_mode: Option<GrepMode>,
    #[serde(rename = "-A")]
    pub after: Option<u32>,
    #[serde(rename = "-B")]
    pub before: Option<u32>,
    #[serde(rename = "-C")]
    pub context: Option<u32>,
    #[serde(rename = "-i")]
    pub case_insensitive: Option<bool>,
    pub multiline: Option<bool>,
    pub head_limit: Option<u32>,
    pub offset: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct GlobInput {
    pub glob_pattern: String,
    pub target_directory: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct LsInput {
    pub path: String,
    #[serde(default)]
    pub ignore: Vec<String>,
}

impl Tool for GrepInput {
    type Result = pb::GrepResult;

    const NAME: &'static str = "Grep";
    const ARGUMENTS: &'static [(&'static str, bool)] = &[
        ("pattern", true),
        ("path", false),
        ("glob", false),
        ("type", false),
        ("output_mode", false),
        ("-A", false),
        ("-B", false),
        ("-C", false),
        ("-i", false),
        ("multiline", false),
        ("head_limit", false),
        ("offset", false),
    ];

    fn parse(text: &str) -> Result<GrepInput, String> {
        let input: GrepInput = parse_args("Grep", text)?;
        non_empty("Grep", "pattern", &input.pattern)?;
        Ok(input)
    }

    fn card(args: Option<&Self>, call_id: &str, result: Option<Self::Result>) -> pb::ToolCall {
        card(tool_call::Tool::GrepToolCall(pb::GrepToolCall {
            args: args.map(|grep| grep_args(grep, call_id)),
            result,
        }))
    }

    fn error(_args: Option<&Self>, _call_id: &str, message: &str) -> Self::Result {
        pb::GrepResult {
            result: Some(pb::grep_result::Result::Error(pb::GrepError {
                error: message.to_owned(),
            })),
        }
    }

    fn start(&self, call_id: &str, _env: &ToolEnv) -> ToolStep {
        ToolStep::exec(exec_server_message::Message::GrepArgs(grep_args(
            self, call_id,
        )))
    }

    on_exec_answer!(GrepResult => grep_outcome);
}

impl Tool for GlobInput {
    type Result = pb::GlobToolResult;

    const NAME: &'static str = "Glob";
    const ARGUMENTS: &'static [(&'static str, bool)] =
        &[("glob_pattern", true), ("target_directory", false)];

    fn parse(text: &str) -> Result<GlobInput, String> {
        let input: GlobInput = parse_args("Glob", text)?;
        non_empty("Glob", "glob_pattern", &input.glob_pattern)?;
        Ok(input)
    }

    fn card(args: Option<&Self>, _call_id: &str, result: Option<Self::Result>) -> pb::ToolCall {
        card(tool_call::Tool::GlobToolCall(pb::GlobToolCall {
            args: args.map(|glob| pb::GlobToolArgs {
                target_directory: glob.target_directory.clone(),
                glob_pattern: glob.glob_pattern.clone(),
            }),
            result,
        }))
    }

    fn error(_args: Option<&Self>, _call_id: &str, message: &str) -> Self::Result {
        pb::GlobToolResult {
            result: Some(pb::glob_tool_result::Result::Error(pb::GlobToolError {
                error: message.to_owned(),
            })),
        }
    }

    fn start(&self, call_id: &str, _env: &ToolEnv) -> ToolStep {
        ToolStep::exec(exec_server_message::Message::GrepArgs(glob_args(
            self, call_id,
        )))
    }

    on_exec_answer!(GrepResult => glob_outcome);
}

fn ls_args(ls: &LsInput, call_id: &str) -> pb::LsArgs {
    pb::LsArgs {
        path: ls.path.clone(),
        ignore: ls.ignore.clone(),
        tool_call_id: call_id.to_owned(),
        ..pb::LsArgs::default()
    }
}

impl Tool for LsInput {
    type Result = pb::LsResult;

    const NAME: &'static str = "LS";
    const ARGUMENTS: &'static [(&'static str, bool)] = &[("path", true), ("ignore", false)];

    fn parse(text: &str) -> Result<LsInput, String> {
        let input: LsInput = parse_args("LS", text)?;
        non_empty("LS", "path", &input.path)?;
        Ok(input)
    }

    fn card(args: Option<&Self>, call_id: &str, result: Option<Self::Result>) -> pb::ToolCall {
        card(tool_call::Tool::LsToolCall(pb::LsToolCall {
            args: args.map(|ls| ls_args(ls, call_id)),
            result,
        }))
    }

    fn error(args: Option<&Self>, _call_id: &str, message: &str) -> Self::Result {
        pb::LsResult {
            result: Some(pb::ls_result::Result::Error(pb::LsError {
                path: args.map(|a| a.path.clone()).unwrap_or_default(),
                error: message.to_owned(),
            })),
        }
    }

    fn start(&self, call_id: &str, _env: &ToolEnv) -> ToolStep {
        ToolStep::exec(exec_server_message::Message::LsArgs(ls_args(self, call_id)))
    }

    on_exec_answer!(LsResult => ls_outcome);
}

/// `GrepArgs` for a Grep call; also the Grep card's typed args.
fn grep_args(input: &GrepInput, call_id: &str) -> pb::GrepArgs {
    let signed = |v: Option<u32>| v.map(|v| i32::try_from(v).unwrap_or(i32::MAX));
    pb::GrepArgs {
        pattern: input.pattern.clone(),
        path: input.path.clone(),
        glob: input.glob.clone(),
        output_mode: Some(
            input
                .output_mode
                .unwrap_or(GrepMode::Content)
                .as_str()
                .to_owned(),
        ),
        context_before: signed(input.before),
        context_after: signed(input.after),
        context: signed(input.context),
        case_insensitive: input.case_insensitive,
        r#type: input.file_type.clone(),
        head_limit: signed(input.head_limit),
        multiline: input.multiline,
        tool_call_id: call_id.to_owned(),
        offset: signed(input.offset),
        ..pb::GrepArgs::default()
    }
}

/// Glob runs as a files-mode grep with no pattern.
fn glob_args(glob: &GlobInput, call_id: &str) -> pb::GrepArgs {
    pb::GrepArgs {
        glob: Some(glob.glob_pattern.clone()),
        path: glob.target_directory.clone(),
        output_mode: Some(GrepMode::FilesWithMatches.as_str().to_owned()),
        tool_call_id: call_id.to_owned(),
        ..pb::GrepArgs::default()
    }
}

fn sorted_workspaces(success: &pb::GrepSuccess) -> Vec<(&String, &pb::GrepUnionResult)> {
    let mut results: Vec<_> = success.workspace_results.iter().collect();
    results.sort_by(|a, b| a.0.cmp(b.0));
    results
}

fn grep_outcome(
    grep: &GrepInput,
    call_id: &str,
    result: pb::GrepResult,
    env: &ToolEnv,
) -> ToolOutcome {
    use pb::grep_result::Result as G;
    let text = match &result.result {
        Some(G::Success(success)) => {
            let mut text = String::new();
            let mut truncated = false;
            let unions = sorted_workspaces(success)
                .into_iter()
                .map(|(_, u)| u)
                .chain(success.active_editor_result.as_ref());
            for union in unions {
                match &union.result {
                    Some(pb::grep_union_result::Result::Content(content)) => {
                        truncated |= content.client_truncated || content.ripgrep_truncated;
                        for file in &content.matches {
                            for m in &file.matches {
                                let sep = if m.is_context_line { '-' } else { ':' };
                                let _ = writeln!(
                                    text,
                                    "{}{sep}{}{sep}{}",
                                    file.file, m.line_number, m.content
                                );
                            }
                        }
                    }
                    Some(pb::grep_union_result::Result::Files(files)) => {
                        truncated |= files.client_truncated || files.ripgrep_truncated;
                        for file in &files.files {
                            let _ = writeln!(text, "{file}");
                        }
                    }
                    Some(pb::grep_union_result::Result::Count(counts)) => {
                        truncated |= counts.client_truncated || counts.ripgrep_truncated;
                        for count in &counts.counts {
                            let _ = writeln!(text, "{}:{}", count.file, count.count);
                        }
                    }
                    None => {}
                }
            }
            if text.is_empty() {
                text = format!("No matches found for pattern {:?}.", grep.pattern);
            } else if truncated {
                text.push_str("[results truncated; narrow the search or use head_limit/offset]");
            }
            let mode = grep.output_mode.unwrap_or(GrepMode::Content);
            if mode == GrepMode::Count && !text.starts_with("No matches") {
                text.insert_str(0, "file:matches\n");
            }
            truncate_for_model(&text, env.max_output_bytes, 0)
        }
        Some(G::Error(e)) => {
            let text = format!("Error: grep failed: {}", e.error);
            return done(grep, call_id, result, text, true);
        }
        None => return failed(grep, call_id, "the client returned an empty grep result"),
    };
    done(grep, call_id, result, text, false)
}

fn glob_outcome(
    glob: &GlobInput,
    call_id: &str,
    result: pb::GrepResult,
    env: &ToolEnv,
) -> ToolOutcome {
    use pb::grep_result::Result as G;
    match result.result {
        Some(G::Success(success)) => {
            let mut files = Vec::new();
            let mut client_truncated = false;
            let mut ripgrep_truncated = false;
            for (_, union) in sorted_workspaces(&success) {
                if let Some(pb::grep_union_result::Result::Files(found)) = &union.result {
                    files.extend(found.files.iter().cloned());
                    client_truncated |= found.client_truncated;
                    ripgrep_truncated |= found.ripgrep_truncated;
                }
            }
            let mut text = if files.is_empty() {
                format!("No files match {:?}.", glob.glob_pattern)
            } else {
                files.join("\n")
            };
            if client_truncated || ripgrep_truncated {
                text.push_str("\n[list truncated; use a narrower pattern]");
            }
            let part = pb::GlobToolResult {
                result: Some(pb::glob_tool_result::Result::Success(pb::GlobToolSuccess {
                    pattern: glob.glob_pattern.clone(),
                    path: success.path.clone(),
                    total_files: i32_of(files.len()),
                    files,
                    client_truncated,
                    ripgrep_truncated,
                })),
            };
            done(
                glob,
                call_id,
                part,
                truncate_for_model(&text, env.max_output_bytes, 0),
                false,
            )
        }
        Some(G::Error(e)) => failed(glob, call_id, &format!("glob failed: {}", e.error)),
        None => failed(glob, call_id, "the client returned an empty glob result"),
    }
}

fn ls_outcome(ls: &LsInput, call_id: &str, result: pb::LsResult, env: &ToolEnv) -> ToolOutcome {
    use pb::ls_result::Result as L;
    let (text, is_error) = match &result.result {
        Some(L::Success(success)) => match &success.directory_tree_root {
            Some(root) => {
                let mut text = String::new();
                render_tree(root, 0, &mut text);
                (truncate_for_model(&text, env.max_output_bytes, 0), false)
            }
            None => ("(empty directory)".to_owned(), false),
        },
        Some(L::Timeout(timeout)) => {
            let mut text = String::from("[listing timed out; partial result]\n");
            if let Some(root) = &timeout.directory_tree_root {
                render_tree(root, 0, &mut text);
            }
            (truncate_for_model(&text, env.max_output_bytes, 0), false)
        }
        Some(L::Error(e)) => (format!("Error: listing {}: {}", e.path, e.error), true),
        Some(L::Rejected(r)) => (
            format!("Error: listing {} was rejected: {}", r.path, r.reason),
            true,
        ),
        None => return failed(ls, call_id, "the client returned an empty ls result"),
    };
    done(ls, call_id, result, text, is_error)
}

pub(crate) fn render_tree(node: &pb::LsDirectoryTreeNode, depth: usize, out: &mut String) {
    let indent = "  ".repeat(depth);
    if depth == 0 {
        let _ = writeln!(out, "{}/", node.abs_path.trim_end_matches('/'));
    } else {
        let name = node.abs_path.rsplit('/').next().unwrap_or(&node.abs_path);
        let _ = writeln!(out, "{indent}- {name}/");
    }
    if !node.children_were_processed
        && node.children_dirs.is_empty()
        && node.children_files.is_empty()
    {
        let _ = writeln!(
            out,
            "{indent}  ... ({} files, not expanded)",
            node.num_files
        );
        return;
    }
    for dir in &node.children_dirs {
        render_tree(dir, depth + 1, out);
    }
    for file in &node.children_files {
        let _ = writeln!(out, "{indent}  - {}", file.name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cursor::proto::agent::exec_client_message;
    use crate::tools::tool_result::Stage;
    use crate::tools::tool_result::testing::{ended, env};

    #[test]
    fn an_empty_listing_says_so_and_its_card_keeps_the_path() {
        let ls = LsInput::parse(r#"{"path":"src"}"#).unwrap();
        let result = pb::LsResult {
            result: Some(pb::ls_result::Result::Success(pb::LsSuccess::default())),
        };
        let outcome = ended(ls.on_result(
            "c1",
            exec_client_message::Message::LsResult(result),
            &mut Stage::default(),
            &env(),
        ));
        assert_eq!(
            (outcome.model_text.as_str(), outcome.is_error),
            ("(empty directory)", false)
        );
        let Some(tool_call::Tool::LsToolCall(card)) = outcome.card.tool else {
            panic!("an LS card")
        };
        assert_eq!(card.args.map(|a| a.path), Some("src".to_owned()));
    }

    #[test]
    fn a_failed_grep_has_the_grep_error_card() {
        let grep = GrepInput::parse(r#"{"pattern":"fn main"}"#).unwrap();
        let outcome = failed(&grep, "c1", "ripgrep is missing");
        assert_eq!(outcome.model_text, "Error: ripgrep is missing");
        let Some(tool_call::Tool::GrepToolCall(card)) = outcome.card.tool else {
            panic!("a Grep card")
        };
        assert_eq!(card.args.map(|a| a.pattern), Some("fn main".to_owned()));
        assert_eq!(
            card.result.and_then(|r| r.result),
            Some(pb::grep_result::Result::Error(pb::GrepError {
                error: "ripgrep is missing".into()
            }))
        );
    }
}
