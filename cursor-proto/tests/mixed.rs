//! Bundles that mix: both protobuf-es generations in one bundle, proto2 beside proto3 in one package, and a
//! schema split across chunk files. Each is made in the test from a reference bundle in
//! `../shared/reference/bundles/` (never copied into the tree) and must still give back the reference schema.

use std::path::{Path, PathBuf};

use cursor_proto::compare::{DiffKind, compare};
use cursor_proto::extract::{extract_files, extract_source};
use cursor_proto::fingerprint::fingerprint;
use cursor_proto::install::{compile_dir, locate};
use prost::Message as _;
use prost_types::field_descriptor_proto::{Label, Type};
use prost_types::{DescriptorProto, FieldDescriptorProto, FileDescriptorProto, FileDescriptorSet};

fn shared() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/reference");
    assert!(
        dir.is_dir(),
        "the reference data is expected at {}",
        dir.display()
    );
    dir
}

fn bundle_text(shape: &str) -> String {
    std::fs::read_to_string(shared().join("bundles").join(shape).join("main.js"))
        .expect("reference bundle")
}

/// Differences from the reference schema other than those `allowed` (by kind and path).
fn unexpected(set: &FileDescriptorSet, allowed: impl Fn(DiffKind, &str) -> bool) -> Vec<String> {
    let reference = compile_dir(&shared().join("proto")).expect("reference compiles");
    compare(&reference, set)
        .iter()
        .filter(|d| !(d.kind == DiffKind::ServiceAdded && d.path == "agent.v1.AgentService"))
        .filter(|d| !allowed(d.kind, &d.path))
        .map(ToString::to_string)
        .collect()
}

/// Standard base64, unpadded, as protobuf-es v2 embeds descriptors.
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk.iter().fold(0u32, |n, b| (n << 8) | u32::from(*b)) << (8 * (3 - chunk.len()));
        for i in 0..=chunk.len() {
            out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
        }
    }
    out
}

fn field(name: &str, number: i32, kind: Type, type_name: Option<&str>) -> FieldDescriptorProto {
    let mut field = FieldDescriptorProto {
        name: Some(name.into()),
        number: Some(number),
        type_name: type_name.map(Into::into),
        ..Default::default()
    };
    field.set_type(kind);
    field.set_label(Label::Optional);
    field
}

#[test]
fn a_bundle_with_both_generations_takes_each_type_from_where_it_is_and_says_so() {
    // A v1 bundle plus one v2 file: a new message that uses a v1 type, and a copy of a v1 type.
    let file = FileDescriptorProto {
        name: Some("agent_v1_next.proto".into()),
        package: Some("agent.v1".into()),
        syntax: Some("proto3".into()),
        message_type: vec![
            DescriptorProto {
                name: Some("OnlyInV2".into()),
                field: vec![
                    field("text", 1, Type::String, None),
                    field("user", 2, Type::Message, Some(".agent.v1.UserMessage")),
                ],
                ..Default::default()
            },
            DescriptorProto {
                name: Some("AbortArgs".into()),
                ..Default::default()
            },
        ],
        ..Default::default()
    };
    let text = format!(
        "{}\n;var fd=function(s,d){{return s}};var nx=fd(\"{}\",[]);",
        bundle_text("legacy"),
        base64(&file.encode_to_vec())
    );
    let extraction = extract_source(Path::new("mixed.js"), &text).expect("extracts");
    assert!(
        extraction.unresolved.is_empty(),
        "{:?}",
        extraction.unresolved
    );
    let source = &extraction.sources[0];
    assert_eq!(source.v2_types, 2, "two types read from the v2 descriptor");
    assert!(source.v1_types > 4000, "{source:?}");
    assert!(
        extraction.duplicates >= 1,
        "the v2 copy of AbortArgs is a duplicate"
    );
    let others = unexpected(&extraction.descriptors, |kind, path| {
        kind == DiffKind::MessageAdded && path == "agent.v1.OnlyInV2"
    });
    assert!(others.is_empty(), "{others:#?}");
    let only = extraction
        .descriptors
        .file
        .iter()
        .flat_map(|f| &f.message_type)
        .find(|m| m.name() == "OnlyInV2")
        .expect("the v2-only message is in the schema");
    assert_eq!(only.field[1].type_name(), ".agent.v1.UserMessage");
}

/// protobuf-es v1's own `descriptor.proto` classes (proto2, a `default:` value, a top-level enum made by the
/// proto2 runtime), written as esbuild lowers them.
const PROTO2_DESCRIPTOR_CLASSES: &str = r#"
;(function(){var P2=mk("proto2",{});
var JT;(function(e){e[e.JS_NORMAL=0]="JS_NORMAL"})(JT||(JT={}));P2.util.setEnumType(JT,"google.protobuf.FieldOptions.JSType",[{no:0,name:"JS_NORMAL"},{no:1,name:"JS_STRING"}]);
var ED;(function(e){e[e.EDITION_UNKNOWN=0]="EDITION_UNKNOWN"})(ED||(ED={}));P2.util.setEnumType(ED,"google.protobuf.Edition",[{no:0,name:"EDITION_UNKNOWN"},{no:1000,name:"EDITION_2023"}]);
var FO=class{};FO.runtime=P2;FO.typeName="google.protobuf.FieldOptions";FO.fields=P2.util.newFieldList(()=>[{no:2,name:"packed",kind:"scalar",T:8,opt:!0},{no:3,name:"deprecated",kind:"scalar",T:8,opt:!0,default:!1},{no:6,name:"jstype",kind:"enum",T:P2.getEnumType(JT),opt:!0}]);
var FD=class{};FD.runtime=P2;FD.typeName="google.protobuf.FileDescriptorProto";FD.fields=P2.util.newFieldList(()=>[{no:1,name:"name",kind:"scalar",T:9,opt:!0},{no:14,name:"edition",kind:"enum",T:P2.getEnumType(ED),opt:!0}]);
})();
"#;

#[test]
fn a_proto2_google_protobuf_descriptor_beside_proto3_well_known_types_compiles() {
    let text = format!("{}\n{PROTO2_DESCRIPTOR_CLASSES}", bundle_text("legacy"));
    let extraction =
        extract_source(Path::new("proto2.js"), &text).expect("a mix of syntaxes compiles");
    assert!(
        extraction.unresolved.is_empty(),
        "{:?}",
        extraction.unresolved
    );
    let files = &extraction.descriptors.file;
    let syntax_of = |name: &str| {
        files
            .iter()
            .find(|f| f.name() == name)
            .map(|f| f.syntax().to_owned())
            .unwrap_or_else(|| {
                panic!(
                    "{name} missing: {:?}",
                    files.iter().map(|f| f.name()).collect::<Vec<_>>()
                )
            })
    };
    // protox reports proto2 as an empty syntax.
    assert!(matches!(
        syntax_of("google/protobuf/descriptor.proto").as_str(),
        "" | "proto2"
    ));
    assert_eq!(syntax_of("google/protobuf/struct.proto"), "proto3");
    let options = files
        .iter()
        .flat_map(|f| &f.message_type)
        .find(|m| m.name() == "FieldOptions")
        .expect("FieldOptions");
    let deprecated = options
        .field
        .iter()
        .find(|f| f.name() == "deprecated")
        .expect("field");
    assert_eq!(deprecated.default_value(), "false");
    // The protocol packages are exactly the reference.
    let others = unexpected(&extraction.descriptors, |kind, path| {
        matches!(kind, DiffKind::MessageAdded | DiffKind::EnumAdded)
            && path.starts_with("google.protobuf.")
    });
    assert!(others.is_empty(), "{others:#?}");
}

/// The webpack reference bundle with its `aiserver.v1` module (id 684) moved into a lazy-loaded chunk, as
/// webpack writes one: `(self.webpackChunk…=…||[]).push([[id],{684(e,t,n){…}}])`. Types in each file refer
/// to types in the other through the module registry.
fn split_webpack(dir: &Path) -> (PathBuf, PathBuf) {
    let text = bundle_text("webpack");
    let start = text.find(",684(e,t,n){").expect("module 684");
    let end = start
        + text[start..]
            .find("},571(e,t,n){")
            .expect("module 571 follows")
        + 1;
    let module = &text[start + 1..end];
    let main = format!("{}{}", &text[..start], &text[end..]);
    let chunk = format!(
        "\"use strict\";(self.webpackChunkcursor=self.webpackChunkcursor||[]).push([[1],{{{module}}}]);"
    );
    let dist = dir.join("cursor-always-local/dist");
    std::fs::create_dir_all(&dist).expect("mkdir");
    std::fs::write(dir.join("cursor-always-local/package.json"), "{}").expect("write");
    let (main_path, chunk_path) = (dist.join("main.js"), dist.join("1.main.js"));
    std::fs::write(&main_path, main).expect("write main");
    std::fs::write(&chunk_path, chunk).expect("write chunk");
    (main_path, chunk_path)
}

#[test]
fn the_reference_schema_split_across_two_chunk_files_gives_the_one_file_result() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (main, chunk) = split_webpack(dir.path());
    // Either file alone is missing half the schema: the split is real.
    let alone = extract_files(std::slice::from_ref(&main)).expect("main alone extracts");
    assert!(
        !alone.unresolved.is_empty(),
        "the main file alone resolves everything?"
    );
    // The extension directory leads to both files, main first.
    let found = locate(Some(&dir.path().join("cursor-always-local"))).expect("located");
    assert_eq!(found.bundles, vec![main.clone(), chunk.clone()]);
    let together = extract_files(&found.bundles).expect("both extract");
    assert!(together.unresolved.is_empty(), "{:#?}", together.unresolved);
    let others = unexpected(&together.descriptors, |_, _| false);
    assert!(others.is_empty(), "{others:#?}");
    let whole = extract_files(&[shared().join("bundles/webpack/main.js")]).expect("whole");
    assert_eq!(
        fingerprint(&together.descriptors),
        fingerprint(&whole.descriptors)
    );
    // Which file gave what: the chunk carries aiserver.v1's messages, the main file the rest.
    let [main_source, chunk_source] = together.sources.as_slice() else {
        panic!("two sources: {:?}", together.sources);
    };
    assert!(chunk_source.used > 3000, "{chunk_source:?}");
    assert!(main_source.used > 700, "{main_source:?}");
    assert_eq!(
        main_source.used + chunk_source.used,
        whole.sources[0].used,
        "every type comes from exactly one file"
    );
}
