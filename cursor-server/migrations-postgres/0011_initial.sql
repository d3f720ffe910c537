-- cursor-server schema on PostgreSQL, version 11: the schema SQLite reaches with migrations
-- 0001–0011 (cursor-server/migrations/), in one migration numbered like the last of those, so a
-- schema version means the same on both backends. Later migrations come in pairs, one per backend.
--
-- SQLite INTEGER is BIGINT here, BLOB is BYTEA. Where SQLite relies on its implicit rowid (the
-- order provider calls were recorded in), the table has an identity column of that name, so the
-- queries read the same on both.

CREATE TABLE conversations (
    id               TEXT PRIMARY KEY NOT NULL,
    created_at_ms    BIGINT NOT NULL,
    -- The latest published ConversationStateStructure blob (a GC root), and its revision.
    head_blob        BYTEA,
    revision         BIGINT NOT NULL DEFAULT 0,
    -- The run that owns the conversation: only it may append (see the trigger below).
    owner_request_id TEXT,
    -- Where the conversation's blob graph starts, and how many stored messages that base covers.
    base_state       BYTEA,
    base_messages    BIGINT NOT NULL DEFAULT 0
);

-- The single source of truth for history. Rows are only ever inserted; `seq` counts from 0
-- without gaps per conversation (a writer locks the conversation's row before reading the end).
CREATE TABLE messages (
    conversation_id  TEXT   NOT NULL REFERENCES conversations (id),
    seq              BIGINT NOT NULL CHECK (seq >= 0),
    role             TEXT   NOT NULL CHECK (role IN ('user', 'assistant', 'tool')),
    origin           TEXT   NOT NULL CHECK (origin IN ('user', 'runtime', 'model', 'tool')),
    body             TEXT   NOT NULL, -- JSON of model::message::CanonicalMessage
    request_id       TEXT   NOT NULL, -- the run that appended it
    created_at_ms    BIGINT NOT NULL,
    runtime_event_id TEXT,
    tool_meta        TEXT,
    PRIMARY KEY (conversation_id, seq)
);

-- One runtime message per event and conversation.
CREATE UNIQUE INDEX messages_by_runtime_event
    ON messages (conversation_id, runtime_event_id)
    WHERE runtime_event_id IS NOT NULL;

-- One writer per conversation: an insert from a run other than the owner is refused with the text
-- the store maps to NotOwner. Conversations without an owner accept any writer.
CREATE FUNCTION messages_only_from_the_owner() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    owner TEXT;
BEGIN
    SELECT owner_request_id INTO owner FROM conversations WHERE id = NEW.conversation_id;
    IF owner IS NOT NULL AND owner IS DISTINCT FROM NEW.request_id THEN
        RAISE EXCEPTION 'cursor-server: the run does not own this conversation'
            USING ERRCODE = 'raise_exception';
    END IF;
    RETURN NEW;
END;
$$;

CREATE TRIGGER messages_only_from_the_owner
BEFORE INSERT ON messages
FOR EACH ROW EXECUTE FUNCTION messages_only_from_the_owner();

CREATE TABLE runs (
    request_id         TEXT PRIMARY KEY NOT NULL,
    conversation_id    TEXT   NOT NULL REFERENCES conversations (id),
    status             TEXT   NOT NULL CHECK (status IN ('running', 'succeeded', 'failed', 'canceled')),
    model_id           TEXT   NOT NULL,
    provider_calls     BIGINT NOT NULL DEFAULT 0,
    input_tokens       BIGINT,
    output_tokens      BIGINT,
    cache_read_tokens  BIGINT,
    cache_write_tokens BIGINT,
    reasoning_tokens   BIGINT,
    error_code         TEXT,
    error_message      TEXT,
    started_at_ms      BIGINT NOT NULL,
    finished_at_ms     BIGINT,
    mode               TEXT,
    transport          TEXT,
    requested_model    TEXT
);

CREATE INDEX runs_by_conversation ON runs (conversation_id, started_at_ms);
CREATE INDEX runs_by_start ON runs (started_at_ms);
CREATE INDEX runs_by_status ON runs (status, started_at_ms);
CREATE INDEX runs_by_model ON runs (model_id, started_at_ms);

-- Immutable blobs keyed by SHA-256 of their data.
CREATE TABLE blobs (
    id            BYTEA PRIMARY KEY NOT NULL CHECK (length(id) = 32),
    data          BYTEA  NOT NULL,
    created_at_ms BIGINT NOT NULL
);

-- parent references child as the `ordinal`-th entry of its field `kind`. A child may be a blob
-- only the client holds, so it is not a foreign key.
CREATE TABLE blob_edges (
    parent  BYTEA  NOT NULL REFERENCES blobs (id) ON DELETE CASCADE,
    kind    TEXT   NOT NULL,
    ordinal BIGINT NOT NULL,
    child   BYTEA  NOT NULL,
    PRIMARY KEY (parent, kind, ordinal)
);

CREATE INDEX blob_edges_by_child ON blob_edges (child);

-- Blobs the client has acknowledged storing for a conversation: never sent to it again.
CREATE TABLE conversation_blob_acks (
    conversation_id TEXT  NOT NULL REFERENCES conversations (id),
    blob_id         BYTEA NOT NULL,
    PRIMARY KEY (conversation_id, blob_id)
);

-- KV work sent to the client and not yet confirmed (see store/outbox.rs).
CREATE TABLE outbox (
    conversation_id TEXT   NOT NULL REFERENCES conversations (id),
    kind            TEXT   NOT NULL CHECK (kind IN ('blob', 'checkpoint')),
    blob_id         BYTEA  NOT NULL CHECK (length(blob_id) = 32),
    request_id      TEXT   NOT NULL, -- the run that sent or built it
    created_at_ms   BIGINT NOT NULL,
    PRIMARY KEY (conversation_id, kind, blob_id)
);

-- One row per provider call, written when it ends.
CREATE TABLE provider_calls (
    model_call_id      TEXT PRIMARY KEY,
    -- The order calls were recorded in (SQLite's implicit rowid).
    rowid              BIGINT GENERATED ALWAYS AS IDENTITY,
    request_id         TEXT   NOT NULL REFERENCES runs (request_id),
    conversation_id    TEXT   NOT NULL,
    provider           TEXT   NOT NULL,
    model_id           TEXT   NOT NULL,
    purpose            TEXT   NOT NULL CHECK (purpose IN ('turn', 'compaction')),
    request_bytes      BIGINT NOT NULL,
    started_at_ms      BIGINT NOT NULL,
    first_event_ms     BIGINT,
    total_ms           BIGINT NOT NULL,
    input_tokens       BIGINT,
    output_tokens      BIGINT,
    cache_read_tokens  BIGINT,
    cache_write_tokens BIGINT,
    reasoning_tokens   BIGINT,
    finish_reason      TEXT,
    error              TEXT,
    attempts           BIGINT NOT NULL DEFAULT 1,
    retries_json       TEXT,
    key_index          BIGINT,
    fallback_from      TEXT
);

CREATE INDEX provider_calls_by_request ON provider_calls (request_id);
CREATE INDEX provider_calls_by_start ON provider_calls (started_at_ms);

-- One row per finished tool call.
CREATE TABLE tool_executions (
    request_id    TEXT   NOT NULL,
    call_id       TEXT   NOT NULL,
    tool          TEXT   NOT NULL,
    summary       TEXT   NOT NULL,
    started_at_ms BIGINT NOT NULL,
    duration_ms   BIGINT NOT NULL,
    outcome       TEXT   NOT NULL CHECK (outcome IN ('success', 'error')),
    PRIMARY KEY (request_id, call_id)
);
