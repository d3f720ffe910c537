//! The outbox: KV work sent to the client and not yet confirmed (protocol.md §7) — blobs whose
//! `set_blob_result` has not arrived, and the newest checkpoint built but not yet published.
//!
//! It lets a later run pick up where an interrupted one stopped (continue from the unpublished
//! checkpoint, send its blobs again) and keeps that work alive through garbage collection.

use super::conversations;
use super::{
    DatabaseKind, Param, QueryContext, ROWS_PER_STATEMENT, Store, StoreError, Tx,
    list_placeholders, now_ms, row_placeholders,
};
use crate::model::conversation::BlobId;

/// What a conversation still owes the client.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pending {
    /// The newest checkpoint built and not published (its state blob).
    pub checkpoint: Option<BlobId>,
    /// Blobs sent and not acknowledged, oldest first.
    pub blobs: Vec<BlobId>,
}

/// Records blobs about to be sent with `set_blob_args`, inside the transaction that stores them
/// (`blobs::put_and_send`).
pub(super) async fn blobs_sent_in(
    tx: &mut Tx,
    conversation_id: &str,
    request_id: &str,
    ids: &[BlobId],
) -> Result<(), StoreError> {
    if ids.is_empty() {
        return Ok(());
    }
    let ensure_ahead = conversations::ensure_now_or_ahead(tx, conversation_id).await?;
    sent(tx, (conversation_id, request_id), ids, ensure_ahead).await
}

/// `blobs_sent_in` for a conversation whose row this transaction has made sure of.
pub(super) async fn blobs_sent_to_existing(
    tx: &mut Tx,
    (conversation_id, request_id): (&str, &str),
    ids: &[BlobId],
) -> Result<(), StoreError> {
    sent(tx, (conversation_id, request_id), ids, false).await
}

/// Outbox rows for blobs sent; with `ensure_ahead`, the first statement's command also makes sure
/// of the conversation's row (`conversations::with_ensure_ahead`, SQLite only).
async fn sent(
    tx: &mut Tx,
    (conversation_id, request_id): (&str, &str),
    ids: &[BlobId],
    mut ensure_ahead: bool,
) -> Result<(), StoreError> {
    if ids.is_empty() {
        return Ok(());
    }
    let now = now_ms();
    let chunks = ids.len().div_ceil(ROWS_PER_STATEMENT);
    for (index, chunk) in ids.chunks(ROWS_PER_STATEMENT).enumerate() {
        if index + 1 < chunks {
            tx.not_last();
        }
        let rows = sent_rows((conversation_id, request_id), chunk, now);
        let (sql, params) =
            conversations::with_ensure_ahead(&mut ensure_ahead, conversation_id, rows);
        on_tx!(&mut *tx, |c| {
            super::bound(&params, sqlx::query(sqlx::AssertSqlSafe(sql)))
                .execute(c)
                .await
                .map(|done| done.rows_affected())
                .map_err(|source| {
                    super::owner_refusal(
                        source,
                        "recording sent blobs",
                        (conversation_id, request_id),
                    )
                })?
        });
    }
    Ok(())
}

/// The outbox rows of blobs run `request_id` sent, to run alone or joined with other statements
/// (`sqlite::Joined`).
pub(super) fn sent_rows<'a>(
    (conversation_id, request_id): (&'a str, &'a str),
    ids: &'a [BlobId],
    now: i64,
) -> (String, Vec<Param<'a>>) {
    let sql = format!(
        "INSERT INTO outbox (conversation_id, kind, blob_id, request_id, created_at_ms)
         VALUES {} ON CONFLICT DO NOTHING",
        row_placeholders(ids.len(), 5)
    );
    let params = ids
        .iter()
        .flat_map(|id| {
            [
                Param::Text(conversation_id),
                Param::Text("blob"),
                Param::Bytes(&id.0[..]),
                Param::Text(request_id),
                Param::Int(now),
            ]
        })
        .collect();
    (sql, params)
}

/// On SQLite, `state` replaces the conversation's unpublished checkpoint in one query of two
/// statements, alone or joined with others (`sqlite::Joined`).
pub(super) fn checkpoint_replacement<'a>(
    (conversation_id, request_id): (&'a str, &'a str),
    state: &'a BlobId,
    now: i64,
) -> (String, Vec<Param<'a>>) {
    (
        "DELETE FROM outbox WHERE conversation_id = $1 AND kind = 'checkpoint';
         INSERT INTO outbox (conversation_id, kind, blob_id, request_id, created_at_ms)
         VALUES ($1, 'checkpoint', $2, $3, $4)"
            .to_owned(),
        vec![
            Param::Text(conversation_id),
            Param::Bytes(&state.0[..]),
            Param::Text(request_id),
            Param::Int(now),
        ],
    )
}

/// Blobs the client acknowledged: no longer owed.
pub(super) async fn blobs_acknowledged(
    tx: &mut Tx,
    conversation_id: &str,
    ids: &[BlobId],
) -> Result<(), StoreError> {
    for chunk in ids.chunks(ROWS_PER_STATEMENT) {
        let rows = acknowledged_rows(conversation_id, chunk);
        super::run_alone(tx, rows, "clearing acknowledged blobs").await?;
    }
    Ok(())
}

/// The deletion of acknowledged blobs' outbox rows, to run alone or joined with other statements
/// (`sqlite::Joined`).
pub(super) fn acknowledged_rows<'a>(
    conversation_id: &'a str,
    ids: &'a [BlobId],
) -> (String, Vec<Param<'a>>) {
    let sql = format!(
        "DELETE FROM outbox WHERE conversation_id = $1 AND kind = 'blob' AND blob_id IN ({})",
        list_placeholders(2, ids.len())
    );
    let params = std::iter::once(Param::Text(conversation_id))
        .chain(ids.iter().map(|id| Param::Bytes(&id.0[..])))
        .collect();
    (sql, params)
}

/// Makes `state` the conversation's unpublished checkpoint (replacing an older one). Refused
/// (`NotOwner`) to a run that no longer owns the conversation.
pub async fn checkpoint_built(
    store: &Store,
    conversation_id: &str,
    request_id: &str,
    state: BlobId,
) -> Result<(), StoreError> {
    write_tx!(store, "recording the unpublished checkpoint", |tx| {
        checkpoint_built_in(&mut tx, conversation_id, request_id, state).await
    })
}

/// `checkpoint_built` inside the caller's transaction (`blobs::put_and_send`).
pub(super) async fn checkpoint_built_in(
    tx: &mut Tx,
    conversation_id: &str,
    request_id: &str,
    state: BlobId,
) -> Result<(), StoreError> {
    checkpoint_replaced(tx, (conversation_id, request_id), state, true).await
}

/// `checkpoint_built_in` for a conversation whose row this transaction has made sure of.
pub(super) async fn checkpoint_built_to_existing(
    tx: &mut Tx,
    conversation_id: &str,
    request_id: &str,
    state: BlobId,
) -> Result<(), StoreError> {
    checkpoint_replaced(tx, (conversation_id, request_id), state, false).await
}

/// Makes `state` the conversation's one unpublished checkpoint; with `ensure`, makes sure of the
/// conversation's row first. On SQLite all of it is one command on its worker thread
/// (`conversations::with_ensure_ahead`).
async fn checkpoint_replaced(
    tx: &mut Tx,
    (conversation_id, request_id): (&str, &str),
    state: BlobId,
    ensure: bool,
) -> Result<(), StoreError> {
    let refused = |source| {
        super::owner_refusal(
            source,
            "recording the unpublished checkpoint",
            (conversation_id, request_id),
        )
    };
    let now = now_ms();
    let mut ensure_ahead =
        ensure && conversations::ensure_now_or_ahead(tx, conversation_id).await?;
    if tx.kind() == DatabaseKind::Sqlite {
        let replacement = checkpoint_replacement((conversation_id, request_id), &state, now);
        let (sql, params) =
            conversations::with_ensure_ahead(&mut ensure_ahead, conversation_id, replacement);
        on_tx!(tx, |c| {
            super::bound(&params, sqlx::query(sqlx::AssertSqlSafe(sql)))
                .execute(c)
                .await
                .map(|done| done.rows_affected())
                .map_err(refused)?
        });
        return Ok(());
    }
    on_tx!(tx, |c| {
        sqlx::query("DELETE FROM outbox WHERE conversation_id = $1 AND kind = 'checkpoint'")
            .bind(conversation_id)
            .execute(&mut *c)
            .await
            .map(|done| done.rows_affected())
            .context("replacing the unpublished checkpoint")?;
        sqlx::query(
            "INSERT INTO outbox (conversation_id, kind, blob_id, request_id, created_at_ms)
             VALUES ($1, 'checkpoint', $2, $3, $4)",
        )
        .bind(conversation_id)
        .bind(&state.0[..])
        .bind(request_id)
        .bind(now)
        .execute(&mut *c)
        .await
        .map(|done| done.rows_affected())
        .map_err(refused)?;
    });
    Ok(())
}

/// The checkpoint `state` was published. Every blob it names is acknowledged, and a checkpoint is
/// published only when it is the newest one built, so whatever else is owed is superseded.
pub(super) async fn checkpoint_published(
    tx: &mut Tx,
    conversation_id: &str,
    state: BlobId,
) -> Result<(), StoreError> {
    on_tx!(tx, |c| sqlx::query(
        "DELETE FROM outbox WHERE conversation_id = $1
         AND (kind = 'blob' OR (kind = 'checkpoint' AND blob_id = $2))",
    )
    .bind(conversation_id)
    .bind(&state.0[..])
    .execute(c)
    .await
    .map(|done| done.rows_affected())
    .context("clearing the published checkpoint"))?;
    Ok(())
}

/// What `conversation_id` still owes the client.
pub async fn pending(store: &Store, conversation_id: &str) -> Result<Pending, StoreError> {
    let rows: Vec<(String, Vec<u8>)> = on_readers!(store, |p| sqlx::query_as(
        "SELECT kind, blob_id FROM outbox WHERE conversation_id = $1
         ORDER BY created_at_ms, blob_id",
    )
    .bind(conversation_id)
    .fetch_all(p)
    .await
    .context("reading the outbox"))?;
    let mut pending = Pending::default();
    for (kind, id) in rows {
        let Some(id) = BlobId::from_slice(&id) else {
            continue;
        };
        match kind.as_str() {
            "checkpoint" => pending.checkpoint = Some(id),
            _ => pending.blobs.push(id),
        }
    }
    Ok(pending)
}
