"""Intake: a provider says SUCCEEDED; record it and enqueue the fetch, in one transaction.

Nothing is downloaded here (seed §11.7.1): a callback must answer in milliseconds. The same
function serves callbacks, the poller and ``aivedio ingest``, so all three record an output
the same way:

1. the generation task moves to PROVIDER_SUCCEEDED (created if we never saw it);
2. the output descriptor is upserted on ``(provider, provider_task_id, output_index,
   output_revision)``; its URL is encrypted, bound to the output's id; a later descriptor for
   an output not yet stored replaces the URL (a refresh by callback), never the identity;
3. the fetch job is enqueued with the key ``fetch:{output_id}:v{pipeline_version}`` and the
   URL's expiry as its deadline, so duplicates of all three steps are no-ops.
"""

from __future__ import annotations

import hmac
import uuid
from contextlib import nullcontext
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec

from aivedio.config import Config
from aivedio.crypto import UrlCipher
from aivedio.errors import ConfigError, NotFoundError, PolicyBlockedError
from aivedio.ledger_config import LedgerConfig
from aivedio.pipeline.providers import ProviderTask
from aivedio.pipeline.registry import Registry
from aivedio.states import TERMINAL_OUTPUT_STATES, Entity
from aivedio.store.database import Connection, map_db_errors
from aivedio.store.ledger import generation_charge_part, log_generation_charge
from aivedio.store.queue import Queue
from aivedio.store.records import transition
from aivedio.store.tenants import found_tenant
from aivedio.store.together import Part, write_together

FETCH_KIND = "fetch"


class OutputDescriptor(msgspec.Struct, frozen=True, kw_only=True):
    provider: str
    provider_task_id: str
    output_index: int = 0
    output_revision: int = 1
    url: str
    expires_at: datetime | None = None
    sha256: str | None = None
    size: int | None = None
    content_type: str | None = None


class Recorded(msgspec.Struct, frozen=True, kw_only=True):
    generation_task_id: uuid.UUID
    provider_output_id: uuid.UUID
    fetch_job_id: int
    output_created: bool
    job_created: bool
    fetch_status: str


def fetch_job_key(provider_output_id: uuid.UUID, pipeline_version: int) -> str:
    return f"fetch:{provider_output_id}:v{pipeline_version}"


async def record_provider_output(
    conn: Connection,
    *,
    queue: Queue,
    registry: Registry,
    cipher: UrlCipher,
    tenant_id: int,
    descriptor: OutputDescriptor,
    pipeline_version: int = 1,
    default_ttl_seconds: float = 3600.0,
    estimated_bytes_per_second: float = 20 * 1024**2,
    now: datetime | None = None,
    ledger: LedgerConfig | None = None,
) -> Recorded:
    """Record one provider output and enqueue its fetch. Runs in one transaction.

    The provider's generation charge is recorded in it too, once per provider task (the
    ledger's key makes a duplicate callback or a re-ingest a no-op); ``ledger`` None means
    the default [ledger] policies."""
    now = now or datetime.now(UTC)
    expires_at = descriptor.expires_at or now + timedelta(seconds=default_ttl_seconds)
    if descriptor.sha256 is not None and len(descriptor.sha256) != 64:
        raise PolicyBlockedError("invalid_descriptor: sha256 must be 64 hex characters")
    # The caller's transaction when there is one (a savepoint would cost two round trips
    # and no caller goes on after a failure), else one of its own.
    own = nullcontext() if conn.is_in_transaction() else conn.transaction()
    async with own:
        task_id = await _succeed_task(conn, tenant_id, descriptor)
        charge = generation_charge_part(
            ledger or LedgerConfig(),
            tenant_id=tenant_id,
            provider=descriptor.provider,
            provider_task_id=descriptor.provider_task_id,
            generation_task_id=task_id,
        )
        output_id, created, status, url_changed = await _upsert_output(
            conn, tenant_id, task_id, descriptor, expires_at, cipher, charge
        )
        estimated = (descriptor.size or 0) / estimated_bytes_per_second
        spec = registry.spec(
            FETCH_KIND,
            fetch_job_key(output_id, pipeline_version),
            tenant_id=tenant_id,
            payload={"provider_output_id": str(output_id)},
            expires_at=expires_at,
        )
        spec = msgspec.structs.replace(
            spec, estimated_seconds=max(spec.estimated_seconds, estimated)
        )
        enqueued = await queue.enqueue_one(conn, spec)
        if url_changed and not enqueued.created:
            # A fresh URL for an output whose fetch job already gave up (or waits to retry):
            # bring the job back now, with a fresh budget, rather than leave the URL unused.
            await queue.replay_in(conn, enqueued.job_id)
    return Recorded(
        generation_task_id=task_id,
        provider_output_id=output_id,
        fetch_job_id=enqueued.job_id,
        output_created=created,
        job_created=enqueued.created,
        fetch_status=status,
    )


async def _succeed_task(conn: Connection, tenant_id: int, d: OutputDescriptor) -> uuid.UUID:
    with map_db_errors("recording the generation task"):
        inserted = await conn.fetchval(
            "INSERT INTO generation_tasks (id, tenant_id, provider, provider_task_id,"
            " provider_status) VALUES ($1, $2, $3, $4, 'PROVIDER_SUCCEEDED')"
            " ON CONFLICT (provider, provider_task_id) DO NOTHING RETURNING id",
            uuid.uuid4(),
            tenant_id,
            d.provider,
            d.provider_task_id,
        )
        if inserted is not None:
            return uuid.UUID(str(inserted))
        row = await conn.fetchrow(
            "SELECT id, tenant_id, provider_status, version FROM generation_tasks"
            " WHERE provider = $1 AND provider_task_id = $2 FOR UPDATE",
            d.provider,
            d.provider_task_id,
        )
    assert row is not None
    if row["tenant_id"] != tenant_id:
        raise PolicyBlockedError(
            f"tenant_mismatch: task {d.provider}/{d.provider_task_id} belongs to another tenant"
        )
    if row["provider_status"] in ("SUBMITTED", "PROVIDER_RUNNING"):
        await transition(
            conn,
            Entity.GENERATION_TASK,
            (row["id"],),
            expected=row["provider_status"],
            new="PROVIDER_SUCCEEDED",
            version=row["version"],
        )
    return uuid.UUID(str(row["id"]))


async def _upsert_output(
    conn: Connection,
    tenant_id: int,
    task_id: uuid.UUID,
    d: OutputDescriptor,
    expires_at: datetime,
    cipher: UrlCipher,
    charge: Part,
) -> tuple[uuid.UUID, bool, str, bool]:
    """The output's row, inserted or found (and its URL taken when newer), with the task's
    generation charge written in the same statement as the insert."""
    key = (d.provider, d.provider_task_id, d.output_index, d.output_revision)
    select = (
        "SELECT id, fetch_status, version, source_url_expires_at, source_url_ciphertext,"
        " source_url_key_id FROM provider_outputs"
        " WHERE provider = $1 AND provider_task_id = $2 AND output_index = $3"
        " AND output_revision = $4 FOR UPDATE"
    )
    # Insert first: a new output (the common case) costs one round trip, shared with the
    # charge; a duplicate finds the row by its key, locked, below.
    output_id = uuid.uuid4()
    blob, key_id = cipher.encrypt(d.url, bound_to=str(output_id))
    insert = Part(
        "INSERT INTO provider_outputs (id, tenant_id, generation_task_id, provider,"
        " provider_task_id, output_index, output_revision, source_url_ciphertext,"
        " source_url_key_id, source_url_expires_at, expected_size_bytes,"
        " expected_checksum_alg, expected_checksum, content_type, fetch_status)"
        " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14,"
        " 'FETCH_PENDING') ON CONFLICT DO NOTHING RETURNING id",
        (output_id, tenant_id, task_id, *key, blob, key_id, expires_at, d.size,
         "sha256" if d.sha256 else None, d.sha256.lower() if d.sha256 else None,
         d.content_type),
        value="id",
    )  # fmt: skip
    got = await write_together(
        conn, {"charge": charge, "output": insert}, "recording the provider output"
    )
    if got["charge"]:
        log_generation_charge(charge)
    if got["output"] is not None:
        return output_id, True, "FETCH_PENDING", False
    with map_db_errors("recording the provider output"):
        row = await conn.fetchrow(select, *key)
    if row is None:
        raise NotFoundError("provider output vanished during intake")
    output_id = uuid.UUID(str(row["id"]))
    status = row["fetch_status"]
    same_url = _decrypts_to(cipher, row, d.url)
    # Not while a fetch or a refresh holds the row: they would lose their CAS to us.
    busy = status in ("FETCHING", "NEED_URL_REFRESH")
    if status not in TERMINAL_OUTPUT_STATES and not busy and not same_url:
        # A newer descriptor for an output not yet stored: keep the identity, take the URL.
        blob, key_id = cipher.encrypt(d.url, bound_to=str(output_id))
        with map_db_errors("refreshing the provider output's URL"):
            await conn.execute(
                "UPDATE provider_outputs SET source_url_ciphertext = $2, source_url_key_id = $3,"
                " source_url_expires_at = $4, descriptor_version = descriptor_version + 1,"
                " version = version + 1, updated_at = now() WHERE id = $1 AND version = $5",
                output_id,
                blob,
                key_id,
                expires_at,
                row["version"],
            )
        return output_id, False, status, True
    return output_id, False, status, False


def _decrypts_to(cipher: UrlCipher, row: Any, url: str) -> bool:
    """Whether the stored URL is this one (a duplicate callback changes nothing)."""
    try:
        stored = cipher.decrypt(
            row["source_url_ciphertext"], row["source_url_key_id"], bound_to=str(row["id"])
        )
    except ConfigError:
        return False
    return hmac.compare_digest(stored.encode(), url.encode())


async def task_tenant(
    conn: Connection, config: Config, provider: str, provider_task_id: str
) -> tuple[int | None, bool]:
    """Whose task a callback names, and whether we knew it: a known task keeps its tenant; a
    task we never saw belongs to ``[providers.NAME] tenant`` (one provider account per
    tenant), or to nobody (None) when that is unset."""
    pc = config.providers.get(provider)
    named = pc.tenant if pc is not None and pc.tenant else None
    with map_db_errors("looking up the generation task"):
        row = await conn.fetchrow(  # both lookups in one round trip
            "SELECT (SELECT tenant_id FROM generation_tasks"
            "  WHERE provider = $1 AND provider_task_id = $2) AS known,"
            " (SELECT id FROM tenants WHERE name = $3) AS named",
            provider,
            provider_task_id,
            named,
        )
    assert row is not None
    if row["known"] is not None:
        return int(row["known"]), True
    if named is None:
        return None, False
    return found_tenant(named, row["named"]), False


async def tenant_exists(conn: Connection, tenant_id: int) -> bool:
    with map_db_errors("looking up a tenant"):
        return bool(await conn.fetchval("SELECT 1 FROM tenants WHERE id = $1", tenant_id))


async def record_task_outputs(
    conn: Connection,
    *,
    queue: Queue,
    registry: Registry,
    cipher: UrlCipher,
    config: Config,
    provider: str,
    task: ProviderTask,
    tenant_id: int,
) -> list[Recorded]:
    """A SUCCEEDED task's outputs, each recorded as above, in the caller's transaction: the
    one way a verified callback and the poller record a provider's success."""
    pc = config.providers.get(provider)
    recorded = []
    for output in task.outputs:
        descriptor = OutputDescriptor(
            provider=provider,
            provider_task_id=task.provider_task_id,
            output_index=output.index,
            url=output.url,
            expires_at=output.expires_at,
            sha256=output.sha256.lower() if output.sha256 else None,
            size=output.size,
            content_type=output.content_type,
        )
        recorded.append(
            await record_provider_output(
                conn,
                queue=queue,
                registry=registry,
                cipher=cipher,
                tenant_id=tenant_id,
                descriptor=descriptor,
                pipeline_version=config.fetch.pipeline_version,
                default_ttl_seconds=pc.default_url_ttl_seconds if pc else 3600.0,
                estimated_bytes_per_second=config.fetch.estimated_bytes_per_second,
                ledger=config.ledger,
            )
        )
    return recorded
