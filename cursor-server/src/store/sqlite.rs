//! SQLite: the connection pools (WAL, foreign keys, busy timeout), its write transactions, what
//! counts as busy, and its migrations (`migrations/`), checked and applied at open.

use std::str::FromStr;
use std::time::Duration;

use sqlx::migrate::Migrate as _;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{Sqlite, SqlitePool, Transaction};

use super::{DatabaseKind, QueryContext, SchemaStatus, StoreError};

/// SQLite's migrations, in order.
static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

/// How often `BEGIN IMMEDIATE` that found the database busy past the busy timeout is retried.
const BUSY_RETRIES: u32 = 3;

/// SQLITE_BUSY and its extended codes (BUSY_RECOVERY 261, BUSY_SNAPSHOT 517, BUSY_TIMEOUT 773).
pub(super) fn is_busy(error: &sqlx::Error) -> bool {
    matches!(error, sqlx::Error::Database(db)
        if db.code().is_some_and(|code| matches!(code.as_ref(), "5" | "261" | "517" | "773")))
}

/// Readers and the one writer. SQLite admits one writer at a time; a writer that finds the lock
/// taken sleeps in its busy handler (up to 100 ms between tries), so writers queue here instead,
/// on a pool of one connection: in order, woken as soon as the writer before them commits.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    pool: SqlitePool,
    writer: SqlitePool,
}

fn options(url: &str) -> Result<SqliteConnectOptions, StoreError> {
    Ok(SqliteConnectOptions::from_str(url)
        .map_err(|source| StoreError::Open {
            url: url.to_owned(),
            source,
        })?
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Normal)
        .foreign_keys(true)
        .busy_timeout(Duration::from_secs(5))
        // Checkpoints run in the background (`SqliteStore::checkpoint`), not in the commit that
        // happens to fill the WAL: that commit used to wait for the copy and its fsync (about
        // 12 ms, the slowest 1-2 % of first tokens).
        .pragma("wal_autocheckpoint", "0"))
}

/// The applied and dirty migrations of the database behind `conn`, against `MIGRATOR`.
async fn status_of(conn: &mut sqlx::SqliteConnection) -> Result<SchemaStatus, StoreError> {
    conn.ensure_migrations_table("_sqlx_migrations").await?;
    let dirty = conn.dirty_version("_sqlx_migrations").await?;
    let applied: Vec<i64> = conn
        .list_applied_migrations("_sqlx_migrations")
        .await?
        .iter()
        .map(|m| m.version)
        .collect();
    super::schema_status(DatabaseKind::Sqlite, &MIGRATOR, &applied, dirty)
}

/// Reader connections: a run start reads three things at once (`run/lifecycle.rs` `StartReads`),
/// and other runs and the console read beside it.
const READERS: u32 = 4;

impl SqliteStore {
    /// Opens (creating if needed) the database at `url`, refuses one newer than this binary and
    /// applies pending migrations.
    pub(super) async fn open(url: &str) -> Result<SqliteStore, StoreError> {
        let open_error = |source| StoreError::Open {
            url: url.to_owned(),
            source,
        };
        let options = options(url)?.create_if_missing(true);
        let writer = SqlitePoolOptions::new()
            .max_connections(1)
            .connect_with(options.clone())
            .await
            .map_err(open_error)?;
        {
            let mut conn = writer.acquire().await.map_err(open_error)?;
            status_of(&mut conn).await?;
        }
        MIGRATOR.run(&writer).await?;
        // Every reader is opened now: opening one costs about a millisecond (the pragmas), which
        // the first run starts after a restart or a quiet spell would otherwise wait for.
        let pool = SqlitePoolOptions::new()
            .max_connections(READERS)
            .min_connections(READERS)
            .idle_timeout(None)
            .connect_with(options)
            .await
            .map_err(open_error)?;
        Ok(SqliteStore { pool, writer })
    }

    /// The schema state of the database at `url`, which must exist (nothing is created).
    pub(super) async fn inspect(url: &str) -> Result<SchemaStatus, StoreError> {
        use sqlx::Connection as _;
        let mut conn = sqlx::SqliteConnection::connect_with(&options(url)?)
            .await
            .map_err(|source| StoreError::Open {
                url: url.to_owned(),
                source,
            })?;
        let status = status_of(&mut conn).await;
        let _ = conn.close().await;
        status
    }

    /// Copies the WAL's committed pages into the database without waiting for anyone (PASSIVE:
    /// writers go on appending, readers keep their snapshots), so the next write can start the
    /// WAL over. Returns the WAL's frames and how many of them are now in the database.
    pub(super) async fn checkpoint(&self) -> Result<(i64, i64), StoreError> {
        use sqlx::Row as _;
        let row = sqlx::query("PRAGMA wal_checkpoint(PASSIVE)")
            .fetch_one(&self.pool)
            .await
            .context("checkpointing the WAL")?;
        Ok((row.get::<i64, _>(1), row.get::<i64, _>(2)))
    }

    /// The readers (WAL: they never wait for the writer).
    pub(super) fn readers(&self) -> &SqlitePool {
        &self.pool
    }

    /// The one writing connection, for a single statement outside a transaction.
    pub(super) fn writer(&self) -> &SqlitePool {
        &self.writer
    }

    /// A write transaction. `BEGIN IMMEDIATE` takes the write lock up front, waiting for it up to
    /// the busy timeout: a deferred transaction that read first and then writes cannot wait — its
    /// snapshot may be stale, or waiting would deadlock with the writer it waits on — so SQLite
    /// fails it at once (`database is locked`, 5 / 517), which is how runs failed under
    /// concurrency. A lock still busy after the timeout is tried again a few times.
    pub(super) async fn begin_write(&self) -> Result<Transaction<'static, Sqlite>, StoreError> {
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

    pub(super) async fn close(&self) {
        self.pool.close().await;
        self.writer.close().await;
    }
}
