//! Conversation records: one row per Cursor `conversation_id` the server has seen, with the head
//! (latest published checkpoint blob) and its revision.

use sqlx::{Row, SqliteConnection};

use super::{QueryContext, Store, StoreError, now_ms};
use crate::model::conversation::BlobId;

/// Creates the conversation row if it does not exist yet.
pub async fn ensure(conn: &mut SqliteConnection, conversation_id: &str) -> Result<(), StoreError> {
    sqlx::query("INSERT OR IGNORE INTO conversations (id, created_at_ms) VALUES (?, ?)")
        .bind(conversation_id)
        .bind(now_ms())
        .execute(conn)
        .await
        .context("creating conversation")?;
    Ok(())
}

/// The conversation's latest published checkpoint blob and its revision.
pub async fn head(
    store: &Store,
    conversation_id: &str,
) -> Result<Option<(BlobId, i64)>, StoreError> {
    let row = sqlx::query("SELECT head_blob, revision FROM conversations WHERE id = ?")
        .bind(conversation_id)
        .fetch_optional(store.pool())
        .await
        .context("reading conversation head")?;
    Ok(row.and_then(|row| {
        let blob: Option<Vec<u8>> = row.get("head_blob");
        blob.as_deref()
            .and_then(BlobId::from_slice)
            .map(|id| (id, row.get::<i64, _>("revision")))
    }))
}

/// Moves the head to `blob` as revision `revision`, unless a newer revision is already there
/// (late events of an older run never move a newer head). Returns whether the head moved. Part of
/// a checkpoint's publication (`outbox::publish`), which also settles the outbox in the same
/// transaction.
pub async fn move_head(
    conn: &mut SqliteConnection,
    conversation_id: &str,
    blob: BlobId,
    revision: i64,
) -> Result<bool, StoreError> {
    let moved = sqlx::query(
        "UPDATE conversations SET head_blob = ?, revision = ? WHERE id = ? AND revision < ?",
    )
    .bind(&blob.0[..])
    .bind(revision)
    .bind(conversation_id)
    .bind(revision)
    .execute(conn)
    .await
    .context("moving conversation head")?
    .rows_affected();
    Ok(moved == 1)
}
