//! Bad input never panics: a non-JavaScript file, a bundle without protobuf classes, a truncated bundle, a field
//! or method that references an unknown identifier, an unreadable enum, two classes claiming one full name, and
//! pathological nesting each give a clear error naming the file and the type, or a warning with a count where the
//! rest of the schema is still sound. Small protobuf-es-style fixtures are written inline to a temporary
//! directory; the truncated bundle and the end-to-end runs of the `cursor-proto` binary use the reference bundles.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use cursor_proto::extract::{ExtractError, Extraction, extract_file, extract_source};
use prost_types::FileDescriptorSet;

/// `shared/` lives beside the repository checkout.
const SHARED: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/reference");

fn legacy_bundle() -> PathBuf {
    Path::new(SHARED).join("bundles/legacy/main.js")
}

/// A protobuf-es (v1) runtime stand-in: what matters to the extractor is `mk("proto3")`.
const RUNTIME: &str = r#"var rt=mk("proto3");"#;

/// A message class as TypeScript lowers it (assignments after the class).
fn message(var: &str, name: &str, fields: &str) -> String {
    format!(
        "var {var}=class{{}};{var}.runtime=rt;{var}.typeName=\"{name}\";\
         {var}.fields=rt.util.newFieldList(()=>[{fields}]);"
    )
}

fn write(dir: &Path, name: &str, bytes: impl AsRef<[u8]>) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, bytes).expect("write fixture");
    path
}

/// Writes a fixture and extracts it.
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

/// Field names of a message in the extracted descriptors.
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

// ---------------------------------------------------------------------------------------------------------------
// Files that are not a protobuf-es bundle at all.

#[test]
fn a_png_is_not_a_text_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let png = [
        0x89, b'P', b'N', b'G', b'\r', b'\n', 0x1a, b'\n', 0, 0, 0, 13, b'I', b'H', b'D', b'R',
        0xff, 0xd8,
    ];
    let path = write(dir.path(), "logo.png", png);
    let error = extract_file(&path).expect_err("a PNG is no bundle");
    assert!(
        matches!(error, ExtractError::NotText { offset: 0, .. }),
        "{error:?}"
    );
    assert_names(&error.to_string(), &[&shown(&path), "not a text file"]);
}

#[test]
fn a_python_file_is_not_javascript_and_is_not_called_truncated() {
    let (path, error, _dir) = error_of("def main():\n    return [1, 2]\n\nprint(main())\n");
    assert!(
        matches!(
            error,
            ExtractError::NotJavaScript {
                line: 1,
                cut_short: false,
                ..
            }
        ),
        "{error:?}"
    );
    let text = error.to_string();
    assert_names(&text, &[&shown(&path), "not JavaScript", "line 1"]);
    assert!(!text.contains("truncated"), "{text}");
}

#[test]
fn an_empty_file_says_so() {
    for text in ["", "\n  \n"] {
        let (path, error, _dir) = error_of(text);
        assert!(matches!(error, ExtractError::Empty { .. }), "{error:?}");
        assert_names(&error.to_string(), &[&shown(&path), "is empty"]);
    }
}

#[test]
fn a_bundle_without_protobuf_classes() {
    let (path, error, _dir) = error_of(
        "var a=require(\"fs\");function b(c){return c.typeName}exports.d={typeName:\"x\"};",
    );
    assert!(
        matches!(error, ExtractError::NoProtobuf { .. }),
        "{error:?}"
    );
    assert_names(
        &error.to_string(),
        &[&shown(&path), "no protobuf-es message classes"],
    );
}

#[test]
fn the_legacy_bundle_cut_in_half_is_called_truncated() {
    let text = std::fs::read_to_string(legacy_bundle()).expect("the legacy reference bundle");
    let half = &text[..text.floor_char_boundary(text.len() / 2)];
    let (path, error, _dir) = error_of(half);
    assert!(
        matches!(
            error,
            ExtractError::NotJavaScript {
                cut_short: true,
                ..
            }
        ),
        "{error:?}"
    );
    assert_names(&error.to_string(), &[&shown(&path), "truncated"]);
}

#[test]
fn nesting_100_000_deep_is_an_error_not_a_stack_overflow() {
    for (what, text) in [
        ("brackets", format!("var a={};", "[".repeat(100_000))),
        ("parentheses", format!("var a={}1;", "(".repeat(100_000))),
        (
            "balanced brackets",
            format!("var a={}{};", "[".repeat(100_000), "]".repeat(100_000)),
        ),
        (
            "prefix operators",
            format!("var a={}1;", "!".repeat(100_000)),
        ),
        (
            "conditionals",
            format!("var a={}1;", "b?c:".repeat(100_000)),
        ),
    ] {
        let (path, error, _dir) = error_of(&text);
        assert!(
            matches!(error, ExtractError::TooDeep { line: 1, .. }),
            "{what}: {error:?}"
        );
        assert_names(&error.to_string(), &[&shown(&path), "nests deeper than"]);
    }
}

#[test]
fn nesting_just_under_the_limit_is_read() {
    // 5,000 levels: more than any generated code and well above what a 2 MiB test thread's stack holds for
    // oxc in a debug build; the reader's own stack carries it.
    let text = format!(
        "{RUNTIME}var deep={}1{};{}",
        "[".repeat(5_000),
        "]".repeat(5_000),
        message("A", "x.v1.A", r#"{no:1,name:"b",kind:"scalar",T:9}"#)
    );
    let (_dir, _path, result) = extract_text(&text);
    let extraction = result.expect("extracts");
    assert_eq!(
        fields_of(&extraction.descriptors, "x.v1", "A"),
        ["b"],
        "{:?}",
        extraction.unresolved
    );
}

// ---------------------------------------------------------------------------------------------------------------
// Bundles with protobuf classes, some of which cannot be used.

#[test]
fn an_unknown_identifier_in_t_leaves_that_field_out_with_one_warning() {
    let text = format!(
        "{RUNTIME}{}",
        message(
            "A",
            "x.v1.A",
            r#"{no:1,name:"b",kind:"message",T:Nope},{no:2,name:"c",kind:"scalar",T:9}"#
        )
    );
    let (_dir, _path, result) = extract_text(&text);
    let extraction = result.expect("the rest of the schema is sound");
    assert_eq!(
        extraction.unresolved.len(),
        1,
        "{:?}",
        extraction.unresolved
    );
    let unresolved = &extraction.unresolved[0];
    assert_eq!(
        (unresolved.type_name.as_str(), unresolved.member.as_str()),
        ("x.v1.A", "b")
    );
    assert_names(&unresolved.to_string(), &["x.v1.A.b", "`Nope`"]);
    assert_eq!(fields_of(&extraction.descriptors, "x.v1", "A"), ["c"]);
    assert_eq!(extraction.counts["x.v1"].fields, 1);
}

#[test]
fn two_classes_claiming_one_name_with_different_fields_conflict() {
    let text = format!(
        "{RUNTIME}{}{}",
        message("A", "x.v1.A", r#"{no:1,name:"b",kind:"scalar",T:9}"#),
        message("B", "x.v1.A", r#"{no:2,name:"b",kind:"scalar",T:9}"#)
    );
    let (path, error, _dir) = error_of(&text);
    match &error {
        ExtractError::Conflict { type_name, .. } => assert_eq!(type_name, "x.v1.A"),
        other => panic!("expected a conflict, got {other:?}"),
    }
    assert_names(
        &error.to_string(),
        &[&shown(&path), "x.v1.A", "b = 1", "b = 2"],
    );

    // The same numbers and names, another type: the differing field is named.
    let text = format!(
        "{RUNTIME}{}{}",
        message("A", "x.v1.A", r#"{no:1,name:"b",kind:"scalar",T:9}"#),
        message("B", "x.v1.A", r#"{no:1,name:"b",kind:"scalar",T:5}"#)
    );
    let (_path, error, _dir) = error_of(&text);
    assert_names(&error.to_string(), &["x.v1.A", "field b = 1 differs"]);
}

#[test]
fn identical_copies_are_merged_and_counted() {
    let one = message(
        "A",
        "x.v1.A",
        r#"{no:1,name:"b",kind:"scalar",T:9},{no:2,name:"c",kind:"message",T:A}"#,
    );
    // A third copy declares the same fields in another order: the same meaning, so a duplicate too.
    let reordered = message(
        "A",
        "x.v1.A",
        r#"{no:2,name:"c",kind:"message",T:A},{no:1,name:"b",kind:"scalar",T:9}"#,
    );
    let text = format!(
        "{RUNTIME}{one}(function(){{{RUNTIME}{one}}})();(function(){{{RUNTIME}{reordered}}})();"
    );
    let (_dir, _path, result) = extract_text(&text);
    let extraction = result.expect("identical copies merge");
    assert_eq!(extraction.duplicates, 2);
    assert!(
        extraction.unresolved.is_empty(),
        "{:?}",
        extraction.unresolved
    );
    assert_eq!(fields_of(&extraction.descriptors, "x.v1", "A"), ["b", "c"]);
}

#[test]
fn an_unreadable_enum_value_is_reported_and_the_others_kept() {
    let text = format!(
        "{RUNTIME}var E={{}};rt.util.setEnumType(E,\"x.v1.E\",[{{no:0,name:\"E_UNSPECIFIED\"}},\
         {{no:\"one\",name:\"E_ONE\"}},{{no:2,name:\"E_TWO\"}},f()]);{}",
        message(
            "A",
            "x.v1.A",
            r#"{no:1,name:"e",kind:"enum",T:rt.getEnumType(E)}"#
        )
    );
    let (_dir, _path, result) = extract_text(&text);
    let extraction = result.expect("the rest of the schema is sound");
    let listed: Vec<String> = extraction
        .unresolved
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(listed.len(), 2, "{listed:#?}");
    assert_names(&listed[0], &["x.v1.E.E_ONE", "value number", "\"one\""]);
    assert_names(
        &listed[1],
        &["x.v1.E.value #4", "not an object literal", "f()"],
    );
    let values: Vec<&str> = extraction
        .descriptors
        .file
        .iter()
        .flat_map(|f| &f.enum_type)
        .find(|e| e.name() == "E")
        .expect("x.v1.E")
        .value
        .iter()
        .map(|v| v.name())
        .collect();
    assert_eq!(values, ["E_UNSPECIFIED", "E_TWO"]);
    assert_eq!(fields_of(&extraction.descriptors, "x.v1", "A"), ["e"]);
}

#[test]
fn an_enum_whose_value_list_cannot_be_read_is_left_out_with_the_fields_using_it() {
    let text = format!(
        "{RUNTIME}var E={{}},vals=load();rt.util.setEnumType(E,\"x.v1.E\",vals);{}",
        message(
            "A",
            "x.v1.A",
            r#"{no:1,name:"e",kind:"enum",T:rt.getEnumType(E)},{no:2,name:"s",kind:"scalar",T:9}"#
        )
    );
    let (_dir, _path, result) = extract_text(&text);
    let extraction = result.expect("the rest of the schema is sound");
    let listed: Vec<String> = extraction
        .unresolved
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(listed.len(), 3, "{listed:#?}");
    assert_names(
        &listed[0],
        &["x.v1.E: its value list could not be read", "`vals`"],
    );
    assert_names(&listed[1], &["x.v1.E: no value could be read"]);
    assert_names(&listed[2], &["x.v1.A.e", "x.v1.E was left out"]);
    assert_eq!(fields_of(&extraction.descriptors, "x.v1", "A"), ["s"]);
    assert_eq!(extraction.counts["x.v1"].enums, 0);
}

#[test]
fn a_service_method_whose_input_does_not_resolve_is_left_out() {
    let text = format!(
        "{RUNTIME}{}var S={{typeName:\"x.v1.S\",methods:{{get:{{name:\"Get\",I:Missing,O:A,kind:0}},\
         put:{{name:\"Put\",I:A,O:A,kind:0}}}}}};",
        message("A", "x.v1.A", r#"{no:1,name:"b",kind:"scalar",T:9}"#)
    );
    let (_dir, _path, result) = extract_text(&text);
    let extraction = result.expect("the rest of the schema is sound");
    let listed: Vec<String> = extraction
        .unresolved
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(listed.len(), 1, "{listed:#?}");
    assert_names(&listed[0], &["x.v1.S.Get", "input type", "`Missing`"]);
    let methods: Vec<&str> = extraction
        .descriptors
        .file
        .iter()
        .flat_map(|f| &f.service)
        .flat_map(|s| &s.method)
        .map(|m| m.name())
        .collect();
    assert_eq!(methods, ["Put"]);
}

#[test]
fn what_protoc_would_refuse_is_left_out_by_name() {
    let text = format!(
        "{RUNTIME}var E={{}};rt.util.setEnumType(E,\"x.v1.E\",[{{no:0,name:\"E_ZERO\"}}]);{}",
        message(
            "A",
            "x.v1.A",
            r#"{no:1,name:"ok",kind:"scalar",T:9},
               {no:2,name:"wrong_kind",kind:"message",T:E},
               {no:1,name:"same_number",kind:"scalar",T:5},
               {no:3,name:"bad-name",kind:"scalar",T:9},
               {no:19500,name:"reserved",kind:"scalar",T:9},
               {no:4,name:"double_key",kind:"map",K:1,V:{kind:"scalar",T:9}}"#
        )
    );
    let (_dir, _path, result) = extract_text(&text);
    let extraction = result.expect("the rest of the schema is sound");
    let listed: Vec<String> = extraction
        .unresolved
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(listed.len(), 5, "{listed:#?}");
    for (line, wanted) in listed.iter().zip([
        [
            "x.v1.A.wrong_kind",
            "is an enum, where a message is expected",
        ],
        ["x.v1.A.same_number", "number 1 is also field `ok`"],
        ["x.v1.A.bad-name", "not a valid field name"],
        ["x.v1.A.reserved", "19500"],
        ["x.v1.A.double_key", "cannot be a map key"],
    ]) {
        assert_names(line, &wanted);
    }
    assert_eq!(fields_of(&extraction.descriptors, "x.v1", "A"), ["ok"]);
}

#[test]
fn every_prefix_of_a_fixture_gives_a_schema_or_an_error_never_a_panic() {
    let text = format!(
        "{RUNTIME}var E={{}};rt.util.setEnumType(E,\"x.v1.E\",[{{no:0,name:\"E_A\"}},{{no:1,name:\"E_B\"}}]);{}{}\
         var S={{typeName:\"x.v1.S\",methods:{{run:{{name:\"Run\",I:A,O:B,kind:3}}}}}};",
        message(
            "A",
            "x.v1.A",
            r#"{no:1,name:"e",kind:"enum",T:rt.getEnumType(E),oneof:"k"},{no:2,name:"m",kind:"map",K:9,V:{kind:"message",T:B}},{no:3,name:"o",kind:"scalar",T:3,opt:!0,L:1}"#
        ),
        message(
            "B",
            "x.v1.A.B",
            r#"{no:1,name:"r",kind:"message",T:A,repeated:!0}"#
        )
    );
    let path = Path::new("prefix.js");
    let whole = extract_source(path, &text).expect("the whole fixture extracts");
    assert!(whole.unresolved.is_empty(), "{:?}", whole.unresolved);
    for end in 0..text.len() {
        // Any outcome but a panic is fine; every error names the file.
        if let Err(error) = extract_source(path, &text[..end]) {
            assert!(error.to_string().contains("prefix.js"), "{error}");
        }
    }
}

// ---------------------------------------------------------------------------------------------------------------
// The command line, end to end.

fn cursor_proto(args: &[&str], env: &[(&str, &Path)]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_cursor-proto"));
    command.args(args).env_remove("CURSOR_APP_DIR");
    for (key, value) in env {
        command.env(key, value);
    }
    command.output().expect("cursor-proto runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("read_dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

fn arg(path: &Path) -> &str {
    path.to_str().expect("UTF-8 temp path")
}

#[test]
fn cli_extract_writes_one_file_per_package_and_reports_the_counts() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("proto");
    let run = cursor_proto(&["extract", arg(&legacy_bundle()), "--out", arg(&out)], &[]);
    let stdout = text(&run.stdout);
    assert!(run.status.success(), "{stdout}\n{}", text(&run.stderr));
    assert_names(
        &stdout,
        &[
            "agent.v1: ",
            "aiserver.v1: ",
            " messages, ",
            " fields, ",
            "every field and method resolved",
        ],
    );
    assert_eq!(
        entries(&out),
        ["SOURCE", "agent_v1.proto", "aiserver_v1.proto", "google"]
    );
    // The record says which files the schema came from, for the server's banner and `schema-check`.
    let record = std::fs::read_to_string(out.join("SOURCE")).expect("SOURCE written");
    assert_names(
        &record,
        &[
            "fingerprint ",
            &format!("bundle {}", shown(&legacy_bundle())),
        ],
    );
    let well_known = entries(&out.join("google/protobuf"));
    assert!(
        !well_known.is_empty() && well_known.iter().all(|n| n.ends_with(".proto")),
        "{well_known:?}"
    );
}

#[test]
fn cli_extract_of_a_bad_file_fails_naming_it_and_leaves_nothing_behind() {
    let dir = tempfile::tempdir().expect("tempdir");
    let bad = write(dir.path(), "logo.png", [0x89, b'P', b'N', b'G', 0xff, 0]);
    let out = dir.path().join("proto");
    let run = cursor_proto(&["extract", arg(&bad), "--out", arg(&out)], &[]);
    let stderr = text(&run.stderr);
    assert!(!run.status.success(), "{stderr}");
    assert_names(&stderr, &[&shown(&bad), "not a text file"]);
    assert_eq!(entries(dir.path()), ["logo.png"], "no schema, no temp dir");
}

#[test]
fn cli_strict_with_an_unresolved_field_fails_and_writes_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let bundle = write(
        dir.path(),
        "main.js",
        format!(
            "{RUNTIME}{}",
            message("A", "x.v1.A", r#"{no:1,name:"b",kind:"message",T:Nope}"#)
        ),
    );
    let out = dir.path().join("proto");
    let run = cursor_proto(
        &["extract", arg(&bundle), "--out", arg(&out), "--strict"],
        &[],
    );
    let stderr = text(&run.stderr);
    assert!(!run.status.success(), "{stderr}");
    assert_names(
        &stderr,
        &["x.v1.A.b", "Nope", "--strict", "nothing written"],
    );
    assert_eq!(entries(dir.path()), ["main.js"]);

    // Without --strict the same bundle is written, with the warning.
    let run = cursor_proto(&["extract", arg(&bundle), "--out", arg(&out)], &[]);
    assert!(run.status.success(), "{}", text(&run.stderr));
    assert_names(&text(&run.stderr), &["warning", "1 field", "x.v1.A.b"]);
    assert_eq!(entries(&out), ["SOURCE", "x_v1.proto"]);
}

/// The reference schema's package files, copied to `dir`; `edit` may change `agent_v1.proto` on the way.
fn copy_reference(dir: &Path, edit: impl Fn(String) -> String) {
    let reference = Path::new(SHARED).join("proto");
    std::fs::create_dir_all(dir.join("google/protobuf")).expect("mkdir");
    for name in ["agent_v1.proto", "aiserver_v1.proto"] {
        let text = std::fs::read_to_string(reference.join(name)).expect("reference file");
        let text = if name == "agent_v1.proto" {
            edit(text)
        } else {
            text
        };
        std::fs::write(dir.join(name), text).expect("write");
    }
    for name in entries(&reference.join("google/protobuf")) {
        std::fs::copy(
            reference.join("google/protobuf").join(&name),
            dir.join("google/protobuf").join(&name),
        )
        .expect("copy");
    }
}

#[test]
fn cli_diff_of_two_identical_schemas_exits_0() {
    let dir = tempfile::tempdir().expect("tempdir");
    let copy = dir.path().join("copy");
    copy_reference(&copy, |text| text);
    let reference = Path::new(SHARED).join("proto");
    let run = cursor_proto(&["diff", arg(&reference), arg(&copy)], &[]);
    let stdout = text(&run.stdout);
    assert_eq!(
        run.status.code(),
        Some(0),
        "{stdout}\n{}",
        text(&run.stderr)
    );
    assert_names(&stdout, &["the two schemas mean the same"]);
}

#[test]
fn cli_diff_names_a_renumbered_field_and_exits_1() {
    let dir = tempfile::tempdir().expect("tempdir");
    let copy = dir.path().join("copy");
    copy_reference(&copy, |text| {
        let from = "message WaitAction {\n  int32 duration_ms = 1;";
        assert!(text.contains(from), "the reference changed: edit the test");
        text.replacen(from, "message WaitAction {\n  int32 duration_ms = 5;", 1)
    });
    let reference = Path::new(SHARED).join("proto");
    let run = cursor_proto(&["diff", arg(&reference), arg(&copy)], &[]);
    let stdout = text(&run.stdout);
    assert_eq!(
        run.status.code(),
        Some(1),
        "{stdout}\n{}",
        text(&run.stderr)
    );
    assert_names(
        &stdout,
        &["agent.v1.WaitAction.duration_ms", "renumbered", "1 → 5"],
    );

    // The same on a schema directory of one small file.
    let tiny = |number: u32| {
        let dir = dir.path().join(format!("tiny{number}"));
        std::fs::create_dir_all(&dir).expect("mkdir");
        let proto = format!(
            "syntax = \"proto3\";\npackage agent.v1;\nmessage Ping {{\n  string text = 1;\n  int32 count = {number};\n}}\n"
        );
        std::fs::write(dir.join("agent_v1.proto"), proto).expect("write");
        dir
    };
    let (old, new) = (tiny(2), tiny(3));
    let run = cursor_proto(&["diff", arg(&old), arg(&old)], &[]);
    assert_eq!(run.status.code(), Some(0), "{}", text(&run.stdout));
    let run = cursor_proto(&["diff", arg(&old), arg(&new)], &[]);
    let stdout = text(&run.stdout);
    assert_eq!(run.status.code(), Some(1), "{stdout}");
    assert_names(&stdout, &["agent.v1.Ping.count", "renumbered"]);
}

#[test]
fn cli_extract_without_a_path_finds_the_install_in_cursor_app_dir() {
    let dir = tempfile::tempdir().expect("tempdir");
    let install = dir.path().join("Cursor");
    let app = install.join("resources/app");
    let dist = app.join("extensions/cursor-always-local/dist");
    std::fs::create_dir_all(&dist).expect("mkdir");
    std::fs::copy(legacy_bundle(), dist.join("main.js")).expect("copy the bundle");
    std::fs::write(app.join("product.json"), r#"{"version":"9.9.9"}"#).expect("write");
    let out = dir.path().join("proto");
    let run = cursor_proto(
        &["extract", "--out", arg(&out)],
        &[("CURSOR_APP_DIR", &install)],
    );
    let stdout = text(&run.stdout);
    assert!(run.status.success(), "{stdout}\n{}", text(&run.stderr));
    assert_names(
        &stdout,
        &[
            "Cursor version 9.9.9",
            &shown(&dist.join("main.js")),
            "every field and method resolved",
        ],
    );
    assert!(out.join("agent_v1.proto").is_file());
}
