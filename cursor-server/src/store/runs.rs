//! Run records: one row per request id with its status, provider call count, usage and error; and
//! one row per provider call of a run (timing, usage, finish reason or error).

use super::sqlite::Joined;
use super::{
    Columns, DatabaseKind, Param, QueryContext, Store, StoreError, Tx, conversations, now_ms,
};
use crate::model::usage::Usage;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunStatus {
    Running,
    Succeeded,
    Failed,
    Canceled,
}

impl RunStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Running => "running",
            RunStatus::Succeeded => "succeeded",
            RunStatus::Failed => "failed",
            RunStatus::Canceled => "canceled",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "running" => Some(RunStatus::Running),
            "succeeded" => Some(RunStatus::Succeeded),
            "failed" => Some(RunStatus::Failed),
            "canceled" => Some(RunStatus::Canceled),
            _ => None,
        }
    }
}

/// How a run ended, as recorded.
#[derive(Debug, Clone)]
pub struct RunOutcome {
    pub status: RunStatus,
    pub provider_calls: u32,
    pub usage: Usage,
    /// Connect code and message for failed runs.
    pub error: Option<(String, String)>,
}

#[derive(Debug, Clone)]
pub struct RunRecord {
    pub request_id: String,
    pub conversation_id: String,
    /// The configured model the run was routed to.
    pub model_id: String,
    /// The name Cursor asked for (an alias, Auto, an exact id); `None` in runs recorded before
    /// routing was recorded.
    pub requested_model: Option<String>,
    pub outcome: RunOutcome,
}

pub async fn start(
    store: &Store,
    request_id: &str,
    conversation_id: &str,
    model_id: &str,
    requested_model: &str,
) -> Result<(), StoreError> {
    start_on(
        store,
        request_id,
        conversation_id,
        (model_id, requested_model),
        None,
    )
    .await
}

/// `start`, recording the node that runs it (`[cluster]`; `None` for a single node).
pub async fn start_on(
    store: &Store,
    request_id: &str,
    conversation_id: &str,
    (model_id, requested_model): (&str, &str),
    node: Option<&str>,
) -> Result<(), StoreError> {
    let start = RunStart {
        request_id,
        conversation_id,
        model_id,
        requested_model,
        node,
        person: None,
    };
    start_as(store, &start).await
}

/// Records `start` in its own write transaction (a run whose first write is not a message).
pub async fn start_as(store: &Store, start: &RunStart<'_>) -> Result<(), StoreError> {
    write_tx!(store, "committing run start", |tx| start_in(&mut tx, start)
        .await)
}

/// A run's record as it starts: which conversation, which model (as asked and as routed), which
/// node (`[cluster]`; `None` for a single node), whose it is (`[auth]`: the person the
/// conversation is claimed for, if nobody has it yet; `None` without `[auth]`).
#[derive(Debug, Clone, Copy)]
pub struct RunStart<'a> {
    pub request_id: &'a str,
    pub conversation_id: &'a str,
    pub model_id: &'a str,
    pub requested_model: &'a str,
    pub node: Option<&'a str>,
    pub person: Option<&'a str>,
}

/// Records the run as running and makes it the conversation's one writer, inside the caller's
/// transaction (`start_on`, or the run's first messages: `messages::append_opening`).
pub(super) async fn start_in(tx: &mut Tx, start: &RunStart<'_>) -> Result<(), StoreError> {
    let now = now_ms();
    // `RUN_RECORD`'s six, then the person (`TAKE_OVER`'s third).
    let values = [
        Param::Text(start.request_id),
        Param::Text(start.conversation_id),
        Param::Text(start.model_id),
        Param::Text(start.requested_model),
        Param::Int(now),
        Param::MaybeText(start.node),
        Param::MaybeText(start.person),
    ];
    let taken = match tx {
        // One query of three statements, one round trip to SQLite's worker thread: the row the
        // update returns says whether the conversation was taken.
        Tx::Sqlite(c) => {
            // Never the transaction's last: whether the conversation was taken is read after.
            c.not_last();
            let (sql, params) = Joined::of([
                conversations::ensure_row(start.conversation_id, now),
                (RUN_RECORD.to_owned(), values[..6].to_vec()),
                (
                    format!("{TAKE_OVER} RETURNING 1"),
                    vec![values[0], values[1], values[6]],
                ),
            ])
            .into_parts();
            let row = super::bound(&params, sqlx::query(sqlx::AssertSqlSafe(sql)))
                .fetch_optional(c)
                .await
                .context("recording run start")?;
            u64::from(row.is_some())
        }
        Tx::Postgres(_) => {
            conversations::ensure(tx, start.conversation_id).await?;
            let record = (RUN_RECORD.to_owned(), values[..6].to_vec());
            super::run_alone(tx, record, "recording run start").await?;
            let take = (TAKE_OVER.to_owned(), vec![values[0], values[1], values[6]]);
            super::run_alone(tx, take, "taking the conversation over").await?
        }
    };
    match taken {
        0 => Err(StoreError::NotYours {
            conversation_id: start.conversation_id.to_owned(),
        }),
        _ => Ok(()),
    }
}

/// The run's record, as running: $1 the run, $2 the conversation, $3 and $4 the model as routed
/// and as asked, $5 the time, $6 the node.
const RUN_RECORD: &str = "INSERT INTO runs (request_id, conversation_id, status, model_id,
         requested_model, started_at_ms, node)
     VALUES ($1, $2, 'running', $3, $4, $5, $6)";

/// From now on only run $1 adds to conversation $2's history (enforced by a trigger). With
/// `[auth]` the same statement claims a conversation nobody has for the run's person ($3) and
/// takes over only one that is theirs: no row changed means someone else's.
const TAKE_OVER: &str = "UPDATE conversations SET owner_request_id = $1,
         owner_user = COALESCE(owner_user, $3)
     WHERE id = $2 AND ($3 IS NULL OR owner_user IS NULL OR owner_user = $3)";

/// Runs a previous process left `running` (it was killed, or lost power): they can never finish,
/// so they are marked failed with the reason. Called once at start, before any run begins.
/// Returns how many there were.
pub async fn reconcile_interrupted(store: &Store) -> Result<u64, StoreError> {
    let done = on_writer!(store, |w| sqlx::query(
        "UPDATE runs SET status = 'failed', error_code = 'aborted',
             error_message = 'the server stopped while the run was in progress', finished_at_ms = $1
         WHERE status = 'running'",
    )
    .bind(now_ms())
    .execute(w)
    .await
    .map(|done| done.rows_affected())
    .context("ending the runs a stopped server left running"))?;
    Ok(done)
}

/// Records how the run ended, with the mode it ended in and the transport it came over.
pub async fn finish(
    store: &Store,
    request_id: &str,
    outcome: &RunOutcome,
    (mode, transport): (Option<&str>, &str),
) -> Result<(), StoreError> {
    let as_i64 = |v: Option<u64>| v.map(|v| i64::try_from(v).unwrap_or(i64::MAX));
    let (code, message) = match &outcome.error {
        Some((code, message)) => (Some(code.as_str()), Some(message.as_str())),
        None => (None, None),
    };
    on_writer!(store, |w| sqlx::query(
        "UPDATE runs SET status = $1, provider_calls = $2, input_tokens = $3, output_tokens = $4,
             cache_read_tokens = $5, cache_write_tokens = $6, reasoning_tokens = $7,
             error_code = $8, error_message = $9, finished_at_ms = $10, mode = $11, transport = $12
         WHERE request_id = $13",
    )
    .bind(outcome.status.as_str())
    .bind(i64::from(outcome.provider_calls))
    .bind(as_i64(outcome.usage.input_tokens))
    .bind(as_i64(outcome.usage.output_tokens))
    .bind(as_i64(outcome.usage.cache_read_tokens))
    .bind(as_i64(outcome.usage.cache_write_tokens))
    .bind(as_i64(outcome.usage.reasoning_tokens))
    .bind(code)
    .bind(message)
    .bind(now_ms())
    .bind(mode)
    .bind(transport)
    .bind(request_id)
    .execute(w)
    .await
    .map(|done| done.rows_affected())
    .context("recording run end"))?;
    Ok(())
}

pub async fn get(store: &Store, request_id: &str) -> Result<Option<RunRecord>, StoreError> {
    let filter = RunFilter {
        request_id: Some(request_id.to_owned()),
        limit: 1,
        ..RunFilter::default()
    };
    Ok(list(store, &filter).await?.pop().map(|run| run.record))
}

/// What a provider call was for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallPurpose {
    /// The model's answer in a turn.
    Turn,
    /// A summary of older history.
    Compaction,
}

impl CallPurpose {
    pub fn as_str(self) -> &'static str {
        match self {
            CallPurpose::Turn => "turn",
            CallPurpose::Compaction => "compaction",
        }
    }
}

/// One attempt of a provider call that failed before streaming and was tried again.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FailedAttempt {
    /// The HTTP status, when the provider answered.
    pub status: Option<u16>,
    pub error: String,
    /// How long the next attempt waited.
    pub delay_ms: u64,
    /// The provider key (index from 0) the attempt used; absent in records from before keys had
    /// pools.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_index: Option<usize>,
}

/// One provider call as recorded when it ended.
#[derive(Debug, Clone, PartialEq)]
pub struct ProviderCallRecord {
    pub model_call_id: String,
    pub request_id: String,
    pub conversation_id: String,
    pub provider: String,
    pub model_id: String,
    pub purpose: CallPurpose,
    pub request_bytes: u64,
    pub started_at_ms: i64,
    /// Milliseconds from the request to the first streamed event, if one came.
    pub first_event_ms: Option<u64>,
    pub total_ms: u64,
    pub usage: Usage,
    pub finish_reason: Option<String>,
    pub error: Option<String>,
    /// The attempts that failed before the one that streamed (or the last one that failed).
    pub retries: Vec<FailedAttempt>,
    /// The model whose call failed before streaming, so that this one was made instead.
    pub fallback_from: Option<String>,
    /// The provider key (index from 0, in the configured order) that answered; `None` when no
    /// attempt got an answer, and in records from before keys had pools.
    pub key_index: Option<u32>,
}

impl ProviderCallRecord {
    /// HTTP attempts the call took.
    pub fn attempts(&self) -> u32 {
        u32::try_from(self.retries.len())
            .unwrap_or(u32::MAX)
            .saturating_add(1)
    }
}

/// The statement that records a provider call `$call` (`&ProviderCallRecord`) with its retries'
/// JSON `$retries` (`&Option<String>`). A macro, so that each backend's expansion in `on_tx!` or
/// `on_writer!` is typed by its own driver.
macro_rules! provider_call_insert {
    ($call:expr, $retries:expr) => {{
        let call: &ProviderCallRecord = $call;
        let as_i64 = |v: Option<u64>| v.map(|v| i64::try_from(v).unwrap_or(i64::MAX));
        sqlx::query(
            "INSERT INTO provider_calls (model_call_id, request_id, conversation_id, provider,
                 model_id, purpose, request_bytes, started_at_ms, first_event_ms, total_ms,
                 input_tokens, output_tokens, cache_read_tokens, cache_write_tokens,
                 reasoning_tokens, finish_reason, error, attempts, retries_json, fallback_from,
                 key_index)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17,
                 $18, $19, $20, $21)",
        )
        .bind(&call.model_call_id)
        .bind(&call.request_id)
        .bind(&call.conversation_id)
        .bind(&call.provider)
        .bind(&call.model_id)
        .bind(call.purpose.as_str())
        .bind(as_i64(Some(call.request_bytes)))
        .bind(call.started_at_ms)
        .bind(as_i64(call.first_event_ms))
        .bind(as_i64(Some(call.total_ms)))
        .bind(as_i64(call.usage.input_tokens))
        .bind(as_i64(call.usage.output_tokens))
        .bind(as_i64(call.usage.cache_read_tokens))
        .bind(as_i64(call.usage.cache_write_tokens))
        .bind(as_i64(call.usage.reasoning_tokens))
        .bind(&call.finish_reason)
        .bind(&call.error)
        .bind(i64::from(call.attempts()))
        .bind($retries)
        .bind(&call.fallback_from)
        .bind(call.key_index.map(i64::from))
    }};
}

/// The call's retries as stored (`retries_json`), `None` for a call that needed none.
fn retries_json(call: &ProviderCallRecord) -> Result<Option<String>, StoreError> {
    if call.retries.is_empty() {
        return Ok(None);
    }
    Ok(Some(serde_json::to_string(&call.retries)?))
}

/// Records a provider call (`budgets::record_charged_call` also charges it to a person). One
/// statement, so no transaction around it: on SQLite one command to the writer's thread instead
/// of a `BEGIN` riding on it and a `COMMIT` after.
pub async fn record_provider_call(
    store: &Store,
    call: &ProviderCallRecord,
) -> Result<(), StoreError> {
    let retries = retries_json(call)?;
    on_writer!(store, |w| provider_call_insert!(call, &retries)
        .execute(w)
        .await
        .map(|_| ())
        .context("recording a provider call"))
}

/// Writes a provider call's record inside a write transaction.
pub(super) async fn insert_provider_call(
    tx: &mut super::Tx,
    call: &ProviderCallRecord,
) -> Result<(), StoreError> {
    let retries = retries_json(call)?;
    on_tx!(&mut *tx, |w| provider_call_insert!(call, &retries)
        .execute(w)
        .await
        .map(|_| ())
        .context("recording a provider call"))
}

/// The provider calls of a run, in the order they started.
pub async fn provider_calls(
    store: &Store,
    request_id: &str,
) -> Result<Vec<ProviderCallRecord>, StoreError> {
    on_readers!(store, |p| {
        let rows = sqlx::query(
            "SELECT * FROM provider_calls WHERE request_id = $1 ORDER BY started_at_ms, rowid",
        )
        .bind(request_id)
        .fetch_all(p)
        .await
        .context("reading provider calls")?;
        rows.iter()
            .map(|row| provider_call_of(row, request_id))
            .collect()
    })
}

fn provider_call_of(
    row: &impl Columns,
    request_id: &str,
) -> Result<ProviderCallRecord, StoreError> {
    let count = |name: &str| row.opt_int(name).map(|v| v.max(0) as u64);
    let purpose = row.text("purpose");
    let purpose = match purpose.as_str() {
        "turn" => CallPurpose::Turn,
        "compaction" => CallPurpose::Compaction,
        // The schema's CHECK constraint allows only these: anything else is corrupt.
        _ => {
            return Err(StoreError::CorruptRun {
                request_id: request_id.to_owned(),
                status: format!("provider call purpose {purpose:?}"),
            });
        }
    };
    Ok(ProviderCallRecord {
        model_call_id: row.text("model_call_id"),
        request_id: row.text("request_id"),
        conversation_id: row.text("conversation_id"),
        provider: row.text("provider"),
        model_id: row.text("model_id"),
        purpose,
        request_bytes: count("request_bytes").unwrap_or(0),
        started_at_ms: row.int("started_at_ms"),
        first_event_ms: count("first_event_ms"),
        total_ms: count("total_ms").unwrap_or(0),
        usage: usage_of(row),
        finish_reason: row.opt_text("finish_reason"),
        error: row.opt_text("error"),
        retries: match row.opt_text("retries_json") {
            Some(json) => serde_json::from_str(&json)?,
            None => Vec::new(),
        },
        fallback_from: row.opt_text("fallback_from"),
        key_index: row.opt_int("key_index").and_then(|v| u32::try_from(v).ok()),
    })
}

/// The five token counts of a `runs` or `provider_calls` row (or a sum over them).
pub(super) fn usage_of(row: &impl Columns) -> Usage {
    let tokens = |name: &str| row.opt_int(name).map(|v| v.max(0) as u64);
    Usage {
        input_tokens: tokens("input_tokens"),
        output_tokens: tokens("output_tokens"),
        cache_read_tokens: tokens("cache_read_tokens"),
        cache_write_tokens: tokens("cache_write_tokens"),
        reasoning_tokens: tokens("reasoning_tokens"),
    }
}

/// Which runs a listing shows, newest first.
#[derive(Debug, Clone, Default)]
pub struct RunFilter {
    /// One run only.
    pub request_id: Option<String>,
    pub status: Option<RunStatus>,
    pub model_id: Option<String>,
    pub conversation_id: Option<String>,
    /// Only runs started at or after this time (ms since the epoch).
    pub since_ms: Option<i64>,
    /// Only runs started before this time: the previous page's last `started_at_ms`.
    pub before_ms: Option<i64>,
    pub limit: u32,
    /// `[auth]`: only runs on conversations of this person.
    pub owner: Option<String>,
}

/// A run as a listing shows it: its record, when it started and ended, and its time to first token
/// (request → first streamed event of its first provider call).
#[derive(Debug, Clone)]
pub struct RunSummary {
    pub record: RunRecord,
    pub started_at_ms: i64,
    pub finished_at_ms: Option<i64>,
    pub first_token_ms: Option<i64>,
    /// The mode the run ended in, and its transport (`run_sse`, `http2_run`), once it ended.
    pub mode: Option<String>,
    pub transport: Option<String>,
    /// The node that ran it (`[cluster]`; `None` for a single node).
    pub node: Option<String>,
    /// `[auth]`: the person whose conversation it ran on.
    pub user: Option<String>,
}

/// Runs matching `filter`, newest first (`filter.limit` of them at most).
pub async fn list(store: &Store, filter: &RunFilter) -> Result<Vec<RunSummary>, StoreError> {
    on_readers!(store, |p| sqlx::query(
        "SELECT r.*,
            (SELECT c.started_at_ms + c.first_event_ms - r.started_at_ms FROM provider_calls c
              WHERE c.request_id = r.request_id AND c.first_event_ms IS NOT NULL
              ORDER BY c.started_at_ms, c.rowid LIMIT 1) AS first_token_ms,
            cv.owner_user
         FROM runs r LEFT JOIN conversations cv ON cv.id = r.conversation_id
         WHERE ($1 IS NULL OR r.status = $1)
           AND ($2 IS NULL OR r.model_id = $2)
           AND ($3 IS NULL OR r.conversation_id = $3)
           AND ($4 IS NULL OR r.started_at_ms >= $4)
           AND ($5 IS NULL OR r.started_at_ms < $5)
           AND ($7 IS NULL OR r.request_id = $7)
           AND ($8 IS NULL OR cv.owner_user = $8)
         ORDER BY r.started_at_ms DESC, r.request_id DESC
         LIMIT $6",
    )
    .bind(filter.status.map(RunStatus::as_str))
    .bind(filter.model_id.as_deref())
    .bind(filter.conversation_id.as_deref())
    .bind(filter.since_ms)
    .bind(filter.before_ms)
    .bind(i64::from(filter.limit))
    .bind(filter.request_id.as_deref())
    .bind(filter.owner.as_deref())
    .fetch_all(p)
    .await
    .context("listing runs")?
    .iter()
    .map(summary_of)
    .collect())
}

fn summary_of(row: &impl Columns) -> Result<RunSummary, StoreError> {
    let request_id = row.text("request_id");
    let status_text = row.text("status");
    let status = RunStatus::parse(&status_text).ok_or_else(|| StoreError::CorruptRun {
        request_id: request_id.clone(),
        status: status_text.clone(),
    })?;
    let code = row.opt_text("error_code");
    let message = row.opt_text("error_message");
    Ok(RunSummary {
        record: RunRecord {
            request_id,
            conversation_id: row.text("conversation_id"),
            model_id: row.text("model_id"),
            requested_model: row.opt_text("requested_model"),
            outcome: RunOutcome {
                status,
                provider_calls: u32::try_from(row.int("provider_calls")).unwrap_or(0),
                usage: usage_of(row),
                error: code.zip(message),
            },
        },
        started_at_ms: row.int("started_at_ms"),
        finished_at_ms: row.opt_int("finished_at_ms"),
        first_token_ms: row.opt_int("first_token_ms"),
        mode: row.opt_text("mode"),
        transport: row.opt_text("transport"),
        node: row.opt_text("node"),
        user: row.opt_text("owner_user"),
    })
}

/// Tokens of the provider calls of one day, provider and model.
#[derive(Debug, Clone, PartialEq)]
pub struct UsageRow {
    /// `YYYY-MM-DD` (UTC).
    pub day: String,
    pub provider: String,
    pub model_id: String,
    pub calls: u64,
    pub usage: Usage,
}

/// Usage per day, provider and model since `since_ms`, oldest day first.
pub async fn usage_by_day(store: &Store, since_ms: i64) -> Result<Vec<UsageRow>, StoreError> {
    // The UTC day of a time in milliseconds, in each dialect.
    let day = match store.kind() {
        DatabaseKind::Sqlite => "date(started_at_ms / 1000, 'unixepoch')",
        DatabaseKind::Postgres => {
            "to_char(to_timestamp(started_at_ms / 1000) AT TIME ZONE 'UTC', 'YYYY-MM-DD')"
        }
    };
    // SUM of BIGINT is NUMERIC on PostgreSQL: cast back (SQLite's is an integer already).
    let sql = format!(
        "SELECT {day} AS day, provider, model_id,
                COUNT(*) AS calls,
                CAST(SUM(input_tokens) AS BIGINT) AS input_tokens,
                CAST(SUM(output_tokens) AS BIGINT) AS output_tokens,
                CAST(SUM(cache_read_tokens) AS BIGINT) AS cache_read_tokens,
                CAST(SUM(cache_write_tokens) AS BIGINT) AS cache_write_tokens,
                CAST(SUM(reasoning_tokens) AS BIGINT) AS reasoning_tokens
         FROM provider_calls WHERE started_at_ms >= $1
         GROUP BY day, provider, model_id ORDER BY day, provider, model_id"
    );
    on_readers!(store, |p| Ok(sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(since_ms)
        .fetch_all(p)
        .await
        .context("summing usage")?
        .iter()
        .map(|row| UsageRow {
            day: row.text("day"),
            provider: row.text("provider"),
            model_id: row.text("model_id"),
            calls: row.int("calls").max(0) as u64,
            usage: usage_of(row),
        })
        .collect()))
}

/// Each model's newest provider call: when, and whether it failed (for the providers' overview).
pub async fn last_calls(store: &Store) -> Result<Vec<(String, i64, Option<String>)>, StoreError> {
    on_readers!(store, |p| sqlx::query_as(
        "SELECT model_id, started_at_ms, error FROM provider_calls p
         WHERE rowid = (SELECT rowid FROM provider_calls q WHERE q.model_id = p.model_id
                        ORDER BY started_at_ms DESC, rowid DESC LIMIT 1)",
    )
    .fetch_all(p)
    .await
    .context("reading the newest provider calls"))
}

/// One tool call of a run, as the console lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolExecution {
    pub request_id: String,
    pub call_id: String,
    pub tool: String,
    /// The arguments, shortened (see `summarize_arguments`).
    pub summary: String,
    pub started_at_ms: i64,
    pub duration_ms: i64,
    /// `success` or `error`.
    pub outcome: &'static str,
}

/// How much of a call's arguments a listing keeps.
const SUMMARY_CHARS: usize = 160;

/// A call's arguments shortened for a listing: the JSON text up to `SUMMARY_CHARS` characters.
pub fn summarize_arguments(arguments: &str) -> String {
    let mut summary: String = arguments.chars().take(SUMMARY_CHARS).collect();
    if arguments.chars().nth(SUMMARY_CHARS).is_some() {
        summary.push('…');
    }
    summary
}

/// Records a finished tool call (once per call; a repeat of the same call id is ignored).
pub async fn record_tool(store: &Store, execution: &ToolExecution) -> Result<(), StoreError> {
    write_tx!(store, "recording a tool call", |tx| record_tool_in(
        &mut tx, execution
    )
    .await)
}

/// `record_tool` inside a unit of work's transaction (`commit.rs`).
pub(super) async fn record_tool_in(
    tx: &mut Tx,
    execution: &ToolExecution,
) -> Result<(), StoreError> {
    on_tx!(&mut *tx, |c| sqlx::query(
        "INSERT INTO tool_executions
             (request_id, call_id, tool, summary, started_at_ms, duration_ms, outcome)
         VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT DO NOTHING",
    )
    .bind(&execution.request_id)
    .bind(&execution.call_id)
    .bind(&execution.tool)
    .bind(&execution.summary)
    .bind(execution.started_at_ms)
    .bind(execution.duration_ms)
    .bind(execution.outcome)
    .execute(c)
    .await
    .map(|done| done.rows_affected())
    .context("recording a tool call"))?;
    Ok(())
}

/// A run's tool calls in the order they started.
pub async fn tool_executions(
    store: &Store,
    request_id: &str,
) -> Result<Vec<ToolExecution>, StoreError> {
    on_readers!(store, |p| Ok(sqlx::query(
        "SELECT * FROM tool_executions WHERE request_id = $1 ORDER BY started_at_ms, call_id",
    )
    .bind(request_id)
    .fetch_all(p)
    .await
    .context("reading tool calls")?
    .iter()
    .map(tool_execution_of)
    .collect()))
}

fn tool_execution_of(row: &impl Columns) -> ToolExecution {
    ToolExecution {
        request_id: row.text("request_id"),
        call_id: row.text("call_id"),
        tool: row.text("tool"),
        summary: row.text("summary"),
        started_at_ms: row.int("started_at_ms"),
        duration_ms: row.int("duration_ms"),
        outcome: if row.text("outcome") == "error" {
            "error"
        } else {
            "success"
        },
    }
}
