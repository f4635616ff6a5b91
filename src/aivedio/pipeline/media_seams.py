"""What a media job runs on: the worker's long-lived services (``MediaServices``) and
the seams it takes from its worker per job (``WorkerSeams``)."""

from __future__ import annotations

from dataclasses import dataclass

from aivedio.config.load import Config
from aivedio.metrics import WorkerMetrics
from aivedio.pipeline.ffmpeg.sandbox import Sandbox
from aivedio.pipeline.moderation import ModerationStage
from aivedio.pipeline.publish import InJobPublish, PublishStage
from aivedio.pipeline.upkeep.backlog import BacklogMonitor
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
    store, the ffmpeg sandbox and the session locks (a render's revision lock)."""

    config: Config
    pool: Pool
    queue: Queue
    store: ObjectStore
    sandbox: Sandbox
    locks: SessionLocks
