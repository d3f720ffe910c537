//! fingerprint: a short hash of a schema's meaning, to tell at a glance whether two schemas are the same.
//!
//! Owns the canonical form: a copy of the `FileDescriptorSet` with comments (`source_code_info`) and file
//! options dropped (with the imports) by merging the files of one package into one (which file declares a
//! type is not meaning: the server compiles the types, not the file layout), messages, enums, services and methods
//! sorted by name, oneofs by name (field `oneof_index` remapped), fields and extensions by number, enum values by
//! number then name, reserved ranges and names sorted, and `json_name` cleared where it is the default one. The
//! canonical set is protobuf-encoded (deterministic in prost) and hashed with SHA-256.

use prost::Message as _;
use prost_types::{DescriptorProto, EnumDescriptorProto, FileDescriptorProto, FileDescriptorSet};
use sha2::{Digest as _, Sha256};

use crate::printer::default_json_name;

/// The first 16 hex digits (64 bits) of the SHA-256 of `set`'s canonical form.
///
/// Same meaning → same fingerprint, whatever the declaration order or comments; a field renumbered or
/// retyped, or any type added or removed, changes it.
pub fn fingerprint(set: &FileDescriptorSet) -> String {
    let mut packages: std::collections::BTreeMap<(String, String), FileDescriptorProto> =
        std::collections::BTreeMap::new();
    for file in &set.file {
        let key = (file.package().to_owned(), file.syntax().to_owned());
        let merged = packages.entry(key).or_insert_with(|| FileDescriptorProto {
            name: Some(file.package().to_owned()),
            package: file.package.clone(),
            syntax: file.syntax.clone(),
            ..Default::default()
        });
        merged
            .message_type
            .extend(file.message_type.iter().cloned());
        merged.enum_type.extend(file.enum_type.iter().cloned());
        merged.service.extend(file.service.iter().cloned());
        merged.extension.extend(file.extension.iter().cloned());
    }
    let files: Vec<FileDescriptorProto> = packages.into_values().map(canonicalize).collect();
    let digest = Sha256::digest(FileDescriptorSet { file: files }.encode_to_vec());
    digest[..8]
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

/// Sorts a merged package file. It holds only types, services and extensions (no imports, options or
/// comments: `fingerprint` builds it from those alone), so nothing else needs canonicalizing.
fn canonicalize(mut file: FileDescriptorProto) -> FileDescriptorProto {
    canonical_messages(&mut file.message_type);
    canonical_enums(&mut file.enum_type);
    file.extension
        .sort_by(|a, b| (a.extendee(), a.number()).cmp(&(b.extendee(), b.number())));
    file.service.sort_by(|a, b| a.name().cmp(b.name()));
    for service in &mut file.service {
        service.method.sort_by(|a, b| a.name().cmp(b.name()));
    }
    file
}

fn canonical_messages(messages: &mut [DescriptorProto]) {
    for message in messages.iter_mut() {
        let mut order: Vec<usize> = (0..message.oneof_decl.len()).collect();
        order.sort_by(|&a, &b| {
            message.oneof_decl[a]
                .name()
                .cmp(message.oneof_decl[b].name())
        });
        let new_index = |old: i32| {
            let old = usize::try_from(old).ok()?;
            order
                .iter()
                .position(|&o| o == old)
                .and_then(|i| i32::try_from(i).ok())
        };
        for field in message.field.iter_mut().chain(message.extension.iter_mut()) {
            field.oneof_index = field.oneof_index.and_then(new_index);
            if field.json_name.as_deref() == Some(default_json_name(field.name()).as_str()) {
                field.json_name = None;
            }
        }
        message.oneof_decl = order
            .iter()
            .map(|&i| message.oneof_decl[i].clone())
            .collect();
        message.field.sort_by_key(|f| f.number());
        message
            .extension
            .sort_by(|a, b| (a.extendee(), a.number()).cmp(&(b.extendee(), b.number())));
        message
            .extension_range
            .sort_by_key(|r| (r.start(), r.end()));
        message.reserved_range.sort_by_key(|r| (r.start(), r.end()));
        message.reserved_name.sort();
        canonical_messages(&mut message.nested_type);
        canonical_enums(&mut message.enum_type);
    }
    messages.sort_by(|a, b| a.name().cmp(b.name()));
}

fn canonical_enums(enums: &mut [EnumDescriptorProto]) {
    for enumeration in enums.iter_mut() {
        enumeration
            .value
            .sort_by(|a, b| (a.number(), a.name()).cmp(&(b.number(), b.name())));
        enumeration
            .reserved_range
            .sort_by_key(|r| (r.start(), r.end()));
        enumeration.reserved_name.sort();
    }
    enums.sort_by(|a, b| a.name().cmp(b.name()));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::printer::tests::compile;

    const ORDERED: &str = r#"
syntax = "proto3";
package demo.v1;
import "google/protobuf/empty.proto";
import "google/protobuf/struct.proto";
// A comment that must not matter.
message A {
  string x = 1;
  oneof first { int32 p = 2; }
  oneof second { int32 q = 3; }
  map<string, B> bs = 4;
}
message B { repeated int32 n = 1; }
enum E { E_ZERO = 0; E_ONE = 1; E_TWO = 2; }
service S {
  rpc One(A) returns (B);
  rpc Two(google.protobuf.Empty) returns (google.protobuf.Struct);
}
"#;

    const REORDERED: &str = r#"
syntax = "proto3";
package demo.v1;
import "google/protobuf/struct.proto";
import "google/protobuf/empty.proto";
option go_package = "example.com/demo";
service S {
  rpc Two(google.protobuf.Empty) returns (google.protobuf.Struct);
  rpc One(A) returns (B);
}
enum E { E_ZERO = 0; E_TWO = 2; E_ONE = 1; }
message B { repeated int32 n = 1; }
message A {
  map<string, B> bs = 4;
  oneof second { int32 q = 3; }
  oneof first { int32 p = 2; }
  string x = 1;
}
"#;

    #[test]
    fn declaration_order_comments_and_file_options_do_not_matter() {
        let a = fingerprint(&compile(&[("demo.proto", ORDERED)]));
        let b = fingerprint(&compile(&[("demo.proto", REORDERED)]));
        assert_eq!(a, b);
        assert_eq!(a.len(), 16);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
    }

    #[test]
    fn renumbering_or_retyping_changes_it() {
        let original = compile(&[("demo.proto", ORDERED)]);
        let base = fingerprint(&original);
        let renumbered = ORDERED.replace("string x = 1;", "string x = 5;");
        let retyped = ORDERED.replace("string x = 1;", "bytes x = 1;");
        for changed in [renumbered, retyped] {
            assert_ne!(fingerprint(&compile(&[("demo.proto", &changed)])), base);
        }
    }
}
