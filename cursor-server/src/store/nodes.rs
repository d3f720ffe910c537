//! Several nodes on one database (migration 0012): the node registry and its leases, which node
//! owns a request id (the first to claim it), the runs of a node that stopped, and which node runs
//! a conversation now. Used only with `[cluster]`; a single node never touches these tables.
//!
//! Times of leases are the database's clock, never a node's: nodes on machines whose
//! clocks disagree still agree on who is silent. Every decision several nodes could race on is one
//! statement or one write transaction (a primary key, a guarded UPDATE), so it holds on both
//! backends.

use super::{Columns, DatabaseKind, QueryContext, Store, StoreError, Tx};

/// Milliseconds since the epoch by the database's clock, in each dialect (`clock_timestamp`, not
/// `now()`: PostgreSQL's `now()` is the start of the transaction).
fn clock(kind: DatabaseKind) -> &'static str {
    match kind {
        DatabaseKind::Sqlite => "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)",
        DatabaseKind::Postgres => "(extract(epoch from clock_timestamp()) * 1000)::bigint",
    }
}

/// `sql` with each `{now}` replaced by the database's clock.
pub(super) fn timed(kind: DatabaseKind, sql: &str) -> sqlx::AssertSqlSafe<String> {
    sqlx::AssertSqlSafe(sql.replace("{now}", clock(kind)))
}

/// The reason runs of a node taken as stopped end with.
pub const NODE_STOPPED: &str = "the node running it stopped";

/// A node as the registry shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeRecord {
    pub name: String,
    pub internal_url: String,
    /// Milliseconds since its last heartbeat (by the database's clock).
    pub lease_age_ms: i64,
    /// Why it stopped, if it did (a clean shutdown, or a lease that ran out).
    pub stopped: Option<String>,
    /// Its registration (see `Joined::Registered`).
    pub instance: i64,
}

/// The node that owns a request id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunOwner {
    pub node: String,
    /// Where it is reached; `None` if it never registered.
    pub internal_url: Option<String>,
    /// Registered, not stopped and heard from within the lease.
    pub live: bool,
}

/// How a node's attempt to take its name went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Joined {
    /// The name is this process's now. `instance` (the registration's start time by the
    /// database's clock, made larger than the previous holder's when they fall in the same
    /// millisecond) tells this process's lease from any earlier or later holder's: only the holder
    /// renews it or leaves with it.
    Registered { instance: i64 },
    /// A node under that name holds a lease that has not run out: a previous process of this node
    /// that stopped without leaving (its lease runs out by itself), or another live process
    /// (which renews it).
    Held {
        internal_url: String,
        /// The holder's last heartbeat (by the database's clock): a later one means it is alive.
        heartbeat_at_ms: i64,
        age_ms: i64,
    },
}

/// Takes the name `name`, reached at `internal_url`, unless a node under that name holds a lease
/// renewed within `lease_ms` and not stopped: one guarded statement, so two processes given one
/// name never both hold it.
pub async fn register_if_free(
    store: &Store,
    (name, internal_url): (&str, &str),
    lease_ms: i64,
) -> Result<Joined, StoreError> {
    let sql = timed(
        store.kind(),
        "INSERT INTO nodes (name, internal_url, started_at_ms, heartbeat_at_ms)
         VALUES ($1, $2, {now}, {now})
         ON CONFLICT (name) DO UPDATE SET internal_url = excluded.internal_url,
             started_at_ms = CASE WHEN excluded.started_at_ms > nodes.started_at_ms
                 THEN excluded.started_at_ms ELSE nodes.started_at_ms + 1 END,
             heartbeat_at_ms = excluded.heartbeat_at_ms,
             stopped_at_ms = NULL, stop_reason = NULL, stopped_by = NULL
         WHERE nodes.stopped_at_ms IS NOT NULL OR nodes.heartbeat_at_ms < {now} - $3
         RETURNING started_at_ms",
    );
    let registered: Option<i64> = on_writer!(store, |p| sqlx::query_scalar(sql)
        .bind(name)
        .bind(internal_url)
        .bind(lease_ms)
        .fetch_optional(p)
        .await
        .context("registering the node"))?;
    if let Some(instance) = registered {
        return Ok(Joined::Registered { instance });
    }
    let sql = timed(
        store.kind(),
        "SELECT internal_url, heartbeat_at_ms, {now} - heartbeat_at_ms FROM nodes WHERE name = $1",
    );
    let holder: Option<(String, i64, i64)> = on_readers!(store, |p| sqlx::query_as(sql)
        .bind(name)
        .fetch_optional(p)
        .await
        .context("reading the node's name"))?;
    match holder {
        Some((internal_url, heartbeat_at_ms, age_ms)) => Ok(Joined::Held {
            internal_url,
            heartbeat_at_ms,
            age_ms,
        }),
        // Gone between the two statements (it cannot be deleted, but be exact): try again.
        None => Box::pin(register_if_free(store, (name, internal_url), lease_ms)).await,
    }
}

/// Joins as `name` whatever holds it (tests, and a node that knows its old lease is gone): its
/// lease starts now. Returns the registration's instance.
pub async fn register(store: &Store, name: &str, internal_url: &str) -> Result<i64, StoreError> {
    match register_if_free(store, (name, internal_url), i64::MIN / 2).await? {
        Joined::Registered { instance } => Ok(instance),
        Joined::Held { .. } => unreachable!("a lease of -inf is never held"),
    }
}

/// Renews the lease of `name`'s registration `instance`. `false`: the node was taken as stopped
/// meanwhile (its runs were ended by another node), or another process took the name after this
/// one's lease ran out; either way it must not go on as if it still owned its runs.
pub async fn renew(store: &Store, name: &str, instance: i64) -> Result<bool, StoreError> {
    let sql = timed(
        store.kind(),
        "UPDATE nodes SET heartbeat_at_ms = {now}
         WHERE name = $1 AND started_at_ms = $2 AND stopped_at_ms IS NULL",
    );
    let renewed = on_writer!(store, |p| sqlx::query(sql)
        .bind(name)
        .bind(instance)
        .execute(p)
        .await
        .map(|done| done.rows_affected())
        .context("renewing the node's lease"))?;
    Ok(renewed == 1)
}

/// A clean shutdown: registration `instance` of `name` is marked stopped (its runs have recorded
/// their endings); a later holder of the name is left alone.
pub async fn leave(store: &Store, name: &str, instance: i64) -> Result<(), StoreError> {
    let sql = timed(
        store.kind(),
        "UPDATE nodes SET stopped_at_ms = {now}, stop_reason = 'shut down', stopped_by = name
         WHERE name = $1 AND started_at_ms = $2 AND stopped_at_ms IS NULL",
    );
    on_writer!(store, |p| sqlx::query(sql)
        .bind(name)
        .bind(instance)
        .execute(p)
        .await
        .map(|done| done.rows_affected())
        .context("marking the node stopped"))?;
    Ok(())
}

/// Every node, newest heartbeat first.
pub async fn list(store: &Store) -> Result<Vec<NodeRecord>, StoreError> {
    let sql = timed(
        store.kind(),
        "SELECT name, internal_url, {now} - heartbeat_at_ms AS age, stop_reason, started_at_ms
         FROM nodes ORDER BY heartbeat_at_ms DESC, name",
    );
    on_readers!(store, |p| Ok(sqlx::query(sql)
        .fetch_all(p)
        .await
        .context("listing nodes")?
        .iter()
        .map(|row| NodeRecord {
            name: row.text("name"),
            internal_url: row.text("internal_url"),
            lease_age_ms: row.int("age"),
            stopped: row.opt_text("stop_reason"),
            instance: row.int("started_at_ms"),
        })
        .collect()))
}

/// Nodes other than `me` that have not stopped but were silent longer than `lease_ms`.
pub async fn silent(store: &Store, me: &str, lease_ms: i64) -> Result<Vec<String>, StoreError> {
    let sql = timed(
        store.kind(),
        "SELECT name FROM nodes
         WHERE name != $1 AND stopped_at_ms IS NULL AND heartbeat_at_ms < {now} - $2",
    );
    on_readers!(store, |p| sqlx::query_scalar(sql)
        .bind(me)
        .bind(lease_ms)
        .fetch_all(p)
        .await
        .context("finding silent nodes"))
}

/// Takes silent node `dead` as stopped, if no other node did first and it is still silent (the
/// guarded UPDATE is the claim): its running runs end failed with `NODE_STOPPED` and their
/// conversations are released. Returns how many runs were ended, `None` when another node (or the
/// node itself, renewing its lease) came first.
pub async fn take_over_stopped(
    store: &Store,
    dead: &str,
    by: &str,
    lease_ms: i64,
) -> Result<Option<u64>, StoreError> {
    write_tx!(store, "committing a silent node's end", |tx| {
        let sql = timed(
            store.kind(),
            "UPDATE nodes SET stopped_at_ms = {now}, stop_reason = 'lease expired',
                 stopped_by = $2
             WHERE name = $1 AND stopped_at_ms IS NULL AND heartbeat_at_ms < {now} - $3",
        );
        let claimed = on_tx!(&mut tx, |c| sqlx::query(sql)
            .bind(dead)
            .bind(by)
            .bind(lease_ms)
            .execute(&mut *c)
            .await
            .map(|done| done.rows_affected())
            .context("claiming a silent node"))?;
        if claimed != 1 {
            return Ok(None);
        }
        Ok(Some(end_runs_of(&mut tx, dead, NODE_STOPPED).await?))
    })
}

/// Runs this node left `running` when it last stopped (killed before its lease ran out, so no
/// other node ended them): ended as `runs::reconcile_interrupted` ends a single node's, leaving
/// other nodes' runs alone. Called once at start, before any run begins.
pub async fn reconcile_own(store: &Store, node: &str) -> Result<u64, StoreError> {
    write_tx!(store, "committing the node's old runs", |tx| {
        end_runs_of(
            &mut tx,
            node,
            "the server stopped while the run was in progress",
        )
        .await
    })
}

/// Ends `node`'s running runs with `reason` and releases their conversations. Released, a
/// conversation's owner becomes a name no run has: the next run on it takes it over as usual, and
/// until then nobody may append to it — not even the stopped node's run, should the node be
/// alive after all (a network partition): its late writes are refused by the owner trigger.
async fn end_runs_of(tx: &mut Tx, node: &str, reason: &str) -> Result<u64, StoreError> {
    let end = timed(
        tx.kind(),
        "UPDATE runs SET status = 'failed', error_code = 'aborted', error_message = $2,
             finished_at_ms = {now}
         WHERE node = $1 AND status = 'running'",
    );
    on_tx!(tx, |c| {
        sqlx::query(
            "UPDATE conversations SET owner_request_id = 'released:' || owner_request_id
             WHERE owner_request_id IN
                 (SELECT request_id FROM runs WHERE node = $1 AND status = 'running')",
        )
        .bind(node)
        .execute(&mut *c)
        .await
        .map(|done| done.rows_affected())
        .context("releasing a stopped node's conversations")?;
        sqlx::query(end)
            .bind(node)
            .bind(reason)
            .execute(&mut *c)
            .await
            .map(|done| done.rows_affected())
            .context("ending a stopped node's runs")
    })
}

/// The node that owns `request_id`, if any node claimed it.
pub async fn run_owner(
    store: &Store,
    request_id: &str,
    lease_ms: i64,
) -> Result<Option<RunOwner>, StoreError> {
    // `live` is a boolean on PostgreSQL and 0/1 on SQLite; both decode as `bool`, NULL (a node
    // that never registered) as `None`.
    let sql = timed(
        store.kind(),
        "SELECT c.node, n.internal_url,
             (n.stopped_at_ms IS NULL AND n.heartbeat_at_ms >= {now} - $2) AS live
         FROM run_claims c LEFT JOIN nodes n ON n.name = c.node
         WHERE c.request_id = $1",
    );
    on_readers!(store, |p| Ok(sqlx::query(sql)
        .bind(request_id)
        .bind(lease_ms)
        .fetch_optional(p)
        .await
        .context("finding a run's node")?
        .map(|row| RunOwner {
            node: row.text("node"),
            internal_url: row.opt_text("internal_url"),
            live: sqlx::Row::get::<Option<bool>, _>(&row, "live").unwrap_or(false),
        })))
}

/// Claims `request_id` for `node` unless a node already did; returns the node that owns it now
/// (the first claimer).
pub async fn claim_run(store: &Store, request_id: &str, node: &str) -> Result<String, StoreError> {
    write_tx!(store, "committing a run's claim", |tx| {
        let sql = timed(
            store.kind(),
            "INSERT INTO run_claims (request_id, node, claimed_at_ms) VALUES ($1, $2, {now})
             ON CONFLICT (request_id) DO NOTHING",
        );
        on_tx!(&mut tx, |c| {
            sqlx::query(sql)
                .bind(request_id)
                .bind(node)
                .execute(&mut *c)
                .await
                .map(|done| done.rows_affected())
                .context("claiming a run")?;
            sqlx::query_scalar("SELECT node FROM run_claims WHERE request_id = $1")
                .bind(request_id)
                .fetch_one(&mut *c)
                .await
                .context("reading a run's claim")
        })
    })
}

/// Forgets claims older than `max_age_ms` (their runs ended long ago; a request id is not reused).
pub async fn forget_claims(store: &Store, max_age_ms: i64) -> Result<u64, StoreError> {
    let sql = timed(
        store.kind(),
        "DELETE FROM run_claims WHERE claimed_at_ms < {now} - $1",
    );
    on_writer!(store, |p| sqlx::query(sql)
        .bind(max_age_ms)
        .execute(p)
        .await
        .map(|done| done.rows_affected())
        .context("forgetting old run claims"))
}

/// The run still running on `conversation_id` on a node other than `me`, if any: its request id,
/// its node and where that node is reached.
pub async fn conversation_run_elsewhere(
    store: &Store,
    conversation_id: &str,
    me: &str,
) -> Result<Option<(String, String, String)>, StoreError> {
    on_readers!(store, |p| sqlx::query_as(
        "SELECT r.request_id, r.node, n.internal_url
         FROM conversations c
         JOIN runs r ON r.request_id = c.owner_request_id
         JOIN nodes n ON n.name = r.node
         WHERE c.id = $1 AND r.status = 'running' AND r.node != $2 AND n.stopped_at_ms IS NULL",
    )
    .bind(conversation_id)
    .bind(me)
    .fetch_optional(p)
    .await
    .context("finding the conversation's run on another node"))
}

/// The runs running now on live nodes other than `me`, oldest first: (request id, node).
pub async fn running_elsewhere(
    store: &Store,
    me: &str,
) -> Result<Vec<(String, String)>, StoreError> {
    on_readers!(store, |p| sqlx::query_as(
        "SELECT r.request_id, r.node FROM runs r JOIN nodes n ON n.name = r.node
         WHERE r.status = 'running' AND r.node != $1 AND n.stopped_at_ms IS NULL
         ORDER BY r.started_at_ms, r.request_id",
    )
    .bind(me)
    .fetch_all(p)
    .await
    .context("listing the other nodes' running runs"))
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn store() -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().expect("tempdir");
        let url = format!("sqlite://{}", dir.path().join("t.db").display());
        let store = Store::open(&url).await.expect("store");
        (dir, store)
    }

    #[tokio::test]
    async fn the_first_claimer_owns_a_run_and_a_silent_node_is_taken_over_once() {
        let (_dir, store) = store().await;
        let a = register(&store, "a", "http://a").await.unwrap();
        register(&store, "b", "http://b").await.unwrap();
        assert_eq!(claim_run(&store, "r1", "a").await.unwrap(), "a");
        assert_eq!(claim_run(&store, "r1", "b").await.unwrap(), "a");
        let owner = run_owner(&store, "r1", 60_000).await.unwrap().unwrap();
        assert_eq!(owner.node, "a");
        assert!(owner.live);
        assert_eq!(owner.internal_url.as_deref(), Some("http://a"));
        assert_eq!(run_owner(&store, "nope", 60_000).await.unwrap(), None);

        crate::store::runs::start_on(&store, "r1", "c1", ("m", "m"), Some("a"))
            .await
            .unwrap();
        // Within its lease nobody takes a over.
        assert_eq!(
            take_over_stopped(&store, "a", "b", 60_000).await.unwrap(),
            None
        );
        // Past it (a lease of -1 ms: any heartbeat is too old), exactly one node does.
        assert_eq!(
            take_over_stopped(&store, "a", "b", -1).await.unwrap(),
            Some(1)
        );
        assert_eq!(take_over_stopped(&store, "a", "c", -1).await.unwrap(), None);
        let run = crate::store::runs::get(&store, "r1")
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            run.outcome.error.map(|(_, m)| m).as_deref(),
            Some(NODE_STOPPED)
        );
        assert!(
            !renew(&store, "a", a).await.unwrap(),
            "a was taken as stopped"
        );
        assert!(!run_owner(&store, "r1", 60_000).await.unwrap().unwrap().live);
        // The stopped run may not write any more; the next run may.
        use crate::model::message::{CanonicalMessage, Origin, UserMessage};
        let message = CanonicalMessage::User(UserMessage {
            images: Vec::new(),
            shown_as: None,
            state_before: None,
            origin: Origin::User,
            text: "late".into(),
            client_message_id: String::new(),
            mode: None,
            runtime: None,
        });
        assert!(matches!(
            crate::store::messages::append(&store, "c1", "r1", &[message]).await,
            Err(StoreError::NotOwner { .. })
        ));
        let again = register(&store, "a", "http://a").await.unwrap();
        assert!(renew(&store, "a", again).await.unwrap(), "a joined again");
        let names: Vec<_> = list(&store)
            .await
            .unwrap()
            .into_iter()
            .map(|n| n.name)
            .collect();
        assert_eq!(names.len(), 2);
    }
}
