"""A full schemathesis run against the served /openapi.json, with every check it has: no
server errors, every response as the document says (status codes, content types, headers,
bodies), every request the document calls valid accepted and every invalid one refused, auth
never ignored, undeclared methods answered 405 with ``Allow``, and, in the stateful phase
that follows the document's links, what one answer creates found by the next request.

The API runs for real on loopback (real PostgreSQL, the local store) with a published asset
and providers that accept callbacks and watches; schemathesis's own CLI runs as a subprocess
with an API key, so it exercises authenticated routes too. Its reports are kept as artifacts.

What the schema cannot say is told to schemathesis per operation, never by leaving a check or
an operation out:

* ``PUT /v1/videos/{id}/upload`` keeps only the bytes ``POST /v1/videos`` declared (size and
  SHA-256): a schema-valid body of other bytes is refused 422, as documented.
* ``POST /v1/generation-tasks`` names a provider: which ones are configured (and which task
  ids each issues) is this deployment's configuration, which the public document does not
  list, so a well-formed name of no configured provider is refused 422, as documented. The
  configured names are given as a dictionary, so the success path (and its link) runs too.
* ``GET``/``HEAD /media/{token}/{path}``: a well-formed ``Range`` past the object's end is
  416, as documented; the object's size is not the schema's to know.
* ``POST /v1/providers/{provider}/callbacks`` is checked like every operation, but its two
  warnings about never getting past the signature are not shown (why: ``UNSIGNABLE``).
* The event stream is endless by design: it is read up to its first event (or 2 s), so it
  is fuzzed with existing assets too instead of being left out of the second run.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import anyio
import msgspec
import pytest

from aivedio.config.api import RateLimitConfig, RateLimitsConfig
from aivedio.config.load import Config, ProviderConfig
from aivedio.store.database import Pool
from aivedio.store.outbox import OutboxStore, emit
from tests.support.api_rig import Api, open_api, published

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(600)]

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
    path = Path(root) if root else Path(__file__).resolve().parents[3] / "var" / "test-artifacts"
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


async def test_schemathesis_finds_no_conformance_failure(
    config: Config, pool: Pool, tmp_path: Path
) -> None:
    providers = {
        "sim": ProviderConfig(callback_secret="fuzz-secret", tenant="acme"),
        # Polled by a worker (none runs here), so watches of its tasks are registered.
        "poll": ProviderConfig(api_base_url="http://127.0.0.1:9/", tenant="acme"),
    }
    config = msgspec.structs.replace(config, providers=providers)
    async with open_api(
        config, pool, tmp_path, sse_keepalive_seconds=1.0, rate_limits=LIMITS
    ) as api:
        # First every parameter generated (unknown ids, garbage tokens, hostile bodies), and
        # the ids that answers create followed through the document's links ...
        first = settings({}, fail_on=DOCUMENT_WARNINGS)  # unknown ids: 404s are the point
        await run_schemathesis(api.base, api.key, "generated", tmp_path, first)
        # ... then with ids that exist, so the handlers' success paths answer too.
        # A real video for the stills made on demand (getThumbnail decodes the playback).
        clip = tmp_path / "fuzz.mp4"
        subprocess.run(
            [
                "ffmpeg",
                "-v",
                "error",
                "-f",
                "lavfi",
                "-i",
                "testsrc2=size=64x48:rate=10:d=1",
                "-pix_fmt",
                "yuv420p",
                "-c:v",
                "libx264",
                str(clip),
            ],
            check=True,
        )
        asset = await published(api, playback=clip.read_bytes())
        await pool.execute(
            "UPDATE assets SET duration_us = 1000000, width = 64, height = 48 WHERE id = $1",
            asset,
        )
        doomed = await published(api)
        task = await api.rig.provider_output("sim", "fuzz-task")
        task_id = await pool.fetchval(
            "SELECT generation_task_id FROM provider_outputs WHERE id = $1", task
        )
        token = (await api.json("GET", f"/v1/videos/{asset}/playback"))["token"]
        pinned = {
            "path.asset_id": str(asset),
            "path.task_id": str(task_id),
            "path.token": token,
            "path.path": "playback.mp4",
        }
        webhook, doomed_webhook, dead_event = await webhook_with_a_dead_delivery(api)
        published_video = {"path.video_id": str(asset)}
        uploaded_video = {"path.video_id": await uploaded(api, b"fuzz")}
        per_operation = {
            "getVideoStatus": published_video,
            "getVideoPlayback": published_video,
            "createVideoTrack": published_video,
            "uploadVideo": uploaded_video,
            "completeVideo": uploaded_video,
            "deleteAsset": {"path.asset_id": str(doomed)},
            "getWebhook": {"path.webhook_id": webhook},
            "rotateWebhookSecret": {"path.webhook_id": webhook},
            "deleteWebhook": {"path.webhook_id": doomed_webhook},
            "retryWebhookDelivery": {"path.event_id": dead_event},
        }
        # Every warning fails this run: the ids exist, the key and the token are valid.
        fail_on = [*DOCUMENT_WARNINGS, "missing_auth", "missing_test_data"]
        existing = settings(pinned, fail_on=fail_on, per_operation=per_operation)
        output = await run_schemathesis(api.base, api.key, "existing", tmp_path, existing)
        assert "Authentication failed" not in output, output[-3000:]
        assert "Missing test data" not in output, output[-3000:]
