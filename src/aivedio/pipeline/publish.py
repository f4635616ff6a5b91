"""The publish coordinator: the one place an asset becomes visible, whether it came from a
provider's output or an upload. Nothing is visible before every item of the checklist below
held, and what becomes visible at once is a complete, moderated revision.

Checklist, before any transaction (objects cannot take part in one): the source object is
there at its recorded size; every required output is SUCCEEDED and every file of it is in the
store at its recorded size; optional outputs are checked the same way and any that fail are
left out of the release (an HLS rendition missing a segment is never published); media
metadata is written; moderation allowed; the revision is still the candidate.

Then ONE statement, fenced by the job's lease: the task and the asset row are locked and
re-checked (``delete_version``, ``cancel_version`` against the values the revision started
with, the current revision it expects to replace), the revision becomes READY with the outputs
it publishes, ``assets.current_revision`` moves by compare-and-set, a ``releases`` row is
added, the generation task is linked, ``asset.ready`` goes to the outbox and the processing
charge to the ledger; a check or a compare-and-set that fails raises in the statement and
undoes all of it (``store.together.require``; the statement is ``publish_release``). A
retry after an unknown outcome finds the revision READY and current: a no-op.

PLAYABLE first with the required set. Outputs of the same revision that finish later are
never added to it: once they are all done, an ``enrich`` run publishes a new complete
revision n+1 that references the same immutable objects, and the asset becomes ENRICHED.
The player of revision n keeps working: nothing it references changed.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import asyncpg

from aivedio.config.load import Config
from aivedio.errors import (
    AivedioError,
    DeferredError,
    LeaseLostError,
    StaleStateError,
    TransientError,
)
from aivedio.logs import get_logger
from aivedio.pipeline import jobs
from aivedio.pipeline.jobs import JobContext, Registry, publish_spec
from aivedio.pipeline.media.credentials import content_credentials, to_json
from aivedio.pipeline.publish_release import NotPublishable, PointerMoved, Unmet, release
from aivedio.states import Entity
from aivedio.store import publishing
from aivedio.store.database import Pool, acquired
from aivedio.store.objects.base import ObjectStore
from aivedio.store.objects.keys import recorded_files
from aivedio.store.publishing import (
    CANCELLED,
    DELETED,
    NOT_CURRENT,
    REBUILDING,
)
from aivedio.store.queue import Job, Queue
from aivedio.store.records import transition

Row = dict[str, Any]

log = get_logger("aivedio.publish")

KIND = jobs.PUBLISH.name
LANE = jobs.PUBLISH.lane


@dataclass(frozen=True)
class InJobPublish:
    """The job that opened the last gate, with its worker's publish stage: the publish (or
    the enrichment) runs in that job, fenced by its lease, instead of in a job of its own
    that would wait for a claim. A crash before it is done leaves that job to be retried,
    and its retry finds the gates open again; a publish that cannot finish now (an object
    not there yet, the pointer moved) is left to a publish job and its retry rules."""

    stage: PublishStage
    job: Job

    async def run(
        self,
        asset_id: uuid.UUID,
        revision: int,
        *,
        enrich: bool = False,
        loaded: asyncpg.Record | None = None,
        enrichment_follows: bool = False,
    ) -> bool:
        """Published (or found nothing to do) here: True; left to a job: False.
        ``loaded``: the caller's ``publishing.load`` of the revision, read after its own
        commit (the check that called for this), not read again. ``enrichment_follows``:
        the caller renders the pending outputs next, their render job held for it, and
        looks at the revision again after (``inline_enrichment``)."""
        try:
            if enrich:
                await self.stage.enrich(self.job, asset_id, revision, loaded)
            else:
                await self.stage.publish(
                    self.job, asset_id, revision, loaded, enrichment_follows=enrichment_follows
                )
        except LeaseLostError:
            raise  # this job is no longer ours: neither is its publish
        except (AivedioError, asyncpg.PostgresError, asyncpg.InterfaceError, OSError) as exc:
            # Not this job's failure: the publish job retries it by its own rules.
            error_class = exc.error_class if isinstance(exc, AivedioError) else "database"
            log.info(
                "publish_left_to_its_job",
                asset_id=str(asset_id),
                revision=revision,
                enrich=enrich,
                job_id=self.job.id,
                error_class=error_class,
                detail=str(exc)[:300],
            )
            return False
        return True


async def enrich_now_or_later(
    pool: Pool,
    queue: Queue,
    asset_id: uuid.UUID,
    revision: int,
    tenant_id: int,
    here: InJobPublish | None,
    loaded: asyncpg.Record | None = None,
) -> None:
    """Revision ``revision`` is published and all its outputs are done: its enrichment, here
    or by a job (``loaded``: see ``InJobPublish.run``)."""
    if here is not None and await here.run(asset_id, revision, enrich=True, loaded=loaded):
        return
    async with acquired(pool) as conn:
        await queue.enqueue_one(conn, publish_spec(asset_id, revision, tenant_id, enrich=True))


async def publish_when_ready(
    pool: Pool,
    queue: Queue,
    asset_id: uuid.UUID,
    revision: int,
    here: InJobPublish | None = None,
    loaded: asyncpg.Record | None = None,
) -> bool:
    """Publish once both gates are open: the required set SUCCEEDED and the moderation
    verdict allow; here (``InJobPublish``) or by enqueueing the publish job. Called by each gate
    after its own commit, so the one that opens last always sees the other (READ
    COMMITTED); the publish is idempotent and the job key makes the enqueue so.
    ``loaded``: the caller's ``publishing.load`` after its commit, in which it found both
    gates open (not read again)."""
    if loaded is not None:
        row: Any = publishing.gates_of(loaded)
    else:
        row = await publishing.gates(pool, asset_id, revision)
    if row is None or row["status"] not in ("BUILDING", "READY"):
        return False
    # READY: published already, maybe by a delivery of this gate's job that died before the
    # enrichment check that follows the commit; the publish (here or a job) checks again.
    if row["moderation_verdict"] != "allow" or not row["complete"]:
        return False
    if here is not None and await here.run(asset_id, revision, loaded=loaded):
        return True
    async with acquired(pool) as conn:
        created = await queue.enqueue_one(conn, publish_spec(asset_id, revision, row["tenant_id"]))
    if created.created:
        log.info("publish_enqueued", asset_id=str(asset_id), revision=revision)
    return True


class PublishStage:
    """The ``publish`` job: the one place a revision becomes what an asset serves.

    Owns the revision's way from BUILDING to READY (or ABANDONED), the asset's pointer and
    its states PLAYABLE and ENRICHED, the superseding of the revision it replaces, the
    enrichment revision n+1 made of revision n's finished outputs, and what the release
    writes with them (``publish_release``). Never touches an object in the store (it reads
    their sizes, never writes or deletes one), a render, or a moderation verdict (it reads
    the verdict; the moderation stage gives it)."""

    def __init__(self, config: Config, pool: Pool, queue: Queue, store: ObjectStore) -> None:
        self.config = config
        self.pool = pool
        self.queue = queue
        self.store = store

    async def handle(self, job: Job) -> dict[str, Any]:
        asset_id = uuid.UUID(str(job.payload["asset_id"]))
        revision = int(job.payload["revision"])
        if job.payload.get("mode") == "enrich":
            return await self.enrich(job, asset_id, revision)
        return await self.publish(job, asset_id, revision)

    # -- checklist ---------------------------------------------------------------------------

    async def _present(
        self, variants: Sequence[Row], also: Sequence[str] = ()
    ) -> tuple[set[str], dict[str, int | None]]:
        """The outputs among ``variants`` whose every file is in the store at its recorded
        size, and the sizes found (``also``: more keys to look up in the same call): one
        ``sizes`` call for all of them."""
        wanted_by = {v["variant_type"]: _wanted(v) for v in variants}
        keys = [*also, *(key for wanted in wanted_by.values() for key in wanted)]
        found = await self.store.sizes(keys) if keys else {}
        present: set[str] = set()
        for name, wanted in wanted_by.items():
            missing = [(key, size) for key, size in wanted.items() if found.get(key) != size]
            if not missing:
                present.add(name)
                continue
            key, size = missing[0]
            log.warning(
                "publish_object_missing",
                key=key,
                variant=name,
                expected_size=size,
                found=found.get(key),
            )
        return present, found

    async def _checklist(
        self, asset: asyncpg.Record, revision: Row, variants: list[Row]
    ) -> list[str]:
        """The outputs to publish; raises when the revision cannot be published now."""
        if asset["status"] in ("DELETED", "REJECTED", "PROCESSING_FAILED", "INVALID_MEDIA"):
            raise NotPublishable(f"asset is {asset['status']}")
        if asset["delete_version"] != revision["delete_version_at_start"]:
            raise NotPublishable("asset was deleted after this revision started")
        if asset["cancel_version"] != revision["cancel_version_at_start"]:
            raise NotPublishable("generation was cancelled after this revision started")
        if revision["moderation_verdict"] != "allow":
            raise NotPublishable(f"moderation verdict is {revision['moderation_verdict']!r}")
        if asset["width"] is None or asset["duration_us"] is None:
            raise NotPublishable("media metadata is not written")
        # The source and every finished output's files in one store call.
        source_key = asset["source_object_key"]
        done = [v for v in variants if v["status"] == "SUCCEEDED"]
        present, found = await self._present(done, also=[source_key] if source_key else [])
        if source_key is None or found.get(source_key) != asset["source_size_bytes"]:
            raise TransientError("the source object is missing or has another size")
        required = set(revision["required_outputs"])
        by_type = {v["variant_type"]: v for v in variants}
        for name in sorted(required):
            variant = by_type.get(name)
            if variant is None or variant["status"] != "SUCCEEDED":
                raise DeferredError(
                    f"required output {name} is not done yet", retry_after_seconds=5
                )
            if name not in present:
                raise TransientError(f"required output {name}: an object is missing")
        outputs = sorted(required)
        outputs += [name for name in sorted(present) if name not in required]
        return outputs

    # -- publish -------------------------------------------------------------------------------

    async def publish(
        self,
        job: Job,
        asset_id: uuid.UUID,
        revision_no: int,
        loaded: asyncpg.Record | None = None,
        *,
        enrichment_follows: bool = False,
    ) -> dict[str, Any]:
        asset, revision, variants = await self._load(asset_id, revision_no, loaded)
        if revision is None:
            return {"outcome": "no_such_revision"}
        if revision["status"] == "READY":
            # Published by an earlier delivery that may have died before its enrichment
            # check (it runs after the commit): done again here, the enrichment decides.
            if asset["current_revision"] == revision_no and all(
                v["status"] != "PENDING" for v in variants
            ):
                await enrich_now_or_later(
                    self.pool,
                    self.queue,
                    asset_id,
                    revision_no,
                    asset["tenant_id"],
                    InJobPublish(self, job),
                )
            return {"outcome": "already_published", "revision": revision_no}
        if revision["status"] != "BUILDING":
            return {"outcome": f"revision_{revision['status'].lower()}"}
        newer = revision["newest_candidate"]
        if newer is not None and newer > revision_no:
            await self._abandon(asset_id, revision_no, "a newer revision is the candidate")
            return {"outcome": "superseded_before_publish"}
        try:
            outputs = await self._checklist(asset, revision, variants)
        except NotPublishable as exc:
            await self._abandon(asset_id, revision_no, str(exc))
            return {"outcome": "not_published", "reason": str(exc)}
        optional = set(revision["optional_outputs"])
        complete = all(v["status"] != "PENDING" for v in variants)
        enriched = complete and optional <= set(outputs)
        previous = asset["current_revision"]
        # Under the lock, what the checklist decided on must still hold: the versions the
        # revision started with (else not publishable) and the pointer it replaces.
        checks = {
            "fresh": publishing.versions_check(
                revision["delete_version_at_start"], revision["cancel_version_at_start"]
            ),
            "pointer": publishing.pointer_check(previous),
        }
        try:
            await release(
                self.pool,
                self.config.ledger,
                job,
                asset,
                checks,
                previous,
                revision_no,
                outputs,
                enriched,
                credentials=_credentials(asset, variants, outputs),
            )
        except NotPublishable as exc:  # undone; the job itself is fine
            await self._abandon(asset_id, revision_no, str(exc))
            return {"outcome": "not_published", "reason": str(exc)}
        except PointerMoved:
            mine = await publishing.revision_status(self.pool, asset_id, revision_no)
            if mine in ("READY", "SUPERSEDED"):
                # Another delivery published this very revision meanwhile (the job that
                # opened the last gate and a publish job, both seeing both gates open).
                return {"outcome": "already_published", "revision": revision_no}
            raise  # another revision was published meanwhile: the retry decides afresh
        log.info(
            "asset_published",
            asset_id=str(asset_id),
            revision=revision_no,
            outputs=outputs,
            state="ENRICHED" if enriched else "PLAYABLE",
        )
        if not complete and not enrichment_follows:
            # Outputs still rendering are released later by an enrichment revision. The
            # render that finishes the last one enqueues it; checked here too, after our
            # commit, in case it finished while we published (the later check sees both).
            # Not when this job renders them next: nothing else renders them meanwhile.
            log.info("enrichment_pending", asset_id=str(asset_id), revision=revision_no)
            pending = await publishing.pending_outputs(self.pool, asset_id, revision_no)
            if pending == 0:
                await enrich_now_or_later(
                    self.pool,
                    self.queue,
                    asset_id,
                    revision_no,
                    asset["tenant_id"],
                    InJobPublish(self, job),
                )
        return {
            "outcome": "published",
            "revision": revision_no,
            "outputs": outputs,
            "enriched": enriched,
        }

    async def _abandon(self, asset_id: uuid.UUID, revision_no: int, reason: str) -> None:
        async with acquired(self.pool) as conn:
            try:
                await transition(
                    conn,
                    Entity.REVISION,
                    (asset_id, revision_no),
                    expected="BUILDING",
                    new="ABANDONED",
                )
            except StaleStateError:
                return
        log.warning(
            "revision_abandoned", asset_id=str(asset_id), revision=revision_no, reason=reason
        )

    # -- enrichment ----------------------------------------------------------------------------

    async def enrich(
        self, job: Job, asset_id: uuid.UUID, base_no: int, loaded: asyncpg.Record | None = None
    ) -> dict[str, Any]:
        """Publish revision n+1 = everything revision n finished, once all of it is done."""
        asset, base, variants = await self._load(asset_id, base_no, loaded)
        if base is None or base["status"] != "READY" or asset["current_revision"] != base_no:
            return {"outcome": "not_current"}
        if any(v["status"] == "PENDING" for v in variants):
            raise DeferredError("outputs are still rendering", retry_after_seconds=10)
        published = set(base["published_outputs"] or [])
        fresh = [
            v for v in variants if v["status"] == "SUCCEEDED" and v["variant_type"] not in published
        ]
        present, _ = await self._present(fresh)
        extra = [v["variant_type"] for v in fresh if v["variant_type"] in present]
        if not extra:
            return {"outcome": "nothing_to_add"}
        outputs = sorted(published | set(extra))
        optional = set(base["optional_outputs"])
        enriched = optional <= set(outputs)
        # Checked under the lock, with the new revision and its outputs made there (the
        # variants' reference to the revision is checked at the end of the statement). The
        # number: one past the highest read with the asset; a revision that took it since
        # makes the insert fail, and the retry reads again.
        new_no = int(asset["max_revision"]) + 1
        checks = {
            "current": publishing.current_check(base_no),
            "not_deleted": publishing.not_deleted_check(base["delete_version_at_start"]),
            "not_cancelled": publishing.not_cancelled_check(base["cancel_version_at_start"]),
            # A rebuild (reprocess, integrity repair) will replace this revision: an
            # enrichment now would only be superseded, or move the pointer past it.
            "no_rebuild": publishing.no_rebuild_check(asset_id, base_no),
        }
        # The copy reads the last check, so it waits for the lock and the checks.
        copy = publishing.copy_parts(
            asset_id, new_no, base_no, outputs, datetime.now(UTC), after_part="no_rebuild"
        )
        outcomes = {
            NOT_CURRENT: "not_current",
            DELETED: "deleted",
            CANCELLED: "cancelled",
            REBUILDING: "superseded_by_rebuild",
        }
        try:
            await release(
                self.pool,
                self.config.ledger,
                job,
                asset,
                checks,
                base_no,
                new_no,
                outputs,
                enriched,
                enriches=base_no,
                copy=copy,
                credentials=_credentials(asset, variants, outputs),
            )
        except Unmet as exc:
            if exc.code in outcomes:
                return {"outcome": outcomes[exc.code]}
            raise
        log.info(
            "asset_enriched",
            asset_id=str(asset_id),
            revision=new_no,
            base=base_no,
            added=sorted(extra),
        )
        return {"outcome": "enriched", "revision": new_no, "added": sorted(extra)}

    # -- helpers -------------------------------------------------------------------------------

    async def _load(
        self, asset_id: uuid.UUID, revision_no: int, loaded: asyncpg.Record | None = None
    ) -> tuple[asyncpg.Record, Row | None, list[Row]]:
        """The asset, the revision and its outputs in one round trip (the revision and the
        outputs as JSON objects: only their JSON-typed columns are read); ``loaded``: that
        read, made by the caller after its own commit."""
        asset = (
            loaded
            if loaded is not None
            else await publishing.load(self.pool, asset_id, revision_no)
        )
        if asset is None:
            raise StaleStateError(f"asset {asset_id} does not exist")
        return asset, asset["revision_row"], asset["variant_rows"]


def _credentials(
    asset: asyncpg.Record, variants: Sequence[Row], outputs: Sequence[str]
) -> dict[str, Any] | None:
    """The ``asset.ready`` event's Content Credentials: the source's provenance and the
    signing of each output the release publishes."""
    signing = {
        v["variant_type"]: (v.get("extra") or {}).get("c2pa")
        for v in variants
        if v["variant_type"] in outputs
    }
    return to_json(content_credentials(asset["provenance"], signing))


def _wanted(variant: Row) -> dict[str, int]:
    """An output's files as object keys with their recorded sizes."""
    files = (variant["extra"] or {}).get("files")
    return {
        key: int(size)  # type: ignore[arg-type]  # every recorded file has its size
        for key, size, _ in recorded_files(
            variant["object_key"], variant["size_bytes"], None, files
        )
    }


async def handle(ctx: JobContext, job: Job) -> dict[str, Any] | None:
    stage = ctx.services.get("publish")
    if not isinstance(stage, PublishStage):
        raise TransientError("this worker has no publish stage configured")
    return await stage.handle(job)


def register(registry: Registry) -> None:
    registry.bind(jobs.PUBLISH, handle)
