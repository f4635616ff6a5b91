"""Where the outbox relay sends: a configured webhook, or a tenant's own receiver.

A tenant's receiver URL is written by a tenant, not the operator, so it is held to the same
address policy as a provider URL the fetch dials (``net/policy.py``): checked as written,
then again at every connection by the pinning resolver and the guarded socket factory. A
name that resolves to the metadata service or loopback is refused however it looked at
creation; only ``[net] allow_cidrs`` (tests, labs) makes an exception, as for fetches.
The provider host allowlist (``allowed_host_suffixes``) is a rule about providers and does
not apply, and redirects are never followed (a signed body goes where the tenant said).
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
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
