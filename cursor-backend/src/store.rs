//! `captures.db`: the exchanges and frames a capture recorded (SQLite through sqlx, with migrations).
//! Writes arrive in batches from the recorder (one transaction each, never one per frame); reads serve
//! the UI, its JSON API, the JSONL export and `diff`.

use std::path::Path;
use std::str::FromStr as _;

use serde::Serialize;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{Row as _, SqlitePool};

use crate::decode::FrameRecord;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("captures database {path}: {source}")]
    Open { path: String, source: sqlx::Error },
    #[error("captures database {path}: migrations: {source}")]
    Migrate {
        path: String,
        source: sqlx::migrate::MigrateError,
    },
    #[error("captures database: {0}")]
    Query(#[from] sqlx::Error),
}

/// The captures database.
#[derive(Debug, Clone)]
pub struct Captures {
    pool: SqlitePool,
}

/// One change the recorder makes.
#[derive(Debug)]
pub enum Write {
    Exchange(NewExchange),
    Response {
        id: i64,
        status: u16,
        headers: String,
    },
    /// The run an exchange belongs to, once its body named it.
    Group {
        id: i64,
        request_id: Option<String>,
        conversation_id: Option<String>,
    },
    Frame {
        exchange_id: i64,
        t_us: i64,
        record: FrameRecord,
    },
    Outcome {
        id: i64,
        outcome: String,
    },
    Ended {
        id: i64,
        ended_us: i64,
        error: Option<String>,
    },
}

#[derive(Debug)]
pub struct NewExchange {
    pub id: i64,
    pub request_id: String,
    pub method: String,
    pub path: String,
    pub http_version: String,
    pub request_headers: String,
    pub started_at_ms: i64,
    pub started_us: i64,
}

/// A run (or a lone exchange) as the requests list shows it.
#[derive(Debug, Clone, Serialize)]
pub struct RequestRow {
    pub request_id: String,
    pub route: String,
    pub conversation_id: Option<String>,
    pub status: Option<i64>,
    pub outcome: Option<String>,
    pub error: Option<String>,
    pub exchanges: i64,
    pub frames: i64,
    pub started_at_ms: i64,
    /// `None` while an exchange of it is still open.
    pub duration_ms: Option<f64>,
}

/// One exchange of a run.
#[derive(Debug, Clone, Serialize)]
pub struct ExchangeRow {
    pub id: i64,
    pub method: String,
    pub path: String,
    pub http_version: String,
    pub request_headers: serde_json::Value,
    pub status: Option<i64>,
    pub response_headers: Option<serde_json::Value>,
    pub started_at_ms: i64,
    pub duration_ms: Option<f64>,
    pub frames: i64,
    pub outcome: Option<String>,
    pub error: Option<String>,
}

/// One frame as the API and the export give it.
#[derive(Debug, Clone, Serialize)]
pub struct FrameRow {
    pub id: i64,
    pub exchange_id: i64,
    pub route: String,
    pub direction: String,
    /// Monotonic microseconds since the debugger started.
    pub t_us: i64,
    pub size: i64,
    pub flags: Option<i64>,
    pub kind: String,
    #[serde(rename = "type")]
    pub type_path: String,
    pub json: Option<serde_json::Value>,
    /// The payload's bytes, hex.
    pub raw_hex: String,
    pub error: Option<String>,
    pub transport: bool,
}

const MAIN_ROUTES: &str = "('/agent.v1.AgentService/RunSSE', '/agent.v1.AgentService/Run')";

impl Captures {
    /// Opens (creating if needed) and migrates the database at `path`.
    pub async fn open(path: &Path) -> Result<Captures, StoreError> {
        Self::connect(path, true).await
    }

    /// Opens an existing database (for `diff`); a missing file is an error, not a new capture.
    pub async fn open_existing(path: &Path) -> Result<Captures, StoreError> {
        Self::connect(path, false).await
    }

    async fn connect(path: &Path, create: bool) -> Result<Captures, StoreError> {
        let shown = path.display().to_string();
        let options = SqliteConnectOptions::from_str(&format!("sqlite://{shown}"))
            .map_err(|source| StoreError::Open {
                path: shown.clone(),
                source,
            })?
            .create_if_missing(create)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .foreign_keys(true);
        let pool = SqlitePoolOptions::new()
            .max_connections(4)
            .connect_with(options)
            .await
            .map_err(|source| StoreError::Open {
                path: shown.clone(),
                source,
            })?;
        sqlx::migrate!("./migrations")
            .run(&pool)
            .await
            .map_err(|source| StoreError::Migrate {
                path: shown,
                source,
            })?;
        Ok(Captures { pool })
    }

    /// The id after the largest exchange id already stored (a capture reopened keeps adding).
    pub async fn next_exchange_id(&self) -> Result<i64, StoreError> {
        let max: Option<i64> = sqlx::query_scalar("SELECT MAX(id) FROM exchanges")
            .fetch_one(&self.pool)
            .await?;
        Ok(max.unwrap_or(0) + 1)
    }

    /// Applies a batch in one transaction.
    pub async fn write(&self, batch: Vec<Write>) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await?;
        let mut frame_counts: Vec<(i64, i64)> = Vec::new();
        for write in batch {
            match write {
                Write::Exchange(e) => {
                    sqlx::query(
                        "INSERT INTO exchanges (id, request_id, method, path, http_version, request_headers, started_at_ms, started_us)
                         VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    )
                    .bind(e.id)
                    .bind(e.request_id)
                    .bind(e.method)
                    .bind(e.path)
                    .bind(e.http_version)
                    .bind(e.request_headers)
                    .bind(e.started_at_ms)
                    .bind(e.started_us)
                    .execute(&mut *tx)
                    .await?;
                }
                Write::Response {
                    id,
                    status,
                    headers,
                } => {
                    sqlx::query(
                        "UPDATE exchanges SET status = ?, response_headers = ? WHERE id = ?",
                    )
                    .bind(i64::from(status))
                    .bind(headers)
                    .bind(id)
                    .execute(&mut *tx)
                    .await?;
                }
                Write::Group {
                    id,
                    request_id,
                    conversation_id,
                } => {
                    sqlx::query(
                        "UPDATE exchanges SET request_id = COALESCE(?, request_id),
                         conversation_id = COALESCE(conversation_id, ?) WHERE id = ?",
                    )
                    .bind(request_id)
                    .bind(conversation_id)
                    .bind(id)
                    .execute(&mut *tx)
                    .await?;
                }
                Write::Frame {
                    exchange_id,
                    t_us,
                    record,
                } => {
                    insert_frame(&mut tx, exchange_id, t_us, record).await?;
                    match frame_counts.iter_mut().find(|(id, _)| *id == exchange_id) {
                        Some((_, n)) => *n += 1,
                        None => frame_counts.push((exchange_id, 1)),
                    }
                }
                Write::Outcome { id, outcome } => {
                    sqlx::query("UPDATE exchanges SET outcome = ? WHERE id = ?")
                        .bind(outcome)
                        .bind(id)
                        .execute(&mut *tx)
                        .await?;
                }
                Write::Ended {
                    id,
                    ended_us,
                    error,
                } => {
                    sqlx::query(
                        "UPDATE exchanges SET ended_us = MAX(COALESCE(ended_us, 0), ?),
                         error = COALESCE(error, ?) WHERE id = ?",
                    )
                    .bind(ended_us)
                    .bind(error)
                    .bind(id)
                    .execute(&mut *tx)
                    .await?;
                }
            }
        }
        for (id, n) in frame_counts {
            sqlx::query("UPDATE exchanges SET frames = frames + ? WHERE id = ?")
                .bind(n)
                .bind(id)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// Runs newest first; `search` keeps those whose request, conversation or any frame id equals it.
    pub async fn requests(
        &self,
        search: Option<&str>,
        limit: i64,
    ) -> Result<Vec<RequestRow>, StoreError> {
        let filter = match search {
            // Whole runs: a run matches when any exchange or frame of it does.
            Some(_) => {
                "WHERE request_id IN (
                    SELECT ?1
                    UNION SELECT request_id FROM exchanges WHERE conversation_id = ?1
                    UNION SELECT e.request_id FROM frame_ids i
                        JOIN frames f ON f.id = i.frame_id
                        JOIN exchanges e ON e.id = f.exchange_id
                        WHERE i.value = ?1)"
            }
            None => "WHERE ?1 IS NULL",
        };
        let sql = format!(
            "SELECT request_id,
                COALESCE(MAX(CASE WHEN path IN {MAIN_ROUTES} THEN path END), MIN(path)) AS route,
                MAX(conversation_id) AS conversation_id,
                COALESCE(MAX(CASE WHEN path IN {MAIN_ROUTES} THEN status END), MAX(status)) AS status,
                COALESCE(MAX(CASE WHEN outcome <> 'ok' THEN outcome END), MAX(outcome)) AS outcome,
                MAX(error) AS error,
                COUNT(*) AS exchanges,
                SUM(frames) AS frames,
                MIN(started_at_ms) AS started_at_ms,
                CASE WHEN SUM(ended_us IS NULL) > 0 THEN NULL
                     ELSE (MAX(ended_us) - MIN(started_us)) / 1000.0 END AS duration_ms,
                MAX(id) AS last_id
             FROM exchanges {filter}
             GROUP BY request_id
             ORDER BY started_at_ms DESC, last_id DESC
             LIMIT ?2"
        );
        // Only constants are spliced in; the search is bound.
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(search)
            .bind(limit)
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|row| {
                Ok(RequestRow {
                    request_id: row.try_get("request_id")?,
                    route: row.try_get("route")?,
                    conversation_id: row.try_get("conversation_id")?,
                    status: row.try_get("status")?,
                    outcome: row.try_get("outcome")?,
                    error: row.try_get("error")?,
                    exchanges: row.try_get("exchanges")?,
                    frames: row.try_get("frames")?,
                    started_at_ms: row.try_get("started_at_ms")?,
                    duration_ms: row.try_get("duration_ms")?,
                })
            })
            .collect()
    }

    /// The exchanges of one run, in the order they arrived.
    pub async fn exchanges(&self, request_id: &str) -> Result<Vec<ExchangeRow>, StoreError> {
        let rows = sqlx::query(
            "SELECT id, method, path, http_version, request_headers, status, response_headers,
                    started_at_ms, (ended_us - started_us) / 1000.0 AS duration_ms, frames, outcome, error
             FROM exchanges WHERE request_id = ? ORDER BY started_us, id",
        )
        .bind(request_id)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                let headers: String = row.try_get("request_headers")?;
                let response: Option<String> = row.try_get("response_headers")?;
                Ok(ExchangeRow {
                    id: row.try_get("id")?,
                    method: row.try_get("method")?,
                    path: row.try_get("path")?,
                    http_version: row.try_get("http_version")?,
                    request_headers: serde_json::from_str(&headers).unwrap_or_default(),
                    status: row.try_get("status")?,
                    response_headers: response.and_then(|h| serde_json::from_str(&h).ok()),
                    started_at_ms: row.try_get("started_at_ms")?,
                    duration_ms: row.try_get("duration_ms")?,
                    frames: row.try_get("frames")?,
                    outcome: row.try_get("outcome")?,
                    error: row.try_get("error")?,
                })
            })
            .collect()
    }

    /// Every frame of one run, both directions interleaved by time.
    pub async fn frames(&self, request_id: &str) -> Result<Vec<FrameRow>, StoreError> {
        let rows = sqlx::query(
            "SELECT f.id, f.exchange_id, e.path, f.direction, f.t_us, f.size, f.flags, f.kind, f.type,
                    f.json, f.raw, f.error, f.transport
             FROM frames f JOIN exchanges e ON e.id = f.exchange_id
             WHERE e.request_id = ? ORDER BY f.t_us, f.id",
        )
        .bind(request_id)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                let json: Option<String> = row.try_get("json")?;
                let raw: Vec<u8> = row.try_get("raw")?;
                Ok(FrameRow {
                    id: row.try_get("id")?,
                    exchange_id: row.try_get("exchange_id")?,
                    route: row.try_get("path")?,
                    direction: row.try_get("direction")?,
                    t_us: row.try_get("t_us")?,
                    size: row.try_get("size")?,
                    flags: row.try_get("flags")?,
                    kind: row.try_get("kind")?,
                    type_path: row.try_get("type")?,
                    json: json.and_then(|j| serde_json::from_str(&j).ok()),
                    raw_hex: hex::encode(raw),
                    error: row.try_get("error")?,
                    transport: row.try_get::<i64, _>("transport")? != 0,
                })
            })
            .collect()
    }
}

async fn insert_frame(
    tx: &mut sqlx::Transaction<'_, sqlx::Sqlite>,
    exchange_id: i64,
    t_us: i64,
    record: FrameRecord,
) -> Result<(), StoreError> {
    let json = record.json.as_ref().map(serde_json::Value::to_string);
    let inserted = sqlx::query(
        "INSERT INTO frames (exchange_id, direction, t_us, size, flags, kind, type, json, raw, error, transport)
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
    )
    .bind(exchange_id)
    .bind(record.direction.as_str())
    .bind(t_us)
    .bind(record.raw.len() as i64)
    .bind(record.flags.map(i64::from))
    .bind(record.kind.as_str())
    .bind(&record.type_path)
    .bind(json)
    .bind(&record.raw[..])
    .bind(record.error)
    .bind(record.transport)
    .execute(&mut **tx)
    .await?;
    let frame_id = inserted.last_insert_rowid();
    for (kind, value) in record.ids {
        sqlx::query("INSERT INTO frame_ids (frame_id, kind, value) VALUES (?, ?, ?)")
            .bind(frame_id)
            .bind(kind)
            .bind(value)
            .execute(&mut **tx)
            .await?;
    }
    Ok(())
}
