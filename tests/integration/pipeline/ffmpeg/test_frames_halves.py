"""The fast path's pass over the source in two halves: the same stills, scene frames,
poster and loudness as one pass, and a source the halves fail on passed over whole."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from aivedio.config.media import MediaConfig
from aivedio.config.moderation import ModerationConfig
from aivedio.errors import InvalidMediaError
from aivedio.pipeline.ffmpeg import frames_halves
from aivedio.pipeline.ffmpeg.frames import Frame, PosterShot, read_loudness, source_frames
from aivedio.pipeline.ffmpeg.frames_halves import (
    HALVES_MIN_SECONDS,
    cut_seconds,
    halves_args,
    halves_frames,
    halves_pay,
    source_pass,
)
from aivedio.pipeline.ffmpeg.sandbox import RunResult, Sandbox
from aivedio.pipeline.ffmpeg.verdict import inspect_file
from aivedio.pipeline.media.sniff import sniff_file
from aivedio.pipeline.media.validate import MediaSummary
from tests.support import media_fixtures as mf

pytestmark = pytest.mark.anyio

FPS = 24


def cut_in_the_middle(directory: Path, *, corrupt_tail: bool = False) -> Path:
    """6 s of H.264 (keyframe every second) + AAC whose picture changes completely at 3.0 s,
    the middle still's time, where the halves meet; ``corrupt_tail``: its last quarter of
    ``mdat`` overwritten, so only the tail half fails to decode."""
    out = directory / ("corrupt.mp4" if corrupt_tail else "cut.mp4")
    if out.exists():
        return out
    made = directory / "made.mp4" if corrupt_tail else out
    mf.run_ffmpeg(
        *("-f", "lavfi", "-i", f"testsrc2=s=320x240:r={FPS}:d=3"),
        *("-f", "lavfi", "-i", f"color=c=red:s=320x240:r={FPS}:d=3"),
        *("-f", "lavfi", "-i", "sine=frequency=440:sample_rate=48000:duration=6"),
        *("-filter_complex", "[0:v][1:v]concat=n=2:v=1:a=0[v]", "-map", "[v]", "-map", "2:a"),
        *("-c:v", "libx264", "-preset", "veryfast", "-g", str(FPS), "-pix_fmt", "yuv420p"),
        *("-c:a", "aac", "-b:a", "64k", "-movflags", "+faststart", str(made)),
    )
    if corrupt_tail:
        mf._corrupt_tail(made, out)
    return out


@pytest.fixture(scope="module")
def media(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("halves-media")


async def summary_of(sandbox: Sandbox, path: Path) -> MediaSummary:
    verdict, _ = await inspect_file(sandbox, path)
    assert verdict.valid and verdict.media is not None, verdict.reasons
    return verdict.media


def picture_md5(jpeg: bytes, tmp_path: Path) -> str:
    path = tmp_path / "picture.jpg"
    path.write_bytes(jpeg)
    return mf.picture_md5(path)


async def test_only_a_long_enough_video_on_two_cores_is_passed_over_in_halves(
    media: Path, tmp_path: Path
) -> None:
    sandbox = Sandbox(MediaConfig(decode_check="none", scratch_dir=str(tmp_path / "s")))
    probed = await summary_of(sandbox, cut_in_the_middle(media))

    def summary(seconds: float) -> MediaSummary:
        return msgspec.structs.replace(
            probed, duration_seconds=seconds, video_duration_seconds=seconds
        )

    assert halves_pay(summary(HALVES_MIN_SECONDS), cores=2)
    assert not halves_pay(summary(HALVES_MIN_SECONDS - 0.5), cores=2)
    assert not halves_pay(summary(60.0), cores=1)
    assert cut_seconds(probed) == pytest.approx(3.0, abs=0.05)
    # Each half's video decoder gets half the cores (ffmpeg's own count would contend).
    source = cut_in_the_middle(media)
    for cores, threads in ((2, "1"), (3, "1"), (8, "4")):
        for args in halves_args(
            sniff_file(source),
            source,
            probed,
            ModerationConfig(),
            tmp_path,
            max_streams=8,
            max_pixels=1 << 24,
            cores=cores,
        ):
            assert args[args.index("-threads") + 1] == threads
            assert args.index("-threads") < args.index("-i")


@pytest.mark.parametrize("poster_at", [0.6, 4.5], ids=["poster-in-head", "poster-in-tail"])
async def test_the_halves_take_what_one_pass_takes(
    media: Path, tmp_path: Path, poster_at: float
) -> None:
    source = cut_in_the_middle(media)
    sandbox = Sandbox(MediaConfig(decode_check="none", scratch_dir=str(tmp_path / "s")))
    summary = await summary_of(sandbox, source)
    config = ModerationConfig()
    whole_dir, halves_dir = tmp_path / "whole", tmp_path / "halves"
    whole_dir.mkdir()
    halves_dir.mkdir()
    whole = await source_frames(
        sandbox,
        sniff_file(source),
        source,
        summary,
        config,
        whole_dir,
        poster=PosterShot(poster_at, whole_dir / "poster.jpg"),
        measure=True,
    )
    runs: list[RunResult] = []
    halves = await halves_frames(
        sandbox,
        sniff_file(source),
        source,
        summary,
        config,
        halves_dir,
        poster=PosterShot(poster_at, halves_dir / "poster.jpg"),
        measure=True,
        record=runs,
    )
    assert halves is not None
    assert len(runs) == 2 and all(r.ok for r in runs)  # two processes, side by side

    def stills(frames: list[Frame]) -> list[tuple[str, float, str]]:
        return [
            (f.kind, round(f.seconds, 3), picture_md5(f.jpeg, tmp_path))
            for f in frames
            if f.kind != "scene"
        ]

    assert [f.kind for f in halves][:3] == ["first", "middle", "last"]
    assert stills(halves) == stills(whole)
    # The cut at 3.0 s, where the halves meet, is a scene change in both (the head scores
    # the frame at the cut against the one before it); nothing else differs.
    whole_scenes = [f for f in whole if f.kind == "scene"]
    halves_scenes = [f for f in halves if f.kind == "scene"]
    assert any(abs(f.seconds - 3.0) <= 1 / FPS for f in whole_scenes)
    assert len(halves_scenes) == len(whole_scenes)
    for a, b in zip(halves_scenes, whole_scenes, strict=True):
        assert a.seconds == pytest.approx(b.seconds, abs=1 / FPS)
        assert picture_md5(a.jpeg, tmp_path) == picture_md5(b.jpeg, tmp_path)
    poster_whole = picture_md5((whole_dir / "poster.jpg").read_bytes(), tmp_path)
    assert picture_md5((halves_dir / "poster.jpg").read_bytes(), tmp_path) == poster_whole
    loud_whole, loud_halves = await read_loudness(whole_dir), await read_loudness(halves_dir)
    assert loud_whole is not None and loud_halves is not None
    assert loud_halves.integrated_lufs == pytest.approx(loud_whole.integrated_lufs, abs=0.1)


async def test_a_tail_that_does_not_decode_fails_the_halves_and_the_whole_pass_decides(
    media: Path, tmp_path: Path
) -> None:
    source = cut_in_the_middle(media, corrupt_tail=True)
    sandbox = Sandbox(MediaConfig(decode_check="none", scratch_dir=str(tmp_path / "s")))
    summary = await summary_of(sandbox, source)
    args = (sandbox, sniff_file(source), source, summary, ModerationConfig(), tmp_path)
    assert await halves_frames(*args) is None
    runs: list[RunResult] = []
    with pytest.raises(InvalidMediaError) as caught:
        await source_pass(*args, record=runs, cores=2)
    assert caught.value.reasons == ["decode_failed"]
    # The halves' two processes, then the whole pass and the plain decode that confirmed it.
    assert len(runs) >= 3 and not runs[-1].ok


async def test_halves_that_fail_on_their_outputs_give_way_to_the_whole_pass(
    media: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = cut_in_the_middle(media)
    sandbox = Sandbox(MediaConfig(decode_check="none", scratch_dir=str(tmp_path / "s")))
    summary = await summary_of(sandbox, source)
    real = frames_halves.halves_args

    def broken(*args: object, **kwargs: object) -> tuple[list[str], list[str]]:
        # The tail's middle still written into a directory that does not exist.
        head, tail = real(*args, **kwargs)  # type: ignore[arg-type]
        missing = [
            str(Path(a).parent / "missing" / "middle.jpg") for a in tail if a.endswith("middle.jpg")
        ]
        assert missing
        return head, [missing[0] if a.endswith("middle.jpg") else a for a in tail]

    monkeypatch.setattr(frames_halves, "halves_args", broken)
    runs: list[RunResult] = []
    got = await source_pass(
        sandbox,
        sniff_file(source),
        source,
        summary,
        ModerationConfig(),
        tmp_path,
        record=runs,
        cores=2,
    )
    assert [f.kind for f in got][:3] == ["first", "middle", "last"]
    assert not all(r.ok for r in runs[:-1]) and runs[-1].ok  # a half failed, the whole ran
