"""The schemathesis runs of ``tests/integration/api/test_schemathesis*.py``: the run's
configuration (what the schema cannot say, told per operation), the API it fuzzes, and the
CLI run itself. Two runs, one file each so that the suite's two workers take them at once:
every parameter generated (``test_schemathesis.py``), and ids that exist
(``test_schemathesis_existing.py``).
"""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import msgspec

from aivedio.config.api import RateLimitConfig, RateLimitsConfig
from aivedio.config.load import Config, ProviderConfig
from aivedio.store.database import Pool
from aivedio.store.outbox import OutboxStore, emit
from tests.support.api_rig import Api, open_api

ST = Path(sys.executable).with_name("st")
# Rate limits stay on (their 429 is in the document) but out of the fuzzer's way: it must
# see the answers the checks expect, such as 401 for each of its many requests without a key.
ROOMY = RateLimitConfig(rate_per_second=100_000.0, burst=1_000_000)
LIMITS = RateLimitsConfig(key=ROOMY, address=ROOMY, auth_failure=ROOMY, callback=ROOMY)
# The positive-data check's defaults, plus the refusal of a rule the schema cannot state.
ACCEPTED = ["2xx", "3xx", "401", "403", "404", "409", "429", "5xx"]
BEYOND_THE_SCHEMA: dict[str, str | list[str]] = {
    # An Idempotency-Key the fuzzer sends again with another body: 422 by a rule of state.
    "createVideo": "422",
    "uploadVideo": "422",
    # A cursor is opaque: only the ones the API gave are valid, which no schema can say.
    "listAssets": "400",
    "listVideos": "400",
    "listGenerationTasks": "400",
    # A still's time must fall inside the video's duration, which no schema can say.
    "getThumbnail": "400",
    "watchGenerationTask": "422",
    # A receiver URL the address policy refuses (a private address, a port not allowed), or
    # a tenant past its receivers: rules of policy and state, not of the schema.
    "createWebhook": "422",
    "listWebhookDeliveries": "400",
    # Caption text that is not WebVTT or SRT (no timing line, a bad timestamp, more bytes
    # of UTF-8 than characters): the parser's rule, which no schema can state.
    "createVideoTrack": "422",
    "getMedia": "416",
    "headMedia": "416",
}
# The tus routes are left out of the fuzzing: the protocol answers a missing or unsupported
# Tus-Resumable with 412 (where the fuzzer expects a 400-class answer), its OPTIONS is the
# capability discovery and CORS preflight that answers any URL under /v1/uploads, and its
# bodies are application/offset+octet-stream, which the fuzzer cannot make. They are held to
# the protocol by a real tus client and hostile headers instead (tests/integration/api/
# test_tus.py, tests/unit/api/test_tus_protocol.py); their entries in the document are
# still validated with the whole document.
TUS = {
    "discoverUploads",
    "createUpload",
    "discoverUpload",
    "getUploadOffset",
    "appendUpload",
    "terminateUpload",
}
# A callback is signed with its provider's secret, which the fuzzer cannot do: every request
# to a configured provider is 401, to any other 404, so "authentication failed" and "missing
# test data" are all it could say. Its signed bodies are fuzzed by test_api_edge_property.py.
UNSIGNABLE = {"postProviderCallback"}
# Warnings about the document or the run itself fail every run. (Not validation_mismatch:
# schema-valid data refused is a positive_data_acceptance failure already, and the
# operations allowed a refusal above would only warn again about the rule they are allowed.)
DOCUMENT_WARNINGS = [
    "unsupported_regex",
    "unresolvable_reference",
    "rate_limited",
    "missing_deserializer",
    "unused_openapi_auth",
]


def toml(value: object) -> str:
    return msgspec.json.encode(value).decode()  # JSON strings and arrays are TOML too


def settings(
    parameters: dict[str, str],
    *,
    fail_on: list[str],
    per_operation: dict[str, dict[str, str]] | None = None,
) -> str:
    """The run's configuration file: ``parameters`` pins parameters everywhere,
    ``per_operation`` in one operation (by its operationId)."""
    per_operation = per_operation or {}
    pinned = "".join(f"{toml(name)} = {toml(value)}\n" for name, value in parameters.items())
    operations = ""
    for operation in sorted(
        BEYOND_THE_SCHEMA.keys() | per_operation.keys() | UNSIGNABLE | TUS | {"streamAssetEvents"}
    ):
        operations += f"\n[[operations]]\ninclude-operation-id = {toml(operation)}\n"
        if operation == "streamAssetEvents":
            operations += "request-timeout = 2\n"
        if operation in UNSIGNABLE:
            shown = [name for name in fail_on if name not in ("missing_auth", "missing_test_data")]
            operations += f"warnings = {{ display = {toml(shown)}, fail-on = true }}\n"
        if operation in BEYOND_THE_SCHEMA:
            beyond = BEYOND_THE_SCHEMA[operation]
            statuses = [*ACCEPTED, *([beyond] if isinstance(beyond, str) else beyond)]
            operations += f"checks.positive_data_acceptance.expected-statuses = {toml(statuses)}\n"
        if operation in TUS:
            operations += "enabled = false\n"
        for name, value in per_operation.get(operation, {}).items():
            operations += f"parameters.{toml(name)} = {toml(value)}\n"
    return f"""
# An event stream is endless: one event shows its shape (the stream sends its history first),
# and a stream resumed after its last event (a generated Last-Event-ID) is read for 2 s.
max-stream-events = 1

[warnings]
fail-on = {toml(fail_on)}

# The providers configured, as names for the fields that name one.
[dictionaries.pollable]
values = ["poll"]

[dictionaries.signing]
values = ["sim"]

[parameters]
"body.provider" = {{ dictionary = "pollable", probability = 0.5 }}
"path.provider" = {{ dictionary = "signing", probability = 0.5 }}
{pinned}{operations}"""


async def uploaded(api: Api, body: bytes) -> str:
    """A video whose bytes were uploaded, not yet completed: its id."""
    declared = {"size_bytes": len(body), "sha256": hashlib.sha256(body).hexdigest()}
    created = await api.json("POST", "/v1/videos", expect=201, json=declared)
    video_id = str(created["video_id"])
    await api.json(
        "PUT",
        f"/v1/videos/{video_id}/upload",
        data=body,
        headers={"Content-Type": "application/octet-stream"},
    )
    return video_id


async def webhook_with_a_dead_delivery(api: Api) -> tuple[str, str, str]:
    """A receiver with a dead delivery (its event's id), and another receiver to delete."""
    create = {"url": "https://hooks.example.com/in"}
    webhook = (await api.json("POST", "/v1/webhooks", expect=201, json=create))["webhook_id"]
    doomed = (await api.json("POST", "/v1/webhooks", expect=201, json=create))["webhook_id"]
    async with api.rig.pool.acquire() as conn, conn.transaction():
        event_id = await emit(
            conn, "asset.ready", tenant_id=api.rig.tenant_id, aggregate_id=None, payload={}
        )
    await OutboxStore(api.rig.pool).materialise(f"receiver:{webhook}", [], 10, api.rig.tenant_id)
    await api.rig.pool.execute("UPDATE outbox_deliveries SET dead_at = now()")
    return webhook, doomed, str(event_id)


def artifacts() -> Path:
    root = os.environ.get("AIVEDIO_TEST_ARTIFACTS")
    path = Path(root) if root else Path(__file__).resolve().parents[2] / "var" / "test-artifacts"
    path.mkdir(parents=True, exist_ok=True)
    return path


async def run_schemathesis(base: str, key: str, name: str, cwd: Path, settings: str) -> str:
    report = artifacts() / f"schemathesis-{name}.xml"
    config_file = cwd / f"schemathesis-{name}.toml"
    config_file.write_text(settings)
    with anyio.fail_after(300):  # a hung request fails here, with the run's name
        result = await anyio.run_process(
            [
                str(ST),
                "--no-color",
                "--config-file",
                str(config_file),
                "run",
                f"{base}/openapi.json",
                "--checks",
                "all",
                "--header",
                f"Authorization: Bearer {key}",
                "--phases",
                "examples,coverage,fuzzing,stateful",
                "--max-examples",
                "25",
                "--request-timeout",
                "10",
                "--workers",
                "1",
                "--seed",
                "1",
                "--suppress-health-check",
                "all",
                "--report",
                "junit",
                "--report-junit-path",
                str(report),
            ],
            check=False,
            cwd=cwd,  # its own cache directory lands there, not in the checkout
        )
    output = result.stdout.decode(errors="replace") + result.stderr.decode(errors="replace")
    (artifacts() / f"schemathesis-{name}.txt").write_text(output)
    assert result.returncode == 0, output[-6000:]
    assert "generated" in output and "passed" in output, output[-3000:]
    return output


@asynccontextmanager
async def fuzzed_api(config: Config, pool: Pool, tmp_path: Path) -> AsyncIterator[Api]:
    """The API as both runs fuzz it: providers that accept callbacks and watches, rate
    limits on but roomy, a short keepalive for the event stream."""
    providers = {
        "sim": ProviderConfig(callback_secret="fuzz-secret", tenant="acme"),
        # Polled by a worker (none runs here), so watches of its tasks are registered.
        "poll": ProviderConfig(api_base_url="http://127.0.0.1:9/", tenant="acme"),
    }
    config = msgspec.structs.replace(config, providers=providers)
    async with open_api(
        config, pool, tmp_path, sse_keepalive_seconds=1.0, rate_limits=LIMITS
    ) as api:
        yield api
