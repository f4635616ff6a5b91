-- An asset's timeline (aivedio status, GET /v1/videos/{id}/status, status --follow) reads its
-- finished jobs by payload->>'asset_id'; without this it scans the whole history. The live
-- `jobs` table stays small (finished jobs move out), so it needs none.
CREATE INDEX job_history_asset ON job_history ((payload->>'asset_id'));
