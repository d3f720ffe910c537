//! The Connect wire as it passes by: how a body is framed (from its content type), an incremental
//! envelope reader that takes chunks exactly as they arrive (a frame split across chunks, several frames
//! in one), and gzip. Bytes in, payloads out; what a payload means is `decode.rs`'s business.

use std::io::Read as _;

use bytes::{Buf as _, Bytes, BytesMut};

pub const FLAG_COMPRESSED: u8 = 0x01;
pub const FLAG_END_STREAM: u8 = 0x02;
const HEADER_LEN: usize = 5;
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
#[derive(Debug, Default)]
pub struct EnvelopeReader {
    buffer: BytesMut,
    broken: Option<String>,
}

impl EnvelopeReader {
    pub fn push(&mut self, chunk: &[u8]) -> Vec<Piece> {
        if let Some(reason) = &self.broken {
            return vec![Piece::Unframed {
                bytes: Bytes::copy_from_slice(chunk),
                reason: reason.clone(),
            }];
        }
        self.buffer.extend_from_slice(chunk);
        let mut pieces = Vec::new();
        while self.buffer.len() >= HEADER_LEN {
            let flags = self.buffer[0];
            let len = u32::from_be_bytes([
                self.buffer[1],
                self.buffer[2],
                self.buffer[3],
                self.buffer[4],
            ]) as usize;
            if len > MAX_FRAME_BYTES {
                let reason = format!(
                    "envelope header claims {len} bytes (over {MAX_FRAME_BYTES}); the rest of the body is not framed"
                );
                pieces.push(Piece::Unframed {
                    bytes: self.buffer.split().freeze(),
                    reason: reason.clone(),
                });
                self.broken = Some(reason);
                return pieces;
            }
            if self.buffer.len() < HEADER_LEN + len {
                break;
            }
            self.buffer.advance(HEADER_LEN);
            let payload = self.buffer.split_to(len).freeze();
            pieces.push(Piece::Envelope(Envelope { flags, payload }));
        }
        pieces
    }

    /// The body ended: whatever is left is a truncated frame.
    pub fn finish(&mut self) -> Option<Piece> {
        if self.buffer.is_empty() {
            return None;
        }
        let have = self.buffer.len();
        let need = if have >= HEADER_LEN {
            HEADER_LEN
                + u32::from_be_bytes([
                    self.buffer[1],
                    self.buffer[2],
                    self.buffer[3],
                    self.buffer[4],
                ]) as usize
        } else {
            HEADER_LEN
        };
        Some(Piece::Unframed {
            bytes: self.buffer.split().freeze(),
            reason: format!("the body ended inside a frame: {have} of {need} bytes"),
        })
    }
}

/// Content encodings this reader understands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    Identity,
    Gzip,
    Other,
}

impl Encoding {
    pub fn of(value: Option<&str>) -> Encoding {
        match value.map(str::trim).map(str::to_ascii_lowercase).as_deref() {
            None | Some("") | Some("identity") => Encoding::Identity,
            Some("gzip") => Encoding::Gzip,
            Some(_) => Encoding::Other,
        }
    }
}

pub fn gunzip(data: &[u8]) -> Result<Bytes, String> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(data)
        .take(MAX_FRAME_BYTES as u64 + 1)
        .read_to_end(&mut out)
        .map_err(|e| format!("gzip: {e}"))?;
    if out.len() > MAX_FRAME_BYTES {
        return Err(format!(
            "gzip: more than {MAX_FRAME_BYTES} bytes once inflated"
        ));
    }
    Ok(Bytes::from(out))
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

/// A unary body: inflated per `content-encoding`, then unwrapped if it is one envelope. A raw protobuf
/// message cannot start with 0x00 or 0x01 (field number 0 is invalid), so a leading flags byte marks an
/// envelope without ambiguity.
pub fn unary_payload(body: &[u8], body_encoding: Encoding) -> Result<Bytes, String> {
    let body = match body_encoding {
        Encoding::Identity => Bytes::copy_from_slice(body),
        Encoding::Gzip => gunzip(body)?,
        Encoding::Other => return Err("content-encoding this debugger cannot read".to_owned()),
    };
    match body.first() {
        Some(&flags) if flags == 0 || flags == FLAG_COMPRESSED => {
            let mut reader = EnvelopeReader::default();
            let mut pieces = reader.push(&body);
            pieces.extend(reader.finish());
            match pieces.as_slice() {
                [Piece::Envelope(envelope)] => envelope_payload(envelope, Encoding::Gzip),
                [Piece::Unframed { reason, .. }] => Err(reason.clone()),
                _ => Err(format!(
                    "a unary body in {} envelopes; exactly one expected",
                    pieces.len()
                )),
            }
        }
        _ => Ok(body),
    }
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
