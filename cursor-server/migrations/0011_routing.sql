-- cursor-server schema, version 11: model routing.
--
-- A run records the name Cursor asked for beside the model it was routed to (`model_id`): an
-- alias, Auto, or a model chosen for the run's mode or subagent type differs from what was sent.
-- A provider call made because another model's call failed before streaming names that model.

ALTER TABLE runs ADD COLUMN requested_model TEXT;
ALTER TABLE provider_calls ADD COLUMN fallback_from TEXT;
