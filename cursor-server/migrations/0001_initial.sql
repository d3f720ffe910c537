-- cursor-server schema, version 1: conversations, append-only canonical messages, run records.

CREATE TABLE conversations (
    id            TEXT PRIMARY KEY NOT NULL,
    created_at_ms INTEGER NOT NULL
);

-- The single source of truth for history. Rows are only ever inserted.
CREATE TABLE messages (
    conversation_id TEXT    NOT NULL REFERENCES conversations (id),
    seq             INTEGER NOT NULL CHECK (seq >= 0),
    role            TEXT    NOT NULL CHECK (role IN ('user', 'assistant', 'tool')),
    origin          TEXT    NOT NULL CHECK (origin IN ('user', 'runtime', 'model', 'tool')),
    body            TEXT    NOT NULL, -- JSON of model::message::CanonicalMessage
    request_id      TEXT    NOT NULL, -- the run that appended it
    created_at_ms   INTEGER NOT NULL,
    PRIMARY KEY (conversation_id, seq)
) WITHOUT ROWID;

CREATE TABLE runs (
    request_id         TEXT PRIMARY KEY NOT NULL,
    conversation_id    TEXT    NOT NULL REFERENCES conversations (id),
    status             TEXT    NOT NULL CHECK (status IN ('running', 'succeeded', 'failed', 'canceled')),
    model_id           TEXT    NOT NULL,
    provider_calls     INTEGER NOT NULL DEFAULT 0,
    input_tokens       INTEGER,
    output_tokens      INTEGER,
    cache_read_tokens  INTEGER,
    cache_write_tokens INTEGER,
    reasoning_tokens   INTEGER,
    error_code         TEXT,
    error_message      TEXT,
    started_at_ms      INTEGER NOT NULL,
    finished_at_ms     INTEGER
);

CREATE INDEX runs_by_conversation ON runs (conversation_id, started_at_ms);
