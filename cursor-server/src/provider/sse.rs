//! Server-sent events as providers stream them: a response body's bytes in, whole events out
//! (the WHATWG "interpreting an event stream" rules: lines end with LF, CRLF or CR; `:` starts a
//! comment; `data` lines join with a newline; an empty line dispatches an event that has data; a
//! byte-order mark at the start is skipped). `id` and `retry` mean nothing to a provider call and
//! are ignored.
//!
//! (added) The decoder is the per-chunk work of every streamed call: it parses in place, one pass
//! over each line, and copies a byte only into the event it belongs to, so a read that holds
//! hundreds of events costs no more per event than one that holds one.

/// One event: its type (`event:`, empty when unnamed) and its data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    pub event: String,
    pub data: String,
}

/// Why the stream cannot be read as events.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SseError {
    #[error("the event stream is not UTF-8 at byte {0} of a line")]
    Utf8(usize),
}

/// Incremental decoder: `push` what the body gives, then take events with `next_event` until it
/// says it needs more bytes.
#[derive(Debug, Default)]
pub struct SseDecoder {
    /// Bytes received and not yet parsed start at `pos`.
    buf: Vec<u8>,
    pos: usize,
    /// The byte-order mark is looked for once, at the stream's start.
    started: bool,
    event: String,
    data: String,
}

const BOM: &[u8] = "\u{feff}".as_bytes();

impl SseDecoder {
    /// Adds the body's next bytes.
    pub fn push(&mut self, bytes: &[u8]) {
        // What was parsed goes first: the rest is at most a partial line.
        self.buf.drain(..self.pos);
        self.pos = 0;
        self.buf.extend_from_slice(bytes);
        if !self.started {
            if self.buf.len() < BOM.len() && BOM.starts_with(&self.buf) {
                return; // a mark that may still be arriving
            }
            self.started = true;
            if self.buf.starts_with(BOM) {
                self.pos = BOM.len();
            }
        }
    }

    /// The next complete event among the bytes pushed so far; `None` until more arrive.
    pub fn next_event(&mut self) -> Result<Option<SseEvent>, SseError> {
        if !self.started {
            return Ok(None);
        }
        loop {
            let rest = &self.buf[self.pos..];
            let Some(end) = rest.iter().position(|&b| b == b'\n' || b == b'\r') else {
                return Ok(None);
            };
            let ending = match (rest[end], rest.get(end + 1)) {
                (b'\r', Some(b'\n')) => 2,
                // A CR at the end of what came so far may be half of a CRLF: wait for the next byte.
                (b'\r', None) => return Ok(None),
                _ => 1,
            };
            let line =
                std::str::from_utf8(&rest[..end]).map_err(|e| SseError::Utf8(e.valid_up_to()))?;
            let dispatch = line.is_empty();
            if !dispatch {
                field(&mut self.event, &mut self.data, line);
            }
            self.pos += end + ending;
            if dispatch && let Some(event) = self.dispatch() {
                return Ok(Some(event));
            }
        }
    }

    /// An empty line: the event gathered so far, if it has data; its type is reset either way.
    fn dispatch(&mut self) -> Option<SseEvent> {
        let event = std::mem::take(&mut self.event);
        if self.data.is_empty() {
            return None;
        }
        let mut data = std::mem::take(&mut self.data);
        data.pop(); // the newline after the last `data` line
        Some(SseEvent { event, data })
    }
}

/// One `name: value` line (or a comment) of the event being gathered.
fn field(event: &mut String, data: &mut String, line: &str) {
    let (name, value) = match line.split_once(':') {
        Some(("", _)) => return, // a comment
        Some((name, value)) => (name, value.strip_prefix(' ').unwrap_or(value)),
        None => (line, ""),
    };
    match name {
        "data" => {
            data.push_str(value);
            data.push('\n');
        }
        "event" => {
            event.clear();
            event.push_str(value);
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events(chunks: &[&[u8]]) -> Vec<SseEvent> {
        let mut decoder = SseDecoder::default();
        let mut out = Vec::new();
        for chunk in chunks {
            decoder.push(chunk);
            while let Some(event) = decoder.next_event().expect("valid") {
                out.push(event);
            }
        }
        out
    }

    fn event(event: &str, data: &str) -> SseEvent {
        SseEvent {
            event: event.into(),
            data: data.into(),
        }
    }

    #[test]
    fn events_split_anywhere_come_out_whole_with_every_line_ending() {
        let stream = "\u{feff}: keep-alive\n\nevent: message_start\ndata: {\"a\":1}\n\ndata:x\r\ndata:  two spaces\r\n\r\nid: 7\rretry: 10\rdata\r\rdata: é\n\n";
        let expected = [
            event("message_start", "{\"a\":1}"),
            event("", "x\n two spaces"),
            event("", ""),
            event("", "é"),
        ];
        // `data` with no colon is a data line with an empty value: the event's data is "\n" less
        // its last newline, so it is empty but present (and dispatched).
        let whole = events(&[stream.as_bytes()]);
        assert_eq!(whole, expected);
        // Cut at every byte (mid-CRLF, mid-character, mid-mark): the same events.
        for cut in 0..=stream.len() {
            let (a, b) = stream.as_bytes().split_at(cut);
            assert_eq!(events(&[a, b]), expected, "cut at {cut}");
        }
        let bytes: Vec<&[u8]> = stream.as_bytes().chunks(1).collect();
        assert_eq!(events(&bytes), expected, "one byte at a time");
    }

    #[test]
    fn an_event_without_data_or_without_its_empty_line_is_not_dispatched() {
        assert_eq!(events(&[b"event: ping\n\n"]), []);
        assert_eq!(events(&[b"data: cut off\n"]), []);
        assert_eq!(
            events(&[b"event: a\n\ndata: b\n\n"]),
            [event("", "b")],
            "an event's type ends with it"
        );
    }

    #[test]
    fn bytes_that_are_not_utf8_are_an_error() {
        let mut decoder = SseDecoder::default();
        decoder.push(b"data: \xff\n\n");
        assert_eq!(decoder.next_event(), Err(SseError::Utf8(6)));
    }

    #[test]
    fn many_events_in_one_read_are_parsed_without_copying_the_rest_each_time() {
        let one = "data: {\"choices\":[{\"delta\":{\"content\":\"token \"}}]}\n\n";
        let read = one.repeat(10_000);
        let mut decoder = SseDecoder::default();
        decoder.push(read.as_bytes());
        let mut count = 0;
        while let Some(event) = decoder.next_event().expect("valid") {
            assert_eq!(event.data.len(), one.len() - "data: \n\n".len());
            count += 1;
        }
        assert_eq!(count, 10_000);
        // Parsed bytes are dropped at the next push, not per event.
        decoder.push(b"data: last\n\n");
        assert_eq!(decoder.buf.len(), "data: last\n\n".len());
    }
}
