-- The list routes (GET /v1/assets, /v1/videos, /v1/generation-tasks: store/listings.py)
-- page a tenant's rows newest first by (created_at, id): one index each, so a page costs
-- its own rows, not a scan of the tenant's history.
-- A video's creation time as GET /v1/videos lists it: an upload's is its session's (the
-- asset is made when the upload completes, and the video must not move in a list then);
-- any other asset's is its own. Set when the asset is inserted (store/uploads.py).
ALTER TABLE assets ADD COLUMN video_created_at timestamptz NOT NULL DEFAULT now()
    CONSTRAINT assets_video_created_at_sane
    CHECK (video_created_at >= '1970-01-01 00:00:00+00'
           AND video_created_at < '2500-01-01 00:00:00+00');
UPDATE assets a SET video_created_at = coalesce(
    (SELECT s.created_at FROM upload_sessions s WHERE s.id = a.id), a.created_at);
CREATE INDEX assets_tenant_video_created
    ON assets (tenant_id, video_created_at DESC, id DESC);
CREATE INDEX assets_tenant_created ON assets (tenant_id, created_at DESC, id DESC);
CREATE INDEX upload_sessions_tenant_created
    ON upload_sessions (tenant_id, created_at DESC, id DESC);
CREATE INDEX generation_tasks_tenant_created
    ON generation_tasks (tenant_id, created_at DESC, id DESC);
