//! The tool registry: the only place that maps a model-facing tool name to its transport (client
//! exec, interaction, or local) and to the family file that owns the tool (`tools/<family>.rs`:
//! arguments, requests, typed cards, error cards and model text). Adding a tool is one family item
//! plus a line in each table here. Also: which tools a request offers, and `ToolRun`, the per-call
//! state machine the loop drives.

pub mod edit;
pub mod interactive;
pub mod lints;
pub mod mcp;
pub mod read;
pub mod search;
pub mod shell;
pub mod task;
pub mod todo;
pub mod web;

use self::edit::{DeleteInput, StrReplaceInput, WriteInput};
use self::interactive::{AskQuestionInput, CreatePlanInput, SwitchModeInput};
use self::lints::ReadLintsInput;
use self::mcp::{FetchMcpResourceInput, ListMcpResourcesInput, McpInput};
use self::read::ReadInput;
use self::search::{GlobInput, GrepInput, LsInput};
use self::shell::ShellInput;
use self::task::TaskInput;
use self::todo::TodoWriteInput;
use self::web::{WebFetchInput, WebSearchInput};
use super::exec::ExecKind;
use super::exec::{ExecPayload, QueryPayload};
use super::proto::agent as pb;
use super::tool_result::{
    Stage, Tool, ToolEnv, ToolOutcome, ToolStep, aborted, argument_text, bare_card, failed,
};
use crate::model::conversation::{Mode, SubagentRole};
use crate::model::runtime_tag::BackgroundKind;
use crate::model::tool::{McpTool, ToolCall as ModelToolCall};

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
        self.card_without_args(None)
    }

    /// The card of a call to this tool whose arguments did not validate: the placeholder with the
    /// tool's error result.
    pub fn invalid_card(self, message: &str) -> pb::ToolCall {
        self.card_without_args(Some(message))
    }

    fn card_without_args(self, error: Option<&str>) -> pb::ToolCall {
        match self {
            ToolKind::Read => bare_card::<ReadInput>(error),
            ToolKind::Write => bare_card::<WriteInput>(error),
            ToolKind::StrReplace => bare_card::<StrReplaceInput>(error),
            ToolKind::Delete => bare_card::<DeleteInput>(error),
            ToolKind::Grep => bare_card::<GrepInput>(error),
            ToolKind::Glob => bare_card::<GlobInput>(error),
            ToolKind::Ls => bare_card::<LsInput>(error),
            ToolKind::ReadLints => bare_card::<ReadLintsInput>(error),
            ToolKind::Shell => bare_card::<ShellInput>(error),
            ToolKind::TodoWrite => bare_card::<TodoWriteInput>(error),
            ToolKind::AskQuestion => bare_card::<AskQuestionInput>(error),
            ToolKind::SwitchMode => bare_card::<SwitchModeInput>(error),
            ToolKind::CreatePlan => bare_card::<CreatePlanInput>(error),
            ToolKind::WebFetch => bare_card::<WebFetchInput>(error),
            ToolKind::WebSearch => bare_card::<WebSearchInput>(error),
            ToolKind::ListMcpResources => bare_card::<ListMcpResourcesInput>(error),
            ToolKind::FetchMcpResource => bare_card::<FetchMcpResourceInput>(error),
            ToolKind::Task => bare_card::<TaskInput>(error),
            ToolKind::Mcp => bare_card::<McpInput>(error),
        }
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

/// Runs `$body` with `$tool` bound to the call's typed input, whatever its tool: the one table from
/// a validated call to its family.
macro_rules! with_tool {
    ($input:expr, $tool:ident => $body:expr) => {
        match $input {
            ToolInput::Read($tool) => $body,
            ToolInput::Write($tool) => $body,
            ToolInput::StrReplace($tool) => $body,
            ToolInput::Delete($tool) => $body,
            ToolInput::Grep($tool) => $body,
            ToolInput::Glob($tool) => $body,
            ToolInput::Ls($tool) => $body,
            ToolInput::ReadLints($tool) => $body,
            ToolInput::Shell($tool) => $body,
            ToolInput::TodoWrite($tool) => $body,
            ToolInput::AskQuestion($tool) => $body,
            ToolInput::SwitchMode($tool) => $body,
            ToolInput::CreatePlan($tool) => $body,
            ToolInput::WebFetch($tool) => $body,
            ToolInput::WebSearch($tool) => $body,
            ToolInput::ListMcpResources($tool) => $body,
            ToolInput::FetchMcpResource($tool) => $body,
            ToolInput::Task($tool) => $body,
            ToolInput::Mcp($tool) => $body,
        }
    };
}

/// Parses and validates the model's argument text for `kind`. The message goes back to the model.
pub fn parse_input(kind: ToolKind, arguments: &str) -> Result<ToolInput, String> {
    let text = argument_text(arguments);
    Ok(match kind {
        ToolKind::Read => ToolInput::Read(ReadInput::parse(text)?),
        ToolKind::Write => ToolInput::Write(WriteInput::parse(text)?),
        ToolKind::StrReplace => ToolInput::StrReplace(StrReplaceInput::parse(text)?),
        ToolKind::Delete => ToolInput::Delete(DeleteInput::parse(text)?),
        ToolKind::Grep => ToolInput::Grep(GrepInput::parse(text)?),
        ToolKind::Glob => ToolInput::Glob(GlobInput::parse(text)?),
        ToolKind::Ls => ToolInput::Ls(LsInput::parse(text)?),
        ToolKind::ReadLints => ToolInput::ReadLints(ReadLintsInput::parse(text)?),
        ToolKind::Shell => ToolInput::Shell(ShellInput::parse(text)?),
        ToolKind::TodoWrite => ToolInput::TodoWrite(TodoWriteInput::parse(text)?),
        ToolKind::AskQuestion => ToolInput::AskQuestion(AskQuestionInput::parse(text)?),
        ToolKind::SwitchMode => ToolInput::SwitchMode(SwitchModeInput::parse(text)?),
        ToolKind::CreatePlan => ToolInput::CreatePlan(CreatePlanInput::parse(text)?),
        ToolKind::WebFetch => ToolInput::WebFetch(WebFetchInput::parse(text)?),
        ToolKind::WebSearch => ToolInput::WebSearch(WebSearchInput::parse(text)?),
        ToolKind::ListMcpResources => {
            ToolInput::ListMcpResources(ListMcpResourcesInput::parse(text)?)
        }
        ToolKind::FetchMcpResource => {
            ToolInput::FetchMcpResource(FetchMcpResourceInput::parse(text)?)
        }
        ToolKind::Task => ToolInput::Task(TaskInput::parse(text)?),
        ToolKind::Mcp => {
            return Err(
                "internal error: MCP calls are parsed with their tool (parse_mcp_input)".to_owned(),
            );
        }
    })
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
        offered.extend(options.mcp.iter().map(mcp::definition));
    }
    offered
}

impl ToolKind {
    /// The tool the model's `name` refers to: a fixed-name tool, or one of the request's MCP tools.
    pub fn of(name: &str, env: &ToolEnv) -> Option<ToolKind> {
        ToolKind::from_name(name).or_else(|| {
            env.mcp
                .iter()
                .any(|t| t.model_name == name)
                .then_some(ToolKind::Mcp)
        })
    }
}

/// The card with typed args and no result yet (`tool_call_started`).
fn started<T: Tool>(args: &T, call_id: &str) -> pb::ToolCall {
    T::card(Some(args), call_id, None)
}

/// The state of one tool call between start and outcome.
#[derive(Debug)]
pub struct ToolRun {
    kind: ToolKind,
    call_id: String,
    input: ToolInput,
    stage: Stage,
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
        let Some(kind) = ToolKind::of(&call.name, env) else {
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
            Some(tool) if kind == ToolKind::Mcp => {
                mcp::parse_mcp_input(tool, &call.arguments).map(ToolInput::Mcp)
            }
            _ => parse_input(kind, &call.arguments),
        };
        let input = parsed.map_err(|message| Rejected {
            card: Some(Box::new(kind.invalid_card(&message))),
            model_text: format!("Error: {message}"),
        })?;
        let run = ToolRun {
            kind,
            call_id: call.call_id.clone(),
            input,
            stage: Stage::default(),
        };
        let started = with_tool!(&run.input, tool => started(tool, &run.call_id));
        let step = with_tool!(&run.input, tool => tool.start(&run.call_id, env));
        Ok((run, started, step))
    }

    pub fn kind(&self) -> ToolKind {
        self.kind
    }

    /// Routes one exec result (already matched to this call by exec id and kind).
    pub fn on_result(&mut self, payload: ExecPayload, env: &ToolEnv) -> Vec<ToolStep> {
        let stage = &mut self.stage;
        with_tool!(&self.input, tool => tool.on_result(&self.call_id, *payload.0, stage, env))
    }

    /// The user's response to this call's interaction query (matched by id and kind): the outcome,
    /// or the exec an approval leads to.
    pub fn on_response(&mut self, payload: QueryPayload, env: &ToolEnv) -> ToolStep {
        with_tool!(&self.input, tool => tool.on_response(&self.call_id, *payload.0, env))
    }

    /// The search backend's answer to this call's `ToolStep::Search`.
    pub fn on_search(
        &mut self,
        hits: Result<Vec<crate::provider::web_search::SearchHit>, String>,
        env: &ToolEnv,
    ) -> ToolOutcome {
        match &self.input {
            ToolInput::WebSearch(search) => web::search_outcome(search, &self.call_id, hits, env),
            other => with_tool!(other, tool => failed(
                tool,
                &self.call_id,
                "internal error: search results for another tool",
            )),
        }
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
        let message = format!("the client failed to execute the tool: {error}");
        with_tool!(&self.input, tool => failed(tool, &self.call_id, &message))
    }

    /// The client answered with a `got` where the request asks for an `expected`: a failed
    /// result the model can act on (whether the call had an effect is unknown).
    pub fn on_wrong_result(&mut self, expected: ExecKind, got: ExecKind) -> ToolOutcome {
        let message = format!(
            "the client answered this call with a {got} where a {expected} was expected, so its result could not be read; the call may or may not have taken effect: check before trying again"
        );
        with_tool!(&self.input, tool => failed(tool, &self.call_id, &message))
    }

    /// The user moved this call to the background (a running Shell, or a Task's subagent): its
    /// backgrounded outcome, or `None` when the call is not of that kind.
    pub fn moved_to_background(
        &mut self,
        kind: BackgroundKind,
        env: &ToolEnv,
    ) -> Option<ToolOutcome> {
        match (&self.input, kind) {
            (ToolInput::Shell(shell), BackgroundKind::Shell) => Some(shell::moved_by_user(
                shell,
                &self.call_id,
                &mut self.stage,
                env,
            )),
            (ToolInput::Task(task), BackgroundKind::Subagent) => {
                Some(task::moved_by_user(task, &self.call_id))
            }
            _ => None,
        }
    }

    /// `stream_close` before a terminal result: the exec ended without one.
    pub fn on_closed_without_result(&mut self, env: &ToolEnv) -> ToolOutcome {
        let stage = &mut self.stage;
        with_tool!(&self.input, tool => tool.on_closed(&self.call_id, stage, env))
    }

    /// The run is ending (error, cancel) while this call is still running.
    pub fn abandon(&self, reason: &str) -> ToolOutcome {
        let stage = &self.stage;
        with_tool!(&self.input, tool => aborted(tool, &self.call_id, stage, reason))
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
