"""The one contract between stages: every job kind, its lane, its budget, its idempotency
key and the builder of its spec.

A stage enqueues the next step with a builder from here and never imports the next stage.
A stage binds its handler to a kind with ``Registry.bind``; the worker runs what is bound.
The budget of a kind is written here once: the worker reads a job's deadline and attempts
from its row, and every row is made by a builder below (or by ``Registry.spec`` for a kind
named on the command line).

Kinds whose work grows with the media (render, the chunk steps) size their deadline per
asset: their builder takes ``timeout``, and the contract's figure is the one a job of that
kind gets when nothing is known of its media (``aivedio enqueue``).
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import msgspec

from aivedio.store.queue import Job, JobSpec


@dataclass(frozen=True, slots=True)
class Contract:
    """What every job of one kind gets: its lane, deadline, attempts and priority."""

    name: str
    lane: str
    timeout_seconds: float
    max_attempts: int
    priority: int = 0


FETCH = Contract("fetch", "fetch", 4 * 3600.0, 8)
POLL = Contract("provider.poll", "control", 120.0, 8)
# A probe reads the whole source (decode check included): hours for a long upload.
PROBE = Contract("probe", "media", 4 * 3600.0, 4)
REPROCESS = Contract("reprocess", "media", 900.0, 4)
RENDER = Contract("render", "media", 3 * 3600.0, 4)
CHUNK_SPLIT = Contract("chunk_split", "media", 3 * 3600.0, 4, priority=5)
CHUNK_ENCODE = Contract("chunk_encode", "media", 3 * 3600.0, 4, priority=5)
CHUNK_ASSEMBLE = Contract("chunk_assemble", "media", 3 * 3600.0, 4, priority=5)
MODERATE = Contract("moderate", "control", 600.0, 8, priority=20)
PUBLISH = Contract("publish", "control", 300.0, 8, priority=30)
SWEEP = Contract("sweep", "control", 3600.0, 3)
DIAG_NOOP = Contract("diag.noop", "control", 60.0, 5)
DIAG_SLEEP = Contract("diag.sleep", "control", 3600.0, 5)
DIAG_FAIL = Contract("diag.fail", "control", 60.0, 5)

CONTRACTS: dict[str, Contract] = {
    c.name: c
    for c in (
        FETCH,
        POLL,
        PROBE,
        REPROCESS,
        RENDER,
        CHUNK_SPLIT,
        CHUNK_ENCODE,
        CHUNK_ASSEMBLE,
        MODERATE,
        PUBLISH,
        SWEEP,
        DIAG_NOOP,
        DIAG_SLEEP,
        DIAG_FAIL,
    )
}

# The probe's results are keyed by this version: a new probe version probes every asset again.
PROBE_VERSION = 1
# The render priority of an output the asset cannot be PLAYABLE without.
REQUIRED_RENDER_PRIORITY = 10


def _spec(
    contract: Contract,
    idempotency_key: str,
    payload: dict[str, Any],
    *,
    tenant_id: int = 0,
    priority: int | None = None,
    timeout: float | None = None,
    **extra: Any,
) -> JobSpec:
    return JobSpec(
        kind=contract.name,
        lane=contract.lane,
        tenant_id=tenant_id,
        idempotency_key=idempotency_key,
        payload=payload,
        priority=contract.priority if priority is None else priority,
        timeout_seconds=contract.timeout_seconds if timeout is None else timeout,
        max_attempts=contract.max_attempts,
        **extra,
    )


# -- idempotency keys: one job per step and version ------------------------------------------


def fetch_job_key(provider_output_id: uuid.UUID, pipeline_version: int) -> str:
    return f"fetch:{provider_output_id}:v{pipeline_version}"


def poll_job_key(generation_task_id: uuid.UUID, round_: int) -> str:
    return f"poll:{generation_task_id}:r{round_}"


def chunk_job_key(
    kind: str, asset_id: uuid.UUID, revision: int, piece: str, pipeline_version: int
) -> str:
    return f"{kind}:{asset_id}:{revision}:{piece}:v{pipeline_version}"


# -- the builders -----------------------------------------------------------------------------


def fetch_spec(
    provider_output_id: uuid.UUID,
    tenant_id: int,
    pipeline_version: int,
    *,
    expires_at: datetime,
    estimated_seconds: float,
) -> JobSpec:
    """The fetch of one provider output; ``expires_at`` is when its signed URL stops working."""
    return _spec(
        FETCH,
        fetch_job_key(provider_output_id, pipeline_version),
        {"provider_output_id": str(provider_output_id)},
        tenant_id=tenant_id,
        expires_at=expires_at,
        estimated_seconds=max(estimated_seconds, 0.0),
    )


def poll_spec(generation_task_id: uuid.UUID, tenant_id: int, round_: int) -> JobSpec:
    """One round of polling a provider task (the round keeps a watch's polls apart)."""
    return _spec(
        POLL,
        poll_job_key(generation_task_id, round_),
        {"generation_task_id": str(generation_task_id)},
        tenant_id=tenant_id,
    )


def probe_spec(asset_id: uuid.UUID, tenant_id: int) -> JobSpec:
    """The probe of an asset: one per asset and probe version."""
    return _spec(
        PROBE,
        f"probe:{asset_id}:v{PROBE_VERSION}",
        {"asset_id": str(asset_id)},
        tenant_id=tenant_id,
    )


def reprocess_spec(asset_id: uuid.UUID, tenant_id: int, pipeline_version: int) -> JobSpec:
    """One reprocess per asset and pipeline version at a time (a later request after it
    finished gets a fresh key from the request time)."""
    return _spec(
        REPROCESS,
        f"reprocess:{asset_id}:v{pipeline_version}:{uuid.uuid4().hex[:8]}",
        {"asset_id": str(asset_id)},
        tenant_id=tenant_id,
    )


def render_spec(
    asset_id: uuid.UUID,
    tenant_id: int,
    revision: int,
    output: str,
    *,
    pipeline_version: int,
    required: bool,
    timeout: float,
) -> JobSpec:
    """The render of one output of a revision; a required output goes first."""
    return _spec(
        RENDER,
        f"render:{asset_id}:{revision}:{output}:v{pipeline_version}",
        {"asset_id": str(asset_id), "revision": revision, "variant_type": output},
        tenant_id=tenant_id,
        priority=REQUIRED_RENDER_PRIORITY if required else 0,
        timeout=timeout,
    )


def chunk_spec(
    contract: Contract,
    asset_id: uuid.UUID,
    tenant_id: int,
    revision: int,
    piece: str,
    *,
    pipeline_version: int,
    timeout: float,
    later: float = 0.0,
) -> JobSpec:
    """A step of the chunked render. ``later``: a chunk is due as many seconds after the
    default as it lies into the video, so a short video enqueued meanwhile is not queued
    behind a long one's tail."""
    if contract not in (CHUNK_SPLIT, CHUNK_ENCODE, CHUNK_ASSEMBLE):
        raise ValueError(f"{contract.name!r} is not a step of the chunked render")
    return _spec(
        contract,
        chunk_job_key(contract.name, asset_id, revision, piece, pipeline_version),
        {"asset_id": str(asset_id), "revision": revision, "piece": piece},
        tenant_id=tenant_id,
        timeout=timeout,
        start_later_seconds=later,
    )


def moderate_spec(asset_id: uuid.UUID, revision: int, tenant_id: int) -> JobSpec:
    """The moderation of a revision's outputs."""
    return _spec(
        MODERATE,
        f"moderate:{asset_id}:{revision}",
        {"asset_id": str(asset_id), "revision": revision},
        tenant_id=tenant_id,
    )


def publish_spec(
    asset_id: uuid.UUID, revision: int, tenant_id: int, *, enrich: bool = False
) -> JobSpec:
    """The publish of a revision (PLAYABLE), or with ``enrich`` its enrichment (ENRICHED)."""
    mode = "enrich" if enrich else "publish"
    return _spec(
        PUBLISH,
        f"{mode}:{asset_id}:{revision}",
        {"asset_id": str(asset_id), "revision": revision, "mode": mode},
        tenant_id=tenant_id,
    )


def sweep_spec(now: datetime, interval_seconds: float, *, following: bool) -> JobSpec:
    """The sweep job of ``now``'s time bucket, or (``following``) of the next one."""
    bucket = math.floor(now.timestamp() / interval_seconds) + (1 if following else 0)
    return _spec(
        SWEEP,
        f"sweep:{interval_seconds:g}:{bucket}",
        {"not_before": bucket * interval_seconds},
    )


# -- handlers ---------------------------------------------------------------------------------


@dataclass
class JobContext:
    """What a handler may use. ``services`` holds the seams a stage needs (store, fetcher…)."""

    owner: str
    services: dict[str, Any] = field(default_factory=dict)


Handler = Callable[[JobContext, Job], Awaitable[dict[str, Any] | None]]


@dataclass(frozen=True, slots=True)
class JobKind:
    """A contract bound to the handler that runs its jobs."""

    contract: Contract
    handler: Handler

    @property
    def name(self) -> str:
        return self.contract.name

    @property
    def lane(self) -> str:
        return self.contract.lane


class Registry:
    """The kinds this worker runs: each contract bound to its handler, once."""

    def __init__(self) -> None:
        self._kinds: dict[str, JobKind] = {}

    def bind(self, contract: Contract, handler: Handler) -> None:
        """Run ``contract``'s jobs with ``handler``. A kind of this module is bound with its
        own contract only (a second budget for it is refused); other names are test kinds."""
        known = CONTRACTS.get(contract.name)
        if known is not None and known != contract:
            raise ValueError(f"job kind {contract.name!r} bound with a budget not its own")
        if contract.name in self._kinds:
            raise ValueError(f"job kind {contract.name!r} registered twice")
        self._kinds[contract.name] = JobKind(contract, handler)

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
        priority: int | None = None,
        expires_at: datetime | None = None,
        max_attempts: int | None = None,
    ) -> JobSpec:
        """A job of a kind named at run time (``aivedio enqueue``, diagnostics), with its
        contract's budget unless ``max_attempts`` says otherwise."""
        spec = _spec(
            self._kinds[name].contract,
            idempotency_key,
            payload or {},
            tenant_id=tenant_id,
            priority=priority,
            expires_at=expires_at,
        )
        if max_attempts:
            return msgspec.structs.replace(spec, max_attempts=max_attempts)
        return spec
