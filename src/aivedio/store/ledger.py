"""The ledger: money facts appended in the transaction of the state change that justifies them.

Seed 002 §11.9.5 and follow-up question 10: technical state and money are separate records.
The provider's success may already have cost real money, so its generation charge is kept
even when the platform later loses the output; the loss then adds a compensation row and
never edits or deletes the charge. Three rules make that hold under retries and races:

* **One row per fact.** Each entry has a key naming the fact (``generation:{provider}:
  {provider_task_id}``, ``processing:{asset_id}:{revision}``, ``compensation:{provider}:
  {provider_task_id}``) and is written with ``ON CONFLICT (entry_key) DO NOTHING``. A
  duplicate callback, a re-ingest, a retried job or twenty concurrent writers leave exactly
  one row, decided by the unique index rather than by a read-then-write race.
* **Same transaction.** Every writer takes the caller's connection, inside the caller's
  transaction: the charge commits with PROVIDER_SUCCEEDED, the compensation with
  OUTPUT_LOST (or the publish code's failure), or neither does.
* **Append-only in the database.** A statement trigger refuses UPDATE, DELETE and TRUNCATE
  (``0002_ledger.sql``); a correction is a new row.

Amounts are integers in millionths of the currency (micros), from the tenant's side:
positive is owed by the tenant, negative is credited back. A compensation under
``refund_generation`` is minus the generation charge of its task, in that charge's currency,
read in the same transaction; when no charge exists (a task recorded before the ledger)
nothing is written. A charge of 0 (an unpriced provider) is still refunded with a 0 row, so
the loss itself stays on record.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

import msgspec

from aivedio.config.ledger import LedgerConfig
from aivedio.errors import PolicyBlockedError
from aivedio.logs import get_logger
from aivedio.store.database import Connection, Pool, map_db_errors
from aivedio.store.together import Part

log = get_logger("aivedio.ledger")

GENERATION_CHARGE = "generation_charge"
PROCESSING_CHARGE = "processing_charge"
COMPENSATION = "compensation"

# -- named statements ---------------------------------------------------------------------
# ``detail`` goes in as text cast to jsonb, so it is stored the same whether or not the
# connection has the jsonb codec installed.

# ``{when}``: a condition on earlier parts of the statement it is written in, or true.
INSERT_GENERATION_CHARGE = (
    "INSERT INTO ledger_entries (entry_key, tenant_id, kind, provider, provider_task_id,"
    " generation_task_id, amount_micros, currency, policy, detail)"
    " SELECT $1::text, $2::bigint, 'generation_charge', $3::text, $4::text, $5::uuid,"
    " $6::bigint, $7::text, $8::text, $9::text::jsonb WHERE {when}"
    " ON CONFLICT (entry_key) DO NOTHING RETURNING id"
)

# The asset's provider task, when it has one, so that ``--task`` shows the whole story.
INSERT_PROCESSING_CHARGE = (
    "INSERT INTO ledger_entries (entry_key, tenant_id, kind, provider, provider_task_id,"
    " generation_task_id, asset_id, revision, amount_micros, currency, policy, detail)"
    " SELECT $1::text, $2::bigint, 'processing_charge', o.provider, o.provider_task_id,"
    " o.generation_task_id, $3::uuid, $4::integer, $5::bigint, $6::text, $7::text,"
    " $8::text::jsonb"
    " FROM (SELECT 1) AS one"
    " LEFT JOIN assets a ON a.id = $3::uuid"
    " LEFT JOIN provider_outputs o ON o.id = a.source_provider_output_id"
    " ON CONFLICT (entry_key) DO NOTHING RETURNING id"
)

SELECT_ENTRY_BY_KEY = (
    "SELECT id, tenant_id, generation_task_id, amount_micros, currency"
    " FROM ledger_entries WHERE entry_key = $1"
)

INSERT_COMPENSATION = (
    "INSERT INTO ledger_entries (entry_key, tenant_id, kind, provider, provider_task_id,"
    " generation_task_id, asset_id, amount_micros, currency, policy, detail)"
    " VALUES ($1, $2, 'compensation', $3, $4, $5, $6, $7, $8, $9, $10::text::jsonb)"
    " ON CONFLICT (entry_key) DO NOTHING RETURNING id"
)

ENTRY_COLUMNS = (
    "id, entry_key, tenant_id, kind, provider, provider_task_id, generation_task_id,"
    " asset_id, revision, amount_micros, currency, policy, detail, created_at"
)

# Separate statements by what leads the index, so that a prepared (generic) plan still uses
# it; ``coalesce(…, '-infinity')`` keeps the optional ``since`` indexable too.
SELECT_TASK_ENTRIES = (
    f"SELECT {ENTRY_COLUMNS} FROM ledger_entries WHERE provider_task_id = $1"
    " AND ($2::text IS NULL OR provider = $2) AND ($3::bigint IS NULL OR tenant_id = $3)"
    " AND created_at >= coalesce($4::timestamptz, '-infinity') ORDER BY created_at, id"
)

SELECT_TENANT_ENTRIES = (
    f"SELECT {ENTRY_COLUMNS} FROM ledger_entries WHERE tenant_id = $1"
    " AND created_at >= coalesce($2::timestamptz, '-infinity') ORDER BY created_at, id"
)

SELECT_ALL_ENTRIES = (
    f"SELECT {ENTRY_COLUMNS} FROM ledger_entries"
    " WHERE created_at >= coalesce($1::timestamptz, '-infinity') ORDER BY created_at, id"
)

SELECT_BALANCE = (
    "SELECT currency,"
    " coalesce(sum(amount_micros) FILTER (WHERE kind <> 'compensation'), 0) AS charges_micros,"
    " coalesce(sum(amount_micros) FILTER (WHERE kind = 'compensation'), 0)"
    " AS compensation_micros,"
    " count(*) AS entries"
    " FROM ledger_entries WHERE tenant_id = $1"
    " AND created_at >= coalesce($2::timestamptz, '-infinity')"
    " GROUP BY currency ORDER BY currency"
)


# -- records --------------------------------------------------------------------------------


class LedgerEntry(msgspec.Struct, frozen=True, kw_only=True):
    id: int
    entry_key: str
    tenant_id: int
    kind: str
    provider: str | None
    provider_task_id: str | None
    generation_task_id: uuid.UUID | None
    asset_id: uuid.UUID | None
    revision: int | None
    amount_micros: int
    currency: str
    policy: str
    detail: dict[str, Any]
    created_at: datetime


class Total(msgspec.Struct, frozen=True, kw_only=True):
    """One currency's sums: charges (>= 0), compensation (usually <= 0) and what is owed."""

    currency: str
    charges_micros: int
    compensation_micros: int
    entries: int

    @property
    def net_micros(self) -> int:
        return self.charges_micros + self.compensation_micros


# -- keys and prices (pure) -----------------------------------------------------------------


def generation_key(provider: str, provider_task_id: str) -> str:
    return f"generation:{provider}:{provider_task_id}"


def processing_key(asset_id: uuid.UUID, revision: int) -> str:
    return f"processing:{asset_id}:{revision}"


def compensation_key(provider: str, provider_task_id: str) -> str:
    return f"compensation:{provider}:{provider_task_id}"


def _micros(rate_micros: int, seconds: float) -> int:
    """``rate * seconds``, rounded half up to a whole micro (exact decimal, not float)."""
    product = Decimal(rate_micros) * Decimal(str(seconds))
    return int(product.quantize(Decimal(1), rounding=ROUND_HALF_UP))


def generation_price(
    cfg: LedgerConfig, provider: str, duration_seconds: float | None
) -> tuple[int, str, dict[str, Any]]:
    """The amount, the policy that produced it and its inputs, for one provider task.

    Policies: ``per_task``, ``per_second``, ``per_task+per_second``, ``unpriced`` (no price
    configured: amount 0). A per-second price with no known duration adds nothing and says
    so: ``per_second_unmetered`` (the rate stays in the detail for reconciliation).
    """
    per_task = cfg.generation_micros_per_task.get(provider)
    per_second = cfg.generation_micros_per_second.get(provider)
    if per_task is None and per_second is None:
        return 0, "unpriced", {}
    amount, parts = 0, []
    detail: dict[str, Any] = {}
    if per_task is not None:
        amount += per_task
        parts.append("per_task")
        detail["micros_per_task"] = per_task
    if per_second is not None:
        detail["micros_per_second"] = per_second
        detail["duration_seconds"] = duration_seconds
        if duration_seconds is None:
            parts.append("per_second_unmetered")
        else:
            amount += _micros(per_second, duration_seconds)
            parts.append("per_second")
    return amount, "+".join(parts), detail


def summarize(entries: Iterable[LedgerEntry]) -> list[Total]:
    """Per-currency totals of some entries, in currency order."""
    sums: dict[str, list[int]] = {}  # currency -> [charges, compensation, count]
    for entry in entries:
        acc = sums.setdefault(entry.currency, [0, 0, 0])
        acc[1 if entry.kind == COMPENSATION else 0] += entry.amount_micros
        acc[2] += 1
    return [
        Total(currency=c, charges_micros=s[0], compensation_micros=s[1], entries=s[2])
        for c, s in sorted(sums.items())
    ]


def _json(detail: Mapping[str, Any]) -> str:
    return msgspec.json.encode(detail).decode()


# -- writers (the caller's connection and transaction) --------------------------------------


async def record_generation_charge(
    conn: Connection,
    *,
    cfg: LedgerConfig,
    tenant_id: int,
    provider: str,
    provider_task_id: str,
    generation_task_id: uuid.UUID,
    duration_seconds: float | None = None,
) -> bool:
    """The provider's charge for one task, once whatever the retries; True if written now."""
    part = generation_charge_part(
        cfg,
        tenant_id=tenant_id,
        provider=provider,
        provider_task_id=provider_task_id,
        generation_task_id=generation_task_id,
        duration_seconds=duration_seconds,
    )
    return await _write_charge(conn, part, "recording a generation charge", log_generation_charge)


def generation_charge_part(
    cfg: LedgerConfig,
    *,
    tenant_id: int,
    provider: str,
    provider_task_id: str,
    generation_task_id: uuid.UUID,
    duration_seconds: float | None = None,
    when: str = "true",
) -> Part:
    """The statement of the generation charge, for a caller that writes it together with
    others (``when``: a condition on the statement's earlier parts);
    ``log_generation_charge`` once it returned a row."""
    amount, policy, detail = generation_price(cfg, provider, duration_seconds)
    key = generation_key(provider, provider_task_id)
    args = (
        key,
        tenant_id,
        provider,
        provider_task_id,
        generation_task_id,
        amount,
        cfg.currency,
        policy,
        _json(detail),
    )
    return Part(INSERT_GENERATION_CHARGE.format(when=when), args)


def log_generation_charge(part: Part) -> None:
    _key, tenant_id, provider, provider_task_id, _task, amount, currency, policy, _ = part.args
    log.info(
        "ledger_generation_charge",
        tenant_id=tenant_id,
        provider=provider,
        provider_task_id=provider_task_id,
        amount_micros=amount,
        currency=currency,
        policy=policy,
    )


async def record_processing_charge(
    conn: Connection,
    *,
    cfg: LedgerConfig,
    tenant_id: int,
    asset_id: uuid.UUID,
    revision: int,
    media_seconds: float,
) -> bool:
    """The platform's charge for publishing one revision, once; nothing under ``never``."""
    part = processing_charge_part(
        cfg, tenant_id=tenant_id, asset_id=asset_id, revision=revision, media_seconds=media_seconds
    )
    if part is None:
        return False
    return await _write_charge(conn, part, "recording a processing charge", log_processing_charge)


async def _write_charge(
    conn: Connection, part: Part, doing: str, logged: Callable[[Part], None]
) -> bool:
    """One charge on its own; True (and logged) if written now, False if it was there."""
    with map_db_errors(doing):
        entry_id = await conn.fetchval(part.sql, *part.args)
    if entry_id is not None:
        logged(part)
    return entry_id is not None


def processing_charge_part(
    cfg: LedgerConfig, *, tenant_id: int, asset_id: uuid.UUID, revision: int, media_seconds: float
) -> Part | None:
    """The statement of the processing charge (None under ``never``), for a caller that writes
    it together with others; ``log_processing_charge`` once it returned a row.

    Policy ``per_media_second``, or ``unpriced`` (amount 0) when the rate is 0."""
    if cfg.processing_charge == "never":
        return None
    rate = cfg.processing_micros_per_media_second
    amount = _micros(rate, media_seconds)
    policy = "per_media_second" if rate else "unpriced"
    detail = {"media_seconds": media_seconds, "micros_per_media_second": rate}
    key = processing_key(asset_id, revision)
    args = (key, tenant_id, asset_id, revision, amount, cfg.currency, policy, _json(detail))
    return Part(INSERT_PROCESSING_CHARGE, args)


def log_processing_charge(part: Part) -> None:
    _key, tenant_id, asset_id, revision, amount, currency, policy, _detail = part.args
    log.info(
        "ledger_processing_charge",
        tenant_id=tenant_id,
        asset_id=str(asset_id),
        revision=revision,
        amount_micros=amount,
        currency=currency,
        policy=policy,
    )


async def record_compensation(
    conn: Connection,
    *,
    cfg: LedgerConfig,
    tenant_id: int,
    provider: str,
    provider_task_id: str,
    reason: str,
    asset_id: uuid.UUID | None = None,
) -> bool:
    """At most one compensation per provider task, whichever failure asks first.

    Under ``refund_generation`` it is minus the task's generation charge (read in this
    transaction); nothing under ``none`` or when the task has no charge. True if written now.
    """
    if cfg.compensation == "none":
        return False
    with map_db_errors("recording a compensation"):
        charge = await conn.fetchrow(
            SELECT_ENTRY_BY_KEY, generation_key(provider, provider_task_id)
        )
        if charge is None:
            log.warning(
                "ledger_compensation_without_charge",
                tenant_id=tenant_id,
                provider=provider,
                provider_task_id=provider_task_id,
                reason=reason,
            )
            return False
        if charge["tenant_id"] != tenant_id:
            raise PolicyBlockedError(
                f"tenant_mismatch: the charge for {provider}/{provider_task_id} "
                "belongs to another tenant"
            )
        amount = -int(charge["amount_micros"])
        detail = {"reason": reason, "refunds_entry_id": int(charge["id"])}
        entry_id = await conn.fetchval(
            INSERT_COMPENSATION,
            compensation_key(provider, provider_task_id),
            tenant_id,
            provider,
            provider_task_id,
            charge["generation_task_id"],
            asset_id,
            amount,
            charge["currency"],
            cfg.compensation,
            _json(detail),
        )
    if entry_id is not None:
        log.info(
            "ledger_compensation",
            tenant_id=tenant_id,
            provider=provider,
            provider_task_id=provider_task_id,
            amount_micros=amount,
            currency=charge["currency"],
            reason=reason,
        )
    return entry_id is not None


# -- readers --------------------------------------------------------------------------------


def _entry(row: Any) -> LedgerEntry:
    values = dict(row.items())
    if isinstance(values["detail"], str):  # a connection without the jsonb codec
        values["detail"] = msgspec.json.decode(values["detail"])
    return msgspec.convert(values, LedgerEntry)


async def entries(
    pool: Pool | Connection,
    *,
    task: str | None = None,
    provider: str | None = None,
    tenant_id: int | None = None,
    since: datetime | None = None,
) -> list[LedgerEntry]:
    """Entries of one provider task (optionally of one provider and tenant), or of one
    tenant, or of everyone; at or after ``since``; oldest first."""
    with map_db_errors("reading the ledger"):
        if task is not None:
            rows = await pool.fetch(SELECT_TASK_ENTRIES, task, provider, tenant_id, since)
        elif tenant_id is not None:
            rows = await pool.fetch(SELECT_TENANT_ENTRIES, tenant_id, since)
        else:
            rows = await pool.fetch(SELECT_ALL_ENTRIES, since)
    return [_entry(row) for row in rows]


async def balance(
    pool: Pool | Connection, *, tenant_id: int, since: datetime | None = None
) -> list[Total]:
    """A tenant's per-currency totals, summed in the database."""
    with map_db_errors("summing the ledger"):
        rows = await pool.fetch(SELECT_BALANCE, tenant_id, since)
    return [
        Total(
            currency=row["currency"],
            charges_micros=int(row["charges_micros"]),
            compensation_micros=int(row["compensation_micros"]),
            entries=int(row["entries"]),
        )
        for row in rows
    ]
