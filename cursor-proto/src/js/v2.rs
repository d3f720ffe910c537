//! protobuf-es v2: the schema as serialized descriptors embedded in the bundle.
//!
//! Owns decoding what v2 generates instead of classes: each `.proto` file is one call
//! `fileDesc("<base64 of a FileDescriptorProto>", [deps])`, and messages, enums and services are only indexes
//! into it (`messageDesc(file, i)`), so the descriptor itself is the whole schema of that file. Here the
//! base64 is decoded (by hand, to say where it breaks), the descriptor parsed with prost, and its types turned
//! into the same [`RawMessage`]/[`RawEnum`]/[`RawService`] the v1 reader gives, so both generations go through
//! one path (deduplication, conflicts, soundness, printing) and a bundle with both merges them.
//!
//! v2 strips `json_name` and `dependency` from what it embeds (the dependencies are the call's second
//! argument); every type reference in the descriptor is already a full name, so nothing else is needed.

use prost::Message as _;
use prost_types::field_descriptor_proto::{Label, Type};
use prost_types::field_options::JsType;
use prost_types::method_options::IdempotencyLevel;
use prost_types::{
    DescriptorProto, EnumDescriptorProto, FieldDescriptorProto, FileDescriptorProto,
};

use oxc_ast::ast::{CallExpression, Expression};

use super::{
    Bundle, Collector, FieldKind, Idempotency, MapValue, MethodKind, Owner, Problem, RawEnum,
    RawField, RawMessage, RawMethod, RawService, Site, Syntax, line_column,
};

/// Shorter strings are never a descriptor (a name `x.proto` and a package take more than this).
const MIN_LENGTH: usize = 12;

/// Whether a string argument is meant as an embedded descriptor: its readable start decodes to field 1 of a
/// `FileDescriptorProto` (the file name, which protobuf-es always writes first) ending in `.proto`. Only the
/// start is looked at, so a descriptor whose base64 breaks later is still recognised and reported.
pub(super) fn looks_embedded(text: &str) -> bool {
    text.len() >= MIN_LENGTH && text.starts_with('C') && file_name(text).is_some()
}

/// The file name at the start of an embedded descriptor, read from the longest prefix that decodes.
fn file_name(text: &str) -> Option<String> {
    // 0x0A, a length below 128, and the name: at most 130 bytes, 176 base64 characters.
    let prefix: String = text.chars().take(176).collect();
    let bytes = match decode_base64(&prefix) {
        Ok(bytes) => bytes,
        Err(broken) => broken.decoded,
    };
    let [0x0A, length, rest @ ..] = bytes.as_slice() else {
        return None;
    };
    let name = rest.get(..usize::from(*length))?;
    let name = std::str::from_utf8(name).ok()?;
    name.ends_with(".proto").then(|| name.to_owned())
}

/// Base64 that stops at the first character it cannot use.
#[derive(Debug)]
struct Broken {
    /// The bytes of the whole groups of four before the break.
    decoded: Vec<u8>,
    reason: String,
}

/// Decodes standard or URL-safe base64, padded or not (protobuf-es writes it unpadded).
fn decode_base64(text: &str) -> Result<Vec<u8>, Broken> {
    let text = text.trim_end_matches('=');
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let (mut buffer, mut bits) = (0u32, 0u32);
    for (index, c) in text.char_indices() {
        let value = match c {
            'A'..='Z' => c as u32 - 'A' as u32,
            'a'..='z' => c as u32 - 'a' as u32 + 26,
            '0'..='9' => c as u32 - '0' as u32 + 52,
            '+' | '-' => 62,
            '/' | '_' => 63,
            _ => {
                let whole = out.len() - out.len() % 3;
                out.truncate(whole);
                return Err(Broken {
                    decoded: out,
                    reason: format!("not base64: {c:?} at character {}", index + 1),
                });
            }
        };
        buffer = (buffer << 6) | value;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((buffer >> bits) as u8);
            buffer &= (1 << bits) - 1;
        }
    }
    if text.len() % 4 == 1 {
        return Err(Broken {
            decoded: out,
            reason: format!(
                "the base64 ends after {} characters, one more than a whole byte: truncated",
                text.len()
            ),
        });
    }
    Ok(out)
}

/// Why an embedded descriptor was left out, and which file it is (as far as it can be read).
#[derive(Debug)]
pub(super) struct DecodeFailure {
    pub file: String,
    pub reason: String,
}

/// Decodes one embedded descriptor.
pub(super) fn decode(text: &str) -> Result<FileDescriptorProto, DecodeFailure> {
    let file = file_name(text).unwrap_or_else(|| "an embedded .proto file".to_owned());
    let bytes = decode_base64(text).map_err(|broken| DecodeFailure {
        file: file.clone(),
        reason: broken.reason,
    })?;
    let descriptor = FileDescriptorProto::decode(bytes.as_slice()).map_err(|e| DecodeFailure {
        file: file.clone(),
        reason: format!(
            "its {} bytes do not parse as a FileDescriptorProto ({e}): truncated or corrupt",
            bytes.len()
        ),
    })?;
    if descriptor.name() != file {
        return Err(DecodeFailure {
            file,
            reason: format!(
                "it parses, but names itself {:?}: corrupt",
                descriptor.name()
            ),
        });
    }
    Ok(descriptor)
}

/// Adds the messages, enums and services of one decoded file to `bundle`; `at` is where its call starts.
pub(super) fn add_types(file: &FileDescriptorProto, at: u32, bundle: &mut Bundle) {
    let site = Site {
        at,
        v2: true,
        file: 0,
    };
    let syntax = match file.syntax() {
        "proto3" => Syntax::Proto3,
        "" | "proto2" => Syntax::Proto2,
        other => {
            bundle.problems.push(Problem {
                owner: file.name().to_owned(),
                member: String::new(),
                reason: format!(
                    "syntax {other:?} is read as proto2: editions features other than `delimited` are not kept"
                ),
            });
            Syntax::Proto2
        }
    };
    let prefix = match file.package() {
        "" => String::new(),
        package => format!("{package}."),
    };
    for message in &file.message_type {
        add_message(message, &prefix, syntax, site, bundle);
    }
    for value in &file.enum_type {
        bundle.enums.push(raw_enum(value, &prefix, syntax, site));
    }
    for service in &file.service {
        bundle.services.push(RawService {
            full_name: format!("{prefix}{}", service.name()),
            methods: service.method.iter().map(raw_method).collect(),
            site,
        });
    }
}

fn add_message(
    message: &DescriptorProto,
    prefix: &str,
    syntax: Syntax,
    site: Site,
    bundle: &mut Bundle,
) {
    let full_name = format!("{prefix}{}", message.name());
    let inner = format!("{full_name}.");
    // Map entries are part of their field (`FieldKind::Map`), not types of their own.
    let entries: Vec<&DescriptorProto> = message
        .nested_type
        .iter()
        .filter(|nested| nested.options.as_ref().is_some_and(|o| o.map_entry()))
        .collect();
    let mut fields = Vec::new();
    for field in &message.field {
        match raw_field(field, message, &entries, syntax) {
            Ok(field) => fields.push(field),
            Err(reason) => bundle.problems.push(Problem {
                owner: full_name.clone(),
                member: field.name().to_owned(),
                reason,
            }),
        }
    }
    bundle.messages.push(RawMessage {
        full_name,
        syntax,
        fields,
        site,
    });
    for nested in &message.nested_type {
        if !entries.iter().any(|entry| std::ptr::eq(*entry, nested)) {
            add_message(nested, &inner, syntax, site, bundle);
        }
    }
    for value in &message.enum_type {
        bundle.enums.push(raw_enum(value, &inner, syntax, site));
    }
}

fn raw_field(
    field: &FieldDescriptorProto,
    message: &DescriptorProto,
    entries: &[&DescriptorProto],
    syntax: Syntax,
) -> Result<RawField, String> {
    let type_name = || field.type_name().trim_start_matches('.').to_owned();
    let entry = (field.r#type() == Type::Message && field.label() == Label::Repeated)
        .then(|| {
            let short = field.type_name().rsplit('.').next().unwrap_or_default();
            entries.iter().find(|e| e.name() == short)
        })
        .flatten();
    let kind = match (entry, field.r#type()) {
        (Some(entry), _) => {
            let part = |number: i32| {
                entry
                    .field
                    .iter()
                    .find(|f| f.number() == number)
                    .ok_or_else(|| format!("map entry {} has no field {number}", entry.name()))
            };
            let (key, value) = (part(1)?, part(2)?);
            let value = match value.r#type() {
                Type::Message => {
                    MapValue::Message(value.type_name().trim_start_matches('.').into())
                }
                Type::Enum => MapValue::Enum(value.type_name().trim_start_matches('.').into()),
                scalar => MapValue::Scalar(scalar as i32),
            };
            FieldKind::Map {
                key: key.r#type() as i32,
                value,
            }
        }
        (None, Type::Message | Type::Group) => FieldKind::Message(type_name()),
        (None, Type::Enum) => FieldKind::Enum(type_name()),
        (None, scalar) => FieldKind::Scalar(scalar as i32),
    };
    let oneof = match field.oneof_index {
        Some(index) if !field.proto3_optional() => Some(
            message
                .oneof_decl
                .get(usize::try_from(index).unwrap_or(usize::MAX))
                .ok_or_else(|| format!("oneof #{index} is not declared"))?
                .name()
                .to_owned(),
        ),
        _ => None,
    };
    let repeated = field.label() == Label::Repeated && entry.is_none();
    let options = field.options.as_ref();
    // protobuf-es v1 marks `opt` on proto3 `optional` fields and on every proto2 optional field outside a
    // oneof; the same is done here so a type read from both generations compares equal.
    let optional = match syntax {
        Syntax::Proto3 => field.proto3_optional(),
        Syntax::Proto2 => field.label() == Label::Optional && oneof.is_none(),
    };
    let json_name = field
        .json_name
        .clone()
        .filter(|json| *json != default_json_name(field.name()));
    Ok(RawField {
        number: field.number(),
        name: field.name().to_owned(),
        json_name,
        kind,
        repeated,
        optional,
        required: field.label() == Label::Required,
        oneof,
        packed: options.and_then(|o| o.packed),
        js_string: options.is_some_and(|o| o.jstype() == JsType::JsString),
        delimited: field.r#type() == Type::Group,
        default: field.default_value.clone(),
    })
}

fn raw_enum(value: &EnumDescriptorProto, prefix: &str, syntax: Syntax, site: Site) -> RawEnum {
    RawEnum {
        full_name: format!("{prefix}{}", value.name()),
        values: value
            .value
            .iter()
            .map(|v| (v.number(), v.name().to_owned()))
            .collect(),
        syntax: Some(syntax),
        site,
    }
}

fn raw_method(method: &prost_types::MethodDescriptorProto) -> RawMethod {
    let kind = match (method.client_streaming(), method.server_streaming()) {
        (false, false) => MethodKind::Unary,
        (false, true) => MethodKind::ServerStreaming,
        (true, false) => MethodKind::ClientStreaming,
        (true, true) => MethodKind::BiDiStreaming,
    };
    let idempotency = match method.options.as_ref().map(|o| o.idempotency_level()) {
        Some(IdempotencyLevel::NoSideEffects) => Some(Idempotency::NoSideEffects),
        Some(IdempotencyLevel::Idempotent) => Some(Idempotency::Idempotent),
        _ => None,
    };
    RawMethod {
        name: method.name().to_owned(),
        input: method.input_type().trim_start_matches('.').to_owned(),
        output: method.output_type().trim_start_matches('.').to_owned(),
        kind,
        idempotency,
    }
}

/// protoc's `json_name`: the name in lowerCamelCase, underscores dropped.
fn default_json_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut upper = false;
    for c in name.chars() {
        if c == '_' {
            upper = true;
        } else if upper {
            out.extend(c.to_uppercase());
            upper = false;
        } else {
            out.push(c);
        }
    }
    out
}

/// A protobuf-es v2 file: `fileDesc("<base64 FileDescriptorProto>", [deps])` (the function name minified).
pub(super) struct EmbeddedFile<'a> {
    /// Start of the call: its owner is `Owner::Call(start)`, so a dependency reference can be followed to it.
    pub start: u32,
    pub base64: &'a str,
    pub deps: Vec<&'a Expression<'a>>,
}

impl<'a> Collector<'_, 'a> {
    /// Records `call` when it is a v2 `fileDesc(...)`; `true` when it was.
    pub(super) fn on_embedded(
        &mut self,
        call: &'a CallExpression<'a>,
        args: &[&'a Expression<'a>],
    ) -> bool {
        // protobuf-es v2: the callee is minified, so the call is known by its argument, a base64 string that
        // opens like a serialized FileDescriptorProto with a `.proto` name (checked in `js/v2.rs`).
        if let [Expression::StringLiteral(text), rest @ ..] = args
            && rest.len() <= 1
            && looks_embedded(text.value.as_str())
        {
            let deps = match rest {
                [Expression::ArrayExpression(list)] => list
                    .elements
                    .iter()
                    .filter_map(|e| e.as_expression())
                    .collect(),
                _ => Vec::new(),
            };
            self.embedded_at
                .insert(call.span.start, self.embedded.len());
            self.embedded.push(EmbeddedFile {
                start: call.span.start,
                base64: text.value.as_str(),
                deps,
            });
            return true;
        }
        false
    }

    /// Decodes every protobuf-es v2 embedded file and adds its types. A dependency is followed like any
    /// reference (aliases, webpack modules) to another embedded file; one that leads nowhere is reported, and
    /// the file is kept: its descriptor names every type it uses in full, so those resolve by name wherever
    /// they are declared.
    pub(super) fn read_embedded(&self, bundle: &mut Bundle) {
        for file in &self.embedded {
            let descriptor = match decode(file.base64) {
                Ok(descriptor) => descriptor,
                Err(failure) => {
                    bundle.problems.push(Problem {
                        owner: failure.file,
                        member: String::new(),
                        reason: format!(
                            "the embedded descriptor (line {}) was left out: {}",
                            line_column(self.source, file.start as usize).0,
                            failure.reason
                        ),
                    });
                    continue;
                }
            };
            for (index, dep) in file.deps.iter().enumerate() {
                let found = self.owners(dep).into_iter().any(|owner| {
                    matches!(owner, Owner::Call(start) if self.embedded_at.contains_key(&start))
                });
                if !found {
                    bundle.problems.push(Problem {
                        owner: descriptor.name().to_owned(),
                        member: String::new(),
                        reason: format!(
                            "dependency #{} (`{}`) names no embedded file the bundle declares; the types it \
                             uses are looked up by full name",
                            index + 1,
                            self.snippet(dep)
                        ),
                    });
                }
            }
            bundle.v2_files.push(descriptor.name().to_owned());
            add_types(&descriptor, file.start, bundle);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_decodes_both_alphabets_padded_or_not_and_names_the_bad_character() {
        assert_eq!(decode_base64("aGk").unwrap(), b"hi");
        assert_eq!(decode_base64("aGk=").unwrap(), b"hi");
        assert_eq!(decode_base64("-_8").unwrap(), decode_base64("+/8").unwrap());
        let broken = decode_base64("aGVsbG8!d29y").unwrap_err();
        assert!(
            broken.reason.contains("'!' at character 8"),
            "{}",
            broken.reason
        );
        assert_eq!(broken.decoded, b"hel");
        assert!(
            decode_base64("aGVsb")
                .unwrap_err()
                .reason
                .contains("truncated")
        );
    }

    #[test]
    fn a_string_is_taken_for_a_descriptor_only_when_it_opens_with_a_proto_file_name() {
        let file = FileDescriptorProto {
            name: Some("x/y.proto".into()),
            package: Some("x".into()),
            ..Default::default()
        };
        let text = encode(&file.encode_to_vec());
        assert!(looks_embedded(&text));
        assert_eq!(decode(&text).unwrap().name(), "x/y.proto");
        // Cut short: still recognised, and reported instead of read.
        let cut = &text[..text.len() - 3];
        assert!(looks_embedded(cut));
        let failure = decode(cut).unwrap_err();
        assert_eq!(failure.file, "x/y.proto");
        assert!(!looks_embedded("Cabcdefghijklmnop"));
        assert!(!looks_embedded("C"));
    }

    fn encode(bytes: &[u8]) -> String {
        const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        let mut out = String::new();
        for chunk in bytes.chunks(3) {
            let n =
                chunk.iter().fold(0u32, |n, b| (n << 8) | u32::from(*b)) << (8 * (3 - chunk.len()));
            for i in 0..=chunk.len() {
                out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
            }
        }
        out
    }
}
