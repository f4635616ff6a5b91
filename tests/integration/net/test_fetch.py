"""The guarded fetch against a real HTTPS provider and a real DNS server, all on loopback."""

from __future__ import annotations

import hashlib
import random
import socket
import ssl
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from aivedio.errors import (
    InvalidResponseError,
    NotYetAvailableError,
    PolicyBlockedError,
    ProviderServerError,
    ThrottledError,
    TooLargeError,
    TransientError,
    UrlExpiredError,
)
from aivedio.net.fetch import Fetcher, FetchLimits
from aivedio.net.policy import FetchPolicy
from aivedio.sim.provider import Faults, SimulatedProvider, open_simulated_provider
from aivedio.sim.tls import make_test_ca
from tests.support.dns_server import Zone, dns_server

pytestmark = pytest.mark.anyio

NAMES = (
    "localhost",
    "127.0.0.1",
    "cdn.provider.test",
    "cdn2.provider.test",
    "rebind.test",
    "mixed.test",
)


@dataclass
class Rig:
    sim: SimulatedProvider
    zone: Zone
    nameserver: str
    client_ssl: ssl.SSLContext

    def fetcher(
        self, *, allow_cidrs: tuple[str, ...] = ("127.0.0.0/8",), **limits: float
    ) -> Fetcher:
        policy = FetchPolicy(
            allowed_ports=frozenset({self.sim.port}), allow_cidrs=allow_cidrs, max_redirects=3
        )
        return Fetcher(
            policy,
            FetchLimits(**limits),
            nameservers=[self.nameserver],  # type: ignore[arg-type]
            ssl_context=self.client_ssl,
        )


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> tuple[ssl.SSLContext, Path]:
    _ca, server_ctx, pem = make_test_ca(NAMES, tmp_path_factory.mktemp("ca"))
    return server_ctx, pem


@pytest.fixture
def dns() -> Iterator[tuple[Zone, str]]:
    with dns_server() as (zone, ns):
        zone.set("cdn.provider.test", ["127.0.0.1"])
        zone.set("cdn2.provider.test", ["127.0.0.1"])
        yield zone, ns


@pytest.fixture
async def rig(ca: tuple[ssl.SSLContext, Path], dns: tuple[Zone, str]) -> AsyncIterator[Rig]:
    server_ctx, pem = ca
    async with open_simulated_provider(
        ssl_context=server_ctx, public_host="cdn.provider.test"
    ) as sim:
        yield Rig(sim, dns[0], dns[1], ssl.create_default_context(cafile=str(pem)))


class Sink:
    def __init__(self) -> None:
        self.data = bytearray()

    async def __call__(self, chunk: bytes) -> None:
        self.data.extend(chunk)


async def fetch(rig: Rig, url: str, fetcher: Fetcher | None = None, **kw: object) -> Sink:
    fetcher = fetcher or rig.fetcher()
    sink = Sink()
    try:
        await fetcher.stream(url, sink, **kw)  # type: ignore[arg-type]
    finally:
        await fetcher.aclose()
    return sink


async def test_download_streams_the_exact_bytes(rig: Rig) -> None:
    body = b"\x00\x00\x00\x18ftypmp42" + bytes(range(256)) * 400
    rig.sim.add_output("t1", 0, body)
    fetcher = rig.fetcher()
    sink = Sink()
    result = await fetcher.stream(rig.sim.signed_url("t1", 0), sink)
    await fetcher.aclose()
    assert bytes(sink.data) == body
    assert result.sha256 == hashlib.sha256(body).hexdigest()
    assert result.bytes == len(body)
    assert result.addresses == ["127.0.0.1"]
    assert "sig=" not in result.url


async def test_a_chunked_body_streams_the_exact_bytes(rig: Rig) -> None:
    # No Content-Length: the body comes in HTTP chunks and is read chunk by chunk; only the
    # reader's end of body ends it (there is no length to check truncation against).
    body = random.Random(7).randbytes(3 * (1 << 20) + 12_345)
    rig.sim.add_output("t1", 0, body, faults=Faults(omit_content_length=True))
    fetcher = rig.fetcher()
    sink = Sink()
    result = await fetcher.stream(rig.sim.signed_url("t1", 0), sink)
    await fetcher.aclose()
    assert result.content_length is None
    assert bytes(sink.data) == body
    assert (result.bytes, result.sha256) == (len(body), hashlib.sha256(body).hexdigest())


class Listener:
    """A TCP listener on 127.0.0.1 that counts connections (the rebinding target)."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_server(("127.0.0.1", port))
        self.sock.settimeout(0.2)
        self.connections = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.connections += 1
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sock.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_dns_rebinding_never_reaches_the_second_answer(rig: Rig) -> None:
    # Only 127.0.0.2 is allowed (nothing listens there); the name answers it first, then
    # 127.0.0.1 where a listener waits, TTL 0. A client that resolves twice would connect.
    port = free_port()
    listener = Listener(port)
    try:
        rig.zone.set("rebind.test", ["127.0.0.2"], ["127.0.0.1"])
        policy = FetchPolicy(allowed_ports=frozenset({port}), allow_cidrs=("127.0.0.2/32",))
        fetcher = Fetcher(
            policy,
            FetchLimits(connect_timeout_seconds=2),
            nameservers=[rig.nameserver],
            ssl_context=rig.client_ssl,
        )
        with pytest.raises((TransientError, PolicyBlockedError)):
            await fetch(rig, f"https://rebind.test:{port}/video.mp4", fetcher)
    finally:
        listener.close()
    assert listener.connections == 0
    assert rig.zone.queries["rebind.test/A"] >= 1


async def test_a_name_with_any_denied_answer_is_blocked_whole(rig: Rig) -> None:
    port = free_port()
    listener = Listener(port)
    try:
        rig.zone.set("mixed.test", ["127.0.0.2", "10.0.0.1"])
        policy = FetchPolicy(allowed_ports=frozenset({port}), allow_cidrs=("127.0.0.0/8",))
        fetcher = Fetcher(
            policy, FetchLimits(), nameservers=[rig.nameserver], ssl_context=rig.client_ssl
        )
        with pytest.raises(PolicyBlockedError, match="ip_denied"):
            await fetch(rig, f"https://mixed.test:{port}/v.mp4", fetcher)
    finally:
        listener.close()
    assert listener.connections == 0


async def test_ip_literal_url_is_checked_before_any_request(rig: Rig) -> None:
    rig.sim.add_output("t1", 0, b"x" * 10)
    url = rig.sim.signed_url("t1", 0).replace("cdn.provider.test", "127.0.0.1")
    with pytest.raises(PolicyBlockedError, match="ip_denied"):
        await fetch(rig, url, rig.fetcher(allow_cidrs=()))
    assert rig.sim.requests["download"] == 0


async def test_redirect_to_metadata_address_is_blocked(rig: Rig) -> None:
    target = f"https://169.254.169.254:{rig.sim.port}/latest/meta-data/"
    rig.sim.add_output("t1", 0, b"x" * 10, faults=Faults(redirect_to=target))
    with pytest.raises(PolicyBlockedError, match="ip_denied"):
        await fetch(rig, rig.sim.signed_url("t1", 0))


async def test_redirect_to_plain_http_is_blocked(rig: Rig) -> None:
    target = f"http://cdn.provider.test:{rig.sim.port}/files/t1/0"
    rig.sim.add_output("t1", 0, b"x" * 10, faults=Faults(redirect_to=target))
    with pytest.raises(PolicyBlockedError, match="scheme"):
        await fetch(rig, rig.sim.signed_url("t1", 0))


async def test_redirect_chain_within_the_limit_is_followed(rig: Rig) -> None:
    rig.sim.add_output("t1", 0, b"video" * 100, faults=Faults(redirect_hops=3))
    fetcher = rig.fetcher()
    result = await fetcher.stream(rig.sim.signed_url("t1", 0), Sink())
    await fetcher.aclose()
    assert result.redirects == ["cdn.provider.test"] * 3


async def test_redirect_chain_over_the_limit_is_blocked(rig: Rig) -> None:
    rig.sim.add_output("t1", 0, b"video", faults=Faults(redirect_hops=4))
    with pytest.raises(PolicyBlockedError, match="too_many_redirects"):
        await fetch(rig, rig.sim.signed_url("t1", 0))


@pytest.mark.parametrize(
    ("old", "new"),
    [
        pytest.param("/files/", "/fi\tles/", id="tab-in-path"),
        pytest.param("cdn.provider", "cdn.pro\tvider", id="tab-in-host"),
        pytest.param("https://", "https:\t//", id="tab-after-scheme"),
        pytest.param("?exp", "?e\txp", id="tab-in-query"),
    ],
)
async def test_a_location_with_whitespace_is_blocked_not_cleaned_up(
    rig: Rig, old: str, new: str
) -> None:
    # urljoin drops tabs (and newlines) wherever they are: the Location must be refused as
    # received, not followed once it has been cleaned into an allowed URL.
    rig.sim.add_output("t2", 0, b"video" * 10)
    location = rig.sim.signed_url("t2", 0).replace(old, new, 1)
    assert "\t" in location
    rig.sim.add_output("t1", 0, b"x", faults=Faults(redirect_to=location))
    with pytest.raises(PolicyBlockedError, match="whitespace in Location"):
        await fetch(rig, rig.sim.signed_url("t1", 0))
    assert rig.sim.requests["download"] == 1  # t1's; t2 was never asked for


async def test_a_trailing_dot_host_is_blocked_before_dns(rig: Rig) -> None:
    rig.sim.add_output("t1", 0, b"video")
    url = rig.sim.signed_url("t1", 0).replace("cdn.provider.test", "cdn.provider.test.")
    with pytest.raises(PolicyBlockedError, match="trailing dot"):
        await fetch(rig, url)
    assert rig.sim.requests["download"] == 0
    assert not any(name.startswith("cdn.provider.test") for name in rig.zone.queries)


async def test_every_caller_header_is_dropped_on_a_cross_host_redirect(rig: Rig) -> None:
    rig.sim.add_output(
        "t1", 0, b"video" * 10, faults=Faults(cross_host_redirect="cdn2.provider.test")
    )
    await fetch(
        rig,
        rig.sim.signed_url("t1", 0),
        headers={"Authorization": "Bearer provider-secret", "X-Trace": "kept"},
    )
    first, second = rig.sim.seen_headers[0], rig.sim.seen_headers[-1]
    assert first.get("Authorization") == "Bearer provider-secret"
    assert "Authorization" not in second
    assert "X-Trace" not in second  # a credential may hide under any header name
    assert first.get("X-Trace") == "kept"


async def test_authorization_is_kept_on_a_same_host_redirect(rig: Rig) -> None:
    rig.sim.add_output("t1", 0, b"video", faults=Faults(redirect_hops=1))
    await fetch(rig, rig.sim.signed_url("t1", 0), headers={"Authorization": "Bearer s"})
    assert all(h.get("Authorization") == "Bearer s" for h in rig.sim.seen_headers)


# A body cut short is resumed (max_resumes, 5) before the fetch fails; the waits between the
# resumes double from resume_backoff_seconds (1 s: 15 s in all), shortened here to 0.15 s in
# all: what these tests check is the failure each body ends in after every resume.
BRISK_RESUMES = 0.01


async def test_a_stalled_body_hits_the_idle_read_deadline(rig: Rig) -> None:
    rig.sim.add_output("t1", 0, size=1 << 20, faults=Faults(stall_after_bytes=4096))
    with pytest.raises(TransientError, match="idle read deadline"):
        await fetch(
            rig,
            rig.sim.signed_url("t1", 0),
            rig.fetcher(idle_read_timeout_seconds=0.5, resume_backoff_seconds=BRISK_RESUMES),
        )


async def test_a_slow_drip_is_stopped_by_the_total_deadline(rig: Rig) -> None:
    rig.sim.add_output("t1", 0, size=1 << 20, faults=Faults(drip_bytes_per_second=2000))
    with pytest.raises(TransientError, match="total deadline"):
        await fetch(rig, rig.sim.signed_url("t1", 0), rig.fetcher(total_timeout_seconds=1))


async def test_an_endless_body_stops_at_the_cap(rig: Rig) -> None:
    rig.sim.add_output("t1", 0, size=1 << 20, faults=Faults(endless=True))
    sink = Sink()
    fetcher = rig.fetcher(max_bytes=2 << 20)
    with pytest.raises(TooLargeError):
        await fetcher.stream(rig.sim.signed_url("t1", 0), sink)
    await fetcher.aclose()
    assert len(sink.data) <= 2 << 20


async def test_content_length_over_the_cap_is_refused_before_reading(rig: Rig) -> None:
    rig.sim.add_output("t1", 0, size=8 << 20)
    sink = Sink()
    fetcher = rig.fetcher(max_bytes=1 << 20)
    with pytest.raises(TooLargeError, match="Content-Length"):
        await fetcher.stream(rig.sim.signed_url("t1", 0), sink)
    await fetcher.aclose()
    assert len(sink.data) == 0


async def test_a_gzip_encoded_body_is_refused_not_inflated(rig: Rig) -> None:
    rig.sim.add_output("t1", 0, b"a" * 100_000, faults=Faults(gzip=True))
    sink = Sink()
    fetcher = rig.fetcher()
    with pytest.raises(InvalidResponseError, match="encoded body"):
        await fetcher.stream(rig.sim.signed_url("t1", 0), sink)
    await fetcher.aclose()
    assert len(sink.data) == 0


async def test_a_truncated_body_is_detected(rig: Rig) -> None:
    rig.sim.add_output("t1", 0, size=1 << 20, faults=Faults(truncate_at_bytes=50_000))
    with pytest.raises(TransientError, match="truncated"):
        await fetch(
            rig, rig.sim.signed_url("t1", 0), rig.fetcher(resume_backoff_seconds=BRISK_RESUMES)
        )


@pytest.mark.parametrize(
    ("faults", "error"),
    [
        (Faults(not_ready_requests=1), NotYetAvailableError),
        (Faults(expired=True), UrlExpiredError),
        (Faults(throttle_requests=1, retry_after_seconds=7), ThrottledError),
        (Faults(error_requests=1), ProviderServerError),
    ],
)
async def test_statuses_are_classified(rig: Rig, faults: Faults, error: type[Exception]) -> None:
    rig.sim.add_output("t1", 0, b"x" * 10, faults=faults)
    with pytest.raises(error) as caught:
        await fetch(rig, rig.sim.signed_url("t1", 0))
    assert "sig=" not in str(caught.value)
    if error is ThrottledError:
        assert caught.value.retry_after_seconds == 7  # type: ignore[attr-defined]


async def test_an_expired_signature_is_refused_by_the_provider(rig: Rig) -> None:
    rig.sim.add_output("t1", 0, b"x" * 10)
    with pytest.raises(UrlExpiredError):
        await fetch(rig, rig.sim.signed_url("t1", 0, ttl_seconds=-10))


async def test_a_name_without_answers_is_a_transient_dns_failure(rig: Rig) -> None:
    with pytest.raises(TransientError, match="no A or AAAA answer"):
        await fetch(rig, f"https://unknown.test:{rig.sim.port}/v.mp4")
