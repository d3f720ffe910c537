//! Conversation records: one row per Cursor `conversation_id` the server has seen, with the head
//! (latest published checkpoint blob) and its revision.

use sqlx::Row;

use super::sqlite::Joined;
use super::{DatabaseKind, Param, QueryContext, Store, StoreError, Tx, now_ms};
use crate::model::conversation::BlobId;
use crate::model::message::CanonicalMessage;

/// Makes sure of the conversation's row now, or says it is to be done ahead of the caller's next
/// statement (`with_ensure_ahead`): on SQLite, where sqlx runs a query of several statements as one
/// command on SQLite's worker thread, and each round trip to that thread costs two thread
/// wake-ups, more than the statement itself. PostgreSQL prepares one statement per query: there
/// it is done now.
pub(crate) async fn ensure_now_or_ahead(
    tx: &mut Tx,
    conversation_id: &str,
) -> Result<bool, StoreError> {
    if tx.kind() == DatabaseKind::Sqlite {
        return Ok(true);
    }
    ensure(tx, conversation_id).await?;
    Ok(false)
}

/// `statement` (its text and values), with the conversation's `ensure` in front of it in one
/// query while `pending` (`ensure_now_or_ahead`), once: `pending` is cleared.
pub(crate) fn with_ensure_ahead<'a>(
    pending: &mut bool,
    conversation_id: &'a str,
    statement: (String, Vec<Param<'a>>),
) -> (String, Vec<Param<'a>>) {
    if !std::mem::take(pending) {
        return statement;
    }
    Joined::of([ensure_row(conversation_id, now_ms()), statement]).into_parts()
}

/// Creates the conversation row if it does not exist yet.
pub(crate) async fn ensure(tx: &mut Tx, conversation_id: &str) -> Result<(), StoreError> {
    super::run_alone(
        tx,
        ensure_row(conversation_id, now_ms()),
        "creating conversation",
    )
    .await?;
    Ok(())
}

/// `ensure`'s statement, to run alone or joined with others (`sqlite::Joined`).
pub(crate) fn ensure_row(conversation_id: &str, now: i64) -> (String, Vec<Param<'_>>) {
    (
        "INSERT INTO conversations (id, created_at_ms) VALUES ($1, $2) ON CONFLICT DO NOTHING"
            .to_owned(),
        vec![Param::Text(conversation_id), Param::Int(now)],
    )
}

/// `lock`, or on SQLite (where the one writer is the lock) says its `ensure` is to go ahead of the
/// caller's next statement (`with_ensure_ahead`).
pub(crate) async fn lock_now_or_ahead(
    tx: &mut Tx,
    conversation_id: &str,
) -> Result<bool, StoreError> {
    let ahead = ensure_now_or_ahead(tx, conversation_id).await?;
    lock_existing(tx, conversation_id).await?;
    Ok(ahead)
}

/// Creates the conversation row if needed and, on PostgreSQL, locks it until the transaction
/// ends: writers of one conversation's history take turns, so the end of history they read is the
/// end they write after (SQLite has one writer at a time already).
pub(crate) async fn lock(tx: &mut Tx, conversation_id: &str) -> Result<(), StoreError> {
    ensure(tx, conversation_id).await?;
    lock_existing(tx, conversation_id).await
}

/// `lock` of a conversation whose row this transaction has already made sure of (a run's start).
pub(crate) async fn lock_existing(tx: &mut Tx, conversation_id: &str) -> Result<(), StoreError> {
    if let Tx::Postgres(tx) = tx {
        sqlx::query("SELECT 1 FROM conversations WHERE id = $1 FOR UPDATE")
            .bind(conversation_id)
            .execute(&mut **tx)
            .await
            .context("locking the conversation")?;
    }
    Ok(())
}

/// The conversation's latest published checkpoint blob and its revision.
pub async fn head(
    store: &Store,
    conversation_id: &str,
) -> Result<Option<(BlobId, i64)>, StoreError> {
    let row: Option<(Option<Vec<u8>>, i64)> = on_readers!(store, |p| sqlx::query_as(
        "SELECT head_blob, revision FROM conversations WHERE id = $1"
    )
    .bind(conversation_id)
    .fetch_optional(p)
    .await
    .context("reading conversation head"))?;
    Ok(row.and_then(|(blob, revision)| {
        blob.as_deref()
            .and_then(BlobId::from_slice)
            .map(|id| (id, revision))
    }))
}

/// Moves the head to `blob` as revision `revision`, unless a newer revision is already there
/// (late events of an older run never move a newer head), and refused (`NotOwner`) to a run that
/// no longer owns the conversation. Returns whether the head moved. Part of
/// a checkpoint's publication (`blobs::acknowledge_and_publish`), which also settles the outbox in
/// the same transaction.
pub(super) async fn move_head(
    tx: &mut Tx,
    (conversation_id, request_id): (&str, &str),
    blob: BlobId,
    revision: i64,
) -> Result<bool, StoreError> {
    // `head_request_id` names the run that moves the head: the database refuses it unless that
    // run owns the conversation (migration 0013).
    let moved = on_tx!(tx, |c| {
        sqlx::query(
            "UPDATE conversations SET head_blob = $1, revision = $2, head_request_id = $4
             WHERE id = $3 AND revision < $2",
        )
        .bind(&blob.0[..])
        .bind(revision)
        .bind(conversation_id)
        .bind(request_id)
        .execute(c)
        .await
        .map(|done| done.rows_affected())
        .map_err(|source| {
            super::owner_refusal(
                source,
                "moving conversation head",
                (conversation_id, request_id),
            )
        })
    })?;
    Ok(moved == 1)
}

/// What a run start reads of the conversation's row: its head (`head`) and its base (`base`), in
/// one read, with how many blob ACKs are recorded for it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Recorded {
    /// The latest published checkpoint blob and its revision.
    pub head: Option<(BlobId, i64)>,
    /// Where the conversation's graph starts (`sync/projection.rs`): its base state blob and how
    /// many stored messages that base covers; `None` until the first run sets it.
    pub base: Option<(BlobId, usize)>,
    pub acks: usize,
}

/// The conversation's head (as `head` gives it), its base (its state blob and the messages it
/// covers) and its number of blob ACKs, in one statement (a run start's reads are each a round trip to the database's connection).
pub async fn recorded(store: &Store, conversation_id: &str) -> Result<Recorded, StoreError> {
    type Row = (Option<Vec<u8>>, i64, Option<Vec<u8>>, i64, i64);
    let row: Option<Row> = on_readers!(store, |p| sqlx::query_as(
        "SELECT head_blob, revision, base_state, base_messages,
             (SELECT COUNT(*) FROM conversation_blob_acks WHERE conversation_id = $1)
         FROM conversations WHERE id = $1"
    )
    .bind(conversation_id)
    .fetch_optional(p)
    .await
    .context("reading the conversation's head and base"))?;
    let Some((head, revision, base, covers, acks)) = row else {
        return Ok(Recorded::default());
    };
    Ok(Recorded {
        head: head
            .as_deref()
            .and_then(BlobId::from_slice)
            .map(|id| (id, revision)),
        base: base
            .as_deref()
            .and_then(BlobId::from_slice)
            .map(|id| (id, usize::try_from(covers).unwrap_or(0))),
        acks: usize::try_from(acks).unwrap_or(0),
    })
}

/// Sets the graph's base (a blob stored in the same transaction); a base already set is kept (the
/// first run decides it). Returns the base in force.
pub(super) async fn set_base_in(
    tx: &mut Tx,
    conversation_id: &str,
    state: BlobId,
    covers: usize,
) -> Result<(BlobId, usize), StoreError> {
    // The row exists (the caller made sure of it in this transaction); a base already set is read
    // back only when the update found one.
    let (blob, covers): (Vec<u8>, i64) = on_tx!(tx, |c| {
        let set: Option<(Vec<u8>, i64)> = sqlx::query_as(
            "UPDATE conversations SET base_state = $1, base_messages = $2
             WHERE id = $3 AND base_state IS NULL
             RETURNING base_state, base_messages",
        )
        .bind(&state.0[..])
        .bind(i64::try_from(covers).unwrap_or(i64::MAX))
        .bind(conversation_id)
        .fetch_optional(&mut *c)
        .await
        .context("setting the graph's base")?;
        match set {
            Some(set) => set,
            None => {
                sqlx::query_as("SELECT base_state, base_messages FROM conversations WHERE id = $1")
                    .bind(conversation_id)
                    .fetch_one(&mut *c)
                    .await
                    .context("reading the graph's base")?
            }
        }
    });
    Ok((
        BlobId::from_slice(&blob).unwrap_or(state),
        usize::try_from(covers).unwrap_or(0),
    ))
}

/// Calls `each` with the id of every conversation the store has a row of (every one with
/// messages, a base, a head, blobs owed or acknowledged, or a run), one row at a time (a store
/// may have hundreds of thousands); returns how many.
pub async fn each_id(store: &Store, mut each: impl FnMut(&str)) -> Result<usize, StoreError> {
    use futures_util::TryStreamExt as _;
    const SQL: &str = "SELECT id FROM conversations";
    let mut count = 0;
    on_readers!(store, |p| {
        let mut rows = sqlx::query_scalar::<_, String>(SQL).fetch(p);
        while let Some(id) = rows.try_next().await.context("listing the conversations")? {
            each(&id);
            count += 1;
        }
        Ok::<(), StoreError>(())
    })?;
    Ok(count)
}

/// Every state blob a conversation's graph hangs from: heads, bases and checkpoints built but not
/// published (outbox), of every conversation (garbage collection's roots).
pub async fn graph_tops(store: &Store) -> Result<Vec<BlobId>, StoreError> {
    let ids: Vec<Vec<u8>> = on_readers!(store, |p| sqlx::query_scalar(
        "SELECT head_blob AS id FROM conversations WHERE head_blob IS NOT NULL
         UNION SELECT base_state FROM conversations WHERE base_state IS NOT NULL
         UNION SELECT blob_id FROM outbox WHERE kind = 'checkpoint'",
    )
    .fetch_all(p)
    .await
    .context("listing graph tops"))?;
    Ok(ids.iter().filter_map(|id| BlobId::from_slice(id)).collect())
}

/// A conversation as the console lists it.
#[derive(Debug, Clone, PartialEq)]
pub struct ConversationSummary {
    pub id: String,
    /// The first user message's text (its start), if it has one.
    pub title: Option<String>,
    pub runs: u64,
    pub messages: u64,
    pub last_activity_ms: i64,
}

/// Conversations, most recently active first (`limit` at most, before `before_ms` if given).
pub async fn list(
    store: &Store,
    before_ms: Option<i64>,
    limit: u32,
) -> Result<Vec<ConversationSummary>, StoreError> {
    list_of(store, None, before_ms, limit).await
}

/// `list`, only the conversations of `owner` when one is given (`[auth]`: a member's own).
pub async fn list_of(
    store: &Store,
    owner: Option<&str>,
    before_ms: Option<i64>,
    limit: u32,
) -> Result<Vec<ConversationSummary>, StoreError> {
    // The latest of the conversation's creation and its runs' starts (written as a CASE: SQLite's
    // two-argument MAX is PostgreSQL's GREATEST).
    const SQL: &str = "SELECT * FROM (
        SELECT c.id,
            (SELECT m.body FROM messages m WHERE m.conversation_id = c.id AND m.origin = 'user'
              ORDER BY m.seq LIMIT 1) AS first_user,
            (SELECT COUNT(*) FROM runs r WHERE r.conversation_id = c.id) AS runs,
            (SELECT COUNT(*) FROM messages m WHERE m.conversation_id = c.id) AS messages,
            (SELECT CASE WHEN MAX(r.started_at_ms) > c.created_at_ms THEN MAX(r.started_at_ms)
                         ELSE c.created_at_ms END
               FROM runs r WHERE r.conversation_id = c.id) AS last_activity_ms
        FROM conversations c WHERE ($3 IS NULL OR c.owner_user = $3)) s
     WHERE ($1 IS NULL OR last_activity_ms < $1)
     ORDER BY last_activity_ms DESC, id LIMIT $2";
    on_readers!(store, |p| {
        let rows = sqlx::query(SQL)
            .bind(before_ms)
            .bind(i64::from(limit))
            .bind(owner)
            .fetch_all(p)
            .await
            .context("listing conversations")?;
        Ok(rows
            .iter()
            .map(|row| {
                let first: Option<String> = row.get("first_user");
                ConversationSummary {
                    id: row.get("id"),
                    title: first.as_deref().and_then(title_of),
                    runs: row.get::<i64, _>("runs").max(0) as u64,
                    messages: row.get::<i64, _>("messages").max(0) as u64,
                    last_activity_ms: row.get("last_activity_ms"),
                }
            })
            .collect())
    })
}

/// The first non-empty line of a stored user message's text (80 characters at most).
fn title_of(body: &str) -> Option<String> {
    let Ok(CanonicalMessage::User(message)) = serde_json::from_str(body) else {
        return None;
    };
    let line = message
        .text
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())?;
    Some(line.chars().take(80).collect())
}
