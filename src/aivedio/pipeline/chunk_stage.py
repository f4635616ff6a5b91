"""Chunked transcoding across the fleet: split, ``(chunk, rendition)`` encodes, assembly.

A revision whose plan has ``chunking`` (a source longer than ``chunk_threshold_seconds``)
makes ``playback``, ``hls`` and ``keyframes`` this way; its other outputs render from the
source as usual. Seed 004 keys transcoding work by ``(video, source version, profile,
segment)``; here a piece is ``(asset, revision, piece)`` with the pipeline version in its job
key, each a row of ``media_pieces`` moved PENDING → DONE once (``states.Entity.PIECE``):

* ``chunk_split`` (one per revision): cut the source's video at clean keyframes by stream
  copy; every chunk uploaded and read back, then in one transaction the chunks recorded DONE
  (size, SHA-256), one PENDING ``video:RUNG:NNNN`` piece and one ``chunk_encode`` job per
  encoded rung and chunk;
* ``chunk_encode`` (one per piece, and one for ``audio``, which is never chunked): any
  worker takes it; it downloads its chunk (checked against the recorded SHA-256), encodes,
  verifies the frame count, uploads under a key of its own attempt and commits the piece;
  the commit that leaves nothing pending enqueues the assembly (the revision row is locked
  for it, so two last pieces finishing at once cannot both miss it);
* ``chunk_assemble`` (one per revision): every piece DONE, each download checked against its
  record, the renditions joined in chunk order, then packaged, verified, uploaded and
  recorded like any render; the revision then goes on to moderation and publish.

A retried piece redoes only itself. A duplicate finds its piece DONE and stops; one whose
attempt loses the commit race deletes its own upload. The claim orders by deadline
(``sort_at``), then priority: a chunk is due as many seconds after the default deadline as it
lies into its video, so a short video enqueued while a long one's chunks wait is claimed
before the chunks further into the long one (one long video cannot starve short ones), and on
equal deadlines piece jobs rank below required renders; the queue's tenant fairness applies on
top. An asset's pieces go to whichever workers are free. Work objects live under the
revision's ``work/`` prefix, are deleted after the assembly and are otherwise collected by the
sweeper's GC.
"""

from __future__ import annotations

import contextlib
import hashlib
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import asyncpg
import msgspec

from aivedio.errors import AivedioError, NotFoundError, RenderError, StaleStateError, TransientError
from aivedio.logs import get_logger
from aivedio.metrics import WorkerMetrics
from aivedio.pipeline import media_objects
from aivedio.pipeline.chunk_pieces import (
    ASSEMBLE_KIND,
    AUDIO_PIECE,
    ENCODE_KIND,
    SPLIT_PIECE,
    chunk_outputs,
    chunk_piece,
    piece_key,
    piece_spec,
    piece_timeout,
    video_piece,
    video_piece_timeout,
)
from aivedio.pipeline.ffmpeg.media_run import MediaRun
from aivedio.pipeline.ffmpeg.outputs import OutputRecord
from aivedio.pipeline.media.chunks import chunk_name
from aivedio.pipeline.media.plan import Plan, Rung
from aivedio.pipeline.media.sniff import MP4
from aivedio.pipeline.media.validate import MediaSummary
from aivedio.pipeline.revisions import Revisions, will_retry
from aivedio.states import Entity
from aivedio.store import asset_variants, media_assets, media_pieces, revision_rows
from aivedio.store.objects import keys
from aivedio.store.queue import Job, JobSpec
from aivedio.store.records import transition

log = get_logger("aivedio.media")


class ChunkStage:
    """The three job kinds of the chunked render, on the media stage's services and its
    revision bookkeeping (``Revisions``); ``will_retry(exc, job)`` is the queue's own retry
    rule. It owns the ``media_pieces`` rows and the revision's ``work/`` objects; it never
    probes, and records the chunk outputs only, through the shared bookkeeping."""

    def __init__(
        self,
        revisions: Revisions,
        will_retry: Callable[[AivedioError, Job], bool] = will_retry,
    ) -> None:
        self.revisions = revisions
        self.services = revisions.services
        self.will_retry = will_retry

    # -- shared ----------------------------------------------------------------------------

    async def _live(self, job: Job) -> tuple[uuid.UUID, int, str, asyncpg.Record] | dict[str, Any]:
        asset_id = uuid.UUID(str(job.payload["asset_id"]))
        revision = int(job.payload["revision"])
        piece = str(job.payload["piece"])
        state = await self.revisions.revision(asset_id, revision)
        if state is None:
            return {"outcome": "no_such_revision"}
        if state["status"] != "BUILDING":
            return {"outcome": "revision_" + state["status"].lower()}
        if await self.revisions.stopped(asset_id, state):
            return {"outcome": "asset_deleted_or_cancelled"}
        return asset_id, revision, piece, state

    async def _piece(self, asset_id: uuid.UUID, revision: int, piece: str) -> asyncpg.Record:
        row = await media_pieces.piece_row(self.services.pool, asset_id, revision, piece)
        if row is None:
            raise TransientError(f"piece {piece} of {asset_id}/{revision} is not recorded yet")
        return row

    def _run(self, root: Path, summary: MediaSummary, *, source_present: bool) -> MediaRun:
        """A run in ``root``; with ``source_present`` the source is already at
        ``root/source.bin`` (downloaded and checked), otherwise no step reads it."""
        run = MediaRun(self.services.sandbox, root / "source.bin", root)
        run.assume_valid(summary, sniff=None if source_present else MP4)
        return run

    async def _assembly_run(
        self, root: Path, asset: asyncpg.Record, summary: MediaSummary, plan: Plan
    ) -> MediaRun:
        """The assembly's run: the source at hand when a copied rung comes from it, when
        outputs are signed (the source is the signed outputs' parent ingredient), or when
        it has subtitle streams of its own (published as text tracks with the HLS output)."""
        needs_source = any(rung.copy for rung in plan.rungs) or bool(summary.text_streams)
        if needs_source or self.services.signing is not None:
            run = await self._source_run(root, asset, summary)
        else:
            run = self._run(root, summary, source_present=False)
        return self.services.equip(run, asset)

    async def _source_run(
        self, root: Path, asset: asyncpg.Record, summary: MediaSummary
    ) -> MediaRun:
        await media_objects.download_source(self.services.store, asset, root / "source.bin")
        return self._run(root, summary, source_present=True)

    async def _fail_outputs(
        self, asset_id: uuid.UUID, revision: int, plan: Plan, piece: str, detail: str
    ) -> None:
        """A piece out of retries: the outputs made from pieces can no longer be made."""
        with anyio.CancelScope(shield=True):
            async with media_assets.connection(self.services.pool, "failing a piece") as conn:
                with contextlib.suppress(StaleStateError):
                    await transition(
                        conn,
                        Entity.PIECE,
                        (asset_id, revision, piece),
                        expected="PENDING",
                        new="FAILED",
                        values={"detail": detail[:1000]},
                    )
            if await media_pieces.split_failed(self.services.pool, asset_id, revision):
                return  # the single pass makes the chunk outputs now, not the pieces
            for output in chunk_outputs(plan):
                await self.revisions.mark_failed(asset_id, revision, output, f"{piece}: {detail}")

    async def _fall_back(self, asset_id: uuid.UUID, revision: int, plan: Plan, detail: str) -> None:
        """The split out of retries (a source the segment muxer cannot cut as planned): the
        chunk outputs are made by the single pass, from the source, by render jobs of their
        own, enqueued in the transaction that marks the split FAILED. Nothing was made from
        chunks yet; the audio piece stops (``_guarded``)."""
        with anyio.CancelScope(shield=True):
            try:
                asset = await self.revisions.asset(asset_id)
            except NotFoundError:
                return  # deleted meanwhile: nothing to make
            summary = msgspec.convert(asset["probe"]["media"], MediaSummary)
            async with media_assets.connection(
                self.services.pool, "falling back to the single pass", transaction=True
            ) as conn:
                try:
                    await transition(
                        conn,
                        Entity.PIECE,
                        (asset_id, revision, SPLIT_PIECE),
                        expected="PENDING",
                        new="FAILED",
                        values={"detail": detail[:1000]},
                    )
                except StaleStateError:
                    return  # done meanwhile by another attempt, or already fallen back
                outputs = await asset_variants.pending_among(
                    conn, asset_id, revision, chunk_outputs(plan)
                )
                specs = self.revisions.render_specs(asset, revision, plan, summary, outputs)
                await self.services.queue.enqueue(conn, specs)
            log.warning(
                "chunked_split_failed_single_pass",
                asset_id=str(asset_id),
                revision=revision,
                outputs=outputs,
                detail=detail[:300],
            )

    async def _guarded(self, job: Job, body: Any) -> dict[str, Any]:
        """Run a job body; when the queue will not retry its failure, fail the outputs."""
        live = await self._live(job)
        if isinstance(live, dict):
            return live
        asset_id, revision, piece, state = live
        plan = msgspec.convert(state["plan"], Plan)
        if piece != SPLIT_PIECE and await media_pieces.split_failed(
            self.services.pool, asset_id, revision
        ):
            return {"outcome": "split_failed_single_pass"}
        try:
            result: dict[str, Any] = await body(asset_id, revision, piece, plan)
            return result
        except Exception as exc:
            # Out of retries (the queue's rule; anything unclassified is retried until the
            # budget is spent): the outputs fail instead of staying PENDING forever.
            if isinstance(exc, AivedioError):
                retry, detail = self.will_retry(exc, job), exc.detail
            else:
                retry, detail = job.attempts < job.max_attempts, f"{type(exc).__name__}: {exc}"
            if not retry and piece == SPLIT_PIECE:
                await self._fall_back(asset_id, revision, plan, detail)
            elif not retry:
                await self._fail_outputs(asset_id, revision, plan, piece, detail)
            raise

    def _work(self, asset_id: uuid.UUID, tenant_id: int, revision: int) -> str:
        return f"{keys.revision_prefix(tenant_id, asset_id, revision)}/work"

    # -- split -----------------------------------------------------------------------------

    async def split(self, job: Job) -> dict[str, Any]:
        async def body(
            asset_id: uuid.UUID, revision: int, piece: str, plan: Plan
        ) -> dict[str, Any]:
            if (await self._piece(asset_id, revision, SPLIT_PIECE))["status"] != "PENDING":
                return {"outcome": "already_done"}
            asset = await self.revisions.asset(asset_id)
            summary = msgspec.convert(asset["probe"]["media"], MediaSummary)
            work = self._work(asset_id, asset["tenant_id"], revision)
            attempt = f"{job.id}-{job.attempts}"
            made: list[tuple[str, str, int]] = []
            with self.services.sandbox.scratch() as root:
                run = await self._source_run(root, asset, summary)
                steps = run.chunk_steps(plan)
                for index, path in enumerate(await steps.split(run.sniff, run.source)):
                    key = f"{work}/chunks/{attempt}/{chunk_name(index)}"
                    made.append(
                        (
                            key,
                            *await media_objects.upload_work_object(self.services.store, key, path),
                        )
                    )
            total = sum(size for _, _, size in made)
            manifest = hashlib.sha256("".join(d for _, d, _ in made).encode()).hexdigest()
            assert plan.chunking is not None
            specs: list[JobSpec] = []
            rungs = [r for r in plan.renditions if not r.copy]  # H.264 first, then AV1
            async with media_assets.connection(
                self.services.pool, "recording the chunks", transaction=True
            ) as conn:
                await revision_rows.lock(conn, asset_id, revision)
                try:
                    await transition(
                        conn,
                        Entity.PIECE,
                        (asset_id, revision, SPLIT_PIECE),
                        expected="PENDING",
                        new="DONE",
                        values={
                            "object_key": f"{work}/chunks/{attempt}/",
                            "size_bytes": total,
                            "sha256": manifest,
                        },
                    )
                except StaleStateError:
                    made_keys = [key for key, _, _ in made]
                    await media_objects.discard(self.services.store, *made_keys)
                    return {"outcome": "already_done"}
                rows: list[tuple[Any, ...]] = []
                for index, (key, digest, size) in enumerate(made):
                    rows.append(
                        (
                            asset_id,
                            revision,
                            chunk_piece(index),
                            "DONE",
                            key,
                            size,
                            digest,
                            plan.chunking.frames[index],
                        )
                    )
                    # The last chunk may be half as long again as the others.
                    span = max(plan.chunking.chunk_seconds, plan.chunking.span(index))
                    timeout = video_piece_timeout(plan, span, self.services.config.media)
                    for rung in rungs:
                        name = video_piece(rung, index)
                        rows.append((asset_id, revision, name, "PENDING", None, None, None, None))
                        later = plan.chunking.starts[index] - plan.chunking.origin
                        specs.append(
                            piece_spec(
                                ENCODE_KIND,
                                asset_id,
                                asset["tenant_id"],
                                revision,
                                plan,
                                name,
                                timeout,
                                later=later,
                            )
                        )
                await media_pieces.insert(conn, rows)
                await self.services.queue.enqueue(conn, specs)
                # Each chunk's first rendition leads: the others' jobs wait behind it, so
                # that the lead, whichever worker takes it, encodes them all from one decode
                # of the chunk (they come back by themselves if it never does).
                followers = [
                    s.idempotency_key
                    for s in specs
                    if not s.payload["piece"].startswith(f"video:{rungs[0].name}:")
                ]
                if followers:
                    await self.services.queue.hold(followers, specs[0].timeout_seconds, conn)
            log.info(
                "chunks_split",
                asset_id=str(asset_id),
                revision=revision,
                chunks=len(made),
                pieces=len(specs),
                bytes=total,
                job_id=job.id,
            )
            return {"outcome": "split", "chunks": len(made), "pieces": len(specs)}

        return await self._guarded(job, body)

    # -- encode ----------------------------------------------------------------------------

    async def encode(self, job: Job, metrics: WorkerMetrics | None = None) -> dict[str, Any]:
        async def body(
            asset_id: uuid.UUID, revision: int, piece: str, plan: Plan
        ) -> dict[str, Any]:
            if (await self._piece(asset_id, revision, piece))["status"] != "PENDING":
                return {"outcome": "already_done"}
            asset = await self.revisions.asset(asset_id)
            summary = msgspec.convert(asset["probe"]["media"], MediaSummary)
            work = self._work(asset_id, asset["tenant_id"], revision)
            attempt = f"{job.id}-{job.attempts}"
            held: list[str] = []
            # (piece, path, frames, key) of each piece this run makes.
            made: list[tuple[str, Path, int | None, str]] = []
            try:
                with self.services.sandbox.scratch() as root:
                    if piece == AUDIO_PIECE:
                        run = await self._source_run(root, asset, summary)
                        path = await run.chunk_steps(plan).audio(run.sniff, run.source, summary)
                        made.append((piece, path, None, f"{work}/pieces/audio.{attempt}.m4a"))
                        span = plan.duration_seconds
                    else:
                        _, rung_name, index_text = piece.split(":")
                        index = int(index_text)
                        rung = next(r for r in plan.renditions if r.name == rung_name)
                        run = self._run(root, summary, source_present=False)
                        steps = run.chunk_steps(plan)
                        rungs = [rung]
                        siblings = await self._siblings(asset_id, revision, plan, rung, index)
                        if job.attempts <= 1:
                            held = await self.services.queue.hold(siblings, job.timeout_seconds)
                            rungs += [
                                r
                                for r in steps.encoded_rungs
                                if piece_key(
                                    ENCODE_KIND, asset_id, revision, plan, video_piece(r, index)
                                )
                                in held
                            ]
                        else:
                            # A retry encodes its own piece alone; siblings an attempt of
                            # this job held before it died do their own, now.
                            await self.services.queue.wake_held(siblings)
                        chunk_row = await self._piece(asset_id, revision, chunk_piece(index))
                        chunk = steps.chunk_path(index)
                        await media_objects.download_piece(self.services.store, chunk_row, chunk)
                        encoded = await steps.encode_many(rungs, index, chunk)
                        for r, (path, frames) in zip(rungs, encoded, strict=True):
                            key = f"{work}/pieces/{r.name}/{index:04d}.{attempt}.mp4"
                            made.append((video_piece(r, index), path, frames, key))
                        span = steps.span(index)
                    uploaded = [
                        (
                            name,
                            frames,
                            key,
                            *await media_objects.upload_work_object(self.services.store, key, path),
                        )
                        for name, path, frames, key in made
                    ]
                return await self._commit_pieces(
                    asset, revision, plan, job, piece, uploaded, run, span, metrics
                )
            finally:
                # Done: the held jobs find their pieces done. Failed: they do their own.
                if held:
                    with anyio.CancelScope(shield=True):
                        try:
                            await self.services.queue.wake_held(held)
                        except AivedioError as exc:  # they come back by themselves later
                            log.warning("wake_held_failed", jobs=len(held), detail=exc.detail)

        return await self._guarded(job, body)

    async def _commit_pieces(
        self,
        asset: asyncpg.Record,
        revision: int,
        plan: Plan,
        job: Job,
        piece: str,
        uploaded: list[tuple[str, int | None, str, str, int]],
        run: MediaRun,
        span: float,
        metrics: WorkerMetrics | None,
    ) -> dict[str, Any]:
        """Record each uploaded piece DONE (a piece found done already keeps its object and
        ours is deleted); the commit that leaves nothing pending enqueues the assembly."""
        asset_id: uuid.UUID = asset["id"]
        if metrics is not None and run.report is not None:
            metrics.media_processed(
                plan.path, plan.mode, sum(p.wall_seconds for p in run.report.processes), span
            )
        async with media_assets.connection(
            self.services.pool, "recording pieces", transaction=True
        ) as conn:
            await revision_rows.lock(conn, asset_id, revision)
            stale: list[str] = []
            for name, count, key, digest, size in uploaded:
                try:
                    await transition(
                        conn,
                        Entity.PIECE,
                        (asset_id, revision, name),
                        expected="PENDING",
                        new="DONE",
                        values={
                            "object_key": key,
                            "size_bytes": size,
                            "sha256": digest,
                            "frames": count,
                        },
                    )
                except StaleStateError:
                    stale.append(key)
            pending = await media_pieces.unfinished(conn, asset_id, revision)
            if pending == 0 and len(stale) < len(uploaded):
                timeout = piece_timeout(
                    plan,
                    plan.duration_seconds,
                    self.services.config.media.process_timeout_seconds,
                    self.services.config.media.process_timeout_per_media_second,
                )
                await self.services.queue.enqueue_one(
                    conn,
                    piece_spec(
                        ASSEMBLE_KIND, asset_id, asset["tenant_id"], revision, plan, "all", timeout
                    ),
                )
        await media_objects.discard(self.services.store, *stale)
        if len(stale) == len(uploaded):
            return {"outcome": "already_done"}
        pieces = [name for name, *_ in uploaded]
        log.info(
            "piece_done",
            asset_id=str(asset_id),
            revision=revision,
            piece=piece,
            pieces=pieces,
            frames=uploaded[0][1],
            remaining=pending,
            job_id=job.id,
        )
        return {
            "outcome": "encoded",
            "piece": piece,
            "frames": uploaded[0][1],
            "pieces": pieces,
            "remaining": pending,
        }

    async def _siblings(
        self, asset_id: uuid.UUID, revision: int, plan: Plan, rung: Rung, index: int
    ) -> list[str]:
        """The job keys of the same chunk's other renditions still pending. A first attempt
        holds back those not running yet (for as long as it may take: they come back by
        themselves if it dies) and encodes them from its one decode of the chunk."""
        names = [video_piece(r, index) for r in plan.renditions if not r.copy and r != rung]
        pending = await media_pieces.pending_among(self.services.pool, asset_id, revision, names)
        return [piece_key(ENCODE_KIND, asset_id, revision, plan, name) for name in pending]

    # -- assemble --------------------------------------------------------------------------

    async def assemble(self, job: Job) -> dict[str, Any]:
        async def body(
            asset_id: uuid.UUID, revision: int, piece: str, plan: Plan
        ) -> dict[str, Any]:
            rows = await media_pieces.of_revision(self.services.pool, asset_id, revision)
            pieces = {row["piece"]: row for row in rows}
            missing = sorted(name for name, row in pieces.items() if row["status"] != "DONE")
            if missing or SPLIT_PIECE not in pieces:
                raise TransientError(f"pieces not done: {', '.join(missing[:5]) or 'split'}")
            nodes = await asset_variants.pending_among(
                self.services.pool, asset_id, revision, chunk_outputs(plan)
            )
            if not nodes:
                return {"outcome": "already_done"}
            asset = await self.revisions.asset(asset_id)
            summary = msgspec.convert(asset["probe"]["media"], MediaSummary)
            prefix = keys.revision_prefix(asset["tenant_id"], asset_id, revision)
            assert plan.chunking is not None
            done: list[str] = []
            with self.services.sandbox.scratch() as root:
                # The copied rung and its audio come from the source itself.
                run = await self._assembly_run(root, asset, summary, plan)
                steps = run.chunk_steps(plan)
                if plan.audio != "none":
                    await media_objects.download_piece(
                        self.services.store, pieces[AUDIO_PIECE], run.layout.audio
                    )
                for rung in steps.encoded_rungs:
                    joined: list[tuple[Path, int]] = []
                    for index in range(plan.chunking.count):
                        row = pieces[video_piece(rung, index)]
                        path = steps.piece_path(rung, index)
                        await media_objects.download_piece(self.services.store, row, path)
                        joined.append((path, int(row["frames"])))
                    await steps.join(rung, joined)

                async def record_now(record: OutputRecord) -> None:
                    await media_objects.upload_and_verify(
                        self.services.store, prefix, root / "out", record
                    )
                    if await media_objects.record_variant(
                        self.services.pool, asset_id, revision, record, prefix
                    ):
                        done.append(record.variant_type)
                        await self.revisions.check_revision(asset_id, revision)

                run.on_done = record_now
                report = await run.package_encoded(plan, nodes)
            failed = {n.name: n for n in report.failed()}
            log.info(
                "chunks_assembled",
                asset_id=str(asset_id),
                revision=revision,
                done=done,
                failed=sorted(failed),
                job_id=job.id,
            )
            await self.revisions.check_revision(asset_id, revision)
            if failed:
                first = failed[sorted(failed)[0]]
                raise RenderError(first.detail or f"{first.name} failed")
            # The work objects are garbage now (the sweeper's GC would collect them too).
            work = [row["object_key"] for row in rows if row["piece"] != SPLIT_PIECE]
            await media_objects.discard(self.services.store, *[key for key in work if key])
            return {"outcome": "assembled", "done": done}

        return await self._guarded(job, body)
