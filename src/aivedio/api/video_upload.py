"""``PUT /v1/videos/{id}/upload``: the local store's upload path, through the API.

The API streams the body into the store while counting and hashing it (never whole in
memory) and keeps it only when its size and SHA-256 are the declared ones (a session that
declared no SHA-256 keeps the one measured); a refused attempt
leaves the session open for another. (With S3 the client sends the bytes to presigned URLs
and this route refuses them: ``videos.py``.) The route is described with the other video
routes in ``video_paths.py``.
"""

from __future__ import annotations

import hashlib
import uuid
from typing import NoReturn

import aiohttp
from aiohttp import http_exceptions, web

from aivedio.api import schema
from aivedio.api.context import ApiContext, context
from aivedio.api.problems import ApiError
from aivedio.api.video_bodies import UploadReceived
from aivedio.api.video_sessions import arriving, hash_chunk, refuse_ended, session_of
from aivedio.errors import StaleStateError
from aivedio.logs import get_logger
from aivedio.store import uploads
from aivedio.store.uploads import UploadSession

log = get_logger("aivedio.api")

routes = web.RouteTableDef()


@routes.put("/v1/videos/{video_id}/upload")
async def upload_video(request: web.Request) -> web.Response:
    """Stream the body into the store, counting and hashing; keep it only when its size and
    SHA-256 are the declared ones. A refused attempt leaves the session open for another."""
    ctx = context(request)
    session = await session_of(request)
    if session.method != uploads.API_PUT:
        raise ApiError(
            409,
            "this video uploads to its presigned URL(s), not to the API: "
            "use the `upload` instructions of POST /v1/videos",
        )
    if session.status == uploads.COMPLETED:
        raise ApiError(409, "the upload is already completed", code="upload_completed")
    refuse_ended(session)
    declared = session.declared_size_bytes
    length = request.content_length
    if length is not None and length != declared:
        await _refused(
            ctx,
            session,
            "size_mismatch",
            f"Content-Length {length} differs from the declared size {declared}",
        )
    key = uploads.source_key(session.tenant_id, session.id, f"put-{uuid.uuid4().hex[:16]}")
    hasher = hashlib.sha256()
    received = 0
    idle_seconds = ctx.config.api.body_read_timeout_seconds
    try:
        async with await ctx.store.start_upload(key, content_type=session.content_type) as up:
            async for chunk in arriving(request, idle_seconds):
                received += len(chunk)
                if received > declared:
                    await _refused(
                        ctx, session, "size_mismatch", f"more bytes than the declared {declared}"
                    )
                await hash_chunk(hasher, chunk)
                await up.write(chunk)
            if received != declared:
                await _refused(
                    ctx, session, "size_mismatch", f"received {received} bytes, declared {declared}"
                )
            digest = hasher.hexdigest()
            if session.declared_sha256 is not None and digest != session.declared_sha256:
                await _refused(
                    ctx,
                    session,
                    "checksum_mismatch",
                    f"the body's SHA-256 is {digest}, declared {session.declared_sha256}",
                )
            await up.complete()
    except (
        ConnectionError,
        aiohttp.ClientPayloadError,
        http_exceptions.HttpProcessingError,
    ) as exc:
        raise ApiError(400, f"the request body ended early: {type(exc).__name__}") from None
    try:
        replaced = await uploads.record_received(
            ctx.pool, session.id, key=key, size=received, sha256=digest
        )
    except StaleStateError:
        await ctx.store.delete(key)  # the session ended while the bytes streamed in
        refuse_ended(await session_of(request))
        raise ApiError(409, "the upload is already completed", code="upload_completed") from None
    except BaseException:
        await ctx.store.delete(key)
        raise
    if replaced is not None:
        await ctx.store.delete(replaced)
    log.info("upload_received", video_id=str(session.id), bytes=received)
    return schema.encode(
        UploadReceived(
            video_id=session.id, state="AWAITING_UPLOAD", size_bytes=received, sha256=digest
        )
    )


async def _refused(
    ctx: ApiContext, session: UploadSession, error_class: str, detail: str
) -> NoReturn:
    await uploads.note_refused(ctx.pool, session.id, error_class, detail)
    raise ApiError(422, f"upload refused: {detail}; nothing was kept", code=error_class)
