"""An upload session as the video and upload routes meet it: the video id of a request, its
session (another tenant's answers 404 like a missing one), refusing new sessions under
backlog pressure, refusing a session that has ended, failing one, reading a body as it
arrives, and hashing the bytes that stream through while an upload is received or
verified."""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import AsyncIterator
from typing import Any, NoReturn

import anyio
from aiohttp import web

from aivedio.api.auth import tenant_of
from aivedio.api.context import ApiContext, context
from aivedio.api.idle_watch import body_timeout
from aivedio.api.problems import ApiError
from aivedio.logs import get_logger
from aivedio.store import uploads
from aivedio.store.objects.append import feed_aside
from aivedio.store.objects.base import MIB, ObjectStore
from aivedio.store.uploads import UploadSession

log = get_logger("aivedio.api")

# Request bodies are read this many bytes at a time while streaming into the store.
CHUNK_BYTES = 1 * MIB


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
    await feed_aside((hasher,), (chunk,))


def status_path(video: uuid.UUID) -> str:
    return f"/v1/videos/{video}/status"


async def refuse_under_pressure(ctx: ApiContext) -> None:
    """503 + Retry-After while the backlog pressure is on (and refusing is configured): no
    new upload session, whichever route opens it."""
    reading = await ctx.backlog.current()
    if not ctx.backlog.refuse_uploads:
        return
    ctx.metrics.uploads_refused.inc()
    seconds = ctx.config.backlog.retry_after_seconds
    log.warning("upload_refused", reason=reading.describe(), retry_after_seconds=seconds)
    raise ApiError(
        503,
        f"new uploads are paused while the processing backlog drains ({reading.describe()}); "
        f"retry after {seconds} s",
        code="overloaded",
        headers={"Retry-After": str(seconds)},
    )


async def fail_upload(
    ctx: ApiContext, session: UploadSession, error_class: str, detail: str
) -> NoReturn:
    """The session FAILED with the reason, its objects removed; answers 422."""
    await end_upload(ctx, session, error_class, detail)
    raise ApiError(422, f"upload failed: {detail}; create a new video", code=error_class)


async def end_upload(
    ctx: ApiContext, session: UploadSession, error_class: str, detail: str
) -> bool:
    """AWAITING_UPLOAD → FAILED with the reason, its objects removed; False when the
    session had moved already (nothing done)."""
    if not await uploads.fail_session(ctx.pool, session.id, error_class, detail):
        return False
    await uploads.remove_session_objects(ctx.store, session)
    await uploads.mark_cleaned(ctx.pool, session.id)
    log.info("upload_failed", video_id=str(session.id), error_class=error_class)
    return True


async def arriving(request: web.Request, idle_seconds: float) -> AsyncIterator[bytes]:
    """The body's chunks as they arrive, 408 when none comes for ``idle_seconds``: a large
    upload may take hours, but a client that stops sending must not hold a handler (and an
    open upload) for ever. Chunks of up to ``CHUNK_BYTES``, joined from what aiohttp
    buffered. (A tus ``PATCH`` reads through ``idle_watch.IdleWatch`` instead: one deadline
    for the body rather than one per read.)"""
    content = request.content
    while True:
        try:
            with anyio.fail_after(idle_seconds):
                chunk = await content.read(CHUNK_BYTES)
        except TimeoutError:
            raise body_timeout(idle_seconds) from None
        if not chunk:
            return
        yield chunk


async def hash_object(store: ObjectStore, key: str) -> str:
    """The stored object's SHA-256 (hex), read back through the hash."""
    hasher = hashlib.sha256()
    stream = store.get(key)
    try:
        async for chunk in stream:
            await hash_chunk(hasher, chunk)
    finally:
        aclose = getattr(stream, "aclose", None)
        if aclose is not None:
            await aclose()
    return hasher.hexdigest()
