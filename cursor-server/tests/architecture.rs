//! The structure the user's plan fixes, checked on every test run so `docs/architecture.md` stays
//! true: every source file is listed in the document's tree and every listed file exists; no source
//! file is over 800 lines unless its header says why (`//! Length:`); no function in `run/` or the
//! protocol's folders (`cursor/`, `wire/`, `client/`, `tools/`, `sync/`) is over 80 lines; no two
//! source files import each other, directly or through a chain; imports point down the document's
//! layer table, and `run/` names no protobuf type.
//!
//! Not in the plan's test list: no listed test checks the layout, and the plan says the layout is an
//! acceptance condition, so it is checked where the other acceptance conditions are.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const MAX_FILE_LINES: usize = 800;
const MAX_FN_LINES: usize = 80;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("cursor-server sits in the repository")
        .to_path_buf()
}

/// Source files under `dir` (relative to the repository root) with one of `extensions`.
fn files_under(root: &Path, dir: &str, extensions: &[&str], out: &mut BTreeSet<String>) {
    let Ok(entries) = std::fs::read_dir(root.join(dir)) else {
        return;
    };
    for entry in entries {
        let entry = entry.expect("readable directory entry");
        let name = entry.file_name().to_string_lossy().into_owned();
        let relative = format!("{dir}/{name}");
        if entry.file_type().expect("file type").is_dir() {
            if relative != "cursor-server/tests/golden" {
                files_under(root, &relative, extensions, out);
            }
        } else if extensions.iter().any(|e| name.ends_with(e)) {
            out.insert(relative);
        }
    }
}

fn source_files(root: &Path) -> BTreeSet<String> {
    let mut files = BTreeSet::new();
    for dir in [
        "cursor-server/src",
        "cursor-server/tests",
        "cursor-server/benches",
        "cursor-proto/src",
        "cursor-proto/tests",
        "cursor-proto/benches",
        "cursor-wire/src",
        "cursor-backend/src",
        "cursor-backend/tests",
        "cursor-backend/benches",
    ] {
        files_under(root, dir, &[".rs"], &mut files);
    }
    files_under(root, "cursor-server/migrations", &[".sql"], &mut files);
    files_under(root, "cursor-backend/migrations", &[".sql"], &mut files);
    files.insert("cursor-server/build.rs".to_owned());
    files
}

/// The paths of the document's tree blocks (```text blocks whose first line is `cursor-byok/`),
/// reconstructed from the indentation (four columns a level).
fn documented_paths(document: &str) -> BTreeSet<String> {
    let mut paths = BTreeSet::new();
    let mut in_tree = false;
    let mut stack: Vec<String> = Vec::new();
    for line in document.lines() {
        if line.trim_start().starts_with("```") {
            in_tree = false;
            continue;
        }
        if line.trim() == "cursor-byok/" {
            in_tree = true;
            stack.clear();
            continue;
        }
        if !in_tree || line.trim().is_empty() {
            continue;
        }
        let lead = line
            .chars()
            .take_while(|c| matches!(c, ' ' | '│' | '├' | '└' | '─'))
            .count();
        let depth = lead / 4;
        let name: String = line
            .chars()
            .skip(lead)
            .take_while(|c| !c.is_whitespace())
            .collect();
        stack.truncate(depth.saturating_sub(1));
        let path = stack
            .iter()
            .map(String::as_str)
            .chain([name.trim_end_matches('/')])
            .collect::<Vec<_>>()
            .join("/");
        if name.ends_with('/') {
            stack.push(name.trim_end_matches('/').to_owned());
        }
        paths.insert(path);
    }
    paths
}

#[test]
fn the_architecture_document_lists_every_source_file_and_nothing_that_is_not_there() {
    let root = repo_root();
    let document = std::fs::read_to_string(root.join("docs/architecture.md"))
        .expect("docs/architecture.md exists");
    let listed = documented_paths(&document);
    assert!(
        listed.len() > 50,
        "the tree block was not found: {listed:?}"
    );
    let sources = source_files(&root);
    let missing: Vec<&String> = sources.iter().filter(|f| !listed.contains(*f)).collect();
    assert!(
        missing.is_empty(),
        "source files the document does not list: {missing:?}"
    );
    let absent: Vec<&String> = listed.iter().filter(|p| !root.join(p).exists()).collect();
    assert!(
        absent.is_empty(),
        "the document lists paths that do not exist: {absent:?}"
    );
}

/// The cap is a warning a file's header can answer: a `//! Length:` line in its opening comment
/// says why the file reads better whole than cut to fit.
fn justified_length(path: &std::path::Path) -> bool {
    std::fs::read_to_string(path)
        .expect("readable")
        .lines()
        .take_while(|line| line.starts_with("//!"))
        .any(|line| line.starts_with("//! Length:") && line.len() > "//! Length: ".len() + 20)
}

#[test]
fn no_source_file_is_over_800_lines() {
    let root = repo_root();
    let long: Vec<(String, usize)> = source_files(&root)
        .into_iter()
        .filter(|f| f.contains("/src/") || f.ends_with("build.rs"))
        .map(|f| {
            let lines = std::fs::read_to_string(root.join(&f))
                .expect("readable")
                .lines()
                .count();
            (f, lines)
        })
        .filter(|(_, lines)| *lines > MAX_FILE_LINES)
        .filter(|(f, _)| !justified_length(&root.join(f)))
        .collect();
    assert!(
        long.is_empty(),
        "files over {MAX_FILE_LINES} lines: {long:?}"
    );
}

/// `(name, first line, lines)` of each function in rustfmt-formatted `text`: a function ends at
/// the first later line that is a `}` at the indentation of its `fn`.
fn functions(text: &str) -> Vec<(String, usize, usize)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut found = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let trimmed = line.trim_start();
        let Some(at) = trimmed.find("fn ") else {
            continue;
        };
        let head = &trimmed[..at];
        let is_fn = head.split_whitespace().all(|w| {
            matches!(
                w,
                "pub" | "pub(crate)" | "pub(super)" | "async" | "const" | "unsafe"
            )
        });
        if !is_fn || trimmed.starts_with("//") {
            continue;
        }
        let name: String = trimmed[at + 3..]
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        let indent = &line[..line.len() - trimmed.len()];
        let closing = format!("{indent}}}");
        let mut end = None;
        for (j, later) in lines.iter().enumerate().skip(i) {
            if j == i || !later.starts_with(indent) || later.len() > indent.len() {
                // A declaration without a body ends with `;` before any `{`.
                if later.trim_end().ends_with(';') && !lines[i..=j].iter().any(|l| l.contains('{'))
                {
                    break;
                }
                if *later != closing.as_str() {
                    continue;
                }
            }
            if *later == closing.as_str() {
                end = Some(j);
                break;
            }
        }
        if let Some(end) = end {
            found.push((name, i + 1, end - i + 1));
        }
    }
    found
}

#[test]
fn no_function_in_run_or_cursor_is_over_80_lines() {
    let root = repo_root();
    let mut long = Vec::new();
    for file in source_files(&root) {
        let capped = ["run", "cursor", "wire", "client", "tools", "sync"]
            .iter()
            .any(|dir| file.starts_with(&format!("cursor-server/src/{dir}/")));
        if !capped {
            continue;
        }
        let text = std::fs::read_to_string(root.join(&file)).expect("readable");
        for (name, line, count) in functions(&text) {
            if count > MAX_FN_LINES {
                long.push(format!("{file}:{line} {name} ({count} lines)"));
            }
        }
    }
    assert!(
        long.is_empty(),
        "functions over {MAX_FN_LINES} lines: {long:#?}"
    );
}

#[test]
fn the_function_counter_finds_bodies_and_skips_declarations() {
    let text = "trait T {\n    fn declared(&self);\n    fn with_default(&self) {\n        one();\n    }\n}\n\npub async fn top(\n    a: u8,\n) -> u8 {\n    a\n}\n";
    assert_eq!(
        functions(text),
        [("with_default".to_owned(), 3, 3), ("top".to_owned(), 8, 5)]
    );
}

/// The module path of a source file under `src/` (`tools/read.rs` → `["tools", "read"]`).
fn module_of(relative: &str) -> Vec<String> {
    let stem = relative.trim_end_matches(".rs");
    let mut parts: Vec<String> = stem.split('/').map(str::to_owned).collect();
    if parts.last().is_some_and(|p| p == "mod" || p == "lib") {
        parts.pop();
    }
    parts
}

/// Every path a `use` tree names, flattened (`a::{b, c::{d}}` → `a::b`, `a::c::d`).
fn flatten_use(tree: &str) -> Vec<Vec<String>> {
    fn parse(tokens: &[String], pos: &mut usize, prefix: &[String], out: &mut Vec<Vec<String>>) {
        let mut path = prefix.to_vec();
        while *pos < tokens.len() {
            let token = tokens[*pos].clone();
            *pos += 1;
            match token.as_str() {
                "::" => {}
                "{" => {
                    loop {
                        parse(tokens, pos, &path, out);
                        match tokens.get(*pos).map(String::as_str) {
                            Some(",") => *pos += 1,
                            Some("}") => {
                                *pos += 1;
                                break;
                            }
                            _ => break,
                        }
                    }
                    return;
                }
                "," | "}" => {
                    *pos -= 1;
                    break;
                }
                "as" => *pos += 1,
                "self" if path.len() > prefix.len() || !prefix.is_empty() => {}
                _ => path.push(token),
            }
        }
        out.push(path);
    }
    let mut tokens = Vec::new();
    let mut word = String::new();
    let mut chars = tree.chars().peekable();
    while let Some(c) = chars.next() {
        if c.is_alphanumeric() || c == '_' || c == '*' {
            word.push(c);
            continue;
        }
        if !word.is_empty() {
            tokens.push(std::mem::take(&mut word));
        }
        match c {
            ':' if chars.peek() == Some(&':') => {
                chars.next();
                tokens.push("::".to_owned());
            }
            '{' | '}' | ',' => tokens.push(c.to_string()),
            _ => {}
        }
    }
    if !word.is_empty() {
        tokens.push(word);
    }
    let mut out = Vec::new();
    let mut pos = 0;
    parse(&tokens, &mut pos, &[], &mut out);
    out
}

/// The text of `file` without its `#[cfg(test)]` module (tests may reach anywhere).
fn without_tests(text: &str) -> &str {
    text.find("#[cfg(test)]\nmod tests")
        .map_or(text, |at| &text[..at])
}

/// Paths (`crate::…`, `super::…`, `self::…`) a file names, in its `use` items and inline.
fn named_paths(text: &str) -> Vec<Vec<String>> {
    let mut paths = Vec::new();
    let mut rest = without_tests(text);
    while let Some(at) = rest.find("use ") {
        let before = &rest[..at];
        let starts_item = before.is_empty() || before.ends_with('\n') || before.ends_with(' ');
        let after = &rest[at + 4..];
        let Some(end) = after.find(';') else { break };
        if starts_item && !before.trim_end().ends_with("//") {
            paths.extend(flatten_use(&after[..end]));
        }
        rest = &after[end..];
    }
    for prefix in ["crate::", "super::"] {
        let text = without_tests(text);
        let mut from = 0;
        while let Some(at) = text[from..].find(prefix) {
            let start = from + at;
            let boundary = text[..start]
                .chars()
                .next_back()
                .is_none_or(|c| !(c.is_alphanumeric() || c == '_' || c == ':'));
            let path: String = text[start..]
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':')
                .collect();
            if boundary {
                paths.push(
                    path.split("::")
                        .filter(|s| !s.is_empty())
                        .map(str::to_owned)
                        .collect(),
                );
            }
            from = start + prefix.len();
        }
    }
    paths
}

/// file → files it imports, among the crate's own source files.
fn import_graph(src: &Path, files: &[String]) -> BTreeMap<String, BTreeSet<String>> {
    let modules: BTreeMap<Vec<String>, String> =
        files.iter().map(|f| (module_of(f), f.clone())).collect();
    let mut graph = BTreeMap::new();
    for file in files {
        let here = module_of(file);
        let is_mod_file = file.ends_with("mod.rs") || file == "lib.rs";
        let text = std::fs::read_to_string(src.join(file)).expect("readable");
        let mut targets = BTreeSet::new();
        for path in named_paths(&text) {
            let mut absolute: Vec<String> = match path.first().map(String::as_str) {
                Some("crate") => Vec::new(),
                Some("super") => {
                    let mut base = here.clone();
                    if !is_mod_file {
                        base.pop();
                    }
                    base
                }
                Some("self") => here.clone(),
                _ => continue,
            };
            let mut rest = &path[1..];
            while rest.first().is_some_and(|s| s == "super") {
                absolute.pop();
                rest = &rest[1..];
            }
            absolute.extend(rest.iter().cloned());
            while !absolute.is_empty() && !modules.contains_key(&absolute) {
                absolute.pop();
            }
            if let Some(target) = modules.get(&absolute)
                && target != file
                && !(target.ends_with("mod.rs") || target == "lib.rs")
            {
                targets.insert(target.clone());
            }
        }
        graph.insert(file.clone(), targets);
    }
    graph
}

/// Strongly connected components with more than one file (Tarjan).
fn cycles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct Walk<'a> {
        graph: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        found: Vec<Vec<String>>,
    }
    fn visit<'a>(walk: &mut Walk<'a>, node: &'a str) {
        let n = walk.index.len();
        walk.index.insert(node, n);
        walk.low.insert(node, n);
        walk.stack.push(node);
        walk.on_stack.insert(node);
        for next in walk.graph.get(node).into_iter().flatten() {
            let next = next.as_str();
            if !walk.index.contains_key(next) {
                visit(walk, next);
                let low = walk.low[node].min(walk.low[next]);
                walk.low.insert(node, low);
            } else if walk.on_stack.contains(next) {
                let low = walk.low[node].min(walk.index[next]);
                walk.low.insert(node, low);
            }
        }
        if walk.low[node] == walk.index[node] {
            let mut component = Vec::new();
            while let Some(top) = walk.stack.pop() {
                walk.on_stack.remove(top);
                component.push(top.to_owned());
                if top == node {
                    break;
                }
            }
            if component.len() > 1 {
                component.sort();
                walk.found.push(component);
            }
        }
    }
    let mut walk = Walk {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for node in graph.keys() {
        if !walk.index.contains_key(node.as_str()) {
            visit(&mut walk, node);
        }
    }
    walk.found
}

#[test]
fn no_two_source_files_import_each_other_directly_or_through_a_chain() {
    let src = repo_root().join("cursor-server/src");
    let mut all = BTreeSet::new();
    files_under(&src, ".", &[".rs"], &mut all);
    let files: Vec<String> = all
        .iter()
        .map(|f| f.trim_start_matches("./").to_owned())
        .collect();
    let graph = import_graph(&src, &files);
    let found = cycles(&graph);
    let described: Vec<String> = found
        .iter()
        .map(|component| {
            let edges: Vec<String> = component
                .iter()
                .flat_map(|from| {
                    graph[from]
                        .iter()
                        .filter(|to| component.contains(to))
                        .map(move |to| format!("{from} -> {to}"))
                })
                .collect();
            edges.join(", ")
        })
        .collect();
    assert!(found.is_empty(), "import cycles: {described:#?}");
}

#[test]
fn use_trees_flatten_to_every_path_they_name() {
    assert_eq!(
        flatten_use("super::proto::agent::{self as pb, tool_call::{A, B}}, "),
        [
            vec!["super", "proto", "agent"],
            vec!["super", "proto", "agent", "tool_call", "A"],
            vec!["super", "proto", "agent", "tool_call", "B"],
        ]
    );
}

/// The layer table of `docs/architecture.md` (the table after `<!-- layers:`), top layer first:
/// each layer's name and its entries (paths under `cursor-server/src/`; a folder ends with `/`).
fn layer_table(document: &str) -> Vec<(String, Vec<String>)> {
    let start = document
        .find("<!-- layers:")
        .expect("docs/architecture.md has the layer table");
    document[start..]
        .lines()
        .skip(1)
        .take_while(|line| line.starts_with('|'))
        .skip(2)
        .map(|row| {
            let cells: Vec<&str> = row.split('|').map(str::trim).collect();
            let entries = cells[2]
                .split(',')
                .map(|entry| entry.trim().trim_matches('`').to_owned())
                .filter(|entry| !entry.is_empty())
                .collect();
            (cells[1].to_owned(), entries)
        })
        .collect()
}

/// The index (0 = top) of the layer whose longest entry `file` starts with.
fn layer_of(table: &[(String, Vec<String>)], file: &str) -> Option<usize> {
    table
        .iter()
        .enumerate()
        .flat_map(|(layer, (_, entries))| entries.iter().map(move |entry| (layer, entry)))
        .filter(|(_, entry)| {
            if entry.ends_with('/') {
                file.starts_with(entry.as_str())
            } else {
                file == entry.as_str()
            }
        })
        .max_by_key(|(_, entry)| entry.len())
        .map(|(layer, _)| layer)
}

fn documented_layers() -> Vec<(String, Vec<String>)> {
    let document = std::fs::read_to_string(repo_root().join("docs/architecture.md"))
        .expect("docs/architecture.md exists");
    layer_table(&document)
}

fn server_sources() -> (PathBuf, Vec<String>) {
    let src = repo_root().join("cursor-server/src");
    let mut all = BTreeSet::new();
    files_under(&src, ".", &[".rs"], &mut all);
    let files = all
        .iter()
        .map(|f| f.trim_start_matches("./").to_owned())
        .collect();
    (src, files)
}

#[test]
fn the_layer_table_places_files_by_their_longest_entry() {
    let table = documented_layers();
    let names: Vec<&str> = table.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(
        names,
        ["entry", "routes", "runs", "client", "services", "base"]
    );
    let layer = |file: &str| layer_of(&table, file).map(|i| table[i].0.as_str());
    // `ops/` is routes, but its metrics and drift files are leaves of the base.
    assert_eq!(layer("ops/check.rs"), Some("routes"));
    assert_eq!(layer("ops/metrics.rs"), Some("base"));
    assert_eq!(layer("ops/drift.rs"), Some("base"));
    assert_eq!(layer("cursor/proto.rs"), Some("base"));
    assert_eq!(layer("client/command.rs"), Some("client"));
    assert_eq!(layer("tools/read.rs"), Some("services"));
    assert_eq!(layer("sync/checkpoint.rs"), Some("services"));
    assert_eq!(layer("wire/handlers.rs"), Some("routes"));
    assert_eq!(layer("run/lifecycle.rs"), Some("runs"));
    // An entry naming a file matches that file only, not a longer name beginning with it.
    assert_eq!(layer("config.rs.orig"), None);
    assert_eq!(layer("config/routing.rs"), Some("base"));
    let (_, files) = server_sources();
    let unplaced: Vec<&String> = files
        .iter()
        .filter(|f| layer_of(&table, f).is_none())
        .collect();
    assert!(
        unplaced.is_empty(),
        "source files no entry of the layer table places: {unplaced:?}"
    );
}

#[test]
fn imports_point_down_the_layers() {
    let table = documented_layers();
    let (src, files) = server_sources();
    let graph = import_graph(&src, &files);
    let mut upward = Vec::new();
    for (from, targets) in &graph {
        let Some(here) = layer_of(&table, from) else {
            continue;
        };
        for to in targets {
            if let Some(there) = layer_of(&table, to)
                && there < here
            {
                upward.push(format!(
                    "{from} ({}) imports {to} ({})",
                    table[here].0, table[there].0
                ));
            }
        }
    }
    assert!(
        upward.is_empty(),
        "imports pointing up the layers: {upward:#?}"
    );
}

#[test]
fn run_imports_no_protobuf_type_and_no_prost() {
    let (src, files) = server_sources();
    let mut found = Vec::new();
    for file in files.iter().filter(|f| f.starts_with("run/")) {
        let text = std::fs::read_to_string(src.join(file)).expect("readable");
        for path in named_paths(&text) {
            if path.windows(2).any(|w| w[0] == "cursor" && w[1] == "proto") {
                found.push(format!("{file}: {}", path.join("::")));
            }
        }
        for (n, line) in without_tests(&text).lines().enumerate() {
            let code = line.split("//").next().unwrap_or_default();
            if code.contains("prost::") || code.contains("use prost") {
                found.push(format!("{file}:{}: {}", n + 1, line.trim()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "run/ names protobuf types or prost: {found:#?}"
    );
}
