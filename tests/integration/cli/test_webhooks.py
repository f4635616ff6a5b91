"""``aivedio webhooks deliveries list`` and ``retry`` as subprocesses against real PostgreSQL.

Deliveries die the real way (a relay posting to a receiver that answers 500, one attempt
allowed); the replay is proven by the next relay pass delivering them.
"""

from __future__ import annotations

import json

import pytest

from aivedio.store.database import Pool
from tests.integration.cli.test_ingest import aivedio
from tests.integration.pipeline.upkeep.test_outbox_relay import (
    deliveries,
    emit_one,
    open_receiver,
    open_relay,
    outbox_config,
)

pytestmark = pytest.mark.anyio


async def test_dead_deliveries_are_listed_and_replayed_with_a_fresh_budget(
    database: str, pool: Pool
) -> None:
    async with open_receiver() as receiver:
        receiver.rule = lambda _r, _n: 500
        config = outbox_config(receiver, max_attempts=1)
        async with open_relay(config, pool) as relay:
            dead = await emit_one(pool, "asset.ready")
            await relay.deliver_once()
            healthy = await emit_one(pool, "asset.deleted")
            receiver.rule = lambda _r, _n: 200
            await relay.deliver_once()

            listed = await aivedio(database, "webhooks", "deliveries", "list", "--json")
            assert listed.code == 0, listed.stderr
            rows = [json.loads(line) for line in listed.stdout.splitlines()]
            assert [(r["event_id"], r["state"]) for r in rows] == [
                (healthy, "delivered"),
                (dead, "dead"),
            ]
            assert rows[1]["last_status"] == 500
            assert rows[1]["last_error"] == "HTTP 500"
            assert rows[1]["endpoint"] == "crm"

            only_dead = await aivedio(database, "webhooks", "deliveries", "list", "--state", "dead")
            assert only_dead.code == 0, only_dead.stderr
            header, *lines = only_dead.stdout.splitlines()
            assert header.split()[:4] == ["EVENT_ID", "ENDPOINT", "EVENT_TYPE", "STATE"]
            assert len(lines) == 1
            assert lines[0].split()[:4] == [dead, "crm", "asset.ready", "dead"]

            retried = await aivedio(database, "webhooks", "deliveries", "retry", dead, "--json")
            assert retried.code == 0, retried.stderr
            assert json.loads(retried.stdout) == {
                "replayed": [{"event_id": dead, "endpoint": "crm"}]
            }
            row = next(r for r in await deliveries(pool) if str(r["event_id"]) == dead)
            assert (row["dead_at"], row["attempts"], row["first_attempt_at"]) == (None, 0, None)

            await relay.deliver_once()
    assert receiver.ids() == [dead, healthy, dead]
    row = next(r for r in await deliveries(pool) if str(r["event_id"]) == dead)
    assert row["delivered_at"] is not None
    assert (row["attempts"], row["last_status"]) == (1, 200)

    # Delivered now: nothing to replay, and the command says so.
    again = await aivedio(database, "webhooks", "deliveries", "retry", dead)
    assert again.code == 3
    assert f"no dead or pending delivery of {dead}" in again.stderr


async def test_all_dead_replays_every_dead_delivery_of_an_endpoint(
    database: str, pool: Pool
) -> None:
    async with open_receiver() as receiver:
        receiver.rule = lambda _r, _n: 503
        async with open_relay(outbox_config(receiver, max_attempts=1), pool) as relay:
            first = await emit_one(pool)
            second = await emit_one(pool)
            await relay.deliver_once()
    assert sorted(receiver.ids()) == sorted([first, second])
    other = await aivedio(
        database, "webhooks", "deliveries", "retry", "--all-dead", "--endpoint", "x"
    )
    assert other.code == 3
    replayed = await aivedio(
        database, "webhooks", "deliveries", "retry", "--all-dead", "--endpoint", "crm"
    )
    assert replayed.code == 0, replayed.stderr
    assert sorted(replayed.stdout.splitlines()) == sorted(
        [f"replayed {first} to crm", f"replayed {second} to crm"]
    )
    assert all(r["dead_at"] is None for r in await deliveries(pool))


async def test_retry_refuses_a_command_line_that_names_nothing_or_not_an_id(
    database: str,
) -> None:
    neither = await aivedio(database, "webhooks", "deliveries", "retry")
    assert neither.code == 2
    assert "name event ids, or --all-dead" in neither.stderr
    not_an_id = await aivedio(database, "webhooks", "deliveries", "retry", "42")
    assert not_an_id.code == 2
    assert "an event id is a UUID" in not_an_id.stderr
