//! Builds the provider-neutral `ModelRequest` of one provider call from the committed history, the
//! model's configuration and the run's requested parameters.
//!
//! The system prompt and tools are byte-stable across calls so that request N stays an exact prefix
//! of request N+1; a mode change replaces only them, and is told to the model by runtime messages
//! (decided here, stored once by `store/messages.rs`).

use super::assets::{PromptAssets, PromptKind};
use super::images::ImageSet;
use crate::config::ModelConfig;
use crate::model::conversation::{Attachment, Mode, RuleScope, SubagentRole, WorkspaceContext};
use crate::model::message::{CanonicalMessage, current_context_digest, latest_compaction};
use crate::model::runtime_tag::{
    BackgroundCompletion, BackgroundKind, BackgroundOutcome, RuntimeEvent, RuntimeTag, UserAction,
};
use crate::sync::import::Known;
use std::sync::Arc;

/// The injected-context message for `context`, if the model has not seen this exact context yet
/// (the first message of a conversation, or the environment, rules, skills, MCP servers or
/// subagents changed). It goes before the user's message, like Cursor's own root order.
pub fn context_tag(
    history: &[CanonicalMessage],
    context: &WorkspaceContext,
    anchor: &str,
) -> Option<RuntimeTag> {
    // An empty context (a client that could not give one) tells the model nothing.
    if context == &WorkspaceContext::default() {
        return None;
    }
    let text = render_context(context);
    let digest = context_digest(&text);
    // Only what the model still sees counts: a context summarized away is told again.
    let visible = latest_compaction(history).map_or(history, |(_, _, through)| &history[through..]);
    if current_context_digest(visible) == Some(digest.as_str()) {
        return None;
    }
    Some(RuntimeTag::new(
        RuntimeEvent::WorkspaceContext { digest },
        anchor,
        text,
    ))
}

/// The digest a workspace-context message is known by: of the text the model reads.
fn context_digest(text: &str) -> String {
    hex::encode(<sha2::Sha256 as sha2::Digest>::digest(text.as_bytes()))
}

/// How every workspace-context message opens (`render_context`).
const CONTEXT_OPENING: &str = "<user_info>\n";

/// What importing a client's roots must recognize (`sync/import.rs`): this server's own system
/// prompts, the instructions the run's request context tells (a CLI client also sends its own
/// prompt as a rule), and the workspace context this server injected.
pub struct ImportKnown<'a> {
    prompts: &'a PromptAssets,
    context: Option<&'a WorkspaceContext>,
}

impl<'a> ImportKnown<'a> {
    pub fn new(prompts: &'a PromptAssets, context: Option<&'a WorkspaceContext>) -> Self {
        ImportKnown { prompts, context }
    }
}

impl Known for ImportKnown<'_> {
    fn told(&self, instructions: &str) -> bool {
        let text = instructions.trim();
        self.prompts.is_own_system_prompt(text)
            || self.context.is_some_and(|context| {
                // A rule asked for on request shows only its description, not its text.
                context.rules.iter().any(|rule| {
                    !matches!(rule.applies, RuleScope::OnRequest(_)) && rule.content.trim() == text
                })
            })
    }

    fn runtime(&self, text: &str) -> Option<RuntimeEvent> {
        text.starts_with(CONTEXT_OPENING)
            .then(|| RuntimeEvent::WorkspaceContext {
                digest: context_digest(text),
            })
    }
}

/// Messages the user sent while the agent was busy, in order, each as the user wrote it: stored
/// before the message they were delivered with.
pub fn queued_message_tags(texts: &[String], anchor: &str) -> Vec<RuntimeTag> {
    texts
        .iter()
        .enumerate()
        .map(|(index, text)| {
            RuntimeTag::new(
                RuntimeEvent::QueuedMessage { index },
                &format!("{anchor}:{index}"),
                text.clone(),
            )
        })
        .collect()
}

/// An answer to an AskQuestion that came after the run that asked it ended (once per call).
pub fn late_answer_tag(call_id: &str, answer: &str) -> RuntimeTag {
    RuntimeTag::new(
        RuntimeEvent::QuestionAnswered {
            call_id: call_id.to_owned(),
        },
        call_id,
        format!(
            "<late_answer>\nThe user answered the questions you asked earlier (call {call_id}) after that turn had ended.\n{answer}\n</late_answer>"
        ),
    )
}

/// What the user did outside a turn, told once (anchored to the client's id for it).
pub fn user_action_tag(action: &UserAction) -> RuntimeTag {
    match action {
        UserAction::RanCommand {
            command,
            exec_id,
            output,
        } => RuntimeTag::new(
            RuntimeEvent::UserActed {
                action: action.clone(),
            },
            exec_id,
            match output {
                Some(output) => format!(
                    "<user_ran_command>\nThe user ran this command in your shell:\n{command}\nWhat it returned:\n{output}\n</user_ran_command>"
                ),
                None => format!(
                    "<user_ran_command>\nThe user ran this command in their own terminal:\n{command}\nIts output was not shared with you; if it matters, ask the user or run it yourself.\n</user_ran_command>"
                ),
            },
        ),
    }
}

/// Results of tool calls that were pending when the user interrupted the run and finished after
/// all, each told once before the user's next message: `(call id, the result as text)`.
pub fn resolved_call_tags(resolved: &[(String, String)]) -> Vec<RuntimeTag> {
    resolved
        .iter()
        .map(|(call_id, result)| {
            RuntimeTag::new(
                RuntimeEvent::InterruptedCallResolved {
                    call_id: call_id.clone(),
                },
                call_id,
                format!(
                    "<interrupted_call_result>\nThe tool call {call_id}, still running when the user interrupted you, finished after all:\n{result}\n</interrupted_call_result>"
                ),
            )
        })
        .collect()
}

/// What the user attached to their message, as one runtime message stored just before it (`None`
/// when nothing was attached). Deterministic, so every later request replays the same bytes.
pub fn attachments_tag(attached: &[Attachment], anchor: &str) -> Option<RuntimeTag> {
    if attached.is_empty() {
        return None;
    }
    Some(RuntimeTag::new(
        RuntimeEvent::Attached,
        anchor,
        render_attachments(attached),
    ))
}

fn render_attachments(attached: &[Attachment]) -> String {
    use std::fmt::Write;
    let lines = |lines: &Option<(u32, u32)>| {
        lines.map_or_else(String::new, |(from, to)| format!(" lines=\"{from}-{to}\""))
    };
    let mut out = String::from(
        "<attached_context>\nThe user attached the following to the message that comes next. Paths \
         are as the user's workspace names them; line ranges are 1-based and inclusive.\n",
    );
    for attachment in attached {
        let _ = match attachment {
            Attachment::File { path, content } => {
                writeln!(out, "<file path=\"{path}\">\n{content}\n</file>")
            }
            Attachment::Selection {
                path,
                lines: range,
                content,
            } => writeln!(
                out,
                "<code_selection path=\"{path}\"{}>\n{content}\n</code_selection>",
                lines(range)
            ),
            Attachment::Folder { path, tree } => {
                writeln!(out, "<folder path=\"{path}\">\n{tree}</folder>")
            }
            Attachment::Terminal {
                title,
                lines: range,
                content,
            } => writeln!(
                out,
                "<terminal title=\"{title}\"{}>\n{content}\n</terminal>",
                lines(range)
            ),
            Attachment::Rule { path, content } => writeln!(
                out,
                "<rule path=\"{path}\">\nThe user applied this rule to the message; follow it.\n{content}\n</rule>"
            ),
            Attachment::Command { name, content } => writeln!(
                out,
                "<command name=\"/{name}\">\nThe user invoked this command: its content is their instruction.\n{content}\n</command>"
            ),
            Attachment::Diff { label, content } => {
                writeln!(out, "<diff of=\"{label}\">\n{content}\n</diff>")
            }
            Attachment::Link { url, content } => match content {
                Some(content) => writeln!(out, "<link url=\"{url}\">\n{content}\n</link>"),
                None => writeln!(
                    out,
                    "<link url=\"{url}\">(its content was not sent; fetch it with WebFetch if needed)</link>"
                ),
            },
            Attachment::Text { label, content } => {
                writeln!(out, "<context of=\"{label}\">\n{content}\n</context>")
            }
            // Fetched before the message is committed; one the client could not give is named.
            Attachment::Stored { label, blob } => writeln!(
                out,
                "<not_shown kind=\"{label}\" name=\"{blob}\">The user attached this, but the client could not send its content.</not_shown>"
            ),
            Attachment::Unshown { kind, name } => writeln!(
                out,
                "<not_shown kind=\"{kind}\" name=\"{name}\">The user attached this, but this server cannot show its content to you; say so if it matters.</not_shown>"
            ),
        };
    }
    out.push_str("</attached_context>");
    out
}

/// The workspace context as the model reads it. Deterministic: the same context renders to the
/// same bytes (prefix caches, and the digest that decides whether it is new).
fn render_context(context: &WorkspaceContext) -> String {
    use std::fmt::Write;
    let mut out = String::from("<user_info>\n");
    let mut line = |label: &str, value: &str| {
        if !value.is_empty() {
            let _ = writeln!(out, "{label}: {value}");
        }
    };
    line("OS", &context.os_version);
    line("Shell", &context.shell);
    line("Time zone", &context.time_zone);
    line("Workspace", &context.workspace_paths.join(", "));
    out.push_str("</user_info>");
    if !context.rules.is_empty() {
        out.push_str(
            "\n\n<rules>\nThe user's rules for this project. Follow the ones that apply.\n",
        );
        for rule in &context.rules {
            match &rule.applies {
                RuleScope::Always => {
                    let _ = write!(
                        out,
                        "\n<rule path=\"{}\">\n{}\n</rule>\n",
                        rule.path,
                        rule.content.trim()
                    );
                }
                RuleScope::Files(globs) => {
                    let _ = write!(
                        out,
                        "\n<rule path=\"{}\" applies_to=\"{}\">\n{}\n</rule>\n",
                        rule.path,
                        globs.join(", "),
                        rule.content.trim()
                    );
                }
                RuleScope::OnRequest(description) => {
                    let _ = writeln!(
                        out,
                        "\n- {} (read this file when relevant): {}",
                        rule.path, description
                    );
                }
            }
        }
        out.push_str("</rules>");
    }
    let mut list = |tag: &str, intro: &str, items: &[(String, String)]| {
        if items.is_empty() {
            return;
        }
        let _ = write!(out, "\n\n<{tag}>\n{intro}\n");
        for (name, text) in items {
            let _ = writeln!(out, "- {name}: {}", text.trim());
        }
        let _ = write!(out, "</{tag}>");
    };
    list(
        "skills",
        "Skills you can use: read a skill's file before following it.",
        &context.skills,
    );
    list(
        "mcp_instructions",
        "Instructions from the user's MCP servers.",
        &context.mcp_instructions,
    );
    list(
        "subagents",
        "Subagents the user defined.",
        &context.subagents,
    );
    out
}

/// The runtime messages a user message in `mode` brings, anchored to the run that carries it: a
/// notice when the conversation was in another mode, then the mode's reminder if it has one.
pub fn user_message_tags(
    assets: &PromptAssets,
    previous: Option<Mode>,
    mode: Mode,
    anchor: &str,
) -> Vec<RuntimeTag> {
    let mut tags = Vec::new();
    if let Some(from) = previous.filter(|from| *from != mode) {
        tags.push(RuntimeTag::new(
            RuntimeEvent::ModeChosen { from, to: mode },
            anchor,
            assets.mode_change(from, mode),
        ));
    }
    if let Some(reminder) = &assets.mode(mode).reminder {
        tags.push(RuntimeTag::new(
            RuntimeEvent::ModeReminder { mode },
            anchor,
            reminder.render(&[("mode", mode.title())]),
        ));
    }
    tags
}

/// The notice for a SwitchMode call the user approved (anchored to that call).
pub fn mode_switch_tag(assets: &PromptAssets, from: Mode, to: Mode, call_id: &str) -> RuntimeTag {
    RuntimeTag::new(
        RuntimeEvent::ModeSwitched { from, to },
        call_id,
        assets.mode_change(from, to),
    )
}

/// The runtime message telling the model a background task it started has ended (once per task).
pub fn background_tag(completion: &BackgroundCompletion) -> RuntimeTag {
    use std::fmt::Write;
    let what = match completion.kind {
        BackgroundKind::Subagent => "subagent",
        BackgroundKind::Shell => "shell command",
    };
    let how = match completion.outcome {
        BackgroundOutcome::Succeeded => "finished",
        BackgroundOutcome::Failed => "failed",
        BackgroundOutcome::Aborted => "was aborted",
    };
    let mut text = format!(
        "<background_task_ended>\nThe background {what} {:?} (id {}) {how}.",
        completion.title, completion.task_id
    );
    if let Some(detail) = &completion.detail {
        let _ = write!(text, "\n\n{}", detail.trim());
    }
    if let Some(path) = &completion.output_path {
        let _ = write!(text, "\n\nIts full output is in {path}.");
    }
    text.push_str("\n</background_task_ended>\nContinue the user's task with this result.");
    RuntimeTag::new(
        RuntimeEvent::BackgroundTaskEnded {
            task_id: completion.task_id.clone(),
            outcome: completion.outcome,
        },
        &completion.task_id,
        text,
    )
}

/// The compaction summary as the model reads it in place of the messages it covers.
pub fn compaction_tag(number: u32, through: usize, summary: &str) -> RuntimeTag {
    RuntimeTag::new(
        RuntimeEvent::Compacted { number, through },
        &number.to_string(),
        format!(
            "<conversation_summary>\nThe earlier part of this conversation was summarized to fit the context window:\n\n{summary}\n</conversation_summary>"
        ),
    )
}

/// The system prompt and tool list of a run: its mode's, or — for a run another agent's Task call
/// started — the subagent's, with a custom subagent's own instructions after it.
pub fn prompt_for<'a>(
    assets: &'a PromptAssets,
    mode: Mode,
    subagent: Option<&SubagentRole>,
) -> (String, &'a [Arc<serde_json::Value>]) {
    match subagent {
        None => {
            let set = assets.mode(mode);
            (set.system.clone(), &set.tools)
        }
        Some(role) => {
            let set = assets.set(PromptKind::Subagent);
            let system = match &role.custom_prompt {
                Some(custom) => format!(
                    "{}\n\n<subagent_instructions name=\"{}\">\n{custom}\n</subagent_instructions>",
                    set.system, role.type_name
                ),
                None => set.system.clone(),
            };
            (system, &set.tools)
        }
    }
}

/// What the model sees of `history`: all of it, or — after a compaction — the latest summary
/// followed by the messages it did not cover, in order. Stored history is never rewritten, so
/// every request after a compaction keeps the compacted request as its prefix.
fn visible_history(history: &[CanonicalMessage]) -> Vec<&CanonicalMessage> {
    match latest_compaction(history) {
        None => history.iter().collect(),
        Some((at, _, through)) => std::iter::once(&history[at])
            .chain(&history[through..at])
            .chain(&history[at + 1..])
            .collect(),
    }
}

/// Reasoning effort levels Cursor can request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effort {
    Minimal,
    Low,
    Medium,
    High,
    Max,
}

impl Effort {
    pub fn parse(value: &str) -> Option<Effort> {
        match value.trim().to_ascii_lowercase().as_str() {
            "minimal" | "none" => Some(Effort::Minimal),
            "low" => Some(Effort::Low),
            "medium" => Some(Effort::Medium),
            "high" => Some(Effort::High),
            "max" | "xhigh" => Some(Effort::Max),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Effort::Minimal => "minimal",
            Effort::Low => "low",
            Effort::Medium => "medium",
            Effort::High => "high",
            Effort::Max => "max",
        }
    }
}

/// What the client asked for beyond the model id (`requested_model.parameters`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RequestParameters {
    pub effort: Option<Effort>,
    /// Cursor's "fast" toggle: a priority tier where the endpoint has one.
    pub fast: bool,
}

impl RequestParameters {
    /// Maps Cursor's `(id, value)` parameters; unknown ones are logged and ignored, never fatal.
    pub fn from_pairs(pairs: &[(String, String)]) -> RequestParameters {
        let mut parameters = RequestParameters::default();
        for (id, value) in pairs {
            match id.as_str() {
                "reasoning" | "reasoning_effort" | "effort" | "thinking" => {
                    match Effort::parse(value) {
                        Some(effort) => parameters.effort = Some(effort),
                        None => tracing::debug!("ignoring reasoning parameter value {value:?}"),
                    }
                }
                "fast" => parameters.fast = matches!(value.as_str(), "true" | "1" | "on"),
                other => tracing::debug!("ignoring unknown model parameter {other:?}={value:?}"),
            }
        }
        parameters
    }
}

/// What one provider call is asked, before any provider-specific shaping.
#[derive(Debug, Clone)]
pub struct ModelRequest<'a> {
    pub system: &'a str,
    /// The history the model sees (`visible_history`).
    pub history: Vec<&'a CanonicalMessage>,
    pub model: &'a ModelConfig,
    /// Tool definitions, OpenAI Chat function format.
    pub tools: &'a [Arc<serde_json::Value>],
    pub parameters: RequestParameters,
    /// The bytes of the images the history shows.
    pub images: &'a ImageSet,
}

pub fn compile<'a>(
    system: &'a str,
    history: &'a [CanonicalMessage],
    model: &'a ModelConfig,
    tools: &'a [Arc<serde_json::Value>],
    parameters: RequestParameters,
    images: &'a ImageSet,
) -> ModelRequest<'a> {
    ModelRequest {
        system,
        history: visible_history(history),
        model,
        tools,
        parameters,
        images,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::conversation::Rule;

    #[test]
    fn an_import_knows_the_servers_prompts_the_rules_shown_and_the_context_it_injected() {
        let prompts = PromptAssets::embedded().unwrap();
        let rule = |applies, content: &str| Rule {
            path: "r.mdc".into(),
            applies,
            content: content.into(),
        };
        let context = WorkspaceContext {
            rules: vec![
                rule(RuleScope::Always, "Shown always.\n"),
                rule(RuleScope::Files(vec!["*.rs".into()]), "Shown for Rust."),
                rule(RuleScope::OnRequest("db".into()), "Only described."),
            ],
            ..WorkspaceContext::default()
        };
        let known = ImportKnown::new(&prompts, Some(&context));
        assert!(known.told(&prompts.mode(Mode::Ask).system));
        assert!(known.told("Shown always."));
        assert!(known.told("  Shown for Rust.\n"));
        assert!(!known.told("Only described."), "its text is not shown");
        assert!(!known.told("A foreign client's own rules."));
        assert!(!ImportKnown::new(&prompts, None).told("Shown always."));
        // The context this server injects is read back with the digest it was injected under.
        let tag = context_tag(&[], &context, "req").expect("a context");
        assert_eq!(known.runtime(&tag.text), Some(tag.event));
        assert_eq!(known.runtime("<user_info> typed on one line"), None);
    }

    #[test]
    fn the_context_renders_each_rule_by_scope_and_is_injected_only_when_it_changes() {
        let mut context = WorkspaceContext {
            os_version: "linux 6.8".into(),
            shell: "zsh".into(),
            workspace_paths: vec!["/w".into()],
            rules: vec![
                Rule {
                    path: "a.mdc".into(),
                    applies: RuleScope::Always,
                    content: "Always tabs.".into(),
                },
                Rule {
                    path: "b.mdc".into(),
                    applies: RuleScope::Files(vec!["*.rs".into()]),
                    content: "Rust rule.".into(),
                },
                Rule {
                    path: "c.mdc".into(),
                    applies: RuleScope::OnRequest("database conventions".into()),
                    content: "Long text the model reads on demand.".into(),
                },
            ],
            skills: vec![("skills/pdf/SKILL.md".into(), "Work with PDFs".into())],
            mcp_instructions: vec![("linear".into(), "Use team ENG.".into())],
            subagents: vec![("reviewer".into(), "Reviews diffs".into())],
            ..WorkspaceContext::default()
        };
        let text = render_context(&context);
        assert_eq!(text, render_context(&context.clone()), "deterministic");
        for expected in [
            "OS: linux 6.8",
            "Shell: zsh",
            "Workspace: /w",
            "Always tabs.",
            "applies_to=\"*.rs\"",
            "c.mdc (read this file when relevant): database conventions",
            "skills/pdf/SKILL.md: Work with PDFs",
            "linear: Use team ENG.",
            "reviewer: Reviews diffs",
        ] {
            assert!(text.contains(expected), "{expected} in {text}");
        }
        assert!(
            !text.contains("Long text"),
            "on-request rules are listed, not inlined"
        );

        let first = context_tag(&[], &context, "req-1").expect("new conversation");
        let history = vec![first.message()];
        assert!(
            context_tag(&history, &context, "req-2").is_none(),
            "unchanged"
        );
        context.shell = "bash".into();
        let changed = context_tag(&history, &context, "req-3").expect("changed");
        assert_ne!(changed.event_id, first.event_id);
    }

    #[test]
    fn parameters_map_effort_and_fast_and_ignore_the_rest() {
        let pairs = [
            ("reasoning".to_owned(), "high".to_owned()),
            ("fast".to_owned(), "true".to_owned()),
            ("something_new".to_owned(), "x".to_owned()),
        ];
        assert_eq!(
            RequestParameters::from_pairs(&pairs),
            RequestParameters {
                effort: Some(Effort::High),
                fast: true
            }
        );
    }
}
