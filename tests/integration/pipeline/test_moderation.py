"""The moderation job's frame sampler against real ffmpeg: the first, middle and last frames,
and scene changes at the times the clip has them (read from showinfo's lines)."""

from __future__ import annotations

from pathlib import Path

import pytest

from aivedio.config.media import MediaConfig
from aivedio.config.moderation import ModerationConfig
from aivedio.pipeline.ffmpeg.sandbox import Sandbox
from aivedio.pipeline.moderation import Frame, sample_frames
from tests.support.media_fixtures import run_ffmpeg

pytestmark = [pytest.mark.anyio, pytest.mark.integration]


def black_white_black(tmp_path: Path) -> Path:
    """Three seconds of black, white, black: scene changes at 1 s and at 2 s."""
    clip = tmp_path / "clip.mp4"
    colors = [f"color=c={c}:s=160x120:r=10:d=1" for c in ("black", "white", "black")]
    run_ffmpeg(
        *[arg for color in colors for arg in ("-f", "lavfi", "-i", color)],
        "-filter_complex",
        "[0:v][1:v][2:v]concat=n=3:v=1:a=0[v]",
        "-map",
        "[v]",
        "-c:v",
        "libx264",
        "-pix_fmt",
        "yuv420p",
        "-movflags",
        "+faststart",
        str(clip),
    )
    return clip


async def sample(tmp_path: Path, max_scene_frames: int) -> list[Frame]:
    scratch = tmp_path / f"scratch-{max_scene_frames}"
    scratch.mkdir()
    return await sample_frames(
        Sandbox(MediaConfig()),
        black_white_black(tmp_path),
        3.0,
        ModerationConfig(max_scene_frames=max_scene_frames),
        scratch,
    )


async def test_frames_are_sampled_at_the_scene_changes(tmp_path: Path) -> None:
    frames = await sample(tmp_path, max_scene_frames=4)
    kinds = [f.kind for f in frames]
    assert kinds[:3] == ["first", "middle", "last"]
    assert [f.seconds for f in frames[:3]] == [0.0, 1.5, 2.0]
    assert all(f.jpeg.startswith(b"\xff\xd8") for f in frames)  # JPEG
    # One process made them all: the middle still (white) differs from the first (black).
    assert frames[1].jpeg != frames[0].jpeg and frames[2].jpeg == frames[0].jpeg
    scenes = [round(f.seconds, 1) for f in frames if f.kind == "scene"]
    assert scenes == [1.0, 2.0]


async def test_the_scene_pass_is_left_out_when_no_scene_frame_is_wanted(tmp_path: Path) -> None:
    frames = await sample(tmp_path, max_scene_frames=0)
    assert [f.kind for f in frames] == ["first", "middle", "last"]


@pytest.mark.parametrize(
    ("source", "seconds"),
    [("color=c=gray:s=160x120:r=10:d=3", 3.0), ("testsrc2=s=160x120:r=10:d=0.5", 0.5)],
    ids=["no-scene-change", "shorter-than-a-second"],
)
async def test_stills_without_scenes_and_from_a_short_clip(
    tmp_path: Path, source: str, seconds: float
) -> None:
    clip = tmp_path / "clip.mp4"
    run_ffmpeg(
        "-f",
        "lavfi",
        "-i",
        source,
        "-c:v",
        "libx264",
        "-pix_fmt",
        "yuv420p",
        "-movflags",
        "+faststart",
        str(clip),
    )
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    frames = await sample_frames(
        Sandbox(MediaConfig()), clip, seconds, ModerationConfig(max_scene_frames=4), scratch
    )
    assert [f.kind for f in frames][:3] == ["first", "middle", "last"]
    assert all(f.jpeg.startswith(b"\xff\xd8") for f in frames)
    assert [f for f in frames if f.kind == "scene"] == []  # gray has none; 0.5 s none
