"""The source files: a few small clips and hostile files, made once under var/chaos/media.

Many provider outputs share each file (the provider serves the same bytes under many task
ids), so 200 outputs cost five files. Each file is remade when its recipe changes.
"""

from __future__ import annotations

import json
import random
import subprocess
from pathlib import Path

LAVFI = ["-f", "lavfi", "-i"]
H264 = [
    *LAVFI,
    "testsrc2=size=320x240:rate=24:duration=2",
    *LAVFI,
    "sine=frequency=440:duration=2",
    "-c:v",
    "libx264",
    "-preset",
    "veryfast",
    "-g",
    "24",
    "-pix_fmt",
    "yuv420p",
    "-c:a",
    "aac",
    "-b:a",
    "64k",
    "-shortest",
    "-movflags",
    "+faststart",
]
HEVC = [
    *LAVFI,
    "testsrc2=size=320x240:rate=25:duration=2",
    *LAVFI,
    "sine=frequency=660:duration=2",
    "-c:v",
    "libx265",
    "-preset",
    "ultrafast",
    "-x265-params",
    "log-level=error",
    "-tag:v",
    "hvc1",
    "-pix_fmt",
    "yuv420p",
    "-c:a",
    "aac",
    "-b:a",
    "64k",
    "-shortest",
    "-movflags",
    "+faststart",
]
ERROR_PAGE = b"""<!DOCTYPE html>
<html><head><title>502 Bad Gateway</title></head>
<body><h1>502 Bad Gateway</h1><p>upstream render node timed out; please retry</p></body></html>
"""
SOURCES = ("remux.mp4", "hevc.mp4", "error-page.mp4", "truncated.mp4", "random.mp4")


def _ffmpeg(argv: list[str], path: Path) -> None:
    done = subprocess.run(
        ["ffmpeg", "-nostdin", "-v", "error", "-y", *argv, str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"ffmpeg could not make {path}: {done.stderr.strip()}")


def make_media(directory: Path) -> dict[str, Path]:
    """Every source file, made when missing or when its recipe changed."""
    directory.mkdir(parents=True, exist_ok=True)
    recipes: dict[str, str] = {
        "remux.mp4": json.dumps(H264),
        "hevc.mp4": json.dumps(HEVC),
        "error-page.mp4": ERROR_PAGE.decode(),
        "truncated.mp4": "60% of " + json.dumps(H264),
        "random.mp4": "random.Random('aivedio-chaos').randbytes(40000)",
    }
    paths = {name: directory / name for name in SOURCES}
    for name, recipe in recipes.items():
        path = paths[name]
        stamp = path.with_name(path.name + ".recipe")
        if path.is_file() and stamp.is_file() and stamp.read_text() == recipe:
            continue
        if name == "remux.mp4":
            _ffmpeg(H264, path)
        elif name == "hevc.mp4":
            _ffmpeg(HEVC, path)
        elif name == "error-page.mp4":
            path.write_bytes(ERROR_PAGE)
        elif name == "truncated.mp4":
            whole = directory / ".whole.mp4"
            _ffmpeg(H264, whole)
            data = whole.read_bytes()
            path.write_bytes(data[: len(data) * 6 // 10])
            whole.unlink()
        else:
            path.write_bytes(random.Random("aivedio-chaos").randbytes(40000))
        stamp.write_text(recipe)
    return paths
