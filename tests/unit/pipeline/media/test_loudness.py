"""The loudness rules as pure functions: reading ebur128's printed figures, when a copy
stands, the gain (or loudnorm's second pass) that normalizes, and the plan's audio."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from aivedio.config.media import LoudnessConfig, MediaConfig, validate_loudness
from aivedio.config.moderation import ModerationConfig
from aivedio.errors import ConfigError
from aivedio.pipeline.ffmpeg.frames import frames_rider, source_frames_args
from aivedio.pipeline.media import loudness
from aivedio.pipeline.media import plan as plan_mod
from aivedio.pipeline.media.loudness import Loudness
from aivedio.pipeline.media.rider import RIDER_VIDEO
from aivedio.pipeline.media.sniff import MP4
from tests.unit.pipeline.media.test_validate import summary

CONFIG = LoudnessConfig()

PRINTED = """frame:0    pts:0       pts_time:0
lavfi.r128.M=-120.7
lavfi.r128.I=-70.000
lavfi.r128.LRA=0.000
lavfi.r128.true_peaks_ch0=0.020
lavfi.r128.true_peaks_ch1=0.010
frame:19   pts:91200   pts_time:1.9
lavfi.r128.M=-21.760
lavfi.r128.I=-21.778
lavfi.r128.LRA=3.500
lavfi.r128.true_peaks_ch0=0.092
lavfi.r128.true_peaks_ch1=0.100
"""


def measured(i: float, tp: float, lra: float = 4.0) -> Loudness:
    return Loudness(integrated_lufs=i, range_lu=lra, true_peak_dbtp=tp)


def test_the_last_frame_gives_the_figures_and_the_highest_peak_wins() -> None:
    got = loudness.parse_measurement(PRINTED)
    assert got == Loudness(integrated_lufs=-21.78, range_lu=3.5, true_peak_dbtp=-20.0)
    assert loudness.parse_measurement("") is None
    assert loudness.parse_measurement("lavfi.r128.I=nan\n") is None


def test_a_quiet_track_with_room_under_the_ceiling_gets_one_gain() -> None:
    assert loudness.normalize_filter(measured(-30.0, -20.0), CONFIG, 48000) == "volume=14.00dB"
    assert loudness.normalize_filter(measured(-6.0, -3.0), CONFIG, 48000) == "volume=-10.00dB"


def test_a_track_whose_peak_would_clip_gets_loudnorms_second_pass() -> None:
    chain = loudness.normalize_filter(measured(-30.0, -3.0, lra=6.0), CONFIG, 44100)
    assert chain.startswith("loudnorm=I=-16:TP=-1.5:LRA=11:measured_I=-30.00")
    assert "measured_LRA=6.00:measured_TP=-3.00:measured_thresh=-40.00" in chain
    assert chain.endswith(",aresample=44100")  # loudnorm works at 192 kHz


def test_silence_is_left_alone() -> None:
    quiet = measured(-70.0, -math.inf)
    assert quiet.silent and loudness.normalize_filter(quiet, CONFIG, 48000) == ""
    assert loudness.on_target(quiet, CONFIG)


@pytest.mark.parametrize(
    ("i", "tp", "on"),
    [(-16.0, -3.0, True), (-15.1, -1.0, True), (-14.5, -3.0, False), (-16.0, 0.0, False)],
)
def test_on_target_within_the_tolerance_and_under_the_ceiling(
    i: float, tp: float, on: bool
) -> None:
    assert loudness.on_target(measured(i, tp), CONFIG) is on


def test_the_plan_copies_audio_on_target_and_encodes_it_alone_when_off() -> None:
    s = summary()
    media = MediaConfig()
    on = plan_mod.make_plan(s, media, source_keyframes=[0.0], measured=measured(-16.2, -4.0))
    assert (on.mode, on.audio, on.audio_filter) == ("remux", "copy", "")
    off = plan_mod.make_plan(s, media, source_keyframes=[0.0], measured=measured(-8.0, -2.0))
    assert (off.mode, off.audio, off.audio_filter) == ("remux", "aac", "volume=-8.00dB")
    assert off.top.copy  # the video still copied
    tenant_off = plan_mod.make_plan(s, media, measured=measured(-8.0, -2.0), normalize=False)
    assert (tenant_off.audio, tenant_off.audio_filter) == ("copy", "")
    assert tenant_off.loudness == measured(-8.0, -2.0)  # recorded all the same
    transcode = plan_mod.make_plan(
        summary(video_codec="hevc"), media, measured=measured(-16.2, -4.0)
    )
    assert (transcode.audio, transcode.audio_filter) == ("aac", "volume=0.20dB")
    later = plan_mod.with_loudness(
        plan_mod.make_plan(s, media), s, media, measured(-30.0, -20.0), normalize=True
    )
    assert (later.audio, later.audio_filter) == ("aac", "volume=14.00dB")
    assert plan_mod.make_plan(summary(audio_codec=None), media).audio == "none"


def test_the_frames_pass_measures_the_audio_it_decodes() -> None:
    s = summary(audio_stream_index=3)
    args = source_frames_args(
        MP4,
        Path("/s.mp4"),
        s,
        ModerationConfig(),
        Path("/x"),
        max_streams=8,
        max_pixels=1 << 24,
        measure=True,
    )
    graph = args[args.index("-filter_complex") + 1]
    assert f"[0:3]{loudness.measure_filter()}[loudness]" in graph
    assert args.count("-i") == 1  # the same opening: no second decode


@pytest.mark.parametrize(
    ("change", "key"),
    [
        ({"target_lufs": 0.0}, "target_lufs"),
        ({"true_peak_dbtp": 1.0}, "true_peak_dbtp"),
        ({"range_lu": 0.5}, "range_lu"),
        ({"tolerance_lu": -1.0}, "tolerance_lu"),
    ],
)
def test_loudness_config_errors_name_their_key(change: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError, match=f"media.loudness.{key}"):
        validate_loudness(LoudnessConfig(**change))  # type: ignore[arg-type]


def test_riding_along_a_render_the_stills_and_the_loudness_go_to_the_frames_directory() -> None:
    s = summary(audio_stream_index=3)
    rider = frames_rider(
        s, ModerationConfig(), Path("/job/frames"), Path("/job/work"), check=True, measure=True
    )
    graph = ";".join(rider.graph)
    assert rider.xerror
    assert graph.startswith(f"{RIDER_VIDEO}setpts=PTS-STARTPTS,split=")
    # The render's working directory is work/: what the filters print goes to frames/.
    assert f"[0:3]{loudness.measure_filter('../frames/' + loudness.MEASURED)}[loudness]" in graph
    assert "file=../frames/scene_times.txt" in graph
    assert "/job/frames/first.jpg" in rider.outputs
    quiet = frames_rider(s, ModerationConfig(), Path("/job/frames"), Path("/job/work"), check=False)
    assert not quiet.xerror and "ebur128" not in ";".join(quiet.graph)
    assert "0:3" in quiet.outputs  # the audio still decoded, into the null muxer
    with pytest.raises(ValueError, match="plain relative path"):
        frames_rider(s, ModerationConfig(), Path("/job/fr:ames"), Path("/job/work"))
