-- What admin_delete_scope.sql kept of a scope: the unfinished operations unless
-- abandon, and the other records in flight under a live lease at now unless force.
-- Arguments: abandon, now, force, abandon, scope.
SELECT coalesce(sum(recovery_point <> '' AND NOT ?), 0),
       coalesce(sum(lease_end > ? AND NOT ? AND NOT (recovery_point <> '' AND NOT ?)), 0)
FROM idem_records
WHERE scope = ? AND state = 'in_flight'
