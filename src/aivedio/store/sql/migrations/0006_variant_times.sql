-- When each output was recorded (SUCCEEDED or FAILED), and when each moderation verdict
-- was stored: the timeline and the publish-latency measurement read them.
ALTER TABLE asset_variants ADD COLUMN completed_at timestamptz;
ALTER TABLE asset_revisions ADD COLUMN moderated_at timestamptz;
