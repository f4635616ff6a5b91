"""The fast path's frames pass on real files: the decode check and the moderation frames in
one sandboxed decode, and what a failure of it means."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import pytest

from aivedio.config.media import MediaConfig
from aivedio.config.moderation import ModerationConfig
from aivedio.errors import InvalidMediaError, RenderError
from aivedio.pipeline.ffmpeg import frames as frames_module
from aivedio.pipeline.ffmpeg.frames import Frame, PosterShot, source_frames
from aivedio.pipeline.ffmpeg.media_run import MediaRun
from aivedio.pipeline.ffmpeg.sandbox import Sandbox
from aivedio.pipeline.ffmpeg.verdict import inspect_file
from aivedio.pipeline.media.plan import poster_seconds
from aivedio.pipeline.media.sniff import sniff_file
from tests.support import media_fixtures as mf
from tests.support.media_fixtures import MediaCache

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> MediaCache:
    return MediaCache(tmp_path_factory.mktemp("frames-media"))


async def frames_of(path: Path, tmp_path: Path, *, check: bool = True) -> list[Frame]:
    sandbox = Sandbox(MediaConfig(decode_check="none", scratch_dir=str(tmp_path / "s")))
    verdict, _ = await inspect_file(sandbox, path)
    assert verdict.valid and verdict.media is not None, verdict.reasons
    out = tmp_path / "frames"
    out.mkdir()
    return await source_frames(
        sandbox, sniff_file(path), path, verdict.media, ModerationConfig(), out, check=check
    )


async def test_the_three_stills_and_the_scene_frames_come_from_one_pass(
    cache: MediaCache, tmp_path: Path
) -> None:
    got = await frames_of(cache.get("av", mf.h264_faststart, seconds=3), tmp_path)
    kinds = [f.kind for f in got]
    assert kinds[:3] == ["first", "middle", "last"]
    assert all(f.jpeg.startswith(b"\xff\xd8") for f in got)
    # The last still is looked for in the final few frames only (0.2 s at 30 fps).
    assert [round(f.seconds, 2) for f in got[:3]] == [0.0, 1.5, 2.8]


async def test_the_last_still_is_the_final_frame(cache: MediaCache, tmp_path: Path) -> None:
    source = cache.get("av", mf.h264_faststart, seconds=3)
    got = await frames_of(source, tmp_path)
    last = next(f for f in got if f.kind == "last")
    (tmp_path / "last.jpg").write_bytes(last.jpeg)
    # The same scale and quality from a seek near the end, every frame overwriting the file.
    seek = ["-sseof", "-1", "-i", str(source), "-vf", "scale='min(480,iw)':-2"]
    jpeg = ["-q:v", frames_module.JPEG_QUALITY, "-update", "1", str(tmp_path / "final.jpg")]
    subprocess.run(["ffmpeg", "-v", "error", *seek, *jpeg], check=True)
    assert mf.picture_md5(tmp_path / "last.jpg") == mf.picture_md5(tmp_path / "final.jpg")


async def test_a_picture_shorter_than_its_sound_still_gets_its_middle_and_last_stills(
    cache: MediaCache, tmp_path: Path
) -> None:
    # 1.5 s of video, 6 s of audio: the container's duration is the audio's. Stills taken
    # at the container's middle and end would fall after the last frame.
    source = cache.get("short", mf.short_clip, video_seconds=1.5, audio_seconds=6.0)
    got = await frames_of(source, tmp_path)
    assert {"first", "middle", "last"} <= {f.kind for f in got}
    middle = next(f for f in got if f.kind == "middle")
    assert middle.seconds == pytest.approx(0.75, abs=0.05)


async def test_a_tail_that_does_not_decode_is_the_verdict(
    cache: MediaCache, tmp_path: Path
) -> None:
    with pytest.raises(InvalidMediaError) as caught:
        await frames_of(cache.get("tail", mf.tail_corrupted), tmp_path)
    assert caught.value.reasons == ["decode_failed"]


async def test_a_pass_that_fails_on_its_outputs_is_no_verdict_on_the_media(
    cache: MediaCache, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A JPEG that cannot be written (here: into a directory that does not exist) fails the
    # process; the plain decode that confirms a verdict passes, so it is a failed step.
    real = frames_module._still_output

    def unwritable(label: str, scratch: Path, *, one: bool) -> list[str]:
        return real(label, scratch / "missing", one=one)

    monkeypatch.setattr(frames_module, "_still_output", unwritable)
    with pytest.raises(RenderError) as caught:
        await frames_of(cache.get("av", mf.h264_faststart, seconds=3), tmp_path)
    assert not isinstance(caught.value, InvalidMediaError)


async def test_without_the_check_a_failed_pass_is_a_failed_step(
    cache: MediaCache, tmp_path: Path
) -> None:
    # The tail still does not decode, but no decode check was asked for: no verdict.
    got = await frames_of(cache.get("tail", mf.tail_corrupted), tmp_path, check=False)
    assert [f.kind for f in got][:1] == ["first"]


async def test_the_pass_takes_a_remuxs_poster_as_the_renders_seek_would(
    cache: MediaCache, tmp_path: Path
) -> None:
    # The fast path takes a remux's poster in its pass over the source instead of decoding
    # the source a second time: the same frame at the same size and quality as the seek.
    source = cache.get("av", mf.h264_faststart, seconds=3)
    media = MediaConfig(decode_check="none", scratch_dir=str(tmp_path / "s"))
    sandbox = Sandbox(media)
    verdict, _ = await inspect_file(sandbox, source)
    assert verdict.media is not None
    at = poster_seconds(verdict.media, media)
    out = tmp_path / "frames"
    out.mkdir()
    shot = PosterShot(at, tmp_path / "poster.jpg")
    got = await source_frames(
        sandbox, sniff_file(source), source, verdict.media, ModerationConfig(), out, poster=shot
    )
    assert {"first", "middle", "last"} <= {f.kind for f in got}
    run = MediaRun(sandbox, source, tmp_path / "seek")
    report = await run.run(wants=["poster"])
    assert report.plan is not None and report.plan.poster_seconds == at
    assert "poster" in report.outputs and shot.path.read_bytes()[:2] == b"\xff\xd8"
    assert mf.picture_md5(shot.path) == mf.picture_md5(run.layout.poster)


async def test_a_poster_another_pass_made_is_adopted_and_one_it_did_not_is_made_here(
    cache: MediaCache, tmp_path: Path
) -> None:
    source = cache.get("av", mf.h264_faststart, seconds=3)
    sandbox = Sandbox(MediaConfig(decode_check="none", scratch_dir=str(tmp_path / "s")))
    # Adopted: the file is moved into the layout and verified; no process runs for it.
    run = MediaRun(sandbox, source, tmp_path / "adopt")
    plan = (await run.run(plan_only=True)).plan
    assert plan is not None
    made = tmp_path / "made.jpg"
    subprocess.run(
        ["ffmpeg", "-v", "error", "-i", str(source), "-frames:v", "1", "-q:v", "2", str(made)],
        check=True,
    )
    before = len(run.report.processes) if run.report else 0
    report = await run.adopt("poster", made, plan)
    assert report.nodes["poster"].status == "done" and not made.exists()
    assert len(report.processes) == before
    digest = hashlib.sha256(run.layout.poster.read_bytes()).hexdigest()
    assert report.outputs["poster"].primary_file().sha256 == digest
    # Not written by the other pass: made here by the seek, as without it.
    again = MediaRun(sandbox, source, tmp_path / "fallback")
    plan = (await again.run(plan_only=True)).plan
    assert plan is not None
    report = await again.adopt("poster", tmp_path / "missing.jpg", plan)
    assert report.nodes["poster"].status == "done"
    assert any("poster_seek" in p.step for p in report.processes)
    # Not JPEG bytes: a failed node, never a recorded output.
    broken = MediaRun(sandbox, source, tmp_path / "broken")
    plan = (await broken.run(plan_only=True)).plan
    assert plan is not None
    bad = tmp_path / "bad.jpg"
    bad.write_bytes(b"not a picture")
    report = await broken.adopt("poster", bad, plan)
    assert report.nodes["poster"].status == "failed" and "poster" not in report.outputs
