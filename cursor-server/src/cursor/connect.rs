//! The Connect wire: 5-byte envelopes (`flags:u8`, `length:u32 BE`, payload), end-of-stream JSON, unary
//! bodies (raw or enveloped, gzip), unary responses (success and error) and which HTTP headers
//! belong to the message rather than the connection. Bytes in, frames out; no meaning here.

use std::io::Read as _;

use axum::http::{HeaderMap, HeaderName, StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use bytes::{Buf, BufMut, Bytes, BytesMut};
use prost::Message;

use super::proto::aiserver::{CustomErrorDetails, ErrorDetails, error_details};

pub const FLAG_COMPRESSED: u8 = 0x01;
pub const FLAG_END_STREAM: u8 = 0x02;
const HEADER_LEN: usize = 5;

pub const CONTENT_TYPE_STREAM: &str = "application/connect+proto";
pub const CONTENT_TYPE_UNARY: &str = "application/proto";
pub const CONTENT_TYPE_JSON: &str = "application/json";

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("truncated frame: {have} of {need} bytes")]
    ShortFrame { have: usize, need: usize },
    #[error("frame of {len} bytes exceeds the limit of {max} bytes")]
    FrameTooLarge { len: usize, max: usize },
    #[error("compressed frame without a negotiated encoding")]
    UnexpectedCompression,
    #[error("unknown frame flags {0:#04x}")]
    UnknownFlags(u8),
    #[error("unsupported content encoding {0:?} (only gzip and identity)")]
    UnsupportedEncoding(String),
    #[error("gzip body: {0}")]
    Gzip(String),
    #[error("decompressed body exceeds the limit of {max} bytes")]
    DecompressedTooLarge { max: usize },
    #[error("invalid protobuf {message}: {reason}")]
    Protobuf {
        message: &'static str,
        reason: String,
    },
    #[error("unexpected end-of-stream frame in a request")]
    UnexpectedEndStream,
    #[error("request stream carried {0} messages; exactly one expected")]
    MessageCount(usize),
}

/// One decoded envelope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub flags: u8,
    pub payload: Bytes,
}

impl Frame {
    pub fn is_end_stream(&self) -> bool {
        self.flags & FLAG_END_STREAM != 0
    }
}

/// Incremental envelope decoder for a byte stream arriving in arbitrary chunks.
#[derive(Debug)]
pub struct FrameDecoder {
    buffer: BytesMut,
    max_frame_bytes: usize,
}

impl FrameDecoder {
    pub fn new(max_frame_bytes: usize) -> Self {
        FrameDecoder {
            buffer: BytesMut::new(),
            max_frame_bytes,
        }
    }

    pub fn push(&mut self, chunk: &[u8]) {
        self.buffer.extend_from_slice(chunk);
    }

    /// The next complete frame, `Ok(None)` when more bytes are needed.
    pub fn next_frame(&mut self) -> Result<Option<Frame>, WireError> {
        if self.buffer.len() < HEADER_LEN {
            return Ok(None);
        }
        let flags = self.buffer[0];
        if flags & !(FLAG_COMPRESSED | FLAG_END_STREAM) != 0 {
            return Err(WireError::UnknownFlags(flags));
        }
        let len = u32::from_be_bytes([
            self.buffer[1],
            self.buffer[2],
            self.buffer[3],
            self.buffer[4],
        ]) as usize;
        if len > self.max_frame_bytes {
            return Err(WireError::FrameTooLarge {
                len,
                max: self.max_frame_bytes,
            });
        }
        if self.buffer.len() < HEADER_LEN + len {
            return Ok(None);
        }
        self.buffer.advance(HEADER_LEN);
        let payload = self.buffer.split_to(len).freeze();
        Ok(Some(Frame { flags, payload }))
    }

    /// Call at end of input: leftover bytes mean the peer cut a frame short.
    pub fn finish(&self) -> Result<(), WireError> {
        if self.buffer.is_empty() {
            return Ok(());
        }
        let need = if self.buffer.len() < HEADER_LEN {
            HEADER_LEN
        } else {
            HEADER_LEN
                + u32::from_be_bytes([
                    self.buffer[1],
                    self.buffer[2],
                    self.buffer[3],
                    self.buffer[4],
                ]) as usize
        };
        Err(WireError::ShortFrame {
            have: self.buffer.len(),
            need,
        })
    }
}

/// Decodes every frame of a complete body.
pub fn decode_frames(body: &[u8], max_frame_bytes: usize) -> Result<Vec<Frame>, WireError> {
    let mut decoder = FrameDecoder::new(max_frame_bytes);
    decoder.push(body);
    let mut frames = Vec::new();
    while let Some(frame) = decoder.next_frame()? {
        frames.push(frame);
    }
    decoder.finish()?;
    Ok(frames)
}

pub fn encode_frame(flags: u8, payload: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(HEADER_LEN + payload.len());
    out.put_u8(flags);
    out.put_u32(u32::try_from(payload.len()).unwrap_or(u32::MAX));
    out.put_slice(payload);
    out.freeze()
}

/// A data frame carrying `message`.
pub fn encode_message<M: Message>(message: &M) -> Bytes {
    let len = message.encoded_len();
    let mut out = BytesMut::with_capacity(HEADER_LEN + len);
    out.put_u8(0);
    out.put_u32(u32::try_from(len).unwrap_or(u32::MAX));
    // Encoding into a buffer with enough capacity cannot fail.
    let _ = message.encode(&mut out);
    out.freeze()
}

/// Decodes a protobuf payload, naming the message type on failure.
pub fn decode_message<M: Message + Default>(
    payload: &[u8],
    name: &'static str,
) -> Result<M, WireError> {
    M::decode(payload).map_err(|e| WireError::Protobuf {
        message: name,
        reason: e.to_string(),
    })
}

/// The body's `content-encoding` / `connect-content-encoding`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    Identity,
    Gzip,
}

impl Encoding {
    pub fn parse(value: Option<&str>) -> Result<Encoding, WireError> {
        match value.map(str::trim) {
            None | Some("") | Some("identity") => Ok(Encoding::Identity),
            Some("gzip") => Ok(Encoding::Gzip),
            Some(other) => Err(WireError::UnsupportedEncoding(other.to_owned())),
        }
    }
}

fn gunzip(data: &[u8], max: usize) -> Result<Bytes, WireError> {
    let mut out = Vec::new();
    let mut reader = flate2::read::GzDecoder::new(data).take(max as u64 + 1);
    reader
        .read_to_end(&mut out)
        .map_err(|e| WireError::Gzip(e.to_string()))?;
    if out.len() > max {
        return Err(WireError::DecompressedTooLarge { max });
    }
    Ok(Bytes::from(out))
}

/// The protobuf payload of a unary request body.
///
/// `body_encoding` is the HTTP `content-encoding`. Cursor sends unary bodies either raw or wrapped in
/// one envelope; a raw protobuf message can never start with 0x00 or 0x01 (field number 0 is invalid),
/// so a leading flags byte identifies an envelope without ambiguity.
pub fn decode_unary_body(
    body: &[u8],
    body_encoding: Encoding,
    max_bytes: usize,
) -> Result<Bytes, WireError> {
    if body.len() > max_bytes {
        return Err(WireError::FrameTooLarge {
            len: body.len(),
            max: max_bytes,
        });
    }
    let body = match body_encoding {
        Encoding::Identity => Bytes::copy_from_slice(body),
        Encoding::Gzip => gunzip(body, max_bytes)?,
    };
    match body.first() {
        Some(&flags) if flags == 0 || flags == FLAG_COMPRESSED => {
            let frames = decode_frames(&body, max_bytes)?;
            let [frame] = frames.as_slice() else {
                return Err(WireError::MessageCount(frames.len()));
            };
            if frame.flags & FLAG_COMPRESSED != 0 {
                gunzip(&frame.payload, max_bytes)
            } else {
                Ok(frame.payload.clone())
            }
        }
        _ => Ok(body),
    }
}

/// The single message of a server-streaming request body (one data envelope).
pub fn decode_stream_request(
    body: &[u8],
    message_encoding: Encoding,
    max_frame_bytes: usize,
) -> Result<Bytes, WireError> {
    let frames = decode_frames(body, max_frame_bytes)?;
    let [frame] = frames.as_slice() else {
        return Err(WireError::MessageCount(frames.len()));
    };
    if frame.is_end_stream() {
        return Err(WireError::UnexpectedEndStream);
    }
    payload_of(frame, message_encoding, max_frame_bytes)
}

/// The (decompressed) payload of a request-stream data frame.
pub fn payload_of(
    frame: &Frame,
    message_encoding: Encoding,
    max_frame_bytes: usize,
) -> Result<Bytes, WireError> {
    if frame.flags & FLAG_COMPRESSED == 0 {
        return Ok(frame.payload.clone());
    }
    match message_encoding {
        Encoding::Gzip => gunzip(&frame.payload, max_frame_bytes),
        Encoding::Identity => Err(WireError::UnexpectedCompression),
    }
}

/// Connect error codes the server uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnectCode {
    Canceled,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    Unimplemented,
    Internal,
    Unavailable,
    Unauthenticated,
}

impl ConnectCode {
    pub fn as_str(self) -> &'static str {
        match self {
            ConnectCode::Canceled => "canceled",
            ConnectCode::InvalidArgument => "invalid_argument",
            ConnectCode::NotFound => "not_found",
            ConnectCode::PermissionDenied => "permission_denied",
            ConnectCode::ResourceExhausted => "resource_exhausted",
            ConnectCode::Unimplemented => "unimplemented",
            ConnectCode::Internal => "internal",
            ConnectCode::Unavailable => "unavailable",
            ConnectCode::Unauthenticated => "unauthenticated",
        }
    }

    /// HTTP status of a unary error response with this code (Connect protocol mapping).
    fn http_status(self) -> u16 {
        match self {
            ConnectCode::Canceled => 499,
            ConnectCode::InvalidArgument => 400,
            ConnectCode::NotFound => 404,
            ConnectCode::PermissionDenied => 403,
            ConnectCode::ResourceExhausted => 429,
            ConnectCode::Unimplemented => 501,
            ConnectCode::Internal => 500,
            ConnectCode::Unavailable => 503,
            ConnectCode::Unauthenticated => 401,
        }
    }
}

/// An error as Connect carries it: code, message and optional `aiserver.v1.ErrorDetails`.
#[derive(Debug, Clone, PartialEq)]
pub struct ConnectError {
    pub code: ConnectCode,
    pub message: String,
    /// Boxed: the details are rare and large, and a `Result<_, ConnectError>` should stay small.
    pub details: Option<Box<ErrorDetails>>,
}

impl ConnectError {
    pub fn new(code: ConnectCode, message: impl Into<String>) -> Self {
        ConnectError {
            code,
            message: message.into(),
            details: None,
        }
    }

    /// A provider failure as Cursor expects it: `ERROR_PROVIDER_ERROR` details carrying the
    /// provider's own text (protocol.md §2), under `code`, retryable only where trying again can
    /// help (a bad key or a refused request fails the same way every time).
    pub fn provider(
        code: ConnectCode,
        title: impl Into<String>,
        detail: impl Into<String>,
        is_retryable: bool,
    ) -> Self {
        let detail = detail.into();
        ConnectError {
            code,
            message: detail.clone(),
            details: Some(Box::new(ErrorDetails {
                error: error_details::Error::ProviderError as i32,
                details: Some(CustomErrorDetails {
                    title: title.into(),
                    detail,
                    is_retryable: Some(is_retryable),
                    show_request_id: Some(true),
                    should_show_immediate_error: Some(false),
                    ..CustomErrorDetails::default()
                }),
                is_expected: Some(false),
            })),
        }
    }

    /// The `{"code","message","details"}` object shared by unary bodies and end-of-stream errors.
    fn to_json(&self) -> serde_json::Value {
        let mut error = serde_json::json!({
            "code": self.code.as_str(),
            "message": self.message,
        });
        if let Some(details) = &self.details {
            let value =
                base64::engine::general_purpose::STANDARD_NO_PAD.encode(details.encode_to_vec());
            error["details"] = serde_json::json!([{
                "type": "aiserver.v1.ErrorDetails",
                "value": value,
            }]);
        }
        error
    }
}

/// End-of-stream frame for a successful stream: exactly `02 00 00 00 02 7b 7d`.
pub fn end_stream_ok() -> Bytes {
    encode_frame(FLAG_END_STREAM, b"{}")
}

/// End-of-stream frame carrying `{"error": {...}}`.
pub fn end_stream_error(error: &ConnectError) -> Bytes {
    let body = serde_json::json!({ "error": error.to_json() });
    encode_frame(FLAG_END_STREAM, body.to_string().as_bytes())
}

/// A Connect unary error: HTTP status from the code, JSON `{"code","message","details"?}` body.
impl IntoResponse for ConnectError {
    fn into_response(self) -> Response {
        let status =
            StatusCode::from_u16(self.code.http_status()).unwrap_or(StatusCode::BAD_REQUEST);
        (
            status,
            [(header::CONTENT_TYPE, CONTENT_TYPE_JSON)],
            self.to_json().to_string(),
        )
            .into_response()
    }
}

/// A successful unary response: 200, `application/proto`, the encoded message.
pub fn unary_ok<M: Message>(message: &M) -> Response {
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, CONTENT_TYPE_UNARY)],
        message.encode_to_vec(),
    )
        .into_response()
}

/// The protobuf payload of a unary request, whatever its `content-encoding` and framing.
pub fn unary_payload(
    headers: &HeaderMap,
    body: &[u8],
    max_bytes: usize,
) -> Result<Bytes, WireError> {
    let encoding = Encoding::parse(header_str(headers, header::CONTENT_ENCODING.as_str()))?;
    decode_unary_body(body, encoding, max_bytes)
}

/// A unary request's message, whatever its `content-encoding` and framing.
pub fn decode_unary<M: Message + Default>(
    headers: &HeaderMap,
    body: &[u8],
    max_bytes: usize,
    name: &'static str,
) -> Result<M, WireError> {
    unary_payload(headers, body, max_bytes).and_then(|payload| decode_message(&payload, name))
}

/// A header's value, if present and text.
pub fn header_str<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// `headers` without those that belong to one connection rather than to the message (RFC 9110
/// §7.6.1): what is forwarded between the client and Cursor's backend, both ways.
pub fn end_to_end_headers(headers: &HeaderMap) -> HeaderMap {
    let hop_by_hop = hop_by_hop_headers(headers);
    let mut forwarded = headers.clone();
    for name in &hop_by_hop {
        forwarded.remove(name);
    }
    forwarded
}

/// Headers that belong to one connection, not to the message: never forwarded.
fn hop_by_hop_headers(headers: &HeaderMap) -> Vec<HeaderName> {
    let mut names = vec![
        header::CONNECTION,
        header::HOST,
        header::PROXY_AUTHENTICATE,
        header::PROXY_AUTHORIZATION,
        header::TE,
        header::TRAILER,
        header::TRANSFER_ENCODING,
        header::UPGRADE,
        HeaderName::from_static("keep-alive"),
        HeaderName::from_static("proxy-connection"),
    ];
    // Whatever `Connection` names is hop-by-hop too.
    for value in headers.get_all(header::CONNECTION) {
        if let Ok(list) = value.to_str() {
            names.extend(
                list.split(',')
                    .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok()),
            );
        }
    }
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_unary_error_is_json_with_the_status_of_its_code() {
        let response = ConnectError::new(ConnectCode::NotFound, "gone").into_response();
        assert_eq!(response.status(), StatusCode::NOT_FOUND);
        assert_eq!(response.headers()[header::CONTENT_TYPE], CONTENT_TYPE_JSON);
        let response = ConnectError::new(ConnectCode::Canceled, "stop").into_response();
        assert_eq!(response.status().as_u16(), 499);
    }

    #[test]
    fn connection_headers_and_those_connection_names_are_not_forwarded() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::CONNECTION,
            "keep-alive, x-hop".parse().expect("value"),
        );
        headers.insert("x-hop", "1".parse().expect("value"));
        headers.insert(header::HOST, "localhost".parse().expect("value"));
        headers.insert(header::AUTHORIZATION, "Bearer t".parse().expect("value"));
        let forwarded = end_to_end_headers(&headers);
        assert_eq!(forwarded.len(), 1);
        assert_eq!(forwarded[header::AUTHORIZATION], "Bearer t");
    }
}
