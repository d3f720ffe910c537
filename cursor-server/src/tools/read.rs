//! Read: one file's lines, with line numbers, as the model asked for them (offset from either end,
//! limit), binary content named rather than shown.

use std::fmt::Write as _;

use serde::Deserialize;

use crate::cursor::proto::agent::{self as pb, exec_server_message, tool_call};
use crate::tools::exec::ExecRequest;
use crate::tools::tool_result::{
    Tool, ToolEnv, ToolOutcome, ToolStep, card, done, failed, non_empty, on_exec_answer,
    parse_args, truncate_for_model,
};

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct ReadInput {
    pub path: String,
    pub offset: Option<i32>,
    pub limit: Option<u32>,
}

impl Tool for ReadInput {
    type Result = pb::ReadToolResult;

    const NAME: &'static str = "Read";
    const ARGUMENTS: &'static [(&'static str, bool)] =
        &[("path", true), ("offset", false), ("limit", false)];

    fn parse(text: &str) -> Result<ReadInput, String> {
        let input: ReadInput = parse_args("Read", text)?;
        non_empty("Read", "path", &input.path)?;
        if input.limit == Some(0) {
            return Err("invalid arguments for Read: `limit` must be at least 1".to_owned());
        }
        Ok(input)
    }

    fn card(args: Option<&Self>, _call_id: &str, result: Option<Self::Result>) -> pb::ToolCall {
        card(tool_call::Tool::ReadToolCall(pb::ReadToolCall {
            args: args.map(read_args),
            result,
        }))
    }

    fn error(_args: Option<&Self>, _call_id: &str, message: &str) -> Self::Result {
        pb::ReadToolResult {
            result: Some(pb::read_tool_result::Result::Error(pb::ReadToolError {
                error_message: message.to_owned(),
            })),
        }
    }

    fn start(&self, call_id: &str, _env: &ToolEnv) -> ToolStep {
        ToolStep::Exec(read_request(&self.path, self.offset, self.limit, call_id))
    }

    on_exec_answer!(ReadResult => read_outcome);
}

fn read_args(input: &ReadInput) -> pb::ReadToolArgs {
    pb::ReadToolArgs {
        path: input.path.clone(),
        offset: input.offset,
        limit: input.limit.map(|l| i32::try_from(l).unwrap_or(i32::MAX)),
        include_line_numbers: Some(true),
    }
}

pub fn read_request(
    path: &str,
    offset: Option<i32>,
    limit: Option<u32>,
    call_id: &str,
) -> ExecRequest {
    ExecRequest::new(exec_server_message::Message::ReadArgs(pb::ReadArgs {
        path: path.to_owned(),
        tool_call_id: call_id.to_owned(),
        offset,
        limit,
        encoding_hint: None,
    }))
}

fn read_outcome(
    read: &ReadInput,
    call_id: &str,
    result: pb::ReadResult,
    env: &ToolEnv,
) -> ToolOutcome {
    use pb::read_result::Result as R;
    let error = |text: String| failed(read, call_id, &text);
    match result.result {
        Some(R::Success(success)) => {
            let content = match &success.output {
                Some(pb::read_success::Output::Content(text)) => text.clone(),
                Some(pb::read_success::Output::Data(bytes)) => {
                    let text = format!("(binary file, {} bytes; not shown)", bytes.len());
                    return done(
                        read,
                        call_id,
                        read_success(&success, told_lines(&success), String::new(), None),
                        text,
                        false,
                    );
                }
                None => String::new(),
            };
            let total = file_lines(
                &content,
                told_lines(&success),
                success.range_applied,
                success.truncated,
            );
            let (first_line, lines) = select_lines(
                &content,
                read.offset,
                read.limit,
                total,
                success.range_applied,
            );
            let shown_end = first_line + lines.len().saturating_sub(1);
            let total = if success.range_applied && !lines.is_empty() {
                without_final_empty_part(&content, shown_end, total)
            } else {
                total
            };
            let text = numbered(first_line, &lines, total, success.truncated);
            let range = pb::ReadRange {
                start_line: u32::try_from(first_line).unwrap_or(u32::MAX),
                end_line: u32::try_from(shown_end).unwrap_or(u32::MAX),
            };
            let shown: String = lines.join("\n");
            let model_text = truncate_for_model(&text, env.max_output_bytes, 0);
            done(
                read,
                call_id,
                read_success(&success, total, shown, Some(range)),
                model_text,
                false,
            )
        }
        Some(R::Error(e)) => error(format!("reading {}: {}", e.path, e.error)),
        Some(R::Rejected(r)) => error(format!("reading {} was rejected: {}", r.path, r.reason)),
        Some(R::FileNotFound(f)) => error(format!("file not found: {}", f.path)),
        Some(R::PermissionDenied(p)) => error(format!("permission denied: {}", p.path)),
        Some(R::InvalidFile(f)) => error(format!("cannot read {}: {}", f.path, f.reason)),
        None => error("the client returned an empty read result".to_owned()),
    }
}

/// The lines as the model reads them, numbered, with a note when there is more to read (the
/// client cut the content short, or lines remain after those shown).
fn numbered(first_line: usize, lines: &[&str], total: usize, truncated: bool) -> String {
    let mut text = String::new();
    for (i, line) in lines.iter().enumerate() {
        let _ = writeln!(text, "{:>6}|{line}", first_line + i);
    }
    if lines.is_empty() {
        text.push_str(if total == 0 {
            "(the file is empty)"
        } else {
            "(no lines in the requested range)"
        });
    }
    let shown_end = first_line + lines.len().saturating_sub(1);
    if truncated || (total > 0 && shown_end < total) {
        let _ = write!(
            text,
            "\n[showing lines {first_line}-{shown_end} of {total}; use offset and limit to read more]"
        );
    }
    text
}

/// The line count the client sent (it counts newline-separated parts).
fn told_lines(success: &pb::ReadSuccess) -> usize {
    usize::try_from(success.total_lines.max(0)).unwrap_or(0)
}

/// How many lines the file has. Content the client sent whole (range not applied, not truncated)
/// is the file: its own line count is the truth, since the client counts the empty part after a
/// final newline as a line. Otherwise the client's count is all there is (at least what was sent).
fn file_lines(content: &str, told: usize, range_applied: bool, truncated: bool) -> usize {
    let own = content.lines().count();
    match (range_applied, truncated) {
        (false, false) => own,
        (false, true) => told.max(own),
        (true, _) => told,
    }
}

/// The file's line count for a range the client applied: the client counts the empty part after
/// a final newline as a line, so when the range shown ends with a newline right before that part,
/// nothing is left to read.
fn without_final_empty_part(range: &str, shown_end: usize, told: usize) -> usize {
    if range.ends_with('\n') && shown_end + 1 == told {
        shown_end
    } else {
        told
    }
}

/// The card's result; `total` is the file's line count as this server reads it.
fn read_success(
    success: &pb::ReadSuccess,
    total: usize,
    content: String,
    range: Option<pb::ReadRange>,
) -> pb::ReadToolResult {
    pb::ReadToolResult {
        result: Some(pb::read_tool_result::Result::Success(pb::ReadToolSuccess {
            is_empty: total == 0,
            exceeded_limit: success.truncated,
            total_lines: u32::try_from(total).unwrap_or(u32::MAX),
            file_size: u32::try_from(success.file_size.max(0)).unwrap_or(u32::MAX),
            path: success.path.clone(),
            read_range: range,
            include_line_numbers: Some(true),
            output: Some(pb::read_tool_success::Output::Content(content)),
            ..pb::ReadToolSuccess::default()
        })),
    }
}

/// The 1-based number of the first line shown, and the lines, honouring offset/limit whether or
/// not the client already applied the range.
fn select_lines(
    content: &str,
    offset: Option<i32>,
    limit: Option<u32>,
    total: usize,
    range_applied: bool,
) -> (usize, Vec<&str>) {
    let all: Vec<&str> = if content.is_empty() {
        Vec::new()
    } else {
        content.lines().collect()
    };
    let total = total.max(if range_applied { 0 } else { all.len() });
    let start = match offset {
        Some(o) if o > 0 => o as usize,
        Some(o) if o < 0 => total.saturating_sub(o.unsigned_abs() as usize) + 1,
        _ => 1,
    };
    let limit = limit.map_or(usize::MAX, |l| l as usize);
    if range_applied {
        (start, all.into_iter().take(limit).collect())
    } else {
        (start, all.into_iter().skip(start - 1).take(limit).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cursor::proto::agent::exec_client_message;
    use crate::tools::tool_result::Stage;
    use crate::tools::tool_result::testing::{ended, env};

    fn read() -> ReadInput {
        ReadInput::parse(r#"{"path":"src/a.rs"}"#).unwrap()
    }

    #[test]
    fn a_read_shows_numbered_lines_and_its_card_the_lines_shown() {
        let result = pb::ReadResult {
            result: Some(pb::read_result::Result::Success(pb::ReadSuccess {
                path: "src/a.rs".into(),
                total_lines: 2,
                output: Some(pb::read_success::Output::Content("one\ntwo".into())),
                ..Default::default()
            })),
        };
        let outcome = ended(read().on_result(
            "c1",
            exec_client_message::Message::ReadResult(result),
            &mut Stage::default(),
            &env(),
        ));
        assert!(!outcome.is_error);
        assert_eq!(outcome.model_text, "     1|one\n     2|two\n");
        let Some(tool_call::Tool::ReadToolCall(card)) = outcome.card.tool else {
            panic!("a Read card")
        };
        assert_eq!(card.args.map(|a| a.path), Some("src/a.rs".to_owned()));
        assert!(matches!(
            card.result.and_then(|r| r.result),
            Some(pb::read_tool_result::Result::Success(_))
        ));
    }

    #[test]
    fn a_failed_read_has_the_read_error_card_and_tells_the_model_why() {
        let outcome = failed(&read(), "c1", "file not found: src/a.rs");
        assert!(outcome.is_error);
        assert_eq!(outcome.model_text, "Error: file not found: src/a.rs");
        let Some(tool_call::Tool::ReadToolCall(card)) = outcome.card.tool else {
            panic!("a Read card")
        };
        assert_eq!(
            card.result.and_then(|r| r.result),
            Some(pb::read_tool_result::Result::Error(pb::ReadToolError {
                error_message: "file not found: src/a.rs".into()
            }))
        );
    }

    /// The model text of a Read of `read` answered with `content` and the client's `total_lines`.
    fn model_text(read: &str, content: &str, total_lines: i32, range_applied: bool) -> String {
        let result = pb::ReadResult {
            result: Some(pb::read_result::Result::Success(pb::ReadSuccess {
                path: "src/a.rs".into(),
                total_lines,
                range_applied,
                output: Some(pb::read_success::Output::Content(content.into())),
                ..Default::default()
            })),
        };
        ended(ReadInput::parse(read).unwrap().on_result(
            "c1",
            exec_client_message::Message::ReadResult(result),
            &mut Stage::default(),
            &env(),
        ))
        .model_text
    }

    #[test]
    fn a_read_notes_more_to_read_only_when_lines_really_remain() {
        let whole = r#"{"path":"a"}"#;
        // Cursor counts "one\n" as two lines (its newline-separated parts).
        assert_eq!(model_text(whole, "one\n", 2, false), "     1|one\n");
        assert_eq!(
            model_text(whole, "a\nb\n", 3, false),
            "     1|a\n     2|b\n"
        );
        // Counting from the end of a whole file uses its own line count.
        assert_eq!(
            model_text(r#"{"path":"a","offset":-1}"#, "a\nb\n", 3, false),
            "     2|b\n"
        );
        // A range the client applied, reaching the empty part after the final newline.
        assert_eq!(
            model_text(r#"{"path":"a","offset":2,"limit":5}"#, "b\n", 3, true),
            "     2|b\n"
        );
        // A range the client applied with a real line after it.
        assert_eq!(
            model_text(r#"{"path":"a","limit":1}"#, "a\n", 3, true),
            "     1|a\n\n[showing lines 1-1 of 3; use offset and limit to read more]"
        );
        // A limit on a whole file leaves lines to read.
        assert_eq!(
            model_text(r#"{"path":"a","limit":1}"#, "a\nb\n", 3, false),
            "     1|a\n\n[showing lines 1-1 of 2; use offset and limit to read more]"
        );
        // The client said it cut the content short: the note stays.
        let truncated = pb::ReadResult {
            result: Some(pb::read_result::Result::Success(pb::ReadSuccess {
                total_lines: 2,
                truncated: true,
                output: Some(pb::read_success::Output::Content("one\n".into())),
                ..Default::default()
            })),
        };
        let outcome = ended(read().on_result(
            "c1",
            exec_client_message::Message::ReadResult(truncated),
            &mut Stage::default(),
            &env(),
        ));
        assert!(outcome.model_text.contains("[showing lines 1-1 of 2;"));
        assert_eq!(model_text(whole, "", 1, false), "(the file is empty)");
    }

    #[test]
    fn line_selection_honours_offsets_from_either_end() {
        let content = "a\nb\nc\nd\ne";
        assert_eq!(
            select_lines(content, None, None, 5, false),
            (1, vec!["a", "b", "c", "d", "e"])
        );
        assert_eq!(
            select_lines(content, Some(2), Some(2), 5, false),
            (2, vec!["b", "c"])
        );
        assert_eq!(
            select_lines(content, Some(-2), None, 5, false),
            (4, vec!["d", "e"])
        );
        assert_eq!(
            select_lines("d\ne", Some(-2), None, 5, true),
            (4, vec!["d", "e"])
        );
    }
}
