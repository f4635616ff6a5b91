-- Resumable uploads (tus 1.0, api/tus.py) are upload sessions of method TUS, and the
-- whole-file SHA-256 a client declares is optional (verified when given, computed when not).
--
-- A TUS session appends to one object across requests and API processes: on S3 a multipart
-- upload (multipart_upload_id) whose parts hold the first len(parts) * part_size_bytes
-- bytes (parts: [[etag, base64 SHA-256], ...] of parts 1..n, what completing the upload
-- names), plus a tail object (tail_key) holding the bytes after them, shorter than a part; on the local store an append file (multipart_upload_id is its
-- pending upload's id). upload_offset is how many bytes are stored for good: what HEAD
-- answers, and the Upload-Offset the next PATCH must carry.
--
-- One writer at a time: a PATCH claims writer_id until writer_until (a lease it renews while
-- the body streams in), and every checkpoint is a compare-and-set on writer_id, so a writer
-- whose lease lapsed (a stalled process) cannot overwrite a newer one's progress.
--
-- upload_token_sha256: the hash of the one-time upload token POST /v1/videos hands out, so
-- a browser can send the bytes without the tenant's API key; it works for this one session
-- and only while the session awaits its bytes.
ALTER TABLE upload_sessions ALTER COLUMN declared_sha256 DROP NOT NULL;
ALTER TABLE upload_sessions DROP CONSTRAINT upload_sessions_method_check;
ALTER TABLE upload_sessions ADD CONSTRAINT upload_sessions_method_check
    CHECK (method IN ('API_PUT', 'S3_PUT', 'S3_MULTIPART', 'TUS'));
ALTER TABLE upload_sessions DROP CONSTRAINT upload_sessions_check;
ALTER TABLE upload_sessions ADD CONSTRAINT upload_sessions_multipart_id
    CHECK (CASE method WHEN 'S3_MULTIPART' THEN multipart_upload_id IS NOT NULL
                       WHEN 'TUS' THEN TRUE
                       ELSE multipart_upload_id IS NULL END);
ALTER TABLE upload_sessions
    ADD COLUMN upload_offset bigint CHECK (upload_offset >= 0),
    ADD COLUMN parts jsonb CHECK (jsonb_typeof(parts) = 'array'),
    ADD COLUMN tail_key text,
    ADD COLUMN upload_metadata text CHECK (length(upload_metadata) <= 4096),
    ADD COLUMN upload_token_sha256 bytea UNIQUE,
    ADD COLUMN writer_id uuid,
    ADD COLUMN writer_until timestamptz
        CONSTRAINT upload_sessions_writer_until_sane
        CHECK (writer_until >= '1970-01-01 00:00:00+00' AND writer_until < '2500-01-01 00:00:00+00'),
    ADD CONSTRAINT upload_sessions_tus_state
        CHECK ((method = 'TUS') = (upload_offset IS NOT NULL AND parts IS NOT NULL));
