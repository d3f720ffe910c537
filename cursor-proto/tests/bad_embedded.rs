//! Bad protobuf-es v2 input and bad merges never panic: an embedded descriptor that is cut short, corrupt base64,
//! bytes that do not parse as a `FileDescriptorProto`, a dependency array naming something unknown, and two
//! copies of one type that disagree (in one bundle: an error; in two files: the newest wins with a warning
//! naming both). Each names the file and the type. The fixtures are small v2 bundles built here with
//! prost-types; `tests/bad_input.rs` covers the v1 side and the command line.

use std::path::{Path, PathBuf};

use cursor_proto::extract::{ExtractError, Extraction, extract_file};
use prost_types::FileDescriptorSet;

fn write(dir: &Path, name: &str, bytes: impl AsRef<[u8]>) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, bytes).expect("write fixture");
    path
}

fn extract_text(text: &str) -> (tempfile::TempDir, PathBuf, Result<Extraction, ExtractError>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = write(dir.path(), "main.js", text);
    let result = extract_file(&path);
    (dir, path, result)
}

fn error_of(text: &str) -> (PathBuf, ExtractError, tempfile::TempDir) {
    let (dir, path, result) = extract_text(text);
    match result {
        Ok(extraction) => panic!("expected an error, got a schema: {:?}", extraction.counts),
        Err(error) => (path, error, dir),
    }
}

fn assert_names(text: &str, wanted: &[&str]) {
    for want in wanted {
        assert!(text.contains(want), "{want:?} not in: {text}");
    }
}

fn fields_of(set: &FileDescriptorSet, package: &str, message: &str) -> Vec<String> {
    set.file
        .iter()
        .filter(|f| f.package() == package)
        .flat_map(|f| &f.message_type)
        .find(|m| m.name() == message)
        .unwrap_or_else(|| panic!("{package}.{message} missing"))
        .field
        .iter()
        .map(|f| f.name().to_owned())
        .collect()
}

fn shown(path: &Path) -> String {
    path.display().to_string()
}

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

/// A v2 `.proto` file `name` in package `t.v1` with one message `Thing` holding the given string fields.
fn v2_file(name: &str, fields: &[(&str, i32)]) -> String {
    use prost::Message as _;
    use prost_types::field_descriptor_proto::{Label, Type};
    let file = prost_types::FileDescriptorProto {
        name: Some(name.into()),
        package: Some("t.v1".into()),
        syntax: Some("proto3".into()),
        message_type: vec![prost_types::DescriptorProto {
            name: Some("Thing".into()),
            field: fields
                .iter()
                .map(|(field, number)| {
                    let mut f = prost_types::FieldDescriptorProto {
                        name: Some((*field).into()),
                        number: Some(*number),
                        ..Default::default()
                    };
                    f.set_type(Type::String);
                    f.set_label(Label::Optional);
                    f
                })
                .collect(),
            ..Default::default()
        }],
        ..Default::default()
    };
    base64(&file.encode_to_vec())
}

/// A v2 bundle: a good file `a.proto` plus `extra` (more calls), through a minified `fileDesc`.
fn v2_bundle(extra: &str) -> String {
    format!(
        "var y=function(s,d){{return s}};var a=y(\"{}\");{extra}",
        v2_file("a.proto", &[("x", 1)])
    )
}

#[test]
fn a_truncated_embedded_descriptor_is_left_out_naming_its_file() {
    let broken = v2_file("b.proto", &[("y", 1), ("z", 2)]);
    for cut in [1, 2, 5] {
        let text = v2_bundle(&format!(
            "var b=y(\"{}\",[a]);",
            &broken[..broken.len() - cut]
        ));
        let (_dir, _path, result) = extract_text(&text);
        let extraction = result.expect("the good file still gives a schema");
        let problem = extraction
            .unresolved
            .iter()
            .find(|u| u.type_name == "b.proto")
            .unwrap_or_else(|| {
                panic!(
                    "cut {cut}: b.proto not reported: {:?}",
                    extraction.unresolved
                )
            });
        assert!(problem.reason.contains("truncated"), "cut {cut}: {problem}");
        assert!(problem.reason.contains("line 1"), "{problem}");
    }
}

#[test]
fn corrupt_base64_names_the_character_and_the_file() {
    let mut broken = v2_file("b.proto", &[("y", 1)]);
    broken.insert(20, '!');
    let (_dir, _path, result) = extract_text(&v2_bundle(&format!("var b=y(\"{broken}\");")));
    let extraction = result.expect("the good file still gives a schema");
    let text: Vec<String> = extraction
        .unresolved
        .iter()
        .map(ToString::to_string)
        .collect();
    assert!(
        text.iter()
            .any(|t| t.starts_with("b.proto: ") && t.contains("'!' at character 21")),
        "{text:?}"
    );
}

#[test]
fn a_descriptor_that_does_not_parse_is_reported_and_only_it_is_left_out() {
    // The name is readable, what follows is not a FileDescriptorProto (field 15 with wire type 7).
    let mut bytes = vec![0x0A, 7];
    bytes.extend_from_slice(b"b.proto");
    bytes.extend_from_slice(&[0x7F, 0xFF, 0xFF]);
    let text = v2_bundle(&format!("var b=y(\"{}\");", base64(&bytes)));
    let (_dir, _path, result) = extract_text(&text);
    let extraction = result.expect("the good file still gives a schema");
    assert_eq!(
        extraction.unresolved.len(),
        1,
        "{:?}",
        extraction.unresolved
    );
    let problem = &extraction.unresolved[0];
    assert_eq!(problem.type_name, "b.proto");
    assert!(
        problem
            .reason
            .contains("do not parse as a FileDescriptorProto"),
        "{problem}"
    );
    assert_eq!(fields_of(&extraction.descriptors, "t.v1", "Thing"), ["x"]);
}

#[test]
fn a_dependency_naming_nothing_known_is_a_warning_naming_file_and_dependency() {
    let text = v2_bundle(&format!(
        "var q=5;var b=y(\"{}\",[a,q,nowhere]);",
        v2_file("b.proto", &[("x", 1)])
    ));
    let (_dir, _path, result) = extract_text(&text);
    let extraction = result.expect("extracts");
    let text: Vec<String> = extraction
        .unresolved
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        text.len(),
        2,
        "`a` resolves, `q` and `nowhere` do not: {text:?}"
    );
    assert!(
        text[0].starts_with("b.proto: dependency #2 (`q`)"),
        "{text:?}"
    );
    assert!(
        text[1].starts_with("b.proto: dependency #3 (`nowhere`)"),
        "{text:?}"
    );
}

#[test]
fn two_embedded_files_defining_one_type_differently_conflict_naming_file_and_type() {
    let text = v2_bundle(&format!(
        "var b=y(\"{}\");",
        v2_file("b.proto", &[("x", 1), ("other", 2)])
    ));
    let (path, error, _dir) = error_of(&text);
    let message = error.to_string();
    assert_names(&message, &[&shown(&path), "t.v1.Thing", "other = 2"]);
}

#[test]
fn two_files_defining_one_type_differently_use_the_newest_with_a_warning_naming_both() {
    let dir = tempfile::tempdir().expect("tempdir");
    let old = write(dir.path(), "old.js", v2_bundle(""));
    let new = write(
        dir.path(),
        "new.js",
        format!(
            "var y=function(s){{return s}};y(\"{}\");",
            v2_file("b.proto", &[("x", 1), ("added", 2)])
        ),
    );
    let set_time = |path: &Path, seconds: u64| {
        let file = std::fs::File::options()
            .write(true)
            .open(path)
            .expect("open");
        file.set_modified(std::time::UNIX_EPOCH + std::time::Duration::from_secs(seconds))
            .expect("set mtime");
    };
    set_time(&old, 1_000_000);
    set_time(&new, 2_000_000);
    // The older file first (as the agent extension would be): the newer copy still wins.
    let extraction =
        cursor_proto::extract::extract_files(&[old.clone(), new.clone()]).expect("extracts");
    assert_eq!(
        fields_of(&extraction.descriptors, "t.v1", "Thing"),
        ["x", "added"]
    );
    let [superseded] = extraction.superseded.as_slice() else {
        panic!("one warning: {:?}", extraction.superseded);
    };
    let warning = superseded.to_string();
    assert_names(
        &warning,
        &["t.v1.Thing", &shown(&old), &shown(&new), "added = 2"],
    );
    assert_eq!(superseded.used, new);
    // Made older, the same file loses.
    set_time(&new, 1);
    let extraction = cursor_proto::extract::extract_files(&[old, new.clone()]).expect("extracts");
    assert_eq!(fields_of(&extraction.descriptors, "t.v1", "Thing"), ["x"]);
    assert_eq!(extraction.superseded[0].dropped, new);
}
