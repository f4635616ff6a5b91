"""The media generators make what they promise (checked with ffprobe/ffmpeg and by hand)."""

from __future__ import annotations

import gzip
import struct
import subprocess
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

from tests.support import media_fixtures as mf


def only(out: Path, directory: Path) -> None:
    """The generator left nothing behind but its output."""
    assert sorted(directory.iterdir()) == [out]
    assert out.is_file()


def streams_of(path: Path, kind: str) -> list[dict[str, Any]]:
    return [s for s in mf.ffprobe_streams(path) if s["codec_type"] == kind]


def rotation(stream: dict[str, Any]) -> float | None:
    for side in stream.get("side_data_list", []):
        if "rotation" in side:
            return float(side["rotation"])
    rotate = stream.get("tags", {}).get("rotate")
    return float(rotate) if rotate is not None else None


# -- box parsing ------------------------------------------------------------------------------


def test_top_level_boxes_handles_largesize_and_size_zero(tmp_path: Path) -> None:
    ftyp = struct.pack(">I4s", 16, b"ftyp") + b"isom\0\0\0\0"
    large = struct.pack(">I4sQ", 1, b"mdat", 16 + 5) + b"12345"
    last = struct.pack(">I4s", 0, b"moov") + b"rest of file"
    path = tmp_path / "boxes.mp4"
    path.write_bytes(ftyp + large + last)
    assert mf.top_level_boxes(path) == ["ftyp", "mdat", "moov"]


def test_top_level_boxes_stops_at_a_truncated_header(tmp_path: Path) -> None:
    path = tmp_path / "cut.mp4"
    path.write_bytes(struct.pack(">I4s", 16, b"ftyp") + b"isom\0\0\0\0" + b"\0\0\0")
    assert mf.top_level_boxes(path) == ["ftyp"]
    path.write_bytes(b"")
    assert mf.top_level_boxes(path) == []


# -- ordinary sources -------------------------------------------------------------------------


def test_h264_moov_at_end(tmp_path: Path) -> None:
    out = mf.h264_moov_at_end(tmp_path)
    only(out, tmp_path)
    boxes = mf.top_level_boxes(out)
    assert boxes.index("mdat") < boxes.index("moov")
    [video] = streams_of(out, "video")
    assert (video["codec_name"], video["profile"], video["pix_fmt"]) == ("h264", "High", "yuv420p")
    assert (video["width"], video["height"]) == (640, 360)
    assert Fraction(video["r_frame_rate"]) == 24
    [audio] = streams_of(out, "audio")
    assert (audio["codec_name"], audio["profile"]) == ("aac", "LC")
    assert float(mf.ffprobe_json(out)["format"]["duration"]) == pytest.approx(3, abs=0.1)


def test_h264_moov_at_end_options(tmp_path: Path) -> None:
    out = mf.h264_moov_at_end(tmp_path, width=320, height=240, seconds=1, fps=30, audio=False)
    [video] = mf.ffprobe_streams(out)
    assert (video["width"], video["height"], video["r_frame_rate"]) == (320, 240, "30/1")
    assert mf.top_level_boxes(out)[-1] == "moov"


def test_h264_faststart_has_moov_first(tmp_path: Path) -> None:
    out = mf.h264_faststart(tmp_path)
    boxes = mf.top_level_boxes(out)
    assert boxes.index("moov") < boxes.index("mdat")


@pytest.mark.parametrize(
    ("make", "size"), [(mf.h264_720p, (1280, 720)), (mf.h264_1080p, (1920, 1080))]
)
def test_h264_sizes(tmp_path: Path, make: Callable[[Path], Path], size: tuple[int, int]) -> None:
    out = make(tmp_path)
    only(out, tmp_path)
    [video] = streams_of(out, "video")
    assert (video["codec_name"], video["pix_fmt"]) == ("h264", "yuv420p")
    assert (video["width"], video["height"]) == size
    assert [a["codec_name"] for a in streams_of(out, "audio")] == ["aac"]
    assert float(mf.ffprobe_json(out)["format"]["duration"]) == pytest.approx(2, abs=0.1)


def test_hevc_mkv(tmp_path: Path) -> None:
    out = mf.hevc_mkv(tmp_path)
    only(out, tmp_path)
    assert "matroska" in mf.ffprobe_json(out)["format"]["format_name"]
    assert [s["codec_name"] for s in mf.ffprobe_streams(out)] == ["hevc", "aac"]


def test_vp9_webm(tmp_path: Path) -> None:
    out = mf.vp9_webm(tmp_path)
    only(out, tmp_path)
    assert "webm" in mf.ffprobe_json(out)["format"]["format_name"]
    assert [s["codec_name"] for s in mf.ffprobe_streams(out)] == ["vp9", "opus"]


def test_yuv444p_mp4(tmp_path: Path) -> None:
    out = mf.yuv444p_mp4(tmp_path)
    only(out, tmp_path)
    [video] = mf.ffprobe_streams(out)
    assert (video["codec_name"], video["pix_fmt"]) == ("h264", "yuv444p")
    assert video["profile"] == "High 4:4:4 Predictive"


def test_no_audio_mp4(tmp_path: Path) -> None:
    out = mf.no_audio_mp4(tmp_path)
    only(out, tmp_path)
    assert [s["codec_type"] for s in mf.ffprobe_streams(out)] == ["video"]


def test_rotated_90_mp4(tmp_path: Path) -> None:
    out = mf.rotated_90_mp4(tmp_path)
    only(out, tmp_path)
    [video] = streams_of(out, "video")
    assert rotation(video) in (90.0, -90.0)
    assert (video["width"], video["height"]) == (320, 240)  # stored size; display is 240x320
    assert len(streams_of(out, "audio")) == 1


def test_vfr_mp4(tmp_path: Path) -> None:
    out = mf.vfr_mp4(tmp_path)
    only(out, tmp_path)
    [video] = mf.ffprobe_streams(out)
    assert Fraction(video["avg_frame_rate"]) != Fraction(video["r_frame_rate"])
    assert Fraction(video["avg_frame_rate"]) < 25 < Fraction(video["r_frame_rate"])


def test_odd_dimensions_mp4(tmp_path: Path) -> None:
    out = mf.odd_dimensions_mp4(tmp_path)
    only(out, tmp_path)
    [video] = mf.ffprobe_streams(out)
    assert (video["width"], video["height"]) == (639, 359)
    assert video["codec_name"] == "h264"


def test_audio_only_m4a(tmp_path: Path) -> None:
    out = mf.audio_only_m4a(tmp_path)
    only(out, tmp_path)
    assert out.suffix == ".mp4"
    [audio] = mf.ffprobe_streams(out)
    assert (audio["codec_type"], audio["codec_name"], audio["profile"]) == ("audio", "aac", "LC")
    assert "mp4" in mf.ffprobe_json(out)["format"]["format_name"]


def test_many_audio_streams(tmp_path: Path) -> None:
    out = mf.many_audio_streams(tmp_path)
    only(out, tmp_path)
    kinds = [s["codec_type"] for s in mf.ffprobe_streams(out)]
    assert kinds.count("video") == 1
    assert kinds.count("audio") == 20


def test_many_audio_streams_n(tmp_path: Path) -> None:
    out = mf.many_audio_streams(tmp_path, n=3)
    assert len(streams_of(out, "audio")) == 3


def test_tagged_audio_streams(tmp_path: Path) -> None:
    out = mf.tagged_audio_streams(tmp_path, n=4, default=2)
    only(out, tmp_path)
    audios = streams_of(out, "audio")
    assert [(s["index"], s["disposition"]["default"], s["tags"]["language"]) for s in audios] == [
        (1, 0, "eng"),
        (2, 0, "fra"),
        (3, 1, "deu"),
        (4, 0, "spa"),
    ]
    for k, stream in enumerate(audios):
        assert stream["channels"] == 1
        assert mf.tone_of(out, f"0:{stream['index']}") == pytest.approx(mf.audio_tone_hz(k), abs=5)
    [video] = streams_of(out, "video")
    assert video["pix_fmt"] == "yuv420p"


def test_two_video_streams(tmp_path: Path) -> None:
    out = mf.two_video_streams(tmp_path)
    only(out, tmp_path)
    videos = streams_of(out, "video")
    assert [(s["width"], s["height"], s["disposition"]["default"]) for s in videos] == [
        (320, 240, 0),
        (480, 270, 1),
    ]


@pytest.mark.parametrize(("width", "height"), [(1, 1), (4000, 2), (16, 16)])
def test_sized_video(tmp_path: Path, width: int, height: int) -> None:
    out = mf.sized_video(tmp_path, width=width, height=height)
    only(out, tmp_path)
    [video] = streams_of(out, "video")
    assert (video["width"], video["height"], video["sample_aspect_ratio"]) == (
        width,
        height,
        "1:1",
    )


def test_short_clip(tmp_path: Path) -> None:
    out = mf.short_clip(tmp_path, video_seconds=0.05)
    only(out, tmp_path)
    assert float(mf.ffprobe_json(out)["format"]["duration"]) == pytest.approx(0.05, abs=0.001)
    assert streams_of(out, "audio") == []
    under = mf.short_clip(tmp_path, video_seconds=0.04, audio_seconds=3)
    [video], [audio] = streams_of(under, "video"), streams_of(under, "audio")
    assert (float(video["duration"]), float(audio["duration"])) == (0.04, 3.0)


# -- hostile inputs ---------------------------------------------------------------------------


def test_truncated_half_probes_but_does_not_decode(tmp_path: Path) -> None:
    out = mf.truncated_half(tmp_path)
    only(out, tmp_path)
    info = mf.ffprobe_json(out)
    assert [s["codec_name"] for s in info["streams"]] == ["h264", "aac"]
    assert float(info["format"]["duration"]) == pytest.approx(3, abs=0.1)
    assert mf.decode(out, xerror=True).returncode != 0


def test_moov_missing(tmp_path: Path) -> None:
    out = mf.moov_missing(tmp_path)
    only(out, tmp_path)
    boxes = mf.top_level_boxes(out)
    assert "mdat" in boxes
    assert "moov" not in boxes
    with pytest.raises(mf.MediaToolError, match="moov atom not found"):
        mf.ffprobe_json(out)


def test_zero_bytes(tmp_path: Path) -> None:
    out = mf.zero_bytes(tmp_path)
    only(out, tmp_path)
    assert out.stat().st_size == 0


def test_random_bytes(tmp_path: Path) -> None:
    out = mf.random_bytes(tmp_path)
    only(out, tmp_path)
    assert out.stat().st_size == 64 * 1024
    again = mf.random_bytes(tmp_path)
    assert again != out
    assert again.read_bytes() == out.read_bytes()  # deterministic by default
    fresh = mf.random_bytes(tmp_path, seed=None)
    assert fresh.read_bytes() != out.read_bytes()


def test_html_error_page(tmp_path: Path) -> None:
    out = mf.html_error_page(tmp_path)
    only(out, tmp_path)
    data = out.read_bytes()
    assert data.startswith(b"<!DOCTYPE html>")
    assert b"403 Forbidden" in data
    assert out.suffix == ".mp4"


def test_gzip_blob_wraps_a_valid_mp4(tmp_path: Path) -> None:
    out = mf.gzip_blob(tmp_path)
    only(out, tmp_path)
    data = out.read_bytes()
    assert data[:2] == b"\x1f\x8b"
    inner = tmp_path / "inner" / "inner.mp4"
    inner.parent.mkdir()
    inner.write_bytes(gzip.decompress(data))
    assert mf.top_level_boxes(inner)[0] == "ftyp"
    assert [s["codec_name"] for s in mf.ffprobe_streams(inner)] == ["h264", "aac"]


def test_png_renamed(tmp_path: Path) -> None:
    out = mf.png_renamed(tmp_path)
    only(out, tmp_path)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    [image] = mf.ffprobe_streams(out)
    assert (image["codec_name"], image["width"], image["height"]) == ("png", 320, 240)


def test_decompression_bomb_really_is_16000_square(tmp_path: Path) -> None:
    out = mf.decompression_bomb(tmp_path)
    only(out, tmp_path)
    assert out.stat().st_size < 2 * 1024 * 1024
    [video] = mf.ffprobe_streams(out)
    assert (video["codec_name"], video["width"], video["height"]) == ("h264", 16000, 16000)
    assert video["pix_fmt"] == "yuv420p"
    # Decoding (about 0.9 GB, ~1 s) yields one real 16000x16000 frame.
    frames = mf.ffprobe_json(out, "-show_frames", "-select_streams", "v:0")["frames"]
    assert [(f["width"], f["height"]) for f in frames] == [(16000, 16000)]


def test_header_claims_huge(tmp_path: Path) -> None:
    out = mf.header_claims_huge(tmp_path)
    only(out, tmp_path)
    assert out.stat().st_size < 512 * 1024
    assert mf.container_dimensions(out) == [(16384, 16384)]
    # ffmpeg 5.1 refuses any picture with (w+128)*(h+128) >= INT_MAX/8: ffprobe then
    # reports 0x0; a newer ffmpeg that accepted it would report the claim itself.
    [video] = mf.ffprobe_streams(out)
    assert (video["width"], video["height"]) in [(16384, 16384), (0, 0)]
    assert video["codec_name"] == "h264"
    assert "16384x16384" in mf.decode(out, xerror=False).stderr


def test_header_claims_huge_below_the_ffmpeg_limit_is_reported_verbatim(tmp_path: Path) -> None:
    out = mf.header_claims_huge(tmp_path, width=15360, height=8640)
    assert mf.container_dimensions(out) == [(15360, 8640)]
    [video] = mf.ffprobe_streams(out)
    assert (video["width"], video["height"]) == (15360, 8640)


def test_header_claims_huge_rejects_sizes_it_cannot_write(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="multiples of 16"):
        mf.header_claims_huge(tmp_path, width=1000, height=1000)


def test_patch_sps_dimensions_round_trips_through_the_bit_reader() -> None:
    # x264 Constrained Baseline SPS for 320x240 (20x15 MBs, no cropping).
    sps = bytes.fromhex("6742c00dda0507ec0440000003004000000c03c50aa8")
    patched = mf.patch_sps_dimensions(sps, 1024, 1024)
    assert patched != sps
    assert mf.patch_sps_dimensions(patched, 20, 15) == sps


def test_hls_disguised(tmp_path: Path) -> None:
    target = tmp_path / "target" / "secret.txt"
    target.parent.mkdir()
    target.write_text("x")
    out = mf.hls_disguised(tmp_path, target)
    assert out.name == "x.mp4"
    text = out.read_text()
    assert text.startswith("#EXTM3U\n")
    assert f"file:{target}\n" in text
    assert "#EXT-X-ENDLIST" in text


def test_concat_disguised(tmp_path: Path) -> None:
    target = tmp_path / "target" / "secret.txt"
    target.parent.mkdir()
    target.write_text("x")
    out = mf.concat_disguised(tmp_path, target)
    assert out.name == "y.mp4"
    assert out.read_text() == f"ffconcat version 1.0\nfile '{target}'\n"


def probe_format(path: Path) -> tuple[int, str, str]:
    """Stock ffprobe (no whitelist): (exit code, format/codec lines, stderr)."""
    argv = ["ffprobe", "-v", "error", "-of", "csv=p=0"]
    argv += ["-show_entries", "format=format_name:stream=codec_name", str(path)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    return proc.returncode, proc.stdout, proc.stderr


def test_stock_ffprobe_follows_a_disguised_playlist_to_a_media_neighbour(tmp_path: Path) -> None:
    # This is why the pipeline must pin the demuxer/protocols: ffprobe sniffs x.mp4 as HLS
    # and opens the absolute file: URL it names.
    neighbour = mf.no_audio_mp4(tmp_path / "other_user")
    code, out, _ = probe_format(mf.hls_disguised(tmp_path, neighbour))
    assert code == 0
    assert "hls" in out
    assert "h264" in out


def test_stock_ffprobe_refuses_the_disguised_playlist_for_a_txt_neighbour(tmp_path: Path) -> None:
    secret, _ = mf.neighbour_secret(tmp_path / "other_user")
    code, _, err = probe_format(mf.hls_disguised(tmp_path, secret))
    assert code != 0
    assert "allowed_segment_extensions" in err


def test_stock_ffprobe_refuses_an_absolute_path_in_a_disguised_concat(tmp_path: Path) -> None:
    neighbour = mf.no_audio_mp4(tmp_path / "other_user")
    code, _, err = probe_format(mf.concat_disguised(tmp_path, neighbour))
    assert code != 0
    assert "Unsafe file name" in err


def test_neighbour_secret(tmp_path: Path) -> None:
    path, marker = mf.neighbour_secret(tmp_path)
    only(path, tmp_path)
    assert marker.startswith(b"aivedio-secret-")
    assert len(marker) == len(b"aivedio-secret-") + 32
    assert path.read_bytes().count(marker) == 64
    other_path, other_marker = mf.neighbour_secret(tmp_path)
    assert (other_path, other_marker) != (path, marker)
    named, _ = mf.neighbour_secret(tmp_path, name="secret.ts")
    assert named.name == "secret.ts"


def test_tail_corrupted_fails_only_with_xerror(tmp_path: Path) -> None:
    out = mf.tail_corrupted(tmp_path)
    only(out, tmp_path)
    info = mf.ffprobe_json(out)
    assert [s["codec_name"] for s in info["streams"]] == ["h264", "aac"]
    boxes = mf.top_level_boxes(out)
    assert boxes.index("moov") < boxes.index("mdat")
    lenient = mf.decode(out, xerror=False)
    assert lenient.returncode == 0
    assert lenient.stderr  # errors are logged, but not fatal
    assert mf.decode(out, xerror=True).returncode != 0
    # Deterministic: a second one is byte-identical.
    assert mf.tail_corrupted(tmp_path).read_bytes() == out.read_bytes()


def test_a_good_file_decodes_with_xerror(tmp_path: Path) -> None:
    strict = mf.decode(mf.h264_faststart(tmp_path), xerror=True)
    assert (strict.returncode, strict.stderr) == (0, "")


def test_run_ffmpeg_failure_carries_stderr(tmp_path: Path) -> None:
    with pytest.raises(mf.MediaToolError, match="No such file"):
        mf.run_ffmpeg("-i", str(tmp_path / "absent.mp4"), str(tmp_path / "out.mp4"))


# -- the cache --------------------------------------------------------------------------------


def test_media_cache_makes_each_name_once(tmp_path: Path) -> None:
    calls: list[Path] = []

    def make(directory: Path, *, size: int) -> Path:
        calls.append(directory)
        out = directory / "blob.bin"
        out.write_bytes(b"x" * size)
        return out

    cache = mf.MediaCache(tmp_path)
    first = cache.get("blob", make, size=3)
    assert cache.get("blob", make, size=3) == first
    other = cache.get("other", make, size=5)
    assert other != first
    assert calls == [tmp_path / "blob", tmp_path / "other"]
    assert first.read_bytes() == b"xxx"


def test_media_cache_with_a_real_generator(tmp_path: Path) -> None:
    cache = mf.MediaCache(tmp_path)
    path, marker = cache.get("secret", mf.neighbour_secret)
    assert cache.get("secret", mf.neighbour_secret) == (path, marker)
    assert cache.get("zero", mf.zero_bytes).parent == tmp_path / "zero"
    with pytest.raises(ValueError, match="bad cache name"):
        cache.get("../up", mf.zero_bytes)
