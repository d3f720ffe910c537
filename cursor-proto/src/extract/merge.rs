//! Reading a schema that is split across several files: lazy-loaded chunks of one build, several extensions.
//!
//! Owns which files are parsed together and which declaration came from which file. Chunks of one build (the
//! files under one `package.json`, i.e. one extension) reach each other's types through the build's module
//! registry (webpack's `n(804)` finds module 804 in whichever chunk defines it), so they are parsed as one
//! text, each file wrapped in a function of its own so that top-level names of two files never mix. Files of
//! different builds are parsed apart (their module ids would collide). Every declaration is then attributed to
//! its file by offset, for the report and for `Schema::from_bundle`, which settles two different copies of
//! one type: within one file that is an error, across files the newest file's copy wins with a warning. The
//! entry points for files on disk (`extract_file`, `extract_files`) and the per-file report live here too.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use std::collections::BTreeMap;

use super::{
    ExtractError, Extraction, Schema, describe_difference, extract_inputs, read_failure, sorted,
};
use crate::js::{self, Bundle};

/// One file to read.
pub(super) struct Input {
    pub path: PathBuf,
    pub text: String,
    /// When the file was last modified: the newest copy of a type defined differently in two files wins.
    pub modified: Option<SystemTime>,
}

/// Each file is wrapped so that its top-level declarations stay its own.
const OPEN: &str = "(function(){\n";
const CLOSE: &str = "\n})();\n";

/// Reads every input, chunks of one build together, and tags every declaration with its file's index.
pub(super) fn read_all(inputs: &[Input]) -> Result<Bundle, ExtractError> {
    let mut all = Bundle::default();
    for group in builds(inputs) {
        if let [only] = group.as_slice() {
            let bundle = read_one(&inputs[*only])?;
            append(&mut all, bundle, |_| *only);
            continue;
        }
        let mut text = String::new();
        let mut starts = Vec::new();
        for &index in &group {
            text.push_str(OPEN);
            starts.push((text.len() as u32, index));
            text.push_str(&inputs[index].text);
            text.push_str(CLOSE);
        }
        match js::read_bundle(&text) {
            Ok(bundle) => append(&mut all, bundle, |at| {
                let position = starts.partition_point(|(start, _)| *start <= at);
                starts[position.saturating_sub(1)].1
            }),
            // A file that does not parse wrapped (an ES module's top-level `import`) or not at all: each is read
            // alone, so an error names its own file and line.
            Err(_) => {
                for &index in &group {
                    let bundle = read_one(&inputs[index])?;
                    append(&mut all, bundle, |_| index);
                }
            }
        }
    }
    Ok(all)
}

fn read_one(input: &Input) -> Result<Bundle, ExtractError> {
    js::read_bundle(&input.text).map_err(|failure| read_failure(&input.path, failure))
}

/// Moves `bundle` into `all`, setting each declaration's file from its offset.
fn append(all: &mut Bundle, bundle: Bundle, file_at: impl Fn(u32) -> usize) {
    for mut message in bundle.messages {
        message.site.file = file_at(message.site.at);
        all.messages.push(message);
    }
    for mut value in bundle.enums {
        value.site.file = file_at(value.site.at);
        all.enums.push(value);
    }
    for mut service in bundle.services {
        service.site.file = file_at(service.site.at);
        all.services.push(service);
    }
    all.problems.extend(bundle.problems);
    all.v2_files.extend(bundle.v2_files);
}

/// Indexes of the inputs grouped by build (nearest `package.json` above, else the directory), in the order
/// the first file of each build was given.
fn builds(inputs: &[Input]) -> Vec<Vec<usize>> {
    let mut groups: Vec<(PathBuf, Vec<usize>)> = Vec::new();
    for (index, input) in inputs.iter().enumerate() {
        let root = build_root(&input.path);
        match groups.iter_mut().find(|(r, _)| *r == root) {
            Some((_, members)) => members.push(index),
            None => groups.push((root, vec![index])),
        }
    }
    groups.into_iter().map(|(_, members)| members).collect()
}

fn build_root(path: &Path) -> PathBuf {
    let parent = path.parent().unwrap_or(Path::new(""));
    parent
        .ancestors()
        .find(|dir| dir.join("package.json").is_file())
        .unwrap_or(parent)
        .to_owned()
}

/// What one file gave.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Source {
    pub path: PathBuf,
    /// Messages, enums and services read from protobuf-es v1 classes.
    pub v1_types: usize,
    /// Messages, enums and services read from protobuf-es v2 embedded descriptors.
    pub v2_types: usize,
    /// Types of the schema taken from this file (a type defined in several files counts for the one used).
    pub used: usize,
}

/// A type two files define differently; the copy of the file modified last is used (on a tie, the one read
/// first: the agent extension's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Superseded {
    pub type_name: String,
    pub used: PathBuf,
    pub dropped: PathBuf,
    pub detail: String,
}

impl std::fmt::Display for Superseded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: {} and {} define it differently ({}); the copy in {} (the newest) is used",
            self.type_name,
            self.used.display(),
            self.dropped.display(),
            self.detail,
            self.used.display()
        )
    }
}

/// Extracts the schema from one bundle on disk.
pub fn extract_file(path: &Path) -> Result<Extraction, ExtractError> {
    extract_files(&[path.to_owned()])
}

/// Extracts one schema from several bundles (chunks of one build, several extensions), the agent
/// extension's first: see `extract/merge.rs` for how they are read together and merged.
pub fn extract_files(paths: &[PathBuf]) -> Result<Extraction, ExtractError> {
    let mut inputs = Vec::new();
    for path in paths {
        let read_error = |source| ExtractError::Read {
            path: path.to_owned(),
            source,
        };
        let bytes = std::fs::read(path).map_err(read_error)?;
        let modified = std::fs::metadata(path).and_then(|m| m.modified()).ok();
        let text = String::from_utf8(bytes).map_err(|e| ExtractError::NotText {
            path: path.to_owned(),
            offset: e.utf8_error().valid_up_to(),
        })?;
        inputs.push(Input {
            path: path.to_owned(),
            text,
            modified,
        });
    }
    extract_inputs(inputs)
}

/// Two different copies of one type in one file: an error.
pub(super) struct Conflict {
    pub type_name: String,
    pub detail: String,
    pub file: usize,
}

/// Two different copies of one type in two files: the newest file's is used.
pub(super) struct Replaced {
    pub type_name: String,
    pub detail: String,
    pub used: usize,
    pub dropped: usize,
}

/// The declarations of a type, whatever its kind, say where they were read.
trait Sited {
    fn site(&self) -> js::Site;
}

impl Sited for js::RawMessage {
    fn site(&self) -> js::Site {
        self.site
    }
}

impl Sited for js::RawEnum {
    fn site(&self) -> js::Site {
        self.site
    }
}

impl Sited for js::RawService {
    fn site(&self) -> js::Site {
        self.site
    }
}

/// How copies of one name are settled: which file is newer, and what was replaced.
struct Settle<'m> {
    modified: &'m [Option<std::time::SystemTime>],
    duplicates: usize,
    replaced: Vec<Replaced>,
}

impl Settle<'_> {
    /// Whether file `a` was modified after file `b` (unknown times never win).
    fn newer(&self, a: usize, b: usize) -> bool {
        let time = |i: usize| self.modified.get(i).copied().flatten();
        matches!((time(a), time(b)), (Some(a), Some(b)) if a > b)
    }

    /// Adds `value` under `name`. A copy that is the `same` (identical, declaration order aside) counts as a
    /// duplicate; a different one in the same file is a conflict (described by `describe`); in another file
    /// the newer file's copy is kept and the other recorded as replaced.
    fn add<T: Sited>(
        &mut self,
        map: &mut BTreeMap<String, T>,
        name: String,
        value: T,
        same: impl Fn(&T, &T) -> bool,
        describe: impl Fn(&T, &T) -> String,
    ) -> Result<(), Conflict> {
        let Some(existing) = map.get(&name) else {
            map.insert(name, value);
            return Ok(());
        };
        if same(existing, &value) {
            self.duplicates += 1;
            return Ok(());
        }
        let detail = describe(existing, &value);
        let (old, new) = (existing.site().file, value.site().file);
        if old == new {
            return Err(Conflict {
                type_name: name,
                detail,
                file: new,
            });
        }
        if self.newer(new, old) {
            self.replaced.push(Replaced {
                type_name: name.clone(),
                detail,
                used: new,
                dropped: old,
            });
            map.insert(name, value);
        } else {
            self.replaced.push(Replaced {
                type_name: name,
                detail,
                used: old,
                dropped: new,
            });
        }
        Ok(())
    }
}

impl Schema {
    pub(super) fn from_bundle(
        bundle: Bundle,
        modified: &[Option<std::time::SystemTime>],
    ) -> Result<(Self, usize, Vec<Replaced>), Conflict> {
        let mut settle = Settle {
            modified,
            duplicates: 0,
            replaced: Vec::new(),
        };
        let mut messages = BTreeMap::new();
        for message in bundle.messages {
            settle.add(
                &mut messages,
                message.full_name.clone(),
                message,
                |a, b| {
                    a.syntax == b.syntax
                        && sorted(&a.fields, |f| f.number) == sorted(&b.fields, |f| f.number)
                },
                |a, b| {
                    let show = |f: &js::RawField| format!("{} = {}", f.name, f.number);
                    describe_difference(&a.fields, &b.fields, show, "field")
                },
            )?;
        }
        let mut enums = BTreeMap::new();
        for value in bundle.enums {
            settle.add(
                &mut enums,
                value.full_name.clone(),
                value,
                |a, b| sorted(&a.values, |v| v.clone()) == sorted(&b.values, |v| v.clone()),
                |a, b| {
                    let show = |(number, name): &(i32, String)| format!("{name} = {number}");
                    describe_difference(&a.values, &b.values, show, "value")
                },
            )?;
        }
        let mut services = BTreeMap::new();
        for service in bundle.services {
            settle.add(
                &mut services,
                service.full_name.clone(),
                service,
                |a, b| {
                    sorted(&a.methods, |m| m.name.clone()) == sorted(&b.methods, |m| m.name.clone())
                },
                |a, b| {
                    let show =
                        |m: &js::RawMethod| format!("{}({}) → {}", m.name, m.input, m.output);
                    describe_difference(&a.methods, &b.methods, show, "method")
                },
            )?;
        }
        for (name, value) in &enums {
            if messages.contains_key(name) {
                return Err(Conflict {
                    type_name: name.clone(),
                    detail: "declared both as a message and as an enum".to_owned(),
                    file: value.site.file,
                });
            }
        }
        Ok((
            Self {
                messages,
                enums,
                services,
                problems: bundle.problems,
            },
            settle.duplicates,
            settle.replaced,
        ))
    }
}
