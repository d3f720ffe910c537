//! Generates the prost types of the Cursor protocol from a user-supplied schema directory.
//!
//! The schema is never part of this repository: it is read from `CURSOR_PROTO_DIR`, else from
//! `../cursor-proto/proto/` (git-ignored; where a user's extraction lands). `agent_v1.proto` is compiled
//! whole. `aiserver_v1.proto` is far too large to compile (and has Rust name collisions), so its
//! `FileDescriptorSet` is pruned to the closure of the few messages the server uses before prost sees it.
//! Route constants for every served method are generated from the service declarations.

use std::collections::{BTreeSet, HashMap};
use std::env;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use prost::Message as _;
use prost_types::{DescriptorProto, FileDescriptorProto, FileDescriptorSet};

const AGENT_FILE: &str = "agent_v1.proto";
const AISERVER_FILE: &str = "aiserver_v1.proto";
const OWN_SERVICES_FILE: &str = "agent_service.proto";

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
        panic!("\n\ncursor-server build: {message}\n\n");
    }
}

fn run() -> Result<(), String> {
    println!("cargo:rerun-if-env-changed=CURSOR_PROTO_DIR");
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").map_err(|e| e.to_string())?);
    let own_proto_dir = manifest_dir.join("../cursor-proto");
    let schema_dir = match env::var_os("CURSOR_PROTO_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => own_proto_dir.join("proto"),
    };
    check_schema_dir(&schema_dir)?;
    for file in [AGENT_FILE, AISERVER_FILE] {
        println!("cargo:rerun-if-changed={}", schema_dir.join(file).display());
    }
    println!(
        "cargo:rerun-if-changed={}",
        own_proto_dir.join(OWN_SERVICES_FILE).display()
    );
    // The prompt assets are embedded with `include_dir!`, which cannot ask Cargo to track them.
    println!(
        "cargo:rerun-if-changed={}",
        manifest_dir.join("../prompt").display()
    );

    let out_dir = PathBuf::from(env::var("OUT_DIR").map_err(|e| e.to_string())?);
    let descriptor_path = out_dir.join("cursor_full.fds");
    let protoc =
        protoc_bin_vendored::protoc_bin_path().map_err(|e| format!("vendored protoc: {e}"))?;
    let status = Command::new(&protoc)
        .arg("--include_imports")
        .arg(format!(
            "--descriptor_set_out={}",
            descriptor_path.display()
        ))
        .arg(format!("-I{}", schema_dir.display()))
        .arg(format!("-I{}", own_proto_dir.display()))
        .arg(AGENT_FILE)
        .arg(AISERVER_FILE)
        .arg(OWN_SERVICES_FILE)
        .status()
        .map_err(|e| format!("running protoc {}: {e}", protoc.display()))?;
    if !status.success() {
        return Err(format!(
            "protoc rejected the schema in {} (see its messages above)",
            schema_dir.display()
        ));
    }
    let bytes = std::fs::read(&descriptor_path).map_err(|e| e.to_string())?;
    let mut set = FileDescriptorSet::decode(bytes.as_slice()).map_err(|e| e.to_string())?;
    prune_aiserver(&mut set)?;

    let mut config = prost_build::Config::new();
    config.protoc_executable(protoc);
    config.service_generator(Box::new(RouteConstants));
    // Ordered maps encode deterministically: the same card or state is the same blob.
    config.btree_map(["."]);
    config
        .compile_fds(set)
        .map_err(|e| format!("prost-build: {e}"))?;
    Ok(())
}

fn check_schema_dir(dir: &Path) -> Result<(), String> {
    let missing: Vec<&str> = [AGENT_FILE, AISERVER_FILE]
        .into_iter()
        .filter(|file| !dir.join(file).is_file())
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    Err(format!(
        "the Cursor protobuf schema was not found: {} missing in {}.\n\
         The schema is not shipped with cursor-byok; supply the one extracted from your own Cursor install:\n\
         \x20 - put agent_v1.proto, aiserver_v1.proto and google/protobuf/*.proto into cursor-proto/proto/, or\n\
         \x20 - set CURSOR_PROTO_DIR=/path/to/that/directory (e.g. CURSOR_PROTO_DIR=../shared/reference/proto).",
        missing.join(", "),
        dir.display()
    ))
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
