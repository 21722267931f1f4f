-- What admin_delete_scope.sql kept of a scope (admin.Store.RecordDeleteScope): the
-- unfinished operations (in flight, recovery point advanced: SPEC §13) unless
-- :abandon, and the other records in flight under a live lease at :now unless :force.
SELECT count(*) FILTER (WHERE recovery_point <> '' AND NOT :abandon),
       count(*) FILTER (WHERE lease_end > :now AND NOT :force AND NOT (recovery_point <> '' AND NOT :abandon))
FROM idem_records
WHERE scope = :scope AND state = 'in_flight'
