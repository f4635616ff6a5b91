"""An HLS (fMP4) checker for tests: ``check_hls(master)`` lists every problem it finds.

Checked, with one human-readable problem string per failure (an empty list means OK):

* the master playlist: ``#EXTM3U`` first; every ``#EXT-X-STREAM-INF`` has BANDWIDTH (int > 0),
  RESOLUTION (WxH), CODECS (quoted, non-empty) and FRAME-RATE (> 0) and is followed by the URI
  of a media playlist that exists; ``#EXT-X-MEDIA`` URIs (alternative audio etc.) are checked
  as media playlists too;
* every media playlist: ``#EXTM3U``, ``#EXT-X-TARGETDURATION``, ``#EXT-X-VERSION``,
  ``#EXT-X-MAP`` whose init file exists, every ``#EXTINF`` followed by a segment that exists
  and is non-empty, every duration rounded to the nearest integer <= the target duration,
  ``#EXT-X-ENDLIST``; no URI is absolute, has a scheme, or contains ``..``;
* every video rendition's segments start with a keyframe and all video renditions of one
  codec family (the video entry of CODECS up to its first dot: ``avc1``, ``av01``; a client
  switches within one) start their segments at the same timestamps (within half a frame,
  0.02 s when no FRAME-RATE is known), read with ffprobe from init + segment (fMP4 ``tfdt``
  makes the times absolute);
* with ``decode=True``: init + all segments of each rendition decode with
  ``ffmpeg -v error -xerror`` (exit 0, nothing on stderr).

Nothing raises for bad input: unreadable files, bad syntax and tool failures become problems.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import tempfile
from pathlib import Path
from typing import Any

FFMPEG = "ffmpeg"
FFPROBE = "ffprobe"
TOOL_TIMEOUT = 120

_ATTRIBUTE = re.compile(r'([A-Z0-9-]+)=("[^"]*"|[^",]*)')
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
_RESOLUTION = re.compile(r"^[1-9][0-9]*x[1-9][0-9]*$")


class PlaylistError(Exception):
    """A playlist cannot be read at all (missing, not text, not ``#EXTM3U``)."""


def parse_attributes(text: str) -> dict[str, str]:
    """An HLS attribute list; quoted values keep their quotes (so "was it quoted" is visible)."""
    return {match.group(1): match.group(2) for match in _ATTRIBUTE.finditer(text)}


def unquote(value: str | None) -> str | None:
    if value is not None and len(value) >= 2 and value[0] == value[-1] == '"':
        return value[1:-1]
    return value


def _read_playlist(path: Path) -> list[str]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise PlaylistError(f"{path.name}: missing") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise PlaylistError(f"{path.name}: unreadable ({exc})") from exc
    lines = [line.strip() for line in text.lstrip("\ufeff").splitlines()]
    if not lines or lines[0] != "#EXTM3U":
        raise PlaylistError(f"{path.name}: does not start with #EXTM3U")
    return lines


def parse_master(path: Path) -> list[dict[str, Any]]:
    """The variants of a master playlist, in order.

    Each is ``{"kind": "variant", "line": n, "attributes": {...}, "uri": str | None}`` for an
    ``#EXT-X-STREAM-INF`` (``uri`` is the next non-comment line, ``None`` if there is none) or
    ``{"kind": "media", ...}`` for an ``#EXT-X-MEDIA`` with a URI attribute.
    Raises ``PlaylistError`` when the file cannot be read or does not start with ``#EXTM3U``.
    """
    lines = _read_playlist(path)
    entries: list[dict[str, Any]] = []
    pending: dict[str, Any] | None = None
    for number, line in enumerate(lines, start=1):
        if not line:
            continue
        if line.startswith("#EXT-X-STREAM-INF:"):
            if pending is not None:
                entries.append(pending)
            attributes = parse_attributes(line.partition(":")[2])
            pending = {"kind": "variant", "line": number, "attributes": attributes, "uri": None}
        elif line.startswith("#EXT-X-MEDIA:"):
            attributes = parse_attributes(line.partition(":")[2])
            uri = unquote(attributes.get("URI"))
            if uri is not None:
                entries.append(
                    {"kind": "media", "line": number, "attributes": attributes, "uri": uri}
                )
        elif line.startswith("#"):
            continue
        elif pending is not None:
            pending["uri"] = line
            entries.append(pending)
            pending = None
    if pending is not None:
        entries.append(pending)
    return entries


def parse_media_playlist(path: Path) -> dict[str, Any]:
    """A media playlist as a dict.

    Keys: ``target_duration`` (int | None), ``version`` (int | None), ``map_uri`` (str | None),
    ``segments`` (list of ``{"duration": float | None, "uri": str | None, "line": n}``),
    ``endlist`` (bool), ``syntax`` (list of syntax problems found while parsing).
    Raises ``PlaylistError`` when the file cannot be read or does not start with ``#EXTM3U``.
    """
    lines = _read_playlist(path)
    result: dict[str, Any] = {
        "target_duration": None,
        "version": None,
        "map_uri": None,
        "segments": [],
        "endlist": False,
        "syntax": [],
    }
    syntax: list[str] = result["syntax"]
    segments: list[dict[str, Any]] = result["segments"]
    pending: dict[str, Any] | None = None
    for number, line in enumerate(lines, start=1):
        if not line:
            continue
        tag, _, value = line.partition(":")
        if tag == "#EXT-X-TARGETDURATION":
            try:
                result["target_duration"] = int(value)
            except ValueError:
                syntax.append(f"line {number}: bad #EXT-X-TARGETDURATION {value!r}")
        elif tag == "#EXT-X-VERSION":
            try:
                result["version"] = int(value)
            except ValueError:
                syntax.append(f"line {number}: bad #EXT-X-VERSION {value!r}")
        elif tag == "#EXT-X-MAP":
            uri = unquote(parse_attributes(value).get("URI"))
            if uri is None:
                syntax.append(f"line {number}: #EXT-X-MAP without URI")
            result["map_uri"] = uri
        elif tag == "#EXTINF":
            if pending is not None:
                syntax.append(f"line {pending['line']}: #EXTINF without a segment URI")
                segments.append(pending)
            raw = value.partition(",")[0]
            duration: float | None
            try:
                duration = float(raw)
                if not math.isfinite(duration) or duration < 0:
                    raise ValueError(raw)
            except ValueError:
                syntax.append(f"line {number}: bad #EXTINF duration {raw!r}")
                duration = None
            pending = {"duration": duration, "uri": None, "line": number}
        elif tag == "#EXT-X-ENDLIST":
            result["endlist"] = True
        elif line.startswith("#"):
            continue
        elif pending is not None:
            pending["uri"] = line
            segments.append(pending)
            pending = None
        else:
            syntax.append(f"line {number}: URI {line!r} without #EXTINF")
    if pending is not None:
        syntax.append(f"line {pending['line']}: #EXTINF without a segment URI")
        segments.append(pending)
    return result


def _uri_problem(uri: str) -> str | None:
    if uri.startswith(("/", "\\")) or _SCHEME.match(uri):
        return "is absolute"
    if ".." in uri:
        return "contains '..'"
    return None


def _number(value: str | None) -> float | None:
    try:
        number = float(unquote(value) or "")
    except ValueError:
        return None
    return number if math.isfinite(number) else None


def _check_variant_attributes(label: str, attributes: dict[str, str]) -> list[str]:
    problems: list[str] = []
    bandwidth = attributes.get("BANDWIDTH")
    if bandwidth is None:
        problems.append(f"{label}: BANDWIDTH missing")
    elif not bandwidth.isdigit() or int(bandwidth) <= 0:
        problems.append(f"{label}: BANDWIDTH {bandwidth!r} is not an integer > 0")
    resolution = attributes.get("RESOLUTION")
    if resolution is None:
        problems.append(f"{label}: RESOLUTION missing")
    elif not _RESOLUTION.match(resolution):
        problems.append(f"{label}: RESOLUTION {resolution!r} is not WxH")
    codecs = attributes.get("CODECS")
    if codecs is None:
        problems.append(f"{label}: CODECS missing")
    elif len(codecs) < 3 or not (codecs[0] == codecs[-1] == '"'):
        problems.append(f"{label}: CODECS {codecs!r} is not a non-empty quoted string")
    frame_rate = attributes.get("FRAME-RATE")
    if frame_rate is None:
        problems.append(f"{label}: FRAME-RATE missing")
    else:
        rate = _number(frame_rate)
        if rate is None or rate <= 0:
            problems.append(f"{label}: FRAME-RATE {frame_rate!r} is not a number > 0")
    return problems


class _Rendition:
    def __init__(
        self, name: str, path: Path, video: bool, frame_rate: float | None, family: str = ""
    ) -> None:
        self.name = name
        self.family = family
        self.path = path
        self.video = video
        self.frame_rate = frame_rate
        self.init: Path | None = None
        self.segments: list[Path] = []
        self.complete = False  # structure fine enough to probe and decode


def _check_media_playlist(rendition: _Rendition) -> list[str]:
    name = rendition.name
    try:
        playlist = parse_media_playlist(rendition.path)
    except PlaylistError as exc:
        return [str(exc)]
    problems = [f"{name}: {problem}" for problem in playlist["syntax"]]
    target: int | None = playlist["target_duration"]
    if target is None:
        problems.append(f"{name}: #EXT-X-TARGETDURATION missing")
    if playlist["version"] is None:
        problems.append(f"{name}: #EXT-X-VERSION missing")
    if not playlist["endlist"]:
        problems.append(f"{name}: #EXT-X-ENDLIST missing")
    base = rendition.path.parent
    complete = True

    def existing(uri: str, what: str) -> Path | None:
        unsafe = _uri_problem(uri)
        if unsafe:
            problems.append(f"{name}: {what} URI {uri!r} {unsafe}")
            return None
        path = base / uri
        try:
            size = path.stat().st_size if path.is_file() else None
        except OSError:
            size = None
        if size is None:
            problems.append(f"{name}: {what} {uri} missing")
            return None
        if size == 0:
            problems.append(f"{name}: {what} {uri} is empty")
            return None
        return path

    map_uri: str | None = playlist["map_uri"]
    if map_uri is None:
        problems.append(f"{name}: #EXT-X-MAP (init segment) missing")
        complete = False
    else:
        rendition.init = existing(map_uri, "init")
        complete = complete and rendition.init is not None
    segments: list[dict[str, Any]] = playlist["segments"]
    if not segments:
        problems.append(f"{name}: no segments")
        complete = False
    for segment in segments:
        uri: str | None = segment["uri"]
        duration: float | None = segment["duration"]
        if uri is None:
            complete = False
            continue
        if duration is not None and target is not None and round(duration) > target:
            problems.append(
                f"{name}: #EXTINF {duration} for {uri} exceeds #EXT-X-TARGETDURATION {target}"
            )
        if duration is None:
            complete = False
        path = existing(uri, "segment")
        if path is None:
            complete = False
        else:
            rendition.segments.append(path)
    rendition.complete = complete
    return problems


def _first_video_packet(init: Path, segment: Path, scratch: Path) -> tuple[float, bool] | str:
    """(pts_time, is_key) of the first video packet of init+segment, or a problem."""
    joined = scratch / "probe.mp4"
    joined.write_bytes(init.read_bytes() + segment.read_bytes())
    argv = [FFPROBE, "-v", "error", "-select_streams", "v:0"]
    argv += ["-show_entries", "packet=pts_time,flags", "-of", "json", str(joined)]
    try:
        proc = subprocess.run(argv, capture_output=True, timeout=TOOL_TIMEOUT)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"ffprobe failed ({exc})"
    if proc.returncode != 0:
        return f"ffprobe exit {proc.returncode}: {proc.stderr.decode(errors='replace')[:300]}"
    try:
        packets = json.loads(proc.stdout).get("packets", [])
    except ValueError:
        return "ffprobe printed no JSON"
    if not packets:
        return "no video packet"
    first = packets[0]
    pts = _number(first.get("pts_time"))
    if pts is None:
        return f"first video packet has no pts ({first.get('pts_time')!r})"
    return pts, str(first.get("flags", "")).startswith("K")


def _check_keyframes(renditions: list[_Rendition], scratch: Path) -> list[str]:
    problems: list[str] = []
    starts: dict[str, list[float]] = {}
    for rendition in renditions:
        if not (rendition.video and rendition.complete and rendition.init is not None):
            continue
        times: list[float] = []
        for segment in rendition.segments:
            found = _first_video_packet(rendition.init, segment, scratch)
            if isinstance(found, str):
                problems.append(f"{rendition.name}: segment {segment.name}: {found}")
                times = []
                break
            pts, key = found
            if not key:
                problems.append(
                    f"{rendition.name}: segment {segment.name} does not start with a keyframe"
                )
            times.append(pts)
        else:
            starts[rendition.name] = times
    rates = [r.frame_rate for r in renditions if r.video and r.frame_rate]
    tolerance = 0.5 / max(rates) if rates else 0.02
    families: dict[str, list[str]] = {}
    for rendition in renditions:
        if rendition.name in starts:
            families.setdefault(rendition.family, []).append(rendition.name)
    for names in families.values():
        problems += _check_aligned(names, starts, tolerance)
    return problems


def _check_aligned(names: list[str], starts: dict[str, list[float]], tolerance: float) -> list[str]:
    problems: list[str] = []
    for other in names[1:]:
        reference, times = starts[names[0]], starts[other]
        if len(times) != len(reference):
            problems.append(
                f"renditions misaligned: {names[0]} has {len(reference)} segments, "
                f"{other} has {len(times)}"
            )
            continue
        for index, (a, b) in enumerate(zip(reference, times, strict=True)):
            if abs(a - b) > tolerance:
                problems.append(
                    f"renditions misaligned: segment {index} starts at {a:.3f} in {names[0]} "
                    f"but at {b:.3f} in {other}"
                )
                break
    return problems


def _check_decode(rendition: _Rendition, scratch: Path) -> list[str]:
    if not rendition.complete or rendition.init is None:
        return []
    joined = scratch / "decode.mp4"
    with joined.open("wb") as out:
        for part in (rendition.init, *rendition.segments):
            out.write(part.read_bytes())
    argv = [FFMPEG, "-nostdin", "-hide_banner", "-v", "error", "-xerror"]
    argv += ["-i", str(joined), "-f", "null", "-"]
    try:
        proc = subprocess.run(argv, capture_output=True, timeout=TOOL_TIMEOUT)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return [f"{rendition.name}: decode failed ({exc})"]
    stderr = proc.stderr.decode(errors="replace").strip()
    if proc.returncode != 0 or stderr:
        return [f"{rendition.name}: decode exit {proc.returncode}: {stderr[:500]}"]
    return []


def _check_subtitle_playlist(label: str, path: Path) -> list[str]:
    """A subtitle media playlist: complete, and every WebVTT segment it names present and
    starting with the WebVTT signature."""
    lines = [line.strip() for line in path.read_text().splitlines() if line.strip()]
    problems = []
    if not lines or lines[0] != "#EXTM3U":
        problems.append(f"{label}: subtitle playlist does not start with #EXTM3U")
    if "#EXT-X-ENDLIST" not in lines:
        problems.append(f"{label}: subtitle playlist has no #EXT-X-ENDLIST")
    segments = [line for line in lines if not line.startswith("#")]
    if not segments:
        problems.append(f"{label}: subtitle playlist names no segment")
    for uri in segments:
        unsafe = _uri_problem(uri)
        segment = path.parent / uri
        if unsafe:
            problems.append(f"{label}: segment URI {uri!r} {unsafe}")
        elif not segment.is_file():
            problems.append(f"{label}: subtitle segment {uri} missing")
        elif not segment.read_text().startswith("WEBVTT"):
            problems.append(f"{label}: subtitle segment {uri} is not WebVTT")
    return problems


def check_hls(master_path: Path, *, decode: bool = True) -> list[str]:
    """Every problem found in the HLS presentation under ``master_path``; [] when it is fine."""
    try:
        return _check_hls(master_path, decode=decode)
    except Exception as exc:  # the checker must report, never raise
        return [f"checker error: {type(exc).__name__}: {exc}"]


def _check_hls(master_path: Path, *, decode: bool) -> list[str]:
    master_name = master_path.name
    try:
        entries = parse_master(master_path)
    except PlaylistError as exc:
        return [str(exc)]
    problems: list[str] = []
    if not any(entry["kind"] == "variant" for entry in entries):
        problems.append(f"{master_name}: no #EXT-X-STREAM-INF")
    base = master_path.parent
    renditions: list[_Rendition] = []
    seen: set[str] = set()
    for index, entry in enumerate(entries):
        attributes: dict[str, str] = entry["attributes"]
        uri: str | None = entry["uri"]
        video = entry["kind"] == "variant" or attributes.get("TYPE") == "VIDEO"
        label = f"{master_name}: {entry['kind']} {index} ({uri or 'no URI'})"
        if entry["kind"] == "variant":
            problems += _check_variant_attributes(label, attributes)
        if uri is None:
            problems.append(f"{label}: no media playlist URI after #EXT-X-STREAM-INF")
            continue
        unsafe = _uri_problem(uri)
        if unsafe:
            problems.append(f"{label}: URI {uri!r} {unsafe}")
            continue
        if uri in seen:
            continue
        seen.add(uri)
        path = base / uri
        if not path.is_file():
            problems.append(f"{label}: media playlist {uri} missing")
            continue
        if attributes.get("TYPE") == "SUBTITLES":  # WebVTT segments, no fMP4 to check
            problems += _check_subtitle_playlist(label, path)
            continue
        rate = _number(attributes.get("FRAME-RATE")) if video else None
        family = (unquote(attributes.get("CODECS")) or "").split(".")[0]
        renditions.append(_Rendition(uri, path, video, rate, family))
    for rendition in renditions:
        problems += _check_media_playlist(rendition)
    with tempfile.TemporaryDirectory(prefix="hls-check-") as tmp:
        scratch = Path(tmp)
        problems += _check_keyframes(renditions, scratch)
        if decode:
            for rendition in renditions:
                problems += _check_decode(rendition, scratch)
    return problems
