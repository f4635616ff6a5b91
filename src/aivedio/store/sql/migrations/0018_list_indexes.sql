-- The list routes (GET /v1/assets, /v1/videos, /v1/generation-tasks: store/listings.py)
-- page a tenant's rows newest first by (created_at, id): one index each, so a page costs
-- its own rows, not a scan of the tenant's history.
CREATE INDEX assets_tenant_created ON assets (tenant_id, created_at DESC, id DESC);
CREATE INDEX upload_sessions_tenant_created
    ON upload_sessions (tenant_id, created_at DESC, id DESC);
CREATE INDEX generation_tasks_tenant_created
    ON generation_tasks (tenant_id, created_at DESC, id DESC);
