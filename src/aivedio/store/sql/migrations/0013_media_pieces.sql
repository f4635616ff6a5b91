-- Chunked transcoding (seed 004: transcoding work keyed by video, source version, profile
-- and segment). One row per piece of a chunked revision: 'split' (the stream-copy cut),
-- 'chunk:NNNN' (a cut chunk), 'video:RUNG:NNNN' (a chunk encoded for one rendition) and
-- 'audio' (the whole track, encoded once). A piece is DONE only with its object's size and
-- SHA-256; the assembly reads nothing that is not DONE and verified against them.
CREATE TABLE media_pieces (
    asset_id    uuid NOT NULL,
    revision    integer NOT NULL,
    piece       text NOT NULL,
    status      text NOT NULL CHECK (status IN ('PENDING', 'DONE', 'FAILED')),
    object_key  text,
    size_bytes  bigint,
    sha256      text,
    frames      integer,
    detail      text,
    version     integer NOT NULL DEFAULT 1,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (asset_id, revision, piece),
    FOREIGN KEY (asset_id, revision) REFERENCES asset_revisions (asset_id, revision)
        ON DELETE CASCADE,
    CHECK (status <> 'DONE' OR (object_key IS NOT NULL AND size_bytes IS NOT NULL
                                AND sha256 IS NOT NULL))
);
