"""Token buckets on a hand-stepped clock: bursts, refill, Retry-After, isolation of callers,
bounded memory, and a caller within its rate never refused."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aivedio.api.token_buckets import BucketTable, Rate, RateLimiter, Verdict


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_fresh_bucket_grants_its_burst_then_refuses_until_a_token_is_back() -> None:
    table = BucketTable(10)
    rate = Rate(per_second=2.0, burst=3)
    assert [table.take("a", rate, 0.0).granted for _ in range(4)] == [True, True, True, False]
    refused = table.take("a", rate, 0.1)
    assert not refused.granted
    assert refused.wait_seconds == pytest.approx(0.4)  # 0.2 tokens there, 0.8 to go at 2/s
    assert table.take("a", rate, 0.5).granted
    assert not table.take("a", rate, 0.5).granted


def test_refill_never_goes_above_the_burst() -> None:
    table = BucketTable(10)
    rate = Rate(per_second=100.0, burst=2)
    table.take("a", rate, 0.0)
    grants = [table.take("a", rate, 3600.0).granted for _ in range(3)]
    assert grants == [True, True, False]


def test_retry_after_is_whole_seconds_rounded_up_and_at_least_one() -> None:
    assert Verdict(0.001).retry_after_seconds == 1
    assert Verdict(1.0).retry_after_seconds == 1
    assert Verdict(1.01).retry_after_seconds == 2
    table = BucketTable(10)
    slow = Rate(per_second=0.1, burst=1)
    table.take("a", slow, 0.0)
    assert table.take("a", slow, 0.0).retry_after_seconds == 10
    assert table.take("a", slow, 2.5).retry_after_seconds == 8  # 7.5 s to go


def test_only_the_first_refusal_of_a_run_is_marked() -> None:
    table = BucketTable(10)
    rate = Rate(per_second=1.0, burst=1)
    table.take("a", rate, 0.0)
    assert [table.take("a", rate, 0.0).first_refusal for _ in range(3)] == [True, False, False]
    assert table.take("a", rate, 1.0).granted
    assert table.take("a", rate, 1.0).first_refusal


def test_one_callers_burst_leaves_every_other_caller_whole() -> None:
    table = BucketTable(10)
    rate = Rate(per_second=1.0, burst=5)
    for _ in range(50):
        table.take("greedy", rate, 0.0)
    assert all(table.take("quiet", rate, 0.0).granted for _ in range(5))


def test_peek_takes_nothing_and_stores_no_stranger() -> None:
    table = BucketTable(10)
    rate = Rate(per_second=1.0, burst=1)
    assert table.peek("stranger", rate, 0.0).granted and len(table) == 0
    table.take("a", rate, 0.0)
    assert not table.peek("a", rate, 0.0).granted
    assert table.peek("a", rate, 1.0).granted
    assert table.take("a", rate, 1.0).granted


def test_charges_after_one_peek_are_all_counted_as_debt() -> None:
    table = BucketTable(10)
    rate = Rate(per_second=1.0, burst=3)
    table.charge("a", rate, 0.0)
    # A crowd of 10 passed the peek while a token was there; each failure is charged.
    assert table.peek("a", rate, 0.0).granted
    for _ in range(10):
        table.charge("a", rate, 0.0)
    refused = table.peek("a", rate, 0.0)
    assert not refused.granted
    assert refused.wait_seconds == pytest.approx(4.0)  # the debt stops at -burst: 4 to go
    assert not table.peek("a", rate, 3.9).first_refusal  # the run began at 0.0
    assert table.peek("a", rate, 4.0).granted
    table.charge("a", rate, 4.0)
    assert table.peek("a", rate, 4.0).first_refusal  # a new run


def test_memory_is_bounded_and_forgetting_is_lenient() -> None:
    table = BucketTable(3)
    rate = Rate(per_second=0.001, burst=1)
    for caller in ("a", "b", "c"):
        assert table.take(caller, rate, 0.0).granted
    assert not table.take("a", rate, 1.0).granted  # a is now the most recently seen
    for i in range(10_000):
        table.take(f"flood-{i}", rate, 2.0)
    assert len(table) == 3
    # "a" was pushed out: it comes back with a full bucket, never with someone else's debt.
    assert table.take("a", rate, 3.0).granted


def test_the_least_recently_seen_caller_is_the_one_forgotten() -> None:
    table = BucketTable(2)
    rate = Rate(per_second=0.001, burst=1)
    table.take("old", rate, 0.0)
    table.take("recent", rate, 1.0)
    table.take("old", rate, 2.0)  # refused, but seen: now the most recent
    table.take("new", rate, 3.0)  # pushes out "recent"
    assert not table.take("old", rate, 4.0).granted  # still remembered, still empty
    assert table.take("recent", rate, 4.0).granted  # forgotten: full again


def test_a_clock_stepping_back_adds_nothing() -> None:
    table = BucketTable(10)
    rate = Rate(per_second=1.0, burst=1)
    table.take("a", rate, 100.0)
    assert not table.take("a", rate, 50.0).granted
    assert not table.take("a", rate, 100.5).granted
    assert table.take("a", rate, 101.0).granted


@pytest.mark.parametrize("per_second", [3.0, 7.0, 10.0, 0.3])
def test_a_caller_at_exactly_its_rate_is_never_refused(per_second: float) -> None:
    table = BucketTable(10)
    rate = Rate(per_second=per_second, burst=1)
    assert all(table.take("p", rate, i / per_second).granted for i in range(3000))


@given(
    per_second=st.floats(min_value=0.05, max_value=500.0),
    burst=st.integers(min_value=1, max_value=50),
    gaps=st.lists(st.floats(min_value=0.0, max_value=2.0), min_size=1, max_size=300),
)
def test_grants_never_exceed_burst_plus_rate_times_time(
    per_second: float, burst: int, gaps: list[float]
) -> None:
    table = BucketTable(10)
    rate = Rate(per_second=per_second, burst=burst)
    now = granted = 0.0
    for gap in gaps:
        now += gap
        granted += table.take("x", rate, now).granted
        assert granted <= burst + per_second * now + 1e-6


def test_the_limiter_keeps_scopes_apart_and_applies_named_rates_on_its_clock() -> None:
    clock = Clock()
    limiter = RateLimiter(
        {"key": Rate(1.0, 2), "callback": Rate(1.0, 1)},
        max_buckets=100,
        overrides={"callback": {"fal": Rate(1.0, 4)}},
        clock=clock,
    )
    assert [limiter.take("key", "k1").granted for _ in range(3)] == [True, True, False]
    assert limiter.take("callback", "k1").granted  # same caller, another scope
    fal = [limiter.take("callback", ("fal", "a"), name="fal").granted for _ in range(5)]
    assert fal == [True, True, True, True, False]
    assert limiter.take("callback", ("x", "a"), name="x").granted
    assert not limiter.take("callback", ("x", "a"), name="x").granted
    clock.now += 1.0
    assert limiter.take("key", "k1").granted
    assert limiter.size("callback") == 3


@pytest.mark.parametrize(
    ("per_second", "burst"),
    [(0.0, 1), (-1.0, 1), (float("inf"), 1), (float("nan"), 1), (1.0, 0)],
)
def test_a_rate_must_be_positive_and_finite(per_second: float, burst: int) -> None:
    with pytest.raises(ValueError, match="per_second"):
        Rate(per_second=per_second, burst=burst)
