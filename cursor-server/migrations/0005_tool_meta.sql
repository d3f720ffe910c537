-- cursor-server schema, version 5: typed metadata stored with a tool result.
--
-- The checkpoint's subagent list (Task cards) used to be folded back out of the text the model was
-- shown ("[subagent <id> is running in the background; ...]"). It is now folded from data: a Task
-- result carries `ToolMeta::Subagent` in this column (JSON of `model::tool::ToolMeta`; NULL for
-- every other message). The message body, what the model sees, is never rewritten.
ALTER TABLE messages ADD COLUMN tool_meta TEXT;

-- Rows stored before this version: read each Task result once and fill its metadata from the text
-- the server wrote then, with the title from its call's arguments, so stored conversations keep
-- their subagent cards.
UPDATE messages AS r
SET tool_meta = json_object('subagent', json_object(
        'title', COALESCE(
            CASE WHEN json_valid(json_extract(c.body, '$.call.arguments'))
                THEN json_extract(json_extract(c.body, '$.call.arguments'), '$.description') END,
            ''),
        'agent_id', CASE
            WHEN json_extract(r.body, '$.result.is_error') = 0
                AND substr(json_extract(r.body, '$.result.content'), 1, 10) = '[subagent '
                AND instr(substr(json_extract(r.body, '$.result.content'), 11), ' ') > 1
            THEN substr(
                json_extract(r.body, '$.result.content'), 11,
                instr(substr(json_extract(r.body, '$.result.content'), 11), ' ') - 1)
            END,
        'backgrounded', json(CASE
            WHEN json_extract(r.body, '$.result.is_error') = 0
                AND instr(
                    substr(json_extract(r.body, '$.result.content'), 1,
                        CASE WHEN instr(json_extract(r.body, '$.result.content'), char(10)) > 0
                            THEN instr(json_extract(r.body, '$.result.content'), char(10)) - 1
                            ELSE length(json_extract(r.body, '$.result.content')) END),
                    'is running in the background') > 0
            THEN 'true' ELSE 'false' END)))
FROM messages AS c
WHERE json_extract(r.body, '$.role') = 'tool_result'
    AND c.conversation_id = r.conversation_id
    AND json_extract(c.body, '$.role') = 'tool_call'
    AND json_extract(c.body, '$.call.name') = 'Task'
    AND json_extract(c.body, '$.call.call_id') = json_extract(r.body, '$.result.call_id');
