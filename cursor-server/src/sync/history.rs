//! What the runs of one conversation share from one run start to the next, in memory: its stored
//! history decoded, and the projection's fold as it stood at the last run start. Messages are
//! append-only, numbered without gaps and never rewritten, so a run start reads only the messages
//! after those it holds and folds only those: the work of a run start no longer grows with the
//! conversation. Nothing here is a second source of truth: every entry is what reading and folding
//! the whole history would give (the fold is continued only from the same base, with timings that
//! agree with the turns it closed), and anything that does not match is read and folded again.
//!
//! It also keeps, per conversation, the blob ids its client acknowledged, handed back by the run
//! that last had them: every id in it is one the client stored, so a run that takes it never
//! withholds a blob the client lacks; and when it has as many ids as the store records, it is the
//! store's set (ACKs are only ever added), so it is not read again (1,500 ids at turn 300).
//!
//! It also keeps the conversation states (checkpoints and bases) run starts decoded, by blob id:
//! a blob's id is the hash of its bytes, so a state kept under an id is the state stored under it.
//! At turn 300 the newest checkpoint is a 34 KB blob, read and decoded again by every run start.
//!
//! It also knows which conversations the store has a row of (`Known`), to take a conversation it
//! has none of as new without reading the store; only on one node, where every message is written
//! by a run of this process. That set is not bounded: about 16 bytes per conversation.
//!
//! Its own file because `sync/projection.rs` is the fold itself (a pure function of history) and
//! the store's `messages.rs` only reads and writes rows; keeping some of them between runs,
//! bounded (all but the set of known conversations), is a policy of its own.

use std::collections::{HashMap, HashSet};
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex};

use crate::cursor::proto::agent as pb;
use crate::model::conversation::BlobId;
use crate::store::conversations;
use crate::store::messages::{self, Stored};
use crate::store::{Store, StoreError};
use crate::sync::checkpoint::ConversationState;
use crate::sync::projection::Projection;

/// Conversations kept (least recently used first out).
const MAX_CONVERSATIONS: usize = 64;
/// Messages kept across every conversation (a conversation longer than this is not kept).
const MAX_MESSAGES: usize = 50_000;
/// Acknowledged blob ids kept across every conversation.
const MAX_ACKED: usize = 100_000;
/// Decoded states kept (a run start reads two: the newest checkpoint and the base).
const MAX_STATES: usize = 2 * MAX_CONVERSATIONS;

/// The fold of a conversation's first `rows` messages from the base `base` (its state blob and the
/// messages it covers).
struct Folded {
    base: (BlobId, usize),
    rows: usize,
    projection: Projection,
}

struct Entry {
    rows: Vec<Stored>,
    folded: Option<Folded>,
    /// Blobs the client acknowledged, as the last run that had them left them.
    acked: Option<HashSet<BlobId>>,
    used: u64,
}

#[derive(Default)]
struct Entries {
    map: HashMap<String, Entry>,
    /// Decoded states by blob id, with when each was last used.
    states: HashMap<BlobId, (Arc<ConversationState>, u64)>,
    clock: u64,
}

impl Entries {
    fn messages(&self) -> usize {
        self.map.values().map(|entry| entry.rows.len()).sum()
    }

    fn acked(&self) -> usize {
        self.map
            .values()
            .filter_map(|entry| entry.acked.as_ref())
            .map(HashSet::len)
            .sum()
    }

    /// Drops the least recently used entries until the bounds hold.
    fn bound(&mut self) {
        while self.map.len() > MAX_CONVERSATIONS
            || self.messages() > MAX_MESSAGES
            || self.acked() > MAX_ACKED
        {
            let Some(oldest) = self
                .map
                .iter()
                .min_by_key(|(_, entry)| entry.used)
                .map(|(id, _)| id.clone())
            else {
                return;
            };
            self.map.remove(&oldest);
        }
        while self.states.len() > MAX_STATES {
            let Some(oldest) = self
                .states
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(id, _)| *id)
            else {
                return;
            };
            self.states.remove(&oldest);
        }
    }
}

/// The cache `AppState` holds; every run start of the node goes through it.
#[derive(Default)]
pub struct HistoryCache {
    entries: Mutex<Entries>,
    /// The conversations the store may have a row of (`Known`).
    known: Mutex<Known>,
    /// Hashes conversation ids for `known` (a key of its own per process).
    hasher: std::hash::RandomState,
    /// Told when `known` leaves `Learning::Reading`.
    learned: tokio::sync::Notify,
}

/// The conversations the store may have a row of, as hashes of their ids: those it had when the
/// node started, and every conversation a run of this node started on (on one node, the only
/// writers), so a conversation not in it has no message, no base, nothing owed. Two ids with one
/// hash only make one of them look known, and a known conversation is read: the safe way. About
/// 16 bytes per conversation.
#[derive(Default)]
struct Known {
    learning: Learning,
    conversations: HashSet<u64>,
}

/// How far a node is in reading its store's conversations (`HistoryCache::learn_stored`).
///
/// ```text
///  Off ──begin_learning──▶ Reading ──read──▶ Read
///   ▲                         │
///   └────────failed───────────┘
/// ```
///
/// Runs that start while the rows are read are kept too; nothing is new until they are read.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum Learning {
    /// Not kept (several nodes, `[auth]`, or the read failed).
    #[default]
    Off,
    Reading,
    Read,
}

impl std::fmt::Debug for HistoryCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HistoryCache").finish_non_exhaustive()
    }
}

impl HistoryCache {
    fn lock(&self) -> std::sync::MutexGuard<'_, Entries> {
        self.entries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn known(&self) -> std::sync::MutexGuard<'_, Known> {
        self.known
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// From now on every conversation a run starts on is kept (before the node serves), while the
    /// store's are read (`learn_stored`).
    pub fn begin_learning(&self) {
        self.known().learning = Learning::Reading;
    }

    /// Reads which conversations the store has a row of, one row at a time (in the background:
    /// about 1.5 µs a row here, 0.3 s for 200,000); returns how many. On failure nothing is kept
    /// any more.
    pub async fn learn_stored(&self, store: &Store) -> Result<usize, StoreError> {
        let mut read = HashSet::new();
        let counted = conversations::each_id(store, |id| {
            read.insert(self.hasher.hash_one(id));
        })
        .await;
        {
            let mut known = self.known();
            match counted {
                Ok(_) if known.learning == Learning::Reading => {
                    known.conversations.extend(read);
                    known.learning = Learning::Read;
                }
                _ => *known = Known::default(),
            }
        }
        self.learned.notify_waiters();
        counted
    }

    /// Waits until the store's conversations are read, or will not be (for tests that need a
    /// conversation taken as new).
    pub async fn until_learned(&self) {
        loop {
            let notified = self.learned.notified();
            if self.known().learning != Learning::Reading {
                return;
            }
            notified.await;
        }
    }

    /// A run of this node starts on the conversation: it may write messages from now on.
    pub fn started(&self, conversation_id: &str) {
        let hash = self.hasher.hash_one(conversation_id);
        let mut known = self.known();
        if known.learning != Learning::Off {
            known.conversations.insert(hash);
        }
    }

    /// Whether the store surely has nothing of the conversation: its conversations are known and
    /// this is not one of them. Only for a node that is the store's only writer of history.
    pub fn surely_new(&self, conversation_id: &str) -> bool {
        let hash = self.hasher.hash_one(conversation_id);
        let known = self.known();
        known.learning == Learning::Read && !known.conversations.contains(&hash)
    }

    /// Whether messages of the conversation are held: then it has stored messages, since none is
    /// ever deleted, and a run start that asks whether it has any need not read the store.
    pub fn holds_messages(&self, conversation_id: &str) -> bool {
        self.lock()
            .map
            .get(conversation_id)
            .is_some_and(|entry| !entry.rows.is_empty())
    }

    /// The conversation's whole stored history, oldest first: the messages held, then those
    /// stored after them (read from the store).
    pub async fn rows(
        &self,
        store: &Store,
        conversation_id: &str,
    ) -> Result<Vec<Stored>, StoreError> {
        let held = self
            .lock()
            .map
            .get(conversation_id)
            .map_or(0, |entry| entry.rows.len());
        let newer = messages::load_rows_from(store, conversation_id, held as i64).await?;
        let follows = newer
            .iter()
            .enumerate()
            .all(|(i, (seq, _))| *seq == (held + i) as i64);
        if !follows {
            // Not what a history without gaps gives: read it whole, keep nothing.
            self.lock().map.remove(conversation_id);
            return messages::load_rows(store, conversation_id).await;
        }
        let kept = self.extend(conversation_id, held, newer);
        match kept {
            Some(rows) => Ok(rows),
            // Another run start of the conversation changed the entry meanwhile.
            None => messages::load_rows(store, conversation_id).await,
        }
    }

    /// Adds the messages stored after the `held` first ones to the conversation's entry; returns
    /// the whole history, or `None` (and keeps nothing) when the entry no longer holds `held`.
    fn extend(
        &self,
        conversation_id: &str,
        held: usize,
        newer: Vec<(i64, Stored)>,
    ) -> Option<Vec<Stored>> {
        let mut entries = self.lock();
        entries.clock += 1;
        let used = entries.clock;
        let entry = entries
            .map
            .entry(conversation_id.to_owned())
            .or_insert_with(|| Entry {
                rows: Vec::new(),
                folded: None,
                acked: None,
                used,
            });
        entry.used = used;
        if entry.rows.len() != held {
            entries.map.remove(conversation_id);
            return None;
        }
        entry.rows.extend(newer.into_iter().map(|(_, row)| row));
        let rows = entry.rows.clone();
        entries.bound();
        Some(rows)
    }

    /// The fold of the first messages of `history` from `base`, continued over the rest; `None`
    /// when none is held for this base (or the timings disagree with the turns it closed).
    pub fn fold(
        &self,
        conversation_id: &str,
        base: (BlobId, usize),
        timings: &[pb::StepTiming],
        history: &[Stored],
    ) -> Option<Projection> {
        let (mut projection, from) = {
            let entries = self.lock();
            let folded = entries.map.get(conversation_id)?.folded.as_ref()?;
            if folded.base != base || folded.rows > history.len() {
                return None;
            }
            // The base's messages are in the base, never folded.
            (folded.projection.clone(), folded.rows.max(base.1))
        };
        if !projection.continue_with(timings.to_vec()) {
            return None;
        }
        let mut out = crate::sync::projection::NewBlobs::default();
        for row in history.get(from..).unwrap_or_default() {
            projection.apply(&row.request_id, &row.message, &mut out);
        }
        Some(projection)
    }

    /// Keeps the fold of the conversation's first `rows` messages from `base`.
    pub fn keep_fold(
        &self,
        conversation_id: &str,
        base: (BlobId, usize),
        rows: usize,
        projection: &Projection,
    ) {
        let mut entries = self.lock();
        if let Some(entry) = entries.map.get_mut(conversation_id)
            && entry.rows.len() >= rows
        {
            entry.folded = Some(Folded {
                base,
                rows,
                projection: projection.clone(),
            });
        }
    }

    /// The blob ids the conversation's client acknowledged, taken out for a run, when the set kept
    /// has the `recorded` ids the store counts (else it is dropped and the caller reads the store).
    pub fn take_acked(&self, conversation_id: &str, recorded: usize) -> Option<HashSet<BlobId>> {
        let mut entries = self.lock();
        let acked = entries.map.get_mut(conversation_id)?.acked.take()?;
        (acked.len() == recorded).then_some(acked)
    }

    /// Keeps the ids the conversation's client acknowledged, as a run that ended leaves them (ids
    /// the client was seen to store, recorded or not), for the next run start; kept only while the
    /// conversation's history is.
    pub fn keep_acked(&self, conversation_id: &str, acked: HashSet<BlobId>) {
        let mut entries = self.lock();
        if let Some(entry) = entries.map.get_mut(conversation_id) {
            entry.acked = Some(acked);
            entries.bound();
        }
    }

    /// The state stored as blob `id`, if a run start decoded it lately.
    pub fn state(&self, id: BlobId) -> Option<Arc<ConversationState>> {
        let mut entries = self.lock();
        entries.clock += 1;
        let now = entries.clock;
        let (state, used) = entries.states.get_mut(&id)?;
        *used = now;
        Some(Arc::clone(state))
    }

    /// Keeps `state`, decoded from blob `id`, for the next run starts.
    pub fn keep_state(&self, id: BlobId, state: &Arc<ConversationState>) {
        let mut entries = self.lock();
        entries.clock += 1;
        let now = entries.clock;
        entries.states.insert(id, (Arc::clone(state), now));
        entries.bound();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u32) -> BlobId {
        BlobId::of(&n.to_le_bytes())
    }

    #[test]
    fn a_decoded_state_is_kept_by_id_and_the_least_recently_used_go_first() {
        let cache = HistoryCache::default();
        let first = Arc::new(ConversationState::default());
        cache.keep_state(id(0), &first);
        assert!(Arc::ptr_eq(&cache.state(id(0)).unwrap(), &first));
        assert!(cache.state(id(1)).is_none());

        // Fill the cache past its bound, using the first state all along: it stays, the oldest
        // of the others go.
        for n in 1..=MAX_STATES as u32 {
            cache.keep_state(id(n), &Arc::new(ConversationState::default()));
            assert!(cache.state(id(0)).is_some());
        }
        assert_eq!(cache.lock().states.len(), MAX_STATES);
        assert!(cache.state(id(1)).is_none(), "the least recently used went");
        assert!(cache.state(id(MAX_STATES as u32)).is_some());
    }

    #[test]
    fn a_conversation_with_messages_held_is_known_to_have_messages() {
        use crate::model::runtime_tag::{RuntimeEvent, RuntimeTag};
        let cache = HistoryCache::default();
        assert!(
            !cache.holds_messages("c"),
            "nothing held: the store is asked"
        );
        assert!(cache.extend("c", 0, Vec::new()).is_some());
        assert!(!cache.holds_messages("c"), "held, but empty");
        let tag = RuntimeTag::new(RuntimeEvent::Attached, "r", "attached".to_owned());
        let row = Stored {
            request_id: "r".to_owned(),
            message: tag.message(),
        };
        assert!(cache.extend("c", 0, vec![(0, row)]).is_some());
        assert!(cache.holds_messages("c"));
        assert!(!cache.holds_messages("d"));
    }

    #[tokio::test]
    async fn a_conversation_is_new_only_once_the_stores_are_read_and_it_is_not_one_nor_started() {
        use crate::model::message::{CanonicalMessage, Origin, UserMessage};
        let dir = tempfile::tempdir().expect("tempdir");
        let url = format!("sqlite://{}", dir.path().join("known.db").display());
        let store = Store::open(&url).await.expect("store");
        let user = CanonicalMessage::User(UserMessage {
            images: Vec::new(),
            shown_as: None,
            state_before: None,
            origin: Origin::User,
            text: "hello".to_owned(),
            client_message_id: String::new(),
            mode: None,
            runtime: None,
        });
        messages::append_with_tags(&store, "stored", "r1", &[], &[user], &[])
            .await
            .expect("appended");

        let cache = HistoryCache::default();
        cache.started("early");
        cache.begin_learning();
        cache.started("meanwhile");
        assert!(
            !cache.surely_new("other"),
            "nothing is new before the store's conversations are read"
        );
        assert_eq!(cache.learn_stored(&store).await.expect("read"), 1);
        cache.until_learned().await;
        assert!(!cache.surely_new("stored"));
        assert!(
            !cache.surely_new("meanwhile"),
            "a run started on it while they were read"
        );
        assert!(cache.surely_new("early"), "not kept before learning began");
        assert!(cache.surely_new("new"));
        cache.started("new");
        assert!(
            !cache.surely_new("new"),
            "a run started on it: it may have messages"
        );
    }

    #[test]
    fn acknowledged_ids_are_handed_to_one_run_at_a_time_and_only_when_the_store_counts_as_many() {
        let cache = HistoryCache::default();
        let acked: HashSet<BlobId> = (0..3).map(id).collect();
        // Nothing is kept for a conversation whose history is not.
        cache.keep_acked("c", acked.clone());
        assert!(cache.take_acked("c", 3).is_none());

        assert!(cache.extend("c", 0, Vec::new()).is_some());
        cache.keep_acked("c", acked.clone());
        assert_eq!(cache.take_acked("c", 3), Some(acked.clone()));
        assert!(
            cache.take_acked("c", 3).is_none(),
            "taken: a second run reads the store"
        );

        // The store has more (another node's run): the set is dropped, not handed out.
        cache.keep_acked("c", acked);
        assert!(cache.take_acked("c", 4).is_none());
        assert!(cache.take_acked("c", 3).is_none());
    }
}
