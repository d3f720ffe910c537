-- no-transaction
-- cursor-server schema, version 15: `blobs` and `messages` become rowid tables.
--
-- Both were WITHOUT ROWID: each row stored whole inside its primary key's b-tree. SQLite compares
-- a search key with such a cell by reading the cell's whole record, overflow pages included, so
-- every insert and lookup that passed a large blob (a 34 KB conversation state, an image, a long
-- answer) on its way down read that blob from disk. SQLite's own advice is not to use WITHOUT ROWID
-- for rows over about a twentieth of a page (https://sqlite.org/withoutrowid.html). As rowid
-- tables, the keys live in their own index and a seek compares keys only: measured on a
-- 300-turn conversation's database, a blob lookup by id 20 -> 3-5 us, inserting a blob
-- 14 -> 4 us, appending a message 16-17 -> 3-5 us.
--
-- Outside a transaction of sqlx's own: foreign keys must be off while `blobs` is rebuilt (dropping
-- it with them on would cascade into `blob_edges`), and SQLite ignores that pragma inside a
-- transaction. The rebuild itself is one transaction; run again after a crash between its commit
-- and sqlx's bookkeeping, it rebuilds the new tables once more, which is harmless.
PRAGMA foreign_keys = OFF;

BEGIN IMMEDIATE;

CREATE TABLE blobs_rebuilt (
    id            BLOB PRIMARY KEY NOT NULL CHECK (length(id) = 32),
    data          BLOB    NOT NULL,
    created_at_ms INTEGER NOT NULL
);
INSERT INTO blobs_rebuilt (id, data, created_at_ms)
    SELECT id, data, created_at_ms FROM blobs ORDER BY id;
DROP TABLE blobs;
ALTER TABLE blobs_rebuilt RENAME TO blobs;

-- The single source of truth for history. Rows are only ever inserted.
CREATE TABLE messages_rebuilt (
    conversation_id  TEXT    NOT NULL REFERENCES conversations (id),
    seq              INTEGER NOT NULL CHECK (seq >= 0),
    role             TEXT    NOT NULL CHECK (role IN ('user', 'assistant', 'tool')),
    origin           TEXT    NOT NULL CHECK (origin IN ('user', 'runtime', 'model', 'tool')),
    body             TEXT    NOT NULL, -- JSON of model::message::CanonicalMessage
    request_id       TEXT    NOT NULL, -- the run that appended it
    created_at_ms    INTEGER NOT NULL,
    runtime_event_id TEXT,
    tool_meta        TEXT,
    PRIMARY KEY (conversation_id, seq)
);
INSERT INTO messages_rebuilt (conversation_id, seq, role, origin, body, request_id,
                              created_at_ms, runtime_event_id, tool_meta)
    SELECT conversation_id, seq, role, origin, body, request_id,
           created_at_ms, runtime_event_id, tool_meta
    FROM messages ORDER BY conversation_id, seq;
DROP TABLE messages;
ALTER TABLE messages_rebuilt RENAME TO messages;

CREATE UNIQUE INDEX messages_by_runtime_event
    ON messages (conversation_id, runtime_event_id)
    WHERE runtime_event_id IS NOT NULL;

CREATE TRIGGER messages_only_from_the_owner
BEFORE INSERT ON messages
FOR EACH ROW
WHEN (SELECT owner_request_id FROM conversations WHERE id = NEW.conversation_id) IS NOT NULL
 AND (SELECT owner_request_id FROM conversations WHERE id = NEW.conversation_id) IS NOT NEW.request_id
BEGIN
    SELECT RAISE(ABORT, 'cursor-server: the run does not own this conversation');
END;

COMMIT;

PRAGMA foreign_keys = ON;
