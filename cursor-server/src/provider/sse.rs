//! Server-sent events as providers stream them: a response body's bytes in, whole events out
//! (the WHATWG "interpreting an event stream" rules: lines end with LF, CRLF or CR; `:` starts a
//! comment; `data` lines join with a newline; an empty line dispatches an event that has data; a
//! byte-order mark at the start is skipped). `id` and `retry` mean nothing to a provider call and
//! are ignored.
//!
//! (added) The decoder is the per-chunk work of every streamed call: it finds line ends with
//! `memchr`, parses in place, and hands out each event borrowed from the bytes read, so an event
//! with one `data` line (what providers send) is never copied; a read that holds hundreds of events
//! costs no more per event than one that holds one.

/// One event: its type (`event:`, empty when unnamed) and its data, borrowed from the decoder
/// until its next `advance` or `push`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SseEvent<'a> {
    pub event: &'a str,
    pub data: &'a str,
}

/// Why the stream cannot be read as events.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SseError {
    #[error("the event stream is not UTF-8 at byte {0} of a line")]
    Utf8(usize),
}

/// Incremental decoder: `push` what the body gives, then `advance` to each complete event and read
/// it with `event`, until `advance` says it needs more bytes.
#[derive(Debug, Default)]
pub struct SseDecoder {
    /// Bytes received and not yet parsed start at `pos`.
    buf: Vec<u8>,
    pos: usize,
    /// The byte-order mark is looked for once, at the stream's start.
    started: bool,
    /// The event being gathered, or, once `ready`, the one `advance` completed.
    event: String,
    data: Data,
    ready: bool,
}

/// The data lines of the event being gathered.
#[derive(Debug, Default)]
enum Data {
    /// No `data` line yet: an empty line then dispatches nothing.
    #[default]
    None,
    /// One line, the usual case: where its value lies in `buf`, which is not copied.
    Line(std::ops::Range<usize>),
    /// Several lines joined by newlines, or one kept across a `push` (which moves `buf`).
    Joined(String),
}

const BOM: &[u8] = "\u{feff}".as_bytes();

impl SseDecoder {
    /// Adds the body's next bytes. An event `advance` completed is dropped.
    pub fn push(&mut self, bytes: &[u8]) {
        self.take_ready();
        // A line of data not yet dispatched is copied out: `buf` is about to move.
        if let Data::Line(range) = &self.data {
            self.data = Data::Joined(self.text(range.clone()).to_owned());
        }
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

    /// Moves to the next complete event among the bytes pushed so far: `true` when there is one
    /// (read it with `event`), `false` until more bytes arrive.
    pub fn advance(&mut self) -> Result<bool, SseError> {
        self.take_ready();
        if !self.started {
            return Ok(false);
        }
        loop {
            let rest = &self.buf[self.pos..];
            let Some(end) = memchr::memchr2(b'\n', b'\r', rest) else {
                return Ok(false);
            };
            let ending = match (rest[end], rest.get(end + 1)) {
                (b'\r', Some(b'\n')) => 2,
                // A CR at the end of what came so far may be half of a CRLF: wait for the next byte.
                (b'\r', None) => return Ok(false),
                _ => 1,
            };
            let line =
                std::str::from_utf8(&rest[..end]).map_err(|e| SseError::Utf8(e.valid_up_to()))?;
            let start = self.pos;
            self.pos += end + ending;
            if line.is_empty() {
                if matches!(self.data, Data::None) {
                    self.event.clear(); // an event without data: nothing, and its type ends
                    continue;
                }
                self.ready = true;
                return Ok(true);
            }
            // `name: value`, `name` alone, or a comment (`:` first).
            let (name, value) = match line.find(':') {
                Some(0) => continue,
                Some(colon) => {
                    let space = usize::from(line.as_bytes().get(colon + 1) == Some(&b' '));
                    (&line[..colon], colon + 1 + space)
                }
                None => (line, end),
            };
            match name {
                "data" => self.add_data(start + value..start + end),
                "event" => {
                    let value = &line[value..];
                    self.event.clear();
                    self.event.push_str(value);
                }
                _ => {}
            }
        }
    }

    /// The event the last `advance` that returned `true` completed.
    pub fn event(&self) -> SseEvent<'_> {
        debug_assert!(self.ready, "event() without a completed event");
        let data = match &self.data {
            Data::None => "",
            Data::Line(range) => self.text(range.clone()),
            Data::Joined(joined) => joined,
        };
        SseEvent {
            event: &self.event,
            data,
        }
    }

    /// Forgets the event `advance` completed, if any: the next one starts empty.
    fn take_ready(&mut self) {
        if std::mem::take(&mut self.ready) {
            self.event.clear();
            self.data = Data::None;
        }
    }

    /// One more `data` line: lines join with a newline.
    fn add_data(&mut self, value: std::ops::Range<usize>) {
        self.data = match std::mem::take(&mut self.data) {
            Data::None => Data::Line(value),
            Data::Line(first) => {
                let mut joined = self.text(first).to_owned();
                joined.push('\n');
                joined.push_str(self.text(value));
                Data::Joined(joined)
            }
            Data::Joined(mut joined) => {
                joined.push('\n');
                joined.push_str(self.text(value));
                Data::Joined(joined)
            }
        };
    }

    /// Bytes of `buf` inside a line `advance` already checked as UTF-8, from after an ASCII
    /// delimiter to the line's end, so they are UTF-8 too.
    fn text(&self, range: std::ops::Range<usize>) -> &str {
        std::str::from_utf8(&self.buf[range]).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events(chunks: &[&[u8]]) -> Vec<(String, String)> {
        let mut decoder = SseDecoder::default();
        let mut out = Vec::new();
        for chunk in chunks {
            decoder.push(chunk);
            while decoder.advance().expect("valid") {
                let event = decoder.event();
                out.push((event.event.to_owned(), event.data.to_owned()));
            }
        }
        out
    }

    fn event(event: &str, data: &str) -> (String, String) {
        (event.into(), data.into())
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
        assert_eq!(events(&[b"event: ping\n\n"]), [] as [(String, String); 0]);
        assert_eq!(events(&[b"data: cut off\n"]), [] as [(String, String); 0]);
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
        assert_eq!(decoder.advance(), Err(SseError::Utf8(6)));
    }

    #[test]
    fn many_events_in_one_read_are_parsed_without_copying_the_rest_each_time() {
        let one = "data: {\"choices\":[{\"delta\":{\"content\":\"token \"}}]}\n\n";
        let read = one.repeat(10_000);
        let mut decoder = SseDecoder::default();
        decoder.push(read.as_bytes());
        let mut count = 0;
        while decoder.advance().expect("valid") {
            assert_eq!(decoder.event().data.len(), one.len() - "data: \n\n".len());
            assert!(
                matches!(decoder.data, Data::Line(_)),
                "one line of data is not copied"
            );
            count += 1;
        }
        assert_eq!(count, 10_000);
        // Parsed bytes are dropped at the next push, not per event.
        decoder.push(b"data: last\n\n");
        assert_eq!(decoder.buf.len(), "data: last\n\n".len());
    }
}
