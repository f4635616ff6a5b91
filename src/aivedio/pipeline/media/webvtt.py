"""Caption text from outside (a sidecar a client sends, a provider's captions, a subtitle
stream ffmpeg converted) made into clean WebVTT, or refused with a reason.

Caption text is untrusted and ends up in a page: a browser parses a ``<track>``'s WebVTT
itself and renders its cue text, and players such as hls.js build DOM nodes from the cue
markup. Passing the text through (or patching it with a few replacements) lets through
what the parsers disagree on: a ``<script>`` or ``<img onerror=...>`` tag some renderer
turns into markup, a ``-->`` in a cue line that starts a forged cue, a NUL that cuts a
string in one parser and not in another, a STYLE block with ``url()``, or a file of a
million cues that stalls the page. So nothing is passed through: the text is parsed into
cues (start, end, a few settings, text) and a new file is written from them alone:

* at most ``max_bytes`` of UTF-8 text: binary (a NUL, bytes that are not UTF-8) is refused;
  other control characters are dropped, line ends normalized;
* SRT (``00:00:01,000 --> 00:00:02,000``) or WebVTT (``WEBVTT`` first), told apart by that
  first line; NOTE, STYLE and REGION blocks and cue identifiers are dropped;
* every timing line valid (minutes and seconds below 60, milliseconds of three digits,
  an end after its start, below ``MAX_HOURS``), else the file is refused naming the line;
* cue settings kept only when they are the standard ones with a valid value;
* cue text: only the WebVTT tags ``b i u c v lang ruby rt`` (and inline timestamps) kept,
  balanced, with class names and annotations reduced to safe characters; any other tag is
  dropped (its text kept); ``&``, ``<`` and ``>`` escaped, so the text can say no more
  markup than this; at most ``max_line_chars`` per line, ``max_lines_per_cue`` lines per
  cue and ``max_cues`` cues.

Pure: bytes in, text or ``CaptionsRefused`` out.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass

MAX_HOURS = 100  # a cue past 100 h is no video's

# The tags WebVTT cue text may carry (the spec's "cue components").
SAFE_TAGS = frozenset({"b", "i", "u", "c", "v", "lang", "ruby", "rt"})
# SRT's own tags that mean the same.
_SRT_TAGS = {"b": "b", "i": "i", "u": "u"}

_CONTROL = re.compile(r"[\x01-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u2028\u2029\ufeff]")
_VTT_TIME = r"(?:(\d{1,3}):)?(\d{2}):(\d{2})\.(\d{3})"
_SRT_TIME = r"(\d{1,3}):(\d{2}):(\d{2})[,.](\d{3})"
_VTT_TIMING = re.compile(rf"^{_VTT_TIME}[ \t]+-->[ \t]+{_VTT_TIME}(?:[ \t]+(.*))?$")
_SRT_TIMING = re.compile(rf"^{_SRT_TIME}[ \t]*-->[ \t]*{_SRT_TIME}(?:[ \t]+.*)?$")
_TAG = re.compile(r"<(/?)([^<>\s./]*)((?:\.[^<>\s.]*)*)(?:[ \t]([^<>]*))?>")
_INLINE_TIME = re.compile(rf"^{_VTT_TIME}$")
_CLASS = re.compile(r"^[A-Za-z0-9_-]{1,32}$")
_SETTINGS = {
    "vertical": re.compile(r"^(rl|lr)$"),
    "line": re.compile(r"^(-?\d{1,3}|\d{1,3}(\.\d{1,3})?%)(,(start|center|end))?$"),
    "position": re.compile(r"^\d{1,3}(\.\d{1,3})?%(,(line-left|center|line-right))?$"),
    "size": re.compile(r"^\d{1,3}(\.\d{1,3})?%$"),
    "align": re.compile(r"^(start|center|end|left|right)$"),
}


class CaptionsRefused(ValueError):
    """Caption text that cannot be made into a clean track; ``reason`` is a stable code."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True, slots=True)
class Limits:
    max_bytes: int = 1024 * 1024
    max_cues: int = 10_000
    max_line_chars: int = 500
    max_lines_per_cue: int = 8


@dataclass(frozen=True, slots=True)
class Cue:
    start_ms: int
    end_ms: int
    text: str  # clean cue text (escaped, only safe tags), lines joined by "\n"
    settings: str = ""


@dataclass(frozen=True, slots=True)
class Track:
    cues: tuple[Cue, ...]
    source_format: str  # "webvtt" or "srt"

    def webvtt(self) -> str:
        return serialize(self.cues)


def clean(data: bytes, limits: Limits = Limits()) -> Track:
    """``data`` (SRT or WebVTT) parsed and made clean; raises ``CaptionsRefused``."""
    text = decode_text(data, limits)
    lines = text.split("\n")
    if lines and lines[0].startswith("WEBVTT") and lines[0][6:7] in ("", " ", "\t"):
        return Track(tuple(_sorted(_vtt_cues(lines[1:], limits))), "webvtt")
    return Track(tuple(_sorted(_srt_cues(lines, limits))), "srt")


def decode_text(data: bytes, limits: Limits) -> str:
    if len(data) > limits.max_bytes:
        raise CaptionsRefused("too_large", f"the captions are over {limits.max_bytes} bytes")
    if b"\x00" in data:
        raise CaptionsRefused("binary", "the captions are binary (a NUL byte), not text")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise CaptionsRefused(
            "not_utf8", f"the captions are not UTF-8 (byte {exc.start})"
        ) from None
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    return _CONTROL.sub("", text.replace("\t", " ").replace("\x0b", " "))


def _blocks(lines: list[str], first_line: int) -> list[tuple[int, list[str]]]:
    """Runs of non-blank lines, each with the number (1-based) of its first line."""
    blocks: list[tuple[int, list[str]]] = []
    current: list[str] = []
    start = first_line
    for number, line in enumerate(lines, start=first_line):
        if line.strip():
            if not current:
                start = number
            current.append(line.rstrip())
        elif current:
            blocks.append((start, current))
            current = []
    if current:
        blocks.append((start, current))
    return blocks


def _vtt_cues(lines: list[str], limits: Limits) -> list[Cue]:
    cues: list[Cue] = []
    blocks = _blocks(lines, 2)
    # The rest of the header block (text after WEBVTT, header lines) is not a cue.
    if blocks and blocks[0][0] == 2 and not any("-->" in line for line in blocks[0][1]):
        blocks = blocks[1:]
    for start, block in blocks:
        head = block[0].lstrip()
        if head.startswith(("NOTE", "STYLE", "REGION")) and "-->" not in head:
            continue
        at = 0 if "-->" in block[0] else 1  # an identifier line first
        if at >= len(block) or "-->" not in block[at]:
            raise CaptionsRefused("invalid_timestamp", f"line {start}: a cue without a timing line")
        match = _VTT_TIMING.match(block[at].strip())
        if match is None:
            raise CaptionsRefused(
                "invalid_timestamp", f"line {start + at}: not a WebVTT timing line"
            )
        begin, end = _times(match.groups()[:8], start + at)
        cue = _cue(begin, end, block[at + 1 :], _settings(match.group(9) or ""), limits, start)
        if cue is not None:
            _count(cues, limits)
            cues.append(cue)
    return _nonempty(cues)


def _srt_cues(lines: list[str], limits: Limits) -> list[Cue]:
    cues: list[Cue] = []
    for start, block in _blocks(lines, 1):
        at = 1 if block[0].strip().isdigit() and len(block) > 1 else 0
        match = _SRT_TIMING.match(block[at].strip())
        if match is None:
            raise CaptionsRefused(
                "invalid_timestamp",
                f"line {start + at}: not an SRT timing line (00:00:01,000 --> 00:00:02,000)"
                if at or "-->" in block[0]
                else f"line {start}: neither WebVTT (no WEBVTT header) nor SRT",
            )
        begin, end = _times(match.groups(), start + at)
        cue = _cue(begin, end, block[at + 1 :], "", limits, start, srt=True)
        if cue is not None:
            _count(cues, limits)
            cues.append(cue)
    return _nonempty(cues)


def _count(cues: list[Cue], limits: Limits) -> None:
    if len(cues) >= limits.max_cues:
        raise CaptionsRefused("too_many_cues", f"more than {limits.max_cues} cues")


def _nonempty(cues: list[Cue]) -> list[Cue]:
    if not cues:
        raise CaptionsRefused("no_cues", "the captions have no cue with text")
    return cues


def _sorted(cues: list[Cue]) -> list[Cue]:
    return sorted(cues, key=lambda cue: (cue.start_ms, cue.end_ms))


def _times(groups: tuple[str | None, ...], line: int) -> tuple[int, int]:
    begin, end = _ms(groups[:4], line), _ms(groups[4:8], line)
    if end <= begin:
        raise CaptionsRefused("invalid_timestamp", f"line {line}: the cue ends before it starts")
    return begin, end


def _ms(parts: tuple[str | None, ...], line: int) -> int:
    hours, minutes, seconds, millis = (int(p) if p else 0 for p in parts)
    if minutes >= 60 or seconds >= 60 or hours >= MAX_HOURS:
        raise CaptionsRefused("invalid_timestamp", f"line {line}: a time out of range")
    return ((hours * 60 + minutes) * 60 + seconds) * 1000 + millis


def _settings(text: str) -> str:
    kept: list[str] = []
    seen: set[str] = set()
    for item in text.split():
        name, _, value = item.partition(":")
        rule = _SETTINGS.get(name)
        if rule is not None and name not in seen and rule.match(value):
            kept.append(f"{name}:{value}")
            seen.add(name)
    return " ".join(kept)


def _cue(
    begin: int,
    end: int,
    payload: list[str],
    settings: str,
    limits: Limits,
    line: int,
    *,
    srt: bool = False,
) -> Cue | None:
    if len(payload) > limits.max_lines_per_cue:
        raise CaptionsRefused(
            "too_many_lines", f"line {line}: over {limits.max_lines_per_cue} lines in a cue"
        )
    text_lines: list[str] = []
    for offset, raw in enumerate(payload, start=1):
        if len(raw) > limits.max_line_chars:
            raise CaptionsRefused(
                "line_too_long", f"line {line + offset}: over {limits.max_line_chars} characters"
            )
        text_lines.append(raw.strip())
    # A line left blank (it held only a dropped tag) would end the cue: gone.
    lines = (line.strip() for line in cue_text("\n".join(text_lines), srt=srt).split("\n"))
    text = "\n".join(line for line in lines if line)
    if not _visible(text):
        return None
    return Cue(begin, end, text, settings)


def _visible(text: str) -> bool:
    return bool(_TAG.sub("", text).strip())


def cue_text(text: str, *, srt: bool = False) -> str:
    """Cue text with only the safe tags, balanced, and everything else escaped."""
    out: list[str] = []
    stack: list[str] = []
    at = 0
    for match in _TAG.finditer(text):
        out.append(_escape(text[at : match.start()]))
        at = match.end()
        closing, name, classes, annotation = match.groups()
        name = name.lower()
        if srt:
            name = _SRT_TAGS.get(name, "")
        if not closing and _INLINE_TIME.match(match.group(0)[1:-1]):
            out.append(match.group(0))  # an inline timestamp: digits, colons and a dot
        elif name not in SAFE_TAGS:
            continue  # dropped, its text kept
        elif closing:
            if name in stack:
                while stack:  # close what is open inside it too
                    inner = stack.pop()
                    out.append(f"</{inner}>")
                    if inner == name:
                        break
        else:
            safe = [c for c in (classes or "").split(".") if _CLASS.match(c)]
            tag = name + "".join(f".{c}" for c in safe)
            if name in ("v", "lang") and annotation and annotation.strip():
                tag += " " + _escape(" ".join(annotation.split())[:64])
            out.append(f"<{tag}>")
            stack.append(name)
    out.append(_escape(text[at:]))
    out.extend(f"</{name}>" for name in reversed(stack))
    return "".join(out)


def _escape(text: str) -> str:
    # Entities the source wrote are read as what they mean, then everything is escaped
    # once: "&lt;b&gt;" stays text, never becomes a tag.
    plain = html.unescape(text)
    plain = _CONTROL.sub("", plain.replace("\u00a0", " "))
    return plain.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def timestamp(ms: int) -> str:
    hours, rest = divmod(ms, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    seconds, millis = divmod(rest, 1000)
    return f"{hours:02d}:{minutes:02d}:{seconds:02d}.{millis:03d}"


def serialize(cues: tuple[Cue, ...] | list[Cue]) -> str:
    """A WebVTT file of ``cues`` (clean already: ``clean`` made them)."""
    parts = ["WEBVTT\n"]
    for cue in cues:
        settings = f" {cue.settings}" if cue.settings else ""
        parts.append(f"\n{timestamp(cue.start_ms)} --> {timestamp(cue.end_ms)}{settings}\n")
        parts.append(cue.text.replace("-->", "--&gt;") + "\n")
    return "".join(parts)
