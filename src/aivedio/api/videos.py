"""Uploads: ``POST /v1/videos`` opens an upload session, the bytes go where its
``upload`` instructions say, ``POST /v1/videos/{id}/complete`` confirms them and hands the
source to the pipeline, ``GET /v1/videos/{id}/status`` shows where it is.

* **The video id is the asset id.** Completing a session inserts the QUARANTINED asset under
  that id and enqueues its probe in the transaction that marks the session COMPLETED
  (``store/uploads.complete_session``), like the fetch stage does for provider outputs; a
  second complete finds the session COMPLETED and answers the same, so there is one asset
  and one probe job however often a client retries.
* **A resumable upload** (``"resumable": true``, or ``POST /v1/uploads`` straight away)
  takes its bytes with tus 1.0 on either store (``api/tus.py``); the answer carries a
  one-time upload token, so a browser sends them without ever holding the API key, and the
  last PATCH completes the upload by itself (the same intake as complete).
* **The SHA-256 is optional.** Declared, a mismatch fails the upload; not declared, the
  digest measured while the bytes arrived (or read back from S3) is the source's.
* **Where the bytes go depends on the store.** S3 (a ``PresigningStore``): the client sends
  them straight to S3 with presigned URLs that bind the object's key, its exact length (per
  part for multipart) and, for a single PUT, its SHA-256; the API never carries them. The
  local store: the client PUTs them to ``/v1/videos/{id}/upload`` with its API key, and the
  API streams them into the store while counting and hashing, never whole in memory
  (``video_upload.py``; the session helpers both use are ``video_sessions.py``).
* **Nothing unverified reaches the pipeline.** Complete checks the object's size and SHA-256
  against what the client declared: for uploads through the API, the digest measured while
  streaming (the bytes never left our hands); for S3, by streaming the object back through
  SHA-256, because nothing else proves the whole object's digest: a multipart object only
  has per-part (composite) checksums, S3-compatible stores differ in whether they verify or
  even keep ``x-amz-checksum-sha256``, and a client may bypass the checksum header. A
  mismatch fails the session (422, reason recorded) and deletes the object.
* **Every tenant sees only its own videos**: another tenant's id answers 404 exactly like a
  missing one. Ids that are not UUIDs are missing videos too (404).
* **Backlog pressure refuses new sessions** (when the transcode backlog grows, new
  uploads are limited first): ``POST /v1/videos`` answers 503 ``overloaded`` with
  ``Retry-After`` while ``pipeline/upkeep/backlog.py`` says so (a reading cached per check interval,
  so a burst of refused clients costs the database one query). Sessions already open still
  upload and complete; provider callbacks are never refused.
* **Expired sessions** (``api.upload_session_ttl_seconds``; presigned URLs expire with the
  session) accept nothing more: 410. ``store/uploads.reap_expired_uploads`` marks them and
  removes what they left in quarantine.
"""

from __future__ import annotations

import math
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import msgspec
from aiohttp import web

from aivedio import untrusted
from aivedio.api import schema, tus_protocol
from aivedio.api.auth import tenant_of
from aivedio.api.bodies import read_body
from aivedio.api.context import ApiContext, context
from aivedio.api.idempotency import idempotent
from aivedio.api.problems import ApiError
from aivedio.api.resumable_sessions import open_resumable, upload_path
from aivedio.api.video_bodies import (
    CompleteVideo,
    CreateVideo,
    TimelineEntry,
    UploadInstructions,
    UploadPart,
    UploadReceived,
    UploadSummary,
    VideoAccepted,
    VideoCreated,
    VideoStatus,
    upload_state,
)
from aivedio.api.video_paths import PATHS as PATHS  # these routes and video_upload's
from aivedio.api.video_sessions import (
    fail_upload,
    hash_object,
    path_video_id,
    refuse_ended,
    refuse_under_pressure,
    session_of,
    status_path,
)
from aivedio.errors import MalformedInputError, NotFoundError
from aivedio.logs import get_logger, redact_text
from aivedio.pipeline.jobs import probe_spec
from aivedio.pipeline.media.credentials import content_credentials
from aivedio.store import asset_reads, uploads
from aivedio.store.asset_status import asset_status
from aivedio.store.objects.base import (
    ABORT_TIMEOUT_SECONDS,
    MAX_PRESIGN_SECONDS,
    MIB,
    ObjectInfo,
    ObjectStoreError,
    PresigningStore,
    UploadedPart,
)
from aivedio.store.objects.s3_upload import MAX_PARTS
from aivedio.store.uploads import UploadSession

log = get_logger("aivedio.api")

routes = web.RouteTableDef()

# The largest JSON body read: the biggest a schema-valid complete (10,000 parts) can be.
JSON_BODY_MAX_BYTES = 4 * MIB
SCHEMAS: tuple[type, ...] = (
    CreateVideo,
    CompleteVideo,
    VideoCreated,
    UploadReceived,
    VideoAccepted,
    VideoStatus,
)

# -- helpers -----------------------------------------------------------------------------------


async def _read_json_body(request: web.Request) -> bytes:
    """The whole body (``api/bodies.py``), refused (413) past ``JSON_BODY_MAX_BYTES``: every
    body the schema allows fits, so a bigger one is malformed anyway; anything smaller is
    validated and answered 400/422 with what is wrong, not cut off by the app's generic
    read limit."""
    return await read_body(
        request,
        limit_bytes=JSON_BODY_MAX_BYTES,
        timeout_seconds=context(request).config.api.body_read_timeout_seconds,
    )


async def _decode(
    request: web.Request, kind: type[Any], *, required: bool, raw: bytes | None = None
) -> Any:
    """The body as ``kind``, decoded at the edge's bounds (``untrusted.decode``): a body
    out of bounds (depth, NUL, lengths, 64-bit integers) or not JSON is 400, one that breaks
    the schema 422, each naming the field. ``raw``: the body, already read."""
    body = await _read_json_body(request) if raw is None else raw
    if not body.strip():
        if required:
            raise ApiError(400, "a JSON object is required as the request body")
        return None
    declared = request.headers.get("Content-Type")
    if declared is not None and not _is_json(request.content_type):
        raise ApiError(415, f"the body must be application/json, not {request.content_type}")
    try:
        return untrusted.decode(body, kind)
    except MalformedInputError as exc:
        if exc.reason == "invalid_field":
            raise ApiError(422, f"request body: {exc.detail}", field=exc.field) from None
        raise ApiError(400, f"request body: {exc.detail}", exc.reason, field=exc.field) from None


def _is_json(media_type: str) -> bool:
    return media_type == "application/json" or media_type.endswith("+json")


# -- POST /v1/videos ---------------------------------------------------------------------------


@routes.post("/v1/videos")
async def create_video(request: web.Request) -> web.StreamResponse:
    raw = await _read_json_body(request)
    return await idempotent(request, raw, lambda: _create_video(request, raw))


async def _create_video(request: web.Request, raw: bytes) -> web.Response:
    ctx = context(request)
    body: CreateVideo = await _decode(request, CreateVideo, required=True, raw=raw)
    await refuse_under_pressure(ctx)
    limit = ctx.config.api.upload_max_bytes
    if body.size_bytes > limit:
        # A field over its schema's maximum (openapi.py states the limit there), like any
        # other: 422 naming it. 413 would say this small body is too large.
        raise ApiError(
            422,
            f"size_bytes {body.size_bytes} is over this API's limit of {limit} bytes",
            "too_large",
            field="$.size_bytes",
        )
    tenant_id = tenant_of(request)
    video_id = uuid.uuid4()
    sha256 = body.sha256.lower() if body.sha256 is not None else None
    ttl = ctx.config.api.upload_session_ttl_seconds
    store = ctx.store
    if body.resumable:
        session, token = await open_resumable(
            ctx,
            tenant_id=tenant_id,
            size_bytes=body.size_bytes,
            content_type=body.content_type,
            filename=body.filename,
            sha256=sha256,
            passthrough=body.passthrough,
            with_token=True,
        )
        assert token is not None
        return _created(
            session.id,
            session.expires_at,
            resumable_instructions(ctx, session, token),
            tenant_id=tenant_id,
            size_bytes=body.size_bytes,
        )
    if isinstance(store, PresigningStore):
        ttl = min(ttl, MAX_PRESIGN_SECONDS)  # the session ends when its URLs do
    expires_at = datetime.now(UTC) + timedelta(seconds=ttl)
    common: dict[str, Any] = {
        "video_id": video_id,
        "tenant_id": tenant_id,
        "content_type": body.content_type,
        "filename": body.filename,
        "size_bytes": body.size_bytes,
        "sha256": sha256,
        "expires_at": expires_at,
        "passthrough": body.passthrough,
    }
    if isinstance(store, PresigningStore):
        instructions = await _presigned(ctx, store, common, math.ceil(ttl))
    else:
        await uploads.create_session(ctx.pool, method=uploads.API_PUT, **common)
        instructions = UploadInstructions(
            method="PUT",
            credentials="api_key",
            expires_at=expires_at,
            url=f"{ctx.base_url()}/v1/videos/{video_id}/upload",
            headers={"Content-Type": "application/octet-stream"},
        )
    return _created(
        video_id, expires_at, instructions, tenant_id=tenant_id, size_bytes=body.size_bytes
    )


def _created(
    video_id: uuid.UUID,
    expires_at: datetime,
    instructions: UploadInstructions,
    *,
    tenant_id: int,
    size_bytes: int,
) -> web.Response:
    log.info(
        "upload_session_created",
        video_id=str(video_id),
        tenant_id=tenant_id,
        size_bytes=size_bytes,
        method=instructions.method,
    )
    created = VideoCreated(
        video_id=video_id, state="AWAITING_UPLOAD", expires_at=expires_at, upload=instructions
    )
    return schema.encode(created, 201, headers={"Location": status_path(video_id)})


def resumable_instructions(
    ctx: ApiContext, session: UploadSession, token: str
) -> UploadInstructions:
    """Where a browser sends the bytes with tus: the upload's URL and its one-time token."""
    return UploadInstructions(
        method="TUS",
        credentials="upload_token",
        expires_at=session.expires_at,
        url=f"{ctx.base_url()}{upload_path(session.id)}",
        headers={"Authorization": f"Bearer {token}", "Tus-Resumable": tus_protocol.VERSION},
    )


async def _presigned(
    ctx: ApiContext, store: PresigningStore, common: dict[str, Any], seconds: int
) -> UploadInstructions:
    """A presigned PUT when the file fits one part, else a multipart upload with a presigned
    URL per part; the session is recorded with the key (and upload id) the URLs are for."""
    video_id: uuid.UUID = common["video_id"]
    size: int = common["size_bytes"]
    key = uploads.source_key(common["tenant_id"], video_id)
    part_size = ctx.config.api.upload_part_size_bytes
    if size <= part_size:
        put = await store.presign_put(
            key,
            expires_seconds=seconds,
            content_length=size,
            content_type=common["content_type"],
            sha256_hex=common["sha256"],  # None: complete computes it, reading the object
        )
        await uploads.create_session(ctx.pool, method=uploads.S3_PUT, object_key=key, **common)
        return UploadInstructions(
            method="PUT",
            credentials="none",
            url=put.url,
            headers=put.headers,
            expires_at=common["expires_at"],
        )
    # S3 allows 10,000 parts: past that the parts grow (in whole MiB).
    part_size = max(part_size, math.ceil(size / MAX_PARTS / MIB) * MIB)
    count = math.ceil(size / part_size)
    upload_id = await store.create_multipart(key, content_type=common["content_type"])
    try:
        parts = []
        for number in range(1, count + 1):
            length = min(part_size, size - (number - 1) * part_size)
            url = await store.presign_part(
                key, upload_id, number, expires_seconds=seconds, content_length=length
            )
            parts.append(UploadPart(number, url, length))
        await uploads.create_session(
            ctx.pool,
            method=uploads.S3_MULTIPART,
            object_key=key,
            multipart_upload_id=upload_id,
            part_size_bytes=part_size,
            **common,
        )
    except BaseException:
        with anyio.CancelScope(shield=True), anyio.move_on_after(ABORT_TIMEOUT_SECONDS):
            await ctx.store.abort_multipart_upload(key, upload_id)
        raise
    return UploadInstructions(
        method="MULTIPART",
        credentials="none",
        upload_id=upload_id,
        part_size=part_size,
        parts=parts,
        expires_at=common["expires_at"],
    )


# -- POST /v1/videos/{id}/complete -------------------------------------------------------------


@routes.post("/v1/videos/{video_id}/complete")
async def complete_video(request: web.Request) -> web.Response:
    """Verify the uploaded object (size, SHA-256) and hand it to the pipeline: the asset and
    its probe job in one transaction. Idempotent: a completed video answers the same."""
    ctx = context(request)
    body: CompleteVideo | None = await _decode(request, CompleteVideo, required=False)
    session = await session_of(request)
    if session.status == uploads.COMPLETED:
        return await _accepted(ctx, session)
    refuse_ended(session)
    if session.method == uploads.TUS:
        raise ApiError(
            409,
            f"a resumable upload completes with its last PATCH to {upload_path(session.id)}: "
            f"{session.upload_offset or 0} of {session.declared_size_bytes} bytes are stored",
            code="incomplete_upload",
        )
    key, info = await _uploaded_object(ctx, session, body)
    sha256 = await _verify(ctx, session, key, info)
    probe = probe_spec(session.id, session.tenant_id)
    done = await uploads.complete_session(
        ctx.pool, ctx.queue, session, key=key, size=info.size, sha256=sha256, probe=probe
    )
    now = await session_of(request)
    if not done:
        if now.status == uploads.COMPLETED:
            return await _accepted(ctx, now)
        refuse_ended(now)
        raise ApiError(409, "another upload arrived while completing: complete again")
    log.info(
        "upload_completed", video_id=str(session.id), tenant_id=session.tenant_id, bytes=info.size
    )
    return await _accepted(ctx, now)


async def _uploaded_object(
    ctx: ApiContext, session: UploadSession, body: CompleteVideo | None
) -> tuple[str, ObjectInfo]:
    """The session's object, assembling a multipart upload first when that is still due."""
    nothing = "nothing uploaded yet: send the bytes as the `upload` instructions say, then complete"
    key = session.object_key
    if key is None:
        raise ApiError(409, nothing, code="not_uploaded")
    info = await ctx.store.head(key)
    if info is not None:
        return key, info
    if session.method != uploads.S3_MULTIPART:
        raise ApiError(409, nothing, code="not_uploaded")
    store = ctx.store
    upload_id = session.multipart_upload_id
    if not isinstance(store, PresigningStore) or upload_id is None:
        raise ApiError(409, "this video's store cannot complete a multipart upload")
    try:
        if body is not None and body.parts:
            parts = [UploadedPart(p.part_number, p.etag) for p in body.parts]
        else:
            parts = await store.list_parts(key, upload_id)
            if not parts:
                raise ApiError(409, nothing, code="not_uploaded")
            got = sum(p.size or 0 for p in parts)
            if got != session.declared_size_bytes:
                raise ApiError(
                    409,
                    f"the parts received so far hold {got} bytes of the declared "
                    f"{session.declared_size_bytes}: upload the missing parts, then "
                    "complete",
                    code="incomplete_upload",
                )
        info = await store.complete_multipart(key, upload_id, parts)
    except NotFoundError:
        # No such upload any more: a concurrent complete assembled it, or it is gone.
        info = await store.head(key)
        if info is None:
            raise ApiError(
                409, "the multipart upload no longer exists", code="not_uploaded"
            ) from None
    except ObjectStoreError as exc:
        raise ApiError(
            422, f"the store refused the parts: {redact_text(exc.detail)}", code="invalid_parts"
        ) from None
    return key, info


async def _verify(ctx: ApiContext, session: UploadSession, key: str, info: ObjectInfo) -> str:
    """The object's SHA-256 when it is the declared one (or when none was declared); else
    the session fails (422).

    Through the API the digest was measured while the bytes streamed in and the key was
    written once, by that PUT. For presigned uploads the object is read back through SHA-256:
    see the module docstring for why no store-side checksum can stand in for that.
    """
    declared = session.declared_size_bytes
    if info.size != declared:
        await fail_upload(
            ctx,
            session,
            "size_mismatch",
            f"the uploaded object has {info.size} bytes, declared {declared}",
        )
    if session.method == uploads.API_PUT:
        digest = session.received_sha256 or ""
        if session.received_size_bytes != declared:
            await fail_upload(
                ctx,
                session,
                "size_mismatch",
                f"received {session.received_size_bytes} bytes, declared {declared}",
            )
    else:
        digest = await hash_object(ctx.store, key)
    if session.declared_sha256 is not None and digest != session.declared_sha256:
        await fail_upload(
            ctx,
            session,
            "checksum_mismatch",
            f"the uploaded object's SHA-256 is {digest}, declared {session.declared_sha256}",
        )
    return digest


async def _accepted(ctx: ApiContext, session: UploadSession) -> web.Response:
    state = await asset_reads.asset_state(ctx.pool, session.id)
    accepted = VideoAccepted(
        video_id=session.id,
        state=str(state or "QUARANTINED"),
        size_bytes=session.received_size_bytes or session.declared_size_bytes,
        sha256=session.received_sha256 or session.declared_sha256 or "",
        status_url=status_path(session.id),
    )
    return schema.encode(accepted, 202, headers={"Location": status_path(session.id)})


# -- GET /v1/videos/{id}/status ----------------------------------------------------------------


@routes.get("/v1/videos/{video_id}/status")
async def video_status(request: web.Request) -> web.Response:
    """An upload's state and timeline; once completed, its asset's (a video the pipeline
    fetched from a provider has no session and is answered from its asset alone)."""
    ctx = context(request)
    tenant_id = tenant_of(request)
    video_id = path_video_id(request)
    session = await uploads.load_session(ctx.pool, tenant_id, video_id)
    if session is None:
        owner = await asset_reads.asset_owner(ctx.pool, video_id)
        if owner != tenant_id:
            raise ApiError(404, "no such video")
    timeline = _session_timeline(session) if session is not None else []
    summary = _summary(session) if session is not None else None
    if session is not None and session.status != uploads.COMPLETED:
        return schema.encode(
            VideoStatus(
                video_id=video_id,
                state=upload_state(session),
                timeline=timeline,
                upload=summary,
                error_class=session.error_class,
                error_detail=session.error_detail,
                passthrough=session.passthrough,
            )
        )
    status = await asset_status(ctx.pool, video_id)
    if status is None:
        raise ApiError(404, "no such video")
    entries = [msgspec.convert(entry, TimelineEntry) for entry in status["timeline"]]
    timeline = sorted([*timeline, *entries], key=lambda entry: entry.at)
    detail = status["error_detail"]
    return schema.encode(
        VideoStatus(
            video_id=video_id,
            state=status["state"],
            timeline=timeline,
            published_revision=status["current_revision"],
            moderation=status["moderation"],
            error_class=status["error_class"],
            upload=summary,
            error_detail=redact_text(detail) if detail else None,
            passthrough=(
                session.passthrough
                if session is not None
                else await asset_reads.passthrough(ctx.pool, video_id)
            ),
            progress=status["progress"],
            content_credentials=content_credentials(
                status["source_provenance"], status["output_signing"]
            ),
        )
    )


def _summary(session: UploadSession) -> UploadSummary:
    return UploadSummary(
        size_bytes=session.declared_size_bytes,
        sha256=session.received_sha256 or session.declared_sha256,
        content_type=session.content_type,
        expires_at=session.expires_at,
        filename=session.filename,
        received_bytes=(
            session.upload_offset if session.method == uploads.TUS else session.received_size_bytes
        ),
    )


def _session_timeline(session: UploadSession) -> list[TimelineEntry]:
    entries = [TimelineEntry(at=session.created_at, stage="upload", event="session_created")]
    if session.uploaded_at is not None:
        entries.append(
            TimelineEntry(
                at=session.uploaded_at,
                stage="upload",
                event="received",
                bytes=session.received_size_bytes,
            )
        )
    ended = session.ended_at
    if session.status == uploads.COMPLETED and session.completed_at is not None:
        entries.append(TimelineEntry(at=session.completed_at, stage="upload", event="completed"))
    elif session.status == uploads.FAILED and ended is not None:
        entries.append(
            TimelineEntry(at=ended, stage="upload", event="failed", error_class=session.error_class)
        )
    elif session.expired():
        entries.append(
            TimelineEntry(at=ended or session.expires_at, stage="upload", event="expired")
        )
    return entries
