"""An upload session as the video routes meet it: the video id of a request, its session
(another tenant's answers 404 like a missing one), refusing a session that has ended, and
hashing the bytes that stream through while an upload is received or verified."""

from __future__ import annotations

import uuid
from typing import Any

import anyio
import anyio.to_thread
from aiohttp import web

from aivedio.api.auth import tenant_of
from aivedio.api.context import context
from aivedio.api.problems import ApiError
from aivedio.store import uploads
from aivedio.store.uploads import UploadSession

# Chunks at least this big are hashed in a worker thread (hashlib releases the GIL), so a
# large upload does not hold the event loop for a millisecond and more per chunk.
THREAD_HASH_BYTES = 256 * 1024


def path_video_id(request: web.Request) -> uuid.UUID:
    """The ``video_id`` of the path; an id that is not a UUID is a missing video (404)."""
    try:
        return uuid.UUID(request.match_info["video_id"])
    except ValueError:
        raise ApiError(404, "no such video") from None


async def session_of(request: web.Request) -> UploadSession:
    """The caller's upload session of the path's video, or 404."""
    session = await uploads.load_session(
        context(request).pool, tenant_of(request), path_video_id(request)
    )
    if session is None:
        raise ApiError(404, "no such video")
    return session


def refuse_ended(session: UploadSession) -> None:
    """410 for an expired session, 422 for a failed one (its reason again)."""
    if session.expired():
        raise ApiError(
            410,
            f"the upload session expired at {session.expires_at.isoformat()}; create a new video",
            code="upload_expired",
        )
    if session.status == uploads.FAILED:
        raise ApiError(
            422,
            f"the upload failed: {session.error_detail}; create a new video",
            code=session.error_class or "upload_failed",
        )


async def hash_chunk(hasher: Any, chunk: bytes) -> None:
    """Feed ``chunk`` to ``hasher``, in a worker thread when it is big."""
    if len(chunk) >= THREAD_HASH_BYTES:
        await anyio.to_thread.run_sync(hasher.update, chunk)
    else:
        hasher.update(chunk)


def status_path(video: uuid.UUID) -> str:
    return f"/v1/videos/{video}/status"
