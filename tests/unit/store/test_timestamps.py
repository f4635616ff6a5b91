"""``timestamptz`` decoding (``aivedio.store.timestamps``): always aware, never an overflow.

asyncpg's own codec decodes ``±infinity`` to a naive ``datetime.min``/``max``: comparing
one with ``now`` is the ``TypeError`` that crashed a fetch job and every sweep after it.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta, timezone

from hypothesis import given
from hypothesis import strategies as st

from aivedio.store import timestamps
from aivedio.store.timestamps import EARLIEST, INFINITY, LATEST, NEGATIVE_INFINITY, decode, encode


def test_infinities_decode_aware_and_compare_with_now() -> None:
    now = datetime.now(UTC)
    assert decode((NEGATIVE_INFINITY,)) == EARLIEST and EARLIEST.tzinfo is UTC
    assert decode((INFINITY,)) == LATEST and LATEST.tzinfo is UTC
    assert decode((NEGATIVE_INFINITY,)) < now < decode((INFINITY,))
    assert (decode((NEGATIVE_INFINITY,)) - now).total_seconds() < 0


def test_values_past_pythons_range_are_clamped_not_an_overflow() -> None:
    year_20000 = (datetime(9999, 12, 31, tzinfo=UTC) - timestamps.PG_EPOCH) // timedelta(
        microseconds=1
    ) + 10**15
    assert decode((year_20000,)) == LATEST
    assert decode((-(2**62),)) == EARLIEST  # 4713 BC, say


def test_the_ends_encode_back_to_the_infinities() -> None:
    assert encode(LATEST) == (INFINITY,) and encode(EARLIEST) == (NEGATIVE_INFINITY,)
    assert encode(datetime.max) == (INFINITY,) and encode(datetime.min) == (NEGATIVE_INFINITY,)


def test_a_naive_value_and_a_date_are_local_time_as_asyncpg_has_them() -> None:
    naive = datetime(2024, 5, 1, 12, 0)
    assert decode(encode(naive)) == naive.astimezone(UTC)
    assert decode(encode(date(2024, 5, 1))) == datetime(2024, 5, 1).astimezone(UTC)


ZONES = st.sampled_from([UTC, timezone(timedelta(hours=5)), timezone(timedelta(hours=-9))])


# A day inside either end: the ends themselves are the infinities (above).
@given(st.datetimes(datetime(1, 1, 2), datetime(9999, 12, 30), timezones=ZONES))
def test_every_aware_time_round_trips(value: datetime) -> None:
    decoded = decode(encode(value))
    assert decoded == value and decoded.tzinfo is UTC
