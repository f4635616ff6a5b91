"""``aivedio fetch`` as a black box: a subprocess against a loopback HTTPS provider and DNS.

The command runs with no AIVEDIO_* variables at all (no encryption key, no database): the
fetch command must not need them.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import ssl
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest

from aivedio.sim.provider import Faults, SimulatedProvider, open_simulated_provider
from aivedio.sim.tls import make_test_ca
from tests.support.dns_server import dns_server

pytestmark = pytest.mark.anyio

BODY = random.Random(7).randbytes(300_000)
SHA = hashlib.sha256(BODY).hexdigest()


@dataclass
class Run:
    code: int
    stdout: str
    stderr: str
    records: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Rig:
    sim: SimulatedProvider
    nameserver: str
    pem: Path

    def allow(self) -> list[str]:
        return [
            *("--allow-cidr", "127.0.0.0/8", "--allow-port", str(self.sim.port)),
            *("--nameserver", self.nameserver, "--ca-file", str(self.pem)),
        ]

    def plain(self, path: str) -> str:
        return f"https://cdn.provider.test:{self.sim.port}{path}"


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> tuple[ssl.SSLContext, Path]:
    _ca, server_ctx, pem = make_test_ca(
        ("cdn.provider.test", "cdn2.provider.test"), tmp_path_factory.mktemp("ca")
    )
    return server_ctx, pem


@pytest.fixture
def nameserver() -> Iterator[str]:
    with dns_server() as (zone, ns):
        zone.set("cdn.provider.test", ["127.0.0.1"])
        zone.set("cdn2.provider.test", ["127.0.0.1"])
        yield ns


@pytest.fixture
async def rig(ca: tuple[ssl.SSLContext, Path], nameserver: str) -> AsyncIterator[Rig]:
    server_ctx, pem = ca
    async with open_simulated_provider(
        ssl_context=server_ctx, public_host="cdn.provider.test"
    ) as sim:
        sim.add_output("t1", 0, BODY)
        yield Rig(sim, nameserver, pem)


async def fetch(*args: str) -> Run:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIVEDIO_")}
    with anyio.fail_after(60):
        proc = await anyio.run_process(
            [sys.executable, "-m", "aivedio", "fetch", *args], check=False, env=env
        )
    out, err = proc.stdout.decode(), proc.stderr.decode()
    return Run(proc.returncode, out, err, [json.loads(line) for line in out.splitlines()])


async def test_default_policy_blocks_a_loopback_literal_without_showing_the_query() -> None:
    run = await fetch("https://127.0.0.1/files/t1/0?exp=1&sig=SECRETSIG")
    assert run.code == 4
    (record,) = run.records
    assert record["outcome"] == "blocked"
    assert record["error_class"] == "policy_blocked"
    assert record["detail"].startswith("ip_denied:loopback")
    assert record["url"] == "https://127.0.0.1/files/t1/0"
    assert "SECRETSIG" not in run.stdout + run.stderr


async def test_plain_http_is_blocked_by_scheme(rig: Rig) -> None:
    run = await fetch(*rig.allow(), f"http://cdn.provider.test:{rig.sim.port}/files/t1/0")
    assert run.code == 4
    (record,) = run.records
    assert (record["outcome"], record["error_class"]) == ("blocked", "policy_blocked")
    assert record["detail"].startswith("scheme_not_allowed")
    assert rig.sim.requests["download"] == 0


async def test_allowed_download_is_stored_with_the_right_bytes_and_digest(
    rig: Rig, tmp_path: Path
) -> None:
    out = tmp_path / "video.mp4"
    url = rig.sim.signed_url("t1", 0)
    run = await fetch(*rig.allow(), "--out", str(out), url)
    assert run.code == 0, run.stderr
    (record,) = run.records
    assert record["outcome"] == "stored"
    assert record["error_class"] is None
    assert (record["bytes"], record["sha256"]) == (len(BODY), SHA)
    assert record["addresses"] == ["127.0.0.1"]
    assert record["url"] == rig.plain("/files/t1/0")
    assert "sig=" not in run.stdout
    assert out.read_bytes() == BODY
    assert [p.name for p in tmp_path.iterdir()] == ["video.mp4"]


async def test_matching_expected_size_and_uppercase_sha256_are_accepted(rig: Rig) -> None:
    url = rig.sim.signed_url("t1", 0)
    expect = ["--expect-sha256", SHA.upper(), "--expect-size", str(len(BODY))]
    run = await fetch(*rig.allow(), *expect, url)
    assert run.code == 0, run.stderr
    assert run.records[0]["outcome"] == "stored"


async def test_sha256_mismatch_fails_and_leaves_no_output_file(rig: Rig, tmp_path: Path) -> None:
    out = tmp_path / "video.mp4"
    url = rig.sim.signed_url("t1", 0)
    run = await fetch(*rig.allow(), "--out", str(out), "--expect-sha256", "ab" * 32, url)
    assert run.code == 1
    (record,) = run.records
    assert (record["outcome"], record["error_class"]) == ("failed", "checksum_mismatch")
    assert SHA in record["detail"]
    assert list(tmp_path.iterdir()) == []


def _three_urls(rig: Rig) -> list[str]:
    return [
        rig.sim.signed_url("t1", 0),
        f"https://169.254.169.254:{rig.sim.port}/latest/meta-data?token=SECRETTOKEN",
        f"https://user:hunter2@cdn.provider.test:{rig.sim.port}/files/t1/0",
    ]


def _assert_three_dry_run_records(rig: Rig, run: Run) -> None:
    assert run.code == 4
    assert [r["outcome"] for r in run.records] == ["allowed", "blocked", "blocked"]
    allowed, metadata, userinfo = run.records
    assert allowed["url"] == rig.plain("/files/t1/0")
    assert allowed["addresses"] == ["127.0.0.1"]
    assert metadata["detail"].startswith("ip_denied:")
    assert metadata["url"] == f"https://169.254.169.254:{rig.sim.port}/latest/meta-data"
    assert userinfo["detail"].startswith("userinfo_present")
    assert userinfo["url"] == rig.plain("/files/t1/0")
    for secret in ("hunter2", "SECRETTOKEN", "sig="):
        assert secret not in run.stdout + run.stderr
    assert rig.sim.requests["download"] == 0  # a dry run never connects


async def test_dry_run_reports_each_url_in_order_without_connecting(rig: Rig) -> None:
    run = await fetch(*rig.allow(), "--dry-run", *_three_urls(rig))
    _assert_three_dry_run_records(rig, run)


async def test_urls_from_file_is_checked_like_arguments(rig: Rig, tmp_path: Path) -> None:
    listing = tmp_path / "urls.txt"
    listing.write_text("\n".join(["", *_three_urls(rig), "  "]) + "\n", encoding="utf-8")
    run = await fetch(*rig.allow(), "--dry-run", "--urls-from", str(listing))
    _assert_three_dry_run_records(rig, run)


async def test_a_url_line_is_checked_as_written_never_trimmed(rig: Rig, tmp_path: Path) -> None:
    url = rig.sim.signed_url("t1", 0)
    lines = [url, f" {url}", f"\t{url}", f"{url} ", f"{url}\x0b"]
    listing = tmp_path / "urls.txt"
    listing.write_text("\n".join(lines) + "\n", encoding="utf-8")
    run = await fetch(*rig.allow(), "--dry-run", "--urls-from", str(listing))
    assert run.code == 4
    assert [r["outcome"] for r in run.records] == ["allowed"] + ["blocked"] * 4
    for record in run.records[1:]:
        assert record["detail"].startswith("malformed_url: whitespace in url")


async def test_several_urls_without_dry_run_are_bad_usage(rig: Rig) -> None:
    run = await fetch(*rig.allow(), rig.sim.signed_url("t1", 0), rig.sim.signed_url("t1", 0))
    assert run.code == 2
    assert run.stdout == ""
    assert "--dry-run" in run.stderr
    assert rig.sim.requests["download"] == 0


@pytest.mark.parametrize("header", ["NoColon", "Bad Name: x", ": empty-name"])
async def test_malformed_header_is_bad_usage(header: str) -> None:
    run = await fetch("--header", header, "https://cdn.provider.test/x")
    assert run.code == 2
    assert run.stdout == ""
    assert "--header" in run.stderr


async def test_authorization_header_reaches_the_first_host_only(rig: Rig) -> None:
    rig.sim.add_output("t2", 0, BODY, faults=Faults(cross_host_redirect="cdn2.provider.test"))
    header = ["--header", "Authorization: Bearer x"]
    run = await fetch(*rig.allow(), *header, rig.sim.signed_url("t2", 0))
    assert run.code == 0, run.stderr
    assert run.records[0]["redirects"] == ["cdn2.provider.test"]
    first, second = ({k.lower(): v for k, v in h.items()} for h in rig.sim.seen_headers)
    assert first["authorization"] == "Bearer x"
    assert second["host"].startswith("cdn2.provider.test")
    assert "authorization" not in second


async def test_same_host_redirect_hops_are_reported(rig: Rig) -> None:
    rig.sim.add_output("t3", 0, BODY, faults=Faults(redirect_hops=2))
    run = await fetch(*rig.allow(), rig.sim.signed_url("t3", 0))
    assert run.code == 0, run.stderr
    (record,) = run.records
    assert record["redirects"] == ["cdn.provider.test", "cdn.provider.test"]
    assert (record["bytes"], record["sha256"]) == (len(BODY), SHA)


async def test_not_found_is_a_failure_classed_not_yet_available(rig: Rig) -> None:
    rig.sim.add_output("t4", 0, BODY, faults=Faults(not_ready_requests=5))
    run = await fetch(*rig.allow(), rig.sim.signed_url("t4", 0))
    assert run.code == 1
    (record,) = run.records
    assert (record["outcome"], record["error_class"]) == ("failed", "not_yet_available")
    assert "404" in record["detail"]
    assert "sig=" not in run.stdout + run.stderr


async def test_unknown_config_key_is_bad_usage_naming_the_key(tmp_path: Path) -> None:
    config = tmp_path / "aivedio.toml"
    config.write_text("[net]\nallowed_ports = [443]\nbogus_limit = 3\n", encoding="utf-8")
    run = await fetch("--config", str(config), "https://cdn.provider.test/x")
    assert run.code == 2
    assert run.stdout == ""
    assert "net.bogus_limit" in run.stderr


async def test_a_body_cut_twice_is_resumed_and_reported(rig: Rig, tmp_path: Path) -> None:
    rig.sim.add_output("t5", 0, BODY, faults=Faults(truncate_at_bytes=100_000, truncate_requests=2))
    out = tmp_path / "video.mp4"
    run = await fetch(*rig.allow(), "--out", str(out), rig.sim.signed_url("t5", 0))
    assert run.code == 0, run.stderr
    (record,) = run.records
    assert (record["bytes"], record["sha256"]) == (len(BODY), SHA)
    assert (record["resumes"], record["restarts"]) == (2, 0)
    assert out.read_bytes() == BODY
    ranges = [h.get("Range") for h in rig.sim.seen_headers]
    assert ranges == [None, "bytes=100000-", "bytes=200000-"]
    logged = [json.loads(line) for line in run.stderr.splitlines() if line.startswith("{")]
    resumed = [e for e in logged if e["event"] == "fetch_resumed"]
    assert [(e["offset"], e["resumes"]) for e in resumed] == [(100_000, 1), (200_000, 2)]
    (where,) = {e["url"] for e in resumed}  # scheme, host, port and a hash: no query
    assert where.startswith(f"https://cdn.provider.test:{rig.sim.port}/#"), where
    assert "sig=" not in run.stdout + run.stderr


async def test_a_resume_answered_whole_starts_the_file_over(rig: Rig, tmp_path: Path) -> None:
    faults = Faults(truncate_at_bytes=100_000, truncate_requests=1, ignore_range=True)
    rig.sim.add_output("t6", 0, BODY, faults=faults)
    out = tmp_path / "video.mp4"
    run = await fetch(*rig.allow(), "--out", str(out), rig.sim.signed_url("t6", 0))
    assert run.code == 0, run.stderr
    (record,) = run.records
    assert (record["bytes"], record["sha256"], record["restarts"]) == (len(BODY), SHA, 1)
    assert out.read_bytes() == BODY  # not the first 100 000 bytes twice


async def test_a_body_cut_past_the_resumes_fails_with_what_was_done(
    rig: Rig, tmp_path: Path
) -> None:
    config = tmp_path / "aivedio.toml"
    config.write_text("[net]\nmax_resumes = 2\nresume_backoff_seconds = 0.0\n", encoding="utf-8")
    rig.sim.add_output("t7", 0, BODY, faults=Faults(truncate_at_bytes=10_000))
    run = await fetch("--config", str(config), *rig.allow(), rig.sim.signed_url("t7", 0))
    assert run.code == 1
    (record,) = run.records
    assert (record["outcome"], record["error_class"]) == ("failed", "transient")
    assert "truncated" in record["detail"]
    assert (record["resumes"], record["bytes"]) == (2, 30_000)
    assert rig.sim.requests["download"] == 3
    assert "sig=" not in run.stdout + run.stderr
