"""Resuming an interrupted download: what to ask for, and whether the answer continues it.

A body cut short (the origin or a proxy dropped the connection, a stalled read) is continued
from the last byte received instead of fetched again from byte 0, so a multi-gigabyte output
over a flaky link costs its bytes once. The danger is splicing: the first part of one object
followed by the rest of another (the provider re-rendered it, a CDN served a different
version). The rules that prevent it:

* A resume is asked only with a validator of the first response: its strong ``ETag``, else
  its ``Last-Modified``, sent as ``If-Range``. An origin that honours ``If-Range`` answers a
  changed object with ``200`` and the whole new body; a weak ETag cannot be used for it
  (RFC 9110 §13.1.5), so without a usable validator there is no resume.
* ``200`` to a resume means "here is the whole representation": start over with it (the
  checksum and the sink are reset), never append it.
* ``206`` continues the body only if its ``Content-Range`` starts exactly at our offset, runs
  to the end, and states the total we expect, and if it carries no validator different from
  the first response's (an origin that ignores ``If-Range`` but honours ``Range`` would
  otherwise hand us the tail of a new object). Anything else is refused and the body is
  fetched again from byte 0, once, without ranges.

Pure functions over status codes and headers; ``net/fetch.py`` does the I/O.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Literal

import msgspec

# ``bytes FIRST-LAST/TOTAL`` (RFC 9110 §14.4), digits only: no sign, no spaces inside.
_CONTENT_RANGE = re.compile(r"bytes ([0-9]{1,19})-([0-9]{1,19})/([0-9]{1,19})")


class Validator(msgspec.Struct, frozen=True):
    """What identifies the object of the first response."""

    if_range: str  # the header value sent: the strong ETag or the Last-Modified date
    etag: str | None
    last_modified: str | None


class Verdict(msgspec.Struct, frozen=True):
    """What to do with the answer to a resume request.

    ``continue``: the body goes on at our offset (``total`` is the object's size).
    ``restart``: this response is a whole new body; reset and read it from byte 0.
    ``refetch``: this response is unusable; reset and ask again without a range.
    ``error``: not an answer to a range at all (4xx, 5xx): classify the status as usual.
    """

    action: Literal["continue", "restart", "refetch", "error"]
    reason: str = ""
    total: int | None = None


def validator_of(headers: Mapping[str, str]) -> Validator | None:
    """The validator a resume of this response would be guarded by, or None (no resume)."""
    if headers.get("Accept-Ranges", "").strip().lower() == "none":
        return None
    etag = _strong_etag(headers.get("ETag"))
    last_modified = (headers.get("Last-Modified") or "").strip() or None
    if etag is not None:
        return Validator(if_range=etag, etag=etag, last_modified=last_modified)
    if last_modified is not None:
        return Validator(if_range=last_modified, etag=None, last_modified=last_modified)
    return None


def range_headers(offset: int, validator: Validator) -> dict[str, str]:
    """The headers of a resume from ``offset`` (not credentials: sent on every hop)."""
    return {"Range": f"bytes={offset}-", "If-Range": validator.if_range}


def parse_content_range(value: str | None) -> tuple[int, int, int] | None:
    """``(first, last, total)`` of a satisfied byte range, or None for anything else."""
    match = _CONTENT_RANGE.fullmatch((value or "").strip())
    if match is None:
        return None
    first, last, total = (int(group) for group in match.groups())
    if not first <= last < total:
        return None
    return first, last, total


def judge(
    status: int,
    headers: Mapping[str, str],
    *,
    offset: int,
    total: int | None,
    validator: Validator,
) -> Verdict:
    """The verdict on the answer to ``range_headers(offset, validator)``.

    ``total`` is the object's size as the first response stated it (None when it did not).
    """
    if status == 200:
        same = _same_object(headers, validator)
        return Verdict("restart", "range_ignored" if same else "validator_changed")
    if status == 416:
        return Verdict("refetch", "range_not_satisfiable")
    if status != 206:
        return Verdict("error")
    parsed = parse_content_range(headers.get("Content-Range"))
    if parsed is None:
        return Verdict("refetch", "bad_content_range")
    first, last, stated_total = parsed
    if first != offset or last != stated_total - 1:
        return Verdict("refetch", "bad_content_range")
    if total is not None and stated_total != total:
        return Verdict("refetch", "bad_content_range")
    length = headers.get("Content-Length")
    if length is not None and length.strip() != str(stated_total - offset):
        return Verdict("refetch", "bad_content_range")
    if not _same_object(headers, validator):
        return Verdict("refetch", "validator_changed")
    return Verdict("continue", total=stated_total)


def _strong_etag(value: str | None) -> str | None:
    value = (value or "").strip()
    if (
        not value
        or value.startswith("W/")
        or not re.fullmatch(r'"[\x21\x23-\x7e\x80-\xff]*"', value)
    ):
        return None
    return value


def _same_object(headers: Mapping[str, str], validator: Validator) -> bool:
    """False when the response names a different object than the first response did.

    A response without a validator says nothing either way (many origins omit them on 206).
    """
    etag = (headers.get("ETag") or "").strip()
    if etag and validator.etag is not None and etag != validator.etag:
        return False
    if validator.etag is None and validator.last_modified is not None:
        last_modified = (headers.get("Last-Modified") or "").strip()
        if last_modified and last_modified != validator.last_modified:
            return False
    return True
