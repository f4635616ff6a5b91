"""The ledger against real PostgreSQL: append-only in the database, one row per money fact
under duplicates and races, compensation by policy, and the ``aivedio ledger`` command."""

from __future__ import annotations

import argparse
import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import asyncpg
import pytest

from aivedio.cli.ledger import add_parsers, format_micros
from aivedio.config.ledger import LedgerConfig, validate_ledger
from aivedio.config.load import Config
from aivedio.crypto import UrlCipher
from aivedio.errors import ConfigError, StaleStateError
from aivedio.pipeline import output_records
from aivedio.pipeline.intake import OutputDescriptor, Recorded, record_provider_output
from aivedio.store import ledger as ledger_store
from aivedio.store.database import Connection, Pool, open_connection, open_pool
from aivedio.store.ledger import (
    record_compensation,
    record_generation_charge,
    record_processing_charge,
)
from aivedio.store.queue import Queue
from aivedio.store.tenants import create_tenant

pytestmark = pytest.mark.anyio


PRICED = LedgerConfig(
    generation_micros_per_task={"sim": 250_000},
    generation_micros_per_second={"sim": 10_000, "metered": 40_000},
    processing_micros_per_media_second=2_000,
)


async def _tenant(pool: Pool, name: str = "acme") -> int:
    async with pool.acquire() as conn:
        tenant_id, _ = await create_tenant(conn, name)
    return tenant_id


async def _ingest(
    conn: Connection,
    pool: Pool,
    config: Config,
    tenant_id: int,
    task_id: str,
    *,
    index: int = 0,
    provider: str = "sim",
    ledger: LedgerConfig | None = None,
    url: str | None = None,
    task_known: bool = True,
) -> Recorded:
    descriptor = OutputDescriptor(
        provider=provider,
        provider_task_id=task_id,
        output_index=index,
        url=url or f"https://cdn.provider.test/{task_id}/{index}.mp4",
        expires_at=datetime.now(UTC) + timedelta(hours=1),
    )
    return await record_provider_output(
        conn,
        queue=Queue(pool),
        cipher=UrlCipher.from_base64(
            config.security.url_encryption_key_id, config.security.url_encryption_key, {}
        ),
        tenant_id=tenant_id,
        descriptor=descriptor,
        ledger=ledger,
        task_known=task_known,
    )


async def ingest(pool: Pool, config: Config, tenant_id: int, task_id: str, **kw: Any) -> Recorded:
    async with pool.acquire() as conn:
        return await _ingest(conn, pool, config, tenant_id, task_id, **kw)


async def rows(pool: Pool) -> list[dict[str, object]]:
    found = await pool.fetch("SELECT * FROM ledger_entries ORDER BY id")
    return [dict(r.items()) for r in found]


# -- the table ------------------------------------------------------------------------------


async def test_the_migration_creates_the_ledger_with_its_guard(pool: Pool) -> None:
    assert await pool.fetchval("SELECT 1 FROM schema_migrations WHERE version = 2") == 1
    trigger = await pool.fetchrow(
        "SELECT tgenabled::text FROM pg_trigger WHERE tgname = 'ledger_entries_append_only'"
    )
    assert trigger is not None
    assert trigger["tgenabled"] == "A"  # ENABLE ALWAYS: fires even for replication roles


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE ledger_entries SET amount_micros = 0",
        "UPDATE ledger_entries SET policy = 'x' WHERE false",  # even touching no row
        "DELETE FROM ledger_entries",
        "DELETE FROM ledger_entries WHERE id = -1",
        "TRUNCATE ledger_entries",
        "TRUNCATE tenants CASCADE",
        "INSERT INTO ledger_entries (entry_key, tenant_id, kind, amount_micros, currency, policy)"
        " SELECT entry_key, tenant_id, kind, 1, currency, policy FROM ledger_entries"
        " ON CONFLICT (entry_key) DO UPDATE SET amount_micros = 1",
    ],
)
async def test_entries_cannot_be_changed_or_removed(
    pool: Pool, config: Config, statement: str
) -> None:
    tenant_id = await _tenant(pool)
    await ingest(pool, config, tenant_id, "t-1", ledger=PRICED)
    before = await rows(pool)
    assert len(before) == 1
    with pytest.raises(asyncpg.exceptions.RaiseError, match="append-only"):
        await pool.execute(statement)
    assert await rows(pool) == before


async def test_the_guard_holds_with_triggers_switched_to_replica_mode(
    pool: Pool, config: Config
) -> None:
    tenant_id = await _tenant(pool)
    await ingest(pool, config, tenant_id, "t-1")
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute("SET LOCAL session_replication_role = replica")
        with pytest.raises(asyncpg.exceptions.RaiseError, match="DELETE refused"):
            await conn.execute("DELETE FROM ledger_entries")


async def test_constraints_refuse_a_negative_charge_and_a_bad_currency(pool: Pool) -> None:
    tenant_id = await _tenant(pool)
    insert = (
        "INSERT INTO ledger_entries (entry_key, tenant_id, kind, provider, provider_task_id,"
        " amount_micros, currency, policy) VALUES ($1, $2, 'generation_charge', 'p', 't', $3,"
        " $4, 'x')"
    )
    with pytest.raises(asyncpg.exceptions.CheckViolationError):
        await pool.execute(insert, "k1", tenant_id, -1, "USD")
    with pytest.raises(asyncpg.exceptions.CheckViolationError):
        await pool.execute(insert, "k2", tenant_id, 1, "usd")


# -- generation charges ---------------------------------------------------------------------


# task_known False: the caller found no row of the task, so intake tries the task, its charge,
# the output and its fetch job as one statement first; a task that exists makes that
# statement write nothing, and the general path records the output.
@pytest.mark.parametrize("task_known", [True, False])
async def test_a_duplicate_callback_or_reingest_writes_one_generation_charge(
    pool: Pool, config: Config, task_known: bool
) -> None:
    tenant_id = await _tenant(pool)
    known = {"ledger": PRICED, "task_known": task_known}
    first = await ingest(pool, config, tenant_id, "t-1", **known)
    assert first.output_created and first.job_created
    again = await ingest(pool, config, tenant_id, "t-1", **known)  # the same callback again
    assert (again.provider_output_id, again.fetch_job_id) == (
        first.provider_output_id,
        first.fetch_job_id,
    )
    assert not again.output_created and not again.job_created
    await ingest(pool, config, tenant_id, "t-1", url="https://cdn.provider.test/new", **known)
    second = await ingest(pool, config, tenant_id, "t-1", index=1, **known)  # a second output
    assert second.generation_task_id == first.generation_task_id and second.output_created
    assert await pool.fetchval("SELECT count(*) FROM generation_tasks") == 1
    assert (
        await pool.fetchval(
            "SELECT count(*) FROM jobs WHERE kind = 'fetch' AND payload->>'provider_output_id'"
            " = ANY($1::text[])",
            [str(first.provider_output_id), str(second.provider_output_id)],
        )
        == 2
    )
    [entry] = await rows(pool)
    assert entry["entry_key"] == "generation:sim:t-1"
    assert entry["kind"] == "generation_charge"
    assert entry["generation_task_id"] == first.generation_task_id
    assert entry["tenant_id"] == tenant_id
    # Intake knows no duration: the per-task part, and the per-second rate kept unmetered.
    assert entry["amount_micros"] == 250_000
    assert entry["policy"] == "per_task+per_second_unmetered"
    assert entry["currency"] == "USD"
    assert entry["detail"]["micros_per_second"] == 10_000


@pytest.mark.parametrize("task_known", [True, False])
async def test_twenty_concurrent_intakes_of_one_task_write_one_charge(
    pool: Pool, config: Config, task_known: bool
) -> None:
    tenant_id = await _tenant(pool)
    failures: list[BaseException] = []

    async def one(i: int) -> None:
        async with open_connection(config.database) as conn:
            try:
                await _ingest(
                    conn,
                    pool,
                    config,
                    tenant_id,
                    "race",
                    index=i % 3,
                    ledger=PRICED,
                    task_known=task_known,
                )
            except Exception as exc:
                failures.append(exc)

    async with anyio.create_task_group() as tg:
        for i in range(20):
            tg.start_soon(one, i)
    assert failures == []
    found = await rows(pool)
    assert [(e["kind"], e["entry_key"]) for e in found] == [
        ("generation_charge", "generation:sim:race")
    ]
    assert await pool.fetchval("SELECT count(*) FROM generation_tasks") == 1
    assert await pool.fetchval("SELECT count(*) FROM provider_outputs") == 3
    assert await pool.fetchval("SELECT count(*) FROM jobs WHERE kind = 'fetch'") == 3


async def test_an_unpriced_provider_still_records_the_fact_at_zero(
    pool: Pool, config: Config
) -> None:
    tenant_id = await _tenant(pool)
    await ingest(pool, config, tenant_id, "t-1", provider="other", ledger=PRICED)
    await ingest(pool, config, tenant_id, "t-2")  # no ledger config at all: the defaults
    found = await rows(pool)
    assert [(e["provider"], e["amount_micros"], e["policy"]) for e in found] == [
        ("other", 0, "unpriced"),
        ("sim", 0, "unpriced"),
    ]


def test_generation_prices_per_task_per_second_and_rounding() -> None:
    price = ledger_store.generation_price
    assert price(PRICED, "sim", 4.5) == (
        295_000,
        "per_task+per_second",
        {"micros_per_task": 250_000, "micros_per_second": 10_000, "duration_seconds": 4.5},
    )
    assert price(PRICED, "metered", 0.00001)[:2] == (0, "per_second")  # 0.4 micro rounds down
    assert price(PRICED, "metered", 0.0000125)[:2] == (1, "per_second")  # 0.5 rounds up
    assert price(PRICED, "metered", None)[:2] == (0, "per_second_unmetered")
    assert price(PRICED, "nobody", 3.0) == (0, "unpriced", {})


async def test_a_charge_rolls_back_with_the_transaction_that_justified_it(pool: Pool) -> None:
    tenant_id = await _tenant(pool)

    class Boom(Exception):
        pass

    async def charge_then_fail() -> None:
        async with pool.acquire() as conn, conn.transaction():
            await record_generation_charge(
                conn,
                cfg=PRICED,
                tenant_id=tenant_id,
                provider="sim",
                provider_task_id="t-1",
                generation_task_id=uuid.uuid4(),
            )
            raise Boom

    with pytest.raises(Boom):
        await charge_then_fail()
    assert await rows(pool) == []


# -- compensation ---------------------------------------------------------------------------


async def test_lost_outputs_and_a_processing_failure_compensate_once(
    pool: Pool, config: Config
) -> None:
    tenant_id = await _tenant(pool)
    outputs = [
        await ingest(pool, config, tenant_id, "t-1", index=i, ledger=PRICED) for i in range(2)
    ]
    # Both outputs of the task are lost, then the publish code reports a processing failure.
    for recorded in outputs:
        row = await output_records.load(pool, recorded.provider_output_id)
        await output_records.mark_lost(pool, row, "gone at the provider", ledger=PRICED)
    async with pool.acquire() as conn, conn.transaction():
        again = await record_compensation(
            conn,
            cfg=PRICED,
            tenant_id=tenant_id,
            provider="sim",
            provider_task_id="t-1",
            reason="processing_failed",
            asset_id=uuid.uuid4(),
        )
    assert again is False
    charge, compensation = await rows(pool)
    assert compensation["kind"] == "compensation"
    assert compensation["entry_key"] == "compensation:sim:t-1"
    assert compensation["amount_micros"] == -charge["amount_micros"] == -250_000
    assert compensation["currency"] == charge["currency"]
    assert compensation["policy"] == "refund_generation"
    assert compensation["generation_task_id"] == charge["generation_task_id"]
    assert compensation["detail"] == {
        "reason": "output_lost: gone at the provider",
        "refunds_entry_id": charge["id"],
    }
    # The loss itself is still recorded twice in the outbox: one event an output.
    assert (
        await pool.fetchval("SELECT count(*) FROM outbox_events WHERE event_type = 'output.lost'")
        == 2
    )
    totals = await ledger_store.balance(pool, tenant_id=tenant_id)
    assert [
        (t.currency, t.charges_micros, t.compensation_micros, t.net_micros) for t in totals
    ] == [("USD", 250_000, -250_000, 0)]


async def test_marking_lost_twice_fails_the_state_change_and_writes_nothing_more(
    pool: Pool, config: Config
) -> None:
    tenant_id = await _tenant(pool)
    recorded = await ingest(pool, config, tenant_id, "t-1", ledger=PRICED)
    row = await output_records.load(pool, recorded.provider_output_id)
    await output_records.mark_lost(pool, row, "expired", ledger=PRICED)
    with pytest.raises(StaleStateError):  # the CAS refuses the stale row
        await output_records.mark_lost(pool, row, "expired", ledger=PRICED)
    assert [e["kind"] for e in await rows(pool)] == ["generation_charge", "compensation"]


async def test_the_refund_is_minus_a_metered_charge_in_its_own_currency(pool: Pool) -> None:
    tenant_id = await _tenant(pool)
    task = uuid.uuid4()
    async with pool.acquire() as conn, conn.transaction():
        await record_generation_charge(
            conn,
            cfg=PRICED,
            tenant_id=tenant_id,
            provider="metered",
            provider_task_id="m-1",
            generation_task_id=task,
            duration_seconds=8.25,
        )
    later = LedgerConfig(currency="EUR", generation_micros_per_second={"metered": 1})
    async with pool.acquire() as conn, conn.transaction():
        assert await record_compensation(
            conn,
            cfg=later,
            tenant_id=tenant_id,
            provider="metered",
            provider_task_id="m-1",
            reason="processing_failed",
        )
    charge, refund = await rows(pool)
    assert charge["amount_micros"] == 330_000
    assert refund["amount_micros"] == -330_000
    assert refund["currency"] == charge["currency"] == "USD"
    assert refund["generation_task_id"] == task


async def test_policy_none_and_never_write_nothing(pool: Pool, config: Config) -> None:
    tenant_id = await _tenant(pool)
    quiet = LedgerConfig(
        generation_micros_per_task={"sim": 1}, compensation="none", processing_charge="never"
    )
    recorded = await ingest(pool, config, tenant_id, "t-1", ledger=quiet)
    row = await output_records.load(pool, recorded.provider_output_id)
    await output_records.mark_lost(pool, row, "expired", ledger=quiet)
    async with pool.acquire() as conn, conn.transaction():
        assert not await record_processing_charge(
            conn,
            cfg=quiet,
            tenant_id=tenant_id,
            asset_id=uuid.uuid4(),
            revision=1,
            media_seconds=10,
        )
        assert not await record_compensation(
            conn,
            cfg=quiet,
            tenant_id=tenant_id,
            provider="sim",
            provider_task_id="t-1",
            reason="processing_failed",
        )
    assert [e["kind"] for e in await rows(pool)] == ["generation_charge"]


async def test_no_compensation_without_a_charge(pool: Pool) -> None:
    tenant_id = await _tenant(pool)
    async with pool.acquire() as conn, conn.transaction():
        assert not await record_compensation(
            conn,
            cfg=PRICED,
            tenant_id=tenant_id,
            provider="sim",
            provider_task_id="before-the-ledger",
            reason="output_lost",
        )
    assert await rows(pool) == []


# -- processing charges ---------------------------------------------------------------------


async def test_a_processing_charge_once_per_revision_names_the_provider_task(
    pool: Pool, config: Config
) -> None:
    tenant_id = await _tenant(pool)
    recorded = await ingest(pool, config, tenant_id, "t-1", ledger=PRICED)
    asset_id = uuid.uuid4()
    await pool.execute(
        "INSERT INTO assets (id, tenant_id, source_type, source_provider_output_id, status)"
        " VALUES ($1, $2, 'PROVIDER_OUTPUT', $3, 'PLAYABLE')",
        asset_id,
        tenant_id,
        recorded.provider_output_id,
    )
    written = []
    for _ in range(3):  # a retried publish
        async with pool.acquire() as conn, conn.transaction():
            written.append(
                await record_processing_charge(
                    conn,
                    cfg=PRICED,
                    tenant_id=tenant_id,
                    asset_id=asset_id,
                    revision=1,
                    media_seconds=12.5,
                )
            )
    upload = uuid.uuid4()  # an upload has no provider task; its charge is recorded all the same
    async with pool.acquire() as conn, conn.transaction():
        await record_processing_charge(
            conn,
            cfg=LedgerConfig(),
            tenant_id=tenant_id,
            asset_id=upload,
            revision=1,
            media_seconds=3,
        )
    assert written == [True, False, False]
    found = await ledger_store.entries(pool, task="t-1")
    assert [(e.kind, e.amount_micros, e.policy) for e in found] == [
        ("generation_charge", 250_000, "per_task+per_second_unmetered"),
        ("processing_charge", 25_000, "per_media_second"),
    ]
    processing = found[1]
    assert (processing.provider, processing.asset_id, processing.revision) == ("sim", asset_id, 1)
    assert processing.generation_task_id == recorded.generation_task_id
    [free] = [
        e for e in await ledger_store.entries(pool, tenant_id=tenant_id) if e.asset_id == upload
    ]
    assert (free.provider_task_id, free.amount_micros, free.policy) == (None, 0, "unpriced")


# -- reading --------------------------------------------------------------------------------


async def test_entries_filter_by_task_provider_tenant_and_since(pool: Pool, config: Config) -> None:
    acme = await _tenant(pool, "acme")
    other = await _tenant(pool, "other")
    await ingest(pool, config, acme, "t-1", ledger=PRICED)
    await ingest(pool, config, acme, "t-1", provider="metered", ledger=PRICED)
    await ingest(pool, config, other, "t-2", ledger=PRICED)
    assert len(await ledger_store.entries(pool, task="t-1")) == 2
    assert [e.provider for e in await ledger_store.entries(pool, task="t-1", provider="sim")] == [
        "sim"
    ]
    assert {e.provider_task_id for e in await ledger_store.entries(pool, tenant_id=other)} == {
        "t-2"
    }
    future = datetime.now(UTC) + timedelta(minutes=5)
    assert await ledger_store.entries(pool, tenant_id=acme, since=future) == []
    everything = await ledger_store.entries(pool)
    assert ledger_store.summarize(everything) == await _balance_all(pool, [acme, other])


async def _balance_all(pool: Pool, tenants: list[int]) -> list[ledger_store.Total]:
    per = [t for tenant in tenants for t in await ledger_store.balance(pool, tenant_id=tenant)]
    return [
        ledger_store.Total(
            currency="USD",
            charges_micros=sum(t.charges_micros for t in per),
            compensation_micros=sum(t.compensation_micros for t in per),
            entries=sum(t.entries for t in per),
        )
    ]


# -- configuration --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cfg", "message"),
    [
        (
            LedgerConfig(compensation="refund"),
            "ledger.compensation: one of refund_generation, none",
        ),
        (LedgerConfig(processing_charge="always"), "ledger.processing_charge: one of on_publish"),
        (LedgerConfig(currency="usd"), "ledger.currency"),
        (
            LedgerConfig(generation_micros_per_task={"sim": -1}),
            "ledger.generation_micros_per_task.sim",
        ),
        (LedgerConfig(generation_micros_per_second={"": 1}), "ledger.generation_micros_per_second"),
        (
            LedgerConfig(processing_micros_per_media_second=-5),
            "ledger.processing_micros_per_media_second",
        ),
    ],
)
def test_bad_ledger_settings_name_their_key(cfg: LedgerConfig, message: str) -> None:
    with pytest.raises(ConfigError, match=f"config error: {message}"):
        validate_ledger(cfg)


def test_the_default_ledger_settings_are_valid() -> None:
    validate_ledger(LedgerConfig())
    validate_ledger(PRICED)


# -- the command ----------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="aivedio")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config")
    sub = parser.add_subparsers(dest="command", required=True)
    add_parsers(sub, common)
    return parser


def _run(config: Config, *argv: str) -> int:
    args = _parser().parse_args(["ledger", *argv])
    code: int = args.fn(config, args)
    return code


def _seed_for_cli(config: Config) -> None:
    async def seed() -> None:
        async with open_pool(config.database, min_size=1, max_size=2) as pool:
            acme = await _tenant(pool, "acme")
            recorded = await ingest(pool, config, acme, "t-1", ledger=PRICED)
            await ingest(pool, config, acme, "t-2", provider="metered", ledger=PRICED)
            row = await output_records.load(pool, recorded.provider_output_id)
            await output_records.mark_lost(pool, row, "expired", ledger=PRICED)

    anyio.run(seed)


def test_the_command_prints_entries_and_totals_as_json(
    config: Config, capsys: pytest.CaptureFixture[str]
) -> None:
    _seed_for_cli(config)
    capsys.readouterr()  # the seeding's own log lines
    assert _run(config, "--task", "t-1", "--json") == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["kind"] for line in lines] == ["generation_charge", "compensation", "total"]
    assert lines[0]["amount_micros"] == 250_000
    assert lines[1]["amount_micros"] == -250_000
    assert lines[2] == {
        "kind": "total",
        "currency": "USD",
        "charges_micros": 250_000,
        "compensation_micros": -250_000,
        "net_micros": 0,
        "entries": 2,
    }
    assert _run(config, "--tenant", "acme", "--json") == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(lines) == 4
    assert lines[-1]["net_micros"] == 0
    # By id too, and narrowed by --since.
    tenant_id = lines[0]["tenant_id"]
    assert _run(config, "--tenant", str(tenant_id), "--since", "2000-01-01", "--json") == 0
    assert len(capsys.readouterr().out.splitlines()) == 4
    assert _run(config, "--tenant", "acme", "--since", "2499-01-01T00:00:00Z", "--json") == 0
    assert capsys.readouterr().out == ""
    assert _run(config, "--tenant", "acme", "--since", "2499-01-01T00:00:00Z") == 0
    assert capsys.readouterr().out.splitlines()[1:] == ["(none)"]


def test_the_command_prints_a_text_table_by_default(
    config: Config, capsys: pytest.CaptureFixture[str]
) -> None:
    _seed_for_cli(config)
    capsys.readouterr()  # the seeding's own log lines
    assert _run(config, "--task", "t-1", "--provider", "sim") == 0
    header, *out = capsys.readouterr().out.splitlines()
    assert header.split() == ["created_at", "kind", "amount", "policy", "about"]
    assert len(out) == 3
    assert "generation_charge" in out[0] and "0.250000 USD" in out[0] and "sim/t-1" in out[0]
    assert "compensation" in out[1] and "-0.250000 USD" in out[1]
    # The amounts are one column, aligned under its header.
    assert out[0][header.index("amount") :].startswith("0.250000 USD")
    assert out[2] == "total USD: charges 0.250000, compensation -0.250000, net 0.000000 (2 entries)"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ((), "exactly one of --task or --tenant"),
        (("--tenant", "acme", "--since", "yesterday"), "--since"),
        # Outside what the store holds, ±infinity's neighbours: usage errors, not crashes.
        (("--tenant", "acme", "--since", "0001-01-01"), "--since"),
        (("--tenant", "acme", "--since", "9999-12-31T23:59:59-01:00"), "--since"),
        (("--tenant", "acme", "--provider", "sim"), "--provider"),
        (("--tenant", "nobody"), "no tenant 'nobody'"),
    ],
)
def test_the_command_rejects_bad_usage_with_status_2(
    config: Config, capsys: pytest.CaptureFixture[str], argv: tuple[str, ...], message: str
) -> None:
    assert _run(config, *argv) == 2
    assert message in capsys.readouterr().err


def test_task_and_tenant_together_are_a_usage_error() -> None:
    with pytest.raises(SystemExit) as exc:
        _parser().parse_args(["ledger", "--task", "t", "--tenant", "acme"])
    assert exc.value.code == 2


def test_format_micros_is_exact() -> None:
    assert [format_micros(v) for v in (0, 1, -1_250_000, 12_000_000)] == [
        "0.000000",
        "0.000001",
        "-1.250000",
        "12.000000",
    ]
