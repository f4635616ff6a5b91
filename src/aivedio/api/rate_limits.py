"""Rate limits: which token bucket each request is counted in, and the 429 when it is empty.

Scopes, each a table of buckets (``token_buckets.py``) with its rate in ``[api.rate_limits]``:

* ``key``: a route that needs an API key, once the key is verified: a bucket per key (its
  public prefix). One key's burst never slows another key.
* ``auth_failure``: a request to such a route whose key is missing, unknown or revoked
  takes a token from its client address's bucket, and an address whose bucket is empty is
  refused before its key is looked up, so a flood of wrong keys costs no database query.
  A valid key never takes from it.
* ``callback``: ``POST /v1/providers/{name}/callbacks`` of a configured provider: a bucket
  per (provider, client address), counted before the body is read (why, below).
* ``address``: everything else a client may call without a key (``/watch``, ``/media``,
  ``/static``, ``/openapi.json``, unknown paths, callbacks to an unknown provider): a bucket
  per client address.
* ``/healthz``, ``/readyz`` and ``/metrics`` are never limited: probes and scrapes must see
  an overloaded API as it is.

**Callbacks.** The promise: a provider sending within its rate is never refused. One
bucket per provider would break it, since anyone can post junk to the provider's URL and
drain it. Counting only requests whose signature verified would keep it, but then every
junk request is read (up to ``max_callback_bytes``) and verified before anything can refuse
it, and the junk still needs a bucket of its own, per sender. So the bucket is per
(provider, client address), taken before the body is read: junk drains only its sender's
bucket, and a provider's callbacks come from the provider's own addresses, each of which
gets the provider's whole rate, so however the provider spreads them it stays within every
bucket it uses. The cost: a provider whose egress address is shared with a hostile sender
(or hidden behind a proxy missing from ``trusted_proxies``) shares that sender's bucket;
list the proxy, or raise the provider's rate in ``callback_providers``.

**The client address** is the socket peer. ``X-Forwarded-For`` is believed only from a peer
in ``trusted_proxies``, and then read from the right: the first address that is not a
trusted proxy is the client; what lies left of it was written by the client and is ignored,
and an entry that is not an address ends the walk at the proxy that passed it on.
``Forwarded`` and ``X-Real-IP`` are not read (one header, one rule). IPv6 clients are
counted per /64: a host usually holds a whole /64, so per-address buckets would be free to
multiply.

Refusals are answered through ``problems.py`` (429 ``rate_limited`` with ``Retry-After`` in
whole seconds, at least 1), counted in ``aivedio_api_rate_limited_total{scope}``, and logged
once per run of refusals of one caller (``rate_limited``), never once per request.
"""

from __future__ import annotations

import ipaddress
import time
from collections.abc import Callable, Collection, Sequence

from aiohttp import web
from aiohttp.typedefs import Middleware

from aivedio.api.auth import API_KEY, TENANT, needs_key
from aivedio.api.problems import ApiError, Handler
from aivedio.api.token_buckets import Rate, RateLimiter, Verdict
from aivedio.config.api import RateLimitConfig, RateLimitsConfig
from aivedio.logs import get_logger
from aivedio.metrics import ApiMetrics

log = get_logger("aivedio.api")

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

SCOPES = ("key", "address", "auth_failure", "callback")
NEVER_LIMITED = frozenset({"/healthz", "/readyz", "/metrics"})
CALLBACK_ROUTE = "/v1/providers/{provider}/callbacks"
IPV6_PREFIX_BITS = 64


def _rate(config: RateLimitConfig) -> Rate:
    return Rate(per_second=config.rate_per_second, burst=config.burst)


def limiter_for(
    limits: RateLimitsConfig, clock: Callable[[], float] = time.monotonic
) -> RateLimiter:
    rates = {
        "key": _rate(limits.key),
        "address": _rate(limits.address),
        "auth_failure": _rate(limits.auth_failure),
        "callback": _rate(limits.callback),
    }
    overrides = {"callback": {n: _rate(r) for n, r in limits.callback_providers.items()}}
    return RateLimiter(rates, max_buckets=limits.max_buckets, overrides=overrides, clock=clock)


def _parse(text: str | None) -> IPAddress | None:
    try:
        ip = ipaddress.ip_address((text or "").strip())
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped  # a dual-stack socket's view of an IPv4 client
    return ip


def client_address(
    peer: str | None, forwarded_for: Sequence[str], trusted: Sequence[IPNetwork]
) -> str:
    """The bucket name of the client: an IPv4 address, an IPv6 /64, or the raw peer name
    when it is not an address (a Unix socket)."""
    ip = _parse(peer)
    if ip is None:
        return peer or "unknown"
    if any(ip in net for net in trusted):
        hops = [hop for value in forwarded_for for hop in value.split(",")]
        for hop in reversed(hops):
            candidate = _parse(hop)
            if candidate is None:
                break
            ip = candidate
            if not any(candidate in net for net in trusted):
                break
    if isinstance(ip, ipaddress.IPv6Address):
        return str(ipaddress.IPv6Network((ip, IPV6_PREFIX_BITS), strict=False))
    return str(ip)


def _route(request: web.Request) -> str:
    """The route's template, never the path (a /media path carries a token)."""
    resource = request.match_info.route.resource
    return resource.canonical if resource is not None else "unmatched"


def middlewares(
    limits: RateLimitsConfig,
    metrics: ApiMetrics,
    providers: Collection[str],
    *,
    clock: Callable[[], float] = time.monotonic,
) -> tuple[list[Middleware], list[Middleware]]:
    """(the middlewares to run before the API key middleware, those to run after it); both
    empty when rate limiting is off. ``providers``: the names configured (a callback to any
    other name is counted per address, so made-up names cannot add buckets of their own)."""
    if not limits.enabled:
        return [], []
    limiter = limiter_for(limits, clock)
    trusted = tuple(ipaddress.ip_network(c, strict=False) for c in limits.trusted_proxies)
    for scope in SCOPES:
        metrics.rate_limited.labels(scope)  # shown at 0 before the first refusal

    def refuse(request: web.Request, scope: str, verdict: Verdict, caller: str) -> ApiError:
        seconds = verdict.retry_after_seconds
        metrics.rate_limited.labels(scope).inc()
        if verdict.first_refusal:
            log.warning(
                "rate_limited",
                scope=scope,
                caller=caller,
                route=_route(request),
                retry_after_seconds=seconds,
            )
        return ApiError(
            429,
            f"too many requests ({scope} rate limit); retry after {seconds} s",
            "rate_limited",
            headers={"Retry-After": str(seconds)},
        )

    def address_of(request: web.Request) -> str:
        forwarded_for = request.headers.getall("X-Forwarded-For", [])
        return client_address(request.remote, forwarded_for, trusted)

    @web.middleware
    async def before_auth(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path in NEVER_LIMITED:
            return await handler(request)
        address = address_of(request)
        if needs_key(request.path):
            verdict = limiter.peek("auth_failure", address)
            if not verdict.granted:
                raise refuse(request, "auth_failure", verdict, address)
            response = await handler(request)
            if TENANT not in request:  # answered without a valid key
                limiter.charge("auth_failure", address)
            return response
        provider = request.match_info.get("provider")
        if _route(request) == CALLBACK_ROUTE and provider in providers:
            verdict = limiter.take("callback", (provider, address), name=provider)
            if not verdict.granted:
                metrics.callbacks.labels(provider, "rate_limited").inc()
                raise refuse(request, "callback", verdict, f"{provider} {address}")
        else:
            verdict = limiter.take("address", address)
            if not verdict.granted:
                raise refuse(request, "address", verdict, address)
        return await handler(request)

    @web.middleware
    async def after_auth(request: web.Request, handler: Handler) -> web.StreamResponse:
        key = request.get(API_KEY)
        if key is not None:
            verdict = limiter.take("key", key)
            if not verdict.granted:
                raise refuse(request, "key", verdict, key)
        return await handler(request)

    return [before_auth], [after_auth]
