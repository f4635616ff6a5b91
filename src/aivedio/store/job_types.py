"""The values the job queue trades in: ``JobSpec`` (a job to enqueue), ``Job`` (a claimed job,
with its lease) and ``Enqueued`` (what an enqueue made of one key). Both ``queue`` and
``enqueuing`` use them; ``queue`` re-exports them.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import msgspec


class JobSpec(msgspec.Struct, frozen=True, kw_only=True):
    """A job to enqueue. The payload carries ids only, never a URL or a secret."""

    kind: str
    lane: str
    idempotency_key: str
    tenant_id: int = 0
    payload: dict[str, Any] = msgspec.field(default_factory=dict)
    priority: int = 0
    expires_at: datetime | None = None
    estimated_seconds: float = 0.0
    max_attempts: int = 8
    timeout_seconds: float = 300.0
    # Due this much later than the default deadline (no effect with ``expires_at``).
    start_later_seconds: float = 0.0
    # Inserted held back (``waiting``) for this long: its enqueuer does the work meanwhile
    # and finishes it (``Queue.finish_held_parts``); should the enqueuer die first, the job
    # comes back by itself when the time is up and does the work.
    held_seconds: float = 0.0
    # The job doing its work meanwhile: its lease expiring or given back makes this one due.
    held_by: int | None = None


class Job(msgspec.Struct, frozen=True, kw_only=True):
    """A claimed job, with the lease token that every later change of it must present."""

    id: int
    kind: str
    lane: str
    tenant_id: int
    payload: dict[str, Any]
    attempts: int
    max_attempts: int
    lease_token: int
    timeout_seconds: float
    expires_at: datetime | None
    idempotency_key: str
    created_at: datetime


@dataclass(frozen=True, slots=True)
class Enqueued:
    idempotency_key: str
    job_id: int
    created: bool
