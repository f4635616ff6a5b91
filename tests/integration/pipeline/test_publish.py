"""Moderation and the atomic publish through the worker, each race or failure they must
survive made real (a second delivery, a lost lease, a delete or cancel at the lock, a
moderator down, an object gone): PostgreSQL, the local object store, real ffmpeg, a real
HTTP moderator."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from aivedio.config.load import Config
from aivedio.errors import LeaseLostError, RenderError, TransientError
from aivedio.pipeline.ffmpeg import media_run
from aivedio.pipeline.jobs import publish_spec
from aivedio.pipeline.media_stage import open_media_stage
from aivedio.pipeline.publish import InJobPublish, PublishStage, publish_when_ready
from aivedio.pipeline.upkeep.lifecycle import cancel_task, delete_asset
from aivedio.store.database import Pool
from aivedio.store.queue import Queue
from tests.support.media_fixtures import MediaCache, h264_faststart
from tests.support.moderator import moderator_server
from tests.support.pipeline_rig import (
    Rig,
    fake_job,
    make_rig,
    registry_without,
    running_worker,
    without_fast_path,
)

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    cache = MediaCache(tmp_path_factory.mktemp("media"))
    return cache.get("h264", h264_faststart, width=320, height=240, seconds=2).read_bytes()


@pytest.fixture
async def rig(config: Config, pool: Pool, tmp_path: Path) -> AsyncIterator[Rig]:
    async with make_rig(config, pool, tmp_path) as r:
        yield r


async def published(rig: Rig, asset_id: uuid.UUID) -> dict[str, Any]:
    await rig.wait(
        "SELECT 1 FROM assets WHERE id = $1 AND status IN ('PLAYABLE', 'ENRICHED')", asset_id
    )
    return await rig.asset(asset_id)


async def enriched(rig: Rig, source: bytes) -> uuid.UUID:
    """An asset run through the whole pipeline to ENRICHED, nothing of it left queued."""
    asset_id = await rig.quarantine(source)
    await rig.enqueue_probe(asset_id)
    async with running_worker(rig):
        await rig.wait("SELECT 1 FROM assets WHERE id = $1 AND status = 'ENRICHED'", asset_id)
        await rig.wait_idle(asset_id)
    return asset_id


async def published_not_enriched(rig: Rig, source: bytes) -> tuple[uuid.UUID, Any]:
    """An asset with revision 1 published and current, every output done and no enrichment
    revision (an ENRICHED run taken back), and a live lease on a job to enrich it."""
    asset_id = await enriched(rig, source)
    for sql in (
        "DELETE FROM releases WHERE asset_id = $1 AND revision = 2",
        "DELETE FROM asset_variants WHERE asset_id = $1 AND revision = 2",
        "DELETE FROM asset_revisions WHERE asset_id = $1 AND revision = 2",
        "UPDATE asset_revisions SET status = 'READY' WHERE asset_id = $1 AND revision = 1",
        "UPDATE assets SET status = 'PLAYABLE', current_revision = 1 WHERE id = $1",
    ):
        await rig.pool.execute(sql, asset_id)
    queue = Queue(rig.pool)
    async with rig.pool.acquire() as conn:
        await queue.enqueue_one(conn, publish_spec(asset_id, 1, rig.tenant_id, enrich=True))
    (job,) = await queue.claim("control", 1, "enricher", 60)
    return asset_id, job


async def gates_open(rig: Rig, source: bytes) -> uuid.UUID:
    """An asset whose revision 1 has both gates open and its publish job queued, to be
    claimed now: everything ran but publish (a worker without it enqueues the publish job)."""
    asset_id = await rig.quarantine(source)
    await rig.enqueue_probe(asset_id)
    async with running_worker(rig, registry_without("publish")) as worker:
        await rig.wait("SELECT 1 FROM jobs WHERE kind = 'publish'")
        worker.request_drain(force=True)
    await rig.pool.execute(
        "UPDATE jobs SET status = 'queued', lease_owner = NULL,"
        " run_after = now() WHERE kind = 'publish'"
    )
    return asset_id


async def test_required_set_first_then_an_enrichment_revision(rig: Rig, source: bytes) -> None:
    asset_id = await rig.quarantine(source)
    await rig.enqueue_probe(asset_id)
    async with running_worker(rig):
        await published(rig, asset_id)
        await rig.wait("SELECT 1 FROM assets WHERE id = $1 AND status = 'ENRICHED'", asset_id)
        await rig.wait_idle(asset_id)
    asset = await rig.asset(asset_id)
    revisions = await rig.revisions(asset_id)
    releases = await rig.pool.fetch(
        "SELECT revision, previous_revision, outputs FROM releases WHERE asset_id = $1"
        " ORDER BY revision",
        asset_id,
    )
    current = revisions[asset["current_revision"] - 1]
    assert current["status"] == "READY"
    assert set(current["published_outputs"]) == {
        "playback",
        "poster",
        "hls",
        "proxy",
        "sprite",
        "waveform",
        "keyframes",
    }
    assert current["moderation_verdict"] == "allow"
    if len(revisions) == 2:
        # Published with its required set first, then enriched by revision 2, which
        # references the same immutable objects; revision 1 was never changed.
        first = revisions[0]
        assert first["status"] == "SUPERSEDED"
        assert {"playback", "poster"} <= set(first["published_outputs"])
        assert [r["revision"] for r in releases] == [1, 2]
        assert releases[1]["previous_revision"] == 1
        keys_1 = await rig.pool.fetch(
            "SELECT variant_type, object_key FROM asset_variants WHERE asset_id = $1"
            " AND revision = 1",
            asset_id,
        )
        keys_2 = {
            r["variant_type"]: r["object_key"]
            for r in await rig.pool.fetch(
                "SELECT variant_type, object_key FROM asset_variants WHERE asset_id = $1"
                " AND revision = 2",
                asset_id,
            )
        }
        for row in keys_1:
            assert keys_2[row["variant_type"]] == row["object_key"]
            assert await rig.store.head(row["object_key"]) is not None
    else:  # everything finished before moderation did: one complete revision
        assert [r["revision"] for r in releases] == [1]
    events = await rig.events(asset_id)
    assert [e["event_type"] for e in events] == ["asset.ready"] * len(releases)
    assert events[-1]["payload"]["state"] == "ENRICHED"


async def test_duplicate_publish_attempts_give_one_release(rig: Rig, source: bytes) -> None:
    asset_id = await rig.quarantine(source)
    await rig.enqueue_probe(asset_id)
    async with running_worker(rig):
        await published(rig, asset_id)
        await rig.wait_idle(asset_id)
    before = await rig.pool.fetchval("SELECT count(*) FROM releases")
    queue = Queue(rig.pool)
    stage = PublishStage(rig.config, rig.pool, queue, rig.store)
    # (Published in the job that opened the last gate.) A publish job asked for again is
    # one job, and the same publish delivered again changes nothing.
    async with rig.pool.acquire() as conn:
        first = await queue.enqueue_one(conn, publish_spec(asset_id, 1, rig.tenant_id))
        again = await queue.enqueue_one(conn, publish_spec(asset_id, 1, rig.tenant_id))
    assert again.job_id == first.job_id and not again.created
    for _ in range(3):
        job = fake_job({"asset_id": str(asset_id), "revision": 1}, "publish")
        result = await stage.handle(job)
        assert result["outcome"] in ("already_published", "revision_superseded")
    assert await rig.pool.fetchval("SELECT count(*) FROM releases") == before
    ready = "SELECT count(*) FROM outbox_events WHERE event_type = 'asset.ready'"
    assert await rig.pool.fetchval(ready) == before


async def test_the_job_that_opens_the_last_gate_publishes_and_enriches_in_itself(
    rig: Rig, source: bytes
) -> None:
    asset_id = await enriched(rig, source)
    releases = await rig.pool.fetch(
        "SELECT revision FROM releases WHERE asset_id = $1 ORDER BY revision", asset_id
    )
    assert [r["revision"] for r in releases] == [1, 2]
    kinds = await rig.pool.fetch(
        "SELECT kind FROM job_history WHERE payload->>'asset_id' = $1", str(asset_id)
    )
    # No publish job was needed: moderation or the render published, the render enriched.
    assert "publish" not in {k["kind"] for k in kinds}


async def test_a_publish_that_cannot_finish_in_the_gate_job_is_left_to_a_publish_job(
    rig: Rig, source: bytes
) -> None:
    asset_id = await gates_open(rig, source)
    # Forget that publish job (and its key), as if that verdict had come with no worker.
    await rig.pool.execute("DELETE FROM jobs WHERE kind = 'publish'")
    await rig.pool.execute("DELETE FROM job_keys WHERE idempotency_key LIKE 'publish:%'")
    asset = await rig.asset(asset_id)
    await rig.store.delete(asset["source_object_key"])  # the checklist fails: transient
    queue = Queue(rig.pool)
    here = InJobPublish(
        PublishStage(rig.config, rig.pool, queue, rig.store), fake_job({}, "moderate")
    )
    assert await publish_when_ready(rig.pool, queue, asset_id, 1, here)
    assert (await rig.asset(asset_id))["current_revision"] is None
    left = await rig.pool.fetch("SELECT payload FROM jobs WHERE kind = 'publish'")
    assert [dict(j["payload"]) for j in left] == [
        {"asset_id": str(asset_id), "revision": 1, "mode": "publish"}
    ]


async def test_two_deliveries_of_one_publish_at_once_end_without_an_error(
    rig: Rig, source: bytes
) -> None:
    # Both gates' jobs may see both gates open (each looks after its own commit): one
    # publishes in itself while a publish job runs too. The second finds the revision
    # published under the lock: done, not an error to retry.
    asset_id = await gates_open(rig, source)
    queue = Queue(rig.pool)
    async with rig.pool.acquire() as conn:
        await queue.enqueue_one(conn, publish_spec(asset_id, 1, rig.tenant_id, enrich=True))
    jobs = await queue.claim("control", 2, "both", 60)  # two live leases to publish under
    assert len(jobs) == 2
    stage = PublishStage(rig.config, rig.pool, queue, rig.store)
    # Both load first and then meet at the lock.
    ended = await waiting_at_the_lock(
        rig, asset_id, [lambda job=job: stage.publish(job, asset_id, 1) for job in jobs]
    )
    outcomes = [e["outcome"] for e in ended]
    assert sorted(outcomes) == ["already_published", "published"]
    assert (
        await rig.pool.fetchval("SELECT count(*) FROM releases WHERE asset_id = $1", asset_id) == 1
    )


async def waiting_at_the_lock(
    rig: Rig, asset_id: uuid.UUID, works: list[Any], decide: str | None = None
) -> list[dict[str, Any]]:
    """Each of ``works`` (a publish or an enrichment) loads and checks, then waits at the
    asset's lock, which another transaction holds while it writes ``decide`` (a delete or a
    cancel made then, or nothing); their outcomes once that commits, in the order they end."""
    outcomes: list[dict[str, Any]] = []

    async def run(work: Any) -> None:
        outcomes.append(await work())

    async with rig.pool.acquire() as holder:
        await holder.execute("BEGIN")
        await holder.execute("SELECT 1 FROM assets WHERE id = $1 FOR UPDATE", asset_id)
        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                for work in works:
                    tg.start_soon(run, work)
                # Loaded, checked and waiting at the lock, every one of them.
                while await rig.pool.fetchval(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                    " AND wait_event_type = 'Lock'"
                ) < len(works):
                    await anyio.sleep(0.02)
                if decide is not None:
                    await holder.execute(decide, asset_id)
                await holder.execute("COMMIT")
    return outcomes


async def test_a_delete_decided_while_the_publish_waits_at_the_lock_undoes_it_all(
    rig: Rig, source: bytes
) -> None:
    asset_id = await gates_open(rig, source)
    queue = Queue(rig.pool)
    (job,) = await queue.claim("control", 1, "one", 60)
    stage = PublishStage(rig.config, rig.pool, queue, rig.store)
    (outcome,) = await waiting_at_the_lock(
        rig,
        asset_id,
        [lambda: stage.publish(job, asset_id, 1)],
        "UPDATE assets SET delete_version = delete_version + 1 WHERE id = $1",
    )
    assert outcome["outcome"] == "not_published"
    assert "deleted or cancelled" in outcome["reason"]
    asset = await rig.asset(asset_id)
    assert asset["current_revision"] is None and asset["status"] == "PROCESSING"
    assert (
        await rig.pool.fetchval(
            "SELECT status FROM asset_revisions WHERE asset_id = $1 AND revision = 1", asset_id
        )
        == "ABANDONED"
    )
    for table in ("releases", "outbox_events"):
        assert await rig.pool.fetchval(f"SELECT count(*) FROM {table}") == 0, table
    assert (
        await rig.pool.fetchval(
            "SELECT count(*) FROM ledger_entries WHERE kind = 'processing_charge'"
        )
        == 0
    )


async def test_a_cancel_decided_while_the_enrichment_waits_at_the_lock_adds_no_revision(
    rig: Rig, source: bytes
) -> None:
    asset_id, job = await published_not_enriched(rig, source)
    queue = Queue(rig.pool)
    stage = PublishStage(rig.config, rig.pool, queue, rig.store)
    outcomes = await waiting_at_the_lock(
        rig,
        asset_id,
        [lambda: stage.enrich(job, asset_id, 1)],
        "UPDATE assets SET cancel_version = cancel_version + 1 WHERE id = $1",
    )
    assert outcomes == [{"outcome": "cancelled"}]
    assert (
        await rig.pool.fetchval(
            "SELECT max(revision) FROM asset_revisions WHERE asset_id = $1", asset_id
        )
        == 1
    )
    asset = await rig.asset(asset_id)
    assert asset["status"] == "PLAYABLE" and asset["current_revision"] == 1


async def test_a_rebuild_that_takes_the_number_while_the_enrichment_waits_is_retried(
    rig: Rig, source: bytes
) -> None:
    # The enrichment's number is read with the asset; a rebuild committed while it waited
    # at the lock took it. The insert's conflict undoes the statement and asks for a retry,
    # which then finds the rebuild under way.
    asset_id, job = await published_not_enriched(rig, source)
    stage = PublishStage(rig.config, rig.pool, Queue(rig.pool), rig.store)

    async def enrich() -> dict[str, Any]:
        with pytest.raises(TransientError, match="took the number"):
            await stage.enrich(job, asset_id, 1)
        return {}

    await waiting_at_the_lock(
        rig,
        asset_id,
        [enrich],
        "INSERT INTO asset_revisions (asset_id, revision, pipeline_version, status)"
        " VALUES ($1, 2, 1, 'BUILDING')",
    )
    assert (
        await rig.pool.fetchval(
            "SELECT count(*) FROM asset_revisions WHERE asset_id = $1 AND enriches IS NOT NULL",
            asset_id,
        )
        == 0
    )
    assert (await stage.enrich(job, asset_id, 1)) == {"outcome": "superseded_by_rebuild"}


async def test_a_publish_delivered_again_after_its_commit_still_enriches(
    rig: Rig, source: bytes
) -> None:
    # Chaos finding (scripts/chaos --n 200 --seed 606, once): an asset left PLAYABLE with
    # every output done and no live job. The enrichment check follows the publish's commit;
    # a delivery that died between the two left it to nobody, since a delivery again found
    # the revision published and stopped there.
    # As that death left it: revision 1 published and current, every output done, no
    # enrichment revision; a live lease for the delivery again.
    asset_id, job = await published_not_enriched(rig, source)
    queue = Queue(rig.pool)
    stage = PublishStage(rig.config, rig.pool, queue, rig.store)
    assert (await stage.publish(job, asset_id, 1))["outcome"] == "already_published"
    asset = await rig.asset(asset_id)
    assert asset["status"] == "ENRICHED" and asset["current_revision"] == 2


async def test_a_publish_whose_lease_moved_on_cannot_publish(rig: Rig, source: bytes) -> None:
    asset_id = await gates_open(rig, source)
    queue = Queue(rig.pool)
    (first,) = await queue.claim("control", 1, "first", 60)
    assert first.kind == "publish"
    await rig.pool.execute("UPDATE jobs SET lease_until = now() - interval '1 s'")
    await queue.reap()
    (second,) = await queue.claim("control", 1, "second", 60)
    stage = PublishStage(rig.config, rig.pool, queue, rig.store)
    with pytest.raises(LeaseLostError):
        await stage.handle(first)
    assert (await rig.asset(asset_id))["current_revision"] is None
    result = await stage.handle(second)
    assert result["outcome"] == "published"
    assert await rig.pool.fetchval("SELECT count(*) FROM releases") == 1


async def test_delete_during_processing_publishes_nothing(
    rig: Rig, source: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = media_run.MediaRun._finalize
    gate = anyio.Event()

    async def slow_finalize(self: media_run.MediaRun, node: str, *args: Any) -> Any:
        await gate.wait()  # the delete lands while outputs are being made
        return await original(self, node, *args)

    monkeypatch.setattr(media_run.MediaRun, "_finalize", slow_finalize)
    rig.config = without_fast_path(rig.config)  # the fast path's twin: test_fast_path
    asset_id = await rig.quarantine(source)
    await rig.enqueue_probe(asset_id)
    async with running_worker(rig):
        await rig.wait("SELECT 1 FROM jobs WHERE kind = 'render' AND status = 'running'")
        assert await delete_asset(rig.pool, asset_id)
        gate.set()
        await rig.wait_idle(asset_id)
    asset = await rig.asset(asset_id)
    assert asset["status"] == "DELETED" and asset["current_revision"] is None
    assert await rig.pool.fetchval("SELECT count(*) FROM releases") == 0
    assert [r["status"] for r in await rig.revisions(asset_id)] in (["ABANDONED"], ["FAILED"])
    assert [e["event_type"] for e in await rig.events(asset_id)] == ["asset.deleted"]


async def test_cancel_after_fetch_keeps_the_source_and_publishes_nothing(
    rig: Rig, source: bytes
) -> None:
    asset_id = await rig.quarantine(source, task=("sim", "task-c"))
    result = await cancel_task(rig.pool, "sim", "task-c", retain_days=7)
    assert result["retired_assets"] == [str(asset_id)]
    await rig.enqueue_probe(asset_id)
    async with running_worker(rig):
        await rig.wait_idle(asset_id)
    asset = await rig.asset(asset_id)
    assert asset["status"] == "DELETED" and asset["last_error_class"] == "cancelled"
    assert asset["source_retain_until"] is not None
    assert await rig.store.head(asset["source_object_key"]) is not None
    assert await rig.pool.fetchval("SELECT count(*) FROM asset_revisions") == 0
    task = await rig.pool.fetchrow("SELECT provider_status FROM generation_tasks")
    assert task["provider_status"] == "CANCELLED"


async def test_a_render_that_finds_its_published_asset_cancelled_fails_what_is_pending(
    rig: Rig, source: bytes
) -> None:
    # Chaos finding (scripts/chaos --n 200 --seed 505): published PLAYABLE, then the task
    # was cancelled while the render of an optional output ran; the worker died after
    # uploading a rendition playlist, and the render's retry found the asset cancelled and
    # returned with the output still PENDING, forever. A READY revision with a pending
    # output keeps its whole prefix from GC, so the unrecorded playlist was never collected.
    asset_id = await rig.quarantine(source, task=("sim", "task-p"))
    await rig.enqueue_probe(asset_id)
    async with running_worker(rig):
        await rig.wait("SELECT 1 FROM assets WHERE id = $1 AND status = 'ENRICHED'", asset_id)
        await rig.wait_idle(asset_id)
    # As the died run left it: the READY revision (here the enrichment, 2) with hls not
    # recorded.
    await rig.pool.execute(
        "UPDATE asset_variants SET status = 'PENDING' WHERE asset_id = $1 AND revision = 2"
        " AND variant_type = 'hls'",
        asset_id,
    )
    await cancel_task(rig.pool, "sim", "task-p", retain_days=7)
    assert (await rig.asset(asset_id))["status"] == "ENRICHED"  # published: it stays
    queue = Queue(rig.pool)
    async with open_media_stage(rig.config, rig.pool, queue, rig.store) as media:
        job = fake_job({"asset_id": str(asset_id), "revision": 2, "variant_type": "hls"}, "render")
        assert (await media.render(job))["outcome"] == "asset_deleted_or_cancelled"
    variant = await rig.pool.fetchrow(
        "SELECT status, extra FROM asset_variants WHERE asset_id = $1 AND revision = 2"
        " AND variant_type = 'hls'",
        asset_id,
    )
    assert variant["status"] == "FAILED" and "cancelled" in variant["extra"]["error"]
    pending = await rig.pool.fetchval(
        "SELECT count(*) FROM asset_variants WHERE asset_id = $1 AND status = 'PENDING'",
        asset_id,
    )
    assert pending == 0  # nothing keeps the revision's prefix from GC any more


async def test_moderation_down_keeps_the_asset_private_until_it_returns(
    config: Config, pool: Pool, tmp_path: Path, source: bytes
) -> None:
    answers: list[Any] = [503, 503, 503, {"decision": "allow", "reasons": [], "version": "m7"}]
    async with (
        moderator_server(answers) as (url, seen),
        make_rig(config, pool, tmp_path, backend="http", url=url) as rig,
    ):
        asset_id = await rig.quarantine(source)
        await rig.enqueue_probe(asset_id)
        async with running_worker(rig):
            await rig.wait(
                "SELECT 1 FROM asset_revisions WHERE moderation_verdict IS NULL"
                " AND status = 'BUILDING'"
            )
            while len(seen) < 2:
                await anyio.sleep(0.05)
            assert (await rig.asset(asset_id))["current_revision"] is None
            asset = await published(rig, asset_id)
    assert asset["moderation_status"] == "ALLOWED"
    assert len(seen) >= 4
    request = seen[-1]
    kinds = [f["kind"] for f in request["frames"]]
    assert kinds[:3] == ["first", "middle", "last"]
    assert all(f["jpeg_base64"] for f in request["frames"])
    assert request["media"]["width"] == 320
    revision = (await rig.revisions(asset_id))[0]
    assert revision["moderation_version"] == "m7"


async def test_reject_publishes_nothing_and_retains_the_source(
    config: Config, pool: Pool, tmp_path: Path, source: bytes
) -> None:
    verdict = {"decision": "reject", "reasons": ["violence"], "version": "m7"}
    async with (
        moderator_server([verdict]) as (url, _),
        make_rig(config, pool, tmp_path, backend="http", url=url) as rig,
    ):
        asset_id = await rig.quarantine(source)
        await rig.enqueue_probe(asset_id)
        async with running_worker(rig):
            await rig.wait("SELECT 1 FROM assets WHERE status = 'REJECTED'")
            await rig.wait_idle(asset_id)
        asset = await rig.asset(asset_id)
        assert asset["current_revision"] is None
        assert asset["source_retain_until"] is not None
        assert await rig.store.head(asset["source_object_key"]) is not None
        assert await rig.pool.fetchval("SELECT count(*) FROM releases") == 0
        (revision,) = await rig.revisions(asset_id)
        assert revision["status"] == "FAILED"
        assert revision["moderation_reasons"] == ["violence"]
        events = await rig.events(asset_id)
        assert [e["event_type"] for e in events] == ["asset.rejected"]


async def test_an_optional_output_failing_still_publishes_the_required_set(
    rig: Rig, source: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken(*_args: Any, **_kwargs: Any) -> Any:
        raise RenderError("sprite sheet could not be verified")

    monkeypatch.setattr(media_run.MediaRun, "_finalize_sprite", broken)
    asset_id = await rig.quarantine(source)
    await rig.enqueue_probe(asset_id)
    async with running_worker(rig):
        await published(rig, asset_id)
        await rig.wait_idle(asset_id)
    asset = await rig.asset(asset_id)
    assert asset["status"] == "PLAYABLE"  # never ENRICHED: the sprite is missing
    current = (await rig.revisions(asset_id))[asset["current_revision"] - 1]
    assert "sprite" not in current["published_outputs"]
    assert {"playback", "poster"} <= set(current["published_outputs"])


async def test_hls_missing_a_segment_is_never_published(
    rig: Rig, source: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A segment object disappears after render verified it, before publish checks it.
    original = PublishStage._present

    async def present(
        self: PublishStage, variants: Any, also: Any = ()
    ) -> tuple[set[str], dict[str, int | None]]:
        for variant in variants:
            if variant["variant_type"] == "hls":
                base = variant["object_key"].rsplit("/hls/", 1)[0]
                await self.store.delete(f"{base}/hls/180p/seg_00001.m4s")
        return await original(self, variants, also)

    monkeypatch.setattr(PublishStage, "_present", present)
    asset_id = await rig.quarantine(source)
    await rig.enqueue_probe(asset_id)
    async with running_worker(rig):
        await published(rig, asset_id)
        await rig.wait_idle(asset_id)
    revisions = await rig.revisions(asset_id)
    assert any(r["status"] == "READY" for r in revisions)
    for revision in revisions:
        assert "hls" not in (revision["published_outputs"] or [])
    ready = [e for e in await rig.events(asset_id) if e["event_type"] == "asset.ready"]
    assert ready and all("hls" not in e["payload"]["outputs"] for e in ready)
    assert (await rig.asset(asset_id))["status"] == "PLAYABLE"  # not ENRICHED without HLS


async def test_review_waits_private_until_an_operator_decides(
    config: Config,
    pool: Pool,
    tmp_path: Path,
    source: bytes,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from aivedio.cli import main as cli
    from aivedio.config.moderation import LocalModerationConfig
    from tests.conftest import TEST_KEY

    # No rule allows: the local policy sends everything to review.
    async with make_rig(config, pool, tmp_path, local=LocalModerationConfig()) as rig:
        asset_id = await rig.quarantine(source)
        await rig.enqueue_probe(asset_id)
        async with running_worker(rig):
            await rig.wait("SELECT 1 FROM assets WHERE moderation_status = 'REVIEW'")
            await anyio.sleep(0.5)
            asset = await rig.asset(asset_id)
            assert asset["status"] == "PROCESSING" and asset["current_revision"] is None
            monkeypatch.setenv("AIVEDIO_DATABASE_URL", rig.config.database.url)
            monkeypatch.setenv("AIVEDIO_URL_ENCRYPTION_KEY", TEST_KEY)
            import structlog

            saved = structlog.get_config()
            capsys.readouterr()
            try:
                code = await anyio.to_thread.run_sync(
                    lambda: cli.main(["moderate", str(asset_id), "--allow", "--reason", "ok"])
                )
            finally:
                structlog.configure(**saved)
            assert code == 0
            assert json.loads(capsys.readouterr().out.splitlines()[-1])["decision"] == "allow"
            asset = await published(rig, asset_id)
        (revision, *_) = await rig.revisions(asset_id)
        assert revision["moderation_reasons"] == ["operator:ok"]
        assert asset["moderation_status"] == "ALLOWED"
