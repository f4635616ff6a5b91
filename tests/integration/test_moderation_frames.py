"""The moderation job's frame sampler against real ffmpeg: the first, middle and last frames,
and scene changes at the times the clip has them (read from showinfo's lines)."""

from __future__ import annotations

from pathlib import Path

import pytest

from aivedio.media_config import MediaConfig
from aivedio.moderation_config import ModerationConfig
from aivedio.pipeline.moderation import sample_frames
from aivedio.pipeline.sandbox import Sandbox
from tests.media_fixtures import run_ffmpeg

pytestmark = [pytest.mark.anyio, pytest.mark.integration]


async def test_frames_are_sampled_at_the_scene_changes(tmp_path: Path) -> None:
    # Three seconds of black, white, black: scene changes at 1 s and at 2 s.
    clip = tmp_path / "clip.mp4"
    colors = [f"color=c={c}:s=160x120:r=10:d=1" for c in ("black", "white", "black")]
    run_ffmpeg(
        *[arg for color in colors for arg in ("-f", "lavfi", "-i", color)],
        "-filter_complex", "[0:v][1:v][2:v]concat=n=3:v=1:a=0[v]", "-map", "[v]",
        "-c:v", "libx264", "-pix_fmt", "yuv420p", "-movflags", "+faststart", str(clip),
    )  # fmt: skip
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    frames = await sample_frames(
        Sandbox(MediaConfig()), clip, 3.0, ModerationConfig(max_scene_frames=4), scratch
    )
    kinds = [f.kind for f in frames]
    assert kinds[:3] == ["first", "middle", "last"]
    assert all(f.jpeg.startswith(b"\xff\xd8") for f in frames)  # JPEG
    scenes = [round(f.seconds, 1) for f in frames if f.kind == "scene"]
    assert scenes == [1.0, 2.0]
