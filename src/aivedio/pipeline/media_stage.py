"""The media stage in the worker: its job kinds bound to their handlers.

``probe`` and ``reprocess`` (``probe_stage``) start a revision from a stored source;
``render`` (``render_stage``) makes its outputs, one DAG run for many; the chunked render's
``chunk_split``, ``chunk_encode`` and ``chunk_assemble`` (``chunk_stage``) make a long
video's playback, HLS and keyframes across the fleet. All of them share the revision's
bookkeeping (``revisions``) and the poison rule (``media_poison``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

from aivedio.config.load import Config
from aivedio.errors import TransientError
from aivedio.metrics import WorkerMetrics
from aivedio.pipeline import chunk_stage, jobs
from aivedio.pipeline.ffmpeg.provenance_read import ProvenanceReader
from aivedio.pipeline.ffmpeg.sandbox import Sandbox
from aivedio.pipeline.jobs import JobContext, Registry
from aivedio.pipeline.media.signing import Signing
from aivedio.pipeline.media_poison import PoisonGuard
from aivedio.pipeline.media_seams import NO_SEAMS, MediaServices, WorkerSeams
from aivedio.pipeline.moderation import ModerationStage
from aivedio.pipeline.probe_stage import ProbeStage
from aivedio.pipeline.publish import PublishStage
from aivedio.pipeline.render_stage import RenderStage
from aivedio.pipeline.revisions import Revisions, will_retry
from aivedio.pipeline.upkeep.backlog import BacklogMonitor
from aivedio.store.database import Pool
from aivedio.store.objects.base import ObjectStore
from aivedio.store.objects.opening import open_object_store
from aivedio.store.queue import Job, Queue
from aivedio.store.session_locks import SessionLocks

PROBE_KIND = jobs.PROBE.name
REPROCESS_KIND = jobs.REPROCESS.name
PROBE_VERSION = jobs.PROBE_VERSION
RENDER_KIND = jobs.RENDER.name
LANE = jobs.RENDER.lane


class MediaStage:
    """The worker's media stage: the probe, reprocess and render jobs on one set of
    services (``MediaServices``), and the revision bookkeeping the chunked render shares.

    It owns an asset from QUARANTINED to a revision with its required set made (or
    INVALID_MEDIA / PROCESSING_FAILED); it never moderates and never publishes but through
    the worker's publish stage, and never fetches from a provider."""

    def __init__(self, services: MediaServices) -> None:
        self.services = services
        self.revisions = Revisions(services)
        self.poison = PoisonGuard(self.revisions)
        self.probes = ProbeStage(self.revisions, self.poison)
        self.renders = RenderStage(self.revisions, self.poison)

    async def probe(self, job: Job, seams: WorkerSeams = NO_SEAMS) -> dict[str, Any]:
        return await self.probes.probe(job, seams)

    async def reprocess(self, job: Job, seams: WorkerSeams = NO_SEAMS) -> dict[str, Any]:
        return await self.probes.reprocess(job, seams)

    async def render(self, job: Job, seams: WorkerSeams = NO_SEAMS) -> dict[str, Any]:
        return await self.renders.render(job, seams)


@asynccontextmanager
async def open_media_stage(
    config: Config,
    pool: Pool,
    queue: Queue,
    store: ObjectStore | None = None,
    signing: Signing | None = None,
) -> AsyncIterator[MediaStage]:
    """The media stage; ``signing``: the C2PA signing of outputs (built by the caller from
    ``[provenance]``, so that this stage never loads c2pa itself)."""
    async with AsyncExitStack() as stack:
        if store is None:
            store = await stack.enter_async_context(open_object_store(config.storage))
        sandbox = Sandbox(config.media)
        # Refuse to start (ConfigError) rather than fail assets: ffmpeg, ffprobe and prlimit
        # must be there and, if required, the network namespace must work.
        await sandbox.check()
        locks = SessionLocks(config.database)
        stack.push_async_callback(locks.aclose)
        reader = ProvenanceReader(sandbox, config.provenance) if config.provenance.read else None
        services = MediaServices(
            config=config,
            pool=pool,
            queue=queue,
            store=store,
            sandbox=sandbox,
            locks=locks,
            reader=reader,
            signing=signing,
        )
        yield MediaStage(services)


async def handle_probe(ctx: JobContext, job: Job) -> dict[str, Any] | None:
    return await _stage(ctx).probe(job, _seams(ctx))


async def handle_render(ctx: JobContext, job: Job) -> dict[str, Any] | None:
    return await _stage(ctx).render(job, _seams(ctx))


def _seams(ctx: JobContext) -> WorkerSeams:
    backlog = ctx.services.get("backlog")
    metrics = ctx.services.get("metrics")
    publisher = ctx.services.get("publish")
    moderation = ctx.services.get("moderation")
    queue_empty = ctx.services.get("media_queue_empty")
    return WorkerSeams(
        backlog=backlog if isinstance(backlog, BacklogMonitor) else None,
        metrics=metrics if isinstance(metrics, WorkerMetrics) else None,
        publisher=publisher if isinstance(publisher, PublishStage) else None,
        moderation=moderation if isinstance(moderation, ModerationStage) else None,
        media_queue_empty=queue_empty if callable(queue_empty) else None,
    )


def _stage(ctx: JobContext) -> MediaStage:
    stage = ctx.services.get("media")
    if not isinstance(stage, MediaStage):
        raise TransientError("this worker has no media stage configured")
    return stage


async def handle_reprocess(ctx: JobContext, job: Job) -> dict[str, Any] | None:
    return await _stage(ctx).reprocess(job, _seams(ctx))


def _chunks(ctx: JobContext) -> chunk_stage.ChunkStage:
    return chunk_stage.ChunkStage(_stage(ctx).revisions, will_retry)


async def handle_chunk_split(ctx: JobContext, job: Job) -> dict[str, Any] | None:
    return await _chunks(ctx).split(job)


async def handle_chunk_encode(ctx: JobContext, job: Job) -> dict[str, Any] | None:
    return await _chunks(ctx).encode(job, _seams(ctx).metrics)


async def handle_chunk_assemble(ctx: JobContext, job: Job) -> dict[str, Any] | None:
    return await _chunks(ctx).assemble(job)


def register(registry: Registry) -> None:
    registry.bind(jobs.CHUNK_SPLIT, handle_chunk_split)
    registry.bind(jobs.CHUNK_ENCODE, handle_chunk_encode)
    registry.bind(jobs.CHUNK_ASSEMBLE, handle_chunk_assemble)
    registry.bind(jobs.REPROCESS, handle_reprocess)
    registry.bind(jobs.PROBE, handle_probe)
    registry.bind(jobs.RENDER, handle_render)
