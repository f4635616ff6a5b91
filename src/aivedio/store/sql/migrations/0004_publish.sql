-- Publish: what a released revision promised, retention of rejected sources, moderation.

-- The outputs a revision had when it was published. Outputs of the same revision that finish
-- later are never added to it (a published revision never changes): they are released by a
-- new, complete revision (enrichment) that references the same immutable objects.
ALTER TABLE asset_revisions ADD COLUMN published_outputs text[];
ALTER TABLE asset_revisions ADD COLUMN enriches integer;
ALTER TABLE asset_revisions ADD COLUMN cancel_version_at_start bigint NOT NULL DEFAULT 0;
ALTER TABLE releases ADD COLUMN outputs text[] NOT NULL DEFAULT '{}';

-- A rejected source stays in quarantine for appeal and audit until this time; the sweeper
-- never removes it earlier.
ALTER TABLE assets ADD COLUMN source_retain_until timestamptz;
ALTER TABLE assets ADD COLUMN deleted_at timestamptz;

CREATE INDEX asset_variants_object_key ON asset_variants (object_key);
CREATE INDEX assets_status ON assets (status, updated_at);

-- The provider's own safety labels for an output, when its adapter reports them; moderation
-- sends them with the frames.
ALTER TABLE provider_outputs ADD COLUMN safety_labels jsonb;
