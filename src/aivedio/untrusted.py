"""What comes from outside, decoded once at the edge, with bounds.

msgspec parses fast and checks types, but it does not bound what a signed body (or a
provider's answer) can still do to the code after it. Nesting: its decoder recurses, so a
body 1,000 levels deep raised RecursionError, answered 500. NUL characters: valid JSON, but
PostgreSQL text cannot hold one, so the insert failed as a database error and was answered
503, which tells the sender to retry a request that can never succeed. Magnitudes: a size of
2^62 bytes or the year 1 are valid JSON, and overflowed the claim order's arithmetic (500),
or were stored as ``-infinity`` and crashed every scan that read the row afterwards.

So every body from outside goes through ``decode``: the depth of the raw bytes is measured
before anything is parsed (in C: strings removed, then matched bracket pairs peeled off one
level per pass), the bytes are parsed once (msgspec refuses invalid UTF-8 and lone
surrogates), the parsed tree is walked for NUL characters, over-long strings and integers
outside 64 bits, then it is converted to the caller's type (whose errors name the field, as
``$.outputs[0].size``), and every time in the typed result is held to ``instant``'s window.
Whatever is refused raises ``MalformedInputError`` with the field's path and a reason code;
the API answers it 400, the poller counts it as a failed read.

Numbers: JSON has one number type, and JSON Schema (the OpenAPI document's) counts a number
with a zero fractional part as an integer, so ``10.0`` is a valid ``size_bytes`` by the
document while msgspec refuses a float where an int is typed. A typed conversion (``convert``)
therefore reads an integral float within 64 bits as the integer it equals (a float field
still reads it as a float); ``10.5`` stays a float and is refused where an int is wanted.

Times: an instant from outside (an output's expiry, a task's creation or completion, a CLI
flag) must lie within [now - 400 days, now + 400 days] (``instant``). The past bound is as
wide as the future one on purpose: a provider answering about a task past its lifetime
(Kling's ``created_at`` 31 days ago, Replicate's ``completed_at`` of an hour-old
prediction) is telling us the output is lost, which is a fact to record, not a malformed
answer. A time the store
keeps must lie within [1970-01-01, 2500-01-01), which the schema's CHECK constraints
enforce too (``stored_instant``, for filters such as ``--since``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar, overload

import msgspec

from aivedio.errors import MalformedInputError

T = TypeVar("T")

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
PAST_WINDOW = timedelta(days=400)
FUTURE_WINDOW = timedelta(days=400)
# The range every stored time must be in (migration 0016's CHECK constraints say the same).
EARLIEST_STORED = datetime(1970, 1, 1, tzinfo=UTC)
LATEST_STORED = datetime(2500, 1, 1, tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class Bounds:
    """What a decoded body may hold beyond its schema."""

    max_depth: int = 32
    max_string_chars: int = 64 * 1024
    # Refuse integers outside 64 bits anywhere in the tree. Our own schemas: every integer
    # is a field we store. A vendor's document: most of it is never read (a prediction's
    # echoed input, a 64-bit unsigned seed), and what is read is bounded where it is read
    # (``pipeline/providers.check_reported``, ``providers/base.parse_time``).
    integers_within_64_bits: bool = True


# Our own schemas (callbacks, uploads, watch registrations) nest four levels at most.
API_BOUNDS = Bounds()
# Vendors' documents (poll answers, webhook bodies) carry more than we read: logs, inputs.
PROVIDER_BOUNDS = Bounds(max_depth=64, max_string_chars=1024 * 1024, integers_within_64_bits=False)

# A JSON string (escapes included; DOTALL so an escaped raw newline cannot end the match).
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_PAIR = re.compile(rb"\[\]|\{\}")
_PATH_IN_ERROR = re.compile(r" - at `(\$[^`]*)`$")
_PLAIN_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,63}")


def whole(pattern: str) -> str:
    """``pattern`` (``^…$``) held to the whole string. msgspec applies a pattern with Python's
    ``re.search``, where ``$`` also matches before a final newline, so ``"succeeded\n"``
    passed ``^(?i:succeeded)$``; the lookahead refuses that, and ECMA-262 (the dialect of the
    JSON Schema the OpenAPI document carries) reads the pattern the same way."""
    body = pattern.removeprefix("^").removesuffix("$")
    return f"^(?:{body})(?!\\n)$"


def shown(value: object, limit: int = 60) -> str:
    """``value`` safe to put in an error, a log or a row: escaped, short, no NUL."""
    text = value if isinstance(value, str) else repr(value)
    return ascii(text[:limit]) + ("..." if len(text) > limit else "")


def nesting_within(body: bytes, max_depth: int) -> bool:
    """Whether the JSON text nests at most ``max_depth`` arrays and objects deep (malformed
    text that cannot be measured counts as too deep: it would be refused anyway).

    Strings are removed first (brackets inside them do not count), then every innermost
    ``[]`` or ``{}`` pair, one nesting level per pass: text that is not empty after
    ``max_depth`` passes nests deeper. All in C, so a megabyte of ``[`` costs milliseconds."""
    brackets = _STRING.sub(b"", body).translate(None, _NOT_BRACKETS)
    for _ in range(max_depth):
        if not brackets:
            return True
        brackets, peeled = _PAIR.subn(b"", brackets)
        if not peeled:
            # Unbalanced: short leftovers are for the parser to report as malformed (it
            # cannot recurse far on them); long ones are refused here.
            return len(brackets) <= max_depth
    return not brackets


@overload
def decode(
    body: bytes, kind: type[T], *, bounds: Bounds = ..., now: datetime | None = ...
) -> T: ...
@overload
def decode(body: bytes, *, bounds: Bounds = ..., now: datetime | None = ...) -> Any: ...
def decode(
    body: bytes,
    kind: type[Any] | None = None,
    *,
    bounds: Bounds = API_BOUNDS,
    now: datetime | None = None,
) -> Any:
    """``body`` (JSON) as ``kind`` (None: the parsed tree), within ``bounds``;
    MalformedInputError otherwise."""
    if not nesting_within(body, bounds.max_depth):
        raise MalformedInputError(
            f"the body nests deeper than {bounds.max_depth} levels", reason="too_deep"
        )
    try:
        tree = msgspec.json.decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        # ValidationError: a number no float can hold (1e999).
        raise MalformedInputError(f"not valid JSON: {exc}", reason="malformed") from None
    check_tree(tree, bounds)
    if kind is None:
        return tree
    return convert(tree, kind, now=now)


def convert(tree: Any, kind: type[T], *, now: datetime | None = None) -> T:
    """A checked tree (``check_tree``) as ``kind``, every time in it held to the window."""
    try:
        value = msgspec.convert(integral_floats_as_ints(tree), kind)
    except msgspec.ValidationError as exc:
        message = str(exc)
        found = _PATH_IN_ERROR.search(message)
        field = found.group(1) if found else "$"
        raise MalformedInputError(message, field=field, reason="invalid_field") from None
    check_times(value, "$", now or datetime.now(UTC))
    return value


def integral_floats_as_ints(tree: Any) -> Any:
    """``tree`` with every float that equals an integer within 64 bits (``10.0``, ``-0.0``,
    ``1e3``) as that integer: JSON Schema's integers (see the module docstring). Recursion is
    bounded: the depth was measured first."""
    if isinstance(tree, float):
        if tree.is_integer() and INT64_MIN <= tree <= INT64_MAX:
            return int(tree)
        return tree
    if isinstance(tree, dict):
        return {key: integral_floats_as_ints(value) for key, value in tree.items()}
    if isinstance(tree, list):
        return [integral_floats_as_ints(value) for value in tree]
    return tree


def check_tree(tree: Any, bounds: Bounds = API_BOUNDS, path: str = "$") -> None:
    """Refuse NUL characters and over-long strings (keys too) and integers outside 64 bits
    anywhere in a parsed JSON tree. Recursion is bounded: the depth was measured first."""
    if isinstance(tree, str):
        _check_text(tree, path, bounds)
    elif isinstance(tree, bool) or tree is None or isinstance(tree, float):
        return  # msgspec gives finite floats only
    elif isinstance(tree, int):
        if bounds.integers_within_64_bits and not INT64_MIN <= tree <= INT64_MAX:
            raise MalformedInputError(
                f"{path}: an integer outside 64 bits", field=path, reason="out_of_range"
            )
    elif isinstance(tree, Mapping):
        for key, value in tree.items():
            where = _member(path, key)
            _check_text(key, where, bounds)
            check_tree(value, bounds, where)
    elif isinstance(tree, list):
        for index, value in enumerate(tree):
            check_tree(value, bounds, f"{path}[{index}]")


def _member(path: str, key: str) -> str:
    return f"{path}.{key}" if _PLAIN_KEY.fullmatch(key) else f"{path}[{shown(key, 40)}]"


def _check_text(text: str, path: str, bounds: Bounds) -> None:
    if "\x00" in text:
        raise MalformedInputError(
            f"{path}: a NUL character (U+0000) in text", field=path, reason="nul_character"
        )
    if len(text) > bounds.max_string_chars:
        raise MalformedInputError(
            f"{path}: text longer than {bounds.max_string_chars} characters",
            field=path,
            reason="too_long",
        )


def check_times(value: Any, path: str, now: datetime) -> None:
    """Every datetime in a typed value (Structs, lists, dicts) within ``instant``'s window."""
    if isinstance(value, datetime):
        instant(value, path, now=now)
    elif isinstance(value, msgspec.Struct):
        for name in value.__struct_fields__:
            check_times(getattr(value, name), f"{path}.{name}", now)
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            check_times(item, f"{path}[{index}]", now)
    elif isinstance(value, Mapping):
        for key, item in value.items():
            check_times(item, _member(path, str(key)), now)


def instant(value: datetime, field: str, *, now: datetime | None = None) -> datetime:
    """``value`` in UTC when it lies within [now - 400 days, now + 400 days]: the sane window
    for a time from outside (a URL's expiry, a task's completion). A time without a UTC
    offset is refused: whose clock it was read on is unknown."""
    if value.tzinfo is None or value.utcoffset() is None:
        raise MalformedInputError(
            f"{field}: a time needs its UTC offset (Z or ±hh:mm)", field=field, reason="naive_time"
        )
    current = now or datetime.now(UTC)
    # Aware datetimes compare by their UTC instants without converting (which could
    # overflow at the year 1 or 9999).
    if not current - PAST_WINDOW <= value <= current + FUTURE_WINDOW:
        raise MalformedInputError(
            f"{field}: {shown(value.isoformat())} is outside [now - {PAST_WINDOW.days} days, "
            f"now + {FUTURE_WINDOW.days} days]",
            field=field,
            reason="time_out_of_range",
        )
    return value.astimezone(UTC)


def stored_instant(value: datetime, field: str) -> datetime:
    """``value`` in UTC when the store can hold it: [1970-01-01, 2500-01-01), with an
    offset. For times that are filters rather than facts (``--since``)."""
    if value.tzinfo is None or value.utcoffset() is None:
        raise MalformedInputError(
            f"{field}: a time needs its UTC offset (Z or ±hh:mm)", field=field, reason="naive_time"
        )
    if not EARLIEST_STORED <= value < LATEST_STORED:
        raise MalformedInputError(
            f"{field}: {shown(value.isoformat())} is outside [1970-01-01, 2500-01-01)",
            field=field,
            reason="time_out_of_range",
        )
    return value.astimezone(UTC)


def unix_instant(seconds: int | float, field: str, *, now: datetime | None = None) -> datetime:
    """Unix seconds (finite, in the window) as a UTC datetime."""
    current = now or datetime.now(UTC)
    low = (current - PAST_WINDOW).timestamp()
    high = (current + FUTURE_WINDOW).timestamp()
    # NaN fails both comparisons; infinities and huge numbers fail one, before any
    # conversion could overflow.
    if not low <= seconds <= high:
        raise MalformedInputError(
            f"{field}: {shown(seconds)} Unix seconds is outside [now - {PAST_WINDOW.days} "
            f"days, now + {FUTURE_WINDOW.days} days]",
            field=field,
            reason="time_out_of_range",
        )
    return datetime.fromtimestamp(seconds, UTC)
