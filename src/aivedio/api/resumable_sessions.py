"""Opening a resumable (tus) upload session, and finding the one a request is about.

Both ways in open it here: ``POST /v1/uploads`` (tus creation, with the API key) and
``POST /v1/videos`` with ``"resumable": true`` (which also hands out a one-time upload
token). The session's object is started in the store at once (an S3 multipart upload, or a
local append file), so every PATCH, in whichever API process, appends to the same object.
"""

from __future__ import annotations

import math
import uuid
from datetime import UTC, datetime, timedelta

import anyio
from aiohttp import web

from aivedio.api.auth import granted_upload, tenant_of
from aivedio.api.context import ApiContext, context
from aivedio.api.problems import ApiError
from aivedio.api.video_sessions import refuse_under_pressure
from aivedio.store import resumable_uploads, uploads
from aivedio.store.objects.append import AppendingStore
from aivedio.store.objects.base import ABORT_TIMEOUT_SECONDS, MIB
from aivedio.store.objects.s3_upload import MAX_PARTS
from aivedio.store.uploads import UploadSession


def upload_path(video_id: uuid.UUID) -> str:
    return f"/v1/uploads/{video_id}"


def scratch_prefix(session: UploadSession) -> str:
    """Where an S3 upload keeps its tail objects: under the session's prefix, so the reaper
    of expired sessions removes them with the rest."""
    return f"{uploads.session_prefix(session.tenant_id, session.id)}tus/"


def part_size_for(ctx: ApiContext, size_bytes: int) -> int:
    """The configured part size, grown (in whole MiB) so that S3's 10,000 parts hold it."""
    configured = ctx.config.api.resumable_part_size_bytes
    return max(configured, math.ceil(size_bytes / MAX_PARTS / MIB) * MIB)


def appending_store(ctx: ApiContext) -> AppendingStore:
    store = ctx.store
    if not isinstance(store, AppendingStore):
        raise ApiError(501, "this object store cannot take resumable uploads")
    return store


async def open_resumable(
    ctx: ApiContext,
    *,
    tenant_id: int,
    size_bytes: int,
    content_type: str,
    filename: str | None,
    sha256: str | None,
    passthrough: str | None,
    metadata: str | None = None,
    with_token: bool = False,
) -> tuple[UploadSession, str | None]:
    """A new TUS session and its object; with ``with_token``, its one-time upload token."""
    await refuse_under_pressure(ctx)
    limit = ctx.config.api.upload_max_bytes
    if size_bytes > limit:
        raise ApiError(
            413,
            f"the upload's length {size_bytes} is over this API's limit of {limit} bytes",
            "too_large",
            headers={"Tus-Max-Size": str(limit)},
        )
    store = appending_store(ctx)
    video_id = uuid.uuid4()
    key = uploads.source_key(tenant_id, video_id)
    append_id = await store.begin_append(key, content_type=content_type)
    token, token_sha256 = resumable_uploads.new_upload_token() if with_token else (None, None)
    expires_at = datetime.now(UTC) + timedelta(seconds=ctx.config.api.resumable_idle_seconds)
    try:
        session = await uploads.create_session(
            ctx.pool,
            video_id=video_id,
            tenant_id=tenant_id,
            method=uploads.TUS,
            content_type=content_type,
            filename=filename,
            size_bytes=size_bytes,
            sha256=sha256,
            expires_at=expires_at,
            object_key=key,
            multipart_upload_id=append_id,
            part_size_bytes=part_size_for(ctx, size_bytes),
            passthrough=passthrough,
            upload_metadata=metadata,
            upload_token_sha256=token_sha256,
        )
    except BaseException:
        with anyio.CancelScope(shield=True), anyio.move_on_after(ABORT_TIMEOUT_SECONDS):
            await ctx.store.abort_multipart_upload(key, append_id)
        raise
    return session, token


async def resumable_of(request: web.Request) -> UploadSession:
    """The resumable upload of the path, the caller's (its tenant's, or the one its upload
    token opens); 404 for anything else, a video that is not a resumable upload included."""
    try:
        video_id = uuid.UUID(request.match_info["video_id"])
    except ValueError:
        raise ApiError(404, "no such upload") from None
    granted = granted_upload(request)
    if granted is not None and granted != video_id:
        raise ApiError(404, "no such upload")
    session = await uploads.load_session(context(request).pool, tenant_of(request), video_id)
    if session is None or session.method != uploads.TUS:
        raise ApiError(404, "no such upload")
    return session
