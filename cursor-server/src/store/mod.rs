//! Persistence, on SQLite (the embedded default) or PostgreSQL (a team's shared server).
//! `messages` is the only source of truth for history; everything else is bookkeeping around it.
//!
//! Callers see `Store` and the domain modules' functions and types only. Each domain module
//! (messages, blobs, conversations, runs, outbox) is that domain's one interface and holds the
//! query code of both backends: where the SQL is the same (`$n` parameters, `ON CONFLICT DO
//! NOTHING`, portable expressions) one text serves both, and the `on_*!` macros below expand the
//! code that runs it once per backend, so each expansion is type-checked against its own driver
//! (no `sqlx::Any`); where the dialects differ, the module says so with a `match` on the backend.
//! `sqlite.rs` and `postgres.rs` own their connections, transactions and what counts as a
//! conflict worth retrying; the invariants (gap-free sequences, one writer per conversation,
//! runtime events once, content-addressed blobs) are enforced by each database's schema.

// The macros come first: the domain modules below use them.
/// Runs `$body` with `$c` bound to the transaction's executor (`&mut SqliteTx`, the writer whose
/// first statement carries the `BEGIN`, or `&mut PgConnection`): the body is expanded once per backend and type-checked against each.
macro_rules! on_tx {
    ($tx:expr, |$c:ident| $body:expr) => {
        match $tx {
            $crate::store::Tx::Sqlite(tx) => {
                let $c: &mut $crate::store::sqlite::SqliteTx = tx;
                $body
            }
            $crate::store::Tx::Postgres(tx) => {
                let $c: &mut sqlx::PgConnection = &mut **tx;
                $body
            }
        }
    };
}

/// Runs `$body` with `$p` bound to a reader (a held `&mut SqliteConnection`, or `&PgPool`). The
/// body is an expression of type `Result<T, StoreError>`.
macro_rules! on_readers {
    ($store:expr, |$p:ident| $body:expr) => {
        match $store.backend() {
            $crate::store::Backend::Sqlite(s) => match s.reader().await {
                Ok(mut reader) => {
                    let $p: &mut sqlx::SqliteConnection = &mut *reader;
                    $body
                }
                Err(error) => Err(error),
            },
            $crate::store::Backend::Postgres(s) => {
                let $p: &sqlx::PgPool = s.pool();
                $body
            }
        }
    };
}

/// Runs `$body` (one statement, its own transaction) with `$p` bound to the store's writer: the
/// one SQLite writing connection (`&mut SqliteConnection`, held for the body), or the PostgreSQL
/// pool. The body is an expression of type `Result<T, StoreError>`.
macro_rules! on_writer {
    ($store:expr, |$p:ident| $body:expr) => {
        match $store.backend() {
            $crate::store::Backend::Sqlite(s) => match s.writer().await {
                Ok(mut writer) => {
                    let $p: &mut sqlx::SqliteConnection = &mut *writer;
                    $body
                }
                Err(error) => Err(error),
            },
            $crate::store::Backend::Postgres(s) => {
                let $p: &sqlx::PgPool = s.pool();
                $body
            }
        }
    };
}

/// Runs `$body` in a write transaction bound to `$tx` and commits it; a conflict (busy,
/// deadlock, serialization failure) runs the whole body again, a bounded number of times. The
/// body is an expression of type `Result<T, StoreError>` and may use `?`.
macro_rules! write_tx {
    ($store:expr, $context:literal, |$tx:ident| $body:expr) => {{
        let store: &$crate::store::Store = $store;
        let mut attempt = 0u32;
        loop {
            let mut $tx = store.begin_write().await?;
            let result: Result<_, $crate::store::StoreError> = async { $body }.await;
            let result = match result {
                Ok(value) => $tx.commit($context).await.map(|()| value),
                Err(error) => {
                    if $tx.rollback().await {
                        break Err(error);
                    }
                    Err(error)
                }
            };
            match result {
                Err(error) if store.retry_after(&error, attempt).await => attempt += 1,
                other => break other,
            }
        }
    }};
}

pub mod blobs;
pub mod budgets;
pub mod commit;
pub mod conversations;
pub mod messages;
pub mod nodes;
pub mod outbox;
pub mod postgres;
pub mod runs;
pub mod sqlite;
pub mod users;

use std::time::Duration;

/// The store: a handle on one database, cheap to clone.
#[derive(Debug, Clone)]
pub struct Store {
    backend: Backend,
}

/// Which database the store is on.
#[derive(Debug, Clone)]
pub(crate) enum Backend {
    Sqlite(sqlite::SqliteStore),
    Postgres(postgres::PgStore),
}

/// The database kind a `database_url` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DatabaseKind {
    Sqlite,
    Postgres,
}

impl DatabaseKind {
    /// `postgres://` and `postgresql://` select PostgreSQL, `sqlite:` SQLite; anything else is
    /// refused by the configuration's validation.
    pub fn of_url(url: &str) -> Option<DatabaseKind> {
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Some(DatabaseKind::Postgres)
        } else if url.starts_with("sqlite:") {
            Some(DatabaseKind::Sqlite)
        } else {
            None
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            DatabaseKind::Sqlite => "SQLite",
            DatabaseKind::Postgres => "PostgreSQL",
        }
    }
}

/// The schema of an open database against the migrations this binary carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchemaStatus {
    pub kind: DatabaseKind,
    /// The newest migration applied (0: none).
    pub applied: i64,
    /// The newest migration this binary knows.
    pub known: i64,
    /// Migrations this binary knows that the database has not applied.
    pub pending: usize,
}

/// The PostgreSQL pool's bounds (`database_max_connections`, `database_acquire_timeout_ms`);
/// SQLite keeps its one writer and its readers whatever these say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolSettings {
    /// Connections one process keeps open at most.
    pub max_connections: u32,
    /// How long a statement waits for a connection before failing as unavailable: a database
    /// that is down fails runs with a clear error in bounded time instead of holding them.
    pub acquire_timeout: Duration,
}

impl Default for PoolSettings {
    fn default() -> Self {
        PoolSettings {
            max_connections: crate::config::DEFAULT_DATABASE_MAX_CONNECTIONS,
            acquire_timeout: Duration::from_millis(
                crate::config::DEFAULT_DATABASE_ACQUIRE_TIMEOUT_MS,
            ),
        }
    }
}

impl Store {
    /// Opens the database `url` names with the default pool bounds (see `open_with`).
    pub async fn open(url: &str) -> Result<Store, StoreError> {
        Store::open_with(url, PoolSettings::default()).await
    }

    /// Opens the database `url` names (SQLite, created if needed, or PostgreSQL with `pool`'s
    /// bounds), refuses a database newer than this binary or left half-migrated, and applies
    /// pending migrations.
    pub async fn open_with(url: &str, pool: PoolSettings) -> Result<Store, StoreError> {
        let backend = match DatabaseKind::of_url(url) {
            Some(DatabaseKind::Postgres) => {
                Backend::Postgres(postgres::PgStore::open(url, pool).await?)
            }
            Some(DatabaseKind::Sqlite) => Backend::Sqlite(sqlite::SqliteStore::open(url).await?),
            None => return Err(StoreError::UnknownUrl(url.to_owned())),
        };
        Ok(Store { backend })
    }

    /// Reads the schema state of `url` without changing anything (`cursor-server check`).
    pub async fn inspect(url: &str) -> Result<SchemaStatus, StoreError> {
        match DatabaseKind::of_url(url) {
            Some(DatabaseKind::Postgres) => postgres::PgStore::inspect(url).await,
            Some(DatabaseKind::Sqlite) => sqlite::SqliteStore::inspect(url).await,
            None => Err(StoreError::UnknownUrl(url.to_owned())),
        }
    }

    pub fn kind(&self) -> DatabaseKind {
        match &self.backend {
            Backend::Sqlite(_) => DatabaseKind::Sqlite,
            Backend::Postgres(_) => DatabaseKind::Postgres,
        }
    }

    pub(crate) fn backend(&self) -> &Backend {
        &self.backend
    }

    /// Proves the database takes a write (for readiness): creates a table in a transaction and
    /// rolls it back, so nothing is left behind. A read-only file, a full disk or a database that
    /// is down fails here.
    pub async fn probe_write(&self) -> Result<(), StoreError> {
        let mut tx = self.begin_write().await?;
        let probed = on_tx!(&mut tx, |c| sqlx::query(
            "CREATE TABLE readiness_probe (x INTEGER)"
        )
        .execute(c)
        .await
        .map(|done| done.rows_affected())
        .context("writing to the database"));
        tx.rollback().await;
        probed.map(|_| ())
    }

    /// A write transaction: on SQLite the one writer's `BEGIN IMMEDIATE`, on PostgreSQL a
    /// transaction of the pool (READ COMMITTED; the writes lock what they depend on).
    pub(crate) async fn begin_write(&self) -> Result<Tx, StoreError> {
        match &self.backend {
            Backend::Sqlite(store) => store.begin_write().await.map(Tx::Sqlite),
            Backend::Postgres(store) => store.begin().await.map(Tx::Postgres),
        }
    }

    /// Whether a transaction that failed with `error` should be run again from the start (after
    /// `attempt` earlier tries): a busy SQLite database, a PostgreSQL deadlock or serialization
    /// failure, a bounded number of times.
    pub(crate) async fn retry_after(&self, error: &StoreError, attempt: u32) -> bool {
        let StoreError::Query { source, .. } = error else {
            return false;
        };
        let conflict = match &self.backend {
            Backend::Sqlite(_) => sqlite::is_busy(source),
            Backend::Postgres(_) => postgres::is_conflict(source),
        };
        if !conflict || attempt >= CONFLICT_RETRIES {
            return false;
        }
        tracing::warn!(attempt, %error, "a write transaction conflicted; trying it again");
        tokio::time::sleep(Duration::from_millis(20 * u64::from(attempt + 1))).await;
        true
    }

    /// SQLite: moves what the WAL holds into the database (`sqlite.rs`, `checkpoint`), as the
    /// server does every `CHECKPOINT_EVERY`; returns the WAL's frames and those checkpointed.
    /// PostgreSQL checkpoints by itself: `None`.
    pub async fn checkpoint(&self) -> Result<Option<(i64, i64)>, StoreError> {
        match &self.backend {
            Backend::Sqlite(store) => store.checkpoint().await.map(Some),
            Backend::Postgres(_) => Ok(None),
        }
    }

    pub async fn close(&self) {
        match &self.backend {
            Backend::Sqlite(store) => store.close().await,
            Backend::Postgres(store) => store.close().await,
        }
    }
}

/// How often the server checkpoints SQLite's WAL (`Store::checkpoint`): about a second of writes
/// at most waits in the WAL.
pub const CHECKPOINT_EVERY: Duration = Duration::from_secs(1);

/// How often a conflicting write transaction is run again before its error is returned.
const CONFLICT_RETRIES: u32 = 3;

/// An open write transaction on either backend. Dropped without `commit` it rolls back.
pub(crate) enum Tx {
    Sqlite(sqlite::SqliteTx),
    Postgres(sqlx::Transaction<'static, sqlx::Postgres>),
}

impl Tx {
    pub(crate) fn kind(&self) -> DatabaseKind {
        match self {
            Tx::Sqlite(_) => DatabaseKind::Sqlite,
            Tx::Postgres(_) => DatabaseKind::Postgres,
        }
    }

    /// The next statement is the transaction's last: on SQLite its `COMMIT` goes with it, in one
    /// round trip to SQLite's worker thread instead of two. Only where nothing after that
    /// statement can fail: once it has run, the transaction is committed whatever the body
    /// returns. A function that sends several statements marks each but its last (`not_last`); a
    /// statement after the last is refused. On PostgreSQL, nothing changes.
    pub(crate) fn end_with_next(&mut self) {
        if let Tx::Sqlite(tx) = self {
            tx.end_with_next();
        }
    }

    /// The next statement is one of several this function sends, not its last (`end_with_next`).
    pub(crate) fn not_last(&mut self) {
        if let Tx::Sqlite(tx) = self {
            tx.not_last();
        }
    }

    pub(crate) async fn commit(self, context: &'static str) -> Result<(), StoreError> {
        match self {
            Tx::Sqlite(tx) => tx.commit().await.context(context),
            Tx::Postgres(tx) => tx.commit().await.context(context),
        }
    }

    /// Rolls back now: a dropped transaction is rolled back lazily (on SQLite by the writer's
    /// next holder, on PostgreSQL when its connection goes back to the pool), holding its locks
    /// until then. Returns whether it was committed already (a body that failed after the
    /// statement carrying its `COMMIT`, a misuse of `end_with_next`): such a body must not run
    /// again.
    pub(crate) async fn rollback(self) -> bool {
        match self {
            Tx::Sqlite(tx) => tx.rollback().await,
            Tx::Postgres(tx) => {
                let _ = tx.rollback().await;
                false
            }
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(
        "database_url {0:?} names no supported database (sqlite://FILE or postgres://USER:PASSWORD@HOST:PORT/DB)"
    )]
    UnknownUrl(String),
    #[error("opening database {url}: {source}")]
    Open { url: String, source: sqlx::Error },
    #[error("running migrations: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error(
        "the database is at schema version {applied}, newer than this cursor-server knows ({known}): it was used by a newer release; run that release (or restore a backup taken before the upgrade)"
    )]
    NewerSchema { applied: i64, known: i64 },
    #[error(
        "the database's migration {version} failed part-way (marked dirty in _sqlx_migrations); restore a backup, or repair the schema and remove that row"
    )]
    HalfMigrated { version: i64 },
    #[error("{context}: {source}")]
    Query {
        context: &'static str,
        source: sqlx::Error,
    },
    #[error("message {seq} of conversation {conversation_id} is not valid JSON: {source}")]
    CorruptMessage {
        conversation_id: String,
        seq: i64,
        source: serde_json::Error,
    },
    #[error("encoding message: {0}")]
    Encode(#[from] serde_json::Error),
    #[error("{0}")]
    BlobHash(#[from] blobs::HashMismatch),
    #[error("run {request_id} has an unknown status {status:?}")]
    CorruptRun { request_id: String, status: String },
    #[error("stored blob {id} does not decode: {message}")]
    CorruptBlob { id: String, message: String },
    #[error(
        "conversation {conversation_id} changed while run {request_id} was opening (another run wrote to it first)"
    )]
    HistoryMoved {
        conversation_id: String,
        request_id: String,
    },
    #[error("blob {0} is named by the store but not stored")]
    MissingBlob(crate::model::conversation::BlobId),
    #[error(
        "run {request_id} no longer owns conversation {conversation_id} (a newer run took it over); its write was refused"
    )]
    NotOwner {
        conversation_id: String,
        request_id: String,
    },
    /// `[auth]`: the run's person may not start a run on this conversation (someone else's).
    #[error(
        "conversation {conversation_id} belongs to someone else on this server; start a new chat (an admin can see every conversation in the console)"
    )]
    NotYours { conversation_id: String },
}

impl StoreError {
    /// Whether the database could not be reached (down, restarting, the network, no connection
    /// free in time) rather than refusing the operation: a client may try again later.
    pub fn is_unavailable(&self) -> bool {
        let (StoreError::Query { source, .. } | StoreError::Open { source, .. }) = self else {
            return false;
        };
        match source {
            sqlx::Error::Io(_)
            | sqlx::Error::Tls(_)
            | sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::WorkerCrashed => true,
            sqlx::Error::Database(db) => db.code().is_some_and(|code| {
                // Class 08: connection exceptions; 57P01–57P03: the server shutting down,
                // crashed or starting; 53300: too many connections.
                code.starts_with("08") || code.starts_with("57P") || code == "53300"
            }),
            _ => false,
        }
    }
}

/// The text of the trigger that refuses appends from a run that does not own the conversation
/// (SQLite: migrations/0006_conversation_owner.sql; PostgreSQL: its trigger function).
pub(crate) const NOT_OWNER: &str = "cursor-server: the run does not own this conversation";

/// A write of `request_id` to `conversation_id` that failed: the database's refusal of a run that
/// no longer owns the conversation (the owner triggers, migrations 0006 and 0013) as `NotOwner`,
/// anything else as a query error with `context`.
pub(crate) fn owner_refusal(
    source: sqlx::Error,
    context: &'static str,
    (conversation_id, request_id): (&str, &str),
) -> StoreError {
    match &source {
        sqlx::Error::Database(db) if db.message().contains(NOT_OWNER) => StoreError::NotOwner {
            conversation_id: conversation_id.to_owned(),
            request_id: request_id.to_owned(),
        },
        _ => StoreError::Query { context, source },
    }
}

/// Attaches a short description of the failed operation to a sqlx error.
pub(crate) trait QueryContext<T> {
    fn context(self, context: &'static str) -> Result<T, StoreError>;
}

impl<T> QueryContext<T> for Result<T, sqlx::Error> {
    fn context(self, context: &'static str) -> Result<T, StoreError> {
        self.map_err(|source| StoreError::Query { context, source })
    }
}

/// A result row of either backend, read by column name: what record decoding shared by both
/// backends needs (a column of the wrong type panics, as `sqlx::Row::get` does).
pub(crate) trait Columns {
    fn int(&self, name: &str) -> i64;
    fn opt_int(&self, name: &str) -> Option<i64>;
    fn text(&self, name: &str) -> String;
    fn opt_text(&self, name: &str) -> Option<String>;
}

macro_rules! columns_of {
    ($row:ty) => {
        impl Columns for $row {
            fn int(&self, name: &str) -> i64 {
                sqlx::Row::get(self, name)
            }
            fn opt_int(&self, name: &str) -> Option<i64> {
                sqlx::Row::get(self, name)
            }
            fn text(&self, name: &str) -> String {
                sqlx::Row::get(self, name)
            }
            fn opt_text(&self, name: &str) -> Option<String> {
                sqlx::Row::get(self, name)
            }
        }
    };
}

columns_of!(sqlx::sqlite::SqliteRow);
columns_of!(sqlx::postgres::PgRow);

/// Compares the migrations applied to a database with the ones this binary carries: a database
/// with a migration this binary does not know is newer than it, and one left dirty by a failed
/// migration is half-migrated; both are refused before anything is applied.
pub(crate) fn schema_status(
    kind: DatabaseKind,
    migrator: &sqlx::migrate::Migrator,
    applied: &[i64],
    dirty: Option<i64>,
) -> Result<SchemaStatus, StoreError> {
    if let Some(version) = dirty {
        return Err(StoreError::HalfMigrated { version });
    }
    let known = migrator.iter().map(|m| m.version).max().unwrap_or(0);
    let newest = applied.iter().copied().max().unwrap_or(0);
    if applied.iter().any(|v| !migrator.version_exists(*v)) {
        return Err(StoreError::NewerSchema {
            applied: newest,
            known,
        });
    }
    let pending = migrator
        .iter()
        .filter(|m| !applied.contains(&m.version))
        .count();
    Ok(SchemaStatus {
        kind,
        applied: newest,
        known,
        pending,
    })
}

pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// Rows written by one multi-row statement: each statement is a round trip to the database (and,
/// on SQLite, a hand-off to its worker thread), so a run's blobs, edges, outbox rows and ACKs go in
/// as few statements as possible; 256 rows of at most 5 values stay far under either database's
/// limit on bound parameters (32,766 on SQLite, 65,535 on PostgreSQL).
pub(crate) const ROWS_PER_STATEMENT: usize = 256;

/// A value bound to a statement's parameter, on either backend: a statement built as text and
/// values runs alone, or on SQLite joined with others into one query (`sqlite::Joined`).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Param<'a> {
    Text(&'a str),
    MaybeText(Option<&'a str>),
    Bytes(&'a [u8]),
    Int(i64),
}

/// `query` with `params` bound in order.
pub(crate) fn bound<'q, DB: sqlx::Database>(
    params: &[Param<'q>],
    mut query: sqlx::query::Query<'q, DB, DB::Arguments>,
) -> sqlx::query::Query<'q, DB, DB::Arguments>
where
    &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    Option<&'q str>: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    &'q [u8]: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    i64: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
{
    for param in params {
        query = match *param {
            Param::Text(value) => query.bind(value),
            Param::MaybeText(value) => query.bind(value),
            Param::Bytes(value) => query.bind(value),
            Param::Int(value) => query.bind(value),
        };
    }
    query
}

/// Runs one statement built as text and values (`Param`) on its own; returns the rows it changed.
pub(crate) async fn run_alone(
    tx: &mut Tx,
    (sql, params): (String, Vec<Param<'_>>),
    context: &'static str,
) -> Result<u64, StoreError> {
    on_tx!(tx, |c| bound(
        &params,
        sqlx::query(sqlx::AssertSqlSafe(sql))
    )
    .execute(c)
    .await
    .map(|done| done.rows_affected())
    .context(context))
}

/// `($1, $2, $3), ($4, $5, $6)` for `rows` rows of `columns` values each: the `VALUES` list of a
/// multi-row insert, numbered as both dialects accept.
pub(crate) fn row_placeholders(rows: usize, columns: usize) -> String {
    let mut sql = String::with_capacity(rows * columns * 5);
    for row in 0..rows {
        if row > 0 {
            sql.push_str(", ");
        }
        sql.push('(');
        for column in 0..columns {
            if column > 0 {
                sql.push_str(", ");
            }
            sql.push('$');
            sql.push_str(&(row * columns + column + 1).to_string());
        }
        sql.push(')');
    }
    sql
}

/// `$first, $first+1, …` (`n` of them): the list of an `IN (…)` after `first - 1` other values.
pub(crate) fn list_placeholders(first: usize, n: usize) -> String {
    (first..first + n)
        .map(|i| format!("${i}"))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod placeholder_tests {
    use super::{list_placeholders, row_placeholders};

    #[test]
    fn rows_are_numbered_across_the_statement() {
        assert_eq!(row_placeholders(1, 2), "($1, $2)");
        assert_eq!(row_placeholders(2, 3), "($1, $2, $3), ($4, $5, $6)");
        assert_eq!(list_placeholders(2, 3), "$2, $3, $4");
        assert_eq!(list_placeholders(1, 0), "");
    }
}
