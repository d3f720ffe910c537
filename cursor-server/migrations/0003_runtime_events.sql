-- cursor-server schema, version 3: runtime-origin messages name the event that produced them.
--
-- A runtime message (mode notice, mode reminder) is appended in the same transaction that consumes
-- its event; the unique index makes a second append of the same event impossible, so retries and
-- restarts replay the stored message instead of adding another.
ALTER TABLE messages ADD COLUMN runtime_event_id TEXT;

CREATE UNIQUE INDEX messages_by_runtime_event
    ON messages (conversation_id, runtime_event_id)
    WHERE runtime_event_id IS NOT NULL;
