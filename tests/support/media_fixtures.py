"""Test-time media generators: every file is made by ffmpeg (or by hand) when a test needs it.

Nothing here is committed media. Each generator takes a directory, writes exactly one file into
it (intermediates live in a temporary subdirectory that is removed before returning) and returns
that file's path; names never collide, a second call in the same directory gets ``name-1.ext``.

Sources are short and small (2-3 s, 320x240 or 640x360) so the suite stays quick on 2 cores:
``testsrc2``/``sine`` from lavfi, ``libx264 -preset ultrafast``.

Hostile inputs (``truncated_half`` ... ``tail_corrupted``) are documented one by one below; the
matching assertions are in ``tests/unit/support/test_media_fixtures.py``.

``MediaCache`` shares generated files within a session::

    cache = MediaCache(tmp_path_factory.mktemp("media"))
    path = cache.get("hevc", hevc_mkv)
"""

from __future__ import annotations

import gzip
import itertools
import json
import math
import os
import random
import secrets
import struct
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, TypeVar

FFMPEG = "ffmpeg"
FFPROBE = "ffprobe"

P = ParamSpec("P")
T = TypeVar("T")

# Boxes whose payload is a sequence of boxes (enough of ISO BMFF to reach the sample entries).
_CONTAINER_BOXES = frozenset({"moov", "trak", "mdia", "minf", "stbl", "edts", "dinf", "udta"})


# -- running the tools ------------------------------------------------------------------------


class MediaToolError(RuntimeError):
    """ffmpeg/ffprobe failed while generating a fixture; carries its stderr."""


def run_ffmpeg(*args: str) -> None:
    """``ffmpeg -nostdin -y -v error ARGS``; raises ``MediaToolError`` with stderr on failure."""
    argv = [FFMPEG, "-nostdin", "-hide_banner", "-v", "error", "-y", *args]
    try:
        subprocess.run(argv, check=True, capture_output=True, timeout=120)
    except subprocess.CalledProcessError as exc:
        stderr = exc.stderr.decode(errors="replace")[-4000:]
        raise MediaToolError(f"{' '.join(argv)}\nexit {exc.returncode}\n{stderr}") from exc


def ffprobe_json(path: Path, *extra: str) -> dict[str, Any]:
    """``ffprobe -show_format -show_streams`` as JSON (raises ``MediaToolError`` on failure)."""
    argv = [FFPROBE, "-v", "error", "-of", "json", "-show_format", "-show_streams", *extra]
    proc = subprocess.run([*argv, str(path)], capture_output=True, timeout=60)
    if proc.returncode != 0:
        stderr = proc.stderr.decode(errors="replace")[-4000:]
        raise MediaToolError(f"ffprobe {path}: exit {proc.returncode}\n{stderr}")
    result: dict[str, Any] = json.loads(proc.stdout)
    return result


def stream_md5(path: Path, stream: str) -> str:
    """The MD5 of ``stream``'s packets as they are stored (copied, not decoded)."""
    argv = [FFMPEG, "-nostdin", "-v", "error", "-i", str(path), "-map", stream]
    proc = subprocess.run([*argv, "-c", "copy", "-f", "md5", "-"], capture_output=True, timeout=60)
    if proc.returncode != 0:
        raise MediaToolError(f"md5 of {path} {stream}: {proc.stderr.decode(errors='replace')}")
    return proc.stdout.decode().strip()


def picture_md5(image: Path) -> str:
    """The decoded picture's MD5 (two JPEGs of the same frame, whatever their bytes)."""
    done = subprocess.run(
        ["ffmpeg", "-v", "error", "-i", str(image), "-f", "md5", "-"],
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


def ffprobe_streams(path: Path) -> list[dict[str, Any]]:
    streams: list[dict[str, Any]] = ffprobe_json(path).get("streams", [])
    return streams


def decode(path: Path, *, xerror: bool) -> subprocess.CompletedProcess[str]:
    """``ffmpeg -v error [-xerror] -i path -f null -``: the completed process (never raises)."""
    argv = [FFMPEG, "-nostdin", "-hide_banner", "-v", "error"]
    if xerror:
        argv.append("-xerror")
    argv += ["-i", str(path), "-f", "null", "-"]
    return subprocess.run(argv, capture_output=True, text=True, errors="replace", timeout=120)


# -- files and boxes --------------------------------------------------------------------------


def _fresh(directory: Path, name: str) -> Path:
    """``directory/name``, or ``stem-N.ext`` when that already exists."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    stem, suffix = path.stem, path.suffix
    n = 0
    while path.exists():
        n += 1
        path = directory / f"{stem}-{n}{suffix}"
    return path


def _scratch(directory: Path) -> tempfile.TemporaryDirectory[str]:
    directory.mkdir(parents=True, exist_ok=True)
    return tempfile.TemporaryDirectory(dir=directory, prefix=".scratch-")


class Box:
    """One ISO BMFF box: its type, the offset of its header, its total size, header length."""

    __slots__ = ("header", "offset", "size", "type")

    def __init__(self, box_type: str, offset: int, size: int, header: int) -> None:
        self.type = box_type
        self.offset = offset
        self.size = size
        self.header = header

    @property
    def payload(self) -> int:
        return self.offset + self.header

    @property
    def end(self) -> int:
        return self.offset + self.size

    def __repr__(self) -> str:
        return f"Box({self.type!r}, offset={self.offset}, size={self.size})"


def iter_boxes(data: bytes | bytearray, start: int = 0, end: int | None = None) -> Iterator[Box]:
    """ISO BMFF boxes in ``data[start:end]`` (one level), stopping at a truncated header."""
    end = len(data) if end is None else end
    offset = start
    while offset + 8 <= end:
        size, raw_type = struct.unpack(">I4s", data[offset : offset + 8])
        header = 8
        if size == 1:
            if offset + 16 > end:
                return
            (size,) = struct.unpack(">Q", data[offset + 8 : offset + 16])
            header = 16
        elif size == 0:
            size = end - offset
        if size < header:
            return
        yield Box(raw_type.decode("latin-1"), offset, size, header)
        offset += size


def top_level_boxes(path: Path) -> list[str]:
    """The top-level box types of an MP4/MOV file, in order (64-bit sizes handled).

    Reads headers only (seeking over payloads), so it is cheap on big files.
    """
    types: list[str] = []
    size_total = path.stat().st_size
    with path.open("rb") as f:
        offset = 0
        while offset + 8 <= size_total:
            f.seek(offset)
            header = f.read(16)
            size, raw_type = struct.unpack(">I4s", header[:8])
            if size == 1:
                if len(header) < 16:
                    break
                (size,) = struct.unpack(">Q", header[8:16])
                if size < 16:
                    break
            elif size == 0:
                size = size_total - offset
            elif size < 8:
                break
            types.append(raw_type.decode("latin-1"))
            offset += size
    return types


def _box_tree(data: bytes | bytearray) -> list[tuple[tuple[str, ...], Box]]:
    """Every box reachable through container boxes and ``stsd``/sample entries, with its path."""
    found: list[tuple[tuple[str, ...], Box]] = []

    def walk(start: int, end: int, parents: tuple[str, ...]) -> None:
        for box in iter_boxes(data, start, end):
            path = (*parents, box.type)
            found.append((path, box))
            if box.type in _CONTAINER_BOXES:
                walk(box.payload, box.end, path)
            elif box.type == "stsd":  # full box header (4) + entry count (4)
                walk(box.payload + 8, box.end, path)
            elif box.type in ("avc1", "avc3"):  # VisualSampleEntry is 78 bytes
                walk(box.payload + 78, box.end, path)

    walk(0, len(data), ())
    return found


def _assert_moov_position(path: Path, *, moov_first: bool) -> None:
    boxes = top_level_boxes(path)
    assert "moov" in boxes, boxes
    assert "mdat" in boxes, boxes
    before = boxes.index("moov") < boxes.index("mdat")
    assert before == moov_first, f"{path.name}: top-level boxes {boxes}"


# -- ordinary sources -------------------------------------------------------------------------

_X264_HIGH = ["-profile:v", "high", "-x264-params", "cabac=1:8x8dct=1"]


def _h264_mp4(
    out: Path,
    *,
    width: int,
    height: int,
    seconds: float,
    fps: int,
    audio: bool,
    faststart: bool,
    keyint: int | None = None,
) -> None:
    args = ["-f", "lavfi", "-i", f"testsrc2=s={width}x{height}:r={fps}:d={seconds}"]
    if audio:
        args += ["-f", "lavfi", "-i", f"sine=frequency=440:sample_rate=48000:duration={seconds}"]
    args += ["-map", "0:v"] + (["-map", "1:a"] if audio else [])
    args += ["-c:v", "libx264", "-preset", "ultrafast", *_X264_HIGH, "-pix_fmt", "yuv420p"]
    args += ["-g", str(keyint or fps)]
    if audio:
        args += ["-c:a", "aac", "-b:a", "96k", "-ac", "2"]
    if faststart:
        args += ["-movflags", "+faststart"]
    run_ffmpeg(*args, str(out))


def h264_moov_at_end(
    directory: Path,
    *,
    width: int = 640,
    height: int = 360,
    seconds: float = 3,
    fps: int = 24,
    audio: bool = True,
) -> Path:
    """H.264 High yuv420p (+ AAC-LC stereo) MP4 without faststart: ``mdat`` before ``moov``.

    A keyframe every second (``-g fps``).
    """
    out = _fresh(directory, "moov_at_end.mp4")
    _h264_mp4(
        out, width=width, height=height, seconds=seconds, fps=fps, audio=audio, faststart=False
    )
    _assert_moov_position(out, moov_first=False)
    return out


def h264_faststart(
    directory: Path,
    *,
    width: int = 320,
    height: int = 240,
    seconds: float = 3,
    fps: int = 24,
    audio: bool = True,
) -> Path:
    """H.264 High yuv420p (+ AAC-LC) MP4 with ``moov`` before ``mdat``."""
    out = _fresh(directory, "faststart.mp4")
    _h264_mp4(
        out, width=width, height=height, seconds=seconds, fps=fps, audio=audio, faststart=True
    )
    _assert_moov_position(out, moov_first=True)
    return out


def h264_720p(directory: Path, *, seconds: float = 2) -> Path:
    """1280x720 H.264 High yuv420p + AAC-LC, 24 fps, keyframe every second."""
    out = _fresh(directory, "h264_720p.mp4")
    _h264_mp4(out, width=1280, height=720, seconds=seconds, fps=24, audio=True, faststart=True)
    return out


def h264_1080p(directory: Path, seconds: float = 2) -> Path:
    """1920x1080 H.264 High yuv420p + AAC-LC, 24 fps, keyframe every second."""
    out = _fresh(directory, "h264_1080p.mp4")
    _h264_mp4(out, width=1920, height=1080, seconds=seconds, fps=24, audio=True, faststart=True)
    return out


def hevc_mkv(directory: Path) -> Path:
    """HEVC (libx265 Main) + AAC in Matroska, 320x240, 2 s."""
    out = _fresh(directory, "hevc.mkv")
    run_ffmpeg(
        *("-f", "lavfi", "-i", "testsrc2=s=320x240:r=24:d=2"),
        *("-f", "lavfi", "-i", "sine=frequency=440:sample_rate=48000:duration=2"),
        *("-c:v", "libx265", "-preset", "ultrafast", "-pix_fmt", "yuv420p"),
        *("-x265-params", "log-level=error"),
        *("-c:a", "aac", "-b:a", "64k"),
        str(out),
    )
    return out


def vp9_webm(directory: Path) -> Path:
    """VP9 (libvpx-vp9, realtime) + Opus in WebM, 320x240, 2 s."""
    out = _fresh(directory, "vp9.webm")
    run_ffmpeg(
        *("-f", "lavfi", "-i", "testsrc2=s=320x240:r=24:d=2"),
        *("-f", "lavfi", "-i", "sine=frequency=440:sample_rate=48000:duration=2"),
        *("-c:v", "libvpx-vp9", "-deadline", "realtime", "-cpu-used", "8", "-b:v", "300k"),
        *("-pix_fmt", "yuv420p", "-c:a", "libopus", "-b:a", "64k"),
        str(out),
    )
    return out


def yuv444p_mp4(directory: Path) -> Path:
    """H.264 High 4:4:4 Predictive, yuv444p, 320x240, 2 s, no audio."""
    out = _fresh(directory, "yuv444p.mp4")
    run_ffmpeg(
        *("-f", "lavfi", "-i", "testsrc2=s=320x240:r=24:d=2"),
        *("-c:v", "libx264", "-preset", "ultrafast", "-pix_fmt", "yuv444p"),
        str(out),
    )
    return out


def no_audio_mp4(directory: Path) -> Path:
    """H.264 High yuv420p MP4 with a video stream only (faststart), 320x240, 2 s."""
    out = _fresh(directory, "no_audio.mp4")
    _h264_mp4(out, width=320, height=240, seconds=2, fps=24, audio=False, faststart=True)
    return out


def rotated_90_mp4(directory: Path) -> Path:
    """H.264 + AAC 320x240 whose track carries a 90-degree display matrix.

    ffmpeg 5.1's mov muxer turns ``-metadata:s:v:0 rotate=90`` into a ``tkhd`` matrix on a
    ``-c copy`` remux; ffprobe reports it as side data ``Display Matrix`` with
    ``rotation`` 90 (ffmpeg >= 6 would report -90; accept either sign).
    """
    out = _fresh(directory, "rotated_90.mp4")
    with _scratch(directory) as tmp:
        plain = Path(tmp) / "plain.mp4"
        _h264_mp4(plain, width=320, height=240, seconds=2, fps=24, audio=True, faststart=False)
        run_ffmpeg(
            *("-i", str(plain), "-map", "0", "-c", "copy"),
            *("-metadata:s:v:0", "rotate=90", "-movflags", "+faststart"),
            str(out),
        )
    return out


def vfr_mp4(directory: Path) -> Path:
    """H.264 MP4 with variable frame rate: 30 fps for 1 s, then ~18.9 fps (53 ms apart).

    Timestamps are rewritten with ``setpts`` on a 1/1000 time base and kept verbatim with
    ``-fps_mode passthrough``; ffprobe shows ``r_frame_rate`` 30/1 and a lower
    ``avg_frame_rate``.
    """
    out = _fresh(directory, "vfr.mp4")
    run_ffmpeg(
        *("-f", "lavfi", "-i", "testsrc2=s=320x240:r=30:d=2"),
        *("-vf", "settb=1/1000,setpts='if(lt(N,30),N*100/3,1000+(N-30)*53)/1000/TB'"),
        *("-fps_mode", "passthrough", "-video_track_timescale", "1000"),
        *("-c:v", "libx264", "-preset", "ultrafast", *_X264_HIGH, "-pix_fmt", "yuv420p"),
        str(out),
    )
    return out


def odd_dimensions_mp4(directory: Path) -> Path:
    """H.264 High 4:4:4 at 639x359 (4:2:0 cannot have odd sizes; 4:4:4 can).

    ``testsrc2`` silently rounds its size down to even, so the frame is scaled to 639x359.
    """
    out = _fresh(directory, "odd_dimensions.mp4")
    run_ffmpeg(
        *("-f", "lavfi", "-i", "testsrc2=s=640x360:r=24:d=2,scale=639:359,format=yuv444p"),
        *("-c:v", "libx264", "-preset", "ultrafast", "-pix_fmt", "yuv444p"),
        str(out),
    )
    return out


# A P3 D65 display of 1000 nits (x265's notation): what ``colour_tagged``'s HDR10 says.
MASTER_DISPLAY = "G(13250,34500)B(7500,3000)R(34000,16000)WP(15635,16450)L(10000000,1)"


def colour_tagged(
    directory: Path,
    *,
    transfer: str,
    primaries: str = "bt2020",
    matrix: str = "bt2020nc",
    codec: str = "libx265",
    pix_fmt: str = "yuv420p10le",
    seconds: float = 2,
) -> Path:
    """320x240 video + AAC, 2 s, tagged with the given colour (``-color_primaries``,
    ``-color_trc``, ``-colorspace``, limited range): HDR10 (``smpte2084``) or HLG
    (``arib-std-b67``) as 10-bit HEVC by default. The pixels are testsrc2's; only the tags
    say what light they mean, which is all a pipeline reads."""
    out = _fresh(directory, f"colour_{transfer}_{codec}_{pix_fmt}.mp4")
    x265 = "log-level=error"
    if transfer == "smpte2084":  # HDR10's static metadata, in the bitstream's SEI
        x265 += f":hdr10=1:master-display={MASTER_DISPLAY}:max-cll=1000,400"
    extra = ["-x265-params", x265, "-tag:v", "hvc1"] if codec == "libx265" else []
    run_ffmpeg(
        *("-f", "lavfi", "-i", f"testsrc2=s=320x240:r=24:d={seconds}"),
        *("-f", "lavfi", "-i", f"sine=frequency=440:sample_rate=48000:duration={seconds}"),
        *("-map", "0:v", "-map", "1:a", "-c:v", codec, "-preset", "ultrafast", *extra),
        *("-pix_fmt", pix_fmt, "-color_primaries", primaries, "-color_trc", transfer),
        *("-colorspace", matrix, "-color_range", "tv"),
        *("-c:a", "aac", "-b:a", "64k", "-movflags", "+faststart"),
        str(out),
    )
    return out


def anamorphic_mp4(directory: Path, *, sar: str = "4/3") -> Path:
    """H.264 + AAC whose 320x240 pixels are ``sar`` wide (``setsar``): shown 427x240."""
    out = _fresh(directory, "anamorphic.mp4")
    run_ffmpeg(
        *("-f", "lavfi", "-i", "testsrc2=s=320x240:r=24:d=2"),
        *("-f", "lavfi", "-i", "sine=frequency=440:sample_rate=48000:duration=2"),
        *("-map", "0:v", "-map", "1:a", "-vf", f"setsar={sar}"),
        *("-c:v", "libx264", "-preset", "ultrafast", "-pix_fmt", "yuv420p"),
        *("-c:a", "aac", "-b:a", "64k"),
        str(out),
    )
    return out


def vfr_with_audio(directory: Path) -> Path:
    """2 s of 30 fps video with frames dropped (every other one in the second half, and
    none at all from 0.7 to 0.9 s: ``-fps_mode vfr`` keeps the gaps) beside a 2 s AAC sine,
    both from 0: the audio must stay in sync once the video is made constant-rate."""
    out = _fresh(directory, "vfr_audio.mp4")
    run_ffmpeg(
        *("-f", "lavfi", "-i", "testsrc2=s=320x240:r=30:d=2"),
        *("-f", "lavfi", "-i", "sine=frequency=440:sample_rate=48000:duration=2"),
        *("-map", "0:v", "-map", "1:a"),
        *("-vf", "select='not(between(n\\,21\\,26))*(lt(n\\,30)+not(mod(n\\,2)))'"),
        *("-fps_mode", "vfr", "-video_track_timescale", "1000"),
        *("-c:v", "libx264", "-preset", "ultrafast", *_X264_HIGH, "-pix_fmt", "yuv420p"),
        *("-c:a", "aac", "-b:a", "64k"),
        str(out),
    )
    return out


def tone_at(
    directory: Path, *, volume_db: float, seconds: float = 2, pix_fmt: str = "yuv420p"
) -> Path:
    """H.264 320x240 + a stereo 1 kHz AAC sine ``volume_db`` from sine's own level (about
    -21 LUFS at 0 dB): a loud (+15) or quiet (-15) source. ``yuv420p`` remuxes, ``yuv444p``
    needs a transcode."""
    out = _fresh(directory, f"tone_{volume_db:g}dB_{pix_fmt}.mp4")
    run_ffmpeg(
        *("-f", "lavfi", "-i", f"testsrc2=s=320x240:r=24:d={seconds}"),
        *("-f", "lavfi", "-i", f"sine=frequency=1000:sample_rate=48000:duration={seconds}"),
        *("-map", "0:v", "-map", "1:a", "-filter:a", f"volume={volume_db}dB"),
        *("-c:v", "libx264", "-preset", "ultrafast", "-pix_fmt", pix_fmt),
        *("-c:a", "aac", "-b:a", "128k", "-ac", "2"),
        *("-movflags", "+faststart"),
        str(out),
    )
    return out


def frame_times(path: Path) -> list[float]:
    """The presentation times (seconds) of the video frames of ``path``, in order."""
    argv = [FFPROBE, "-v", "error", "-select_streams", "v:0", "-show_entries"]
    argv += ["packet=pts_time", "-of", "csv=p=0", str(path)]
    proc = subprocess.run(argv, capture_output=True, timeout=60, check=True)
    return sorted(float(line) for line in proc.stdout.decode().split() if line.strip())


def ebur128_of(path: Path, stream: str = "0:a:0") -> dict[str, float]:
    """ffmpeg's own EBU R128 figures of ``stream``: ``I`` (LUFS), ``LRA`` (LU) and ``TP``
    (dBTP, the highest channel), read from the filter's frame metadata."""
    argv = [FFMPEG, "-nostdin", "-hide_banner", "-v", "error", "-i", str(path), "-map", stream]
    argv += ["-filter:a", "ebur128=peak=true:metadata=1,ametadata=mode=print:file=-"]
    argv += ["-f", "null", "-"]
    proc = subprocess.run(argv, capture_output=True, timeout=60, check=True)
    figures: dict[str, float] = {}
    peak = 0.0
    for line in proc.stdout.decode().splitlines():
        key, _, value = line.partition("=")
        if key == "lavfi.r128.I":
            figures["I"] = float(value)
        elif key == "lavfi.r128.LRA":
            figures["LRA"] = float(value)
        elif key.startswith("lavfi.r128.true_peaks_ch"):
            peak = max(peak, float(value))
    figures["TP"] = 20 * math.log10(peak) if peak > 0 else -math.inf
    return figures


def audio_only_m4a(directory: Path) -> Path:
    """AAC-LC in an MP4 container (named ``.mp4``), no video stream, 2 s."""
    out = _fresh(directory, "audio_only.mp4")
    run_ffmpeg(
        *("-f", "lavfi", "-i", "sine=frequency=440:sample_rate=48000:duration=2"),
        *("-c:a", "aac", "-b:a", "96k", "-f", "mp4"),
        str(out),
    )
    return out


def many_audio_streams(directory: Path, n: int = 20) -> Path:
    """H.264 320x240 + ``n`` mono AAC streams (the same sine mapped ``n`` times), 2 s."""
    out = _fresh(directory, f"audio_x{n}.mp4")
    maps: list[str] = ["-map", "0:v"]
    for _ in range(n):
        maps += ["-map", "1:a"]
    run_ffmpeg(
        *("-f", "lavfi", "-i", "testsrc2=s=320x240:r=24:d=2"),
        *("-f", "lavfi", "-i", "sine=frequency=440:sample_rate=48000:duration=2"),
        *maps,
        *("-c:v", "libx264", "-preset", "ultrafast", "-pix_fmt", "yuv420p"),
        *("-c:a", "aac", "-b:a", "32k"),
        str(out),
    )
    return out


# Language tags of ``tagged_audio_streams``' tracks, in order (cycled past 20).
LANGUAGES = (
    "eng",
    "fra",
    "deu",
    "spa",
    "ita",
    "por",
    "nld",
    "swe",
    "nor",
    "dan",
    "fin",
    "pol",
    "ces",
    "hun",
    "ron",
    "ell",
    "tur",
    "rus",
    "jpn",
    "kor",
)


def audio_tone_hz(k: int) -> int:
    """The sine of ``tagged_audio_streams``' audio stream ``k`` (0-based): 300, 400, ... Hz."""
    return 300 + 100 * k


def tagged_audio_streams(
    directory: Path, *, n: int = 20, default: int = 2, pix_fmt: str = "yuv420p"
) -> Path:
    """H.264 320x240 + ``n`` mono AAC streams, 2 s. Audio ``k`` is a sine of
    ``audio_tone_hz(k)`` Hz tagged ``LANGUAGES[k % 20]``; only audio ``default`` has the
    default disposition (its absolute index is ``default + 1``). ``yuv420p`` remuxes,
    ``yuv444p`` needs a transcode."""
    out = _fresh(directory, f"tagged_audio_x{n}_default{default}_{pix_fmt}.mp4")
    args = ["-f", "lavfi", "-i", "testsrc2=s=320x240:r=24:d=2"]
    maps = ["-map", "0:v"]
    tags: list[str] = []
    for k in range(n):
        args += ["-f", "lavfi", "-i", f"sine=frequency={audio_tone_hz(k)}:sample_rate=48000:d=2"]
        maps += ["-map", f"{k + 1}:a"]
        tags += [f"-metadata:s:a:{k}", f"language={LANGUAGES[k % len(LANGUAGES)]}"]
    run_ffmpeg(
        *args,
        *maps,
        *("-c:v", "libx264", "-preset", "ultrafast", "-pix_fmt", pix_fmt),
        *("-c:a", "aac", "-b:a", "32k"),
        *("-disposition:a", "0", f"-disposition:a:{default}", "default"),
        *tags,
        str(out),
    )
    return out


def two_video_streams(directory: Path) -> Path:
    """Two H.264 video streams, 320x240 (stream 0) and 480x270 (stream 1, the only one with
    the default disposition), + AAC, 2 s."""
    out = _fresh(directory, "two_videos.mp4")
    run_ffmpeg(
        *("-f", "lavfi", "-i", "testsrc2=s=320x240:r=24:d=2"),
        *("-f", "lavfi", "-i", "testsrc=s=480x270:r=24:d=2"),
        *("-f", "lavfi", "-i", "sine=frequency=440:sample_rate=48000:duration=2"),
        *("-map", "0:v", "-map", "1:v", "-map", "2:a"),
        *("-c:v", "libx264", "-preset", "ultrafast", "-pix_fmt", "yuv420p"),
        *("-c:a", "aac", "-b:a", "64k"),
        *("-disposition:v:0", "0", "-disposition:v:1", "default"),
        str(out),
    )
    return out


def sized_video(directory: Path, *, width: int, height: int, seconds: float = 2) -> Path:
    """H.264 yuv444p (so any size, odd ones too) ``width``x``height``, square pixels, + AAC,
    24 fps: a 1x1, a 4000x2 or a 16x16 source."""
    out = _fresh(directory, f"sized_{width}x{height}.mp4")
    run_ffmpeg(
        *("-f", "lavfi", "-i", f"testsrc2=s=320x240:r=24:d={seconds}"),
        *("-f", "lavfi", "-i", f"sine=frequency=440:sample_rate=48000:duration={seconds}"),
        *("-vf", f"scale={width}:{height}:flags=bicubic,setsar=1"),
        *("-c:v", "libx264", "-preset", "ultrafast", "-pix_fmt", "yuv444p"),
        *("-c:a", "aac", "-b:a", "64k"),
        str(out),
    )
    return out


def short_clip(directory: Path, *, video_seconds: float, audio_seconds: float = 0.0) -> Path:
    """H.264 320x240 at 100 fps lasting ``video_seconds`` (5 frames for 0.05 s), with an
    AAC track of ``audio_seconds`` when given: a clip too short, or a picture that ends
    long before its sound."""
    out = _fresh(directory, f"short_{video_seconds:g}s_{audio_seconds:g}s.mp4")
    args = ["-f", "lavfi", "-i", f"testsrc2=s=320x240:r=100:d={video_seconds}"]
    if audio_seconds:
        args += ["-f", "lavfi", "-i", f"sine=frequency=440:sample_rate=48000:d={audio_seconds}"]
        args += ["-map", "0:v", "-map", "1:a", "-c:a", "aac", "-b:a", "64k"]
    args += ["-c:v", "libx264", "-preset", "ultrafast", "-pix_fmt", "yuv420p"]
    run_ffmpeg(*args, str(out))
    return out


def tone_of(path: Path, stream: str = "0:a:0") -> float:
    """The frequency (Hz) of the sine in ``stream`` of ``path`` (a file or a playlist), by
    counting zero crossings of its decoded samples (mono, 16 kHz)."""
    result = subprocess.run(
        [
            FFMPEG,
            "-nostdin",
            "-v",
            "error",
            "-i",
            str(path),
            "-map",
            stream,
            "-ac",
            "1",
            "-ar",
            "16000",
            "-f",
            "s16le",
            "-",
        ],
        capture_output=True,
        check=True,
        timeout=60,
    )
    samples = [v for (v,) in struct.iter_unpack("<h", result.stdout)]
    # Skip the encoder's priming and fade-in, and count only clear sign changes.
    body = samples[1600:-1600] or samples
    signs = [v > 0 for v in body if abs(v) > 64]
    crossings = sum(1 for a, b in itertools.pairwise(signs) if a != b)
    return crossings / 2 / (len(body) / 16000)


# -- hostile inputs ---------------------------------------------------------------------------


def truncated_half(directory: Path) -> Path:
    """The first 50% of the bytes of a 3 s faststart H.264+AAC MP4.

    ``moov`` is at the front, so ffprobe succeeds (full duration, both streams); the sample
    table points past the end of the file, so ``ffmpeg -xerror`` fails decoding (plain
    ``ffmpeg -v error`` without ``-xerror`` still exits 0, reporting "partial file").
    """
    out = _fresh(directory, "truncated_half.mp4")
    with _scratch(directory) as tmp:
        src = Path(tmp) / "src.mp4"
        _h264_mp4(src, width=320, height=240, seconds=3, fps=24, audio=True, faststart=True)
        data = src.read_bytes()
    out.write_bytes(data[: len(data) // 2])
    return out


def moov_missing(directory: Path) -> Path:
    """An H.264 MP4 written with ``moov`` at the end, cut right before ``moov``.

    Only ``ftyp``/``free``/``mdat`` remain: ffprobe fails ("moov atom not found").
    """
    out = _fresh(directory, "moov_missing.mp4")
    with _scratch(directory) as tmp:
        src = Path(tmp) / "src.mp4"
        _h264_mp4(src, width=320, height=240, seconds=2, fps=24, audio=True, faststart=False)
        data = src.read_bytes()
    moov = [box for box in iter_boxes(data) if box.type == "moov"]
    assert moov, "ffmpeg wrote no moov"
    out.write_bytes(data[: moov[0].offset])
    assert "moov" not in top_level_boxes(out)
    return out


def zero_bytes(directory: Path) -> Path:
    """An empty ``.mp4``."""
    out = _fresh(directory, "zero_bytes.mp4")
    out.write_bytes(b"")
    return out


def random_bytes(directory: Path, *, size: int = 64 * 1024, seed: int | None = 0) -> Path:
    """``size`` pseudo-random bytes named ``.mp4`` (deterministic by default; ``seed=None``
    uses ``os.urandom``)."""
    out = _fresh(directory, "random_bytes.mp4")
    data = os.urandom(size) if seed is None else random.Random(seed).randbytes(size)
    out.write_bytes(data)
    return out


HTML_403 = b"""<!DOCTYPE html>
<html>
<head><title>403 Forbidden</title></head>
<body>
<h1>403 Forbidden</h1>
<p>You don't have permission to access this resource. The signed URL has expired.</p>
<hr><address>nginx</address>
</body>
</html>
"""


def html_error_page(directory: Path) -> Path:
    """A CDN-style HTML "403 Forbidden" page saved as ``.mp4``."""
    out = _fresh(directory, "html_error_page.mp4")
    out.write_bytes(HTML_403)
    return out


def gzip_blob(directory: Path) -> Path:
    """A valid 2 s H.264 MP4, gzip-compressed (``Content-Encoding`` mishap), named ``.mp4``."""
    out = _fresh(directory, "gzip_blob.mp4")
    with _scratch(directory) as tmp:
        src = Path(tmp) / "src.mp4"
        _h264_mp4(src, width=320, height=240, seconds=2, fps=24, audio=True, faststart=True)
        out.write_bytes(gzip.compress(src.read_bytes(), mtime=0))
    return out


def png_renamed(directory: Path) -> Path:
    """A real 320x240 PNG still (ffmpeg ``png`` encoder) saved as ``.mp4``."""
    out = _fresh(directory, "png_renamed.mp4")
    run_ffmpeg(
        *("-f", "lavfi", "-i", "testsrc2=s=320x240:r=1:d=1", "-frames:v", "1"),
        *("-c:v", "png", "-f", "image2pipe"),
        str(out),
    )
    return out


def decompression_bomb(directory: Path) -> Path:
    """One real 16000x16000 H.264 High yuv420p frame (solid black) in MP4, ~750 KB.

    Made with ``color=s=16000x16000,format=yuv420p`` (``format`` avoids an RGB->YUV scale of a
    1 GiB frame) and ``libx264 -preset ultrafast -threads 1``. Measured on ffmpeg 5.1: ~1-3 s
    and ~1.85 GiB peak RSS to generate (x264 keeps several padded 384 MB pictures).
    Decoding it allocates >= 384 MB per frame. 16000 is under libavutil's image size limit
    ((w+128)*(h+128) < INT_MAX/8, i.e. about 16256 square), so ffmpeg really decodes it.
    """
    out = _fresh(directory, "decompression_bomb.mp4")
    run_ffmpeg(
        *("-f", "lavfi", "-i", "color=c=black:s=16000x16000:r=25:d=0.04,format=yuv420p"),
        *("-frames:v", "1", "-c:v", "libx264", "-preset", "ultrafast", *_X264_HIGH),
        *("-pix_fmt", "yuv420p", "-threads", "1", "-movflags", "+faststart"),
        str(out),
    )
    return out


def header_claims_huge(directory: Path, *, width: int = 16384, height: int = 16384) -> Path:
    """A 1 s 320x240 H.264 MP4 (~100 KB) whose headers claim ``width`` x ``height``.

    Patched in place: the ``tkhd`` width/height, the ``avc1`` sample entry width/height and
    the SPS inside ``avcC`` (``pic_width_in_mbs_minus1``/``pic_height_in_map_units_minus1``
    re-encoded, cropping removed, emulation prevention redone; ``avcC`` and its ancestors
    resized). The file is written without faststart so resizing ``moov`` moves no sample.

    Beware, ffmpeg 5.1: any size with (w+128)*(h+128) >= INT_MAX/8 (16384x16384 included) is
    refused by libavutil ("Picture size 16384x16384 is invalid"), so ffprobe reports such a
    stream as width=0 height=0 (and exits 0); a claim below that (e.g. 15360x15360) is
    reported verbatim. The container's own claim can be read with ``container_dimensions``.
    """
    if width % 16 or height % 16 or not (16 <= width <= 65535 and 16 <= height <= 65535):
        raise ValueError("width and height must be multiples of 16 in [16, 65535]")
    out = _fresh(directory, "header_claims_huge.mp4")
    with _scratch(directory) as tmp:
        src = Path(tmp) / "src.mp4"
        _h264_mp4(src, width=320, height=240, seconds=1, fps=24, audio=False, faststart=False)
        _assert_moov_position(src, moov_first=False)
        data = bytearray(src.read_bytes())
    tree = _box_tree(data)
    [tkhd] = [box for path, box in tree if path[-1] == "tkhd"]
    [avc1] = [box for path, box in tree if path[-1] == "avc1"]
    [(avcc_path, avcc)] = [(path, box) for path, box in tree if path[-1] == "avcC"]
    # tkhd ends with width and height as 16.16 fixed point.
    data[tkhd.end - 8 : tkhd.end] = struct.pack(">II", width << 16, height << 16)
    # VisualSampleEntry: 8 bytes SampleEntry + 16 bytes pre_defined/reserved, then w, h.
    data[avc1.payload + 24 : avc1.payload + 28] = struct.pack(">HH", width, height)
    # avcC: version, profile, compat, level, lengthSize, numSPS, then u16 length + SPS.
    body = bytes(data[avcc.payload : avcc.end])
    if body[5] & 0x1F != 1:
        raise MediaToolError("expected exactly one SPS in avcC")
    (sps_len,) = struct.unpack(">H", body[6:8])
    sps = body[8 : 8 + sps_len]
    new_sps = patch_sps_dimensions(sps, width // 16, height // 16)
    new_body = body[:6] + struct.pack(">H", len(new_sps)) + new_sps + body[8 + sps_len :]
    delta = len(new_body) - len(body)
    ancestors = [
        box
        for path, box in tree
        if path == avcc_path[: len(path)] and box is not avcc and box.header == 8
    ]
    assert len(ancestors) == len(avcc_path) - 1, "a 64-bit ancestor box is not supported"
    for box in ancestors:
        data[box.offset : box.offset + 4] = struct.pack(">I", box.size + delta)
    data[avcc.offset : avcc.end] = struct.pack(">I4s", 8 + len(new_body), b"avcC") + new_body
    out.write_bytes(bytes(data))
    return out


def container_dimensions(path: Path) -> list[tuple[int, int]]:
    """(width, height) from every ``tkhd`` (16.16 fixed point, integer part) of an MP4."""
    data = path.read_bytes()
    dims: list[tuple[int, int]] = []
    for box_path, box in _box_tree(data):
        if box_path[-1] == "tkhd":
            w, h = struct.unpack(">II", data[box.end - 8 : box.end])
            dims.append((w >> 16, h >> 16))
    return dims


def hls_disguised(directory: Path, target: Path) -> Path:
    """An ``#EXTM3U`` playlist named ``x.mp4`` whose one segment is ``file:<target>``.

    ffmpeg's hls demuxer would open ``target`` if it ever treated this upload as a playlist.
    """
    out = _fresh(directory, "x.mp4")
    out.write_text(
        "#EXTM3U\n"
        "#EXT-X-VERSION:3\n"
        "#EXT-X-TARGETDURATION:10\n"
        "#EXT-X-MEDIA-SEQUENCE:0\n"
        "#EXTINF:10,\n"
        f"file:{target.resolve()}\n"
        "#EXT-X-ENDLIST\n"
    )
    return out


def concat_disguised(directory: Path, target: Path) -> Path:
    """An ``ffconcat version 1.0`` script named ``y.mp4`` listing ``target`` (absolute)."""
    out = _fresh(directory, "y.mp4")
    quoted = str(target.resolve()).replace("'", "'\\''")
    out.write_text(f"ffconcat version 1.0\nfile '{quoted}'\n")
    return out


def neighbour_secret(directory: Path, *, name: str = "secret.txt") -> tuple[Path, bytes]:
    """A file ``name`` full of one fresh random marker; returns (path, marker).

    The marker is ``aivedio-secret-`` + 32 random hex digits; the file holds it 64 times,
    one per line. Assert that the marker never shows up in outputs, logs or errors.

    Note: Debian's ffmpeg 5.1 hls demuxer only opens segments whose extension is in
    ``allowed_segment_extensions`` (``.txt`` is not; ``.ts``/``.mp4``/... are), so pass e.g.
    ``name="secret.ts"`` to make ``hls_disguised`` a live threat rather than one ffmpeg
    already refuses.
    """
    out = _fresh(directory, name)
    marker = b"aivedio-secret-" + secrets.token_hex(16).encode()
    out.write_bytes((marker + b"\n") * 64)
    return out, marker


TAIL_CORRUPTION_SEED = 0x7A11


def tail_corrupted(directory: Path) -> Path:
    """A 3 s faststart H.264+AAC MP4 whose last 25% of ``mdat`` payload is overwritten.

    Size and ``moov`` are untouched; the garbage is deterministic (``random.Random(0x7A11)``).
    ffprobe succeeds; ``ffmpeg -v error -i f -f null -`` logs decode errors but exits 0;
    with ``-xerror`` it exits non-zero.
    """
    out = _fresh(directory, "tail_corrupted.mp4")
    with _scratch(directory) as tmp:
        src = Path(tmp) / "src.mp4"
        _h264_mp4(src, width=320, height=240, seconds=3, fps=24, audio=True, faststart=True)
        _corrupt_tail(src, out)
    return out


def tail_corrupted_hevc(directory: Path) -> Path:
    """``tail_corrupted``, in HEVC (libx265) + AAC: a source the plan transcodes."""
    out = _fresh(directory, "tail_corrupted_hevc.mp4")
    with _scratch(directory) as tmp:
        src = Path(tmp) / "src.mp4"
        run_ffmpeg(
            *("-f", "lavfi", "-i", "testsrc2=s=320x240:r=24:d=3"),
            *("-f", "lavfi", "-i", "sine=frequency=440:sample_rate=48000:duration=3"),
            *("-c:v", "libx265", "-preset", "ultrafast", "-pix_fmt", "yuv420p"),
            *("-x265-params", "log-level=error", "-c:a", "aac", "-b:a", "64k"),
            *("-movflags", "+faststart", str(src)),
        )
        _corrupt_tail(src, out)
    return out


def _corrupt_tail(src: Path, out: Path) -> None:
    """``src`` with the last 25% of its ``mdat`` payload overwritten, as ``out``."""
    data = bytearray(src.read_bytes())
    [mdat] = [box for box in iter_boxes(data) if box.type == "mdat"]
    start = mdat.payload + (mdat.end - mdat.payload) * 3 // 4
    data[start : mdat.end] = random.Random(TAIL_CORRUPTION_SEED).randbytes(mdat.end - start)
    out.write_bytes(bytes(data))
    _assert_moov_position(out, moov_first=True)


# -- H.264 SPS rewriting ----------------------------------------------------------------------

_HIGH_PROFILES = frozenset({100, 110, 122, 244, 44, 83, 86, 118, 128, 138, 139, 134, 135})


def _unescape(nal: bytes) -> bytes:
    out = bytearray()
    zeros = 0
    for byte in nal:
        if zeros >= 2 and byte == 3:
            zeros = 0
            continue
        out.append(byte)
        zeros = zeros + 1 if byte == 0 else 0
    return bytes(out)


def _escape(rbsp: bytes) -> bytes:
    out = bytearray()
    zeros = 0
    for byte in rbsp:
        if zeros >= 2 and byte <= 3:
            out.append(3)
            zeros = 0
        out.append(byte)
        zeros = zeros + 1 if byte == 0 else 0
    return bytes(out)


class _Bits:
    def __init__(self, data: bytes) -> None:
        self.bits = "".join(f"{byte:08b}" for byte in data)
        self.pos = 0

    def u(self, n: int) -> int:
        value = int(self.bits[self.pos : self.pos + n], 2) if n else 0
        self.pos += n
        return value

    def ue(self) -> int:
        zeros = 0
        while self.bits[self.pos] == "0":
            zeros += 1
            self.pos += 1
        self.pos += 1
        return (1 << zeros) - 1 + self.u(zeros)


def _ue_bits(value: int) -> str:
    binary = bin(value + 1)[2:]
    return "0" * (len(binary) - 1) + binary


def patch_sps_dimensions(sps: bytes, width_mbs: int, height_mbs: int) -> bytes:
    """Return the SPS NAL unit with the picture size set to ``width_mbs`` x ``height_mbs``
    macroblocks (progressive only) and frame cropping removed; the rest is kept bit for bit.
    Handles what x264 writes: no scaling matrices, pic_order_cnt_type 0 or 2."""
    bits = _Bits(_unescape(sps))
    bits.u(8)  # NAL header
    profile = bits.u(8)
    bits.u(16)  # constraint flags, level
    bits.ue()  # seq_parameter_set_id
    if profile in _HIGH_PROFILES:
        if bits.ue() == 3:  # chroma_format_idc
            bits.u(1)
        bits.ue()
        bits.ue()
        bits.u(1)
        if bits.u(1):
            raise MediaToolError("SPS with scaling matrices is not supported")
    bits.ue()  # log2_max_frame_num_minus4
    poc_type = bits.ue()
    if poc_type == 0:
        bits.ue()
    elif poc_type != 2:
        raise MediaToolError(f"SPS pic_order_cnt_type {poc_type} is not supported")
    bits.ue()  # max_num_ref_frames
    bits.u(1)  # gaps_in_frame_num_value_allowed_flag
    size_at = bits.pos
    bits.ue()
    bits.ue()
    after_size = bits.pos
    if not bits.u(1):  # frame_mbs_only_flag
        raise MediaToolError("interlaced SPS is not supported")
    bits.u(1)  # direct_8x8_inference_flag
    crop_at = bits.pos
    if bits.u(1):
        for _ in range(4):
            bits.ue()
    after_crop = bits.pos
    payload = bits.bits.rstrip("0")  # drop rbsp alignment zeros; keeps the stop bit
    new = (
        bits.bits[:size_at]
        + _ue_bits(width_mbs - 1)
        + _ue_bits(height_mbs - 1)
        + bits.bits[after_size:crop_at]
        + "0"
        + payload[after_crop:]
    )
    new += "0" * (-len(new) % 8)
    return _escape(bytes(int(new[i : i + 8], 2) for i in range(0, len(new), 8)))


# -- sharing within a session -----------------------------------------------------------------


# -- a long source whose frames and seconds can be read back ----------------------------------

COUNTER_BITS = 16
COUNTER_BLOCK = 16  # pixels per bit, in a band at the top of a 320-wide frame


def tone_hz(second: int) -> int:
    """The tone of ``counted_av``'s audio during ``second``: it changes every second."""
    return 500 + 250 * (second % 4)


def counted_av(
    directory: Path,
    *,
    seconds: int = 180,
    fps: int = 24,
    keyint: int = 50,
    pix_fmt: str = "yuv444p",
) -> Path:
    """320x240 H.264 + AAC whose frame ``n`` shows ``n`` in binary (16 blocks of 16x16 at
    the top, white = 1, lowest bit left) and whose audio is a tone that changes every second
    (``tone_hz``). A keyframe every ``keyint`` frames (off the segment grid by default);
    ``yuv444p`` makes it need a transcode, ``yuv420p`` allows a remux."""
    out = _fresh(directory, f"counted_{seconds}s_{pix_fmt}.mp4")
    bits = "255*mod(floor(N/pow(2,floor(X/16))),2)"
    tone = "+".join(f"eq(mod(floor(t),4),{k})*{tone_hz(k)}" for k in range(4))
    run_ffmpeg(
        "-f",
        "lavfi",
        "-i",
        f"testsrc2=s=320x240:r={fps}:d={seconds}",
        "-f",
        "lavfi",
        "-i",
        f"color=black:s={COUNTER_BITS * COUNTER_BLOCK}x{COUNTER_BLOCK}:r={fps}:d={seconds},"
        f"geq=lum='{bits}':cb=128:cr=128",
        "-f",
        "lavfi",
        "-i",
        f"aevalsrc='0.5*sin(2*PI*({tone})*t)':s=48000:d={seconds}",
        "-filter_complex",
        "[0:v][1:v]overlay=0:0,format=" + pix_fmt + "[v]",
        "-map",
        "[v]",
        "-map",
        "2:a",
        "-c:v",
        "libx264",
        "-preset",
        "ultrafast",
        "-qp",
        "10",
        "-g",
        str(keyint),
        "-keyint_min",
        str(keyint),
        "-sc_threshold",
        "0",
        "-c:a",
        "aac",
        "-b:a",
        "128k",
        "-ac",
        "1",
        str(out),
    )
    return out


def read_counters(path: Path, *, width: int) -> list[int]:
    """The counter of every decoded frame of ``path`` (a file or a playlist), in order."""
    scale = width / 320
    block = COUNTER_BLOCK * scale
    band_h = max(2, round(block))
    result = subprocess.run(
        [
            "ffmpeg",
            "-v",
            "error",
            "-i",
            str(path),
            "-map",
            "0:v:0",
            "-fps_mode",
            "passthrough",
            "-vf",
            f"crop={width}:{band_h}:0:0,format=gray",
            "-f",
            "rawvideo",
            "-",
        ],
        capture_output=True,
        check=True,
    )
    frame = width * band_h
    data = result.stdout
    counters = []
    row = band_h // 2
    for start in range(0, len(data) - frame + 1, frame):
        value = 0
        for bit in range(COUNTER_BITS):
            x = int((bit + 0.5) * block)
            if data[start + row * width + x] > 128:
                value |= 1 << bit
        counters.append(value)
    return counters


class MediaCache:
    """Generate each named fixture once and hand out the same path afterwards.

    ``cache.get("hevc", hevc_mkv)`` calls ``hevc_mkv(root / "hevc")`` the first time; extra
    arguments are passed through (the name alone is the key, so give different names to
    different arguments). Treat the returned files as read-only.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self._made: dict[str, Any] = {}
        self._lock = threading.Lock()

    def get(
        self,
        name: str,
        fn: Callable[Concatenate[Path, P], T],
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> T:
        with self._lock:
            if name not in self._made:
                if not name or "/" in name or name.startswith("."):
                    raise ValueError(f"bad cache name {name!r}")
                subdir = self.root / name
                subdir.mkdir(parents=True, exist_ok=True)
                self._made[name] = fn(subdir, *args, **kwargs)
            made: T = self._made[name]
            return made
