"""Loudness through the media DAG, judged by ffmpeg's own ``ebur128`` of the outputs:
normalized outputs within 1 LU of the target, a remux's audio re-encoded only when it is
off target (its video still copied), and untouched when normalization is off."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from aivedio.config.media import MediaConfig, RungConfig
from aivedio.pipeline.ffmpeg.media_run import MediaRun
from aivedio.pipeline.ffmpeg.outputs import Report
from aivedio.pipeline.ffmpeg.sandbox import Sandbox
from aivedio.pipeline.media.ffmpeg_args import Layout
from tests.support import media_fixtures as mf
from tests.support.hls_check import check_hls

TARGET = -16.0
CEILING = -1.5
MEDIA = MediaConfig(ladder=[RungConfig(height=240), RungConfig(height=144)], segment_seconds=1)
WANTS = ["playback", "poster", "hls"]

# name -> (source generator, normalize for this run)
CASES: dict[str, tuple[Any, bool]] = {
    "loud_remux": (lambda d: mf.tone_at(d, volume_db=15), True),  # about -6 LUFS
    "quiet_transcode": (lambda d: mf.tone_at(d, volume_db=-15, pix_fmt="yuv444p"), True),
    "on_target_remux": (lambda d: mf.tone_at(d, volume_db=5.3), True),  # about -16 LUFS
    "loud_remux_off": (lambda d: mf.tone_at(d, volume_db=15), False),
}


class Made:
    def __init__(self, source: Path, report: Report, root: Path) -> None:
        self.source = source
        self.report = report
        self.layout = Layout(root)

    @property
    def rung_playlists(self) -> list[Path]:
        plan = self.report.plan
        assert plan is not None
        return [self.layout.hls_rung(rung) / "index.m3u8" for rung in plan.rungs]


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Any:
    root = tmp_path_factory.mktemp("loudness")
    cache = mf.MediaCache(root / "sources")
    done: dict[str, Made] = {}

    def get(name: str) -> Made:
        if name not in done:
            generator, normalize = CASES[name]
            source = cache.get(name.removesuffix("_off"), generator)
            out = root / "runs" / name

            async def main() -> Report:
                run = MediaRun(Sandbox(MEDIA), source, out)
                run.normalize = normalize  # the tenant's switch
                return await run.run(wants=WANTS)

            report = anyio.run(main)
            assert report.verdict.valid, report.verdict
            assert all(n.status == "done" for n in report.nodes.values()), report.failed()
            done[name] = Made(source, report, out)
        return done[name]

    return get


def assert_normalized(path: Path) -> None:
    figures = mf.ebur128_of(path)
    assert abs(figures["I"] - TARGET) <= 1.0, (path, figures)
    assert figures["TP"] <= CEILING + 0.5, (path, figures)


def test_a_loud_remux_gets_its_audio_alone_normalized(made: Any) -> None:
    m = made("loud_remux")
    source = mf.ebur128_of(m.source)
    assert source["I"] > TARGET + 5  # the source is loud, as made
    plan = m.report.plan
    assert plan.mode == "remux" and plan.top.copy and plan.audio == "aac"
    assert plan.loudness is not None
    assert plan.loudness.integrated_lufs == pytest.approx(source["I"], abs=0.2)
    assert plan.loudness.true_peak_dbtp == pytest.approx(source["TP"], abs=0.3)
    assert_normalized(m.layout.playback)
    for playlist in m.rung_playlists:
        assert_normalized(playlist)
    # The video is still the source's own bitstream.
    assert mf.stream_md5(m.layout.playback, "0:v:0") == mf.stream_md5(m.source, "0:v:0")
    assert check_hls(m.layout.hls / "master.m3u8") == []


def test_a_quiet_transcode_is_normalized_in_every_output(made: Any) -> None:
    m = made("quiet_transcode")
    assert mf.ebur128_of(m.source)["I"] < TARGET - 15
    assert m.report.plan.mode == "transcode"
    assert m.report.plan.audio_filter.startswith("volume=")  # linear: the peak allows it
    assert_normalized(m.layout.playback)
    for playlist in m.rung_playlists:
        assert_normalized(playlist)


def test_a_remux_within_the_tolerance_keeps_its_audio(made: Any) -> None:
    m = made("on_target_remux")
    assert abs(mf.ebur128_of(m.source)["I"] - TARGET) <= 1.0
    plan = m.report.plan
    assert plan.audio == "copy" and plan.audio_filter == ""
    assert plan.loudness is not None
    assert mf.stream_md5(m.layout.playback, "0:a:0") == mf.stream_md5(m.source, "0:a:0")


def test_with_normalization_off_the_audio_is_untouched(made: Any) -> None:
    m = made("loud_remux_off")
    plan = m.report.plan
    assert plan.audio == "copy" and plan.loudness is None
    assert "loudness" not in [p.step for p in m.report.processes]
    assert mf.stream_md5(m.layout.playback, "0:a:0") == mf.stream_md5(m.source, "0:a:0")
    assert mf.ebur128_of(m.layout.playback)["I"] > TARGET + 5
