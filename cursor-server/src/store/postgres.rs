//! PostgreSQL: the connection pool, its transactions, which errors are conflicts worth running a
//! transaction again for, and its migrations (`migrations-postgres/`), checked and applied at
//! open. A team's several processes share one database: every invariant is enforced by the
//! schema (triggers, unique indexes) and by row locks taken in the writing transactions.

use std::str::FromStr;

use sqlx::migrate::Migrate as _;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{PgPool, Postgres, Transaction};

use super::{DatabaseKind, PoolSettings, QueryContext as _, SchemaStatus, StoreError};

/// PostgreSQL's migrations, in order. The first is numbered like the SQLite migration whose
/// schema it equals, so a schema version means the same on both backends.
static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations-postgres");

/// A deadlock (40P01) or serialization failure (40001): the transaction did nothing and may run
/// again.
pub(super) fn is_conflict(error: &sqlx::Error) -> bool {
    matches!(error, sqlx::Error::Database(db)
        if db.code().is_some_and(|code| matches!(code.as_ref(), "40001" | "40P01")))
}

/// The pool every reader and writer shares: PostgreSQL takes concurrent writers, and each write
/// locks the rows it depends on (a conversation's row before its history grows).
#[derive(Debug, Clone)]
pub struct PgStore {
    pool: PgPool,
}

fn options(url: &str) -> Result<PgConnectOptions, StoreError> {
    PgConnectOptions::from_str(url).map_err(|source| StoreError::Open {
        url: redacted(url),
        source,
    })
}

/// `url` without its password, for messages and logs.
pub fn redacted(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut parsed) if parsed.password().is_some() => {
            let _ = parsed.set_password(Some("***"));
            parsed.to_string()
        }
        _ => url.to_owned(),
    }
}

async fn status_of(conn: &mut sqlx::PgConnection) -> Result<SchemaStatus, StoreError> {
    conn.ensure_migrations_table("_sqlx_migrations").await?;
    let dirty = conn.dirty_version("_sqlx_migrations").await?;
    let applied: Vec<i64> = conn
        .list_applied_migrations("_sqlx_migrations")
        .await?
        .iter()
        .map(|m| m.version)
        .collect();
    super::schema_status(DatabaseKind::Postgres, &MIGRATOR, &applied, dirty)
}

impl PgStore {
    /// Connects to the database at `url`, refuses one newer than this binary and applies pending
    /// migrations (under sqlx's advisory lock, so several processes starting at once apply them
    /// once).
    pub(super) async fn open(url: &str, settings: PoolSettings) -> Result<PgStore, StoreError> {
        let pool = PgPoolOptions::new()
            .max_connections(settings.max_connections)
            .acquire_timeout(settings.acquire_timeout)
            .connect_with(options(url)?)
            .await
            .map_err(|source| StoreError::Open {
                url: redacted(url),
                source,
            })?;
        {
            let mut conn = pool.acquire().await.context("connecting")?;
            status_of(&mut conn).await?;
        }
        MIGRATOR.run(&pool).await?;
        Ok(PgStore { pool })
    }

    /// The schema state of the database at `url` (nothing is applied).
    pub(super) async fn inspect(url: &str) -> Result<SchemaStatus, StoreError> {
        use sqlx::Connection as _;
        let mut conn = sqlx::PgConnection::connect_with(&options(url)?)
            .await
            .map_err(|source| StoreError::Open {
                url: redacted(url),
                source,
            })?;
        let status = status_of(&mut conn).await;
        let _ = conn.close().await;
        status
    }

    pub(super) fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// A READ COMMITTED transaction; the statements in it lock what they depend on.
    pub(super) async fn begin(&self) -> Result<Transaction<'static, Postgres>, StoreError> {
        self.pool
            .begin()
            .await
            .context("starting a write transaction")
    }

    pub(super) async fn close(&self) {
        self.pool.close().await;
    }
}
