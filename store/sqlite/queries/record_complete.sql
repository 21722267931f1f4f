-- Stores the final response; fenced by the holder's token and the in-flight state. The
-- record expires at created_at + ttl, or, when its recovery point advanced, a ttl after
-- the completion at :now (SPEC §13: an operation that outlived its TTL unfinished keeps
-- its result a whole TTL). The recovery point says where an unfinished operation
-- stands: a completed record keeps its steps' results, not it.
UPDATE idem_records
SET state               = 'completed',
    token               = NULL,
    lease_end           = NULL,
    response_status     = :status,
    response_headers    = :headers,
    response_body       = :body,
    response_not_stored = :not_stored,
    recovery_point      = '',
    expires_at          = CASE WHEN recovery_point = '' THEN created_at ELSE max(created_at, :now) END + :ttl
WHERE scope = :scope AND key = :key AND state = 'in_flight' AND token = :token
