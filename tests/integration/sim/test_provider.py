"""The simulated provider over loopback HTTPS: task API, signed URLs and every fault.

A client session trusts the throwaway CA and resolves every host name to 127.0.0.1, so the
cross-host redirect (``cdn2.provider.test``) stays on loopback too. Redirects to other
targets (``redirect_to``) are inspected, never followed.
"""

from __future__ import annotations

import gzip
import hashlib
import socket
import ssl
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import pytest
import trustme
from aiohttp.abc import AbstractResolver, ResolveResult

from aivedio.sim.provider import Faults, SimulatedProvider, open_simulated_provider
from aivedio.sim.tls import make_test_ca

pytestmark = pytest.mark.anyio

MIB = 1 << 20
CDN2 = "cdn2.provider.test"
BODY = bytes(range(256)) * 400  # 100 KiB, explicit


class LoopbackResolver(AbstractResolver):
    """Every name is 127.0.0.1: no traffic leaves the machine."""

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        return [
            {
                "hostname": host,
                "host": "127.0.0.1",
                "port": port,
                "family": socket.AF_INET,
                "proto": 0,
                "flags": socket.AI_NUMERICHOST,
            }
        ]

    async def close(self) -> None:
        pass


@pytest.fixture(scope="module")
def test_ca(tmp_path_factory: pytest.TempPathFactory) -> tuple[trustme.CA, ssl.SSLContext, Path]:
    names = ("localhost", "127.0.0.1", "::1", CDN2)
    return make_test_ca(names, tmp_path_factory.mktemp("ca"))


@pytest.fixture
async def provider(
    test_ca: tuple[trustme.CA, ssl.SSLContext, Path],
) -> AsyncIterator[SimulatedProvider]:
    async with open_simulated_provider(ssl_context=test_ca[1]) as p:
        yield p


def client_context(ca_pem: Path) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(ca_pem))


@pytest.fixture
async def session(
    provider: SimulatedProvider, test_ca: tuple[trustme.CA, ssl.SSLContext, Path]
) -> AsyncIterator[aiohttp.ClientSession]:
    # Depends on ``provider`` so the client closes its connections before the server stops.
    connector = aiohttp.TCPConnector(ssl=client_context(test_ca[2]), resolver=LoopbackResolver())
    async with aiohttp.ClientSession(connector=connector) as s:
        yield s


async def fetch(session: aiohttp.ClientSession, url: str, **kwargs: Any) -> tuple[int, bytes]:
    async with session.get(url, **kwargs) as resp:
        return resp.status, await resp.read()


async def read_into(resp: aiohttp.ClientResponse, sizes: list[int]) -> None:
    """Read the body to its end, appending each chunk's size (kept when reading fails)."""
    async for chunk in resp.content.iter_chunked(64 * 1024):
        sizes.append(len(chunk))


async def task_output(
    session: aiohttp.ClientSession, provider: SimulatedProvider, task_id: str, index: int = 0
) -> dict[str, Any]:
    async with session.get(f"{provider.base_url}/v1/tasks/{task_id}") as resp:
        assert resp.status == 200
        task = await resp.json()
    assert task["id"] == task_id
    assert task["status"] == "SUCCEEDED"
    (output,) = [o for o in task["outputs"] if o["index"] == index]
    return dict(output)


async def test_plain_download_matches_task_api(
    provider: SimulatedProvider, session: aiohttp.ClientSession, test_ca: tuple[Any, Any, Path]
) -> None:
    provider.add_output("t-plain", 0, BODY)
    provider.add_output("t-plain", 1, b"second")
    output = await task_output(session, provider, "t-plain")
    assert output["sha256"] == hashlib.sha256(BODY).hexdigest()
    assert output["size"] == len(BODY)
    assert output["content_type"] == "video/mp4"
    assert output["url"].startswith(f"https://localhost:{provider.port}/files/t-plain/0?exp=")
    expires = datetime.fromisoformat(output["expires_at"])
    assert expires.tzinfo is not None
    assert 3500 < (expires - datetime.now(UTC)).total_seconds() <= 3602
    async with session.get(output["url"]) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"] == "video/mp4"
        assert resp.content_length == len(BODY)
        body = await resp.read()
    assert body == BODY
    assert provider.requests == {"task": 1, "download": 1}
    assert len(provider.seen_headers) == 1
    assert provider.seen_headers[0]["Host"] == f"localhost:{provider.port}"
    # The CA PEM on disk is what an out-of-process client would trust.
    assert test_ca[2].read_text().startswith("-----BEGIN CERTIFICATE-----")


async def test_generated_50_mib_output_streams_and_matches(
    provider: SimulatedProvider, session: aiohttp.ClientSession
) -> None:
    size = 50 * MIB + 12345
    provider.add_output("t-big", 0, size=size)
    output = await task_output(session, provider, "t-big")
    assert output["size"] == size
    digest = hashlib.sha256()
    received = 0
    async with session.get(output["url"]) as resp:
        assert resp.status == 200
        assert resp.content_length == size
        async for chunk in resp.content.iter_chunked(MIB):
            digest.update(chunk)
            received += len(chunk)
    assert received == size
    assert digest.hexdigest() == output["sha256"]
    # Deterministic: the same task and index give the same bytes.
    provider.add_output("t-big", 1, size=size)
    assert (await task_output(session, provider, "t-big", 1))["sha256"] != output["sha256"]
    provider.add_output("t-big", 0, size=size)
    assert (await task_output(session, provider, "t-big"))["sha256"] == output["sha256"]


async def test_range_requests(provider: SimulatedProvider, session: aiohttp.ClientSession) -> None:
    provider.add_output("t-range", 0, BODY)
    url = provider.signed_url("t-range", 0)
    async with session.get(url, headers={"Range": "bytes=1000-1999"}) as resp:
        assert resp.status == 206
        assert resp.headers["Content-Range"] == f"bytes 1000-1999/{len(BODY)}"
        assert await resp.read() == BODY[1000:2000]
    assert await fetch(session, url, headers={"Range": "bytes=5000-"}) == (206, BODY[5000:])
    assert await fetch(session, url, headers={"Range": "bytes=-10"}) == (206, BODY[-10:])
    status, _ = await fetch(session, url, headers={"Range": f"bytes={len(BODY)}-"})
    assert status == 416
    stale = {"Range": "bytes=0-9", "If-Range": '"not-the-etag"'}
    assert await fetch(session, url, headers=stale) == (200, BODY)


async def test_bad_signature_is_refused(
    provider: SimulatedProvider, session: aiohttp.ClientSession
) -> None:
    provider.add_output("t-sig", 0, BODY)
    provider.add_output("t-sig", 1, BODY)
    url = provider.signed_url("t-sig", 0)
    tampered = url[:-1] + ("0" if url[-1] != "0" else "1")
    assert await fetch(session, tampered) == (403, b'{"error": "bad_signature"}')
    assert (await fetch(session, url.split("&sig=")[0]))[0] == 403
    other_index = url.replace("/files/t-sig/0?", "/files/t-sig/1?")
    assert (await fetch(session, other_index))[0] == 403
    other_key = SimulatedProvider(
        ssl_context=None, port=provider.port, signing_key=b"another key"
    ).signed_url("t-sig", 0)
    assert (await fetch(session, other_key.replace("http://", "https://")))[0] == 403
    assert (await fetch(session, url))[0] == 200


async def test_expired_url_and_expired_fault(
    provider: SimulatedProvider, session: aiohttp.ClientSession
) -> None:
    provider.add_output("t-exp", 0, BODY)
    assert await fetch(session, provider.signed_url("t-exp", 0, ttl_seconds=-5)) == (
        403,
        b'{"error": "expired"}',
    )
    provider.add_output("t-exp", 1, BODY, faults=Faults(expired=True))
    for _ in range(2):
        assert await fetch(session, provider.signed_url("t-exp", 1)) == (
            403,
            b'{"error": "expired"}',
        )


async def test_unknown_task_or_output_is_404(
    provider: SimulatedProvider, session: aiohttp.ClientSession
) -> None:
    provider.add_output("t-known", 0, BODY)
    assert (await fetch(session, f"{provider.base_url}/v1/tasks/nope"))[0] == 404
    async with session.post(f"{provider.base_url}/v1/tasks/nope/outputs/0/refresh") as resp:
        assert resp.status == 404
    assert (await fetch(session, f"{provider.base_url}/files/nope/0?exp=1&sig=x"))[0] == 404
    assert (await fetch(session, f"{provider.base_url}/files/t-known/7?exp=1&sig=x"))[0] == 404
    with pytest.raises(KeyError):
        provider.task_json("nope")


async def test_not_ready_twice_then_ok(
    provider: SimulatedProvider, session: aiohttp.ClientSession
) -> None:
    provider.add_output("t-nr", 0, BODY, faults=Faults(not_ready_requests=2))
    provider.add_output("t-nr", 1, BODY)
    url = provider.signed_url("t-nr", 0)
    assert await fetch(session, url) == (404, b'{"error": "not_ready"}')
    # Counters are per output: the other output is ready from the start.
    assert await fetch(session, provider.signed_url("t-nr", 1)) == (200, BODY)
    assert (await fetch(session, url))[0] == 404
    assert await fetch(session, url) == (200, BODY)
    assert provider.requests["download"] == 4


async def test_throttle_sends_retry_after(
    provider: SimulatedProvider, session: aiohttp.ClientSession
) -> None:
    provider.add_output("t-429", 0, BODY, faults=Faults(throttle_requests=1, retry_after_seconds=7))
    provider.add_output(
        "t-429", 1, BODY, faults=Faults(throttle_requests=1, retry_after_seconds=0.2)
    )
    url = provider.signed_url("t-429", 0)
    async with session.get(url) as resp:
        assert resp.status == 429
        assert resp.headers["Retry-After"] == "7"
        assert await resp.json() == {"error": "throttled"}
    async with session.get(provider.signed_url("t-429", 1)) as resp:
        assert resp.status == 429
        assert resp.headers["Retry-After"] == "0.2"
    assert await fetch(session, url) == (200, BODY)


async def test_error_burst_and_fault_order(
    provider: SimulatedProvider, session: aiohttp.ClientSession
) -> None:
    provider.add_output("t-503", 0, BODY, faults=Faults(error_requests=3))
    url = provider.signed_url("t-503", 0)
    assert [(await fetch(session, url))[0] for _ in range(4)] == [503, 503, 503, 200]
    mixed = Faults(not_ready_requests=1, throttle_requests=1, error_requests=1)
    provider.add_output("t-503", 1, BODY, faults=mixed)
    url = provider.signed_url("t-503", 1)
    assert [(await fetch(session, url))[0] for _ in range(4)] == [404, 429, 503, 200]


async def test_truncation_is_a_payload_error(
    provider: SimulatedProvider, session: aiohttp.ClientSession
) -> None:
    size = 3 * MIB
    provider.add_output("t-trunc", 0, size=size, faults=Faults(truncate_at_bytes=MIB + 7))
    sizes: list[int] = []
    async with session.get(provider.signed_url("t-trunc", 0)) as resp:
        assert resp.status == 200
        assert resp.content_length == size
        with pytest.raises(aiohttp.ClientPayloadError):
            await read_into(resp, sizes)
    assert sum(sizes) == MIB + 7
    # The next download is truncated again: the fault is not a "first N" one.
    with pytest.raises(aiohttp.ClientPayloadError):
        await fetch(session, provider.signed_url("t-trunc", 0))


async def test_truncate_requests_cuts_only_the_first_bodies(
    provider: SimulatedProvider, session: aiohttp.ClientSession
) -> None:
    faults = Faults(truncate_at_bytes=1000, truncate_requests=2)
    provider.add_output("t-cut", 0, BODY, faults=faults)
    url = provider.signed_url("t-cut", 0)
    with pytest.raises(aiohttp.ClientPayloadError):
        await fetch(session, url)
    with pytest.raises(aiohttp.ClientPayloadError):  # a resume's body is cut too
        await fetch(session, url, headers={"Range": "bytes=1000-"})
    assert await fetch(session, url, headers={"Range": "bytes=2000-"}) == (206, BODY[2000:])
    assert await fetch(session, url) == (200, BODY)


async def test_ignore_range_answers_the_whole_body(
    provider: SimulatedProvider, session: aiohttp.ClientSession
) -> None:
    provider.add_output("t-norange", 0, BODY, faults=Faults(ignore_range=True))
    url = provider.signed_url("t-norange", 0)
    async with session.get(url, headers={"Range": "bytes=1000-"}) as resp:
        assert resp.status == 200
        assert "Accept-Ranges" not in resp.headers
        assert resp.headers["ETag"]
        assert await resp.read() == BODY


async def test_gzip_body(provider: SimulatedProvider, session: aiohttp.ClientSession) -> None:
    provider.add_output("t-gz", 0, BODY, faults=Faults(gzip=True))
    url = provider.signed_url("t-gz", 0)
    async with session.get(url) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Encoding"] == "gzip"
        assert "Content-Length" not in resp.headers
        assert await resp.read() == BODY
    async with session.get(url, auto_decompress=False) as resp:
        raw = await resp.read()
    assert raw[:2] == b"\x1f\x8b"
    assert gzip.decompress(raw) == BODY


async def test_redirect_hops(provider: SimulatedProvider, session: aiohttp.ClientSession) -> None:
    provider.add_output("t-hops", 0, BODY, faults=Faults(redirect_hops=3))
    async with session.get(provider.signed_url("t-hops", 0)) as resp:
        assert resp.status == 200
        assert [r.status for r in resp.history] == [302, 302, 302]
        assert resp.url.path == "/r/3/files/t-hops/0"
        assert resp.url.host == "localhost"
        assert await resp.read() == BODY
    assert provider.requests["download"] == 1
    assert provider.requests["redirect"] == 3
    assert len(provider.seen_headers) == 4
    with pytest.raises(aiohttp.TooManyRedirects):
        await fetch(session, provider.signed_url("t-hops", 0), max_redirects=2)


async def test_redirect_to_is_not_followed_here(
    provider: SimulatedProvider, session: aiohttp.ClientSession
) -> None:
    target = "http://169.254.169.254/latest/meta-data/"
    provider.add_output("t-to", 0, BODY, faults=Faults(redirect_to=target))
    async with session.get(provider.signed_url("t-to", 0), allow_redirects=False) as resp:
        assert resp.status == 302
        assert resp.headers["Location"] == target


async def test_cross_host_redirect_records_headers(
    provider: SimulatedProvider, session: aiohttp.ClientSession
) -> None:
    provider.add_output("t-cdn", 0, BODY, faults=Faults(cross_host_redirect=CDN2))
    url = provider.signed_url("t-cdn", 0)
    async with session.get(url, allow_redirects=False) as resp:
        assert resp.status == 302
        location = resp.headers["Location"]
    assert location == url.replace("https://localhost:", f"https://{CDN2}:")
    secret = {"Authorization": "Bearer provider-token"}
    provider.seen_headers.clear()
    async with session.get(url, headers=secret) as resp:
        assert resp.status == 200
        assert resp.url.host == CDN2
        assert await resp.read() == BODY
    first, second = provider.seen_headers
    assert first["Authorization"] == "Bearer provider-token"
    assert second["Host"] == f"{CDN2}:{provider.port}"
    assert "Authorization" not in second  # aiohttp strips it on a cross-origin redirect


@pytest.mark.timeout(30)
async def test_endless_body(provider: SimulatedProvider, session: aiohttp.ClientSession) -> None:
    provider.add_output("t-endless", 0, size=MIB, faults=Faults(endless=True))
    provider.add_output("t-endless", 1, BODY)
    for _ in range(3):
        received = 0
        async with session.get(provider.signed_url("t-endless", 0)) as resp:
            assert resp.status == 200
            assert resp.content_length is None
            assert resp.headers["Transfer-Encoding"] == "chunked"
            async for chunk in resp.content.iter_chunked(256 * 1024):
                received += len(chunk)
                if received >= 5 * MIB:
                    break
        assert received >= 5 * MIB
        # The server noticed the client leaving and still answers (a handler that kept
        # writing into the dead connection without yielding once hung the whole loop).
        with anyio.fail_after(5):
            assert await fetch(session, provider.signed_url("t-endless", 1)) == (200, BODY)


async def test_drip_rate_is_bounded(
    provider: SimulatedProvider, session: aiohttp.ClientSession
) -> None:
    rate = 100_000
    provider.add_output("t-drip", 0, BODY[:60_000], faults=Faults(drip_bytes_per_second=rate))
    started = time.monotonic()
    assert await fetch(session, provider.signed_url("t-drip", 0)) == (200, BODY[:60_000])
    elapsed = time.monotonic() - started
    assert 0.45 <= elapsed < 3, elapsed  # 60 kB at 100 kB/s: 0.55 s after the first tick


async def test_stall_keeps_the_connection_open(
    provider: SimulatedProvider, session: aiohttp.ClientSession
) -> None:
    provider.add_output("t-stall", 0, BODY, faults=Faults(stall_after_bytes=10_000))
    async with session.get(provider.signed_url("t-stall", 0)) as resp:
        assert resp.content_length == len(BODY)
        assert await resp.content.readexactly(10_000) == BODY[:10_000]
        with anyio.move_on_after(0.5) as scope:
            await resp.content.read(1)
        assert scope.cancelled_caught
        resp.close()


async def test_chunked_transfer_and_wrong_checksum(
    provider: SimulatedProvider, session: aiohttp.ClientSession
) -> None:
    provider.add_output("t-chunked", 0, BODY, faults=Faults(omit_content_length=True))
    async with session.get(provider.signed_url("t-chunked", 0)) as resp:
        assert "Content-Length" not in resp.headers
        assert resp.headers["Transfer-Encoding"] == "chunked"
        assert await resp.read() == BODY
    provider.add_output("t-chunked", 1, BODY, faults=Faults(advertise_wrong_sha256=True))
    output = await task_output(session, provider, "t-chunked", 1)
    assert output["sha256"] != hashlib.sha256(BODY).hexdigest()
    assert len(output["sha256"]) == 64
    status, body = await fetch(session, output["url"])
    assert (status, body) == (200, BODY)


async def test_refresh_gives_a_new_working_url(
    provider: SimulatedProvider, session: aiohttp.ClientSession
) -> None:
    provider.add_output("t-refresh", 0, BODY)
    stale = provider.signed_url("t-refresh", 0, ttl_seconds=-60)
    assert (await fetch(session, stale))[0] == 403
    async with session.post(f"{provider.base_url}/v1/tasks/t-refresh/outputs/0/refresh") as resp:
        assert resp.status == 200
        fresh = await resp.json()
    assert fresh["url"] != stale
    assert datetime.fromisoformat(fresh["expires_at"]) > datetime.now(UTC)
    assert await fetch(session, fresh["url"]) == (200, BODY)
    assert provider.requests["refresh"] == 1


async def test_gone_output(provider: SimulatedProvider, session: aiohttp.ClientSession) -> None:
    provider.add_output("t-gone", 0, BODY, faults=Faults(gone=True))
    output = await task_output(session, provider, "t-gone")
    assert output["size"] == len(BODY)
    async with session.post(f"{provider.base_url}/v1/tasks/t-gone/outputs/0/refresh") as resp:
        assert resp.status == 410
        assert await resp.json() == {"error": "gone"}
    assert (await fetch(session, output["url"]))[0] == 404


async def test_plain_http_mode() -> None:
    async with open_simulated_provider(public_host="127.0.0.1", url_ttl_seconds=60) as plain:
        assert plain.base_url == f"http://127.0.0.1:{plain.port}"
        plain.add_output("t-http", 0, BODY)
        async with aiohttp.ClientSession() as session:
            task = plain.task_json("t-http")
            assert await fetch(session, task["outputs"][0]["url"]) == (200, BODY)
    with pytest.raises(RuntimeError):
        _ = SimulatedProvider(ssl_context=None).base_url
