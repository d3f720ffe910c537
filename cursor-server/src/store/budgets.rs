//! Spend counters (`[auth]` budgets): cost in micro-dollars, tokens and provider calls per scope
//! (`user:EMAIL`, `team:NAME`) and period (`day:…`, `month:…`, `minute:…`), in the store so every
//! node on the database enforces the same budget. One upsert per scope and period per call.

use super::{Columns, QueryContext, Store, StoreError};

/// What one scope spent in one period.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Spent {
    pub cost_micro_usd: i64,
    pub tokens: i64,
    pub calls: i64,
}

/// A row's `cost_micro_usd`, `tokens` and `calls`.
fn spent_of(row: &impl Columns) -> Spent {
    Spent {
        cost_micro_usd: row.int("cost_micro_usd"),
        tokens: row.int("tokens"),
        calls: row.int("calls"),
    }
}

/// What one provider call adds to the counters: `spent` to every scope in every period.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Charge {
    /// `user:EMAIL` and, when the person has one, `team:NAME`.
    pub scopes: Vec<String>,
    /// `day:…` and `month:…`.
    pub periods: Vec<String>,
    pub spent: Spent,
}

/// Adds `charge` to the counters, in one transaction.
pub async fn charge(store: &Store, charge: &Charge) -> Result<(), StoreError> {
    write_tx!(store, "charging a budget", |tx| add(&mut tx, charge).await)
}

/// Records a provider call and charges it to its person (and team) in one transaction: the
/// counters add up exactly to the recorded calls, on every node.
pub async fn record_charged_call(
    store: &Store,
    call: &super::runs::ProviderCallRecord,
    charge: &Charge,
) -> Result<(), StoreError> {
    write_tx!(store, "recording and charging a provider call", |tx| {
        super::runs::insert_provider_call(&mut tx, call).await?;
        add(&mut tx, charge).await
    })
}

/// Adds `charge` inside a write transaction.
async fn add(tx: &mut super::Tx, charge: &Charge) -> Result<(), StoreError> {
    for scope in &charge.scopes {
        for period in &charge.periods {
            on_tx!(&mut *tx, |c| sqlx::query(
                "INSERT INTO budget_counters (scope, period, cost_micro_usd, tokens, calls)
                 VALUES ($1, $2, $3, $4, $5)
                 ON CONFLICT (scope, period) DO UPDATE SET
                     cost_micro_usd = budget_counters.cost_micro_usd + excluded.cost_micro_usd,
                     tokens = budget_counters.tokens + excluded.tokens,
                     calls = budget_counters.calls + excluded.calls"
            )
            .bind(scope)
            .bind(period)
            .bind(charge.spent.cost_micro_usd)
            .bind(charge.spent.tokens)
            .bind(charge.spent.calls)
            .execute(c)
            .await
            .map(|done| done.rows_affected())
            .context("charging a budget"))?;
        }
    }
    Ok(())
}

/// Counts one provider call against `scope`'s `limit` calls in `period` (a minute), unless it
/// has them all: one conditional upsert, so concurrent calls (on any node) cannot overshoot.
/// Returns whether the call was counted (`false`: the limit is reached).
pub async fn count_call(
    store: &Store,
    scope: &str,
    period: &str,
    limit: i64,
) -> Result<bool, StoreError> {
    write_tx!(store, "counting a call against a limit", |tx| {
        let counted: Option<i64> = on_tx!(&mut tx, |c| sqlx::query_scalar(
            "INSERT INTO budget_counters (scope, period, cost_micro_usd, tokens, calls)
             VALUES ($1, $2, 0, 0, 1)
             ON CONFLICT (scope, period) DO UPDATE SET calls = budget_counters.calls + 1
             WHERE budget_counters.calls < $3
             RETURNING calls"
        )
        .bind(scope)
        .bind(period)
        .bind(limit)
        .fetch_optional(c)
        .await
        .context("counting a call against a limit"))?;
        Ok(counted.is_some())
    })
}

/// What `scope` spent in each of `periods` (zero where nothing was counted), in one query.
pub async fn read(
    store: &Store,
    scope: &str,
    periods: &[String; 3],
) -> Result<[Spent; 3], StoreError> {
    const SQL: &str = "SELECT period, cost_micro_usd, tokens, calls FROM budget_counters
         WHERE scope = $1 AND period IN ($2, $3, $4)";
    let rows: Vec<(String, Spent)> = on_readers!(store, |p| Ok::<_, StoreError>(
        sqlx::query(SQL)
            .bind(scope)
            .bind(&periods[0])
            .bind(&periods[1])
            .bind(&periods[2])
            .fetch_all(p)
            .await
            .context("reading a budget")?
            .iter()
            .map(|row| (row.text("period"), spent_of(row)))
            .collect()
    ))?;
    let mut out = [Spent::default(); 3];
    for (period, spent) in rows {
        if let Some(i) = periods.iter().position(|p| *p == period) {
            out[i] = spent;
        }
    }
    Ok(out)
}

/// Where a person stands before a provider call: what they and their team spent in each of the
/// three periods, how many runs of theirs are in progress (on every node), and how many nodes
/// hold a live lease (they share the person's headroom).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Standing {
    pub person: [Spent; 3],
    pub team: [Spent; 3],
    pub running: i64,
    pub live_nodes: i64,
}

/// What a standing is read for besides the person's own counters.
#[derive(Debug, Clone, Copy, Default)]
pub struct Asked<'a> {
    /// The team whose counters are read too (one with a total).
    pub team: Option<&'a str>,
    /// Whether their runs in progress are counted (`concurrent_runs` is set).
    pub runs: bool,
    /// `[cluster]`: count the nodes whose lease is younger than this.
    pub lease_ms: Option<i64>,
}

/// `email`'s standing in `periods`: their counters and what `asked` names, in one query (a budget
/// check is one round trip on the call's way). The live nodes are counted here, not by the lease
/// loop, so a node that joined a moment ago already shares the headroom.
pub async fn standing(
    store: &Store,
    email: &str,
    periods: &[String; 3],
    asked: Asked<'_>,
) -> Result<Standing, StoreError> {
    // The counts ride in `calls` under scopes no counter has ('running', 'nodes'); the nodes'
    // leases are timed by the database's clock, as everywhere (`store/nodes.rs`).
    const SQL: &str = "SELECT scope, period, cost_micro_usd, tokens, calls FROM budget_counters
         WHERE scope IN ($1, $2) AND period IN ($3, $4, $5)
         UNION ALL
         SELECT 'running' AS scope, '' AS period, 0 AS cost_micro_usd, 0 AS tokens,
                COUNT(*) AS calls
         FROM runs r JOIN conversations c ON c.id = r.conversation_id
         WHERE $6 = 1 AND r.status = 'running' AND c.owner_user = $7
         UNION ALL
         SELECT 'nodes' AS scope, '' AS period, 0 AS cost_micro_usd, 0 AS tokens,
                COUNT(*) AS calls
         FROM nodes WHERE $8 >= 0 AND stopped_at_ms IS NULL AND heartbeat_at_ms >= {now} - $8";
    let person_scope = format!("user:{email}");
    let team_scope = asked.team.map(|t| format!("team:{t}"));
    let sql = super::nodes::timed(store.kind(), SQL);
    let rows: Vec<(String, String, Spent)> = on_readers!(store, |p| Ok::<_, StoreError>(
        sqlx::query(sql)
            .bind(&person_scope)
            .bind(&team_scope)
            .bind(&periods[0])
            .bind(&periods[1])
            .bind(&periods[2])
            .bind(i64::from(asked.runs))
            .bind(email)
            .bind(asked.lease_ms.unwrap_or(-1))
            .fetch_all(p)
            .await
            .context("reading a person's standing")?
            .iter()
            .map(|row| (row.text("scope"), row.text("period"), spent_of(row)))
            .collect()
    ))?;
    let mut out = Standing::default();
    for (scope, period, spent) in rows {
        match scope.as_str() {
            "running" => out.running = spent.calls,
            "nodes" => out.live_nodes = spent.calls,
            _ => {
                let Some(i) = periods.iter().position(|p| *p == period) else {
                    continue;
                };
                if scope == person_scope {
                    out.person[i] = spent;
                } else if team_scope.as_deref() == Some(scope.as_str()) {
                    out.team[i] = spent;
                }
            }
        }
    }
    Ok(out)
}

/// Everything `scope` spent in the periods whose key starts with `kind` (`day:`, `month:`).
pub async fn total(store: &Store, scope: &str, kind: &str) -> Result<Spent, StoreError> {
    // PostgreSQL's SUM of BIGINT is NUMERIC: cast back.
    const SQL: &str = "SELECT CAST(COALESCE(SUM(cost_micro_usd), 0) AS BIGINT) AS cost_micro_usd,
             CAST(COALESCE(SUM(tokens), 0) AS BIGINT) AS tokens,
             CAST(COALESCE(SUM(calls), 0) AS BIGINT) AS calls
         FROM budget_counters WHERE scope = $1 AND period LIKE $2";
    let pattern = format!("{kind}%");
    on_readers!(store, |p| {
        let row = sqlx::query(SQL)
            .bind(scope)
            .bind(&pattern)
            .fetch_one(p)
            .await
            .context("totalling a budget")?;
        Ok(spent_of(&row))
    })
}

/// Tokens of the provider calls of one day, person, provider and model (`[auth]`).
#[derive(Debug, Clone, PartialEq)]
pub struct PersonUsage {
    /// `YYYY-MM-DD` (UTC).
    pub day: String,
    /// `None`: calls on conversations of nobody (before `[auth]`).
    pub user: Option<String>,
    pub team: Option<String>,
    pub provider: String,
    pub model_id: String,
    pub calls: u64,
    pub usage: crate::model::usage::Usage,
}

/// Usage per day, person (with their team), provider and model since `since_ms`; only `owner`'s
/// when given.
pub async fn usage_by_person(
    store: &Store,
    since_ms: i64,
    owner: Option<&str>,
) -> Result<Vec<PersonUsage>, StoreError> {
    let day = match store.kind() {
        super::DatabaseKind::Sqlite => "date(p.started_at_ms / 1000, 'unixepoch')",
        super::DatabaseKind::Postgres => {
            "to_char(to_timestamp(p.started_at_ms / 1000) AT TIME ZONE 'UTC', 'YYYY-MM-DD')"
        }
    };
    let sql = format!(
        "SELECT {day} AS day, c.owner_user AS user_email, u.team AS team, p.provider, p.model_id,
                COUNT(*) AS calls,
                CAST(SUM(p.input_tokens) AS BIGINT) AS input_tokens,
                CAST(SUM(p.output_tokens) AS BIGINT) AS output_tokens,
                CAST(SUM(p.cache_read_tokens) AS BIGINT) AS cache_read_tokens,
                CAST(SUM(p.cache_write_tokens) AS BIGINT) AS cache_write_tokens,
                CAST(SUM(p.reasoning_tokens) AS BIGINT) AS reasoning_tokens
         FROM provider_calls p
         LEFT JOIN conversations c ON c.id = p.conversation_id
         LEFT JOIN users u ON u.email = c.owner_user
         WHERE p.started_at_ms >= $1 AND ($2 IS NULL OR c.owner_user = $2)
         GROUP BY day, c.owner_user, u.team, p.provider, p.model_id
         ORDER BY day, c.owner_user, p.provider, p.model_id"
    );
    on_readers!(store, |p| Ok(sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(since_ms)
        .bind(owner)
        .fetch_all(p)
        .await
        .context("summing usage per person")?
        .iter()
        .map(|row| PersonUsage {
            day: row.text("day"),
            user: row.opt_text("user_email"),
            team: row.opt_text("team"),
            provider: row.text("provider"),
            model_id: row.text("model_id"),
            calls: row.int("calls").max(0) as u64,
            usage: super::runs::usage_of(row),
        })
        .collect()))
}
