"""The [worker] and [queue] sections: a worker's lanes and loops, and how the queue retries.

Kept apart from ``config/load.py`` like the other sections: the worker daemon and the queue
read them. The loader decodes them like every other section and calls ``validate_worker``.
"""

from __future__ import annotations

import msgspec

from aivedio.errors import ConfigError


class LaneConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    slots: int


def default_lanes() -> dict[str, LaneConfig]:
    return {
        "fetch": LaneConfig(slots=16),
        "media": LaneConfig(slots=2),
        "control": LaneConfig(slots=8),
    }


class WorkerConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    http_host: str = "127.0.0.1"
    http_port: int = 9464
    drain_timeout_seconds: float = 30.0
    lease_seconds: float = 30.0
    heartbeat_interval_seconds: float = 5.0
    poll_interval_seconds: float = 1.0
    # How long a lane that found nothing waits, unwoken, before asking again (every way a
    # job becomes claimable notifies, so this is a safety net); default 5 x the poll interval.
    claim_poll_seconds: float | None = None
    claim_batch_max: int = 32
    ack_batch_max: int = 64
    # How long a finished job's acknowledgement waits for a claim to carry it (one round
    # trip for both) before it is sent on its own.
    ack_flush_seconds: float = 0.25
    lanes: dict[str, LaneConfig] = msgspec.field(default_factory=default_lanes)


def claim_poll_seconds(worker: WorkerConfig) -> float:
    """``worker.claim_poll_seconds``, or its default: 5 x ``worker.poll_interval_seconds``."""
    if worker.claim_poll_seconds is None:
        return 5 * worker.poll_interval_seconds
    return worker.claim_poll_seconds


class QueueConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    max_attempts: int = 8
    backoff_base_seconds: float = 2.0
    backoff_max_seconds: float = 600.0
    # A job without an expiry should start within this long; it ages into the order as if
    # this were its deadline, so deadline-bearing jobs cannot starve it.
    default_start_within_seconds: float = 3600.0
    retry_penalty_seconds: float = 30.0
    max_tenants_per_claim: int = 64


def validate_worker(worker: WorkerConfig, queue: QueueConfig) -> None:
    """Semantic checks that types alone cannot express. Each names the key it is about."""
    if not 0 <= worker.http_port <= 65535:
        raise ConfigError("config error: worker.http_port: must be 0..65535")
    if worker.heartbeat_interval_seconds * 2 > worker.lease_seconds:
        raise ConfigError(
            "config error: worker.heartbeat_interval_seconds: must be at most half of "
            "worker.lease_seconds, or leases expire between heartbeats"
        )
    for name, positive in (
        ("worker.drain_timeout_seconds", worker.drain_timeout_seconds),
        ("worker.poll_interval_seconds", worker.poll_interval_seconds),
        ("worker.claim_poll_seconds", claim_poll_seconds(worker)),
        ("worker.claim_batch_max", worker.claim_batch_max),
        ("worker.ack_batch_max", worker.ack_batch_max),
        ("queue.max_attempts", queue.max_attempts),
        ("queue.backoff_base_seconds", queue.backoff_base_seconds),
        ("queue.max_tenants_per_claim", queue.max_tenants_per_claim),
    ):
        if positive <= 0:
            raise ConfigError(f"config error: {name}: must be positive")
    if not worker.lanes:
        raise ConfigError("config error: worker.lanes: at least one lane is needed")
    for lane, lane_config in worker.lanes.items():
        if lane_config.slots < 0:
            raise ConfigError(f"config error: worker.lanes.{lane}.slots: must be >= 0")
