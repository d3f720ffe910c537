-- cursor-server schema on PostgreSQL, version 13: SQLite's migrations/0013_late_writes.sql (a run
-- that no longer owns its conversation can neither record outbox work nor move the head; see that
-- file). The outbox reuses 0011's trigger function: it reads only NEW.conversation_id and
-- NEW.request_id, which the outbox has too.

ALTER TABLE conversations ADD COLUMN head_request_id TEXT;

CREATE TRIGGER outbox_only_from_the_owner
BEFORE INSERT ON outbox
FOR EACH ROW EXECUTE FUNCTION messages_only_from_the_owner();

CREATE FUNCTION head_only_from_the_owner() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.owner_request_id IS NOT NULL
       AND NEW.owner_request_id IS DISTINCT FROM NEW.head_request_id THEN
        RAISE EXCEPTION 'cursor-server: the run does not own this conversation'
            USING ERRCODE = 'raise_exception';
    END IF;
    RETURN NEW;
END;
$$;

CREATE TRIGGER head_only_from_the_owner
BEFORE UPDATE OF head_blob ON conversations
FOR EACH ROW EXECUTE FUNCTION head_only_from_the_owner();
