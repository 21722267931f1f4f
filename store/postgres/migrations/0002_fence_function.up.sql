-- idem_fence raises SQLSTATE IDL01 unless the fenced completion found its record.
-- Raising (instead of reporting zero rows) aborts the application's transaction on the
-- server, which lets InTx send the completion and COMMIT in one pipelined round trip:
-- after an error the server skips the queued COMMIT, so a holder that lost its lease
-- can never commit its writes (SPEC §7).
CREATE FUNCTION {{schema}}idem_fence(held boolean) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    IF NOT held THEN
        RAISE EXCEPTION 'idem: lease lost: the record is no longer in flight under this token'
            USING ERRCODE = 'IDL01';
    END IF;
    RETURN true;
END
$$;
