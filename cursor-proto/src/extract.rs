//! From one JavaScript bundle to a compiled schema.
//!
//! Owns the step from what `js.rs` read ([`crate::js::Bundle`]) to descriptors: packages and nesting from the
//! full names, one `.proto` file per package (well-known types in their usual `google/protobuf/*.proto` files),
//! map entries, oneofs and proto3 `optional`, imports between files, conflicts between two classes that claim
//! one name. The result is printed ([`crate::printer`]) and compiled back with protox, so what is returned is
//! exactly what `protoc` makes of the written files.
//!
//! Before printing, `extract/sound.rs` leaves out (and reports) whatever `protoc` would refuse, so one bad field
//! costs that field, not the schema.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use prost_types::field_descriptor_proto::{Label, Type};
use prost_types::{
    DescriptorProto, EnumDescriptorProto, EnumOptions, EnumValueDescriptorProto,
    FieldDescriptorProto, FieldOptions, FileDescriptorProto, FileDescriptorSet, MessageOptions,
    MethodDescriptorProto, MethodOptions, OneofDescriptorProto, ServiceDescriptorProto,
    field_options::JsType, method_options::IdempotencyLevel,
};

use crate::js::{self, FieldKind, MapValue, MethodKind, Problem, ReadFailure, Syntax};

mod merge;
mod sound;

use merge::Input;
pub use merge::{Source, Superseded, extract_file, extract_files};

/// Why a bundle gave no schema. Every variant names the file.
#[derive(Debug, thiserror::Error)]
pub enum ExtractError {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not a text file (not UTF-8 at byte {offset}), so not a JavaScript bundle")]
    NotText { path: PathBuf, offset: usize },
    #[error("{path} is empty, not a JavaScript bundle")]
    Empty { path: PathBuf },
    #[error(
        "{path} is not JavaScript that parses (line {line}, column {column}: {message}){}",
        ends_early(*.cut_short)
    )]
    NotJavaScript {
        path: PathBuf,
        line: usize,
        column: usize,
        message: String,
        /// The parser stopped at the end of the text, or the text ends inside a bracket, string or comment:
        /// the file is likely cut short.
        cut_short: bool,
    },
    #[error(
        "{path} nests deeper than {limit} levels (line {line}, column {column}); refused before parsing, as \
         no generated bundle does that"
    )]
    TooDeep {
        path: PathBuf,
        line: usize,
        column: usize,
        limit: usize,
    },
    #[error(
        "{path} holds no protobuf-es message classes (no `typeName` with `fields`): not a Cursor bundle with the protocol"
    )]
    NoProtobuf { path: PathBuf },
    #[error("{path}: two classes claim {type_name} with different definitions ({detail})")]
    Conflict {
        path: PathBuf,
        type_name: String,
        detail: String,
    },
    #[error(
        "{path}: the extracted schema does not compile ({message}); this is an extractor bug, please report it with the bundle's Cursor version"
    )]
    Compile { path: PathBuf, message: String },
    #[error(
        "{path}: the extractor failed ({message}); this is an extractor bug, please report it with the bundle's Cursor version"
    )]
    Internal { path: PathBuf, message: String },
    #[error("{path}: {source}")]
    Print {
        path: PathBuf,
        source: crate::printer::PrintError,
    },
}

fn ends_early(cut_short: bool) -> &'static str {
    if cut_short {
        "; the text ends inside an unclosed bracket, string or comment: is the file truncated?"
    } else {
        ""
    }
}

/// A compiled schema and what was noticed while reading it.
#[derive(Debug, Clone)]
pub struct Extraction {
    /// The compiled descriptors of every written file (well-known types included).
    pub descriptors: FileDescriptorSet,
    /// `(file name, .proto text)` for every file, ready for [`crate::write::write_schema`].
    pub files: Vec<(String, String)>,
    /// Message, enum and service counts per package.
    pub counts: BTreeMap<String, Counts>,
    /// Fields and methods that were left out, each with its reason.
    pub unresolved: Vec<Unresolved>,
    /// Identical copies of one class met more than once (real installs bundle some classes twice).
    pub duplicates: usize,
    /// Every file read, in order, with what it gave.
    pub sources: Vec<Source>,
    /// Types two files define differently: the newest file's copy was used.
    pub superseded: Vec<Superseded>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    pub messages: usize,
    pub enums: usize,
    pub services: usize,
    pub fields: usize,
}

/// A field or method the extractor could not read; the rest of the schema does not depend on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unresolved {
    pub type_name: String,
    pub member: String,
    pub reason: String,
}

impl std::fmt::Display for Unresolved {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.member.is_empty() {
            write!(f, "{}: {}", self.type_name, self.reason)
        } else {
            write!(f, "{}.{}: {}", self.type_name, self.member, self.reason)
        }
    }
}

/// Extracts the schema from a bundle's text; `path` only names it in errors.
pub fn extract_source(path: &Path, source: &str) -> Result<Extraction, ExtractError> {
    extract_inputs(vec![Input {
        path: path.to_owned(),
        text: source.to_owned(),
        modified: None,
    }])
}

/// A reader's failure as an error naming the file.
fn read_failure(path: &Path, failure: ReadFailure) -> ExtractError {
    match failure {
        ReadFailure::Syntax {
            line,
            column,
            message,
            cut_short,
        } => ExtractError::NotJavaScript {
            path: path.to_owned(),
            line,
            column,
            message,
            cut_short,
        },
        ReadFailure::TooDeep {
            line,
            column,
            limit,
        } => ExtractError::TooDeep {
            path: path.to_owned(),
            line,
            column,
            limit,
        },
        ReadFailure::Internal(message) => ExtractError::Internal {
            path: path.to_owned(),
            message,
        },
    }
}

fn extract_inputs(inputs: Vec<Input>) -> Result<Extraction, ExtractError> {
    let Some(first) = inputs.first() else {
        return Err(ExtractError::Internal {
            path: PathBuf::new(),
            message: "no file to read".to_owned(),
        });
    };
    let path = first.path.clone();
    for input in &inputs {
        if input.text.trim().is_empty() {
            return Err(ExtractError::Empty {
                path: input.path.clone(),
            });
        }
    }
    let bundle = merge::read_all(&inputs)?;
    if bundle.messages.is_empty() {
        return Err(ExtractError::NoProtobuf { path });
    }
    let mut sources: Vec<Source> = inputs
        .iter()
        .map(|input| Source {
            path: input.path.clone(),
            ..Source::default()
        })
        .collect();
    let sites = bundle
        .messages
        .iter()
        .map(|m| m.site)
        .chain(bundle.enums.iter().map(|e| e.site))
        .chain(bundle.services.iter().map(|s| s.site));
    for site in sites {
        if let Some(source) = sources.get_mut(site.file) {
            if site.v2 {
                source.v2_types += 1;
            } else {
                source.v1_types += 1;
            }
        }
    }
    let modified: Vec<Option<std::time::SystemTime>> =
        inputs.iter().map(|input| input.modified).collect();
    let (mut schema, duplicates, replaced) =
        Schema::from_bundle(bundle, &modified).map_err(|conflict| ExtractError::Conflict {
            path: inputs[conflict.file].path.clone(),
            type_name: conflict.type_name,
            detail: conflict.detail,
        })?;
    let superseded = replaced
        .into_iter()
        .map(|r| Superseded {
            type_name: r.type_name,
            used: inputs[r.used].path.clone(),
            dropped: inputs[r.dropped].path.clone(),
            detail: r.detail,
        })
        .collect();
    schema.make_sound();
    let used = schema
        .messages
        .values()
        .map(|m| m.site.file)
        .chain(schema.enums.values().map(|e| e.site.file))
        .chain(schema.services.values().map(|s| s.site.file));
    for file in used {
        if let Some(source) = sources.get_mut(file) {
            source.used += 1;
        }
    }
    let rough = schema.descriptors();
    let files = crate::printer::render_set(&rough).map_err(|source| ExtractError::Print {
        path: path.clone(),
        source,
    })?;
    let descriptors = compile(&files).map_err(|message| ExtractError::Compile {
        path: path.clone(),
        message,
    })?;
    let counts = schema.counts();
    // Identical copies of a class report the same problem once.
    let mut seen = BTreeSet::new();
    let unresolved = schema
        .problems
        .into_iter()
        .filter(|p| seen.insert((p.owner.clone(), p.member.clone(), p.reason.clone())))
        .map(|p| Unresolved {
            type_name: p.owner,
            member: p.member,
            reason: p.reason,
        })
        .collect();
    Ok(Extraction {
        descriptors,
        files,
        counts,
        unresolved,
        duplicates,
        sources,
        superseded,
    })
}

/// Compiles `.proto` texts held in memory (with the well-known types protox carries).
pub fn compile(files: &[(String, String)]) -> Result<FileDescriptorSet, String> {
    let resolver = MemoryResolver {
        files: files.iter().cloned().collect(),
    };
    let mut chain = protox::file::ChainFileResolver::new();
    chain.add(resolver);
    chain.add(protox::file::GoogleFileResolver::new());
    let mut compiler = protox::Compiler::with_file_resolver(chain);
    compiler.include_imports(true);
    let names: Vec<&str> = files.iter().map(|(name, _)| name.as_str()).collect();
    compiler.open_files(names).map_err(|e| e.to_string())?;
    Ok(compiler.file_descriptor_set())
}

struct MemoryResolver {
    files: HashMap<String, String>,
}

impl protox::file::FileResolver for MemoryResolver {
    fn open_file(&self, name: &str) -> Result<protox::file::File, protox::Error> {
        match self.files.get(name) {
            Some(source) => protox::file::File::from_source(name, source),
            None => Err(protox::Error::file_not_found(name)),
        }
    }
}

/// The bundle's declarations, deduplicated, keyed by full name.
struct Schema {
    messages: BTreeMap<String, js::RawMessage>,
    enums: BTreeMap<String, js::RawEnum>,
    services: BTreeMap<String, js::RawService>,
    problems: Vec<Problem>,
}

impl Schema {
    fn is_message(&self, name: &str) -> bool {
        self.messages.contains_key(name)
    }

    /// The package of a full name: what is left once every enclosing message is taken off.
    fn package_of(&self, full_name: &str) -> String {
        let segments: Vec<&str> = full_name.split('.').collect();
        for k in 1..segments.len() {
            let prefix = segments[..k].join(".");
            if self.is_message(&prefix) {
                return segments[..k - 1].join(".");
            }
        }
        // No enclosing message: the package is everything before the last segment.
        segments[..segments.len() - 1].join(".")
    }

    /// The enclosing message of a nested type, if any.
    fn parent_of(&self, full_name: &str) -> Option<String> {
        let (parent, _) = full_name.rsplit_once('.')?;
        self.is_message(parent).then(|| parent.to_owned())
    }

    /// One file per package and syntax, so any valid mix of proto2 and proto3 compiles (a proto2 default value
    /// or required field never lands in a proto3 file). The well-known types keep their usual files; a type
    /// whose syntax is not its well-known file's (`descriptor.proto` is proto2, the others proto3) goes into
    /// a sibling file named by its syntax.
    fn file_of(&self, full_name: &str, syntax: Syntax) -> String {
        let package = self.package_of(full_name);
        if package == "google.protobuf" {
            let top = full_name
                .trim_start_matches("google.protobuf.")
                .split('.')
                .next()
                .unwrap_or_default();
            let base = well_known_file(top);
            let natural = if base == "descriptor" {
                Syntax::Proto2
            } else {
                Syntax::Proto3
            };
            return match (syntax == natural, syntax) {
                (true, _) => format!("google/protobuf/{base}.proto"),
                (false, Syntax::Proto2) => format!("google/protobuf/{base}_proto2.proto"),
                (false, Syntax::Proto3) => format!("google/protobuf/{base}_proto3.proto"),
            };
        }
        let base = package.replace('.', "_");
        match syntax {
            Syntax::Proto3 => format!("{base}.proto"),
            Syntax::Proto2 => format!("{base}_proto2.proto"),
        }
    }

    /// The syntax a type's file has: its own for a message, its top-level message's for nested types. A
    /// top-level enum has its file's syntax when that is known (v2, or a v1 runtime that says); otherwise it
    /// is proto3 (usable from both syntaxes) unless its first value is not zero, which only proto2 allows.
    /// Services are proto3.
    fn syntax_of(&self, full_name: &str) -> Syntax {
        let mut name = full_name.to_owned();
        let mut found = self.messages.get(&name).map(|m| m.syntax);
        while let Some(parent) = self.parent_of(&name) {
            found = self.messages.get(&parent).map(|m| m.syntax).or(found);
            name = parent;
        }
        found
            .or_else(|| {
                let value = self.enums.get(full_name)?;
                value.syntax.or_else(|| {
                    let open = value.values.first().is_none_or(|(number, _)| *number == 0);
                    (!open).then_some(Syntax::Proto2)
                })
            })
            .unwrap_or(Syntax::Proto3)
    }

    fn counts(&self) -> BTreeMap<String, Counts> {
        let mut counts: BTreeMap<String, Counts> = BTreeMap::new();
        for (name, message) in &self.messages {
            let entry = counts.entry(self.package_of(name)).or_default();
            entry.messages += 1;
            entry.fields += message.fields.len();
        }
        for name in self.enums.keys() {
            counts.entry(self.package_of(name)).or_default().enums += 1;
        }
        for name in self.services.keys() {
            counts.entry(self.package_of(name)).or_default().services += 1;
        }
        counts
    }

    /// Rough descriptors (not yet compiled): enough for the printer.
    fn descriptors(&self) -> FileDescriptorSet {
        let mut built: BTreeMap<String, DescriptorProto> = BTreeMap::new();
        for (name, message) in &self.messages {
            built.insert(name.clone(), self.message_descriptor(message));
        }
        let mut files: BTreeMap<String, FileDescriptorProto> = BTreeMap::new();
        let mut deps: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        // Enums go into their parent message (before it is moved into its own parent) or their file.
        let mut top_enums: Vec<(String, EnumDescriptorProto)> = Vec::new();
        for (name, value) in &self.enums {
            let descriptor = enum_descriptor(name, value);
            match self.parent_of(name) {
                Some(parent) => {
                    if let Some(parent) = built.get_mut(&parent) {
                        parent.enum_type.push(descriptor);
                    }
                }
                None => top_enums.push((self.file_entry(&mut files, name), descriptor)),
            }
        }
        // Nested messages are moved into their parents, deepest first.
        let mut names: Vec<String> = built.keys().cloned().collect();
        names.sort_by_key(|n| std::cmp::Reverse(n.matches('.').count()));
        for name in names {
            if let Some(parent) = self.parent_of(&name)
                && let Some(descriptor) = built.remove(&name)
                && let Some(parent) = built.get_mut(&parent)
            {
                parent.nested_type.push(descriptor);
                parent.nested_type.sort_by(|a, b| a.name.cmp(&b.name));
            }
        }
        for (name, descriptor) in built {
            let file = self.file_entry(&mut files, &name);
            collect_type_refs(&descriptor, &mut |type_name| {
                deps.entry(file.clone())
                    .or_default()
                    .insert(type_name.to_owned());
            });
            if let Some(f) = files.get_mut(&file) {
                f.message_type.push(descriptor);
            }
        }
        for (file, descriptor) in top_enums {
            if let Some(f) = files.get_mut(&file) {
                f.enum_type.push(descriptor);
            }
        }
        for (name, service) in &self.services {
            let file = self.file_entry(&mut files, name);
            let descriptor = service_descriptor(name, service);
            for method in &descriptor.method {
                let d = deps.entry(file.clone()).or_default();
                d.insert(method.input_type().to_owned());
                d.insert(method.output_type().to_owned());
            }
            if let Some(f) = files.get_mut(&file) {
                f.service.push(descriptor);
            }
        }
        for (file, type_names) in deps {
            let mut imports = BTreeSet::new();
            for type_name in type_names {
                let full = type_name.trim_start_matches('.');
                let target = self.file_of(full, self.syntax_of(full));
                if target != file {
                    imports.insert(target);
                }
            }
            if let Some(f) = files.get_mut(&file) {
                f.dependency = imports.into_iter().collect();
            }
        }
        FileDescriptorSet {
            file: files.into_values().collect(),
        }
    }

    /// The file a top-level type goes into, created on first use.
    fn file_entry(&self, files: &mut BTreeMap<String, FileDescriptorProto>, name: &str) -> String {
        let syntax = self.syntax_of(name);
        let file_name = self.file_of(name, syntax);
        files
            .entry(file_name.clone())
            .or_insert_with(|| FileDescriptorProto {
                name: Some(file_name.clone()),
                package: Some(self.package_of(name)),
                syntax: Some(
                    match syntax {
                        Syntax::Proto3 => "proto3",
                        Syntax::Proto2 => "proto2",
                    }
                    .to_owned(),
                ),
                ..Default::default()
            });
        file_name
    }

    fn message_descriptor(&self, message: &js::RawMessage) -> DescriptorProto {
        let short = short_name(&message.full_name);
        let mut descriptor = DescriptorProto {
            name: Some(short.to_owned()),
            ..Default::default()
        };
        let mut oneofs: Vec<String> = Vec::new();
        for field in &message.fields {
            if let Some(oneof) = &field.oneof
                && !oneofs.contains(oneof)
            {
                oneofs.push(oneof.clone());
            }
        }
        let mut synthetic: Vec<String> = Vec::new();
        let mut fields = Vec::new();
        for field in &message.fields {
            let mut out = FieldDescriptorProto {
                name: Some(field.name.clone()),
                number: Some(field.number),
                json_name: field.json_name.clone(),
                default_value: field.default.clone(),
                ..Default::default()
            };
            let label = if field.repeated {
                Label::Repeated
            } else if field.required {
                Label::Required
            } else {
                Label::Optional
            };
            out.set_label(label);
            match &field.kind {
                FieldKind::Scalar(t) => out.r#type = Some(*t),
                FieldKind::Message(name) => {
                    out.set_type(if field.delimited && message.syntax == Syntax::Proto2 {
                        Type::Group
                    } else {
                        Type::Message
                    });
                    out.type_name = Some(format!(".{name}"));
                }
                FieldKind::Enum(name) => {
                    out.set_type(Type::Enum);
                    out.type_name = Some(format!(".{name}"));
                }
                FieldKind::Map { key, value } => {
                    let entry = map_entry_name(&field.name);
                    descriptor.nested_type.push(map_entry(&entry, *key, value));
                    out.set_label(Label::Repeated);
                    out.set_type(Type::Message);
                    out.type_name = Some(format!(".{}.{entry}", message.full_name));
                }
            }
            let mut options = FieldOptions::default();
            let mut has_options = false;
            if let Some(packed) = field.packed {
                let default_packed = message.syntax == Syntax::Proto3;
                if packed != default_packed {
                    options.packed = Some(packed);
                    has_options = true;
                }
            }
            if field.js_string {
                options.set_jstype(JsType::JsString);
                has_options = true;
            }
            if has_options {
                out.options = Some(options);
            }
            if let Some(oneof) = &field.oneof {
                out.oneof_index = oneofs.iter().position(|o| o == oneof).map(|i| i as i32);
            } else if field.optional && message.syntax == Syntax::Proto3 && !field.repeated {
                out.proto3_optional = Some(true);
                synthetic.push(format!("_{}", field.name));
                out.oneof_index = Some((oneofs.len() + synthetic.len() - 1) as i32);
            }
            fields.push(out);
        }
        descriptor.field = fields;
        descriptor.oneof_decl = oneofs
            .into_iter()
            .chain(synthetic)
            .map(|name| OneofDescriptorProto {
                name: Some(name),
                options: None,
            })
            .collect();
        descriptor
    }
}

/// The members in a canonical order, to compare two copies whatever their declaration order.
fn sorted<T: Clone, K: Ord>(items: &[T], key: impl Fn(&T) -> K) -> Vec<T> {
    let mut items = items.to_vec();
    items.sort_by_key(|item| key(item));
    items
}

/// Which members two conflicting copies disagree on: those only one has (by `show`), or, when both have the
/// same ones, the first whose details differ.
fn describe_difference<T: PartialEq>(
    a: &[T],
    b: &[T],
    show: impl Fn(&T) -> String,
    noun: &str,
) -> String {
    let set = |items: &[T]| -> BTreeSet<String> { items.iter().map(&show).collect() };
    let (sa, sb) = (set(a), set(b));
    let only_a: Vec<&String> = sa.difference(&sb).collect();
    let only_b: Vec<&String> = sb.difference(&sa).collect();
    if !only_a.is_empty() || !only_b.is_empty() {
        return format!("only in the first: {only_a:?}; only in the second: {only_b:?}");
    }
    match a.iter().find(|x| !b.contains(x)) {
        Some(x) => format!("{noun} {} differs in type, label or options", show(x)),
        None => format!("the same {noun}s, some of them repeated"),
    }
}

fn short_name(full_name: &str) -> &str {
    full_name.rsplit('.').next().unwrap_or(full_name)
}

/// protoc's name for a map field's entry type: the field name in CamelCase plus `Entry`.
fn map_entry_name(field: &str) -> String {
    let mut out = String::new();
    let mut upper = true;
    for c in field.chars() {
        if c == '_' {
            upper = true;
        } else if upper {
            out.extend(c.to_uppercase());
            upper = false;
        } else {
            out.push(c);
        }
    }
    out.push_str("Entry");
    out
}

fn map_entry(name: &str, key: i32, value: &MapValue) -> DescriptorProto {
    let mut key_field = FieldDescriptorProto {
        name: Some("key".to_owned()),
        number: Some(1),
        r#type: Some(key),
        ..Default::default()
    };
    key_field.set_label(Label::Optional);
    let mut value_field = FieldDescriptorProto {
        name: Some("value".to_owned()),
        number: Some(2),
        ..Default::default()
    };
    value_field.set_label(Label::Optional);
    match value {
        MapValue::Scalar(t) => value_field.r#type = Some(*t),
        MapValue::Message(name) => {
            value_field.set_type(Type::Message);
            value_field.type_name = Some(format!(".{name}"));
        }
        MapValue::Enum(name) => {
            value_field.set_type(Type::Enum);
            value_field.type_name = Some(format!(".{name}"));
        }
    }
    DescriptorProto {
        name: Some(name.to_owned()),
        field: vec![key_field, value_field],
        options: Some(MessageOptions {
            map_entry: Some(true),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn enum_descriptor(full_name: &str, value: &js::RawEnum) -> EnumDescriptorProto {
    let mut numbers = BTreeSet::new();
    let aliased = value.values.iter().any(|(n, _)| !numbers.insert(*n));
    EnumDescriptorProto {
        name: Some(short_name(full_name).to_owned()),
        value: value
            .values
            .iter()
            .map(|(number, name)| EnumValueDescriptorProto {
                name: Some(name.clone()),
                number: Some(*number),
                options: None,
            })
            .collect(),
        options: aliased.then(|| EnumOptions {
            allow_alias: Some(true),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn service_descriptor(full_name: &str, service: &js::RawService) -> ServiceDescriptorProto {
    ServiceDescriptorProto {
        name: Some(short_name(full_name).to_owned()),
        method: service
            .methods
            .iter()
            .map(|method| MethodDescriptorProto {
                name: Some(method.name.clone()),
                input_type: Some(format!(".{}", method.input)),
                output_type: Some(format!(".{}", method.output)),
                client_streaming: Some(matches!(
                    method.kind,
                    MethodKind::ClientStreaming | MethodKind::BiDiStreaming
                )),
                server_streaming: Some(matches!(
                    method.kind,
                    MethodKind::ServerStreaming | MethodKind::BiDiStreaming
                )),
                options: method.idempotency.map(|level| {
                    let mut options = MethodOptions::default();
                    options.set_idempotency_level(match level {
                        js::Idempotency::NoSideEffects => IdempotencyLevel::NoSideEffects,
                        js::Idempotency::Idempotent => IdempotencyLevel::Idempotent,
                    });
                    options
                }),
            })
            .collect(),
        options: None,
    }
}

fn collect_type_refs(descriptor: &DescriptorProto, out: &mut impl FnMut(&str)) {
    for field in &descriptor.field {
        if let Some(type_name) = &field.type_name {
            out(type_name);
        }
    }
    for nested in &descriptor.nested_type {
        collect_type_refs(nested, out);
    }
}

/// The file of a well-known type, as protobuf itself names it.
fn well_known_file(type_name: &str) -> &'static str {
    match type_name {
        "Any" => "any",
        "Api" | "Method" | "Mixin" => "api",
        "Duration" => "duration",
        "Empty" => "empty",
        "FieldMask" => "field_mask",
        "SourceContext" => "source_context",
        "Struct" | "Value" | "ListValue" | "NullValue" => "struct",
        "Timestamp" => "timestamp",
        "Type" | "Field" | "Enum" | "EnumValue" | "Option" | "Syntax" => "type",
        "DoubleValue" | "FloatValue" | "Int64Value" | "UInt64Value" | "Int32Value"
        | "UInt32Value" | "BoolValue" | "StringValue" | "BytesValue" => "wrappers",
        _ => "descriptor",
    }
}
