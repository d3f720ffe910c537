//! Edits: Write (whole content, streamed into the card while the model writes it), StrReplace (read,
//! replace exactly, write back) and Delete. The incremental argument decoder lives here because
//! Write is the tool whose argument streams into its card.

use serde::Deserialize;

use crate::cursor::proto::agent::{
    self as pb, exec_client_message, exec_server_message, tool_call,
};
use crate::tools::exec::ExecRequest;
use crate::tools::tool_result::{
    PendingEdit, Stage, Tool, ToolEnv, ToolOutcome, ToolStep, card, done, failed, i32_of,
    non_empty, on_exec_answer, parse_args, unexpected_result,
};

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct WriteInput {
    pub path: String,
    pub contents: String,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct StrReplaceInput {
    pub path: String,
    pub old_string: String,
    pub new_string: String,
    #[serde(default)]
    pub replace_all: bool,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct DeleteInput {
    pub path: String,
}

/// Which edit a write finishes (the model is told what happened in its terms).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum EditKind {
    Write,
    Replace,
}

/// The edit card Write and StrReplace share: the path, and an `EditResult`.
fn edit_card(path: Option<&str>, result: Option<pb::EditResult>) -> pb::ToolCall {
    card(tool_call::Tool::EditToolCall(pb::EditToolCall {
        args: path.map(edit_args),
        result,
    }))
}

impl Tool for WriteInput {
    type Result = pb::EditResult;

    const NAME: &'static str = "Write";
    const ARGUMENTS: &'static [(&'static str, bool)] = &[("path", true), ("contents", true)];
    const STREAMED_CONTENT: Option<&'static str> = Some("contents");

    fn parse(text: &str) -> Result<WriteInput, String> {
        let input: WriteInput = parse_args("Write", text)?;
        non_empty("Write", "path", &input.path)?;
        Ok(input)
    }

    fn card(args: Option<&Self>, _call_id: &str, result: Option<Self::Result>) -> pb::ToolCall {
        edit_card(args.map(|a| a.path.as_str()), result)
    }

    fn error(args: Option<&Self>, _call_id: &str, message: &str) -> Self::Result {
        edit_error(args.map_or("", |a| a.path.as_str()), message)
    }

    fn start(&self, call_id: &str, _env: &ToolEnv) -> ToolStep {
        ToolStep::Exec(write_request(&self.path, &self.contents, call_id))
    }

    on_exec_answer!(WriteResult => write_outcome);
}

impl Tool for StrReplaceInput {
    type Result = pb::EditResult;

    const NAME: &'static str = "StrReplace";
    const ARGUMENTS: &'static [(&'static str, bool)] = &[
        ("path", true),
        ("old_string", true),
        ("new_string", true),
        ("replace_all", false),
    ];

    fn parse(text: &str) -> Result<StrReplaceInput, String> {
        let input: StrReplaceInput = parse_args("StrReplace", text)?;
        non_empty("StrReplace", "path", &input.path)?;
        if input.old_string.is_empty() {
            return Err("invalid arguments for StrReplace: `old_string` must not be empty (use Write to create a file)".to_owned());
        }
        if input.old_string == input.new_string {
            return Err(
                "invalid arguments for StrReplace: `new_string` is identical to `old_string`"
                    .to_owned(),
            );
        }
        Ok(input)
    }

    fn card(args: Option<&Self>, _call_id: &str, result: Option<Self::Result>) -> pb::ToolCall {
        edit_card(args.map(|a| a.path.as_str()), result)
    }

    fn error(args: Option<&Self>, _call_id: &str, message: &str) -> Self::Result {
        edit_error(args.map_or("", |a| a.path.as_str()), message)
    }

    /// An exact replacement needs the current content first.
    fn start(&self, call_id: &str, _env: &ToolEnv) -> ToolStep {
        ToolStep::Exec(super::read::read_request(&self.path, None, None, call_id))
    }

    fn on_result(
        &self,
        call_id: &str,
        result: exec_client_message::Message,
        stage: &mut Stage,
        _env: &ToolEnv,
    ) -> Vec<ToolStep> {
        use exec_client_message::Message as R;
        match result {
            R::ReadResult(result) => str_replace_after_read(self, call_id, stage, result),
            R::WriteResult(result) => {
                let pending = stage.pending_edit.take();
                let outcome = edit_write_outcome(
                    self,
                    EditKind::Replace,
                    call_id,
                    &self.path,
                    result,
                    pending,
                );
                vec![ToolStep::Done(outcome)]
            }
            other => unexpected_result(self, call_id, &other),
        }
    }
}

impl Tool for DeleteInput {
    type Result = pb::DeleteResult;

    const NAME: &'static str = "Delete";
    const ARGUMENTS: &'static [(&'static str, bool)] = &[("path", true)];

    fn parse(text: &str) -> Result<DeleteInput, String> {
        let input: DeleteInput = parse_args("Delete", text)?;
        non_empty("Delete", "path", &input.path)?;
        Ok(input)
    }

    fn card(args: Option<&Self>, call_id: &str, result: Option<Self::Result>) -> pb::ToolCall {
        card(tool_call::Tool::DeleteToolCall(pb::DeleteToolCall {
            args: args.map(|delete| pb::DeleteArgs {
                path: delete.path.clone(),
                tool_call_id: call_id.to_owned(),
            }),
            result,
        }))
    }

    fn error(args: Option<&Self>, _call_id: &str, message: &str) -> Self::Result {
        pb::DeleteResult {
            result: Some(pb::delete_result::Result::Error(pb::DeleteError {
                path: args.map(|a| a.path.clone()).unwrap_or_default(),
                error: message.to_owned(),
            })),
        }
    }

    fn start(&self, call_id: &str, _env: &ToolEnv) -> ToolStep {
        ToolStep::exec(exec_server_message::Message::DeleteArgs(pb::DeleteArgs {
            path: self.path.clone(),
            tool_call_id: call_id.to_owned(),
        }))
    }

    on_exec_answer!(DeleteResult => delete_outcome);
}

fn edit_args(path: &str) -> pb::EditArgs {
    pb::EditArgs {
        path: path.to_owned(),
        stream_content: None,
    }
}

fn edit_error(path: &str, message: &str) -> pb::EditResult {
    pb::EditResult {
        result: Some(pb::edit_result::Result::Error(pb::EditError {
            path: path.to_owned(),
            error: message.to_owned(),
            model_visible_error: Some(message.to_owned()),
        })),
    }
}

fn write_request(path: &str, text: &str, call_id: &str) -> ExecRequest {
    ExecRequest::new(exec_server_message::Message::WriteArgs(pb::WriteArgs {
        path: path.to_owned(),
        file_text: text.to_owned(),
        tool_call_id: call_id.to_owned(),
        return_file_content_after_write: false,
        ..pb::WriteArgs::default()
    }))
}

fn str_replace_after_read(
    edit: &StrReplaceInput,
    call_id: &str,
    stage: &mut Stage,
    result: pb::ReadResult,
) -> Vec<ToolStep> {
    use pb::read_result::Result as R;
    let fail = |text: String| vec![ToolStep::Done(failed(edit, call_id, &text))];
    let before = match result.result {
        Some(R::Success(success)) => match success.output {
            Some(pb::read_success::Output::Content(text)) => text,
            _ => return fail(format!("{} is not a text file", edit.path)),
        },
        Some(R::FileNotFound(_)) => return fail(format!("file not found: {}", edit.path)),
        Some(R::PermissionDenied(_)) => {
            return fail(format!("permission denied reading {}", edit.path));
        }
        Some(R::Error(e)) => return fail(format!("reading {}: {}", edit.path, e.error)),
        Some(R::Rejected(r)) => {
            return fail(format!("reading {} was rejected: {}", edit.path, r.reason));
        }
        Some(R::InvalidFile(f)) => return fail(format!("cannot edit {}: {}", edit.path, f.reason)),
        None => return fail("the client returned an empty read result".to_owned()),
    };
    let count = before.matches(edit.old_string.as_str()).count();
    if count == 0 {
        return fail(format!(
            "old_string was not found in {}; read the file again and copy the text exactly",
            edit.path
        ));
    }
    if count > 1 && !edit.replace_all {
        return fail(format!(
            "old_string occurs {count} times in {}; include more surrounding context to make it unique, or set replace_all",
            edit.path
        ));
    }
    let after = if edit.replace_all {
        before.replace(&edit.old_string, &edit.new_string)
    } else {
        before.replacen(&edit.old_string, &edit.new_string, 1)
    };
    let request = write_request(&edit.path, &after, call_id);
    stage.pending_edit = Some(PendingEdit {
        before,
        after,
        replacements: count,
    });
    vec![ToolStep::Exec(request)]
}

fn edit_write_outcome<T: Tool<Result = pb::EditResult>>(
    input: &T,
    kind: EditKind,
    call_id: &str,
    path: &str,
    result: pb::WriteResult,
    edit: Option<PendingEdit>,
) -> ToolOutcome {
    use pb::write_result::Result as W;
    let error = |text: String| {
        done(
            input,
            call_id,
            edit_error(path, &text),
            format!("Error: {text}"),
            true,
        )
    };
    match result.result {
        Some(W::Success(success)) => {
            let edit = edit.unwrap_or(PendingEdit {
                before: String::new(),
                after: String::new(),
                replacements: 0,
            });
            let (added, removed) = line_delta(&edit.before, &edit.after);
            let text = match kind {
                EditKind::Replace => format!(
                    "Edited {path}: replaced {} occurrence{}.",
                    edit.replacements,
                    if edit.replacements == 1 { "" } else { "s" }
                ),
                _ => format!("Wrote {} lines to {path}.", success.lines_created),
            };
            let part = pb::EditResult {
                result: Some(pb::edit_result::Result::Success(pb::EditSuccess {
                    path: if success.path.is_empty() {
                        path.to_owned()
                    } else {
                        success.path.clone()
                    },
                    lines_added: Some(i32_of(added)),
                    lines_removed: Some(i32_of(removed)),
                    before_full_file_content: Some(edit.before),
                    after_full_file_content: edit.after,
                    message: Some(text.clone()),
                    ..pb::EditSuccess::default()
                })),
            };
            done(input, call_id, part, text, false)
        }
        Some(W::PermissionDenied(p)) => {
            error(format!("permission denied writing {path}: {}", p.error))
        }
        Some(W::NoSpace(_)) => error(format!("no space left on device writing {path}")),
        Some(W::Error(e)) => error(format!("writing {path}: {}", e.error)),
        Some(W::Rejected(r)) => error(format!(
            "the user rejected the change to {path}: {}",
            r.reason
        )),
        None => error("the client returned an empty write result".to_owned()),
    }
}

/// Lines added and removed between two versions (common prefix and suffix excluded).
fn line_delta(before: &str, after: &str) -> (usize, usize) {
    let a: Vec<&str> = before.lines().collect();
    let b: Vec<&str> = after.lines().collect();
    let prefix = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    let suffix = a[prefix..]
        .iter()
        .rev()
        .zip(b[prefix..].iter().rev())
        .take_while(|(x, y)| x == y)
        .count();
    (b.len() - prefix - suffix, a.len() - prefix - suffix)
}

/// A Write's answer: the whole new content is the card's diff.
fn write_outcome(
    write: &WriteInput,
    call_id: &str,
    result: pb::WriteResult,
    _env: &ToolEnv,
) -> ToolOutcome {
    let written = PendingEdit {
        before: String::new(),
        after: write.contents.clone(),
        replacements: 0,
    };
    edit_write_outcome(
        write,
        EditKind::Write,
        call_id,
        &write.path,
        result,
        Some(written),
    )
}

fn delete_outcome(
    delete: &DeleteInput,
    call_id: &str,
    result: pb::DeleteResult,
    _env: &ToolEnv,
) -> ToolOutcome {
    let path = delete.path.as_str();
    use pb::delete_result::Result as D;
    let (text, is_error) = match &result.result {
        Some(D::Success(_)) => (format!("Deleted {path}."), false),
        Some(D::FileNotFound(_)) => (format!("Error: file not found: {path}"), true),
        Some(D::NotFile(n)) => (
            format!("Error: {path} is not a file ({})", n.actual_type),
            true,
        ),
        Some(D::PermissionDenied(p)) => (
            format!(
                "Error: permission denied deleting {path}: {}",
                p.client_visible_error
            ),
            true,
        ),
        Some(D::FileBusy(_)) => (format!("Error: {path} is busy"), true),
        Some(D::Rejected(r)) => (
            format!("Error: the user rejected deleting {path}: {}", r.reason),
            true,
        ),
        Some(D::Error(e)) => (format!("Error: deleting {path}: {}", e.error), true),
        None => {
            return failed(
                delete,
                call_id,
                "the client returned an empty delete result",
            );
        }
    };
    done(delete, call_id, result, text, is_error)
}

/// Incremental argument decoder: follows the model's JSON argument text fragment by fragment and
/// yields the decoded text of one top-level string field as it arrives, in O(fragment) per call.
#[derive(Debug)]
pub struct FieldStreamer {
    field: &'static str,
    depth: u32,
    expect_key: bool,
    last_key: String,
    key: String,
    state: ScanState,
    escape: Escape,
    high_surrogate: Option<u16>,
    done: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ScanState {
    Outside,
    InKey,
    InOtherString,
    InTarget,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Escape {
    None,
    Backslash,
    Unicode(String),
}

impl FieldStreamer {
    pub fn new(field: &'static str) -> Self {
        FieldStreamer {
            field,
            depth: 0,
            expect_key: false,
            last_key: String::new(),
            key: String::new(),
            state: ScanState::Outside,
            escape: Escape::None,
            high_surrogate: None,
            done: false,
        }
    }

    /// Feeds one argument fragment; returns the newly decoded part of the field's value.
    pub fn feed(&mut self, fragment: &str) -> String {
        let mut out = String::new();
        for c in fragment.chars() {
            match self.state {
                ScanState::Outside => self.outside(c),
                ScanState::InKey | ScanState::InOtherString => {
                    if self.string_char(c) == Some('"') {
                        if self.state == ScanState::InKey {
                            self.last_key = std::mem::take(&mut self.key);
                        }
                        self.state = ScanState::Outside;
                    } else if self.state == ScanState::InKey {
                        self.key.push(c);
                    }
                }
                ScanState::InTarget => self.target_char(c, &mut out),
            }
        }
        out
    }

    fn outside(&mut self, c: char) {
        match c {
            '{' => {
                self.depth += 1;
                self.expect_key = self.depth == 1;
            }
            '[' => self.depth += 1,
            '}' | ']' => self.depth = self.depth.saturating_sub(1),
            ',' if self.depth == 1 => self.expect_key = true,
            ':' if self.depth == 1 => self.expect_key = false,
            '"' => {
                self.state = if self.depth == 1 && self.expect_key {
                    self.key.clear();
                    ScanState::InKey
                } else if self.depth == 1 && !self.done && self.last_key == self.field {
                    ScanState::InTarget
                } else {
                    ScanState::InOtherString
                };
            }
            _ => {}
        }
    }

    /// Escape tracking for strings we do not decode; returns `Some('"')` at the closing quote.
    fn string_char(&mut self, c: char) -> Option<char> {
        match (&self.escape, c) {
            (Escape::Backslash, _) => {
                self.escape = Escape::None;
                None
            }
            (_, '\\') => {
                self.escape = Escape::Backslash;
                None
            }
            (_, '"') => Some('"'),
            _ => None,
        }
    }

    fn target_char(&mut self, c: char, out: &mut String) {
        match std::mem::replace(&mut self.escape, Escape::None) {
            Escape::None => match c {
                '\\' => self.escape = Escape::Backslash,
                '"' => {
                    self.state = ScanState::Outside;
                    self.done = true;
                }
                c => out.push(c),
            },
            Escape::Backslash => match c {
                'n' => out.push('\n'),
                't' => out.push('\t'),
                'r' => out.push('\r'),
                'b' => out.push('\u{8}'),
                'f' => out.push('\u{c}'),
                'u' => self.escape = Escape::Unicode(String::new()),
                other => out.push(other),
            },
            Escape::Unicode(mut hex) => {
                hex.push(c);
                if hex.len() < 4 {
                    self.escape = Escape::Unicode(hex);
                    return;
                }
                let Ok(unit) = u16::from_str_radix(&hex, 16) else {
                    return;
                };
                match (self.high_surrogate.take(), unit) {
                    (None, 0xD800..=0xDBFF) => self.high_surrogate = Some(unit),
                    (Some(high), 0xDC00..=0xDFFF) => {
                        let code = 0x10000
                            + ((u32::from(high) - 0xD800) << 10)
                            + (u32::from(unit) - 0xDC00);
                        out.extend(char::from_u32(code));
                    }
                    (_, unit) => out.extend(char::from_u32(u32::from(unit))),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::tool_result::testing::{ended, env};

    #[test]
    fn a_write_reports_the_lines_written_on_its_edit_card() {
        let write = WriteInput::parse(r#"{"path":"a.txt","contents":"x\ny\n"}"#).unwrap();
        let result = pb::WriteResult {
            result: Some(pb::write_result::Result::Success(pb::WriteSuccess {
                path: "a.txt".into(),
                lines_created: 2,
                ..Default::default()
            })),
        };
        let outcome = ended(write.on_result(
            "c1",
            exec_client_message::Message::WriteResult(result),
            &mut Stage::default(),
            &env(),
        ));
        assert_eq!(outcome.model_text, "Wrote 2 lines to a.txt.");
        let Some(tool_call::Tool::EditToolCall(card)) = outcome.card.tool else {
            panic!("an edit card")
        };
        let Some(pb::edit_result::Result::Success(success)) = card.result.and_then(|r| r.result)
        else {
            panic!("a success")
        };
        assert_eq!(
            (success.path.as_str(), success.lines_added),
            ("a.txt", Some(2))
        );
    }

    #[test]
    fn failed_edits_and_deletes_name_their_path_on_the_error_card() {
        let edit =
            StrReplaceInput::parse(r#"{"path":"b.rs","old_string":"a","new_string":"b"}"#).unwrap();
        let outcome = failed(&edit, "c1", "no match");
        assert_eq!(outcome.model_text, "Error: no match");
        let Some(tool_call::Tool::EditToolCall(card)) = outcome.card.tool else {
            panic!("an edit card")
        };
        assert_eq!(card.result, Some(edit_error("b.rs", "no match")));
        let delete = DeleteInput::parse(r#"{"path":"c.rs"}"#).unwrap();
        let Some(tool_call::Tool::DeleteToolCall(card)) = failed(&delete, "c2", "gone").card.tool
        else {
            panic!("a delete card")
        };
        assert_eq!(
            card.result.and_then(|r| r.result),
            Some(pb::delete_result::Result::Error(pb::DeleteError {
                path: "c.rs".into(),
                error: "gone".into()
            }))
        );
    }

    #[test]
    fn the_streamed_field_decodes_incrementally_whatever_the_fragment_boundaries() {
        let args = r#"{"path":"say \"contents\": x","contents":"line 1\n\"quoted\" \u00e9\ud83d\ude00 tab\tend","n":[1,{"contents":"no"}]}"#;
        let expected = "line 1\n\"quoted\" é😀 tab\tend";
        for size in [1, 2, 3, 7, args.len()] {
            let mut streamer = FieldStreamer::new("contents");
            let mut decoded = String::new();
            let chars: Vec<char> = args.chars().collect();
            for chunk in chars.chunks(size) {
                decoded.push_str(&streamer.feed(&chunk.iter().collect::<String>()));
            }
            assert_eq!(decoded, expected, "fragment size {size}");
        }
    }

    #[test]
    fn line_delta_counts_changed_lines_only() {
        assert_eq!(line_delta("a\nb\nc", "a\nx\ny\nc"), (2, 1));
        assert_eq!(line_delta("", "one\ntwo"), (2, 0));
    }
}
