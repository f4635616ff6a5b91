"""A revision's bookkeeping, shared by the probe, the render and the chunked render.

A revision is BUILDING from the probe that starts it. Each output is a variant row, PENDING
until it is made (SUCCEEDED) or can no longer be made (FAILED). After each such change the
revision is looked at again (``Revisions.check_revision``): a FAILED required output fails
the revision and, unless it is a rebuild of a published asset, the asset
(PROCESSING_FAILED, with the ledger's compensation); a complete required set goes to
moderation and then to publish; a published revision whose outputs are all done goes to
enrichment.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import asyncpg

from aivedio.config.load import Config
from aivedio.errors import AivedioError, NotFoundError, StaleStateError
from aivedio.logs import get_logger
from aivedio.pipeline import jobs
from aivedio.pipeline.jobs import moderate_spec
from aivedio.pipeline.media import av1
from aivedio.pipeline.media.plan import Plan
from aivedio.pipeline.media.validate import MediaSummary
from aivedio.pipeline.media_seams import MediaServices
from aivedio.pipeline.publish import InJobPublish, enrich_now_or_later, publish_when_ready
from aivedio.scheduling import decide_retry
from aivedio.states import Entity
from aivedio.store import asset_variants, ledger, media_assets, publishing, revision_rows
from aivedio.store.queue import Job, JobSpec
from aivedio.store.records import transition

log = get_logger("aivedio.media")


class Revisions:
    """The bookkeeping of a revision that every media job shares: reading the asset and
    the revision, failing an output, asking for moderation, and the check after an output
    is recorded or failed that moves the revision on (failed, to moderation, to publish or
    to enrichment), with the ledger's compensation when the platform fails a paid source.

    It owns no job kind and runs no ffmpeg; it never renders, probes or touches files."""

    def __init__(self, services: MediaServices) -> None:
        self.services = services

    async def asset(self, asset_id: uuid.UUID) -> asyncpg.Record:
        row = await self.asset_row(asset_id)
        if row is None:
            raise NotFoundError(f"asset {asset_id} does not exist")
        return row

    async def asset_row(self, asset_id: uuid.UUID) -> asyncpg.Record | None:
        """The asset row, with what the media jobs decide on, read with it so that each
        costs no round trip of its own: ``media_crashes`` (how many media jobs its source
        crashed: the poison rule), ``task_status`` (its generation task's provider status,
        None for an upload: a cancel) and ``next_revision`` (the number a new one takes)."""
        return await media_assets.asset_row(self.services.pool, asset_id)

    async def asset_and_revision(
        self, asset_id: uuid.UUID, revision: int, output: str
    ) -> tuple[asyncpg.Record | None, Mapping[str, Any] | None]:
        """``asset_row`` and ``revision`` (with ``output``'s own state) in one round trip:
        the asset, and the revision's row with ``mine_status`` and ``mine_deferred_at``
        (None for a revision that does not exist)."""
        row = await media_assets.asset_and_revision(self.services.pool, asset_id, revision, output)
        if row is None or row["revision_row"] is None:
            return row, None
        # As JSON: the revision's columns read here are JSON-typed (no timestamps).
        state = dict(row["revision_row"])
        state.update(mine_status=row["mine_status"], mine_deferred_at=row["mine_deferred_at"])
        return row, state

    async def revision(self, asset_id: uuid.UUID, revision: int) -> asyncpg.Record | None:
        """The revision's row (None when there is none)."""
        return await revision_rows.revision_row(self.services.pool, asset_id, revision)

    async def stopped(self, asset_id: uuid.UUID, revision: asyncpg.Record) -> bool:
        """Deleted or cancelled since the revision started: no more rendering (a user's
        decision stops optional work at once)."""
        return stopped_since(await self.asset_row(asset_id), revision)

    async def check_revision(
        self,
        asset_id: uuid.UUID,
        revision: int,
        asked: set[str] | None = None,
        here: InJobPublish | None = None,
    ) -> None:
        """After an output is recorded or failed: a FAILED required output fails a building
        revision and its asset; a complete required set goes to moderation (then publish);
        a published revision whose outputs are all done goes to enrichment. ``asked``: the
        jobs this run already enqueued (a render checks more than once), not asked again.
        ``here``: the render job that checks, with its worker's publish stage: a publish or
        an enrichment the check calls for runs in it (``publish.InJobPublish``)."""
        asked = set() if asked is None else asked
        state = await self._outputs_state(asset_id, revision, here)
        if state is None:
            return
        revision_status, tenant_id, required, status, verdict, loaded = state
        if revision_status == "READY":
            if all(value != "PENDING" for value in status.values()):
                await enrich_now_or_later(
                    self.services.pool,
                    self.services.queue,
                    asset_id,
                    revision,
                    tenant_id,
                    here,
                    loaded,
                )
            return
        if revision_status != "BUILDING":
            return
        if any(status.get(name) == "FAILED" for name in required):
            async with media_assets.connection(
                self.services.pool, "failing the revision", transaction=True
            ) as conn:
                try:
                    await transition(
                        conn,
                        Entity.REVISION,
                        (asset_id, revision),
                        expected="BUILDING",
                        new="FAILED",
                    )
                    asset = await media_assets.state(conn, asset_id)
                    # A failed rebuild of a published asset leaves the published revision.
                    if asset is not None and asset["status"] == "PROCESSING":
                        await transition(
                            conn,
                            Entity.ASSET,
                            (asset_id,),
                            expected="PROCESSING",
                            new="PROCESSING_FAILED",
                            values={
                                "last_error_class": "render_failed",
                                "last_error_detail": "a required output failed",
                            },
                        )
                        await self.compensate(conn, asset_id, "processing_failed")
                except StaleStateError:
                    return
            log.error("revision_failed", asset_id=str(asset_id), revision=revision)
            return
        # Moderation looks at the playback output: it starts as soon as that exists, in
        # parallel with the rest of the required set; not again once it has a verdict.
        if status.get("playback") == "SUCCEEDED" and verdict is None:
            await self.ask_moderation(asset_id, revision, tenant_id, asked)
        if verdict == "allow" and all(status.get(name) == "SUCCEEDED" for name in required):
            # Read after our own commit, as moderation reads after its own: whichever
            # finishes last sees both gates open and enqueues the publish (idempotent). A
            # verdict not yet allow here is moderation's to act on once it commits.
            await publish_when_ready(
                self.services.pool, self.services.queue, asset_id, revision, here, loaded
            )

    async def _outputs_state(
        self, asset_id: uuid.UUID, revision: int, here: InJobPublish | None
    ) -> tuple[str, int, set[str], dict[str, str], str | None, asyncpg.Record | None] | None:
        """The revision's status, tenant, required set, each output's status and verdict
        (None when it has no outputs). A job that publishes here reads what its publish or
        enrichment reads (``publishing.load``) and hands it on (``loaded``): one round trip
        for the check and the publish, not two."""
        if here is None:
            rows = await revision_rows.outputs_state(self.services.pool, asset_id, revision)
            if not rows:
                return None
            first = rows[0]
            status = {r["variant_type"]: r["status"] for r in rows}
            return (
                first["revision_status"],
                first["tenant_id"],
                set(first["required_outputs"]),
                status,
                first["moderation_verdict"],
                None,
            )
        loaded = await publishing.load(self.services.pool, asset_id, revision)
        if loaded is None or loaded["revision_row"] is None or not loaded["variant_rows"]:
            return None
        row = loaded["revision_row"]
        status = {v["variant_type"]: v["status"] for v in loaded["variant_rows"]}
        return (
            row["status"],
            loaded["tenant_id"],
            set(row["required_outputs"]),
            status,
            row["moderation_verdict"],
            loaded,
        )

    async def ask_moderation(
        self, asset_id: uuid.UUID, revision: int, tenant_id: int, asked: set[str]
    ) -> None:
        """The revision's moderation job, once per run (its key makes it once anyway)."""
        if "moderate" in asked:
            return
        async with media_assets.connection(self.services.pool, "enqueuing the moderation") as conn:
            await self.services.queue.enqueue_one(
                conn, moderate_spec(asset_id, revision, tenant_id)
            )
        asked.add("moderate")

    async def mark_failed(
        self, asset_id: uuid.UUID, revision: int, variant_type: str, detail: str
    ) -> None:
        """This job's own output is out of retries: FAILED, and the revision re-checked."""
        await asset_variants.fail_one(
            self.services.pool, asset_id, revision, variant_type, {"error": detail[:1000]}
        )
        log.error(
            "variant_failed",
            asset_id=str(asset_id),
            revision=revision,
            variant_type=variant_type,
            detail=detail[:300],
        )
        await self.check_revision(asset_id, revision)

    async def stop_outputs(self, asset_id: uuid.UUID, revision: int) -> None:
        """Deleted or cancelled since the revision started: its outputs still PENDING will
        not be made (the user stopped the asset), so they are FAILED, not left pending forever. (A
        published revision's pending outputs keep its whole prefix from garbage collection;
        once none is pending, the files a stopped run uploaded without recording go.)"""
        stopped = await asset_variants.fail_revision(
            self.services.pool,
            asset_id,
            revision,
            {"error": "stopped: the asset was deleted or cancelled"},
        )
        if stopped:
            log.info(
                "outputs_stopped",
                asset_id=str(asset_id),
                revision=revision,
                outputs=sorted(stopped),
            )

    async def compensate(self, conn: Any, asset_id: uuid.UUID, reason: str) -> None:
        """The platform failed after the provider succeeded: the ledger's compensation (by
        policy, once per provider task), in the caller's transaction."""
        row = await media_assets.provider_charge(conn, asset_id)
        if row is None:
            return  # an upload: no provider charge to compensate
        await ledger.record_compensation(
            conn,
            cfg=self.services.config.ledger,
            tenant_id=row["tenant_id"],
            provider=row["provider"],
            provider_task_id=row["provider_task_id"],
            reason=reason,
            asset_id=asset_id,
        )

    def render_specs(
        self,
        asset: asyncpg.Record,
        revision: int,
        plan: Plan,
        summary: MediaSummary,
        outputs: Sequence[str],
    ) -> list[JobSpec]:
        timeout = render_timeout(self.services.config, summary, plan)
        return [
            render_spec(asset["id"], asset["tenant_id"], revision, o, plan, timeout)
            for o in outputs
        ]


def will_retry(exc: AivedioError, job: Job) -> bool:
    """The queue's own decision for this failure (scheduling.decide_retry, one rule)."""
    return decide_retry(
        retry_class=exc.retry,
        attempts=job.attempts,
        max_attempts=job.max_attempts,
        base_seconds=1.0,
        max_seconds=1.0,
    ).retry


def render_spec(
    asset_id: uuid.UUID, tenant_id: int, revision: int, output: str, plan: Plan, timeout: float
) -> JobSpec:
    return jobs.render_spec(
        asset_id,
        tenant_id,
        revision,
        output,
        pipeline_version=plan.pipeline_version,
        required=output in plan.required,
        timeout=timeout,
    )


def render_timeout(config: Config, summary: MediaSummary, plan: Plan | None = None) -> float:
    """A render job's lease: three runs' budget (the encode pass, the packaging runs, the
    uploads) and, when ``plan`` has the AV1 ladder, the AV1 encode's extra time."""
    media = config.media
    per_run = media.process_timeout_seconds + media.process_timeout_per_media_second * max(
        summary.duration_seconds, 0.0
    )
    extra = av1.deadline_extra_seconds(media, summary.duration_seconds)
    return per_run * 3 + 120 + (extra if plan is not None and plan.av1_rungs else 0.0)


def stopped_since(row: asyncpg.Record | None, revision: asyncpg.Record | Mapping[str, Any]) -> bool:
    """Whether the asset (its row) was deleted or cancelled since the revision started."""
    return (
        row is None
        or row["status"] == "DELETED"
        or (
            row["delete_version"] != revision["delete_version_at_start"]
            or row["cancel_version"] != revision["cancel_version_at_start"]
        )
    )
