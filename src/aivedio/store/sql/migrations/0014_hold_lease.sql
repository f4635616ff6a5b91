-- Fencing in the round trip that opens a transaction: a worker sends
-- 'BEGIN; SELECT aivedio_hold_lease(id, token)' as one simple query (store/queue.py, fenced).
-- The job's row stays share-locked until the transaction ends, so its lease cannot move
-- before the caller commits; a lease no longer held raises SQLSTATE AVL01.
CREATE FUNCTION aivedio_hold_lease(job_id bigint, token bigint) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM jobs
    WHERE id = job_id AND lease_token = token AND status = 'running'
    FOR SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'job %: lease % is no longer held', job_id, token
            USING ERRCODE = 'AVL01';
    END IF;
END
$$;
