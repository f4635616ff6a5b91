"""Media benchmark: ``aivedio process`` against a naive baseline, in one run.

Sources (generated here with ffmpeg, never committed): a 10 s 1080p HEVC source in Matroska
(the transcode path), a 10 s 1080p H.264 MP4 with moov at the end (the remux path), both
with AAC audio; a 10 s 1080p 10-bit HEVC tagged HDR10 (PQ, BT.2020: the ``hdr`` path, tone
mapped to SDR BT.709) and the H.264 remux source with its audio 15 dB louder (the
``normalized_remux`` path: the audio alone re-encoded to -16 LUFS, the video copied).

For each source:

* ``aivedio process SRC --out DIR`` as a subprocess: its wall time, its CPU time (children's
  rusage, which includes every ffmpeg it started), and from its JSON summary the ffmpeg
  processes' wall time, CPU time and peak RSS, and the time per node;
* the naive baseline: separate sequential ffmpeg processes producing the same outputs, each
  decoding the source again (playback MP4, one HLS rendition per rung, proxy, poster, sprite
  sheet, waveform PCM), with the same x264 preset, CRFs and rung sizes; for ``hdr`` each of
  them tone-maps again (the same chain), for ``normalized_remux`` a measuring pass
  (``ebur128``) comes first and every output with audio applies the gain it found.

For the normalized remux the required set alone (``--only playback,poster``) is also run
with normalization off (``AIVEDIO_MEDIA__LOUDNESS__NORMALIZE=false``): the difference is
what normalizing adds to a remux's required set on the queue path (``aivedio process``
measures in a pass of its own; the worker's fast path measures in its frames pass).

Targets (issue 4): transcode path <= 0.6x naive wall and CPU; remux path's required outputs
(playback + poster) at RTF <= 0.05; aivedio's overhead (its wall minus its ffmpeg processes'
wall) <= 5%; peak RSS of any ffmpeg process <= 1 GiB. Issue 29: the HDR tone-mapped ladder
<= 0.6x naive wall; normalizing adds <= 0.3 s to an 8 s remux's required set; the H.264 +
AV1 HLS ladders of the transcode source (``_av1_ladder.py``: one ffmpeg per rung as the
baseline, the H.264 ladder alone as a peer) <= 0.6x naive wall.

Usage: .venv/bin/python scripts/bench/media.py [--seconds 10] [--size 1920x1080] [--workdir DIR]
       [--cases transcode,remux,hdr,normalized_remux,av1] [--smoke]

``--smoke``: 1 s sources at 640x360 (one rung of the ladder on both paths; the naive
baseline makes only the rungs aivedio makes), and the results checked for sanity instead of
the targets: both plans as expected, every figure positive, every output made.
"""

from __future__ import annotations

import sys

if sys.path and sys.path[0] and __file__.startswith(sys.path[0]):
    sys.path.pop(0)

import argparse
import importlib.util
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
from aivedio.pipeline.media import colour, loudness
from aivedio.pipeline.media.colour import Colour

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))
from smoke import positive, verdict


def _sibling(name: str) -> Any:
    """A module of scripts/bench by its path (that directory is off sys.path: its queue.py
    would shadow the standard library's)."""
    spec = importlib.util.spec_from_file_location(
        f"bench_{name}", Path(__file__).resolve().parent / f"{name}.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


av1_ladder = _sibling("_av1_ladder")  # the H.264 + AV1 ladders case

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
    hdr = work / "source_hdr10.mkv"
    subprocess.run(
        [
            *ffmpeg,
            *lavfi,
            *("-c:v", "libx265", "-preset", "fast", "-pix_fmt", "yuv420p10le"),
            *("-x265-params", "log-level=error:keyint=48:hdr10=1:max-cll=1000,400"),
            *("-color_primaries", "bt2020", "-color_trc", "smpte2084"),
            *("-colorspace", "bt2020nc", "-color_range", "tv"),
            *("-c:a", "aac", "-shortest", str(hdr)),
        ],
        check=True,
    )
    loud = work / "source_h264_loud.mp4"
    subprocess.run(
        [*ffmpeg, "-i", str(h264), "-c:v", "copy", "-af", "volume=15dB", "-c:a", "aac", str(loud)],
        check=True,
    )
    return {"transcode": hevc, "remux": h264, "hdr": hdr, "normalized_remux": loud}


# The plan each source must get, and the baseline's shape for it.
PLANS = {
    "transcode": "transcode",
    "remux": "remux",
    "hdr": "transcode",
    "normalized_remux": "remux",
}
HDR10 = Colour(primaries="bt2020", transfer="smpte2084", matrix="bt2020nc", range="tv")


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


def naive_commands(
    src: Path, out: Path, mode: str, media: MediaConfig, *, pre: str = "", gain: str = ""
) -> list[list[str]]:
    """Separate processes for the same outputs; each decodes the source again. ``pre``: a
    filter every video output applies first (the tone map); ``gain``: the audio filter
    every output with audio applies (then a copied video keeps its video copied)."""
    ff = ["ffmpeg", "-nostdin", "-v", "error", "-y"]
    lead = f"{pre}," if pre else ""
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
    aac = [*(["-af", gain] if gain else []), "-c:a", "aac", "-b:a", f"{media.audio_bitrate_kbps}k"]
    # A copy of the source's streams, or of its video only when the audio is normalized.
    copy = ["-c:v", "copy", *aac] if gain else ["-c", "copy"]
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
                *copy,
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
                f"{lead}scale=-2:{top}",
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
            cmds.append([*ff, "-i", str(src), *copy, *hls])
            continue
        cmds.append(
            [
                *ff,
                "-i",
                str(src),
                "-vf",
                f"{lead}scale=-2:{rung.height}",
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
            f"{lead}scale=-2:{media.proxy_height}",
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
            *(["-vf", pre] if pre else []),
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
            f"{lead}fps=1/{media.sprite_interval_seconds:g},scale={media.sprite_width}:-2,"
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
    """The baseline's processes one after the other; for ``normalized_remux`` a measuring
    pass first, whose figures give the gain the outputs apply."""
    out.mkdir(parents=True)
    wall = cpu = 0.0
    pre = gain = ""
    if mode == "hdr":
        pre = colour.colour_filter(HDR10, media.colour)
    if mode == "normalized_remux":
        measured = out / loudness.MEASURED
        argv = ["ffmpeg", "-nostdin", "-v", "error", "-y", "-i", str(src), "-map", "0:a:0"]
        argv += ["-af", loudness.measure_filter(str(measured)), "-f", "null", "-"]
        wall, cpu, _ = run_measured(argv)
        figures = loudness.parse_measurement(measured.read_text())
        assert figures is not None, "the baseline's measuring pass printed nothing"
        gain = loudness.normalize_filter(figures, media.loudness, 48000)
    for argv in naive_commands(src, out, PLANS[mode], media, pre=pre, gain=gain):
        w, c, _ = run_measured(argv)
        wall += w
        cpu += c
    return {"wall_seconds": wall, "cpu_seconds": cpu}


def run_aivedio(
    src: Path,
    out: Path,
    only: str | None = None,
    *,
    normalize: bool = True,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    argv = [*AIVEDIO, "process", str(src), "--out", str(out)]
    if only:
        argv += ["--only", only]
    env = {**os.environ, "AIVEDIO_LOG__LEVEL": "warning", **(env or {})}
    if not normalize:
        env["AIVEDIO_MEDIA__LOUDNESS__NORMALIZE"] = "false"
    wall, cpu, done = run_measured(argv, env=env)
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
        "audio": summary["plan"]["audio"],
        "av1_rungs": len(summary["plan"].get("av1_rungs", [])),
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
    for mode in PLANS:
        entry = results.get(mode)
        if entry is None:
            problems.append(f"{mode}: not measured")
            continue
        ours = entry["aivedio"]
        if ours["plan"] != PLANS[mode]:
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
        if mode == "normalized_remux" and ours["audio"] != "aac":
            problems.append(f"normalized_remux: the audio was planned {ours['audio']}")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--size", default="1920x1080", help="the sources' WIDTHxHEIGHT")
    parser.add_argument("--workdir")
    parser.add_argument("--smoke", action="store_true", help="1 s at 640x360; sanity checked")
    parser.add_argument(
        "--cases",
        default=",".join([*PLANS, "av1"]),
        help="the cases to run, comma-separated (default: all); --smoke runs all",
    )
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
        cases = set([*PLANS, "av1"] if args.smoke else args.cases.split(","))
        for mode, src in sources.items():
            if mode not in cases:
                continue
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
            if mode == "normalized_remux":
                required = "playback,poster"
                on = run_aivedio(src, work / "normalized_required", only=required)
                off = run_aivedio(
                    src, work / "unnormalized_required", only=required, normalize=False
                )
                entry["required_normalized_wall_seconds"] = on["wall_seconds"]
                entry["required_unnormalized_wall_seconds"] = off["wall_seconds"]
                entry["normalizing_adds_seconds"] = on["wall_seconds"] - off["wall_seconds"]
            results[mode] = entry
            print(
                json.dumps({mode: {k: v for k, v in entry.items() if k != "aivedio"}}, indent=1),
                file=sys.stderr,
            )
        if "av1" in cases:
            rate = 24.0  # the sources' (make_sources)
            results["av1"] = av1_ladder.run_case(
                sources["transcode"], work, media, rate, run_aivedio, run_measured
            )
            shown = {
                k: v for k, v in results["av1"].items() if k not in ("aivedio", "peer_h264_only")
            }
            print(json.dumps({"av1": shown}, indent=1), file=sys.stderr)
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(results, indent=1))
    problems = sanity(results) + av1_ladder.sanity(results.get("av1"), media)
    return verdict("media", problems) if args.smoke else 0


if __name__ == "__main__":
    raise SystemExit(main())
