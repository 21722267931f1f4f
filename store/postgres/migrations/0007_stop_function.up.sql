-- idem_stop raises SQLSTATE IDL02 when the key of a ClaimInHandler transaction
-- (Respond, RecordGetOrStop) is already recorded: after the statement has sent the live
-- record, the error aborts the transaction before its insert and the application's
-- statements run, so that a replay writes nothing and is answered in the same round
-- trip. (idem_fence's IDL01 means a lost lease; a replay is not one, and the server's
-- log says which it was.)
CREATE FUNCTION {{schema}}idem_stop(present boolean) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    IF present THEN
        RAISE EXCEPTION 'idem: the key is recorded already (a replay or a duplicate): this transaction stops here, having written nothing'
            USING ERRCODE = 'IDL02';
    END IF;
    RETURN false;
END
$$;
