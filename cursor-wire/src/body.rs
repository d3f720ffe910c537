//! Payloads out of bodies: the content encodings understood (identity and gzip), bounded gunzip, a
//! unary body (raw or in one envelope, gzipped or not), the one message of a server-streaming request,
//! and a data frame's payload once its compression flag is honoured.

use std::io::Read as _;

use bytes::Bytes;

use crate::envelope::{Frame, decode_frames};
use crate::{FLAG_COMPRESSED, WireError};

/// The body's `content-encoding` / `connect-content-encoding`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    Identity,
    Gzip,
}

impl Encoding {
    /// The header's value, trimmed; absent or empty is identity.
    pub fn parse(value: Option<&str>) -> Result<Encoding, WireError> {
        match value.map(str::trim) {
            None | Some("") | Some("identity") => Ok(Encoding::Identity),
            Some("gzip") => Ok(Encoding::Gzip),
            Some(other) => Err(WireError::UnsupportedEncoding(other.to_owned())),
        }
    }
}

/// `data` inflated, refused once it grows past `max` bytes (a small gzip can inflate enormously, so
/// the bound is enforced while reading, not after).
pub fn gunzip(data: &[u8], max: usize) -> Result<Bytes, WireError> {
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
/// so a leading flags byte identifies an envelope without ambiguity. A compressed envelope is gzip,
/// Connect's only common encoding, whatever the body's own encoding was.
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
            if frame.is_compressed() {
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

/// The (decompressed) payload of a data frame; compressed without a negotiated encoding is an error.
pub fn payload_of(
    frame: &Frame,
    message_encoding: Encoding,
    max_frame_bytes: usize,
) -> Result<Bytes, WireError> {
    if !frame.is_compressed() {
        return Ok(frame.payload.clone());
    }
    match message_encoding {
        Encoding::Gzip => gunzip(&frame.payload, max_frame_bytes),
        Encoding::Identity => Err(WireError::UnexpectedCompression),
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write as _;

    use super::*;
    use crate::{FLAG_END_STREAM, encode_frame};

    const MESSAGE: [u8; 3] = [0x0a, 0x01, b'x'];

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(data).expect("gzip");
        gz.finish().expect("gzip")
    }

    #[test]
    fn encodings_parse_and_unknown_ones_are_refused() {
        assert_eq!(Encoding::parse(None), Ok(Encoding::Identity));
        assert_eq!(Encoding::parse(Some(" gzip ")), Ok(Encoding::Gzip));
        assert_eq!(
            Encoding::parse(Some("br")),
            Err(WireError::UnsupportedEncoding("br".to_owned()))
        );
    }

    #[test]
    fn unary_bodies_raw_enveloped_and_gzipped_give_the_same_payload() {
        let gzipped = gzip(&MESSAGE);
        for (body, encoding) in [
            (MESSAGE.to_vec(), Encoding::Identity),
            (encode_frame(0, &MESSAGE).to_vec(), Encoding::Identity),
            (gzipped.clone(), Encoding::Gzip),
            (gzip(&encode_frame(0, &MESSAGE)), Encoding::Gzip),
            (
                encode_frame(FLAG_COMPRESSED, &gzipped).to_vec(),
                Encoding::Identity,
            ),
        ] {
            let payload = decode_unary_body(&body, encoding, 1024).expect("payload");
            assert_eq!(&payload[..], MESSAGE, "{body:?}");
        }
    }

    #[test]
    fn a_gzip_bomb_is_stopped_at_the_bound() {
        let bomb = gzip(&[0u8; 4096]);
        assert_eq!(
            gunzip(&bomb, 1024),
            Err(WireError::DecompressedTooLarge { max: 1024 })
        );
        assert!(matches!(gunzip(b"not gzip", 1024), Err(WireError::Gzip(_))));
    }

    #[test]
    fn a_compressed_frame_needs_a_negotiated_encoding() {
        let frame = Frame {
            flags: FLAG_COMPRESSED,
            payload: Bytes::from(gzip(&MESSAGE)),
        };
        assert_eq!(
            payload_of(&frame, Encoding::Identity, 1024),
            Err(WireError::UnexpectedCompression)
        );
        assert_eq!(
            &payload_of(&frame, Encoding::Gzip, 1024).expect("gzip")[..],
            MESSAGE
        );
    }

    #[test]
    fn a_stream_request_is_exactly_one_data_frame() {
        let one = encode_frame(0, &MESSAGE);
        assert_eq!(
            &decode_stream_request(&one, Encoding::Identity, 64).expect("one")[..],
            MESSAGE
        );
        let mut two = one.to_vec();
        two.extend_from_slice(&one);
        assert_eq!(
            decode_stream_request(&two, Encoding::Identity, 64),
            Err(WireError::MessageCount(2))
        );
        assert_eq!(
            decode_stream_request(
                &encode_frame(FLAG_END_STREAM, b"{}"),
                Encoding::Identity,
                64
            ),
            Err(WireError::UnexpectedEndStream)
        );
    }
}
