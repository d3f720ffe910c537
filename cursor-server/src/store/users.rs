//! People on a shared server (`[auth]`): users and their hashed tokens, teams, who owns a
//! conversation, and the audit log of admin actions and refusals. Tokens are only ever stored as
//! their SHA-256.

use super::{Columns, QueryContext, Store, StoreError, Tx, now_ms};

/// One person as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserRecord {
    /// Lower case; the key.
    pub email: String,
    pub team: Option<String>,
    pub admin: bool,
    pub disabled: bool,
    /// Per-person limit overrides (a JSON object of `config::auth::Limits`).
    pub limits: Option<String>,
}

fn user_of(row: &impl Columns) -> UserRecord {
    UserRecord {
        email: row.text("email"),
        team: row.opt_text("team"),
        admin: row.int("admin") != 0,
        disabled: row.int("disabled") != 0,
        limits: row.opt_text("limits"),
    }
}

/// Records `email` if it is new, and sets its team and admin flag (the file decides these for the
/// people it lists; `None` team leaves the stored one). Returns the record.
pub async fn upsert(
    store: &Store,
    email: &str,
    team: Option<&str>,
    admin: bool,
) -> Result<UserRecord, StoreError> {
    write_tx!(store, "recording a user", |tx| {
        upsert_in(&mut tx, email, team, admin).await
    })?;
    get(store, email).await?.ok_or(StoreError::Query {
        context: "reading the user just recorded",
        source: sqlx::Error::RowNotFound,
    })
}

async fn upsert_in(
    tx: &mut Tx,
    email: &str,
    team: Option<&str>,
    admin: bool,
) -> Result<(), StoreError> {
    on_tx!(tx, |c| {
        sqlx::query(
            "INSERT INTO users (email, team, admin, created_at_ms) VALUES ($1, $2, $3, $4)
             ON CONFLICT (email) DO UPDATE SET team = COALESCE($2, users.team), admin = $3",
        )
        .bind(email)
        .bind(team)
        .bind(i64::from(admin))
        .bind(now_ms())
        .execute(c)
        .await
        .map(|done| done.rows_affected())
        .context("recording a user")
    })?;
    Ok(())
}

/// Records `email` as met through a verified identity, if it is new (a stored record is kept).
pub async fn ensure(store: &Store, email: &str) -> Result<UserRecord, StoreError> {
    if let Some(found) = get(store, email).await? {
        return Ok(found);
    }
    on_writer!(store, |w| sqlx::query(
        "INSERT INTO users (email, created_at_ms) VALUES ($1, $2) ON CONFLICT DO NOTHING"
    )
    .bind(email)
    .bind(now_ms())
    .execute(w)
    .await
    .map(|done| done.rows_affected())
    .context("recording a user"))?;
    get(store, email).await?.ok_or(StoreError::Query {
        context: "reading the user just recorded",
        source: sqlx::Error::RowNotFound,
    })
}

pub async fn get(store: &Store, email: &str) -> Result<Option<UserRecord>, StoreError> {
    const SQL: &str = "SELECT email, team, admin, disabled, limits FROM users WHERE email = $1";
    on_readers!(store, |p| Ok(sqlx::query(SQL)
        .bind(email)
        .fetch_optional(p)
        .await
        .context("reading a user")?
        .as_ref()
        .map(user_of)))
}

/// The person a token was issued to (by the token's SHA-256).
pub async fn by_token(store: &Store, sha256: &[u8]) -> Result<Option<UserRecord>, StoreError> {
    const SQL: &str = "SELECT u.email, u.team, u.admin, u.disabled, u.limits
         FROM user_tokens t JOIN users u ON u.email = t.email WHERE t.token_sha256 = $1";
    on_readers!(store, |p| Ok(sqlx::query(SQL)
        .bind(sha256)
        .fetch_optional(p)
        .await
        .context("looking a token up")?
        .as_ref()
        .map(user_of)))
}

/// Issues a token to `email` (recording the person if new): only its SHA-256 is stored.
pub async fn add_token(store: &Store, email: &str, sha256: &[u8]) -> Result<(), StoreError> {
    write_tx!(store, "issuing a token", |tx| {
        on_tx!(&mut tx, |c| {
            sqlx::query(
                "INSERT INTO users (email, created_at_ms) VALUES ($1, $2) ON CONFLICT DO NOTHING",
            )
            .bind(email)
            .bind(now_ms())
            .execute(&mut *c)
            .await
            .map(|done| done.rows_affected())
            .context("recording a user")?;
            sqlx::query(
                "INSERT INTO user_tokens (token_sha256, email, created_at_ms) VALUES ($1, $2, $3)",
            )
            .bind(sha256)
            .bind(email)
            .bind(now_ms())
            .execute(&mut *c)
            .await
            .map(|done| done.rows_affected())
            .context("storing a token's hash")
        })?;
        Ok(())
    })
}

pub async fn list(store: &Store) -> Result<Vec<UserRecord>, StoreError> {
    const SQL: &str = "SELECT email, team, admin, disabled, limits FROM users ORDER BY email";
    on_readers!(store, |p| Ok(sqlx::query(SQL)
        .fetch_all(p)
        .await
        .context("listing users")?
        .iter()
        .map(user_of)
        .collect()))
}

/// Disables or enables `email`; `false` when there is no such person.
pub async fn set_disabled(store: &Store, email: &str, disabled: bool) -> Result<bool, StoreError> {
    let changed = on_writer!(store, |w| sqlx::query(
        "UPDATE users SET disabled = $1 WHERE email = $2"
    )
    .bind(i64::from(disabled))
    .bind(email)
    .execute(w)
    .await
    .map(|done| done.rows_affected())
    .context("disabling a user"))?;
    Ok(changed == 1)
}

/// Sets `email`'s limit overrides (a JSON object); `false` when there is no such person.
pub async fn set_limits(store: &Store, email: &str, limits: &str) -> Result<bool, StoreError> {
    let changed = on_writer!(store, |w| sqlx::query(
        "UPDATE users SET limits = $1 WHERE email = $2"
    )
    .bind(limits)
    .bind(email)
    .execute(w)
    .await
    .map(|done| done.rows_affected())
    .context("setting a user's limits"))?;
    Ok(changed == 1)
}

/// Records a team and its limits (a JSON object), replacing what was stored.
pub async fn upsert_team(store: &Store, name: &str, limits: &str) -> Result<(), StoreError> {
    on_writer!(store, |w| sqlx::query(
        "INSERT INTO teams (name, limits, created_at_ms) VALUES ($1, $2, $3)
         ON CONFLICT (name) DO UPDATE SET limits = $2"
    )
    .bind(name)
    .bind(limits)
    .bind(now_ms())
    .execute(w)
    .await
    .map(|done| done.rows_affected())
    .context("recording a team"))?;
    Ok(())
}

/// The person whose conversation `conversation_id` is (`None`: nobody's yet, or unknown).
pub async fn conversation_owner(
    store: &Store,
    conversation_id: &str,
) -> Result<Option<String>, StoreError> {
    on_readers!(store, |p| Ok(sqlx::query_scalar::<_, Option<String>>(
        "SELECT owner_user FROM conversations WHERE id = $1"
    )
    .bind(conversation_id)
    .fetch_optional(p)
    .await
    .context("reading a conversation's owner")?
    .flatten()))
}

/// The person whose conversation run `request_id` is on (`None`: no such run yet, or nobody's).
pub async fn run_owner(store: &Store, request_id: &str) -> Result<Option<String>, StoreError> {
    on_readers!(store, |p| Ok(sqlx::query_scalar::<_, Option<String>>(
        "SELECT c.owner_user FROM runs r JOIN conversations c ON c.id = r.conversation_id
         WHERE r.request_id = $1"
    )
    .bind(request_id)
    .fetch_optional(p)
    .await
    .context("reading a run's owner")?
    .flatten()))
}

/// One line of the audit log.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct AuditEntry {
    pub at_ms: i64,
    /// Who did it (`None`: the command line, or an unidentified client).
    pub actor: Option<String>,
    pub action: String,
    pub subject: Option<String>,
    pub detail: Option<String>,
}

pub async fn audit(store: &Store, entry: &AuditEntry) -> Result<(), StoreError> {
    on_writer!(store, |w| sqlx::query(
        "INSERT INTO audit_log (at_ms, actor, action, subject, detail) VALUES ($1, $2, $3, $4, $5)"
    )
    .bind(entry.at_ms)
    .bind(entry.actor.as_deref())
    .bind(&entry.action)
    .bind(entry.subject.as_deref())
    .bind(entry.detail.as_deref())
    .execute(w)
    .await
    .map(|done| done.rows_affected())
    .context("writing the audit log"))?;
    Ok(())
}

/// The newest `limit` audit entries, newest first.
pub async fn audit_log(store: &Store, limit: u32) -> Result<Vec<AuditEntry>, StoreError> {
    on_readers!(store, |p| Ok(sqlx::query(
        "SELECT at_ms, actor, action, subject, detail FROM audit_log ORDER BY id DESC LIMIT $1"
    )
    .bind(i64::from(limit))
    .fetch_all(p)
    .await
    .context("reading the audit log")?
    .iter()
    .map(|row| AuditEntry {
        at_ms: row.int("at_ms"),
        actor: row.opt_text("actor"),
        action: row.text("action"),
        subject: row.opt_text("subject"),
        detail: row.opt_text("detail"),
    })
    .collect()))
}

/// The time of `now_ms()`, for callers outside the store that stamp audit entries.
pub fn now() -> i64 {
    now_ms()
}
