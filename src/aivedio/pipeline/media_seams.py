"""What a media job runs on: the worker's long-lived services (``MediaServices``) and
the seams it takes from its worker per job (``WorkerSeams``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import asyncpg
import msgspec

from aivedio.config.load import Config
from aivedio.metrics import WorkerMetrics
from aivedio.pipeline.ffmpeg.media_run import MediaRun
from aivedio.pipeline.ffmpeg.provenance_read import ProvenanceReader
from aivedio.pipeline.ffmpeg.sandbox import Sandbox
from aivedio.pipeline.media.provenance import Provenance
from aivedio.pipeline.media.signing import Signing
from aivedio.pipeline.media.transcriber import NULL_TRANSCRIBER, Transcriber
from aivedio.pipeline.moderation import ModerationStage
from aivedio.pipeline.publish import InJobPublish, PublishStage
from aivedio.pipeline.upkeep.backlog import BacklogMonitor
from aivedio.providers.seam import ProviderCaption
from aivedio.store.database import Pool
from aivedio.store.objects.base import ObjectStore
from aivedio.store.queue import Job, Queue
from aivedio.store.session_locks import SessionLocks


@dataclass(frozen=True)
class WorkerSeams:
    """What a job of this stage takes from its worker: the shared backlog reading (deferral
    of optional outputs), the worker's metrics, its publish stage and its moderation stage.
    All optional: without them nothing is deferred, nothing counted, a render that opens
    the last gate enqueues the publish instead of publishing in its own job, and the probe
    takes no fast path (``pipeline/fast_path.py`` moderates and publishes in its job)."""

    backlog: BacklogMonitor | None = None
    metrics: WorkerMetrics | None = None
    publisher: PublishStage | None = None
    moderation: ModerationStage | None = None
    # Whether the worker believes no media job waits for a slot (``Lane.nothing_waiting``);
    # None (a stage run without a worker): nothing waits.
    media_queue_empty: Callable[[], bool] | None = None

    def nothing_waiting(self) -> bool:
        return self.media_queue_empty is None or self.media_queue_empty()

    def here(self, job: Job) -> InJobPublish | None:
        return InJobPublish(self.publisher, job) if self.publisher is not None else None

    async def deferring(self) -> bool:
        if self.backlog is None:
            return False
        await self.backlog.current()
        return self.backlog.defer_optional


NO_SEAMS = WorkerSeams()


@dataclass
class MediaServices:
    """The worker's services a media job uses: configuration, database, queue, object
    store, the ffmpeg sandbox and the session locks (a render's revision lock), and the C2PA
    side: the reader of a source's manifest store (None: reading is off) and the signing of
    outputs (None: no signer configured)."""

    config: Config
    pool: Pool
    queue: Queue
    store: ObjectStore
    sandbox: Sandbox
    locks: SessionLocks
    reader: ProvenanceReader | None = None
    signing: Signing | None = None
    # Captions from speech when a source has none (``pipeline/media/transcriber.py``).
    transcriber: Transcriber = NULL_TRANSCRIBER

    def equip(self, run: MediaRun, asset: asyncpg.Record) -> MediaRun:
        """``run`` with this worker's provenance reading and signing for ``asset``: the
        source's provenance as the probe recorded it (a run that skips ``inspect``), and
        whether its provider requires provenance."""
        run.provenance_reader = self.reader
        run.signing = self.signing
        provider = self.config.providers.get(asset["source_provider"] or "")
        run.require_provenance = provider is not None and provider.require_provenance
        recorded = asset["provenance"]
        if recorded is not None:
            run.source_provenance = msgspec.convert(recorded, Provenance)
        # The captions the provider reported with this source, made into tracks with it.
        captions = asset.get("provider_captions")
        if captions:
            run.provided_captions = tuple(msgspec.convert(captions, list[ProviderCaption]))
        run.transcriber = self.transcriber
        return run
