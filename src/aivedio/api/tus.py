"""Resumable uploads: tus 1.0 on ``/v1/uploads`` (tus-js-client, Uppy, tuspy work as they
are), with the creation, creation-with-upload, termination, expiration and checksum
(``sha256``) extensions, on either store.

* ``OPTIONS /v1/uploads``: what this server supports (no credential needed).
* ``POST /v1/uploads`` (creation): ``Upload-Length`` and ``Upload-Metadata`` (``filename``,
  ``filetype``, ``passthrough``, and ``sha256``, a hex digest to verify the file against)
  open a video whose upload is resumable; ``Location`` is ``/v1/uploads/{video_id}`` (the
  video's id). A body (creation-with-upload) is its first bytes. With an upload token, the
  token's own upload is answered instead (it exists since ``POST /v1/videos``).
* ``HEAD /v1/uploads/{id}``: ``Upload-Offset``, the bytes stored for good; resume there.
* ``PATCH /v1/uploads/{id}``: bytes at ``Upload-Offset`` (``api/tus_writes.py``); the last
  one completes the upload (the video's asset and its processing start).
* ``DELETE /v1/uploads/{id}`` (termination): the upload ends and what it stored is removed.

The tus headers are parsed in ``tus_protocol.py``; the sessions are upload sessions
(``store/uploads.py``), so a resumable video has a status, a timeline, an expiry reaped by
the sweeper and a tenant like every other. Every answer carries ``Tus-Resumable`` and the
CORS headers a browser's script needs to read it (credentials are bearer tokens, never
cookies, so any origin may call).
"""

from __future__ import annotations

import functools
import uuid

import anyio
from aiohttp import web

from aivedio.api import schema
from aivedio.api.auth import granted_upload, tenant_of
from aivedio.api.context import context
from aivedio.api.idempotency import idempotent
from aivedio.api.problems import ApiError, Handler
from aivedio.api.resumable_sessions import open_resumable, resumable_of, upload_path
from aivedio.api.tus_paths import PATHS as PATHS
from aivedio.api.tus_paths import UploadCreated
from aivedio.api.tus_protocol import (
    CHECKSUM_ALGORITHMS,
    EXPOSED_HEADERS,
    EXTENSIONS,
    REQUEST_HEADERS,
    VERSION,
    http_date,
    metadata_text,
    parse_checksum,
    parse_count,
    parse_metadata,
    require_version,
)
from aivedio.api.tus_writes import ended_error, receive
from aivedio.api.video_sessions import end_upload
from aivedio.logs import get_logger
from aivedio.store import resumable_uploads, uploads
from aivedio.store.objects.base import ABORT_TIMEOUT_SECONDS
from aivedio.store.uploads import UploadSession

log = get_logger("aivedio.api")

routes = web.RouteTableDef()

CONTENT_TYPES = ("video/mp4", "video/quicktime", "video/webm", "video/x-matroska")
_CORS = {"Access-Control-Allow-Origin": "*", "Access-Control-Expose-Headers": EXPOSED_HEADERS}
_COMMON = {"Tus-Resumable": VERSION, "Cache-Control": "no-store", **_CORS}


SCHEMAS: tuple[type, ...] = (UploadCreated,)


def tus_route(handler: Handler) -> Handler:
    """Every answer of a tus route, errors included, carries the tus and CORS headers."""

    @functools.wraps(handler)
    async def wrapped(request: web.Request) -> web.StreamResponse:
        try:
            response = await handler(request)
        except ApiError as exc:
            exc.headers = {**_COMMON, **(exc.headers or {})}
            raise
        response.headers.update({k: v for k, v in _COMMON.items() if k not in response.headers})
        return response

    return wrapped


@routes.options("/v1/uploads")
@routes.options("/v1/uploads/{video_id}")
async def discover(request: web.Request) -> web.Response:
    """tus discovery and the CORS preflight: no credential, no state."""
    limit = context(request).config.api.upload_max_bytes
    return web.Response(
        status=204,
        headers={
            **_CORS,
            "Tus-Resumable": VERSION,
            "Tus-Version": VERSION,
            "Tus-Extension": EXTENSIONS,
            "Tus-Max-Size": str(limit),
            "Tus-Checksum-Algorithm": CHECKSUM_ALGORITHMS,
            "Access-Control-Allow-Methods": "POST, HEAD, PATCH, DELETE, OPTIONS",
            "Access-Control-Allow-Headers": REQUEST_HEADERS,
            "Access-Control-Max-Age": "86400",
        },
    )


@routes.post("/v1/uploads")
@tus_route
async def create_upload(request: web.Request) -> web.StreamResponse:
    require_version(request.headers.get("Tus-Resumable"))
    for unsupported in ("Upload-Defer-Length", "Upload-Concat"):
        if unsupported in request.headers:
            raise ApiError(
                400,
                f"{unsupported} is not supported here: declare Upload-Length",
                code="tus_extension",
                field=unsupported,
            )
    length = parse_count("Upload-Length", request.headers.get("Upload-Length"))
    if length == 0:
        raise ApiError(400, "Upload-Length 0: an empty file is no video", field="Upload-Length")
    raw = request.headers.get("Upload-Metadata")
    metadata = parse_metadata(raw)
    granted = granted_upload(request)
    if granted is not None:
        return await _open_granted(request, length)
    # The request is its headers (its body, if any, is the first bytes of the upload).
    fingerprint = f"{length}\n{raw or ''}".encode()
    return await idempotent(
        request, fingerprint, lambda: _create(request, length, metadata, raw or None)
    )


async def _create(
    request: web.Request, length: int, metadata: dict[str, bytes], raw: str | None
) -> web.Response:
    ctx = context(request)
    content_type = metadata_text(metadata, "filetype", 100) or "video/mp4"
    if content_type not in CONTENT_TYPES:
        raise ApiError(
            400,
            f"Upload-Metadata filetype must be one of {', '.join(CONTENT_TYPES)}",
            code="tus_metadata",
            field="Upload-Metadata",
        )
    sha256 = metadata_text(metadata, "sha256", 64)
    if sha256 is not None and (
        len(sha256) != 64 or not all(c in "0123456789abcdef" for c in sha256.lower())
    ):
        raise ApiError(400, "Upload-Metadata sha256 must be 64 hex digits", "tus_metadata")
    session, _ = await open_resumable(
        ctx,
        tenant_id=tenant_of(request),
        size_bytes=length,
        content_type=content_type,
        filename=metadata_text(metadata, "filename", 255),
        sha256=sha256.lower() if sha256 else None,
        passthrough=metadata_text(metadata, "passthrough", 255),
        metadata=raw,
    )
    log.info(
        "upload_session_created",
        video_id=str(session.id),
        tenant_id=session.tenant_id,
        size_bytes=length,
        method=uploads.TUS,
    )
    return await _answer_created(request, session)


async def _open_granted(request: web.Request, length: int) -> web.StreamResponse:
    """Creation with an upload token: its upload exists already; answer it."""
    granted = granted_upload(request)
    assert granted is not None
    session = await resumable_of_id(request, granted)
    if length != session.declared_size_bytes:
        raise ApiError(
            400,
            f"Upload-Length {length} is not the size this upload was opened for "
            f"({session.declared_size_bytes})",
            field="Upload-Length",
        )
    return await _answer_created(request, session)


async def resumable_of_id(request: web.Request, video_id: uuid.UUID) -> UploadSession:
    session = await uploads.load_session(context(request).pool, tenant_of(request), video_id)
    if session is None or session.method != uploads.TUS:
        raise ApiError(404, "no such upload")
    return session


async def _answer_created(request: web.Request, session: UploadSession) -> web.Response:
    """201 with Location; a body's bytes (creation-with-upload) are appended first."""
    ctx = context(request)
    offset = session.upload_offset or 0
    has_body = request.body_exists and request.content_length != 0  # None: chunked
    if has_body:
        checksum = parse_checksum(request.headers.get("Upload-Checksum"))
        received = await receive(request, session, offset, checksum)
        offset, session = received.offset, received.session
    url = f"{ctx.base_url()}{upload_path(session.id)}"
    headers = {"Location": url, "Upload-Offset": str(offset), **_expiry(session)}
    created = UploadCreated(
        video_id=str(session.id),
        upload_url=url,
        upload_offset=offset,
        expires_at=session.expires_at.isoformat(),
    )
    return schema.encode(created, 201, headers=headers)


def _expiry(session: UploadSession) -> dict[str, str]:
    if session.status != uploads.AWAITING:
        return {}
    return {"Upload-Expires": http_date(session.expires_at)}


@routes.head("/v1/uploads/{video_id}")
@tus_route
async def upload_offset(request: web.Request) -> web.Response:
    require_version(request.headers.get("Tus-Resumable"))
    session = await resumable_of(request)
    if session.status != uploads.COMPLETED and (
        session.status != uploads.AWAITING or session.expired()
    ):
        raise ended_error(session)
    length = session.declared_size_bytes
    offset = length if session.status == uploads.COMPLETED else session.upload_offset or 0
    headers = {"Upload-Offset": str(offset), "Upload-Length": str(length), **_expiry(session)}
    if session.upload_metadata:
        headers["Upload-Metadata"] = session.upload_metadata
    return web.Response(status=200, headers=headers)


@routes.patch("/v1/uploads/{video_id}")
@tus_route
async def upload_bytes(request: web.Request) -> web.Response:
    require_version(request.headers.get("Tus-Resumable"))
    offset = parse_count("Upload-Offset", request.headers.get("Upload-Offset"))
    checksum = parse_checksum(request.headers.get("Upload-Checksum"))
    session = await resumable_of(request)
    if session.status != uploads.COMPLETED and (
        session.status != uploads.AWAITING or session.expired()
    ):
        raise ended_error(session)
    received = await receive(request, session, offset, checksum)
    headers = {"Upload-Offset": str(received.offset), **_expiry(received.session)}
    if received.completed:
        headers["Location"] = f"/v1/videos/{session.id}/status"
    return web.Response(status=204, headers=headers)


@routes.delete("/v1/uploads/{video_id}")
@tus_route
async def terminate_upload(request: web.Request) -> web.Response:
    """Termination: the upload ends (FAILED, ``upload_terminated``), its bytes removed."""
    require_version(request.headers.get("Tus-Resumable"))
    ctx = context(request)
    session = await resumable_of(request)
    if session.status == uploads.COMPLETED:
        raise ApiError(
            409, "the upload is completed: its video exists now", code="upload_completed"
        )
    if session.status != uploads.AWAITING or session.expired():
        raise ended_error(session)
    writer = uuid.uuid4()
    lease = ctx.config.api.resumable_lease_seconds
    claimed = await resumable_uploads.claim_writer(ctx.pool, session.id, writer, lease)
    if claimed is None:
        raise ApiError(
            423,
            "a PATCH is writing to this upload; retry",
            code="upload_locked",
            headers={"Retry-After": "1"},
        )
    try:
        await end_upload(ctx, claimed, "upload_terminated", "terminated by the client")
    finally:
        with anyio.CancelScope(shield=True), anyio.move_on_after(ABORT_TIMEOUT_SECONDS):
            await resumable_uploads.release_writer(ctx.pool, session.id, writer)
    ctx.upload_hashes.forget(session.id)
    log.info("upload_terminated", video_id=str(session.id), tenant_id=session.tenant_id)
    return web.Response(status=204)
