-- How far a running job's media work has got, a fraction in [0, 1] (aivedio/progress.py):
-- written by the worker's heartbeat with the leases it extends (no statement of its own),
-- cleared by the claim, read by `aivedio status`, the API's status and its event stream.
-- Nullable with no default: adding it rewrites nothing, and NULL means "not measured".
ALTER TABLE jobs ADD COLUMN progress real
    CONSTRAINT jobs_progress_fraction CHECK (progress >= 0 AND progress <= 1);
