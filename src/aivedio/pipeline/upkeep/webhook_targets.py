"""Where the outbox relay sends: a configured webhook, or a tenant's own receiver.

A tenant's receiver URL is written by a tenant, not the operator, so it is held to the same
address policy as a provider URL the fetch dials (``net/policy.py``): checked as written,
then again at every connection by the pinning resolver and the guarded socket factory. A
name that resolves to the metadata service or loopback is refused however it looked at
creation; only ``[net] allow_cidrs`` (tests, labs) makes an exception, as for fetches.
The provider host allowlist (``allowed_host_suffixes``) is a rule about providers and does
not apply, and redirects are never followed (a signed body goes where the tenant said).

The relay wakes at every outbox event and reads its targets at every pass; the tenants'
receivers it read are kept (``ReceiverCache``) until a change may have happened: a NOTIFY on
``RECEIVERS_CHANNEL`` (sent at commit by a trigger on ``webhook_receivers``, for any change:
created, rotated, deleted) or a gap in the LISTEN that would hear it. While the relay does
not listen, or a replaced secret still signs (when it stops is the database clock's to say),
they are read at every pass, as before. A pass that used the set just before a change
committed is the race a read at every pass has too.
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass

import aiohttp
import anyio

from aivedio.config.net import NetConfig
from aivedio.config.outbox import WebhookConfig
from aivedio.crypto import UrlCipher
from aivedio.net.connector import AsyncioTlsConnector
from aivedio.net.policy import FetchPolicy
from aivedio.net.resolver import PinningResolver, guarded_socket_factory
from aivedio.store.webhook_receivers import ActiveReceiver, WebhookReceiverStore

RECEIVERS_CHANNEL = "aivedio_receivers"  # migration 0026

# Bound on closing the resolver while the relay stops.
CLOSE_TIMEOUT_SECONDS = 5.0


@dataclass(frozen=True, slots=True)
class Target:
    """One endpoint as the relay sends to it: a configured webhook, or a tenant's receiver
    (only its tenant's events; its URL under the address policy)."""

    hook: WebhookConfig
    tenant_id: int | None = None
    guarded: bool = False


@dataclass(frozen=True)
class TenantDelivery:
    """How tenants' own receivers are reached: the cipher their secrets are sealed with, the
    address policy their URLs are held to, and how long one of them may take to answer."""

    cipher: UrlCipher
    policy: FetchPolicy
    nameservers: tuple[str, ...] = ()
    ssl_context: ssl.SSLContext | None = None
    timeout_seconds: float = 10.0


class ReceiverCache:
    """The tenants' receivers as last read, and whether they can be used again: read again
    after a change was announced (``changed``), while not listening, or during a rotation's
    grace. Owns nothing but that decision; the relay owns the LISTEN that feeds it."""

    def __init__(self, receivers: WebhookReceiverStore) -> None:
        self.receivers = receivers
        self.listening = False
        self._changes = 0  # changes announced so far
        self._read_at: int | None = None  # ``_changes`` when the kept set was read
        self._kept: list[ActiveReceiver] = []

    def changed(self) -> None:
        """A change was announced (or may have been missed): read again at the next pass."""
        self._changes += 1

    def heard(self, *_args: object) -> None:
        """The LISTEN's callback for ``RECEIVERS_CHANNEL``."""
        self.changed()

    def listen(self, listening: bool) -> None:
        self.listening = listening
        self.changed()  # what happened while nobody listened is unknown

    def stopped(self) -> None:
        self.listen(False)

    async def active(self) -> list[ActiveReceiver]:
        if self.listening and self._read_at == self._changes:
            return self._kept
        changes = self._changes  # a change announced during the read makes it stale
        self._kept = await self.receivers.active()
        graced = any(len(r.secrets) > 1 for r in self._kept)
        self._read_at = None if graced else changes
        return self._kept


async def read_targets(
    hooks: Mapping[str, WebhookConfig],
    receivers: ReceiverCache | None,
    tenants: TenantDelivery | None,
) -> dict[str, Target]:
    """The configured webhooks, and every tenant receiver as it is now (secrets rotated or
    receivers deleted since the last read included)."""
    targets = {name: Target(hook) for name, hook in hooks.items()}
    if receivers is not None and tenants is not None:
        for r in await receivers.active():
            hook = WebhookConfig(
                url=r.url,
                secrets=r.secrets,
                event_types=r.event_types,
                timeout_seconds=tenants.timeout_seconds,
            )
            targets[r.endpoint] = Target(hook, tenant_id=r.tenant_id, guarded=True)
    return targets


def receiver_policy(net: NetConfig) -> FetchPolicy:
    """The fetch's policy for tenants' webhook URLs: its schemes, ports and deny table (with
    ``allow_cidrs``, the only exception), not its provider host allowlist, and no redirect."""
    return FetchPolicy(
        allowed_schemes=frozenset(net.allowed_schemes),
        allowed_ports=frozenset(net.allowed_ports),
        allow_cidrs=tuple(net.allow_cidrs),
        max_redirects=0,
    )


@asynccontextmanager
async def open_guarded_session(
    tenants: TenantDelivery, connections: int
) -> AsyncIterator[aiohttp.ClientSession]:
    """The session tenants' receivers are reached through: the pinning resolver and the
    guarded socket factory check every address against the policy, as the fetch does."""
    resolver = PinningResolver(tenants.policy, tenants.nameservers)
    connector = AsyncioTlsConnector(
        resolver=resolver,
        use_dns_cache=False,
        limit=max(connections, 1),
        ssl=tenants.ssl_context or ssl.create_default_context(),
        socket_factory=guarded_socket_factory(tenants.policy),
    )
    try:
        async with aiohttp.ClientSession(
            connector=connector,
            trust_env=False,
            cookie_jar=aiohttp.DummyCookieJar(),
            timeout=aiohttp.ClientTimeout(total=None),
        ) as session:
            yield session
    finally:
        with anyio.CancelScope(shield=True), anyio.move_on_after(CLOSE_TIMEOUT_SECONDS):
            await resolver.close()
