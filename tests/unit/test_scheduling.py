"""Claim order, fairness across tenants, backoff and the retry budget."""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aivedio.errors import Retry
from aivedio.scheduling import (
    LIMITED_RETRY_ATTEMPTS,
    MAX_ESTIMATED_SECONDS,
    RETRY_AFTER_MAX_SECONDS,
    Candidate,
    RetryDecision,
    backoff_ceilings,
    backoff_seconds,
    decide_retry,
    reference_claim,
    sort_at,
)

NOW = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)


def retry(
    retry_class: Retry = Retry.BACKOFF,
    attempts: int = 1,
    *,
    max_attempts: int = 8,
    retry_after_seconds: float | None = None,
) -> RetryDecision:
    """decide_retry with base 2s, cap 600s and jitter pinned to its ceiling."""
    return decide_retry(
        retry_class=retry_class,
        attempts=attempts,
        max_attempts=max_attempts,
        base_seconds=2.0,
        max_seconds=600.0,
        retry_after_seconds=retry_after_seconds,
        rand=lambda: 1.0,
    )


def test_sort_at_is_expiry_minus_estimate() -> None:
    expires = NOW + timedelta(minutes=10)
    got = sort_at(
        now=NOW, expires_at=expires, estimated_seconds=90, default_start_within_seconds=3600
    )
    assert got == expires - timedelta(seconds=90)


@pytest.mark.parametrize("estimate", [2**62 / (20 * 1024**2), 1e300, float("inf"), float("nan")])
def test_an_absurd_estimate_is_bounded_and_never_overflows(estimate: float) -> None:
    # A declared size of 2^62 bytes made the estimate ~2.2e11 s: the subtraction overflowed
    # (OverflowError, a 500 at the callback) before the estimate was bounded.
    expires = NOW + timedelta(minutes=10)
    got = sort_at(
        now=NOW, expires_at=expires, estimated_seconds=estimate, default_start_within_seconds=1
    )
    assert got == expires - timedelta(seconds=MAX_ESTIMATED_SECONDS)
    early = datetime(1, 1, 2, tzinfo=UTC)  # refused at the edge; still no crash here
    assert sort_at(
        now=NOW, expires_at=early, estimated_seconds=estimate, default_start_within_seconds=1
    ) == datetime.min.replace(tzinfo=UTC)


def test_sort_at_without_expiry_is_now_plus_window() -> None:
    got = sort_at(now=NOW, expires_at=None, estimated_seconds=90, default_start_within_seconds=3600)
    assert got == NOW + timedelta(hours=1)


def test_sort_at_of_an_expiring_job_ignores_now() -> None:
    expires = NOW + timedelta(minutes=10)
    a = sort_at(now=NOW, expires_at=expires, estimated_seconds=5, default_start_within_seconds=1)
    b = sort_at(
        now=NOW + timedelta(hours=3),
        expires_at=expires,
        estimated_seconds=5,
        default_start_within_seconds=1,
    )
    assert a == b


def test_backoff_full_jitter_bounds() -> None:
    assert backoff_seconds(1, 2.0, 600.0, rand=lambda: 0.0) == 0.0
    assert backoff_seconds(1, 2.0, 600.0, rand=lambda: 1.0) == 2.0
    assert backoff_seconds(3, 2.0, 600.0, rand=lambda: 0.5) == 4.0


def test_backoff_ceiling_doubles_then_caps_at_max() -> None:
    ceilings = [backoff_seconds(n, 2.0, 100.0, rand=lambda: 1.0) for n in range(1, 10)]
    assert ceilings == [2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 100.0, 100.0, 100.0]
    assert list(backoff_ceilings(10, 2.0, 100.0)) == ceilings


def test_backoff_of_attempt_zero_uses_the_base() -> None:
    assert backoff_seconds(0, 3.0, 600.0, rand=lambda: 1.0) == 3.0


@given(
    attempts=st.integers(min_value=0, max_value=200),
    base=st.floats(min_value=0.001, max_value=100),
    cap=st.floats(min_value=0.001, max_value=10_000),
    r=st.floats(min_value=0.0, max_value=1.0),
)
def test_backoff_is_always_within_zero_and_cap(
    attempts: int, base: float, cap: float, r: float
) -> None:
    delay = backoff_seconds(attempts, base, cap, rand=lambda: r)
    assert 0.0 <= delay <= cap


def test_never_is_never_retried() -> None:
    for attempts in (0, 1, 2):
        decision = retry(Retry.NEVER, attempts, retry_after_seconds=1.0)
        assert decision.retry is False


def test_limited_stops_after_three_attempts() -> None:
    assert LIMITED_RETRY_ATTEMPTS == 3
    verdicts = [retry(Retry.LIMITED, n).retry for n in (1, 2, 3, 4)]
    assert verdicts == [True, True, False, False]


def test_limited_respects_a_smaller_max_attempts() -> None:
    assert retry(Retry.LIMITED, 1, max_attempts=2).retry is True
    assert retry(Retry.LIMITED, 2, max_attempts=2).retry is False


def test_backoff_stops_at_max_attempts() -> None:
    verdicts = [retry(Retry.BACKOFF, n, max_attempts=5).retry for n in range(1, 7)]
    assert verdicts == [True, True, True, True, False, False]


def test_attempts_counts_the_attempt_that_just_failed() -> None:
    # With max_attempts=1 the first failure is the last run: no retry at all.
    assert retry(Retry.BACKOFF, 1, max_attempts=1).retry is False
    # The n-th failure's delay uses ceiling base * 2^(n-1).
    assert retry(Retry.BACKOFF, 1).delay_seconds == 2.0
    assert retry(Retry.BACKOFF, 4).delay_seconds == 16.0


def test_spent_budget_says_so() -> None:
    decision = retry(Retry.BACKOFF, 8)
    assert decision.retry is False
    assert "8/8" in decision.reason


def test_retry_after_replaces_the_computed_delay() -> None:
    decision = retry(Retry.BACKOFF, 1, retry_after_seconds=42.0)
    assert decision.retry is True
    assert decision.delay_seconds == 42.0
    assert decision.reason == "retry-after"
    assert retry(Retry.BACKOFF, 1, retry_after_seconds=0.0).delay_seconds == 0.0


def test_retry_after_beats_the_backoff_ceiling() -> None:
    # The remote side's explicit request wins over our schedule's 600 s ceiling.
    assert retry(retry_after_seconds=1200.0).delay_seconds == 1200.0


def test_retry_after_is_capped_at_the_absolute_bound() -> None:
    decision = retry(retry_after_seconds=10 * RETRY_AFTER_MAX_SECONDS)
    assert decision.retry is True
    assert decision.delay_seconds == RETRY_AFTER_MAX_SECONDS


def test_retry_after_does_not_extend_the_budget() -> None:
    assert retry(Retry.BACKOFF, 8, retry_after_seconds=1.0).retry is False


def test_negative_retry_after_falls_back_to_backoff() -> None:
    decision = retry(Retry.BACKOFF, 2, retry_after_seconds=-5.0)
    assert decision.delay_seconds == 4.0


# -- claim order and fairness ---------------------------------------------------------------


def _key(c: Candidate) -> tuple[datetime, int, int]:
    return (c.sort_at, -c.priority, c.id)


@st.composite
def candidate_sets(draw: st.DrawFn) -> list[Candidate]:
    rows = draw(
        st.lists(
            st.tuples(
                st.integers(0, 6),  # tenant
                st.integers(-5, 5),  # minutes from NOW: few values, so ties happen
                st.integers(0, 3),  # priority
            ),
            max_size=40,
        )
    )
    ids = draw(st.permutations(range(1, len(rows) + 1)))
    return [
        Candidate(id=i, tenant_id=t, sort_at=NOW + timedelta(minutes=m), priority=p)
        for i, (t, m, p) in zip(ids, rows, strict=True)
    ]


claims = given(
    candidates=candidate_sets(),
    batch=st.integers(1, 12),
    max_tenants=st.integers(1, 10),
)


@claims
def test_claim_takes_at_most_batch_distinct_known_ids(
    candidates: list[Candidate], batch: int, max_tenants: int
) -> None:
    got = reference_claim(candidates, batch, max_tenants)
    assert len(got) <= batch
    assert len(got) == len(set(got))
    assert set(got) <= {c.id for c in candidates}
    tenants = {c.tenant_id for c in candidates}
    if len(tenants) <= max_tenants:
        assert len(got) == min(batch, len(candidates))


@claims
def test_claim_takes_every_tenants_most_urgent_job_when_they_fit(
    candidates: list[Candidate], batch: int, max_tenants: int
) -> None:
    by_tenant: dict[int, list[Candidate]] = defaultdict(list)
    for c in candidates:
        by_tenant[c.tenant_id].append(c)
    got = set(reference_claim(candidates, batch, max_tenants))
    if len(by_tenant) <= min(batch, max_tenants):
        for tenant, own in by_tenant.items():
            assert min(own, key=_key).id in got, tenant


@claims
def test_claim_takes_each_tenants_most_urgent_jobs_in_order(
    candidates: list[Candidate], batch: int, max_tenants: int
) -> None:
    by_id = {c.id: c for c in candidates}
    chosen: dict[int, list[int]] = defaultdict(list)
    for cid in reference_claim(candidates, batch, max_tenants):
        chosen[by_id[cid].tenant_id].append(cid)
    for tenant, ids in chosen.items():
        ranked = sorted((c for c in candidates if c.tenant_id == tenant), key=_key)
        assert ids == [c.id for c in ranked[: len(ids)]], tenant


def test_claim_is_round_robin_across_tenants() -> None:
    early = [Candidate(id=i, tenant_id=1, sort_at=NOW, priority=0) for i in range(1, 6)]
    late = Candidate(id=99, tenant_id=2, sort_at=NOW + timedelta(days=1), priority=0)
    assert reference_claim([*early, late], batch=2, max_tenants=10) == [1, 99]


def test_claim_breaks_ties_on_priority_then_id() -> None:
    cands = [
        Candidate(id=3, tenant_id=1, sort_at=NOW, priority=0),
        Candidate(id=2, tenant_id=1, sort_at=NOW, priority=0),
        Candidate(id=9, tenant_id=1, sort_at=NOW, priority=5),
    ]
    assert reference_claim(cands, batch=3, max_tenants=1) == [9, 2, 3]


@pytest.mark.parametrize("batch", [0, 1])
def test_claim_of_nothing_is_empty(batch: int) -> None:
    assert reference_claim([], batch=batch, max_tenants=4) == []


def test_an_absurd_attempt_count_backs_off_the_maximum_and_never_overflows() -> None:
    # A job row's attempts is data: 5000 of a budget of 100000 once overflowed a float in
    # recording the failure, and ended the worker.
    assert backoff_seconds(5000, 2.0, 600.0, rand=lambda: 1.0) == 600.0
    assert backoff_seconds(10**9, 2.0, 600.0, rand=lambda: 0.5) == 300.0
    decision = decide_retry(
        retry_class=Retry.BACKOFF,
        attempts=5000,
        max_attempts=100000,
        base_seconds=2.0,
        max_seconds=600.0,
        rand=lambda: 1.0,
    )
    assert decision.retry and decision.delay_seconds == 600.0
