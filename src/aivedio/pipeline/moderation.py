"""Output-side moderation: what a provider generated is looked at before it is published,
whatever the provider said of it. A ``Moderator`` seam, two implementations, the frame
sampler and the ``moderate`` job.

The job runs once per revision when its required set is complete. It samples JPEG frames
from the playback MP4 (first, middle, last, and scene changes) in the ffmpeg sandbox and asks
the configured moderator, with the media summary and the provider's own safety labels:

* ``allow``: the verdict is stored with the revision and the publish job is enqueued;
* ``reject``: the asset becomes REJECTED, nothing is published, the source stays in
  quarantine until ``source_retain_until`` for appeal and audit, ``asset.rejected`` is sent;
* ``review``: the asset stays private (moderation_status REVIEW) until someone decides;
* moderator unavailable: fail-closed. Nothing is published; the job waits and asks again
  (``unavailable_retry_seconds``) without spending attempts; processing goes on meanwhile.
"""

from __future__ import annotations

import base64
import random
import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

import aiohttp
import anyio
import msgspec

from aivedio import untrusted
from aivedio.config.load import Config
from aivedio.config.moderation import ModerationConfig, require_moderation
from aivedio.errors import (
    AivedioError,
    ConfigError,
    DeferredError,
    MalformedInputError,
    Retry,
    StaleStateError,
    TransientError,
)
from aivedio.logs import get_logger
from aivedio.pipeline import jobs
from aivedio.pipeline.ffmpeg.frames import (
    Frame,
    playback_frames_args,
    read_frames,
    still_times,
)
from aivedio.pipeline.ffmpeg.sandbox import Sandbox
from aivedio.pipeline.jobs import JobContext, Registry
from aivedio.pipeline.publish import InJobPublish, PublishStage, publish_when_ready
from aivedio.states import Entity
from aivedio.store import moderation_verdicts, outbox
from aivedio.store.database import Pool, acquired, transaction
from aivedio.store.objects.base import ObjectStore
from aivedio.store.queue import Job, Queue
from aivedio.store.records import transition

log = get_logger("aivedio.moderation")

KIND = jobs.MODERATE.name
LANE = jobs.MODERATE.lane
DECISIONS = ("allow", "reject", "review")


class ModeratorUnavailableError(AivedioError):
    """The moderator could not give a verdict (down, timing out, answering garbage)."""

    error_class = "moderation_unavailable"
    retry = Retry.BACKOFF


@dataclass(frozen=True, slots=True)
class Request:
    asset_id: uuid.UUID
    revision: int
    media: dict[str, Any]
    provider_labels: list[str]
    frames: list[Frame]


class Decision(msgspec.Struct, frozen=True, kw_only=True):
    decision: str
    reasons: list[str] = msgspec.field(default_factory=list)
    version: str = ""


class Moderator(Protocol):
    version: str

    async def check(self, request: Request) -> Decision: ...

    async def aclose(self) -> None: ...


@dataclass
class LocalModerator:
    """Rules from ``[moderation.local]``: labels, a length limit, and allow_all if written."""

    config: ModerationConfig
    version: str = ""

    def __post_init__(self) -> None:
        self.version = f"local:{self.config.version}"

    async def check(self, request: Request) -> Decision:
        rules = self.config.local
        labels = set(request.provider_labels)
        if labels & set(rules.reject_labels):
            reasons = sorted(f"label:{x}" for x in labels & set(rules.reject_labels))
            return Decision(decision="reject", reasons=reasons, version=self.version)
        if labels & set(rules.review_labels):
            reasons = sorted(f"label:{x}" for x in labels & set(rules.review_labels))
            return Decision(decision="review", reasons=reasons, version=self.version)
        duration = float(request.media.get("duration_seconds") or 0.0)
        if rules.review_over_seconds and duration > rules.review_over_seconds:
            return Decision(decision="review", reasons=["too_long_for_auto"], version=self.version)
        if not request.frames:
            return Decision(decision="review", reasons=["no_frames"], version=self.version)
        if rules.allow_all:
            return Decision(decision="allow", reasons=["allow_all"], version=self.version)
        return Decision(decision="review", reasons=["no_rule_allows"], version=self.version)

    async def aclose(self) -> None:
        return None


@dataclass
class HttpModerator:
    """POSTs the frames (base64 JPEG), the media summary and the provider labels as JSON; expects
    ``{"decision": "allow"|"reject"|"review", "reasons": [...], "version": "..."}``. Timeouts,
    connection errors and 5xx are retried with backoff ``attempts`` times, then unavailable."""

    config: ModerationConfig
    version: str = ""
    _session: aiohttp.ClientSession | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.version = f"http:{self.config.version}"

    async def check(self, request: Request) -> Decision:
        body = msgspec.json.encode(
            {
                "asset_id": str(request.asset_id),
                "revision": request.revision,
                "media": request.media,
                "provider_labels": request.provider_labels,
                "frames": [
                    {
                        "kind": f.kind,
                        "seconds": round(f.seconds, 3),
                        "jpeg_base64": base64.b64encode(f.jpeg).decode(),
                    }
                    for f in request.frames
                ],
            }
        )
        headers = {"Content-Type": "application/json"}
        if self.config.auth_header:
            headers["Authorization"] = self.config.auth_header
        last = ""
        for attempt in range(1, self.config.attempts + 1):
            try:
                return await self._post(body, headers)
            except ModeratorUnavailableError as exc:
                last = exc.detail
                if attempt < self.config.attempts:
                    ceiling = self.config.backoff_base_seconds * 2 ** (attempt - 1)
                    await anyio.sleep(ceiling * random.random())
        raise ModeratorUnavailableError(f"after {self.config.attempts} attempts: {last}")

    async def _post(self, body: bytes, headers: dict[str, str]) -> Decision:
        if self._session is None:
            self._session = aiohttp.ClientSession(trust_env=False)
        timeout = aiohttp.ClientTimeout(total=self.config.timeout_seconds)
        try:
            async with self._session.post(
                self.config.url, data=body, headers=headers, timeout=timeout
            ) as response:
                text = await response.read()
                if response.status >= 300:
                    raise ModeratorUnavailableError(f"moderator answered HTTP {response.status}")
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise ModeratorUnavailableError(f"moderator unreachable: {type(exc).__name__}") from exc
        try:  # at the edge's bounds: a wrong type or a deep answer is no decision (fail-closed)
            decision = untrusted.decode(text, Decision, bounds=untrusted.PROVIDER_BOUNDS)
        except MalformedInputError as exc:
            raise ModeratorUnavailableError(
                f"moderator answer did not decode: {exc.detail}"
            ) from exc
        if decision.decision not in DECISIONS:
            raise ModeratorUnavailableError(f"moderator decision {decision.decision!r} unknown")
        return Decision(
            decision=decision.decision,
            reasons=decision.reasons,
            version=decision.version or self.version,
        )

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()


def make_moderator(config: ModerationConfig) -> Moderator:
    require_moderation(config)
    if config.backend == "http":
        return HttpModerator(config)
    if config.backend == "local":
        return LocalModerator(config)
    raise ConfigError(f"config error: moderation.backend: {config.backend!r} unknown")


# -- frames --------------------------------------------------------------------------------


async def sample_frames(
    sandbox: Sandbox, video: Path, duration: float, config: ModerationConfig, scratch: Path
) -> list[Frame]:
    """First, middle and last frames, then up to ``max_scene_frames`` at scene changes, from
    a playback MP4, in one sandboxed ffmpeg (``frames.playback_frames_args``)."""
    result = await sandbox.run(
        "ffmpeg",
        playback_frames_args(video, duration, config, scratch),
        cwd=scratch,
        deadline_seconds=sandbox.media.process_timeout_seconds + duration,
    )
    if not result.ok:
        result.raise_if_exhausted()
        raise ModeratorUnavailableError(f"frame sampling failed: {result.error_detail()}")
    return await read_frames(scratch, still_times(duration))


# -- the job ---------------------------------------------------------------------------------


@dataclass
class ModerationStage:
    """The ``moderate`` job: the verdict on a revision's outputs.

    Owns the sampling of frames from the playback output (in the sandbox's scratch
    directory), the question to the moderator and the verdict stored with the revision
    (``VerdictRecorder``; a rejection ends the revision and the asset and keeps the source for
    appeal). An allow opens the moderation gate; the publish itself is the publish stage's,
    in this job or its own. Never touches an object in the store (it downloads the playback
    output, never writes or deletes one), a render, or the asset's pointer."""

    config: ModerationConfig
    pool: Pool
    queue: Queue
    store: ObjectStore
    sandbox: Sandbox
    moderator: Moderator

    async def moderate(self, job: Job, publisher: PublishStage | None = None) -> dict[str, Any]:
        """``publisher``: the worker's publish stage, when it has one; then a verdict that
        opens the last gate publishes in this job (``publish.InJobPublish``)."""
        here = InJobPublish(publisher, job) if publisher is not None else None
        asset_id = uuid.UUID(str(job.payload["asset_id"]))
        revision = int(job.payload["revision"])
        row = await moderation_verdicts.load_for_moderation(self.pool, asset_id, revision)
        if row is not None and row["status"] == "READY" and row["moderation_verdict"] == "allow":
            # Published, maybe by an earlier delivery of this job that died before the
            # enrichment check that follows the publish: the publish looks again.
            await publish_when_ready(self.pool, self.queue, asset_id, revision, here)
            return {"outcome": "already_allowed"}
        # PLAYABLE/ENRICHED: a rebuild (reprocess, integrity repair) of a published asset.
        live = ("PROCESSING", "PLAYABLE", "ENRICHED")
        if row is None or row["status"] != "BUILDING" or row["asset_status"] not in live:
            return {"outcome": "not_building"}
        if row["moderation_verdict"] == "allow":
            await publish_when_ready(self.pool, self.queue, asset_id, revision, here)
            return {"outcome": "already_allowed"}
        if row["moderation_verdict"] == "reject":
            # Stored with the revision by the probe's fast path, which died before acting
            # on it (or is acting on it now: idempotent): the rejection is finished here.
            reasons = [str(x) for x in (row["moderation_reasons"] or [])]
            await self.finish_reject(asset_id, revision, row["tenant_id"], reasons)
            return {"outcome": "already_reject"}
        if row["moderation_verdict"] == "review":
            return {"outcome": "already_review"}
        if row["playback_key"] is None:
            raise DeferredError("the playback output is not there yet", retry_after_seconds=5)
        media = dict(row["media"] or {})
        labels = [str(x) for x in (row["safety_labels"] or [])]
        try:
            with self.sandbox.scratch() as scratch:
                video = scratch / "playback.mp4"
                await self.store.download_file(row["playback_key"], str(video))
                frames = await sample_frames(
                    self.sandbox,
                    video,
                    float(media.get("duration_seconds") or 0.0),
                    self.config,
                    scratch,
                )
            decision = await self.moderator.check(
                Request(
                    asset_id=asset_id,
                    revision=revision,
                    media=media,
                    provider_labels=labels,
                    frames=frames,
                )
            )
        except ModeratorUnavailableError as exc:
            # Fail-closed: nothing is published; ask again later without spending attempts.
            log.warning(
                "moderation_unavailable",
                asset_id=str(asset_id),
                revision=revision,
                detail=exc.detail,
            )
            raise DeferredError(
                f"moderation unavailable: {exc.detail}",
                retry_after_seconds=self.config.unavailable_retry_seconds,
            ) from exc
        await self.record(asset_id, revision, row["tenant_id"], decision, here)
        return {
            "outcome": decision.decision,
            "reasons": decision.reasons,
            "frames": len(frames),
            "version": decision.version,
        }

    async def record(
        self,
        asset_id: uuid.UUID,
        revision: int,
        tenant_id: int,
        decision: Decision,
        here: InJobPublish | None = None,
    ) -> None:
        await VerdictRecorder(self.config, self.pool, self.queue).record(
            asset_id, revision, tenant_id, decision, here
        )

    async def finish_reject(
        self, asset_id: uuid.UUID, revision: int, tenant_id: int, reasons: list[str]
    ) -> None:
        await VerdictRecorder(self.config, self.pool, self.queue).finish_reject(
            asset_id, revision, tenant_id, reasons
        )


@dataclass
class VerdictRecorder:
    """Stores a verdict and acts on it: the moderator's, or an operator's on a review."""

    config: ModerationConfig
    pool: Pool
    queue: Queue

    async def record(
        self,
        asset_id: uuid.UUID,
        revision: int,
        tenant_id: int,
        decision: Decision,
        here: InJobPublish | None = None,
    ) -> None:
        """Store the verdict with the revision and act on it, in one transaction (one
        statement unless it rejects). ``here``: an allow that opens the last gate publishes
        in that job; without it (an operator's verdict) a publish job is enqueued."""
        reasons = list(decision.reasons)
        status = {"allow": "ALLOWED", "reject": "REJECTED", "review": "REVIEW"}
        async with acquired(self.pool) as conn, AsyncExitStack() as tx:
            if decision.decision == "reject":
                await tx.enter_async_context(transaction(conn))
            updated = await moderation_verdicts.store_verdict(
                conn,
                asset_id,
                revision,
                decision.decision,
                decision.version,
                reasons,
                status[decision.decision],
            )
            if updated is None:
                return
            if decision.decision == "reject":
                await self._reject(conn, asset_id, revision, tenant_id, reasons)
        if decision.decision == "allow":
            # After our commit (see publish_when_ready): publish if the required set is
            # complete too; otherwise the render that completes it publishes.
            await publish_when_ready(self.pool, self.queue, asset_id, revision, here)
        log.info(
            "moderation_verdict",
            asset_id=str(asset_id),
            revision=revision,
            decision=decision.decision,
            reasons=reasons,
            version=decision.version,
        )

    async def finish_reject(
        self, asset_id: uuid.UUID, revision: int, tenant_id: int, reasons: list[str]
    ) -> None:
        """A reject already stored with the revision (the probe's fast path stores the
        decision in hand in the statement that starts it): the revision FAILED, the asset
        REJECTED, its source kept for appeal, ``asset.rejected``; nothing if done already."""
        async with acquired(self.pool) as conn, transaction(conn):
            await self._reject(conn, asset_id, revision, tenant_id, reasons)

    async def _reject(
        self, conn: Any, asset_id: uuid.UUID, revision: int, tenant_id: int, reasons: list[str]
    ) -> None:
        retain = datetime.now(UTC) + timedelta(days=self.config.reject_retention_days)
        try:
            await transition(
                conn, Entity.REVISION, (asset_id, revision), expected="BUILDING", new="FAILED"
            )
            status = await moderation_verdicts.asset_state(conn, asset_id)
            if status != "PROCESSING":
                # A rebuild of a published asset: the published revision keeps serving; the
                # decision about the asset itself is an operator's (logged at error level).
                log.error(
                    "rebuild_rejected", asset_id=str(asset_id), revision=revision, reasons=reasons
                )
                return
            await transition(
                conn,
                Entity.ASSET,
                (asset_id,),
                expected="PROCESSING",
                new="REJECTED",
                values={
                    "last_error_class": "moderation_rejected",
                    "last_error_detail": ", ".join(reasons)[:1000],
                },
            )
        except StaleStateError:
            return
        await moderation_verdicts.retain_source_until(conn, asset_id, retain)
        await outbox.emit(
            conn,
            "asset.rejected",
            tenant_id=tenant_id,
            aggregate_id=asset_id,
            payload={
                "asset_id": str(asset_id),
                "revision": revision,
                "reasons": reasons,
                "source_retained_until": retain.isoformat(),
            },
        )


@asynccontextmanager
async def open_moderation_stage(
    config: Config, pool: Pool, queue: Queue, store: ObjectStore
) -> AsyncIterator[ModerationStage]:
    """The stage with its moderator; refuses to start without a configured backend."""
    moderator = make_moderator(config.moderation)
    try:
        yield ModerationStage(
            config.moderation, pool, queue, store, Sandbox(config.media), moderator
        )
    finally:
        await moderator.aclose()


async def handle(ctx: JobContext, job: Job) -> dict[str, Any] | None:
    stage = ctx.services.get("moderation")
    if not isinstance(stage, ModerationStage):
        raise TransientError("this worker has no moderation stage configured")
    publisher = ctx.services.get("publish")
    return await stage.moderate(job, publisher if isinstance(publisher, PublishStage) else None)


def register(registry: Registry) -> None:
    registry.bind(jobs.MODERATE, handle)
