//! SQLite: its connections (WAL, foreign keys, busy timeout), its write transactions, what
//! counts as busy, and its migrations (`migrations/`), checked and applied at open (version 15,
//! which rebuilds `blobs` and `messages` as rowid tables, is tested here with rows written before).
//!
//! The connections are owned here, not in sqlx's pool: the pool pings a connection when it is
//! taken and again when it is given back, each ping a round trip to the connection's worker
//! thread, waking a thread on each side. The one writer is behind a fair lock; the readers are a
//! fair semaphore over a list of idle connections (`Readers`). A write transaction's `BEGIN`
//! travels with its first statement, and its `COMMIT` with its last where the body names it
//! (`SqliteTx`, `TxState`); statements that need no answer in between go as one query
//! (`Joined`).
//!
//! Length: about 1,200 lines, of which the tests of these rules (cancellation, the riding `BEGIN`
//! and `COMMIT`, joined statements, a busy lock, readers taken in turn, the rowid migration) are
//! 470: the rules and their tests read best beside the connections they govern, and the statement
//! framing shares the writer's state.

use std::str::FromStr;
use std::time::Duration;

use sqlx::migrate::Migrate as _;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use futures_util::TryStreamExt as _;
use futures_util::future::BoxFuture;
use futures_util::stream::BoxStream;

use sqlx::error::BoxDynError;
use sqlx::sqlite::{
    SqliteArguments, SqliteQueryResult, SqliteRow, SqliteStatement, SqliteTypeInfo,
};
use sqlx::{
    AssertSqlSafe, Connection as _, Describe, Either, Execute, Executor, SqlSafeStr as _, SqlStr,
    Sqlite, SqliteConnection,
};
use tokio::sync::{Mutex, OwnedMutexGuard, OwnedSemaphorePermit, Semaphore};

use super::{DatabaseKind, Param, QueryContext, SchemaStatus, StoreError};

/// SQLite's migrations, in order.
static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

/// The migration that rebuilds `blobs` and `messages` as rowid tables (`0015_rowid_tables.sql`).
const ROWID_TABLES: i64 = 15;

/// SQLITE_BUSY and its extended codes (BUSY_RECOVERY 261, BUSY_SNAPSHOT 517, BUSY_TIMEOUT 773).
pub(super) fn is_busy(error: &sqlx::Error) -> bool {
    matches!(error, sqlx::Error::Database(db)
        if db.code().is_some_and(|code| matches!(code.as_ref(), "5" | "261" | "517" | "773")))
}

/// How long a query waits for a connection before it fails, as sqlx's pool waited.
const CONNECTION_WAIT: Duration = Duration::from_secs(30);

/// Readers and the one writer. SQLite admits one writer at a time; a writer that finds the lock
/// taken sleeps in its busy handler (up to 100 ms between tries), so writers queue here instead,
/// on the writer's lock: in order (tokio's mutex is fair), woken as soon as the writer before
/// them is done.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    readers: Arc<Readers>,
    writer: Arc<Mutex<Writer>>,
}

/// The reading connections: a permit per connection, taken in turn, and the idle ones.
#[derive(Debug)]
struct Readers {
    permits: Arc<Semaphore>,
    idle: std::sync::Mutex<Vec<SqliteConnection>>,
}

/// A reading connection, held; back to the idle list when dropped (a query cut short by a
/// cancelled future ends on the connection's worker before the next holder's query starts).
#[derive(Debug)]
pub(crate) struct ReaderGuard {
    conn: Option<SqliteConnection>,
    readers: Arc<Readers>,
    _permit: OwnedSemaphorePermit,
}

impl Deref for ReaderGuard {
    type Target = SqliteConnection;
    fn deref(&self) -> &SqliteConnection {
        self.conn.as_ref().expect("held until dropped")
    }
}

impl DerefMut for ReaderGuard {
    fn deref_mut(&mut self) -> &mut SqliteConnection {
        self.conn.as_mut().expect("held until dropped")
    }
}

impl Drop for ReaderGuard {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            // Before the permit goes (a field, dropped after this): whoever it wakes finds it.
            lock_idle(&self.readers).push(conn);
        }
    }
}

fn lock_idle(readers: &Readers) -> std::sync::MutexGuard<'_, Vec<SqliteConnection>> {
    // Held for a push or a pop only: nothing in it can panic half-way.
    readers
        .idle
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The writing connection and what its last holder may have left open.
#[derive(Debug)]
struct Writer {
    /// `None` once the store is closed.
    conn: Option<SqliteConnection>,
    /// A transaction was begun and not seen to end: its holder was cancelled between `BEGIN` and
    /// the end of `COMMIT` or `ROLLBACK`. `SqliteTx`'s `Drop` rolls it back at once; failing that,
    /// the next holder does before anything else (a `ROLLBACK` with nothing open fails
    /// harmlessly), so nobody writes inside a stranger's transaction.
    maybe_open: bool,
}

/// The writer, held: a `&mut SqliteConnection` for single statements, each its own transaction.
#[derive(Debug)]
pub(crate) struct WriterGuard(OwnedMutexGuard<Writer>);

impl Deref for WriterGuard {
    type Target = SqliteConnection;
    fn deref(&self) -> &SqliteConnection {
        // Checked when the guard was made (`SqliteStore::writer`), and only `close` empties it.
        self.0.conn.as_ref().expect("an open writer")
    }
}

impl DerefMut for WriterGuard {
    fn deref_mut(&mut self) -> &mut SqliteConnection {
        self.0.conn.as_mut().expect("an open writer")
    }
}

/// A write transaction on the writer. Its `BEGIN IMMEDIATE` goes in front of its first
/// statement, in one query: one round trip to the worker thread instead of two. If `BEGIN` fails
/// (the lock stayed busy), the statement does not run (a query stops at its first error) and the
/// error is the statement's. Its `COMMIT` goes behind its last statement, in the same way, where
/// the body says which that is (`end_with_next`). Dropped without `commit` or `rollback` (its
/// future cancelled), it is rolled back by a task of its own that holds the writer until then, so
/// neither SQLite's write lock nor the writer stays taken; the writer's mark
/// (`Writer::maybe_open`) is the fallback where no task can be spawned.
#[derive(Debug)]
pub(crate) struct SqliteTx {
    /// Taken only by `Drop`.
    writer: Option<WriterGuard>,
    state: TxState,
    /// The next statement is not the last, though the transaction is `Ending` (one statement of
    /// several that a function sends): it goes without the `COMMIT`.
    not_last: bool,
}

/// Where a write transaction stands, by what has been sent to SQLite:
///
/// ```text
///  NotBegun ──a statement, BEGIN in front──▶ Open ──commit(): COMMIT alone──▶ (ended)
///     │                                        │
///     └──end_with_next()──▶ Ending{begun} ◀────┘
///                              │ the last statement: [BEGIN in front,] COMMIT behind, one query
///                              ▼
///                          CommitSent ──its results read to their end──▶ Committed
///                              └──an error (the statement's or COMMIT's)──▶ Open (rollback ends it)
/// ```
///
/// `commit` sends nothing where nothing is left open: `NotBegun` and `Ending{begun: false}` sent
/// no statement, `Committed` is done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TxState {
    NotBegun,
    Open,
    Ending { begun: bool },
    CommitSent,
    Committed,
}

impl SqliteTx {
    fn writer(&mut self) -> &mut WriterGuard {
        self.writer.as_mut().expect("held until dropped")
    }

    /// The next statement is the transaction's last: its `COMMIT` goes behind it. Once that
    /// statement has run the transaction is committed, whatever the body does next.
    pub(crate) fn end_with_next(&mut self) {
        self.state = match self.state {
            TxState::NotBegun => TxState::Ending { begun: false },
            TxState::Open => TxState::Ending { begun: true },
            other => other,
        };
    }

    /// While `Ending`, the next statement goes without the `COMMIT`: more follow it.
    pub(crate) fn not_last(&mut self) {
        self.not_last = true;
    }

    pub(crate) async fn commit(mut self) -> Result<(), sqlx::Error> {
        match self.state {
            TxState::NotBegun | TxState::Ending { begun: false } | TxState::Committed => {}
            TxState::Open | TxState::Ending { begun: true } => {
                sqlx::query("COMMIT").execute(&mut **self.writer()).await?;
            }
            TxState::CommitSent => {
                // Left to `Drop`'s rollback: whether the `COMMIT` ran is not known here.
                return Err(sqlx::Error::Protocol(
                    "the statement carrying the transaction's COMMIT was not read to its end"
                        .into(),
                ));
            }
        }
        self.state = TxState::Committed;
        self.writer().0.maybe_open = false;
        Ok(())
    }

    /// Rolls back; returns whether the transaction was committed already, its writes kept.
    pub(crate) async fn rollback(mut self) -> bool {
        match self.state {
            TxState::NotBegun | TxState::Ending { begun: false } => {}
            TxState::Committed => {
                // The body failed after the statement carrying its COMMIT: a misuse of
                // `end_with_next`, whose writes stay.
                tracing::error!("a write transaction failed after it was committed");
                debug_assert!(false, "a write transaction failed after it was committed");
                self.writer().0.maybe_open = false;
                return true;
            }
            TxState::Open | TxState::Ending { begun: true } | TxState::CommitSent => {
                if let Err(error) = rolled_back(self.writer()).await {
                    tracing::debug!(%error, "rolling back a write transaction");
                }
                return false;
            }
        }
        self.writer().0.maybe_open = false;
        false
    }
}

/// Rolls back whatever transaction the writer has open. SQLite answering that none is (a `BEGIN`
/// that failed, or a transaction SQLite ended itself) also leaves nothing open; only a connection
/// that did not answer keeps the writer marked.
async fn rolled_back(writer: &mut WriterGuard) -> Result<(), sqlx::Error> {
    let result = sqlx::query("ROLLBACK").execute(&mut **writer).await;
    if matches!(result, Ok(_) | Err(sqlx::Error::Database(_))) {
        writer.0.maybe_open = false;
    }
    result.map(|_| ())
}

impl Drop for SqliteTx {
    fn drop(&mut self) {
        let Some(mut writer) = self.writer.take() else {
            return;
        };
        if !writer.0.maybe_open {
            return;
        }
        if matches!(
            self.state,
            TxState::NotBegun | TxState::Ending { begun: false } | TxState::Committed
        ) {
            writer.0.maybe_open = false;
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                if let Err(error) = rolled_back(&mut writer).await {
                    tracing::warn!(%error, "rolling back an abandoned write transaction");
                }
            });
        }
    }
}

/// A statement with the transaction's `BEGIN IMMEDIATE` in front, its `COMMIT` behind, or both
/// (`SqliteTx`), its arguments already taken (so that what rides with it is known to be sent once
/// it is).
struct Framed<E> {
    query: E,
    arguments: Option<SqliteArguments>,
    begin: bool,
    commit: bool,
}

impl<'q, E: Execute<'q, Sqlite>> Execute<'q, Sqlite> for Framed<E> {
    fn sql(self) -> SqlStr {
        let sql = self.query.sql();
        let statement = sql.as_str().trim_end().trim_end_matches(';');
        let begin = if self.begin { "BEGIN IMMEDIATE;\n" } else { "" };
        // On a line of its own: a statement ending in a `--` comment keeps its `;` out of it.
        let commit = if self.commit { "\n;\nCOMMIT" } else { "" };
        AssertSqlSafe(format!("{begin}{statement}{commit}")).into_sql_str()
    }

    fn statement(&self) -> Option<&SqliteStatement> {
        // The text is not the prepared statement's any more.
        None
    }

    fn take_arguments(&mut self) -> Result<Option<SqliteArguments>, BoxDynError> {
        Ok(self.arguments.take())
    }

    fn persistent(&self) -> bool {
        self.query.persistent()
    }
}

impl SqliteTx {
    /// `query` with what rides with it by the transaction's state (the state moved on), or as it
    /// is. Arguments that fail to encode are the statement's error, with nothing sent.
    fn framed<'q, E: Execute<'q, Sqlite>>(
        &mut self,
        mut query: E,
    ) -> Result<Either<Framed<E>, E>, sqlx::Error> {
        let not_last = std::mem::take(&mut self.not_last);
        let (begin, commit, next) = match self.state {
            TxState::Open => return Ok(Either::Right(query)),
            TxState::Ending { begun: true } if not_last => return Ok(Either::Right(query)),
            TxState::NotBegun => (true, false, TxState::Open),
            TxState::Ending { begun: false } if not_last => {
                (true, false, TxState::Ending { begun: true })
            }
            TxState::Ending { begun } => (!begun, true, TxState::CommitSent),
            TxState::CommitSent | TxState::Committed => {
                debug_assert!(false, "a statement after the transaction's last");
                return Err(sqlx::Error::Protocol(
                    "a statement after the one carrying the transaction's COMMIT".into(),
                ));
            }
        };
        let arguments = query.take_arguments().map_err(sqlx::Error::Encode)?;
        self.state = next;
        Ok(Either::Left(Framed {
            query,
            arguments,
            begin,
            commit,
        }))
    }
}

type QueryItem = Result<Either<SqliteQueryResult, SqliteRow>, sqlx::Error>;

/// The results of a `Framed` statement as the statement's own. `BEGIN`'s result is left out:
/// SQLite reports the changes of the last statement that made any, which would add the previous
/// transaction's count to this statement's; so is `COMMIT`'s, the last (each statement's result
/// follows its rows, so each result is held until the next item shows it was not the last). The
/// transaction is `Committed` once the results end without an error, `Open` again on an error.
struct FramedResults<'c> {
    results: BoxStream<'c, QueryItem>,
    begin: bool,
    commit: Option<&'c mut TxState>,
    held: Option<SqliteQueryResult>,
    row: Option<SqliteRow>,
}

impl<'c> FramedResults<'c> {
    fn new(
        results: BoxStream<'c, QueryItem>,
        framed: (bool, bool),
        state: &'c mut TxState,
    ) -> Self {
        let (begin, commit) = framed;
        FramedResults {
            results,
            begin,
            commit: commit.then_some(state),
            held: None,
            row: None,
        }
    }
}

impl futures_util::Stream for FramedResults<'_> {
    type Item = QueryItem;

    fn poll_next(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<QueryItem>> {
        use std::task::Poll;
        let this = self.get_mut();
        if let Some(row) = this.row.take() {
            return Poll::Ready(Some(Ok(Either::Right(row))));
        }
        loop {
            let item = match this.results.as_mut().poll_next(cx) {
                Poll::Ready(item) => item,
                Poll::Pending => return Poll::Pending,
            };
            match item {
                Some(Ok(Either::Left(_))) if std::mem::take(&mut this.begin) => {}
                Some(Ok(Either::Left(done))) if this.commit.is_some() => {
                    if let Some(before) = this.held.replace(done) {
                        return Poll::Ready(Some(Ok(Either::Left(before))));
                    }
                }
                Some(Ok(Either::Right(row))) => match this.held.take() {
                    Some(before) => {
                        this.row = Some(row);
                        return Poll::Ready(Some(Ok(Either::Left(before))));
                    }
                    None => return Poll::Ready(Some(Ok(Either::Right(row)))),
                },
                Some(Err(error)) => {
                    if let Some(state) = this.commit.take() {
                        *state = TxState::Open;
                    }
                    this.held = None;
                    return Poll::Ready(Some(Err(error)));
                }
                Some(done) => return Poll::Ready(Some(done)),
                None => {
                    if let Some(state) = this.commit.take()
                        && this.held.take().is_some()
                    {
                        *state = TxState::Committed;
                    }
                    return Poll::Ready(None);
                }
            }
        }
    }
}

/// The statements of a transaction run on the writer; the first carries the `BEGIN`, the last
/// may carry the `COMMIT`.
impl<'c> Executor<'c> for &'c mut SqliteTx {
    type Database = Sqlite;

    fn fetch_many<'e, 'q: 'e, E>(self, query: E) -> BoxStream<'e, QueryItem>
    where
        'c: 'e,
        E: 'q + Execute<'q, Sqlite>,
    {
        let query = match self.framed(query) {
            Ok(query) => query,
            Err(error) => return Box::pin(futures_util::stream::once(async { Err(error) })),
        };
        let SqliteTx { writer, state, .. } = self;
        let conn: &'c mut SqliteConnection = writer.as_mut().expect("held until dropped");
        match query {
            Either::Right(query) => conn.fetch_many(query),
            Either::Left(framed) => {
                let riding = (framed.begin, framed.commit);
                Box::pin(FramedResults::new(conn.fetch_many(framed), riding, state))
            }
        }
    }

    fn fetch_optional<'e, 'q: 'e, E>(
        self,
        query: E,
    ) -> BoxFuture<'e, Result<Option<SqliteRow>, sqlx::Error>>
    where
        'c: 'e,
        E: 'q + Execute<'q, Sqlite>,
    {
        let query = match self.framed(query) {
            Ok(query) => query,
            Err(error) => return Box::pin(std::future::ready(Err(error))),
        };
        let SqliteTx { writer, state, .. } = self;
        let conn: &'c mut SqliteConnection = writer.as_mut().expect("held until dropped");
        match query {
            Either::Right(query) => conn.fetch_optional(query),
            // `BEGIN` returns no row: the first row is the statement's either way.
            Either::Left(framed) if !framed.commit => conn.fetch_optional(framed),
            // Read to the end, not stopped at the first row: the `COMMIT` is still behind it.
            Either::Left(framed) => {
                let riding = (framed.begin, framed.commit);
                let mut results = FramedResults::new(conn.fetch_many(framed), riding, state);
                Box::pin(async move {
                    let mut first = None;
                    while let Some(item) = results.try_next().await? {
                        if let Either::Right(row) = item {
                            first.get_or_insert(row);
                        }
                    }
                    Ok(first)
                })
            }
        }
    }

    fn prepare_with<'e>(
        self,
        sql: SqlStr,
        parameters: &'e [SqliteTypeInfo],
    ) -> BoxFuture<'e, Result<SqliteStatement, sqlx::Error>>
    where
        'c: 'e,
    {
        let conn: &'c mut SqliteConnection = self.writer();
        conn.prepare_with(sql, parameters)
    }

    // Part of the trait while sqlx's `offline` feature is on (its query macros turn it on).
    fn describe<'e>(self, sql: SqlStr) -> BoxFuture<'e, Result<Describe<Sqlite>, sqlx::Error>>
    where
        'c: 'e,
    {
        let conn: &'c mut SqliteConnection = self.writer();
        conn.describe(sql)
    }
}

/// Statements sent to SQLite as one query, one round trip to the writer's thread for all of them
/// (a query stops at its first error). Each is written with its parameters numbered from `$1`
/// and renumbered here after the ones before it; no statement has a `$` other than a parameter's.
#[derive(Debug, Default)]
pub(crate) struct Joined<'a> {
    sql: String,
    params: Vec<Param<'a>>,
}

impl<'a> Joined<'a> {
    /// Appends `statement` (one or several, `;`-separated) with its parameters' values.
    pub(crate) fn push(&mut self, statement: &str, params: Vec<Param<'a>>) {
        if !self.sql.is_empty() {
            // On a line of its own, as `Framed`'s `COMMIT`.
            self.sql.push_str("\n;\n");
        }
        let offset = self.params.len();
        let mut rest = statement;
        while let Some(at) = rest.find('$') {
            self.sql.push_str(&rest[..=at]);
            rest = &rest[at + 1..];
            let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
            if let Ok(number) = rest[..digits].parse::<usize>() {
                self.sql.push_str(&(number + offset).to_string());
            }
            rest = &rest[digits..];
        }
        self.sql.push_str(rest);
        self.params.extend(params);
    }

    /// `statements` joined, in order.
    pub(crate) fn of(statements: impl IntoIterator<Item = (String, Vec<Param<'a>>)>) -> Self {
        let mut joined = Joined::default();
        for (statement, params) in statements {
            joined.push(&statement, params);
        }
        joined
    }

    /// The query's text and values, to run as one statement is (`store::bound`).
    pub(crate) fn into_parts(self) -> (String, Vec<Param<'a>>) {
        (self.sql, self.params)
    }

    /// Runs the statements in `tx`, in order.
    pub(crate) async fn execute(self, tx: &mut SqliteTx) -> Result<SqliteQueryResult, sqlx::Error> {
        super::bound(&self.params, sqlx::query(AssertSqlSafe(self.sql)))
            .execute(tx)
            .await
    }
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
const READERS: usize = 4;

impl SqliteStore {
    /// Opens (creating if needed) the database at `url`, refuses one newer than this binary and
    /// applies pending migrations.
    pub(super) async fn open(url: &str) -> Result<SqliteStore, StoreError> {
        let open_error = |source| StoreError::Open {
            url: url.to_owned(),
            source,
        };
        let options = options(url)?.create_if_missing(true);
        // Migrated on a pool of its own: sqlx's migrator takes a pool (given one connection, the
        // future it makes is not `Send` for every lifetime, as a spawned task must be).
        let migrating = SqlitePoolOptions::new()
            .max_connections(1)
            .connect_with(options.clone())
            .await
            .map_err(open_error)?;
        let status = {
            let mut conn = migrating.acquire().await.map_err(open_error)?;
            status_of(&mut conn).await?
        };
        if status.applied > 0 && status.applied < ROWID_TABLES {
            // A store made by an older release: its largest tables are copied once.
            tracing::info!(
                from = status.applied,
                to = status.known,
                "migrating the database: version {ROWID_TABLES} rebuilds its blobs and messages \
                 tables once, which takes a while and as much free disk as they use"
            );
        }
        MIGRATOR.run(&migrating).await?;
        migrating.close().await;
        let writer = SqliteConnection::connect_with(&options)
            .await
            .map_err(open_error)?;
        // Every reader is opened now: opening one costs about a millisecond (the pragmas), which
        // the first run starts after a restart or a quiet spell would otherwise wait for.
        let mut idle = Vec::with_capacity(READERS);
        for _ in 0..READERS {
            idle.push(
                SqliteConnection::connect_with(&options)
                    .await
                    .map_err(open_error)?,
            );
        }
        let writer = Writer {
            conn: Some(writer),
            maybe_open: false,
        };
        Ok(SqliteStore {
            readers: Arc::new(Readers {
                permits: Arc::new(Semaphore::new(READERS)),
                idle: std::sync::Mutex::new(idle),
            }),
            writer: Arc::new(Mutex::new(writer)),
        })
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
        let mut reader = self.reader().await?;
        let row = sqlx::query("PRAGMA wal_checkpoint(PASSIVE)")
            .fetch_one(&mut *reader)
            .await
            .context("checkpointing the WAL")?;
        Ok((row.get::<i64, _>(1), row.get::<i64, _>(2)))
    }

    /// A reading connection (WAL: readers never wait for the writer), once one is free: they are
    /// handed out in the order asked for.
    pub(crate) async fn reader(&self) -> Result<ReaderGuard, StoreError> {
        let permits = self.readers.permits.clone();
        let permit = match permits.clone().try_acquire_owned() {
            Ok(permit) => Ok(permit),
            Err(_) => tokio::time::timeout(CONNECTION_WAIT, permits.acquire_owned())
                .await
                .map_err(|_| StoreError::Query {
                    context: "waiting for a database reader",
                    source: sqlx::Error::PoolTimedOut,
                })?,
        }
        .map_err(|_| StoreError::Query {
            context: "reading the database",
            source: sqlx::Error::PoolClosed,
        })?;
        // Empty only once `close` has taken the idle connections.
        let conn = lock_idle(&self.readers).pop().ok_or(StoreError::Query {
            context: "reading the database",
            source: sqlx::Error::PoolClosed,
        })?;
        Ok(ReaderGuard {
            conn: Some(conn),
            readers: self.readers.clone(),
            _permit: permit,
        })
    }

    /// The one writing connection, once the writers queued before have done with it.
    pub(crate) async fn writer(&self) -> Result<WriterGuard, StoreError> {
        let held = match self.writer.clone().try_lock_owned() {
            Ok(held) => held,
            Err(_) => tokio::time::timeout(CONNECTION_WAIT, self.writer.clone().lock_owned())
                .await
                .map_err(|_| StoreError::Query {
                    context: "waiting for the database's writer",
                    source: sqlx::Error::PoolTimedOut,
                })?,
        };
        if held.conn.is_none() {
            return Err(StoreError::Query {
                context: "writing to the database",
                source: sqlx::Error::PoolClosed,
            });
        }
        let mut guard = WriterGuard(held);
        if guard.0.maybe_open {
            // An abandoned transaction no task could roll back (`SqliteTx`'s `Drop`).
            if let Err(error) = rolled_back(&mut guard).await {
                tracing::debug!(%error, "nothing was left open on the writer");
            }
        }
        Ok(guard)
    }

    /// A write transaction. `BEGIN IMMEDIATE` takes the write lock up front, waiting for it up to
    /// the busy timeout: a deferred transaction that read first and then writes cannot wait — its
    /// snapshot may be stale, or waiting would deadlock with the writer it waits on — so SQLite
    /// fails it at once (`database is locked`, 5 / 517), which is how runs failed under
    /// concurrency. It is sent with the first statement (`SqliteTx`); a lock still busy after the
    /// timeout fails that statement, and `write_tx!` runs the transaction again a few times.
    pub(super) async fn begin_write(&self) -> Result<SqliteTx, StoreError> {
        let mut writer = self.writer().await?;
        // Marked now: cancelled once its first statement is on its way, the transaction may open.
        writer.0.maybe_open = true;
        Ok(SqliteTx {
            writer: Some(writer),
            state: TxState::NotBegun,
            not_last: false,
        })
    }

    pub(super) async fn close(&self) {
        self.readers.permits.close();
        let idle = std::mem::take(&mut *lock_idle(&self.readers));
        for conn in idle {
            let _ = conn.close().await;
        }
        let conn = self.writer.lock().await.conn.take();
        if let Some(conn) = conn {
            let _ = conn.close().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sqlx::Row as _;

    /// A new store in a directory of its own (kept alive by the returned guard), and its URL.
    async fn new_store() -> (tempfile::TempDir, String, SqliteStore) {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("store.db").display());
        let store = SqliteStore::open(&url).await.unwrap();
        (dir, url, store)
    }

    /// Another connection to the store's file (another process, as far as SQLite can tell),
    /// holding SQLite's write lock.
    async fn lock_from_outside(url: &str) -> SqliteConnection {
        let mut other = SqliteConnection::connect_with(&options(url).unwrap())
            .await
            .unwrap();
        sqlx::query("BEGIN IMMEDIATE")
            .execute(&mut other)
            .await
            .unwrap();
        other
    }

    /// Inserts the conversation row `id`.
    fn insert(
        id: &'static str,
    ) -> sqlx::query::Query<'static, Sqlite, <Sqlite as sqlx::Database>::Arguments> {
        sqlx::query("INSERT INTO conversations (id, created_at_ms) VALUES ($1, 0)").bind(id)
    }

    /// A write transaction whose holder is cancelled (its future dropped) between `BEGIN` and
    /// `COMMIT` leaves nothing behind: it is rolled back at once, so SQLite's write lock is free
    /// for another process, and the next write is not swallowed by it. A closed store refuses
    /// writes with an error.
    #[tokio::test]
    async fn a_cancelled_write_transaction_is_rolled_back_before_the_next_write() {
        let (_dir, url, store) = new_store().await;

        let mut tx = store.begin_write().await.unwrap();
        insert("abandoned").execute(&mut tx).await.unwrap();
        drop(tx);
        // SQLite's write lock is free again without this store writing anything more: another
        // process (`cursor-server users add`) can write.
        let mut other = lock_from_outside(&url).await;
        sqlx::query("ROLLBACK").execute(&mut other).await.unwrap();
        {
            let mut writer = store.writer().await.unwrap();
            insert("kept").execute(&mut *writer).await.unwrap();
        }
        let ids: Vec<String> = sqlx::query_scalar("SELECT id FROM conversations ORDER BY id")
            .fetch_all(&mut *store.reader().await.unwrap())
            .await
            .unwrap();
        assert_eq!(
            ids,
            ["kept"],
            "the lone write committed, the abandoned one did not"
        );

        let mut tx = store.begin_write().await.unwrap();
        insert("committed").execute(&mut tx).await.unwrap();
        tx.commit().await.unwrap();
        let count: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM conversations")
            .fetch_one(&mut *store.reader().await.unwrap())
            .await
            .unwrap();
        assert_eq!(count, 2);

        store.close().await;
        let refused = store
            .begin_write()
            .await
            .expect_err("a closed store refuses writes");
        assert!(refused.to_string().contains("closed"), "{refused}");
    }

    /// A transaction's `BEGIN` rides on its first statement and changes none of that statement's
    /// results: an update that matched nothing reports no change (SQLite itself still reports the
    /// last statement that made any); a read first gets its row; the statements after run inside
    /// the same transaction; one that ran nothing commits and rolls back.
    #[tokio::test]
    async fn the_begin_riding_on_a_first_statement_changes_none_of_its_results() {
        let (_dir, _, store) = new_store().await;
        let ids = || async {
            sqlx::query_scalar::<_, String>("SELECT id FROM conversations ORDER BY id")
                .fetch_all(&mut *store.reader().await.unwrap())
                .await
                .unwrap()
        };
        insert("a")
            .execute(&mut *store.writer().await.unwrap())
            .await
            .unwrap();

        let mut tx = store.begin_write().await.unwrap();
        let changed = sqlx::query("UPDATE conversations SET created_at_ms = 1 WHERE id = 'none'")
            .execute(&mut tx)
            .await
            .unwrap();
        assert_eq!(changed.rows_affected(), 0);
        insert("b").execute(&mut tx).await.unwrap();
        assert!(!tx.rollback().await, "nothing was committed");
        assert_eq!(
            ids().await,
            ["a"],
            "the second statement was inside the transaction"
        );

        let mut tx = store.begin_write().await.unwrap();
        let count: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM conversations")
            .fetch_one(&mut tx)
            .await
            .unwrap();
        assert_eq!(count, 1);
        let inserted = insert("c").execute(&mut tx).await.unwrap();
        assert_eq!(inserted.rows_affected(), 1);
        tx.commit().await.unwrap();
        assert_eq!(ids().await, ["a", "c"]);

        store.begin_write().await.unwrap().commit().await.unwrap();
        assert!(!store.begin_write().await.unwrap().rollback().await);
        let mut tx = store.begin_write().await.unwrap();
        insert("d").execute(&mut tx).await.unwrap();
        tx.commit().await.unwrap();
        assert_eq!(ids().await, ["a", "c", "d"]);
    }

    /// A transaction's `COMMIT` rides on the statement its body names as the last
    /// (`end_with_next`) and changes none of its results: an update of one row reports one change
    /// (SQLite reports that change again for `COMMIT`); the write is visible to another
    /// connection before `commit` is called; a row the statement returns does not cut its `COMMIT`
    /// off (sqlx stops a one-row read at its first row); a transaction of one statement carries
    /// both `BEGIN` and `COMMIT`; a last statement that fails commits nothing; and a body that
    /// names a last statement but sends none is committed by `commit`.
    #[tokio::test]
    async fn a_commit_riding_on_the_last_statement_commits_with_it_and_changes_none_of_its_results()
    {
        let (_dir, url, store) = new_store().await;
        let mut outside = SqliteConnection::connect_with(&options(&url).unwrap())
            .await
            .unwrap();
        let mut seen_outside = async || -> Vec<String> {
            sqlx::query_scalar("SELECT id FROM conversations ORDER BY id")
                .fetch_all(&mut outside)
                .await
                .unwrap()
        };

        let mut tx = store.begin_write().await.unwrap();
        insert("a").execute(&mut tx).await.unwrap();
        tx.end_with_next();
        let changed = sqlx::query("UPDATE conversations SET created_at_ms = 1 WHERE id = 'a'")
            .execute(&mut tx)
            .await
            .unwrap();
        assert_eq!(changed.rows_affected(), 1, "COMMIT's own count left out");
        assert_eq!(seen_outside().await, ["a"], "committed with the statement");
        tx.commit().await.unwrap();

        let mut tx = store.begin_write().await.unwrap();
        insert("b").execute(&mut tx).await.unwrap();
        tx.end_with_next();
        let returned: Option<String> = sqlx::query_scalar(
            "UPDATE conversations SET created_at_ms = 2 WHERE id = 'b' RETURNING id",
        )
        .fetch_optional(&mut tx)
        .await
        .unwrap();
        assert_eq!(returned.as_deref(), Some("b"));
        assert_eq!(
            seen_outside().await,
            ["a", "b"],
            "read past its row to the COMMIT"
        );
        tx.commit().await.unwrap();

        let mut tx = store.begin_write().await.unwrap();
        tx.end_with_next();
        let inserted = insert("c").execute(&mut tx).await.unwrap();
        assert_eq!(inserted.rows_affected(), 1);
        assert_eq!(seen_outside().await, ["a", "b", "c"]);
        tx.commit().await.unwrap();

        let mut tx = store.begin_write().await.unwrap();
        insert("d").execute(&mut tx).await.unwrap();
        tx.end_with_next();
        insert("a")
            .execute(&mut tx)
            .await
            .expect_err("a duplicate id");
        assert!(!tx.rollback().await, "nothing was committed");
        assert_eq!(
            seen_outside().await,
            ["a", "b", "c"],
            "nothing of it committed"
        );

        let mut tx = store.begin_write().await.unwrap();
        insert("e").execute(&mut tx).await.unwrap();
        tx.end_with_next();
        tx.commit().await.unwrap();
        assert_eq!(seen_outside().await, ["a", "b", "c", "e"]);
    }

    /// Statements joined into one query are numbered in turn (each written from `$1`) and land
    /// or fail together: one that fails leaves nothing of those before it once rolled back.
    #[tokio::test]
    async fn statements_joined_into_one_query_are_numbered_in_turn_and_land_or_fail_together() {
        let (_dir, _, store) = new_store().await;
        let row = |id: &'static str, at: i64| {
            (
                "INSERT INTO conversations (id, created_at_ms) VALUES ($1, $2)",
                vec![Param::Text(id), Param::Int(at)],
            )
        };
        let mut joined = Joined::default();
        for (id, at) in [("x", 1), ("y", 2)] {
            let (sql, params) = row(id, at);
            joined.push(sql, params);
        }
        assert_eq!(
            joined.sql,
            "INSERT INTO conversations (id, created_at_ms) VALUES ($1, $2)\n;\n\
             INSERT INTO conversations (id, created_at_ms) VALUES ($3, $4)"
        );
        let mut tx = store.begin_write().await.unwrap();
        tx.end_with_next();
        let done = joined.execute(&mut tx).await.unwrap();
        assert_eq!(done.rows_affected(), 2);
        tx.commit().await.unwrap();

        let mut joined = Joined::default();
        for (id, at) in [("z", 3), ("x", 4)] {
            let (sql, params) = row(id, at);
            joined.push(sql, params);
        }
        let mut tx = store.begin_write().await.unwrap();
        tx.end_with_next();
        joined
            .execute(&mut tx)
            .await
            .expect_err("x is there already");
        assert!(!tx.rollback().await, "nothing was committed");
        let rows: Vec<(String, i64)> =
            sqlx::query_as("SELECT id, created_at_ms FROM conversations ORDER BY id")
                .fetch_all(&mut *store.reader().await.unwrap())
                .await
                .unwrap();
        assert_eq!(rows, [("x".to_owned(), 1), ("y".to_owned(), 2)]);
    }

    /// While another connection holds SQLite's write lock past the busy timeout, a transaction's
    /// first statement fails with the busy error and does not run (its `BEGIN` failed in front of
    /// it), and once the lock is free the writer takes transactions again.
    #[tokio::test]
    async fn a_first_statement_whose_begin_stays_busy_fails_and_writes_nothing() {
        let (_dir, url, store) = new_store().await;
        let mut other = lock_from_outside(&url).await;

        let mut tx = store.begin_write().await.unwrap();
        let refused = insert("x").execute(&mut tx).await.unwrap_err();
        assert!(is_busy(&refused), "{refused}");
        let _ = tx.rollback().await;
        sqlx::query("COMMIT").execute(&mut other).await.unwrap();

        let count: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM conversations")
            .fetch_one(&mut *store.reader().await.unwrap())
            .await
            .unwrap();
        assert_eq!(
            count, 0,
            "the statement behind the failed BEGIN did not run"
        );
        let mut tx = store.begin_write().await.unwrap();
        insert("y").execute(&mut tx).await.unwrap();
        tx.commit().await.unwrap();
    }

    /// Reads take the reading connections in turn: a read past the four waits until one comes
    /// back, and a connection given back in the middle of a query (its future dropped) serves the
    /// next read with its own answer.
    #[tokio::test]
    async fn a_read_waits_for_a_free_reader_and_a_cancelled_read_gives_its_reader_back() {
        let (_dir, _, store) = new_store().await;
        insert("a")
            .execute(&mut *store.writer().await.unwrap())
            .await
            .unwrap();
        let count = |store: SqliteStore| async move {
            let mut reader = store.reader().await.unwrap();
            sqlx::query_scalar::<_, i64>("SELECT COUNT(*) FROM conversations")
                .fetch_one(&mut *reader)
                .await
                .unwrap()
        };

        let mut held = Vec::new();
        for _ in 0..READERS {
            held.push(store.reader().await.unwrap());
        }
        let waiting = tokio::spawn(count(store.clone()));
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert!(!waiting.is_finished(), "every reader is held");
        held.pop();
        assert_eq!(waiting.await.unwrap(), 1);

        {
            let mut reader = held.pop().unwrap();
            let long = sqlx::query_scalar::<_, i64>(
                "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 200000)
                 SELECT x FROM c",
            )
            .fetch_all(&mut *reader);
            let mut long = std::pin::pin!(long);
            assert!(futures_util::poll!(long.as_mut()).is_pending());
        }
        drop(held);
        for _ in 0..READERS * 2 {
            assert_eq!(count(store.clone()).await, 1);
        }
    }

    /// A database written before version 15 keeps every blob, edge and message through the rebuild
    /// of `blobs` and `messages` as rowid tables, and every rule on them holds afterwards.
    #[tokio::test]
    async fn blobs_and_messages_rebuilt_as_rowid_tables_keep_their_rows_edges_and_rules() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("old.db").display());
        let pool = SqlitePoolOptions::new()
            .max_connections(1)
            .connect_with(options(&url).unwrap().create_if_missing(true))
            .await
            .unwrap();
        MIGRATOR.run_to(14, &pool).await.unwrap();
        let state = vec![7u8; 34_000]; // larger than a page: its cell overflowed
        let (parent, child) = ([1u8; 32], [2u8; 32]);
        sqlx::query(
            "INSERT INTO conversations (id, created_at_ms, owner_request_id) VALUES ('c', 0, 'r1')",
        )
        .execute(&pool)
        .await
        .unwrap();
        for (id, data) in [(&parent[..], &state[..]), (&child[..], &b"turn"[..])] {
            sqlx::query("INSERT INTO blobs (id, data, created_at_ms) VALUES (?1, ?2, 0)")
                .bind(id)
                .bind(data)
                .execute(&pool)
                .await
                .unwrap();
        }
        sqlx::query(
            "INSERT INTO blob_edges (parent, kind, ordinal, child) VALUES (?1, 'turns', 0, ?2)",
        )
        .bind(&parent[..])
        .bind(&child[..])
        .execute(&pool)
        .await
        .unwrap();
        for seq in 0..3 {
            sqlx::query(
                "INSERT INTO messages (conversation_id, seq, role, origin, body, request_id, created_at_ms, tool_meta)
                 VALUES ('c', ?1, 'user', 'user', ?2, 'r1', 0, ?3)",
            )
            .bind(seq)
            .bind(format!("{{\"n\":{seq}}}"))
            .bind((seq == 2).then_some("{\"m\":1}"))
            .execute(&pool)
            .await
            .unwrap();
        }

        MIGRATOR.run(&pool).await.unwrap();

        let schema: Vec<String> =
            sqlx::query_scalar("SELECT sql FROM sqlite_schema WHERE name IN ('blobs', 'messages')")
                .fetch_all(&pool)
                .await
                .unwrap();
        assert_eq!(schema.len(), 2);
        assert!(
            schema.iter().all(|sql| !sql.contains("WITHOUT ROWID")),
            "{schema:?}"
        );
        let data: Vec<u8> = sqlx::query_scalar("SELECT data FROM blobs WHERE id = ?1")
            .bind(&parent[..])
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(data, state);
        let edges: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM blob_edges")
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(edges, 1, "rebuilding blobs cascaded nothing");
        let rows = sqlx::query("SELECT seq, body, tool_meta FROM messages ORDER BY seq")
            .fetch_all(&pool)
            .await
            .unwrap();
        let rows: Vec<(i64, String, Option<String>)> = rows
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2)))
            .collect();
        assert_eq!(
            rows,
            [
                (0, "{\"n\":0}".into(), None),
                (1, "{\"n\":1}".into(), None),
                (2, "{\"n\":2}".into(), Some("{\"m\":1}".into())),
            ]
        );

        // The rules: foreign keys are on again, a sequence number is taken once, only the owner
        // appends, a blob's id is unique, and dropping a blob drops its edges.
        let foreign_keys: i64 = sqlx::query_scalar("PRAGMA foreign_keys")
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(foreign_keys, 1);
        let problems = sqlx::query("PRAGMA foreign_key_check")
            .fetch_all(&pool)
            .await
            .unwrap();
        assert!(problems.is_empty());
        let append = |seq: i64, request: &'static str| {
            sqlx::query(
                "INSERT INTO messages (conversation_id, seq, role, origin, body, request_id, created_at_ms)
                 VALUES ('c', ?1, 'user', 'user', '{}', ?2, 0)",
            )
            .bind(seq)
            .bind(request)
            .execute(&pool)
        };
        assert!(append(2, "r1").await.is_err(), "seq 2 is taken");
        let refused = append(3, "r2").await.unwrap_err().to_string();
        assert!(refused.contains("does not own"), "{refused}");
        append(3, "r1").await.unwrap();
        let twice =
            sqlx::query("INSERT INTO blobs (id, data, created_at_ms) VALUES (?1, x'00', 0)")
                .bind(&child[..])
                .execute(&pool)
                .await;
        assert!(twice.is_err(), "a blob id is unique");
        sqlx::query("DELETE FROM blobs WHERE id = ?1")
            .bind(&parent[..])
            .execute(&pool)
            .await
            .unwrap();
        let edges: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM blob_edges")
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(edges, 0, "a blob's edges go with it");
    }
}
