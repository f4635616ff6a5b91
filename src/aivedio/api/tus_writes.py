"""One PATCH of a resumable upload: its bytes appended at the recorded offset, then either
recorded (a checkpoint) or, when they were the last, the upload completed.

The order of a PATCH, and the failure each step prevents:

1. **The writer lease** (``store/resumable_uploads.claim_writer``): one writer per upload,
   across processes. A second PATCH while one streams is refused 423 (tus clients retry
   it); a writer that stalls past its lease cannot record anything (compare-and-set).
2. **The offset** is compared with the recorded one after the claim (409 when it differs):
   nothing else can move it while the lease is held.
3. **The bytes stream into the store** (``store/objects/append.py``) while counting and
   hashing them, never whole in memory (a batch being written, the next being read), the
   lease renewed as they arrive. More bytes than the upload's length are refused (413)
   before they are written.
4. **Only verified bytes are recorded.** With ``Upload-Checksum`` the body's SHA-256 must be
   the declared one (460), and a body cut short counts for nothing (its checksum cannot
   be checked). Without one, a body cut short (a dropped connection, an idle timeout) is
   recorded as far as it arrived: the client resumes from there, as tus intends.
5. **The last byte completes the upload** through the same intake as
   ``POST /v1/videos/{id}/complete``: the object is finished (parts assembled, or the
   append file renamed), its SHA-256 checked against a declared one, and the session turns
   COMPLETED with its asset and probe job in one transaction (``uploads.complete_session``).
   A repeated final PATCH (its answer was lost) finds the session COMPLETED and is
   answered with the full offset: one asset, one probe job.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from typing import Any

import aiohttp
import anyio
from aiohttp import http_exceptions, web
from anyio.streams.memory import MemoryObjectSendStream

from aivedio.api.context import ApiContext, context
from aivedio.api.idle_watch import IdleWatch
from aivedio.api.problems import ApiError
from aivedio.api.resumable_sessions import appending_store, scratch_prefix
from aivedio.api.tus_protocol import CHECKSUM_MISMATCH, OFFSET_CONTENT_TYPE
from aivedio.api.video_sessions import fail_upload, hash_object
from aivedio.errors import NotFoundError
from aivedio.logs import get_logger
from aivedio.pipeline.jobs import probe_spec
from aivedio.store import resumable_uploads, uploads
from aivedio.store.objects.append import Appender
from aivedio.store.objects.base import ABORT_TIMEOUT_SECONDS, MIB, ObjectInfo
from aivedio.store.uploads import UploadSession

log = get_logger("aivedio.api")

# Errors of a body that stopped arriving: the client went away or broke the framing.
BODY_ENDED = (ConnectionError, aiohttp.ClientPayloadError, http_exceptions.HttpProcessingError)


class Received:
    """What a PATCH did: the offset now, and whether the upload is complete."""

    def __init__(self, offset: int, session: UploadSession, completed: bool) -> None:
        self.offset = offset
        self.session = session
        self.completed = completed


async def receive(
    request: web.Request, session: UploadSession, offset: int, checksum: bytes | None
) -> Received:
    """Append the request's body at ``offset`` (see the module docstring)."""
    ctx = context(request)
    if request.content_type != OFFSET_CONTENT_TYPE:
        raise ApiError(415, f"a PATCH body must be {OFFSET_CONTENT_TYPE}", field="Content-Type")
    length = session.declared_size_bytes
    if session.status == uploads.COMPLETED:
        return _repeated_final(request, session, offset)
    _refuse_past_length(request, session, offset)
    writer = uuid.uuid4()
    claimed = await _claim(ctx, session, writer)
    try:
        if claimed.upload_offset != offset:
            raise _offset_mismatch(offset, claimed.upload_offset or 0)
        try:
            ctx.upload_hashes.writes.acquire_nowait()
        except anyio.WouldBlock:
            raise ApiError(
                503,
                "too many uploads are streaming into this process; retry",
                code="overloaded",
                headers={"Retry-After": "1"},
            ) from None
        try:
            return await _append(request, ctx, claimed, writer, checksum, length)
        finally:
            ctx.upload_hashes.writes.release()
    finally:
        with anyio.CancelScope(shield=True), anyio.move_on_after(ABORT_TIMEOUT_SECONDS):
            await resumable_uploads.release_writer(ctx.pool, session.id, writer)


def _repeated_final(request: web.Request, session: UploadSession, offset: int) -> Received:
    """A PATCH on a completed upload: the final one again (its answer was lost) is answered
    as it was; any other offset is not where the upload stands (409)."""
    length = session.declared_size_bytes
    sent = request.content_length
    if offset == length or (sent is not None and offset + sent == length):
        return Received(length, session, completed=True)
    raise _offset_mismatch(offset, length)


def _refuse_past_length(request: web.Request, session: UploadSession, offset: int) -> None:
    sent = request.content_length
    if sent is not None and offset + sent > session.declared_size_bytes:
        raise ApiError(
            413,
            f"{sent} bytes at offset {offset} would pass the upload's length "
            f"{session.declared_size_bytes}",
            "too_large",
        )


async def _claim(ctx: ApiContext, session: UploadSession, writer: uuid.UUID) -> UploadSession:
    lease = ctx.config.api.resumable_lease_seconds
    claimed = await resumable_uploads.claim_writer(ctx.pool, session.id, writer, lease)
    if claimed is not None:
        return claimed
    now = await uploads.load_session(ctx.pool, session.tenant_id, session.id)
    if now is None or now.status != uploads.AWAITING or now.expired():
        raise ended_error(now or session)
    raise ApiError(
        423,
        "another PATCH is writing to this upload; retry once it has ended",
        code="upload_locked",
        headers={"Retry-After": "1"},
    )


def ended_error(session: UploadSession) -> ApiError:
    """410 for an upload that will take no more bytes, saying why."""
    if session.status == uploads.COMPLETED:
        return ApiError(409, "the upload is already completed", code="upload_completed")
    if session.expired():
        return ApiError(
            410, "the upload expired: nothing was written to it for too long", "upload_expired"
        )
    why = session.error_detail or session.error_class or "it failed"
    return ApiError(410, f"the upload has ended: {why}", code=session.error_class or "gone")


def _offset_mismatch(sent: int, stored: int) -> ApiError:
    return ApiError(
        409,
        f"Upload-Offset {sent} is not the upload's offset {stored}: HEAD it and resume there",
        code="offset_mismatch",
        headers={"Upload-Offset": str(stored)},
    )


async def _append(
    request: web.Request,
    ctx: ApiContext,
    session: UploadSession,
    writer: uuid.UUID,
    checksum: bytes | None,
    length: int,
) -> Received:
    store = appending_store(ctx)
    key = session.object_key
    append_id = session.multipart_upload_id
    assert key is not None and append_id is not None
    start = session.upload_offset or 0
    whole = ctx.upload_hashes.resume(session.id, start)
    body = hashlib.sha256() if checksum is not None else None
    mark = resumable_uploads.mark_of(session)
    try:
        async with store.open_append(
            key,
            append_id,
            mark,
            part_size_bytes=session.part_size_bytes or ctx.config.api.resumable_part_size_bytes,
            scratch_prefix=scratch_prefix(session),
            content_type=session.content_type,
        ) as appender:
            cut = await _stream(request, ctx, session, writer, appender, whole, body, length)
            if body is not None and checksum is not None:
                if cut is not None:
                    raise ApiError(400, f"{cut}: nothing of it was kept", "incomplete_body")
                if body.digest() != checksum:
                    raise ApiError(
                        CHECKSUM_MISMATCH,
                        "the body's SHA-256 is not the Upload-Checksum: nothing of it was kept",
                        code="checksum_mismatch",
                    )
            if appender.offset == length:
                info = await appender.finish()
                return await _complete(ctx, session, info, whole)
            new = await appender.checkpoint()
    except NotFoundError:
        # The append is gone: a finish completed the object before its session could be
        # marked (a crash, a lost database), or the upload was removed.
        published = await ctx.store.head(key)
        if published is None or published.size != length:
            raise
        return await _complete(ctx, session, published, None)
    recorded = await resumable_uploads.record_checkpoint(
        ctx.pool,
        session.id,
        writer,
        started_at=start,
        mark=new,
        idle_seconds=ctx.config.api.resumable_idle_seconds,
    )
    if not recorded:
        raise ApiError(409, "another writer took this upload over; HEAD it and resume")
    if mark.tail_key is not None and mark.tail_key != new.tail_key:
        await ctx.store.delete(mark.tail_key)
    if whole is not None:
        ctx.upload_hashes.keep(session.id, new.offset, whole)
    if cut is not None:
        log.info("upload_patch_cut", video_id=str(session.id), offset=new.offset, why=cut)
    return Received(new.offset, session, completed=False)


# The body is handed to the appender in batches of at least this many bytes (the chunks as
# aiohttp's parser made them, never joined: joining them was a fifth of the event loop's
# time): one batch is hashed and written (a worker thread, on the local store) while the
# event loop reads the next.
BATCH_BYTES = 4 * MIB


async def _stream(
    request: web.Request,
    ctx: ApiContext,
    session: UploadSession,
    writer: uuid.UUID,
    appender: Appender,
    whole: Any | None,
    body: Any | None,
    length: int,
) -> str | None:
    """Feed the body to the appender and the hashes; None when it arrived whole, else why
    it stopped (what arrived was written, and hashed).

    Three tasks: this one reads the body into a batch, another hands each full batch to the
    appender with the hashers (``Appender.write``), one batch at a time, so the hashing and
    the writing (a worker thread) overlap the reading (the event loop) instead of taking
    turns with it, and no chunk is hashed on the event loop; the third is the body's idle
    watchdog (``IdleWatch``)."""
    hashers = tuple(hasher for hasher in (whole, body) if hasher is not None)
    send, receive = anyio.create_memory_object_stream[list[bytes]]()
    watch = IdleWatch(ctx.config.api.body_read_timeout_seconds)

    async def keep() -> None:
        async with receive:
            async for batch in receive:
                await appender.write(*batch, hashers=hashers)

    try:
        async with anyio.create_task_group() as group:
            group.start_soon(keep)
            group.start_soon(watch.watch)
            async with send:
                try:
                    cut = await _read(
                        request, ctx, session, writer, send, watch, appender.offset, length
                    )
                finally:
                    watch.stop()
    except BaseExceptionGroup as failed:
        raise _first(failed) from None
    return cut


async def _read(
    request: web.Request,
    ctx: ApiContext,
    session: UploadSession,
    writer: uuid.UUID,
    send: MemoryObjectSendStream[list[bytes]],
    watch: IdleWatch,
    offset: int,
    length: int,
) -> str | None:
    """The body into batches for ``send``, each read watched by ``watch`` (one idle
    deadline for the body, not one per chunk); what ``_stream`` answers. A body cut short
    still sends what arrived of it."""
    lease = ctx.config.api.resumable_lease_seconds
    renewed = time.monotonic()
    content = request.content
    batch: list[bytes] = []
    batched = 0
    cut: str | None = None
    try:
        with watch.scope:
            while True:
                # The chunks as aiohttp's parser made them: no copy, the batch joins none.
                chunk, end_of_http_chunk = await watch.readchunk(content)
                if not chunk:
                    if end_of_http_chunk:
                        continue  # the end of a chunk of a chunked body, not of the body
                    break
                if offset + len(chunk) > length:
                    raise ApiError(
                        413, f"the body passes the upload's length {length}", "too_large"
                    )
                offset += len(chunk)
                batch.append(chunk)
                batched += len(chunk)
                if batched >= BATCH_BYTES:
                    await send.send(batch)
                    batch, batched = [], 0
                if time.monotonic() - renewed > lease / 3:
                    renewed = time.monotonic()
                    if not await resumable_uploads.renew_writer(
                        ctx.pool, session.id, writer, lease
                    ):
                        raise ApiError(
                            409, "the upload's writer lease was lost; HEAD it and resume"
                        )
        if watch.expired:
            cut = "the body stopped arriving"
    except BODY_ENDED as exc:
        cut = f"the body ended early ({type(exc).__name__})"
    if batch:
        await send.send(batch)
    return cut


def _first(error: BaseException) -> BaseException:
    """The error a task group wrapped (the first, unwrapped): callers expect ours."""
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    return error


async def _complete(
    ctx: ApiContext, session: UploadSession, info: ObjectInfo, whole: Any | None
) -> Received:
    """The upload's object is whole: the same intake as complete (asset + probe job)."""
    key = info.key
    digest = whole.hexdigest() if whole is not None else await hash_object(ctx.store, key)
    if session.declared_sha256 is not None and digest != session.declared_sha256:
        await fail_upload(
            ctx,
            session,
            "checksum_mismatch",
            f"the uploaded file's SHA-256 is {digest}, declared {session.declared_sha256}",
        )
    probe = probe_spec(session.id, session.tenant_id)
    done = await uploads.complete_session(
        ctx.pool, ctx.queue, session, key=key, size=info.size, sha256=digest, probe=probe
    )
    ctx.upload_hashes.forget(session.id)
    now = await uploads.load_session(ctx.pool, session.tenant_id, session.id)
    if not done and (now is None or now.status != uploads.COMPLETED):
        raise ended_error(now or session)
    if session.tail_key is not None:
        await ctx.store.delete(session.tail_key)
    if done:
        log.info(
            "upload_completed",
            video_id=str(session.id),
            tenant_id=session.tenant_id,
            bytes=info.size,
            resumable=True,
        )
    return Received(info.size, now or session, completed=True)
