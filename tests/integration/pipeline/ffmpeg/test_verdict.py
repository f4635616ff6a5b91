"""The verdict on every kind of input: ``inspect_file`` in process and ``aivedio probe`` as a
subprocess, against media generated once per module by ``tests/support/media_fixtures.py``.

Deterministic failures must come back as an ``invalid`` verdict with reason codes and error
class ``invalid_media``, never as an exception. Files refused by their magic bytes never reach
a process at all (``record`` stays empty); hostile playlists and concat scripts must never make
ffmpeg open their neighbours.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest

from aivedio.config.media import MediaConfig, ToleranceConfig
from aivedio.pipeline.ffmpeg.sandbox import RunResult, Sandbox
from aivedio.pipeline.ffmpeg.verdict import Verdict, inspect_file, verdict_json
from aivedio.pipeline.media.validate import Declared
from tests.support import media_fixtures as mf

pytestmark = pytest.mark.anyio

Generator = Callable[[Path], Path]


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> mf.MediaCache:
    return mf.MediaCache(tmp_path_factory.mktemp("media"))


@dataclass
class Inspected:
    verdict: Verdict
    record: list[RunResult]
    seconds: float

    @property
    def json(self) -> dict[str, Any]:
        return verdict_json(self.verdict)

    @property
    def media(self) -> dict[str, Any]:
        media: dict[str, Any] = self.json["media"]
        return media


async def inspect(
    path: Path, scratch: Path, *, declared: Declared | None = None, **media: Any
) -> Inspected:
    """``inspect_file`` with ``[media]`` overrides; the scratch base must be empty afterwards."""
    config = MediaConfig(scratch_dir=str(scratch), **media)
    tolerance = config.tolerances.get("runway")
    record: list[RunResult] = []
    started = time.monotonic()
    verdict, _ = await inspect_file(
        Sandbox(config), path, declared=declared, tolerance=tolerance, record=record
    )
    seconds = time.monotonic() - started
    assert not scratch.exists() or list(scratch.iterdir()) == []  # every scratch dir removed
    if verdict.valid:
        assert (verdict.error_class, verdict.reasons, verdict.detail) == (None, [], None)
    else:
        assert verdict.error_class == "invalid_media"
        assert verdict.reasons
    return Inspected(verdict, record, seconds)


# -- valid media ----------------------------------------------------------------------------


VALID: dict[str, tuple[Generator, dict[str, Any]]] = {
    "moov_at_end": (
        mf.h264_moov_at_end,
        {
            "container": "mov,mp4,m4a,3gp,3g2,mj2",
            "video_codec": "h264",
            "video_profile": "High",
            "pix_fmt": "yuv420p",
            "width": 640,
            "height": 360,
            "display_width": 640,
            "display_height": 360,
            "duration_seconds": 3.0,
            "frame_rate": 24.0,
            "variable_frame_rate": False,
            "audio_codec": "aac",
            "audio_profile": "LC",
            "audio_channels": 2,
            "audio_sample_rate": 48000,
            "audio_streams": 1,
        },
    ),
    "hevc_mkv": (
        mf.hevc_mkv,
        {
            "container": "matroska,webm",
            "video_codec": "hevc",
            "width": 320,
            "height": 240,
            "audio_codec": "aac",
        },
    ),
    "vp9_webm": (
        mf.vp9_webm,
        {"container": "matroska,webm", "video_codec": "vp9", "audio_codec": "opus"},
    ),
    "yuv444p": (
        mf.yuv444p_mp4,
        {"pix_fmt": "yuv444p", "video_profile": "High 4:4:4 Predictive", "audio_streams": 0},
    ),
    "no_audio": (
        mf.no_audio_mp4,
        {
            "audio_stream_index": None,
            "audio_codec": None,
            "audio_profile": None,
            "audio_sample_rate": None,
            "audio_channels": None,
            "audio_channel_layout": None,
            "audio_streams": 0,
            "video_streams": 1,
        },
    ),
    "vfr": (mf.vfr_mp4, {"variable_frame_rate": True, "real_frame_rate": 30.0}),
    "odd_dimensions": (mf.odd_dimensions_mp4, {"width": 639, "height": 359}),
    "h264_720p": (
        mf.h264_720p,
        {"width": 1280, "height": 720, "display_width": 1280, "display_height": 720},
    ),
}


@pytest.mark.parametrize("name", list(VALID))
async def test_valid_media(cache: mf.MediaCache, tmp_path: Path, name: str) -> None:
    generator, expected = VALID[name]
    path = cache.get(name, generator)
    got = await inspect(path, tmp_path / "scratch")
    assert got.verdict.valid, got.json
    assert got.verdict.decode_check == "sampled"
    assert got.verdict.network_isolated is True
    assert {key: got.media[key] for key in expected} == expected
    # One ffprobe, then one ffmpeg decode check, both in the network namespace.
    assert [(r.tool, r.ok, r.network_isolated) for r in got.record] == [
        ("ffprobe", True, True),
        ("ffmpeg", True, True),
    ]


async def test_vfr_average_rate_is_below_the_base_rate(
    cache: mf.MediaCache, tmp_path: Path
) -> None:
    got = await inspect(cache.get("vfr", mf.vfr_mp4), tmp_path / "scratch")
    assert 18.0 < got.media["frame_rate"] < 29.0


async def test_rotated_file_reports_a_right_angle_and_swaps_the_display_size(
    cache: mf.MediaCache, tmp_path: Path
) -> None:
    got = await inspect(cache.get("rotated", mf.rotated_90_mp4), tmp_path / "scratch")
    assert got.verdict.valid, got.json
    media = got.media
    # ffmpeg 5.1 writes the "rotate=90" tag as a display matrix it reads back as 90 degrees
    # counter-clockwise (270 clockwise); later versions flip the sign. Either way a quarter turn.
    assert media["rotation"] in (90, 270)
    assert (media["width"], media["height"]) == (320, 240)
    assert (media["display_width"], media["display_height"]) == (240, 320)


async def test_every_decode_mode_accepts_a_good_file(cache: mf.MediaCache, tmp_path: Path) -> None:
    path = cache.get("moov_at_end", mf.h264_moov_at_end)
    for mode, tools in (("full", ["ffprobe", "ffmpeg"]), ("none", ["ffprobe"])):
        got = await inspect(path, tmp_path / mode, decode_check=mode)
        assert got.verdict.valid and got.verdict.decode_check == mode
        assert [r.tool for r in got.record] == tools


# -- refused by magic bytes: no process at all -----------------------------------------------


@pytest.mark.parametrize(
    ("name", "generator", "container", "reason"),
    [
        ("zero_bytes", mf.zero_bytes, "empty", "empty_file"),
        ("random_bytes", mf.random_bytes, "unknown", "unrecognized_container"),
        ("html_error_page", mf.html_error_page, "html", "unsupported_container:html"),
        ("gzip_blob", mf.gzip_blob, "gzip", "unsupported_container:gzip"),
        ("png_renamed", mf.png_renamed, "png", "unsupported_container:png"),
    ],
)
async def test_refused_by_sniff(
    cache: mf.MediaCache,
    tmp_path: Path,
    name: str,
    generator: Generator,
    container: str,
    reason: str,
) -> None:
    got = await inspect(cache.get(name, generator), tmp_path / "scratch")
    assert got.json == {
        "verdict": "invalid",
        "error_class": "invalid_media",
        "reasons": [reason],
        "container": container,
        "media": None,
        "decode_check": "skipped",
        "network_isolated": None,  # nothing was started, so nothing was isolated
        "detail": None,
        "provenance": None,  # nor was the C2PA reader
    }
    assert got.record == []
    assert not (tmp_path / "scratch").exists()  # not even a scratch directory


# -- refused by ffprobe or by the rules -------------------------------------------------------


async def test_moov_missing(cache: mf.MediaCache, tmp_path: Path) -> None:
    got = await inspect(cache.get("moov_missing", mf.moov_missing), tmp_path / "scratch")
    assert got.verdict.reasons == ["moov_missing"]
    assert (got.verdict.container, got.verdict.media, got.verdict.decode_check) == (
        "mp4",
        None,
        "skipped",
    )
    assert got.verdict.detail is not None and "ffprobe exit" in got.verdict.detail
    assert [r.tool for r in got.record] == ["ffprobe"]


@pytest.mark.parametrize("mode", ["sampled", "full"])
async def test_truncated_at_half_passes_probe_but_fails_decode(
    cache: mf.MediaCache, tmp_path: Path, mode: str
) -> None:
    got = await inspect(
        cache.get("truncated", mf.truncated_half), tmp_path / "s", decode_check=mode
    )
    assert got.verdict.reasons == ["decode_failed"]
    assert got.verdict.decode_check == mode
    # ffprobe believed the moov at the front: the summary is there, full duration and all.
    assert got.media["duration_seconds"] == 3.0
    assert [(r.tool, r.ok) for r in got.record] == [("ffprobe", True), ("ffmpeg", False)]
    assert got.verdict.detail is not None and got.verdict.detail.startswith("decode_failed: ")


async def test_truncated_file_is_valid_without_a_decode_check(
    cache: mf.MediaCache, tmp_path: Path
) -> None:
    # decode_check = "none" trusts ffprobe, which reads only the headers: a file cut in half
    # with its moov at the front is accepted. This is what "none" costs.
    got = await inspect(
        cache.get("truncated", mf.truncated_half), tmp_path / "s", decode_check="none"
    )
    assert got.verdict.valid
    assert got.verdict.decode_check == "none"
    assert [r.tool for r in got.record] == ["ffprobe"]


@pytest.mark.parametrize("mode", ["sampled", "full"])
async def test_tail_corruption_fails_the_decode_check(
    cache: mf.MediaCache, tmp_path: Path, mode: str
) -> None:
    # The last 25% of mdat is garbage. "full" decodes everything; "sampled" decodes 1 s at the
    # head, the middle and the tail, and the tail sample (2.0-3.0 s of 3 s) lands in it.
    got = await inspect(cache.get("tail", mf.tail_corrupted), tmp_path / "s", decode_check=mode)
    assert got.verdict.reasons == ["decode_failed"]
    assert got.verdict.decode_check == mode
    assert got.verdict.media is not None


async def test_audio_only(cache: mf.MediaCache, tmp_path: Path) -> None:
    got = await inspect(cache.get("audio_only", mf.audio_only_m4a), tmp_path / "scratch")
    assert (got.verdict.reasons, got.verdict.media, got.verdict.decode_check) == (
        ["audio_only"],
        None,
        "skipped",
    )
    assert [r.tool for r in got.record] == ["ffprobe"]


async def test_twenty_audio_streams_use_the_default_one_and_list_the_rest(
    cache: mf.MediaCache, tmp_path: Path
) -> None:
    # 21 streams, under the demuxer's cap (32); the third audio stream (absolute index 3) has
    # the default disposition. Refused as too_many_streams before: ffprobe ran under
    # -max_streams 8, and past it a rule allowed 4 audio streams.
    path = cache.get("tagged_x20", mf.tagged_audio_streams, n=20, default=2)
    got = await inspect(path, tmp_path / "a")
    assert got.verdict.valid, got.json
    media = got.media
    assert (media["audio_stream_index"], media["audio_streams"]) == (3, 20)
    assert (media["audio_codec"], media["audio_channels"]) == ("aac", 1)
    assert [
        (i["index"], i["codec_type"], i["language"], i["why"]) for i in media["ignored_streams"]
    ] == [(k + 1, "audio", mf.LANGUAGES[k], "not_chosen") for k in range(20) if k != 2]
    # Without a default disposition (every track flagged alike): the first audio stream.
    plain = await inspect(cache.get("audio_x20", mf.many_audio_streams, n=20), tmp_path / "b")
    assert plain.verdict.valid, plain.json
    assert plain.media["audio_stream_index"] == 1
    assert len(plain.media["ignored_streams"]) == 19


@pytest.mark.parametrize(("audios", "valid"), [(31, True), (32, False)])
async def test_only_more_streams_than_the_demuxers_cap_are_refused(
    cache: mf.MediaCache, tmp_path: Path, audios: int, valid: bool
) -> None:
    # 1 video + 31 audio streams is exactly max_streams (32); one more is past it.
    got = await inspect(
        cache.get(f"audio_x{audios}", mf.many_audio_streams, n=audios), tmp_path / "s"
    )
    if valid:
        assert got.verdict.valid, got.json
        assert len(got.media["ignored_streams"]) == audios - 1
    else:
        # ffprobe's own -max_streams stops the demuxer ("Cannot allocate memory" on
        # stderr): a verdict, not resource exhaustion, and no decode after it.
        assert got.verdict.reasons == ["too_many_streams"]
        assert got.verdict.media is None
        assert got.verdict.detail is not None and "max_streams" in got.verdict.detail
        assert [r.tool for r in got.record] == ["ffprobe"]
    # The cap is the configured one.
    lower = await inspect(
        cache.get("audio_x20", mf.many_audio_streams, n=20), tmp_path / "l", max_streams=8
    )
    assert lower.verdict.reasons == ["too_many_streams"]


async def test_the_default_video_stream_is_the_one_validated(
    cache: mf.MediaCache, tmp_path: Path
) -> None:
    got = await inspect(cache.get("two_videos", mf.two_video_streams), tmp_path / "s")
    assert got.verdict.valid, got.json  # not refused as multiple_video_streams any more
    media = got.media
    assert (media["video_stream_index"], media["width"], media["height"]) == (1, 480, 270)
    assert (media["video_streams"], media["audio_stream_index"]) == (2, 2)
    assert [(i["index"], i["why"]) for i in media["ignored_streams"]] == [(0, "not_chosen")]


@pytest.mark.parametrize(
    ("name", "make", "reasons"),
    [
        ("1x1", lambda d: mf.sized_video(d, width=1, height=1), ["dimensions_too_small:1x1"]),
        (
            "4000x2",
            lambda d: mf.sized_video(d, width=4000, height=2),
            ["dimensions_too_small:4000x2"],
        ),
        (
            "2x4000",
            lambda d: mf.sized_video(d, width=2, height=4000),
            ["dimensions_too_small:2x4000"],
        ),
        ("15x16", lambda d: mf.sized_video(d, width=15, height=16), ["dimensions_too_small:15x16"]),
        ("16x16", lambda d: mf.sized_video(d, width=16, height=16), []),
        ("0.05s", lambda d: mf.short_clip(d, video_seconds=0.05), ["duration_too_short"]),
        ("0.1s", lambda d: mf.short_clip(d, video_seconds=0.1), []),
        # One frame under 3 s of sound: the file lasts 3 s, the picture 0.04 s.
        (
            "frame_under_audio",
            lambda d: mf.short_clip(d, video_seconds=0.04, audio_seconds=3),
            ["video_duration_too_short"],
        ),
    ],
)
async def test_minimum_size_and_duration(
    cache: mf.MediaCache, tmp_path: Path, name: str, make: Generator, reasons: list[str]
) -> None:
    got = await inspect(cache.get(f"small_{name}", make), tmp_path / "s")
    assert got.verdict.reasons == reasons, got.json
    assert got.verdict.media is not None  # probed: the summary says what was found
    if reasons:
        assert got.verdict.decode_check == "skipped"
        assert [r.tool for r in got.record] == ["ffprobe"]
    # Configurable: the same source under lower minimums.
    relaxed = await inspect(
        cache.get(f"small_{name}", make),
        tmp_path / "r",
        min_width=1,
        min_height=1,
        min_duration_seconds=0.01,
    )
    assert relaxed.verdict.valid, relaxed.json


async def test_decompression_bomb_is_refused_without_decoding(
    cache: mf.MediaCache, tmp_path: Path
) -> None:
    path = cache.get("bomb", mf.decompression_bomb)
    got = await inspect(path, tmp_path / "scratch")
    assert got.verdict.reasons in (
        ["too_many_pixels"],
        ["dimensions_too_large:16000x16000", "too_many_pixels"],
    )
    assert got.seconds < 30
    # ffprobe refused the 16000x16000 picture (max_pixels 4096*4096); ffmpeg never started.
    assert [r.tool for r in got.record] == ["ffprobe"]
    assert got.verdict.detail is not None and "max pixel count" in got.verdict.detail


async def test_decompression_bomb_past_the_parser_limit_is_stopped_by_the_rules(
    cache: mf.MediaCache, tmp_path: Path
) -> None:
    path = cache.get("bomb", mf.decompression_bomb)
    got = await inspect(path, tmp_path / "scratch", max_pixels=16000 * 16000)
    assert "dimensions_too_large:16000x16000" in got.verdict.reasons
    assert got.seconds < 30
    assert [r.tool for r in got.record] == ["ffprobe"]  # still no decode check


async def test_header_claiming_16384_square_is_invalid(
    cache: mf.MediaCache, tmp_path: Path
) -> None:
    got = await inspect(cache.get("huge", mf.header_claims_huge), tmp_path / "scratch")
    # ffmpeg 5.1 refuses 16384x16384 in libavutil and ffprobe reports width=height=0 with no
    # pixel format (exit 0), so the rules speak rather than the parser limit.
    assert got.verdict.reasons == ["zero_dimensions", "pixel_format_unknown"]
    assert (got.media["width"], got.media["height"]) == (0, 0)
    assert [r.tool for r in got.record] == ["ffprobe"]


async def test_header_claiming_15360_square_hits_the_pixel_limit(
    cache: mf.MediaCache, tmp_path: Path
) -> None:
    path = cache.get("huge15360", mf.header_claims_huge, width=15360, height=15360)
    got = await inspect(path, tmp_path / "scratch")
    assert got.verdict.reasons == ["too_many_pixels"]
    assert [r.tool for r in got.record] == ["ffprobe"]


async def test_matroska_with_a_nan_rotate_tag_gets_a_verdict(tmp_path: Path) -> None:
    # The Matroska muxer upper-cases tag names, so write ROTATX and patch it to "rotate".
    made = tmp_path / "made.mkv"
    mf.run_ffmpeg(
        *("-f", "lavfi", "-i", "testsrc2=s=160x120:r=10:d=1", "-c:v", "libx264"),
        *("-preset", "ultrafast", "-write_crc32", "0", "-metadata:s:v:0", "rotatx=nan"),
        str(made),
    )
    data = made.read_bytes()
    assert data.count(b"ROTATX") == 1
    path = tmp_path / "nan_rotate.mkv"
    path.write_bytes(data.replace(b"ROTATX", b"rotate"))
    assert mf.ffprobe_streams(path)[0]["tags"]["rotate"] == "nan"
    got = await inspect(path, tmp_path / "scratch")
    assert got.verdict.media is not None and got.media["rotation"] == 0


# -- playlists and concat scripts disguised as .mp4 ------------------------------------------


def _files_containing(root: Path, marker: bytes, *, skip: Path | None = None) -> list[Path]:
    found = []
    for path in root.rglob("*"):
        regular = path.is_file() and not path.is_symlink() and path != skip
        if regular and marker in path.read_bytes():
            found.append(path)
    return found


DISGUISES = {
    "hls": (mf.hls_disguised, "hls_playlist", "unsupported_container:hls_playlist"),
    "concat": (mf.concat_disguised, "concat_script", "unsupported_container:concat_script"),
}


@pytest.mark.parametrize("disguise", list(DISGUISES))
@pytest.mark.parametrize("target", ["neighbour", "etc_passwd"])
async def test_disguised_playlist_never_opens_its_target(
    tmp_path: Path, disguise: str, target: str
) -> None:
    make, container, reason = DISGUISES[disguise]
    upload = tmp_path / "upload"
    if target == "neighbour":
        # .ts: the Debian ffmpeg hls demuxer would really open this one (see neighbour_secret).
        secret, marker = mf.neighbour_secret(upload, name="secret.ts")
    else:
        secret = Path("/etc/passwd")
        marker = secret.read_bytes().splitlines()[0]
    path = make(upload, secret)
    assert str(secret.resolve()) in path.read_text()

    got = await inspect(path, tmp_path / "scratch")
    assert (got.verdict.reasons, got.verdict.container) == ([reason], container)
    assert got.record == []  # refused before any process started
    assert marker.decode() not in json.dumps(got.json)

    # The same through the real command, with its own scratch base to scan afterwards.
    run = await probe_cli(path, tmp_path)
    assert run.code == 5
    assert (run.verdict["verdict"], run.verdict["reasons"]) == ("invalid", [reason])
    assert marker not in run.stdout + run.stderr
    assert _files_containing(tmp_path, marker, skip=secret) == []


async def test_stock_ffprobe_does_open_the_neighbour_of_a_disguised_playlist(
    tmp_path: Path,
) -> None:
    """Why the forced demuxer matters: ffprobe left to probe ``x.mp4`` itself picks the hls
    demuxer from the content and reads the neighbouring MPEG-TS file's packets."""
    upload = tmp_path / "upload"
    upload.mkdir()
    neighbour = upload / "secret.ts"
    mf.run_ffmpeg(
        *("-f", "lavfi", "-i", "testsrc2=s=160x120:r=10:d=1", "-c:v", "libx264"),
        *("-preset", "ultrafast", "-f", "mpegts"),
        str(neighbour),
    )
    path = mf.hls_disguised(upload, neighbour)
    assert path.name == "x.mp4" and path.stat().st_size < 300

    stock = subprocess.run(
        ["ffprobe", "-v", "error", "-show_packets", "-show_format", "-of", "json", str(path)],
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert stock.returncode == 0, stock.stderr
    shown = json.loads(stock.stdout)
    assert shown["format"]["format_name"] == "hls"
    assert len(shown["packets"]) >= 10  # 1 s at 10 fps, read out of secret.ts
    assert {p["codec_type"] for p in shown["packets"]} == {"video"}

    got = await inspect(path, tmp_path / "scratch")
    assert got.verdict.reasons == ["unsupported_container:hls_playlist"]
    assert got.record == []


async def test_a_playlist_behind_mp4_magic_meets_only_the_mov_demuxer(tmp_path: Path) -> None:
    # An 8-byte "free" box in front passes the sniff as MP4; the forced mov demuxer then finds
    # no moov. The hls demuxer is never consulted (it is not in the format whitelist either).
    secret, marker = mf.neighbour_secret(tmp_path / "upload", name="secret.ts")
    path = tmp_path / "upload" / "poly.mp4"
    playlist = mf.hls_disguised(tmp_path / "pl", secret).read_bytes()
    path.write_bytes(b"\0\0\0\x08free" + playlist)
    got = await inspect(path, tmp_path / "scratch")
    assert (got.verdict.container, got.verdict.reasons) == ("mp4", ["moov_missing"])
    assert marker.decode() not in json.dumps(got.json)


# -- per-provider tolerances ------------------------------------------------------------------

RUNWAY = ToleranceConfig(
    duration_seconds=0.5, duration_ratio=0.0, resolution_ratio=0.0, aspect_ratio=0.02
)


@pytest.mark.parametrize(
    ("declared", "tolerance", "reasons"),
    [
        (Declared(duration_seconds=3.0, width=640, height=360), RUNWAY, []),
        (Declared(duration_seconds=3.4), RUNWAY, []),
        (Declared(duration_seconds=3.6), RUNWAY, ["duration_mismatch"]),
        (Declared(duration_seconds=2.0), RUNWAY, ["duration_mismatch"]),
        (Declared(width=1280, height=720), RUNWAY, ["resolution_mismatch"]),
        (Declared(width=640, height=480), RUNWAY, ["resolution_mismatch", "aspect_mismatch"]),
        (
            Declared(width=640, height=480),
            ToleranceConfig(resolution_ratio=0.5),
            ["aspect_mismatch"],
        ),
        (Declared(width=648, height=364), ToleranceConfig(resolution_ratio=0.02), []),
        (
            Declared(duration_seconds=5.0, width=1280, height=960),
            RUNWAY,
            ["duration_mismatch", "resolution_mismatch", "aspect_mismatch"],
        ),
    ],
)
async def test_provider_tolerances(
    cache: mf.MediaCache,
    tmp_path: Path,
    declared: Declared,
    tolerance: ToleranceConfig,
    reasons: list[str],
) -> None:
    path = cache.get("moov_at_end", mf.h264_moov_at_end)
    got = await inspect(
        path, tmp_path / "scratch", declared=declared, tolerances={"runway": tolerance}
    )
    assert got.verdict.reasons == reasons
    assert got.verdict.media is not None  # a mismatch still reports what the file is
    if reasons:
        assert got.verdict.decode_check == "skipped"


async def test_tolerances_compare_the_rotated_display_size(
    cache: mf.MediaCache, tmp_path: Path
) -> None:
    path = cache.get("rotated", mf.rotated_90_mp4)
    portrait = Declared(duration_seconds=2.0, width=240, height=320)
    got = await inspect(path, tmp_path / "a", declared=portrait, tolerances={"runway": RUNWAY})
    assert got.verdict.valid
    landscape = Declared(width=320, height=240)
    got = await inspect(path, tmp_path / "b", declared=landscape, tolerances={"runway": RUNWAY})
    assert got.verdict.reasons == ["resolution_mismatch", "aspect_mismatch"]


# -- network isolation is recorded ------------------------------------------------------------


@pytest.mark.parametrize(("mode", "isolated"), [("auto", True), ("required", True), ("off", False)])
async def test_network_isolation_is_recorded(
    cache: mf.MediaCache, tmp_path: Path, mode: str, isolated: bool
) -> None:
    # unshare -n works here (root); "off" must not even try.
    path = cache.get("no_audio", mf.no_audio_mp4)
    got = await inspect(path, tmp_path / "scratch", network_isolation=mode)
    assert got.verdict.valid
    assert got.verdict.network_isolated is isolated
    assert [r.network_isolated for r in got.record] == [isolated, isolated]
    invalid = await inspect(
        cache.get("moov_missing", mf.moov_missing), tmp_path / "s2", network_isolation=mode
    )
    assert invalid.verdict.network_isolated is isolated


# -- the command ------------------------------------------------------------------------------


@dataclass
class CliRun:
    code: int
    stdout: bytes
    stderr: bytes

    @property
    def verdict(self) -> dict[str, Any]:
        lines = self.stdout.decode().splitlines()
        assert len(lines) == 1, self.stdout
        verdict: dict[str, Any] = json.loads(lines[0])
        return verdict


CLI_CONFIG = """\
[media]
scratch_dir = "{scratch}"

[media.tolerances.runway]
duration_seconds = 0.5
duration_ratio = 0.0

[media.tolerances.kling]
duration_seconds = 5.0
"""


async def probe_cli(path: Path, tmp_path: Path, *args: str) -> CliRun:
    """``python -m aivedio probe`` with no AIVEDIO_* variables (no secret, no database)."""
    scratch = tmp_path / "cli-scratch"
    config = tmp_path / "aivedio.toml"
    config.write_text(CLI_CONFIG.format(scratch=scratch), encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIVEDIO_")}
    work = tmp_path / "cli-cwd"
    work.mkdir(exist_ok=True)
    argv = [sys.executable, "-m", "aivedio", "probe", "--config", str(config), *args, str(path)]
    with anyio.fail_after(60):
        proc = await anyio.run_process(argv, check=False, env=env, cwd=work)
    assert not scratch.exists() or list(scratch.iterdir()) == []
    assert list(work.iterdir()) == []
    return CliRun(proc.returncode, proc.stdout, proc.stderr)


CLI_CASES: dict[str, tuple[str, Generator, int, list[str]]] = {
    "valid": ("moov_at_end", mf.h264_moov_at_end, 0, []),
    "zero_bytes": ("zero_bytes", mf.zero_bytes, 5, ["empty_file"]),
    "html": ("html_error_page", mf.html_error_page, 5, ["unsupported_container:html"]),
    "truncated": ("truncated", mf.truncated_half, 5, ["decode_failed"]),
    "tagged_x20": ("tagged_x20", lambda d: mf.tagged_audio_streams(d, n=20, default=2), 0, []),
    "audio_x32": ("audio_x32", lambda d: mf.many_audio_streams(d, n=32), 5, ["too_many_streams"]),
    "1x1": (
        "small_1x1",
        lambda d: mf.sized_video(d, width=1, height=1),
        5,
        ["dimensions_too_small:1x1"],
    ),
    "bomb": ("bomb", mf.decompression_bomb, 5, ["too_many_pixels"]),
}


@pytest.mark.parametrize("case", list(CLI_CASES))
async def test_cli_verdicts(cache: mf.MediaCache, tmp_path: Path, case: str) -> None:
    name, generator, code, reasons = CLI_CASES[case]
    run = await probe_cli(cache.get(name, generator), tmp_path)
    assert run.code == code, run.stderr
    verdict = run.verdict
    assert set(verdict) >= {"verdict", "error_class", "reasons", "media", "decode_check"}
    assert verdict["reasons"] == reasons
    if code == 0:
        assert (verdict["verdict"], verdict["error_class"]) == ("valid", None)
        assert verdict["media"]["video_codec"] == "h264"
        assert verdict["media"]["audio_codec"] == "aac"
        assert verdict["network_isolated"] is True
    else:
        assert (verdict["verdict"], verdict["error_class"]) == ("invalid", "invalid_media")
    if case == "truncated":
        assert verdict["decode_check"] == "sampled"
        assert verdict["media"]["duration_seconds"] == 3.0
    if case in ("zero_bytes", "html", "bomb", "audio_x32"):
        assert verdict["media"] is None
    if case == "tagged_x20":  # what ``aivedio probe`` prints: the choice and what it ignored
        assert verdict["media"]["audio_stream_index"] == 3
        ignored = verdict["media"]["ignored_streams"]
        assert [i["index"] for i in ignored] == [1, 2, *range(4, 21)]
        assert ignored[0] == {
            "index": 1,
            "codec_type": "audio",
            "codec_name": "aac",
            "language": "eng",
            "why": "not_chosen",
        }


@pytest.mark.parametrize(
    ("args", "code", "reasons"),
    [
        (["--provider", "runway", "--expect-duration", "3.4"], 0, []),
        (["--provider", "runway", "--expect-duration", "5"], 5, ["duration_mismatch"]),
        (["--provider", "kling", "--expect-duration", "5"], 0, []),
        # no [media.tolerances.X]: the defaults (1 s or 10%, exact resolution)
        (["--provider", "luma", "--expect-duration", "5"], 5, ["duration_mismatch"]),
        (["--expect-resolution", "640x360"], 0, []),
        (["--expect-resolution", "1280X720"], 5, ["resolution_mismatch"]),
        (["--expect-resolution", "360x640"], 5, ["resolution_mismatch", "aspect_mismatch"]),
    ],
)
async def test_cli_declared_values_and_provider_tolerances(
    cache: mf.MediaCache, tmp_path: Path, args: list[str], code: int, reasons: list[str]
) -> None:
    run = await probe_cli(cache.get("moov_at_end", mf.h264_moov_at_end), tmp_path, *args)
    assert run.code == code, run.stderr
    assert run.verdict["reasons"] == reasons
    assert run.verdict["media"]["duration_seconds"] == 3.0


async def test_cli_bad_usage(cache: mf.MediaCache, tmp_path: Path) -> None:
    missing = await probe_cli(tmp_path / "nope.mp4", tmp_path)
    assert (missing.code, missing.stdout) == (2, b"")
    assert b"no such file" in missing.stderr
    path = cache.get("moov_at_end", mf.h264_moov_at_end)
    bad = await probe_cli(path, tmp_path, "--expect-resolution", "wide")
    assert bad.code != 0 and bad.stdout == b""
    assert b"--expect-resolution" in bad.stderr
