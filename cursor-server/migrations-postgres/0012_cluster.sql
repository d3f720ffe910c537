-- cursor-server schema on PostgreSQL, version 12: SQLite's migrations/0012_cluster.sql (several
-- nodes on one database, issue 27), with BIGINT for SQLite's INTEGER. See that file for what each
-- table and column means; the times are the database's clock (store/nodes.rs).

CREATE TABLE nodes (
    name            TEXT PRIMARY KEY,
    internal_url    TEXT   NOT NULL,
    started_at_ms   BIGINT NOT NULL,
    heartbeat_at_ms BIGINT NOT NULL,
    stopped_at_ms   BIGINT,
    stop_reason     TEXT,
    stopped_by      TEXT
);

CREATE TABLE run_claims (
    request_id    TEXT PRIMARY KEY,
    node          TEXT   NOT NULL,
    claimed_at_ms BIGINT NOT NULL
);

CREATE INDEX run_claims_by_age ON run_claims (claimed_at_ms);

ALTER TABLE runs ADD COLUMN node TEXT;

CREATE INDEX runs_running_by_node ON runs (node) WHERE status = 'running';
