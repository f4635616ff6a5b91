-- A statement of several writes (store/together.py) has no transaction to roll back: a part
-- that finds what the writes depend on no longer true raises, with its own SQLSTATE, and the
-- whole statement is undone (store/together.py, require).
CREATE FUNCTION aivedio_require(ok boolean, code text, message text) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    IF ok IS NOT TRUE THEN
        RAISE EXCEPTION '%', message USING ERRCODE = code;
    END IF;
    RETURN true;
END
$$;
