//! Units of work that span the store's domains, each in one write transaction. A tool result's
//! commit — the blobs its result names (its card, its images), the console's record of the call,
//! the call and its result in history with the runtime notice they cause, the graph's blobs that
//! show them and the checkpoint built on them (the blobs sent recorded as owed) — lands whole or
//! not at all: a crash or a refusal (a run that no longer owns the conversation) leaves none of it.

use super::blobs::Edge;
use super::runs::{self, ToolExecution};
use super::{Store, StoreError, blobs, conversations, messages, outbox};
use crate::model::conversation::BlobId;
use crate::model::message::CanonicalMessage;
use crate::model::runtime_tag::RuntimeTag;

/// Everything one finished tool call writes.
#[derive(Debug)]
pub struct ToolResultCommit<'a> {
    pub conversation_id: &'a str,
    pub request_id: &'a str,
    /// The blobs the result names (its card, its images): stored with the messages naming them.
    pub blobs: &'a [(BlobId, &'a [u8])],
    /// The call and its result.
    pub messages: &'a [CanonicalMessage],
    /// Runtime messages the result causes (an approved mode switch's notice), after it.
    pub after: &'a [RuntimeTag],
    /// The console's record of the call.
    pub execution: &'a ToolExecution,
    /// The graph's blobs the result adds (with their edges), and the checkpoint that shows it.
    pub graph: &'a [(BlobId, &'a [u8], &'a [Edge<'a>])],
    /// Of those, the blobs sent to the client: owed until acknowledged.
    pub sent: &'a [BlobId],
    /// The checkpoint's state blob: the conversation's unpublished checkpoint from now on.
    pub built: Option<BlobId>,
}

/// Commits a tool result in one write transaction; returns the messages appended, in order.
pub async fn tool_result(
    store: &Store,
    commit: &ToolResultCommit<'_>,
) -> Result<Vec<CanonicalMessage>, StoreError> {
    write_tx!(store, "committing a tool result", |tx| {
        conversations::lock(&mut tx, commit.conversation_id).await?;
        let rows: Vec<(BlobId, &[u8], &[Edge<'_>])> = (commit.blobs.iter())
            .map(|(id, data)| (*id, *data, &[][..]))
            .collect();
        blobs::put_in(&mut tx, &rows).await?;
        blobs::put_in(&mut tx, commit.graph).await?;
        runs::record_tool_in(&mut tx, commit.execution).await?;
        let appended = messages::append_with_tags_in(
            &mut tx,
            (commit.conversation_id, commit.request_id),
            &[],
            commit.messages,
            commit.after,
        )
        .await?;
        let (conversation_id, request_id) = (commit.conversation_id, commit.request_id);
        // Nothing after the last statement can fail: its COMMIT goes with it.
        if commit.built.is_none() {
            tx.end_with_next();
        }
        // `lock` made sure of the conversation's row.
        outbox::blobs_sent_to_existing(&mut tx, (conversation_id, request_id), commit.sent).await?;
        if let Some(state) = commit.built {
            tx.end_with_next();
            outbox::checkpoint_built_to_existing(&mut tx, conversation_id, request_id, state)
                .await?;
        }
        Ok(appended)
    })
}
