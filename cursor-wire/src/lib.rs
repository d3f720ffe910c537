//! The mechanics of the Connect wire that both cursor-server and the capture debugger (cursor-backend)
//! need, kept once: envelope flags and framing, the content types, gzip and unary bodies, and the
//! one HTML escaper both crates' pages use. Bytes in, payloads out: no schema, no protobuf types and
//! no HTTP stack, so the debugger (which loads its schema at run time) depends on this and not on the
//! server's build-time schema. What a payload means, and how an error reaches a client, stay with
//! each crate.

pub mod body;
pub mod envelope;
pub mod html;

pub use body::{Encoding, decode_stream_request, decode_unary_body, gunzip, payload_of};
pub use envelope::{Frame, FrameDecoder, decode_frames, encode_frame};

/// Envelope flag: the payload is compressed with the negotiated message encoding.
pub const FLAG_COMPRESSED: u8 = 0x01;
/// Envelope flag: the last envelope of a stream, carrying end-of-stream JSON.
pub const FLAG_END_STREAM: u8 = 0x02;
/// An envelope's header: `flags:u8`, `length:u32` big-endian.
pub const HEADER_LEN: usize = 5;

/// A stream of envelopes (Connect streaming, protobuf messages).
pub const CONTENT_TYPE_STREAM: &str = "application/connect+proto";
/// A stream of envelopes carrying JSON messages.
pub const CONTENT_TYPE_STREAM_JSON: &str = "application/connect+json";
/// One protobuf message (Connect unary).
pub const CONTENT_TYPE_UNARY: &str = "application/proto";
/// A unary JSON message or a Connect unary error.
pub const CONTENT_TYPE_JSON: &str = "application/json";

/// What can be wrong with bytes on the Connect wire. `Protobuf` is the one variant this crate never
/// returns: it is here so a user decoding payloads reports through the same type its framing errors
/// arrive in.
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
