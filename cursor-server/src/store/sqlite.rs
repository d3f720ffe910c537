//! The connection pool: WAL, foreign keys, busy timeout, migrations at open.

use std::str::FromStr;
use std::time::Duration;

use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{Sqlite, SqlitePool, Transaction};

use super::StoreError;

/// How often a write transaction that found the database busy past the busy timeout is retried.
const BUSY_RETRIES: u32 = 3;

/// SQLITE_BUSY and its extended codes (BUSY_RECOVERY 261, BUSY_SNAPSHOT 517, BUSY_TIMEOUT 773).
fn is_busy(error: &sqlx::Error) -> bool {
    matches!(error, sqlx::Error::Database(db)
        if db.code().is_some_and(|code| matches!(code.as_ref(), "5" | "261" | "517" | "773")))
}

/// Readers and the one writer. SQLite admits one writer at a time; a writer that finds the lock
/// taken sleeps in its busy handler (up to 100 ms between tries), so writers queue here instead,
/// on a pool of one connection: in order, woken as soon as the writer before them commits.
#[derive(Debug, Clone)]
pub struct Store {
    pool: SqlitePool,
    writer: SqlitePool,
}

impl Store {
    /// Opens (creating if needed) the database at `url` and applies pending migrations.
    pub async fn open(url: &str) -> Result<Store, StoreError> {
        let open_error = |source| StoreError::Open {
            url: url.to_owned(),
            source,
        };
        let options = SqliteConnectOptions::from_str(url)
            .map_err(open_error)?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .foreign_keys(true)
            .busy_timeout(Duration::from_secs(5));
        let writer = SqlitePoolOptions::new()
            .max_connections(1)
            .connect_with(options.clone())
            .await
            .map_err(open_error)?;
        sqlx::migrate!("./migrations").run(&writer).await?;
        let pool = SqlitePoolOptions::new()
            .max_connections(4)
            .connect_with(options)
            .await
            .map_err(open_error)?;
        Ok(Store { pool, writer })
    }

    /// Proves the database takes a write (for readiness): takes the write lock, creates a table
    /// and rolls it back, so nothing is left behind. A read-only file or a full disk fails here.
    pub async fn probe_write(&self) -> Result<(), StoreError> {
        use super::QueryContext as _;
        let mut tx = self.begin_write().await?;
        sqlx::query("CREATE TABLE readiness_probe (x INTEGER)")
            .execute(&mut *tx)
            .await
            .context("writing to the database")?;
        tx.rollback()
            .await
            .context("rolling back the readiness probe")?;
        Ok(())
    }

    /// The readers (WAL: they never wait for the writer).
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// The one writing connection, for a single statement outside a transaction.
    pub fn writer(&self) -> &SqlitePool {
        &self.writer
    }

    /// A write transaction. `BEGIN IMMEDIATE` takes the write lock up front, waiting for it up to
    /// the busy timeout: a deferred transaction that read first and then writes cannot wait — its
    /// snapshot may be stale, or waiting would deadlock with the writer it waits on — so SQLite
    /// fails it at once (`database is locked`, 5 / 517), which is how runs failed under
    /// concurrency. A lock still busy after the timeout is tried again a few times.
    pub async fn begin_write(&self) -> Result<Transaction<'static, Sqlite>, StoreError> {
        let mut attempt = 0;
        loop {
            match self.writer.begin_with("BEGIN IMMEDIATE").await {
                Ok(tx) => return Ok(tx),
                Err(source) if is_busy(&source) && attempt < BUSY_RETRIES => {
                    attempt += 1;
                    tracing::warn!(
                        attempt,
                        "the database stayed busy past its timeout; trying again"
                    );
                    tokio::time::sleep(Duration::from_millis(50 * u64::from(attempt))).await;
                }
                Err(source) => {
                    return Err(StoreError::Query {
                        context: "starting a write transaction",
                        source,
                    });
                }
            }
        }
    }

    pub async fn close(&self) {
        self.pool.close().await;
        self.writer.close().await;
    }
}
