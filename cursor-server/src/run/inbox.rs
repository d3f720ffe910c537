//! Orders BidiAppend messages by `append_seqno`: starts at 0, strictly increasing, gaps buffered until
//! filled, duplicates dropped. HTTP arrival order is not protocol order.

use std::collections::BTreeMap;

/// How many out-of-order messages may wait for a gap to fill before the client is declared broken.
pub const MAX_BUFFERED: usize = 1024;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InboxError {
    #[error("negative append_seqno {0}")]
    Negative(i64),
    #[error("{buffered} messages are waiting for append_seqno {missing}; giving up")]
    GapTooLong { missing: i64, buffered: usize },
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
            if self.waiting.len() >= MAX_BUFFERED {
                return Err(InboxError::GapTooLong {
                    missing: self.next,
                    buffered: self.waiting.len(),
                });
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
}
