//! Generates the prost types of the Cursor protocol from the user's own Cursor schema.
//!
//! The schema is never part of this repository. It is taken, in this order, from `CURSOR_PROTO_DIR` (a
//! schema directory, or a Cursor install / bundle to extract from), from `../cursor-proto/proto/` (where
//! `cursor-proto extract` writes by default), or extracted from the Cursor install found in the standard
//! places (`CURSOR_APP_DIR` first) into `OUT_DIR`, never into the source tree. Without any of them the build
//! fails with one message naming the places it looked and the command to run.
//!
//! The schema is compiled with protox (no protoc needed). An `agent.v1.AgentService` the schema declares
//! is set aside for the project's own declaration (`cursor-proto/agent_service.proto`: the routes the server
//! serves), after checking that both agree on the methods they share. `aiserver_v1.proto` is far too large to
//! compile whole (and has Rust name collisions), so it is pruned to the closure of the few messages the server
//! uses before prost sees it. Route constants for every served method are generated from the service
//! declarations. The schema's fingerprint (`cursor_proto::fingerprint`) and its descriptors are handed to
//! the server (`CURSOR_SCHEMA_FINGERPRINT`, `CURSOR_SCHEMA_SOURCE`, `cursor_schema.fds`) for the start-up log
//! and `cursor-server schema-check`.

use std::collections::{BTreeSet, HashMap};
use std::env;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use cursor_proto::install::{self, InstallError};
use prost::Message as _;
use prost_types::{DescriptorProto, FileDescriptorProto, FileDescriptorSet};

const AGENT_FILE: &str = "agent_v1.proto";
const AISERVER_FILE: &str = "aiserver_v1.proto";
const OWN_SERVICES_FILE: &str = "agent_service.proto";
const AGENT_SERVICE: &str = "agent.v1.AgentService";

/// `aiserver.v1` messages the server uses directly; everything they reference is kept too.
const AISERVER_ROOTS: &[&str] = &[
    "BidiRequestId",
    "BidiAppendRequest",
    "BidiAppendResponse",
    "ErrorDetails",
    "AvailableModelsRequest",
    "AvailableModelsResponse",
    "GetUsableModelsRequest",
    "GetUsableModelsResponse",
    "GetDefaultModelForCliRequest",
    "GetDefaultModelForCliResponse",
    // Asked of Cursor's backend to learn the account behind an access token ([auth] cursor_account).
    "GetMeRequest",
    "GetMeResponse",
];

/// `aiserver.v1` methods the server serves (service, method). Other methods are forwarded upstream
/// unchanged and need no generated types.
const AISERVER_SERVED_METHODS: &[(&str, &str)] = &[
    ("BidiService", "BidiAppend"),
    ("AiService", "AvailableModels"),
    ("AiService", "GetUsableModels"),
    ("AiService", "GetDefaultModelForCli"),
];

fn main() {
    if let Err(message) = run() {
        // A plain message and exit status: a panic would bury the message under a backtrace.
        eprintln!("\ncursor-server build: {message}\n");
        std::process::exit(1);
    }
}

/// Where the schema came from, for the warning, the start-up log and `schema-check`.
struct SchemaSource {
    dir: PathBuf,
    description: String,
    /// The Cursor version it was extracted from, when known (the install's, or a schema directory's record).
    cursor_version: Option<String>,
}

fn run() -> Result<(), String> {
    println!("cargo:rerun-if-env-changed=CURSOR_PROTO_DIR");
    println!("cargo:rerun-if-env-changed=CURSOR_APP_DIR");
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").map_err(|e| e.to_string())?);
    let own_proto_dir = manifest_dir.join("../cursor-proto");
    let out_dir = PathBuf::from(env::var("OUT_DIR").map_err(|e| e.to_string())?);
    let source = find_schema(&manifest_dir, &own_proto_dir, &out_dir)?;
    println!(
        "cargo:rerun-if-changed={}",
        own_proto_dir.join(OWN_SERVICES_FILE).display()
    );
    // The prompt assets are embedded with `include_dir!`, which cannot ask Cargo to track them.
    println!(
        "cargo:rerun-if-changed={}",
        manifest_dir.join("../prompt").display()
    );

    let mut schema = install::compile_dir(&source.dir).map_err(|e| e.to_string())?;
    for file in [AGENT_FILE, AISERVER_FILE] {
        if !schema.file.iter().any(|f| f.name() == file) {
            return Err(format!("{} has no {file}", source.description));
        }
    }
    let own = compile_own_services(&own_proto_dir, &mut schema)?;
    let fingerprint = cursor_proto::fingerprint::fingerprint(&schema);
    std::fs::write(out_dir.join("cursor_schema.fds"), schema.encode_to_vec())
        .map_err(|e| format!("writing the schema descriptors: {e}"))?;
    println!("cargo:rustc-env=CURSOR_SCHEMA_FINGERPRINT={fingerprint}");
    println!(
        "cargo:rustc-env=CURSOR_SCHEMA_SOURCE={}",
        source.description.replace('\n', " ")
    );
    println!(
        "cargo:rustc-env=CURSOR_SCHEMA_CURSOR_VERSION={}",
        source
            .cursor_version
            .as_deref()
            .unwrap_or("")
            .replace('\n', " ")
    );

    write_drift_table(&own, &out_dir)?;
    let mut set = own;
    prune_aiserver(&mut set)?;
    let mut config = prost_build::Config::new();
    config.service_generator(Box::new(RouteConstants));
    // Ordered maps encode deterministically: the same card or state is the same blob.
    config.btree_map(["."]);
    config
        .compile_fds(set)
        .map_err(|e| format!("prost-build: {e}"))?;
    Ok(())
}

/// The message the client sends: everything it reaches is in the drift table.
const CLIENT_ROOT: &str = ".agent.v1.AgentClientMessage";

/// Writes `drift_table.rs` for `ops/drift.rs`: every message reachable from [`CLIENT_ROOT`] with its field
/// numbers (sorted) and, per field, the message or enum it holds; every enum reached with its values
/// (sorted). The detector compares what a client sends against it without any descriptor at run time.
fn write_drift_table(set: &FileDescriptorSet, out_dir: &Path) -> Result<(), String> {
    use prost_types::field_descriptor_proto::Type;
    let mut messages: HashMap<String, &DescriptorProto> = HashMap::new();
    let mut enums: HashMap<String, Vec<i32>> = HashMap::new();
    fn walk<'a>(
        prefix: &str,
        message: &'a DescriptorProto,
        messages: &mut HashMap<String, &'a DescriptorProto>,
        enums: &mut HashMap<String, Vec<i32>>,
    ) {
        let name = format!("{prefix}.{}", message.name());
        for value in &message.enum_type {
            enums.insert(
                format!("{name}.{}", value.name()),
                value.value.iter().map(|v| v.number()).collect(),
            );
        }
        for nested in &message.nested_type {
            walk(&name, nested, messages, enums);
        }
        messages.insert(name, message);
    }
    for file in &set.file {
        let prefix = format!(".{}", file.package());
        for message in &file.message_type {
            walk(&prefix, message, &mut messages, &mut enums);
        }
        for value in &file.enum_type {
            enums.insert(
                format!("{prefix}.{}", value.name()),
                value.value.iter().map(|v| v.number()).collect(),
            );
        }
    }
    // Breadth first from the root: indexes are positions in `order`.
    let mut order: Vec<String> = vec![CLIENT_ROOT.to_owned()];
    let mut index: HashMap<String, usize> = HashMap::from([(CLIENT_ROOT.to_owned(), 0)]);
    let mut enum_order: Vec<String> = Vec::new();
    let mut enum_index: HashMap<String, usize> = HashMap::new();
    let mut rows = Vec::new();
    let mut next = 0;
    while next < order.len() {
        let name = order[next].clone();
        next += 1;
        let message = messages
            .get(&name)
            .ok_or_else(|| format!("drift table: {name} is not in the schema"))?;
        let mut fields: Vec<(i32, String)> = Vec::new();
        for field in &message.field {
            let kind = match field.r#type() {
                Type::Message | Type::Group if messages.contains_key(field.type_name()) => {
                    let target = field.type_name().to_owned();
                    let at = *index.entry(target.clone()).or_insert_with(|| {
                        order.push(target);
                        order.len() - 1
                    });
                    format!("Kind::Message({at})")
                }
                Type::Enum if enums.contains_key(field.type_name()) => {
                    let target = field.type_name().to_owned();
                    let at = *enum_index.entry(target.clone()).or_insert_with(|| {
                        enum_order.push(target);
                        enum_order.len() - 1
                    });
                    format!("Kind::Enum({at})")
                }
                _ => "Kind::Other".to_owned(),
            };
            fields.push((field.number(), kind));
        }
        fields.sort();
        let fields: Vec<String> = fields
            .iter()
            .map(|(number, kind)| format!("({number}, {kind})"))
            .collect();
        rows.push(format!(
            "    Message {{ name: {:?}, fields: &[{}] }},",
            name.trim_start_matches('.'),
            fields.join(", ")
        ));
    }
    let mut text = String::from("// Generated by build.rs (write_drift_table) from the schema.\n");
    let _ = writeln!(text, "pub(crate) static MESSAGES: &[Message] = &[");
    text.push_str(&rows.join("\n"));
    text.push_str("\n];\npub(crate) static ENUMS: &[Enum] = &[\n");
    for name in &enum_order {
        let mut values = enums[name].clone();
        values.sort_unstable();
        values.dedup();
        let values: Vec<String> = values.iter().map(ToString::to_string).collect();
        let _ = writeln!(
            text,
            "    Enum {{ name: {:?}, values: &[{}] }},",
            name.trim_start_matches('.'),
            values.join(", ")
        );
    }
    text.push_str("];\n");
    std::fs::write(out_dir.join("drift_table.rs"), text)
        .map_err(|e| format!("writing the drift table: {e}"))
}

/// `CURSOR_PROTO_DIR`, else `cursor-proto/proto/`, else an extraction from the Cursor install found.
fn find_schema(
    manifest_dir: &Path,
    own_proto_dir: &Path,
    out_dir: &Path,
) -> Result<SchemaSource, String> {
    let named = env::var_os("CURSOR_PROTO_DIR").map(|dir| manifest_dir.join(dir));
    let default_dir = own_proto_dir.join("proto");
    if let Some(dir) = &named {
        if dir.join(AGENT_FILE).is_file() {
            return Ok(schema_dir(dir, "CURSOR_PROTO_DIR"));
        }
        // A Cursor install or bundle named instead of a schema directory.
        return extract_into(Some(dir), out_dir).map_err(|e| {
            format!(
                "CURSOR_PROTO_DIR={} is neither a schema directory (no {AGENT_FILE}) nor a Cursor install: {e}",
                dir.display()
            )
        });
    }
    if default_dir.join(AGENT_FILE).is_file() {
        return Ok(schema_dir(&default_dir, "cursor-proto/proto"));
    }
    // Watching the folder (not the missing `proto/`, which would rerun this script on every build) picks up
    // a schema extracted into `cursor-proto/proto/` later.
    println!("cargo:rerun-if-changed={}", own_proto_dir.display());
    extract_into(None, out_dir).map_err(|e| match e {
        InstallError::NotFound { looked } => format!(
            "the Cursor protobuf schema was not found. Looked at:\n\
             \x20 - CURSOR_PROTO_DIR (not set)\n\
             \x20 - {} (no {AGENT_FILE})\n{}\n\
             Extract it from your Cursor install once:\n\
             \x20 cargo run --release --manifest-path cursor-proto/Cargo.toml -- extract /path/to/Cursor --out cursor-proto/proto\n\
             or point the build at the install: CURSOR_APP_DIR=/path/to/Cursor (or a schema directory: CURSOR_PROTO_DIR=DIR).",
            default_dir.display(),
            looked
                .iter()
                .map(|p| format!("  - {} (no Cursor install)", p.display()))
                .collect::<Vec<_>>()
                .join("\n")
        ),
        other => format!("extracting the schema from the Cursor install: {other}"),
    })
}

fn schema_dir(dir: &Path, how: &str) -> SchemaSource {
    for file in [AGENT_FILE, AISERVER_FILE, install::RECORD_FILE] {
        println!("cargo:rerun-if-changed={}", dir.join(file).display());
    }
    SchemaSource {
        dir: dir.to_owned(),
        description: format!("schema directory {} ({how})", dir.display()),
        cursor_version: install::recorded_version(dir),
    }
}

/// Extracts the schema from a Cursor install (the one named, or the first in the standard places) into
/// `OUT_DIR/cursor-schema`.
fn extract_into(path: Option<&Path>, out_dir: &Path) -> Result<SchemaSource, InstallError> {
    let found = install::locate(path)?;
    for bundle in &found.bundles {
        println!("cargo:rerun-if-changed={}", bundle.display());
    }
    let extraction = cursor_proto::extract::extract_files(&found.bundles)?;
    let dir = out_dir.join("cursor-schema");
    cursor_proto::write::write_schema(&dir, &extraction.files).map_err(|e| InstallError::Io {
        path: dir.clone(),
        source: std::io::Error::other(e.to_string()),
    })?;
    let version = found
        .version
        .as_deref()
        .map_or_else(|| "version unknown".to_owned(), |v| format!("Cursor {v}"));
    let description = format!("extracted from {} ({version})", found.bundle.display());
    println!("cargo:warning=using the Cursor schema {description}");
    if !extraction.unresolved.is_empty() {
        println!(
            "cargo:warning={} fields, enum values, methods or types of the install's schema could not be read and were left out (run `cursor-proto extract` to list them)",
            extraction.unresolved.len()
        );
    }
    Ok(SchemaSource {
        dir,
        description,
        cursor_version: found.version,
    })
}

/// Sets aside an `agent.v1.AgentService` declared by the schema (warning where it disagrees with the
/// project's declaration) and compiles `agent_service.proto` against the schema. Returns every file the
/// server needs: the project's services file and its imports.
fn compile_own_services(
    own_proto_dir: &Path,
    schema: &mut FileDescriptorSet,
) -> Result<FileDescriptorSet, String> {
    let theirs = cursor_proto::compare::take_service(schema, AGENT_SERVICE);
    let mut resolver = protox::file::ChainFileResolver::new();
    resolver.add(DescriptorResolver {
        files: schema
            .file
            .iter()
            .map(|f| (f.name().to_owned(), f.clone()))
            .collect(),
    });
    resolver.add(protox::file::IncludeFileResolver::new(
        own_proto_dir.to_owned(),
    ));
    let mut compiler = protox::Compiler::with_file_resolver(resolver);
    compiler.include_imports(true);
    compiler
        .open_file(OWN_SERVICES_FILE)
        .map_err(|e| format!("compiling {OWN_SERVICES_FILE} against the schema: {e}"))?;
    let set = compiler.file_descriptor_set();
    if let Some(theirs) = theirs {
        let ours = set
            .file
            .iter()
            .filter(|f| f.package() == "agent.v1")
            .flat_map(|f| &f.service)
            .find(|s| s.name() == "AgentService");
        for method in ours.into_iter().flat_map(|s| &s.method) {
            let Some(their) = theirs.method.iter().find(|m| m.name() == method.name()) else {
                continue;
            };
            let shape = |m: &prost_types::MethodDescriptorProto| {
                (
                    m.input_type().to_owned(),
                    m.output_type().to_owned(),
                    m.client_streaming(),
                    m.server_streaming(),
                )
            };
            if shape(method) != shape(their) {
                println!(
                    "cargo:warning=Cursor's {AGENT_SERVICE}/{} is {:?}, the server serves {:?}",
                    method.name(),
                    shape(their),
                    shape(method)
                );
            }
        }
    }
    Ok(set)
}

/// Serves already compiled schema files to protox by name.
struct DescriptorResolver {
    files: HashMap<String, FileDescriptorProto>,
}

impl protox::file::FileResolver for DescriptorResolver {
    fn open_file(&self, name: &str) -> Result<protox::file::File, protox::Error> {
        match self.files.get(name) {
            Some(file) => Ok(protox::file::File::from_file_descriptor_proto(file.clone())),
            None => Err(protox::Error::file_not_found(name)),
        }
    }
}

/// Keeps, in `aiserver_v1.proto`, only the top-level messages and enums reachable from
/// [`AISERVER_ROOTS`] and only the [`AISERVER_SERVED_METHODS`].
fn prune_aiserver(set: &mut FileDescriptorSet) -> Result<(), String> {
    let file = set
        .file
        .iter_mut()
        .find(|f| f.name() == AISERVER_FILE)
        .ok_or("aiserver_v1.proto missing from the descriptor set")?;
    let package = format!(".{}.", file.package());
    let messages: HashMap<String, &DescriptorProto> = file
        .message_type
        .iter()
        .map(|m| (m.name().to_owned(), m))
        .collect();

    let mut kept = BTreeSet::new();
    let mut queue: Vec<String> = AISERVER_ROOTS.iter().map(|s| (*s).to_owned()).collect();
    while let Some(name) = queue.pop() {
        if !kept.insert(name.clone()) {
            continue;
        }
        let Some(message) = messages.get(&name) else {
            // Top-level enums have no fields to follow.
            continue;
        };
        let mut referenced = Vec::new();
        collect_references(message, &mut referenced);
        for type_name in referenced {
            if let Some(local) = type_name.strip_prefix(&package) {
                let top = local.split('.').next().unwrap_or(local).to_owned();
                if !kept.contains(&top) {
                    queue.push(top);
                }
            }
        }
    }
    let missing: Vec<&&str> = AISERVER_ROOTS
        .iter()
        .filter(|root| !messages.contains_key(**root))
        .collect();
    if !missing.is_empty() {
        return Err(format!(
            "aiserver_v1.proto lacks required messages: {missing:?}"
        ));
    }
    retain_kept(file, &kept);
    Ok(())
}

fn collect_references(message: &DescriptorProto, out: &mut Vec<String>) {
    for field in &message.field {
        if !field.type_name().is_empty() {
            out.push(field.type_name().to_owned());
        }
    }
    for nested in &message.nested_type {
        collect_references(nested, out);
    }
}

fn retain_kept(file: &mut FileDescriptorProto, kept: &BTreeSet<String>) {
    file.message_type.retain(|m| kept.contains(m.name()));
    file.enum_type.retain(|e| kept.contains(e.name()));
    file.service.retain_mut(|service| {
        let service_name = service.name().to_owned();
        service.method.retain(|method| {
            AISERVER_SERVED_METHODS.contains(&(service_name.as_str(), method.name()))
        });
        !service.method.is_empty()
    });
    // Source info refers to element paths that no longer exist after pruning.
    file.source_code_info = None;
}

/// Emits `pub mod <service>_routes { pub const <METHOD>: &str = "/pkg.Service/Method"; }` so that the
/// router mounts exactly the declared paths.
struct RouteConstants;

impl prost_build::ServiceGenerator for RouteConstants {
    fn generate(&mut self, service: prost_build::Service, buf: &mut String) {
        let module = format!("{}_routes", to_snake(&service.name));
        let _ = writeln!(
            buf,
            "/// HTTP paths of `{}.{}`.",
            service.package, service.proto_name
        );
        let _ = writeln!(buf, "pub mod {module} {{");
        for method in &service.methods {
            let _ = writeln!(
                buf,
                "    pub const {}: &str = \"/{}.{}/{}\";",
                to_snake(&method.proto_name).to_uppercase(),
                service.package,
                service.proto_name,
                method.proto_name
            );
        }
        let _ = writeln!(buf, "}}");
    }
}

fn to_snake(name: &str) -> String {
    let mut out = String::new();
    let chars: Vec<char> = name.chars().collect();
    for (i, c) in chars.iter().enumerate() {
        if c.is_uppercase() {
            let prev_lower = i > 0 && chars[i - 1].is_lowercase();
            let next_lower = chars.get(i + 1).is_some_and(|n| n.is_lowercase());
            let prev_upper = i > 0 && chars[i - 1].is_uppercase();
            if i > 0 && (prev_lower || (prev_upper && next_lower)) {
                out.push('_');
            }
            out.extend(c.to_lowercase());
        } else {
            out.push(*c);
        }
    }
    out
}
