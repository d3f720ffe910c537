-- A capture: every HTTP exchange that crossed the debugger, and every frame of its two bodies.

-- One HTTP request and its response. `request_id` groups a run's exchanges (RunSSE with its
-- BidiAppends, or one HTTP/2 Run); an exchange that names no run gets `exchange-<id>`.
CREATE TABLE exchanges (
    id INTEGER PRIMARY KEY,
    request_id TEXT NOT NULL,
    conversation_id TEXT,
    method TEXT NOT NULL,
    path TEXT NOT NULL,
    http_version TEXT NOT NULL,
    -- JSON array of [name, value]; authorization and cookies redacted.
    request_headers TEXT NOT NULL,
    status INTEGER,
    response_headers TEXT,
    -- Wall clock (Unix milliseconds) when the request arrived.
    started_at_ms INTEGER NOT NULL,
    -- Monotonic microseconds since the debugger started.
    started_us INTEGER NOT NULL,
    ended_us INTEGER,
    frames INTEGER NOT NULL DEFAULT 0,
    -- How the run's stream ended: `ok` or the end-of-stream / unary error code.
    outcome TEXT,
    -- The upstream could not be reached, or a body broke off.
    error TEXT
);
CREATE INDEX exchanges_request_id ON exchanges (request_id);
CREATE INDEX exchanges_conversation_id ON exchanges (conversation_id);
CREATE INDEX exchanges_started ON exchanges (started_us DESC);

CREATE TABLE frames (
    id INTEGER PRIMARY KEY,
    exchange_id INTEGER NOT NULL REFERENCES exchanges (id),
    direction TEXT NOT NULL CHECK (direction IN ('client', 'server')),
    -- Monotonic microseconds since the debugger started: both directions interleave by this.
    t_us INTEGER NOT NULL,
    -- Payload bytes as they crossed the wire.
    size INTEGER NOT NULL,
    flags INTEGER,
    kind TEXT NOT NULL CHECK (kind IN ('message', 'end_stream', 'error', 'body', 'undecoded')),
    -- The oneof path (`interaction_update.text_delta`) or the message name.
    type TEXT NOT NULL,
    json TEXT,
    raw BLOB NOT NULL,
    -- Why (part of) the frame could not be decoded.
    error TEXT,
    -- RunSSE's request and BidiAppend's answers: plumbing of one transport, left out of `diff`.
    transport INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX frames_exchange ON frames (exchange_id, t_us);

-- Conversation, request, exec, KV, tool-call, model-call and blob ids, for search.
CREATE TABLE frame_ids (
    frame_id INTEGER NOT NULL REFERENCES frames (id),
    kind TEXT NOT NULL,
    value TEXT NOT NULL
);
CREATE INDEX frame_ids_value ON frame_ids (value);
CREATE INDEX frame_ids_frame ON frame_ids (frame_id);
