"""Per-host AIMD concurrency and the per-provider circuit breaker (fake clock, no sleeping)."""

from __future__ import annotations

import anyio
import pytest

from aivedio.net.limits import CircuitBreaker, HostLimiter

HOST = "cdn.provider.test"


# -- HostLimiter: additive increase, multiplicative decrease ---------------------------------


def test_unknown_host_starts_at_the_maximum() -> None:
    assert HostLimiter(8).limit(HOST) == 8


def test_throttle_halves_the_limit_down_to_one() -> None:
    limiter = HostLimiter(8)
    seen = []
    for _ in range(5):
        limiter.throttled(HOST)
        seen.append(limiter.limit(HOST))
    assert seen == [4, 2, 1, 1, 1]


def test_success_grows_the_limit_by_one_up_to_the_maximum() -> None:
    limiter = HostLimiter(4)
    limiter.throttled(HOST)
    limiter.throttled(HOST)
    assert limiter.limit(HOST) == 1
    seen = []
    for _ in range(5):
        limiter.succeeded(HOST)
        seen.append(limiter.limit(HOST))
    assert seen == [2, 3, 4, 4, 4]


def test_limits_are_per_host() -> None:
    limiter = HostLimiter(6)
    limiter.throttled(HOST)
    assert limiter.limit(HOST) == 3
    assert limiter.limit("other.test") == 6


class Holders:
    """Tasks that take a slot, say so, and hold it until released."""

    def __init__(self, limiter: HostLimiter) -> None:
        self.limiter = limiter
        self.inside = 0
        self.peak = 0
        self.entered = [anyio.Event() for _ in range(3)]
        self.release = anyio.Event()

    async def hold(self, n: int) -> None:
        async with self.limiter.slot(HOST):
            self.inside += 1
            self.peak = max(self.peak, self.inside)
            self.entered[n].set()
            await self.release.wait()
            self.inside -= 1


async def _not_entered(event: anyio.Event) -> bool:
    await anyio.wait_all_tasks_blocked()
    with anyio.move_on_after(0.05):
        await event.wait()
    return not event.is_set()


@pytest.mark.anyio
async def test_third_holder_waits_while_two_slots_are_taken() -> None:
    holders = Holders(HostLimiter(2))
    async with anyio.create_task_group() as tg:
        for n in range(3):
            tg.start_soon(holders.hold, n)
        with anyio.fail_after(1):
            await holders.entered[0].wait()
            await holders.entered[1].wait()
        assert await _not_entered(holders.entered[2])
        assert holders.inside == 2
        holders.release.set()
        with anyio.fail_after(1):
            await holders.entered[2].wait()
    assert holders.peak == 2


@pytest.mark.anyio
async def test_released_slot_admits_the_waiting_holder() -> None:
    limiter = HostLimiter(1)
    first_in, first_out, second_in = anyio.Event(), anyio.Event(), anyio.Event()

    async def first() -> None:
        async with limiter.slot(HOST):
            first_in.set()
            await first_out.wait()

    async def second() -> None:
        async with limiter.slot(HOST):
            second_in.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(first)
        with anyio.fail_after(1):
            await first_in.wait()
        tg.start_soon(second)
        assert await _not_entered(second_in)
        first_out.set()
        with anyio.fail_after(1):
            await second_in.wait()


@pytest.mark.anyio
async def test_success_that_raises_the_limit_admits_a_waiter_without_a_release() -> None:
    limiter = HostLimiter(2)
    limiter.throttled(HOST)  # limit 1
    holders = Holders(limiter)
    async with anyio.create_task_group() as tg:
        tg.start_soon(holders.hold, 0)
        with anyio.fail_after(1):
            await holders.entered[0].wait()
        tg.start_soon(holders.hold, 1)
        assert await _not_entered(holders.entered[1])
        limiter.succeeded(HOST)  # limit 2: room for the waiter now
        with anyio.fail_after(1):
            await holders.entered[1].wait()
        assert holders.inside == 2
        holders.release.set()


# -- CircuitBreaker -------------------------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_breaker_stays_closed_below_the_failure_threshold() -> None:
    breaker = CircuitBreaker(3, 30.0, clock=FakeClock())
    breaker.failure()
    breaker.failure()
    assert breaker.blocked_for() == 0.0


def test_breaker_opens_after_consecutive_failures_and_counts_down() -> None:
    clock = FakeClock()
    breaker = CircuitBreaker(3, 30.0, clock=clock)
    for _ in range(3):
        breaker.failure()
    assert breaker.blocked_for() == pytest.approx(30.0)
    clock.now += 10
    assert breaker.blocked_for() == pytest.approx(20.0)
    clock.now += 19.5
    assert breaker.blocked_for() == pytest.approx(0.5)


def test_breaker_is_half_open_after_the_window() -> None:
    clock = FakeClock()
    breaker = CircuitBreaker(2, 30.0, clock=clock)
    breaker.failure()
    breaker.failure()
    clock.now += 30
    assert breaker.blocked_for() == 0.0
    clock.now += 100
    assert breaker.blocked_for() == 0.0


def test_failed_probe_reopens_for_a_full_window() -> None:
    clock = FakeClock()
    breaker = CircuitBreaker(2, 30.0, clock=clock)
    breaker.failure()
    breaker.failure()
    clock.now += 31
    breaker.failure()  # the half-open probe failed
    assert breaker.blocked_for() == pytest.approx(30.0)


def test_successful_probe_closes_the_breaker() -> None:
    clock = FakeClock()
    breaker = CircuitBreaker(2, 30.0, clock=clock)
    breaker.failure()
    breaker.failure()
    clock.now += 31
    breaker.success()
    assert breaker.blocked_for() == 0.0
    breaker.failure()  # one failure after closing is below the threshold again
    assert breaker.blocked_for() == 0.0


def test_success_between_failures_resets_the_count() -> None:
    breaker = CircuitBreaker(3, 30.0, clock=FakeClock())
    breaker.failure()
    breaker.failure()
    breaker.success()
    breaker.failure()
    breaker.failure()
    assert breaker.blocked_for() == 0.0
    breaker.failure()
    assert breaker.blocked_for() == pytest.approx(30.0)


def test_after_the_open_window_exactly_one_probe_goes_through() -> None:
    now = [0.0]
    breaker = CircuitBreaker(failures=2, open_seconds=30, clock=lambda: now[0])
    assert breaker.acquire() == 0.0
    breaker.failure()
    breaker.failure()
    assert breaker.acquire() == 30.0
    now[0] = 31.0
    assert breaker.acquire() == 0.0  # the probe
    assert breaker.acquire() > 0  # everyone else waits for the probe's verdict
    breaker.failure()  # the probe failed: a full window again
    assert breaker.acquire() == 30.0
    now[0] = 62.0
    assert breaker.acquire() == 0.0
    breaker.success()
    assert breaker.acquire() == 0.0
    assert breaker.acquire() == 0.0
