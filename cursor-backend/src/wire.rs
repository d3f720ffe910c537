//! The Connect wire as it passes by: how a body is framed (from its content type), and the debugger's
//! tolerant use of the shared framing (`cursor-wire`): an envelope reader that takes chunks exactly as
//! they arrive and, where the server would refuse, keeps the bytes raw with a reason; gzip tried even
//! when nothing negotiated it. Bytes in, payloads out; what a payload means is `decode.rs`'s business.

use bytes::Bytes;
use cursor_wire::{FrameDecoder, WireError};

pub use cursor_wire::{FLAG_COMPRESSED, FLAG_END_STREAM};
/// A frame claiming more than this is not believed: the rest of the body is kept raw.
pub const MAX_FRAME_BYTES: usize = 256 * 1024 * 1024;
/// Bodies that are not RPC messages (HTML, images, ...) are kept up to this many bytes.
pub const MAX_OPAQUE_BYTES: usize = 4 * 1024 * 1024;

/// How one direction of an exchange is framed, read off its content type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// `application/connect+proto`, `application/grpc`: a sequence of envelopes.
    Envelopes { json: bool },
    /// `application/proto`: one message, raw or in one envelope (Cursor sends both).
    Unary,
    /// `application/json`: a unary message or a Connect error, as JSON.
    Json,
    /// Anything else: kept as it is.
    Opaque,
}

impl Framing {
    pub fn of(content_type: Option<&str>) -> Framing {
        let essence = content_type
            .unwrap_or("")
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase();
        match essence.as_str() {
            "application/connect+proto" | "application/grpc" | "application/grpc+proto" => {
                Framing::Envelopes { json: false }
            }
            "application/connect+json" | "application/grpc+json" => {
                Framing::Envelopes { json: true }
            }
            "application/proto" | "application/x-protobuf" | "application/protobuf" => {
                Framing::Unary
            }
            "application/json" => Framing::Json,
            _ => Framing::Opaque,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Framing::Envelopes { .. } => "envelopes",
            Framing::Unary => "unary",
            Framing::Json => "json",
            Framing::Opaque => "opaque",
        }
    }
}

/// One envelope read off the wire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Envelope {
    pub flags: u8,
    pub payload: Bytes,
}

/// What the envelope reader gives back for a chunk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    Envelope(Envelope),
    /// Bytes that cannot be framed (an impossible length); the reader stops framing after this and
    /// hands every later byte back the same way.
    Unframed {
        bytes: Bytes,
        reason: String,
    },
}

/// Reads envelopes out of chunks as they arrive.
#[derive(Debug)]
pub struct EnvelopeReader {
    /// Any flags byte is taken: the debugger records what passes by, gRPC trailers included.
    decoder: FrameDecoder,
    broken: Option<String>,
}

impl Default for EnvelopeReader {
    fn default() -> Self {
        EnvelopeReader {
            decoder: FrameDecoder::new(MAX_FRAME_BYTES).with_any_flags(),
            broken: None,
        }
    }
}

impl EnvelopeReader {
    pub fn push(&mut self, chunk: &[u8]) -> Vec<Piece> {
        if let Some(reason) = &self.broken {
            return vec![Piece::Unframed {
                bytes: Bytes::copy_from_slice(chunk),
                reason: reason.clone(),
            }];
        }
        self.decoder.push(chunk);
        let mut pieces = Vec::new();
        loop {
            match self.decoder.next_frame() {
                Ok(Some(frame)) => pieces.push(Piece::Envelope(Envelope {
                    flags: frame.flags,
                    payload: frame.payload,
                })),
                Ok(None) => return pieces,
                Err(error) => {
                    let reason = match error {
                        WireError::FrameTooLarge { len, max } => format!(
                            "envelope header claims {len} bytes (over {max}); the rest of the body is not framed"
                        ),
                        other => format!("{other}; the rest of the body is not framed"),
                    };
                    pieces.push(Piece::Unframed {
                        bytes: self.decoder.take_buffered(),
                        reason: reason.clone(),
                    });
                    self.broken = Some(reason);
                    return pieces;
                }
            }
        }
    }

    /// The body ended: whatever is left is a truncated frame.
    pub fn finish(&mut self) -> Option<Piece> {
        let Err(WireError::ShortFrame { have, need }) = self.decoder.finish() else {
            return None;
        };
        Some(Piece::Unframed {
            bytes: self.decoder.take_buffered(),
            reason: format!("the body ended inside a frame: {have} of {need} bytes"),
        })
    }
}

/// Content encodings this reader understands; `Other` is recorded, not refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    Identity,
    Gzip,
    Other,
}

impl Encoding {
    pub fn of(value: Option<&str>) -> Encoding {
        let lower = value.map(str::to_ascii_lowercase);
        match cursor_wire::Encoding::parse(lower.as_deref()) {
            Ok(cursor_wire::Encoding::Identity) => Encoding::Identity,
            Ok(cursor_wire::Encoding::Gzip) => Encoding::Gzip,
            Err(_) => Encoding::Other,
        }
    }
}

pub fn gunzip(data: &[u8]) -> Result<Bytes, String> {
    cursor_wire::gunzip(data, MAX_FRAME_BYTES).map_err(|e| e.to_string())
}

/// The payload of an envelope once its compression flag is honoured.
pub fn envelope_payload(envelope: &Envelope, encoding: Encoding) -> Result<Bytes, String> {
    if envelope.flags & FLAG_COMPRESSED == 0 {
        return Ok(envelope.payload.clone());
    }
    match encoding {
        Encoding::Gzip => gunzip(&envelope.payload),
        // Compressed without a negotiated encoding: Connect's only common one is gzip; try it.
        Encoding::Identity => gunzip(&envelope.payload)
            .map_err(|e| format!("compressed frame without a negotiated encoding ({e})")),
        Encoding::Other => Err("compressed with an encoding this debugger cannot read".to_owned()),
    }
}

/// A unary body: inflated per `content-encoding`, then unwrapped if it is one envelope (the server's
/// rule, shared: a raw protobuf message cannot start with 0x00 or 0x01).
pub fn unary_payload(body: &[u8], body_encoding: Encoding) -> Result<Bytes, String> {
    let encoding = match body_encoding {
        Encoding::Identity => cursor_wire::Encoding::Identity,
        Encoding::Gzip => cursor_wire::Encoding::Gzip,
        Encoding::Other => return Err("content-encoding this debugger cannot read".to_owned()),
    };
    cursor_wire::decode_unary_body(body, encoding, MAX_FRAME_BYTES).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn envelope(flags: u8, payload: &[u8]) -> Vec<u8> {
        let mut out = vec![flags];
        out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        out.extend_from_slice(payload);
        out
    }

    #[test]
    fn frames_split_across_chunks_and_packed_into_one_come_out_whole() {
        let mut wire = envelope(0, b"first");
        wire.extend(envelope(FLAG_END_STREAM, b"{}"));
        let mut reader = EnvelopeReader::default();
        let mut pieces = Vec::new();
        for byte in &wire[..3] {
            pieces.extend(reader.push(&[*byte]));
        }
        pieces.extend(reader.push(&wire[3..]));
        assert_eq!(
            pieces,
            [
                Piece::Envelope(Envelope {
                    flags: 0,
                    payload: Bytes::from_static(b"first")
                }),
                Piece::Envelope(Envelope {
                    flags: FLAG_END_STREAM,
                    payload: Bytes::from_static(b"{}")
                }),
            ]
        );
        assert_eq!(reader.finish(), None);
    }

    #[test]
    fn an_impossible_length_stops_framing_and_keeps_every_byte() {
        let mut reader = EnvelopeReader::default();
        let pieces = reader.push(&[0, 0xff, 0xff, 0xff, 0xff, 1, 2]);
        let [Piece::Unframed { bytes, reason }] = pieces.as_slice() else {
            panic!("{pieces:?}")
        };
        assert_eq!(bytes.len(), 7);
        assert!(reason.contains("claims"), "{reason}");
        let later = reader.push(&[9]);
        assert!(matches!(&later[..], [Piece::Unframed { bytes, .. }] if bytes[..] == [9]));
    }

    #[test]
    fn a_body_that_ends_mid_frame_is_reported_with_its_bytes() {
        let mut reader = EnvelopeReader::default();
        assert!(reader.push(&envelope(0, b"abcdef")[..7]).is_empty());
        let Some(Piece::Unframed { bytes, reason }) = reader.finish() else {
            panic!()
        };
        assert_eq!(bytes.len(), 7);
        assert!(reason.contains("7 of 11"), "{reason}");
    }

    #[test]
    fn unary_bodies_raw_enveloped_and_gzipped_give_the_same_payload() {
        use std::io::Write as _;
        let message = [0x0a, 0x01, b'x'];
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&message).expect("gzip");
        let gzipped = gz.finish().expect("gzip");
        assert_eq!(
            &unary_payload(&message, Encoding::Identity).expect("raw")[..],
            message
        );
        assert_eq!(
            &unary_payload(&envelope(0, &message), Encoding::Identity).expect("enveloped")[..],
            message
        );
        assert_eq!(
            &unary_payload(&gzipped, Encoding::Gzip).expect("gzip")[..],
            message
        );
        assert_eq!(
            &unary_payload(&envelope(FLAG_COMPRESSED, &gzipped), Encoding::Identity)
                .expect("compressed envelope")[..],
            message
        );
    }

    #[test]
    fn content_types_choose_the_framing() {
        assert_eq!(
            Framing::of(Some("application/connect+proto")),
            Framing::Envelopes { json: false }
        );
        assert_eq!(
            Framing::of(Some("application/proto; charset=x")),
            Framing::Unary
        );
        assert_eq!(Framing::of(Some("application/json")), Framing::Json);
        assert_eq!(Framing::of(None), Framing::Opaque);
    }
}
