"""The tus 1.0 headers, read and written without I/O (``api/tus.py`` serves the routes).

Every header a client sends is hostile until parsed here, and each rule has one place:

* **Offsets and lengths are plain decimal digits**, at most 19 of them (a signed 64-bit
  integer, what PostgreSQL's ``bigint`` holds): no sign, no spaces, no ``0x``, no exponent.
  Python's ``int()`` would accept ``+5``, `` 5``, ``5_000`` and Arabic-Indic digits; a
  number another component reads differently is how offset games start.
* **Upload-Metadata is bounded before it is parsed** (``METADATA_MAX_BYTES``, at most
  ``METADATA_MAX_PAIRS`` pairs), its keys are visible ASCII without commas, each key once,
  and each value is strict base64 (``binascii`` refuses what is not, and the value must
  re-encode to itself: no padding games, no whitespace). Values that become our own fields
  (``filename``, ``filetype``, ``passthrough``) must also be visible UTF-8 text.
* **Upload-Checksum** is ``sha256 <base64 of 32 bytes>``; another algorithm is a 400
  naming the one we take (the checksum extension's rule), a mismatch is 460 (``api/tus.py``).
"""

from __future__ import annotations

import base64
import binascii
import re
from datetime import datetime
from email.utils import format_datetime

from aivedio.api.problems import ApiError

VERSION = "1.0.0"
EXTENSIONS = "creation,creation-with-upload,termination,expiration,checksum"
CHECKSUM_ALGORITHMS = "sha256"
OFFSET_CONTENT_TYPE = "application/offset+octet-stream"
# The checksum extension's own status for a body whose checksum is not the one declared.
CHECKSUM_MISMATCH = 460
METADATA_MAX_BYTES = 4096
METADATA_MAX_PAIRS = 32
# The headers a browser's script must be allowed to send and to read (CORS).
REQUEST_HEADERS = (
    "Authorization, Content-Type, Tus-Resumable, Upload-Length, Upload-Metadata, "
    "Upload-Offset, Upload-Checksum, Upload-Defer-Length, Upload-Concat, Idempotency-Key, "
    "X-HTTP-Method-Override, X-Requested-With"
)
EXPOSED_HEADERS = (
    "Location, Tus-Resumable, Tus-Version, Tus-Extension, Tus-Max-Size, "
    "Tus-Checksum-Algorithm, Upload-Offset, Upload-Length, Upload-Metadata, Upload-Expires"
)

_DIGITS = re.compile(r"[0-9]{1,19}")
_KEY = re.compile(r"[\x21-\x2b\x2d-\x7e]{1,64}")  # visible ASCII but ","
_TEXT = re.compile(r"[^\x00-\x1f\x7f]*")


def require_version(value: str | None) -> None:
    """412 unless the request speaks tus 1.0.0 (``Tus-Resumable``)."""
    if value != VERSION:
        raise ApiError(
            412,
            f"Tus-Resumable must be {VERSION} (got {_shown(value)})",
            code="tus_version",
            headers={"Tus-Version": VERSION, "Tus-Resumable": VERSION},
        )


def parse_count(name: str, value: str | None) -> int:
    """A non-negative integer header (``Upload-Offset``, ``Upload-Length``); 400 otherwise."""
    if value is None:
        raise ApiError(400, f"the {name} header is required", code="tus_header", field=name)
    if not _DIGITS.fullmatch(value) or int(value) > 2**63 - 1:
        raise ApiError(
            400,
            f"{name} must be a non-negative decimal integer (got {_shown(value)})",
            code="tus_header",
            field=name,
        )
    return int(value)


def parse_metadata(value: str | None) -> dict[str, bytes]:
    """``Upload-Metadata``: ``key base64,key base64,key``; the decoded values by key."""
    if value is None or not value.strip():
        return {}
    if len(value.encode("utf-8", "surrogateescape")) > METADATA_MAX_BYTES:
        raise _bad_metadata(f"longer than {METADATA_MAX_BYTES} bytes")
    pairs = value.split(",")
    if len(pairs) > METADATA_MAX_PAIRS:
        raise _bad_metadata(f"more than {METADATA_MAX_PAIRS} pairs")
    found: dict[str, bytes] = {}
    for pair in pairs:
        key, _, encoded = pair.strip().partition(" ")
        if not _KEY.fullmatch(key):
            raise _bad_metadata("a key must be 1 to 64 visible ASCII characters without ','")
        if key in found:
            raise _bad_metadata(f"the key {key!r} appears twice")
        found[key] = _strict_b64(key, encoded)
    return found


def metadata_text(metadata: dict[str, bytes], key: str, max_length: int) -> str | None:
    """A metadata value that becomes a field of ours: visible UTF-8 text, 1..max_length."""
    raw = metadata.get(key)
    if raw is None:
        return None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise _bad_metadata(f"{key} is not UTF-8 text") from None
    if not 1 <= len(text) <= max_length or not _TEXT.fullmatch(text):
        raise _bad_metadata(f"{key} must be 1 to {max_length} visible characters")
    return text


def parse_checksum(value: str | None) -> bytes | None:
    """``Upload-Checksum: sha256 <base64>``: the 32-byte digest, None when absent."""
    if value is None:
        return None
    algorithm, _, encoded = value.strip().partition(" ")
    if algorithm.lower() != "sha256":
        raise ApiError(
            400,
            f"Upload-Checksum algorithm {_shown(algorithm)} is not supported: use sha256",
            code="checksum_algorithm",
            field="Upload-Checksum",
        )
    digest = _b64(encoded.strip())
    if digest is None or len(digest) != 32:
        raise ApiError(
            400,
            "Upload-Checksum must be `sha256 <base64 of the 32-byte digest>`",
            code="tus_header",
            field="Upload-Checksum",
        )
    return digest


def http_date(moment: datetime) -> str:
    """``Upload-Expires``: an HTTP date (RFC 9110), always GMT."""
    return format_datetime(moment, usegmt=True)


def _strict_b64(key: str, encoded: str) -> bytes:
    if encoded == "":
        return b""
    decoded = _b64(encoded)
    if decoded is None:
        raise _bad_metadata(f"the value of {key!r} is not base64")
    return decoded


def _b64(encoded: str) -> bytes | None:
    """Canonical base64 only: decodes with validation and encodes back to the same text."""
    try:
        decoded = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        return None
    return decoded if base64.b64encode(decoded).decode("ascii") == encoded else None


def _bad_metadata(why: str) -> ApiError:
    return ApiError(400, f"Upload-Metadata: {why}", code="tus_metadata", field="Upload-Metadata")


def _shown(value: str | None) -> str:
    """A header value in an error message: bounded, never echoed whole."""
    if value is None:
        return "nothing"
    return repr(value[:40] + ("…" if len(value) > 40 else ""))
