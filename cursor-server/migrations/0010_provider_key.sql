-- Which of a provider's keys answered each call (its index from 0 in the configured list), so a
-- run's page can say "key 2 of 2" without the key; NULL for calls no key answered and for calls
-- recorded before providers had several keys.
ALTER TABLE provider_calls ADD COLUMN key_index INTEGER;
