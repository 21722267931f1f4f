-- Stores the final response; fenced by the holder's token and the in-flight state.
UPDATE idem_records
SET state               = 'completed',
    token               = NULL,
    lease_end           = NULL,
    response_status     = :status,
    response_headers    = :headers,
    response_body       = :body,
    response_not_stored = :not_stored,
    expires_at          = created_at + :ttl
WHERE scope = :scope AND key = :key AND state = 'in_flight' AND token = :token
