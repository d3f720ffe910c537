//! Known answer: each reference bundle in `../shared/reference/bundles/` (real protobuf-es code generated
//! from `../shared/reference/proto/`, bundled four ways with protobuf-es v1 and once with v2) must give back, by meaning, every message, field,
//! enum value and service method of the reference schema, plus `agent.v1.AgentService`, which the bundles
//! declare and the reference `.proto` files do not. Descriptors are compared field by field, not text.

use std::path::{Path, PathBuf};

use cursor_proto::compare::{DiffKind, compare};
use cursor_proto::extract::extract_file;
use cursor_proto::fingerprint::fingerprint;
use cursor_proto::install::compile_dir;
use prost_types::FileDescriptorSet;

fn shared() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/reference");
    assert!(
        dir.is_dir(),
        "the reference data is expected at {} (shared/ beside the checkout)",
        dir.display()
    );
    dir
}

fn reference() -> FileDescriptorSet {
    compile_dir(&shared().join("proto")).expect("the reference schema compiles")
}

fn method<'a>(
    set: &'a FileDescriptorSet,
    service: &str,
    name: &str,
) -> &'a prost_types::MethodDescriptorProto {
    set.file
        .iter()
        .filter(|f| f.package() == "agent.v1")
        .flat_map(|f| &f.service)
        .filter(|s| s.name() == service)
        .flat_map(|s| &s.method)
        .find(|m| m.name() == name)
        .unwrap_or_else(|| panic!("agent.v1.{service}/{name} missing"))
}

fn assert_bundle_means_the_reference(shape: &str) {
    let reference = reference();
    let bundle = shared().join("bundles").join(shape).join("main.js");
    let extraction = extract_file(&bundle).expect("the bundle extracts");
    assert!(
        extraction.unresolved.is_empty(),
        "{shape}: unresolved: {:#?}",
        extraction.unresolved
    );
    let differences = compare(&reference, &extraction.descriptors);
    // The only difference allowed: the bundle declares agent.v1.AgentService, the reference files do not.
    let unexpected: Vec<String> = differences
        .iter()
        .filter(|d| !(d.kind == DiffKind::ServiceAdded && d.path == "agent.v1.AgentService"))
        .map(ToString::to_string)
        .collect();
    assert!(
        unexpected.is_empty(),
        "{shape}: {} differences from the reference:\n{}",
        unexpected.len(),
        unexpected.join("\n")
    );
    let set = &extraction.descriptors;
    let run = method(set, "AgentService", "Run");
    assert_eq!(run.input_type(), ".agent.v1.AgentClientMessage");
    assert_eq!(run.output_type(), ".agent.v1.AgentServerMessage");
    assert!(
        run.client_streaming() && run.server_streaming(),
        "Run is bidi"
    );
    let sse = method(set, "AgentService", "RunSSE");
    assert_eq!(sse.input_type(), ".aiserver.v1.BidiRequestId");
    assert_eq!(sse.output_type(), ".agent.v1.AgentServerMessage");
    assert!(
        !sse.client_streaming() && sse.server_streaming(),
        "RunSSE is server streaming"
    );
    let models = method(set, "AgentService", "GetUsableModels");
    assert!(
        !models.client_streaming() && !models.server_streaming(),
        "GetUsableModels is unary"
    );
    // One file per package, with the imports protoc needs.
    let names: Vec<&str> = extraction.files.iter().map(|(n, _)| n.as_str()).collect();
    for expected in [
        "agent_v1.proto",
        "aiserver_v1.proto",
        "google/protobuf/struct.proto",
    ] {
        assert!(
            names.contains(&expected),
            "{shape}: {expected} not written: {names:?}"
        );
    }
}

#[test]
fn legacy_bundle_assignments_after_the_class() {
    assert_bundle_means_the_reference("legacy");
}

#[test]
fn modern_bundle_native_static_fields() {
    assert_bundle_means_the_reference("modern");
}

#[test]
fn static_blocks_bundle() {
    assert_bundle_means_the_reference("static-blocks");
}

#[test]
fn webpack_bundle_with_cross_module_exports() {
    assert_bundle_means_the_reference("webpack");
}

#[test]
fn protobuf_es_v2_bundle_with_embedded_descriptors() {
    assert_bundle_means_the_reference("v2-esbuild");
}

#[test]
fn every_bundle_shape_gives_one_fingerprint() {
    let prints: Vec<String> = ["legacy", "modern", "static-blocks", "webpack", "v2-esbuild"]
        .iter()
        .map(|shape| {
            let bundle = shared().join("bundles").join(shape).join("main.js");
            fingerprint(&extract_file(&bundle).expect("extracts").descriptors)
        })
        .collect();
    assert!(prints.windows(2).all(|w| w[0] == w[1]), "{prints:?}");
}

#[test]
fn a_bundle_and_the_reference_schema_have_one_fingerprint_once_the_agent_service_is_set_aside() {
    // The server declares agent.v1.AgentService itself and fingerprints the schema without it, so a build
    // from the reference directory and a build from an install of the same schema report the same fingerprint.
    let mut reference = reference();
    let bundle = shared().join("bundles/legacy/main.js");
    let mut extracted = extract_file(&bundle).expect("extracts").descriptors;
    assert!(cursor_proto::compare::take_service(&mut extracted, "agent.v1.AgentService").is_some());
    assert!(cursor_proto::compare::take_service(&mut reference, "agent.v1.AgentService").is_none());
    assert_eq!(fingerprint(&reference), fingerprint(&extracted));
}
