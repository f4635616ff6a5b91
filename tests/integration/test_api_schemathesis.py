"""A full schemathesis run against the served /openapi.json: no server errors, and every
response conforms to the document (status codes, content types, headers, bodies).

The API runs for real on loopback (real PostgreSQL, the local store) with a published asset
and a provider that accepts callbacks; schemathesis's own CLI runs as a subprocess with an
API key, so it exercises authenticated routes too. Its JUnit report is kept as an artifact.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import anyio
import msgspec
import pytest

from aivedio.config import Config, ProviderConfig
from aivedio.store.database import Pool
from tests.api_rig import open_api, published

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(600)]

ST = Path(sys.executable).with_name("st")
CHECKS = ",".join(
    [
        "not_a_server_error",
        "status_code_conformance",
        "content_type_conformance",
        "response_headers_conformance",
        "response_schema_conformance",
        "negative_data_rejection",
        "missing_required_header",
        "unsupported_method",
        "ignored_auth",
    ]
)


def artifacts() -> Path:
    root = os.environ.get("AIVEDIO_TEST_ARTIFACTS")
    path = Path(root) if root else Path(__file__).resolve().parents[2] / "var" / "test-artifacts"
    path.mkdir(parents=True, exist_ok=True)
    return path


async def run_schemathesis(
    base: str, key: str, name: str, cwd: Path, *run_args: str, settings: Path | None = None
) -> str:
    report = artifacts() / f"schemathesis-{name}.xml"
    with anyio.fail_after(300):  # a hung request fails here, with the run's name
        result = await anyio.run_process(
            [
            str(ST), "--no-color",
            *(["--config-file", str(settings)] if settings else []),
            "run", f"{base}/openapi.json", *run_args,
            "--checks", CHECKS,
            "--header", f"Authorization: Bearer {key}",
            "--phases", "examples,coverage,fuzzing",
            "--max-examples", "25",
            "--request-timeout", "10",
            "--workers", "1",
            "--seed", "1",
            "--suppress-health-check", "all",
            "--report", "junit", "--report-junit-path", str(report),
        ],
        check=False,
        cwd=cwd,  # its own cache directory lands there, not in the checkout
    )  # fmt: skip
    output = result.stdout.decode(errors="replace") + result.stderr.decode(errors="replace")
    (artifacts() / f"schemathesis-{name}.txt").write_text(output)
    assert result.returncode == 0, output[-6000:]
    assert "generated" in output and "passed" in output, output[-3000:]
    return output


async def test_schemathesis_finds_no_server_error_or_schema_violation(
    config: Config, pool: Pool, tmp_path: Path
) -> None:
    providers = {"sim": ProviderConfig(callback_secret="fuzz-secret", tenant="acme")}
    config = msgspec.structs.replace(config, providers=providers)
    async with open_api(config, pool, tmp_path, sse_keepalive_seconds=1.0) as api:
        # First every parameter generated (unknown ids, garbage tokens, hostile bodies) ...
        await run_schemathesis(api.base, api.key, "generated", tmp_path)
        # ... then with ids that exist, so the handlers' success paths answer too.
        asset = await published(api)
        doomed = await published(api)
        task = await api.rig.provider_output("sim", "fuzz-task")
        task_id = await pool.fetchval(
            "SELECT generation_task_id FROM provider_outputs WHERE id = $1", task
        )
        token = (await api.json("GET", f"/v1/videos/{asset}/playback"))["token"]
        settings = tmp_path / "schemathesis.toml"
        settings.write_text(
            f"""
[parameters]
"path.asset_id" = "{asset}"
"path.video_id" = "{asset}"
"path.task_id" = "{task_id}"
"path.token" = "{token}"

[[operations]]
include-operation-id = "deleteAsset"
parameters = {{ "path.asset_id" = "{doomed}" }}
"""
        )
        # The event stream of an existing asset is endless by design (its own tests read it);
        # here it would only hold the run until the timeout.
        output = await run_schemathesis(
            api.base,
            api.key,
            "existing",
            tmp_path,
            "--exclude-path-regex",
            "/events$",
            settings=settings,
        )
        assert "Authentication failed" not in output, output[-3000:]
