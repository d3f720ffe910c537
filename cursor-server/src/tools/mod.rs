//! The tool registry: one line per tool naming its `Tool` impl, from which every per-tool table
//! follows (kind, name, transport, arguments, placeholder, typed input, parsing, dispatch). The
//! impl, in the family file (`tools/<family>.rs`), declares the rest: name, transport, arguments,
//! requests, typed cards, error cards and model text. Adding a tool is its impl plus its line here.
//! Also: which tools a request offers, and `ToolRun`, the per-call state machine the loop drives.

pub mod edit;
pub mod exec;
pub mod interactive;
pub mod lints;
pub mod mcp;
pub mod pending;
pub mod read;
pub mod search;
pub mod shell;
pub mod task;
pub mod todo;
pub mod tool_result;
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
use crate::cursor::proto::agent as pb;
use crate::model::conversation::{Mode, SubagentRole};
use crate::model::runtime_tag::BackgroundKind;
use crate::model::tool::{McpTool, ToolCall as ModelToolCall};
use crate::tools::exec::ExecKind;
use crate::tools::exec::{ExecPayload, QueryPayload};
pub use crate::tools::tool_result::Transport;
use crate::tools::tool_result::{
    Stage, Tool, ToolEnv, ToolOutcome, ToolStep, aborted, argument_text, bare_card, failed,
};
use std::sync::Arc;

/// Derives every per-tool table from the registry's one line per tool (`Kind(Input)`, `Input`
/// implementing `Tool`): `ToolKind`, `ToolKind::ALL`, the name, transport, arguments and
/// placeholder of a kind, `ToolInput`, `parse_input`, and `with_tool!`, the dispatch from a
/// validated call to its family. `$d` is `$`, so the macro can define `with_tool!`.
macro_rules! registry {
    ($d:tt $($kind:ident($input:ty),)* ; $(#[$mcp_doc:meta])* $mcp:ident($mcp_input:ty)) => {
        /// Every tool the model can be offered.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum ToolKind {
            $($kind,)*
            $(#[$mcp_doc])*
            $mcp,
        }

        /// A tool call with validated arguments.
        #[derive(Debug, Clone, PartialEq)]
        pub enum ToolInput {
            $($kind($input),)*
            $mcp($mcp_input),
        }

        /// Evaluates `$body` with `$T` naming the `Tool` type of `$kind_value`.
        macro_rules! per_kind {
            ($d kind_value:expr, $d t:ident => $d body:expr) => {
                match $d kind_value {
                    $(ToolKind::$kind => {
                        type $d t = $input;
                        $d body
                    })*
                    ToolKind::$mcp => {
                        type $d t = $mcp_input;
                        $d body
                    }
                }
            };
        }

        /// Runs `$body` with `$tool` bound to the call's typed input, whatever its tool.
        macro_rules! with_tool {
            ($d input:expr, $d tool:ident => $d body:expr) => {
                match $d input {
                    $(ToolInput::$kind($d tool) => $d body,)*
                    ToolInput::$mcp($d tool) => $d body,
                }
            };
        }

        impl ToolKind {
            /// The tools with a fixed model-facing name (MCP tools are named by the request).
            pub const ALL: [ToolKind; [$(ToolKind::$kind),*].len()] = [$(ToolKind::$kind),*];
        }

        /// Parses and validates the model's argument text for `kind`. The message goes back to
        /// the model.
        pub fn parse_input(kind: ToolKind, arguments: &str) -> Result<ToolInput, String> {
            let text = argument_text(arguments);
            match kind {
                $(ToolKind::$kind => <$input as Tool>::parse(text).map(ToolInput::$kind),)*
                ToolKind::$mcp => <$mcp_input as Tool>::parse(text).map(ToolInput::$mcp),
            }
        }
    };
}

// The registry: one line per tool. Adding a tool is its `Tool` impl in a family file and its line
// here (and its description in the modes' `tools.json`, which the prompt assets check against
// `Tool::ARGUMENTS`). The order is the order of the unknown-tool message's list.
registry! {$
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
    ;
    /// One of the user's MCP tools; its model-facing name comes from the request (`McpTool`).
    Mcp(McpInput)
}

impl ToolKind {
    /// The model-facing name (`Tool::NAME`).
    pub fn name(self) -> &'static str {
        per_kind!(self, T => T::NAME)
    }

    /// The fixed-name tool called `name` (MCP tools are resolved by `ToolEnv::kind_of`).
    pub fn from_name(name: &str) -> Option<ToolKind> {
        ToolKind::ALL.into_iter().find(|kind| kind.name() == name)
    }

    pub fn transport(self) -> Transport {
        per_kind!(self, T => T::TRANSPORT)
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
        per_kind!(self, T => bare_card::<T>(error))
    }

    /// The arguments `parse_input` accepts for this tool, as (name, required) (`Tool::ARGUMENTS`).
    pub fn arguments(self) -> &'static [(&'static str, bool)] {
        per_kind!(self, T => T::ARGUMENTS)
    }

    /// The argument whose value streams into the card as file content while the model writes it.
    pub fn streamed_content_field(self) -> Option<&'static str> {
        per_kind!(self, T => T::STREAMED_CONTENT)
    }
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
/// resources may call MCP tools). Computed once per mode, not per provider call. The mode's
/// definitions are shared, not copied: a copy of a mode's hundreds of JSON nodes cost every run
/// start 15-30 µs.
pub fn offered_tools(
    mode_tools: &[Arc<serde_json::Value>],
    options: &ToolOptions,
) -> Vec<Arc<serde_json::Value>> {
    let name_of = |tool: &serde_json::Value| {
        tool["function"]["name"]
            .as_str()
            .and_then(ToolKind::from_name)
    };
    let mode_has_mcp = mode_tools
        .iter()
        .any(|t| name_of(t) == Some(ToolKind::ListMcpResources));
    let mut offered: Vec<Arc<serde_json::Value>> = mode_tools
        .iter()
        .filter(|tool| name_of(tool).is_none_or(|kind| options.allows(kind)))
        .cloned()
        .collect();
    if mode_has_mcp && options.only.is_none() {
        offered.extend(
            options
                .mcp
                .iter()
                .map(|tool| Arc::new(mcp::definition(tool))),
        );
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
    fn a_run_is_offered_the_modes_own_definitions_less_what_it_may_not_use() {
        let assets = crate::prompting::assets::PromptAssets::embedded().expect("assets");
        let mode_tools = &assets.mode(Mode::Agent).tools;
        let name = |tool: &serde_json::Value| tool["function"]["name"].as_str().unwrap().to_owned();
        let mut options = ToolOptions::without_context(Vec::new());
        options.web_search = false;
        let offered = offered_tools(mode_tools, &options);
        assert!(
            !offered
                .iter()
                .any(|t| name(t) == ToolKind::WebSearch.name())
        );
        assert!(
            !offered
                .iter()
                .any(|t| name(t) == ToolKind::ListMcpResources.name())
        );
        assert_eq!(
            offered.len(),
            mode_tools.len() - 3,
            "web search and both MCP resource tools"
        );
        for tool in &offered {
            let own = mode_tools.iter().find(|t| name(t) == name(tool)).unwrap();
            assert!(
                Arc::ptr_eq(tool, own),
                "{} is shared, not copied",
                name(tool)
            );
        }
        // With an MCP server the mode's resource tools are offered and its tools come after.
        options.mcp = vec![McpTool {
            model_name: "mcp_docs_search".into(),
            name: "search".into(),
            server: "docs".into(),
            tool_name: "search".into(),
            description: "Searches the docs.".into(),
            input_schema: serde_json::json!({"type": "object"}),
        }];
        options.add_servers(std::iter::empty());
        let offered = offered_tools(mode_tools, &options);
        assert_eq!(offered.len(), mode_tools.len());
        assert_eq!(name(offered.last().unwrap()), "mcp_docs_search");
    }

    #[test]
    fn the_registry_derives_each_tool_from_its_declaration() {
        let mut names: Vec<&str> = ToolKind::ALL.iter().map(|k| k.name()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), ToolKind::ALL.len(), "two tools share a name");
        for kind in ToolKind::ALL {
            assert_eq!(ToolKind::from_name(kind.name()), Some(kind));
            // Every declared argument list is accepted by the tool's own parser's field names:
            // a required-only call missing them is refused, never parsed.
            if kind.arguments().iter().any(|(_, required)| *required) {
                assert!(parse_input(kind, "{}").is_err(), "{}", kind.name());
            }
        }
        assert_eq!(ToolKind::from_name(ToolKind::Mcp.name()), None);
        assert_eq!(ToolKind::Write.streamed_content_field(), Some("contents"));
        assert_eq!(ToolKind::WebSearch.transport(), Transport::Interaction);
        assert_eq!(ToolKind::TodoWrite.transport(), Transport::Local);
        assert_eq!(ToolKind::Read.transport(), Transport::Exec);
        assert!(parse_input(ToolKind::Mcp, "{}").is_err());
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
