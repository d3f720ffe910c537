//! The prompt assets of the repository's `prompt/` directory: embedded at compile time, or read
//! from the directory the user names in `prompt_dir` (to edit prompts without rebuilding), and
//! validated when the server starts — a broken asset is a start-up error, never a runtime surprise.
//!
//! Layout: `common_prefix.md`; per prompt kind (`agent/`, `ask/`, `plan/`, `debug/`, `multitask/`,
//! `subagent/`, `compaction/`, `commit/`) a `prompt.md`, a `tools.json` (OpenAI function array)
//! and, where the kind has one, a `reminder.md`; shared templates under `reminders/`.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use include_dir::{Dir, include_dir};
use serde_json::Value;

use crate::model::conversation::Mode;

static EMBEDDED: Dir<'static> = include_dir!("$CARGO_MANIFEST_DIR/../prompt");

/// What a prompt is for: a mode the user picks, or a task the server runs itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PromptKind {
    Mode(Mode),
    Subagent,
    Compaction,
    Commit,
}

impl PromptKind {
    pub const ALL: [PromptKind; 8] = [
        PromptKind::Mode(Mode::Agent),
        PromptKind::Mode(Mode::Ask),
        PromptKind::Mode(Mode::Plan),
        PromptKind::Mode(Mode::Debug),
        PromptKind::Mode(Mode::Multitask),
        PromptKind::Subagent,
        PromptKind::Compaction,
        PromptKind::Commit,
    ];

    pub fn dir(self) -> &'static str {
        match self {
            PromptKind::Mode(mode) => mode.as_str(),
            PromptKind::Subagent => "subagent",
            PromptKind::Compaction => "compaction",
            PromptKind::Commit => "commit",
        }
    }

    /// The variables its `reminder.md` may use.
    fn reminder_variables(self) -> &'static [&'static str] {
        &["mode"]
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AssetError {
    #[error("prompt asset {path} is missing")]
    Missing { path: String },
    #[error("reading prompt asset {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("prompt asset {path} is not UTF-8")]
    NotUtf8 { path: String },
    #[error("{path}: {message}")]
    Invalid { path: String, message: String },
    #[error("{path}: template variable {{{{{name}}}}} is not one of {known:?}")]
    UnknownVariable {
        path: String,
        name: String,
        known: &'static [&'static str],
    },
}

/// A text with `{{name}}` placeholders, checked against the variables its user supplies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    text: String,
}

impl Template {
    pub fn parse(
        path: &str,
        text: &str,
        known: &'static [&'static str],
    ) -> Result<Template, AssetError> {
        let mut rest = text;
        while let Some(start) = rest.find("{{") {
            let after = &rest[start + 2..];
            let Some(end) = after.find("}}") else {
                return Err(AssetError::Invalid {
                    path: path.to_owned(),
                    message: "unclosed `{{`".to_owned(),
                });
            };
            let name = after[..end].trim();
            if !known.contains(&name) {
                return Err(AssetError::UnknownVariable {
                    path: path.to_owned(),
                    name: name.to_owned(),
                    known,
                });
            }
            rest = &after[end + 2..];
        }
        Ok(Template {
            text: text.trim_end().to_owned(),
        })
    }

    /// Fills in `values`; every variable the template uses was checked to be known at load.
    pub fn render(&self, values: &[(&str, &str)]) -> String {
        let mut out = self.text.clone();
        for (name, value) in values {
            out = out.replace(&format!("{{{{{name}}}}}"), value);
        }
        out
    }
}

/// One prompt kind's assets, ready to use.
#[derive(Debug, Clone)]
pub struct PromptSet {
    /// The system prompt: the common prefix, then the kind's own prompt.
    pub system: String,
    /// Tool definitions, OpenAI Chat function format; every name is a registry tool. Each is
    /// shared: a run holds the ones it offers, not copies (`tools::offered_tools`).
    pub tools: Vec<Arc<Value>>,
    /// Appended (as a runtime message) to each user message of the mode, if the mode has one.
    pub reminder: Option<Template>,
}

/// Every prompt asset, validated.
#[derive(Debug, Clone)]
pub struct PromptAssets {
    sets: HashMap<PromptKind, PromptSet>,
    mode_change: Template,
    /// What every system prompt starts with (recognizes this server's own prompts of any kind).
    common_prefix: String,
}

impl PromptAssets {
    /// The assets compiled into the binary.
    pub fn embedded() -> Result<PromptAssets, AssetError> {
        PromptAssets::load(|path| match EMBEDDED.get_file(path) {
            None => Ok(None),
            Some(file) => file
                .contents_utf8()
                .map(|text| Some(text.to_owned()))
                .ok_or_else(|| AssetError::NotUtf8 {
                    path: path.to_owned(),
                }),
        })
    }

    /// The assets of `dir` (a copy of `prompt/` the user edits).
    pub fn from_dir(dir: &Path) -> Result<PromptAssets, AssetError> {
        PromptAssets::load(|path| {
            let full: PathBuf = dir.join(path);
            match std::fs::read(&full) {
                Ok(bytes) => String::from_utf8(bytes)
                    .map(Some)
                    .map_err(|_| AssetError::NotUtf8 {
                        path: full.display().to_string(),
                    }),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(source) => Err(AssetError::Io {
                    path: full.display().to_string(),
                    source,
                }),
            }
        })
    }

    fn load(
        read: impl Fn(&str) -> Result<Option<String>, AssetError>,
    ) -> Result<PromptAssets, AssetError> {
        let required = |path: &str| {
            read(path)?.ok_or_else(|| AssetError::Missing {
                path: path.to_owned(),
            })
        };
        let common_prefix = required("common_prefix.md")?;
        let mut sets = HashMap::new();
        for kind in PromptKind::ALL {
            let dir = kind.dir();
            let prompt = required(&format!("{dir}/prompt.md"))?;
            let tools_path = format!("{dir}/tools.json");
            let tools = parse_tools(&tools_path, &required(&tools_path)?)?;
            let reminder_path = format!("{dir}/reminder.md");
            let reminder = read(&reminder_path)?
                .map(|text| Template::parse(&reminder_path, &text, kind.reminder_variables()))
                .transpose()?;
            sets.insert(
                kind,
                PromptSet {
                    system: format!("{}\n\n{}", common_prefix.trim_end(), prompt.trim_end()),
                    tools: tools.into_iter().map(Arc::new).collect(),
                    reminder,
                },
            );
        }
        let mode_change_path = "reminders/mode_change.md";
        let mode_change = Template::parse(
            mode_change_path,
            &required(mode_change_path)?,
            &["previous_mode", "mode"],
        )?;
        Ok(PromptAssets {
            sets,
            mode_change,
            common_prefix: common_prefix.trim_end().to_owned(),
        })
    }

    pub fn set(&self, kind: PromptKind) -> &PromptSet {
        // `load` fills every kind of `PromptKind::ALL`.
        &self.sets[&kind]
    }

    pub fn mode(&self, mode: Mode) -> &PromptSet {
        self.set(PromptKind::Mode(mode))
    }

    /// Whether `text` is a system prompt of this server: any kind's as it stands, or one that
    /// starts with the common prefix (a mode's prompt of an earlier version, a subagent's with its
    /// own instructions). A conversation taken elsewhere and back brings it as a root.
    pub fn is_own_system_prompt(&self, text: &str) -> bool {
        let text = text.trim();
        (!self.common_prefix.is_empty() && text.starts_with(&self.common_prefix))
            || self.sets.values().any(|set| set.system.trim() == text)
    }

    /// The notice appended when the user switches modes.
    pub fn mode_change(&self, previous: Mode, mode: Mode) -> String {
        self.mode_change
            .render(&[("previous_mode", previous.title()), ("mode", mode.title())])
    }
}

/// Parses a `tools.json`: an array of function definitions, each named once, described, with an
/// object of parameters. Whether each is a tool the server implements, with exactly the arguments
/// it validates, is checked against the registry at start-up (`tools::check_prompt_tools`).
fn parse_tools(path: &str, text: &str) -> Result<Vec<Value>, AssetError> {
    let invalid = |message: String| AssetError::Invalid {
        path: path.to_owned(),
        message,
    };
    let tools: Vec<Value> = serde_json::from_str(text)
        .map_err(|e| invalid(format!("not a JSON array of tool definitions: {e}")))?;
    let mut seen = BTreeSet::new();
    for tool in &tools {
        let function = &tool["function"];
        let name = function["name"]
            .as_str()
            .ok_or_else(|| invalid(format!("a tool without function.name: {tool}")))?;
        if tool["type"] != "function" {
            return Err(invalid(format!("{name}: type must be \"function\"")));
        }
        if !seen.insert(name) {
            return Err(invalid(format!("{name} is defined twice")));
        }
        if function["description"].as_str().is_none_or(str::is_empty) {
            return Err(invalid(format!("{name} has no description")));
        }
        if !function["parameters"]["properties"].is_object() {
            return Err(invalid(format!(
                "{name}: parameters.properties must be an object"
            )));
        }
    }
    Ok(tools)
}

/// The most a mode's system prompt and tool definitions may cost, in tokens (about 4 bytes each):
/// both are resent on every provider call.
pub const PROMPT_TOKEN_BUDGET: usize = 6_000;
#[cfg(test)]
const BYTES_PER_TOKEN: usize = 4;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::app::check_prompt_tools;
    use crate::tools::{ToolKind, parse_input};

    /// Loads and checks an override directory as the server does at start-up.
    fn load_checked(dir: &Path) -> Result<PromptAssets, AssetError> {
        let assets = PromptAssets::from_dir(dir)?;
        check_prompt_tools(&assets)?;
        Ok(assets)
    }

    /// A plausible value for a JSON-schema property (the first enum value, a non-empty string, ...).
    fn sample(schema: &Value, name: &str) -> Value {
        if let Some(first) = schema["enum"].as_array().and_then(|e| e.first()) {
            return first.clone();
        }
        match schema["type"].as_str() {
            Some("string") if schema["format"] == "uri" => Value::from("https://example.com/"),
            Some("string") => Value::from(format!("src/{name}.rs")),
            Some("integer") | Some("number") => Value::from(1),
            Some("boolean") => Value::from(false),
            Some("array") => Value::Array(vec![sample(&schema["items"], name)]),
            Some("object") => {
                let mut object = serde_json::Map::new();
                for (key, property) in schema["properties"].as_object().into_iter().flatten() {
                    object.insert(key.clone(), sample(property, key));
                }
                Value::Object(object)
            }
            other => panic!("no sample for schema type {other:?}: {schema}"),
        }
    }

    #[test]
    fn each_mode_prompt_says_how_to_work_in_cursor_and_stays_within_its_token_budget() {
        let assets = PromptAssets::embedded().expect("embedded assets are valid");
        let modes = [
            Mode::Agent,
            Mode::Ask,
            Mode::Plan,
            Mode::Debug,
            Mode::Multitask,
        ];
        for mode in modes {
            let set = assets.mode(mode);
            let system = &set.system;
            // What Cursor renders and what the user gives: every mode.
            for needle in [
                "startLine:endLine:path",
                "<attached_context>",
                "<rule>",
                "<command name=",
                "Asking versus assuming",
                "## Ending the turn",
                "Grep",
                "Glob",
                "parallel",
            ] {
                assert!(system.contains(needle), "{mode:?} prompt lacks {needle:?}");
            }
            let bytes = system.len() + serde_json::to_string(&set.tools).unwrap().len();
            assert!(
                bytes / BYTES_PER_TOKEN <= PROMPT_TOKEN_BUDGET,
                "{mode:?}: system prompt + tools is ~{} tokens, over the {PROMPT_TOKEN_BUDGET} budget",
                bytes / BYTES_PER_TOKEN
            );
            for tool in &set.tools {
                let description = tool["function"]["description"].as_str().unwrap_or_default();
                assert!(
                    description.len() >= 60,
                    "{mode:?}: {} says too little about when to use it",
                    tool["function"]["name"]
                );
            }
        }
        // The modes that change code say how to use the editing tools well.
        for mode in [Mode::Agent, Mode::Debug, Mode::Multitask] {
            let system = &assets.mode(mode).system;
            for needle in ["StrReplace", "ReadLints", "TodoWrite"] {
                assert!(system.contains(needle), "{mode:?} prompt lacks {needle:?}");
            }
        }
        let agent = &assets.mode(Mode::Agent).system;
        for needle in [
            "Read before you edit",
            "exactly once",
            "Write only for new files",
            "Shell runs in the user's terminal",
        ] {
            assert!(agent.contains(needle), "the agent prompt lacks {needle:?}");
        }
        assert!(assets.mode(Mode::Plan).system.contains("CreatePlan"));
    }

    #[test]
    fn every_prompt_kind_loads_with_a_system_prompt_and_tools_the_registry_accepts() {
        let assets = PromptAssets::embedded().expect("embedded assets are valid");
        check_prompt_tools(&assets).expect("embedded tools match the registry");
        for kind in PromptKind::ALL {
            let set = assets.set(kind);
            assert!(set.system.len() > 200, "{kind:?} has a real system prompt");
            for tool in &set.tools {
                let function = &tool["function"];
                let name = function["name"].as_str().unwrap();
                let tool_kind = ToolKind::from_name(name).unwrap();
                // Arguments built from the description are accepted by the registry...
                let full = sample(&function["parameters"], name);
                parse_input(tool_kind, &full.to_string())
                    .unwrap_or_else(|e| panic!("{kind:?} {name}: {e} for {full}"));
                // ...and leaving out any required one is rejected.
                for required in function["parameters"]["required"].as_array().unwrap() {
                    let mut partial = full.clone();
                    partial
                        .as_object_mut()
                        .unwrap()
                        .remove(required.as_str().unwrap());
                    assert!(
                        parse_input(tool_kind, &partial.to_string()).is_err(),
                        "{kind:?} {name} without {required} was accepted"
                    );
                }
            }
        }
        let ask: Vec<&str> = assets
            .mode(Mode::Ask)
            .tools
            .iter()
            .map(|t| t["function"]["name"].as_str().unwrap())
            .collect();
        assert!(
            !ask.contains(&"Write") && !ask.contains(&"Shell"),
            "Ask mode is read-only: {ask:?}"
        );
        assert!(assets.set(PromptKind::Compaction).tools.is_empty());
        assert!(assets.mode(Mode::Plan).reminder.is_some());
        assert!(
            assets
                .mode_change(Mode::Agent, Mode::Plan)
                .contains("from Agent mode to Plan mode")
        );
    }

    #[test]
    fn every_kinds_system_prompt_is_recognized_as_this_servers_own_and_others_are_not() {
        let assets = PromptAssets::embedded().expect("embedded assets are valid");
        for kind in PromptKind::ALL {
            let system = &assets.set(kind).system;
            assert!(assets.is_own_system_prompt(system), "{kind:?}");
            // An earlier version of the mode's own part.
            let (prefix, _) = system.split_at(assets.common_prefix.len());
            assert!(assets.is_own_system_prompt(&format!("{prefix}\n\nOlder rules.")));
        }
        assert!(!assets.is_own_system_prompt("You are the terminal agent."));
        assert!(!assets.is_own_system_prompt(""));
    }

    #[test]
    fn an_override_directory_is_validated_like_the_embedded_assets() {
        fn copy(from: &Dir<'_>, to: &Path) {
            for file in from.files() {
                let path = to.join(file.path());
                std::fs::create_dir_all(path.parent().unwrap()).unwrap();
                std::fs::write(&path, file.contents()).unwrap();
            }
            for dir in from.dirs() {
                copy(dir, to);
            }
        }
        let dir = tempfile::tempdir().unwrap();
        copy(&EMBEDDED, dir.path());
        std::fs::write(
            dir.path().join("ask/prompt.md"),
            "# Mode: Ask\n\nMy own rules.",
        )
        .unwrap();
        let assets = load_checked(dir.path()).unwrap();
        assert!(assets.mode(Mode::Ask).system.ends_with("My own rules."));

        std::fs::write(dir.path().join("plan/reminder.md"), "Plan for {{user}}").unwrap();
        let err = load_checked(dir.path()).unwrap_err().to_string();
        assert!(err.contains("{{user}}"), "{err}");
        std::fs::write(dir.path().join("plan/reminder.md"), "Plan ({{mode}})").unwrap();

        let tools = dir.path().join("ask/tools.json");
        std::fs::write(&tools, r#"[{"type":"function","function":{"name":"Teleport","description":"x","parameters":{"type":"object","properties":{}}}}]"#).unwrap();
        let err = load_checked(dir.path()).unwrap_err().to_string();
        assert!(err.contains("Teleport is not a tool"), "{err}");
        std::fs::write(&tools, r#"[{"type":"function","function":{"name":"Read","description":"x","parameters":{"type":"object","properties":{"file":{"type":"string"}},"required":["file"]}}}]"#).unwrap();
        let err = load_checked(dir.path()).unwrap_err().to_string();
        assert!(err.contains("differ from the arguments"), "{err}");
        std::fs::remove_file(&tools).unwrap();
        let err = load_checked(dir.path()).unwrap_err().to_string();
        assert!(err.contains("ask/tools.json is missing"), "{err}");
    }
}
