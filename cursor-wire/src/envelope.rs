//! Connect envelopes: `flags:u8`, `length:u32` big-endian, then the payload. Encoding one, and an
//! incremental decoder that takes a body in whatever chunks it arrives (a frame split across chunks,
//! several frames in one) and refuses a length over its bound before buffering it.

use bytes::{Buf as _, BufMut as _, Bytes, BytesMut};

use crate::{FLAG_COMPRESSED, FLAG_END_STREAM, HEADER_LEN, WireError};

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

    pub fn is_compressed(&self) -> bool {
        self.flags & FLAG_COMPRESSED != 0
    }
}

/// Incremental envelope decoder for a byte stream arriving in arbitrary chunks.
#[derive(Debug)]
pub struct FrameDecoder {
    buffer: BytesMut,
    max_frame_bytes: usize,
    /// Flags outside Connect's two are refused unless the user asked for any: the server answers
    /// a client that sends them, the debugger records whatever passes by (gRPC trailers included).
    any_flags: bool,
}

impl FrameDecoder {
    pub fn new(max_frame_bytes: usize) -> Self {
        FrameDecoder {
            buffer: BytesMut::new(),
            max_frame_bytes,
            any_flags: false,
        }
    }

    /// The same decoder, taking frames whatever their flags byte holds.
    pub fn with_any_flags(mut self) -> Self {
        self.any_flags = true;
        self
    }

    pub fn push(&mut self, chunk: &[u8]) {
        self.buffer.extend_from_slice(chunk);
    }

    /// The length the buffered header claims, if a whole header is buffered.
    fn claimed_len(&self) -> Option<usize> {
        let header = self.buffer.get(..HEADER_LEN)?;
        Some(u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize)
    }

    /// The next complete frame, `Ok(None)` when more bytes are needed. After an error the buffer is
    /// left as it was, so the caller can take it (`take_buffered`).
    pub fn next_frame(&mut self) -> Result<Option<Frame>, WireError> {
        let Some(len) = self.claimed_len() else {
            return Ok(None);
        };
        let flags = self.buffer[0];
        if !self.any_flags && flags & !(FLAG_COMPRESSED | FLAG_END_STREAM) != 0 {
            return Err(WireError::UnknownFlags(flags));
        }
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
        Err(WireError::ShortFrame {
            have: self.buffer.len(),
            need: HEADER_LEN + self.claimed_len().unwrap_or(0),
        })
    }

    /// Every byte not yet returned as a frame, leaving the buffer empty: what a recorder keeps raw
    /// once framing has failed.
    pub fn take_buffered(&mut self) -> Bytes {
        self.buffer.split().freeze()
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

/// One envelope around `payload`.
pub fn encode_frame(flags: u8, payload: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(HEADER_LEN + payload.len());
    out.put_u8(flags);
    out.put_u32(u32::try_from(payload.len()).unwrap_or(u32::MAX));
    out.put_slice(payload);
    out.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wire() -> Vec<u8> {
        let mut wire = encode_frame(0, b"first").to_vec();
        wire.extend_from_slice(&encode_frame(FLAG_END_STREAM, b"{}"));
        wire
    }

    fn drain(decoder: &mut FrameDecoder) -> Vec<Frame> {
        let mut frames = Vec::new();
        while let Some(frame) = decoder.next_frame().expect("frame") {
            frames.push(frame);
        }
        frames
    }

    #[test]
    fn an_envelope_is_flags_then_a_big_endian_length_then_the_payload() {
        assert_eq!(
            &encode_frame(FLAG_END_STREAM, b"{}")[..],
            [0x02, 0, 0, 0, 2, b'{', b'}']
        );
    }

    #[test]
    fn frames_fed_one_byte_at_a_time_come_out_whole_and_in_order() {
        let mut decoder = FrameDecoder::new(64);
        let mut frames = Vec::new();
        for byte in wire() {
            decoder.push(&[byte]);
            frames.extend(drain(&mut decoder));
        }
        assert_eq!(frames.len(), 2);
        assert_eq!(&frames[0].payload[..], b"first");
        assert!(!frames[0].is_end_stream());
        assert!(frames[1].is_end_stream());
        decoder.finish().expect("nothing left over");
    }

    #[test]
    fn frames_packed_into_one_chunk_all_come_out() {
        let frames = decode_frames(&wire(), 64).expect("frames");
        assert_eq!(
            frames,
            [
                Frame {
                    flags: 0,
                    payload: Bytes::from_static(b"first")
                },
                Frame {
                    flags: FLAG_END_STREAM,
                    payload: Bytes::from_static(b"{}")
                },
            ]
        );
    }

    #[test]
    fn a_length_over_the_bound_is_refused_from_the_header_alone_and_the_bytes_stay() {
        let mut decoder = FrameDecoder::new(4);
        decoder.push(&[0, 0, 0, 0, 5]);
        assert_eq!(
            decoder.next_frame(),
            Err(WireError::FrameTooLarge { len: 5, max: 4 })
        );
        assert_eq!(&decoder.take_buffered()[..], [0, 0, 0, 0, 5]);
        decoder.finish().expect("taken");
    }

    #[test]
    fn a_body_cut_inside_a_frame_or_a_header_is_short() {
        let whole = encode_frame(0, b"abcdef");
        assert_eq!(
            decode_frames(&whole[..7], 64),
            Err(WireError::ShortFrame { have: 7, need: 11 })
        );
        assert_eq!(
            decode_frames(&whole[..3], 64),
            Err(WireError::ShortFrame { have: 3, need: 5 })
        );
    }

    #[test]
    fn unknown_flags_are_refused_unless_any_flags_are_taken() {
        let frame = encode_frame(0x80, b"trailers");
        assert_eq!(
            decode_frames(&frame, 64),
            Err(WireError::UnknownFlags(0x80))
        );
        let mut decoder = FrameDecoder::new(64).with_any_flags();
        decoder.push(&frame);
        assert_eq!(drain(&mut decoder)[0].flags, 0x80);
    }

    #[test]
    fn the_compression_flag_is_read_off_the_flags_byte() {
        let frames = decode_frames(&encode_frame(FLAG_COMPRESSED, b"z"), 64).expect("frame");
        assert!(frames[0].is_compressed());
        assert!(!frames[0].is_end_stream());
    }
}
