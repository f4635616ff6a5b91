"""The chunked path's ffmpeg steps, each checked before its result may be used.

Shared by the worker's chunk jobs (``chunk_stage``: one step per job, objects in between)
and by ``aivedio process`` (``dag``: every step in one scratch directory, the encodes as
concurrent local processes). Each step verifies what it made: the split gives one file per
planned chunk with that chunk's packet count, an encoded piece has exactly its share of the
output frames, a joined rendition the sum of them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Protocol

from aivedio.config.media import MediaConfig
from aivedio.errors import RenderError
from aivedio.pipeline.ffmpeg.sandbox import RunResult
from aivedio.pipeline.media.chunks import (
    NUT,
    Chunking,
    chunk_name,
    concat_args,
    concat_list,
    split_args,
)
from aivedio.pipeline.media.ffmpeg_args import EncodeJob, encode_args, pieces_args
from aivedio.pipeline.media.layout import Layout
from aivedio.pipeline.media.plan import Plan, Rung
from aivedio.pipeline.media.sniff import MP4, Sniff, input_args
from aivedio.pipeline.media.validate import MediaSummary


class RunFfmpeg(Protocol):
    """Runs one checked ffmpeg step over ``duration`` seconds of media; ``encodes_av1``:
    it encodes AV1 renditions and gets their budget on top (``av1.deadline_extra_seconds``,
    ``av1.cpu_extra_seconds``)."""

    def __call__(
        self, step: str, args: list[str], duration: float, *, encodes_av1: bool = False
    ) -> Awaitable[RunResult]: ...


RunFfprobe = Callable[[str, list[str]], Awaitable[str]]
AUDIO_ONLY = EncodeJob(rungs=(), proxy=False, poster=False, sprite=False, pcm=False, audio=True)


class ChunkSteps:
    def __init__(
        self,
        ffmpeg: RunFfmpeg,
        ffprobe: RunFfprobe,
        media: MediaConfig,
        plan: Plan,
        layout: Layout,
    ) -> None:
        if plan.chunking is None:
            raise ValueError("the plan takes the single-pass path")
        self.ffmpeg = ffmpeg
        self.ffprobe = ffprobe
        self.media = media
        self.plan = plan
        self.chunking: Chunking = plan.chunking
        self.layout = layout

    @property
    def chunk_dir(self) -> Path:
        return self.layout.work / "chunks"

    def chunk_path(self, index: int) -> Path:
        return self.chunk_dir / chunk_name(index)

    def piece_path(self, rung: Rung, index: int) -> Path:
        return self.layout.work / "pieces" / rung.name / f"{index:04d}.mp4"

    @property
    def encoded_rungs(self) -> list[Rung]:
        """The renditions made from chunks, the H.264 ones first, then the AV1 ones (a
        copied top rung comes from the source itself)."""
        return [rung for rung in self.plan.renditions if not rung.copy]

    def span(self, index: int) -> float:
        return self.chunking.span(index)

    async def count_packets(self, sniff: Sniff, path: Path) -> int:
        text = await self.ffprobe(
            "count_packets",
            [
                *input_args(sniff, path),
                "-select_streams",
                "v:0",
                "-count_packets",
                "-show_entries",
                "stream=nb_read_packets",
                "-of",
                "csv=p=0",
            ],
        )
        try:
            return int(text.strip().splitlines()[0].strip(","))
        except (ValueError, IndexError):
            raise RenderError(f"count_packets: unreadable answer {text[:80]!r}") from None

    async def split(self, sniff: Sniff, source: Path) -> list[Path]:
        """Cut the source's video into the planned chunks by stream copy."""
        self.chunk_dir.mkdir(parents=True, exist_ok=True)
        args = split_args(
            sniff, source, self.chunking, self.plan.video_map, self.media, self.chunk_dir
        )
        await self.ffmpeg("split", args, self.plan.duration_seconds)
        made = sorted(self.chunk_dir.glob("chunk_*.nut"))
        if len(made) != self.chunking.count:
            raise RenderError(f"split: {len(made)} chunks made, {self.chunking.count} planned")
        for index, path in enumerate(made):
            packets = await self.count_packets(NUT, path)
            if packets != self.chunking.frames[index]:
                raise RenderError(
                    f"split: chunk {index} has {packets} packets, "
                    f"{self.chunking.frames[index]} planned"
                )
        return made

    async def encode(self, rung: Rung, index: int, chunk: Path) -> tuple[Path, int]:
        """One ``(chunk, rendition)`` piece; returns it with its frame count."""
        (made,) = await self.encode_many([rung], index, chunk)
        return made

    async def encode_many(
        self, rungs: list[Rung], index: int, chunk: Path
    ) -> list[tuple[Path, int]]:
        """Pieces of several renditions of one chunk from one decode of it, in ``rungs``'
        order, each with its frame count (each checked as a piece encoded alone)."""
        if not rungs:
            return []
        outputs = [(rung, self.piece_path(rung, index)) for rung in rungs]
        for _, output in outputs:
            output.parent.mkdir(parents=True, exist_ok=True)
        args = pieces_args(self.plan, self.chunking, index, outputs, self.media, chunk)
        names = "+".join(rung.name for rung in rungs)
        encodes_av1 = any(rung.codec == "av1" for rung in rungs)
        await self.ffmpeg(
            f"encode[{names}:{index}]", args, self.span(index), encodes_av1=encodes_av1
        )
        expected = self.chunking.output_frames(index, self.plan.frame_rate)
        made: list[tuple[Path, int]] = []
        for rung, output in outputs:
            frames = await self.count_packets(MP4, output)
            if frames != expected:
                raise RenderError(
                    f"encode[{rung.name}:{index}]: {frames} frames made, {expected} expected"
                )
            made.append((output, frames))
        return made

    async def audio(self, sniff: Sniff, source: Path, summary: MediaSummary) -> Path:
        """The whole audio track, once, encoded or copied as planned (never chunked: no
        priming at chunk boundaries)."""
        self.layout.work.mkdir(parents=True, exist_ok=True)
        args = encode_args(
            self.plan,
            AUDIO_ONLY,
            self.media,
            sniff,
            source,
            self.layout,
            audio_channels=summary.audio_channels,
            audio_rate=summary.audio_sample_rate,
        )
        await self.ffmpeg("audio", args, self.plan.duration_seconds)
        return self.layout.audio

    async def join(self, rung: Rung, pieces: list[tuple[Path, int]]) -> Path:
        """One rendition's pieces joined in order into the rung video the packaging reads."""
        if len(pieces) != self.chunking.count:
            raise RenderError(
                f"join[{rung.name}]: {len(pieces)} pieces, {self.chunking.count} chunks"
            )
        listing = self.layout.work / f"concat_{rung.name}.txt"
        listing.write_text(concat_list(pieces, self.plan.frame_rate))
        output = self.layout.rung_video(rung)
        args = concat_args(listing, output, origin=self.chunking.grid_starts[0])
        await self.ffmpeg(f"join[{rung.name}]", args, self.plan.duration_seconds)
        frames = await self.count_packets(MP4, output)
        expected = sum(count for _, count in pieces)
        if frames != expected:
            raise RenderError(f"join[{rung.name}]: {frames} frames, {expected} expected")
        return output
