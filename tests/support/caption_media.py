"""Caption sources for the text-track tests: generated clips with a ``mov_text`` stream made
from an SRT (ffmpeg ``-c:s mov_text``), and SRT/WebVTT sidecars, friendly and hostile."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from tests.support.media_fixtures import FFPROBE, run_ffmpeg

FRIENDLY_SRT = """1
00:00:00,500 --> 00:00:01,800
<i>Hello</i> from the source

2
00:00:02,000 --> 00:00:03,500
Second line & more
"""

# Script tags, an event handler, SRT font markup, a forged cue inside the text and an
# entity that spells a tag: none of it may come out as markup or as a cue of its own.
HOSTILE_SRT = """1
00:00:01,000 --> 00:00:02,500
<script>alert(1)</script><i>kept</i> <img src=x onerror=alert(2)>
<font color="red">red</font> 00:00:09.000 --> 00:00:10.000 forged

2
00:00:03,000 --> 00:00:04,000
&lt;b&gt;not a tag&lt;/b&gt; <b>bold
"""

GOOD_VTT = """WEBVTT - a title

NOTE a comment that is dropped

STYLE
::cue { background: url(https://evil.example/x.png) }

intro
00:00.800 --> 00:02.600 align:start line:0 onclick:evil
<v Narrator>Caption at one second</v>

00:03.000 --> 00:04.200
<c.yellow.bad$class>second</c> cue
"""


def clip_with_mov_text(
    directory: Path, srt: str, *, seconds: float = 4.0, pix_fmt: str = "yuv420p"
) -> Path:
    """An MP4 (H.264 + AAC, 320x240, 24 fps) with a ``mov_text`` stream made from ``srt``,
    tagged English. ``pix_fmt`` ``yuv444p``: a source the plan transcodes."""
    directory.mkdir(parents=True, exist_ok=True)
    source = directory / "source.srt"
    source.write_text(srt)
    out = directory / "with_mov_text.mp4"
    run_ffmpeg(
        *("-f", "lavfi", "-i", f"testsrc2=s=320x240:r=24:d={seconds}"),
        *("-f", "lavfi", "-i", f"sine=frequency=440:sample_rate=48000:duration={seconds}"),
        *("-i", str(source)),
        *("-map", "0:v", "-map", "1:a", "-map", "2:s"),
        *("-c:v", "libx264", "-preset", "ultrafast", "-pix_fmt", pix_fmt, "-g", "24"),
        *("-c:a", "aac", "-b:a", "64k", "-c:s", "mov_text"),
        *("-metadata:s:s:0", "language=eng", "-movflags", "+faststart"),
        str(out),
    )
    return out


def probe(target: str | Path, *entries: str) -> dict[str, Any]:
    """ffprobe's JSON of ``target`` (a file or a loopback URL) with ``entries``."""
    argv = [FFPROBE, "-v", "error", "-of", "json", *entries, str(target)]
    done = subprocess.run(argv, check=True, capture_output=True, timeout=60)
    return dict(json.loads(done.stdout))
