"""The records of resumable (tus) uploads: upload sessions of method TUS (``uploads.py``
creates, completes and reaps them like every session; this module keeps what only a
resumable one has).

* **One writer at a time.** A PATCH claims the session's writer lease (``claim_writer``):
  ``writer_id`` is its own random id, ``writer_until`` when the lease lapses unless renewed.
  A second PATCH while the lease is held is refused (423); a writer whose process died
  frees the upload when its lease lapses. Every checkpoint is a compare-and-set on the
  writer id and the offset it started from, so a writer that lost its lease (stalled past
  it while another took over) cannot overwrite the newer writer's progress.
* **A checkpoint moves the idle expiry.** ``expires_at`` is pushed ``idle_seconds`` past
  each recorded PATCH, so the sweeper's ``expired_uploads`` scan (``uploads.py``) reaps an
  upload nobody has written to for that long, with everything it left in the store.
* **Upload tokens** (``avu_`` and 43 url-safe characters) are stored as their SHA-256: 256
  random bits need no key-stretching, and the hash finds the row. A token opens its one
  session only, and only while it awaits its bytes.
"""

from __future__ import annotations

import hashlib
import secrets
import uuid

from aivedio.store.database import Pool, map_db_errors
from aivedio.store.objects.append import AppendMark
from aivedio.store.uploads import AWAITING, COLUMNS, TUS, UploadSession, session_from_row

TOKEN_PREFIX = "avu_"  # noqa: S105 (a prefix, not a secret)


def new_upload_token() -> tuple[str, bytes]:
    """(token, its hash to store)."""
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    return token, token_hash(token)


def token_hash(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def is_upload_token(credential: str) -> bool:
    return credential.startswith(TOKEN_PREFIX)


def mark_of(session: UploadSession) -> AppendMark:
    parts = tuple((str(etag), str(sha)) for etag, sha in session.parts or [])
    return AppendMark(offset=session.upload_offset or 0, parts=parts, tail_key=session.tail_key)


async def session_for_token(pool: Pool, token: str) -> UploadSession | None:
    """The session an upload token opens, while it awaits its bytes; else None."""
    with map_db_errors("reading the upload token"):
        row = await pool.fetchrow(
            f"SELECT {COLUMNS} FROM upload_sessions WHERE upload_token_sha256 = $1"
            f" AND method = '{TUS}' AND status = '{AWAITING}' AND expires_at > now()",
            token_hash(token),
        )
    return None if row is None else session_from_row(row)


async def claim_writer(
    pool: Pool, video_id: uuid.UUID, writer: uuid.UUID, lease_seconds: float
) -> UploadSession | None:
    """Take the writer lease of a session awaiting its bytes; None when another writer holds
    it or the session no longer accepts bytes (the caller reads it again to say which)."""
    with map_db_errors("claiming the upload"):
        row = await pool.fetchrow(
            "UPDATE upload_sessions SET writer_id = $2,"
            " writer_until = now() + make_interval(secs => $3),"
            " expires_at = greatest(expires_at, now() + make_interval(secs => $3)),"
            " updated_at = now()"
            f" WHERE id = $1 AND method = '{TUS}' AND status = '{AWAITING}'"
            " AND expires_at > now() AND (writer_id IS NULL OR writer_until < now())"
            f" RETURNING {COLUMNS}",
            video_id,
            writer,
            lease_seconds,
        )
    return None if row is None else session_from_row(row)


async def renew_writer(
    pool: Pool, video_id: uuid.UUID, writer: uuid.UUID, lease_seconds: float
) -> bool:
    """Extend the lease; False when it is no longer ours."""
    with map_db_errors("renewing the upload's writer lease"):
        done = await pool.fetchval(
            "UPDATE upload_sessions SET writer_until = now() + make_interval(secs => $3),"
            " expires_at = greatest(expires_at, now() + make_interval(secs => $3))"
            f" WHERE id = $1 AND writer_id = $2 AND status = '{AWAITING}' RETURNING 1",
            video_id,
            writer,
            lease_seconds,
        )
    return done is not None


async def record_checkpoint(
    pool: Pool,
    video_id: uuid.UUID,
    writer: uuid.UUID,
    *,
    started_at: int,
    mark: AppendMark,
    idle_seconds: float,
) -> bool:
    """The bytes up to ``mark`` are stored: record it (compare-and-set on the writer and the
    offset the request started at) and push the idle expiry. False: not ours any more."""
    with map_db_errors("recording the upload's progress"):
        done = await pool.fetchval(
            "UPDATE upload_sessions SET upload_offset = $4, parts = $5, tail_key = $6,"
            " expires_at = now() + make_interval(secs => $7), uploaded_at = now(),"
            " updated_at = now()"
            f" WHERE id = $1 AND writer_id = $2 AND status = '{AWAITING}'"
            " AND upload_offset = $3 RETURNING 1",
            video_id,
            writer,
            started_at,
            mark.offset,
            [list(part) for part in mark.parts],
            mark.tail_key,
            idle_seconds,
        )
    return done is not None


async def release_writer(pool: Pool, video_id: uuid.UUID, writer: uuid.UUID) -> None:
    """Give the lease up (a no-op when it is no longer ours)."""
    with map_db_errors("releasing the upload"):
        await pool.execute(
            "UPDATE upload_sessions SET writer_id = NULL, writer_until = NULL"
            " WHERE id = $1 AND writer_id = $2",
            video_id,
            writer,
        )
