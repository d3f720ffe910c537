//! The three ways a run ends — success, error, canceled — and the frames each sends (every path ends
//! with exactly one end-of-stream frame, after which nothing is sent); and the checkpoints published
//! along the way.

use crate::cursor::blob_sync::{CheckpointGate, KvError, KvOutcome, KvPayload, KvSync};
use crate::cursor::checkpoint::StateDetails;
use crate::cursor::checkpoint::{self, Blob, ConversationGraph, roots};
use crate::cursor::connect::{self, ConnectCode, ConnectError};
use crate::cursor::interaction;
use crate::cursor::proto::agent::{self as pb, ConversationStateStructure, conversation_step};
use crate::cursor::run_sse::Downlink;
use crate::error::{ProtocolError, ServerError};
use crate::model::conversation::BlobId;
use crate::model::conversation::Mode;
use crate::model::tool::{ToolCall, ToolResult};
use crate::model::usage::Usage;
use crate::store::blobs::{self, Edge};
use crate::store::{Store, StoreError, conversations, outbox};

use std::collections::HashMap;
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
        ServerError::Provider(provider) => {
            ConnectError::provider(provider.title(), provider.to_string())
        }
        other => ConnectError::new(other.connect_code(), other.to_string()),
    }
}

fn now_ms() -> u64 {
    u64::try_from(crate::store::now_ms()).unwrap_or(0)
}

/// A blob of our own store that must decode; if it does not, the store is corrupt.
fn decode_stored<M: prost::Message + Default>(
    data: &[u8],
    name: &'static str,
    id: BlobId,
) -> Result<M, ServerError> {
    connect::decode_message::<M>(data, name).map_err(|e| {
        ServerError::Store(StoreError::CorruptBlob {
            id: id.to_hex(),
            message: e.to_string(),
        })
    })
}

/// Publishes the run's checkpoints: builds the blob graph as history grows, stores each new blob in
/// the CAS and asks the client to store it, and publishes a checkpoint only once every blob it
/// references is acknowledged (protocol.md §7). Owned by the run's turn loop.
pub struct Checkpoints {
    /// The run's handle on the store: blobs, outbox, the conversation head.
    store: Store,
    conversation_id: String,
    request_id: String,
    graph: ConversationGraph,
    kv: KvSync,
    gate: CheckpointGate<(ConversationStateStructure, BlobId)>,
    /// Every blob sent in this run: the newest checkpoint references them all.
    referenced: Vec<BlobId>,
    /// Blobs sent and not yet acknowledged, with when they were (last) sent.
    outstanding: HashMap<BlobId, (Blob, Instant)>,
    revision: i64,
    last_published: Option<ConversationStateStructure>,
    /// The state this run started from (`UserMessage.conversation_state_blob_id`).
    previous_head: Option<BlobId>,
    /// The mode recorded in that state (a resumed run continues in it).
    previous_mode: Option<Mode>,
    /// Blobs an earlier run sent and never got acknowledged (outbox): sent again with the first
    /// new blobs of this run.
    owed: Vec<BlobId>,
    /// The turn's last checkpoints wait for `turn_ended` before they are published.
    held: bool,
    /// The transitional checkpoint, published right before the final one (whose id is first).
    transitional: Option<(BlobId, (ConversationStateStructure, BlobId))>,
}

/// What opens a turn in the graph: the mode's system prompt (the first root of a new
/// conversation) and the user's message in the mode they picked.
#[derive(Debug, Clone, Copy)]
pub struct TurnOpening<'a> {
    pub system: &'a str,
    /// The injected-context message stored before the user's, if there is a new one.
    pub context: Option<&'a str>,
    pub mode: Mode,
    pub user_text: &'a str,
    pub user_message_id: &'a str,
}

impl Checkpoints {
    /// Continues the conversation's graph from its stored head and opens this run's turn.
    pub async fn start(
        store: Store,
        conversation_id: &str,
        request_id: &str,
        opening: TurnOpening<'_>,
        out: &mut Downlink,
    ) -> Result<Checkpoints, ServerError> {
        let mut checkpoints = Checkpoints::open(store, conversation_id, request_id, None).await?;
        checkpoints.begin_turn(request_id, opening, out).await?;
        Ok(checkpoints)
    }

    /// The conversation's graph: from the newest checkpoint this server built (published, or
    /// left unpublished in the outbox by an earlier run), else from the state the client sent
    /// (`client_state`, for a conversation being imported; the client holds those blobs).
    pub async fn open(
        store: Store,
        conversation_id: &str,
        request_id: &str,
        client_state: Option<&ConversationStateStructure>,
    ) -> Result<Checkpoints, ServerError> {
        let head = conversations::head(&store, conversation_id).await?;
        let owed = outbox::pending(&store, conversation_id).await?;
        let mut acked = blobs::acked(&store, conversation_id).await?;
        let newest = owed.checkpoint.or(head.map(|(id, _)| id));
        let revision = head.map_or(0, |(_, revision)| revision);
        let mut previous_mode = None;
        let (graph, previous_head) = match (newest, client_state) {
            (Some(id), _) => match blobs::get(&store, id).await? {
                Some(data) => {
                    let state = decode_stored::<ConversationStateStructure>(
                        &data,
                        "agent.v1.ConversationStateStructure",
                        id,
                    )?;
                    previous_mode = state.mode.and_then(|m| checkpoint::mode_of(m).ok());
                    (ConversationGraph::from_state(&state), Some(id))
                }
                None => (ConversationGraph::default(), None),
            },
            (None, Some(state)) => {
                acked.extend(
                    state
                        .root_prompt_messages_json
                        .iter()
                        .chain(&state.turns)
                        .filter_map(|id| BlobId::from_slice(id)),
                );
                (ConversationGraph::from_state(state), None)
            }
            (None, None) => (ConversationGraph::default(), None),
        };
        if !owed.blobs.is_empty() {
            tracing::info!(
                conversation_id,
                owed = owed.blobs.len(),
                "an earlier run left blobs unacknowledged; sending them again"
            );
        }
        Ok(Checkpoints {
            store,
            conversation_id: conversation_id.to_owned(),
            request_id: request_id.to_owned(),
            previous_mode,
            owed: owed.blobs,
            held: false,
            transitional: None,
            graph,
            kv: KvSync::with_acked(acked),
            gate: CheckpointGate::default(),
            referenced: Vec::new(),
            outstanding: HashMap::new(),
            revision,
            last_published: None,
            previous_head,
        })
    }

    /// The mode of the state this run continues (`None` for a new conversation).
    pub fn previous_mode(&self) -> Option<Mode> {
        self.previous_mode
    }

    /// Opens this run's turn with the user's message.
    pub async fn begin_turn(
        &mut self,
        request_id: &str,
        opening: TurnOpening<'_>,
        out: &mut Downlink,
    ) -> Result<(), ServerError> {
        let TurnOpening {
            system,
            context,
            mode,
            user_text,
            user_message_id,
        } = opening;
        let mut new_blobs = Vec::new();
        if self.graph.root_count() == 0 {
            new_blobs.push(self.graph.push_root(&roots::system(system)));
        }
        if let Some(context) = context {
            new_blobs.push(self.graph.push_root(&roots::user(context)));
        }
        new_blobs.push(self.graph.push_root(&roots::user(user_text)));
        new_blobs.push(
            self.graph.begin_turn(
                request_id,
                &pb::UserMessage {
                    text: user_text.to_owned(),
                    message_id: user_message_id.to_owned(),
                    conversation_state_blob_id: self
                        .previous_head
                        .map(|id| id.0.to_vec())
                        .unwrap_or_default(),
                    mode: checkpoint::agent_mode(mode),
                    ..pb::UserMessage::default()
                },
                now_ms(),
            ),
        );
        self.emit(new_blobs, out).await
    }

    /// Forgets roots the client could not produce (see `ConversationGraph::drop_roots`).
    pub fn forget_missing_roots(&mut self, missing: &[BlobId]) {
        self.graph.drop_roots(missing);
    }

    /// Asks the client for every root of the graph (importing a conversation); returns their ids.
    pub async fn fetch_roots(&mut self, out: &mut Downlink) -> Vec<BlobId> {
        let roots = self.graph.roots().to_vec();
        for id in &roots {
            out.send_message(&self.kv.fetch(*id)).await;
        }
        roots
    }

    /// Asks the client for one blob (the answer comes back through `on_kv`).
    pub async fn fetch(&mut self, id: BlobId, out: &mut Downlink) {
        out.send_message(&self.kv.fetch(id)).await;
    }

    /// Continues the conversation's last turn (a resumed run has no new user message).
    pub async fn resume(
        store: Store,
        conversation_id: &str,
        request_id: &str,
    ) -> Result<Checkpoints, ServerError> {
        let mut checkpoints = Checkpoints::open(store, conversation_id, request_id, None).await?;
        if let Some(last) = checkpoints.graph.last_turn()
            && let Some(data) = blobs::get(&checkpoints.store, last).await?
        {
            let turn = decode_stored::<pb::ConversationTurnStructure>(
                &data,
                "agent.v1.ConversationTurnStructure",
                last,
            )?;
            if let Some(pb::conversation_turn_structure::Turn::AgentConversationTurn(turn)) =
                turn.turn
            {
                checkpoints.graph.reopen_last_turn(request_id, &turn);
            }
        }
        Ok(checkpoints)
    }

    /// Stores `new_blobs` (and whatever an earlier run still owes), sends those the client does
    /// not hold yet, and records them in the outbox until they are acknowledged.
    async fn emit(
        &mut self,
        mut new_blobs: Vec<Blob>,
        out: &mut Downlink,
    ) -> Result<(), ServerError> {
        if !self.owed.is_empty() {
            let mut owed = Vec::new();
            for id in std::mem::take(&mut self.owed) {
                match blobs::get(&self.store, id).await? {
                    Some(data) => owed.push(Blob {
                        id,
                        data: data.into(),
                        edges: Vec::new(),
                    }),
                    None => {
                        tracing::warn!(conversation_id = %self.conversation_id, blob = %id, "an owed blob is no longer stored")
                    }
                }
            }
            owed.append(&mut new_blobs);
            new_blobs = owed;
        }
        let edges: Vec<Vec<Edge<'_>>> = new_blobs
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
            .collect();
        let stored: Vec<(BlobId, &[u8], &[Edge<'_>])> = new_blobs
            .iter()
            .zip(&edges)
            .map(|(blob, edges)| (blob.id, blob.data.as_ref(), edges.as_slice()))
            .collect();
        blobs::put_all(&self.store, &stored).await?;
        drop(stored);
        let mut sent = Vec::new();
        for blob in new_blobs {
            if let Some(message) = self.kv.store(&blob) {
                out.send_message(&message).await;
                sent.push(blob.id);
                self.outstanding
                    .insert(blob.id, (blob.clone(), Instant::now()));
            }
            self.referenced.push(blob.id);
        }
        outbox::blobs_sent(&self.store, &self.conversation_id, &self.request_id, &sent).await?;
        Ok(())
    }

    /// A finished thinking segment.
    pub async fn thinking(
        &mut self,
        text: &str,
        duration_ms: u32,
        out: &mut Downlink,
    ) -> Result<(), ServerError> {
        let step = self
            .graph
            .push_step(conversation_step::Message::ThinkingMessage(
                pb::ThinkingMessage {
                    text: text.to_owned(),
                    duration_ms,
                },
            ));
        self.emit(vec![step], out).await
    }

    /// Runtime messages (mode notices, reminders) appended to history: roots the model sees.
    pub async fn runtime_messages(
        &mut self,
        texts: &[String],
        out: &mut Downlink,
    ) -> Result<(), ServerError> {
        let new_blobs = texts
            .iter()
            .map(|text| self.graph.push_root(&roots::user(text)))
            .collect();
        self.emit(new_blobs, out).await
    }

    /// A completed provider call's text and reasoning.
    pub async fn assistant(
        &mut self,
        text: &str,
        reasoning: &str,
        out: &mut Downlink,
    ) -> Result<(), ServerError> {
        let mut new_blobs = Vec::new();
        if !text.is_empty() {
            new_blobs.push(
                self.graph
                    .push_step(conversation_step::Message::AssistantMessage(
                        pb::AssistantMessage {
                            text: text.to_owned(),
                        },
                    )),
            );
        }
        if !text.is_empty() || !reasoning.is_empty() {
            new_blobs.push(self.graph.push_root(&roots::assistant(text, reasoning)));
        }
        self.emit(new_blobs, out).await
    }

    /// A completed tool call enters the graph: its card as a step, its call and result as roots,
    /// then the runtime messages it brought (a mode notice). The batch adds calls in call order
    /// and checkpoints after.
    pub async fn tool_completed(
        &mut self,
        call: &ToolCall,
        result: &ToolResult,
        card: Option<pb::ToolCall>,
        notices: &[String],
        out: &mut Downlink,
    ) -> Result<(), ServerError> {
        let mut new_blobs = Vec::new();
        if let Some(card) = card {
            new_blobs.push(
                self.graph
                    .push_step(conversation_step::Message::ToolCall(card)),
            );
        }
        new_blobs.push(self.graph.push_root(&roots::tool_call(
            &call.call_id,
            &call.name,
            &call.arguments,
        )));
        new_blobs.push(self.graph.push_root(&roots::tool_result(
            &call.call_id,
            &call.name,
            &result.content,
            result.is_error,
        )));
        new_blobs.extend(
            notices
                .iter()
                .map(|text| self.graph.push_root(&roots::user(text))),
        );
        self.emit(new_blobs, out).await
    }

    /// Builds the checkpoint of everything so far and publishes it once it is safe to.
    pub async fn checkpoint(
        &mut self,
        details: &StateDetails,
        out: &mut Downlink,
    ) -> Result<(), ServerError> {
        let Some(turn) = self.graph.turn_blob() else {
            return Ok(());
        };
        let (state, state_blob, mut new_blobs) = self.graph.state(Some(&turn), details);
        let state_id = state_blob.id;
        new_blobs.push(turn);
        new_blobs.push(state_blob);
        self.emit(new_blobs, out).await?;
        outbox::checkpoint_built(
            &self.store,
            &self.conversation_id,
            &self.request_id,
            state_id,
        )
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
        let Some(turn) = self.graph.turn_blob() else {
            return Ok(());
        };
        let (transitional_state, transitional_blob, mut new_blobs) =
            self.graph.state(Some(&turn), transitional);
        let (final_state, final_blob, _) = self.graph.state(Some(&turn), last);
        let (transitional_id, final_id) = (transitional_blob.id, final_blob.id);
        new_blobs.extend([turn, transitional_blob, final_blob]);
        self.emit(new_blobs, out).await?;
        outbox::checkpoint_built(
            &self.store,
            &self.conversation_id,
            &self.request_id,
            final_id,
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
        ready: (ConversationStateStructure, BlobId),
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
        (state, state_id): (ConversationStateStructure, BlobId),
        out: &mut Downlink,
    ) -> Result<(), ServerError> {
        self.revision += 1;
        if !outbox::publish(&self.store, &self.conversation_id, state_id, self.revision).await? {
            tracing::warn!(conversation_id = %self.conversation_id, "a newer run moved the head; this checkpoint is not published");
            return Ok(());
        }
        out.send_message(&checkpoint::update_message(state.clone()))
            .await;
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
                blobs::record_acks(&self.store, &self.conversation_id, &[blob]).await?;
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
                tracing::info!(conversation_id = %self.conversation_id, kv_id = id, "late KV result ignored");
                Ok(None)
            }
            Err(KvError::StoreFailed { blob, message }) => {
                // The previous checkpoint stays current; the graph is still ours to publish later.
                tracing::warn!(conversation_id = %self.conversation_id, %blob, "client could not store a blob: {message}");
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
                tracing::info!(conversation_id = %self.conversation_id, blob = %blob.id, "resending a blob whose ACK is overdue");
                out.send_message(&message).await;
                *sent = now;
            }
        }
    }

    /// Whether every built checkpoint has been published.
    pub fn settled(&self) -> bool {
        !self.gate.is_waiting()
    }

    /// Sends the last published checkpoint once more (the final state is published twice).
    pub async fn republish(&self, out: &mut Downlink) {
        if let Some(state) = &self.last_published {
            out.send_message(&checkpoint::update_message(state.clone()))
                .await;
        }
    }
}
