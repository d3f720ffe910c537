//! The blob CAS: immutable blobs keyed by SHA-256 of their bytes (verified on every put), the edges
//! of the object graph, and reachability GC from conversation heads.

use std::time::Duration;

use super::sqlite::Joined;
use super::{
    Backend, Param, QueryContext, ROWS_PER_STATEMENT, Store, StoreError, Tx, now_ms,
    row_placeholders,
};
use crate::model::conversation::BlobId;

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
    if blobs.is_empty() {
        return Ok(());
    }
    write_tx!(store, "committing blobs", |tx| put(&mut tx, blobs).await)
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
    let base = BaseWrite {
        roots: roots.to_vec(),
        state,
        covers,
    };
    write_tx!(store, "committing the graph's base", |tx| {
        super::conversations::ensure(&mut tx, conversation_id).await?;
        put_base_in(&mut tx, conversation_id, &base).await
    })
}

/// A conversation's graph base about to be recorded: its root blobs, its state blob, and how many
/// of the conversation's first messages it covers.
#[derive(Debug, Clone)]
pub struct BaseWrite<'a> {
    pub roots: Vec<(BlobId, &'a [u8])>,
    pub state: (BlobId, &'a [u8]),
    pub covers: usize,
}

/// `put_base` inside the caller's transaction (`messages::append_opening`), for a conversation whose
/// row that transaction has made sure of; returns the base in force.
pub(super) async fn put_base_in(
    tx: &mut Tx,
    conversation_id: &str,
    base: &BaseWrite<'_>,
) -> Result<(BlobId, usize), StoreError> {
    let rows: Vec<(BlobId, &[u8], &[Edge<'_>])> = base
        .roots
        .iter()
        .chain([&base.state])
        .map(|(id, data)| (*id, *data, &[][..]))
        .collect();
    put(tx, &rows).await?;
    super::conversations::set_base_in(tx, conversation_id, base.state.0, base.covers).await
}

/// Blobs about to be sent to a conversation's client: `(conversation_id, request_id, ids)`.
pub type Sending<'a> = (&'a str, &'a str, &'a [BlobId]);

/// Stores the blobs, records those about to be sent in the outbox and, with `built`, makes that
/// state blob the conversation's unpublished checkpoint: one write transaction for what a
/// checkpoint (or a run's first blobs) commits, before its KV requests go out.
pub async fn put_and_send(
    store: &Store,
    blobs: &[(BlobId, &[u8], &[Edge<'_>])],
    (conversation_id, request_id, sent): Sending<'_>,
    built: Option<BlobId>,
) -> Result<(), StoreError> {
    if blobs.is_empty() && sent.is_empty() && built.is_none() {
        return Ok(());
    }
    let edges = edges_of(blobs);
    let one_query = [blobs.len(), edges.len(), sent.len()]
        .iter()
        .all(|rows| *rows <= ROWS_PER_STATEMENT);
    write_tx!(store, "committing blobs", |tx| {
        if let (Tx::Sqlite(sqlite), true) = (&mut tx, one_query) {
            // On SQLite every statement goes in one query with the transaction's BEGIN in front
            // and its COMMIT behind: one round trip to the writer's thread.
            hashes_checked(blobs)?;
            let now = now_ms();
            let mut joined = Joined::default();
            if !blobs.is_empty() {
                let (sql, params) = blob_rows(blobs, now);
                joined.push(&sql, params);
            }
            if !edges.is_empty() {
                let (sql, params) = edge_rows(&edges);
                joined.push(&sql, params);
            }
            if !sent.is_empty() || built.is_some() {
                let (sql, params) = super::conversations::ensure_row(conversation_id, now);
                joined.push(&sql, params);
            }
            let sending = (conversation_id, request_id);
            if !sent.is_empty() {
                let (sql, params) = super::outbox::sent_rows(sending, sent, now);
                joined.push(&sql, params);
            }
            if let Some(state) = &built {
                let (sql, params) = super::outbox::checkpoint_replacement(sending, state, now);
                joined.push(&sql, params);
            }
            sqlite.end_with_next();
            return joined
                .execute(sqlite)
                .await
                .map(|_| ())
                .map_err(|source| super::owner_refusal(source, "committing blobs", sending));
        }
        put(&mut tx, blobs).await?;
        if built.is_none() {
            tx.end_with_next();
        }
        super::outbox::blobs_sent_in(&mut tx, conversation_id, request_id, sent).await?;
        if let Some(state) = built {
            let (conversation, request) = (conversation_id, request_id);
            // One statement on SQLite, and nothing after it can fail.
            tx.end_with_next();
            if sent.is_empty() {
                super::outbox::checkpoint_built_in(&mut tx, conversation, request, state).await?;
            } else {
                // The sent blobs' outbox rows made sure of the conversation's row.
                super::outbox::checkpoint_built_to_existing(&mut tx, conversation, request, state)
                    .await?;
            }
        }
        Ok(())
    })
}

/// `put` for another domain's transaction (`messages::append_opening`).
pub(super) async fn put_in(
    tx: &mut Tx,
    blobs: &[(BlobId, &[u8], &[Edge<'_>])],
) -> Result<(), StoreError> {
    put(tx, blobs).await
}

/// Stores each `(id, data, edges)` (a no-op for a blob present) after checking that every id is
/// its data's hash: blobs and edges each go in as multi-row statements, a round trip per
/// `ROWS_PER_STATEMENT` rows rather than one per row.
async fn put(tx: &mut Tx, blobs: &[(BlobId, &[u8], &[Edge<'_>])]) -> Result<(), StoreError> {
    hashes_checked(blobs)?;
    let now = now_ms();
    for chunk in blobs.chunks(ROWS_PER_STATEMENT) {
        super::run_alone(tx, blob_rows(chunk, now), "storing blobs").await?;
    }
    let edges = edges_of(blobs);
    for chunk in edges.chunks(ROWS_PER_STATEMENT) {
        super::run_alone(tx, edge_rows(chunk), "storing blob edges").await?;
    }
    Ok(())
}

/// Every id is its data's hash.
fn hashes_checked(blobs: &[(BlobId, &[u8], &[Edge<'_>])]) -> Result<(), StoreError> {
    for (id, data, _) in blobs {
        let actual = BlobId::of(data);
        if actual != *id {
            return Err(StoreError::BlobHash(HashMismatch {
                claimed: *id,
                actual,
            }));
        }
    }
    Ok(())
}

/// Each blob's edges, with the blob they leave.
fn edges_of<'a>(blobs: &'a [(BlobId, &[u8], &'a [Edge<'a>])]) -> Vec<(BlobId, &'a Edge<'a>)> {
    blobs
        .iter()
        .flat_map(|(id, _, edges)| edges.iter().map(move |edge| (*id, edge)))
        .collect()
}

/// The blobs' rows (a blob present is left as it is), to run alone or joined with other
/// statements (`sqlite::Joined`).
fn blob_rows<'a>(
    blobs: &'a [(BlobId, &'a [u8], &[Edge<'_>])],
    now: i64,
) -> (String, Vec<Param<'a>>) {
    let sql = format!(
        "INSERT INTO blobs (id, data, created_at_ms) VALUES {} ON CONFLICT DO NOTHING",
        row_placeholders(blobs.len(), 3)
    );
    let params = blobs
        .iter()
        .flat_map(|(id, data, _)| [Param::Bytes(&id.0[..]), Param::Bytes(data), Param::Int(now)])
        .collect();
    (sql, params)
}

/// The edges' rows, as `blob_rows`.
fn edge_rows<'a>(edges: &'a [(BlobId, &'a Edge<'a>)]) -> (String, Vec<Param<'a>>) {
    let sql = format!(
        "INSERT INTO blob_edges (parent, kind, ordinal, child) VALUES {} ON CONFLICT DO NOTHING",
        row_placeholders(edges.len(), 4)
    );
    let params = edges
        .iter()
        .flat_map(|(parent, edge)| {
            [
                Param::Bytes(&parent.0[..]),
                Param::Text(edge.kind),
                Param::Int(i64::from(edge.ordinal)),
                Param::Bytes(&edge.child.0[..]),
            ]
        })
        .collect();
    (sql, params)
}

pub async fn get(store: &Store, id: BlobId) -> Result<Option<Vec<u8>>, StoreError> {
    on_readers!(store, |p| sqlx::query_scalar(
        "SELECT data FROM blobs WHERE id = $1"
    )
    .bind(&id.0[..])
    .fetch_optional(p)
    .await
    .context("reading blob"))
}

/// Deletes every blob not reachable from a conversation head or base, a stored tool result's card,
/// an image a stored message shows, the outbox or one of `extra_roots`, sparing blobs younger than
/// `grace` (a run may be building a graph that no head references yet). Returns the number of blobs deleted.
pub async fn collect_garbage(
    store: &Store,
    extra_roots: &[BlobId],
    grace: Duration,
) -> Result<u64, StoreError> {
    let cutoff = now_ms() - i64::try_from(grace.as_millis()).unwrap_or(i64::MAX);
    write_tx!(store, "committing gc", |tx| match &mut tx {
        Tx::Sqlite(tx) => sqlite_gc(&mut *tx, extra_roots, cutoff).await,
        Tx::Postgres(tx) => postgres_gc(&mut *tx, extra_roots, cutoff).await,
    })
}

/// SQLite's collection: the extra roots in a temporary table, the message JSON read with
/// `json_each`, ids decoded with `unhex`.
async fn sqlite_gc(
    conn: &mut super::sqlite::SqliteTx,
    extra_roots: &[BlobId],
    cutoff: i64,
) -> Result<u64, StoreError> {
    sqlx::query("CREATE TEMP TABLE IF NOT EXISTS gc_roots (id BLOB PRIMARY KEY)")
        .execute(&mut *conn)
        .await
        .context("preparing gc")?;
    sqlx::query("DELETE FROM gc_roots")
        .execute(&mut *conn)
        .await
        .context("preparing gc")?;
    for root in extra_roots {
        sqlx::query("INSERT OR IGNORE INTO gc_roots (id) VALUES ($1)")
            .bind(&root.0[..])
            .execute(&mut *conn)
            .await
            .context("preparing gc")?;
    }
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
             UNION SELECT id FROM blobs WHERE created_at_ms >= $1
             UNION SELECT e.child FROM blob_edges e JOIN live l ON e.parent = l.id
         )
         DELETE FROM blobs WHERE id NOT IN (SELECT id FROM live)",
    )
    .bind(cutoff)
    .execute(&mut *conn)
    .await
    .context("collecting garbage")?
    .rows_affected();
    sqlx::query("DELETE FROM blob_edges WHERE parent NOT IN (SELECT id FROM blobs)")
        .execute(&mut *conn)
        .await
        .context("collecting garbage")?;
    sqlx::query("DROP TABLE gc_roots")
        .execute(&mut *conn)
        .await
        .context("finishing gc")?;
    Ok(deleted)
}

/// PostgreSQL's collection: the extra roots bound as one array, the message JSON read as `jsonb`,
/// ids decoded with `decode(…, 'hex')`. Edges go with their parent (`ON DELETE CASCADE`).
async fn postgres_gc(
    conn: &mut sqlx::PgConnection,
    extra_roots: &[BlobId],
    cutoff: i64,
) -> Result<u64, StoreError> {
    let roots: Vec<Vec<u8>> = extra_roots.iter().map(|id| id.0.to_vec()).collect();
    let deleted = sqlx::query(
        "WITH RECURSIVE live(id) AS (
             SELECT head_blob FROM conversations WHERE head_blob IS NOT NULL
             UNION SELECT base_state FROM conversations WHERE base_state IS NOT NULL
             UNION SELECT decode(body::jsonb ->> 'card', 'hex') FROM messages
                 WHERE role = 'tool' AND body::jsonb ->> 'card' IS NOT NULL
             UNION SELECT decode(i ->> 'blob', 'hex')
                 FROM messages, jsonb_array_elements(body::jsonb -> 'images') i
                 WHERE messages.role = 'user'
             UNION SELECT decode(i ->> 'blob', 'hex')
                 FROM messages, jsonb_array_elements(body::jsonb -> 'result' -> 'images') i
                 WHERE messages.role = 'tool'
             UNION SELECT unnest($2::bytea[])
             UNION SELECT blob_id FROM outbox
             UNION SELECT id FROM blobs WHERE created_at_ms >= $1
             UNION SELECT e.child FROM blob_edges e JOIN live l ON e.parent = l.id
         )
         DELETE FROM blobs WHERE id NOT IN (SELECT id FROM live WHERE id IS NOT NULL)",
    )
    .bind(cutoff)
    .bind(&roots)
    .execute(&mut *conn)
    .await
    .context("collecting garbage")?
    .rows_affected();
    Ok(deleted)
}

/// Records that the client stored `ids` for `conversation_id` (part of a publication), and that
/// they are no longer owed. On SQLite each chunk's acks and outbox rows go in one query: one round
/// trip.
async fn acks_in(tx: &mut Tx, conversation_id: &str, ids: &[BlobId]) -> Result<(), StoreError> {
    if ids.is_empty() {
        return Ok(());
    }
    let sqlite = tx.kind() == super::DatabaseKind::Sqlite;
    let mut ensure_ahead = super::conversations::ensure_now_or_ahead(tx, conversation_id).await?;
    let chunks = ids.len().div_ceil(ROWS_PER_STATEMENT);
    for (index, chunk) in ids.chunks(ROWS_PER_STATEMENT).enumerate() {
        if index + 1 < chunks {
            tx.not_last();
        }
        let mut statement = ack_rows(conversation_id, chunk);
        if sqlite {
            let cleared = super::outbox::acknowledged_rows(conversation_id, chunk);
            statement = Joined::of([statement, cleared]).into_parts();
        }
        let statement =
            super::conversations::with_ensure_ahead(&mut ensure_ahead, conversation_id, statement);
        super::run_alone(tx, statement, "recording blob acks").await?;
    }
    if sqlite {
        return Ok(());
    }
    super::outbox::blobs_acknowledged(tx, conversation_id, ids).await
}

/// The acks' rows (an ack already recorded is left as it is).
fn ack_rows<'a>(conversation_id: &'a str, ids: &'a [BlobId]) -> (String, Vec<Param<'a>>) {
    let sql = format!(
        "INSERT INTO conversation_blob_acks (conversation_id, blob_id) VALUES {}
         ON CONFLICT DO NOTHING",
        row_placeholders(ids.len(), 2)
    );
    let params = ids
        .iter()
        .flat_map(|id| [Param::Text(conversation_id), Param::Bytes(&id.0[..])])
        .collect();
    (sql, params)
}

/// Records the client's ACKs for `acked` and publishes `state` as revision `revision` (unless a
/// newer revision is the head), in one write transaction: a checkpoint is published once its
/// blobs are acknowledged, so both facts land together. Returns whether the head moved; refused
/// (`NotOwner`) when run `request_id` no longer owns the conversation.
pub async fn acknowledge_and_publish(
    store: &Store,
    (conversation_id, request_id): (&str, &str),
    acked: &[BlobId],
    state: BlobId,
    revision: i64,
) -> Result<bool, StoreError> {
    write_tx!(store, "committing conversation head", |tx| {
        acks_in(&mut tx, conversation_id, acked).await?;
        let moved = super::conversations::move_head(
            &mut tx,
            (conversation_id, request_id),
            state,
            revision,
        )
        .await?;
        if moved {
            tx.end_with_next();
            super::outbox::checkpoint_published(&mut tx, conversation_id, state).await?;
        }
        Ok(moved)
    })
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
    write_tx!(store, "committing blob acks", |tx| {
        // Nothing after the acks can fail.
        tx.end_with_next();
        acks_in(&mut tx, conversation_id, ids).await
    })
}

/// Blobs the client already holds for `conversation_id`.
pub async fn acked(store: &Store, conversation_id: &str) -> Result<Vec<BlobId>, StoreError> {
    // One row, the ids in hex: a conversation holds thousands (several per turn), and reading
    // each as a row of its own made every run start slower as the conversation grew.
    let sql = match store.backend() {
        Backend::Sqlite(_) => {
            "SELECT group_concat(hex(blob_id), ',') FROM conversation_blob_acks
             WHERE conversation_id = $1"
        }
        Backend::Postgres(_) => {
            "SELECT string_agg(encode(blob_id, 'hex'), ',') FROM conversation_blob_acks
             WHERE conversation_id = $1"
        }
    };
    let ids: Option<String> = on_readers!(store, |p| sqlx::query_scalar(sql)
        .bind(conversation_id)
        .fetch_one(p)
        .await
        .context("reading blob acks"))?;
    // Each id decoded in place: a turn-300 conversation has about 1,500, and a vector per id
    // was most of this read's cost.
    let ids = ids.unwrap_or_default();
    let mut acked = Vec::with_capacity(ids.len() / 65 + 1);
    for id in ids.split(',') {
        let mut bytes = [0u8; 32];
        if hex::decode_to_slice(id, &mut bytes).is_ok() {
            acked.push(BlobId(bytes));
        }
    }
    Ok(acked)
}

/// The children of `parent` in its field `kind`, in ordinal order (tests and diagnostics).
pub async fn children(
    store: &Store,
    parent: BlobId,
    kind: &str,
) -> Result<Vec<BlobId>, StoreError> {
    let ids: Vec<Vec<u8>> = on_readers!(store, |p| sqlx::query_scalar(
        "SELECT child FROM blob_edges WHERE parent = $1 AND kind = $2 ORDER BY ordinal",
    )
    .bind(&parent.0[..])
    .bind(kind)
    .fetch_all(p)
    .await
    .context("reading blob edges"))?;
    Ok(ids.iter().filter_map(|id| BlobId::from_slice(id)).collect())
}
