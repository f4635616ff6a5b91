"""Intake: a provider says SUCCEEDED; record it and enqueue the fetch, in one transaction.

Nothing is downloaded here: a callback must answer in milliseconds, so intake only records
the output and enqueues its fetch (the fetch job downloads). The same function serves
callbacks, the poller and ``aivedio ingest``, so all three record an output the same way:

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
from collections.abc import Callable
from contextlib import nullcontext
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

import msgspec

from aivedio.config.ledger import LedgerConfig
from aivedio.config.load import Config
from aivedio.crypto import UrlCipher
from aivedio.errors import ConfigError, NotFoundError, PolicyBlockedError, TransientError
from aivedio.pipeline import jobs
from aivedio.providers import check_open
from aivedio.providers.seam import (
    ProviderCaption,
    ProviderOutput,
    ProviderTask,
    check_output,
    check_reported,
)
from aivedio.states import TERMINAL_OUTPUT_STATES, Entity
from aivedio.store import generation_tasks, provider_outputs
from aivedio.store.callback_receipts import receipt_part
from aivedio.store.database import Connection, transaction
from aivedio.store.ledger import generation_charge_part, log_generation_charge
from aivedio.store.queue import JobSpec, Queue
from aivedio.store.records import transition
from aivedio.store.tenants import found_tenant
from aivedio.store.together import Part, write_together

FETCH_KIND = jobs.FETCH.name


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
    # Captions the adapter reported with the output (``providers/seam.py``).
    captions: list[ProviderCaption] = msgspec.field(default_factory=list)


class Recorded(msgspec.Struct, frozen=True, kw_only=True):
    generation_task_id: uuid.UUID
    provider_output_id: uuid.UUID
    fetch_job_id: int
    output_created: bool
    job_created: bool
    fetch_status: str


async def record_provider_output(
    conn: Connection,
    *,
    queue: Queue,
    cipher: UrlCipher,
    tenant_id: int,
    descriptor: OutputDescriptor,
    pipeline_version: int = 1,
    default_ttl_seconds: float = 3600.0,
    estimated_bytes_per_second: float = 20 * 1024**2,
    now: datetime | None = None,
    ledger: LedgerConfig | None = None,
    task_known: bool = True,
) -> Recorded:
    """Record one provider output and enqueue its fetch. Runs in one transaction.

    The provider's generation charge is recorded in it too, once per provider task (the
    ledger's key makes a duplicate callback or a re-ingest a no-op); ``ledger`` None means
    the default [ledger] policies. ``task_known`` False: the caller found no row of the
    task, so the task, its charge, the output and its fetch job are first tried as one
    statement of inserts (a task that appeared meanwhile makes it write nothing, and the
    general path follows)."""
    now = now or datetime.now(UTC)
    check_descriptor(descriptor, now)
    expires_at = descriptor.expires_at or now + timedelta(seconds=default_ttl_seconds)
    ledger = ledger or LedgerConfig()

    def fetch_spec(output_id: uuid.UUID) -> JobSpec:
        return jobs.fetch_spec(
            output_id,
            tenant_id,
            pipeline_version,
            expires_at=expires_at,
            estimated_seconds=(descriptor.size or 0) / estimated_bytes_per_second,
        )

    # The caller's transaction when there is one (a savepoint would cost two round trips
    # and no caller goes on after a failure), else one of its own.
    own = nullcontext() if conn.is_in_transaction() else transaction(conn)
    async with own:
        if not task_known:
            new = await _record_new_task(
                conn, queue, cipher, tenant_id, descriptor, expires_at, ledger, fetch_spec
            )
            if new is not None:
                return new
        task_id = await _succeed_task(conn, tenant_id, descriptor)
        charge = generation_charge_part(
            ledger,
            tenant_id=tenant_id,
            provider=descriptor.provider,
            provider_task_id=descriptor.provider_task_id,
            generation_task_id=task_id,
        )
        output_id, created, status, url_changed = await _upsert_output(
            conn, tenant_id, task_id, descriptor, expires_at, cipher, charge
        )
        enqueued = await queue.enqueue_one(conn, fetch_spec(output_id))
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


def check_descriptor(d: OutputDescriptor, now: datetime) -> None:
    """A descriptor from outside (a callback, a poll, ``aivedio ingest``) held to what the
    store takes (``providers.check_reported``): MalformedInputError naming the field."""
    output = ProviderOutput(
        index=d.output_index,
        url=d.url,
        expires_at=d.expires_at,
        sha256=d.sha256,
        size=d.size,
        content_type=d.content_type,
    )
    check_reported(d.provider_task_id, None)
    check_output(output, f"outputs[{d.output_index}]", now=now)


async def _record_new_task(
    conn: Connection,
    queue: Queue,
    cipher: UrlCipher,
    tenant_id: int,
    d: OutputDescriptor,
    expires_at: datetime,
    ledger: LedgerConfig,
    fetch_spec: Callable[[uuid.UUID], JobSpec],
) -> Recorded | None:
    """The task SUCCEEDED, its generation charge, the output and its fetch job: one
    statement, every part of it written only when the task's insert was (None: the task
    exists, nothing was written)."""
    task_id, output_id = uuid.uuid4(), uuid.uuid4()
    inserted = provider_outputs.after("task")
    charge = generation_charge_part(
        ledger,
        tenant_id=tenant_id,
        provider=d.provider,
        provider_task_id=d.provider_task_id,
        generation_task_id=task_id,
        when=inserted,
    )
    fetch = queue.enqueuing(
        [fetch_spec(output_id)], name="fetch", when=provider_outputs.after("output")
    )
    assert fetch is not None
    got = await write_together(
        conn,
        {
            "task": generation_tasks.new_succeeded_task_part(
                task_id, tenant_id, d.provider, d.provider_task_id
            ),
            "charge": charge,
            "output": _output_part(output_id, tenant_id, task_id, d, expires_at, cipher, inserted),
            **fetch.parts,
        },
        "recording the provider output",
    )
    made = fetch.made(got).get(fetch.keys[0])
    if got["task"] is None:
        return None
    if got["output"] is None or made is None:  # a new task's output and job are new too
        raise TransientError(f"provider output of new task {d.provider_task_id} was not made")
    if got["charge"]:
        log_generation_charge(charge)
    job_id, _lane = made
    return Recorded(
        generation_task_id=task_id,
        provider_output_id=output_id,
        fetch_job_id=job_id,
        output_created=True,
        job_created=True,
        fetch_status="FETCH_PENDING",
    )


async def _succeed_task(conn: Connection, tenant_id: int, d: OutputDescriptor) -> uuid.UUID:
    doing = "recording the generation task"
    inserted = await generation_tasks.insert_succeeded_task(
        conn, uuid.uuid4(), tenant_id, d.provider, d.provider_task_id, doing=doing
    )
    if inserted is not None:
        return uuid.UUID(str(inserted))
    row = await generation_tasks.lock_task_by_provider_id(
        conn, d.provider, d.provider_task_id, doing=doing
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
    # Insert first: a new output (the common case) costs one round trip, shared with the
    # charge; a duplicate finds the row by its key, locked, below.
    output_id = uuid.uuid4()
    insert = _output_part(output_id, tenant_id, task_id, d, expires_at, cipher, "true")
    got = await write_together(
        conn, {"charge": charge, "output": insert}, "recording the provider output"
    )
    if got["charge"]:
        log_generation_charge(charge)
    if got["output"] is not None:
        return output_id, True, "FETCH_PENDING", False
    row = await provider_outputs.lock_by_key(conn, *key)
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
        await provider_outputs.take_newer_url(
            conn, output_id, blob, key_id, expires_at, row["version"]
        )
        return output_id, False, status, True
    return output_id, False, status, False


def _output_part(
    output_id: uuid.UUID,
    tenant_id: int,
    task_id: uuid.UUID,
    d: OutputDescriptor,
    expires_at: datetime,
    cipher: UrlCipher,
    when: str,
) -> Part:
    """The output's insert (FETCH_PENDING, its URL encrypted and bound to its id), when
    ``when`` holds; answers the id, or None when the output's key exists."""
    blob, key_id = cipher.encrypt(d.url, bound_to=str(output_id))
    return provider_outputs.insert_part(
        output_id,
        tenant_id,
        task_id,
        d.provider,
        d.provider_task_id,
        d.output_index,
        d.output_revision,
        blob,
        key_id,
        expires_at,
        d.size,
        d.sha256.lower() if d.sha256 else None,
        d.content_type,
        when,
        captions=[msgspec.to_builtins(c) for c in d.captions] or None,
    )


def _decrypts_to(cipher: UrlCipher, row: Any, url: str) -> bool:
    """Whether the stored URL is this one (a duplicate callback changes nothing)."""
    try:
        stored = cipher.decrypt(
            row["source_url_ciphertext"], row["source_url_key_id"], bound_to=str(row["id"])
        )
    except ConfigError:
        return False
    return hmac.compare_digest(stored.encode(), url.encode())


class Received(NamedTuple):
    """A callback taken in: whether its event id was new (``fresh``; True when it had none)
    and whose task it names (``task_tenant``)."""

    fresh: bool
    tenant_id: int | None
    known: bool


async def receive(
    conn: Connection, config: Config, provider: str, provider_task_id: str, event_id: str | None
) -> Received:
    """The event id recorded (``callbacks.receipt_part``) and the task's tenant looked up,
    in one round trip."""
    pc = config.providers.get(provider)
    named = pc.tenant if pc is not None and pc.tenant else None
    parts = {
        "known": generation_tasks.task_tenant_part(provider, provider_task_id),
        "named": generation_tasks.tenant_named_part(named),
    }
    if event_id is not None:
        parts["receipt"] = receipt_part(provider, event_id)
    got = await write_together(conn, parts, "recording a callback")
    fresh = event_id is None or bool(got["receipt"])
    if got["known"] is not None:
        return Received(fresh, int(got["known"]), True)
    if named is None:
        return Received(fresh, None, False)
    return Received(fresh, found_tenant(named, got["named"]), False)


async def task_tenant(
    conn: Connection, config: Config, provider: str, provider_task_id: str
) -> tuple[int | None, bool]:
    """Whose task a callback names, and whether we knew it: a known task keeps its tenant; a
    task we never saw belongs to ``[providers.NAME] tenant`` (one provider account per
    tenant), or to nobody (None) when that is unset."""
    received = await receive(conn, config, provider, provider_task_id, None)
    return received.tenant_id, received.known


async def tenant_exists(conn: Connection, tenant_id: int) -> bool:
    return await generation_tasks.tenant_exists(conn, tenant_id)


async def record_task_outputs(
    conn: Connection,
    *,
    queue: Queue,
    cipher: UrlCipher,
    config: Config,
    provider: str,
    task: ProviderTask,
    tenant_id: int,
    task_known: bool = True,
) -> list[Recorded]:
    """A SUCCEEDED task's outputs, each recorded as above, in the caller's transaction: the
    one way a verified callback and the poller record a provider's success. ``task_known``
    False: the caller found no row of the task (``task_known`` of ``receive``)."""
    pc = config.providers.get(provider)
    if pc is not None:
        check_open(provider, pc)  # a vendor whose API is gone sends nothing we may take
    check_reported(task.provider_task_id, task.outputs)
    recorded: list[Recorded] = []
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
            captions=output.captions,
        )
        recorded.append(
            await record_provider_output(
                conn,
                queue=queue,
                cipher=cipher,
                tenant_id=tenant_id,
                descriptor=descriptor,
                pipeline_version=config.fetch.pipeline_version,
                default_ttl_seconds=pc.default_url_ttl_seconds if pc else 3600.0,
                estimated_bytes_per_second=config.fetch.estimated_bytes_per_second,
                ledger=config.ledger,
                task_known=task_known or bool(recorded),
            )
        )
    return recorded
