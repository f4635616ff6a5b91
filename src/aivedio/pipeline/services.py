"""Building the stages' seams from configuration: one place, used by the worker and the CLI."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager

from aivedio.config.load import Config, NetConfig, ProviderConfig
from aivedio.crypto import UrlCipher
from aivedio.net.fetch import Fetcher, FetchLimits
from aivedio.net.limits import HostLimiter
from aivedio.net.policy import FetchPolicy
from aivedio.pipeline.fetch import FetchServices, FetchStage
from aivedio.pipeline.upkeep.webhook_targets import TenantDelivery, receiver_policy
from aivedio.providers import build_adapter
from aivedio.providers.seam import ProviderAdapter
from aivedio.store.database import Pool
from aivedio.store.objects.base import ObjectStore
from aivedio.store.objects.opening import open_object_store
from aivedio.store.queue import Queue


def url_cipher(config: Config) -> UrlCipher:
    sec = config.security
    return UrlCipher.from_base64(
        sec.url_encryption_key_id, sec.url_encryption_key, sec.previous_url_encryption_keys
    )


def fetch_policy(net: NetConfig, provider: ProviderConfig | None = None) -> FetchPolicy:
    suffixes = list(net.allowed_host_suffixes)
    ports = list(net.allowed_ports)
    if provider is not None:
        if provider.allowed_host_suffixes is not None:
            suffixes = list(provider.allowed_host_suffixes)
        if provider.allowed_ports is not None:
            ports = list(provider.allowed_ports)
    return FetchPolicy(
        allowed_schemes=frozenset(net.allowed_schemes),
        allowed_ports=frozenset(ports),
        allowed_host_suffixes=tuple(suffixes),
        allow_cidrs=tuple(net.allow_cidrs),
        max_redirects=net.max_redirects,
    )


def fetch_limits(net: NetConfig, provider: ProviderConfig | None = None) -> FetchLimits:
    return FetchLimits(
        max_bytes=(provider.max_bytes if provider and provider.max_bytes else net.max_bytes),
        connect_timeout_seconds=net.connect_timeout_seconds,
        header_timeout_seconds=net.header_timeout_seconds,
        idle_read_timeout_seconds=net.idle_read_timeout_seconds,
        total_timeout_seconds=net.total_timeout_seconds,
        per_host_connections=net.per_host_connections,
        max_resumes=net.max_resumes,
        resume_backoff_seconds=net.resume_backoff_seconds,
    )


def ssl_context(net: NetConfig) -> ssl.SSLContext:
    context = ssl.create_default_context()
    if net.ca_file:
        context.load_verify_locations(cafile=net.ca_file)
    return context


def make_fetcher(net: NetConfig, provider: ProviderConfig | None = None) -> Fetcher:
    return Fetcher(
        fetch_policy(net, provider),
        fetch_limits(net, provider),
        nameservers=net.nameservers,
        ssl_context=ssl_context(net),
    )


def open_fetch_store(config: Config) -> AbstractAsyncContextManager[ObjectStore]:
    """The store as the fetch stage tunes it (multipart part size and parts in flight)."""
    return open_object_store(
        config.storage,
        part_size_bytes=config.fetch.part_size_bytes,
        parts_in_flight=config.fetch.parts_in_flight,
    )


@asynccontextmanager
async def open_fetch_stage(
    config: Config, pool: Pool, queue: Queue, store: ObjectStore | None = None
) -> AsyncIterator[FetchStage]:
    async with AsyncExitStack() as stack:
        if store is None:
            store = await stack.enter_async_context(open_fetch_store(config))
        fetchers: dict[str, Fetcher] = {"": make_fetcher(config.net)}
        adapters: dict[str, ProviderAdapter] = {}
        for name, pc in config.providers.items():
            fetchers[name] = make_fetcher(config.net, pc)
            adapter = build_adapter(name, pc, fetchers[name])
            if adapter is not None:
                adapters[name] = adapter
        for fetcher in fetchers.values():
            stack.push_async_callback(fetcher.aclose)
        services = FetchServices(
            config=config,
            pool=pool,
            queue=queue,
            store=store,
            cipher=url_cipher(config),
            fetchers=fetchers,
            adapters=adapters,
            hosts=HostLimiter(config.net.per_host_connections),
        )
        yield FetchStage(services)


def tenant_delivery(config: Config) -> TenantDelivery | None:
    """How this worker's relay reaches tenants' own webhook receivers; None when it does not
    (``[outbox] tenant_webhooks`` off, or a worker without fetch slots: no egress)."""
    fetch = config.worker.lanes.get("fetch")
    if not config.outbox.tenant_webhooks or fetch is None or fetch.slots <= 0:
        return None
    return TenantDelivery(
        cipher=url_cipher(config),
        policy=receiver_policy(config.net),
        nameservers=tuple(config.net.nameservers),
        ssl_context=ssl_context(config.net),
        timeout_seconds=config.outbox.tenant_webhook_timeout_seconds,
    )
