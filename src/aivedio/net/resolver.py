"""The pinning resolver: validation and connection use one DNS answer.

Why: "resolve, check, then let the HTTP client connect" resolves twice. An attacker's name
answers a public address to the check and 127.0.0.1 (TTL 0) to the connect: DNS rebinding.
Here aiohttp's connector asks this resolver for addresses and dials only what it returns, so
the addresses that were checked are the addresses that are dialled; the TLS layer still
verifies the certificate against the original host name (SNI), since aiohttp keeps it.

Every A and AAAA answer is checked by the policy; one denied address blocks the whole name
(an attacker controls which answer a client tries first). aiohttp's own DNS cache is off
(``use_dns_cache=False``) so no validated answer outlives the request that validated it.
IP-literal URLs never reach a resolver (aiohttp skips it for them), so they are checked by
``check_url`` before any request, and ``guarded_socket_factory`` checks the address once more
at dial time: defence in depth for any path that forgets.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence
from typing import Any

import aiodns
import anyio
from aiohttp.abc import AbstractResolver, ResolveResult

from aivedio.errors import AivedioError, PolicyBlockedError, TransientError
from aivedio.net.policy import FetchPolicy, check_address, check_answers

DNS_TIMEOUT_SECONDS = 5.0
DNS_TRIES = 2
_NO_DATA = {aiodns.error.ARES_ENODATA, aiodns.error.ARES_ENOTFOUND}


class PinningResolver(AbstractResolver):
    """Resolve through aiodns, validate every answer, return canonical IP strings only."""

    def __init__(self, policy: FetchPolicy, nameservers: Sequence[str] = ()) -> None:
        self.policy = policy
        self._nameservers = list(nameservers)
        self._dns: aiodns.DNSResolver | None = None
        # host -> the validated addresses of its last resolution, for reporting.
        self.answers: dict[str, list[str]] = {}

    def _resolver(self) -> aiodns.DNSResolver:
        if self._dns is None:
            self._dns = aiodns.DNSResolver(
                nameservers=self._nameservers or None,
                timeout=DNS_TIMEOUT_SECONDS,
                tries=DNS_TRIES,
            )
        return self._dns

    async def lookup(self, host: str) -> list[str]:
        """Every A and AAAA address of ``host``, validated; PolicyBlockedError if any is
        denied, TransientError when DNS fails."""
        results: dict[str, list[str]] = {}

        async def query(qtype: str) -> None:
            try:
                answer = await self._resolver().query_dns(host, qtype)
            except aiodns.error.DNSError as exc:
                code = exc.args[0] if exc.args else None
                if code in _NO_DATA:
                    results[qtype] = []
                    return
                raise TransientError(f"dns {qtype} lookup for {host} failed: {exc}") from None
            results[qtype] = [
                str(record.data.addr) for record in answer.answer if hasattr(record.data, "addr")
            ]

        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(query, "A")
                tg.start_soon(query, "AAAA")
        except BaseExceptionGroup as group:
            # The task group wraps a child's error; callers expect our taxonomy, unwrapped.
            first = group.exceptions[0]
            if isinstance(first, AivedioError):
                raise first from None
            raise
        answers = results.get("A", []) + results.get("AAAA", [])
        if not answers:
            # NXDOMAIN or no data: DNS may be catching up (a new CDN name) or failing; not a
            # policy verdict. Retried with backoff like any transient failure.
            raise TransientError(f"dns: {host} has no A or AAAA answer")
        addresses = check_answers(host, answers, self.policy)
        self.answers[host.rstrip(".").lower()] = addresses
        return addresses

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        addresses = await self.lookup(host)
        out: list[ResolveResult] = []
        for address in addresses:
            is_v6 = ":" in address
            if (family == socket.AF_INET and is_v6) or (family == socket.AF_INET6 and not is_v6):
                continue
            out.append(
                ResolveResult(
                    hostname=host,
                    host=address,
                    port=port,
                    family=socket.AF_INET6 if is_v6 else socket.AF_INET,
                    proto=0,
                    flags=socket.AI_NUMERICHOST | socket.AI_NUMERICSERV,
                )
            )
        if not out:
            raise PolicyBlockedError(f"no_addresses: {host} has no usable address")
        return out

    async def close(self) -> None:
        if self._dns is not None:
            await _close_dns(self._dns)
            self._dns = None


async def _close_dns(dns: Any) -> None:
    close = getattr(dns, "close", None)
    if close is not None:
        result = close()
        if hasattr(result, "__await__"):
            await result
    else:
        dns.cancel()


def guarded_socket_factory(policy: FetchPolicy) -> Any:
    """A socket factory for aiohttp's connector that re-checks the address being dialled."""

    def factory(addr_info: Any) -> socket.socket:
        family, type_, proto, _canon, sockaddr = addr_info
        check_address(sockaddr[0], policy)
        sock = socket.socket(family=family, type=type_, proto=proto)
        sock.setblocking(False)
        return sock

    return factory
