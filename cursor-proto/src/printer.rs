//! printer: renders a `FileDescriptorProto` as `.proto` source text that protoc/protox compile back to the same
//! descriptor (by meaning; comments are not kept).
//!
//! Owns the text form only: syntax, package, imports, the common file options, messages (fields with labels,
//! maps, real oneofs, proto2 groups, field options, reserved and extension ranges), enums and services.
//! Every type reference is printed fully qualified with a leading dot (`.agent.v1.Foo`), so no scoping rule can
//! change what it resolves to. Extensions (`extend`) and editions files are refused with a [`PrintError`].
//!
//! It also holds the few descriptor facts the other modules share: scalar type names, the default JSON name,
//! map-entry detection and real (non-synthetic) oneof membership.

use prost_types::field_descriptor_proto::{Label, Type};
use prost_types::field_options::JsType;
use prost_types::method_options::IdempotencyLevel;
use prost_types::{
    DescriptorProto, EnumDescriptorProto, FieldDescriptorProto, FileDescriptorProto,
    FileDescriptorSet, OneofDescriptorProto, ServiceDescriptorProto,
};

/// A descriptor that cannot be rendered as `.proto` text.
#[derive(Debug, thiserror::Error)]
#[error("{file}: cannot print `{item}`: {reason}")]
pub struct PrintError {
    /// The file being rendered.
    pub file: String,
    /// The full name of the element (or the syntax string) that could not be printed.
    pub item: String,
    /// Why.
    pub reason: String,
}

/// Renders every file of `set`, returning `(file name, text)` pairs in the set's order.
pub fn render_set(set: &FileDescriptorSet) -> Result<Vec<(String, String)>, PrintError> {
    set.file
        .iter()
        .map(|file| Ok((file.name().to_owned(), render_file(file)?)))
        .collect()
}

/// Renders one file descriptor as `.proto` text.
pub fn render_file(file: &FileDescriptorProto) -> Result<String, PrintError> {
    let proto3 = match file.syntax() {
        "" | "proto2" => false,
        "proto3" => true,
        other => {
            return Err(error(
                file.name(),
                other,
                "only proto2 and proto3 files are supported",
            ));
        }
    };
    let mut p = Printer {
        out: String::new(),
        depth: 0,
        file: file.name(),
        proto3,
    };
    p.line(&format!(
        "syntax = {};",
        quote(if proto3 { "proto3" } else { "proto2" })
    ));
    if !file.package().is_empty() {
        p.blank();
        p.line(&format!("package {};", file.package()));
    }
    p.blank();
    for (index, dependency) in file.dependency.iter().enumerate() {
        let index = i32::try_from(index).unwrap_or(i32::MAX);
        let modifier = if file.public_dependency.contains(&index) {
            "public "
        } else if file.weak_dependency.contains(&index) {
            "weak "
        } else {
            ""
        };
        p.line(&format!("import {modifier}{};", quote(dependency)));
    }
    p.blank();
    for option in file_options(file) {
        p.line(&format!("option {option};"));
    }
    let scope = file.package();
    if let Some(extension) = file.extension.first() {
        return Err(p.error(
            &join(scope, extension.name()),
            "extensions are not supported",
        ));
    }
    for message in &file.message_type {
        p.message(message, scope)?;
    }
    for enumeration in &file.enum_type {
        p.enumeration(enumeration);
    }
    for service in &file.service {
        p.service(service);
    }
    Ok(p.out)
}

/// The `.proto` spelling of a scalar field type; `None` for messages, enums and groups.
pub(crate) fn scalar_name(ty: Type) -> Option<&'static str> {
    Some(match ty {
        Type::Double => "double",
        Type::Float => "float",
        Type::Int64 => "int64",
        Type::Uint64 => "uint64",
        Type::Int32 => "int32",
        Type::Fixed64 => "fixed64",
        Type::Fixed32 => "fixed32",
        Type::Bool => "bool",
        Type::String => "string",
        Type::Bytes => "bytes",
        Type::Uint32 => "uint32",
        Type::Sfixed32 => "sfixed32",
        Type::Sfixed64 => "sfixed64",
        Type::Sint32 => "sint32",
        Type::Sint64 => "sint64",
        Type::Group | Type::Message | Type::Enum => return None,
    })
}

/// The field's declared type, if it is set and known.
pub(crate) fn field_type(field: &FieldDescriptorProto) -> Option<Type> {
    field.r#type.and_then(|ty| Type::try_from(ty).ok())
}

/// The JSON name protoc derives from a field name (`foo_bar` → `fooBar`).
pub(crate) fn default_json_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut upper_next = false;
    for ch in name.chars() {
        if ch == '_' {
            upper_next = true;
        } else if upper_next {
            out.push(ch.to_ascii_uppercase());
            upper_next = false;
        } else {
            out.push(ch);
        }
    }
    out
}

/// The nested `*Entry` type of `message` (full name `full`) when `field` is a map field.
pub(crate) fn map_entry<'a>(
    message: &'a DescriptorProto,
    full: &str,
    field: &FieldDescriptorProto,
) -> Option<&'a DescriptorProto> {
    if field.label() != Label::Repeated || field_type(field).is_some_and(|ty| ty != Type::Message) {
        return None;
    }
    nested_named(message, full, field.type_name())
        .filter(|entry| entry.options.as_ref().is_some_and(|o| o.map_entry()))
}

/// The real (not proto3-optional synthetic) oneof `field` belongs to.
pub(crate) fn real_oneof<'a>(
    message: &'a DescriptorProto,
    field: &FieldDescriptorProto,
) -> Option<&'a OneofDescriptorProto> {
    if field.proto3_optional() {
        return None;
    }
    let index = usize::try_from(field.oneof_index?).ok()?;
    message.oneof_decl.get(index)
}

/// `scope.name`, or `name` at the root scope.
pub(crate) fn join(scope: &str, name: &str) -> String {
    if scope.is_empty() {
        name.to_owned()
    } else {
        format!("{scope}.{name}")
    }
}

/// The nested type of `message` (full name `full`) that `type_name` refers to.
fn nested_named<'a>(
    message: &'a DescriptorProto,
    full: &str,
    type_name: &str,
) -> Option<&'a DescriptorProto> {
    let rest = type_name
        .trim_start_matches('.')
        .strip_prefix(full)?
        .strip_prefix('.')?;
    message
        .nested_type
        .iter()
        .find(|nested| nested.name() == rest)
}

fn error(file: &str, item: &str, reason: &str) -> PrintError {
    PrintError {
        file: file.to_owned(),
        item: item.to_owned(),
        reason: reason.to_owned(),
    }
}

/// A double-quoted literal with protoc's C escaping (non-ASCII bytes as octal escapes).
fn quote(text: &str) -> String {
    format!("\"{}\"", escape(text.as_bytes()))
}

fn escape(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    for &byte in bytes {
        match byte {
            b'\t' => out.push_str("\\t"),
            b'\r' => out.push_str("\\r"),
            b'\n' => out.push_str("\\n"),
            b'\\' => out.push_str("\\\\"),
            b'\'' => out.push_str("\\'"),
            b'"' => out.push_str("\\\""),
            b' '..=b'~' => out.push(char::from(byte)),
            _ => out.push_str(&format!("\\{byte:03o}")),
        }
    }
    out
}

/// The file options worth keeping in the text (`go_package` and friends), as `name = value`.
fn file_options(file: &FileDescriptorProto) -> Vec<String> {
    let Some(o) = &file.options else {
        return Vec::new();
    };
    let strings = [
        ("java_package", &o.java_package),
        ("java_outer_classname", &o.java_outer_classname),
        ("go_package", &o.go_package),
        ("objc_class_prefix", &o.objc_class_prefix),
        ("csharp_namespace", &o.csharp_namespace),
        ("swift_prefix", &o.swift_prefix),
        ("php_class_prefix", &o.php_class_prefix),
        ("php_namespace", &o.php_namespace),
        ("php_metadata_namespace", &o.php_metadata_namespace),
        ("ruby_package", &o.ruby_package),
    ];
    let bools = [
        ("java_multiple_files", o.java_multiple_files),
        ("cc_enable_arenas", o.cc_enable_arenas),
        ("deprecated", o.deprecated),
    ];
    let strings = strings
        .into_iter()
        .filter_map(|(name, value)| Some(format!("{name} = {}", quote(value.as_deref()?))));
    let bools = bools
        .into_iter()
        .filter_map(|(name, value)| Some(format!("{name} = {}", value?)));
    strings.chain(bools).collect()
}

/// `reserved`/`extensions` numbers: `1, 5 to 9`; `exclusive_end` for message ranges (enum ranges are inclusive).
fn ranges(ranges: impl Iterator<Item = (i32, i32)>, exclusive_end: bool) -> String {
    let text: Vec<String> = ranges
        .map(|(start, end)| {
            let end = if exclusive_end { end - 1 } else { end };
            if start == end {
                start.to_string()
            } else {
                format!("{start} to {end}")
            }
        })
        .collect();
    text.join(", ")
}

fn quoted_list(names: &[String]) -> String {
    names
        .iter()
        .map(|name| quote(name))
        .collect::<Vec<_>>()
        .join(", ")
}

fn deprecated(flag: Option<bool>) -> Option<String> {
    flag.map(|flag| format!("deprecated = {flag}"))
}

fn bracketed(options: &[String]) -> String {
    if options.is_empty() {
        String::new()
    } else {
        format!(" [{}]", options.join(", "))
    }
}

struct Printer<'a> {
    out: String,
    depth: usize,
    file: &'a str,
    proto3: bool,
}

impl Printer<'_> {
    fn line(&mut self, text: &str) {
        for _ in 0..self.depth {
            self.out.push_str("  ");
        }
        self.out.push_str(text);
        self.out.push('\n');
    }

    /// An empty line, unless at the start of a block or after another empty line.
    fn blank(&mut self) {
        if !(self.out.ends_with("{\n") || self.out.ends_with("\n\n")) {
            self.out.push('\n');
        }
    }

    fn open(&mut self, header: &str) {
        self.line(&format!("{header} {{"));
        self.depth += 1;
    }

    fn close(&mut self) {
        self.depth -= 1;
        self.line("}");
    }

    fn error(&self, item: &str, reason: &str) -> PrintError {
        error(self.file, item, reason)
    }

    fn message(&mut self, message: &DescriptorProto, scope: &str) -> Result<(), PrintError> {
        self.blank();
        self.open(&format!("message {}", message.name()));
        self.message_body(message, &join(scope, message.name()))?;
        self.close();
        Ok(())
    }

    /// Everything inside a message's braces; also the body of a group field.
    fn message_body(&mut self, message: &DescriptorProto, full: &str) -> Result<(), PrintError> {
        if let Some(extension) = message.extension.first() {
            return Err(self.error(
                &join(full, extension.name()),
                "extensions are not supported",
            ));
        }
        if let Some(option) = deprecated(message.options.as_ref().and_then(|o| o.deprecated)) {
            self.line(&format!("option {option};"));
        }
        // Map entries and groups are printed with their field, not as nested messages.
        let inline = |nested: &DescriptorProto| {
            message.field.iter().any(|field| {
                let group = field_type(field) == Some(Type::Group);
                let target = if group {
                    nested_named(message, full, field.type_name())
                } else {
                    map_entry(message, full, field)
                };
                target.is_some_and(|target| std::ptr::eq(target, nested))
            })
        };
        for nested in message.nested_type.iter().filter(|nested| !inline(nested)) {
            self.message(nested, full)?;
        }
        for enumeration in &message.enum_type {
            self.enumeration(enumeration);
        }
        let mut printed_oneofs = Vec::new();
        for field in &message.field {
            let Some(oneof) = real_oneof(message, field) else {
                self.field(message, full, field, false)?;
                continue;
            };
            if printed_oneofs.contains(&field.oneof_index) {
                continue;
            }
            printed_oneofs.push(field.oneof_index);
            self.open(&format!("oneof {}", oneof.name()));
            for member in message
                .field
                .iter()
                .filter(|f| f.oneof_index == field.oneof_index)
            {
                self.field(message, full, member, true)?;
            }
            self.close();
        }
        if !message.extension_range.is_empty() {
            let numbers = message.extension_range.iter().map(|r| (r.start(), r.end()));
            self.line(&format!("extensions {};", ranges(numbers, true)));
        }
        self.reserved(
            message.reserved_range.iter().map(|r| (r.start(), r.end())),
            true,
            &message.reserved_name,
        );
        Ok(())
    }

    fn reserved(
        &mut self,
        numbers: impl ExactSizeIterator<Item = (i32, i32)>,
        exclusive_end: bool,
        names: &[String],
    ) {
        if numbers.len() > 0 {
            self.line(&format!("reserved {};", ranges(numbers, exclusive_end)));
        }
        if !names.is_empty() {
            self.line(&format!("reserved {};", quoted_list(names)));
        }
    }

    /// Prints one field, with the body of its nested type when it is a group.
    fn field(
        &mut self,
        message: &DescriptorProto,
        full: &str,
        field: &FieldDescriptorProto,
        in_oneof: bool,
    ) -> Result<(), PrintError> {
        let path = join(full, field.name());
        let options = bracketed(&self.field_options(field));
        let (name, number) = (field.name(), field.number());
        if let Some(entry) = map_entry(message, full, field) {
            let part = |n: i32| {
                let part = entry.field.iter().find(|f| f.number() == n);
                part.ok_or_else(|| self.error(&path, "map entry lacks its key or value field"))
            };
            let (key, value) = (
                self.type_ref(part(1)?, &path)?,
                self.type_ref(part(2)?, &path)?,
            );
            self.line(&format!("map<{key}, {value}> {name} = {number}{options};"));
            return Ok(());
        }
        let label = match field.label() {
            _ if in_oneof => "",
            Label::Repeated => "repeated ",
            Label::Required => "required ",
            Label::Optional if self.proto3 && !field.proto3_optional() => "",
            Label::Optional => "optional ",
        };
        if field_type(field) != Some(Type::Group) {
            let ty = self.type_ref(field, &path)?;
            self.line(&format!("{label}{ty} {name} = {number}{options};"));
            return Ok(());
        }
        let group = nested_named(message, full, field.type_name())
            .ok_or_else(|| self.error(&path, "group field without its nested message type"))?;
        if group.name().to_ascii_lowercase() != name {
            return Err(self.error(
                &path,
                "a group field's name must be its type name in lower case",
            ));
        }
        self.open(&format!(
            "{label}group {} = {number}{options}",
            group.name()
        ));
        self.message_body(group, &join(full, group.name()))?;
        self.close();
        Ok(())
    }

    fn type_ref(&self, field: &FieldDescriptorProto, path: &str) -> Result<String, PrintError> {
        if let Some(name) = field_type(field).and_then(scalar_name) {
            return Ok(name.to_owned());
        }
        match &field.type_name {
            Some(name) if !name.is_empty() => Ok(name.clone()),
            _ => Err(self.error(path, "field has neither a scalar type nor a type name")),
        }
    }

    fn field_options(&self, field: &FieldDescriptorProto) -> Vec<String> {
        let mut options = Vec::new();
        if let Some(default) = &field.default_value {
            let value = match field_type(field) {
                Some(Type::String) => quote(default),
                Some(Type::Bytes) => format!("\"{default}\""), // already C-escaped in the descriptor
                _ => default.clone(),
            };
            options.push(format!("default = {value}"));
        }
        if let Some(json) = field
            .json_name
            .as_deref()
            .filter(|json| *json != default_json_name(field.name()))
        {
            options.push(format!("json_name = {}", quote(json)));
        }
        let Some(o) = &field.options else {
            return options;
        };
        options.extend(o.packed.map(|packed| format!("packed = {packed}")));
        let jstype = o.jstype.and_then(|j| JsType::try_from(j).ok());
        options.extend(jstype.map(|j| format!("jstype = {}", j.as_str_name())));
        options.extend(deprecated(o.deprecated));
        options
    }

    fn enumeration(&mut self, enumeration: &EnumDescriptorProto) {
        self.blank();
        self.open(&format!("enum {}", enumeration.name()));
        let values = &enumeration.value;
        let options = enumeration.options.as_ref();
        let shared_number = values
            .iter()
            .enumerate()
            .any(|(i, v)| values[..i].iter().any(|w| w.number() == v.number()));
        if shared_number || options.is_some_and(|o| o.allow_alias()) {
            self.line("option allow_alias = true;");
        }
        if let Some(option) = deprecated(options.and_then(|o| o.deprecated)) {
            self.line(&format!("option {option};"));
        }
        for value in values {
            let options: Vec<String> =
                deprecated(value.options.as_ref().and_then(|o| o.deprecated))
                    .into_iter()
                    .collect();
            self.line(&format!(
                "{} = {}{};",
                value.name(),
                value.number(),
                bracketed(&options)
            ));
        }
        let numbers = enumeration
            .reserved_range
            .iter()
            .map(|r| (r.start(), r.end()));
        self.reserved(numbers, false, &enumeration.reserved_name);
        self.close();
    }

    fn service(&mut self, service: &ServiceDescriptorProto) {
        self.blank();
        self.open(&format!("service {}", service.name()));
        if let Some(option) = deprecated(service.options.as_ref().and_then(|o| o.deprecated)) {
            self.line(&format!("option {option};"));
        }
        for method in &service.method {
            let stream = |on: bool| if on { "stream " } else { "" };
            let signature = format!(
                "rpc {}({}{}) returns ({}{})",
                method.name(),
                stream(method.client_streaming()),
                method.input_type(),
                stream(method.server_streaming()),
                method.output_type(),
            );
            let o = method.options.as_ref();
            let idempotency = o
                .and_then(|o| o.idempotency_level)
                .and_then(|l| IdempotencyLevel::try_from(l).ok());
            let options: Vec<String> = idempotency
                .map(|level| format!("idempotency_level = {}", level.as_str_name()))
                .into_iter()
                .chain(deprecated(o.and_then(|o| o.deprecated)))
                .collect();
            if options.is_empty() {
                self.line(&format!("{signature};"));
                continue;
            }
            self.open(&signature);
            for option in options {
                self.line(&format!("option {option};"));
            }
            self.close();
        }
        self.close();
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Compiles `(file name, source)` pairs with protox (imports included, source info dropped).
    pub(crate) fn compile(files: &[(&str, &str)]) -> FileDescriptorSet {
        let dir = tempfile::tempdir().unwrap();
        for (name, source) in files {
            let path = dir.path().join(name);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, source).unwrap();
        }
        let names = files.iter().map(|(name, _)| *name);
        let mut set = protox::compile(names, [dir.path()]).unwrap();
        for file in &mut set.file {
            file.source_code_info = None;
        }
        set
    }

    /// Renders every file of `set`, compiles the text again and returns both sets.
    fn reprint(set: &FileDescriptorSet) -> FileDescriptorSet {
        let rendered = render_set(set).unwrap();
        let files: Vec<(&str, &str)> = rendered
            .iter()
            .map(|(n, t)| (n.as_str(), t.as_str()))
            .collect();
        compile(&files)
    }

    const PROTO3: &str = r#"
syntax = "proto3";
package demo.v1;
option go_package = "example.com/demo;demo";
import "google/protobuf/struct.proto";

message Outer {
  message Inner { repeated int32 packed_no = 1 [packed = false]; }
  enum Kind { option allow_alias = true; KIND_UNSPECIFIED = 0; KIND_A = 1; KIND_ALSO_A = 1 [deprecated = true]; }
  string name = 1;
  optional int64 big = 2 [jstype = JS_STRING];
  repeated Inner inners = 3;
  map<string, Inner> by_name = 4;
  map<int32, Kind> kinds = 5 [json_name = "kindMap"];
  oneof choice {
    string text = 6;
    Inner inner = 7 [deprecated = true];
  }
  optional Kind kind = 8;
  google.protobuf.Struct extra = 9;
  uint64 small = 10 [jstype = JS_NUMBER];
  reserved 20, 30 to 40;
  reserved "old";
}

enum Top { TOP_UNSPECIFIED = 0; TOP_ONE = 1; reserved 5 to 7; }

service Demo {
  rpc Get(Outer) returns (Outer.Inner) { option idempotency_level = NO_SIDE_EFFECTS; }
  rpc Put(stream Outer) returns (Outer) { option idempotency_level = IDEMPOTENT; }
  rpc Watch(Outer) returns (stream Outer);
  rpc Chat(stream Outer) returns (stream Outer);
}
"#;

    const PROTO2: &str = r#"
syntax = "proto2";
package demo.legacy;

message Old {
  required string id = 1 [default = "a \"quoted\"\n\\ line\t\001 é"];
  optional bytes blob = 2 [default = "\000\377x"];
  optional double ratio = 3 [default = inf];
  optional float low = 4 [default = -1.5];
  optional Mode mode = 5 [default = MODE_B];
  repeated int32 plain = 6;
  repeated int32 dense = 7 [packed = true];
  optional group Result = 8 {
    optional string url = 1;
    repeated group Part = 2 { optional int32 n = 1; }
  }
  oneof pick { int32 a = 9; group Choice = 10 { optional bool yes = 1; } }
  optional bool flag = 11 [default = true];
  extensions 100 to 199, 500;
  enum Mode { MODE_A = 1; MODE_B = 2; }
}
"#;

    #[test]
    fn proto3_file_reprints_to_the_same_descriptor() {
        let original = compile(&[("demo.proto", PROTO3)]);
        let text = render_file(&original.file[1]).unwrap();
        assert!(
            text.contains("map<string, .demo.v1.Outer.Inner> by_name = 4;"),
            "{text}"
        );
        assert!(
            text.contains("optional int64 big = 2 [jstype = JS_STRING];"),
            "{text}"
        );
        assert!(text.contains("[json_name = \"kindMap\"]"), "{text}");
        assert!(!text.contains("_big") && !text.contains("Entry"), "{text}");
        assert_eq!(reprint(&original), original);
    }

    #[test]
    fn proto2_file_with_groups_and_defaults_reprints_to_the_same_descriptor() {
        let original = compile(&[("old.proto", PROTO2)]);
        let text = render_file(&original.file[0]).unwrap();
        assert!(text.starts_with("syntax = \"proto2\";"), "{text}");
        assert!(text.contains("optional group Result = 8 {"), "{text}");
        assert_eq!(reprint(&original), original);
    }

    #[test]
    fn group_without_its_type_is_an_error() {
        let mut set = compile(&[("old.proto", PROTO2)]);
        set.file[0].message_type[0]
            .nested_type
            .retain(|n| n.name() != "Result");
        let err = render_file(&set.file[0]).unwrap_err();
        assert_eq!(err.item, "demo.legacy.Old.result");
    }

    #[test]
    fn editions_are_refused() {
        let file = FileDescriptorProto {
            syntax: Some("editions".into()),
            ..Default::default()
        };
        assert!(render_file(&file).is_err());
    }

    #[test]
    fn default_json_name_is_camel_case() {
        assert_eq!(default_json_name("foo_bar_baz"), "fooBarBaz");
        assert_eq!(default_json_name("already"), "already");
    }
}
