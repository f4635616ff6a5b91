"""Vendor adapters' pure parts: statuses, callbacks, credentials' origins, poll timing."""

from __future__ import annotations

import base64
import hashlib
import hmac
import random
from datetime import UTC, datetime, timedelta

import msgspec
import pytest

from aivedio.config.load import ProviderConfig
from aivedio.errors import ConfigError, InvalidResponseError, OutputLostError, PolicyBlockedError
from aivedio.net.fetch import Fetcher, FetchLimits
from aivedio.net.policy import FetchPolicy
from aivedio.pipeline.poller import RateLimiter, next_poll_delay
from aivedio.providers import VENDORS, build_adapter, callback_scheme
from aivedio.providers.base import path_segment
from aivedio.providers.fal import FalAdapter
from aivedio.providers.kling import KlingAdapter, jwt_token
from aivedio.providers.minimax import MiniMaxAdapter
from aivedio.providers.openai import OpenAIAdapter
from aivedio.providers.operations import operation_path
from aivedio.providers.replicate import ReplicateAdapter

FETCHER = Fetcher(FetchPolicy(), FetchLimits())


def adapter(kind: str, **settings: object) -> object:
    base: dict[str, object] = {
        "adapter": kind,
        "api_key": "k",
        "access_key": "a",
        "secret_key": "s",
        "app_id": "fal-ai/pika",
    }
    base.update(settings)
    return build_adapter(kind, ProviderConfig(**base), FETCHER)  # type: ignore[arg-type]


def test_every_vendor_has_an_adapter_and_a_callback_scheme() -> None:
    schemes = {kind: callback_scheme(ProviderConfig(adapter=kind)) for kind in VENDORS}
    assert schemes == {
        "runway": "none",
        "openai": "standard_webhooks",
        "veo_gemini": "standard_webhooks",
        "veo_vertex": "none",
        "replicate": "standard_webhooks",
        "fal": "fal_ed25519",
        "luma": "unsigned",
        "kling": "unsigned",
        "minimax": "minimax_challenge",
        "openrouter": "openrouter_hmac",
        "seedance": "unsigned",
        "wan": "none",
    }
    assert callback_scheme(ProviderConfig(callback_secret="x")) == "aivedio_hmac"
    assert callback_scheme(ProviderConfig()) == "none"


def test_a_vendor_adapter_without_its_credential_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"providers\.o\.api_key"):
        build_adapter("o", ProviderConfig(adapter="openai"), FETCHER)
    with pytest.raises(ConfigError, match=r"providers\.k\.secret_key"):
        build_adapter("k", ProviderConfig(adapter="kling", access_key="a"), FETCHER)


def test_download_credentials_go_to_the_vendors_own_origin_only() -> None:
    openai = adapter("openai", api_base_url="https://api.openai.com")
    assert isinstance(openai, OpenAIAdapter)
    content = openai.content_url("video_1")
    assert openai.download_headers(content) == {"Authorization": "Bearer k"}
    assert openai.download_headers("https://cdn.openai.com/x") == {}
    assert openai.download_headers("http://api.openai.com/x") == {}  # another origin
    assert openai.download_headers("https://api.openai.com:8443/x") == {}
    gemini = adapter("veo_gemini")
    files = "https://generativelanguage.googleapis.com/v1beta/files/a:download?alt=media"
    assert gemini.download_headers(files) == {"x-goog-api-key": "k"}  # type: ignore[attr-defined]
    assert gemini.download_headers("https://evil.example/x") == {}  # type: ignore[attr-defined]
    for signed in (
        "runway",
        "replicate",
        "fal",
        "luma",
        "kling",
        "minimax",
        "openrouter",
        "seedance",
        "wan",
    ):
        assert adapter(signed).download_headers("https://x.example/a") == {}  # type: ignore[attr-defined]


def test_vertex_turns_gcs_uris_into_download_urls_on_the_gcs_origin() -> None:
    vertex = adapter("veo_vertex")
    url = vertex.download_url("gs://bucket/dir/a b.mp4")  # type: ignore[attr-defined]
    assert (
        url
        == "https://storage.googleapis.com/download/storage/v1/b/bucket/o/dir%2Fa%20b.mp4?alt=media"
    )
    assert vertex.download_headers(url) == {"Authorization": "Bearer k"}  # type: ignore[attr-defined]
    with pytest.raises(InvalidResponseError):
        vertex.download_url("https://bucket/x")  # type: ignore[attr-defined]


def test_replicate_webhook_body_gives_outputs_that_expire_an_hour_after_completion() -> None:
    completed = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=5)
    body = msgspec.json.encode(
        {
            "id": "p1",
            "status": "succeeded",
            "completed_at": completed.isoformat().replace("+00:00", "Z"),
            "output": ["https://r.example/0.mp4", "https://r.example/1.mp4"],
        }
    )
    hint = ReplicateAdapter.parse_callback(body, ProviderConfig())
    assert hint.status == "SUCCEEDED" and hint.outputs is not None
    assert [(o.index, o.url) for o in hint.outputs] == [
        (0, "https://r.example/0.mp4"),
        (1, "https://r.example/1.mp4"),
    ]
    assert {o.expires_at for o in hint.outputs} == {completed + timedelta(hours=1)}
    single = ReplicateAdapter.parse_callback(
        msgspec.json.encode({"id": "p2", "status": "canceled"}), ProviderConfig()
    )
    assert (single.status, single.outputs) == ("CANCELLED", None)


def test_a_vendor_document_is_not_refused_for_a_number_in_a_field_we_never_read() -> None:
    """A prediction echoes its input: a ComfyUI-style seed is an unsigned 64-bit number
    (up to 2**64 - 1), beyond int64. The fields we read are held to their own bounds
    (``check_reported``, ``parse_time``); the rest of the vendor's document is not ours to
    refuse, and refusing it loses a genuine task (its webhook 400, every poll failed)."""
    completed = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=5)
    body = msgspec.json.encode(
        {
            "id": "p3",
            "status": "succeeded",
            "input": {"prompt": "a cat", "seed": 2**64 - 1},
            "metrics": {"predict_time": 12.5},
            "completed_at": completed.isoformat().replace("+00:00", "Z"),
            "output": "https://r.example/0.mp4",
        }
    )
    hint = ReplicateAdapter.parse_callback(body, ProviderConfig())
    assert hint.outputs is not None and [o.url for o in hint.outputs] == ["https://r.example/0.mp4"]


def test_fal_webhook_files_and_errors() -> None:
    ok = {
        "request_id": "r1",
        "status": "OK",
        "payload": {
            "video": {
                "url": "https://fal.media/v.mp4",
                "file_size": 12,
                "content_type": "video/mp4",
            }
        },
    }
    hint = FalAdapter.parse_callback(msgspec.json.encode(ok), ProviderConfig())
    assert hint.outputs is not None and hint.outputs[0].size == 12
    error = FalAdapter.parse_callback(
        msgspec.json.encode({"request_id": "r1", "status": "ERROR"}), ProviderConfig()
    )
    assert (error.status, error.outputs) == ("FAILED", [])
    with pytest.raises(InvalidResponseError):
        FalAdapter.parse_callback(b'{"request_id": "r1", "status": "OK"}', ProviderConfig())


def test_unsigned_callbacks_never_carry_outputs() -> None:
    luma = b'{"id": "g1", "state": "completed", "assets": {"video": "https://x/y"}}'
    kling = b'{"task_id": "k1", "task_status": "succeed", "task_result": {"videos": []}}'
    minimax = b'{"task_id": "m1", "status": "success", "file_id": "f"}'
    seedance = b'{"id": "s1", "status": "succeeded", "content": {"video_url": "https://x/y"}}'
    for cls, body in (
        (VENDORS["luma"], luma),
        (KlingAdapter, kling),
        (MiniMaxAdapter, minimax),
        (VENDORS["seedance"], seedance),
    ):
        hint = cls.parse_callback(body, ProviderConfig())
        assert hint.status == "SUCCEEDED" and hint.outputs is None


def test_kling_token_is_an_hs256_jwt_issued_by_the_access_key() -> None:
    token = jwt_token("ak", "sk", now=1_700_000_000)
    header, claims, signature = token.split(".")
    expected = hmac.new(b"sk", f"{header}.{claims}".encode(), hashlib.sha256).digest()
    assert base64.urlsafe_b64decode(signature + "=" * (-len(signature) % 4)) == expected
    decoded = msgspec.json.decode(base64.urlsafe_b64decode(claims + "=" * (-len(claims) % 4)))
    assert decoded == {"iss": "ak", "exp": 1_700_001_800, "nbf": 1_699_999_995}


async def _never(_task_id: str) -> object:
    raise AssertionError("a lapsed non-refreshable output must not even be asked about")


@pytest.mark.anyio
async def test_a_non_refreshable_output_past_its_lifetime_is_lost_without_asking() -> None:
    replicate = adapter("replicate")
    replicate.get_task = _never  # type: ignore[attr-defined]
    past = datetime.now(UTC) - timedelta(seconds=1)
    with pytest.raises(OutputLostError, match="does not re-issue"):
        await replicate.refresh_output_url("p1", 0, expires_at=past)  # type: ignore[attr-defined]


def test_poll_delay_follows_the_cadence_then_backs_off_honouring_retry_after() -> None:
    rng = random.Random(7)
    steady = [
        next_poll_delay(
            interval_seconds=6, jitter_seconds=1.5, failures=0, retry_after_seconds=None, rng=rng
        )
        for _ in range(200)
    ]
    assert min(steady) >= 4.5 and max(steady) <= 7.5 and len(set(steady)) > 100
    for failures in range(1, 12):
        delays = [
            next_poll_delay(
                interval_seconds=2,
                jitter_seconds=0.5,
                failures=failures,
                retry_after_seconds=None,
                rng=rng,
            )
            for _ in range(50)
        ]
        ceiling = min(600.0, 2 * 2 ** (failures - 1))
        assert all(ceiling / 2 <= d <= ceiling for d in delays)
    honoured = next_poll_delay(
        interval_seconds=2, jitter_seconds=0.5, failures=1, retry_after_seconds=30, rng=rng
    )
    assert honoured == 30


def test_rate_limiter_spaces_requests_per_provider() -> None:
    now = [100.0]
    limiter = RateLimiter(clock=lambda: now[0])
    assert limiter.acquire("a", 4) == 0
    assert limiter.acquire("a", 4) == pytest.approx(0.25)
    assert limiter.acquire("b", 4) == 0  # another provider has its own budget
    now[0] += 0.25
    assert limiter.acquire("a", 4) == 0
    limiter.hold("a", 30)  # a 429 with Retry-After: 30 holds the provider, not one task
    assert limiter.acquire("a", 4) == pytest.approx(30)
    limiter.hold("a", 1)  # a shorter hold never shortens a longer one
    assert limiter.acquire("a", 4) == pytest.approx(30)
    assert limiter.acquire("b", 4) == 0  # the other provider is not held


def test_a_task_id_fills_one_path_segment_or_is_refused() -> None:
    # The id lands in a URL sent with the vendor's key; a URL parser resolves "..", and
    # "/", "?", "#", "%" would change the path or the query.
    assert path_segment("17f2-a_b.c~d:e@f") == "17f2-a_b.c~d:e@f"
    for bad in ("", ".", "..", "../x", "a/b", "a?b", "a#b", "%2e%2e", "a\\b", "a b", "a\nb"):
        with pytest.raises(PolicyBlockedError, match="invalid_task_id"):
            path_segment(bad)
        for kind in VENDORS:
            with pytest.raises(PolicyBlockedError, match="invalid_task_id"):
                VENDORS[kind].check_task_id(bad)
    with pytest.raises(PolicyBlockedError, match="invalid_task_id"):
        path_segment("x" * 401)


def test_an_operation_name_stays_an_operation_name() -> None:
    name = "projects/p/locations/l/publishers/google/models/m@1/operations/9"
    assert operation_path(name, "projects") == name
    assert operation_path("models/veo/operations/a1", "models") == "models/veo/operations/a1"
    for bad in (
        "models/../../v1beta/files/operations/x",
        "models/veo/operations/..",
        "models/veo/operations/a/b",
        "tunedModels/x/operations/y",
        "models/veo",
        "models/veo/operations/a?alt=media",
    ):
        with pytest.raises(PolicyBlockedError, match="invalid_task_id"):
            operation_path(bad, "models")


def test_the_generic_adapter_puts_a_task_id_in_one_path_segment_or_refuses_it() -> None:
    from aivedio.providers.seam import GenericAdapter

    config = ProviderConfig(api_base_url="https://api.example.com/v1", task_path="/tasks/{task_id}")
    adapter = GenericAdapter("custom", config, FETCHER)
    assert (
        adapter._url(config.task_path, task_id="t:1@x") == "https://api.example.com/v1/tasks/t:1@x"
    )
    path = "/tasks/{task_id}/outputs/{output_index}"
    url = adapter._url(path, task_id="a_b", output_index=2)
    assert url == "https://api.example.com/v1/tasks/a_b/outputs/2"
    for hostile in ("../../v1/organization", "..", "a/b", "a?b=1", "%2e%2e", "a#b"):
        with pytest.raises(PolicyBlockedError):
            adapter._url(config.task_path, task_id=hostile)
