-- cursor-server schema on PostgreSQL, version 14: SQLite's migrations/0014_auth.sql (people on a
-- shared server, issue 28), with BIGINT for SQLite's INTEGER, BYTEA for BLOB and BIGSERIAL for
-- the audit log's id. See that file for what each table and column means.

CREATE TABLE users (
    email         TEXT PRIMARY KEY,
    team          TEXT,
    admin         BIGINT NOT NULL DEFAULT 0,
    disabled      BIGINT NOT NULL DEFAULT 0,
    limits        TEXT,
    created_at_ms BIGINT NOT NULL
);

CREATE TABLE user_tokens (
    token_sha256  BYTEA PRIMARY KEY,
    email         TEXT NOT NULL REFERENCES users (email),
    created_at_ms BIGINT NOT NULL
);

CREATE TABLE teams (
    name          TEXT PRIMARY KEY,
    limits        TEXT,
    created_at_ms BIGINT NOT NULL
);

CREATE TABLE audit_log (
    id      BIGSERIAL PRIMARY KEY,
    at_ms   BIGINT NOT NULL,
    actor   TEXT,
    action  TEXT NOT NULL,
    subject TEXT,
    detail  TEXT
);

CREATE INDEX audit_log_by_time ON audit_log (at_ms);

CREATE TABLE budget_counters (
    scope          TEXT NOT NULL,
    period         TEXT NOT NULL,
    cost_micro_usd BIGINT NOT NULL DEFAULT 0,
    tokens         BIGINT NOT NULL DEFAULT 0,
    calls          BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (scope, period)
);

ALTER TABLE conversations ADD COLUMN owner_user TEXT;

CREATE INDEX conversations_by_owner ON conversations (owner_user);
