"""The fast path's enrichment, made in the probe job that published the required set.

Why. On the fast path the probe job made, moderated and published the required set; the
optional outputs (HLS ladder, proxy, sprites, waveform, keyframes) then waited for a render
job of their own: its claim, a read of the asset and its revision, a revision lock taken and
given back on a session of its own, a read of what is pending, the source downloaded back
from the store, and its acknowledgement: most of a dozen round trips and a second copy of
the source, for work the probe job could have started at once from the bytes in its
scratch directory.

What. When the moderator allowed the revision and there is no backlog pressure, the probe's
record (``ProbeStage.start_revision``) inserts the revision's render job held back
(``JobSpec.held_seconds``: waiting, announced to nobody) instead of queued, and the probe job
renders the pending outputs itself, from its ``MediaRun`` (the source and the playback are
on its scratch), uploads and verifies each, then records them and finishes the held job in
one statement fenced by the probe job's lease. The revision is then looked at again as a
render job would look at it (``Revisions.check_revision``), and the enrichment is published
in the job.

Guarantees. Nothing here is recorded unless the probe job still holds its lease. The held
job is the crash recovery: the reaper makes it due once the probe job's lease expired (its
worker died or stalled), the drain's release once it was given back, and at the latest it
comes back when its hold ends; then it renders whatever is still pending by its own rules.
The work here is bounded to end before the hold (and the probe job's deadline), and no
output is uploaded here but within the lease's time as last read (the rule of the fast
path's own stores, ``fast_path.fenced_deadline``), so the held job and this run never write
one revision's keys at once: no revision lock is taken. An output that fails here, a run
that cannot finish in time or an interrupted job wakes the held job at once.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from typing import Any

import anyio
import asyncpg

from aivedio.errors import AivedioError, LeaseLostError
from aivedio.logs import get_logger
from aivedio.pipeline import media_objects
from aivedio.pipeline.fast_path import fenced_deadline
from aivedio.pipeline.ffmpeg.media_run import MediaRun
from aivedio.pipeline.ffmpeg.outputs import OutputRecord
from aivedio.pipeline.media.plan import Plan
from aivedio.pipeline.media_seams import WorkerSeams
from aivedio.pipeline.revisions import Revisions
from aivedio.store import asset_variants, media_assets
from aivedio.store.objects import keys
from aivedio.store.queue import Job, lease_left_part, write_fenced
from aivedio.store.together import Part

log = get_logger("aivedio.media")

# The inline run must end this long before the held job comes back or the probe job's
# deadline passes (the statements after the run, clock rates).
MARGIN_SECONDS = 30.0
# Less time than this left to the probe job: the held job does the work instead.
MIN_BUDGET_SECONDS = 30.0


def hold_seconds(render_timeout_seconds: float) -> float:
    """How long the held render job waits before it comes back by itself: the render job's
    own time budget and the margin, so an inline run bounded by it has ended by then."""
    return render_timeout_seconds + 2 * MARGIN_SECONDS


class InlineEnrichment:
    """Renders, stores and records the outputs a fast-path revision still needs, in the probe
    job; finishes the held render job with them, or wakes it when it cannot."""

    def __init__(self, revisions: Revisions) -> None:
        self.revisions = revisions
        self.services = revisions.services
        # Until when (monotonic) the probe job's lease surely stays this delivery's.
        self._fenced_until = float("-inf")

    async def run(
        self,
        job: Job,
        run: MediaRun,
        asset: asyncpg.Record,
        revision: int,
        plan: Plan,
        pending: Sequence[str],
        held_key: str,
        seams: WorkerSeams,
        *,
        hold: float,
        fenced_until: float,
    ) -> dict[str, Any]:
        """The outcome for the probe job's result. ``pending``: the outputs the revision's
        record left PENDING (held for this job); ``hold``: the held job's hold, in seconds
        from the record. Interrupted (a drain, a lease lost, the database), the held job is
        woken on the way out: it does what is left now, not when its hold ends."""
        self._fenced_until = fenced_until
        try:
            return await self._run(job, run, asset, revision, plan, pending, held_key, seams, hold)
        except BaseException:
            await self._wake(held_key, asset["id"], revision, "interrupted")
            raise

    async def _run(
        self,
        job: Job,
        run: MediaRun,
        asset: asyncpg.Record,
        revision: int,
        plan: Plan,
        pending: Sequence[str],
        held_key: str,
        seams: WorkerSeams,
        hold: float,
    ) -> dict[str, Any]:
        asset_id: uuid.UUID = asset["id"]
        started = time.monotonic()
        deadline = anyio.current_effective_deadline() - anyio.current_time()
        budget = min(hold, deadline) - MARGIN_SECONDS
        if budget < MIN_BUDGET_SECONDS:
            await self._wake(held_key, asset_id, revision, "no time left")
            return {"enrichment": "left_to_render_job"}
        prefix = keys.revision_prefix(asset["tenant_id"], asset_id, revision)
        made: list[OutputRecord] = []

        lost: list[LeaseLostError] = []  # the run fails the node; the job is what ends

        async def store(record: OutputRecord) -> None:
            if lost:
                raise lost[0]
            if time.monotonic() >= self._fenced_until:
                try:
                    await self._check_lease(job)
                except LeaseLostError as exc:
                    lost.append(exc)
                    raise
            await media_objects.upload_and_verify(
                self.services.store, prefix, run.layout.out, record
            )
            made.append(record)

        run.on_done = store
        earlier = len(run.report.processes) if run.report is not None else 0
        if not plan.top.copy and run.layout.rung_video(plan.top).exists():
            # The playback's encode IS the top rung's (one x264 pass): the ladder takes it.
            run.encoded_rungs.add(plan.top.name)
        failed: list[str] = []
        try:
            with anyio.fail_after(budget):
                report = await run.run(wants=list(pending), plan=plan)
            failed = sorted(n.name for n in report.failed())
            if lost:
                raise lost[0]
        except LeaseLostError:
            raise  # this delivery is no longer the one: nothing more of it (woken below)
        except (AivedioError, TimeoutError, OSError) as exc:
            log.warning(
                "enrichment_left_to_render_job",
                asset_id=str(asset_id),
                revision=revision,
                error=str(exc)[:300],
            )
            failed = [name for name in pending if name not in {r.variant_type for r in made}]
        finally:
            run.on_done = None
        if seams.metrics is not None:
            seams.metrics.media_processed(
                plan.path,
                plan.mode,
                # This run's processes only: the probe counted the ones before.
                sum(p.wall_seconds for p in run.report.processes[earlier:]) if run.report else 0.0,
                plan.duration_seconds,
            )
        done = [r.variant_type for r in made]
        finish = not failed and set(done) >= set(pending)
        recorded = await self._record(job, asset_id, revision, made, prefix, held_key, finish)
        if not finish:
            # What is still pending is the held job's, now: it renders it with its rules.
            await self._wake(held_key, asset_id, revision, f"failed: {', '.join(failed)}")
        log.info(
            "enrichment_inline",
            asset_id=str(asset_id),
            revision=revision,
            done=sorted(recorded),
            failed=failed,
            seconds=round(time.monotonic() - started, 3),
            job_id=job.id,
        )
        # As a render job that recorded them: the enrichment is published here.
        await self.revisions.check_revision(asset_id, revision, here=seams.here(job))
        return {"enrichment": "inline", "enriched": sorted(recorded), "enrich_failed": failed}

    async def _record(
        self,
        job: Job,
        asset_id: uuid.UUID,
        revision: int,
        made: Sequence[OutputRecord],
        prefix: str,
        held_key: str,
        finish: bool,
    ) -> set[str]:
        """The outputs SUCCEEDED (a CAS on PENDING per row) and, when they are all of them,
        the held job finished with them: one statement, fenced by this job's lease."""
        parts: dict[str, Part] = {}
        if made:
            columns = media_objects.variant_columns(made, prefix)
            parts.update(asset_variants.succeed_parts(asset_id, revision, columns))
        if finish:
            result = {"outcome": "rendered_by_probe", "probe_job_id": job.id}
            parts.update(self.services.queue.finish_held_parts(held_key, result))
        if not parts:
            return set()
        async with media_assets.connection(self.services.pool, "recording outputs") as conn:
            got = await write_fenced(conn, job, parts, "recording the enrichment's outputs")
        return set(asset_variants.moved(got)) if made else set()

    async def _check_lease(self, job: Job) -> None:
        """That this delivery still holds the probe job's lease, and until when it surely
        will (``fast_path.fenced_deadline``): the held job cannot come back before then, so
        no render job writes these keys while this one does. As the fast path's stores: a
        delivery that lost its lease (it stalled, and the held job may be rendering) never
        writes its outputs; one within its lease's time needs no check per output."""
        sent = time.monotonic()
        parts = {"lease_left": lease_left_part(job)}
        async with media_assets.connection(self.services.pool, "checking the lease") as conn:
            got = await write_fenced(conn, job, parts, "checking the probe job's lease")
        self._fenced_until = fenced_deadline(sent, got["lease_left"])

    async def _wake(self, key: str, asset_id: uuid.UUID, revision: int, why: str) -> None:
        """The held job now, rather than when its hold ends (at worst it ends by itself)."""
        try:
            with anyio.CancelScope(shield=True), anyio.move_on_after(MARGIN_SECONDS):
                await self.services.queue.wake_held([key])
        except AivedioError as exc:
            log.warning(
                "held_render_not_woken",
                asset_id=str(asset_id),
                revision=revision,
                error=exc.detail[:300],
            )
            return
        log.info("held_render_woken", asset_id=str(asset_id), revision=revision, reason=why)
