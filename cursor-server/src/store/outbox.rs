//! The outbox: KV work sent to the client and not yet confirmed (protocol.md §7) — blobs whose
//! `set_blob_result` has not arrived, and the newest checkpoint built but not yet published.
//!
//! It lets a later run pick up where an interrupted one stopped (continue from the unpublished
//! checkpoint, send its blobs again) and keeps that work alive through garbage collection.

use sqlx::{Row, SqliteConnection};

use super::conversations;
use super::{QueryContext, Store, StoreError, now_ms};
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
    conn: &mut SqliteConnection,
    conversation_id: &str,
    request_id: &str,
    ids: &[BlobId],
) -> Result<(), StoreError> {
    if ids.is_empty() {
        return Ok(());
    }
    conversations::ensure(&mut *conn, conversation_id).await?;
    let now = now_ms();
    for id in ids {
        sqlx::query(
            "INSERT OR IGNORE INTO outbox (conversation_id, kind, blob_id, request_id, created_at_ms)
             VALUES (?, 'blob', ?, ?, ?)",
        )
        .bind(conversation_id)
        .bind(&id.0[..])
        .bind(request_id)
        .bind(now)
        .execute(&mut *conn)
        .await
        .context("recording a sent blob")?;
    }
    Ok(())
}

/// Blobs the client acknowledged: no longer owed.
pub async fn blobs_acknowledged(
    conn: &mut SqliteConnection,
    conversation_id: &str,
    ids: &[BlobId],
) -> Result<(), StoreError> {
    for id in ids {
        sqlx::query(
            "DELETE FROM outbox WHERE conversation_id = ? AND kind = 'blob' AND blob_id = ?",
        )
        .bind(conversation_id)
        .bind(&id.0[..])
        .execute(&mut *conn)
        .await
        .context("clearing an acknowledged blob")?;
    }
    Ok(())
}

/// Makes `state` the conversation's unpublished checkpoint (replacing an older one).
pub async fn checkpoint_built(
    store: &Store,
    conversation_id: &str,
    request_id: &str,
    state: BlobId,
) -> Result<(), StoreError> {
    let mut conn = store
        .writer()
        .acquire()
        .await
        .context("recording the unpublished checkpoint")?;
    conversations::ensure(&mut conn, conversation_id).await?;
    sqlx::query("DELETE FROM outbox WHERE conversation_id = ? AND kind = 'checkpoint'")
        .bind(conversation_id)
        .execute(&mut *conn)
        .await
        .context("replacing the unpublished checkpoint")?;
    sqlx::query(
        "INSERT INTO outbox (conversation_id, kind, blob_id, request_id, created_at_ms)
         VALUES (?, 'checkpoint', ?, ?, ?)",
    )
    .bind(conversation_id)
    .bind(&state.0[..])
    .bind(request_id)
    .bind(now_ms())
    .execute(&mut *conn)
    .await
    .context("recording the unpublished checkpoint")?;
    Ok(())
}

/// The checkpoint `state` was published. Every blob it names is acknowledged, and a checkpoint is
/// published only when it is the newest one built, so whatever else is owed is superseded.
pub(super) async fn checkpoint_published(
    conn: &mut SqliteConnection,
    conversation_id: &str,
    state: BlobId,
) -> Result<(), StoreError> {
    sqlx::query(
        "DELETE FROM outbox WHERE conversation_id = ?
         AND (kind = 'blob' OR (kind = 'checkpoint' AND blob_id = ?))",
    )
    .bind(conversation_id)
    .bind(&state.0[..])
    .execute(&mut *conn)
    .await
    .context("clearing the published checkpoint")?;
    Ok(())
}

/// What `conversation_id` still owes the client.
pub async fn pending(store: &Store, conversation_id: &str) -> Result<Pending, StoreError> {
    let rows = sqlx::query(
        "SELECT kind, blob_id FROM outbox WHERE conversation_id = ? ORDER BY created_at_ms, blob_id",
    )
    .bind(conversation_id)
    .fetch_all(store.pool())
    .await
    .context("reading the outbox")?;
    let mut pending = Pending::default();
    for row in rows {
        let Some(id) = BlobId::from_slice(&row.get::<Vec<u8>, _>("blob_id")) else {
            continue;
        };
        match row.get::<String, _>("kind").as_str() {
            "checkpoint" => pending.checkpoint = Some(id),
            _ => pending.blobs.push(id),
        }
    }
    Ok(pending)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn acks_and_publication_clear_what_is_owed() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&format!("sqlite://{}", dir.path().join("o.db").display()))
            .await
            .unwrap();
        let mut conn = store.pool().acquire().await.unwrap();
        let (a, b, s1, s2) = (
            BlobId::of(b"a"),
            BlobId::of(b"b"),
            BlobId::of(b"s1"),
            BlobId::of(b"s2"),
        );
        crate::store::blobs::put_and_send(&store, &[], Some(("c", "r1", &[a, b])))
            .await
            .unwrap();
        checkpoint_built(&store, "c", "r1", s1).await.unwrap();
        checkpoint_built(&store, "c", "r1", s2).await.unwrap();
        blobs_acknowledged(&mut conn, "c", &[a]).await.unwrap();
        assert_eq!(
            pending(&store, "c").await.unwrap(),
            Pending {
                checkpoint: Some(s2),
                blobs: vec![b]
            }
        );
        checkpoint_published(&mut conn, "c", s2).await.unwrap();
        assert_eq!(pending(&store, "c").await.unwrap(), Pending::default());
    }
}
