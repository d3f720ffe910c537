-- cursor-server schema, version 2: the outbox of KV work the client has not confirmed yet.
--
-- A `blob` row is a set_blob_args sent and not yet acknowledged; the `checkpoint` row (at most one
-- per conversation) is the newest ConversationStateStructure built and not yet published. A run that
-- ends or crashes before the ACKs arrive leaves them here: the next run of the conversation
-- continues from that checkpoint and sends the blobs again, and GC treats them as live.
CREATE TABLE outbox (
    conversation_id TEXT    NOT NULL REFERENCES conversations (id),
    kind            TEXT    NOT NULL CHECK (kind IN ('blob', 'checkpoint')),
    blob_id         BLOB    NOT NULL CHECK (length(blob_id) = 32),
    request_id      TEXT    NOT NULL, -- the run that sent or built it
    created_at_ms   INTEGER NOT NULL,
    PRIMARY KEY (conversation_id, kind, blob_id)
) WITHOUT ROWID;
