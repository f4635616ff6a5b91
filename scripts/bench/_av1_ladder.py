"""The AV1 ladder case of ``media.py``: the H.264 and AV1 HLS ladders of one source.

* **aivedio**: ``aivedio process SRC --only hls`` with the AV1 ladder on
  (``AIVEDIO_MEDIA__AV1__FROM_PIPELINE_VERSION=1``): one decode, split to every H.264 and
  AV1 rung (an AV1 rung shares its H.264 twin's scale), then copy-only packaging;
* **peer**, in the same run: the same command with AV1 off (the H.264 ladder alone), so
  what the AV1 ladder adds is read from two runs on the same machine minutes apart;
* **naive**: one ffmpeg per rung, one after another, each decoding the source again and
  writing its own HLS rendition with the same settings (x264 for the H.264 rungs; SVT-AV1
  with the same preset, CRF, cap and GOP for the AV1 ones; AAC audio in each).

Target (issue 29): aivedio <= 0.6x the naive wall time.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aivedio.config.media import MediaConfig
from aivedio.pipeline.ffmpeg.sandbox import SVT_LOG_LEVEL
from aivedio.pipeline.media import av1

AV1_ON = {"AIVEDIO_MEDIA__AV1__FROM_PIPELINE_VERSION": "1"}


def _hls(directory: Path, segment_seconds: float) -> list[str]:
    directory.mkdir(parents=True, exist_ok=True)
    return [
        *("-f", "hls", "-hls_time", f"{segment_seconds:g}", "-hls_playlist_type", "vod"),
        *("-hls_segment_type", "fmp4"),
        *("-hls_segment_filename", str(directory / "seg_%05d.m4s"), str(directory / "index.m3u8")),
    ]


def naive_commands(src: Path, out: Path, media: MediaConfig, frame_rate: float) -> list[list[str]]:
    """One process per rung of both ladders (the ladder already cut to the source's size)."""
    ff = ["ffmpeg", "-nostdin", "-v", "error", "-y", "-i", str(src)]
    aac = ["-c:a", "aac", "-b:a", f"{media.audio_bitrate_kbps}k"]
    seg = media.segment_seconds
    gop = round(frame_rate * seg)
    cmds: list[list[str]] = []
    ladder = sorted(media.ladder, key=lambda r: -r.height)
    for rung in ladder:
        x264 = [
            *("-c:v", "libx264", "-preset", media.x264_preset, "-profile:v", "high"),
            *("-pix_fmt", "yuv420p", "-sc_threshold", "0", "-crf", str(rung.crf)),
            *("-maxrate", f"{rung.maxrate_kbps}k", "-bufsize", f"{rung.bufsize_kbps}k"),
            *("-force_key_frames", f"expr:gte(t,n_forced*{seg:g})"),
        ]
        hls = _hls(out / "hls" / f"{rung.height}p", seg)
        cmds.append([*ff, "-vf", f"scale=-2:{rung.height}", *x264, *aac, *hls])
    for rung in ladder:
        crf = rung.crf + media.av1.crf_offset
        maxrate = round(rung.maxrate_kbps * media.av1.maxrate_ratio)
        encoder = av1.encoder_args(crf=crf, maxrate_kbps=maxrate, gop_frames=gop, media=media)
        hls = _hls(out / "hls" / f"av1_{rung.height}p", seg)
        cmds.append([*ff, "-vf", f"scale=-2:{rung.height}", *encoder, *aac, *hls])
    return cmds


def run_case(
    src: Path,
    work: Path,
    media: MediaConfig,
    frame_rate: float,
    run_aivedio: Callable[..., dict[str, Any]],
    run_measured: Callable[..., tuple[float, float, Any]],
) -> dict[str, Any]:
    ours = run_aivedio(src, work / "av1_aivedio", only="hls", env=AV1_ON)
    peer = run_aivedio(src, work / "av1_peer_h264_only", only="hls")
    out = work / "av1_naive"
    wall = cpu = 0.0
    for argv in naive_commands(src, out, media, frame_rate):
        w, c, _ = run_measured(argv, env={**os.environ, "SVT_LOG": SVT_LOG_LEVEL})
        wall += w
        cpu += c
    master = (work / "av1_aivedio" / "hls" / "master.m3u8").read_text()
    return {
        "source": src.name,
        "preset": media.av1.preset,
        "aivedio": ours,
        "peer_h264_only": peer,
        "naive": {"wall_seconds": wall, "cpu_seconds": cpu},
        "wall_ratio": ours["wall_seconds"] / wall,
        "cpu_ratio": ours["cpu_seconds"] / cpu,
        "av1_adds_wall_seconds": ours["wall_seconds"] - peer["wall_seconds"],
        "av1_adds_cpu_seconds": ours["cpu_seconds"] - peer["cpu_seconds"],
        "master_codecs": [
            line.split('CODECS="')[1].split('"')[0]
            for line in master.splitlines()
            if 'CODECS="' in line
        ],
        "hls_bytes": {
            "h264": _bytes(work / "av1_aivedio" / "hls", av1=False),
            "av1": _bytes(work / "av1_aivedio" / "hls", av1=True),
        },
    }


def _bytes(hls_dir: Path, *, av1: bool) -> int:
    return sum(
        path.stat().st_size
        for directory in hls_dir.iterdir()
        if directory.is_dir() and directory.name.startswith("av1_") == av1
        for path in directory.iterdir()
    )


def sanity(entry: dict[str, Any] | None, media: MediaConfig) -> list[str]:
    if entry is None:
        return ["av1: not measured"]
    problems = []
    ours = entry["aivedio"]
    if ours["av1_rungs"] != len(media.ladder):
        problems.append(f"av1: aivedio planned {ours['av1_rungs']} AV1 rungs")
    if entry["peer_h264_only"]["av1_rungs"] != 0:
        problems.append("av1: the H.264-only peer planned AV1 rungs")
    codecs = entry["master_codecs"]
    if not any(c.startswith("av01.") for c in codecs) or not any(
        c.startswith("avc1.") for c in codecs
    ):
        problems.append(f"av1: the master's CODECS {codecs}")
    for key in ("wall_seconds", "cpu_seconds"):
        for side in ("aivedio", "naive", "peer_h264_only"):
            if not entry[side][key] > 0:
                problems.append(f"av1: {side} {key} = {entry[side][key]}")
    return problems
