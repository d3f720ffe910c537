//! The blob CAS: immutable blobs keyed by SHA-256 of their bytes (verified on every put), the edges
//! of the object graph, and reachability GC from conversation heads.

use std::time::Duration;

use sqlx::{Row, SqliteConnection};

use super::{QueryContext, Store, StoreError, now_ms};
use crate::model::conversation::BlobId;

/// Edges stored by one statement (4 bound values each, well under SQLite's limit).
const EDGES_PER_STATEMENT: usize = 256;

/// An edge: `parent` references `child` as entry `ordinal` of its field `kind`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Edge<'a> {
    pub kind: &'a str,
    pub ordinal: u32,
    pub child: BlobId,
}

#[derive(Debug, thiserror::Error)]
#[error("blob {claimed} does not match its data (SHA-256 is {actual})")]
pub struct HashMismatch {
    pub claimed: BlobId,
    pub actual: BlobId,
}

/// Stores each `(id, data, edges)` as `put` does, in one write transaction.
pub async fn put_all(
    store: &Store,
    blobs: &[(BlobId, &[u8], &[Edge<'_>])],
) -> Result<(), StoreError> {
    put_and_send(store, blobs, None).await
}

/// Stores `roots` and `state`, and records `state` as the conversation's graph base covering its
/// first `covers` messages, in one write transaction; a base already set is kept. Returns the
/// base in force.
pub async fn put_base(
    store: &Store,
    conversation_id: &str,
    roots: &[(BlobId, &[u8])],
    state: (BlobId, &[u8]),
    covers: usize,
) -> Result<(BlobId, usize), StoreError> {
    let mut tx = store.begin_write().await?;
    for (id, data) in roots.iter().chain([&state]) {
        put(&mut tx, *id, data, &[]).await?;
    }
    let base = super::conversations::set_base_in(&mut tx, conversation_id, state.0, covers).await?;
    tx.commit().await.context("committing the graph's base")?;
    Ok(base)
}

/// Blobs about to be sent to a conversation's client: `(conversation_id, request_id, ids)`.
pub type Sending<'a> = (&'a str, &'a str, &'a [BlobId]);

/// Stores the blobs and records those about to be sent in the outbox, in one write transaction.
pub async fn put_and_send(
    store: &Store,
    blobs: &[(BlobId, &[u8], &[Edge<'_>])],
    sending: Option<Sending<'_>>,
) -> Result<(), StoreError> {
    let sending = sending.filter(|(_, _, ids)| !ids.is_empty());
    if blobs.is_empty() && sending.is_none() {
        return Ok(());
    }
    let mut tx = store.begin_write().await?;
    for (id, data, edges) in blobs {
        put(&mut tx, *id, data, edges).await?;
    }
    if let Some((conversation_id, request_id, ids)) = sending {
        super::outbox::blobs_sent_in(&mut tx, conversation_id, request_id, ids).await?;
    }
    tx.commit().await.context("committing blobs")?;
    Ok(())
}

/// Stores `data` under `id` (a no-op if present) after checking that `id` is its hash.
async fn put(
    conn: &mut SqliteConnection,
    id: BlobId,
    data: &[u8],
    edges: &[Edge<'_>],
) -> Result<(), StoreError> {
    let actual = BlobId::of(data);
    if actual != id {
        return Err(StoreError::BlobHash(HashMismatch {
            claimed: id,
            actual,
        }));
    }
    sqlx::query("INSERT OR IGNORE INTO blobs (id, data, created_at_ms) VALUES (?, ?, ?)")
        .bind(&id.0[..])
        .bind(data)
        .bind(now_ms())
        .execute(&mut *conn)
        .await
        .context("storing blob")?;
    // One statement per chunk of edges: each statement is a round trip to the database thread.
    for chunk in edges.chunks(EDGES_PER_STATEMENT) {
        let mut sql =
            String::from("INSERT OR IGNORE INTO blob_edges (parent, kind, ordinal, child) VALUES ");
        for i in 0..chunk.len() {
            sql.push_str(if i == 0 {
                "(?, ?, ?, ?)"
            } else {
                ", (?, ?, ?, ?)"
            });
        }
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
        for edge in chunk {
            query = query
                .bind(&id.0[..])
                .bind(edge.kind)
                .bind(i64::from(edge.ordinal))
                .bind(&edge.child.0[..]);
        }
        query
            .execute(&mut *conn)
            .await
            .context("storing blob edges")?;
    }
    Ok(())
}

pub async fn get(store: &Store, id: BlobId) -> Result<Option<Vec<u8>>, StoreError> {
    let row = sqlx::query("SELECT data FROM blobs WHERE id = ?")
        .bind(&id.0[..])
        .fetch_optional(store.pool())
        .await
        .context("reading blob")?;
    Ok(row.map(|row| row.get::<Vec<u8>, _>("data")))
}

/// Deletes every blob not reachable from a conversation head or base, a stored tool result's card,
/// an image a stored message shows, the outbox or one of `extra_roots`, sparing blobs younger than
/// `grace` (a run may be building a graph that no head references yet). Returns the number of blobs deleted.
pub async fn collect_garbage(
    store: &Store,
    extra_roots: &[BlobId],
    grace: Duration,
) -> Result<u64, StoreError> {
    let mut tx = store.begin_write().await?;
    sqlx::query("CREATE TEMP TABLE IF NOT EXISTS gc_roots (id BLOB PRIMARY KEY)")
        .execute(&mut *tx)
        .await
        .context("preparing gc")?;
    sqlx::query("DELETE FROM gc_roots")
        .execute(&mut *tx)
        .await
        .context("preparing gc")?;
    for root in extra_roots {
        sqlx::query("INSERT OR IGNORE INTO gc_roots (id) VALUES (?)")
            .bind(&root.0[..])
            .execute(&mut *tx)
            .await
            .context("preparing gc")?;
    }
    let cutoff = now_ms() - i64::try_from(grace.as_millis()).unwrap_or(i64::MAX);
    let deleted = sqlx::query(
        "WITH RECURSIVE live(id) AS (
             SELECT head_blob FROM conversations WHERE head_blob IS NOT NULL
             UNION SELECT base_state FROM conversations WHERE base_state IS NOT NULL
             UNION SELECT unhex(json_extract(body, '$.card')) FROM messages
                 WHERE role = 'tool' AND json_extract(body, '$.card') IS NOT NULL
             UNION SELECT unhex(json_extract(i.value, '$.blob'))
                 FROM messages, json_each(messages.body, '$.images') i WHERE messages.role = 'user'
             UNION SELECT unhex(json_extract(i.value, '$.blob'))
                 FROM messages, json_each(messages.body, '$.result.images') i WHERE messages.role = 'tool'
             UNION SELECT id FROM gc_roots
             UNION SELECT blob_id FROM outbox
             UNION SELECT id FROM blobs WHERE created_at_ms >= ?
             UNION SELECT e.child FROM blob_edges e JOIN live l ON e.parent = l.id
         )
         DELETE FROM blobs WHERE id NOT IN (SELECT id FROM live)",
    )
    .bind(cutoff)
    .execute(&mut *tx)
    .await
    .context("collecting garbage")?
    .rows_affected();
    sqlx::query("DELETE FROM blob_edges WHERE parent NOT IN (SELECT id FROM blobs)")
        .execute(&mut *tx)
        .await
        .context("collecting garbage")?;
    sqlx::query("DROP TABLE gc_roots")
        .execute(&mut *tx)
        .await
        .context("finishing gc")?;
    tx.commit().await.context("committing gc")?;
    Ok(deleted)
}

/// Records that the client stored `ids` for `conversation_id` (part of a publication).
async fn acks_in(
    conn: &mut SqliteConnection,
    conversation_id: &str,
    ids: &[BlobId],
) -> Result<(), StoreError> {
    if ids.is_empty() {
        return Ok(());
    }
    super::conversations::ensure(&mut *conn, conversation_id).await?;
    for id in ids {
        sqlx::query(
            "INSERT OR IGNORE INTO conversation_blob_acks (conversation_id, blob_id) VALUES (?, ?)",
        )
        .bind(conversation_id)
        .bind(&id.0[..])
        .execute(&mut *conn)
        .await
        .context("recording blob ack")?;
    }
    super::outbox::blobs_acknowledged(&mut *conn, conversation_id, ids).await
}

/// Records the client's ACKs for `acked` and publishes `state` as revision `revision` (unless a
/// newer revision is the head), in one write transaction: a checkpoint is published once its
/// blobs are acknowledged, so both facts land together. Returns whether the head moved.
pub async fn acknowledge_and_publish(
    store: &Store,
    conversation_id: &str,
    acked: &[BlobId],
    state: BlobId,
    revision: i64,
) -> Result<bool, StoreError> {
    let mut tx = store.begin_write().await?;
    acks_in(&mut tx, conversation_id, acked).await?;
    let moved = super::conversations::move_head(&mut tx, conversation_id, state, revision).await?;
    if moved {
        super::outbox::checkpoint_published(&mut tx, conversation_id, state).await?;
    }
    tx.commit().await.context("committing conversation head")?;
    Ok(moved)
}

/// Records that the client stored `ids` for `conversation_id`, apart from any publication (a run
/// that ended before publishing what they were sent for).
pub async fn acknowledge(
    store: &Store,
    conversation_id: &str,
    ids: &[BlobId],
) -> Result<(), StoreError> {
    if ids.is_empty() {
        return Ok(());
    }
    let mut tx = store.begin_write().await?;
    acks_in(&mut tx, conversation_id, ids).await?;
    tx.commit().await.context("committing blob acks")?;
    Ok(())
}

/// Blobs the client already holds for `conversation_id`.
pub async fn acked(store: &Store, conversation_id: &str) -> Result<Vec<BlobId>, StoreError> {
    let rows = sqlx::query("SELECT blob_id FROM conversation_blob_acks WHERE conversation_id = ?")
        .bind(conversation_id)
        .fetch_all(store.pool())
        .await
        .context("reading blob acks")?;
    Ok(rows
        .iter()
        .filter_map(|row| BlobId::from_slice(&row.get::<Vec<u8>, _>("blob_id")))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Children of `parent` in field `kind`, in ordinal order.
    async fn children(
        store: &Store,
        parent: BlobId,
        kind: &str,
    ) -> Result<Vec<BlobId>, StoreError> {
        let rows = sqlx::query(
            "SELECT child FROM blob_edges WHERE parent = ? AND kind = ? ORDER BY ordinal",
        )
        .bind(&parent.0[..])
        .bind(kind)
        .fetch_all(store.pool())
        .await
        .context("reading blob edges")?;
        Ok(rows
            .iter()
            .filter_map(|row| BlobId::from_slice(&row.get::<Vec<u8>, _>("child")))
            .collect())
    }

    async fn store() -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&format!("sqlite://{}", dir.path().join("b.db").display()))
            .await
            .unwrap();
        (dir, store)
    }

    #[tokio::test]
    async fn puts_are_hash_checked_and_idempotent() {
        let (_dir, store) = store().await;
        let data = b"hello blob";
        let id = BlobId::of(data);
        let mut conn = store.pool().acquire().await.unwrap();
        put(&mut conn, id, data, &[]).await.unwrap();
        put(&mut conn, id, data, &[]).await.unwrap();
        assert_eq!(get(&store, id).await.unwrap().as_deref(), Some(&data[..]));
        let wrong = BlobId::of(b"other");
        let err = put(&mut conn, wrong, data, &[]).await.unwrap_err();
        assert!(err.to_string().contains("does not match its data"), "{err}");
        assert!(get(&store, wrong).await.unwrap().is_none());
    }

    #[tokio::test]
    async fn gc_keeps_what_a_head_reaches_and_drops_the_rest() {
        let (_dir, store) = store().await;
        let mut conn = store.pool().acquire().await.unwrap();
        let leaf = BlobId::of(b"leaf");
        put(&mut conn, leaf, b"leaf", &[]).await.unwrap();
        let head_data = b"head";
        let head = BlobId::of(head_data);
        put(
            &mut conn,
            head,
            head_data,
            &[Edge {
                kind: "turns",
                ordinal: 0,
                child: leaf,
            }],
        )
        .await
        .unwrap();
        let orphan = BlobId::of(b"orphan");
        put(&mut conn, orphan, b"orphan", &[]).await.unwrap();
        crate::store::conversations::ensure(&mut conn, "c")
            .await
            .unwrap();
        sqlx::query("UPDATE conversations SET head_blob = ? WHERE id = 'c'")
            .bind(&head.0[..])
            .execute(&mut *conn)
            .await
            .unwrap();
        drop(conn);
        // Within the grace period nothing goes.
        assert_eq!(
            collect_garbage(&store, &[], Duration::from_secs(3600))
                .await
                .unwrap(),
            0
        );
        assert_eq!(
            collect_garbage(&store, &[], Duration::ZERO).await.unwrap(),
            1
        );
        assert!(get(&store, orphan).await.unwrap().is_none());
        assert!(get(&store, leaf).await.unwrap().is_some());
        assert_eq!(children(&store, head, "turns").await.unwrap(), vec![leaf]);
    }
}
