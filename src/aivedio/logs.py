"""Logs are JSON events with stable snake_case names, never a secret.

The redaction processor is the net under everything else: whatever a caller passes, any
value that looks like a signed URL's query string, a bearer token, an API key, a playback
token or a private key is masked before it is rendered. Callers still log
``url_for_log(url)`` (scheme, host and a hash of the path) rather than rely on it.

The net only holds if every line goes through it. Libraries log through the standard
library (aiohttp's server echoes a malformed request's raw line, asyncio reports a task's
exception, ``warnings`` prints to stderr, an uncaught exception prints its traceback), so
``configure`` routes all of those into the same structlog pipeline (``log_bridge.py``):
one stream, one JSON shape, one redaction, in every process.
"""

from __future__ import annotations

import hashlib
import logging
import re
import sys
from collections.abc import Mapping, MutableMapping
from typing import Any
from urllib.parse import urlsplit

import structlog

from aivedio import log_bridge

MASK = "***"

# Names that say "the value is a secret" (a pattern over names, not a password).
_SECRET_WORDS = "secret|token|password|passwd|api[_-]?key|signature|credential|x-amz-[\\w-]+"  # noqa: S105
_SECRET_NAME = rf"(?:[\w-]*(?:{_SECRET_WORDS})[\w-]*|(?:[\w-]*[_-])?key|sig)"

# Order matters: whole private keys first, so no later pattern can break their markers.
_PATTERNS = [
    (
        re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?-----END [A-Z ]*PRIVATE KEY-----"),
        MASK,
    ),
    # The password of a URL's userinfo (a DSN's, a proxy's): the user name stays.
    (re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://[^/\s:@'\"]*):[^/\s@'\"]+@"), r"\1:" + MASK + "@"),
    # Query strings of URLs (signatures, tokens, expiries live there).
    (re.compile(r"(?i)\b((?:https?|s3|wss?)://[^\s?#'\"]*)\?[^\s#'\"]*"), r"\1?" + MASK),
    # Authorization values: a scheme followed by something credential-shaped (long, no space).
    (re.compile(r"(?i)\b(bearer|basic|token)\s+[A-Za-z0-9._~+/=-]{16,}"), r"\1 " + MASK),
    # Header lines whose whole value is a credential, whatever its shape: after the scheme
    # word, if any, the rest of the line (to a quote, as in a repr of raw header bytes) goes.
    # A signature header by its ":" only: "X-Amz-Signature=…" in a query ends at "&" or a
    # space (below), so the text after it stays readable.
    (
        re.compile(
            r"(?i)\b((?:proxy-)?authorization\s*[:=]|(?:set-)?cookie\s*[:=]|[\w-]*-signature\s*:)"
            r"(\s*)([A-Za-z][\w-]*\s+)?[^\r\n'\"]+"
        ),
        r"\1\2\3" + MASK,
    ),
    # "name": "value" in JSON text whose name says secret.
    (re.compile(rf"(?i)(\"{_SECRET_NAME}\"\s*:\s*\")[^\"]{{4,}}\""), r"\1" + MASK + '"'),
    # name=value or name: value whose name says secret.
    (re.compile(rf"(?i)\b({_SECRET_NAME})(\s*[=:]\s*)(\"?)[^\s&,;\"']{{4,}}"), r"\1\2\3" + MASK),
    # Our own API keys (av_live_… / av_test_…) in any case, percent-encoded or glued to what
    # precedes them ("%20av_live_…"), and cut short (a parser's error report keeps the first
    # 100 bytes): a prefix and 4 characters are already masked. ffmpeg's own av_* names stay,
    # and so does a key's public prefix alone (``av_live_<8 hex>``, nothing after it): it
    # names the key to operators (rate limits, revocation) and is stored in clear.
    (
        re.compile(
            r"(?i)av(?:_|%5f)(?:live|test)(?:_|%5f)(?![0-9a-f]{8}(?![A-Za-z0-9_%-]))"
            r"[A-Za-z0-9_%-]{4,}"
        ),
        "av_" + MASK,
    ),
    # One-time upload tokens of resumable uploads (avu_…, store/resumable_uploads.py).
    (re.compile(r"(?i)avu(?:_|%5f)[A-Za-z0-9_%-]{4,}"), "avu_" + MASK),
    # Standard Webhooks secrets (whsec_ and base64), ours for receivers and vendors'.
    (re.compile(r"whsec_[A-Za-z0-9+/=_-]{4,}"), "whsec_" + MASK),
    # Playback tokens (api/tokens.py: base64url of a JSON array, so "Wz", a dot and a MAC)
    # and JWTs ("eyJ", base64url of '{"'), whole or cut short.
    (re.compile(r"\b(?:Wz|eyJ)[A-Za-z0-9_-]{16,}(?:\.[A-Za-z0-9_-]*){0,2}"), MASK),
    # The segment after /media/ is a playback token, whatever it looks like (cut, escaped).
    (re.compile(r"/media/[^/\s'\"?#]+"), "/media/" + MASK),
    # The query of a bare path or request target ("GET /x?sig=…", b'/x?t=…'); a URL's query
    # was masked above, and a path inside a URL follows a word character, never a quote.
    (re.compile(r"(?<![\w:/.%-])(/[^\s?#'\"]*)\?[^\s#'\"]+"), r"\1?" + MASK),
]

SECRET_FIELD = re.compile(
    r"(?i)(secret|token|password|authorization|api_key|signature|cookie|"
    r"encryption_key|credential)"
)


# Every pattern above needs one of these to match (a key's spaces, a URL's colon, a name's
# "=" or ":", a token's space, a query's "?", our keys' prefix, a token's first letters, a
# /media/ path, a webhook secret's prefix): text without any is returned as it is, which is
# most values of most events (ids, names, numbers as text).
_MAY_HOLD_A_SECRET = re.compile(r"(?i:[=:\s?]|av(?:_|%5f)|/media/)|Wz|eyJ|whsec_")


def redact_text(text: str) -> str:
    if not _MAY_HOLD_A_SECRET.search(text):
        return text
    for pattern, replacement in _PATTERNS:
        text = pattern.sub(replacement, text)
    return text


def _redact(value: Any) -> Any:
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, Mapping):
        return {k: (MASK if SECRET_FIELD.search(str(k)) else _redact(v)) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_redact(v) for v in value]
    return value


def redact_processor(
    _logger: Any, _name: str, event_dict: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    for key in list(event_dict):
        if SECRET_FIELD.search(key):
            event_dict[key] = MASK
        else:
            event_dict[key] = _redact(event_dict[key])
    return event_dict


def url_for_log(url: str) -> str:
    """What may be logged of a URL: scheme, host, port and a short hash of the path+query.

    Never raises: URLs from providers are logged before (or without) passing the policy, and
    ``urlsplit`` raises on a bad port or bracket; such a URL is logged as a hash only."""
    try:
        parts = urlsplit(url)
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return f"unparsable/#{_digest(url)}"
    host = parts.hostname or "?"
    if ":" in host:
        host = f"[{host}]"
    return f"{parts.scheme}://{host}{port}/#{_digest(f'{parts.path}?{parts.query}')}"


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:12]


def configure(level: str = "info", fmt: str = "json", stream: Any = None) -> None:
    """Set up structlog once per process, with the standard library routed into it."""
    levelno = logging.getLevelNamesMapping()[level.upper()]
    renderer: Any = (
        structlog.processors.JSONRenderer()
        if fmt == "json"
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.format_exc_info,
            redact_processor,  # everything a caller or a traceback put in the event
            structlog.processors.TimeStamper(fmt="iso", utc=True),  # ours: not scanned
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(levelno),
        logger_factory=structlog.PrintLoggerFactory(stream or sys.stderr),
        cache_logger_on_first_use=False,
    )
    log_bridge.install(levelno)


def reset() -> None:
    """Undo ``configure`` (tests that configure a process's logging in their own)."""
    log_bridge.uninstall()
    structlog.reset_defaults()


def get_logger(name: str = "aivedio") -> Any:
    return structlog.get_logger(name)
