//! KV sync with the client: `set_blob_args` / `get_blob_args` under per-request KV ids, ACK
//! tracking, hash-checked reads, and the checkpoint barrier (a checkpoint is published only once
//! every blob it references is acknowledged).

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::Instant;

use crate::cursor::proto::agent::{
    AgentServerMessage, GetBlobArgs, KvServerMessage, SetBlobArgs, agent_server_message,
    kv_client_message, kv_server_message,
};
use crate::model::conversation::BlobId;
use crate::ops::metrics::{self, KvEvent};
use crate::sync::checkpoint::Blob;

/// A KV request to the client (GET or SET of a blob), ready for the downlink: the run holds and
/// sends it without looking inside, and only `KvSync` makes one (under a KV id it tracks).
#[derive(Debug, Clone, PartialEq)]
pub struct KvRequest(AgentServerMessage);

impl KvRequest {
    /// The message the downlink sends.
    pub fn message(&self) -> &AgentServerMessage {
        &self.0
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KvError {
    #[error("KV result for KV id {0}, which was never issued")]
    UnknownId(u32),
    #[error("KV result for KV id {0}, which was already answered")]
    Late(u32),
    #[error("KV id {id} was a {expected}, the client answered with a {got}")]
    WrongKind {
        id: u32,
        expected: &'static str,
        got: &'static str,
    },
    #[error("the client could not store blob {blob}: {message}")]
    StoreFailed { blob: BlobId, message: String },
    #[error("blob {claimed} read from the client does not match its data (SHA-256 {actual})")]
    HashMismatch { claimed: BlobId, actual: BlobId },
}

/// A client's KV answer, opaque to the loop.
#[derive(Debug, Clone, PartialEq)]
pub struct KvPayload(pub Box<kv_client_message::Message>);

#[derive(Debug, Clone, Copy)]
enum Request {
    Set(BlobId),
    Get(BlobId),
}

/// What a KV answer meant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvOutcome {
    /// The client now holds this blob.
    Stored(BlobId),
    /// A requested blob arrived and matches its id.
    Fetched { id: BlobId, data: Vec<u8> },
    /// The client does not have the requested blob (an empty `get_blob_result`).
    Missing(BlobId),
}

#[derive(Debug, Default)]
pub struct KvSync {
    next_id: u32,
    in_flight: HashMap<u32, Request>,
    sending: HashSet<BlobId>,
    acked: HashSet<BlobId>,
}

fn kv_message(id: u32, message: kv_server_message::Message) -> KvRequest {
    KvRequest(AgentServerMessage {
        message: Some(agent_server_message::Message::KvServerMessage(
            KvServerMessage {
                id,
                message: Some(message),
                ..KvServerMessage::default()
            },
        )),
    })
}

impl KvSync {
    /// Starts with the blobs the client already acknowledged for this conversation.
    pub fn with_acked(acked: HashSet<BlobId>) -> KvSync {
        KvSync {
            acked,
            ..KvSync::default()
        }
    }

    /// The blobs the client holds, as far as this run saw (what it started with, those it
    /// stored and those it sent when asked), taken out when the run is over.
    pub fn take_acked(&mut self) -> HashSet<BlobId> {
        std::mem::take(&mut self.acked)
    }

    fn issue(&mut self, request: Request) -> u32 {
        // The official backend numbers KV requests from 0 within a request.
        let id = self.next_id;
        self.next_id += 1;
        self.in_flight.insert(id, request);
        id
    }

    /// Whether the client holds `blob` or it is on its way there.
    pub fn reaches_client(&self, blob: BlobId) -> bool {
        self.acked.contains(&blob) || self.sending.contains(&blob)
    }

    /// A `set_blob_args` for `blob`, unless the client holds it or it is already on its way.
    pub fn store(&mut self, blob: &Blob) -> Option<KvRequest> {
        if self.acked.contains(&blob.id) || !self.sending.insert(blob.id) {
            return None;
        }
        let id = self.issue(Request::Set(blob.id));
        metrics::kv_blob(KvEvent::Sent);
        Some(kv_message(
            id,
            kv_server_message::Message::SetBlobArgs(SetBlobArgs {
                blob_id: blob.id.0.to_vec(),
                blob_data: blob.data.to_vec(),
            }),
        ))
    }

    /// Sends `blob` again under a new KV id (after a timeout); storing is idempotent.
    pub fn resend(&mut self, blob: &Blob) -> Option<KvRequest> {
        self.sending.remove(&blob.id);
        self.in_flight
            .retain(|_, r| !matches!(r, Request::Set(id) if *id == blob.id));
        metrics::kv_blob(KvEvent::Resent);
        self.store(blob)
    }

    /// A `get_blob_args`, remembering which blob was asked for (the answer does not repeat it).
    pub fn fetch(&mut self, blob: BlobId) -> KvRequest {
        let id = self.issue(Request::Get(blob));
        kv_message(
            id,
            kv_server_message::Message::GetBlobArgs(GetBlobArgs {
                blob_id: blob.0.to_vec(),
            }),
        )
    }

    fn is_acked(&self, blob: &BlobId) -> bool {
        self.acked.contains(blob)
    }

    /// Applies the client's answer to KV request `id`.
    pub fn on_result(
        &mut self,
        id: u32,
        result: kv_client_message::Message,
    ) -> Result<KvOutcome, KvError> {
        let request = self.in_flight.remove(&id).ok_or(if id < self.next_id {
            KvError::Late(id)
        } else {
            KvError::UnknownId(id)
        })?;
        match (request, result) {
            (Request::Set(blob), kv_client_message::Message::SetBlobResult(result)) => {
                self.sending.remove(&blob);
                if let Some(error) = result.error {
                    return Err(KvError::StoreFailed {
                        blob,
                        message: error.message,
                    });
                }
                self.acked.insert(blob);
                metrics::kv_blob(KvEvent::Acknowledged);
                Ok(KvOutcome::Stored(blob))
            }
            (Request::Get(blob), kv_client_message::Message::GetBlobResult(result)) => {
                match result.blob_data {
                    None => Ok(KvOutcome::Missing(blob)),
                    Some(data) => {
                        let actual = BlobId::of(&data);
                        if actual != blob {
                            return Err(KvError::HashMismatch {
                                claimed: blob,
                                actual,
                            });
                        }
                        self.acked.insert(blob);
                        Ok(KvOutcome::Fetched { id: blob, data })
                    }
                }
            }
            (Request::Set(_), _) => Err(KvError::WrongKind {
                id,
                expected: "set_blob_args",
                got: "get_blob_result",
            }),
            (Request::Get(_), _) => Err(KvError::WrongKind {
                id,
                expected: "get_blob_args",
                got: "set_blob_result",
            }),
        }
    }
}

/// Holds checkpoints until every blob they reference is acknowledged, and hands them out in the
/// order they were built. At most two wait: the oldest — a checkpoint taken while a batch still
/// had calls pending, which Cursor expects to see before the batch's last — and the newest, which
/// replaces any in between (publishing those would only be overwritten).
#[derive(Debug)]
pub struct CheckpointGate<C> {
    /// Each checkpoint, the blobs it needs, and when it was built (for the publish latency).
    waiting: VecDeque<(C, Vec<BlobId>, Instant)>,
}

impl<C> Default for CheckpointGate<C> {
    fn default() -> Self {
        CheckpointGate {
            waiting: VecDeque::new(),
        }
    }
}

impl<C> CheckpointGate<C> {
    /// Queues `checkpoint`, which needs `blobs`; returns what is ready now, oldest first.
    pub fn offer(&mut self, checkpoint: C, blobs: Vec<BlobId>, kv: &KvSync) -> Vec<C> {
        self.queue(checkpoint, blobs);
        self.ready(kv)
    }

    /// Queues `checkpoint` (replacing a waiting newer-than-oldest one) without checking whether it
    /// is ready.
    pub fn queue(&mut self, checkpoint: C, blobs: Vec<BlobId>) {
        if self.waiting.len() >= 2 {
            self.waiting.pop_back();
        }
        self.waiting.push_back((checkpoint, blobs, Instant::now()));
    }

    /// The waiting checkpoints whose blobs are now all acknowledged, oldest first (a checkpoint
    /// never overtakes an older one).
    pub fn ready(&mut self, kv: &KvSync) -> Vec<C> {
        let mut ready = Vec::new();
        while self
            .waiting
            .front()
            .is_some_and(|(_, blobs, _)| blobs.iter().all(|b| kv.is_acked(b)))
        {
            if let Some((checkpoint, _, built)) = self.waiting.pop_front() {
                metrics::checkpoint_published(built.elapsed());
                ready.push(checkpoint);
            }
        }
        ready
    }

    pub fn is_waiting(&self) -> bool {
        !self.waiting.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cursor::proto::agent::{Error, GetBlobResult, SetBlobResult};

    fn ack() -> kv_client_message::Message {
        kv_client_message::Message::SetBlobResult(SetBlobResult { error: None })
    }

    fn kv_id(request: &KvRequest) -> u32 {
        match &request.message().message {
            Some(agent_server_message::Message::KvServerMessage(kv)) => kv.id,
            other => panic!("not a KV message: {other:?}"),
        }
    }

    #[test]
    fn a_checkpoint_waits_for_every_ack_and_acked_blobs_are_never_resent() {
        let a = Blob::new(b"a".to_vec(), Vec::new());
        let b = Blob::new(b"b".to_vec(), Vec::new());
        let mut kv = KvSync::default();
        let set_a = kv.store(&a).expect("sent");
        let set_b = kv.store(&b).expect("sent");
        assert_eq!((kv_id(&set_a), kv_id(&set_b)), (0, 1));
        assert!(kv.store(&a).is_none(), "not twice while in flight");

        let mut gate = CheckpointGate::default();
        assert!(gate.offer("cp1", vec![a.id, b.id], &kv).is_empty());
        assert_eq!(kv.on_result(0, ack()), Ok(KvOutcome::Stored(a.id)));
        assert!(gate.ready(&kv).is_empty(), "b is still missing");
        assert_eq!(kv.on_result(1, ack()), Ok(KvOutcome::Stored(b.id)));
        assert_eq!(gate.ready(&kv), vec!["cp1"]);
        assert!(
            kv.store(&a).is_none(),
            "acknowledged blobs are not sent again"
        );
        assert_eq!(
            kv.on_result(1, ack()),
            Err(KvError::Late(1)),
            "a late duplicate ACK"
        );
    }

    #[test]
    fn a_failed_set_keeps_the_previous_checkpoint_and_a_resend_uses_a_new_id() {
        let a = Blob::new(b"a".to_vec(), Vec::new());
        let mut kv = KvSync::default();
        kv.store(&a).expect("sent");
        let failed = kv.on_result(
            0,
            kv_client_message::Message::SetBlobResult(SetBlobResult {
                error: Some(Error {
                    message: "disk full".into(),
                }),
            }),
        );
        assert!(matches!(failed, Err(KvError::StoreFailed { .. })));
        let again = kv.resend(&a).expect("resent");
        assert_eq!(kv_id(&again), 1);
        assert_eq!(kv.on_result(1, ack()), Ok(KvOutcome::Stored(a.id)));
    }

    #[test]
    fn reads_are_hash_checked_and_empty_means_missing() {
        let data = b"turn".to_vec();
        let id = BlobId::of(&data);
        let mut kv = KvSync::default();
        kv.fetch(id);
        kv.fetch(id);
        kv.fetch(id);
        let ok = kv.on_result(
            0,
            kv_client_message::Message::GetBlobResult(GetBlobResult {
                blob_data: Some(data),
            }),
        );
        assert_eq!(
            ok,
            Ok(KvOutcome::Fetched {
                id,
                data: b"turn".to_vec()
            })
        );
        let wrong = kv.on_result(
            1,
            kv_client_message::Message::GetBlobResult(GetBlobResult {
                blob_data: Some(b"evil".to_vec()),
            }),
        );
        assert!(matches!(wrong, Err(KvError::HashMismatch { .. })));
        let missing = kv.on_result(
            2,
            kv_client_message::Message::GetBlobResult(GetBlobResult { blob_data: None }),
        );
        assert_eq!(missing, Ok(KvOutcome::Missing(id)));
        assert!(matches!(kv.on_result(7, ack()), Err(KvError::UnknownId(7))));
    }
}
