//! The reference schema survives render → write → compile unchanged, by meaning and by fingerprint.

use std::path::Path;

use cursor_proto::compare::compare;
use cursor_proto::fingerprint::fingerprint;
use cursor_proto::printer::render_set;
use cursor_proto::write::write_schema;

/// `shared/` lives beside the repository checkout.
const REFERENCE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/reference/proto");
const ROOTS: [&str; 2] = ["agent_v1.proto", "aiserver_v1.proto"];

#[test]
fn reference_schema_round_trips() {
    let missing: Vec<&str> = ROOTS
        .iter()
        .copied()
        .filter(|f| !Path::new(REFERENCE).join(f).is_file())
        .collect();
    assert!(
        missing.is_empty(),
        "reference schema not found: {missing:?} in {REFERENCE} (shared/ must sit beside the repository)"
    );
    let original = protox::compile(ROOTS, [REFERENCE])
        .unwrap_or_else(|e| panic!("compiling {REFERENCE}: {e}"));

    let files = render_set(&original).unwrap_or_else(|e| panic!("rendering: {e}"));
    let tmp = tempfile::tempdir().expect("temporary directory");
    let dir = tmp.path().join("proto");
    write_schema(&dir, &files).unwrap_or_else(|e| panic!("writing: {e}"));
    let reprinted = protox::compile(ROOTS, [&dir])
        .unwrap_or_else(|e| panic!("compiling the printed schema: {e}"));

    let diffs = compare(&original, &reprinted);
    let listing: Vec<String> = diffs.iter().map(ToString::to_string).collect();
    assert!(
        diffs.is_empty(),
        "{} differences after the round trip:\n{}",
        diffs.len(),
        listing.join("\n")
    );
    assert_eq!(fingerprint(&original), fingerprint(&reprinted));
    assert_eq!(
        render_set(&reprinted).expect("rendering again"),
        files,
        "printing is not stable"
    );
}
