"""``aivedio status`` and ``aivedio reprocess`` against a real published asset."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

from aivedio.cli import main as cli
from aivedio.config.load import Config
from aivedio.store.asset_status import asset_status
from aivedio.store.database import Pool
from tests.conftest import TEST_KEY
from tests.support.media_fixtures import MediaCache, h264_faststart
from tests.support.pipeline_rig import Rig, make_rig, running_worker

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    cache = MediaCache(tmp_path_factory.mktemp("media"))
    return cache.get("h264", h264_faststart, width=320, height=240, seconds=2).read_bytes()


@pytest.fixture
async def rig(config: Config, pool: Pool, tmp_path: Path) -> AsyncIterator[Rig]:
    async with make_rig(config, pool, tmp_path) as r:
        yield r


async def publish(rig: Rig, source: bytes) -> uuid.UUID:
    asset_id = await rig.quarantine(source, task=("sim", f"task-{uuid.uuid4().hex[:6]}"))
    await rig.enqueue_probe(asset_id)
    async with running_worker(rig):
        await rig.wait("SELECT 1 FROM assets WHERE id = $1 AND status = 'ENRICHED'", asset_id)
        await rig.wait_idle(asset_id)
    return asset_id


def run_cli(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], rig: Rig, *argv: str
) -> tuple[int, str]:
    monkeypatch.setenv("AIVEDIO_DATABASE_URL", rig.config.database.url)
    monkeypatch.setenv("AIVEDIO_URL_ENCRYPTION_KEY", TEST_KEY)
    monkeypatch.setenv("AIVEDIO_STORAGE_URL", rig.config.storage.url)
    import structlog

    saved = structlog.get_config()
    capsys.readouterr()  # what the worker logged earlier is not the command's output
    try:
        code = cli.main(list(argv))
    finally:
        structlog.configure(**saved)
    return code, capsys.readouterr().out


async def test_status_reports_state_variants_and_timeline(
    rig: Rig, source: bytes, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    asset_id = await publish(rig, source)
    status = await asset_status(rig.pool, asset_id)
    assert status is not None
    assert status["asset_id"] == str(asset_id)
    assert status["state"] == "ENRICHED"
    assert status["current_revision"] == 2
    by_type = {v["variant_type"]: v for v in status["variants"]}
    assert {"playback", "poster", "hls"} <= set(by_type)
    for variant in by_type.values():
        body = await rig.store.get_bytes(variant["object_key"])
        assert len(body) == variant["size_bytes"]
        import hashlib

        assert hashlib.sha256(body).hexdigest() == variant["sha256"]
    stages = [entry["stage"] for entry in status["timeline"]]
    assert stages[0] == "asset"
    assert "probe" in stages and "publish" in stages
    # The moderation: in the probe job (the fast path, a phase of its own) or a job.
    assert "probe:moderation" in stages or "moderate" in stages
    assert [e["revision"] for e in status["timeline"] if e["event"] == "released"] == [1, 2]
    # The command: by asset id and by task, JSON and text.
    code, out = await anyio.to_thread.run_sync(
        lambda: run_cli(monkeypatch, capsys, rig, "status", str(asset_id), "--json")
    )
    assert code == 0
    document = json.loads(out)
    assert {"asset_id", "state", "current_revision", "variants", "timeline"} <= set(document)
    task = await rig.pool.fetchval(
        "SELECT o.provider_task_id FROM provider_outputs o JOIN assets a"
        " ON a.source_provider_output_id = o.id WHERE a.id = $1",
        asset_id,
    )
    code, out = await anyio.to_thread.run_sync(
        lambda: run_cli(monkeypatch, capsys, rig, "status", "--task", task, "--json")
    )
    assert code == 0 and [d["asset_id"] for d in json.loads(out)] == [str(asset_id)]
    code, out = await anyio.to_thread.run_sync(
        lambda: run_cli(monkeypatch, capsys, rig, "status", str(asset_id))
    )
    assert code == 0 and "ENRICHED" in out and "released" in out
    # The variants are a table under a header (the one renderer of every listing).
    assert ["variant_type", "size_bytes", "sha256", "object_key"] in [
        line.split() for line in out.splitlines()
    ]
    # assets show: tables for people, one JSON document with --json.
    code, out = await anyio.to_thread.run_sync(
        lambda: run_cli(monkeypatch, capsys, rig, "assets", "show", str(asset_id))
    )
    lines = [line.split() for line in out.splitlines()]
    assert code == 0 and out.startswith(f"asset {asset_id}: ENRICHED")
    assert ["revision", "status", "mode", "required_outputs"] in lines
    assert ["2", "READY"] in [line[:2] for line in lines]
    assert ["2", "playback", "SUCCEEDED"] in [line[:3] for line in lines]
    code, out = await anyio.to_thread.run_sync(
        lambda: run_cli(monkeypatch, capsys, rig, "assets", "show", str(asset_id), "--json")
    )
    document = json.loads(out)
    assert code == 0 and [r["revision"] for r in document["revisions"]] == [1, 2]
    code, _ = await anyio.to_thread.run_sync(
        lambda: run_cli(monkeypatch, capsys, rig, "status", str(uuid.uuid4()))
    )
    assert code == 3


async def test_reprocess_publishes_a_new_revision_atomically(
    rig: Rig, source: bytes, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    asset_id = await publish(rig, source)
    before = await rig.asset(asset_id)
    old_keys = [
        r["object_key"]
        for r in await rig.pool.fetch(
            "SELECT object_key FROM asset_variants WHERE asset_id = $1 AND revision = $2",
            asset_id,
            before["current_revision"],
        )
    ]
    code, out = await anyio.to_thread.run_sync(
        lambda: run_cli(monkeypatch, capsys, rig, "reprocess", str(asset_id))
    )
    assert code == 0 and json.loads(out)["asset_id"] == str(asset_id)
    async with running_worker(rig):
        await rig.wait(
            "SELECT 1 FROM assets WHERE id = $1 AND current_revision > $2",
            asset_id,
            before["current_revision"],
            timeout=90,
        )
        await rig.wait_idle(asset_id)
    after = await rig.asset(asset_id)
    assert after["status"] == "ENRICHED"
    revisions = await rig.revisions(asset_id)
    statuses = {r["revision"]: r["status"] for r in revisions}
    assert statuses[after["current_revision"]] == "READY"
    assert statuses[before["current_revision"]] == "SUPERSEDED"
    # Nothing was fetched again: the same source object; the old revision's objects remain.
    assert after["source_object_key"] == before["source_object_key"]
    for key in old_keys:
        assert await rig.store.head(key) is not None
    # Not published: refused.
    unpublished = await rig.quarantine(source)
    code, out = await anyio.to_thread.run_sync(
        lambda: run_cli(monkeypatch, capsys, rig, "reprocess", str(unpublished))
    )
    assert code == 2 and "not published" in out
