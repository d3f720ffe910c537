-- How many HTTP attempts each provider call took, and why the failed ones failed (a JSON array of
-- {status, error, delay_ms}), so a slow turn that was retried can be explained.
ALTER TABLE provider_calls ADD COLUMN attempts INTEGER NOT NULL DEFAULT 1;
ALTER TABLE provider_calls ADD COLUMN retries_json TEXT;
