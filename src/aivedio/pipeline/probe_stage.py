"""The ``probe`` job (one per asset) and ``reprocess`` (a new revision of a published asset).

``probe``: fetch the quarantined source into a scratch directory, check it against the
checksum recorded at fetch, run the verdict (sniff, probe, validate, decode check). Invalid
media moves the asset to INVALID_MEDIA with its reason codes and the job ends (never
retried). Valid media gets, in one statement: the media columns, the plan, a BUILDING
revision, one variant per output and ONE render job, for the first output still to make (a
chunked plan's split and audio jobs too, see ``chunk_stage``), keyed
``render:{asset}:{revision}:{variant_type}:v{pipeline_version}``. A probe out of retries for
a reason that is not the media's fault fails the asset (PROCESSING_FAILED) with the
ledger's compensation.

The fast path (``fast_path``; on by default, for every source too short to be chunked):
after the verdict, the probe job runs the decode check with the moderation frames (one
decode of the whole source) and, beside it, plans and makes the required set, and asks the
moderator as soon as the frames exist; the statement then records the made outputs
SUCCEEDED and the moderator's decision with the revision, its render job is the
enrichment's, and the probe job publishes. A delivery of the job that finds the asset
PROCESSING (an earlier one died or was drained after its statement) looks at the revision
again.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any

import anyio
import asyncpg
import msgspec

from aivedio.config.media import MediaConfig
from aivedio.errors import AivedioError, DeferredError, StaleStateError
from aivedio.logs import get_logger
from aivedio.pipeline import chunk_pieces, media_objects
from aivedio.pipeline.fast_path import FastPath, Made, Phases, fenced_deadline
from aivedio.pipeline.ffmpeg.media_run import MediaRun
from aivedio.pipeline.ffmpeg.outputs import MIME, PRIMARY, OutputRecord
from aivedio.pipeline.ffmpeg.verdict import verdict_json
from aivedio.pipeline.inline_enrichment import InlineEnrichment, hold_seconds
from aivedio.pipeline.jobs import moderate_spec
from aivedio.pipeline.media import av1
from aivedio.pipeline.media.plan import Plan
from aivedio.pipeline.media.validate import MediaSummary
from aivedio.pipeline.media_poison import PoisonGuard
from aivedio.pipeline.media_seams import NO_SEAMS, WorkerSeams
from aivedio.pipeline.moderation import Decision
from aivedio.pipeline.publish import publish_when_ready
from aivedio.pipeline.revisions import Revisions, render_spec, render_timeout, will_retry
from aivedio.pipeline.upkeep.lifecycle import retire_if_cancelled
from aivedio.states import Entity
from aivedio.store import asset_variants, media_assets, outbox, revision_rows
from aivedio.store.objects import keys
from aivedio.store.queue import Job, JobSpec, lease_left_part, write_fenced
from aivedio.store.records import stale, transition, transition_part
from aivedio.store.together import Part, write_together

log = get_logger("aivedio.media")


class ProbeStage:
    """The probe and reprocess jobs: from a stored source to a BUILDING revision with its
    first jobs (or to INVALID_MEDIA). On the fast path it also has the required set made and
    the moderator asked (``FastPath``, which records nothing), records them with the
    revision and publishes it through the worker's publish stage; otherwise it never renders
    an output and never publishes. It never renders an optional output."""

    def __init__(self, revisions: Revisions, poison: PoisonGuard) -> None:
        self.revisions = revisions
        self.poison = poison
        self.services = revisions.services

    async def probe(self, job: Job, seams: WorkerSeams = NO_SEAMS) -> dict[str, Any]:
        asset_id = uuid.UUID(str(job.payload["asset_id"]))
        asset = await self.revisions.asset(asset_id)
        if asset["status"] not in ("QUARANTINED", "PROBING"):
            if asset["status"] == "PROCESSING":
                # An earlier delivery may have recorded its revision (the fast path's), then
                # died or been drained before acting on its verdict: the revision is looked
                # at again (moderation asked for if it has none, the publish if both gates
                # are open). Idempotent, so every such delivery does it.
                revision = int(asset["next_revision"]) - 1
                await self.revisions.check_revision(asset_id, revision, here=seams.here(job))
            return {"outcome": "already_probed", "status": asset["status"]}
        retain_days = self.services.config.moderation.reject_retention_days
        cancelled = asset["task_status"] == "CANCELLED"  # checked again under its lock
        if cancelled and await retire_if_cancelled(
            self.services.pool, asset_id, retain_days=retain_days
        ):
            return {"outcome": "cancelled", "source_retained": True}
        fenced_until = float("-inf")
        if asset["status"] == "QUARANTINED":
            fenced_until = await self._start_probing(job, asset_id)
        try:
            await self.poison.refuse_poison(job, asset_id, seams, known=asset["media_crashes"])
            return await self._probe(job, asset, seams, fenced_until)
        except DeferredError:
            raise
        except AivedioError as exc:
            # Out of retries (the queue's own rule): the asset must not wait in PROBING.
            if not will_retry(exc, job):
                with anyio.CancelScope(shield=True):
                    await self._probe_failed(asset_id, exc)
            raise

    async def _start_probing(self, job: Job, asset_id: uuid.UUID) -> float:
        """QUARANTINED → PROBING (another delivery of this job may have moved it first:
        PROBING either way), the job's lease checked in the same statement: until when
        (monotonic) this delivery surely holds its lease with the asset in PROBING, so that
        the fast path's stores before then need no check of their own (``FastPath``)."""
        sent = time.monotonic()
        parts = {
            "move": transition_part(
                Entity.ASSET, (asset_id,), expected="QUARANTINED", new="PROBING"
            ),
            "probing": media_assets.still_probing_part(asset_id),
            "lease_left": lease_left_part(job),
        }
        async with media_assets.connection(self.services.pool, "starting the probe") as conn:
            got = await write_fenced(conn, job, parts, "starting the probe")
        if not (got["move"] or got["probing"]):
            return float("-inf")
        return fenced_deadline(sent, got["lease_left"])

    async def _probe_failed(self, asset_id: uuid.UUID, exc: AivedioError) -> None:
        async with media_assets.connection(
            self.services.pool, "failing the probe", transaction=True
        ) as conn:
            try:
                await transition(
                    conn,
                    Entity.ASSET,
                    (asset_id,),
                    expected="PROBING",
                    new="PROCESSING_FAILED",
                    values={
                        "last_error_class": exc.error_class,
                        "last_error_detail": exc.detail[:1000],
                    },
                )
            except StaleStateError:
                return
            await self.revisions.compensate(conn, asset_id, f"probe_failed:{exc.error_class}")
        log.error(
            "probe_failed",
            asset_id=str(asset_id),
            error_class=exc.error_class,
            detail=exc.detail[:300],
        )

    async def _probe(
        self, job: Job, asset: asyncpg.Record, seams: WorkerSeams, fenced_until: float
    ) -> dict[str, Any]:
        asset_id: uuid.UUID = asset["id"]
        media = self.services.config.media
        phases = Phases()
        fast = media.fast_path and seams.moderation is not None and seams.publisher is not None
        with self.services.sandbox.scratch() as root:
            started = time.monotonic()
            source = root / "source.bin"
            await media_objects.download_source(self.services.store, asset, source)
            phases.add("source", started)
            started = time.monotonic()
            run = self.services.equip(MediaRun(self.services.sandbox, source, root), asset)
            run.normalize = normalizes(media, asset)
            run.av1 = av1.wanted(media, asset["tenant_name"])
            # A crash in the verdict itself is the verdict (INVALID_MEDIA, decoder_crashed);
            # one in the keyframe scans after it fails the attempt and counts as a crash.
            # The fast path's decode check runs with its frames, beside the render.
            async with self.poison.watch_crashes(job, asset_id, run, seams):
                report = await run.inspect(decode=not fast)
                phases.add("probe", started)
                if report.verdict.valid and fast and _may_chunk(media, report.verdict.media):
                    fast = False
                    started = time.monotonic()
                    await run.check_decode()  # the queue path's check, deferred above
                    phases.add("decode_check", started)
                if report.verdict.valid and not fast:
                    report = await run.run(plan_only=True)
            if not report.verdict.valid:
                return await self._invalid(asset_id, verdict_json(report.verdict))
            assert report.verdict.media is not None
            if not fast:
                assert report.plan is not None
                return await self.start_revision(
                    asset,
                    report.verdict.media,
                    report.plan,
                    verdict_json(report.verdict),
                    job,
                    media.pipeline_version,
                )
            assert seams.moderation is not None
            revision = int(asset["next_revision"])
            async with self.poison.watch_crashes(job, asset_id, run, seams):
                fast_path = FastPath(self.services, seams.moderation, fenced_until=fenced_until)
                made = await fast_path.make(
                    job, run, asset, revision, phases, ask=self._moderates_here()
                )
            verdict = verdict_json(made.verdict)
            if not made.verdict.valid:
                return await self._invalid(asset_id, verdict)
            assert made.plan is not None and made.verdict.media is not None
            if seams.metrics is not None and run.report is not None:
                seams.metrics.media_processed(
                    made.plan.path,
                    made.plan.mode,
                    sum(p.wall_seconds for p in run.report.processes),
                    made.plan.duration_seconds,
                )
            hold = await self._inline_hold(made, seams)
            started = time.monotonic()
            result = await self.start_revision(
                asset,
                made.verdict.media,
                made.plan,
                verdict,
                job,
                media.pipeline_version,
                made=made.outputs,
                decision=made.decision,
                hold=hold,
            )
            phases.add("record", started)
            started = time.monotonic()
            held = result.pop("held", None)
            await self._after_fast(job, asset, revision, made, seams, follows=held is not None)
            phases.add("publish" if _allowed(made.decision) else "verdict", started)
            if held is not None:
                # The enrichment from the same scratch, its render job held meanwhile.
                started = time.monotonic()
                pending, key = held
                enrichment = InlineEnrichment(self.revisions)
                result.update(
                    await enrichment.run(
                        job,
                        run,
                        asset,
                        revision,
                        made.plan,
                        pending,
                        key,
                        seams,
                        hold=hold,
                        fenced_until=fast_path.fenced_until,
                    )
                )
                phases.add("enrichment", started)
        result.update(
            fast_path=True,
            made=[r.variant_type for r in made.outputs],
            failed=made.failed,
            decision=made.decision.decision if made.decision else None,
            frames=made.frames,
            phases=phases.as_result(),
            # The sandboxed processes the job ran, in order: what its time was spent on.
            processes=[p.step for p in run.report.processes] if run.report else [],
        )
        if made.unavailable:
            result["moderation_unavailable"] = made.unavailable[:300]
        return result

    async def _inline_hold(self, made: Made, seams: WorkerSeams) -> float:
        """How long the revision's render job is held while this job makes the enrichment
        (``inline_enrichment``); 0: it is queued as ever. Only for an allowed revision with
        its required set made, no other media job waiting for a slot (under a burst the next
        probes, which make assets playable, go first), no AV1 (the render job's own budget)
        and no backlog pressure (the optional outputs wait for the queue: ``render_stage``)."""
        if not self.services.config.media.enrich_in_probe or not _allowed(made.decision):
            return 0.0
        plan, summary = made.plan, made.verdict.media
        if made.failed or not plan or not summary or plan.chunking is not None or plan.av1_rungs:
            return 0.0
        if not seams.nothing_waiting() or await seams.deferring():
            return 0.0
        return hold_seconds(render_timeout(self.services.config, summary, plan))

    def _moderates_here(self) -> bool:
        """Whether this worker runs the control lane, where moderate jobs run: only then
        does its probe ask the moderator. A media-only node (``slots = 0`` for the other
        lanes) needs no egress beyond PostgreSQL and the object store, fast path or not."""
        lane = self.services.config.worker.lanes.get("control")
        return lane is not None and lane.slots > 0

    async def _after_fast(
        self,
        job: Job,
        asset: asyncpg.Record,
        revision: int,
        made: Made,
        seams: WorkerSeams,
        *,
        follows: bool = False,
    ) -> None:
        """After the fast path's record, which stored the decision in hand with the
        revision: an allow publishes in this job once the required set is complete (else
        the render that completes it does); a reject ends the revision and the asset as the
        moderate job would (that job, made with the revision, finishes it should this one
        die first); a review waits for a person; no decision leaves the moderate job to
        ask again."""
        asset_id: uuid.UUID = asset["id"]
        decision = made.decision
        if decision is None:
            return
        log.info(
            "moderation_verdict",
            asset_id=str(asset_id),
            revision=revision,
            decision=decision.decision,
            reasons=decision.reasons,
            version=decision.version,
            fast_path=True,
        )
        if _allowed(decision):
            here = seams.here(job)
            if here is not None and not made.failed:
                # Both gates were opened by this job's own statement: no need to read them
                # back (the publish checks everything again under its lock).
                if await here.run(asset_id, revision, enrichment_follows=follows):
                    return
                here = None  # it could not publish now: the publish job does
            await publish_when_ready(
                self.services.pool, self.services.queue, asset_id, revision, here
            )
            return
        if decision.decision == "reject":
            assert seams.moderation is not None
            await seams.moderation.finish_reject(
                asset_id, revision, asset["tenant_id"], list(decision.reasons)
            )

    async def reprocess(self, job: Job, seams: WorkerSeams = NO_SEAMS) -> dict[str, Any]:
        """A new revision from the retained source under the current pipeline version; the
        published revision serves until the new one is published. Nothing is re-fetched."""
        asset_id = uuid.UUID(str(job.payload["asset_id"]))
        asset = await self.revisions.asset(asset_id)
        if asset["status"] not in ("PLAYABLE", "ENRICHED"):
            return {"outcome": "not_published", "status": asset["status"]}
        building = await revision_rows.building_rebuild(
            self.services.pool, asset_id, asset["current_revision"]
        )
        if building is not None:
            return {"outcome": "already_building", "revision": building}
        await self.poison.refuse_poison(job, asset_id, seams)
        with self.services.sandbox.scratch() as root:
            source = root / "source.bin"
            await media_objects.download_source(self.services.store, asset, source)
            run = self.services.equip(MediaRun(self.services.sandbox, source, root), asset)
            run.normalize = normalizes(self.services.config.media, asset)
            run.av1 = av1.wanted(self.services.config.media, asset["tenant_name"])
            async with self.poison.watch_crashes(job, asset_id, run, seams):
                report = await run.run(plan_only=True)
            verdict = verdict_json(report.verdict)
            if not report.verdict.valid or report.plan is None:
                log.warning(
                    "reprocess_source_invalid", asset_id=str(asset_id), reasons=verdict["reasons"]
                )
                return {"outcome": "invalid_media", "reasons": verdict["reasons"]}
            assert report.verdict.media is not None
            return await self.start_revision(
                asset,
                report.verdict.media,
                report.plan,
                verdict,
                job,
                self.services.config.media.pipeline_version,
                reprocess=True,
            )

    async def _invalid(self, asset_id: uuid.UUID, verdict: dict[str, Any]) -> dict[str, Any]:
        detail = ", ".join(verdict["reasons"]) + (
            f" ({verdict['detail']})" if verdict.get("detail") else ""
        )
        async with media_assets.connection(
            self.services.pool, "recording invalid media", transaction=True
        ) as conn:
            tenant_id = await media_assets.tenant_of(conn, asset_id)
            await outbox.emit(
                conn,
                "asset.invalid",
                tenant_id=tenant_id,
                aggregate_id=asset_id,
                payload={"asset_id": str(asset_id), "reasons": verdict["reasons"]},
            )
            await transition(
                conn,
                Entity.ASSET,
                (asset_id,),
                expected="PROBING",
                new="INVALID_MEDIA",
                values={
                    "probe": verdict,
                    "last_error_class": "invalid_media",
                    "last_error_detail": detail[:1000],
                    **provenance_columns(verdict),
                },
            )
        log.warning("asset_invalid_media", asset_id=str(asset_id), reasons=verdict["reasons"])
        return {
            "outcome": "invalid_media",
            "reasons": verdict["reasons"],
            "network_isolated": verdict["network_isolated"],
        }

    async def start_revision(
        self,
        asset: asyncpg.Record,
        summary: MediaSummary,
        plan: Plan,
        verdict: dict[str, Any],
        job: Job,
        pipeline_version: int,
        *,
        reprocess: bool = False,
        made: Sequence[OutputRecord] = (),
        decision: Decision | None = None,
        hold: float = 0.0,
    ) -> dict[str, Any]:
        """The asset PROCESSING (a rebuild: its probe refreshed), a BUILDING revision, a
        variant per output and the jobs that make the rest, in one statement. ``made``:
        outputs the fast path made, uploaded and verified (SUCCEEDED at once); ``decision``:
        its moderator's (an allow is stored with the revision; anything else, or none, with
        the playback made, leaves the moderate job to ask by its rules)."""
        asset_id: uuid.UUID = asset["id"]
        tenant_id: int = asset["tenant_id"]
        num, den = _rate_fraction(summary.frame_rate)
        # A new asset's first revision: the number read with the asset (``asset_row``; the
        # move out of PROBING below makes one run the one). A rebuild reads it now: an
        # enrichment may have taken the next number while its source was probed.
        revision = int(asset["next_revision"])
        if reprocess:
            revision = await revision_rows.next_number(self.services.pool, asset_id)
        prefix = keys.revision_prefix(tenant_id, asset_id, revision)
        outputs = plan.outputs
        parts: dict[str, Part] = {}
        statuses = {"allow": "ALLOWED", "reject": "REJECTED", "review": "REVIEW"}
        if reprocess:
            # A published asset keeps serving its current revision until the new one is
            # published; only the probe result is refreshed.
            parts["asset"] = media_assets.refresh_probe_part(asset_id, verdict)
        else:
            parts["asset"] = transition_part(
                Entity.ASSET,
                (asset_id,),
                expected="PROBING",
                new="PROCESSING",
                values={
                    "probe": verdict,
                    "media_type": "video",
                    "duration_us": int(summary.duration_seconds * 1_000_000),
                    "width": summary.display_width,
                    "height": summary.display_height,
                    "video_codec": summary.video_codec,
                    "audio_codec": summary.audio_codec,
                    "frame_rate_num": num,
                    "frame_rate_den": den,
                    "last_error_class": None,
                    "last_error_detail": None,
                    **provenance_columns(verdict),
                    **({"moderation_status": statuses[decision.decision]} if decision else {}),
                },
            )
        # Everything below is written only when the asset's move (``asset``) won: this is one
        # statement, with no transaction to roll back.
        won = revision_rows.wrote("asset")
        parts["revision"] = revision_rows.insert_part(
            asset_id,
            revision,
            pipeline_version,
            plan.required,
            plan.optional,
            msgspec.to_builtins(plan),
            asset["delete_version"],
            asset["cancel_version"],
            when=won,
            verdict=(
                (decision.decision, decision.version, list(decision.reasons)) if decision else None
            ),
        )
        done = {r.variant_type for r in made}
        todo = [o for o in outputs if o not in done]
        parts["outputs"] = asset_variants.insert_pending_part(
            asset_id,
            revision,
            todo,
            [f"{prefix}/{_primary(o, plan)}" for o in todo],
            [MIME.get(Path(_primary(o, plan)).suffix, "application/octet-stream") for o in todo],
            when=won,
        )
        if made:
            parts["made"] = asset_variants.insert_made_part(
                asset_id, revision, media_objects.variant_columns(made, prefix), when=won
            )
        specs: list[JobSpec] = []
        by_chunks = chunk_pieces.chunk_outputs(plan)
        if by_chunks:
            media = self.services.config.media
            parts["pieces"], chunk_specs = chunk_pieces.start(
                asset_id,
                tenant_id,
                revision,
                plan,
                media.process_timeout_seconds,
                media.process_timeout_per_media_second,
                when=won,
            )
            specs += chunk_specs
        # One render job, for the first output the chunk jobs do not make: its first run
        # renders every pending output in one DAG run. An output it fails gets a job of its
        # own then, the outputs it puts off one together (``_spawn``), and a job that finds
        # its output made spawns jobs for the rest (``_spawn_rest``): no output ever waits
        # without a job that will make it.
        lead = [o for o in todo if o not in by_chunks][:1]
        timeout = render_timeout(self.services.config, summary, plan)
        lead_specs = [render_spec(asset_id, tenant_id, revision, o, plan, timeout) for o in lead]
        if hold > 0:  # made by this job meanwhile (``inline_enrichment``)
            lead_specs = [
                msgspec.structs.replace(s, held_seconds=hold, held_by=job.id) for s in lead_specs
            ]
        specs += lead_specs
        if "playback" in done and (decision is None or decision.decision == "reject"):
            # Moderation starts once the playback exists: a render that records it asks; the
            # playback made here with no decision in hand (the moderator was unavailable, or
            # not asked on this node), this statement does. A decision in hand is stored
            # with the revision; a reject is acted on right after (``_after_fast``), and
            # this job, which finds it stored, finishes it if this one dies first.
            specs.append(moderate_spec(asset_id, revision, tenant_id))
        jobs = self.services.queue.enqueuing(specs, name="jobs", when=won)
        if jobs is not None:
            parts.update(jobs.parts)
        # The asset's move, the revision, its outputs and jobs: one statement.
        async with media_assets.connection(self.services.pool, "starting a revision") as conn:
            got = await write_together(conn, parts, "starting a revision")
        created = jobs.made(got) if jobs is not None else {}
        if not got["asset"] and reprocess:
            raise StaleStateError(f"asset {asset_id} disappeared")
        if not got["asset"]:
            raise stale(Entity.ASSET, (asset_id,), expected="PROBING", new="PROCESSING")
        log.info(
            "revision_building",
            asset_id=str(asset_id),
            revision=revision,
            mode=plan.mode,
            path=plan.path,
            outputs=plan.outputs,
            job_id=job.id,
        )
        held = [s.idempotency_key for s in lead_specs if s.held_seconds]
        answer: dict[str, Any] = {}
        if held and held[0] in created:  # (pending outputs, the held job's key)
            answer["held"] = ([o for o in todo if o not in by_chunks], held[0])
        return answer | {
            "outcome": "processing",
            "revision": revision,
            "plan": plan.mode,
            "path": plan.path,
            "network_isolated": verdict["network_isolated"],
        }


def normalizes(media: MediaConfig, asset: asyncpg.Record) -> bool:
    """Whether the asset's tenant has its audio normalized (``[media.loudness]``: on, and
    the tenant not among ``off_tenants``)."""
    loudness = media.loudness
    return loudness.normalize and asset["tenant_name"] not in loudness.off_tenants


def provenance_columns(verdict: dict[str, Any]) -> dict[str, Any]:
    """The asset's provenance columns from a verdict (none when the store was not read)."""
    found = verdict.get("provenance")
    if found is None:
        return {}
    return {"provenance": found, "provenance_state": found["state"]}


def _primary(output: str, plan: Plan) -> str:
    return PRIMARY[output].format(zoom=plan.waveform_zooms[0])


def _rate_fraction(rate: float) -> tuple[int | None, int | None]:
    if rate <= 0:
        return None, None
    fraction = Fraction(rate).limit_denominator(1001)
    return fraction.numerator, fraction.denominator


def _allowed(decision: Decision | None) -> bool:
    return decision is not None and decision.decision == "allow"


def _may_chunk(media: MediaConfig, summary: MediaSummary | None) -> bool:
    """A source long enough that its plan may spread its encode over the fleet (chunks):
    the queue path, with the configured decode check (a whole decode of a long source is
    not what its first output should wait for)."""
    duration = summary.duration_seconds if summary is not None else 0.0
    return 0 < media.chunk_threshold_seconds < duration
