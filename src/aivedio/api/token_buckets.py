"""Token buckets: whether a caller may make a request now, and if not, when it may.

A bucket holds up to ``burst`` tokens and gains ``per_second`` of them each second; a
request takes one, and a request that finds less than one is refused with the time until one
is there (the ``Retry-After`` of the 429). A caller within its rate is therefore never
refused, whatever anyone else sends, and a burst drains only the burster's own bucket.

Pure: no I/O, and the clock is injected (``BucketTable.take(..., now=...)`` and
``RateLimiter(clock=...)``), so the tests step time by hand.

Memory is bounded: a table keeps at most ``max_buckets`` callers and forgets the least
recently seen. Forgetting is lenient by construction: a forgotten caller comes back with a
full bucket, which is what it would have had anyway after ``burst / per_second`` idle
seconds. So a flood of distinct addresses or keys costs a fixed amount of memory, and the
worst it can do is let the callers it pushed out start again from full; it can never make
anyone be refused.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Rate:
    """``per_second`` tokens a second, at most ``burst`` saved up (and so taken at once)."""

    per_second: float
    burst: int

    def __post_init__(self) -> None:
        if not (self.per_second > 0 and math.isfinite(self.per_second)) or self.burst < 1:
            raise ValueError("a rate needs per_second > 0 (finite) and burst >= 1")


@dataclass(slots=True)
class _Bucket:
    tokens: float
    updated: float
    refusing: bool = False  # refused since its last grant: the next refusal is not news


@dataclass(frozen=True, slots=True)
class Verdict:
    """``wait_seconds`` 0 means granted; otherwise how long until a token is there.
    ``first_refusal`` marks the refusal that starts a run of them (log it, not the rest)."""

    wait_seconds: float
    first_refusal: bool = False

    @property
    def granted(self) -> bool:
        return self.wait_seconds == 0.0

    @property
    def retry_after_seconds(self) -> int:
        """Whole seconds for ``Retry-After``: rounded up, at least 1."""
        return max(1, math.ceil(self.wait_seconds))


GRANTED = Verdict(0.0)
# Tokens are floats: a caller at exactly its rate must not be refused by rounding (a third
# of a token added three times is 0.9999999999999999).
EPSILON_TOKENS = 1e-9


class BucketTable:
    """Buckets by caller, at most ``max_buckets`` of them (least recently seen dropped)."""

    def __init__(self, max_buckets: int) -> None:
        if max_buckets < 1:
            raise ValueError("max_buckets must be at least 1")
        self.max_buckets = max_buckets
        self._buckets: OrderedDict[Hashable, _Bucket] = OrderedDict()

    def __len__(self) -> int:
        return len(self._buckets)

    def _refill(self, caller: Hashable, rate: Rate, now: float) -> _Bucket:
        bucket = self._buckets.get(caller)
        if bucket is None:
            bucket = _Bucket(tokens=float(rate.burst), updated=now)
            self._buckets[caller] = bucket
            if len(self._buckets) > self.max_buckets:
                self._buckets.popitem(last=False)
        else:
            self._buckets.move_to_end(caller)
            # A clock that steps back (it should not: monotonic) adds nothing, takes nothing.
            elapsed = max(0.0, now - bucket.updated)
            bucket.tokens = min(float(rate.burst), bucket.tokens + elapsed * rate.per_second)
            bucket.updated = max(bucket.updated, now)
        return bucket

    def take(self, caller: Hashable, rate: Rate, now: float) -> Verdict:
        """Take a token from ``caller``'s bucket if there is one."""
        bucket = self._refill(caller, rate, now)
        if bucket.tokens >= 1.0 - EPSILON_TOKENS:
            bucket.tokens = max(0.0, bucket.tokens - 1.0)
            bucket.refusing = False
            return GRANTED
        first = not bucket.refusing
        bucket.refusing = True
        return Verdict((1.0 - bucket.tokens) / rate.per_second, first)

    def charge(self, caller: Hashable, rate: Rate, now: float) -> None:
        """Take a token whether or not there is one, into debt down to ``-burst``: for what
        can only be counted once it was done (a key lookup that failed). With ``peek`` in
        front, every such request is counted however many ran at once; a refused ``take``
        counts nothing, so a crowd let through by one peek would leave no trace."""
        bucket = self._refill(caller, rate, now)
        bucket.tokens = max(-float(rate.burst), bucket.tokens - 1.0)

    def peek(self, caller: Hashable, rate: Rate, now: float) -> Verdict:
        """Whether ``take`` would grant, without taking (a caller never seen: granted, and
        still not stored, so looking costs no memory)."""
        if caller not in self._buckets:
            return GRANTED
        bucket = self._refill(caller, rate, now)
        if bucket.tokens >= 1.0 - EPSILON_TOKENS:
            bucket.refusing = False
            return GRANTED
        first = not bucket.refusing
        bucket.refusing = True
        return Verdict((1.0 - bucket.tokens) / rate.per_second, first)


class RateLimiter:
    """One ``BucketTable`` per scope (``key``, ``address``, …), each with its rate, plus
    rates for named callers of a scope (a provider's own callback rate), on one clock."""

    def __init__(
        self,
        rates: Mapping[str, Rate],
        *,
        max_buckets: int,
        overrides: Mapping[str, Mapping[str, Rate]] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.rates = dict(rates)
        self.overrides = {scope: dict(named) for scope, named in (overrides or {}).items()}
        self.clock = clock
        self._tables = {scope: BucketTable(max_buckets) for scope in self.rates}

    def rate(self, scope: str, name: str | None = None) -> Rate:
        named = self.overrides.get(scope, {})
        return named[name] if name is not None and name in named else self.rates[scope]

    def take(self, scope: str, caller: Hashable, *, name: str | None = None) -> Verdict:
        """``name`` picks an override rate of the scope (the caller still has its own
        bucket: include the name in ``caller`` when callers of two names must not share)."""
        return self._tables[scope].take(caller, self.rate(scope, name), self.clock())

    def peek(self, scope: str, caller: Hashable, *, name: str | None = None) -> Verdict:
        return self._tables[scope].peek(caller, self.rate(scope, name), self.clock())

    def charge(self, scope: str, caller: Hashable, *, name: str | None = None) -> None:
        self._tables[scope].charge(caller, self.rate(scope, name), self.clock())

    def size(self, scope: str) -> int:
        return len(self._tables[scope])
