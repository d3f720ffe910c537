//! Connect for this server, on top of the workspace's shared framing (`cursor-wire`, re-exported
//! here so the server and its tests keep one path): protobuf messages in and out of envelopes,
//! Connect error codes and their JSON (with `aiserver.v1.ErrorDetails`), unary responses, and which
//! HTTP headers belong to the message rather than the connection. What needs the build-time schema
//! or axum stays here; bytes-only mechanics live in `cursor-wire`, which the debugger shares.

use axum::http::{HeaderMap, HeaderName, StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use bytes::{BufMut, Bytes, BytesMut};
use prost::Message;

use cursor_wire::HEADER_LEN;
pub use cursor_wire::{
    CONTENT_TYPE_JSON, CONTENT_TYPE_STREAM, CONTENT_TYPE_UNARY, Encoding, FLAG_COMPRESSED,
    FLAG_END_STREAM, Frame, FrameDecoder, WireError, decode_frames, decode_stream_request,
    decode_unary_body, encode_frame, payload_of,
};

use crate::cursor::proto::aiserver::{CustomErrorDetails, ErrorDetails, error_details};

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
