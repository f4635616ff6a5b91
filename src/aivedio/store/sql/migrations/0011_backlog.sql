-- Degradation under backlog (seed 002 §11.11.3, seed 004).

-- The pressure query reads the oldest queued job of a lane; this keeps it one index probe
-- however deep the backlog is (only queued rows are in it).
CREATE INDEX jobs_queued_age ON jobs (lane, run_after) WHERE status = 'queued';

-- An optional output put off under pressure: when it was first deferred (it stays PENDING,
-- its render job waits with a run_after, and enrichment publishes it later).
ALTER TABLE asset_variants ADD COLUMN deferred_at timestamptz;

-- Poison media: each crash of a media job over an asset's source, one row per job attempt
-- (job id and lease token): a sandboxed ffmpeg/ffprobe killed by a crash signal
-- (decoder_crashed, written by the media stage) or the worker dying while it ran the job
-- (lease_expired, written by the queue's reap in the same statement). An asset with
-- [backlog] poison_crash_count of them is quarantined instead of retried. No foreign key:
-- the reap must never fail on a job whose payload names no asset row.
CREATE TABLE media_crashes (
    job_id      bigint NOT NULL,
    lease_token bigint NOT NULL,
    asset_id    uuid NOT NULL,
    kind        text NOT NULL,
    cause       text NOT NULL CHECK (cause IN ('decoder_crashed', 'lease_expired')),
    detail      text,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (job_id, lease_token)
);
CREATE INDEX media_crashes_asset ON media_crashes (asset_id);
