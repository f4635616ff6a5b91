"""The probe job's fast path: a stored source's required set, decode check and moderation
in one job, from the bytes already in its scratch directory.

Why. Through the queue alone an asset took four jobs before it played: the probe (ffprobe,
a sampled decode check, the plan), a render (the required set), a moderate job (the
playback downloaded back and decoded again for its frames, then the moderator) and the
publish, each starting when the one before had ended. For an eight-second clip that one
copy and one JPEG make playable, the waits and the decodes that repeated each other were
most of the five seconds to PLAYABLE.

What. When the worker has a moderation stage and a publish stage, ``[media] fast_path`` is
on and the source is too short to be chunked, the probe job goes on after its verdict with
two things at once:

* the frames pass (``ffmpeg/frames.py``): ONE decode of the whole source, which is the
  decode check (``-xerror``: a full check, stronger than the sampled one; the scene frames
  need every frame decoded anyway) and makes the moderation frames; the moderator is asked
  as soon as they exist, so its latency overlaps the render;
* the plan, then the required set (``MediaRun``): the copy and the poster of a remux, or the
  playback rendition and the poster from one decode of a transcode; uploaded under the
  revision prefix and read back (size, SHA-256) once this delivery has checked that it
  still holds the job's lease and the asset is still PROBING.

A transcode decodes the whole source for its playback anyway: there the frames and the
decode check ride along that encode pass (``frames_rider``, under ``-xerror``) instead of a
pass of their own decoding the source a second time on the same two cores. Should no such
pass run (a chunked plan) or it fail, the frames pass runs after it, and the render stores
nothing before that pass's verdict.

Guarantees. A failed decode check cancels the render and the asset is INVALID_MEDIA; no
frame of it reaches the moderator; nothing is recorded, so nothing can be published. The
moderator's decision in hand is stored with the revision; only an allow opens the gate, a
reject is acted on (and finished by the moderate job made with the revision should the probe
die first), a review waits for a person, and no decision (unavailable, a still missing)
leaves the moderate job, whose fail-closed rules then apply. A worker that does not run the
control lane (a media-only node, which needs no egress beyond PostgreSQL and the object
store) never asks: its moderate job does. Every object is verified before its row says
SUCCEEDED. The record is one statement (``ProbeStage.start_revision``) whose
compare-and-set on the asset makes one delivery the one, so a crash before it leaves the
asset in PROBING for the job's retry, which starts over (objects it uploaded are overwritten
by that retry or collected by the sweeper's GC), and a crash after it leaves a revision the
render job of the enrichment, or the probe job's next delivery, moves on.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import asyncpg
import msgspec

from aivedio.errors import AivedioError, DatabaseError, InvalidMediaError, StaleStateError
from aivedio.logs import get_logger
from aivedio.pipeline import media_objects
from aivedio.pipeline.ffmpeg.frames import (
    STILLS,
    Frame,
    PosterShot,
    frames_rider,
    read_loudness,
    rider_frames,
)
from aivedio.pipeline.ffmpeg.frames_halves import source_pass
from aivedio.pipeline.ffmpeg.media_run import MediaRun
from aivedio.pipeline.ffmpeg.outputs import OutputRecord
from aivedio.pipeline.ffmpeg.sandbox import RunResult
from aivedio.pipeline.ffmpeg.verdict import Verdict, decode_failed
from aivedio.pipeline.media.loudness import Loudness
from aivedio.pipeline.media.plan import Plan, poster_seconds, transcode_reasons, with_loudness
from aivedio.pipeline.media.validate import MediaSummary
from aivedio.pipeline.media_seams import MediaServices
from aivedio.pipeline.moderation import (
    Decision,
    ModerationStage,
    ModeratorUnavailableError,
    Request,
)
from aivedio.store import media_assets
from aivedio.store.objects import keys
from aivedio.store.queue import Job, lease_left_part, write_fenced

log = get_logger("aivedio.media")

# The decode check the frames pass amounts to (a whole decode under -xerror).
FULL = "full"
# Stores of one job within its lease as read by the last check need no check of their own;
# this much of what was left is not relied on (the statement's own time, clock rates).
LEASE_MARGIN_SECONDS = 5.0


def fenced_deadline(sent: float, lease_left: float | None) -> float:
    """Until when (monotonic) a lease whose time left was read by a statement sent at
    ``sent`` surely stays this delivery's (``LEASE_MARGIN_SECONDS`` not relied on)."""
    return sent + float(lease_left or 0.0) - LEASE_MARGIN_SECONDS


@dataclass
class Phases:
    """Each phase of the fast path: its start (seconds after the job's own start) and
    length, for the job's result and the status timeline."""

    origin: float = field(default_factory=time.monotonic)
    done: dict[str, tuple[float, float]] = field(default_factory=dict)

    def add(self, name: str, started: float) -> None:
        now = time.monotonic()
        self.done[name] = (round(started - self.origin, 4), round(now - started, 4))

    def as_result(self) -> list[dict[str, Any]]:
        return [
            {"phase": name, "at_seconds": at, "seconds": seconds}
            for name, (at, seconds) in sorted(self.done.items(), key=lambda kv: kv[1][0])
        ]


@dataclass
class Made:
    """What the fast path made: the verdict with its decode check run (invalid when it
    failed), the plan, the required outputs uploaded and verified, the required outputs
    that failed, and the moderator's decision (None when it gave none: ``unavailable``
    says why)."""

    verdict: Verdict
    plan: Plan | None  # None when the verdict is invalid
    outputs: list[OutputRecord]
    failed: list[str]
    decision: Decision | None
    unavailable: str = ""
    frames: int = 0


class FastPath:
    """Runs the frames pass and the required set at once; records nothing (the probe
    stage records what it made, ``ProbeStage.start_revision``)."""

    def __init__(
        self,
        services: MediaServices,
        moderation: ModerationStage,
        *,
        fenced_until: float = float("-inf"),
    ) -> None:
        self.services = services
        self.moderation = moderation
        # Until when (monotonic) this delivery is known to hold its lease, the asset having
        # been in PROBING: the last check's answer (``_check``), or the probe's move to
        # PROBING, which checks the lease with it.
        self._fenced_until = fenced_until

    async def make(
        self,
        job: Job,
        run: MediaRun,
        asset: asyncpg.Record,
        revision: int,
        phases: Phases,
        *,
        ask: bool = True,
    ) -> Made:
        """``run``: inspected, its decode check deferred. The frames pass starts at once;
        the plan (the source's keyframe scans) and then the required set beside it.
        ``ask=False``: the moderator is not asked here (a media-only node talks to nothing
        but PostgreSQL and the object store); the moderate job asks."""
        report = run.report
        assert report is not None and report.verdict.media is not None
        summary = report.verdict.media
        finalized: list[OutputRecord] = []
        stored: list[OutputRecord] = []
        errors: list[Exception] = []
        plans: list[Plan] = []
        scope = anyio.CancelScope()

        async def collect(record: OutputRecord) -> None:
            finalized.append(record)

        scratch = run.layout.root / "frames"
        poster = self._poster_shot(summary, scratch)
        framed = anyio.Event()
        measured: list[Loudness] = []
        # Normalizing: measured before the render (below); otherwise the frames pass's own
        # audio decode measures it, for the record (the audio is published as it is).
        normalizing = run.normalizes_audio(summary)
        checking = self.services.config.media.decode_check != "none"
        measure = summary.audio_stream_index is not None and not normalizing
        # A transcode decodes the source for its playback anyway: the stills and the decode
        # check ride along that decode (``frames_rider``) instead of a pass of their own
        # that would decode it a second time beside it. Should the plan make no such pass
        # after all (a chunked plan), or that pass fail, the frames pass runs after it.
        rides = self._rides(summary)
        rendered = anyio.Event()
        if rides:
            scratch.mkdir(parents=True, exist_ok=True)
            run.rider = frames_rider(
                summary,
                self.moderation.config,
                scratch,
                run.layout.work,
                check=checking,
                measure=measure,
            )

        async def render() -> None:
            started = time.monotonic()
            try:
                # A plan that normalizes the audio is made with its loudness, measured by an
                # audio-only pass first (0.1 s for 8 s of AAC, beside the frames pass that
                # PLAYABLE waits for anyway), so the playback is made once, normalized.
                # Measured by the frames pass instead, a loud remux's playback was made
                # again after that pass, on the path to PLAYABLE (0.26-0.39 s per output).
                planned = await run.run(plan_only=True, measure=normalizing)
                plan = planned.plan
                assert plan is not None
                plans.append(plan)
                phases.add("plan", started)
                started = time.monotonic()
                # A chunked plan spreads its encode over the fleet: nothing made here.
                wants = plan.required if plan.chunking is None else []
                # A remux's poster comes from the frames pass: not a second decode here.
                adopt = poster is not None and plan.mode == "remux" and "poster" in wants
                await run.run(wants=[w for w in wants if not (adopt and w == "poster")], plan=plan)
                run.rider = None  # taken by that pass, or by none: never by a later run
                rendered.set()
                if rides and not run.rider_ran:
                    await framed.wait()  # nothing of a source that may not decode is stored
                stored.extend(await self._store(job, run, asset, revision, finalized))
                phases.add("render", started)
                if adopt and poster is not None:
                    await framed.wait()
                    started = time.monotonic()
                    finalized.clear()
                    await run.adopt("poster", poster.path, plan)
                    stored.extend(await self._store(job, run, asset, revision, finalized))
                    phases.add("poster", started)
                if plan.audio != "none" and plan.chunking is None:
                    await framed.wait()
                    started = time.monotonic()
                    if await self._loudness(job, run, asset, revision, measured, finalized, stored):
                        phases.add("loudness", started)
            except Exception as exc:  # re-raised after the group, as itself
                errors.append(exc)
                scope.cancel()

        run.on_done = collect
        verdict = report.verdict
        decision: Decision | None = None
        unavailable = ""
        frames: list[Frame] = []
        runs: list[RunResult] = []
        with scope:
            async with anyio.create_task_group() as group:
                group.start_soon(render)
                started = time.monotonic()
                try:
                    scratch.mkdir(parents=True, exist_ok=True)
                    if rides:
                        await rendered.wait()
                    if rides and run.rider_ran:
                        frames = await rider_frames(scratch, summary)
                    else:
                        frames = await source_pass(
                            self.services.sandbox,
                            run.sniff,
                            run.source,
                            summary,
                            self.moderation.config,
                            scratch,
                            check=checking,
                            poster=poster,
                            measure=measure,
                            record=runs,
                        )
                    loudness = await read_loudness(scratch) if measure else None
                    measured.extend([loudness] if loudness is not None else [])
                    framed.set()
                except InvalidMediaError as exc:
                    verdict = decode_failed(verdict, exc, FULL)
                    scope.cancel()  # nothing of an invalid source is made
                except Exception as exc:  # re-raised after the group, as itself
                    errors.append(exc)
                    scope.cancel()
                else:
                    verdict = msgspec.structs.replace(
                        verdict, decode_check=FULL if checking else "none"
                    )
                    phases.add("decode_check_and_frames", started)
                    if ask:
                        started = time.monotonic()
                        decision, unavailable = await self._ask(asset, revision, verdict, frames)
                        phases.add("moderation", started)
                finally:
                    for result in runs:
                        report.record("frames", result)
        if not verdict.valid:
            return Made(verdict, None, [], [], None, "", len(frames))
        if errors:
            raise errors[0]
        plan = run.report.plan if run.report is not None and run.report.plan else plans[0]
        failed = [n for n in plan.required if n not in {r.variant_type for r in stored}]
        return Made(verdict, plan, stored, failed, decision, unavailable, len(frames))

    async def _loudness(
        self,
        job: Job,
        run: MediaRun,
        asset: asyncpg.Record,
        revision: int,
        measured: list[Loudness],
        finalized: list[OutputRecord],
        stored: list[OutputRecord],
    ) -> bool:
        """The plan with the loudness the frames pass measured (``run.report.plan``: what
        is recorded), when it measured (a plan that normalizes was measured before the
        render and made once). A playback made before the measurement whose audio it
        changes (normalized: a transcode's, or a remux's off target) is made again, its
        audio alone (the encoded video in ``work/`` is used again; a copy stays a copy):
        True. One that cannot be made again is left to the render job, as a failed one."""
        report = run.report
        assert report is not None and report.plan is not None
        summary = report.verdict.media
        if not measured or summary is None:
            return False
        plan = report.plan
        final = with_loudness(
            plan, summary, self.services.config.media, measured[0], normalize=run.normalize
        )
        report.plan = final
        same = (final.audio, final.audio_filter) == (plan.audio, plan.audio_filter)
        if same or "playback" not in {record.variant_type for record in stored}:
            return False
        finalized.clear()
        if not final.top.copy:
            run.encoded_rungs.add(final.top.name)
        await run.run(wants=["playback"], plan=final)
        again = await self._store(job, run, asset, revision, finalized)
        stored[:] = [r for r in stored if r.variant_type != "playback"] + again
        return True

    def _rides(self, summary: MediaSummary) -> bool:
        """Whether the plan will transcode in one pass here (not chunked), so that the
        frames ride along its decode."""
        media = self.services.config.media
        chunked = 0 < media.chunk_threshold_seconds < summary.duration_seconds
        return bool(transcode_reasons(summary)) and not chunked

    def _poster_shot(self, summary: MediaSummary, scratch: Path) -> PosterShot | None:
        """The poster the frames pass takes when the plan will be a remux (the plan copies
        the video, so its poster is a frame of the source at the source's size); a
        transcode's poster comes from its encode pass's own decode."""
        media = self.services.config.media
        if transcode_reasons(summary) or "poster" not in media.required_outputs:
            return None
        return PosterShot(poster_seconds(summary, media), scratch / "poster.jpg")

    async def _store(
        self,
        job: Job,
        run: MediaRun,
        asset: asyncpg.Record,
        revision: int,
        records: list[OutputRecord],
    ) -> list[OutputRecord]:
        """Upload the made outputs under the revision prefix and read each back; the ones
        stored. Only while this delivery holds the job's lease and the asset is still in
        PROBING: a delivery that lost its lease to another (which may have recorded and
        published this very revision) never writes its keys. An output that cannot be
        stored is left to the render job (as one the run failed)."""
        if not records:
            return []
        if time.monotonic() >= self._fenced_until:
            await self._check(job, asset)
        prefix = keys.revision_prefix(asset["tenant_id"], asset["id"], revision)
        stored = []
        for record in records:
            try:
                await media_objects.upload_and_verify(
                    self.services.store, prefix, run.layout.out, record
                )
            except DatabaseError:
                raise
            except AivedioError as exc:
                log.warning(
                    "output_not_stored",
                    asset_id=str(asset["id"]),
                    revision=revision,
                    variant_type=record.variant_type,
                    error_class=exc.error_class,
                    detail=exc.detail[:300],
                )
                continue
            stored.append(record)
        return stored

    @property
    def fenced_until(self) -> float:
        return self._fenced_until

    async def _check(self, job: Job, asset: asyncpg.Record) -> None:
        """That this delivery holds the job's lease and the asset is in PROBING, and until
        when the lease surely stays its own: no other delivery can have the job before the
        lease ends (the reaper waits for that), and only a delivery of this job records a
        revision. So the stores of one job (the required set, the poster after the frames
        pass, a playback made again) cost one check, not one each. An asset deleted in
        between gets no revision (the record's compare-and-set on PROBING fails) and the
        objects stored meanwhile are the sweeper's GC's, as those of a delivery that died."""
        sent = time.monotonic()
        async with media_assets.connection(self.services.pool, "checking the probe") as conn:
            got = await write_fenced(
                conn,
                job,
                {
                    "probing": media_assets.still_probing_part(asset["id"]),
                    "lease_left": lease_left_part(job),
                },
                "checking the probe is still this delivery's",
            )
        if not got["probing"]:
            raise StaleStateError(f"asset {asset['id']} is no longer PROBING: not ours to store")
        self._fenced_until = fenced_deadline(sent, got["lease_left"])

    async def _ask(
        self, asset: asyncpg.Record, revision: int, verdict: Verdict, frames: list[Frame]
    ) -> tuple[Decision | None, str]:
        """The moderator's decision on the frames; None (and why) when it cannot give one:
        fail-closed, the moderate job asks again by its own rules (from the playback)."""
        missing = sorted(set(STILLS) - {frame.kind for frame in frames})
        if missing:
            # A still the pass did not make is a look the moderator would not get.
            log.warning(
                "moderation_frames_missing",
                asset_id=str(asset["id"]),
                revision=revision,
                missing=missing,
            )
            return None, f"frames missing: {', '.join(missing)}"
        media = msgspec.to_builtins(verdict.media)
        labels = [str(x) for x in (asset["safety_labels"] or [])]
        try:
            decision = await self.moderation.moderator.check(
                Request(
                    asset_id=asset["id"],
                    revision=revision,
                    media=media,
                    provider_labels=labels,
                    frames=frames,
                )
            )
        except Exception as exc:
            # Whatever went wrong asking, there is no decision: fail-closed.
            detail = exc.detail if isinstance(exc, ModeratorUnavailableError) else repr(exc)
            log.warning(
                "moderation_unavailable",
                asset_id=str(asset["id"]),
                revision=revision,
                detail=detail[:300],
                error_class=type(exc).__name__,
                fast_path=True,
            )
            return None, detail
        return decision, ""
