-- cursor-server schema, version 1: conversations, append-only canonical messages, run records,
-- the content-addressed blob store with its reference edges, and per-conversation KV acknowledgements.

CREATE TABLE conversations (
    id            TEXT PRIMARY KEY NOT NULL,
    created_at_ms INTEGER NOT NULL,
    -- The latest published ConversationStateStructure blob (a GC root), and its revision.
    head_blob     BLOB,
    revision      INTEGER NOT NULL DEFAULT 0
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

-- Immutable blobs keyed by SHA-256 of their data.
CREATE TABLE blobs (
    id            BLOB PRIMARY KEY NOT NULL CHECK (length(id) = 32),
    data          BLOB    NOT NULL,
    created_at_ms INTEGER NOT NULL
) WITHOUT ROWID;

-- parent references child as the `ordinal`-th entry of its field `kind` (e.g. "turns", "steps").
-- A child may be a blob only the client holds, so it is not a foreign key.
CREATE TABLE blob_edges (
    parent  BLOB    NOT NULL REFERENCES blobs (id) ON DELETE CASCADE,
    kind    TEXT    NOT NULL,
    ordinal INTEGER NOT NULL,
    child   BLOB    NOT NULL,
    PRIMARY KEY (parent, kind, ordinal)
) WITHOUT ROWID;

CREATE INDEX blob_edges_by_child ON blob_edges (child);

-- Blobs the client has acknowledged storing for a conversation: never sent to it again.
CREATE TABLE conversation_blob_acks (
    conversation_id TEXT NOT NULL REFERENCES conversations (id),
    blob_id         BLOB NOT NULL,
    PRIMARY KEY (conversation_id, blob_id)
) WITHOUT ROWID;
