-- What the console shows of a run beyond its status and usage: the mode it ended in and the
-- transport it came over; one row per tool call with its timing and outcome; indexes for the
-- newest-first, filtered run list and for usage per day.
ALTER TABLE runs ADD COLUMN mode TEXT;
ALTER TABLE runs ADD COLUMN transport TEXT;

CREATE TABLE tool_executions (
    request_id    TEXT    NOT NULL,
    call_id       TEXT    NOT NULL,
    tool          TEXT    NOT NULL,
    summary       TEXT    NOT NULL,
    started_at_ms INTEGER NOT NULL,
    duration_ms   INTEGER NOT NULL,
    outcome       TEXT    NOT NULL CHECK (outcome IN ('success', 'error')),
    PRIMARY KEY (request_id, call_id)
) WITHOUT ROWID;

CREATE INDEX runs_by_start ON runs (started_at_ms);
CREATE INDEX runs_by_status ON runs (status, started_at_ms);
CREATE INDEX runs_by_model ON runs (model_id, started_at_ms);
CREATE INDEX provider_calls_by_start ON provider_calls (started_at_ms);
