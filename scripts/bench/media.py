"""Media benchmark: ``aivedio process`` against a naive baseline, in one run.

Sources (generated here with ffmpeg, never committed): a 10 s 1080p HEVC source in Matroska
(the transcode path) and a 10 s 1080p H.264 MP4 with moov at the end (the remux path), both
with AAC audio.

For each source:

* ``aivedio process SRC --out DIR`` as a subprocess: its wall time, its CPU time (children's
  rusage, which includes every ffmpeg it started), and from its JSON summary the ffmpeg
  processes' wall time, CPU time and peak RSS, and the time per node;
* the naive baseline: separate sequential ffmpeg processes producing the same outputs, each
  decoding the source again (playback MP4, one HLS rendition per rung, proxy, poster, sprite
  sheet, waveform PCM), with the same x264 preset, CRFs and rung sizes.

Targets (issue 4): transcode path <= 0.6x naive wall and CPU; remux path's required outputs
(playback + poster) at RTF <= 0.05; aivedio's overhead (its wall minus its ffmpeg processes'
wall) <= 5%; peak RSS of any ffmpeg process <= 1 GiB.

Usage: .venv/bin/python scripts/bench/media.py [--seconds 10] [--size 1920x1080] [--workdir DIR]
       [--smoke]

``--smoke``: 1 s sources at 640x360 (one rung of the ladder on both paths; the naive
baseline makes only the rungs aivedio makes), and the results checked for sanity instead of
the targets: both plans as expected, every figure positive, every output made.
"""

from __future__ import annotations

import sys

if sys.path and sys.path[0] and __file__.startswith(sys.path[0]):
    sys.path.pop(0)

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec

from aivedio.config.media import MediaConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))
from smoke import positive, verdict

AIVEDIO = [sys.executable, "-m", "aivedio"]


def run_measured(
    argv: list[str], **kwargs: Any
) -> tuple[float, float, subprocess.CompletedProcess[str]]:
    """(wall seconds, CPU seconds of the process tree, completed process)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, check=False, **kwargs)
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if done.returncode != 0:
        raise SystemExit(f"failed ({done.returncode}): {' '.join(argv)}\n{done.stderr[-2000:]}")
    return wall, cpu, done


def make_sources(work: Path, seconds: int, size: str) -> dict[str, Path]:
    lavfi = [
        "-f",
        "lavfi",
        "-i",
        f"testsrc2=s={size}:r=24:d={seconds}",
        "-f",
        "lavfi",
        "-i",
        f"sine=frequency=440:d={seconds}",
    ]
    hevc = work / "source_hevc.mkv"
    h264 = work / "source_h264_moov_end.mp4"
    ffmpeg = ["ffmpeg", "-nostdin", "-v", "error", "-y"]
    subprocess.run(
        [
            *ffmpeg,
            *lavfi,
            "-c:v",
            "libx265",
            "-preset",
            "fast",
            "-x265-params",
            "log-level=error:keyint=48",
            "-c:a",
            "aac",
            "-shortest",
            str(hevc),
        ],
        check=True,
    )
    subprocess.run(
        [
            *ffmpeg,
            *lavfi,
            "-c:v",
            "libx264",
            "-preset",
            "medium",
            "-g",
            "48",
            "-pix_fmt",
            "yuv420p",
            "-c:a",
            "aac",
            "-shortest",
            str(h264),
        ],
        check=True,
    )
    return {"transcode": hevc, "remux": h264}


def probe(path: Path) -> dict[str, Any]:
    out = subprocess.run(
        [
            "ffprobe",
            "-v",
            "error",
            "-print_format",
            "json",
            "-show_streams",
            "-show_format",
            str(path),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    data: dict[str, Any] = json.loads(out.stdout)
    return data


def naive_commands(src: Path, out: Path, mode: str, media: MediaConfig) -> list[list[str]]:
    """Separate processes for the same outputs; each decodes the source again."""
    ff = ["ffmpeg", "-nostdin", "-v", "error", "-y"]
    x264 = [
        "-c:v",
        "libx264",
        "-preset",
        media.x264_preset,
        "-profile:v",
        "high",
        "-pix_fmt",
        "yuv420p",
        "-sc_threshold",
        "0",
    ]
    aac = ["-c:a", "aac", "-b:a", f"{media.audio_bitrate_kbps}k"]
    seg = media.segment_seconds
    keys = ["-force_key_frames", f"expr:gte(t,n_forced*{seg:g})"]
    cmds: list[list[str]] = []
    top = max(r.height for r in media.ladder)
    if mode == "remux":
        cmds.append(
            [
                *ff,
                "-i",
                str(src),
                "-c",
                "copy",
                "-movflags",
                "+faststart",
                str(out / "playback.mp4"),
            ]
        )
    else:
        rung = next(r for r in media.ladder if r.height == top)
        playback = str(out / "playback.mp4")
        cmds.append(
            [
                *ff,
                "-i",
                str(src),
                "-vf",
                f"scale=-2:{top}",
                *x264,
                "-crf",
                str(rung.crf),
                "-maxrate",
                f"{rung.maxrate_kbps}k",
                "-bufsize",
                f"{rung.bufsize_kbps}k",
                *keys,
                *aac,
                "-movflags",
                "+faststart",
                playback,
            ]
        )
    for rung in sorted(media.ladder, key=lambda r: -r.height):
        rdir = out / "hls" / f"{rung.height}p"
        rdir.mkdir(parents=True, exist_ok=True)
        hls = [
            "-f",
            "hls",
            "-hls_time",
            f"{seg:g}",
            "-hls_playlist_type",
            "vod",
            "-hls_segment_type",
            "fmp4",
            "-hls_segment_filename",
            str(rdir / "seg_%05d.m4s"),
            str(rdir / "index.m3u8"),
        ]
        if mode == "remux" and rung.height == top:
            cmds.append([*ff, "-i", str(src), "-c", "copy", *hls])
            continue
        cmds.append(
            [
                *ff,
                "-i",
                str(src),
                "-vf",
                f"scale=-2:{rung.height}",
                *x264,
                "-crf",
                str(rung.crf),
                "-maxrate",
                f"{rung.maxrate_kbps}k",
                "-bufsize",
                f"{rung.bufsize_kbps}k",
                *keys,
                *aac,
                *hls,
            ]
        )
    cmds.append(
        [
            *ff,
            "-i",
            str(src),
            "-vf",
            f"scale=-2:{media.proxy_height}",
            *x264,
            "-crf",
            str(media.proxy_crf),
            "-g",
            str(media.proxy_gop_frames),
            "-bf",
            "0",
            *aac,
            "-movflags",
            "+faststart",
            str(out / "proxy.mp4"),
        ]
    )
    cmds.append(
        [
            *ff,
            "-ss",
            "1",
            "-i",
            str(src),
            "-frames:v",
            "1",
            "-q:v",
            "2",
            "-update",
            "1",
            str(out / "poster.jpg"),
        ]
    )
    cmds.append(
        [
            *ff,
            "-i",
            str(src),
            "-vf",
            f"fps=1/{media.sprite_interval_seconds:g},scale={media.sprite_width}:-2,"
            f"tile={media.sprite_columns}x{media.sprite_rows}",
            "-q:v",
            "5",
            str(out / "sprite_%03d.jpg"),
        ]
    )
    cmds.append(
        [
            *ff,
            "-i",
            str(src),
            "-vn",
            "-ac",
            "1",
            "-ar",
            str(media.waveform_sample_rate),
            "-f",
            "s16le",
            str(out / "waveform.pcm"),
        ]
    )
    return cmds


def run_naive(src: Path, out: Path, mode: str, media: MediaConfig) -> dict[str, Any]:
    out.mkdir(parents=True)
    wall = cpu = 0.0
    for argv in naive_commands(src, out, mode, media):
        w, c, _ = run_measured(argv)
        wall += w
        cpu += c
    return {"wall_seconds": wall, "cpu_seconds": cpu}


def run_aivedio(src: Path, out: Path, only: str | None = None) -> dict[str, Any]:
    argv = [*AIVEDIO, "process", str(src), "--out", str(out)]
    if only:
        argv += ["--only", only]
    wall, cpu, done = run_measured(argv, env={**os.environ, "AIVEDIO_LOG__LEVEL": "warning"})
    summary: dict[str, Any] = json.loads(done.stdout)
    ffmpeg_wall = summary["ffmpeg_wall_seconds"]
    return {
        "wall_seconds": wall,
        "cpu_seconds": cpu,
        "in_process_wall_seconds": summary["wall_seconds"],
        "ffmpeg_wall_seconds": ffmpeg_wall,
        "overhead_seconds": wall - ffmpeg_wall,
        "overhead_ratio": (wall - ffmpeg_wall) / wall,
        "in_process_overhead_ratio": summary["overhead_seconds"] / summary["wall_seconds"],
        "peak_rss_bytes": summary["peak_rss_bytes"],
        "plan": summary["plan"]["mode"],
        "nodes": {k: v["seconds"] for k, v in summary["nodes"].items()},
        "steps": summary["steps"],
        "processes": [
            {k: p[k] for k in ("step", "wall_seconds", "cpu_seconds", "max_rss_bytes")}
            for p in summary["processes"]
        ],
    }


def sized_ladder(media: MediaConfig, size: str) -> MediaConfig:
    """The ladder aivedio makes for a source of ``size``: it never goes above the source, so
    the naive baseline makes the same rungs (all of them at 1080p)."""
    short = min(int(side) for side in size.split("x"))
    ladder = [rung for rung in media.ladder if rung.height <= short]
    return msgspec.structs.replace(media, ladder=ladder) if ladder else media


def sanity(results: dict[str, Any]) -> list[str]:
    """Both plans as named, every time a positive figure, every output process accounted."""
    problems = []
    for mode in ("transcode", "remux"):
        entry = results.get(mode)
        if entry is None:
            problems.append(f"{mode}: not measured")
            continue
        ours = entry["aivedio"]
        if ours["plan"] != mode:
            problems.append(f"{mode} source: aivedio planned {ours['plan']}")
        figures = {
            "aivedio wall": ours["wall_seconds"],
            "aivedio CPU": ours["cpu_seconds"],
            "ffmpeg wall": ours["ffmpeg_wall_seconds"],
            "peak RSS": ours["peak_rss_bytes"],
            "naive wall": entry["naive"]["wall_seconds"],
            "naive CPU": entry["naive"]["cpu_seconds"],
        }
        problems += [f"{mode}: {k} = {v}" for k, v in figures.items() if not positive(v)]
        if not ours["processes"] or not ours["nodes"]:
            problems.append(f"{mode}: no ffmpeg process or node reported")
        if mode == "remux" and not positive(entry.get("required_rtf_end_to_end")):
            problems.append(f"remux: required-only RTF = {entry.get('required_rtf_end_to_end')}")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--size", default="1920x1080", help="the sources' WIDTHxHEIGHT")
    parser.add_argument("--workdir")
    parser.add_argument("--smoke", action="store_true", help="1 s at 640x360; sanity checked")
    args = parser.parse_args()
    if args.smoke:
        args.seconds, args.size = 1, "640x360"
    work = Path(args.workdir or tempfile.mkdtemp(prefix="aivedio-bench-media-"))
    work.mkdir(parents=True, exist_ok=True)
    media = sized_ladder(MediaConfig(), args.size)
    results: dict[str, Any] = {
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "ffmpeg": subprocess.run(
                ["ffmpeg", "-version"], capture_output=True, text=True, check=True
            ).stdout.splitlines()[0],
        },
    }
    try:
        sources = make_sources(work, args.seconds, args.size)
        for mode, src in sources.items():
            duration = float(probe(src)["format"]["duration"])
            ours = run_aivedio(src, work / f"{mode}_aivedio")
            naive = run_naive(src, work / f"{mode}_naive", mode, media)
            entry: dict[str, Any] = {
                "source": src.name,
                "duration_seconds": duration,
                "aivedio": ours,
                "naive": naive,
                "wall_ratio": ours["wall_seconds"] / naive["wall_seconds"],
                "cpu_ratio": ours["cpu_seconds"] / naive["cpu_seconds"],
            }
            if mode == "remux":
                required = run_aivedio(src, work / "remux_required", only="playback,poster")
                node_seconds = sum(required["nodes"].values())
                entry["required_only"] = required
                entry["required_rtf_nodes"] = node_seconds / duration
                entry["required_rtf_end_to_end"] = required["wall_seconds"] / duration
            results[mode] = entry
            print(
                json.dumps({mode: {k: v for k, v in entry.items() if k != "aivedio"}}, indent=1),
                file=sys.stderr,
            )
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(results, indent=1))
    return verdict("media", sanity(results)) if args.smoke else 0


if __name__ == "__main__":
    raise SystemExit(main())
