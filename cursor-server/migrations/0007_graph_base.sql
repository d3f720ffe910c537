-- cursor-server schema, version 7: where a conversation's blob graph starts.
--
-- The graph is a projection of history (cursor/projection.rs) from a base: a
-- ConversationStateStructure blob naming the roots and turns that precede the conversation's own
-- messages — the system prompt root, or the roots and turns of a conversation imported from the
-- client — and how many stored messages that base already covers (the imported ones). Set once,
-- on the conversation's first run; a GC root.

ALTER TABLE conversations ADD COLUMN base_state BLOB;
ALTER TABLE conversations ADD COLUMN base_messages INTEGER NOT NULL DEFAULT 0;
