"""Logs are JSON events with stable snake_case names, never a secret.

The redaction processor is the net under everything else: whatever a caller passes, any
value that looks like a signed URL's query string, a bearer token, an API key or a private
key is masked before it is rendered. Callers still log ``url_for_log(url)`` (scheme, host
and a hash of the path) rather than rely on it.
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
    # Query strings of URLs (signatures, tokens, expiries live there).
    (re.compile(r"(?i)\b((?:https?|s3|wss?)://[^\s?#'\"]*)\?[^\s#'\"]*"), r"\1?" + MASK),
    # Authorization values: a scheme followed by something credential-shaped (long, no space).
    (re.compile(r"(?i)\b(bearer|basic|token)\s+[A-Za-z0-9._~+/=-]{16,}"), r"\1 " + MASK),
    # "name": "value" in JSON text whose name says secret.
    (re.compile(rf"(?i)(\"{_SECRET_NAME}\"\s*:\s*\")[^\"]{{4,}}\""), r"\1" + MASK + '"'),
    # name=value or name: value whose name says secret.
    (re.compile(rf"(?i)\b({_SECRET_NAME})(\s*[=:]\s*)(\"?)[^\s&,;\"']{{4,}}"), r"\1\2\3" + MASK),
    # Our own API keys (av_live_… / av_test_…); ffmpeg's own av_* names in error text stay.
    (re.compile(r"\bav_(?:live|test)_[A-Za-z0-9_-]{16,}"), "av_" + MASK),
]

SECRET_FIELD = re.compile(
    r"(?i)(secret|token|password|authorization|api_key|signature|cookie|"
    r"encryption_key|credential)"
)


# Every pattern above needs one of these to match (a key's spaces, a URL's colon, a name's
# "=" or ":", a token's space, our keys' prefix): text without any is returned as it is,
# which is most values of most events (ids, names, numbers as text).
_MAY_HOLD_A_SECRET = re.compile(r"[=:\s]|av_")


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
    """Set up structlog once per process."""
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
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping()[level.upper()]
        ),
        logger_factory=structlog.PrintLoggerFactory(stream or sys.stderr),
        cache_logger_on_first_use=False,
    )


def get_logger(name: str = "aivedio") -> Any:
    return structlog.get_logger(name)
