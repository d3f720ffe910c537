-- cursor-server schema, version 14: people on a shared server (issue 28).
--
-- `users`: everyone the server knows, by e-mail (lower case): seeded from the file's [[users]] and
-- [[teams]] members, added by `cursor-server users add`, or met through a verified identity.
-- `team` is the one team whose limits apply; `limits` a JSON object of per-person overrides.
-- `user_tokens`: tokens issued to a person (`tokens` mode), only as their SHA-256: the token itself
-- is printed once and never stored.
-- `teams`: a team's limits (JSON), seeded from the file.
-- `audit_log`: admin actions and refusals (refusals are rate limited before they reach it).
-- `budget_counters`: spend per scope (`user:EMAIL`, `team:NAME`) and period (`day:2026-12-06`,
-- `month:2026-12`), shared by every node on the database.
-- `conversations.owner_user`: the person a conversation belongs to (NULL: made before, or on a
-- server without [auth]).

CREATE TABLE users (
    email         TEXT PRIMARY KEY,
    team          TEXT,
    admin         INTEGER NOT NULL DEFAULT 0,
    disabled      INTEGER NOT NULL DEFAULT 0,
    limits        TEXT,
    created_at_ms INTEGER NOT NULL
);

CREATE TABLE user_tokens (
    token_sha256  BLOB PRIMARY KEY,
    email         TEXT NOT NULL REFERENCES users (email),
    created_at_ms INTEGER NOT NULL
);

CREATE TABLE teams (
    name          TEXT PRIMARY KEY,
    limits        TEXT,
    created_at_ms INTEGER NOT NULL
);

CREATE TABLE audit_log (
    id      INTEGER PRIMARY KEY AUTOINCREMENT,
    at_ms   INTEGER NOT NULL,
    actor   TEXT,
    action  TEXT NOT NULL,
    subject TEXT,
    detail  TEXT
);

CREATE INDEX audit_log_by_time ON audit_log (at_ms);

CREATE TABLE budget_counters (
    scope          TEXT NOT NULL,
    period         TEXT NOT NULL,
    cost_micro_usd INTEGER NOT NULL DEFAULT 0,
    tokens         INTEGER NOT NULL DEFAULT 0,
    calls          INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (scope, period)
);

ALTER TABLE conversations ADD COLUMN owner_user TEXT;

CREATE INDEX conversations_by_owner ON conversations (owner_user);
