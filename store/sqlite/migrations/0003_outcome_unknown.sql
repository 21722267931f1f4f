-- The policy unknown (SPEC §13): a record completed by a claim that found its holder's
-- lease lapsed, under that policy, answers outcome_unknown (status 500, no body) until
-- an operator resolves it. Its state is 'completed'; this flag says why.
ALTER TABLE idem_records ADD COLUMN outcome_unknown INTEGER NOT NULL DEFAULT 0;
