//! Run-time correlation of exec ids: which tool call an outstanding exec belongs to and which result
//! kind it expects. Matching is by id only — never "the only pending one".

use std::collections::{HashMap, HashSet};

use crate::tools::exec::{ExecKind, ExecRequest, QueryRequest};

#[derive(Debug, Clone, Copy)]
struct Pending {
    slot: usize,
    expected: ExecKind,
    streaming: bool,
    /// An interaction query (waits for the user; nothing to abort on the client).
    query: bool,
}

/// How an incoming exec message relates to what is outstanding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Match {
    /// For the tool call in batch slot `slot`.
    Active { slot: usize },
    /// For an exec that already finished: ignore it (idempotently) and log.
    Late,
    /// For the call in batch slot `slot`, but not the kind of result its request asks for: the
    /// call fails with a message the model can act on, and the turn goes on.
    WrongKind { slot: usize, expected: ExecKind },
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PendingError {
    #[error("exec id {0} was never issued in this run")]
    Unknown(u32),
}

#[derive(Debug)]
pub struct PendingExecs {
    next_id: u32,
    pending: HashMap<u32, Pending>,
    finished: HashSet<u32>,
}

impl Default for PendingExecs {
    fn default() -> Self {
        PendingExecs {
            // The official backend numbers execs from 1 within a request.
            next_id: 1,
            pending: HashMap::new(),
            finished: HashSet::new(),
        }
    }
}

impl PendingExecs {
    /// The ids of a request that already used ids `1..=issued` before its turn began (the request
    /// context asked of a CLI client): numbering goes on after them, and late messages for them are
    /// recognised as late.
    pub fn after(issued: u32) -> Self {
        let mut execs = PendingExecs::default();
        execs.next_id += issued;
        execs.finished.extend(1..=issued);
        execs
    }

    /// Assigns the next exec id to `request` for the call in `slot`.
    pub fn register(&mut self, slot: usize, request: &ExecRequest) -> u32 {
        self.insert(Pending {
            slot,
            expected: request.expected_result(),
            streaming: request.is_streaming(),
            query: false,
        })
    }

    /// Assigns the next id (same sequence as execs) to an interaction query for `slot`.
    pub fn register_query(&mut self, slot: usize, request: &QueryRequest) -> u32 {
        self.insert(Pending {
            slot,
            expected: request.expected_result(),
            streaming: false,
            query: true,
        })
    }

    fn insert(&mut self, pending: Pending) -> u32 {
        let id = self.next_id;
        self.next_id += 1;
        self.pending.insert(id, pending);
        id
    }

    /// Matches a result of kind `kind` for exec `id`.
    pub fn match_result(&self, id: u32, kind: ExecKind) -> Result<Match, PendingError> {
        match self.pending.get(&id) {
            Some(pending) if pending.expected == kind => Ok(Match::Active { slot: pending.slot }),
            Some(pending) => Ok(Match::WrongKind {
                slot: pending.slot,
                expected: pending.expected,
            }),
            None => self.not_pending(id),
        }
    }

    /// Matches a control message (`stream_close`, `throw`) for exec `id`.
    pub fn match_control(&self, id: u32) -> Result<Match, PendingError> {
        match self.pending.get(&id) {
            Some(pending) => Ok(Match::Active { slot: pending.slot }),
            None => self.not_pending(id),
        }
    }

    fn not_pending(&self, id: u32) -> Result<Match, PendingError> {
        if self.finished.contains(&id) {
            Ok(Match::Late)
        } else {
            Err(PendingError::Unknown(id))
        }
    }

    /// Whether exec `id` answers with a stream of results (it ends on a terminal one).
    /// Whether a client exec is still running (questions to the user do not count: people take
    /// their time).
    pub fn has_running_exec(&self) -> bool {
        self.pending.values().any(|p| !p.query)
    }

    pub fn is_streaming(&self, id: u32) -> bool {
        self.pending.get(&id).is_some_and(|p| p.streaming)
    }

    /// Exec `id` reached its end; later messages for it are late.
    pub fn finish(&mut self, id: u32) {
        if self.pending.remove(&id).is_some() {
            self.finished.insert(id);
        }
    }

    /// Finishes every exec of `slot` (its tool call is over).
    pub fn finish_slot(&mut self, slot: usize) {
        let ids: Vec<u32> = self
            .pending
            .iter()
            .filter(|(_, p)| p.slot == slot)
            .map(|(id, _)| *id)
            .collect();
        for id in ids {
            self.finish(id);
        }
    }

    /// Execs still running, oldest first (to abort them when the run ends).
    pub fn running(&self) -> Vec<(u32, usize)> {
        let mut running: Vec<(u32, usize)> = self
            .pending
            .iter()
            .filter(|(_, p)| !p.query)
            .map(|(id, p)| (*id, p.slot))
            .collect();
        running.sort_unstable();
        running
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cursor::proto::agent::{self as pb, exec_server_message::Message as A};

    fn request(message: A) -> ExecRequest {
        ExecRequest::new(message)
    }

    #[test]
    fn results_match_by_id_and_kind_and_late_ones_are_recognised() {
        let mut pending = PendingExecs::default();
        let read = pending.register(0, &request(A::ReadArgs(pb::ReadArgs::default())));
        let write = pending.register(1, &request(A::WriteArgs(pb::WriteArgs::default())));
        assert_eq!((read, write), (1, 2));
        assert_eq!(
            pending.match_result(2, ExecKind::WriteResult),
            Ok(Match::Active { slot: 1 })
        );
        assert_eq!(
            pending.match_result(1, ExecKind::WriteResult),
            Ok(Match::WrongKind {
                slot: 0,
                expected: ExecKind::ReadResult
            })
        );
        assert_eq!(
            pending.match_result(9, ExecKind::ReadResult),
            Err(PendingError::Unknown(9))
        );
        pending.finish(1);
        assert_eq!(
            pending.match_result(1, ExecKind::ReadResult),
            Ok(Match::Late)
        );
        assert_eq!(pending.match_control(1), Ok(Match::Late));
        assert_eq!(pending.running(), vec![(2, 1)]);
    }
}
