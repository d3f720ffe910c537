//! Orders BidiAppend messages by `append_seqno`: starts at 0, strictly increasing, gaps buffered until
//! filled, duplicates dropped. HTTP arrival order is not protocol order.
//!
//! The buffer is bounded by a window, not by a count of failures: only the `MAX_BUFFERED` seqnos
//! after the one expected can wait. A seqno past the window (2^62, `i64::MAX`, a client that
//! skipped far ahead) is refused at once, so its append gets an answer instead of waiting for a
//! gap that cannot fill; what still waits when the run ends is handed back by `drain` to be
//! answered with the run's ending.

use std::collections::BTreeMap;

/// How many seqnos past the expected one may wait for a gap to fill.
pub const MAX_BUFFERED: usize = 1024;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InboxError {
    #[error("negative append_seqno {0}")]
    Negative(i64),
    #[error(
        "append_seqno {seqno} is too far ahead: the run expects append_seqno {expected} next and holds at most {window} appends ahead of it"
    )]
    TooFarAhead {
        seqno: i64,
        expected: i64,
        window: usize,
    },
}

/// What `push` did with a message.
#[derive(Debug, PartialEq, Eq)]
pub enum Accepted<T> {
    /// These messages are now in order and ready, oldest first (possibly several after a gap fills).
    Ready(Vec<T>),
    /// Buffered behind a gap.
    Buffered,
    /// Already seen: handed back, to be dropped.
    Duplicate(T),
    /// Past the window (`InboxError::TooFarAhead`): handed back, to be refused; the inbox is
    /// unchanged and later appends go on as before.
    Refused(T, InboxError),
}

#[derive(Debug)]
pub struct Inbox<T> {
    next: i64,
    waiting: BTreeMap<i64, T>,
}

impl<T> Default for Inbox<T> {
    fn default() -> Self {
        Inbox {
            next: 0,
            waiting: BTreeMap::new(),
        }
    }
}

impl<T> Inbox<T> {
    pub fn push(&mut self, seqno: i64, item: T) -> Result<Accepted<T>, InboxError> {
        if seqno < 0 {
            return Err(InboxError::Negative(seqno));
        }
        if seqno < self.next || self.waiting.contains_key(&seqno) {
            return Ok(Accepted::Duplicate(item));
        }
        if seqno > self.next {
            // `seqno - next` cannot overflow: both are non-negative.
            if seqno - self.next > MAX_BUFFERED as i64 {
                let error = InboxError::TooFarAhead {
                    seqno,
                    expected: self.next,
                    window: MAX_BUFFERED,
                };
                return Ok(Accepted::Refused(item, error));
            }
            self.waiting.insert(seqno, item);
            return Ok(Accepted::Buffered);
        }
        let mut ready = vec![item];
        self.next += 1;
        while let Some(item) = self.waiting.remove(&self.next) {
            ready.push(item);
            self.next += 1;
        }
        Ok(Accepted::Ready(ready))
    }

    /// The seqno the inbox waits for next.
    pub fn expected(&self) -> i64 {
        self.next
    }

    /// Everything still waiting behind a gap, by seqno, leaving the inbox with none.
    pub fn drain(&mut self) -> Vec<(i64, T)> {
        std::mem::take(&mut self.waiting).into_iter().collect()
    }
}
