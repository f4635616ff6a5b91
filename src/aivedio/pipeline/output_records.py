"""The provider output's records for the fetch stage: one row, its attempts, its events.

Every state change of the output goes through ``move`` (a CAS on state and version that
re-reads and retries when only the version moved, a concurrent URL refresh) and checks, in
the same transaction, that the job's lease is still the one this run holds: a run whose lease
was taken over cannot move the output (fencing). ``fetch_attempts`` keeps one row per
attempt for operators and the status timeline; ``outbox`` writes events for consumers
outside the system.
"""

from __future__ import annotations

import contextvars
import uuid
from datetime import UTC, datetime
from typing import Any, Protocol

import msgspec

from aivedio.config.ledger import LedgerConfig
from aivedio.errors import AivedioError, NotFoundError, StaleStateError
from aivedio.logs import get_logger
from aivedio.states import Entity
from aivedio.store import fetch_attempts, provider_outputs
from aivedio.store.database import Pool, acquired
from aivedio.store.ledger import record_compensation
from aivedio.store.outbox import emit
from aivedio.store.queue import Job, fenced, write_fenced
from aivedio.store.records import stale, transition, transition_part
from aivedio.store.together import Part

log = get_logger("aivedio.fetch")


class Digest(Protocol):
    """What an attempt records of the bytes it stored."""

    @property
    def bytes(self) -> int: ...

    @property
    def sha256(self) -> str: ...


class OutputRow(msgspec.Struct, kw_only=True):
    id: uuid.UUID
    tenant_id: int
    generation_task_id: uuid.UUID
    provider: str
    provider_task_id: str
    output_index: int
    source_url_ciphertext: bytes
    source_url_key_id: str
    source_url_expires_at: datetime | None
    expected_size_bytes: int | None
    expected_checksum: str | None
    content_type: str | None
    fetch_status: str
    version: int


# The job (and so the lease) the current task works for: every state change of the output
# checks, in its own transaction, that this lease is still the job's (fencing).
current_job: contextvars.ContextVar[Job | None] = contextvars.ContextVar(
    "aivedio_fetch_job", default=None
)


async def load(pool: Pool, output_id: uuid.UUID) -> OutputRow:
    row = await provider_outputs.load(pool, output_id)
    if row is None:
        raise NotFoundError(f"provider output {output_id} does not exist")
    return msgspec.convert(dict(row.items()), OutputRow)


async def move(
    pool: Pool, output: OutputRow, new: str, *, error: AivedioError | None = None
) -> OutputRow:
    """CAS the output to ``new``. A concurrent descriptor update (a callback with a fresh
    URL) bumps the version without changing the state: then re-read the row, taking its
    newer URL, and try again. A changed state is a real conflict: StaleStateError."""
    values: dict[str, Any] = {}
    if error is not None:
        values = {"last_error_class": error.error_class, "last_error_detail": error.detail}
    moved, _ = await _move_retrying(pool, output, new, values, {})
    return moved


async def start_fetching(pool: Pool, output: OutputRow, job: Job) -> tuple[OutputRow, int]:
    """FETCHING (as ``move``) and the attempt's row, in one statement: the moved output and
    the attempt's id."""
    # only when the move won (it reads the move's answer)
    attempt = fetch_attempts.begin_after_move_part(output.id, job.id, job.attempts)
    moved, answers = await _move_retrying(pool, output, "FETCHING", {}, {"attempt": attempt})
    return moved, int(answers["attempt"])


async def _move_retrying(
    pool: Pool, output: OutputRow, new: str, values: dict[str, Any], also: dict[str, Part]
) -> tuple[OutputRow, dict[str, Any]]:
    """``move``'s rule: a version moved by a descriptor update alone is read again and the
    move tried again (three times); a changed state raises StaleStateError."""
    for _ in range(3):
        try:
            answers = await _move_fenced(pool, output, new, values, also)
            version = int(answers["move"])
            return msgspec.structs.replace(output, fetch_status=new, version=version), answers
        except StaleStateError:
            fresh = await load(pool, output.id)
            if fresh.fetch_status != output.fetch_status:
                raise
            output = fresh
    raise StaleStateError(f"provider output {output.id} keeps changing; giving up")


async def _move_fenced(
    pool: Pool, output: OutputRow, new: str, values: dict[str, Any], also: dict[str, Part]
) -> dict[str, Any]:
    """The output's CAS to ``new`` in one statement fenced by the current job's lease, with
    ``also`` (parts that read ``move``, so they write only when it won); the answers, the
    new version under ``move``."""
    key = (output.id,)
    move = transition_part(
        Entity.PROVIDER_OUTPUT,
        key,
        expected=output.fetch_status,
        new=new,
        version=output.version,
        values=values,
    )
    async with acquired(pool) as conn:
        got = await write_fenced(
            conn, current_job.get(), {"move": move, **also}, "moving a provider output"
        )
    if got["move"] is None:
        raise stale(
            Entity.PROVIDER_OUTPUT,
            key,
            expected=output.fetch_status,
            new=new,
            version=output.version,
        )
    return got


async def mark_lost(
    pool: Pool, output: OutputRow, reason: str, *, ledger: LedgerConfig | None = None
) -> None:
    """OUTPUT_LOST, the ``output.lost`` event and the ledger's compensation (by the
    ``ledger`` policy; None: the default one), in one transaction."""
    async with acquired(pool) as conn, fenced(conn, current_job.get()):
        await transition(
            conn,
            Entity.PROVIDER_OUTPUT,
            (output.id,),
            expected=output.fetch_status,
            new="OUTPUT_LOST",
            version=output.version,
            values={"last_error_class": "output_lost", "last_error_detail": reason},
        )
        await emit(
            conn,
            "output.lost",
            tenant_id=output.tenant_id,
            aggregate_id=output.id,
            payload={
                "provider": output.provider,
                "provider_task_id": output.provider_task_id,
                "output_index": output.output_index,
                "provider_output_id": str(output.id),
                "reason": reason,
            },
        )
        await record_compensation(
            conn,
            cfg=ledger or LedgerConfig(),
            tenant_id=output.tenant_id,
            provider=output.provider,
            provider_task_id=output.provider_task_id,
            reason=f"output_lost: {reason}",
        )
    log.warning(
        "output_lost",
        provider_output_id=str(output.id),
        provider=output.provider,
        reason=reason,
    )


async def begin_attempt(pool: Pool, output: OutputRow, job: Job) -> int:
    return await fetch_attempts.begin(pool, output.id, job.id, job.attempts)


async def end_attempt(
    pool: Pool,
    attempt_id: int,
    outcome: str,
    error: AivedioError | None,
    result: Digest | None = None,
    key: str | None = None,
) -> None:
    await fetch_attempts.end(pool, end_attempt_part(attempt_id, outcome, error, result, key))


def end_attempt_part(
    attempt_id: int,
    outcome: str,
    error: AivedioError | None,
    result: Digest | None = None,
    key: str | None = None,
    *,
    when: str = "true",
) -> Part:
    """The statement of ``end_attempt``, for a caller that writes it with others (``when``:
    a condition on the statement's earlier parts)."""
    return fetch_attempts.end_part(
        attempt_id,
        outcome,
        error_class=error.error_class if error else None,
        error_detail=error.detail if error else None,
        http_status=error.http_status if error else None,
        size_bytes=result.bytes if result else None,
        sha256=result.sha256 if result else None,
        object_key=key,
        when=when,
    )


def expired(output: OutputRow) -> bool:
    return (
        output.source_url_expires_at is not None
        and output.source_url_expires_at <= datetime.now(UTC)
    )
