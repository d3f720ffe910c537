-- Indexes for the console: the newest-first run list (filtered by status or model) and usage per
-- day from the provider calls.
CREATE INDEX runs_by_start ON runs (started_at_ms);
CREATE INDEX runs_by_status ON runs (status, started_at_ms);
CREATE INDEX runs_by_model ON runs (model_id, started_at_ms);
CREATE INDEX provider_calls_by_start ON provider_calls (started_at_ms);
