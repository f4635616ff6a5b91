"""``timestamptz`` to and from Python, for every connection (``database._init_connection``).

Why not asyncpg's own codec: it decodes ``infinity`` and ``-infinity`` to ``datetime.max`` and
``datetime.min`` *without a time zone*, while every other value comes back aware (UTC). One
such value in a row is a ``TypeError`` ("can't compare offset-naive and offset-aware
datetimes") in whatever code next compares it with ``now``. And its encoder takes those two
values as the sentinels of the infinities whatever their zone (it compares the microseconds
since 2000 with theirs): an aware ``0001-01-01T00:00:00Z`` is *written* as ``-infinity``.
That is how a callback's ``"expires_at": "0001-01-01T00:00:00Z"`` was stored as
``-infinity``, read back naive, and crashed its fetch job at every attempt and then every
sweep, in the scan of outputs near expiry. And a value past year 9999 (PostgreSQL stores
up to 294276) is an ``OverflowError`` raised while decoding, which fails the whole result
set, so one row stops every query that reads it.

So every ``timestamptz`` is decoded here, once: always aware (UTC), ``±infinity`` and values
outside Python's range clamped to the aware ``datetime.min``/``datetime.max``, which compare
and subtract like any other time (an arithmetic that steps past them still overflows: that
is the row's own error, isolated by the code reading it). Encoding is asyncpg's rule: a
naive value is local time, a ``date`` is its local midnight; the aware ends encode as
``∓infinity`` again, so a value read is the value written.

The wire value (binary format) is microseconds since 2000-01-01 UTC, an int64 whose two
extremes are ``-infinity`` and ``infinity``.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

INFINITY = 2**63 - 1
NEGATIVE_INFINITY = -(2**63)
PG_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)
EARLIEST = datetime.min.replace(tzinfo=UTC)
LATEST = datetime.max.replace(tzinfo=UTC)
ONE_MICROSECOND = timedelta(microseconds=1)
_EARLIEST_US = (EARLIEST - PG_EPOCH) // ONE_MICROSECOND
_LATEST_US = (LATEST - PG_EPOCH) // ONE_MICROSECOND


def decode(value: tuple[int]) -> datetime:
    """A ``timestamptz`` in asyncpg's tuple format: always aware, clamped to Python's range."""
    (microseconds,) = value
    if microseconds <= _EARLIEST_US:
        return EARLIEST
    if microseconds >= _LATEST_US:
        return LATEST
    return PG_EPOCH + timedelta(microseconds=microseconds)


def encode(value: datetime | date) -> tuple[int]:
    """A Python time as asyncpg's tuple format (naive: local time, as asyncpg has it)."""
    if not isinstance(value, datetime):
        if not isinstance(value, date):
            raise TypeError(f"expected a datetime or a date, got {type(value).__name__}")
        value = datetime(value.year, value.month, value.day)
    if value.tzinfo is None:
        if value == datetime.max:
            return (INFINITY,)
        if value == datetime.min:
            return (NEGATIVE_INFINITY,)
        value = value.astimezone()
    if value == LATEST:
        return (INFINITY,)
    if value == EARLIEST:
        return (NEGATIVE_INFINITY,)
    return ((value - PG_EPOCH) // ONE_MICROSECOND,)
