-- Upload sessions of POST /v1/videos (seed 004: "POST /videos creates the video and its upload
-- session, POST /videos/{id}/complete confirms the source object is usable").
--
-- The session id is the video id, and the asset's id once the upload completes: completing
-- inserts the QUARANTINED asset and enqueues its probe in the transaction that marks the
-- session COMPLETED, so a session is COMPLETED exactly when its asset exists.
--
-- object_key is where the session's bytes are: for presigned uploads (S3) the key the URLs
-- were made for, from the start; for uploads through the API the key of the last PUT that
-- finished, recorded with the size and SHA-256 measured while it streamed. Each PUT writes a
-- key of its own, so bytes whose checksum was recorded are never replaced by a later PUT.
--
-- cleaned_at: a FAILED or EXPIRED session's objects (and multipart upload) were removed; the
-- reaper (store/uploads.reap_expired_uploads) finishes what a crash left undone.
CREATE TABLE upload_sessions (
    id                   uuid PRIMARY KEY,
    tenant_id            bigint NOT NULL REFERENCES tenants (id),
    status               text NOT NULL
                         CHECK (status IN ('AWAITING_UPLOAD', 'COMPLETED', 'FAILED', 'EXPIRED')),
    method               text NOT NULL CHECK (method IN ('API_PUT', 'S3_PUT', 'S3_MULTIPART')),
    content_type         text NOT NULL,
    filename             text,
    declared_size_bytes  bigint NOT NULL CHECK (declared_size_bytes > 0),
    declared_sha256      text NOT NULL CHECK (declared_sha256 ~ '^[0-9a-f]{64}$'),
    object_key           text,
    multipart_upload_id  text,
    part_size_bytes      bigint,
    received_size_bytes  bigint,
    received_sha256      text,
    error_class          text,
    error_detail         text,
    expires_at           timestamptz NOT NULL,
    uploaded_at          timestamptz,
    completed_at         timestamptz,
    ended_at             timestamptz,
    cleaned_at           timestamptz,
    created_at           timestamptz NOT NULL DEFAULT now(),
    updated_at           timestamptz NOT NULL DEFAULT now(),
    CHECK ((method = 'S3_MULTIPART') = (multipart_upload_id IS NOT NULL)),
    CHECK (status <> 'COMPLETED' OR (object_key IS NOT NULL AND completed_at IS NOT NULL))
);
CREATE INDEX upload_sessions_tenant ON upload_sessions (tenant_id, created_at);
-- The reaper's scans: sessions past their expiry, and ended sessions not yet cleaned.
CREATE INDEX upload_sessions_expiry ON upload_sessions (expires_at)
    WHERE status = 'AWAITING_UPLOAD';
CREATE INDEX upload_sessions_uncleaned ON upload_sessions (ended_at)
    WHERE status IN ('FAILED', 'EXPIRED') AND cleaned_at IS NULL;
-- The quarantine GC keeps the objects of live sessions (their keys are not sources yet).
CREATE INDEX upload_sessions_object_key ON upload_sessions (object_key)
    WHERE object_key IS NOT NULL;
