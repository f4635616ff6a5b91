"""The outbox relay against real PostgreSQL and a real HTTP receiver on loopback.

The receiver records every request and answers by a rule per test (a status, or "slow":
past the webhook's timeout). Most tests drive ``deliver_once`` with zero backoff jitter, so
every retry is due on the next pass and the sequence of requests is deterministic; the
background tests run ``open_outbox_relay`` as the worker would.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import itertools
import json
import random
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import aiohttp
import anyio
import asyncpg
import msgspec
import pytest
from aiohttp import web
from multidict import CIMultiDict
from standardwebhooks import Webhook, WebhookVerificationError
from structlog.testing import capture_logs

from aivedio.config.load import Config, masked
from aivedio.config.outbox import OutboxConfig, WebhookConfig, secret_key, validate_outbox
from aivedio.errors import ConfigError
from aivedio.pipeline.upkeep.outbox_relay import (
    Attempt,
    OutboxRelay,
    judge,
    open_outbox_relay,
    parse_retry_after,
    signatures,
)
from aivedio.store import listening
from aivedio.store.database import Pool
from aivedio.store.outbox import NOTIFY_CHANNEL, emit

pytestmark = pytest.mark.anyio

SECRET = "whsec_" + base64.b64encode(bytes(range(32))).decode()
NEW_SECRET = "whsec_" + base64.b64encode(bytes(range(100, 132))).decode()
Answer = int | str | tuple[int, dict[str, str]]


@dataclass
class Received:
    path: str
    headers: CIMultiDict[str]
    body: bytes
    at: float

    @property
    def event_id(self) -> str:
        return self.headers["webhook-id"]

    @property
    def data(self) -> dict[str, Any]:
        decoded: dict[str, Any] = json.loads(self.body)
        return decoded


@dataclass
class Receiver:
    """Records requests; ``rule(request, nth request for this event)`` picks the answer."""

    base_url: str = ""
    received: list[Received] = field(default_factory=list)
    rule: Callable[[Received, int], Answer] = lambda _r, _n: 200
    slow_seconds: float = 1.0
    slow_status: int = 200  # what "slow" answers once it has waited

    def url(self, name: str = "hook") -> str:
        return f"{self.base_url}/{name}"

    def ids(self) -> list[str]:
        return [r.event_id for r in self.received]

    async def handle(self, request: web.Request) -> web.Response:
        received = Received(
            request.path, CIMultiDict(request.headers), await request.read(), time.time()
        )
        self.received.append(received)
        nth = sum(1 for r in self.received if r.event_id == received.event_id)
        answer = self.rule(received, nth)
        if answer == "slow":
            await anyio.sleep(self.slow_seconds)
            answer = self.slow_status
        if isinstance(answer, tuple):
            return web.Response(status=answer[0], headers=answer[1])
        assert isinstance(answer, int)
        return web.Response(status=answer)


@asynccontextmanager
async def open_receiver() -> AsyncIterator[Receiver]:
    receiver = Receiver()
    app = web.Application()
    app.router.add_post("/{name}", receiver.handle)
    runner = web.AppRunner(app, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    receiver.base_url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        yield receiver
    finally:
        await runner.cleanup()


def outbox_config(receiver: Receiver, **hook: Any) -> OutboxConfig:
    settings: dict[str, Any] = {
        "url": receiver.url(),
        "secrets": [SECRET],
        "timeout_seconds": 2.0,
    }
    settings.update(hook)
    return OutboxConfig(
        poll_interval_seconds=0.05,
        backoff_base_seconds=0.01,
        backoff_max_seconds=0.05,
        webhooks={"crm": WebhookConfig(**settings)},
    )


@asynccontextmanager
async def open_relay(
    config: OutboxConfig, pool: Pool, rand: Callable[[], float] = lambda: 0.0
) -> AsyncIterator[OutboxRelay]:
    """A relay driven by hand: no jitter (every retry due at once), registered now."""
    async with aiohttp.ClientSession(trust_env=False) as session:
        relay = OutboxRelay(config, pool, session, rand=rand)
        await relay.register()
        yield relay


async def emit_one(
    pool: Pool,
    event_type: str = "asset.ready",
    aggregate_id: uuid.UUID | None = None,
    **payload: Any,
) -> str:
    async with pool.acquire() as conn, conn.transaction():
        event_id = await emit(
            conn,
            event_type,
            tenant_id=7,
            aggregate_id=aggregate_id or uuid.uuid4(),
            payload=payload or {"n": 1},
        )
    return str(event_id)


async def deliveries(pool: Pool) -> list[dict[str, Any]]:
    rows = await pool.fetch(
        "SELECT d.*, e.event_id FROM outbox_deliveries d"
        " JOIN outbox_events e ON e.id = d.outbox_event_id ORDER BY d.outbox_event_id"
    )
    return [dict(r.items()) for r in rows]


async def passes(relay: OutboxRelay, n: int) -> None:
    for _ in range(n):
        await relay.deliver_once()


# -- the request -------------------------------------------------------------------------------


async def test_delivery_is_signed_in_the_standard_webhooks_format(pool: Pool) -> None:
    async with open_receiver() as receiver, open_relay(outbox_config(receiver), pool) as relay:
        aggregate = uuid.uuid4()
        event_id = await emit_one(pool, "asset.ready", aggregate, asset_id=str(aggregate))
        assert await relay.deliver_once() == 1
    [request] = receiver.received
    h = request.headers
    assert h["Content-Type"] == "application/json"
    assert h["webhook-id"] == event_id
    assert abs(int(h["webhook-timestamp"]) - time.time()) < 60
    assert h["X-Aivedio-Event-Type"] == "asset.ready"
    # The receiving side as a receiver writes it: the Standard Webhooks library.
    body = Webhook(SECRET).verify(request.body, dict(h.items()))
    with pytest.raises(WebhookVerificationError, match="No matching signature"):
        Webhook(NEW_SECRET).verify(request.body, dict(h.items()))
    with pytest.raises(WebhookVerificationError):
        Webhook(SECRET).verify(request.body + b" ", dict(h.items()))
    # The legacy headers belong to the deprecated single secret only.
    assert "X-Aivedio-Signature" not in h
    assert "X-Aivedio-Timestamp" not in h
    assert body["id"] == event_id
    assert body["type"] == "asset.ready"
    assert body["tenant_id"] == 7
    assert body["aggregate_id"] == str(aggregate)
    assert body["data"] == {"asset_id": str(aggregate)}
    assert body["created_at"]
    [row] = await deliveries(pool)
    assert row["delivered_at"] is not None
    assert (row["attempts"], row["last_status"], row["lease_token"]) == (1, 200, None)


async def test_during_a_rotation_every_delivery_verifies_under_either_secret(pool: Pool) -> None:
    async with open_receiver() as receiver:
        config = outbox_config(receiver, secrets=[SECRET, NEW_SECRET])
        async with open_relay(config, pool) as relay:
            await emit_one(pool)
            await emit_one(pool)
            assert await relay.deliver_once() == 2
    assert len(receiver.received) == 2
    unrelated = "whsec_" + base64.b64encode(b"x" * 32).decode()
    for request in receiver.received:
        headers = dict(request.headers.items())
        assert len(headers["webhook-signature"].split(" ")) == 2
        assert Webhook(SECRET).verify(request.body, headers)["id"] == request.event_id
        assert Webhook(NEW_SECRET).verify(request.body, headers)["id"] == request.event_id
        with pytest.raises(WebhookVerificationError):
            Webhook(unrelated).verify(request.body, headers)


async def test_the_deprecated_secret_signs_both_formats_and_is_warned_about(pool: Pool) -> None:
    plain = "an-old-plain-secret-0123"
    async with open_receiver() as receiver:
        config = outbox_config(receiver, secrets=[], secret=plain)
        validate_outbox(config)
        with capture_logs() as logs:
            async with open_outbox_relay(config, pool):
                event_id = await emit_one(pool)
                with anyio.fail_after(10):
                    while not receiver.received:
                        await anyio.sleep(0.02)
    request = receiver.received[0]
    h = request.headers
    # The same key in the new form: "whsec_" + base64 of the old secret's bytes.
    Webhook("whsec_" + base64.b64encode(plain.encode()).decode()).verify(
        request.body, dict(h.items())
    )
    assert h["X-Aivedio-Event-Id"] == event_id
    timestamp = h["X-Aivedio-Timestamp"]
    expected = hmac.new(
        plain.encode(), f"{timestamp}.".encode() + request.body, hashlib.sha256
    ).hexdigest()
    assert hmac.compare_digest(h["X-Aivedio-Signature"], f"v1={expected}")
    [warning] = [e for e in logs if e["event"] == "outbox_webhook_secret_deprecated"]
    assert warning["endpoint"] == "crm"
    assert plain not in repr(logs)


async def test_a_500_then_200_is_retried_with_the_same_event_id(pool: Pool) -> None:
    async with open_receiver() as receiver, open_relay(outbox_config(receiver), pool) as relay:
        receiver.rule = lambda _r, nth: 500 if nth == 1 else 200
        event_id = await emit_one(pool)
        await relay.deliver_once()
        [row] = await deliveries(pool)
        assert row["delivered_at"] is None
        assert (row["attempts"], row["last_status"], row["last_error"]) == (1, 500, "HTTP 500")
        await relay.deliver_once()
        await relay.deliver_once()  # nothing left: no third request
    assert receiver.ids() == [event_id, event_id]
    first, second = receiver.received
    assert first.body == second.body  # byte-identical: the id inside is the same too
    assert first.headers["X-Aivedio-Delivery-Attempt"] == "1"
    assert second.headers["X-Aivedio-Delivery-Attempt"] == "2"
    [row] = await deliveries(pool)
    assert row["delivered_at"] is not None
    assert (row["attempts"], row["last_status"], row["last_error"]) == (2, 200, None)


async def test_a_timeout_then_200_is_retried_with_the_same_event_id(pool: Pool) -> None:
    async with open_receiver() as receiver:
        receiver.slow_seconds = 2.0
        receiver.rule = lambda _r, nth: "slow" if nth == 1 else 200
        config = outbox_config(receiver, timeout_seconds=0.2)
        async with open_relay(config, pool) as relay:
            event_id = await emit_one(pool)
            started = time.monotonic()
            await relay.deliver_once()
            assert time.monotonic() - started < 1.5  # gave up at the timeout, not the answer
            [row] = await deliveries(pool)
            assert row["delivered_at"] is None
            assert row["last_status"] is None
            assert row["last_error"] == "no answer within 0.2s"
            await relay.deliver_once()
    assert receiver.ids() == [event_id, event_id]
    [row] = await deliveries(pool)
    assert row["delivered_at"] is not None
    assert row["attempts"] == 2


async def test_budget_spent_makes_the_delivery_dead_and_sends_no_more(pool: Pool) -> None:
    async with open_receiver() as receiver:
        receiver.rule = lambda _r, _n: 503
        async with open_relay(outbox_config(receiver, max_attempts=3), pool) as relay:
            event_id = await emit_one(pool)
            with capture_logs() as logs:
                await passes(relay, 6)
    assert receiver.ids() == [event_id] * 3
    [row] = await deliveries(pool)
    assert row["dead_at"] is not None
    assert row["delivered_at"] is None
    assert (row["attempts"], row["last_status"]) == (3, 503)
    events = [e["event"] for e in logs]
    assert events.count("outbox_delivery_retry") == 2
    [dead] = [e for e in logs if e["event"] == "outbox_delivery_dead"]
    assert (dead["event_id"], dead["endpoint"], dead["attempt"]) == (event_id, "crm", 3)
    assert SECRET not in repr(logs)


async def test_past_its_window_a_delivery_is_dead_after_one_last_attempt(pool: Pool) -> None:
    async with open_receiver() as receiver:
        receiver.rule = lambda _r, _n: 500
        # Backoff far longer than the window: the second attempt is pulled to its end.
        config = msgspec.structs.replace(
            outbox_config(receiver, retry_for_seconds=0.5),
            backoff_base_seconds=60.0,
            backoff_max_seconds=600.0,
        )
        async with open_relay(config, pool, rand=lambda: 1.0) as relay:
            event_id = await emit_one(pool)
            await relay.deliver_once()
            [row] = await deliveries(pool)
            assert row["first_attempt_at"] is not None
            # Due exactly at the window's end, by the recorded times (not the wall clock).
            assert row["next_attempt_at"] - row["first_attempt_at"] == timedelta(seconds=0.5)
            await passes(relay, 2)  # not due yet: nothing sent
            assert receiver.ids() == [event_id]
            await anyio.sleep(0.6)
            with capture_logs() as logs:
                await passes(relay, 3)
    assert receiver.ids() == [event_id, event_id]
    [row] = await deliveries(pool)
    assert row["dead_at"] is not None
    assert (row["attempts"], row["last_status"]) == (2, 500)
    [dead] = [e for e in logs if e["event"] == "outbox_delivery_dead"]
    assert dead["reason"] == "retried for 0.5s"


async def test_a_slow_attempt_does_not_push_the_last_attempt_past_the_window(
    pool: Pool,
) -> None:
    async with open_receiver() as receiver:
        receiver.slow_seconds, receiver.slow_status = 0.3, 500
        receiver.rule = lambda _r, _n: "slow"
        config = msgspec.structs.replace(
            outbox_config(receiver, retry_for_seconds=0.5),
            backoff_base_seconds=60.0,
            backoff_max_seconds=600.0,
        )
        async with open_relay(config, pool, rand=lambda: 1.0) as relay:
            await emit_one(pool)
            await relay.deliver_once()
    [row] = await deliveries(pool)
    assert row["last_status"] == 500
    # The window's end as the first attempt's start fixed it, not 0.3 s later (the attempt's
    # own length): the last attempt lands at the end of the window, never past it.
    assert row["next_attempt_at"] - row["first_attempt_at"] == timedelta(seconds=0.5)


async def test_retry_after_on_429_sets_the_next_attempt(pool: Pool) -> None:
    async with open_receiver() as receiver:
        receiver.rule = lambda _r, _n: (429, {"Retry-After": "30"})
        async with open_relay(outbox_config(receiver), pool) as relay:
            await emit_one(pool)
            await relay.deliver_once()
            assert await relay.deliver_once() == 0  # not due for 30 s
    wait = await pool.fetchval(
        "SELECT extract(epoch FROM next_attempt_at - now()) FROM outbox_deliveries"
    )
    assert 25 < float(wait) <= 30
    assert len(receiver.received) == 1


async def test_a_4xx_is_retried_and_logged_as_the_receivers_fault(pool: Pool) -> None:
    async with open_receiver() as receiver:
        receiver.rule = lambda _r, nth: 401 if nth == 1 else 204
        async with open_relay(outbox_config(receiver), pool) as relay:
            await emit_one(pool)
            with capture_logs() as logs:
                await passes(relay, 2)
    [retry] = [e for e in logs if e["event"] == "outbox_delivery_retry"]
    assert retry["log_level"] == "error"
    assert retry["receiver_rejected"] is True
    assert retry["status"] == 401
    assert [e["event"] for e in logs].count("outbox_delivered") == 1


async def test_a_lease_lapsed_on_the_last_attempt_is_dead_without_sending(pool: Pool) -> None:
    async with (
        open_receiver() as receiver,
        open_relay(outbox_config(receiver, max_attempts=2), pool) as relay,
    ):
        await emit_one(pool)
        await relay.store.materialise("crm", [], 10)
        # A sender claimed the last attempt and died: its lease has run out.
        await pool.execute(
            "UPDATE outbox_deliveries SET attempts = 2, lease_token = gen_random_uuid(),"
            " next_attempt_at = now() - interval '1 second'"
        )
        await relay.deliver_once()
    assert receiver.received == []
    [row] = await deliveries(pool)
    assert row["dead_at"] is not None
    assert row["last_error"] == "lease lapsed during the last attempt"


# -- order, filters, registration ----------------------------------------------------------------


async def test_a_later_event_of_an_aggregate_waits_for_the_earlier_one(pool: Pool) -> None:
    async with open_receiver() as receiver, open_relay(outbox_config(receiver), pool) as relay:
        asset, other = uuid.uuid4(), uuid.uuid4()
        a = await emit_one(pool, "asset.ready", asset)
        b = await emit_one(pool, "asset.deleted", asset)
        c = await emit_one(pool, "asset.ready", other)
        receiver.rule = lambda r, nth: 500 if r.event_id == a and nth < 3 else 200
        await relay.deliver_once()
        assert receiver.ids() == [a, c]  # B waits behind A; C (another asset) does not
        await relay.deliver_once()
        assert receiver.ids() == [a, c, a]
        await relay.deliver_once()  # A delivered on its third attempt
        assert receiver.ids() == [a, c, a, a]
        await relay.deliver_once()
    assert receiver.ids() == [a, c, a, a, b]
    assert all(row["delivered_at"] is not None for row in await deliveries(pool))


async def test_a_dead_event_no_longer_holds_back_the_next(pool: Pool) -> None:
    async with (
        open_receiver() as receiver,
        open_relay(outbox_config(receiver, max_attempts=2), pool) as relay,
    ):
        asset = uuid.uuid4()
        a = await emit_one(pool, "asset.ready", asset)
        b = await emit_one(pool, "asset.deleted", asset)
        receiver.rule = lambda r, _n: 500 if r.event_id == a else 200
        await passes(relay, 4)
    assert receiver.ids() == [a, a, b]
    rows = {str(r["event_id"]): r for r in await deliveries(pool)}
    assert rows[a]["dead_at"] is not None
    assert rows[b]["delivered_at"] is not None


async def test_event_types_filter_what_a_webhook_receives(pool: Pool) -> None:
    async with open_receiver() as receiver:
        config = OutboxConfig(
            poll_interval_seconds=0.05,
            webhooks={
                "everything": WebhookConfig(url=receiver.url("everything"), secrets=[SECRET]),
                "losses": WebhookConfig(
                    url=receiver.url("losses"), secrets=[NEW_SECRET], event_types=["output.lost"]
                ),
            },
        )
        async with open_relay(config, pool) as relay:
            ready = await emit_one(pool, "asset.ready")
            lost = await emit_one(pool, "output.lost")
            await passes(relay, 2)
    by_path = Counter((r.path, r.event_id) for r in receiver.received)
    assert by_path == {("/everything", ready): 1, ("/everything", lost): 1, ("/losses", lost): 1}
    losses = [r for r in receiver.received if r.path == "/losses"]
    # Each webhook signs with its own secrets.
    Webhook(NEW_SECRET).verify(losses[0].body, dict(losses[0].headers.items()))
    with pytest.raises(WebhookVerificationError):
        Webhook(SECRET).verify(losses[0].body, dict(losses[0].headers.items()))


async def test_a_webhook_added_later_gets_events_from_then_on(pool: Pool) -> None:
    async with open_receiver() as receiver:
        before = await emit_one(pool)
        async with open_relay(outbox_config(receiver), pool) as relay:
            after = await emit_one(pool)
            await passes(relay, 2)
    assert receiver.ids() == [after]
    assert before not in receiver.ids()


async def test_an_event_with_a_smaller_id_committed_last_is_not_skipped(pool: Pool) -> None:
    """The sequence gap: X takes the smaller id but commits last. A cursor on ids alone
    would pass X while it was invisible and never come back for it."""
    async with open_receiver() as receiver, open_relay(outbox_config(receiver), pool) as relay:
        async with pool.acquire() as late, pool.acquire() as early:
            early_tx, late_tx = early.transaction(), late.transaction()
            await early_tx.start()
            await early.fetchval("SELECT pg_current_xact_id()")  # the older transaction
            await late_tx.start()
            x = await emit(late, "asset.ready", tenant_id=1, aggregate_id=uuid.uuid4(), payload={})
            y = await emit(early, "asset.ready", tenant_id=1, aggregate_id=uuid.uuid4(), payload={})
            await early_tx.commit()
            await passes(relay, 2)
            assert receiver.ids() == [str(y)]  # X is not visible yet
            await late_tx.commit()
        await passes(relay, 2)
    assert receiver.ids() == [str(y), str(x)]
    ids = await pool.fetch("SELECT event_id FROM outbox_events ORDER BY id")
    assert [r["event_id"] for r in ids] == [x, y]


async def test_an_event_of_an_older_transaction_committed_last_is_not_skipped(
    pool: Pool,
) -> None:
    """X's transaction is older (smaller xid) and commits after Y's: a cursor on (xid, id)
    without the horizon would pass X too. Y waits until X's transaction ends."""
    async with open_receiver() as receiver, open_relay(outbox_config(receiver), pool) as relay:
        async with pool.acquire() as older, pool.acquire() as newer:
            older_tx = older.transaction()
            await older_tx.start()
            await older.fetchval("SELECT pg_current_xact_id()")
            async with newer.transaction():
                await newer.fetchval("SELECT pg_current_xact_id()")
                y = await emit(newer, "asset.ready", tenant_id=1, aggregate_id=None, payload={})
            x = await emit(older, "asset.ready", tenant_id=1, aggregate_id=None, payload={})
            await passes(relay, 2)
            assert receiver.ids() == []  # held at the horizon: the older transaction is open
            await older_tx.commit()
        await passes(relay, 2)
    assert sorted(receiver.ids()) == sorted([str(x), str(y)])


async def test_a_transaction_open_in_another_database_does_not_hold_delivery(
    pool: Pool, empty_database: str
) -> None:
    other = await asyncpg.connect(empty_database)
    try:
        async with other.transaction():
            await other.fetchval("SELECT pg_current_xact_id()")
            async with (
                open_receiver() as receiver,
                open_relay(outbox_config(receiver), pool) as relay,
            ):
                event_id = await emit_one(pool)
                await relay.deliver_once()
                assert receiver.ids() == [event_id]
    finally:
        await other.close()


async def test_order_holds_while_the_earlier_event_is_not_yet_picked_up(pool: Pool) -> None:
    """Y (later id) can be turned into a delivery before X when X's transaction got its xid
    later; Y must still wait for X."""
    async with open_receiver() as receiver, open_relay(outbox_config(receiver), pool) as relay:
        asset = uuid.uuid4()
        async with pool.acquire() as y_conn, pool.acquire() as holder, pool.acquire() as x_conn:
            y_tx, hold_tx = y_conn.transaction(), holder.transaction()
            await y_tx.start()
            await y_conn.fetchval("SELECT pg_current_xact_id()")
            await hold_tx.start()
            await holder.fetchval("SELECT pg_current_xact_id()")  # holds the horizon
            async with x_conn.transaction():
                x = await emit(x_conn, "asset.ready", tenant_id=1, aggregate_id=asset, payload={})
            y = await emit(y_conn, "asset.deleted", tenant_id=1, aggregate_id=asset, payload={})
            await y_tx.commit()
            await passes(relay, 2)
            made = await pool.fetch(
                "SELECT e.event_id FROM outbox_deliveries d"
                " JOIN outbox_events e ON e.id = d.outbox_event_id"
            )
            assert [r["event_id"] for r in made] == [y]  # Y picked up, X not yet
            assert receiver.ids() == []  # and Y waits for X
            await hold_tx.rollback()
        await passes(relay, 3)
    assert receiver.ids() == [str(x), str(y)]


# -- NOTIFY ------------------------------------------------------------------------------------


async def test_notify_is_heard_at_commit_and_never_on_rollback(config: Config, pool: Pool) -> None:
    heard: list[dict[str, Any]] = []
    listener = await asyncpg.connect(config.database.url)
    try:
        await listener.add_listener(
            NOTIFY_CHANNEL, lambda _c, _pid, _ch, payload: heard.append(json.loads(payload))
        )
        aggregate = uuid.uuid4()
        async with pool.acquire() as conn:
            tx = conn.transaction()
            await tx.start()
            event_id = await emit(
                conn, "output.lost", tenant_id=3, aggregate_id=aggregate, payload={"x": 1}
            )
            await anyio.sleep(0.3)
            assert heard == []
            await tx.commit()
            with anyio.fail_after(5):
                while not heard:
                    await anyio.sleep(0.01)
            assert heard == [
                {
                    "event_id": str(event_id),
                    "event_type": "output.lost",
                    "aggregate_id": str(aggregate),
                    "tenant_id": 3,
                }
            ]
            tx = conn.transaction()
            await tx.start()
            await emit(conn, "asset.ready", tenant_id=3, aggregate_id=None, payload={})
            await tx.rollback()
        await listener.execute("SELECT 1")  # a round trip: anything pending has arrived
        await anyio.sleep(0.3)
        assert len(heard) == 1
        assert await pool.fetchval("SELECT count(*) FROM outbox_events") == 1
    finally:
        await listener.close()


# -- concurrency and the background relay ------------------------------------------------------


async def test_two_relays_never_send_one_delivery_twice(pool: Pool) -> None:
    async with open_receiver() as receiver:
        receiver.slow_seconds = 0.05
        receiver.rule = lambda _r, _n: "slow"
        config = outbox_config(receiver)
        async with open_relay(config, pool) as one, open_relay(config, pool) as two:
            shared = uuid.uuid4()
            ids = [await emit_one(pool, "asset.ready") for _ in range(30)]
            ids += [await emit_one(pool, "asset.ready", shared) for _ in range(5)]
            for _ in range(8):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(one.deliver_once)
                    tg.start_soon(two.deliver_once)
    counts = Counter(receiver.ids())
    assert set(counts) == set(ids)
    assert set(counts.values()) == {1}
    shared_order = [i for i in receiver.ids() if i in ids[30:]]
    assert shared_order == ids[30:]
    assert all(r["delivered_at"] is not None for r in await deliveries(pool))


async def test_background_relay_is_woken_by_notify(config: Config, pool: Pool) -> None:
    async with open_receiver() as receiver:
        relay_config = msgspec.structs.replace(outbox_config(receiver), poll_interval_seconds=30.0)
        async with open_outbox_relay(relay_config, pool, database=config.database):
            with anyio.fail_after(5):
                while not await pool.fetchval(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                    " AND query LIKE 'LISTEN%'"
                ):
                    await anyio.sleep(0.01)
            event_id = await emit_one(pool)
            with anyio.fail_after(5):
                while not receiver.received:
                    await anyio.sleep(0.01)
            with anyio.fail_after(5):
                while not await pool.fetchval(
                    "SELECT count(*) FROM outbox_deliveries WHERE delivered_at IS NOT NULL"
                ):
                    await anyio.sleep(0.01)
    assert receiver.ids() == [event_id]


async def test_an_event_emitted_while_the_listen_opens_is_delivered_at_once(
    config: Config, pool: Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    emitted: list[uuid.UUID] = []
    opening = listening.open_connection

    def open_after_an_event(database: Any) -> Any:
        cm = opening(database)  # the relay is running: its first pass found nothing

        class EmitFirst:
            async def __aenter__(self) -> Any:
                emitted.append(await emit_one(pool))  # its NOTIFY reaches nobody
                return await cm.__aenter__()

            async def __aexit__(self, *exc: Any) -> Any:
                return await cm.__aexit__(*exc)

        return EmitFirst()

    monkeypatch.setattr(listening, "open_connection", open_after_an_event)
    async with open_receiver() as receiver:
        relay_config = msgspec.structs.replace(outbox_config(receiver), poll_interval_seconds=30.0)
        async with open_outbox_relay(relay_config, pool, database=config.database):
            with anyio.fail_after(5):
                while not receiver.received:
                    await anyio.sleep(0.01)
    assert receiver.ids() == emitted[:1]


async def test_background_relay_retries_on_its_own(pool: Pool) -> None:
    async with open_receiver() as receiver:
        receiver.rule = lambda _r, nth: 500 if nth < 3 else 200
        async with open_outbox_relay(outbox_config(receiver), pool):
            event_id = await emit_one(pool)
            with anyio.fail_after(10):
                while len(receiver.received) < 3:
                    await anyio.sleep(0.01)
    assert receiver.ids() == [event_id] * 3


async def test_stopping_mid_request_hands_the_delivery_back(pool: Pool) -> None:
    async with open_receiver() as receiver:
        receiver.slow_seconds = 0.4
        receiver.rule = lambda _r, _n: "slow"
        async with open_outbox_relay(outbox_config(receiver), pool):
            await emit_one(pool)
            with anyio.fail_after(5):
                while not receiver.received:
                    await anyio.sleep(0.01)
        [row] = await deliveries(pool)
        assert row["lease_token"] is None
        assert row["attempts"] == 0  # refunded
        assert row["delivered_at"] is None
        due = await pool.fetchval("SELECT next_attempt_at <= now() FROM outbox_deliveries")
        assert due is True


# -- emit, config, pure rules --------------------------------------------------------------------


async def test_emit_refuses_an_unknown_event_type(pool: Pool) -> None:
    async with pool.acquire() as conn:
        with pytest.raises(ValueError, match="unknown outbox event type"):
            await emit(conn, "asset.exploded", tenant_id=1, aggregate_id=None, payload={})
    assert await pool.fetchval("SELECT count(*) FROM outbox_events") == 0


@pytest.mark.parametrize(
    ("hook", "message"),
    [
        ({"url": "ftp://example.com/h"}, "outbox.webhooks.crm.url: scheme must be http or https"),
        ({"url": "https://user:pw@example.com/h"}, "outbox.webhooks.crm.url: no user"),
        ({"url": "https://user@example.com/h"}, "outbox.webhooks.crm.url: no user"),
        ({"url": "https:///h"}, "outbox.webhooks.crm.url: no host"),
        ({"url": "https://example.com:99999/h"}, "outbox.webhooks.crm.url: not a URL"),
        ({"secrets": []}, "outbox.webhooks.crm.secrets: missing"),
        ({"secret": "old"}, r"outbox.webhooks.crm.secret: deprecated, and secrets is set too"),
        ({"secrets": ["plain"]}, r"outbox.webhooks.crm.secrets\[0\]: a secret is whsec_"),
        (
            {"secrets": [SECRET, "whsec_!!"]},
            r"outbox.webhooks.crm.secrets\[1\]: a secret is whsec_",
        ),
        ({"secrets": ["whsec_c2hvcnQ="]}, r"outbox.webhooks.crm.secrets\[0\]: .* 24 to 64 bytes"),
        ({"secrets": [SECRET, SECRET]}, "outbox.webhooks.crm.secrets: listed twice"),
        ({"timeout_seconds": 0}, "outbox.webhooks.crm.timeout_seconds: must be positive"),
        ({"max_attempts": -1}, r"outbox.webhooks.crm.max_attempts: must be at least 1 \(0: no"),
        ({"retry_for_seconds": -1.0}, "outbox.webhooks.crm.retry_for_seconds: must not be neg"),
        ({"event_types": ["asset.ready", "nope"]}, "outbox.webhooks.crm.event_types: unknown"),
    ],
)
def test_webhook_config_errors_name_the_key(hook: dict[str, Any], message: str) -> None:
    settings: dict[str, Any] = {"url": "https://hooks.example.com/in", "secrets": [SECRET]}
    settings.update(hook)
    config = OutboxConfig(webhooks={"crm": WebhookConfig(**settings)})
    with pytest.raises(ConfigError, match=f"^config error: {message}"):
        validate_outbox(config)


def test_webhook_names_and_a_good_config() -> None:
    good = WebhookConfig(url="http://127.0.0.1:8080/hook?x=1", secrets=[SECRET])
    validate_outbox(OutboxConfig(webhooks={"crm-1": good}))
    with pytest.raises(ConfigError, match=r"outbox\.webhooks\.CRM: name"):
        validate_outbox(OutboxConfig(webhooks={"CRM": good}))
    with pytest.raises(ConfigError, match=r"outbox\.batch_size: must be positive"):
        validate_outbox(OutboxConfig(batch_size=0))
    decoded = msgspec.convert(
        {"webhooks": {"crm": {"url": "https://h.example/x", "secret": "s"}}}, OutboxConfig
    )
    assert decoded.webhooks["crm"].max_attempts == 0  # no cap: the window alone
    assert decoded.webhooks["crm"].retry_for_seconds == 86400.0
    with pytest.raises(msgspec.ValidationError, match="unknown field"):
        msgspec.convert({"notify_channel": "x"}, OutboxConfig)


def test_webhook_secrets_are_masked_in_the_effective_config() -> None:
    hook = WebhookConfig(url="https://h.example/x", secrets=[SECRET, NEW_SECRET])
    shown = masked(Config(outbox=OutboxConfig(webhooks={"crm": hook})))
    assert shown["outbox"]["webhooks"]["crm"]["secrets"] == "***"
    assert SECRET not in repr(shown)


def test_signatures_match_the_standard_webhooks_published_vector() -> None:
    # The vector of the Standard Webhooks reference libraries' tests.
    key = secret_key("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
    body = b'{"test": 2432232314}'
    expected = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
    assert signatures([key], "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body) == expected
    other = secret_key(NEW_SECRET)
    both = signatures([key, other], "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body)
    assert both.split(" ")[0] == expected
    assert len(both.split(" ")) == 2


def day_of_failures(rand: Callable[[], float]) -> tuple[list[float], Any]:
    """Every attempt's start (seconds after the first) until the relay gives up, under the
    default configuration, with a receiver that answers 500 forever."""
    config, hook = OutboxConfig(), WebhookConfig(url="https://h.example/x", secrets=[SECRET])
    starts, attempts = [0.0], 1
    while True:
        outcome = judge(
            Attempt(500, "HTTP 500"),
            attempts=attempts,
            retrying_seconds=starts[-1],
            retry_for_seconds=hook.retry_for_seconds,
            max_attempts=hook.max_attempts,
            base_seconds=config.backoff_base_seconds,
            max_seconds=config.backoff_max_seconds,
            rand=rand,
        )
        if outcome.kind != "retry":
            return starts, outcome
        assert 0.0 <= outcome.delay_seconds <= config.backoff_max_seconds
        starts.append(starts[-1] + outcome.delay_seconds)
        attempts += 1


def test_by_default_a_failing_delivery_is_retried_for_a_day_then_dead() -> None:
    for seed in range(20):
        starts, outcome = day_of_failures(random.Random(seed).random)
        assert outcome.kind == "dead"
        assert outcome.reason == "retried for 86400s"
        # The last attempt lands at the end of the window, not before it.
        assert starts[-1] == 86400.0
        assert 20 <= len(starts) <= 400
        # Exponential at first: the early ceilings are 2, 4, 8… seconds (full jitter below).
        assert starts[1] <= 2.0 and starts[2] - starts[1] <= 4.0
    # Always at the ceiling: 2, 4 … 2048 s, then the hour's cap.
    starts, _ = day_of_failures(lambda: 1.0)
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert gaps[:12] == [2.0 * 2**n for n in range(11)] + [3600.0]
    assert set(gaps[12:-1]) == {3600.0}


def test_max_attempts_caps_the_window_when_set() -> None:
    outcome = judge(
        Attempt(None, "refused"),
        attempts=5,
        retrying_seconds=60.0,
        retry_for_seconds=86400.0,
        max_attempts=5,
        base_seconds=2.0,
        max_seconds=3600.0,
    )
    assert (outcome.kind, outcome.reason) == ("dead", "retry budget spent (5/5)")
    after_retry_after = judge(
        Attempt(503, retry_after_seconds=7200.0),
        attempts=2,
        retrying_seconds=86000.0,
        retry_for_seconds=86400.0,
        base_seconds=2.0,
        max_seconds=3600.0,
    )
    assert (after_retry_after.kind, after_retry_after.delay_seconds) == ("retry", 400.0)


def test_schedule_delivers_retries_and_buries() -> None:
    def outcome(status: int | None, attempts: int, retry_after: float | None = None) -> Any:
        return judge(
            Attempt(status, retry_after_seconds=retry_after),
            attempts=attempts,
            retrying_seconds=0.0,
            retry_for_seconds=86400.0,
            max_attempts=3,
            base_seconds=2.0,
            max_seconds=600.0,
            rand=lambda: 1.0,
        )

    assert outcome(204, 1).kind == "delivered"
    assert (outcome(500, 1).kind, outcome(500, 1).delay_seconds) == ("retry", 2.0)
    assert outcome(None, 2).delay_seconds == 4.0
    assert outcome(429, 1, retry_after=45.0).delay_seconds == 45.0
    assert outcome(404, 1).kind == "retry"
    assert outcome(500, 3).kind == "dead"
    assert Attempt(404).receiver_rejected and Attempt(302).receiver_rejected
    assert not Attempt(429).receiver_rejected and not Attempt(None).receiver_rejected
    assert parse_retry_after("12") == 12.0
    assert parse_retry_after("soon") is None
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0


async def test_every_delivery_carries_the_videos_passthrough_as_it_was_when_emitted(
    pool: Pool,
) -> None:
    tenant = await pool.fetchval("INSERT INTO tenants (name) VALUES ('pt') RETURNING id")
    video = uuid.uuid4()
    await pool.execute(
        "INSERT INTO upload_sessions (id, tenant_id, status, method, content_type,"
        " declared_size_bytes, declared_sha256, expires_at, passthrough)"
        " VALUES ($1, $2, 'AWAITING_UPLOAD', 'API_PUT', 'video/mp4', 1, $3,"
        " now() + interval '1 h', 'order-42')",
        video,
        tenant,
        "a" * 64,
    )
    async with (
        open_receiver() as receiver,
        open_relay(outbox_config(receiver, max_attempts=2), pool) as relay,
    ):
        await emit_one(pool, "asset.ready", video, asset_id=str(video))
        # Changed after the event: the body stays what it was (byte-identical retries).
        await pool.execute(
            "UPDATE upload_sessions SET passthrough = 'changed' WHERE id = $1", video
        )
        await emit_one(pool, "asset.deleted", uuid.uuid4())  # an aggregate with none
        await passes(relay, 2)
    bodies = {r.data["type"]: r.data for r in receiver.received}
    assert bodies["asset.ready"]["passthrough"] == "order-42"
    assert bodies["asset.deleted"]["passthrough"] is None
