//! The identity state `AppState` holds for `[auth]`: the configuration in force, the Cursor
//! tokens verified lately, which person each run of this node belongs to, the people read lately and
//! their provider calls in flight (`CallsInFlight`, for `budget`); the `Caller` type, the
//! headers and token format. A leaf of `auth/` (it imports no route or run code), so the state can
//! hold it and every part of `auth/` can read it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sha2::Digest as _;

use crate::config::auth::{AuthConfig, Limits};
use crate::store::budgets::Spent;
use crate::store::users::UserRecord;
use crate::store::{Store, StoreError, users};

/// The header carrying the verified person on a request inside this server and between nodes of
/// a cluster (set by the identity layer, never taken from a client; believed from a peer node only
/// with the cluster secret).
pub const USER_HEADER: &str = "x-cursor-byok-user";
/// The header a client that can send one carries its issued token in (`tokens` mode); a bearer
/// `Authorization: Bearer cbk_…` works too.
pub const TOKEN_HEADER: &str = "x-cursor-byok-token";
/// Every issued token starts with this (so a token is recognised beside Cursor's own bearer).
pub const TOKEN_PREFIX: &str = "cbk_";

/// A verified person.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// Lower case.
    pub email: String,
    pub team: Option<String>,
    pub admin: bool,
}

/// How long a run's person is remembered in memory (the store answers after that).
pub(super) const RUN_OWNER_TTL: Duration = Duration::from_secs(3600);
/// Past this many remembered runs, the ones older than `RUN_OWNER_TTL` are forgotten.
pub(super) const RUN_OWNERS_PRUNE_AT: usize = 4096;

/// How long a person's record this node read is used without reading it again. Identifying a
/// request reads it anyway (the token or the name must be looked up), so a run's budget check and
/// charge right after use that copy: a change by a `users` command or another node's people page
/// applies to calls that start at most this long after it; this node's people page forgets its
/// copy at once (`forget_person`).
pub const PERSON_FRESH: Duration = Duration::from_secs(1);
/// Past this many remembered people, the ones older than `PERSON_FRESH` are forgotten.
const PEOPLE_PRUNE_AT: usize = 4096;

/// `[auth]` in force: the configuration, the verified Cursor tokens and the runs' people.
pub struct Auth {
    pub config: AuthConfig,
    /// Cursor access tokens verified lately, by SHA-256 (`cursor_account`).
    pub(crate) cursor_tokens: TokenCache,
    /// Which person each run of this node belongs to, by request id.
    pub(super) run_owners: Mutex<HashMap<String, (String, Instant)>>,
    /// Each person's provider calls in flight on this node (`budget`).
    pub calls: Arc<CallsInFlight>,
    /// People's records read lately, by e-mail, and when each was read.
    people: Mutex<HashMap<String, (UserRecord, Instant)>>,
    /// Refusals written to the audit log in the current minute (a flood cannot fill the table).
    audited: Mutex<(Instant, u32)>,
}

/// Refusals written to the audit log per minute at most; the rest are only logged and counted.
const AUDITED_REFUSALS_PER_MINUTE: u32 = 30;

impl Auth {
    pub fn new(config: AuthConfig) -> Auth {
        Auth {
            config,
            cursor_tokens: TokenCache::default(),
            run_owners: Mutex::new(HashMap::new()),
            calls: Arc::default(),
            people: Mutex::new(HashMap::new()),
            audited: Mutex::new((Instant::now(), 0)),
        }
    }

    /// The person run `request_id` was admitted for, if this node admitted it.
    pub fn owner_of_run(&self, request_id: &str) -> Option<String> {
        self.run_owners
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(request_id)
            .map(|(email, _)| email.clone())
    }

    /// Remembers a person's record just read from the store.
    pub fn read_person(&self, record: &UserRecord) {
        let mut people = self.people.lock().unwrap_or_else(|e| e.into_inner());
        if people.len() >= PEOPLE_PRUNE_AT {
            people.retain(|_, (_, read)| read.elapsed() < PERSON_FRESH);
        }
        people.insert(record.email.clone(), (record.clone(), Instant::now()));
    }

    /// `email`'s record: the copy read less than `PERSON_FRESH` ago, else read again.
    pub async fn person(
        &self,
        store: &Store,
        email: &str,
    ) -> Result<Option<UserRecord>, StoreError> {
        let fresh = {
            let people = self.people.lock().unwrap_or_else(|e| e.into_inner());
            people
                .get(email)
                .filter(|(_, read)| read.elapsed() < PERSON_FRESH)
                .map(|(record, _)| record.clone())
        };
        if fresh.is_some() {
            return Ok(fresh);
        }
        let record = users::get(store, email).await?;
        if let Some(record) = &record {
            self.read_person(record);
        }
        Ok(record)
    }

    /// Forgets this node's copy of `email`'s record (after an admin changed it here).
    pub fn forget_person(&self, email: &str) {
        self.people
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(email);
    }

    /// Writes a refusal to the audit log, unless this minute's share is used up (then it is only
    /// in the log and the metric). Never waits for the write.
    pub fn audit_refusal(&self, store: &Store, actor: Option<String>, what: String, why: String) {
        {
            let mut audited = self.audited.lock().unwrap_or_else(|e| e.into_inner());
            if audited.0.elapsed() >= Duration::from_secs(60) {
                *audited = (Instant::now(), 0);
            }
            if audited.1 >= AUDITED_REFUSALS_PER_MINUTE {
                return;
            }
            audited.1 += 1;
        }
        let store = store.clone();
        let entry = users::AuditEntry {
            at_ms: users::now(),
            actor,
            action: "refused".to_owned(),
            subject: Some(what),
            detail: Some(why),
        };
        tokio::spawn(async move {
            if let Err(e) = users::audit(&store, &entry).await {
                tracing::warn!("writing a refusal to the audit log: {e}");
            }
        });
    }

    /// Records the file's people and teams in the store (the file seeds them; `users` commands
    /// change them at run time).
    pub async fn seed(&self, store: &Store) -> Result<(), StoreError> {
        for team in &self.config.teams {
            let limits = serde_json::to_string(&team.limits).unwrap_or_default();
            users::upsert_team(store, &team.name, &limits).await?;
            for member in &team.members {
                let admin = self.config.admins.contains(member);
                users::upsert(store, member, Some(&team.name), admin).await?;
            }
        }
        for admin in &self.config.admins {
            users::upsert(store, admin, None, true).await?;
        }
        for user in &self.config.users {
            let admin = self.config.admins.contains(&user.email);
            users::upsert(store, &user.email, None, admin).await?;
            if user.limits != Limits::default() {
                let limits = serde_json::to_string(&user.limits).unwrap_or_default();
                users::set_limits(store, &user.email, &limits).await?;
            }
        }
        Ok(())
    }
}

/// Removes this server's own identity headers from a request going to Cursor's backend (the
/// pass-through): an issued token or a verified user is never sent on.
pub fn strip_own_headers(headers: &mut axum::http::HeaderMap) {
    headers.remove(TOKEN_HEADER);
    headers.remove(USER_HEADER);
    let ours = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with(&format!("Bearer {TOKEN_PREFIX}")));
    if ours {
        headers.remove(axum::http::header::AUTHORIZATION);
    }
}

/// Whether `token` is one this server issued to a person who is not disabled.
pub async fn issued(store: &Store, token: &str) -> bool {
    token.starts_with(TOKEN_PREFIX)
        && matches!(
            users::by_token(store, &token_hash(token)).await,
            Ok(Some(record)) if !record.disabled
        )
}

/// The SHA-256 of a token: all that is stored or cached of it.
pub fn token_hash(token: &str) -> [u8; 32] {
    sha2::Sha256::digest(token.as_bytes()).into()
}

/// A new token to issue: the prefix and 244 random bits in hex.
pub fn new_token() -> String {
    format!(
        "{TOKEN_PREFIX}{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    )
}

/// Past this many cached tokens, expired ones are dropped.
const PRUNE_AT: usize = 10_000;

/// Verified tokens by SHA-256: the account's e-mail and when the answer expires.
#[derive(Default)]
pub struct TokenCache {
    entries: Mutex<HashMap<[u8; 32], (String, Instant)>>,
    /// Verifications asked of Cursor's backend (for the metrics and tests).
    pub(super) asked: AtomicU64,
}

impl TokenCache {
    pub(super) fn get(&self, hash: &[u8; 32]) -> Option<String> {
        let entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries
            .get(hash)
            .filter(|(_, expires)| *expires > Instant::now())
            .map(|(email, _)| email.clone())
    }

    pub(super) fn put(&self, hash: [u8; 32], email: String, ttl: Duration) {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        if entries.len() >= PRUNE_AT {
            let now = Instant::now();
            entries.retain(|_, (_, expires)| *expires > now);
        }
        entries.insert(hash, (email, Instant::now() + ttl));
    }

    /// How many times Cursor's backend was asked.
    pub fn asked(&self) -> u64 {
        self.asked.load(Ordering::Relaxed)
    }
}

/// Each person's provider calls in flight on this node, and the largest call charged here.
#[derive(Default)]
pub struct CallsInFlight {
    people: Mutex<HashMap<String, PersonCalls>>,
    /// Told whenever a call ends (its place is released).
    pub(super) released: tokio::sync::Notify,
}

#[derive(Debug, Default, Clone, Copy)]
struct PersonCalls {
    in_flight: u32,
    /// The largest cost and the most tokens one call of theirs was charged on this node.
    largest: Option<Spent>,
}

/// Past this many people remembered, those with nothing in flight are forgotten.
const CALLERS_PRUNE_AT: usize = 4096;

/// One admitted call of `email`, counted in flight until dropped.
pub struct Admitted {
    table: Arc<CallsInFlight>,
    email: String,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        {
            let mut people = self.table.people.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(calls) = people.get_mut(&self.email) {
                calls.in_flight = calls.in_flight.saturating_sub(1);
            }
        }
        self.table.released.notify_waiters();
    }
}

impl CallsInFlight {
    /// Admits a call of `email` when `fits(calls in flight here, largest call)` says so.
    pub(super) fn try_admit(
        self: &Arc<Self>,
        email: &str,
        fits: impl FnOnce(u32, Option<Spent>) -> bool,
    ) -> Option<Admitted> {
        let mut people = self.people.lock().unwrap_or_else(|e| e.into_inner());
        if people.len() >= CALLERS_PRUNE_AT && !people.contains_key(email) {
            people.retain(|_, calls| calls.in_flight > 0);
        }
        let calls = people.entry(email.to_owned()).or_default();
        if !fits(calls.in_flight, calls.largest) {
            return None;
        }
        calls.in_flight += 1;
        Some(Admitted {
            table: Arc::clone(self),
            email: email.to_owned(),
        })
    }

    /// Remembers what a call of `email` was charged (the largest so far bounds the next ones).
    pub(super) fn charged(&self, email: &str, spent: Spent) {
        let mut people = self.people.lock().unwrap_or_else(|e| e.into_inner());
        let calls = people.entry(email.to_owned()).or_default();
        let largest = calls.largest.unwrap_or_default();
        calls.largest = Some(Spent {
            cost_micro_usd: largest.cost_micro_usd.max(spent.cost_micro_usd),
            tokens: largest.tokens.max(spent.tokens),
            calls: 1,
        });
    }
}
