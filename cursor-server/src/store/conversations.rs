//! Conversation records: one row per Cursor `conversation_id` the server has seen.

use sqlx::SqliteConnection;

use super::{QueryContext, StoreError, now_ms};

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
