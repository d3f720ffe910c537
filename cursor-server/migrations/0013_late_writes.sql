-- cursor-server schema, version 13: a run that no longer owns its conversation writes nothing.
--
-- Migration 0006 refuses such a run's messages. A run superseded on another node that was never
-- told (the stop request lost, the node cut off) still builds checkpoints and sends blobs: its
-- outbox rows would make the next run resend its blobs and continue from its checkpoint, and its
-- publication would move the head the client is shown. Both are refused here with the same text
-- as 0006's, so the store reports them as the same refusal (StoreError::NotOwner).
--
-- `head_request_id` is the run that moved the head (set by the same UPDATE that moves it); the
-- trigger compares it with the owner. Conversations without an owner accept any writer, as in 0006.

ALTER TABLE conversations ADD COLUMN head_request_id TEXT;

CREATE TRIGGER outbox_only_from_the_owner
BEFORE INSERT ON outbox
FOR EACH ROW
WHEN (SELECT owner_request_id FROM conversations WHERE id = NEW.conversation_id) IS NOT NULL
 AND (SELECT owner_request_id FROM conversations WHERE id = NEW.conversation_id) IS NOT NEW.request_id
BEGIN
    SELECT RAISE(ABORT, 'cursor-server: the run does not own this conversation');
END;

CREATE TRIGGER head_only_from_the_owner
BEFORE UPDATE OF head_blob ON conversations
FOR EACH ROW
WHEN NEW.owner_request_id IS NOT NULL AND NEW.owner_request_id IS NOT NEW.head_request_id
BEGIN
    SELECT RAISE(ABORT, 'cursor-server: the run does not own this conversation');
END;
