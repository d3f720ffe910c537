//! The tool registry: the only place that maps a model-facing tool name to its transport (client exec
//! or local), its Cursor card (`ToolCall` oneof), its argument validation and its execution steps.
//!
//! A `ToolRun` is the per-call state machine. The loop feeds it exec results by id and gets back
//! `ToolStep`s (send this exec, show this delta, done with this outcome); it never sees a oneof.

use serde::Deserialize;

use super::exec::{self, ExecPayload, ExecRequest, QueryPayload, QueryRequest};
use super::proto::agent::{self as pb, tool_call};
use super::tool_result::{self, ToolOutcome};
use crate::model::conversation::{Mode, SubagentRole};
use crate::model::tool::ToolCall as ModelToolCall;
use crate::prompting::derived_state::{Todo, TodoStatus};

/// Every tool the model can be offered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ToolKind {
    Read,
    Write,
    StrReplace,
    Delete,
    Grep,
    Glob,
    Ls,
    ReadLints,
    Shell,
    TodoWrite,
    AskQuestion,
    SwitchMode,
    CreatePlan,
    WebFetch,
    WebSearch,
    ListMcpResources,
    FetchMcpResource,
    Task,
    /// One of the user's MCP tools; its model-facing name comes from the request (`McpTool`).
    Mcp,
}

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

impl ToolKind {
    /// The tools with a fixed model-facing name (MCP tools are named by the request).
    pub const ALL: [ToolKind; 18] = [
        ToolKind::Read,
        ToolKind::Write,
        ToolKind::StrReplace,
        ToolKind::Delete,
        ToolKind::Grep,
        ToolKind::Glob,
        ToolKind::Ls,
        ToolKind::ReadLints,
        ToolKind::Shell,
        ToolKind::TodoWrite,
        ToolKind::AskQuestion,
        ToolKind::SwitchMode,
        ToolKind::CreatePlan,
        ToolKind::WebFetch,
        ToolKind::WebSearch,
        ToolKind::ListMcpResources,
        ToolKind::FetchMcpResource,
        ToolKind::Task,
    ];

    pub fn name(self) -> &'static str {
        match self {
            ToolKind::Read => "Read",
            ToolKind::Write => "Write",
            ToolKind::StrReplace => "StrReplace",
            ToolKind::Delete => "Delete",
            ToolKind::Grep => "Grep",
            ToolKind::Glob => "Glob",
            ToolKind::Ls => "LS",
            ToolKind::ReadLints => "ReadLints",
            ToolKind::Shell => "Shell",
            ToolKind::TodoWrite => "TodoWrite",
            ToolKind::AskQuestion => "AskQuestion",
            ToolKind::SwitchMode => "SwitchMode",
            ToolKind::CreatePlan => "CreatePlan",
            ToolKind::WebFetch => "WebFetch",
            ToolKind::WebSearch => "WebSearch",
            ToolKind::ListMcpResources => "ListMcpResources",
            ToolKind::FetchMcpResource => "FetchMcpResource",
            ToolKind::Task => "Task",
            // Never matched by `from_name`: each MCP tool has its own name.
            ToolKind::Mcp => "mcp",
        }
    }

    /// The fixed-name tool called `name` (MCP tools are resolved by `ToolEnv::kind_of`).
    pub fn from_name(name: &str) -> Option<ToolKind> {
        ToolKind::ALL.into_iter().find(|kind| kind.name() == name)
    }

    pub fn transport(self) -> Transport {
        match self {
            ToolKind::TodoWrite => Transport::Local,
            // WebFetch asks first; once approved the same call becomes a `fetch_args` exec.
            // WebSearch asks first; once approved the server's search backend runs it.
            ToolKind::AskQuestion
            | ToolKind::SwitchMode
            | ToolKind::CreatePlan
            | ToolKind::WebFetch
            | ToolKind::WebSearch => Transport::Interaction,
            _ => Transport::Exec,
        }
    }

    /// The card Cursor draws while the model is still writing the arguments.
    pub fn placeholder(self) -> pb::ToolCall {
        let tool = match self {
            ToolKind::Read => tool_call::Tool::ReadToolCall(pb::ReadToolCall::default()),
            ToolKind::Write | ToolKind::StrReplace => {
                tool_call::Tool::EditToolCall(pb::EditToolCall::default())
            }
            ToolKind::Delete => tool_call::Tool::DeleteToolCall(pb::DeleteToolCall::default()),
            ToolKind::Grep => tool_call::Tool::GrepToolCall(pb::GrepToolCall::default()),
            ToolKind::Glob => tool_call::Tool::GlobToolCall(pb::GlobToolCall::default()),
            ToolKind::Ls => tool_call::Tool::LsToolCall(pb::LsToolCall::default()),
            ToolKind::ReadLints => {
                tool_call::Tool::ReadLintsToolCall(pb::ReadLintsToolCall::default())
            }
            ToolKind::Shell => tool_call::Tool::ShellToolCall(pb::ShellToolCall::default()),
            ToolKind::TodoWrite => {
                tool_call::Tool::UpdateTodosToolCall(pb::UpdateTodosToolCall::default())
            }
            ToolKind::AskQuestion => {
                tool_call::Tool::AskQuestionToolCall(pb::AskQuestionToolCall::default())
            }
            ToolKind::SwitchMode => {
                tool_call::Tool::SwitchModeToolCall(pb::SwitchModeToolCall::default())
            }
            ToolKind::CreatePlan => {
                tool_call::Tool::CreatePlanToolCall(pb::CreatePlanToolCall::default())
            }
            ToolKind::WebFetch => {
                tool_call::Tool::WebFetchToolCall(pb::WebFetchToolCall::default())
            }
            ToolKind::WebSearch => {
                tool_call::Tool::WebSearchToolCall(pb::WebSearchToolCall::default())
            }
            ToolKind::ListMcpResources => {
                tool_call::Tool::ListMcpResourcesToolCall(pb::ListMcpResourcesToolCall::default())
            }
            ToolKind::FetchMcpResource => {
                tool_call::Tool::ReadMcpResourceToolCall(pb::ReadMcpResourceToolCall::default())
            }
            ToolKind::Mcp => tool_call::Tool::McpToolCall(pb::McpToolCall::default()),
            ToolKind::Task => tool_call::Tool::TaskToolCall(pb::TaskToolCall::default()),
        };
        pb::ToolCall { tool: Some(tool) }
    }

    /// The arguments `parse_input` accepts for this tool, as (name, required). A mode's tool
    /// description must list exactly these (checked when the prompt assets load).
    pub fn arguments(self) -> &'static [(&'static str, bool)] {
        match self {
            ToolKind::Read => &[("path", true), ("offset", false), ("limit", false)],
            ToolKind::Write => &[("path", true), ("contents", true)],
            ToolKind::StrReplace => &[
                ("path", true),
                ("old_string", true),
                ("new_string", true),
                ("replace_all", false),
            ],
            ToolKind::Delete => &[("path", true)],
            ToolKind::Grep => &[
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
            ],
            ToolKind::Glob => &[("glob_pattern", true), ("target_directory", false)],
            ToolKind::Ls => &[("path", true), ("ignore", false)],
            ToolKind::ReadLints => &[("paths", true)],
            ToolKind::Shell => &[
                ("command", true),
                ("working_directory", false),
                ("block_until_ms", false),
                ("description", false),
            ],
            ToolKind::TodoWrite => &[("todos", true), ("merge", true)],
            ToolKind::AskQuestion => &[("title", false), ("questions", true)],
            ToolKind::SwitchMode => &[("target_mode_id", true), ("explanation", false)],
            ToolKind::CreatePlan => &[
                ("name", true),
                ("overview", true),
                ("plan", true),
                ("todos", false),
            ],
            ToolKind::WebFetch => &[("url", true)],
            ToolKind::WebSearch => &[("search_term", true)],
            ToolKind::ListMcpResources => &[("server", false)],
            ToolKind::FetchMcpResource => &[("server", true), ("uri", true)],
            ToolKind::Task => &[
                ("description", true),
                ("prompt", true),
                ("subagent_type", false),
                ("model", false),
                ("readonly", false),
                ("resume", false),
                ("run_in_background", false),
                ("attachments", false),
            ],
            // Whatever the MCP server's own schema says; checked against its `required`.
            ToolKind::Mcp => &[],
        }
    }

    /// The argument whose value streams into the card as file content while the model writes it.
    pub fn streamed_content_field(self) -> Option<&'static str> {
        match self {
            ToolKind::Write => Some("contents"),
            _ => None,
        }
    }
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

// ---- validated inputs (exactly what tools.json promises) -------------------------------------

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct ReadInput {
    pub path: String,
    pub offset: Option<i32>,
    pub limit: Option<u32>,
}

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

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct ReadLintsInput {
    pub paths: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct ShellInput {
    pub command: String,
    pub working_directory: Option<String>,
    pub block_until_ms: Option<u32>,
    pub description: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct TodoInput {
    pub id: String,
    pub content: Option<String>,
    pub status: TodoStatus,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct TodoWriteInput {
    pub todos: Vec<TodoInput>,
    pub merge: bool,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct QuestionOption {
    pub id: String,
    pub label: String,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Question {
    pub id: String,
    pub prompt: String,
    #[serde(default)]
    pub options: Vec<QuestionOption>,
    #[serde(default)]
    pub allow_multiple: bool,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct AskQuestionInput {
    #[serde(default)]
    pub title: String,
    pub questions: Vec<Question>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct SwitchModeInput {
    pub target_mode_id: String,
    pub explanation: Option<String>,
    /// Validated: the mode the id names.
    #[serde(skip)]
    pub target: Mode,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct PlanTodo {
    pub id: String,
    pub content: String,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct CreatePlanInput {
    pub name: String,
    pub overview: String,
    pub plan: String,
    #[serde(default)]
    pub todos: Vec<PlanTodo>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct WebFetchInput {
    pub url: String,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct WebSearchInput {
    pub search_term: String,
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

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct TaskInput {
    pub description: String,
    pub prompt: String,
    pub subagent_type: Option<String>,
    pub model: Option<String>,
    #[serde(default)]
    pub readonly: bool,
    pub resume: Option<String>,
    #[serde(default)]
    pub run_in_background: bool,
    #[serde(default)]
    pub attachments: Vec<String>,
}

impl TaskInput {
    /// The subagent type the client is asked to start (`generalPurpose` when the model names none).
    pub fn subagent_type(&self) -> &str {
        self.subagent_type
            .as_deref()
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .unwrap_or("generalPurpose")
    }
}

/// One of the user's MCP tools as the model is offered it.
#[derive(Debug, Clone, PartialEq)]
pub struct McpTool {
    /// The model-facing name: `mcp_<server>_<tool>`, sanitized to what every provider accepts
    /// (`[A-Za-z0-9_-]`, at most 64 characters) and unique within the request.
    pub model_name: String,
    /// Cursor's name for the tool (`McpToolDefinition.name`), echoed in `mcp_args.name`.
    pub name: String,
    /// The server (`provider_identifier`).
    pub server: String,
    /// The tool's name on its server.
    pub tool_name: String,
    pub description: String,
    /// The tool's JSON schema, passed through to the model unchanged.
    pub input_schema: serde_json::Value,
}

impl McpTool {
    /// The OpenAI-style function definition offered to the model.
    fn definition(&self) -> serde_json::Value {
        let parameters = if self.input_schema.is_object() {
            self.input_schema.clone()
        } else {
            serde_json::json!({"type": "object", "properties": {}})
        };
        serde_json::json!({
            "type": "function",
            "function": {
                "name": self.model_name,
                "description": format!("{} (MCP tool `{}` of server `{}`)", self.description.trim(), self.tool_name, self.server),
                "parameters": parameters,
            }
        })
    }
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

/// An MCP call: the tool it names and the model's arguments (a JSON object).
#[derive(Debug, Clone, PartialEq)]
pub struct McpInput {
    pub tool: McpTool,
    pub args: serde_json::Map<String, serde_json::Value>,
}

/// A tool call with validated arguments.
#[derive(Debug, Clone, PartialEq)]
pub enum ToolInput {
    Read(ReadInput),
    Write(WriteInput),
    StrReplace(StrReplaceInput),
    Delete(DeleteInput),
    Grep(GrepInput),
    Glob(GlobInput),
    Ls(LsInput),
    ReadLints(ReadLintsInput),
    Shell(ShellInput),
    TodoWrite(TodoWriteInput),
    AskQuestion(AskQuestionInput),
    SwitchMode(SwitchModeInput),
    CreatePlan(CreatePlanInput),
    WebFetch(WebFetchInput),
    WebSearch(WebSearchInput),
    ListMcpResources(ListMcpResourcesInput),
    FetchMcpResource(FetchMcpResourceInput),
    Task(TaskInput),
    Mcp(McpInput),
}

/// Parses and validates the model's argument text for `kind`. The message goes back to the model.
pub fn parse_input(kind: ToolKind, arguments: &str) -> Result<ToolInput, String> {
    let text = if arguments.trim().is_empty() {
        "{}"
    } else {
        arguments
    };
    fn de<T: serde::de::DeserializeOwned>(kind: ToolKind, text: &str) -> Result<T, String> {
        serde_json::from_str(text)
            .map_err(|e| format!("invalid arguments for {}: {e}", kind.name()))
    }
    let non_empty = |field: &str, value: &str| {
        if value.trim().is_empty() {
            Err(format!(
                "invalid arguments for {}: `{field}` must not be empty",
                kind.name()
            ))
        } else {
            Ok(())
        }
    };
    Ok(match kind {
        ToolKind::Read => {
            let input: ReadInput = de(kind, text)?;
            non_empty("path", &input.path)?;
            if input.limit == Some(0) {
                return Err("invalid arguments for Read: `limit` must be at least 1".to_owned());
            }
            ToolInput::Read(input)
        }
        ToolKind::Write => {
            let input: WriteInput = de(kind, text)?;
            non_empty("path", &input.path)?;
            ToolInput::Write(input)
        }
        ToolKind::StrReplace => {
            let input: StrReplaceInput = de(kind, text)?;
            non_empty("path", &input.path)?;
            if input.old_string.is_empty() {
                return Err("invalid arguments for StrReplace: `old_string` must not be empty (use Write to create a file)".to_owned());
            }
            if input.old_string == input.new_string {
                return Err(
                    "invalid arguments for StrReplace: `new_string` is identical to `old_string`"
                        .to_owned(),
                );
            }
            ToolInput::StrReplace(input)
        }
        ToolKind::Delete => {
            let input: DeleteInput = de(kind, text)?;
            non_empty("path", &input.path)?;
            ToolInput::Delete(input)
        }
        ToolKind::Grep => {
            let input: GrepInput = de(kind, text)?;
            non_empty("pattern", &input.pattern)?;
            ToolInput::Grep(input)
        }
        ToolKind::Glob => {
            let input: GlobInput = de(kind, text)?;
            non_empty("glob_pattern", &input.glob_pattern)?;
            ToolInput::Glob(input)
        }
        ToolKind::Ls => {
            let input: LsInput = de(kind, text)?;
            non_empty("path", &input.path)?;
            ToolInput::Ls(input)
        }
        ToolKind::ReadLints => {
            let input: ReadLintsInput = de(kind, text)?;
            if input.paths.is_empty() || input.paths.iter().any(|p| p.trim().is_empty()) {
                return Err("invalid arguments for ReadLints: `paths` must list at least one non-empty path".to_owned());
            }
            ToolInput::ReadLints(input)
        }
        ToolKind::Shell => {
            let input: ShellInput = de(kind, text)?;
            non_empty("command", &input.command)?;
            ToolInput::Shell(input)
        }
        ToolKind::TodoWrite => {
            let input: TodoWriteInput = de(kind, text)?;
            if let Some(todo) = input.todos.iter().find(|t| t.id.trim().is_empty()) {
                return Err(format!(
                    "invalid arguments for TodoWrite: a todo has an empty id ({todo:?})"
                ));
            }
            if !input.merge
                && let Some(todo) = input
                    .todos
                    .iter()
                    .find(|t| t.content.as_deref().is_none_or(|c| c.trim().is_empty()))
            {
                return Err(format!(
                    "invalid arguments for TodoWrite: todo {:?} needs `content` when merge is false",
                    todo.id
                ));
            }
            ToolInput::TodoWrite(input)
        }
        ToolKind::AskQuestion => {
            let input: AskQuestionInput = de(kind, text)?;
            if input.questions.is_empty() {
                return Err(
                    "invalid arguments for AskQuestion: `questions` must not be empty".to_owned(),
                );
            }
            for question in &input.questions {
                non_empty("questions[].id", &question.id)?;
                non_empty("questions[].prompt", &question.prompt)?;
                if question.options.iter().any(|o| o.id.trim().is_empty()) {
                    return Err(format!(
                        "invalid arguments for AskQuestion: question {:?} has an option without an id",
                        question.id
                    ));
                }
            }
            ToolInput::AskQuestion(input)
        }
        ToolKind::SwitchMode => {
            let mut input: SwitchModeInput = de(kind, text)?;
            input.target = Mode::parse(input.target_mode_id.trim()).ok_or_else(|| {
                format!(
                    "invalid arguments for SwitchMode: unknown mode {:?} (modes: {})",
                    input.target_mode_id,
                    Mode::ALL.map(Mode::as_str).join(", ")
                )
            })?;
            ToolInput::SwitchMode(input)
        }
        ToolKind::CreatePlan => {
            let input: CreatePlanInput = de(kind, text)?;
            non_empty("name", &input.name)?;
            non_empty("plan", &input.plan)?;
            if let Some(todo) = input.todos.iter().find(|t| t.id.trim().is_empty()) {
                return Err(format!(
                    "invalid arguments for CreatePlan: a todo has an empty id ({todo:?})"
                ));
            }
            ToolInput::CreatePlan(input)
        }
        ToolKind::WebFetch => {
            let mut input: WebFetchInput = de(kind, text)?;
            input.url = input.url.trim().to_owned();
            let url = url::Url::parse(&input.url).map_err(|e| {
                format!("invalid arguments for WebFetch: `url` {:?}: {e}", input.url)
            })?;
            if !matches!(url.scheme(), "http" | "https") {
                return Err(format!(
                    "invalid arguments for WebFetch: only http and https URLs can be fetched, not {:?}",
                    url.scheme()
                ));
            }
            ToolInput::WebFetch(input)
        }
        ToolKind::WebSearch => {
            let input: WebSearchInput = de(kind, text)?;
            non_empty("search_term", &input.search_term)?;
            ToolInput::WebSearch(input)
        }
        ToolKind::ListMcpResources => ToolInput::ListMcpResources(de(kind, text)?),
        ToolKind::FetchMcpResource => {
            let input: FetchMcpResourceInput = de(kind, text)?;
            non_empty("server", &input.server)?;
            non_empty("uri", &input.uri)?;
            ToolInput::FetchMcpResource(input)
        }
        ToolKind::Task => {
            let input: TaskInput = de(kind, text)?;
            non_empty("description", &input.description)?;
            non_empty("prompt", &input.prompt)?;
            ToolInput::Task(input)
        }
        ToolKind::Mcp => {
            return Err(
                "internal error: MCP calls are parsed with their tool (parse_mcp_input)".to_owned(),
            );
        }
    })
}

/// Parses an MCP call's arguments: a JSON object holding every property the tool's schema requires.
pub fn parse_mcp_input(tool: &McpTool, arguments: &str) -> Result<ToolInput, String> {
    let text = if arguments.trim().is_empty() {
        "{}"
    } else {
        arguments
    };
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
    Ok(ToolInput::Mcp(McpInput {
        tool: tool.clone(),
        args,
    }))
}

/// What this request makes available beyond a mode's own tool list: the client's switches and the
/// user's MCP tools.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ToolOptions {
    /// `request_context.web_fetch_enabled` (absent = enabled; every fetch is still approved by
    /// the user before it happens).
    pub web_fetch: bool,
    /// `request_context.web_search_enabled` (absent = enabled) — and the server has a search
    /// backend (`Config::web_search`), which the run checks.
    pub web_search: bool,
    /// The user's MCP tools (`run_request.mcp_tools`).
    pub mcp: Vec<McpTool>,
    /// MCP servers the client reported (tools or instructions): resources can be listed and read.
    pub mcp_servers: Vec<String>,
    /// When set, only these tools are offered (an explore subagent, a custom subagent's list).
    pub only: Option<Vec<String>>,
}

impl ToolOptions {
    /// What a request without a request context (a resume) allows.
    pub fn without_context(mcp: Vec<McpTool>) -> Self {
        let mut options = ToolOptions {
            web_fetch: true,
            web_search: true,
            mcp,
            mcp_servers: Vec::new(),
            only: None,
        };
        options.add_servers(std::iter::empty());
        options
    }

    /// Records MCP servers: those of the tools plus `more`, each once, in order.
    pub fn add_servers(&mut self, more: impl IntoIterator<Item = String>) {
        let from_tools: Vec<String> = self.mcp.iter().map(|t| t.server.clone()).collect();
        for server in from_tools.into_iter().chain(more) {
            if !server.is_empty() && !self.mcp_servers.contains(&server) {
                self.mcp_servers.push(server);
            }
        }
    }

    /// Restricts the tools to what a subagent of `role` may use.
    pub fn restrict_to(&mut self, role: &SubagentRole) {
        if role.is_explore() {
            self.only = Some(
                [ToolKind::Glob, ToolKind::Grep, ToolKind::Read, ToolKind::Ls]
                    .map(|k| k.name().to_owned())
                    .to_vec(),
            );
        } else if !role.custom_tools.is_empty() {
            self.only = Some(role.custom_tools.clone());
        }
    }

    fn allows(&self, kind: ToolKind) -> bool {
        if let Some(only) = &self.only
            && !only.iter().any(|name| name == kind.name())
        {
            return false;
        }
        match kind {
            ToolKind::WebFetch => self.web_fetch,
            ToolKind::WebSearch => self.web_search,
            ToolKind::ListMcpResources | ToolKind::FetchMcpResource => !self.mcp_servers.is_empty(),
            _ => true,
        }
    }
}

/// The tool definitions offered to the model: the mode's `tools.json` minus the tools this request
/// does not allow, then the user's MCP tools when the mode can call them (a mode that may list MCP
/// resources may call MCP tools). Computed once per mode, not per provider call.
pub fn offered_tools(
    mode_tools: &[serde_json::Value],
    options: &ToolOptions,
) -> Vec<serde_json::Value> {
    let name_of = |tool: &serde_json::Value| {
        tool["function"]["name"]
            .as_str()
            .and_then(ToolKind::from_name)
    };
    let mode_has_mcp = mode_tools
        .iter()
        .any(|t| name_of(t) == Some(ToolKind::ListMcpResources));
    let mut offered: Vec<serde_json::Value> = mode_tools
        .iter()
        .filter(|tool| name_of(tool).is_none_or(|kind| options.allows(kind)))
        .cloned()
        .collect();
    if mode_has_mcp && options.only.is_none() {
        offered.extend(options.mcp.iter().map(McpTool::definition));
    }
    offered
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

impl ToolEnv {
    /// The tool the model's `name` refers to: a fixed-name tool, or one of the request's MCP tools.
    pub fn kind_of(&self, name: &str) -> Option<ToolKind> {
        ToolKind::from_name(name).or_else(|| {
            self.mcp
                .iter()
                .any(|t| t.model_name == name)
                .then_some(ToolKind::Mcp)
        })
    }
}

/// The state of one tool call between start and outcome.
#[derive(Debug)]
pub struct ToolRun {
    kind: ToolKind,
    call_id: String,
    input: ToolInput,
    stage: tool_result::Stage,
}

/// The model's call could not even start (unknown tool, bad arguments): its terminal result.
#[derive(Debug)]
pub struct Rejected {
    /// Card to complete, if the tool is known (its placeholder was shown).
    pub card: Option<Box<pb::ToolCall>>,
    pub model_text: String,
}

impl ToolRun {
    /// Validates the call and returns its typed started card and first step.
    pub fn start(
        call: &ModelToolCall,
        env: &ToolEnv,
    ) -> Result<(ToolRun, pb::ToolCall, ToolStep), Rejected> {
        let Some(kind) = env.kind_of(&call.name) else {
            let known: Vec<&str> = ToolKind::ALL.iter().map(|k| k.name()).collect();
            return Err(Rejected {
                card: None,
                model_text: format!(
                    "Error: there is no tool named {:?}. Available tools: {}.",
                    call.name,
                    known.join(", ")
                ),
            });
        };
        let parsed = match env.mcp.iter().find(|t| t.model_name == call.name) {
            Some(tool) if kind == ToolKind::Mcp => parse_mcp_input(tool, &call.arguments),
            _ => parse_input(kind, &call.arguments),
        };
        let input = match parsed {
            Ok(input) => input,
            Err(message) => {
                return Err(Rejected {
                    card: Some(Box::new(tool_result::invalid_card(kind, &message))),
                    model_text: format!("Error: {message}"),
                });
            }
        };
        let mut run = ToolRun {
            kind,
            call_id: call.call_id.clone(),
            input,
            stage: tool_result::Stage::default(),
        };
        let started = tool_result::args_card(&run.input, &run.call_id);
        let step = run.first_step(env);
        Ok((run, started, step))
    }

    pub fn kind(&self) -> ToolKind {
        self.kind
    }

    fn first_step(&mut self, env: &ToolEnv) -> ToolStep {
        if let ToolInput::TodoWrite(input) = &self.input {
            return ToolStep::Done(tool_result::todo_write(input, &env.todos));
        }
        if let Some(query) = tool_result::query(&self.input, &self.call_id) {
            return ToolStep::Query(query);
        }
        match exec::first_request(&self.input, &self.call_id, env) {
            Some(request) => ToolStep::Exec(request),
            None => ToolStep::Done(tool_result::failed(
                &self.input,
                &self.call_id,
                "internal error: this tool has no client execution",
            )),
        }
    }

    /// Routes one exec result (already matched to this call by exec id and kind).
    pub fn on_result(&mut self, payload: ExecPayload, env: &ToolEnv) -> Vec<ToolStep> {
        tool_result::on_result(&self.input, &self.call_id, &mut self.stage, payload, env)
    }

    /// The user's response to this call's interaction query (matched by id and kind): the outcome,
    /// or the exec an approval leads to.
    pub fn on_response(&mut self, payload: QueryPayload, env: &ToolEnv) -> ToolStep {
        tool_result::on_response(&self.input, &self.call_id, payload, env)
    }

    /// The search backend's answer to this call's `ToolStep::Search`.
    pub fn on_search(
        &mut self,
        hits: Result<Vec<crate::provider::web_search::SearchHit>, String>,
        env: &ToolEnv,
    ) -> ToolOutcome {
        tool_result::search_outcome(&self.input, &self.call_id, hits, env)
    }

    /// The mode this call moved the conversation to, if it is a SwitchMode the user approved.
    pub fn switched_mode(&self, outcome: &ToolOutcome) -> Option<Mode> {
        match &self.input {
            ToolInput::SwitchMode(switch) if !outcome.is_error => Some(switch.target),
            _ => None,
        }
    }

    /// The client threw while executing: a failed result the model sees.
    pub fn on_throw(&mut self, error: &str) -> ToolOutcome {
        tool_result::failed(
            &self.input,
            &self.call_id,
            &format!("the client failed to execute the tool: {error}"),
        )
    }

    /// `stream_close` before a terminal result: the exec ended without one.
    pub fn on_closed_without_result(&mut self, env: &ToolEnv) -> ToolOutcome {
        tool_result::closed_without_result(&self.input, &self.call_id, &mut self.stage, env)
    }

    /// The run is ending (error, cancel) while this call is still running.
    pub fn abandon(&self, reason: &str) -> ToolOutcome {
        tool_result::failed(&self.input, &self.call_id, reason)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_registered_tool_is_offered_in_some_mode() {
        let assets = crate::prompting::assets::PromptAssets::embedded().expect("assets");
        let names: Vec<&str> = Mode::ALL
            .iter()
            .flat_map(|mode| assets.mode(*mode).tools.iter())
            .map(|t| t["function"]["name"].as_str().expect("name"))
            .collect();
        for kind in ToolKind::ALL {
            assert!(
                names.contains(&kind.name()),
                "{} is registered but not offered",
                kind.name()
            );
        }
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

    #[test]
    fn wrong_argument_types_are_validation_errors() {
        let float =
            parse_input(ToolKind::Shell, r#"{"command":"ls","block_until_ms":1.5}"#).unwrap_err();
        assert!(
            float.contains("block_until_ms") || float.contains("floating"),
            "{float}"
        );
        let string = parse_input(
            ToolKind::Shell,
            r#"{"command":"ls","block_until_ms":"100"}"#,
        )
        .unwrap_err();
        assert!(string.contains("invalid type"), "{string}");
        let missing = parse_input(ToolKind::Read, "{}").unwrap_err();
        assert!(missing.contains("missing field `path`"), "{missing}");
        let not_json = parse_input(ToolKind::Read, "{\"path\": ").unwrap_err();
        assert!(
            not_json.starts_with("invalid arguments for Read"),
            "{not_json}"
        );
        assert!(parse_input(ToolKind::Grep, r#"{"pattern":"x","output_mode":"lines"}"#).is_err());
        assert!(matches!(
            parse_input(ToolKind::Grep, r#"{"pattern":"x","-C":2,"-i":true}"#),
            Ok(ToolInput::Grep(GrepInput {
                context: Some(2),
                case_insensitive: Some(true),
                ..
            }))
        ));
    }
}
