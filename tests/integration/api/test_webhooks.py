"""``/v1/webhooks``: a tenant's own receivers, created and rotated through the API and
delivered by the real relay to a receiver on loopback, verified on the receiving side by the
``standardwebhooks`` package. Loopback is reachable only because these tests allow it
(``[net] allow_cidrs``), as the fetch tests do; without that, the API and the relay refuse it.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest
from standardwebhooks import Webhook, WebhookVerificationError

from aivedio.config.load import Config
from aivedio.config.net import NetConfig
from aivedio.config.outbox import OutboxConfig
from aivedio.pipeline.upkeep.outbox_relay import OutboxRelay
from aivedio.pipeline.upkeep.webhook_targets import (
    RECEIVERS_CHANNEL,
    ReceiverCache,
    TenantDelivery,
    open_guarded_session,
    receiver_policy,
)
from aivedio.store import listening
from aivedio.store.database import Pool
from aivedio.store.outbox import emit
from aivedio.store.webhook_receivers import ActiveReceiver, WebhookReceiverStore
from aivedio.supervision import Loop
from tests.integration.pipeline.upkeep.test_outbox_relay import Receiver, open_receiver
from tests.support.api_rig import Api, open_api

pytestmark = [pytest.mark.anyio, pytest.mark.integration]


def loopback_net(port: int) -> NetConfig:
    return NetConfig(allowed_schemes=["http"], allowed_ports=[port], allow_cidrs=["127.0.0.0/8"])


@asynccontextmanager
async def open_tenant_relay(api: Api, net: NetConfig) -> AsyncIterator[OutboxRelay]:
    """A relay for tenants' receivers only, driven by hand (no jitter)."""
    tenants = TenantDelivery(cipher=api.ctx.cipher, policy=receiver_policy(net))
    async with open_guarded_session(tenants, 4) as guarded:
        relay = OutboxRelay(
            OutboxConfig(),
            api.rig.pool,
            guarded,
            rand=lambda: 0.0,
            tenants=tenants,
            guarded_session=guarded,
        )
        await relay.register()
        yield relay


async def emit_for(pool: Pool, tenant_id: int, event_type: str = "asset.ready") -> str:
    async with pool.acquire() as conn, conn.transaction():
        event_id = await emit(
            conn, event_type, tenant_id=tenant_id, aggregate_id=uuid.uuid4(), payload={"n": 1}
        )
    return str(event_id)


def verify(secret: str, request: Any) -> Any:
    return Webhook(secret).verify(request.body, dict(request.headers.items()))


@asynccontextmanager
async def api_with_receiver(
    config: Config, pool: Pool, tmp_path: Path
) -> AsyncIterator[tuple[Api, Receiver, NetConfig]]:
    async with open_receiver() as receiver:
        port = int(receiver.base_url.rsplit(":", 1)[1])
        net = loopback_net(port)
        async with open_api(msgspec.structs.replace(config, net=net), pool, tmp_path) as api:
            yield api, receiver, net


async def test_a_tenants_receiver_gets_its_events_signed_with_the_secret_shown_once(
    config: Config, pool: Pool, tmp_path: Path
) -> None:
    async with api_with_receiver(config, pool, tmp_path) as (api, receiver, net):
        before = await emit_for(pool, api.rig.tenant_id)  # before the receiver: not sent
        created = await api.json(
            "POST",
            "/v1/webhooks",
            expect=201,
            json={"url": receiver.url("mine"), "event_types": ["asset.ready"]},
        )
        secret = created["secret"]
        assert secret.startswith("whsec_")
        webhook_id = created["webhook_id"]
        shown = await api.json("GET", f"/v1/webhooks/{webhook_id}")
        assert "secret" not in shown
        assert shown["url"] == receiver.url("mine")
        listed = await api.json("GET", "/v1/webhooks")
        assert [w["webhook_id"] for w in listed["data"]] == [webhook_id]

        other_tenant, other_key = await api.tenant("globex")
        mine = await emit_for(pool, api.rig.tenant_id)
        await emit_for(pool, other_tenant)  # another tenant's: never sent here
        await emit_for(pool, api.rig.tenant_id, "asset.deleted")  # not subscribed
        async with open_tenant_relay(api, net) as relay:
            await relay.deliver_once()
            await relay.deliver_once()
        assert receiver.ids() == [mine]
        [request] = receiver.received
        body = verify(secret, request)
        assert (body["id"], body["tenant_id"]) == (mine, api.rig.tenant_id)
        assert before not in receiver.ids()

        page = await api.json("GET", "/v1/webhooks/deliveries")
        assert [(d["event_id"], d["webhook_id"], d["state"]) for d in page["data"]] == [
            (mine, webhook_id, "delivered")
        ]
        # Another tenant sees none of it.
        assert (await api.json("GET", "/v1/webhooks", key=other_key))["data"] == []
        await api.json("GET", f"/v1/webhooks/{webhook_id}", key=other_key, expect=404)
        await api.json("DELETE", f"/v1/webhooks/{webhook_id}", key=other_key, expect=404)
        empty = await api.json("GET", "/v1/webhooks/deliveries", key=other_key)
        assert empty == {"data": [], "next_cursor": None}


async def test_after_a_rotation_both_secrets_sign_until_the_old_one_expires(
    config: Config, pool: Pool, tmp_path: Path
) -> None:
    async with api_with_receiver(config, pool, tmp_path) as (api, receiver, net):
        created = await api.json("POST", "/v1/webhooks", expect=201, json={"url": receiver.url()})
        old = created["secret"]
        rotated = await api.json("POST", f"/v1/webhooks/{created['webhook_id']}/rotate-secret")
        new = rotated["secret"]
        assert new != old and new.startswith("whsec_")
        assert rotated["previous_secret_expires_at"] is not None
        await emit_for(pool, api.rig.tenant_id)
        async with open_tenant_relay(api, net) as relay:
            await relay.deliver_once()
            [request] = receiver.received
            assert len(request.headers["webhook-signature"].split(" ")) == 2
            verify(old, request)
            verify(new, request)
            # The old secret's day is over: only the new one signs.
            await pool.execute(
                "UPDATE webhook_receivers SET previous_secret_expires_at = now() - interval '1s'"
            )
            await emit_for(pool, api.rig.tenant_id)
            await relay.deliver_once()
        later = receiver.received[1]
        verify(new, later)
        with pytest.raises(WebhookVerificationError):
            verify(old, later)
        # Sealed at rest: neither secret is in the row.
        row = await pool.fetchrow("SELECT * FROM webhook_receivers")
        assert row is not None
        assert old.encode() not in bytes(row["secrets_ciphertext"])
        assert new[6:].encode() not in bytes(row["secrets_ciphertext"])


@pytest.mark.parametrize(
    ("url", "code"),
    [
        ("https://169.254.169.254/latest/meta-data/", "ip_denied"),
        ("https://127.0.0.1/hook", "ip_denied"),
        ("https://[::1]/hook", "ip_denied"),
        ("http://hooks.example.com/in", "scheme_not_allowed"),
        ("https://hooks.example.com:8443/in", "port_not_allowed"),
        ("https://user:pw@hooks.example.com/in", "userinfo_present"),
        ("https://2130706433/in", "numeric_host"),
    ],
)
async def test_a_url_the_fetch_policy_refuses_is_refused(
    config: Config, pool: Pool, tmp_path: Path, url: str, code: str
) -> None:
    async with open_api(config, pool, tmp_path) as api:  # the default policy: public HTTPS
        async with api.http.post(
            api.base + "/v1/webhooks", json={"url": url}, headers=api.auth()
        ) as response:
            assert response.status == 422
            error = (await response.json())["error"]
        assert (error["code"], error["field"]) == (code, "$.url")
        assert await pool.fetchval("SELECT count(*) FROM webhook_receivers") == 0


async def test_the_relay_refuses_a_receiver_address_the_policy_denies_when_dialling(
    config: Config, pool: Pool, tmp_path: Path
) -> None:
    async with api_with_receiver(config, pool, tmp_path) as (api, receiver, net):
        created = await api.json("POST", "/v1/webhooks", expect=201, json={"url": receiver.url()})
        event_id = await emit_for(pool, api.rig.tenant_id)
        # The operator narrows the policy later (no loopback): the stored URL is checked again.
        strict = msgspec.structs.replace(net, allow_cidrs=[])
        async with open_tenant_relay(api, strict) as relay:
            await relay.deliver_once()
        assert receiver.received == []
        page = await api.json("GET", "/v1/webhooks/deliveries", params={"state": "pending"})
        [delivery] = page["data"]
        assert (delivery["event_id"], delivery["webhook_id"]) == (event_id, created["webhook_id"])
        assert delivery["last_error"].startswith("blocked: ip_denied:loopback")


async def test_a_dead_delivery_is_retried_by_its_tenant_and_pages_hold_still(
    config: Config, pool: Pool, tmp_path: Path
) -> None:
    async with api_with_receiver(config, pool, tmp_path) as (api, receiver, net):
        receiver.rule = lambda _r, _n: 500
        await api.json("POST", "/v1/webhooks", expect=201, json={"url": receiver.url()})
        events = [await emit_for(pool, api.rig.tenant_id) for _ in range(5)]
        async with open_tenant_relay(api, net) as relay:
            await relay.deliver_once()
            await pool.execute("UPDATE outbox_deliveries SET dead_at = now()")  # a day later
            first = await api.json("GET", "/v1/webhooks/deliveries", params={"limit": "2"})
            assert [d["state"] for d in first["data"]] == ["dead", "dead"]
            rest = await api.json(
                "GET",
                "/v1/webhooks/deliveries",
                params={"limit": "10", "cursor": first["next_cursor"]},
            )
            assert rest["next_cursor"] is None
            walked = [d["event_id"] for d in first["data"] + rest["data"]]
            assert walked == list(reversed(events))
            await api.json(
                "GET", "/v1/webhooks/deliveries", params={"cursor": "bm9wZQ"}, expect=400
            )

            receiver.rule = lambda _r, _n: 200
            retried = await api.json("POST", f"/v1/webhooks/deliveries/{events[0]}/retry")
            assert [r["event_id"] for r in retried["replayed"]] == [events[0]]
            await relay.deliver_once()
            await api.json("POST", f"/v1/webhooks/deliveries/{events[0]}/retry", expect=404)
        assert receiver.ids().count(events[0]) == 2
        delivered = await api.json("GET", "/v1/webhooks/deliveries", params={"state": "delivered"})
        assert [d["event_id"] for d in delivered["data"]] == [events[0]]


async def test_deleting_a_receiver_stops_its_deliveries(
    config: Config, pool: Pool, tmp_path: Path
) -> None:
    async with api_with_receiver(config, pool, tmp_path) as (api, receiver, net):
        created = await api.json("POST", "/v1/webhooks", expect=201, json={"url": receiver.url()})
        await emit_for(pool, api.rig.tenant_id)
        deleted = await api.json("DELETE", f"/v1/webhooks/{created['webhook_id']}")
        assert deleted == {"webhook_id": created["webhook_id"], "deleted": True}
        async with open_tenant_relay(api, net) as relay:
            assert await relay.deliver_once() == 0
        await anyio.sleep(0)
        assert receiver.received == []
        assert await pool.fetchval("SELECT count(*) FROM outbox_endpoints") == 0
        await api.json("GET", f"/v1/webhooks/{created['webhook_id']}", expect=404)
        assert (await api.json("GET", "/v1/webhooks"))["data"] == []
        # Deleting again answers as the first time; the tombstone holds no secret.
        again = await api.json("DELETE", f"/v1/webhooks/{created['webhook_id']}")
        assert again == deleted
        sealed = await pool.fetchval("SELECT secrets_ciphertext FROM webhook_receivers")
        assert bytes(sealed) == b""
        await api.json("DELETE", f"/v1/webhooks/{uuid.uuid4()}", expect=404)


class CountingReceivers(WebhookReceiverStore):
    """The real store, counting its reads of every receiver."""

    reads = 0

    async def active(self) -> list[ActiveReceiver]:
        self.reads += 1
        return await super().active()


async def test_the_relay_reads_the_receivers_again_only_when_a_change_is_announced(
    config: Config, pool: Pool, tmp_path: Path
) -> None:
    async with api_with_receiver(config, pool, tmp_path) as (api, receiver, _net):
        store = CountingReceivers(pool, api.ctx.cipher)
        cache = ReceiverCache(store)
        listening_now, heard = anyio.Event(), [anyio.Event()]

        def on_heard(*args: object) -> None:
            cache.heard(*args)
            heard[0].set()

        def on_listening() -> None:
            cache.listen(True)
            listening_now.set()

        async def announced() -> None:
            with anyio.fail_after(10):
                await heard[0].wait()
            heard[0] = anyio.Event()

        async with anyio.create_task_group() as tg:
            tg.start_soon(
                partial(
                    listening.run,
                    Loop("receivers_listen"),
                    config.database,
                    {RECEIVERS_CHANNEL: on_heard},
                    on_listening=on_listening,
                    on_stopped=cache.stopped,
                )
            )
            with anyio.fail_after(10):
                await listening_now.wait()
            assert await cache.active() == [] and store.reads == 1
            assert await cache.active() == [] and store.reads == 1  # kept: nothing changed
            created = await api.json(
                "POST", "/v1/webhooks", expect=201, json={"url": receiver.url()}
            )
            await announced()  # the trigger's NOTIFY, at the creation's commit
            [active] = await cache.active()
            assert active.url == receiver.url() and store.reads == 2
            await cache.active()
            assert store.reads == 2
            # A rotation's grace: the replaced secret signs until the database's clock says
            # otherwise, so the receivers are read at every pass meanwhile.
            await api.json("POST", f"/v1/webhooks/{created['webhook_id']}/rotate-secret")
            await announced()
            assert len((await cache.active())[0].secrets) == 2
            await cache.active()
            assert store.reads == 4
            await api.json("DELETE", f"/v1/webhooks/{created['webhook_id']}")
            await announced()
            assert await cache.active() == [] and store.reads == 5
            cache.stopped()  # not listening: nothing would announce a change
            await cache.active()
            await cache.active()
            assert store.reads == 7
            tg.cancel_scope.cancel()
