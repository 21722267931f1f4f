-- The number of a scope's records in flight under a live lease at :now.
SELECT count(*) FROM idem_records
WHERE scope = :scope AND state = 'in_flight' AND lease_end > :now
