//! Typed tool results: what every tool family (`tools/`) shares to turn a call into its card and the
//! text the model reads — the outcome, the next step, the facts a call needs, the per-call progress
//! between exec results, bounded output — and `Tool`, the one trait each tool implements in its
//! family file. A tool's success card and its error card come from the same impl, so there is no
//! second table to keep in step. Success or failure is decided by the result's oneof variant only.

use crate::cursor::proto::agent::{
    self as pb, exec_client_message, exec_server_message, interaction_query, interaction_response,
    tool_call,
};
use crate::model::conversation::{Mode, Todo};
use crate::model::tool::{McpTool, ToolMeta};
use crate::tools::exec::{ExecKind, ExecRequest, QueryRequest};

/// The end of one tool call.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolOutcome {
    /// The card's final typed args + typed result.
    pub card: Box<pb::ToolCall>,
    /// What the model gets back (always text).
    pub model_text: String,
    pub is_error: bool,
    /// Typed facts stored with the result for the conversation's derived state.
    pub meta: Option<ToolMeta>,
    /// Images the tool returned: stored as blobs with the result, shown to the model with it.
    pub images: Vec<ToolImage>,
}

/// One image a tool returned: what history keeps of it, and its bytes until they are stored.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolImage {
    pub image: crate::model::conversation::ImageRef,
    pub data: Vec<u8>,
}

/// What the loop must do next for one tool call.
#[derive(Debug, Clone, PartialEq)]
pub enum ToolStep {
    /// Send this exec request to the client and route its result back here.
    Exec(ExecRequest),
    /// Ask the user (`interaction_query`) and route the response back here.
    Query(QueryRequest),
    /// Run this query on the server's search backend and route the hits back here.
    Search(String),
    /// Show this live update on the card (shell output).
    Delta(pb::ToolCallDelta),
    /// The call is over.
    Done(ToolOutcome),
}

impl ToolStep {
    /// Send this exec request (the kind of its answer follows from it).
    pub fn exec(message: exec_server_message::Message) -> ToolStep {
        ToolStep::Exec(ExecRequest::new(message))
    }

    /// Ask the user this question.
    pub fn query(query: interaction_query::Query) -> ToolStep {
        ToolStep::Query(QueryRequest {
            query: Box::new(query),
        })
    }
}

/// Facts about the run that tools need.
#[derive(Debug, Clone, Default)]
pub struct ToolEnv {
    /// The client's terminals folder, where backgrounded shell output goes.
    pub terminals_folder: String,
    /// Model-facing tool output is truncated past this many bytes.
    pub max_output_bytes: usize,
    /// Todos as folded from history before this call (for TodoWrite merges).
    pub todos: Vec<Todo>,
    /// The mode the run is in (SwitchMode's "from").
    pub mode: Mode,
    /// The request's MCP tools, by model-facing name.
    pub mcp: std::sync::Arc<[McpTool]>,
    /// The conversation (a Task's parent) and the model it runs on (a Task's default model).
    pub conversation_id: String,
    pub model_id: String,
}

/// Per-call progress between exec results.
#[derive(Debug, Default)]
pub struct Stage {
    /// Shell output so far (bounded).
    pub stdout: Bounded,
    pub stderr: Bounded,
    /// StrReplace: the edited content waiting for its write result.
    pub pending_edit: Option<PendingEdit>,
    /// ReadLints: diagnostics collected so far, one entry per finished path.
    pub lints: Vec<pb::FileDiagnostics>,
}

/// An edit whose write is on its way: the content before and after, for the card's diff counts.
#[derive(Debug)]
pub struct PendingEdit {
    pub before: String,
    pub after: String,
    pub replacements: usize,
}

/// Text kept up to a byte limit, counting what was dropped.
#[derive(Debug, Default)]
pub struct Bounded {
    pub text: String,
    pub dropped: usize,
}

/// Shell output kept in memory per stream, independent of what the model is shown.
const MAX_KEPT_OUTPUT: usize = 1024 * 1024;

impl Bounded {
    pub fn push(&mut self, data: &str) {
        let room = MAX_KEPT_OUTPUT.saturating_sub(self.text.len());
        if data.len() <= room {
            self.text.push_str(data);
        } else {
            let cut = floor_char_boundary(data, room);
            self.text.push_str(&data[..cut]);
            self.dropped += data.len() - cut;
        }
    }
}

/// The largest char boundary of `text` at or before `max`.
pub fn floor_char_boundary(text: &str, max: usize) -> usize {
    let mut cut = max.min(text.len());
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    cut
}

/// Cuts `text` to `max` bytes with a marker saying how much was left out.
pub fn truncate_for_model(text: &str, max: usize, already_dropped: usize) -> String {
    if text.len() <= max && already_dropped == 0 {
        return text.to_owned();
    }
    let cut = floor_char_boundary(text, max);
    let omitted = text.len() - cut + already_dropped;
    format!(
        "{}\n[... output truncated: {omitted} more bytes not shown ...]",
        &text[..cut]
    )
}

/// A card holding `tool`.
pub fn card(tool: tool_call::Tool) -> pb::ToolCall {
    pb::ToolCall { tool: Some(tool) }
}

pub fn i32_of(value: usize) -> i32 {
    i32::try_from(value).unwrap_or(i32::MAX)
}

/// ` (reason)` when the user gave one, for rejection texts.
pub fn reason_suffix(reason: &str) -> String {
    if reason.trim().is_empty() {
        String::new()
    } else {
        format!(" ({})", reason.trim())
    }
}

// ---- arguments --------------------------------------------------------------------------------

/// The model's argument text to parse: an empty one stands for an empty object.
pub fn argument_text(arguments: &str) -> &str {
    if arguments.trim().is_empty() {
        "{}"
    } else {
        arguments
    }
}

/// The model's argument text as `T`; the message goes back to the model.
pub fn parse_args<T: serde::de::DeserializeOwned>(tool: &str, text: &str) -> Result<T, String> {
    serde_json::from_str(text).map_err(|e| format!("invalid arguments for {tool}: {e}"))
}

/// Refuses an empty (or blank) required string argument.
pub fn non_empty(tool: &str, field: &str, value: &str) -> Result<(), String> {
    if value.trim().is_empty() {
        Err(format!(
            "invalid arguments for {tool}: `{field}` must not be empty"
        ))
    } else {
        Ok(())
    }
}

// ---- one tool ---------------------------------------------------------------------------------

/// Why a call ends when the client closes its exec stream before a terminal result.
pub const CLOSED_WITHOUT_RESULT: &str = "the client closed the execution without a result";

/// How a tool is carried out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// The client executes it (`exec_server_message`).
    Exec,
    /// The server answers at once, without a client round trip.
    Local,
    /// The user decides (`interaction_query`); the response is the tool's result.
    Interaction,
}

/// Everything about one tool, implemented once by the tool's validated input in its family file:
/// its declaration (name, transport, arguments) and its behaviour (cards, steps, results). The
/// registry (`tools.rs`) lists each implementor once and derives every per-tool table from it.
pub trait Tool: Sized {
    /// The model-facing name (`function.name` in a mode's `tools.json`).
    const NAME: &'static str;

    /// How a call is carried out.
    const TRANSPORT: Transport = Transport::Exec;

    /// The arguments `parse` accepts, as (name, required). A mode's tool description must list
    /// exactly these (checked when the prompt assets load).
    const ARGUMENTS: &'static [(&'static str, bool)];

    /// The argument whose value streams into the card as file content while the model writes it.
    const STREAMED_CONTENT: Option<&'static str> = None;

    /// Parses and validates the model's argument text (never empty: see `argument_text`). The
    /// message goes back to the model.
    fn parse(text: &str) -> Result<Self, String>;

    /// The card's typed result.
    type Result;

    /// The card with typed args when they are known (`None`: the placeholder shown while the model
    /// is still writing them, or when they did not validate) and the result when there is one.
    fn card(args: Option<&Self>, call_id: &str, result: Option<Self::Result>) -> pb::ToolCall;

    /// This tool's typed error result.
    fn error(args: Option<&Self>, call_id: &str, message: &str) -> Self::Result;

    /// This tool's result when the run stops while it runs (the user's stop, a new message): the
    /// tool's own "aborted" result where it has one, else its error result.
    fn aborted(args: Option<&Self>, call_id: &str, _stage: &Stage, message: &str) -> Self::Result {
        Self::error(args, call_id, message)
    }

    /// The call's first step: an exec, a question to the user, or (local tools) its outcome.
    fn start(&self, call_id: &str, env: &ToolEnv) -> ToolStep;

    /// One exec result (already matched to this call by exec id and kind).
    fn on_result(
        &self,
        call_id: &str,
        result: exec_client_message::Message,
        _stage: &mut Stage,
        _env: &ToolEnv,
    ) -> Vec<ToolStep> {
        unexpected_result(self, call_id, &result)
    }

    /// The user's response to this call's interaction query.
    fn on_response(
        &self,
        call_id: &str,
        response: interaction_response::Result,
        _env: &ToolEnv,
    ) -> ToolStep {
        // `pending` matched the response kind to the query, so this is unreachable in practice;
        // still a terminal failed card rather than a panic.
        let kind = ExecKind::of_response(&response);
        ToolStep::Done(failed(
            self,
            call_id,
            &format!("unexpected response {kind}"),
        ))
    }

    /// The exec stream closed before a terminal result.
    fn on_closed(&self, call_id: &str, _stage: &mut Stage, _env: &ToolEnv) -> ToolOutcome {
        failed(self, call_id, CLOSED_WITHOUT_RESULT)
    }
}

/// The `on_result` of a tool that waits for one kind of exec answer (`exec_client_message`'s
/// `$variant`); any other answer fails the call. `$outcome(tool, call_id, answer, env)` ends the
/// call; with `steps`, `$steps(tool, call_id, answer, stage, env)` gives the next steps (live
/// output, several answers before the end).
macro_rules! on_exec_answer {
    ($variant:ident => steps $steps:path) => {
        fn on_result(
            &self,
            call_id: &str,
            result: $crate::cursor::proto::agent::exec_client_message::Message,
            stage: &mut $crate::tools::tool_result::Stage,
            env: &$crate::tools::tool_result::ToolEnv,
        ) -> Vec<$crate::tools::tool_result::ToolStep> {
            match result {
                $crate::cursor::proto::agent::exec_client_message::Message::$variant(answer) => {
                    $steps(self, call_id, answer, stage, env)
                }
                other => $crate::tools::tool_result::unexpected_result(self, call_id, &other),
            }
        }
    };
    ($variant:ident => $outcome:path) => {
        fn on_result(
            &self,
            call_id: &str,
            result: $crate::cursor::proto::agent::exec_client_message::Message,
            _stage: &mut $crate::tools::tool_result::Stage,
            env: &$crate::tools::tool_result::ToolEnv,
        ) -> Vec<$crate::tools::tool_result::ToolStep> {
            match result {
                $crate::cursor::proto::agent::exec_client_message::Message::$variant(answer) => {
                    vec![$crate::tools::tool_result::ToolStep::Done($outcome(
                        self, call_id, answer, env,
                    ))]
                }
                other => $crate::tools::tool_result::unexpected_result(self, call_id, &other),
            }
        }
    };
}
pub(crate) use on_exec_answer;

/// An exec result of a kind this tool never asked for: a failed call.
pub fn unexpected_result<T: Tool>(
    args: &T,
    call_id: &str,
    result: &exec_client_message::Message,
) -> Vec<ToolStep> {
    let kind = ExecKind::of_result(result);
    vec![ToolStep::Done(failed(
        args,
        call_id,
        &format!("internal error: unexpected {kind} for this tool"),
    ))]
}

/// An interaction response of a kind this tool never asked for: a failed call. `pending` matched
/// the response kind to the query, so this is unreachable in practice; still a terminal failed card
/// rather than a panic.
pub fn unexpected_response<T: Tool>(
    args: &T,
    call_id: &str,
    response: interaction_response::Result,
    _env: &ToolEnv,
) -> ToolStep {
    let kind = ExecKind::of_response(&response);
    ToolStep::Done(failed(
        args,
        call_id,
        &format!("unexpected response {kind}"),
    ))
}

/// A finished call: its card with `result` and the model's text.
pub fn done<T: Tool>(
    args: &T,
    call_id: &str,
    result: T::Result,
    model_text: String,
    is_error: bool,
) -> ToolOutcome {
    ToolOutcome {
        images: Vec::new(),
        card: Box::new(T::card(Some(args), call_id, Some(result))),
        model_text,
        is_error,
        meta: None,
    }
}

/// A failed call: its card with the tool's typed error and `Error: message` for the model.
pub fn failed<T: Tool>(args: &T, call_id: &str, message: &str) -> ToolOutcome {
    ToolOutcome {
        images: Vec::new(),
        card: Box::new(T::card(
            Some(args),
            call_id,
            Some(T::error(Some(args), call_id, message)),
        )),
        model_text: format!("Error: {message}"),
        is_error: true,
        meta: None,
    }
}

/// A call the run stopped while it ran: its card with the tool's aborted result.
pub fn aborted<T: Tool>(args: &T, call_id: &str, stage: &Stage, message: &str) -> ToolOutcome {
    ToolOutcome {
        images: Vec::new(),
        card: Box::new(T::card(
            Some(args),
            call_id,
            Some(T::aborted(Some(args), call_id, stage, message)),
        )),
        model_text: format!("Error: {message}"),
        is_error: true,
        meta: None,
    }
}

/// The card without args: the placeholder while arguments stream, or (with `error`) the card of a
/// call whose arguments did not validate.
pub fn bare_card<T: Tool>(error: Option<&str>) -> pb::ToolCall {
    T::card(None, "", error.map(|message| T::error(None, "", message)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncation_marks_what_was_left_out() {
        assert_eq!(truncate_for_model("short", 10, 0), "short");
        let cut = truncate_for_model("0123456789abc", 10, 0);
        assert!(
            cut.starts_with("0123456789\n[... output truncated: 3 more bytes"),
            "{cut}"
        );
        let multibyte = truncate_for_model("ééé", 3, 0);
        assert!(multibyte.starts_with('é'), "{multibyte}");
    }
}

/// What the family files' unit tests share.
#[cfg(test)]
pub mod testing {
    use super::*;

    /// A run's facts as a test sets them.
    pub fn env() -> ToolEnv {
        ToolEnv {
            terminals_folder: "/tmp/terminals".into(),
            max_output_bytes: 10_000,
            conversation_id: "conv".into(),
            model_id: "model".into(),
            ..ToolEnv::default()
        }
    }

    /// The outcome of steps that end the call at once.
    pub fn ended(steps: Vec<ToolStep>) -> ToolOutcome {
        match <[ToolStep; 1]>::try_from(steps) {
            Ok([ToolStep::Done(outcome)]) => outcome,
            other => panic!("expected one Done step, got {other:?}"),
        }
    }

    /// The single step as an outcome.
    pub fn ended_step(step: ToolStep) -> ToolOutcome {
        ended(vec![step])
    }
}
