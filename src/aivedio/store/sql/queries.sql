-- Every statement the job queue runs, by name. Loaded once by store/queries.py.
-- Hot paths (claim, complete, heartbeat) are one statement each and touch only the
-- partial indexes over live jobs.

-- name: existing_keys
SELECT idempotency_key, job_id FROM job_keys WHERE idempotency_key = ANY($1::text[]);

-- name: notify
SELECT pg_notify('aivedio_jobs', lane) FROM unnest($1::text[]) AS l(lane);

-- name: claim
-- Fair, deadline-aware claim. Walk the distinct tenants with queued jobs in this lane from
-- a rotating cursor (a loose index scan: one index probe per tenant, at most $8 tenants), take
-- each tenant's most urgent jobs from
-- the same partial index with SKIP LOCKED, then hand out turns round-robin: every tenant's
-- first job before any tenant's second. So a tenant with 10,000 queued jobs delays another
-- tenant's job by at most one claim round. The worker's pending acknowledgements ride on the
-- claim ($1-$4, see acknowledge): one round trip for both. $5 the lane, $6 the limit, $7 the
-- lease in seconds, $8 tenants per round, $9 the tenant cursor.
WITH RECURSIVE {{acknowledge}}, hi AS (
    (SELECT j.tenant_id FROM jobs j
     WHERE j.lane = $5 AND j.status = 'queued' AND j.tenant_id >= $9
     ORDER BY j.tenant_id LIMIT 1)
    UNION ALL
    SELECT (SELECT j.tenant_id FROM jobs j
            WHERE j.lane = $5 AND j.status = 'queued' AND j.tenant_id > t.tenant_id
            ORDER BY j.tenant_id LIMIT 1)
    FROM hi t
    WHERE t.tenant_id IS NOT NULL
), lo AS (
    (SELECT j.tenant_id FROM jobs j
     WHERE j.lane = $5 AND j.status = 'queued' AND j.tenant_id < $9
     ORDER BY j.tenant_id LIMIT 1)
    UNION ALL
    SELECT (SELECT j.tenant_id FROM jobs j
            WHERE j.lane = $5 AND j.status = 'queued' AND j.tenant_id > t.tenant_id
              AND j.tenant_id < $9
            ORDER BY j.tenant_id LIMIT 1)
    FROM lo t
    WHERE t.tenant_id IS NOT NULL
), tenants AS (
    -- From the cursor ($9) up, then wrapping around: with more tenants than one round
    -- takes, the worker moves the cursor past the last one served, so none is left out.
    SELECT tenant_id FROM hi WHERE tenant_id IS NOT NULL
    UNION ALL
    SELECT tenant_id FROM lo WHERE tenant_id IS NOT NULL
    LIMIT $8
), locked AS (
    SELECT c.id, c.tenant_id, c.sort_at, c.priority
    FROM tenants t
    CROSS JOIN LATERAL (
        SELECT j.id, j.tenant_id, j.sort_at, j.priority
        FROM jobs j
        WHERE j.lane = $5 AND j.status = 'queued' AND j.tenant_id = t.tenant_id
        ORDER BY j.sort_at, j.priority DESC, j.id
        LIMIT $6
        FOR UPDATE SKIP LOCKED
    ) c
), chosen AS (
    SELECT id FROM (
        SELECT id, sort_at, priority,
               row_number() OVER (PARTITION BY tenant_id
                                  ORDER BY sort_at, priority DESC, id) AS turn
        FROM locked
    ) r
    ORDER BY turn, sort_at, priority DESC, id
    LIMIT $6
), claimed AS (
    UPDATE jobs j
    SET status = 'running',
        lease_owner = $3,
        lease_token = j.lease_token + 1,
        lease_until = now() + make_interval(secs => $7),
        attempts = j.attempts + 1,
        started_at = now(),
        progress = NULL
    FROM chosen
    WHERE j.id = chosen.id
    RETURNING j.id, j.kind, j.lane, j.tenant_id, j.payload, j.attempts, j.max_attempts,
              j.lease_token, j.timeout_seconds, j.expires_at, j.idempotency_key, j.created_at
)
-- At least one row: the acknowledged ids ride on it when nothing was claimed (id NULL).
SELECT c.*, (SELECT array_agg(id) FROM acked) AS acked
FROM (SELECT 1) AS one LEFT JOIN claimed c ON true;

-- name: acknowledge
-- (A fragment: the CTEs that acknowledge; complete and claim use it as {{acknowledge}}.)
-- Batched acknowledgement with a per-row CAS on owner and fencing token: a row whose lease
-- was re-claimed (token moved on) is not touched, and its id is absent from ``acked``.
-- $1 ids, $2 lease tokens, $3 the owner, $4 results.
done AS (
    DELETE FROM jobs j
    USING unnest($1::bigint[], $2::bigint[], $4::jsonb[]) AS c(id, token, result)
    WHERE j.id = c.id AND j.lease_token = c.token AND j.lease_owner = $3
      AND j.status = 'running'
    RETURNING j.*, c.result
), acked AS (
    INSERT INTO job_history (id, kind, lane, idempotency_key, tenant_id, payload, status,
                             priority, expires_at, attempts, max_attempts, timeout_seconds,
                             lease_owner, lease_token, last_error_class, last_error_detail,
                             result, created_at, started_at)
    SELECT id, kind, lane, idempotency_key, tenant_id, payload, 'succeeded', priority,
           expires_at, attempts, max_attempts, timeout_seconds, lease_owner, lease_token,
           last_error_class, last_error_detail, result, created_at, started_at
    FROM done
    RETURNING id
)

-- name: complete
WITH {{acknowledge}}
SELECT id FROM acked;

-- name: retry_later
-- $8 refunds the attempt the claim counted (a job this worker cannot run at all).
UPDATE jobs
SET status = 'waiting',
    attempts = attempts - CASE WHEN $8::boolean THEN 1 ELSE 0 END,
    run_after = now() + make_interval(secs => $4),
    sort_at = sort_at + make_interval(secs => $5),
    lease_owner = NULL,
    lease_until = NULL,
    last_error_class = $6,
    last_error_detail = $7
WHERE id = $1 AND lease_token = $2 AND lease_owner = $3 AND status = 'running'
RETURNING id;

-- name: bury
WITH done AS (
    DELETE FROM jobs
    WHERE id = $1 AND lease_token = $2 AND lease_owner = $3 AND status = 'running'
    RETURNING *
)
INSERT INTO job_history (id, kind, lane, idempotency_key, tenant_id, payload, status, priority,
                         expires_at, attempts, max_attempts, timeout_seconds, lease_owner,
                         lease_token, last_error_class, last_error_detail, created_at,
                         started_at)
SELECT id, kind, lane, idempotency_key, tenant_id, payload, 'dead', priority, expires_at,
       attempts, max_attempts, timeout_seconds, lease_owner, lease_token, $4, $5, created_at,
       started_at
FROM done
RETURNING id;

-- name: release
-- Give leases back without spending the attempt the claim counted (graceful drain).
-- The lanes' listeners are woken in this round trip, as by an enqueue (store/enqueuing.py).
WITH released AS (
    UPDATE jobs
    SET status = 'queued',
        attempts = greatest(attempts - 1, 0),
        lease_owner = NULL,
        lease_until = NULL,
        run_after = now()
    FROM unnest($1::bigint[], $2::bigint[]) AS c(id, token)
    WHERE jobs.id = c.id AND jobs.lease_token = c.token AND jobs.lease_owner = $3
      AND jobs.status = 'running'
    RETURNING jobs.id, jobs.lane
), unheld AS (
    -- Jobs held for a released one (store/job_types.py ``held_by``): due now.
    UPDATE jobs j SET status = 'queued', run_after = now()
    FROM released r
    WHERE j.held_by = r.id AND j.status = 'waiting'
    RETURNING j.lane
), notified AS (
    SELECT pg_notify('aivedio_jobs', l.lane)
    FROM (SELECT lane FROM released UNION SELECT lane FROM unheld) AS l
)
SELECT id, lane, (SELECT count(*) FROM notified) AS lanes_notified FROM released;

-- name: heartbeat
-- One statement per worker extends the leases it names (the jobs it runs and the ones whose
-- acknowledgement is pending) and returns those it still owns. A lease the worker holds but
-- no longer names (a claim cancelled mid-flight, a failure it could not record) is left to
-- expire and be reaped. It also stores each running job's progress (a fraction; NULL keeps
-- the last), so progress costs no statement of its own (aivedio/progress.py says why).
UPDATE jobs
SET lease_until = now() + make_interval(secs => $2),
    progress = coalesce(h.progress, jobs.progress)
FROM unnest($3::bigint[], $4::bigint[], $5::real[]) AS h(id, token, progress)
WHERE jobs.id = h.id AND jobs.lease_token = h.token AND jobs.lease_owner = $1
  AND jobs.status = 'running'
RETURNING jobs.id, jobs.lease_token;

-- name: reap
-- Expired leases (the holder died or stalled): back to the queue, or dead when the claim
-- that expired was the last attempt. A media-lane job that names an asset and died holding
-- its lease is also a crash of that asset's source (poison media, ``media_crashes``),
-- recorded by this same statement so that no expiry is counted twice or lost. Not the
-- chunked path's pieces (kinds ``chunk_*``, pipeline/chunk_stage.py): a long video has many,
-- a lost node says nothing about the source, and a piece that keeps killing workers ends
-- its outputs when its own retries run out.
WITH expired AS (
    SELECT id FROM jobs
    WHERE status = 'running' AND lease_until < now()
    FOR UPDATE SKIP LOCKED
), crashed AS (
    INSERT INTO media_crashes (job_id, lease_token, asset_id, kind, cause, detail)
    SELECT id, lease_token, asset_id, kind, 'lease_expired',
           'lease expired while ' || coalesce(lease_owner, '?') || ' ran it'
    FROM (SELECT j.id, j.lease_token, j.kind, j.lease_owner,
                 CASE WHEN j.payload->>'asset_id' ~* '^[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}$'
                      THEN (j.payload->>'asset_id')::uuid END AS asset_id
          FROM jobs j JOIN expired e USING (id)
          WHERE j.lane = 'media' AND j.kind NOT LIKE 'chunk\_%') m
    WHERE asset_id IS NOT NULL
    ON CONFLICT DO NOTHING
), unheld AS (
    -- Jobs held for an expired one (its work, done by it: store/job_types.py ``held_by``):
    -- it will not finish them, so they are due now (claimed at the next poll).
    UPDATE jobs j SET status = 'queued', run_after = now()
    FROM expired e
    WHERE j.held_by = e.id AND j.status = 'waiting'
    RETURNING j.id
), requeued AS (
    UPDATE jobs j
    SET status = 'queued', lease_owner = NULL, lease_until = NULL, run_after = now(),
        last_error_class = 'lease_expired',
        last_error_detail = 'lease expired while ' || coalesce(j.lease_owner, '?') || ' held it'
    FROM expired e
    WHERE j.id = e.id AND j.attempts < j.max_attempts
    RETURNING j.id, j.lane, j.kind
), buried AS (
    DELETE FROM jobs j USING expired e
    WHERE j.id = e.id AND j.attempts >= j.max_attempts
    RETURNING j.*
), history AS (
    INSERT INTO job_history (id, kind, lane, idempotency_key, tenant_id, payload, status,
                             priority, expires_at, attempts, max_attempts, timeout_seconds,
                             lease_owner, lease_token, last_error_class, last_error_detail,
                             created_at, started_at)
    SELECT id, kind, lane, idempotency_key, tenant_id, payload, 'dead', priority, expires_at,
           attempts, max_attempts, timeout_seconds, lease_owner, lease_token, 'lease_expired',
           'lease expired on the last attempt', created_at, started_at
    FROM buried
    RETURNING id, lane, kind
)
SELECT id, lane, kind, 'queued' AS outcome FROM requeued
UNION ALL
SELECT id, lane, kind, 'dead' AS outcome FROM history;

-- name: hold
-- Hold back jobs not running yet (queued, or waiting for a retry) whose work the caller is
-- about to do itself; they come back on their own when $2 seconds pass (the caller died), or
-- at once by wake_held. Returns the keys held.
UPDATE jobs
SET status = 'waiting',
    run_after = now() + make_interval(secs => $2)
WHERE id IN (SELECT job_id FROM job_keys WHERE idempotency_key = ANY($1::text[]))
  AND status IN ('queued', 'waiting')
RETURNING idempotency_key;

-- name: finish_held
-- A held job (inserted waiting, its work done by its enqueuer: store/job_types.py
-- ``held_seconds``) finished as succeeded, by its key, while it is still held: one that
-- came back by itself and was claimed meanwhile is its claimer's. Two parts of one
-- statement (store/together.py): ``held_done`` deletes it, ``held_history`` records it
-- (FROM held_done). $1 the key, $2 its result.
DELETE FROM jobs
WHERE id = (SELECT job_id FROM job_keys WHERE idempotency_key = $1) AND status = 'waiting'
RETURNING *;

-- name: finish_held_history
INSERT INTO job_history (id, kind, lane, idempotency_key, tenant_id, payload, status, priority,
                         expires_at, attempts, max_attempts, timeout_seconds, lease_owner,
                         lease_token, last_error_class, last_error_detail, result, created_at,
                         started_at)
SELECT id, kind, lane, idempotency_key, tenant_id, payload, 'succeeded', priority, expires_at,
       attempts, max_attempts, timeout_seconds, lease_owner, lease_token, last_error_class,
       last_error_detail, $1::jsonb, created_at, started_at
FROM held_done
RETURNING id;

-- name: wake_held
-- The lanes' listeners are woken in this round trip, as by an enqueue (store/enqueuing.py).
WITH woken AS (
    UPDATE jobs
    SET status = 'queued',
        run_after = now()
    WHERE id IN (SELECT job_id FROM job_keys WHERE idempotency_key = ANY($1::text[]))
      AND status = 'waiting'
    RETURNING lane
), notified AS (
    SELECT pg_notify('aivedio_jobs', l.lane) FROM (SELECT DISTINCT lane FROM woken) AS l
)
SELECT lane, (SELECT count(*) FROM notified) AS lanes_notified FROM woken;

-- name: promote
-- Retry waits that are due become claimable.
-- The lanes' listeners are woken in this round trip, as by an enqueue (store/enqueuing.py). The last row
-- (lane NULL) tells how many seconds remain until the next wait is due (NULL: none waits;
-- 0 or less: more are due than $1), so the caller can sleep until then.
WITH promoted AS (
    UPDATE jobs j
    SET status = 'queued'
    FROM (SELECT id FROM jobs WHERE status = 'waiting' AND run_after <= now()
          ORDER BY run_after LIMIT $1 FOR UPDATE SKIP LOCKED) due
    WHERE j.id = due.id
    RETURNING j.id, j.lane
), notified AS (
    SELECT pg_notify('aivedio_jobs', l.lane) FROM (SELECT DISTINCT lane FROM promoted) AS l
)
SELECT lane, (SELECT count(*) FROM notified) AS lanes_notified, NULL::float8 AS next_due
FROM promoted
UNION ALL
SELECT NULL, NULL, extract(epoch FROM min(w.run_after) - now())::float8
FROM (SELECT run_after FROM jobs
      WHERE status = 'waiting' AND run_after > now() AND run_after < 'infinity'
      ORDER BY run_after LIMIT 1) w;

-- name: replay
-- An operator's retry: a dead or cancelled job comes back with a fresh budget; a waiting
-- job becomes due now.
WITH revived AS (
    DELETE FROM job_history WHERE id = $1 AND status IN ('dead', 'cancelled')
    RETURNING *
), reinserted AS (
    INSERT INTO jobs (id, kind, lane, idempotency_key, tenant_id, payload, status, priority,
                      expires_at, estimated_seconds, sort_at, max_attempts, timeout_seconds,
                      lease_token, last_error_class, last_error_detail, created_at)
    SELECT id, kind, lane, idempotency_key, tenant_id, payload, 'queued', priority,
           expires_at, 0, now(), max_attempts, timeout_seconds, lease_token,
           last_error_class, last_error_detail, created_at
    FROM revived
    RETURNING id, lane
), hurried AS (
    UPDATE jobs SET status = 'queued', run_after = now()
    WHERE id = $1 AND status = 'waiting'
    RETURNING id, lane
)
SELECT id, lane FROM reinserted UNION ALL SELECT id, lane FROM hurried;

-- name: get_job
SELECT id, kind, lane, idempotency_key, tenant_id, payload, status, priority, expires_at,
       attempts, max_attempts, lease_owner, lease_token, lease_until, last_error_class,
       last_error_detail, created_at, NULL::timestamptz AS finished_at
FROM jobs WHERE id = $1
UNION ALL
SELECT id, kind, lane, idempotency_key, tenant_id, payload, status, priority, expires_at,
       attempts, max_attempts, lease_owner, lease_token, NULL, last_error_class,
       last_error_detail, created_at, finished_at
FROM job_history WHERE id = $1;

-- name: list_jobs
SELECT * FROM (
    SELECT id, kind, lane, tenant_id, status, attempts, max_attempts, last_error_class,
           last_error_detail, created_at, NULL::timestamptz AS finished_at
    FROM jobs
    WHERE ($1::text IS NULL OR status = $1) AND ($2::text IS NULL OR kind = $2)
    UNION ALL
    SELECT id, kind, lane, tenant_id, status, attempts, max_attempts, last_error_class,
           last_error_detail, created_at, finished_at
    FROM job_history
    WHERE ($1::text IS NULL OR status = $1) AND ($2::text IS NULL OR kind = $2)
) all_jobs
ORDER BY id DESC
LIMIT $3;

-- name: backlog_pressure
-- The two pressure signals in one statement, each an index range scan: the age of the
-- oldest queued job of the media lane (jobs_queued_age), and the provider outputs not yet
-- stored whose URL expires between now and now + $1 seconds (provider_outputs_expiring).
-- An output whose URL already expired is the refresh path's, not a race the fetch lane can
-- still win, so it is not counted. A run_after of -infinity (a row no path writes, but one
-- that would fail the subtraction, and so every reading, for ever) is left out; the range
-- keeps the index scan.
SELECT
    (SELECT extract(epoch FROM now() - min(run_after)) FROM jobs
     WHERE lane = 'media' AND status = 'queued'
       AND run_after > '-infinity') AS media_oldest_seconds,
    (SELECT count(*) FROM provider_outputs
     WHERE fetch_status NOT IN ('STORED', 'OUTPUT_LOST', 'INVALID_RESPONSE')
       AND source_url_expires_at >= now()
       AND source_url_expires_at < now() + make_interval(secs => $1)) AS near_expiry;

-- name: queue_stats
-- (A run_after of -infinity counts in the depth, not in the age: see backlog_pressure.)
SELECT kind, count(*) AS depth,
       extract(epoch FROM now() - min(run_after) FILTER (WHERE run_after > '-infinity'))
           AS oldest_seconds
FROM jobs WHERE status = 'queued'
GROUP BY kind;
