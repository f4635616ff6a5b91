"""Every vendor adapter end to end: its simulator, the API, the poller and the fetch stage.

Per vendor: a watched task polled to stored sources (several outputs where the vendor gives
several, each its own index), the download credential only on the vendor's own origin and
never in a log; an expired output refreshed where the vendor allows it and OUTPUT_LOST where
it does not, with no generation requested; signed callbacks refused when forged, stale or
replayed; unsigned callbacks confirmed by a task read before anything is recorded.
"""

from __future__ import annotations

import itertools
import json
import ssl
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import anyio
import msgspec
import pytest
from structlog.testing import capture_logs

from aivedio.api import vendor_callbacks
from aivedio.config.load import Config
from aivedio.pipeline.jobs import FETCH
from aivedio.pipeline.poller import RateLimiter
from aivedio.pipeline.services import url_cipher
from aivedio.providers import openrouter_webhooks
from aivedio.sim.provider import Faults
from aivedio.sim.tls import make_test_ca
from aivedio.sim.vendors.base import standard_webhooks_headers
from aivedio.store.database import Pool
from aivedio.store.objects.opening import open_object_store
from tests.support.dns_server import dns_server
from tests.support.vendor_rig import API_HOST, API_KEY, CDN_HOST, MULTI_OUTPUT, VENDORS, VendorRig
from tests.support.vendor_rig import open_vendor as _open_vendor

pytestmark = pytest.mark.anyio
Opener = Callable[..., AbstractAsyncContextManager[VendorRig]]

# After the documented lifetime: refreshed (a new URL, or the same one still served) or lost.
AFTER_LIFETIME = {
    "runway": "STORED",  # the task read signs fresh URLs
    "veo_gemini": "OUTPUT_LOST",  # files deleted after two days, never re-issued
    "veo_vertex": "STORED",  # the caller's bucket keeps it
    "replicate": "OUTPUT_LOST",  # removed an hour after completion
    "fal": "STORED",  # the result read gives the URL again
    "luma": "STORED",  # the generation read gives the URL again
    "kling": "OUTPUT_LOST",  # cleared after 30 days
    "minimax": "STORED",  # retrieve again
    "openrouter": "STORED",  # the job read gives the URLs again
    "seedance": "OUTPUT_LOST",  # cleared 24 h after the task
    "wan": "OUTPUT_LOST",  # the task (and its URL) valid 24 h, then UNKNOWN
}
LIFETIME_PASSED_SECONDS = 31 * 86400
FETCH_KIND = FETCH.name


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> tuple[ssl.SSLContext, Path]:
    _ca, server_ctx, pem = make_test_ca(
        ("localhost", API_HOST, CDN_HOST), tmp_path_factory.mktemp("ca")
    )
    return server_ctx, pem


@pytest.fixture
def nameserver() -> Iterator[str]:
    with dns_server() as (zone, ns):
        zone.set(API_HOST, ["127.0.0.1"])
        zone.set(CDN_HOST, ["127.0.0.1"])
        yield ns


@pytest.fixture
def open_vendor(
    config: Config,
    pool: Pool,
    tmp_path: Path,
    ca: tuple[ssl.SSLContext, Path],
    nameserver: str,
) -> Opener:
    def opener(vendor: str, **overrides: Any) -> AbstractAsyncContextManager[VendorRig]:
        return _open_vendor(vendor, config, pool, tmp_path, ca, nameserver, **overrides)

    return opener


def bodies(vendor: str, task: str) -> list[bytes]:
    count = 2 if vendor in MULTI_OUTPUT else 1
    return [f"{vendor}/{task}/{i}:".encode() * 5000 for i in range(count)]


async def stored(rig: VendorRig, key: str) -> bytes:
    async with open_object_store(rig.config.storage) as store:
        return b"".join([chunk async for chunk in store.get(key)])


@pytest.mark.parametrize("vendor", VENDORS)
async def test_a_watched_task_is_polled_to_stored_sources_with_the_credential_kept_home(
    vendor: str, open_vendor: Opener
) -> None:
    async with open_vendor(vendor) as rig:
        sim = rig.sim
        # Every download is redirected to another host: a credential must not follow it.
        sent = bodies(vendor, "t1")
        sim.add_task("t1", sent, faults=Faults(cross_host_redirect=CDN_HOST))
        task_id = rig.task_id("t1")
        with capture_logs() as logs:
            watched = await rig.watch(task_id)
            assert watched["watch_status"] == "WATCHING"
            async with rig.worker():
                await rig.pool.fetchval("SELECT 1")
                deadline = time.monotonic() + 10
                while sim.requests["task"] < 2 and time.monotonic() < deadline:
                    await anyio.sleep(0.05)
                assert await rig.outputs() == []  # still running at the provider
                sim.complete("t1")
                rows = await rig.wait_outputs(len(sent))
        assert [r["output_index"] for r in rows] == list(range(len(sent)))
        for row, body in zip(rows, sent, strict=True):
            assert await stored(rig, row["source_object_key"]) == body
        watch = await rig.pool.fetchrow("SELECT status, polls FROM task_watches")
        assert watch is not None
        assert watch["status"] == "SUCCEEDED" and watch["polls"] >= 2
        assert await rig.pool.fetchval("SELECT provider_status FROM generation_tasks") == (
            "PROVIDER_SUCCEEDED"
        )
        assert sim.requests["create"] == 0
        # The credential went to the vendor's API origin only, never to the CDN host...
        cdn = [r for r in sim.seen if r.host.startswith(CDN_HOST)]
        assert cdn and all(
            "Authorization" not in r.headers and "x-goog-api-key" not in r.headers for r in cdn
        )
        assert sim.credential_seen_by(API_KEY) <= {f"{API_HOST}:{sim.port}"}
        # ...and into no log line.
        assert API_KEY not in json.dumps(logs, default=str)
        again = await rig.watch(task_id, expect=200)  # idempotent per (provider, task id)
        assert again == watched | {"created": False, "watch_status": "SUCCEEDED"}


@pytest.mark.parametrize("vendor", VENDORS)
async def test_an_api_call_redirected_to_another_host_is_not_followed_with_the_credential(
    vendor: str, open_vendor: Opener
) -> None:
    async with open_vendor(vendor) as rig:
        sim = rig.sim
        sim.add_task("t1", bodies(vendor, "t1"), done=True)
        sim.redirect_task_reads = CDN_HOST
        with capture_logs() as logs:
            await rig.watch(rig.task_id("t1"))
            async with rig.worker():
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline:
                    error = await rig.pool.fetchval("SELECT last_error_class FROM task_watches")
                    if error is not None:
                        break
                    await anyio.sleep(0.05)
        assert error == "invalid_response"  # a redirect is not an answer
        assert [r for r in sim.seen if r.host.startswith(CDN_HOST)] == []
        assert sim.credential_seen_by(API_KEY) <= {f"{API_HOST}:{sim.port}"}
        assert API_KEY not in json.dumps(logs, default=str)
        assert await rig.outputs() == []


@pytest.mark.parametrize("vendor", VENDORS)
async def test_after_its_lifetime_an_output_is_refreshed_or_lost_never_regenerated(
    vendor: str, open_vendor: Opener
) -> None:
    async with open_vendor(vendor) as rig:
        sim = rig.sim
        sent = bodies(vendor, "t1")
        sim.add_task("t1", sent, done=True)
        sim.issue_expired = True  # the URLs we record are already dead
        await rig.record_now("t1")
        sim.issue_expired = False
        # The documented lifetime passes, at the provider and in our records.
        sim.age("t1", LIFETIME_PASSED_SECONDS)
        await rig.pool.execute(
            "UPDATE provider_outputs SET source_url_expires_at = now() - interval '1 minute'"
        )
        reads_before = sim.requests["task"]
        expected = AFTER_LIFETIME[vendor]
        async with rig.worker():
            rows = await rig.wait_outputs(len(sent), (expected,))
        assert sim.requests["create"] == 0
        if expected == "STORED":
            assert sim.requests["task"] > reads_before  # the refresh read the task again
            for row, body in zip(rows, sent, strict=True):
                assert await stored(rig, row["source_object_key"]) == body
        else:
            events = await rig.pool.fetch(
                "SELECT event_type FROM outbox_events WHERE event_type = 'output.lost'"
            )
            assert len(events) == len(sent)


async def test_a_refused_file_that_is_never_reissued_keeps_its_first_expiry_and_is_lost(
    open_vendor: Opener,
) -> None:
    # Gemini files last two days from our first read and are never re-issued: a refresh
    # after the file was refused reads the same URI again, which must not restart the clock.
    async with open_vendor("veo_gemini") as rig:
        sim = rig.sim
        sim.add_task("t1", bodies("veo_gemini", "t1")[:1], faults=Faults(expired=True), done=True)
        await rig.record_now("t1")
        first_expiry = await rig.pool.fetchval("SELECT source_url_expires_at FROM provider_outputs")
        async with rig.worker():
            with anyio.fail_after(30):
                while sim.requests["task"] < 2:  # the refresh read the operation again
                    await anyio.sleep(0.02)
            # The refresh found the same file: its clock did not restart.
            assert (
                await rig.pool.fetchval("SELECT source_url_expires_at FROM provider_outputs")
                == first_expiry
            )
            # Then let it run out, before the fetch job's retry budget is spent (8 attempts,
            # backoff at most 0.2 s here): the next attempt finds it expired and the output
            # lost. (Timed from the refresh, not from before the worker starts, whose start
            # on a loaded machine took longer than a fixed expiry.) A refresh in flight read
            # the old expiry and writes it back under its own version check, which this
            # out-of-band edit does not bump: keep the clock run out until the output is lost.
            with anyio.fail_after(30):
                while (await rig.outputs())[0]["fetch_status"] != "OUTPUT_LOST":
                    await rig.pool.execute(
                        "UPDATE provider_outputs SET source_url_expires_at = now()"
                        " WHERE source_url_expires_at > now()"
                    )
                    await anyio.sleep(0.02)
        assert sim.requests["create"] == 0


SIGNED = ["veo_gemini", "replicate", "fal", "openrouter"]


@pytest.mark.parametrize("vendor", SIGNED)
async def test_signed_callbacks_forged_stale_or_replayed_are_refused(
    vendor: str, open_vendor: Opener
) -> None:
    async with open_vendor(vendor) as rig:
        sim = rig.sim
        sim.add_task("t1", bodies(vendor, "t1"), done=True)
        make = sim.callback  # type: ignore[attr-defined]
        headers, body = make("t1")
        forged = dict(headers)
        if vendor == "fal":
            forged, body_forged = sim.forged_callback("t1")  # type: ignore[attr-defined]
        elif vendor == "openrouter":
            stamp = str(int(time.time()))
            forged[openrouter_webhooks.HEADER] = f"t={stamp},v1={'a' * 64}"
            body_forged = body
        else:
            forged["webhook-signature"] = "v1," + "A" * 43 + "="
            body_forged = body
        stale_headers, stale_body = make("t1", timestamp=int(time.time()) - 3600)
        await rig.callback(forged, body_forged, 401)
        await rig.callback(stale_headers, stale_body, 401)
        tampered = body.replace(b"t1", b"t2")
        await rig.callback(headers, tampered, 401)
        assert await rig.pool.fetchval("SELECT count(*) FROM generation_tasks") == 0
        first = await rig.callback(headers, body, 202)
        await rig.callback(headers, body, 409)  # the same delivery again
        receipts = await rig.pool.fetchval("SELECT count(*) FROM callback_receipts")
        assert receipts == 1
        if vendor == "fal":
            assert sim.requests["jwks"] == 1  # fetched through the guarded fetcher, cached
        if vendor in ("veo_gemini", "fal"):
            # Gemini's event names the operation (its samples are read from it); fal's key
            # signs any fal customer's webhooks, and this request is not one we know: the
            # task is read first.
            assert first["outcome"] == "task_read"
            assert await rig.outputs() == []
            async with rig.worker():
                await rig.wait_outputs(len(bodies(vendor, "t1")))
        else:
            assert first["outcome"] == "recorded"
            assert first["outputs"] == len(bodies(vendor, "t1"))
            async with rig.worker():
                await rig.wait_outputs(first["outputs"])
        assert sim.requests["create"] == 0


async def test_a_fal_signed_callback_for_a_request_we_never_saw_is_only_a_hint(
    open_vendor: Opener,
) -> None:
    # fal signs every customer's webhooks with the same key: a valid signature proves fal
    # sent the body, not that the request is ours. Anyone can point a request's webhook here.
    async with open_vendor("fal", poll_interval_seconds=60.0) as rig:
        sim = rig.sim
        headers, body = sim.foreign_callback(  # type: ignore[attr-defined]
            "req-of-someone-else", "https://evil.example/planted.mp4"
        )
        async with rig.worker():
            answer = await rig.callback(headers, body, 202)
            assert answer["outcome"] == "task_read"
            deadline = time.monotonic() + 10
            while sim.requests["task"] < 1 and time.monotonic() < deadline:
                await anyio.sleep(0.05)
            # Our account does not know the request (404): nothing is recorded.
            assert sim.requests["task"] >= 1
            await anyio.sleep(0.3)
        assert await rig.outputs() == []
        assert await rig.pool.fetchval("SELECT count(*) FROM provider_outputs") == 0
        # A request we know (watched here) is recorded from its verified body at once.
        sim.add_task("t1", bodies("fal", "t1"), done=True)
        await rig.watch("t1")
        headers, body = sim.callback("t1")  # type: ignore[attr-defined]
        answer = await rig.callback(headers, body, 202)
        assert answer["outcome"] == "recorded" and answer["outputs"] == 2


async def test_a_task_the_provider_does_not_know_is_given_up_after_a_few_reads(
    open_vendor: Opener,
) -> None:
    # A mistyped id, or a forged hint for an id the vendor never issued: a few reads, not
    # hours of backoff spending the provider's request budget of every other watched task.
    async with open_vendor("luma", poll_interval_seconds=0.05) as rig:
        headers = {"Content-Type": "application/json"}
        body = msgspec.json.encode({"id": "never-issued", "state": "completed"})
        async with rig.worker():
            answer = await rig.callback(headers, body, 202)
            assert answer["outcome"] == "task_read"
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:
                status = await rig.pool.fetchval("SELECT status FROM task_watches")
                if status != "WATCHING":
                    break
                await anyio.sleep(0.05)
            await anyio.sleep(0.5)
        watch = await rig.pool.fetchrow("SELECT status, last_error_class FROM task_watches")
        assert watch is not None and watch["status"] == "GAVE_UP"
        assert watch["last_error_class"] == "not_yet_available"
        assert len(rig.sim.task_reads) == 3
        assert await rig.outputs() == []


async def test_fal_keys_are_fetched_once_for_a_burst_and_again_after_a_rotation(
    open_vendor: Opener, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with open_vendor("fal", poll_interval_seconds=60.0) as rig:
        sim = rig.sim
        deliveries = [
            sim.foreign_callback(f"req-{n}", "https://x.example/v.mp4")  # type: ignore[attr-defined]
            for n in range(6)
        ]
        async with anyio.create_task_group() as tg:  # a burst on a cold cache
            for headers, body in deliveries:
                tg.start_soon(rig.callback, headers, body, 202)
        assert sim.requests["jwks"] == 1
        sim.rotate_key()  # type: ignore[attr-defined]
        sim.add_task("t1", bodies("fal", "t1"), done=True)
        headers, body = sim.callback("t1")  # type: ignore[attr-defined]
        # Signed by a key the cache does not hold yet, moments after the last fetch: the
        # JWKS is asked again at most once a minute, so this delivery is refused (fal
        # retries it)...
        await rig.callback(headers, body, 401)
        assert sim.requests["jwks"] == 1
        # ...and once that minute has passed, the next one fetches the new key and passes.
        monkeypatch.setattr(vendor_callbacks, "JWKS_REFETCH_SECONDS", 0.0)
        await rig.callback(headers, body, 202)
        assert sim.requests["jwks"] == 2


UNSIGNED = ["luma", "kling", "minimax", "seedance"]


def forged_success(vendor: str, body: bytes) -> bytes:
    """The same task, claimed done, with an output URL of the forger's choosing."""
    doc = msgspec.json.decode(body)
    evil = "https://evil.example/stolen.mp4"
    if vendor == "luma":
        doc.update(state="completed", assets={"video": evil})
    elif vendor == "kling":
        doc.update(task_status="succeed", task_result={"videos": [{"id": "x", "url": evil}]})
    elif vendor == "seedance":
        doc.update(status="succeeded", content={"video_url": evil})
    else:
        doc.update(status="success", file_id="file-evil", download_url=evil)
    return msgspec.json.encode(doc)


@pytest.mark.parametrize("vendor", UNSIGNED)
async def test_an_unsigned_callback_is_confirmed_by_a_task_read_before_anything_is_recorded(
    vendor: str, open_vendor: Opener
) -> None:
    # A long cadence: only the callbacks' hints make the poller read the task now.
    async with open_vendor(vendor, poll_interval_seconds=60.0) as rig:
        sim = rig.sim
        sent = bodies(vendor, "t1")
        sim.add_task("t1", sent)
        headers, body = sim.callback("t1")  # type: ignore[attr-defined]
        async with rig.worker():
            answer = await rig.callback(headers, forged_success(vendor, body), 202)
            assert answer["outcome"] == "task_read"
            deadline = time.monotonic() + 10
            while sim.requests["task"] < 1 and time.monotonic() < deadline:
                await anyio.sleep(0.05)
            assert sim.requests["task"] >= 1  # the provider was asked...
            await anyio.sleep(0.3)
            assert await rig.outputs() == []  # ...said "running", so nothing was recorded
            sim.complete("t1")
            headers, body = sim.callback("t1")  # type: ignore[attr-defined]
            await rig.callback(headers, body, 202)
            rows = await rig.wait_outputs(len(sent))
        cipher = url_cipher(rig.config)
        for row in rows:
            url = cipher.decrypt(
                row["source_url_ciphertext"], row["source_url_key_id"], bound_to=str(row["id"])
            )
            assert urlsplit(url).hostname == API_HOST  # the provider's URL, not the forger's
        assert sim.requests["create"] == 0


async def test_minimax_challenge_is_echoed(open_vendor: Opener) -> None:
    async with open_vendor("minimax") as rig:
        answer = await rig.callback({}, b'{"challenge": "c-123"}', 200)
        assert answer == {"challenge": "c-123"}
        url = f"{rig.api.base}/v1/providers/minimax/callbacks"
        async with rig.api.http.post(url, data=b'{"challenge": "<b>x</b>"}') as resp:
            assert resp.content_type == "application/json"
            assert resp.headers["X-Content-Type-Options"] == "nosniff"
            assert await resp.json() == {"challenge": "<b>x</b>"}
        # Not a challenge (control characters, overlong, another key beside it): not echoed,
        # and as an unsigned callback it names no task.
        for body in (
            b'{"challenge": "a\\r\\nSet-Cookie: x=1"}',
            b'{"challenge": "' + b"c" * 1025 + b'"}',
            b'{"challenge": "c", "extra": 1}',
        ):
            await rig.callback({}, body, 400)
        assert await rig.pool.fetchval("SELECT count(*) FROM generation_tasks") == 0


async def test_the_poller_honours_retry_after_and_the_provider_rate_limit(
    open_vendor: Opener, monkeypatch: pytest.MonkeyPatch
) -> None:
    # When the limiter let each read go, by its own clock: the spacing it keeps, without the
    # jitter of delivering each request to the simulator.
    granted: list[float] = []
    acquire = RateLimiter.acquire

    def recording_acquire(self: RateLimiter, provider: str, per_second: float) -> float:
        now = self.clock()
        wait = acquire(self, provider, per_second)
        if wait == 0:
            granted.append(now)
        return wait

    monkeypatch.setattr(RateLimiter, "acquire", recording_acquire)
    async with open_vendor("runway", poll_requests_per_second=2.0) as rig:
        sim = rig.sim
        sim.retry_after_seconds = 1.0
        sim.throttle_task_reads = 1
        for name in ("a", "b", "c"):
            sim.add_task(name, bodies("runway", name)[:1])
            await rig.watch(name)
        async with rig.worker():
            await anyio.sleep(1.5)
            for name in ("a", "b", "c"):
                sim.complete(name)
            await rig.wait_outputs(3)
        # One worker, 2 requests a second to this provider: the limiter let every read go
        # at least 0.5 s after the one before (by its clock), one grant per read...
        assert len(granted) == len(sim.task_reads), (granted, sim.task_reads)
        gaps = [b - a for a, b in itertools.pairwise(granted)]
        assert min(gaps) >= 0.5 - 1e-6, gaps
        # ...and the simulator saw them spaced too (loosely: delivery jitter shrinks a gap).
        seen = [b - a for (a, _), (b, _) in itertools.pairwise(sim.task_reads)]
        assert min(seen) >= 0.25, seen
        # The first read was throttled with Retry-After: 1. A 429 is about the account, not
        # the task: no task of this provider was read sooner, then every one was.
        first_at, _throttled = sim.task_reads[0]
        assert all(t - first_at >= 1.0 for t, _ in sim.task_reads[1:]), sim.task_reads
        assert {name for _, name in sim.task_reads[1:]} == {"a", "b", "c"}
        ended = await rig.pool.fetch("SELECT status FROM task_watches")
        assert [r["status"] for r in ended] == ["SUCCEEDED"] * 3


async def test_a_poll_that_crashes_is_recorded_with_its_class_and_stops_no_other_watch(
    open_vendor: Opener, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each watched task is its own job: one whose read raises a bug's exception is retried
    and recorded as ``internal:TypeError`` (not only ``internal``), and the others are
    polled to their outputs meanwhile."""
    from aivedio.providers.runway import RunwayAdapter

    get_task = RunwayAdapter.get_task

    async def crashing(self: RunwayAdapter, task_id: str) -> Any:
        if task_id == "bad":
            raise TypeError("can't compare offset-naive and offset-aware datetimes")
        return await get_task(self, task_id)

    monkeypatch.setattr(RunwayAdapter, "get_task", crashing)
    async with open_vendor("runway", poll_interval_seconds=0.05) as rig:
        for name in ("good", "bad"):
            rig.sim.add_task(name, bodies("runway", name)[:1])
            rig.sim.complete(name)
            await rig.watch(name)
        async with rig.worker():
            await rig.wait_outputs(1)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                # Waiting for its retry, or (its budget spent) dead in the history.
                crashed = await rig.pool.fetchrow(
                    "SELECT j.last_error_class FROM (SELECT payload, last_error_class FROM jobs"
                    " UNION ALL SELECT payload, last_error_class FROM job_history) j"
                    " JOIN task_watches w"
                    " ON j.payload->>'generation_task_id' = w.generation_task_id::text"
                    " WHERE w.provider_task_id = 'bad' AND j.last_error_class LIKE 'internal%'"
                )  # (a poll put off by the provider's request rate first says rate_limited)
                if crashed is not None:
                    break
                await anyio.sleep(0.05)
        assert crashed is not None and crashed["last_error_class"] == "internal:TypeError"
        watches = {
            r["provider_task_id"]: r["status"]
            for r in await rig.pool.fetch("SELECT provider_task_id, status FROM task_watches")
        }
        assert watches == {"good": "SUCCEEDED", "bad": "WATCHING"}


async def test_gemini_webhooks_replace_polling_and_their_uri_is_never_what_we_fetch(
    open_vendor: Opener,
) -> None:
    # The adapter's own cadence with webhooks configured: a slow backstop, so only the
    # webhook can make the operation be read again soon.
    async with open_vendor(
        "veo_gemini", poll_interval_seconds=None, poll_jitter_seconds=None
    ) as rig:
        sim = rig.sim
        sent = bodies("veo_gemini", "t1")
        sim.add_task("t1", sent)
        operation = rig.task_id("t1")
        async with rig.worker():
            await rig.watch(operation)
            with anyio.fail_after(10):
                while sim.requests["task"] < 1:  # the first read: still running
                    await anyio.sleep(0.02)
            await anyio.sleep(0.3)
            assert sim.requests["task"] == 1 and await rig.outputs() == []
            sim.complete("t1")
            # A per-request (dynamic) webhook, signed by its own secret, whose URI points
            # elsewhere: verified, yet only the operation's name is taken from it.
            body = msgspec.json.encode(
                {
                    "id": "evt_dyn",
                    "type": "video.generated",
                    "data": {"name": operation, "output_file_uri": "https://evil.example/x.mp4"},
                }
            )
            headers = standard_webhooks_headers(sim.dynamic_webhook_secret, body, None)  # type: ignore[attr-defined]
            answer = await rig.callback(headers, body, 202)
            assert answer["outcome"] == "task_read"
            rows = await rig.wait_outputs(len(sent))
            # The same delivery again (Google retries with the same webhook-id): refused.
            await rig.callback(headers, body, 409)
        assert sim.requests["task"] == 2  # the first read and the one the webhook asked for
        cipher = url_cipher(rig.config)
        for row in rows:
            url = cipher.decrypt(
                row["source_url_ciphertext"], row["source_url_key_id"], bound_to=str(row["id"])
            )
            assert urlsplit(url).hostname == API_HOST
        assert sim.requests["create"] == 0


async def test_openrouter_deliveries_are_accepted_once_per_job_and_status(
    open_vendor: Opener,
) -> None:
    async with open_vendor(
        "openrouter", extra_webhook_secrets=["rotated-in-secret"], poll_interval_seconds=60.0
    ) as rig:
        sim = rig.sim
        sim.add_task("t1", bodies("openrouter", "t1"), done=True)
        headers, body = sim.callback("t1")  # type: ignore[attr-defined]
        first = await rig.callback(headers, body, 202)
        assert (first["event_id"], first["outcome"], first["outputs"]) == (
            "t1-completed",
            "recorded",
            2,
        )
        # OpenRouter's retry of the same event, signed afresh: the key is the same, so
        # nothing is recorded twice.
        retry_headers, retry_body = sim.callback("t1", timestamp=int(time.time()) - 5)  # type: ignore[attr-defined]
        assert retry_headers != headers
        await rig.callback(retry_headers, retry_body, 409)
        # A later event of the job is another delivery: a hint, nothing recorded from it.
        expired_headers, expired_body = sim.callback("t1", status="expired")  # type: ignore[attr-defined]
        later = await rig.callback(expired_headers, expired_body, 202)
        assert (later["event_id"], later["outcome"]) == ("t1-expired", "task_read")
        assert len(await rig.outputs()) == 2
        receipts = await rig.pool.fetch("SELECT event_id FROM callback_receipts ORDER BY 1")
        assert [r["event_id"] for r in receipts] == ["t1-completed", "t1-expired"]
        # A secret being rotated in (configured as an extra secret): a delivery signed with
        # it alone passes; one signed with a secret we were never given does not.
        sim.add_task("t2", bodies("openrouter", "t2"), done=True)
        sim.webhook_secret = "a-secret-we-never-had"  # type: ignore[attr-defined]
        headers, body = sim.callback("t2")  # type: ignore[attr-defined]
        await rig.callback(headers, body, 401)
        sim.webhook_secret = ""  # type: ignore[attr-defined]
        sim.next_webhook_secret = "rotated-in-secret"  # type: ignore[attr-defined]
        headers, body = sim.callback("t2")  # type: ignore[attr-defined]
        assert (await rig.callback(headers, body, 202))["outcome"] == "recorded"
        async with rig.worker():
            await rig.wait_outputs(4)
        assert sim.requests["create"] == 0


def openrouter_signed(secret: str, doc: object) -> tuple[dict[str, str], bytes]:
    body = msgspec.json.encode(doc)
    stamp = str(int(time.time()))
    header = openrouter_webhooks.signature_header([secret.encode()], stamp, body)
    return {openrouter_webhooks.HEADER: header, "Content-Type": "application/json"}, body


async def test_a_signed_but_hostile_openrouter_body_is_refused_or_stopped_by_the_fetch_policy(
    open_vendor: Opener,
) -> None:
    async with open_vendor("openrouter", poll_interval_seconds=60.0) as rig:
        secret = rig.sim.webhook_secret  # type: ignore[attr-defined]
        for data in (
            {"id": "j1", "videos": [{"url": 5}]},  # wrong type
            {"id": ["j1"], "videos": [{"url": "https://x.example/a.mp4"}]},
            {"id": "j1", "videos": [{"url": "https://x.example/a\r\nb"}]},  # control chars
            {"id": "j1\u0000", "videos": [{"url": "https://x.example/a.mp4"}]},  # NUL
            {"id": "j1", "videos": [{"url": "https://x.example/a.mp4"}] * 257},
        ):
            headers, body = openrouter_signed(
                secret, {"type": "video.generation.completed", "data": data}
            )
            await rig.callback(headers, body, 400)
        assert await rig.pool.fetchval("SELECT count(*) FROM callback_receipts") == 0
        # Well-formed, signed, naming the cloud metadata address: recorded (the account
        # said so), then refused by the fetch's network policy, never requested.
        metadata = "https://169.254.169.254/latest/meta-data/video.mp4"
        headers, body = openrouter_signed(
            secret,
            {
                "type": "video.generation.completed",
                "data": {"id": "j2", "videos": [{"url": metadata}]},
            },
        )
        assert (await rig.callback(headers, body, 202))["outcome"] == "recorded"
        async with rig.worker():
            await rig.wait_outputs(1, ("INVALID_RESPONSE",))
        assert rig.sim.requests["download"] == 0


async def test_luma_calls_back_on_every_state_and_retries_yet_the_generation_is_read_once_done(
    open_vendor: Opener,
) -> None:
    async with open_vendor("luma", poll_interval_seconds=60.0) as rig:
        sim = rig.sim
        sim.add_task("t1", bodies("luma", "t1"))
        async with rig.worker():
            for _ in range(3):  # "dreaming", delivered three times (Luma retries 3 times)
                headers, body = sim.callback("t1")  # type: ignore[attr-defined]
                assert (await rig.callback(headers, body, 202))["outcome"] == "task_read"
            sim.complete("t1")
            for _ in range(3):  # "completed", three times
                headers, body = sim.callback("t1")  # type: ignore[attr-defined]
                await rig.callback(headers, body, 202)
            rows = await rig.wait_outputs(1)
        assert len(rows) == 1
        assert await rig.pool.fetchval("SELECT count(*) FROM generation_tasks") == 1
        fetches = await rig.pool.fetchval(
            "SELECT count(*) FROM (SELECT kind FROM jobs UNION ALL SELECT kind FROM job_history)"
            " j WHERE kind = $1",
            FETCH_KIND,
        )
        assert fetches == 1
        assert sim.requests["create"] == 0


async def test_the_openai_videos_api_is_shut_down_so_nothing_new_is_registered_for_it(
    open_vendor: Opener,
) -> None:
    # A provider section still configured with the openai adapter (its Standard Webhooks
    # secret too): the replicate simulator stands in for an API that no longer answers.
    async with open_vendor("replicate", adapter="openai") as rig:
        refused = (await rig.watch("video_123", expect=422))["error"]
        assert refused["code"] == "provider_shut_down"
        assert "OpenAI Videos API was shut down on 2026-09-24" in refused["detail"]
        rig.sim.add_task("t1", bodies("replicate", "t1"), done=True)
        headers, signed = rig.sim.callback("t1")  # type: ignore[attr-defined]
        answer = (await rig.callback(headers, signed, 410))["error"]
        assert answer["code"] == "provider_shut_down" and "2026-09-24" in answer["detail"]
        assert await rig.pool.fetchval("SELECT count(*) FROM generation_tasks") == 0
        assert await rig.pool.fetchval("SELECT count(*) FROM callback_receipts") == 0
        assert rig.sim.requests["task"] == 0
