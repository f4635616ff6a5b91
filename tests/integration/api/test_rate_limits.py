"""Rate limits through the real API (loopback HTTP, real PostgreSQL, the local store): a
burst over a bucket is answered 429 with Retry-After and counted in /metrics; one key's
burst leaves another key whole; a provider within its bucket is never refused, whatever
junk others send to its URL; probes and scrapes are never limited.

Distinct client addresses come from X-Forwarded-For with 127.0.0.1 listed as a trusted
proxy (the path a deployment behind a load balancer takes); without it the header is
ignored, which one test shows."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest
from prometheus_client.parser import text_string_to_metric_families

from aivedio.config.api import RateLimitConfig, RateLimitsConfig
from aivedio.config.load import Config, ProviderConfig
from aivedio.providers.hmac_callbacks import sign
from aivedio.store.database import Pool
from tests.support.api_rig import Api, open_api

pytestmark = [pytest.mark.anyio, pytest.mark.integration]

SECRET = "cb-secret-for-rate-limits"
SLOW = 0.001  # tokens a second: nothing comes back during a test
PROVIDER_ADDRESS = "203.0.113.5"
JUNK_ADDRESS = "198.51.100.7"


def rate(burst: int, per_second: float = SLOW) -> RateLimitConfig:
    return RateLimitConfig(rate_per_second=per_second, burst=burst)


def limits(**kw: Any) -> RateLimitsConfig:
    """Every scope roomy unless named: a test counts only what it means to."""
    roomy = {s: rate(10_000, 1000.0) for s in ("key", "address", "auth_failure", "callback")}
    return RateLimitsConfig(**{**roomy, **kw})


def with_provider(config: Config) -> Config:
    providers = {"sim": ProviderConfig(callback_secret=SECRET, tenant="acme")}
    return msgspec.structs.replace(config, providers=providers)


async def status_of(api: Api, method: str, path: str, **kw: Any) -> tuple[int, Any, str | None]:
    async with api.http.request(method, api.base + path, **kw) as resp:
        body = await resp.json() if resp.content_type == "application/json" else None
        return resp.status, body, resp.headers.get("Retry-After")


async def rate_limited(api: Api) -> dict[str, float]:
    async with api.http.get(api.base + "/metrics") as resp:
        text = await resp.text()
    return {
        sample.labels["scope"]: sample.value
        for family in text_string_to_metric_families(text)
        if family.name == "aivedio_api_rate_limited"
        for sample in family.samples
        if sample.name == "aivedio_api_rate_limited_total"
    }


def assert_refused(answer: tuple[int, Any, str | None]) -> None:
    status, body, retry_after = answer
    assert status == 429, answer
    assert body["error"]["code"] == "rate_limited" and body["error"]["detail"]
    assert retry_after is not None and retry_after.isdigit() and int(retry_after) >= 1


async def test_a_keys_burst_over_its_bucket_is_refused_and_another_key_is_not(
    config: Config, pool: Pool, tmp_path: Path
) -> None:
    async with open_api(config, pool, tmp_path, rate_limits=limits(key=rate(5))) as api:
        _, other = await api.tenant("globex")
        missing = f"/v1/assets/{uuid.uuid4()}"
        answers = [await status_of(api, "GET", missing, headers=api.auth()) for _ in range(8)]
        assert [a[0] for a in answers] == [404] * 5 + [429] * 3
        for answer in answers[5:]:
            assert_refused(answer)
        assert int(answers[5][2] or 0) >= 900  # a token in 1000 s at 0.001 a second
        # The other key (another tenant here) was not slowed by the first one's burst.
        others = [await status_of(api, "GET", missing, headers=api.auth(other)) for _ in range(5)]
        assert [a[0] for a in others] == [404] * 5
        assert_refused(await status_of(api, "GET", missing, headers=api.auth(other)))
        # Never limited: probes and scrapes, however many.
        for path in ("/healthz", "/readyz", "/metrics") * 20:
            assert (await status_of(api, "GET", path))[0] == 200, path
        counted = await rate_limited(api)
        assert counted["key"] == 4
        assert counted["address"] == counted["auth_failure"] == counted["callback"] == 0


async def test_a_burst_without_a_key_is_limited_per_client_address(
    config: Config, pool: Pool, tmp_path: Path
) -> None:
    async with open_api(
        config,
        pool,
        tmp_path,
        rate_limits=limits(address=rate(4), trusted_proxies=["127.0.0.1/32"]),
    ) as api:
        one = {"X-Forwarded-For": "192.0.2.1"}
        answers = [await status_of(api, "GET", "/openapi.json", headers=one) for _ in range(6)]
        assert [a[0] for a in answers] == [200] * 4 + [429] * 2
        assert_refused(answers[-1])
        assert (await status_of(api, "GET", "/static/watch.css", headers=one))[0] == 429
        token_path = f"/media/not-a-token/{uuid.uuid4()}/x.m3u8"
        assert (await status_of(api, "GET", token_path, headers=one))[0] == 429
        # Another address is whole, and a forged chain cannot pick its own bucket: the
        # rightmost untrusted hop is the client.
        two = {"X-Forwarded-For": "192.0.2.1, 192.0.2.2"}
        assert (await status_of(api, "GET", "/openapi.json", headers=two))[0] == 200
        forged = {"X-Forwarded-For": "192.0.2.99, 192.0.2.1"}
        assert (await status_of(api, "GET", "/openapi.json", headers=forged))[0] == 429
        assert (await rate_limited(api))["address"] == 5


async def test_forwarded_for_from_an_untrusted_peer_buys_no_fresh_bucket(
    config: Config, pool: Pool, tmp_path: Path
) -> None:
    async with open_api(config, pool, tmp_path, rate_limits=limits(address=rate(3))) as api:
        statuses = []
        for i in range(5):
            forged = {"X-Forwarded-For": f"192.0.2.{i}"}
            statuses.append((await status_of(api, "GET", "/openapi.json", headers=forged))[0])
        assert statuses == [200] * 3 + [429] * 2


async def test_wrong_keys_drain_their_address_and_valid_keys_never_do(
    config: Config, pool: Pool, tmp_path: Path
) -> None:
    async with open_api(
        config,
        pool,
        tmp_path,
        rate_limits=limits(auth_failure=rate(3), trusted_proxies=["127.0.0.1/32"]),
    ) as api:
        missing = f"/v1/assets/{uuid.uuid4()}"
        good = {**api.auth(), "X-Forwarded-For": "192.0.2.10"}
        for _ in range(10):  # more valid requests than the failure bucket holds
            assert (await status_of(api, "GET", missing, headers=good))[0] == 404
        bad = {"Authorization": f"Bearer av_live_00000000_{'x' * 43}"}
        bad["X-Forwarded-For"] = "192.0.2.66"
        answers = [await status_of(api, "GET", missing, headers=bad) for _ in range(3)]
        assert [a[0] for a in answers] == [401] * 3
        assert_refused(await status_of(api, "GET", missing, headers=bad))
        no_key = {"X-Forwarded-For": "192.0.2.66"}
        assert_refused(await status_of(api, "GET", missing, headers=no_key))
        # The address that never failed is untouched.
        assert (await status_of(api, "GET", missing, headers=good))[0] == 404
        assert (await rate_limited(api))["auth_failure"] == 2


def callback(event_id: str, *, secret: str = SECRET) -> tuple[bytes, dict[str, str]]:
    output = {"index": 0, "url": "https://cdn.provider.example/o.mp4?sig=a"}
    doc = {"event_id": event_id, "task_id": f"t-{event_id}", "status": "SUCCEEDED"}
    body = msgspec.json.encode({**doc, "outputs": [output]})
    timestamp = str(int(time.time()))
    return body, {
        "X-Aivedio-Timestamp": timestamp,
        "X-Aivedio-Signature": "sha256=" + sign(secret.encode(), timestamp, body),
        "Content-Type": "application/json",
    }


async def test_a_provider_within_its_bucket_is_never_refused_while_junk_floods_its_url(
    config: Config, pool: Pool, tmp_path: Path
) -> None:
    burst = 12
    async with open_api(
        with_provider(config),
        pool,
        tmp_path,
        rate_limits=limits(callback=rate(burst), trusted_proxies=["127.0.0.1/32"]),
    ) as api:
        url = "/v1/providers/sim/callbacks"
        genuine: list[int] = []
        junk: list[int] = []

        async def provider() -> None:
            for i in range(burst):
                body, headers = callback(f"evt-{i}")
                headers["X-Forwarded-For"] = PROVIDER_ADDRESS
                genuine.append((await status_of(api, "POST", url, data=body, headers=headers))[0])

        async def flood() -> None:
            for i in range(60):
                body, headers = callback(f"junk-{i}", secret="not-the-secret")
                headers["X-Forwarded-For"] = JUNK_ADDRESS
                junk.append((await status_of(api, "POST", url, data=body, headers=headers))[0])

        async with anyio.create_task_group() as tg:
            tg.start_soon(flood)
            tg.start_soon(provider)
        assert genuine == [202] * burst
        assert junk[:burst] == [401] * burst and set(junk[burst:]) == {429}
        counted = await rate_limited(api)
        assert counted["callback"] == 60 - burst
        async with api.http.get(api.base + "/metrics") as resp:
            text = await resp.text()
        assert 'aivedio_api_callbacks_total{outcome="rate_limited",provider="sim"}' in text
        # Past its own burst, the provider is limited too: the bucket is its to keep within.
        body, headers = callback("evt-over")
        headers["X-Forwarded-For"] = PROVIDER_ADDRESS
        assert_refused(await status_of(api, "POST", url, data=body, headers=headers))
        assert await pool.fetchval("SELECT count(*) FROM callback_receipts") == burst


async def test_a_providers_own_rate_and_unknown_providers_counted_per_address(
    config: Config, pool: Pool, tmp_path: Path
) -> None:
    own = {"sim": rate(6)}
    rate_limits = limits(callback=rate(2), address=rate(3), callback_providers=own)
    async with open_api(with_provider(config), pool, tmp_path, rate_limits=rate_limits) as api:
        statuses = []
        for i in range(7):
            body, headers = callback(f"evt-{i}")
            url = "/v1/providers/sim/callbacks"
            statuses.append((await status_of(api, "POST", url, data=body, headers=headers))[0])
        assert statuses == [202] * 6 + [429]
        # A name no provider has: the address's bucket, not one bucket per made-up name.
        unknown = [
            (await status_of(api, "POST", f"/v1/providers/made-up-{i}/callbacks", data=b"{}"))[0]
            for i in range(5)
        ]
        assert unknown == [404] * 3 + [429] * 2


async def test_switched_off_nothing_is_refused(config: Config, pool: Pool, tmp_path: Path) -> None:
    off = RateLimitsConfig(enabled=False, key=rate(1), address=rate(1), auth_failure=rate(1))
    async with open_api(config, pool, tmp_path, rate_limits=off) as api:
        missing = f"/v1/assets/{uuid.uuid4()}"
        for _ in range(20):
            assert (await status_of(api, "GET", missing, headers=api.auth()))[0] == 404
            assert (await status_of(api, "GET", missing))[0] == 401
            assert (await status_of(api, "GET", "/openapi.json"))[0] == 200


async def test_the_document_describes_the_429_on_every_limited_operation(
    config: Config, pool: Pool, tmp_path: Path
) -> None:
    async with open_api(config, pool, tmp_path) as api:
        _, doc, _ = await status_of(api, "GET", "/openapi.json")
    for path, item in doc["paths"].items():
        for method, operation in item.items():
            limited = path not in ("/healthz", "/readyz", "/metrics")
            assert ("429" in operation["responses"]) == limited, (path, method)
            if limited:
                header = operation["responses"]["429"]["headers"]["Retry-After"]
                assert header["required"] is True
