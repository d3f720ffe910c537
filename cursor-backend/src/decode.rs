//! What each frame of an exchange means: one `StreamDecoder` per direction takes the body's chunks as
//! they pass and gives back `FrameRecord`s — protobuf decoded to JSON with the route's message type,
//! BidiAppend's hex `data` opened into the `AgentClientMessage` it carries, end-of-stream JSON with its
//! `ErrorDetails` decoded, and anything it cannot read kept as raw bytes with the reason. Never an error
//! out, never a dropped byte.

use base64::Engine as _;
use bytes::{Bytes, BytesMut};
use prost_reflect::MessageDescriptor;
use serde_json::Value;

use crate::schema::{self, Decoded, Method, Schema};
use crate::wire::{self, Encoding, EnvelopeReader, FLAG_END_STREAM, Framing, Piece};

/// Which way a frame went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    /// Cursor → upstream.
    Client,
    /// Upstream → Cursor.
    Server,
}

impl Direction {
    pub fn as_str(self) -> &'static str {
        match self {
            Direction::Client => "client",
            Direction::Server => "server",
        }
    }

    pub fn parse(text: &str) -> Option<Direction> {
        match text {
            "client" => Some(Direction::Client),
            "server" => Some(Direction::Server),
            _ => None,
        }
    }
}

/// What a frame is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameKind {
    /// A protobuf (or JSON) message, decoded.
    Message,
    /// A Connect end-of-stream frame (JSON).
    EndStream,
    /// A unary Connect error body.
    Error,
    /// A body that is not an RPC message (HTML, an image, ...), kept as is.
    Body,
    /// Bytes that could not be decoded; `error` says why.
    Undecoded,
}

impl FrameKind {
    pub fn as_str(self) -> &'static str {
        match self {
            FrameKind::Message => "message",
            FrameKind::EndStream => "end_stream",
            FrameKind::Error => "error",
            FrameKind::Body => "body",
            FrameKind::Undecoded => "undecoded",
        }
    }
}

/// One frame, ready to be stored.
#[derive(Debug, Clone)]
pub struct FrameRecord {
    pub direction: Direction,
    pub kind: FrameKind,
    pub type_path: String,
    /// The envelope's flags byte (none for unary and opaque bodies).
    pub flags: Option<u8>,
    pub json: Option<Value>,
    /// The payload as it crossed the wire (still compressed if it was).
    pub raw: Bytes,
    pub error: Option<String>,
    /// Ids found in the frame: (`conversation_id`, `exec_id`, `kv_id`, ...).
    pub ids: Vec<(&'static str, String)>,
    /// A frame of one transport's plumbing (RunSSE's `BidiRequestId`, BidiAppend's empty answer) that the
    /// other transport has no counterpart for; `diff` leaves these out.
    pub transport: bool,
}

/// The routes whose frames need more than their declared type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouteKind {
    RunSse,
    BidiAppend,
    Run,
    Other,
}

impl RouteKind {
    pub fn of(path: &str) -> RouteKind {
        match path {
            "/agent.v1.AgentService/RunSSE" => RouteKind::RunSse,
            "/aiserver.v1.BidiService/BidiAppend" => RouteKind::BidiAppend,
            "/agent.v1.AgentService/Run" => RouteKind::Run,
            _ => RouteKind::Other,
        }
    }

    /// Whether the body names the run (`BidiRequestId`), so it groups the exchange.
    pub fn request_id_in_body(self) -> bool {
        matches!(self, RouteKind::RunSse | RouteKind::BidiAppend)
    }
}

/// Id fields worth indexing wherever they appear.
const ID_FIELDS: &[&str] = &[
    "conversation_id",
    "request_id",
    "tool_call_id",
    "call_id",
    "model_call_id",
    "blob_id",
];

/// Turns one direction's body into frames.
#[derive(Debug)]
pub struct StreamDecoder {
    direction: Direction,
    route: RouteKind,
    framing: Framing,
    /// `connect-content-encoding` for envelopes, `content-encoding` for whole bodies.
    encoding: Encoding,
    /// What the payloads are; `Err` says why they cannot be decoded.
    message: Result<MessageDescriptor, String>,
    schema: Option<Schema>,
    reader: EnvelopeReader,
    body: BytesMut,
    body_overflow: bool,
}

/// What a decoder needs to know about its side of the exchange.
pub struct Side<'a> {
    pub direction: Direction,
    pub path: &'a str,
    pub content_type: Option<&'a str>,
    pub content_encoding: Option<&'a str>,
    pub connect_content_encoding: Option<&'a str>,
}

impl StreamDecoder {
    pub fn new(schema: Option<&Schema>, side: Side<'_>) -> StreamDecoder {
        let framing = Framing::of(side.content_type);
        let encoding = match framing {
            Framing::Envelopes { .. } => Encoding::of(side.connect_content_encoding),
            _ => Encoding::of(side.content_encoding),
        };
        let message = match schema {
            None => Err("no schema loaded (start with --schema DIR or install Cursor)".to_owned()),
            Some(schema) => match schema.method(side.path) {
                None => Err(format!("the schema has no method {}", side.path)),
                Some(Method { input, output, .. }) => Ok(match side.direction {
                    Direction::Client => input,
                    Direction::Server => output,
                }),
            },
        };
        StreamDecoder {
            direction: side.direction,
            route: RouteKind::of(side.path),
            framing,
            encoding,
            message,
            schema: schema.cloned(),
            reader: EnvelopeReader::default(),
            body: BytesMut::new(),
            body_overflow: false,
        }
    }

    /// Whether the body is a stream of envelopes (so it should end with an end-of-stream frame).
    pub fn is_streaming(&self) -> bool {
        matches!(self.framing, Framing::Envelopes { .. })
    }

    /// The frames completed by this chunk.
    pub fn push(&mut self, chunk: &[u8]) -> Vec<FrameRecord> {
        match self.framing {
            Framing::Envelopes { .. } => {
                let pieces = self.reader.push(chunk);
                pieces.into_iter().map(|p| self.piece(p)).collect()
            }
            Framing::Unary | Framing::Json | Framing::Opaque => {
                let cap = match self.framing {
                    Framing::Opaque => wire::MAX_OPAQUE_BYTES,
                    _ => wire::MAX_FRAME_BYTES,
                };
                let room = cap.saturating_sub(self.body.len());
                if chunk.len() > room {
                    self.body_overflow = true;
                }
                self.body.extend_from_slice(&chunk[..chunk.len().min(room)]);
                Vec::new()
            }
        }
    }

    /// The body ended: what was still buffered.
    pub fn finish(&mut self) -> Vec<FrameRecord> {
        match self.framing {
            Framing::Envelopes { .. } => {
                let piece = self.reader.finish();
                piece.into_iter().map(|p| self.piece(p)).collect()
            }
            _ if self.body.is_empty() => Vec::new(),
            _ if self.body_overflow => {
                let body = self.body.split().freeze();
                let kept = body.len();
                let kind = match self.framing {
                    Framing::Opaque => FrameKind::Body,
                    _ => FrameKind::Undecoded,
                };
                let mut record = self.record(kind, "body", None, body);
                record.error = Some(format!(
                    "a body over the limit; its first {kept} bytes are kept"
                ));
                vec![record]
            }
            Framing::Unary => {
                let body = self.body.split().freeze();
                vec![self.unary(body)]
            }
            Framing::Json => {
                let body = self.body.split().freeze();
                vec![self.json_body(body)]
            }
            Framing::Opaque => {
                let body = self.body.split().freeze();
                vec![self.record(FrameKind::Body, "body", None, body)]
            }
        }
    }

    fn record(
        &self,
        kind: FrameKind,
        type_path: &str,
        flags: Option<u8>,
        raw: Bytes,
    ) -> FrameRecord {
        FrameRecord {
            direction: self.direction,
            kind,
            type_path: type_path.to_owned(),
            flags,
            json: None,
            raw,
            error: None,
            ids: Vec::new(),
            transport: matches!(
                (self.route, self.direction),
                (RouteKind::RunSse, Direction::Client) | (RouteKind::BidiAppend, Direction::Server)
            ),
        }
    }

    fn undecoded(&self, flags: Option<u8>, raw: Bytes, reason: String) -> FrameRecord {
        let mut record = self.record(FrameKind::Undecoded, "undecoded", flags, raw);
        record.error = Some(reason);
        record
    }

    fn piece(&self, piece: Piece) -> FrameRecord {
        match piece {
            Piece::Unframed { bytes, reason } => self.undecoded(None, bytes, reason),
            Piece::Envelope(envelope) => {
                let flags = Some(envelope.flags);
                let payload = match wire::envelope_payload(&envelope, self.encoding) {
                    Ok(payload) => payload,
                    Err(reason) => return self.undecoded(flags, envelope.payload, reason),
                };
                let mut record = if envelope.flags & FLAG_END_STREAM != 0 {
                    self.end_stream(&payload)
                } else if matches!(self.framing, Framing::Envelopes { json: true }) {
                    self.json_message(&payload)
                } else {
                    self.message(&payload)
                };
                record.flags = flags;
                record.raw = envelope.payload;
                record
            }
        }
    }

    fn unary(&self, body: Bytes) -> FrameRecord {
        match wire::unary_payload(&body, self.encoding) {
            Ok(payload) => {
                let mut record = self.message(&payload);
                record.raw = body;
                record
            }
            Err(reason) => self.undecoded(None, body, reason),
        }
    }

    /// A JSON body: a Connect error when it has `code`, else a JSON message.
    fn json_body(&self, body: Bytes) -> FrameRecord {
        let text = match self.encoding {
            Encoding::Identity => body.clone(),
            Encoding::Gzip => match wire::gunzip(&body) {
                Ok(text) => text,
                Err(reason) => return self.undecoded(None, body, reason),
            },
            Encoding::Other => {
                let reason = "content-encoding this debugger cannot read".to_owned();
                return self.undecoded(None, body, reason);
            }
        };
        let mut record = self.json_message(&text);
        if let Some(json) = &record.json
            && json.get("code").is_some_and(Value::is_string)
            && json.get("message").is_some()
        {
            let code = json["code"].as_str().unwrap_or_default().to_owned();
            record.kind = FrameKind::Error;
            record.type_path = format!("error.{code}");
            record.json = record.json.take().map(|j| self.with_details(j));
        }
        record.raw = body;
        record
    }

    fn json_message(&self, payload: &[u8]) -> FrameRecord {
        let raw = Bytes::copy_from_slice(payload);
        match serde_json::from_slice::<Value>(payload) {
            Ok(json) => {
                let name = self.message.as_ref().map(|m| m.name()).unwrap_or("json");
                let mut record = self.record(FrameKind::Message, name, None, raw);
                record.ids = ids_of(name, &json);
                record.json = Some(json);
                record
            }
            Err(e) => self.undecoded(None, raw, format!("not JSON: {e}")),
        }
    }

    fn end_stream(&self, payload: &[u8]) -> FrameRecord {
        let raw = Bytes::copy_from_slice(payload);
        let json = match serde_json::from_slice::<Value>(payload) {
            Ok(json) => json,
            Err(e) => {
                return self.undecoded(
                    Some(FLAG_END_STREAM),
                    raw,
                    format!("end-of-stream payload is not JSON: {e}"),
                );
            }
        };
        let type_path = match json.pointer("/error/code").and_then(Value::as_str) {
            Some(code) => format!("end_stream.error.{code}"),
            None => "end_stream".to_owned(),
        };
        let mut record = self.record(FrameKind::EndStream, &type_path, None, raw);
        record.json = Some(match json {
            Value::Object(mut map) => {
                if let Some(error) = map.remove("error") {
                    map.insert("error".to_owned(), self.with_details(error));
                }
                Value::Object(map)
            }
            other => other,
        });
        record
    }

    /// A Connect error with each `details[]` entry's protobuf decoded beside it as `debug`.
    fn with_details(&self, mut error: Value) -> Value {
        let Some(details) = error.get_mut("details").and_then(Value::as_array_mut) else {
            return error;
        };
        for detail in details {
            let decoded = self.detail(detail);
            if let Value::Object(map) = detail {
                match decoded {
                    Ok(json) => map.insert("debug".to_owned(), json),
                    Err(reason) => map.insert("debug_error".to_owned(), Value::String(reason)),
                };
            }
        }
        error
    }

    fn detail(&self, detail: &Value) -> Result<Value, String> {
        let type_name = detail
            .get("type")
            .and_then(Value::as_str)
            .ok_or("a detail without a type")?;
        let value = detail
            .get("value")
            .and_then(Value::as_str)
            .ok_or("a detail without a value")?;
        let bytes = base64_any(value).ok_or("the detail's value is not base64")?;
        let schema = self.schema.as_ref().ok_or("no schema loaded")?;
        let descriptor = schema
            .message(type_name)
            .ok_or_else(|| format!("the schema has no message {type_name}"))?;
        schema::decode(&descriptor, &bytes).map(|d| d.json)
    }

    fn message(&self, payload: &[u8]) -> FrameRecord {
        let raw = Bytes::copy_from_slice(payload);
        let descriptor = match &self.message {
            Ok(descriptor) => descriptor,
            Err(reason) => return self.undecoded(None, raw, reason.clone()),
        };
        let decoded = match schema::decode(descriptor, payload) {
            Ok(decoded) => decoded,
            Err(reason) => return self.undecoded(None, raw, reason),
        };
        if self.route == RouteKind::BidiAppend && self.direction == Direction::Client {
            return self.append(decoded, raw);
        }
        self.decoded(decoded, raw)
    }

    fn decoded(&self, decoded: Decoded, raw: Bytes) -> FrameRecord {
        let ids = ids_of(&decoded.type_path, &decoded.json);
        self.decoded_with_ids(decoded, raw, ids)
    }

    fn decoded_with_ids(
        &self,
        decoded: Decoded,
        raw: Bytes,
        ids: Vec<(&'static str, String)>,
    ) -> FrameRecord {
        let mut record = self.record(FrameKind::Message, &decoded.type_path, None, raw);
        record.ids = ids;
        if !decoded.unknown.is_empty() {
            record.error = Some(format!(
                "fields the schema does not know: {}",
                decoded.unknown.join(", ")
            ));
        }
        record.json = Some(decoded.json);
        record
    }

    /// A `BidiAppendRequest`: its hex `data` is an `AgentClientMessage`, shown in place of the hex and
    /// typed by its own oneof path, so both transports' uplinks read the same.
    fn append(&self, outer: Decoded, raw: Bytes) -> FrameRecord {
        let hex_text = outer.json.get("data").and_then(Value::as_str).unwrap_or("");
        let inner = hex::decode(hex_text)
            .map_err(|e| format!("BidiAppend data is not hex: {e}"))
            .and_then(|bytes| {
                let schema = self.schema.as_ref().ok_or("no schema loaded")?;
                let descriptor = schema
                    .message("agent.v1.AgentClientMessage")
                    .ok_or("the schema has no agent.v1.AgentClientMessage")?;
                schema::decode(&descriptor, &bytes).map_err(|e| format!("BidiAppend data: {e}"))
            });
        match inner {
            Ok(inner) => {
                // The ids of the message it carries (whose exec or KV id sits at its own top), and
                // the run the append names: the only id of the outer message. Each once.
                let mut ids = ids_of(&inner.type_path, &inner.json);
                if let Some(run) = outer
                    .json
                    .pointer("/request_id/request_id")
                    .and_then(Value::as_str)
                    .filter(|run| !run.is_empty())
                {
                    ids.push(("request_id", run.to_owned()));
                    ids.sort();
                    ids.dedup();
                }
                let mut json = outer.json;
                json["data"] = inner.json;
                let decoded = Decoded {
                    type_path: inner.type_path,
                    json,
                    unknown: inner.unknown,
                };
                self.decoded_with_ids(decoded, raw, ids)
            }
            Err(reason) => {
                let mut record = self.decoded(outer, raw);
                record.kind = FrameKind::Undecoded;
                record.error = Some(reason);
                record
            }
        }
    }
}

fn base64_any(text: &str) -> Option<Vec<u8>> {
    use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD};
    [STANDARD_NO_PAD, STANDARD, URL_SAFE_NO_PAD, URL_SAFE]
        .iter()
        .find_map(|engine| engine.decode(text).ok())
}

/// The ids a frame carries: the id fields anywhere in it, and the exec or KV id of an exec/KV message.
pub fn ids_of(type_path: &str, json: &Value) -> Vec<(&'static str, String)> {
    let mut ids = Vec::new();
    walk_ids(json, &mut ids, 0);
    let top = type_path.split('.').next().unwrap_or("");
    let family = if top.starts_with("exec_") {
        Some("exec_id")
    } else if top.starts_with("kv_") {
        Some("kv_id")
    } else {
        None
    };
    if let Some(kind) = family {
        let message = json.get(top);
        let id = message
            .and_then(|m| m.get("id"))
            .or_else(|| {
                let second = type_path.split('.').nth(1)?;
                message?.get(second)?.get("id")
            })
            .map(|v| v.to_string().trim_matches('"').to_owned());
        // KV ids start at 0, which proto3 JSON leaves out.
        match id {
            Some(id) => ids.push((kind, id)),
            None if kind == "kv_id" => ids.push((kind, "0".to_owned())),
            None => {}
        }
    }
    ids.sort();
    ids.dedup();
    ids
}

fn walk_ids(json: &Value, out: &mut Vec<(&'static str, String)>, depth: usize) {
    if depth > 64 {
        return;
    }
    match json {
        Value::Object(map) => {
            for (key, value) in map {
                if let Some(kind) = ID_FIELDS.iter().find(|k| **k == key)
                    && let Value::String(text) = value
                    && !text.is_empty()
                {
                    out.push((kind, text.clone()));
                    if *kind == "blob_id"
                        && let Some(bytes) = base64_any(text)
                    {
                        out.push((kind, hex::encode(bytes)));
                    }
                }
                walk_ids(value, out, depth + 1);
            }
        }
        Value::Array(items) => items.iter().for_each(|v| walk_ids(v, out, depth + 1)),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exec_and_kv_messages_give_their_ids_and_id_fields_are_found_anywhere() {
        let json: Value = serde_json::json!({
            "exec_server_message": {"id": 3, "shell_args": {"command": "ls", "tool_call_id": "call_1"}}
        });
        let ids = ids_of("exec_server_message.shell_args", &json);
        assert!(ids.contains(&("exec_id", "3".to_owned())), "{ids:?}");
        assert!(
            ids.contains(&("tool_call_id", "call_1".to_owned())),
            "{ids:?}"
        );
        let kv = ids_of(
            "kv_server_message.set_blob_args",
            &serde_json::json!({"kv_server_message": {"set_blob_args": {"blob_id": "AAEC"}}}),
        );
        assert!(kv.contains(&("kv_id", "0".to_owned())), "{kv:?}");
        assert!(kv.contains(&("blob_id", "000102".to_owned())), "{kv:?}");
        let close = ids_of(
            "exec_client_control_message.stream_close",
            &serde_json::json!({"exec_client_control_message": {"stream_close": {"id": 7}}}),
        );
        assert!(close.contains(&("exec_id", "7".to_owned())), "{close:?}");
    }

    #[test]
    fn without_a_schema_every_frame_is_kept_raw_with_the_reason() {
        let mut decoder = StreamDecoder::new(
            None,
            Side {
                direction: Direction::Server,
                path: "/agent.v1.AgentService/Run",
                content_type: Some("application/connect+proto"),
                content_encoding: None,
                connect_content_encoding: None,
            },
        );
        let mut wire = vec![0, 0, 0, 0, 2, 0x0a, 0x00];
        wire.extend([FLAG_END_STREAM, 0, 0, 0, 2, b'{', b'}']);
        let frames = decoder.push(&wire);
        assert_eq!(frames.len(), 2);
        assert_eq!(frames[0].kind, FrameKind::Undecoded);
        assert_eq!(&frames[0].raw[..], [0x0a, 0x00]);
        assert!(
            frames[0]
                .error
                .as_deref()
                .unwrap_or("")
                .contains("no schema")
        );
        assert_eq!(
            frames[1].kind,
            FrameKind::EndStream,
            "end of stream is JSON, no schema needed"
        );
        assert_eq!(frames[1].type_path, "end_stream");
    }
}
