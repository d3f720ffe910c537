-- cursor-server schema, version 6: one writer per conversation, enforced here.
--
-- A conversation is owned by the run that started on it last (runs::start sets the owner in the
-- same transaction that records the run). A run that was interrupted but has not ended yet — one
-- stuck on a client that stopped reading, a provider call that finished late — can no longer add
-- to history: its insert is refused by the trigger below, whatever the code above it does.
-- Conversations without an owner (never run since this migration) accept any writer.

ALTER TABLE conversations ADD COLUMN owner_request_id TEXT;

CREATE TRIGGER messages_only_from_the_owner
BEFORE INSERT ON messages
FOR EACH ROW
WHEN (SELECT owner_request_id FROM conversations WHERE id = NEW.conversation_id) IS NOT NULL
 AND (SELECT owner_request_id FROM conversations WHERE id = NEW.conversation_id) IS NOT NEW.request_id
BEGIN
    SELECT RAISE(ABORT, 'cursor-server: the run does not own this conversation');
END;
