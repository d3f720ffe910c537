-- cursor-server schema, version 12: several nodes on one database (issue 27).
--
-- `nodes`: every node that ever joined, with its lease. A node renews `heartbeat_at_ms` (the
-- database's clock, so nodes on machines whose clocks differ agree) every third of its lease; a
-- node silent past the lease is taken as stopped by one surviving node, which sets `stopped_at_ms`
-- (the UPDATE that sets it is the atomic claim: exactly one survivor ends the dead node's runs).
-- A clean shutdown sets it too. A node that starts again under its name clears it.
--
-- `run_claims`: which node owns a request id, claimed at the first sight of the id (RunSSE or
-- BidiAppend, whichever reaches a node first; the primary key makes the first claimer win). The
-- other nodes forward that run's requests to the owner. Old claims are deleted by the lease task.
--
-- `runs.node`: the node that ran the run (NULL for a single node and for runs from before).

CREATE TABLE nodes (
    name            TEXT PRIMARY KEY,
    internal_url    TEXT NOT NULL,
    started_at_ms   INTEGER NOT NULL,
    heartbeat_at_ms INTEGER NOT NULL,
    stopped_at_ms   INTEGER,
    stop_reason     TEXT,
    stopped_by      TEXT
);

CREATE TABLE run_claims (
    request_id    TEXT PRIMARY KEY,
    node          TEXT NOT NULL,
    claimed_at_ms INTEGER NOT NULL
);

CREATE INDEX run_claims_by_age ON run_claims (claimed_at_ms);

ALTER TABLE runs ADD COLUMN node TEXT;

CREATE INDEX runs_running_by_node ON runs (node) WHERE status = 'running';
