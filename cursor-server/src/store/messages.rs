//! Append-only canonical messages: the single source of truth for a conversation's history.

use sqlx::{Row, SqliteConnection};

use super::{QueryContext, Store, StoreError, conversations, now_ms};
use crate::model::message::{CanonicalMessage, Origin};
use crate::model::runtime_tag::RuntimeTag;

/// Appends `messages` to the end of the conversation's history in one transaction.
pub async fn append(
    store: &Store,
    conversation_id: &str,
    request_id: &str,
    messages: &[CanonicalMessage],
) -> Result<(), StoreError> {
    let mut tx = store.begin_write().await?;
    append_in(&mut tx, conversation_id, request_id, messages).await?;
    tx.commit().await.context("committing messages")?;
    Ok(())
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
    let mut tx = store.begin_write().await?;
    let mut appended = Vec::with_capacity(before.len() + messages.len() + after.len());
    append_tags(&mut tx, conversation_id, request_id, before, &mut appended).await?;
    append_in(&mut tx, conversation_id, request_id, messages).await?;
    appended.extend_from_slice(messages);
    append_tags(&mut tx, conversation_id, request_id, after, &mut appended).await?;
    tx.commit().await.context("committing messages")?;
    Ok(appended)
}

async fn append_tags(
    conn: &mut SqliteConnection,
    conversation_id: &str,
    request_id: &str,
    tags: &[RuntimeTag],
    appended: &mut Vec<CanonicalMessage>,
) -> Result<(), StoreError> {
    for tag in tags {
        let consumed = sqlx::query(
            "SELECT 1 FROM messages WHERE conversation_id = ? AND runtime_event_id = ?",
        )
        .bind(conversation_id)
        .bind(&tag.event_id)
        .fetch_optional(&mut *conn)
        .await
        .context("checking a runtime event")?
        .is_some();
        if consumed {
            tracing::debug!(conversation_id, event = %tag.event_id, "runtime event already in history");
            continue;
        }
        let message = tag.message();
        insert(
            &mut *conn,
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

/// Appends inside a caller's transaction, so messages can commit atomically with other state.
async fn append_in(
    conn: &mut SqliteConnection,
    conversation_id: &str,
    request_id: &str,
    messages: &[CanonicalMessage],
) -> Result<(), StoreError> {
    insert(conn, conversation_id, request_id, messages, None).await
}

async fn insert(
    conn: &mut SqliteConnection,
    conversation_id: &str,
    request_id: &str,
    messages: &[CanonicalMessage],
    runtime_event_id: Option<&str>,
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
            "INSERT INTO messages
                 (conversation_id, seq, role, origin, body, request_id, created_at_ms, runtime_event_id, tool_meta)
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(conversation_id)
        .bind(seq)
        .bind(message.role().as_str())
        .bind(origin)
        .bind(serde_json::to_string(message)?)
        .bind(request_id)
        .bind(created)
        .bind(runtime_event_id)
        .bind(tool_meta(message)?)
        .execute(&mut *conn)
        .await
        .map_err(|source| match &source {
            sqlx::Error::Database(db) if db.message().contains(super::NOT_OWNER) => {
                StoreError::NotOwner {
                    conversation_id: conversation_id.to_owned(),
                    request_id: request_id.to_owned(),
                }
            }
            _ => StoreError::Query {
                context: "appending message",
                source,
            },
        })?;
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
    let rows = sqlx::query(
        "SELECT seq, body, tool_meta, request_id FROM messages WHERE conversation_id = ? ORDER BY seq",
    )
    .bind(conversation_id)
    .fetch_all(store.pool())
    .await
    .context("loading history")?;
    rows.into_iter()
        .map(|row| {
            let seq: i64 = row.get("seq");
            let corrupt = |source| StoreError::CorruptMessage {
                conversation_id: conversation_id.to_owned(),
                seq,
                source,
            };
            let body: String = row.get("body");
            let mut message: CanonicalMessage = serde_json::from_str(&body).map_err(corrupt)?;
            let meta: Option<String> = row.get("tool_meta");
            if let (CanonicalMessage::ToolResult(record), Some(meta)) = (&mut message, meta) {
                record.result.meta = Some(serde_json::from_str(&meta).map_err(corrupt)?);
            }
            Ok(Stored {
                request_id: row.get("request_id"),
                message,
            })
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::conversation::Mode;
    use crate::model::message::UserMessage;
    use crate::model::runtime_tag::RuntimeEvent;

    /// A user message typed in `mode`.
    fn user_in(mode: Option<Mode>, text: &str) -> CanonicalMessage {
        CanonicalMessage::User(UserMessage {
            images: Vec::new(),
            shown_as: None,
            state_before: None,
            origin: Origin::User,
            text: text.into(),
            client_message_id: String::new(),
            mode,
            runtime: None,
        })
    }

    async fn temp_store(dir: &tempfile::TempDir) -> Store {
        Store::open(&format!("sqlite://{}", dir.path().join("m.db").display()))
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn the_database_refuses_history_from_a_run_that_no_longer_owns_the_conversation() {
        let dir = tempfile::tempdir().unwrap();
        let store = temp_store(&dir).await;
        let user = |text: &str| user_in(None, text);
        crate::store::runs::start(&store, "old", "c", "m", "m")
            .await
            .unwrap();
        append(&store, "c", "old", &[user("first")]).await.unwrap();
        // A new message takes the conversation over while the old run is still working.
        crate::store::runs::start(&store, "new", "c", "m", "m")
            .await
            .unwrap();
        append(&store, "c", "new", &[user("second")]).await.unwrap();
        // The old run's late answer is refused by the database itself.
        let refused = append(&store, "c", "old", &[user("late answer")]).await;
        assert!(
            matches!(&refused, Err(StoreError::NotOwner { conversation_id, request_id })
                if conversation_id == "c" && request_id == "old"),
            "{refused:?}"
        );
        let texts: Vec<String> = load(&store, "c")
            .await
            .unwrap()
            .iter()
            .filter_map(|m| match m {
                CanonicalMessage::User(u) => Some(u.text.clone()),
                _ => None,
            })
            .collect();
        assert_eq!(texts, ["first", "second"]);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_runs_never_fail_with_a_locked_database() {
        let dir = tempfile::tempdir().unwrap();
        let store = temp_store(&dir).await;
        // Many runs at once, each reading before it writes in one transaction (a runtime event is
        // checked, then appended): the pattern that made deferred transactions fail with
        // SQLITE_BUSY_SNAPSHOT under load.
        let mut tasks = tokio::task::JoinSet::new();
        for run in 0..200 {
            let store = store.clone();
            tasks.spawn(async move {
                let (request, conversation) = (format!("r{run}"), format!("c{}", run % 20));
                crate::store::runs::start(&store, &request, &conversation, "m", "m").await?;
                for turn in 0..5 {
                    let tag = RuntimeTag::new(
                        RuntimeEvent::ModeReminder { mode: Mode::Agent },
                        &format!("{request}-{turn}"),
                        "reminder".into(),
                    );
                    let appended = append_with_tags(
                        &store,
                        &conversation,
                        &request,
                        &[tag],
                        &[user_in(None, "hello")],
                        &[],
                    )
                    .await;
                    match appended {
                        // A newer run took the conversation over: the refusal this test allows.
                        Err(StoreError::NotOwner { .. }) => break,
                        other => other?,
                    };
                }
                Ok::<(), StoreError>(())
            });
        }
        while let Some(result) = tasks.join_next().await {
            result.unwrap().unwrap();
        }
    }

    #[tokio::test]
    async fn a_consumed_runtime_event_is_never_appended_again() {
        let dir = tempfile::tempdir().unwrap();
        let store = temp_store(&dir).await;
        let user = |text: &str| user_in(Some(Mode::Plan), text);
        let reminder = RuntimeTag::new(
            RuntimeEvent::ModeReminder { mode: Mode::Plan },
            "req-1",
            "plan only".into(),
        );
        let first = append_with_tags(
            &store,
            "c",
            "req-1",
            &[],
            &[user("a")],
            std::slice::from_ref(&reminder),
        )
        .await
        .unwrap();
        assert_eq!(first.len(), 2);
        let again = append_with_tags(
            &store,
            "c",
            "req-1",
            std::slice::from_ref(&reminder),
            &[user("b")],
            &[],
        )
        .await
        .unwrap();
        assert_eq!(
            again,
            vec![user("b")],
            "the event was consumed by the first append"
        );
        // The index itself refuses a second row for the event, whatever the caller does.
        let mut tx = store.pool().begin().await.unwrap();
        let duplicate = insert(
            &mut tx,
            "c",
            "req-2",
            &[reminder.message()],
            Some(&reminder.event_id),
        )
        .await;
        assert!(duplicate.is_err());
        // Rolled back explicitly: a dropped transaction is rolled back lazily, and its write lock
        // could still be held when the next statement runs on another pooled connection.
        tx.rollback().await.unwrap();
        // Another conversation has its own events.
        let other = append_with_tags(&store, "d", "req-1", &[reminder], &[], &[])
            .await
            .unwrap();
        assert_eq!(other.len(), 1);
        assert_eq!(load(&store, "c").await.unwrap().len(), 3);
    }

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
