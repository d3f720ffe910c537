//! The Cursor schema, loaded when the debugger starts (never compiled in, so a new Cursor version needs no
//! rebuild): a descriptor pool from a schema directory or a Cursor install (the extractor in
//! `cursor-proto`), which message each route carries in each direction, and protobuf → JSON with the type
//! of a message named by its oneof path (`interaction_update.text_delta`).

use std::path::Path;

use prost::Message as _;
use prost_reflect::{
    DescriptorPool, DynamicMessage, MessageDescriptor, ReflectMessage as _, SerializeOptions, Value,
};

/// The schema a capture is decoded with.
#[derive(Debug, Clone)]
pub struct Schema {
    pool: DescriptorPool,
    /// Where it came from, for the banner and the UI.
    pub origin: String,
}

#[derive(Debug, thiserror::Error)]
pub enum SchemaError {
    #[error("{0}")]
    Load(#[from] cursor_proto::install::InstallError),
    #[error("the schema from {origin} does not form a descriptor pool: {reason}")]
    Pool { origin: String, reason: String },
}

/// The messages one route carries.
#[derive(Debug, Clone)]
pub struct Method {
    /// `aiserver.v1.BidiService.BidiAppend`.
    pub full_name: String,
    pub input: MessageDescriptor,
    pub output: MessageDescriptor,
}

/// `agent.v1.AgentService` routes as Cursor's client calls them. Cursor's bundles declare the service
/// in a side file, not in the package the extractor writes, so a schema directory may lack it; the
/// message types it names are in every schema.
const AGENT_SERVICE: &[(&str, &str, &str)] = &[
    (
        "Run",
        "agent.v1.AgentClientMessage",
        "agent.v1.AgentServerMessage",
    ),
    (
        "RunSSE",
        "aiserver.v1.BidiRequestId",
        "agent.v1.AgentServerMessage",
    ),
    (
        "GetUsableModels",
        "agent.v1.GetUsableModelsRequest",
        "agent.v1.GetUsableModelsResponse",
    ),
    (
        "GetDefaultModelForCli",
        "agent.v1.GetDefaultModelForCliRequest",
        "agent.v1.GetDefaultModelForCliResponse",
    ),
];

/// A message decoded to JSON, with its type.
#[derive(Debug, Clone, PartialEq)]
pub struct Decoded {
    /// The oneof path (`interaction_update.text_delta`), or the message's name when it has no oneof set.
    pub type_path: String,
    pub json: serde_json::Value,
    /// Fields the schema does not know (a newer Cursor than the schema), as `path.#number`.
    pub unknown: Vec<String>,
}

impl Schema {
    /// Loads the schema at `path` (a schema directory, a Cursor install, its `extensions` folder or a
    /// bundle), or from Cursor's standard install places when `path` is `None`.
    pub fn load(path: Option<&Path>) -> Result<Schema, SchemaError> {
        let loaded = match path {
            Some(path) => cursor_proto::install::load(path)?,
            None => {
                let found = cursor_proto::install::locate(None)?;
                cursor_proto::install::load(&found.bundle)?
            }
        };
        Schema::from_descriptors(loaded.descriptors, loaded.origin.to_string())
    }

    pub fn from_descriptors(
        set: prost_types::FileDescriptorSet,
        origin: String,
    ) -> Result<Schema, SchemaError> {
        let pool =
            DescriptorPool::from_file_descriptor_set(set).map_err(|e| SchemaError::Pool {
                origin: origin.clone(),
                reason: e.to_string(),
            })?;
        Ok(Schema { pool, origin })
    }

    pub fn message(&self, full_name: &str) -> Option<MessageDescriptor> {
        self.pool.get_message_by_name(full_name)
    }

    /// The method a route path (`/pkg.Service/Method`) names.
    pub fn method(&self, path: &str) -> Option<Method> {
        let (service, method) = path.trim_start_matches('/').split_once('/')?;
        if let Some(found) = self
            .pool
            .get_service_by_name(service)
            .and_then(|s| s.methods().find(|m| m.name() == method))
        {
            return Some(Method {
                full_name: found.full_name().to_owned(),
                input: found.input(),
                output: found.output(),
            });
        }
        if service != "agent.v1.AgentService" {
            return None;
        }
        let (name, input, output) = AGENT_SERVICE.iter().find(|(name, ..)| *name == method)?;
        Some(Method {
            full_name: format!("{service}.{name}"),
            input: self.message(input)?,
            output: self.message(output)?,
        })
    }

    /// How many messages the schema knows (for the banner).
    pub fn message_count(&self) -> usize {
        self.pool.all_messages().count()
    }
}

/// Decodes `bytes` as `descriptor` into JSON with proto field names.
pub fn decode(descriptor: &MessageDescriptor, bytes: &[u8]) -> Result<Decoded, String> {
    let message = DynamicMessage::decode(descriptor.clone(), bytes)
        .map_err(|e| format!("not a {}: {e}", descriptor.full_name()))?;
    let json = to_json(&message)?;
    let path = oneof_path(&message, 0);
    let type_path = if path.is_empty() {
        descriptor.name().to_owned()
    } else {
        path.join(".")
    };
    let mut unknown = Vec::new();
    unknown_fields(&message, "", &mut unknown);
    Ok(Decoded {
        type_path,
        json,
        unknown,
    })
}

pub fn to_json(message: &DynamicMessage) -> Result<serde_json::Value, String> {
    let options = SerializeOptions::new()
        .use_proto_field_name(true)
        .stringify_64_bit_integers(false)
        .skip_default_fields(true);
    message
        .serialize_with_options(serde_json::value::Serializer, &options)
        .map_err(|e| format!("JSON of {}: {e}", message.descriptor().full_name()))
}

/// The names of the set oneof fields from the outside in, two levels deep
/// (`exec_server_message.shell_args`, `interaction_update.text_delta`): the message and its kind. Deeper
/// oneofs (a result's success or error) are in the JSON.
fn oneof_path(message: &DynamicMessage, depth: usize) -> Vec<String> {
    let descriptor = message.descriptor();
    for oneof in descriptor.oneofs().filter(|o| !o.is_synthetic()) {
        let Some(field) = oneof.fields().find(|f| message.has_field(f)) else {
            continue;
        };
        let mut path = vec![field.name().to_owned()];
        if depth < 1
            && let Value::Message(inner) = &*message.get_field(&field)
        {
            path.extend(oneof_path(inner, depth + 1));
        }
        return path;
    }
    Vec::new()
}

fn unknown_fields(message: &DynamicMessage, at: &str, out: &mut Vec<String>) {
    for field in message.unknown_fields() {
        out.push(format!("{at}#{}", field.number()));
    }
    for (field, value) in message.fields() {
        // `at` is empty or ends with a dot.
        let here = format!("{at}{}", field.name());
        match value {
            Value::Message(inner) => unknown_fields(inner, &format!("{here}."), out),
            Value::List(items) => {
                for item in items {
                    if let Value::Message(inner) = item {
                        unknown_fields(inner, &format!("{here}[]."), out);
                    }
                }
            }
            _ => {}
        }
    }
}

/// Encodes a JSON value as `descriptor` (the tests' and the bench's way of making frames).
pub fn encode_json(
    descriptor: &MessageDescriptor,
    json: &serde_json::Value,
) -> Result<Vec<u8>, String> {
    let message = DynamicMessage::deserialize(descriptor.clone(), json)
        .map_err(|e| format!("JSON as {}: {e}", descriptor.full_name()))?;
    Ok(message.encode_to_vec())
}
