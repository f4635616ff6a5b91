"""Opaque page cursors, one codec for every list route (``listings.py``, ``webhooks.py``).

A cursor is a msgspec struct (its first field names its list) as base64url JSON. It is not
signed: every statement it feeds is scoped to the caller's tenant, so a made-up cursor only
moves within the caller's own rows. One that does not decode, or names another list, is 400.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any, TypeVar

import msgspec

from aivedio.api.problems import ApiError

T = TypeVar("T", bound=msgspec.Struct)
MAX_CURSOR_CHARS = 200


def encode(cursor: msgspec.Struct) -> str:
    return base64.urlsafe_b64encode(msgspec.json.encode(cursor)).rstrip(b"=").decode()


def decode(text: str, kind: type[T], name: str) -> T:
    """``text`` as ``kind``, whose ``list`` field must be ``name``."""
    try:
        if len(text) > MAX_CURSOR_CHARS:
            raise ValueError("too long")
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        cursor = msgspec.json.decode(raw, type=kind)
    except (binascii.Error, ValueError, msgspec.DecodeError):
        raise ApiError(400, "cursor: not a cursor this API gave", field="cursor") from None
    listed: Any = getattr(cursor, "list", None)
    if listed != name:
        raise ApiError(400, "cursor: not a cursor of this list", field="cursor")
    return cursor
