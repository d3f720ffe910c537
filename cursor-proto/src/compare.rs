//! compare: names the semantic differences between two schemas, and which of them the server relies on.
//!
//! Owns the comparison model: every message, enum and service is matched by full name whatever file declares
//! it, members (fields, enum values, methods) by name; declaration order, comments and file options are
//! ignored. Map fields compare as `map<K, V>` (their synthetic `*Entry` messages are not messages of their own)
//! and the synthetic oneof of a proto3 `optional` field is not a oneof. Also owns [`reachable`] and
//! [`SERVER_ROOTS`], which decide [`Difference::used_by_server`].

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use prost_types::field_descriptor_proto::{Label, Type};
use prost_types::field_options::JsType;
use prost_types::method_options::IdempotencyLevel;
use prost_types::{
    DescriptorProto, EnumDescriptorProto, FieldDescriptorProto, FileDescriptorSet,
    ServiceDescriptorProto,
};

use crate::printer::{default_json_name, field_type, join, map_entry, real_oneof, scalar_name};

/// The messages the server reads or writes; everything reachable from them matters to it.
pub const SERVER_ROOTS: &[&str] = &[
    "agent.v1.AgentClientMessage",
    "agent.v1.AgentServerMessage",
    "agent.v1.ConversationStateStructure",
    "aiserver.v1.BidiRequestId",
    "aiserver.v1.BidiAppendRequest",
    "aiserver.v1.BidiAppendResponse",
    "aiserver.v1.ErrorDetails",
    "aiserver.v1.AvailableModelsRequest",
    "aiserver.v1.AvailableModelsResponse",
    "aiserver.v1.GetUsableModelsRequest",
    "aiserver.v1.GetUsableModelsResponse",
    "aiserver.v1.GetDefaultModelForCliRequest",
    "aiserver.v1.GetDefaultModelForCliResponse",
    "aiserver.v1.GetMeRequest",
    "aiserver.v1.GetMeResponse",
    "agent.v1.GetUsableModelsRequest",
    "agent.v1.GetUsableModelsResponse",
];

/// What changed. Each field or method aspect has its own kind, so one edit can yield several differences.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DiffKind {
    MessageAdded,
    MessageRemoved,
    EnumAdded,
    EnumRemoved,
    FieldAdded,
    FieldRemoved,
    /// The field number changed.
    FieldRenumbered,
    /// The type changed: scalar, message or enum name, or a map's key or value type.
    FieldRetyped,
    /// The label changed: `implicit` (proto3 singular), `optional` (proto2, proto3 `optional`, oneof member),
    /// `required` or `repeated`.
    FieldLabelChanged,
    /// The field moved into, out of or between real oneofs.
    FieldOneofChanged,
    /// `packed` (proto3 default applied), `jstype`, `default` or `json_name` changed.
    FieldOptionChanged,
    EnumValueAdded,
    EnumValueRemoved,
    EnumValueRenumbered,
    ServiceAdded,
    ServiceRemoved,
    MethodAdded,
    MethodRemoved,
    /// Input or output type, streaming mode or idempotency level changed.
    MethodChanged,
}

impl fmt::Display for DiffKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = match self {
            Self::MessageAdded => "message added",
            Self::MessageRemoved => "message removed",
            Self::EnumAdded => "enum added",
            Self::EnumRemoved => "enum removed",
            Self::FieldAdded => "field added",
            Self::FieldRemoved => "field removed",
            Self::FieldRenumbered => "field renumbered",
            Self::FieldRetyped => "field retyped",
            Self::FieldLabelChanged => "field label changed",
            Self::FieldOneofChanged => "field oneof changed",
            Self::FieldOptionChanged => "field option changed",
            Self::EnumValueAdded => "enum value added",
            Self::EnumValueRemoved => "enum value removed",
            Self::EnumValueRenumbered => "enum value renumbered",
            Self::ServiceAdded => "service added",
            Self::ServiceRemoved => "service removed",
            Self::MethodAdded => "method added",
            Self::MethodRemoved => "method removed",
            Self::MethodChanged => "method changed",
        };
        f.write_str(text)
    }
}

/// One semantic difference between two schemas.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Difference {
    pub kind: DiffKind,
    /// Full name of what changed: `agent.v1.UserMessage.text`, `agent.v1.AgentMode.AGENT_MODE_ASK`,
    /// `aiserver.v1.BidiService.BidiAppend`, `agent.v1.UserMessage`.
    pub path: String,
    /// A sentence for people: `number 3 → 4`, `type string → int32`, `oneof none → kind`.
    pub detail: String,
    /// The changed message or enum (or one containing it, or a method's input/output) is reachable from
    /// [`SERVER_ROOTS`] in either schema.
    pub used_by_server: bool,
}

impl fmt::Display for Difference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {} ({})", self.path, self.kind, self.detail)?;
        if self.used_by_server {
            f.write_str(" [used by server]")?;
        }
        Ok(())
    }
}

/// Every difference from `old` to `new`, sorted by path, then kind, then detail.
pub fn compare(old: &FileDescriptorSet, new: &FileDescriptorSet) -> Vec<Difference> {
    let (old_model, new_model) = (Model::new(old), Model::new(new));
    let mut server = reachable(old, SERVER_ROOTS);
    server.extend(reachable(new, SERVER_ROOTS));
    let mut raw = Vec::new();
    let tables = [
        (&old_model.messages, &new_model.messages, MESSAGE),
        (&old_model.enums, &new_model.enums, ENUM),
        (&old_model.services, &new_model.services, SERVICE),
    ];
    for (old_table, new_table, kinds) in tables {
        diff_table(old_table, new_table, &kinds, &mut raw);
    }
    let mut diffs: Vec<Difference> = raw
        .into_iter()
        .map(|(kind, path, detail)| {
            let mut linked = [&old_model, &new_model]
                .into_iter()
                .filter_map(|m| m.links.get(&path))
                .flatten();
            let used_by_server = prefixes(&path).any(|name| server.contains(name))
                || linked.any(|name| server.contains(name));
            Difference {
                kind,
                path,
                detail,
                used_by_server,
            }
        })
        .collect();
    diffs.sort_by(|a, b| (&a.path, a.kind, &a.detail).cmp(&(&b.path, b.kind, &b.detail)));
    diffs
}

/// Every message and enum full name reachable from `roots` (names without a leading dot; unknown roots are
/// ignored) through field types, map key/value types and nested declarations: a reachable message brings its
/// nested messages and enums with it.
pub fn reachable(set: &FileDescriptorSet, roots: &[&str]) -> BTreeSet<String> {
    let mut edges: BTreeMap<String, Vec<String>> = BTreeMap::new();
    walk(set, &mut |item| match item {
        Item::Message(full, message, _) => {
            let fields = message
                .field
                .iter()
                .filter_map(|f| f.type_name.as_deref())
                .map(type_name);
            let nested = message
                .nested_type
                .iter()
                .map(|n| n.name())
                .chain(message.enum_type.iter().map(|e| e.name()));
            let targets = fields.chain(nested.map(|name| join(&full, name))).collect();
            edges.insert(full, targets);
        }
        Item::Enum(full, _) => {
            edges.insert(full, Vec::new());
        }
        Item::Service(..) => {}
    });
    let mut seen = BTreeSet::new();
    let mut queue: Vec<String> = roots.iter().map(|root| (*root).to_owned()).collect();
    while let Some(name) = queue.pop() {
        if let Some(targets) = edges.get(&name)
            && seen.insert(name)
        {
            queue.extend(targets.iter().filter(|t| !seen.contains(*t)).cloned());
        }
    }
    seen
}

/// Removes the service `full_name` (e.g. `agent.v1.AgentService`) from the schema and returns it. The server
/// declares the agent service itself, so its builds and `schema-check` compare schemas without it.
pub fn take_service(
    set: &mut FileDescriptorSet,
    full_name: &str,
) -> Option<ServiceDescriptorProto> {
    let (package, name) = full_name.rsplit_once('.')?;
    let file = set
        .file
        .iter_mut()
        .find(|f| f.package() == package && f.service.iter().any(|s| s.name() == name))?;
    let index = file.service.iter().position(|s| s.name() == name)?;
    Some(file.service.remove(index))
}

/// One line of counts: `5 differences, 2 used by the server: 1 message added, 4 field renumbered`.
pub fn summary(diffs: &[Difference]) -> String {
    if diffs.is_empty() {
        return "no differences".to_owned();
    }
    let mut counts: BTreeMap<DiffKind, usize> = BTreeMap::new();
    for diff in diffs {
        *counts.entry(diff.kind).or_default() += 1;
    }
    let server = diffs.iter().filter(|d| d.used_by_server).count();
    let counts: Vec<String> = counts
        .iter()
        .map(|(kind, n)| format!("{n} {kind}"))
        .collect();
    let plural = if diffs.len() == 1 { "" } else { "s" };
    format!(
        "{} difference{plural}, {server} used by the server: {}",
        diffs.len(),
        counts.join(", ")
    )
}

/// Named aspects of a field, enum value or method: `(kind reported when it changes, aspect name, value)`.
type Aspects = Vec<(DiffKind, &'static str, String)>;

/// Container full name → member name → aspects.
type Members = BTreeMap<String, BTreeMap<String, Aspects>>;

/// What a table's containers and members are called when they appear or disappear.
struct Kinds {
    noun: &'static str,
    member_noun: &'static str,
    added: DiffKind,
    removed: DiffKind,
    member_added: DiffKind,
    member_removed: DiffKind,
}

const MESSAGE: Kinds = Kinds {
    noun: "message",
    member_noun: "field",
    added: DiffKind::MessageAdded,
    removed: DiffKind::MessageRemoved,
    member_added: DiffKind::FieldAdded,
    member_removed: DiffKind::FieldRemoved,
};
const ENUM: Kinds = Kinds {
    noun: "enum",
    member_noun: "value",
    added: DiffKind::EnumAdded,
    removed: DiffKind::EnumRemoved,
    member_added: DiffKind::EnumValueAdded,
    member_removed: DiffKind::EnumValueRemoved,
};
const SERVICE: Kinds = Kinds {
    noun: "service",
    member_noun: "method",
    added: DiffKind::ServiceAdded,
    removed: DiffKind::ServiceRemoved,
    member_added: DiffKind::MethodAdded,
    member_removed: DiffKind::MethodRemoved,
};

/// A schema flattened to full names.
#[derive(Default)]
struct Model {
    messages: Members,
    enums: Members,
    services: Members,
    /// Service and method full names → the message types their methods take or return.
    links: BTreeMap<String, BTreeSet<String>>,
}

impl Model {
    fn new(set: &FileDescriptorSet) -> Self {
        let mut model = Self::default();
        walk(set, &mut |item| match item {
            Item::Message(full, message, proto3) => {
                if !message.options.as_ref().is_some_and(|o| o.map_entry()) {
                    let fields = message.field.iter().map(|f| {
                        (
                            f.name().to_owned(),
                            field_aspects(message, &full, f, proto3),
                        )
                    });
                    let fields = fields.collect();
                    model.messages.insert(full, fields);
                }
            }
            Item::Enum(full, enumeration) => {
                let values = enumeration.value.iter().map(|v| {
                    (
                        v.name().to_owned(),
                        vec![(
                            DiffKind::EnumValueRenumbered,
                            "number",
                            v.number().to_string(),
                        )],
                    )
                });
                model.enums.insert(full, values.collect());
            }
            Item::Service(full, service) => model.add_service(full, service),
        });
        model
    }

    fn add_service(&mut self, full: String, service: &ServiceDescriptorProto) {
        let mut methods = BTreeMap::new();
        for method in &service.method {
            let (input, output) = (
                type_name(method.input_type()),
                type_name(method.output_type()),
            );
            let streaming = match (method.client_streaming(), method.server_streaming()) {
                (false, false) => "unary",
                (true, false) => "client",
                (false, true) => "server",
                (true, true) => "bidi",
            };
            let level = method.options.as_ref().and_then(|o| o.idempotency_level);
            let idempotency = match level.and_then(|l| IdempotencyLevel::try_from(l).ok()) {
                None | Some(IdempotencyLevel::IdempotencyUnknown) => "none",
                Some(level) => level.as_str_name(),
            };
            let path = join(&full, method.name());
            for name in [&path, &full] {
                self.links
                    .entry(name.clone())
                    .or_default()
                    .extend([input.clone(), output.clone()]);
            }
            let aspects = vec![
                (DiffKind::MethodChanged, "input", input),
                (DiffKind::MethodChanged, "output", output),
                (DiffKind::MethodChanged, "streaming", streaming.to_owned()),
                (
                    DiffKind::MethodChanged,
                    "idempotency",
                    idempotency.to_owned(),
                ),
            ];
            methods.insert(method.name().to_owned(), aspects);
        }
        self.services.insert(full, methods);
    }
}

fn type_name(name: &str) -> String {
    name.trim_start_matches('.').to_owned()
}

/// The field's type as written in `.proto` (`string`, `agent.v1.Foo`, `map<string, agent.v1.Foo>`).
fn type_text(field: &FieldDescriptorProto) -> String {
    match field_type(field).and_then(scalar_name) {
        Some(scalar) => scalar.to_owned(),
        None => type_name(field.type_name()),
    }
}

fn field_aspects(
    message: &DescriptorProto,
    full: &str,
    field: &FieldDescriptorProto,
    proto3: bool,
) -> Aspects {
    let oneof = real_oneof(message, field);
    let entry = map_entry(message, full, field);
    let part = |n: i32| {
        entry
            .and_then(|e| e.field.iter().find(|f| f.number() == n))
            .map(type_text)
            .unwrap_or_default()
    };
    let ty = match entry {
        Some(_) => format!("map<{}, {}>", part(1), part(2)),
        None => type_text(field),
    };
    let label = match field.label() {
        Label::Repeated => "repeated",
        Label::Required => "required",
        Label::Optional if proto3 && oneof.is_none() && !field.proto3_optional() => "implicit",
        Label::Optional => "optional",
    };
    let options = field.options.as_ref();
    let packable = field.label() == Label::Repeated
        && !matches!(
            field_type(field),
            None | Some(Type::String | Type::Bytes | Type::Message | Type::Group)
        );
    let packed = options
        .and_then(|o| o.packed)
        .or(packable.then_some(proto3));
    let jstype = options
        .and_then(|o| o.jstype)
        .filter(|j| *j != 0)
        .and_then(|j| JsType::try_from(j).ok());
    let json_name = field
        .json_name
        .clone()
        .filter(|j| *j != default_json_name(field.name()));
    let none = || "none".to_owned();
    vec![
        (
            DiffKind::FieldRenumbered,
            "number",
            field.number().to_string(),
        ),
        (DiffKind::FieldRetyped, "type", ty),
        (DiffKind::FieldLabelChanged, "label", label.to_owned()),
        (
            DiffKind::FieldOneofChanged,
            "oneof",
            oneof.map_or_else(none, |o| o.name().to_owned()),
        ),
        (
            DiffKind::FieldOptionChanged,
            "packed",
            packed.map_or_else(none, |p| p.to_string()),
        ),
        (
            DiffKind::FieldOptionChanged,
            "jstype",
            jstype.map_or_else(none, |j| j.as_str_name().to_owned()),
        ),
        (
            DiffKind::FieldOptionChanged,
            "default",
            field.default_value.clone().unwrap_or_else(none),
        ),
        (
            DiffKind::FieldOptionChanged,
            "json_name",
            json_name.unwrap_or_else(none),
        ),
    ]
}

/// Appends `(kind, path, detail)` for every container and member difference between two tables.
fn diff_table(
    old: &Members,
    new: &Members,
    kinds: &Kinds,
    out: &mut Vec<(DiffKind, String, String)>,
) {
    let count = |members: &BTreeMap<String, Aspects>| {
        let plural = if members.len() == 1 { "" } else { "s" };
        format!(
            "{} with {} {}{plural}",
            kinds.noun,
            members.len(),
            kinds.member_noun
        )
    };
    for (name, members) in old.iter().filter(|(name, _)| !new.contains_key(*name)) {
        out.push((kinds.removed, name.clone(), count(members)));
    }
    for (name, new_members) in new {
        let Some(old_members) = old.get(name) else {
            out.push((kinds.added, name.clone(), count(new_members)));
            continue;
        };
        for (member, aspects) in old_members
            .iter()
            .filter(|(m, _)| !new_members.contains_key(*m))
        {
            out.push((kinds.member_removed, join(name, member), describe(aspects)));
        }
        for (member, new_aspects) in new_members {
            let path = join(name, member);
            let Some(old_aspects) = old_members.get(member) else {
                out.push((kinds.member_added, path, describe(new_aspects)));
                continue;
            };
            for ((kind, what, before), (_, _, after)) in old_aspects.iter().zip(new_aspects) {
                if before != after {
                    out.push((*kind, path.clone(), format!("{what} {before} → {after}")));
                }
            }
        }
    }
}

/// `number 3, type string, label implicit` — the aspects that are set.
fn describe(aspects: &Aspects) -> String {
    let set = aspects.iter().filter(|(_, _, value)| value != "none");
    set.map(|(_, what, value)| format!("{what} {value}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `a`, `a.b`, `a.b.c` for `a.b.c`.
fn prefixes(path: &str) -> impl Iterator<Item = &str> {
    path.match_indices('.')
        .map(|(i, _)| &path[..i])
        .chain([path])
}

enum Item<'a> {
    /// Full name, descriptor, declared in a proto3 file.
    Message(String, &'a DescriptorProto, bool),
    Enum(String, &'a EnumDescriptorProto),
    Service(String, &'a ServiceDescriptorProto),
}

/// Visits every message (nested ones included), enum and service of `set` with its full name.
fn walk<'a>(set: &'a FileDescriptorSet, visit: &mut impl FnMut(Item<'a>)) {
    fn message<'a>(
        scope: &str,
        m: &'a DescriptorProto,
        proto3: bool,
        visit: &mut impl FnMut(Item<'a>),
    ) {
        let full = join(scope, m.name());
        for nested in &m.nested_type {
            message(&full, nested, proto3, visit);
        }
        for e in &m.enum_type {
            visit(Item::Enum(join(&full, e.name()), e));
        }
        visit(Item::Message(full, m, proto3));
    }
    for file in &set.file {
        let (scope, proto3) = (file.package(), file.syntax() == "proto3");
        for m in &file.message_type {
            message(scope, m, proto3, visit);
        }
        for e in &file.enum_type {
            visit(Item::Enum(join(scope, e.name()), e));
        }
        for s in &file.service {
            visit(Item::Service(join(scope, s.name()), s));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::printer::tests::compile;
    use prost_types::{FieldDescriptorProto, FileDescriptorProto, OneofDescriptorProto};

    const SCHEMA: &str = r#"
syntax = "proto3";
package agent.v1;
message AgentClientMessage { oneof message { RunRequest run = 1; } }
message RunRequest {
  string text = 1;
  map<string, Detail> details = 2;
  optional int32 count = 3;
}
message Detail { int64 size = 1; }
message Lonely { string note = 1; }
enum AgentMode { AGENT_MODE_UNSPECIFIED = 0; AGENT_MODE_ASK = 1; }
service AgentService { rpc Run(AgentClientMessage) returns (stream AgentClientMessage); }
service Other { rpc Ping(Lonely) returns (Lonely); }
"#;

    fn schema() -> FileDescriptorSet {
        compile(&[("agent.proto", SCHEMA)])
    }

    /// Compares the schema with a copy changed by `edit`.
    fn diff_after(edit: impl FnOnce(&mut FileDescriptorProto)) -> Vec<Difference> {
        let old = schema();
        let mut new = old.clone();
        edit(&mut new.file[0]);
        compare(&old, &new)
    }

    fn message<'a>(file: &'a mut FileDescriptorProto, name: &str) -> &'a mut DescriptorProto {
        file.message_type
            .iter_mut()
            .find(|m| m.name() == name)
            .unwrap()
    }

    fn field<'a>(
        file: &'a mut FileDescriptorProto,
        msg: &str,
        name: &str,
    ) -> &'a mut FieldDescriptorProto {
        message(file, msg)
            .field
            .iter_mut()
            .find(|f| f.name() == name)
            .unwrap()
    }

    fn only(diffs: &[Difference]) -> (DiffKind, &str, &str, bool) {
        assert_eq!(diffs.len(), 1, "{diffs:#?}");
        let d = &diffs[0];
        (d.kind, d.path.as_str(), d.detail.as_str(), d.used_by_server)
    }

    #[test]
    fn same_schema_has_no_differences() {
        assert!(compare(&schema(), &schema()).is_empty());
    }

    #[test]
    fn renumbered_field_of_a_server_message() {
        let diffs = diff_after(|f| field(f, "RunRequest", "text").number = Some(4));
        assert_eq!(
            only(&diffs),
            (
                DiffKind::FieldRenumbered,
                "agent.v1.RunRequest.text",
                "number 1 → 4",
                true
            )
        );
    }

    #[test]
    fn retyped_field_outside_the_server() {
        let diffs = diff_after(|f| field(f, "Lonely", "note").r#type = Some(Type::Int32 as i32));
        assert_eq!(
            only(&diffs),
            (
                DiffKind::FieldRetyped,
                "agent.v1.Lonely.note",
                "type string → int32",
                false
            )
        );
    }

    #[test]
    fn removed_message() {
        let diffs = diff_after(|f| f.message_type.retain(|m| m.name() != "Lonely"));
        assert_eq!(
            only(&diffs),
            (
                DiffKind::MessageRemoved,
                "agent.v1.Lonely",
                "message with 1 field",
                false
            )
        );
    }

    #[test]
    fn added_enum_value() {
        let diffs = diff_after(|f| {
            let value = prost_types::EnumValueDescriptorProto {
                name: Some("AGENT_MODE_PLAN".into()),
                number: Some(2),
                options: None,
            };
            f.enum_type[0].value.push(value);
        });
        assert_eq!(
            only(&diffs),
            (
                DiffKind::EnumValueAdded,
                "agent.v1.AgentMode.AGENT_MODE_PLAN",
                "number 2",
                false
            )
        );
    }

    #[test]
    fn method_streaming_change_touches_the_server() {
        let diffs = diff_after(|f| f.service[0].method[0].server_streaming = Some(false));
        assert_eq!(
            only(&diffs),
            (
                DiffKind::MethodChanged,
                "agent.v1.AgentService.Run",
                "streaming server → unary",
                true
            )
        );
    }

    #[test]
    fn map_value_change_is_a_retyped_map_not_an_entry_message() {
        let diffs = diff_after(|f| {
            let entry = &mut message(f, "RunRequest").nested_type[0];
            entry.field[1].r#type = Some(Type::String as i32);
            entry.field[1].type_name = None;
        });
        let expected = "type map<string, agent.v1.Detail> → map<string, string>";
        assert_eq!(
            only(&diffs),
            (
                DiffKind::FieldRetyped,
                "agent.v1.RunRequest.details",
                expected,
                true
            )
        );
    }

    #[test]
    fn proto3_optional_is_a_label_not_a_oneof() {
        let diffs = diff_after(|f| {
            let count = field(f, "RunRequest", "count");
            count.proto3_optional = None;
            count.oneof_index = None;
            message(f, "RunRequest").oneof_decl.clear();
        });
        assert_eq!(
            only(&diffs),
            (
                DiffKind::FieldLabelChanged,
                "agent.v1.RunRequest.count",
                "label optional → implicit",
                true
            )
        );
    }

    #[test]
    fn moving_into_a_oneof() {
        let diffs = diff_after(|f| {
            let lonely = message(f, "Lonely");
            lonely.oneof_decl.push(OneofDescriptorProto {
                name: Some("kind".into()),
                options: None,
            });
            lonely.field[0].oneof_index = Some(0);
        });
        let kinds: Vec<(DiffKind, &str)> =
            diffs.iter().map(|d| (d.kind, d.detail.as_str())).collect();
        assert_eq!(
            kinds,
            [
                (DiffKind::FieldLabelChanged, "label implicit → optional"),
                (DiffKind::FieldOneofChanged, "oneof none → kind")
            ]
        );
    }

    #[test]
    fn moved_between_files_is_no_difference() {
        let old = schema();
        let mut new = old.clone();
        let mut second = FileDescriptorProto {
            name: Some("more.proto".into()),
            ..new.file[0].clone()
        };
        second.message_type.retain(|m| m.name() == "Lonely");
        second.enum_type.clear();
        second.service.clear();
        new.file[0].message_type.retain(|m| m.name() != "Lonely");
        new.file[0].message_type.reverse();
        new.file.push(second);
        assert!(compare(&old, &new).is_empty());
    }

    #[test]
    fn reachable_follows_fields_maps_and_nesting() {
        let found = reachable(
            &schema(),
            &["agent.v1.AgentClientMessage", "agent.v1.Missing"],
        );
        let expected = [
            "agent.v1.AgentClientMessage",
            "agent.v1.Detail",
            "agent.v1.RunRequest",
            "agent.v1.RunRequest.DetailsEntry",
        ];
        assert_eq!(found, expected.iter().map(|s| (*s).to_owned()).collect());
    }

    #[test]
    fn display_and_summary() {
        let diffs = diff_after(|f| {
            field(f, "RunRequest", "text").number = Some(4);
            f.message_type.retain(|m| m.name() != "Lonely");
        });
        let lines: Vec<String> = diffs.iter().map(ToString::to_string).collect();
        assert_eq!(
            lines,
            [
                "agent.v1.Lonely: message removed (message with 1 field)",
                "agent.v1.RunRequest.text: field renumbered (number 1 → 4) [used by server]",
            ]
        );
        assert_eq!(
            summary(&diffs),
            "2 differences, 1 used by the server: 1 message removed, 1 field renumbered"
        );
        assert_eq!(summary(&[]), "no differences");
    }
}
