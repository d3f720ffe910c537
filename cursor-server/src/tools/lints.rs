//! ReadLints: the editor's diagnostics for each path the model names, one diagnostics exec per path
//! in order, reported together.

use std::fmt::Write as _;

use serde::Deserialize;

use crate::cursor::proto::agent::{self as pb, exec_server_message, tool_call};
use crate::tools::exec::ExecRequest;
use crate::tools::tool_result::{
    Stage, Tool, ToolEnv, ToolOutcome, ToolStep, card, done, failed, i32_of, on_exec_answer,
    parse_args,
};

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct ReadLintsInput {
    pub paths: Vec<String>,
}

impl Tool for ReadLintsInput {
    type Result = pb::ReadLintsToolResult;

    const NAME: &'static str = "ReadLints";
    const ARGUMENTS: &'static [(&'static str, bool)] = &[("paths", true)];

    fn parse(text: &str) -> Result<ReadLintsInput, String> {
        let input: ReadLintsInput = parse_args("ReadLints", text)?;
        if input.paths.is_empty() || input.paths.iter().any(|p| p.trim().is_empty()) {
            return Err(
                "invalid arguments for ReadLints: `paths` must list at least one non-empty path"
                    .to_owned(),
            );
        }
        Ok(input)
    }

    fn card(args: Option<&Self>, _call_id: &str, result: Option<Self::Result>) -> pb::ToolCall {
        card(tool_call::Tool::ReadLintsToolCall(pb::ReadLintsToolCall {
            args: args.map(|lints| pb::ReadLintsToolArgs {
                paths: lints.paths.clone(),
            }),
            result,
        }))
    }

    fn error(_args: Option<&Self>, _call_id: &str, message: &str) -> Self::Result {
        pb::ReadLintsToolResult {
            result: Some(pb::read_lints_tool_result::Result::Error(
                pb::ReadLintsToolError {
                    error_message: message.to_owned(),
                },
            )),
        }
    }

    /// One diagnostics exec per path, in order; the first here, the rest as results come in.
    fn start(&self, call_id: &str, _env: &ToolEnv) -> ToolStep {
        match self.paths.first() {
            Some(path) => ToolStep::Exec(diagnostics_request(path, call_id)),
            None => ToolStep::Done(failed(
                self,
                call_id,
                "internal error: this tool has no client execution",
            )),
        }
    }

    on_exec_answer!(DiagnosticsResult => steps lints_step);
}

fn diagnostics_request(path: &str, call_id: &str) -> ExecRequest {
    ExecRequest::new(exec_server_message::Message::DiagnosticsArgs(
        pb::DiagnosticsArgs {
            path: path.to_owned(),
            tool_call_id: call_id.to_owned(),
        },
    ))
}

fn lints_step(
    lints: &ReadLintsInput,
    call_id: &str,
    result: pb::DiagnosticsResult,
    stage: &mut Stage,
    _env: &ToolEnv,
) -> Vec<ToolStep> {
    let path = lints
        .paths
        .get(stage.lints.len())
        .cloned()
        .unwrap_or_default();
    let diagnostics = match diagnostics_of(result, &path) {
        Ok(diagnostics) => diagnostics,
        Err(message) => return vec![ToolStep::Done(failed(lints, call_id, &message))],
    };
    stage.lints.push(pb::FileDiagnostics {
        path,
        diagnostics_count: i32_of(diagnostics.len()),
        diagnostics,
    });
    if let Some(next) = lints.paths.get(stage.lints.len()) {
        return vec![ToolStep::Exec(diagnostics_request(next, call_id))];
    }
    let files = std::mem::take(&mut stage.lints);
    vec![ToolStep::Done(report(lints, call_id, files))]
}

/// One path's diagnostics as the card lists them, or why there are none.
fn diagnostics_of(
    result: pb::DiagnosticsResult,
    path: &str,
) -> Result<Vec<pb::DiagnosticItem>, String> {
    use pb::diagnostics_result::Result as D;
    match result.result {
        Some(D::Success(success)) => Ok(success
            .diagnostics
            .into_iter()
            .map(|d| pb::DiagnosticItem {
                severity: d.severity,
                range: d.range.map(|r| pb::DiagnosticRange {
                    start: r.start,
                    end: r.end,
                }),
                message: d.message,
                source: d.source,
                code: d.code,
                is_stale: d.is_stale,
            })
            .collect()),
        Some(D::FileNotFound(_)) => Err(format!("file not found: {path}")),
        Some(D::PermissionDenied(_)) => Err(format!("permission denied: {path}")),
        Some(D::Rejected(r)) => Err(format!(
            "reading diagnostics of {path} was rejected: {}",
            r.reason
        )),
        Some(D::Error(e)) => Err(format!("reading diagnostics of {path}: {}", e.error)),
        None => Err("the client returned an empty diagnostics result".to_owned()),
    }
}

/// Every path's diagnostics: the card's list and the model's lines.
fn report(lints: &ReadLintsInput, call_id: &str, files: Vec<pb::FileDiagnostics>) -> ToolOutcome {
    let total: usize = files.iter().map(|f| f.diagnostics.len()).sum();
    let mut text = String::new();
    for file in &files {
        for d in &file.diagnostics {
            let (line, column) = d
                .range
                .as_ref()
                .and_then(|r| r.start.as_ref())
                .map_or((0, 0), |p| (p.line, p.column));
            let severity =
                pb::DiagnosticSeverity::try_from(d.severity).map_or("unknown", |s| match s {
                    pb::DiagnosticSeverity::Error => "error",
                    pb::DiagnosticSeverity::Warning => "warning",
                    pb::DiagnosticSeverity::Information => "info",
                    pb::DiagnosticSeverity::Hint => "hint",
                    pb::DiagnosticSeverity::Unspecified => "unknown",
                });
            let _ = write!(
                text,
                "{}:{line}:{column}: {severity}: {}",
                file.path, d.message
            );
            if !d.source.is_empty() || !d.code.is_empty() {
                let _ = write!(text, " [{} {}]", d.source, d.code);
            }
            text.push('\n');
        }
    }
    if total == 0 {
        text = format!("No linter errors found in {}.", lints.paths.join(", "));
    }
    let part = pb::ReadLintsToolResult {
        result: Some(pb::read_lints_tool_result::Result::Success(
            pb::ReadLintsToolSuccess {
                total_files: i32_of(files.len()),
                total_diagnostics: i32_of(total),
                file_diagnostics: files,
            },
        )),
    };
    done(lints, call_id, part, text, false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cursor::proto::agent::exec_client_message;
    use crate::tools::tool_result::Stage;
    use crate::tools::tool_result::testing::{ended, env};

    #[test]
    fn a_clean_file_says_so_and_the_card_counts_it() {
        let lints = ReadLintsInput::parse(r#"{"paths":["a.rs"]}"#).unwrap();
        let result = pb::DiagnosticsResult {
            result: Some(pb::diagnostics_result::Result::Success(
                pb::DiagnosticsSuccess::default(),
            )),
        };
        let outcome = ended(lints.on_result(
            "c1",
            exec_client_message::Message::DiagnosticsResult(result),
            &mut Stage::default(),
            &env(),
        ));
        assert_eq!(outcome.model_text, "No linter errors found in a.rs.");
        let Some(tool_call::Tool::ReadLintsToolCall(card)) = outcome.card.tool else {
            panic!("a ReadLints card")
        };
        let Some(pb::read_lints_tool_result::Result::Success(success)) =
            card.result.and_then(|r| r.result)
        else {
            panic!("a success")
        };
        assert_eq!((success.total_files, success.total_diagnostics), (1, 0));
    }

    #[test]
    fn failed_lints_have_the_lints_error_card() {
        let lints = ReadLintsInput::parse(r#"{"paths":["a.rs"]}"#).unwrap();
        let outcome = failed(&lints, "c1", "no language server");
        assert_eq!(outcome.model_text, "Error: no language server");
        let Some(tool_call::Tool::ReadLintsToolCall(card)) = outcome.card.tool else {
            panic!("a ReadLints card")
        };
        assert!(matches!(
            card.result.and_then(|r| r.result),
            Some(pb::read_lints_tool_result::Result::Error(_))
        ));
    }
}
