"""``ChunkSteps`` with the AV1 ladder, on recording process runners (no ffmpeg): the AV1
renditions are pieces made from chunks, and a run that encodes any of them asks for the AV1
budget (its wall time and CPU rlimit: ``RunProcesses._ffmpeg``), one that does not never."""

from __future__ import annotations

from pathlib import Path

import anyio

from aivedio.pipeline.ffmpeg.chunk_steps import ChunkSteps
from aivedio.pipeline.ffmpeg.sandbox import RunResult
from aivedio.pipeline.media.layout import Layout
from tests.unit.pipeline.media.test_av1_chunked import MEDIA, chunked_plan


def test_pieces_that_encode_av1_ask_for_the_av1_budget(tmp_path: Path) -> None:
    plan = chunked_plan()
    assert plan.chunking is not None
    runs: list[tuple[str, float, bool]] = []

    async def ffmpeg(
        step: str, args: list[str], duration: float, *, encodes_av1: bool = False
    ) -> RunResult | None:
        runs.append((step, duration, encodes_av1))
        return None  # the steps read what the run made, never its result

    async def ffprobe(step: str, args: list[str]) -> str:
        assert plan.chunking is not None
        return f"{plan.chunking.output_frames(1, plan.frame_rate)}\n"  # every piece whole

    steps = ChunkSteps(ffmpeg, ffprobe, MEDIA, plan, Layout(tmp_path))
    assert [r.name for r in steps.encoded_rungs] == ["720p", "360p", "av1_720p", "av1_360p"]
    h264, twin = steps.encoded_rungs[1], steps.encoded_rungs[3]

    async def main() -> None:
        await steps.encode_many([h264], 1, tmp_path / "c.nut")
        await steps.encode_many([h264, twin], 1, tmp_path / "c.nut")
        await steps.encode(twin, 1, tmp_path / "c.nut")

    anyio.run(main)
    span = plan.chunking.span(1)
    assert runs == [
        ("encode[360p:1]", span, False),
        ("encode[360p+av1_360p:1]", span, True),
        ("encode[av1_360p:1]", span, True),
    ]
