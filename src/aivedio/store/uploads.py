"""Upload sessions: the records behind ``POST /v1/videos``, and the reaper of expired ones.

A session is created with the size and SHA-256 the client declares; the bytes arrive either
through presigned URLs (S3: one PUT, or multipart parts) or through the API's own streaming
``PUT`` (the local store). ``complete_session`` is the one way a session becomes an asset: in
one transaction the session turns COMPLETED, the QUARANTINED asset (its id is the video id)
is inserted and its probe job enqueued, exactly as the fetch stage does for provider outputs.

States: AWAITING_UPLOAD → COMPLETED | FAILED | EXPIRED, each change a compare-and-set on the
expected status, so a complete racing the reaper (or a second complete) has exactly one
winner. A session past ``expires_at`` accepts nothing even before the reaper marks it.

Object keys (seed layout, tenant as a keyed hash): presigned uploads write
``quarantine/{tenant}/{video}/source.bin``; each PUT through the API writes
``quarantine/{tenant}/{video}/{attempt}/source.bin`` of its own and records that key with what
it measured, so bytes whose checksum was recorded are never replaced by a concurrent PUT, and
completing checks (in its transaction) that the key it verified is still the recorded one.
Everything a session ever wrote lives under ``quarantine/{tenant}/{video}/``, which is what
the reaper removes.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

import msgspec

from aivedio.errors import StaleStateError
from aivedio.logs import get_logger
from aivedio.store.database import Pool, map_db_errors, row_dict
from aivedio.store.objects import keys
from aivedio.store.objects.base import ObjectStore
from aivedio.store.queue import JobSpec, Queue
from aivedio.supervision import RowGuard, Skipped

log = get_logger("aivedio.uploads")

AWAITING = "AWAITING_UPLOAD"
COMPLETED = "COMPLETED"
FAILED = "FAILED"
EXPIRED = "EXPIRED"
# How the bytes arrive.
API_PUT = "API_PUT"
S3_PUT = "S3_PUT"
S3_MULTIPART = "S3_MULTIPART"
TUS = "TUS"  # resumable (tus 1.0) through the API, on either store: resumable_uploads.py
# Sessions handled per reaper call; the next call takes the rest.
REAP_BATCH = 500

COLUMNS = (
    "id, tenant_id, status, method, content_type, filename, declared_size_bytes,"
    " declared_sha256, object_key, multipart_upload_id, part_size_bytes, received_size_bytes,"
    " received_sha256, error_class, error_detail, expires_at, uploaded_at, completed_at,"
    " ended_at, cleaned_at, created_at, passthrough, upload_offset, parts, tail_key,"
    " upload_metadata"
)


class UploadSession(msgspec.Struct, frozen=True, kw_only=True):
    id: uuid.UUID
    tenant_id: int
    status: str
    method: str
    content_type: str
    filename: str | None
    declared_size_bytes: int
    declared_sha256: str | None  # optional: computed while receiving when not declared
    object_key: str | None
    multipart_upload_id: str | None
    part_size_bytes: int | None
    received_size_bytes: int | None
    received_sha256: str | None
    error_class: str | None
    error_detail: str | None
    expires_at: datetime
    uploaded_at: datetime | None
    completed_at: datetime | None
    ended_at: datetime | None
    cleaned_at: datetime | None
    created_at: datetime
    passthrough: str | None = None
    # Resumable (TUS) sessions only: bytes stored for good, the S3 parts sent ([etag,
    # base64 SHA-256] each), the S3 tail object, and the client's Upload-Metadata as sent.
    upload_offset: int | None = None
    parts: list[list[str]] | None = None
    tail_key: str | None = None
    upload_metadata: str | None = None

    def expired(self, now: datetime | None = None) -> bool:
        """EXPIRED, or still awaiting its upload past ``expires_at``."""
        if self.status == EXPIRED:
            return True
        return self.status == AWAITING and self.expires_at <= (now or datetime.now(UTC))


def session_from_row(record: Any) -> UploadSession:
    return UploadSession(**row_dict(record))


def session_prefix(tenant_id: int, video_id: uuid.UUID) -> str:
    """Everything one session may have written lies under this prefix."""
    return f"quarantine/{keys.tenant_hash(tenant_id)}/{video_id}/"


def source_key(tenant_id: int, video_id: uuid.UUID, attempt: str | None = None) -> str:
    """The presigned target (``attempt`` None), or the key of one PUT through the API."""
    middle = f"{attempt}/" if attempt else ""
    return f"{session_prefix(tenant_id, video_id)}{middle}source.bin"


# -- the session's life ------------------------------------------------------------------------


async def create_session(
    pool: Pool,
    *,
    video_id: uuid.UUID,
    tenant_id: int,
    method: str,
    content_type: str,
    filename: str | None,
    size_bytes: int,
    sha256: str | None,
    expires_at: datetime,
    object_key: str | None = None,
    multipart_upload_id: str | None = None,
    part_size_bytes: int | None = None,
    passthrough: str | None = None,
    upload_metadata: str | None = None,
    upload_token_sha256: bytes | None = None,
) -> UploadSession:
    """A session awaiting its bytes; a TUS one starts at offset 0 with no part sent."""
    start = 0 if method == TUS else None
    with map_db_errors("recording the upload session"):
        row = await pool.fetchrow(
            "INSERT INTO upload_sessions (id, tenant_id, status, method, content_type, filename,"
            " declared_size_bytes, declared_sha256, object_key, multipart_upload_id,"
            " part_size_bytes, expires_at, passthrough, upload_metadata, upload_token_sha256,"
            " upload_offset, parts)"
            f" VALUES ($1, $2, '{AWAITING}', $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13,"
            f" $14, $15, $16) RETURNING {COLUMNS}",
            video_id,
            tenant_id,
            method,
            content_type,
            filename,
            size_bytes,
            sha256,
            object_key,
            multipart_upload_id,
            part_size_bytes,
            expires_at,
            passthrough,
            upload_metadata,
            upload_token_sha256,
            start,
            [] if method == TUS else None,
        )
    assert row is not None
    return session_from_row(row)


async def load_session(pool: Pool, tenant_id: int, video_id: uuid.UUID) -> UploadSession | None:
    """The session if it is this tenant's; another tenant's is as missing as no session."""
    with map_db_errors("reading the upload session"):
        row = await pool.fetchrow(
            f"SELECT {COLUMNS} FROM upload_sessions WHERE id = $1 AND tenant_id = $2",
            video_id,
            tenant_id,
        )
    return None if row is None else session_from_row(row)


async def record_received(
    pool: Pool, video_id: uuid.UUID, *, key: str, size: int, sha256: str
) -> str | None:
    """Record a PUT that finished: its key and the size and SHA-256 measured while it
    streamed. Returns the key it replaces (for the caller to delete), or raises
    ``StaleStateError`` when the session no longer accepts uploads (completed, failed,
    expired): the caller then deletes its own object."""
    with map_db_errors("recording the upload"):
        async with pool.acquire() as conn, conn.transaction():
            previous = await conn.fetchrow(
                "SELECT object_key FROM upload_sessions WHERE id = $1"
                f" AND status = '{AWAITING}' AND expires_at > now() FOR UPDATE",
                video_id,
            )
            if previous is None:
                raise StaleStateError(f"upload session {video_id} no longer accepts uploads")
            await conn.execute(
                "UPDATE upload_sessions SET object_key = $2, received_size_bytes = $3,"
                " received_sha256 = $4, uploaded_at = now(), error_class = NULL,"
                " error_detail = NULL, updated_at = now() WHERE id = $1",
                video_id,
                key,
                size,
                sha256,
            )
    old: str | None = previous["object_key"]
    return old if old != key else None


async def note_refused(pool: Pool, video_id: uuid.UUID, error_class: str, detail: str) -> None:
    """An upload attempt was refused (and discarded); the session stays open for another.
    Recorded so the status shows why the last attempt did not count."""
    with map_db_errors("recording a refused upload"):
        await pool.execute(
            "UPDATE upload_sessions SET error_class = $2, error_detail = $3, updated_at = now()"
            f" WHERE id = $1 AND status = '{AWAITING}'",
            video_id,
            error_class,
            detail,
        )


async def fail_session(pool: Pool, video_id: uuid.UUID, error_class: str, detail: str) -> bool:
    """AWAITING_UPLOAD → FAILED with the reason; False if the session had already moved."""
    with map_db_errors("failing the upload session"):
        done = await pool.fetchval(
            f"UPDATE upload_sessions SET status = '{FAILED}', error_class = $2,"
            " error_detail = $3, ended_at = now(), updated_at = now()"
            f" WHERE id = $1 AND status = '{AWAITING}' RETURNING id",
            video_id,
            error_class,
            detail,
        )
    return done is not None


async def mark_cleaned(pool: Pool, video_id: uuid.UUID) -> None:
    """A FAILED or EXPIRED session's objects are gone."""
    with map_db_errors("marking the upload session cleaned"):
        await pool.execute(
            "UPDATE upload_sessions SET cleaned_at = now(), updated_at = now()"
            f" WHERE id = $1 AND status IN ('{FAILED}', '{EXPIRED}')",
            video_id,
        )


async def complete_session(
    pool: Pool,
    queue: Queue,
    session: UploadSession,
    *,
    key: str,
    size: int,
    sha256: str,
    probe: JobSpec,
) -> bool:
    """In one transaction: the session COMPLETED, the QUARANTINED asset (id = video id,
    source UPLOAD) and its probe job. ``key``, ``size`` and ``sha256`` are what the caller
    verified; the compare-and-set refuses when the session moved meanwhile (completed by
    another call, expired, failed) or when a later PUT recorded another key. False then,
    and nothing was written."""
    with map_db_errors("completing the upload"):
        async with pool.acquire() as conn, conn.transaction():
            won = await conn.fetchval(
                f"UPDATE upload_sessions SET status = '{COMPLETED}', object_key = $3,"
                " received_size_bytes = $4, received_sha256 = $5, completed_at = now(),"
                " ended_at = now(), uploaded_at = coalesce(uploaded_at, now()),"
                " error_class = NULL, error_detail = NULL, updated_at = now()"
                f" WHERE id = $1 AND tenant_id = $2 AND status = '{AWAITING}'"
                " AND expires_at > now() AND object_key IS NOT DISTINCT FROM $3 RETURNING id",
                session.id,
                session.tenant_id,
                key,
                size,
                sha256,
            )
            if won is None:
                return False
            await conn.execute(
                # The video was created with its session: the asset (the same id) is listed
                # at that time (video_created_at), so a walk of GET /v1/videos never sees
                # the video move when its upload completes.
                "INSERT INTO assets (id, tenant_id, source_type, source_provider_output_id,"
                " status, source_object_key, source_size_bytes, source_sha256,"
                " video_created_at)"
                " VALUES ($1, $2, 'UPLOAD', NULL, 'QUARANTINED', $3, $4, $5, $6)"
                " ON CONFLICT (id) DO NOTHING",
                session.id,
                session.tenant_id,
                key,
                size,
                sha256,
                session.created_at,
            )
            await queue.enqueue_one(conn, probe)
    return True


# -- the reaper --------------------------------------------------------------------------------


class ReapedUpload(msgspec.Struct, frozen=True, kw_only=True):
    """One session the reaper handled (or, in a dry run, would have)."""

    video_id: uuid.UUID
    tenant_id: int
    status: str  # after the reap: EXPIRED or FAILED
    expires_at: datetime
    action: str  # "expired_and_cleaned", "cleaned", "skipped" (moved meanwhile), "would_…"
    deleted_objects: list[str] = msgspec.field(default_factory=list)
    aborted_uploads: list[str] = msgspec.field(default_factory=list)


async def expired_uploads(
    pool: Pool, *, now: datetime | None = None, limit: int = REAP_BATCH
) -> list[UploadSession]:
    """What the reaper takes: sessions still awaiting their upload past ``expires_at``, and
    FAILED or EXPIRED sessions whose objects were not (yet) removed."""
    return [session_from_row(row) for row in await _expired_rows(pool, now, limit)]


async def _expired_rows(pool: Pool, now: datetime | None, limit: int) -> list[Any]:
    with map_db_errors("listing expired upload sessions"):
        return list(
            await pool.fetch(
                f"SELECT {COLUMNS} FROM upload_sessions"
                f" WHERE (status = '{AWAITING}' AND expires_at <= $1)"
                f"    OR (status IN ('{FAILED}', '{EXPIRED}') AND cleaned_at IS NULL)"
                " ORDER BY expires_at LIMIT $2",
                now or datetime.now(UTC),
                limit,
            )
        )


async def reap_expired_uploads(
    pool: Pool,
    store: ObjectStore,
    *,
    now: datetime | None = None,
    limit: int = REAP_BATCH,
    dry_run: bool = False,
    rows: RowGuard | None = None,
    on_skip: Skipped | None = None,
) -> list[ReapedUpload]:
    """Expire sessions nobody completed in time and remove what they left in quarantine.

    Each session awaiting its upload past ``expires_at`` turns EXPIRED (compare-and-set: a
    complete that wins keeps its session, and one that loses answers 410); then every object
    under the session's prefix is deleted and every pending upload there aborted (the
    recorded multipart upload, and any PUT through the API cut off mid-stream), and the
    session is marked cleaned. FAILED sessions whose cleanup did not finish are cleaned the
    same way. Safe to run concurrently with itself and with the API; idempotent. Each
    session is reaped alone (``rows``): one that cannot be decoded or removed is logged and
    skipped (``on_skip``), and the others are reaped.
    """
    now = now or datetime.now(UTC)
    guard = rows or RowGuard()
    reaped: list[ReapedUpload] = []
    for row in await _expired_rows(pool, now, limit):
        with guard.row("expired_uploads", row["id"], on_skip=on_skip):
            reaped.append(await _reap(pool, store, session_from_row(row), now, dry_run))
    return reaped


async def _reap(
    pool: Pool, store: ObjectStore, session: UploadSession, now: datetime, dry_run: bool
) -> ReapedUpload:
    """One session of ``reap_expired_uploads``."""
    status = session.status
    if dry_run:
        action = "would_expire_and_clean" if status == AWAITING else "would_clean"
        return _reaped(session, EXPIRED if status == AWAITING else status, action)
    if status == AWAITING:
        with map_db_errors("expiring the upload session"):
            moved = await pool.fetchval(
                f"UPDATE upload_sessions SET status = '{EXPIRED}', ended_at = now(),"
                " updated_at = now()"
                f" WHERE id = $1 AND status = '{AWAITING}' AND expires_at <= $2 RETURNING id",
                session.id,
                now,
            )
        if moved is None:
            return _reaped(session, status, "skipped")
        status = EXPIRED
    deleted, aborted = await remove_session_objects(store, session)
    await mark_cleaned(pool, session.id)
    action = "expired_and_cleaned" if session.status == AWAITING else "cleaned"
    log.info(
        "upload_session_reaped",
        video_id=str(session.id),
        status=status,
        objects=len(deleted),
        aborted=len(aborted),
    )
    return _reaped(session, status, action, deleted, aborted)


async def remove_session_objects(
    store: ObjectStore, session: UploadSession
) -> tuple[list[str], list[str]]:
    """Delete every object under the session's prefix and abort every pending upload there.
    Only for sessions that will never complete (FAILED, EXPIRED)."""
    prefix = session_prefix(session.tenant_id, session.id)
    aborted: list[str] = []
    if session.multipart_upload_id and session.object_key:
        await store.abort_multipart_upload(session.object_key, session.multipart_upload_id)
        aborted.append(session.multipart_upload_id)
    for pending in await store.list_multipart_uploads(prefix):
        if pending.upload_id not in aborted:
            await store.abort_multipart_upload(pending.key, pending.upload_id)
            aborted.append(pending.upload_id)
    deleted = [info.key async for info in store.list(prefix)]
    for key in deleted:
        await store.delete(key)
    return deleted, aborted


def _reaped(
    session: UploadSession,
    status: str,
    action: str,
    deleted: list[str] | None = None,
    aborted: list[str] | None = None,
) -> ReapedUpload:
    return ReapedUpload(
        video_id=session.id,
        tenant_id=session.tenant_id,
        status=status,
        expires_at=session.expires_at,
        action=action,
        deleted_objects=deleted or [],
        aborted_uploads=aborted or [],
    )
