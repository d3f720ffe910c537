//! Append-only canonical messages: the single source of truth for a conversation's history.

use super::blobs::{self, BaseWrite, Edge};
use super::runs::{self, RunStart};
use super::{
    Param, QueryContext, ROWS_PER_STATEMENT, Store, StoreError, Tx, conversations, now_ms,
};
use crate::model::conversation::BlobId;
use crate::model::message::{CanonicalMessage, Origin};
use crate::model::runtime_tag::RuntimeTag;

/// Appends `messages` to the end of the conversation's history in one transaction.
pub async fn append(
    store: &Store,
    conversation_id: &str,
    request_id: &str,
    messages: &[CanonicalMessage],
) -> Result<(), StoreError> {
    write_tx!(store, "committing messages", |tx| {
        let ensure_ahead = conversations::lock_now_or_ahead(&mut tx, conversation_id).await?;
        tx.end_with_next();
        let rows = rows_of(messages, None);
        insert_rows(&mut tx, (conversation_id, request_id), &rows, ensure_ahead).await
    })
}

/// Appends the runtime messages of `before` whose events this conversation has not consumed yet,
/// then `messages`, then those of `after`, in one transaction. Returns every message appended, in
/// order.
pub async fn append_with_tags(
    store: &Store,
    conversation_id: &str,
    request_id: &str,
    before: &[RuntimeTag],
    messages: &[CanonicalMessage],
    after: &[RuntimeTag],
) -> Result<Vec<CanonicalMessage>, StoreError> {
    write_tx!(store, "committing messages", |tx| {
        // Locked before the events are checked: two writers never both find one unconsumed.
        conversations::lock(&mut tx, conversation_id).await?;
        append_with_tags_in(
            &mut tx,
            (conversation_id, request_id),
            before,
            messages,
            after,
        )
        .await
    })
}

/// `append_with_tags` inside a transaction that holds the conversation's lock
/// (`conversations::lock`): for a unit of work that writes more than history (`commit.rs`).
pub(super) async fn append_with_tags_in(
    tx: &mut Tx,
    (conversation_id, request_id): (&str, &str),
    before: &[RuntimeTag],
    messages: &[CanonicalMessage],
    after: &[RuntimeTag],
) -> Result<Vec<CanonicalMessage>, StoreError> {
    let mut appended = Vec::with_capacity(before.len() + messages.len() + after.len());
    append_tags(tx, conversation_id, request_id, before, &mut appended).await?;
    insert(tx, conversation_id, request_id, messages, None).await?;
    appended.extend_from_slice(messages);
    append_tags(tx, conversation_id, request_id, after, &mut appended).await?;
    Ok(appended)
}

/// What a run commits with its first messages, in their write transaction: its record (from here
/// on it is the conversation's one writer), the graph's base of a conversation new to the graph,
/// the blobs the messages add to the graph (those sent to the client recorded as owed), and how
/// much history it read before it owned the conversation.
#[derive(Debug, Clone)]
pub struct Opening<'a> {
    pub start: RunStart<'a>,
    pub base: Option<BaseWrite<'a>>,
    /// The number of messages the run read: they must still be the whole history, else another
    /// run wrote in between and the opening is read again (`StoreError::HistoryMoved`).
    pub read: usize,
    pub blobs: &'a [(BlobId, &'a [u8], &'a [Edge<'a>])],
    pub sent: &'a [BlobId],
}

/// A run's first messages (a user's message with its runtime messages, `before` and `after` it,
/// whose events `unconsumed` found new): the run's start, the base, the messages and their blobs
/// land in one write transaction, so a run start is one commit. Returns every message appended, in
/// order.
pub async fn append_opening(
    store: &Store,
    opening: &Opening<'_>,
    before: &[RuntimeTag],
    messages: &[CanonicalMessage],
    after: &[RuntimeTag],
) -> Result<Vec<CanonicalMessage>, StoreError> {
    let (conversation_id, request_id) = (opening.start.conversation_id, opening.start.request_id);
    let tagged: Vec<CanonicalMessage> = before.iter().map(RuntimeTag::message).collect();
    let tagged_after: Vec<CanonicalMessage> = after.iter().map(RuntimeTag::message).collect();
    let rows: Vec<(&CanonicalMessage, Option<&str>)> = before
        .iter()
        .zip(&tagged)
        .map(|(tag, message)| (message, Some(tag.event_id.as_str())))
        .chain(messages.iter().map(|message| (message, None)))
        .chain(
            after
                .iter()
                .zip(&tagged_after)
                .map(|(tag, message)| (message, Some(tag.event_id.as_str()))),
        )
        .collect();
    let moved = || StoreError::HistoryMoved {
        conversation_id: conversation_id.to_owned(),
        request_id: request_id.to_owned(),
    };
    write_tx!(
        store,
        "committing the run's start and first messages",
        |tx| {
            runs::start_in(&mut tx, &opening.start).await?;
            if let Some(base) = &opening.base {
                let (in_force, _) = blobs::put_base_in(&mut tx, conversation_id, base).await?;
                if in_force != base.state.0 {
                    return Err(moved());
                }
            }
            conversations::lock_existing(&mut tx, conversation_id).await?;
            let read = i64::try_from(opening.read).unwrap_or(i64::MAX);
            if end(&mut tx, conversation_id).await? != read {
                return Err(moved());
            }
            insert_rows_at(&mut tx, (conversation_id, request_id), &rows, read).await?;
            blobs::put_in(&mut tx, opening.blobs).await?;
            // The run's record made sure of the conversation's row. Nothing after can fail.
            tx.end_with_next();
            super::outbox::blobs_sent_to_existing(
                &mut tx,
                (conversation_id, request_id),
                opening.sent,
            )
            .await?;
            Ok(())
        }
    )?;
    Ok(rows
        .into_iter()
        .map(|(message, _)| message.clone())
        .collect())
}

/// The next sequence number of the conversation's history (its length: sequences have no gaps).
async fn end(tx: &mut Tx, conversation_id: &str) -> Result<i64, StoreError> {
    end_after(tx, conversation_id, false).await
}

/// `end`; with `ensure_ahead`, the conversation's `ensure` goes in the same query, in front
/// (`conversations::with_ensure_ahead`).
async fn end_after(
    tx: &mut Tx,
    conversation_id: &str,
    mut ensure_ahead: bool,
) -> Result<i64, StoreError> {
    // Never the transaction's last: its row is read after.
    tx.not_last();
    let read = (
        "SELECT COALESCE(MAX(seq) + 1, 0) FROM messages WHERE conversation_id = $1".to_owned(),
        vec![Param::Text(conversation_id)],
    );
    let (sql, params) = conversations::with_ensure_ahead(&mut ensure_ahead, conversation_id, read);
    on_tx!(&mut *tx, |c| super::bound(
        &params,
        sqlx::query(sqlx::AssertSqlSafe(sql))
    )
    .fetch_one(c)
    .await
    .and_then(|row| sqlx::Row::try_get::<i64, _>(&row, 0))
    .context("finding the end of history"))
}

async fn append_tags(
    tx: &mut Tx,
    conversation_id: &str,
    request_id: &str,
    tags: &[RuntimeTag],
    appended: &mut Vec<CanonicalMessage>,
) -> Result<(), StoreError> {
    for tag in tags {
        let consumed = on_tx!(&mut *tx, |c| sqlx::query(
            "SELECT 1 FROM messages WHERE conversation_id = $1 AND runtime_event_id = $2",
        )
        .bind(conversation_id)
        .bind(&tag.event_id)
        .fetch_optional(c)
        .await
        .context("checking a runtime event")?
        .is_some());
        if consumed {
            tracing::debug!(conversation_id, event = %tag.event_id, "runtime event already in history");
            continue;
        }
        let message = tag.message();
        insert(
            &mut *tx,
            conversation_id,
            request_id,
            std::slice::from_ref(&message),
            Some(&tag.event_id),
        )
        .await?;
        appended.push(message);
    }
    Ok(())
}

/// Inserts `messages` after the end of history. The caller holds the conversation's lock
/// (`conversations::lock`), so the end read here is still the end when the rows land; the primary
/// key (conversation, seq) refuses a duplicate whatever happens.
async fn insert(
    tx: &mut Tx,
    conversation_id: &str,
    request_id: &str,
    messages: &[CanonicalMessage],
    runtime_event_id: Option<&str>,
) -> Result<(), StoreError> {
    let rows = rows_of(messages, runtime_event_id);
    insert_rows(tx, (conversation_id, request_id), &rows, false).await
}

/// `messages`, each with `runtime_event_id`.
fn rows_of<'a>(
    messages: &'a [CanonicalMessage],
    runtime_event_id: Option<&'a str>,
) -> Vec<(&'a CanonicalMessage, Option<&'a str>)> {
    messages
        .iter()
        .map(|message| (message, runtime_event_id))
        .collect()
}

/// `insert` of messages each with its own runtime event (or none), as multi-row statements; with
/// `ensure_ahead`, the conversation's `ensure` goes with the read of the end of history.
async fn insert_rows(
    tx: &mut Tx,
    (conversation_id, request_id): (&str, &str),
    rows: &[(&CanonicalMessage, Option<&str>)],
    ensure_ahead: bool,
) -> Result<(), StoreError> {
    if rows.is_empty() {
        if ensure_ahead {
            conversations::ensure(tx, conversation_id).await?;
        }
        return Ok(());
    }
    let next = end_after(tx, conversation_id, ensure_ahead).await?;
    insert_rows_at(tx, (conversation_id, request_id), rows, next).await
}

/// `insert_rows` where the end of history (`next`) is already read in this transaction.
async fn insert_rows_at(
    tx: &mut Tx,
    (conversation_id, request_id): (&str, &str),
    rows: &[(&CanonicalMessage, Option<&str>)],
    next: i64,
) -> Result<(), StoreError> {
    let created = now_ms();
    let mut seq = next;
    let chunks = rows.len().div_ceil(ROWS_PER_STATEMENT);
    for (index, chunk) in rows.chunks(ROWS_PER_STATEMENT).enumerate() {
        if index + 1 < chunks {
            tx.not_last();
        }
        let mut bound = Vec::with_capacity(chunk.len());
        for (message, runtime_event_id) in chunk {
            let origin = match message {
                CanonicalMessage::User(user) => match user.origin {
                    Origin::User => "user",
                    Origin::Runtime => "runtime",
                },
                CanonicalMessage::Assistant(_) | CanonicalMessage::ToolCall(_) => "model",
                CanonicalMessage::ToolResult(_) => "tool",
            };
            let body = serde_json::to_string(message)?;
            let meta = tool_meta(message)?;
            bound.push((
                seq,
                message.role().as_str(),
                origin,
                body,
                *runtime_event_id,
                meta,
            ));
            seq += 1;
        }
        let sql = format!(
            "INSERT INTO messages
                 (conversation_id, seq, role, origin, body, request_id, created_at_ms, runtime_event_id, tool_meta)
             VALUES {}",
            super::row_placeholders(bound.len(), 9)
        );
        let inserted = on_tx!(&mut *tx, |c| {
            let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
            for (seq, role, origin, body, event, meta) in &bound {
                query = query
                    .bind(conversation_id)
                    .bind(*seq)
                    .bind(*role)
                    .bind(*origin)
                    .bind(body)
                    .bind(request_id)
                    .bind(created)
                    .bind(*event)
                    .bind(meta);
            }
            query.execute(c).await.map(|done| done.rows_affected())
        });
        inserted.map_err(|source| {
            super::owner_refusal(source, "appending message", (conversation_id, request_id))
        })?;
    }
    Ok(())
}

/// The tags of `tags` whose runtime events `conversation_id` has not consumed yet (read before a
/// run owns the conversation: `append_opening` stores them only if history did not move since).
pub async fn unconsumed(
    store: &Store,
    conversation_id: &str,
    tags: &[RuntimeTag],
) -> Result<Vec<RuntimeTag>, StoreError> {
    if tags.is_empty() {
        return Ok(Vec::new());
    }
    let sql = format!(
        "SELECT runtime_event_id FROM messages WHERE conversation_id = $1 AND runtime_event_id IN ({})",
        super::list_placeholders(2, tags.len())
    );
    let consumed: Vec<String> = on_readers!(store, |p| {
        let mut query = sqlx::query_scalar(sqlx::AssertSqlSafe(sql)).bind(conversation_id);
        for tag in tags {
            query = query.bind(&tag.event_id);
        }
        query.fetch_all(p).await.context("checking runtime events")
    })?;
    Ok(tags
        .iter()
        .filter(|tag| !consumed.contains(&tag.event_id))
        .cloned()
        .collect())
}

/// `unconsumed` of the runtime events before a message and those after it, in one statement.
pub async fn unconsumed_around(
    store: &Store,
    conversation_id: &str,
    before: Vec<RuntimeTag>,
    after: Vec<RuntimeTag>,
) -> Result<(Vec<RuntimeTag>, Vec<RuntimeTag>), StoreError> {
    let split = before.len();
    let mut tags = before;
    tags.extend(after);
    let new = unconsumed(store, conversation_id, &tags).await?;
    let is_new = |tag: &RuntimeTag| new.iter().any(|n| n.event_id == tag.event_id);
    let after = tags.split_off(split);
    Ok((
        tags.into_iter().filter(is_new).collect(),
        after.into_iter().filter(is_new).collect(),
    ))
}

/// Whether the conversation has any stored history (without loading it).
pub async fn any(store: &Store, conversation_id: &str) -> Result<bool, StoreError> {
    let row: Option<i32> = on_readers!(store, |p| sqlx::query_scalar(
        "SELECT 1 FROM messages WHERE conversation_id = $1 LIMIT 1"
    )
    .bind(conversation_id)
    .fetch_optional(p)
    .await
    .context("checking for history"))?;
    Ok(row.is_some())
}

/// A stored message with the run that appended it.
#[derive(Debug, Clone, PartialEq)]
pub struct Stored {
    pub request_id: String,
    pub message: CanonicalMessage,
}

/// The whole history of a conversation, oldest first (empty for an unknown conversation).
pub async fn load(
    store: &Store,
    conversation_id: &str,
) -> Result<Vec<CanonicalMessage>, StoreError> {
    Ok(load_rows(store, conversation_id)
        .await?
        .into_iter()
        .map(|row| row.message)
        .collect())
}

/// The whole history with the run that appended each message (the checkpoint's projection reads
/// turns from it).
pub async fn load_rows(store: &Store, conversation_id: &str) -> Result<Vec<Stored>, StoreError> {
    Ok(load_rows_from(store, conversation_id, 0)
        .await?
        .into_iter()
        .map(|(_, row)| row)
        .collect())
}

/// The history from sequence number `from` on, each message with its sequence number (a run
/// start that holds the messages before `from` reads only the rest: messages are never rewritten).
pub async fn load_rows_from(
    store: &Store,
    conversation_id: &str,
    from: i64,
) -> Result<Vec<(i64, Stored)>, StoreError> {
    type Row = (i64, String, Option<String>, String);
    let rows: Vec<Row> = on_readers!(store, |p| sqlx::query_as(
        "SELECT seq, body, tool_meta, request_id FROM messages
         WHERE conversation_id = $1 AND seq >= $2 ORDER BY seq",
    )
    .bind(conversation_id)
    .bind(from)
    .fetch_all(p)
    .await
    .context("loading history"))?;
    rows.into_iter()
        .map(|(seq, body, meta, request_id)| {
            let corrupt = |source| StoreError::CorruptMessage {
                conversation_id: conversation_id.to_owned(),
                seq,
                source,
            };
            let mut message: CanonicalMessage = serde_json::from_str(&body).map_err(corrupt)?;
            if let (CanonicalMessage::ToolResult(record), Some(meta)) = (&mut message, meta) {
                record.result.meta = Some(serde_json::from_str(&meta).map_err(corrupt)?);
            }
            Ok((
                seq,
                Stored {
                    request_id,
                    message,
                },
            ))
        })
        .collect()
}

/// The typed metadata stored beside a tool result (`NULL` for every other message).
fn tool_meta(message: &CanonicalMessage) -> Result<Option<String>, StoreError> {
    match message {
        CanonicalMessage::ToolResult(record) => Ok(record
            .result
            .meta
            .as_ref()
            .map(serde_json::to_string)
            .transpose()?),
        _ => Ok(None),
    }
}

/// SQLite's own history: rows stored before a migration, read by it. The invariants both
/// backends share are tested on both in `tests/store.rs`.
#[cfg(test)]
mod tests {
    use super::*;

    /// A Task call and its result as version 4 stored them (no metadata column yet).
    async fn old_task_rows(
        pool: &sqlx::SqlitePool,
        seq: i64,
        call_id: &str,
        description: &str,
        result: &str,
        is_error: bool,
    ) {
        use crate::model::message::{ToolCallRecord, ToolResultRecord};
        use crate::model::tool::{ToolCall, ToolResult};
        let call = CanonicalMessage::ToolCall(ToolCallRecord {
            model_call_id: "m".into(),
            index: 0,
            call: ToolCall {
                call_id: call_id.into(),
                provider_call_id: call_id.into(),
                name: "Task".into(),
                arguments: format!(r#"{{"description":"{description}","prompt":"go"}}"#),
            },
        });
        let result = CanonicalMessage::ToolResult(ToolResultRecord {
            card: None,
            model_call_id: "m".into(),
            index: 0,
            result: ToolResult {
                images: Vec::new(),
                call_id: call_id.into(),
                content: result.into(),
                is_error,
                meta: None,
            },
        });
        for (offset, message) in [call, result].iter().enumerate() {
            sqlx::query(
                "INSERT INTO messages (conversation_id, seq, role, origin, body, request_id, created_at_ms)
                 VALUES ('c', ?, ?, ?, ?, 'r', 0)",
            )
            .bind(seq + offset as i64)
            .bind(message.role().as_str())
            .bind(if offset == 0 { "model" } else { "tool" })
            .bind(serde_json::to_string(message).unwrap())
            .execute(pool)
            .await
            .unwrap();
        }
    }

    #[tokio::test]
    async fn subagent_state_of_rows_stored_before_tool_metadata_is_read_by_the_migration() {
        use crate::model::conversation::SubagentStatus;
        use crate::prompting::derived_state::fold_subagent_runs;
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}?mode=rwc", dir.path().join("old.db").display());
        let pool = sqlx::SqlitePool::connect(&url).await.unwrap();
        sqlx::migrate!("./migrations")
            .run_to(4, &pool)
            .await
            .unwrap();
        sqlx::query("INSERT INTO conversations (id, created_at_ms) VALUES ('c', 0)")
            .execute(&pool)
            .await
            .unwrap();
        let background =
            "[subagent agent-7 is running in the background; you will be told when it finishes]";
        let finished = "[subagent agent-8 finished after 3 tool calls; call Task with resume: \"agent-8\" to continue it]\n\nFound it.";
        old_task_rows(&pool, 0, "t1", "Find the parser", background, false).await;
        old_task_rows(&pool, 2, "t2", "Fix the test", finished, false).await;
        old_task_rows(
            &pool,
            4,
            "t3",
            "Break it",
            "Error: the subagent agent-9 failed: no",
            true,
        )
        .await;
        pool.close().await;

        let store = Store::open(&format!("sqlite://{}", dir.path().join("old.db").display()))
            .await
            .unwrap();
        let history = load(&store, "c").await.unwrap();
        let runs: Vec<_> = fold_subagent_runs(&history, [])
            .into_iter()
            .map(|r| (r.parent_tool_call_id, r.title, r.agent_id, r.status))
            .collect();
        assert_eq!(
            runs,
            [
                (
                    "t1".into(),
                    "Find the parser".into(),
                    Some("agent-7".into()),
                    SubagentStatus::Backgrounded
                ),
                (
                    "t2".into(),
                    "Fix the test".into(),
                    Some("agent-8".into()),
                    SubagentStatus::Succeeded
                ),
                ("t3".into(), "Break it".into(), None, SubagentStatus::Failed),
            ]
        );
    }
}
