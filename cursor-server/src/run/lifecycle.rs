//! The three ways a run ends — success, error, canceled — and the frames each sends (every path ends
//! with exactly one end-of-stream frame, after which nothing is sent); and the checkpoints published
//! along the way.
//!
//! Length: the checkpoints' whole lifecycle — opening the graph, entering committed messages,
//! the emission that stores and sends their blobs (alone or inside a run start's one transaction),
//! the ACK gate and publication — is one state machine on one struct; it reads best in one file.

use crate::client::downlink::Downlink;
use crate::client::interaction;
use crate::cursor::connect::{self, ConnectCode, ConnectError};
use crate::error::{ProtocolError, ServerError};
use crate::model::conversation::BlobId;
use crate::model::conversation::Mode;
use crate::model::message::{CanonicalMessage, Origin, UserMessage};
use crate::model::tool::ToolCall;
use crate::model::usage::Usage;
use crate::store::blobs::{self, Edge};
use crate::store::messages::Stored;
use crate::store::{Store, StoreError, conversations, outbox};
use crate::sync::blob_sync::{CheckpointGate, KvError, KvOutcome, KvPayload, KvRequest, KvSync};
use crate::sync::checkpoint::StateDetails;
use crate::sync::checkpoint::{Blob, ConversationGraph, ConversationState, StepBlob, roots};
use crate::sync::history::HistoryCache;
use crate::sync::projection::{self, Base, Chips, NewBlobs, Projection};

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use std::time::Duration;

use tokio::time::Instant;

#[derive(Debug)]
pub enum RunEnd {
    /// The loop finished: the model answered without further tool calls.
    Success { usage: Usage },
    /// Provider, protocol or internal failure.
    Failed(ServerError),
    /// The user stopped it, the client went away, or the server is shutting down.
    Canceled { reason: String },
}

/// `turn_ended` with the summed usage: the loop is over (the final checkpoint follows).
pub async fn announce_turn_ended(downlink: &mut Downlink, usage: &Usage) {
    downlink.send_message(&interaction::turn_ended(usage)).await;
}

/// After `turn_ended` and the final checkpoint: end-of-stream `{}`.
pub async fn finish_success(downlink: &mut Downlink) {
    downlink.end(connect::end_stream_ok()).await;
}

/// No `turn_ended`; end-of-stream carries the error (provider errors with `ErrorDetails`).
pub async fn finish_error(downlink: &mut Downlink, error: &ServerError) {
    downlink
        .end(connect::end_stream_error(&connect_error(error)))
        .await;
}

/// No `turn_ended`; end-of-stream `canceled`.
pub async fn finish_canceled(downlink: &mut Downlink, reason: &str) {
    let error = ConnectError::new(ConnectCode::Canceled, reason);
    downlink.end(connect::end_stream_error(&error)).await;
}

fn connect_error(error: &ServerError) -> ConnectError {
    match error {
        ServerError::Provider(provider) => ConnectError::provider(
            error.connect_code(),
            provider.title(),
            provider.to_string(),
            error.is_retryable(),
        ),
        ServerError::Compaction(_) => ConnectError::provider(
            error.connect_code(),
            "Summarizing older history failed",
            error.to_string(),
            error.is_retryable(),
        ),
        // The driver's text (an address, "connection refused", a pool timeout) is for the log and
        // the run's record; the client is told what happened and what to do.
        ServerError::Store(store) if store.is_unavailable() => {
            ConnectError::new(ConnectCode::Unavailable, DATABASE_UNAVAILABLE)
        }
        other => ConnectError::new(other.connect_code(), other.to_string()),
    }
}

/// What a client is told when the database could not be reached during its run.
pub const DATABASE_UNAVAILABLE: &str = "the server's database is unavailable (down, restarting or unreachable): the run was stopped and its unfinished step was not stored; send the message again once the database is back";

fn now_ms() -> u64 {
    u64::try_from(crate::store::now_ms()).unwrap_or(0)
}

/// Publishes the run's checkpoints: keeps the blob graph as the projection of history
/// (`sync/projection.rs`) — re-projected when the run starts, extended by each commit — stores
/// each new blob in the CAS and asks the client to store it, and publishes a checkpoint only once
/// every blob it references is acknowledged (protocol.md §7). Owned by the run's turn loop.
pub struct Checkpoints {
    /// The run's handle on the store: blobs, outbox, the conversation head.
    store: Store,
    conversation_id: String,
    request_id: String,
    projection: Projection,
    kv: KvSync,
    gate: CheckpointGate<(ConversationState, BlobId)>,
    /// Every blob sent in this run: the newest checkpoint references them all.
    referenced: Vec<BlobId>,
    /// Blobs sent and not yet acknowledged, with when they were (last) sent.
    outstanding: HashMap<BlobId, (Blob, Instant)>,
    revision: i64,
    last_published: Option<ConversationState>,
    /// The state this run started from (`UserMessage.conversation_state_blob_id`).
    previous_head: Option<BlobId>,
    /// The mode recorded in that state (a resumed run continues in it).
    previous_mode: Option<Mode>,
    /// Blobs to send with the first new blobs of this run, read from the CAS: those an earlier
    /// run sent and never got acknowledged (outbox), and those a re-projection names.
    owed: Vec<BlobId>,
    /// Blobs built by opening the run (a new base, a healed graph): stored and sent with the first
    /// new blobs.
    opening: Vec<Blob>,
    /// Tool cards and user-message blobs stored for messages about to be committed: sent from
    /// memory when the message enters the graph, neither read back nor stored again.
    stashed: HashMap<BlobId, Blob>,
    /// ACKs not stored yet: they are, with the next checkpoint published.
    acked: Vec<BlobId>,
    /// The base is the client's state until the import sets it (with the messages it covers).
    importing: bool,
    /// The turn's last checkpoints wait for `turn_ended` before they are published.
    held: bool,
    /// The transitional checkpoint, published right before the final one (whose id is first).
    transitional: Option<(BlobId, (ConversationState, BlobId))>,
}

/// A state blob this server stored, decoded (`None` when it is no longer stored).
async fn read_state(store: &Store, id: BlobId) -> Result<Option<ConversationState>, ServerError> {
    let Some(data) = blobs::get(store, id).await? else {
        return Ok(None);
    };
    Ok(Some(ConversationState::decode_stored(&data, id)?))
}

/// `read_state`, or the state a run start decoded lately from `cache` (ids are content hashes: the
/// same id is the same state).
async fn stored_state(
    store: &Store,
    cache: &HistoryCache,
    id: BlobId,
) -> Result<Option<Arc<ConversationState>>, ServerError> {
    if let Some(state) = cache.state(id) {
        return Ok(Some(state));
    }
    let Some(state) = read_state(store, id).await? else {
        return Ok(None);
    };
    let state = Arc::new(state);
    cache.keep_state(id, &state);
    Ok(Some(state))
}

/// The newest checkpoint this server built for the conversation (published, or left unpublished
/// in the outbox by an earlier run), decoded.
async fn newest_state(
    store: &Store,
    cache: &HistoryCache,
    newest: Option<BlobId>,
) -> Result<Option<(BlobId, Arc<ConversationState>)>, ServerError> {
    let Some(id) = newest else {
        return Ok(None);
    };
    Ok(stored_state(store, cache, id)
        .await?
        .map(|state| (id, state)))
}

/// A conversation's recorded base, read, with its id and the messages it covers.
type RecordedBase = (Base, (BlobId, usize));

/// The base recorded for the conversation (`recorded`: its id and the messages it covers), read.
async fn recorded_base(
    store: &Store,
    cache: &HistoryCache,
    recorded: Option<(BlobId, usize)>,
) -> Result<Option<RecordedBase>, ServerError> {
    let Some((id, covers)) = recorded else {
        return Ok(None);
    };
    let state = stored_state(store, cache, id)
        .await?
        .ok_or(StoreError::MissingBlob(id))?;
    let graph = ConversationGraph::from_state(&state);
    Ok(Some((Base { graph, covers }, (id, covers))))
}

/// Records `graph` as the conversation's base covering its first `covers` messages (a base a
/// concurrent first run set first is kept); the base's roots go out with the run's first blobs.
async fn set_base(
    store: &Store,
    conversation_id: &str,
    graph: ConversationGraph,
    new_roots: &[Blob],
    covers: usize,
) -> Result<Base, ServerError> {
    let (_, state_blob, _) = graph.state(None, &StateDetails::default());
    let roots: Vec<(BlobId, &[u8])> = new_roots
        .iter()
        .map(|root| (root.id, root.data.as_ref()))
        .collect();
    let state = (state_blob.id, state_blob.data.as_ref());
    let (id, covers_in_force) =
        blobs::put_base(store, conversation_id, &roots, state, covers).await?;
    if id == state_blob.id {
        Ok(Base { graph, covers })
    } else {
        let state = read_state(store, id)
            .await?
            .ok_or(StoreError::MissingBlob(id))?;
        Ok(Base {
            graph: ConversationGraph::from_state(&state),
            covers: covers_in_force,
        })
    }
}

/// The conversation's base: as recorded (`recorded`, read); else, for its first run, the client's
/// state (an import, recorded once its messages are stored: `importing`), the newest checkpoint (a
/// conversation stored before bases existed, taken to cover its history) or the mode's system
/// prompt.
async fn base_of(
    store: &Store,
    conversation_id: &str,
    recorded: Option<RecordedBase>,
    (client_state, newest): (Option<&ConversationState>, Option<&ConversationState>),
    stored_messages: usize,
    system: &str,
    unset: Option<&mut Option<UnsetBase>>,
) -> Result<(Base, Option<(BlobId, usize)>, bool), ServerError> {
    if let Some((base, key)) = recorded {
        return Ok((base, Some(key), false));
    }
    let base = match (client_state, newest) {
        (Some(client), None) if stored_messages == 0 => {
            let graph = ConversationGraph::from_state(client);
            return Ok((Base { graph, covers: 0 }, None, true));
        }
        (_, Some(state)) if stored_messages > 0 => {
            let graph = ConversationGraph::from_state(state);
            set_base(store, conversation_id, graph, &[], stored_messages).await?
        }
        _ => {
            let mut graph = ConversationGraph::default();
            let root = graph.push_root(&roots::system(system));
            if let Some(unset) = unset {
                // Written with the run's first messages, in their transaction.
                let (_, state, _) = graph.state(None, &StateDetails::default());
                *unset = Some(UnsetBase {
                    roots: vec![root],
                    state,
                });
                return Ok((Base { graph, covers: 0 }, None, false));
            }
            set_base(store, conversation_id, graph, &[root], 0).await?
        }
    };
    Ok((base, None, false))
}

/// The base of a conversation new to the graph, built by opening a run and not stored yet: the run
/// stores it with its first messages, in one write transaction (`messages::append_opening`).
pub struct UnsetBase {
    roots: Vec<Blob>,
    state: Blob,
}

impl UnsetBase {
    /// The write that records it: its roots, its state blob, covering no message.
    pub fn write(&self) -> blobs::BaseWrite<'_> {
        blobs::BaseWrite {
            roots: self
                .roots
                .iter()
                .map(|root| (root.id, root.data.as_ref()))
                .collect(),
            state: (self.state.id, self.state.data.as_ref()),
            covers: 0,
        }
    }
}

/// Blobs on their way to the client, decided before the write that stores them: what is stored
/// (with the blobs' edges), which are recorded as owed, and the KV requests that go out once the
/// write is committed.
pub struct Emission {
    /// Stored and offered to the client (opening blobs, owed blobs read back, new blobs).
    all: Vec<Blob>,
    /// Stored only: the client is not asked to hold them.
    local: Vec<Blob>,
    /// Offered to the client, stored already.
    stashed: Vec<Blob>,
    /// The KV request for each of `all` then `stashed` (`None`: the client holds it or has it coming).
    messages: Vec<Option<KvRequest>>,
    /// The blobs those requests send: owed until acknowledged.
    pub sent: Vec<BlobId>,
}

impl Emission {
    /// Each stored blob's edges, in the order of `rows`.
    pub fn edges(&self) -> Vec<Vec<Edge<'_>>> {
        self.all
            .iter()
            .map(|blob| {
                blob.edges
                    .iter()
                    .map(|(kind, ordinal, child)| Edge {
                        kind,
                        ordinal: *ordinal,
                        child: *child,
                    })
                    .collect()
            })
            .collect()
    }

    /// The rows the store writes: `all` with `edges`, then the local blobs.
    pub fn rows<'e>(
        &'e self,
        edges: &'e [Vec<Edge<'e>>],
    ) -> Vec<(BlobId, &'e [u8], &'e [Edge<'e>])> {
        self.all
            .iter()
            .zip(edges)
            .map(|(blob, edges)| (blob.id, blob.data.as_ref(), edges.as_slice()))
            .chain(
                self.local
                    .iter()
                    .map(|blob| (blob.id, blob.data.as_ref(), &[][..])),
            )
            .collect()
    }
}

/// A checkpoint built (`Checkpoints::building`) and not stored yet.
pub struct Building {
    state: ConversationState,
    state_id: BlobId,
    emission: Emission,
}

impl Building {
    /// The state blob the store records as the unpublished checkpoint.
    pub fn state_id(&self) -> BlobId {
        self.state_id
    }

    pub fn emission(&self) -> &Emission {
        &self.emission
    }
}

/// Whether the run starts by sending the projection's blobs: when the newest checkpoint differs
/// from the projection of history (it is continued from the projection), or none was published.
fn must_heal(
    conversation_id: &str,
    newest: Option<&(BlobId, Arc<ConversationState>)>,
    projection: &Projection,
    importing: bool,
) -> bool {
    match newest {
        Some((id, state)) if !projects_to(projection, state) => {
            tracing::warn!(
                conversation_id,
                checkpoint = %id,
                roots = state.root_count(),
                projected_roots = projection.graph().root_count(),
                "the newest checkpoint differs from the projection of history; continuing from the projection"
            );
            true
        }
        Some(_) => false,
        None => !importing,
    }
}

/// The run starts by sending what the projection built (`built`) and, for a conversation with no
/// checkpoint yet, its base's roots (`new_base`: from memory when they are not stored yet, else read
/// back by id from the projection's base): a new base's roots are the client's only once sent; a
/// recorded base's were sent.
fn heal(
    opening: &mut Vec<Blob>,
    owed: &mut Vec<BlobId>,
    built: NewBlobs,
    new_base: Option<Result<Vec<Blob>, &Projection>>,
) {
    match new_base {
        Some(Ok(roots)) => opening.extend(roots),
        Some(Err(projection)) => owed.extend(projection.base_roots()),
        None => {}
    }
    opening.extend(built.built);
    owed.extend(built.stored);
}

/// Whether `state` names exactly the roots and turns the projection has.
fn projects_to(projection: &Projection, state: &ConversationState) -> bool {
    let graph = projection.graph();
    let mut turns = graph.turns().to_vec();
    turns.extend(graph.turn_blob().map(|turn| turn.id));
    state.roots() == graph.roots() && state.turns() == turns
}

/// The fold of `history` from `base`: a recorded base's (`key`) is continued from the one `cache`
/// kept at the last run start when it is held and the newest checkpoint shows it; else, and for a
/// run that must heal (it sends every blob the fold builds), the whole history is folded. The
/// fold is kept for the next run start. `timed` is the state the turns' timings are read from.
fn fold(
    (conversation_id, base, key): (&str, Base, Option<(BlobId, usize)>),
    timed: Option<&ConversationState>,
    (history, cache): (&[Stored], &HistoryCache),
    newest: Option<&ConversationState>,
) -> (Projection, NewBlobs) {
    // Turn timings are wall-clock facts, not history: the state they are read from.
    let timings = timed.map(ConversationState::timings).unwrap_or_default();
    let continued = key.and_then(|key| {
        let projection = cache.fold(conversation_id, key, &timings, history)?;
        projects_to(&projection, newest?).then_some(projection)
    });
    let (projection, built) = match continued {
        Some(projection) => (projection, NewBlobs::default()),
        None => {
            let rows = history
                .iter()
                .map(|row| (row.request_id.as_str(), &row.message));
            projection::project(base, timings, rows)
        }
    };
    if let Some(key) = key {
        cache.keep_fold(conversation_id, key, history.len(), &projection);
    }
    (projection, built)
}

/// What a run start reads of the store besides its history: the conversation's head and base, the
/// outbox and the ACKed blobs (kept in the history cache when it holds as many as the store
/// counts). They are independent, so they are read at once (each read is a round trip to a
/// database connection), and together with the history (`run/opening.rs`). The default is what
/// they give for a conversation the store has nothing of.
#[derive(Default)]
pub struct StartReads {
    recorded: conversations::Recorded,
    owed: outbox::Pending,
    acked: HashSet<BlobId>,
}

impl StartReads {
    pub async fn read(
        store: &Store,
        cache: &HistoryCache,
        conversation_id: &str,
    ) -> Result<StartReads, ServerError> {
        let (recorded, owed) = tokio::try_join!(
            conversations::recorded(store, conversation_id),
            outbox::pending(store, conversation_id),
        )?;
        let acked = match cache.take_acked(conversation_id, recorded.acks) {
            Some(acked) => acked,
            None if recorded.acks == 0 => HashSet::new(),
            None => blobs::acked(store, conversation_id)
                .await?
                .into_iter()
                .collect(),
        };
        Ok(StartReads {
            recorded,
            owed,
            acked,
        })
    }
}

impl Checkpoints {
    /// The conversation's graph projected from its stored `history` (each message with the run
    /// that appended it) and its base — the client's state for a conversation being imported
    /// (`client_state`; the client holds those blobs) — then compared with the newest checkpoint
    /// this server built: what that checkpoint lacks (a crash between a commit and its
    /// checkpoint) is in this run's graph. With `unset_base`, a base the conversation does not
    /// have yet is built and left there for the caller to store with its first messages. The
    /// fold of `history` is continued from the one `cache` kept at the last run start, if any;
    /// `reads` are the run start's other reads.
    pub async fn open(
        (store, reads): (Store, StartReads),
        conversation_id: &str,
        request_id: &str,
        client_state: Option<&ConversationState>,
        (history, cache): (&[Stored], &HistoryCache),
        system: &str,
        mut unset_base: Option<&mut Option<UnsetBase>>,
    ) -> Result<Checkpoints, ServerError> {
        let StartReads {
            recorded,
            owed,
            mut acked,
        } = reads;
        let head = recorded.head;
        let revision = head.map_or(0, |(_, revision)| revision);
        let newest_id = owed.checkpoint.or(head.map(|(id, _)| id));
        let (newest, base) = tokio::try_join!(
            newest_state(&store, cache, newest_id),
            recorded_base(&store, cache, recorded.base),
        )?;
        if let (None, Some(state)) = (&newest, client_state) {
            acked.extend(state.roots_and_turns());
        }
        let newest_state = newest.as_ref().map(|(_, state)| &**state);
        let timed = newest_state.or(client_state);
        let (base, base_key, importing) = base_of(
            &store,
            conversation_id,
            base,
            (client_state, newest_state),
            history.len(),
            system,
            unset_base.as_deref_mut(),
        )
        .await?;
        let deferred_roots = unset_base
            .and_then(|unset| unset.as_ref())
            .map(|unset| unset.roots.clone());
        let (projection, built) = fold(
            (conversation_id, base, base_key),
            timed,
            (history, cache),
            newest_state,
        );
        let mut owed_blobs = owed.blobs;
        let mut opening = Vec::new();
        if must_heal(conversation_id, newest.as_ref(), &projection, importing) {
            let new_base = newest.is_none().then(|| deferred_roots.ok_or(&projection));
            heal(&mut opening, &mut owed_blobs, built, new_base);
        }
        let previous_mode = newest.as_ref().and_then(|(_, state)| state.mode());
        Ok(Checkpoints {
            store,
            conversation_id: conversation_id.to_owned(),
            request_id: request_id.to_owned(),
            previous_mode,
            previous_head: newest.map(|(id, _)| id),
            owed: owed_blobs,
            opening,
            stashed: HashMap::new(),
            acked: Vec::new(),
            importing,
            held: false,
            transitional: None,
            projection,
            kv: KvSync::with_acked(acked),
            gate: CheckpointGate::default(),
            referenced: Vec::new(),
            outstanding: HashMap::new(),
            revision,
            last_published: None,
        })
    }

    /// The mode of the state this run continues (`None` for a new conversation).
    pub fn previous_mode(&self) -> Option<Mode> {
        self.previous_mode
    }

    /// The checkpoint the client holds before this run (a new user message records it).
    pub fn previous_head(&self) -> Option<BlobId> {
        self.previous_head
    }

    /// Messages this run committed enter the graph (in the order the store holds them); their
    /// blobs are stored and sent. Returns whether the graph grew.
    pub async fn committed(
        &mut self,
        messages: &[CanonicalMessage],
        out: &mut Downlink,
    ) -> Result<bool, ServerError> {
        let (grew, emission) = self.entering(messages).await?;
        self.store_and_deliver(emission, None, out).await?;
        Ok(grew)
    }

    /// Messages about to be committed enter the graph: returns whether it grew and their blobs,
    /// to be stored in the transaction that commits the messages and sent once it has
    /// (`delivered`).
    pub async fn entering(
        &mut self,
        messages: &[CanonicalMessage],
    ) -> Result<(bool, Emission), ServerError> {
        let began = messages
            .iter()
            .any(|m| matches!(m, CanonicalMessage::User(u) if u.origin == Origin::User));
        let mut new_blobs = NewBlobs::default();
        for message in messages {
            self.projection
                .apply(&self.request_id, message, &mut new_blobs);
        }
        if began {
            // This run's user message opened a new turn: it started now.
            self.projection.graph_mut().set_turn_started(now_ms());
        }
        let grew = !new_blobs.is_empty();
        let mut stashed = Vec::new();
        for id in new_blobs.stored {
            match self.stashed.remove(&id) {
                Some(blob) => stashed.push(blob),
                None => self.owed.push(id),
            }
        }
        let emission = self.prepare(new_blobs.built, Vec::new(), stashed).await?;
        Ok((grew, emission))
    }

    /// The messages `entering` prepared for are committed with its blobs: their KV requests go out.
    pub async fn delivered(&mut self, emission: Emission, out: &mut Downlink) {
        self.deliver(emission, out).await;
    }

    /// Stores a step blob a message about to be committed names (a tool's finished card, the
    /// user's message as shown); it is sent when the message enters the graph. Returns its id.
    pub async fn stash(&mut self, step: StepBlob) -> Result<BlobId, ServerError> {
        let blob = self.stage(step);
        blobs::put_all(&self.store, &[(blob.id, blob.data.as_ref(), &[])]).await?;
        Ok(blob.id)
    }

    /// `stash` without storing: the caller stores the blob in the transaction that commits the
    /// message naming it (a tool result's commit).
    pub fn stage(&mut self, step: StepBlob) -> Blob {
        let blob = Blob::new(step.into_bytes(), Vec::new());
        self.stashed.insert(blob.id, blob.clone());
        blob
    }

    /// Stores the blob a turn shows for the user's message with its attachments' chips, before
    /// the message is committed (the message names it); returns its id.
    pub async fn stash_user_message(
        &mut self,
        user: &UserMessage,
        chips: Chips,
    ) -> Result<BlobId, ServerError> {
        self.stash(projection::shown_user_step(user, chips)).await
    }

    /// The calls of the open batch not in the graph yet (the checkpoint's pending calls).
    pub fn pending_calls(&self) -> Vec<ToolCall> {
        self.projection.pending_calls()
    }

    /// The imported messages are stored: the client's roots (less those it could not produce)
    /// become the graph's base, covering them.
    pub async fn imported(
        &mut self,
        missing: &[BlobId],
        covers: usize,
        system: &str,
    ) -> Result<(), ServerError> {
        if !std::mem::take(&mut self.importing) {
            return Ok(());
        }
        let mut graph = self.projection.graph().clone();
        graph.drop_roots(missing);
        let mut new_roots = Vec::new();
        if graph.root_count() == 0 {
            new_roots.push(graph.push_root(&roots::system(system)));
        }
        let timings = graph.timings().to_vec();
        let base = set_base(
            &self.store,
            &self.conversation_id,
            graph,
            &new_roots,
            covers,
        )
        .await?;
        self.opening.extend(new_roots);
        self.projection = Projection::new(base, timings);
        Ok(())
    }

    /// Asks the client for every root of the graph (importing a conversation); returns their ids.
    pub async fn fetch_roots(&mut self, out: &mut Downlink) -> Vec<BlobId> {
        let roots = self.projection.graph().roots().to_vec();
        for id in &roots {
            out.send_message(self.kv.fetch(*id).message()).await;
        }
        roots
    }

    /// Asks the client for one blob (the answer comes back through `on_kv`).
    pub async fn fetch(&mut self, id: BlobId, out: &mut Downlink) {
        out.send_message(self.kv.fetch(id).message()).await;
    }

    /// Stores `new_blobs` (after what opening the run built and what the client may lack) and
    /// `local` blobs the client is not asked to hold, sends those the client does not hold yet and
    /// `stashed` blobs already stored (a message about to be committed named them), and records
    /// them in the outbox until they are acknowledged; with `built`, that state blob becomes the
    /// unpublished checkpoint in the same write transaction.
    async fn emit_with(
        &mut self,
        new_blobs: Vec<Blob>,
        local: Vec<Blob>,
        stashed: Vec<Blob>,
        built: Option<BlobId>,
        out: &mut Downlink,
    ) -> Result<(), ServerError> {
        let emission = self.prepare(new_blobs, local, stashed).await?;
        self.store_and_deliver(emission, built, out).await
    }

    /// Stores an emission's blobs and outbox rows (with `built` as the unpublished checkpoint, in
    /// the same write transaction), then sends them.
    async fn store_and_deliver(
        &mut self,
        emission: Emission,
        built: Option<BlobId>,
        out: &mut Downlink,
    ) -> Result<(), ServerError> {
        let edges = emission.edges();
        let rows = emission.rows(&edges);
        let sending = (
            self.conversation_id.as_str(),
            self.request_id.as_str(),
            &emission.sent[..],
        );
        blobs::put_and_send(&self.store, &rows, sending, built).await?;
        drop(rows);
        drop(edges);
        self.deliver(emission, out).await;
        Ok(())
    }

    /// Decides what an emission stores and sends (reading owed blobs back from the CAS); nothing
    /// is written or sent yet.
    async fn prepare(
        &mut self,
        new_blobs: Vec<Blob>,
        local: Vec<Blob>,
        stashed: Vec<Blob>,
    ) -> Result<Emission, ServerError> {
        let mut all = std::mem::take(&mut self.opening);
        for id in std::mem::take(&mut self.owed) {
            if self.kv.reaches_client(id) {
                continue;
            }
            match blobs::get(&self.store, id).await? {
                Some(data) => all.push(Blob {
                    id,
                    data: data.into(),
                    edges: Vec::new(),
                }),
                None => {
                    tracing::warn!(blob = %id, "an owed blob is no longer stored")
                }
            }
        }
        all.extend(new_blobs);
        // Which blobs go to the client is decided first, so storing them and recording them as
        // owed is one write transaction; the KV requests follow it.
        let messages: Vec<_> = all
            .iter()
            .chain(&stashed)
            .map(|blob| self.kv.store(blob))
            .collect();
        let sent: Vec<BlobId> = all
            .iter()
            .chain(&stashed)
            .zip(&messages)
            .filter(|(_, message)| message.is_some())
            .map(|(blob, _)| blob.id)
            .collect();
        Ok(Emission {
            all,
            local,
            stashed,
            messages,
            sent,
        })
    }

    /// Sends an emission's KV requests once what they name is committed.
    async fn deliver(&mut self, emission: Emission, out: &mut Downlink) {
        let Emission {
            all,
            stashed,
            messages,
            ..
        } = emission;
        for (blob, message) in all.into_iter().chain(stashed).zip(messages) {
            if let Some(message) = message {
                out.send_message(message.message()).await;
                self.outstanding
                    .insert(blob.id, (blob.clone(), Instant::now()));
            }
            self.referenced.push(blob.id);
        }
    }

    /// Builds the checkpoint of everything so far without storing it: the transaction that
    /// commits what it shows stores it (a tool result's commit), then `built` sends and offers it.
    pub async fn building(
        &mut self,
        details: &StateDetails,
    ) -> Result<Option<Building>, ServerError> {
        let Some(turn) = self.projection.graph().turn_blob() else {
            return Ok(None);
        };
        let (state, state_blob, mut new_blobs) =
            self.projection.graph().state(Some(&turn), details);
        let state_id = state_blob.id;
        new_blobs.push(turn);
        new_blobs.push(state_blob);
        let emission = self.prepare(new_blobs, Vec::new(), Vec::new()).await?;
        Ok(Some(Building {
            state,
            state_id,
            emission,
        }))
    }

    /// A checkpoint `building` prepared is stored: its KV requests go out, and it is published
    /// once every blob it references is acknowledged.
    pub async fn built(
        &mut self,
        building: Building,
        out: &mut Downlink,
    ) -> Result<(), ServerError> {
        self.deliver(building.emission, out).await;
        let needed = self.referenced.clone();
        for ready in (self.gate).offer((building.state, building.state_id), needed, &self.kv) {
            self.publish(ready, out).await?;
        }
        Ok(())
    }

    /// Builds the checkpoint of everything so far and publishes it once it is safe to.
    pub async fn checkpoint(
        &mut self,
        details: &StateDetails,
        out: &mut Downlink,
    ) -> Result<(), ServerError> {
        let Some(turn) = self.projection.graph().turn_blob() else {
            return Ok(());
        };
        let (state, state_blob, mut new_blobs) =
            self.projection.graph().state(Some(&turn), details);
        let state_id = state_blob.id;
        new_blobs.push(turn);
        new_blobs.push(state_blob);
        self.emit_with(new_blobs, Vec::new(), Vec::new(), Some(state_id), out)
            .await?;
        let needed = self.referenced.clone();
        for ready in self.gate.offer((state, state_id), needed, &self.kv) {
            self.publish(ready, out).await?;
        }
        Ok(())
    }

    /// The turn is over: builds the transitional checkpoint (its complete history, `transitional`)
    /// and the final one (`last`, which adds what only the turn's end knows), stores and sends
    /// their blobs, and holds both until `release` (after `turn_ended`, protocol.md §8). They are
    /// published together, in that order, once every blob is acknowledged.
    pub async fn finish_turn(
        &mut self,
        transitional: &StateDetails,
        last: &StateDetails,
        out: &mut Downlink,
    ) -> Result<(), ServerError> {
        let Some(turn) = self.projection.graph().turn_blob() else {
            return Ok(());
        };
        let (transitional_state, transitional_blob, mut new_blobs) =
            self.projection.graph().state(Some(&turn), transitional);
        let (final_state, final_blob, _) = self.projection.graph().state(Some(&turn), last);
        let (transitional_id, final_id) = (transitional_blob.id, final_blob.id);
        new_blobs.extend([turn, final_blob]);
        // The transitional state is published inline and superseded at once: nothing names its
        // blob, so the client is not asked to store it (the final one is the next message's
        // `conversation_state_blob_id`).
        self.emit_with(
            new_blobs,
            vec![transitional_blob],
            Vec::new(),
            Some(final_id),
            out,
        )
        .await?;
        self.held = true;
        self.transitional = Some((final_id, (transitional_state, transitional_id)));
        self.gate
            .queue((final_state, final_id), self.referenced.clone());
        Ok(())
    }

    /// `turn_ended` is out: a held checkpoint may be published as soon as it is safe to.
    pub async fn release(&mut self, out: &mut Downlink) -> Result<(), ServerError> {
        self.held = false;
        for ready in self.gate.ready(&self.kv) {
            self.publish(ready, out).await?;
        }
        Ok(())
    }

    /// Publishes `ready` (the final checkpoint after the transitional one).
    async fn publish(
        &mut self,
        ready: (ConversationState, BlobId),
        out: &mut Downlink,
    ) -> Result<(), ServerError> {
        if self
            .transitional
            .as_ref()
            .is_some_and(|(before, _)| *before == ready.1)
            && let Some((_, transitional)) = self.transitional.take()
        {
            self.publish_one(transitional, out).await?;
        }
        self.publish_one(ready, out).await
    }

    async fn publish_one(
        &mut self,
        (state, state_id): (ConversationState, BlobId),
        out: &mut Downlink,
    ) -> Result<(), ServerError> {
        self.revision += 1;
        let acked = std::mem::take(&mut self.acked);
        let published = blobs::acknowledge_and_publish(
            &self.store,
            (&self.conversation_id, &self.request_id),
            &acked,
            state_id,
            self.revision,
        )
        .await;
        match published {
            Ok(true) => {}
            Ok(false) => {
                tracing::warn!("a newer run moved the head; this checkpoint is not published");
                return Ok(());
            }
            // Superseded (perhaps on another node that could not tell this one): the newer run
            // publishes from now on.
            Err(StoreError::NotOwner { .. }) => {
                tracing::warn!(
                    "a newer run owns the conversation; this checkpoint is not published"
                );
                return Ok(());
            }
            Err(e) => return Err(e.into()),
        }
        out.send_message(&state.update_message()).await;
        self.last_published = Some(state);
        Ok(())
    }

    /// The client's answer to a KV request.
    pub async fn on_kv(
        &mut self,
        id: u32,
        payload: KvPayload,
        out: &mut Downlink,
    ) -> Result<Option<KvOutcome>, ServerError> {
        match self.kv.on_result(id, *payload.0) {
            Ok(KvOutcome::Stored(blob)) => {
                self.outstanding.remove(&blob);
                // Stored with the next publication (a lost ACK only means the blob is sent again).
                self.acked.push(blob);
                if !self.held {
                    for ready in self.gate.ready(&self.kv) {
                        self.publish(ready, out).await?;
                    }
                }
                Ok(None)
            }
            // Reads go back to whoever asked (the importer).
            Ok(read) => Ok(Some(read)),
            Err(KvError::Late(id)) => {
                tracing::info!(kv_id = id, "late KV result ignored");
                Ok(None)
            }
            Err(KvError::StoreFailed { blob, message }) => {
                // The previous checkpoint stays current; the graph is still ours to publish later.
                tracing::warn!(%blob, "client could not store a blob: {message}");
                Ok(None)
            }
            Err(error) => Err(ProtocolError::Kv(error.to_string()).into()),
        }
    }

    /// Sends again, under new KV ids, the blobs whose ACK is overdue (storing is idempotent).
    pub async fn resend_overdue(&mut self, overdue_after: Duration, out: &mut Downlink) {
        let now = Instant::now();
        for (blob, sent) in self.outstanding.values_mut() {
            if now.duration_since(*sent) >= overdue_after
                && let Some(message) = self.kv.resend(blob)
            {
                tracing::info!(blob = %blob.id, "resending a blob whose ACK is overdue");
                out.send_message(message.message()).await;
                *sent = now;
            }
        }
    }

    /// The blobs the client holds as far as this run saw, taken out when it is over (for the
    /// history cache: the next run start of the conversation need not read them).
    pub fn take_acked(&mut self) -> HashSet<BlobId> {
        self.kv.take_acked()
    }

    /// Records the blobs the client acknowledged since the last publication (a run that ends
    /// early has no publication to carry them): the client holds them whatever the ending.
    pub async fn keep_acks(&mut self) -> Result<(), ServerError> {
        let acked = std::mem::take(&mut self.acked);
        blobs::acknowledge(&self.store, &self.conversation_id, &acked).await?;
        Ok(())
    }

    /// Whether every built checkpoint has been published.
    pub fn settled(&self) -> bool {
        !self.gate.is_waiting()
    }

    /// Sends the last published checkpoint once more (the final state is published twice).
    pub async fn republish(&self, out: &mut Downlink) {
        if let Some(state) = &self.last_published {
            out.send_message(&state.update_message()).await;
        }
    }
}
