"""Job kinds: which lane runs a kind, its handler, its deadline and its retry budget.

A stage module registers its kinds; the worker runs what is registered. Producers build a
``JobSpec`` through ``spec`` so that lane, timeout and budget come from one place.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from aivedio.store.queue import Job, JobSpec


@dataclass
class JobContext:
    """What a handler may use. ``services`` holds the seams a stage needs (store, fetcher…)."""

    owner: str
    services: dict[str, Any] = field(default_factory=dict)


Handler = Callable[[JobContext, Job], Awaitable[dict[str, Any] | None]]


@dataclass(frozen=True, slots=True)
class JobKind:
    name: str
    lane: str
    handler: Handler
    timeout_seconds: float = 300.0
    max_attempts: int = 8
    estimated_seconds: float = 0.0


class Registry:
    def __init__(self) -> None:
        self._kinds: dict[str, JobKind] = {}

    def register(self, kind: JobKind) -> None:
        if kind.name in self._kinds:
            raise ValueError(f"job kind {kind.name!r} registered twice")
        self._kinds[kind.name] = kind

    def get(self, name: str) -> JobKind | None:
        return self._kinds.get(name)

    def __iter__(self) -> Iterator[JobKind]:
        return iter(self._kinds.values())

    def lanes(self) -> set[str]:
        return {k.lane for k in self._kinds.values()}

    def spec(
        self,
        name: str,
        idempotency_key: str,
        *,
        tenant_id: int = 0,
        payload: dict[str, Any] | None = None,
        priority: int = 0,
        expires_at: datetime | None = None,
        max_attempts: int | None = None,
    ) -> JobSpec:
        kind = self._kinds[name]
        return JobSpec(
            kind=name,
            lane=kind.lane,
            idempotency_key=idempotency_key,
            tenant_id=tenant_id,
            payload=payload or {},
            priority=priority,
            expires_at=expires_at,
            estimated_seconds=kind.estimated_seconds,
            max_attempts=max_attempts or kind.max_attempts,
            timeout_seconds=kind.timeout_seconds,
        )
