"""The job contract: one budget per kind, every builder keeps to it, a kind is bound once."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from aivedio.pipeline import jobs
from aivedio.pipeline.jobs import Contract, JobContext, Registry
from aivedio.store.queue import Job, JobSpec
from aivedio.worker.kinds import default_registry

ASSET = uuid.UUID("00000000-0000-4000-8000-000000000001")
NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)


def _every_builder() -> list[JobSpec]:
    return [
        jobs.fetch_spec(ASSET, 7, 1, expires_at=NOW + timedelta(hours=1), estimated_seconds=3.0),
        jobs.poll_spec(ASSET, 7, 2),
        jobs.probe_spec(ASSET, 7),
        jobs.reprocess_spec(ASSET, 7, 3),
        jobs.render_spec(ASSET, 7, 1, "playback", pipeline_version=1, required=True, timeout=90),
        jobs.chunk_spec(jobs.CHUNK_ENCODE, ASSET, 7, 1, "video:0:0", pipeline_version=1, timeout=9),
        jobs.moderate_spec(ASSET, 1, 7),
        jobs.publish_spec(ASSET, 1, 7),
        jobs.publish_spec(ASSET, 1, 7, enrich=True),
        jobs.sweep_spec(NOW, 60.0, following=False),
    ]


def test_every_builder_keeps_its_kinds_lane_and_attempts() -> None:
    for spec in _every_builder():
        contract = jobs.CONTRACTS[spec.kind]
        assert (spec.lane, spec.max_attempts) == (contract.lane, contract.max_attempts), spec
    sized = {"render", "chunk_encode"}  # deadlines sized by the media, given by the caller
    for spec in _every_builder():
        if spec.kind not in sized:
            assert spec.timeout_seconds == jobs.CONTRACTS[spec.kind].timeout_seconds, spec


def test_the_budgets_are_todays() -> None:
    """The figures the stages registered before the contract existed, unchanged."""
    budget = {
        c.name: (c.lane, c.timeout_seconds, c.max_attempts, c.priority)
        for c in jobs.CONTRACTS.values()
    }
    assert budget["fetch"] == ("fetch", 4 * 3600, 8, 0)
    assert budget["provider.poll"] == ("control", 120, 8, 0)
    assert budget["probe"] == ("media", 4 * 3600, 4, 0)
    assert budget["reprocess"] == ("media", 900, 4, 0)
    assert budget["render"] == ("media", 3 * 3600, 4, 0)
    assert budget["moderate"] == ("control", 600, 8, 20)
    assert budget["publish"] == ("control", 300, 8, 30)
    assert budget["sweep"] == ("control", 3600, 3, 0)
    for step in ("chunk_split", "chunk_encode", "chunk_assemble"):
        assert budget[step] == ("media", 3 * 3600, 4, 5)


def test_keys_make_a_step_once_per_version() -> None:
    assert jobs.probe_spec(ASSET, 7).idempotency_key == f"probe:{ASSET}:v{jobs.PROBE_VERSION}"
    assert jobs.publish_spec(ASSET, 2, 7, enrich=True).idempotency_key == f"enrich:{ASSET}:2"
    one, two = jobs.reprocess_spec(ASSET, 7, 3), jobs.reprocess_spec(ASSET, 7, 3)
    assert one.idempotency_key != two.idempotency_key  # a fresh request is a fresh reprocess
    optional = jobs.render_spec(
        ASSET, 7, 1, "sprites", pipeline_version=1, required=False, timeout=1
    )
    assert (
        optional.priority,
        jobs.render_spec(
            ASSET, 7, 1, "playback", pipeline_version=1, required=True, timeout=1
        ).priority,
    ) == (0, 10)
    fetch = jobs.fetch_spec(ASSET, 7, 1, expires_at=NOW, estimated_seconds=-1.0)
    assert fetch.estimated_seconds == 0.0 and fetch.expires_at == NOW


def test_a_chunk_spec_is_only_for_chunk_steps() -> None:
    with pytest.raises(ValueError, match="not a step"):
        jobs.chunk_spec(jobs.RENDER, ASSET, 7, 1, "x", pipeline_version=1, timeout=1)


async def _handler(_ctx: JobContext, _job: Job) -> dict[str, Any] | None:
    return None


def test_a_kind_is_bound_once_and_only_with_its_own_budget() -> None:
    registry = Registry()
    registry.bind(jobs.PUBLISH, _handler)
    with pytest.raises(ValueError, match="twice"):
        registry.bind(jobs.PUBLISH, _handler)
    with pytest.raises(ValueError, match="not its own"):
        Registry().bind(Contract("publish", "control", 1.0, 99), _handler)


def test_the_default_registry_binds_every_contract() -> None:
    registry = default_registry()
    assert {k.name for k in registry} == set(jobs.CONTRACTS)
    assert all(k.contract is jobs.CONTRACTS[k.name] for k in registry)
    spec = registry.spec("diag.noop", "k", max_attempts=2)
    assert (spec.lane, spec.timeout_seconds, spec.max_attempts) == ("control", 60.0, 2)
