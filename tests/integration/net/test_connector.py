"""The fetch's connector: asyncio's TLS protocol on any loop, with every check TLS had."""

from __future__ import annotations

import asyncio.sslproto
import ssl
from collections.abc import Iterator

import aiohttp
import pytest

from aivedio.errors import TransientError
from aivedio.net.connector import AsyncioTlsConnector
from aivedio.net.fetch import Fetcher, FetchLimits
from aivedio.net.policy import FetchPolicy
from aivedio.sim.tls import make_test_ca
from tests.support.dns_server import Zone, dns_server
from tests.support.tls_origin import tls_origin

pytestmark = pytest.mark.anyio

BODY = b"\x00\x00\x00\x18ftypmp42" + bytes(range(256)) * 1000


@pytest.fixture(
    params=[("asyncio", {"debug": True}), ("asyncio", {"use_uvloop": True})],
    ids=["asyncio", "uvloop"],
)
def anyio_backend(request: pytest.FixtureRequest) -> tuple[str, dict[str, bool]]:
    return request.param  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    _ca, server_ctx, pem = make_test_ca(
        ("127.0.0.1", "cdn.provider.test"), tmp_path_factory.mktemp("ca")
    )
    return server_ctx, ssl.create_default_context(cafile=str(pem))


@pytest.fixture
def dns() -> Iterator[tuple[Zone, str]]:
    with dns_server() as (zone, ns):
        zone.set("cdn.provider.test", ["127.0.0.1"])
        zone.set("other.test", ["127.0.0.1"])
        yield zone, ns


async def test_tls_runs_on_asyncio_protocol_whatever_the_loop(
    tls: tuple[ssl.SSLContext, ssl.SSLContext],
) -> None:
    # If aiohttp stopped calling the hook, TLS would silently be the loop's again (uvloop's
    # on the worker): this names the transport the connection really has.
    server_ctx, client_ctx = tls
    with tls_origin(server_ctx, BODY) as origin:
        connector = AsyncioTlsConnector(ssl=client_ctx)
        async with (
            aiohttp.ClientSession(connector=connector) as session,
            session.get(origin.url()) as response,
        ):
            assert response.connection is not None
            transport = response.connection.transport
            assert isinstance(transport, asyncio.sslproto._SSLProtocolTransport)
            assert transport.get_extra_info("peercert") is not None
            assert transport.get_extra_info("ssl_object").server_hostname == "127.0.0.1"
            assert await response.read() == BODY


async def test_plain_http_goes_through_the_loop_unchanged() -> None:
    from aiohttp import web

    async def plain(_request: web.Request) -> web.Response:
        return web.Response(body=b"plain" * 1_000_000)  # held open while read

    app = web.Application()
    app.router.add_get("/", plain)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        async with (
            aiohttp.ClientSession(connector=AsyncioTlsConnector()) as session,
            session.get(f"http://127.0.0.1:{port}/") as response,
        ):
            assert response.connection is not None
            transport = response.connection.transport
            assert not isinstance(transport, asyncio.sslproto._SSLProtocolTransport)
            assert transport is not None and transport.get_extra_info("sslcontext") is None
            assert await response.read() == b"plain" * 1_000_000
    finally:
        await runner.cleanup()


def _fetcher(port: int, client_ctx: ssl.SSLContext, nameserver: str = "") -> Fetcher:
    return Fetcher(
        FetchPolicy(allowed_ports=frozenset({port}), allow_cidrs=("127.0.0.0/8",)),
        FetchLimits(connect_timeout_seconds=5),
        nameservers=[nameserver] if nameserver else [],
        ssl_context=client_ctx,
    )


async def test_a_certificate_from_an_untrusted_ca_is_refused(
    tls: tuple[ssl.SSLContext, ssl.SSLContext],
) -> None:
    server_ctx, _ = tls
    with tls_origin(server_ctx, BODY) as origin:
        fetcher = _fetcher(origin.port, ssl.create_default_context())  # the system's CAs only
        try:
            with pytest.raises(TransientError, match="cannot connect") as caught:
                await fetcher.stream(origin.url(), _discard)
        finally:
            await fetcher.aclose()
        assert origin.seen == []  # no request was sent
    assert "secret-signature" not in str(caught.value)


async def test_a_certificate_for_another_name_is_refused(
    tls: tuple[ssl.SSLContext, ssl.SSLContext], dns: tuple[Zone, str]
) -> None:
    server_ctx, client_ctx = tls
    _zone, nameserver = dns
    with tls_origin(server_ctx, BODY) as origin:
        fetcher = _fetcher(origin.port, client_ctx, nameserver)
        try:
            with pytest.raises(TransientError, match="cannot connect"):
                await fetcher.stream(origin.url("other.test"), _discard)
            # The name the certificate has, through the same resolver: accepted.
            result = await fetcher.stream(origin.url("cdn.provider.test"), _discard)
        finally:
            await fetcher.aclose()
        assert len(origin.seen) == 1
    assert result.bytes == len(BODY)


async def test_a_refused_connection_leaves_no_transport_behind(
    tls: tuple[ssl.SSLContext, ssl.SSLContext],
) -> None:
    # Warnings are errors here: a TLS transport made for a socket that never connected
    # would be reported unclosed when collected.
    import gc
    import socket

    _, client_ctx = tls
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    fetcher = _fetcher(port, client_ctx)
    try:
        with pytest.raises(TransientError, match="cannot connect"):
            await fetcher.stream(f"https://127.0.0.1:{port}/v.mp4", _discard)
    finally:
        await fetcher.aclose()
    gc.collect()


async def _discard(_chunk: bytes) -> None:
    return None
