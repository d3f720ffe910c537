-- cursor-server schema, version 4: one row per provider call, for diagnosing slow or failing
-- models (time to first token, total time, usage, finish reason or error). Written once, when the
-- call ends; never per chunk.
CREATE TABLE provider_calls (
    model_call_id      TEXT PRIMARY KEY,
    request_id         TEXT NOT NULL REFERENCES runs (request_id),
    conversation_id    TEXT NOT NULL,
    provider           TEXT NOT NULL,
    model_id           TEXT NOT NULL,
    -- 'turn' (the model's answer) or 'compaction' (a summary of older history)
    purpose            TEXT NOT NULL CHECK (purpose IN ('turn', 'compaction')),
    request_bytes      INTEGER NOT NULL,
    started_at_ms      INTEGER NOT NULL,
    first_event_ms     INTEGER,
    total_ms           INTEGER NOT NULL,
    input_tokens       INTEGER,
    output_tokens      INTEGER,
    cache_read_tokens  INTEGER,
    cache_write_tokens INTEGER,
    reasoning_tokens   INTEGER,
    finish_reason      TEXT,
    error              TEXT
);

CREATE INDEX provider_calls_by_request ON provider_calls (request_id);
