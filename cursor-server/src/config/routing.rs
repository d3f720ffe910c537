//! Model routing: which configured model a run calls for the name Cursor sends — an exact id (with
//! an effort suffix), Auto (`default`), an alias or an alias pattern (`composer-*`, `*`) — and, when
//! Cursor sent Auto or an aliased name, the model the run's mode or subagent type is configured to
//! use; then the model's fallbacks, in order. Validated with the rest of the file: every name must
//! point at a configured model, no alias is claimed twice, no fallback chain loops.
//!
//! Resolution is once per run and costs a few string comparisons per configured alias (measured
//! in `benches/routing.rs`); nothing here runs per streamed event.

use std::collections::{BTreeMap, HashMap, HashSet};

use super::{AUTO_MODEL_ID, Config, ConfigError, ModelChoice};
use crate::model::conversation::Mode;

/// A name a configured model answers to besides its id: exact, or a pattern where `*` stands for
/// any run of characters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Alias {
    pub pattern: String,
    /// The configured model it names.
    pub model: String,
}

impl Alias {
    fn is_pattern(&self) -> bool {
        self.pattern.contains('*')
    }

    /// Characters the pattern fixes: a more specific pattern wins over a looser one.
    fn specificity(&self) -> usize {
        self.pattern.chars().filter(|c| *c != '*').count()
    }

    fn matches(&self, name: &str) -> bool {
        if !self.is_pattern() {
            return self.pattern == name;
        }
        glob_match(&self.pattern, name)
    }
}

/// `*` matches any run of characters (none included); everything else matches itself.
fn glob_match(pattern: &str, name: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if parts.len() == 1 {
        return pattern == name;
    }
    if !name.starts_with(first) || name.len() < first.len() + last.len() || !name.ends_with(last) {
        return false;
    }
    let mut rest = &name[first.len()..name.len() - last.len()];
    for part in &parts[1..parts.len() - 1] {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    true
}

/// The routing table: aliases (exact names first, then patterns from the most specific), the
/// model per mode and per subagent type.
#[derive(Debug, Clone, Default)]
pub struct Routing {
    pub aliases: Vec<Alias>,
    pub modes: BTreeMap<Mode, String>,
    /// By subagent type (`explore`, `general`, ...); `default` for any type not named.
    pub subagents: BTreeMap<String, String>,
}

/// How a run's model was chosen, for its record and the console.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RoutedBy {
    /// Cursor named a configured model (possibly with an effort suffix).
    Exact,
    /// Cursor sent Auto: the configured default.
    Auto,
    /// Cursor sent a name one of the model's aliases matches.
    Alias(String),
    /// The run's mode is configured to use this model (Cursor sent Auto or an alias).
    Mode(Mode),
    /// The subagent type is configured to use this model (Cursor sent Auto or an alias).
    Subagent(String),
}

/// The model a run calls, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Routed {
    pub choice: ModelChoice,
    pub by: RoutedBy,
}

/// What the run asks for: Cursor's name, the run's mode and, for a subagent's run, its type.
#[derive(Debug, Clone, Copy)]
pub struct RouteRequest<'a> {
    pub name: &'a str,
    pub mode: Mode,
    pub subagent: Option<&'a str>,
}

impl Config {
    /// The model for `request`; `None` when the name is neither a configured model, Auto, nor an
    /// alias (the caller answers `not_found` listing the configured models).
    pub fn route(&self, request: RouteRequest<'_>) -> Option<Routed> {
        let name = request.name;
        let auto = name == AUTO_MODEL_ID && self.find_model(AUTO_MODEL_ID).is_none();
        if !auto && let Some(choice) = self.resolve_configured(name) {
            return Some(Routed {
                choice,
                by: RoutedBy::Exact,
            });
        }
        // Auto, or a name a model answers to: a model configured for the mode or subagent wins.
        let aliased = if auto {
            None
        } else {
            Some(self.resolve_alias(name)?)
        };
        let chosen = match request.subagent {
            Some(kind) => self
                .routing
                .subagents
                .get(kind)
                .or_else(|| self.routing.subagents.get("default"))
                .map(|model| (model, RoutedBy::Subagent(kind.to_owned()))),
            None => self
                .routing
                .modes
                .get(&request.mode)
                .map(|model| (model, RoutedBy::Mode(request.mode))),
        };
        if let Some((model, by)) = chosen
            && let Some(choice) = self.resolve_configured(model)
        {
            return Some(Routed { choice, by });
        }
        match aliased {
            Some((choice, pattern)) => Some(Routed {
                choice,
                by: RoutedBy::Alias(pattern),
            }),
            None => Some(Routed {
                choice: self.resolve_configured(&self.default_model)?,
                by: RoutedBy::Auto,
            }),
        }
    }

    /// The model an alias of `name` names: exact aliases before patterns, specific patterns before
    /// loose ones; for each, the name without an effort suffix (which then stays a parameter) and
    /// then the whole name, so `gpt-5*` keeps `-high` of `gpt-5-high` as the effort.
    fn resolve_alias(&self, name: &str) -> Option<(ModelChoice, String)> {
        let stripped = super::EFFORT_SUFFIXES
            .iter()
            .find_map(|(suffix, parameter, value)| {
                let base = name.strip_suffix(suffix)?;
                Some((base, vec![((*parameter).to_owned(), (*value).to_owned())]))
            });
        self.routing.aliases.iter().find_map(|alias| {
            let implied = match &stripped {
                Some((base, implied)) if alias.matches(base) => implied.clone(),
                _ if alias.matches(name) => Vec::new(),
                _ => return None,
            };
            let (provider, model) = self.find_model(&alias.model)?;
            Some((
                ModelChoice {
                    provider,
                    model,
                    implied,
                },
                alias.pattern.clone(),
            ))
        })
    }

    /// The routing table as `check` prints it, one line per rule: aliases and patterns, models
    /// per mode and subagent type, fallback chains, context fallbacks.
    pub fn routing_table(&self) -> Vec<String> {
        let mut lines = Vec::new();
        for alias in &self.routing.aliases {
            let kind = if alias.is_pattern() {
                "pattern"
            } else {
                "alias"
            };
            lines.push(format!("{kind} {:?} → {}", alias.pattern, alias.model));
        }
        lines.push(format!("Auto (default) → {}", self.default_model));
        for (mode, model) in &self.routing.modes {
            lines.push(format!(
                "mode {} (Auto or an alias) → {model}",
                mode.as_str()
            ));
        }
        for (kind, model) in &self.routing.subagents {
            lines.push(format!("subagent {kind} (Auto or an alias) → {model}"));
        }
        for model in self.providers.iter().flat_map(|p| &p.models) {
            if !model.fallbacks.is_empty() {
                lines.push(format!(
                    "fallbacks of {}: {}",
                    model.id,
                    model.fallbacks.join(" → ")
                ));
            }
            if let Some(larger) = &model.context_fallback {
                lines.push(format!(
                    "too large for {}: {larger} (instead of compacting)",
                    model.id
                ));
            }
        }
        lines
    }

    /// The model ids a call on `model` may fall back to, in order (the model's own `fallbacks`).
    pub fn fallbacks_of(&self, model: &str) -> Vec<ModelChoice> {
        let Some((provider, index)) = self.find_model(model) else {
            return Vec::new();
        };
        self.providers[provider].models[index]
            .fallbacks
            .iter()
            .filter_map(|id| self.resolve_configured(id))
            .collect()
    }
}

/// `[modes]` as written: the model each mode runs on when Cursor sends Auto or an aliased name.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FileModes {
    agent: Option<String>,
    ask: Option<String>,
    plan: Option<String>,
    debug: Option<String>,
    multitask: Option<String>,
}

impl FileModes {
    pub(super) fn into_map(self) -> BTreeMap<Mode, String> {
        [
            (Mode::Agent, self.agent),
            (Mode::Ask, self.ask),
            (Mode::Plan, self.plan),
            (Mode::Debug, self.debug),
            (Mode::Multitask, self.multitask),
        ]
        .into_iter()
        .filter_map(|(mode, model)| Some((mode, model?)))
        .collect()
    }
}

/// The routing table checked against the configured models (`config/routing.rs`), and each
/// model's context fallback: a configured model with a larger window.
pub(super) fn validate_file(
    providers: &[super::ProviderConfig],
    modes: FileModes,
    subagents: BTreeMap<String, String>,
    problems: &mut Vec<ConfigError>,
) -> Routing {
    let models: Vec<&super::ModelConfig> = providers.iter().flat_map(|p| &p.models).collect();
    for model in &models {
        let Some(larger) = &model.context_fallback else {
            continue;
        };
        match models.iter().find(|m| &m.id == larger) {
            Some(other) if other.context_window > model.context_window => {}
            Some(other) => problems.push(ConfigError::Routing(format!(
                "model {:?}: context_fallback {larger:?} has a context window of {}, not larger than its own {}",
                model.id, other.context_window, model.context_window
            ))),
            None => problems.push(ConfigError::Routing(format!(
                "model {:?}: context_fallback {larger:?} is not a configured model",
                model.id
            ))),
        }
    }
    let table: Vec<(String, Vec<String>, Vec<String>)> = models
        .iter()
        .map(|m| (m.id.clone(), m.aliases.clone(), m.fallbacks.clone()))
        .collect();
    validate(&table, modes.into_map(), subagents, problems)
}

/// Checks the routing names against the configured models and builds the table: aliases pointing
/// nowhere, an alias two models claim, fallbacks that name an unknown model, the model itself or
/// a cycle, and modes or subagent types naming an unknown model — every problem, at once.
pub(super) fn validate(
    models: &[(String, Vec<String>, Vec<String>)],
    modes: BTreeMap<Mode, String>,
    subagents: BTreeMap<String, String>,
    problems: &mut Vec<ConfigError>,
) -> Routing {
    let known: HashSet<&str> = models.iter().map(|(id, _, _)| id.as_str()).collect();
    let mut claimed: HashMap<&str, &str> = HashMap::new();
    let mut aliases = Vec::new();
    for (id, model_aliases, fallbacks) in models {
        for pattern in model_aliases {
            if pattern.trim().is_empty() {
                problems.push(ConfigError::Routing(format!(
                    "model {id:?}: an alias must not be empty"
                )));
                continue;
            }
            if known.contains(pattern.as_str()) {
                problems.push(ConfigError::Routing(format!(
                    "model {id:?}: alias {pattern:?} is the id of a configured model"
                )));
                continue;
            }
            match claimed.insert(pattern.as_str(), id.as_str()) {
                Some(first) if first != id => problems.push(ConfigError::Routing(format!(
                    "alias {pattern:?} is claimed by two models: {first:?} and {id:?}"
                ))),
                _ => aliases.push(Alias {
                    pattern: pattern.clone(),
                    model: id.clone(),
                }),
            }
        }
        for fallback in fallbacks {
            if fallback == id {
                problems.push(ConfigError::Routing(format!(
                    "model {id:?}: falls back to itself"
                )));
            } else if !known.contains(fallback.as_str()) {
                problems.push(ConfigError::Routing(format!(
                    "model {id:?}: fallback {fallback:?} is not a configured model"
                )));
            }
        }
    }
    find_cycles(models, problems);
    let mut check = |owner: String, model: &String| {
        if !known.contains(model.as_str()) {
            problems.push(ConfigError::Routing(format!(
                "{owner} names {model:?}, which is not a configured model"
            )));
        }
    };
    for (mode, model) in &modes {
        check(format!("[modes] {}", mode.as_str()), model);
    }
    for (kind, model) in &subagents {
        check(format!("[subagents] {kind}"), model);
    }
    // Exact names first, then patterns from the most specific; config order breaks ties.
    aliases.sort_by_key(|alias| (alias.is_pattern(), std::cmp::Reverse(alias.specificity())));
    Routing {
        aliases,
        modes,
        subagents,
    }
}

/// A fallback chain that comes back to where it started (a → b → a) is refused: a failing call
/// would go round it.
fn find_cycles(models: &[(String, Vec<String>, Vec<String>)], problems: &mut Vec<ConfigError>) {
    let edges: HashMap<&str, &[String]> = models
        .iter()
        .map(|(id, _, fallbacks)| (id.as_str(), fallbacks.as_slice()))
        .collect();
    let mut reported = HashSet::new();
    for (start, _, _) in models {
        let mut stack: Vec<(&str, Vec<&str>)> = vec![(start.as_str(), vec![start.as_str()])];
        while let Some((at, path)) = stack.pop() {
            for next in edges.get(at).copied().unwrap_or_default() {
                if next == start && path.len() > 1 {
                    let mut cycle: Vec<&str> = path.clone();
                    cycle.sort_unstable();
                    if reported.insert(cycle) {
                        problems.push(ConfigError::Routing(format!(
                            "fallbacks form a cycle: {} → {start}",
                            path.join(" → ")
                        )));
                    }
                } else if !path.contains(&next.as_str()) && next != start {
                    let mut longer = path.clone();
                    longer.push(next);
                    stack.push((next, longer));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stars_match_any_run_of_characters() {
        assert!(glob_match("composer-*", "composer-1"));
        assert!(glob_match("composer-*", "composer-"));
        assert!(!glob_match("composer-*", "compose"));
        assert!(glob_match("claude-*-sonnet*", "claude-4.5-sonnet-thinking"));
        assert!(!glob_match("claude-*-sonnet*", "claude-4.5-opus"));
        assert!(glob_match("*", "anything"));
        assert!(glob_match("a*b*c", "a-b-c"));
        assert!(!glob_match("a*b*c", "a-c-b"));
        assert!(!glob_match("ab*ba", "aba"), "the ends may not overlap");
    }

    fn model(id: &str, aliases: &[&str], fallbacks: &[&str]) -> (String, Vec<String>, Vec<String>) {
        let owned = |list: &[&str]| list.iter().map(|s| (*s).to_owned()).collect();
        (id.to_owned(), owned(aliases), owned(fallbacks))
    }

    #[test]
    fn bad_routing_is_reported_all_at_once() {
        let mut problems = Vec::new();
        let models = [
            model("big", &["composer-*", "gpt-5"], &["small", "big"]),
            model("small", &["gpt-5"], &["mid"]),
            model("mid", &["big"], &["big"]),
        ];
        let mut modes = BTreeMap::new();
        modes.insert(Mode::Plan, "nowhere".to_owned());
        let mut subagents = BTreeMap::new();
        subagents.insert("explore".to_owned(), "gone".to_owned());
        validate(&models, modes, subagents, &mut problems);
        let text: Vec<String> = problems.iter().map(ToString::to_string).collect();
        let all = text.join("\n");
        for expected in [
            "model \"big\": falls back to itself",
            "alias \"gpt-5\" is claimed by two models: \"big\" and \"small\"",
            "model \"mid\": alias \"big\" is the id of a configured model",
            "fallbacks form a cycle",
            "[modes] plan names \"nowhere\"",
            "[subagents] explore names \"gone\"",
        ] {
            assert!(all.contains(expected), "missing {expected:?} in:\n{all}");
        }
        assert_eq!(
            text.iter().filter(|t| t.contains("cycle")).count(),
            1,
            "one cycle, reported once: {all}"
        );
    }

    #[test]
    fn exact_aliases_come_before_patterns_and_specific_patterns_before_loose_ones() {
        let mut problems = Vec::new();
        let models = [
            model("catch", &["*"], &[]),
            model("composer", &["composer-*"], &[]),
            model("one", &["composer-1"], &[]),
        ];
        let routing = validate(&models, BTreeMap::new(), BTreeMap::new(), &mut problems);
        assert!(problems.is_empty());
        let order: Vec<&str> = routing.aliases.iter().map(|a| a.pattern.as_str()).collect();
        assert_eq!(order, ["composer-1", "composer-*", "*"]);
    }
}
