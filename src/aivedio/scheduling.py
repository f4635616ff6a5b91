"""Claim order and retry schedule: pure functions over plain data.

Order (DESIGN §5). A fetch job must start before its URL dies:
``expiry_slack = expires_at - now - estimated_fetch_time``, smallest first. Since ``now`` is
common to every candidate, ordering by slack is ordering by ``expires_at - estimated``, a
value fixed at enqueue time. We store it as ``sort_at`` so that the claim walks an index
instead of computing and sorting a score over every ready row. Jobs without an expiry get
``enqueued_at + default_start_within``: they age into the order, so an endless stream of
expiring work cannot starve them. A retry adds a penalty to ``sort_at``. Ties break on
priority (higher first), then id (older first).

Fairness is round-robin across tenants: every tenant's most urgent job is taken before any
tenant's second one (see the ``claim`` query). One round walks at most ``max_tenants``
tenants, from a cursor the worker moves past the last tenant it served, so with more tenants
than that every one is reached within a few rounds. ``reference_claim`` is the same rule
in Python,
which the property tests compare with what PostgreSQL returns.

Backoff is exponential with full jitter (delay uniform in ``[0, min(max, base·2^(n-1))]``),
so a fleet that failed together does not retry together. A ``Retry-After`` from the remote
side replaces the computed delay (bounded by ``RETRY_AFTER_MAX_SECONDS``, not by the
backoff ceiling: the remote side knows better than our schedule when it can serve again).
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from aivedio.errors import Retry

LIMITED_RETRY_ATTEMPTS = 3
# No job is planned to take longer than this: an estimate derived from a declared size
# (2^62 bytes once) is bounded here, so ``sort_at`` stays a time any store can hold.
MAX_ESTIMATED_SECONDS = 7 * 86400.0
# A Retry-After is the remote side's explicit request and beats our schedule, including our
# backoff ceiling; this bound only protects against absurd values.
RETRY_AFTER_MAX_SECONDS = 3600.0


def sort_at(
    *,
    now: datetime,
    expires_at: datetime | None,
    estimated_seconds: float,
    default_start_within_seconds: float,
    start_later_seconds: float = 0.0,
) -> datetime:
    """The latest time a job should start: the key the claim orders by. A job without an
    expiry may ask to be due ``start_later_seconds`` after the default (a long video's later
    chunks: a short video enqueued meanwhile goes before them).

    An estimate outside [0, ``MAX_ESTIMATED_SECONDS``] (or not finite) counts as that bound,
    and a result past what a datetime holds as its limit, so no input can make the claim
    order overflow."""
    if expires_at is not None:
        estimate = min(max(estimated_seconds, 0.0), MAX_ESTIMATED_SECONDS)
        if estimate != estimate:  # NaN
            estimate = MAX_ESTIMATED_SECONDS
        try:
            return expires_at - timedelta(seconds=estimate)
        except OverflowError:
            return datetime.min.replace(tzinfo=expires_at.tzinfo)
    try:
        return now + timedelta(seconds=default_start_within_seconds + start_later_seconds)
    except OverflowError:
        return datetime.max.replace(tzinfo=now.tzinfo)


@dataclass(frozen=True, slots=True)
class Candidate:
    id: int
    tenant_id: int
    sort_at: datetime
    priority: int


def _key(c: Candidate) -> tuple[datetime, int, int]:
    return (c.sort_at, -c.priority, c.id)


def reference_claim(
    candidates: Iterable[Candidate], batch: int, max_tenants: int, start_tenant: int = 0
) -> list[int]:
    """The ids one claim round takes, by the rule the ``claim`` query implements: tenants
    walked from ``start_tenant`` up, wrapping around, at most ``max_tenants`` of them."""
    by_tenant: dict[int, list[Candidate]] = defaultdict(list)
    for c in candidates:
        by_tenant[c.tenant_id].append(c)
    ordered = sorted(by_tenant)
    walk = [t for t in ordered if t >= start_tenant] + [t for t in ordered if t < start_tenant]
    turns: list[tuple[int, Candidate]] = []
    for tenant in walk[:max_tenants]:
        ranked = sorted(by_tenant[tenant], key=_key)[:batch]
        turns.extend((turn, c) for turn, c in enumerate(ranked))
    turns.sort(key=lambda tc: (tc[0], *_key(tc[1])))
    return [c.id for _, c in turns[:batch]]


@dataclass(frozen=True, slots=True)
class RetryDecision:
    """What to do with a failed job: bury it, or run it again after ``delay_seconds``."""

    retry: bool
    delay_seconds: float = 0.0
    reason: str = ""


def decide_retry(
    *,
    retry_class: Retry,
    attempts: int,
    max_attempts: int,
    base_seconds: float,
    max_seconds: float,
    retry_after_seconds: float | None = None,
    rand: Callable[[], float] = random.random,
) -> RetryDecision:
    """The retry schedule. ``attempts`` counts the attempt that just failed (1 for the first)."""
    if retry_class is Retry.NEVER:
        return RetryDecision(False, reason="not retryable")
    budget = max_attempts
    if retry_class is Retry.LIMITED:
        budget = min(max_attempts, LIMITED_RETRY_ATTEMPTS)
    if attempts >= budget:
        return RetryDecision(False, reason=f"retry budget spent ({attempts}/{budget})")
    if retry_after_seconds is not None and retry_after_seconds >= 0:
        return RetryDecision(True, min(retry_after_seconds, RETRY_AFTER_MAX_SECONDS), "retry-after")
    return RetryDecision(True, backoff_seconds(attempts, base_seconds, max_seconds, rand))


def backoff_seconds(
    attempts: int,
    base_seconds: float,
    max_seconds: float,
    rand: Callable[[], float] = random.random,
) -> float:
    """Full jitter: uniform in [0, min(max, base · 2^(attempts-1))]. (The exponent is capped:
    past 2^64 the ceiling is the maximum anyway, and an absurd attempt count in a job's row
    must not overflow into an error that stops the worker recording its failure.)"""
    ceiling = min(max_seconds, base_seconds * 2.0 ** min(max(attempts - 1, 0), 64))
    return float(ceiling * rand())


def backoff_ceilings(max_attempts: int, base_seconds: float, max_seconds: float) -> Sequence[float]:
    """The upper bound of each retry's delay, for documentation and tests."""
    return [min(max_seconds, base_seconds * 2 ** (n - 1)) for n in range(1, max_attempts)]
