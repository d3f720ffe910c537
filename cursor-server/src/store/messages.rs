//! Append-only canonical messages: the single source of truth for a conversation's history.

use sqlx::{Row, SqliteConnection};

use super::{QueryContext, Store, StoreError, conversations, now_ms};
use crate::model::message::{CanonicalMessage, Origin};

/// Appends `messages` to the end of the conversation's history in one transaction.
pub async fn append(
    store: &Store,
    conversation_id: &str,
    request_id: &str,
    messages: &[CanonicalMessage],
) -> Result<(), StoreError> {
    let mut tx = store.pool().begin().await.context("starting transaction")?;
    append_in(&mut tx, conversation_id, request_id, messages).await?;
    tx.commit().await.context("committing messages")?;
    Ok(())
}

/// Appends inside a caller's transaction, so messages can commit atomically with other state.
pub async fn append_in(
    conn: &mut SqliteConnection,
    conversation_id: &str,
    request_id: &str,
    messages: &[CanonicalMessage],
) -> Result<(), StoreError> {
    conversations::ensure(&mut *conn, conversation_id).await?;
    let next: i64 = sqlx::query_scalar(
        "SELECT COALESCE(MAX(seq) + 1, 0) FROM messages WHERE conversation_id = ?",
    )
    .bind(conversation_id)
    .fetch_one(&mut *conn)
    .await
    .context("finding the end of history")?;
    let created = now_ms();
    for (offset, message) in messages.iter().enumerate() {
        let origin = match message {
            CanonicalMessage::User(user) => match user.origin {
                Origin::User => "user",
                Origin::Runtime => "runtime",
            },
            CanonicalMessage::Assistant(_) | CanonicalMessage::ToolCall(_) => "model",
            CanonicalMessage::ToolResult(_) => "tool",
        };
        let seq = next + i64::try_from(offset).unwrap_or(i64::MAX);
        sqlx::query(
            "INSERT INTO messages (conversation_id, seq, role, origin, body, request_id, created_at_ms)
             VALUES (?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(conversation_id)
        .bind(seq)
        .bind(message.role().as_str())
        .bind(origin)
        .bind(serde_json::to_string(message)?)
        .bind(request_id)
        .bind(created)
        .execute(&mut *conn)
        .await
        .context("appending message")?;
    }
    Ok(())
}

/// Whether the conversation has any stored history (without loading it).
pub async fn any(store: &Store, conversation_id: &str) -> Result<bool, StoreError> {
    let row = sqlx::query("SELECT 1 FROM messages WHERE conversation_id = ? LIMIT 1")
        .bind(conversation_id)
        .fetch_optional(store.pool())
        .await
        .context("checking for history")?;
    Ok(row.is_some())
}

/// The whole history of a conversation, oldest first (empty for an unknown conversation).
pub async fn load(
    store: &Store,
    conversation_id: &str,
) -> Result<Vec<CanonicalMessage>, StoreError> {
    let rows = sqlx::query("SELECT seq, body FROM messages WHERE conversation_id = ? ORDER BY seq")
        .bind(conversation_id)
        .fetch_all(store.pool())
        .await
        .context("loading history")?;
    rows.into_iter()
        .map(|row| {
            let seq: i64 = row.get("seq");
            let body: String = row.get("body");
            serde_json::from_str(&body).map_err(|source| StoreError::CorruptMessage {
                conversation_id: conversation_id.to_owned(),
                seq,
                source,
            })
        })
        .collect()
}
