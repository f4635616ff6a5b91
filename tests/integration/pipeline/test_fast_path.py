"""The probe job's fast path through a worker: real PostgreSQL, the local store, real ffmpeg.

The required set, the decode check with the moderation frames, the moderator and the
publish in the probe job; what it must never give up: a failed decode check publishes
nothing, a moderator that fails keeps the asset private, a second delivery adds nothing.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from aivedio.config.load import Config
from aivedio.errors import StaleStateError
from aivedio.pipeline.media_stage import open_media_stage
from aivedio.pipeline.moderation import open_moderation_stage
from aivedio.pipeline.publish import PublishStage
from aivedio.store.asset_status import asset_status
from aivedio.store.database import Pool
from aivedio.store.objects import keys
from aivedio.store.queue import Queue
from tests.support import media_fixtures as mf
from tests.support.media_fixtures import MediaCache
from tests.support.moderator import moderator_server
from tests.support.pipeline_rig import Rig, make_rig, running_worker

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def media_cache(tmp_path_factory: pytest.TempPathFactory) -> MediaCache:
    return MediaCache(tmp_path_factory.mktemp("media"))


@pytest.fixture(scope="module")
def source(media_cache: MediaCache) -> bytes:
    return media_cache.get(
        "h264", mf.h264_moov_at_end, width=320, height=240, seconds=2
    ).read_bytes()


@pytest.fixture
async def rig(config: Config, pool: Pool, tmp_path: Path) -> AsyncIterator[Rig]:
    async with make_rig(config, pool, tmp_path) as r:
        yield r


async def kinds_of(rig: Rig, asset_id: Any) -> list[str]:
    rows = await rig.pool.fetch(
        "SELECT kind FROM job_history WHERE payload->>'asset_id' = $1"
        " UNION ALL SELECT kind FROM jobs WHERE payload->>'asset_id' = $1",
        str(asset_id),
    )
    return sorted(r["kind"] for r in rows)


async def probe_result(rig: Rig, asset_id: Any) -> dict[str, Any]:
    result: dict[str, Any] = await rig.pool.fetchval(
        "SELECT result FROM job_history WHERE kind = 'probe' AND payload->>'asset_id' = $1",
        str(asset_id),
    )
    return result


async def test_the_probe_job_makes_moderates_and_publishes_the_required_set(
    rig: Rig, source: bytes
) -> None:
    asset_id = await rig.quarantine(source)
    await rig.enqueue_probe(asset_id)
    async with running_worker(rig):
        await rig.wait("SELECT 1 FROM assets WHERE status = 'ENRICHED'")
        await rig.wait_idle(asset_id)
    asset = await rig.asset(asset_id)
    assert asset["moderation_status"] == "ALLOWED"
    # The decode check ran with the frames: a whole decode, recorded as such.
    assert asset["probe"]["decode_check"] == "full"
    first, *_ = await rig.revisions(asset_id)
    assert first["moderation_verdict"] == "allow" and first["moderated_at"] is not None
    assert first["status"] in ("READY", "SUPERSEDED")
    # No moderate job and no publish job: the probe moderated and published, then made the
    # optional outputs (the enrichment) itself while the revision's render job was held,
    # and finished that job with them: it never ran.
    kinds = await kinds_of(rig, asset_id)
    assert "moderate" not in kinds
    assert kinds.count("probe") == 1 and kinds.count("render") == 1
    render = await rig.pool.fetchrow(
        "SELECT status, attempts, result FROM job_history WHERE kind = 'render'"
        " AND payload->>'asset_id' = $1",
        str(asset_id),
    )
    assert render["status"] == "succeeded" and render["attempts"] == 0
    assert render["result"]["outcome"] == "rendered_by_probe"
    result = await probe_result(rig, asset_id)
    assert result["enrichment"] == "inline" and result["enrich_failed"] == []
    assert set(result["enriched"]) == set(first["optional_outputs"])
    assert result["fast_path"] is True and result["decision"] == "allow"
    assert sorted(result["made"]) == ["playback", "poster"] and result["failed"] == []
    assert result["frames"] >= 3
    phases = [p["phase"] for p in result["phases"]]
    for phase in ("probe", "decode_check_and_frames", "moderation", "render", "record"):
        assert phase in phases
    assert phases[-2:] == ["publish", "enrichment"]
    # A remux's poster is a frame the pass over the source took: the render only copied.
    assert "poster" in phases
    assert "frames" in result["processes"] and "package" in result["processes"]
    assert not [step for step in result["processes"] if "poster_seek" in step]
    poster = (await rig.variants(asset_id))["poster"]
    assert poster["object_key"] == f"{keys.revision_prefix(rig.tenant_id, asset_id, 1)}/poster.jpg"
    held = await rig.store.head(poster["object_key"])
    assert held is not None and held.size == poster["size_bytes"]
    # The outputs the probe made are what the store holds, verified at their recorded size.
    playback = (await rig.variants(asset_id))["playback"]
    prefix = keys.revision_prefix(rig.tenant_id, asset_id, 1)
    assert playback["object_key"] == f"{prefix}/playback.mp4"
    info = await rig.store.head(playback["object_key"])
    assert info is not None and info.size == playback["size_bytes"]
    # The status timeline shows each phase of the probe job with its time.
    status = await asset_status(rig.pool, asset_id)
    assert status is not None
    stages = [e["stage"] for e in status["timeline"]]
    assert "probe:render" in stages and "probe:moderation" in stages
    entry = next(e for e in status["timeline"] if e["stage"] == "probe:render")
    assert entry["seconds"] >= 0 and entry["event"] == "done"


@pytest.mark.parametrize(
    ("name", "make", "path"),
    [("tail", mf.tail_corrupted, "remux"), ("tail_hevc", mf.tail_corrupted_hevc, "transcode")],
)
async def test_a_failed_decode_check_on_the_fast_path_publishes_nothing(
    config: Config,
    pool: Pool,
    tmp_path: Path,
    media_cache: MediaCache,
    name: str,
    make: Any,
    path: str,
) -> None:
    body = media_cache.get(name, make).read_bytes()
    allow = {"decision": "allow", "reasons": [], "version": "m1"}
    async with (
        moderator_server([allow]) as (url, seen),
        make_rig(config, pool, tmp_path, backend="http", url=url) as rig,
    ):
        asset_id = await rig.quarantine(body)
        await rig.enqueue_probe(asset_id)
        async with running_worker(rig):
            await rig.wait("SELECT 1 FROM assets WHERE status = 'INVALID_MEDIA'", timeout=120)
            await rig.wait_idle(asset_id)
        asset = await rig.asset(asset_id)
        assert asset["probe"]["reasons"] == ["decode_failed"]
        assert asset["probe"]["decode_check"] == "full"
        assert asset["current_revision"] is None
        assert await rig.revisions(asset_id) == []
        assert await rig.variants(asset_id) == {}
        assert await rig.pool.fetchval("SELECT count(*) FROM releases") == 0
        assert seen == []  # no frame of an invalid source reached the moderator
        events = [e["event_type"] for e in await rig.events(asset_id)]
        assert events == ["asset.invalid"]
        assert await kinds_of(rig, asset_id) == ["probe"]
        if path == "transcode":
            # The check rode along the render's encode pass, and the render stored nothing
            # of a source whose check had not passed.
            prefix = keys.revision_prefix(rig.tenant_id, asset_id, 1)
            assert [info.key async for info in rig.store.list(prefix + "/")] == []


async def test_a_transcode_on_the_fast_path_decodes_its_source_once(
    rig: Rig, media_cache: MediaCache
) -> None:
    asset_id = await rig.quarantine(media_cache.get("hevc", mf.hevc_mkv).read_bytes())
    await rig.enqueue_probe(asset_id)
    async with running_worker(rig):
        await rig.wait("SELECT 1 FROM assets WHERE status = 'ENRICHED'", timeout=120)
        await rig.wait_idle(asset_id)
    result = await probe_result(rig, asset_id)
    assert result["fast_path"] is True and result["decision"] == "allow"
    assert sorted(result["made"]) == ["playback", "poster"] and result["failed"] == []
    # The stills and the decode check rode along the playback's encode pass: no frames
    # pass of their own decoded the source a second time, and the check was a whole one.
    assert result["frames"] >= 3
    assert "frames" not in result["processes"], result["processes"]
    assert [step for step in result["processes"] if step.startswith("encode[")]
    assert (await rig.asset(asset_id))["probe"]["decode_check"] == "full"
    first, *_ = await rig.revisions(asset_id)
    assert first["moderation_verdict"] == "allow"


async def test_a_moderator_that_times_out_keeps_the_asset_private(
    config: Config, pool: Pool, tmp_path: Path, source: bytes
) -> None:
    late = {"decision": "allow", "reasons": [], "version": "late"}
    async with (
        moderator_server([late], delay_seconds=5) as (url, calls),
        make_rig(config, pool, tmp_path, backend="http", url=url, timeout_seconds=0.3) as rig,
    ):
        asset_id = await rig.quarantine(source)
        await rig.enqueue_probe(asset_id)
        async with running_worker(rig):
            # The fast path asked, then the moderate job it left asked again.
            await rig.wait(
                "SELECT 1 FROM job_history j WHERE kind = 'probe'"
                " AND result->>'moderation_unavailable' IS NOT NULL"
            )
            while len(calls) < 2:
                await anyio.sleep(0.05)
            asset = await rig.asset(asset_id)
            assert asset["status"] == "PROCESSING"
            assert asset["current_revision"] is None
            assert asset["moderation_status"] != "ALLOWED"
            (revision,) = await rig.revisions(asset_id)
            assert revision["status"] == "BUILDING"
            assert revision["moderation_verdict"] is None
            assert await rig.pool.fetchval("SELECT count(*) FROM releases") == 0
            # The required set is made; only the verdict is missing.
            variants = await rig.variants(asset_id)
            assert variants["playback"]["status"] == "SUCCEEDED"
            assert await rig.pool.fetchval(
                "SELECT 1 FROM jobs WHERE kind = 'moderate' AND payload->>'asset_id' = $1",
                str(asset_id),
            )


async def test_a_reject_in_hand_is_stored_by_the_probe_and_publishes_nothing(
    config: Config, pool: Pool, tmp_path: Path, source: bytes
) -> None:
    verdict = {"decision": "reject", "reasons": ["violence"], "version": "m7"}
    async with (
        moderator_server([verdict]) as (url, seen),
        make_rig(config, pool, tmp_path, backend="http", url=url) as rig,
    ):
        asset_id = await rig.quarantine(source)
        await rig.enqueue_probe(asset_id)
        async with running_worker(rig):
            await rig.wait("SELECT 1 FROM assets WHERE status = 'REJECTED'")
            await rig.wait_idle(asset_id)
        assert len(seen) == 1  # the moderate job found the verdict and did not ask again
        assert (await rig.asset(asset_id))["current_revision"] is None
        assert await rig.pool.fetchval("SELECT count(*) FROM releases") == 0
        (revision,) = await rig.revisions(asset_id)
        assert revision["status"] == "FAILED" and revision["moderation_reasons"] == ["violence"]


async def test_a_second_delivery_of_the_probe_adds_nothing(rig: Rig, source: bytes) -> None:
    import msgspec

    asset_id = await rig.quarantine(source)
    queue = Queue(rig.pool)
    async with (
        open_media_stage(rig.config, rig.pool, queue, rig.store) as media,
        open_moderation_stage(rig.config, rig.pool, queue, rig.store) as moderation,
    ):
        from aivedio.pipeline.media_seams import WorkerSeams

        seams = WorkerSeams(
            publisher=PublishStage(rig.config, rig.pool, queue, rig.store), moderation=moderation
        )
        await rig.enqueue_probe(asset_id)
        (job,) = await queue.claim("media", 1, "test", 60)  # a real lease: publish is fenced
        results = []
        # Two deliveries at once (a lease that expired under a slow first one) and a late
        # third: one revision, one release.
        async with anyio.create_task_group() as tg:

            async def deliver() -> None:
                try:
                    results.append(await media.probe(job, seams))
                except Exception as exc:  # the loser's stale move, which the queue retries
                    results.append({"outcome": type(exc).__name__})

            tg.start_soon(deliver)
            tg.start_soon(deliver)
        again = msgspec.structs.replace(job, attempts=2)
        results.append(await media.probe(again, seams))
    outcomes = sorted(r["outcome"] for r in results)
    assert outcomes.count("processing") == 1, results
    assert results[-1]["outcome"] == "already_probed"
    # One revision from the probe, released once; the delivery that made it went on with
    # the enrichment (revision 2, released once).
    revisions = await rig.revisions(asset_id)
    assert [r["revision"] for r in revisions] == [1, 2]
    assert revisions[0]["status"] == "SUPERSEDED" and revisions[1]["enriches"] == 1
    released = await rig.pool.fetch(
        "SELECT revision FROM releases WHERE asset_id = $1 ORDER BY revision", asset_id
    )
    assert [r["revision"] for r in released] == [1, 2]
    assert (await rig.asset(asset_id))["status"] == "ENRICHED"


async def test_without_the_fast_path_the_queue_path_still_publishes(
    config: Config, pool: Pool, tmp_path: Path, source: bytes
) -> None:
    import msgspec

    async with make_rig(config, pool, tmp_path) as rig:
        rig.config = msgspec.structs.replace(
            rig.config, media=msgspec.structs.replace(rig.config.media, fast_path=False)
        )
        asset_id = await rig.quarantine(source)
        await rig.enqueue_probe(asset_id)
        async with running_worker(rig):
            await rig.wait("SELECT 1 FROM assets WHERE status = 'ENRICHED'")
            await rig.wait_idle(asset_id)
        kinds = await kinds_of(rig, asset_id)
        assert "moderate" in kinds
        result = await probe_result(rig, asset_id)
        assert "fast_path" not in result
        assert (await rig.asset(asset_id))["probe"]["decode_check"] == "sampled"


async def test_with_the_enrichment_left_to_its_render_job_that_job_makes_it(
    config: Config, pool: Pool, tmp_path: Path, source: bytes
) -> None:
    import msgspec

    async with make_rig(config, pool, tmp_path) as rig:
        rig.config = msgspec.structs.replace(
            rig.config, media=msgspec.structs.replace(rig.config.media, enrich_in_probe=False)
        )
        asset_id = await rig.quarantine(source)
        await rig.enqueue_probe(asset_id)
        async with running_worker(rig):
            await rig.wait("SELECT 1 FROM assets WHERE status = 'ENRICHED'")
            await rig.wait_idle(asset_id)
        result = await probe_result(rig, asset_id)
        assert result["fast_path"] is True and "enrichment" not in result
        render = await rig.pool.fetchrow(
            "SELECT attempts, result FROM job_history WHERE kind = 'render'"
            " AND payload->>'asset_id' = $1",
            str(asset_id),
        )
        assert render["attempts"] == 1 and render["result"]["outcome"] == "rendered"


async def test_with_media_jobs_waiting_the_enrichment_is_left_to_the_render_job(
    config: Config, pool: Pool, tmp_path: Path, source: bytes
) -> None:
    # Under a burst the next probes (which make assets playable) go first: a probe that
    # finds media jobs waiting for a slot leaves its enrichment to the render job.
    import msgspec

    from aivedio.config.worker import LaneConfig

    async with make_rig(config, pool, tmp_path) as rig:
        lanes = {**rig.config.worker.lanes, "media": LaneConfig(slots=1)}
        worker = msgspec.structs.replace(rig.config.worker, lanes=lanes)
        rig.config = msgspec.structs.replace(rig.config, worker=worker)
        first = await rig.quarantine(source)
        second = await rig.quarantine(source)
        await rig.enqueue_probe(first)
        await rig.enqueue_probe(second)  # waits for the one slot while the first runs
        async with running_worker(rig):
            await rig.wait("SELECT count(*) = 2 FROM assets WHERE status = 'ENRICHED'")
            await rig.wait_idle(first)
            await rig.wait_idle(second)
        result = await probe_result(rig, first)
        assert result["fast_path"] is True and "enrichment" not in result, result
        render = await rig.pool.fetchrow(
            "SELECT attempts, result FROM job_history WHERE kind = 'render'"
            " AND payload->>'asset_id' = $1",
            str(first),
        )
        assert render["attempts"] == 1 and render["result"]["outcome"] == "rendered"


async def test_a_delete_during_the_fast_path_publishes_nothing(
    rig: Rig, source: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    from aivedio.pipeline.ffmpeg import media_run
    from aivedio.pipeline.upkeep.lifecycle import delete_asset

    original = media_run.MediaRun._finalize
    gate = anyio.Event()

    async def slow_finalize(self: media_run.MediaRun, node: str, *args: Any) -> Any:
        await gate.wait()  # the delete lands while the probe makes the required set
        return await original(self, node, *args)

    monkeypatch.setattr(media_run.MediaRun, "_finalize", slow_finalize)
    asset_id = await rig.quarantine(source)
    await rig.enqueue_probe(asset_id)
    async with running_worker(rig):
        await rig.wait("SELECT 1 FROM jobs WHERE kind = 'probe' AND status = 'running'")
        await rig.wait("SELECT 1 FROM assets WHERE status = 'PROBING'")
        assert await delete_asset(rig.pool, asset_id)
        gate.set()
        await rig.wait_idle(asset_id)
    asset = await rig.asset(asset_id)
    assert asset["status"] == "DELETED" and asset["current_revision"] is None
    assert await rig.pool.fetchval("SELECT count(*) FROM releases") == 0
    assert await rig.revisions(asset_id) == []
    assert [e["event_type"] for e in await rig.events(asset_id)] == ["asset.deleted"]


async def test_a_source_crashing_the_fast_path_twice_is_quarantined(
    rig: Rig, source: bytes, tmp_path: Path
) -> None:
    import msgspec

    from tests.integration.pipeline.upkeep.test_backlog import calls, crashing_ffmpeg

    script, log = crashing_ffmpeg(tmp_path)
    # No decode check: the frames pass crashing is a failed step (the poison rule counts
    # it), not a verdict; with the check, a crash is the verdict (decoder_crashed).
    media = msgspec.structs.replace(rig.config.media, ffmpeg=str(script), decode_check="none")
    rig.config = msgspec.structs.replace(rig.config, media=media)
    asset_id = await rig.quarantine(source)
    await rig.enqueue_probe(asset_id)
    async with running_worker(rig):
        await rig.wait("SELECT 1 FROM assets WHERE status = 'PROCESSING_FAILED'")
        await rig.wait_idle(asset_id, timeout=120)
        made = calls(log)
        await anyio.sleep(1.0)
        assert calls(log) == made  # nothing runs ffmpeg on it any more
    asset = await rig.asset(asset_id)
    assert asset["last_error_class"] == "poison_media"
    crashes = await rig.pool.fetch("SELECT * FROM media_crashes WHERE asset_id = $1", asset_id)
    assert [c["kind"] for c in crashes] == ["probe", "probe"]
    assert await rig.revisions(asset_id) == []
    assert await rig.pool.fetchval("SELECT count(*) FROM releases") == 0


async def test_a_media_only_node_makes_the_required_set_but_never_asks_the_moderator(
    config: Config, pool: Pool, tmp_path: Path, source: bytes
) -> None:
    import msgspec

    from aivedio.config.worker import LaneConfig
    from tests.support.pipeline_rig import registry_without

    allow = {"decision": "allow", "reasons": [], "version": "m1"}
    async with (
        moderator_server([allow]) as (url, seen),
        make_rig(config, pool, tmp_path, backend="http", url=url) as rig,
    ):
        # Only the media lane: egress to PostgreSQL and the object store alone.
        worker = msgspec.structs.replace(rig.config.worker, lanes={"media": LaneConfig(slots=2)})
        rig.config = msgspec.structs.replace(rig.config, worker=worker)
        asset_id = await rig.quarantine(source)
        await rig.enqueue_probe(asset_id)
        async with running_worker(rig, registry_without("moderate")):
            await rig.wait(
                "SELECT 1 FROM jobs WHERE kind = 'moderate' AND payload->>'asset_id' = $1",
                str(asset_id),
            )
            await rig.wait(
                "SELECT 1 FROM job_history WHERE kind = 'probe' AND status = 'succeeded'"
            )
        assert seen == []
        result = await probe_result(rig, asset_id)
        assert result["fast_path"] is True and result["decision"] is None
        assert sorted(result["made"]) == ["playback", "poster"]
        asset = await rig.asset(asset_id)
        assert asset["status"] == "PROCESSING" and asset["current_revision"] is None
        assert asset["probe"]["decode_check"] == "full"


async def test_a_reject_stored_by_a_probe_that_died_is_finished_by_the_moderate_job(
    config: Config, pool: Pool, tmp_path: Path, source: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    from aivedio.pipeline.probe_stage import ProbeStage

    async def died(*_args: Any, **_kwargs: Any) -> None:
        return None  # the probe's statement committed; the job died before acting on it

    verdict = {"decision": "reject", "reasons": ["violence"], "version": "m7"}
    async with (
        moderator_server([verdict]) as (url, seen),
        make_rig(config, pool, tmp_path, backend="http", url=url) as rig,
    ):
        monkeypatch.setattr(ProbeStage, "_after_fast", died)
        asset_id = await rig.quarantine(source)
        await rig.enqueue_probe(asset_id)
        from tests.support.pipeline_rig import registry_without

        async with running_worker(rig, registry_without("moderate")):
            await rig.wait("SELECT 1 FROM job_history WHERE kind = 'probe'")
        # What the dead probe left: the reject stored with the revision, and a moderate job.
        (revision,) = await rig.revisions(asset_id)
        assert (revision["status"], revision["moderation_verdict"]) == ("BUILDING", "reject")
        assert (await rig.asset(asset_id))["status"] == "PROCESSING"
        await rig.due_now("moderate")
        async with running_worker(rig):
            await rig.wait("SELECT 1 FROM assets WHERE status = 'REJECTED'")
            await rig.wait_idle(asset_id)
        assert len(seen) == 1  # the moderator was asked once, by the probe
        assert (await rig.asset(asset_id))["current_revision"] is None
        assert await rig.pool.fetchval("SELECT count(*) FROM releases") == 0
        events = [e["event_type"] for e in await rig.events(asset_id)]
        assert events == ["asset.rejected"]


async def test_frames_without_all_three_stills_are_never_shown_to_the_moderator(
    config: Config, pool: Pool, tmp_path: Path, source: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A pass that yields the first still alone (a source whose middle and end it could not
    # picture) must not be judged on it: the moderate job looks at the playback instead.
    from aivedio.pipeline import fast_path

    real = fast_path.source_pass

    async def first_only(*args: Any, **kwargs: Any) -> Any:
        frames = await real(*args, **kwargs)
        return [f for f in frames if f.kind == "first"]

    monkeypatch.setattr(fast_path, "source_pass", first_only)
    allow = {"decision": "allow", "reasons": [], "version": "m1"}
    async with (
        moderator_server([allow]) as (url, seen),
        make_rig(config, pool, tmp_path, backend="http", url=url) as rig,
    ):
        asset_id = await rig.quarantine(source)
        await rig.enqueue_probe(asset_id)
        async with running_worker(rig):
            await rig.wait("SELECT 1 FROM assets WHERE status = 'ENRICHED'")
            await rig.wait_idle(asset_id)
        result = await probe_result(rig, asset_id)
        assert result["decision"] is None
        assert result["moderation_unavailable"] == "frames missing: last, middle"
        # The moderate job asked, with the playback's first, middle and last frames.
        assert len(seen) == 1
        assert [f["kind"] for f in seen[0]["frames"]][:3] == ["first", "middle", "last"]
        assert "moderate" in await kinds_of(rig, asset_id)


async def test_a_delivery_that_is_no_longer_the_one_never_writes_its_outputs(
    rig: Rig, source: bytes
) -> None:
    # Another delivery recorded the revision (the asset left PROBING): this one's outputs,
    # made from the same source, must not overwrite what that one stored and published.
    from aivedio.pipeline.fast_path import FastPath
    from aivedio.pipeline.ffmpeg.outputs import OutputFile, OutputRecord
    from aivedio.store.objects import keys as object_keys

    asset_id = await rig.quarantine(source)
    await rig.enqueue_probe(asset_id)
    queue = Queue(rig.pool)
    (job,) = await queue.claim("media", 1, "test", 60)
    await rig.pool.execute("UPDATE assets SET status = 'PROCESSING' WHERE id = $1", asset_id)
    asset = await rig.pool.fetchrow("SELECT id, tenant_id FROM assets WHERE id = $1", asset_id)
    out = rig.store  # the store the rig's worker would use

    class Layout:
        def __init__(self, root: Path) -> None:
            self.out = root

    class Run:
        layout = Layout(Path("/nonexistent"))

    record = OutputRecord(
        variant_type="poster",
        primary="poster.jpg",
        files=[OutputFile(path="poster.jpg", size=1, sha256="0" * 64, mime="image/jpeg")],
        required=True,
    )
    async with (
        open_media_stage(rig.config, rig.pool, queue, rig.store) as media,
        open_moderation_stage(rig.config, rig.pool, queue, rig.store) as moderation,
    ):
        path = FastPath(media.services, moderation)
        with pytest.raises(StaleStateError):
            await path._store(job, Run(), asset, 1, [record])  # type: ignore[arg-type]
    prefix = object_keys.revision_prefix(rig.tenant_id, asset_id, 1)
    assert [info async for info in out.list(prefix + "/")] == []


async def test_a_transcodes_ladder_takes_its_top_rung_from_the_published_playback(
    rig: Rig, media_cache: MediaCache, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from aivedio.pipeline.ffmpeg import media_run
    from tests.support.hls_check import check_hls

    encoded: list[list[str]] = []
    real = media_run.encode_job

    def watched(*args: Any, **kwargs: Any) -> Any:
        job = real(*args, **kwargs)
        encoded.append([rung.name for rung in job.rungs])
        return job

    monkeypatch.setattr(media_run, "encode_job", watched)
    asset_id = await rig.quarantine(media_cache.get("hevc", mf.hevc_mkv).read_bytes())
    await rig.enqueue_probe(asset_id)
    async with running_worker(rig):
        await rig.wait("SELECT 1 FROM assets WHERE status = 'ENRICHED'", timeout=120)
        await rig.wait_idle(asset_id)
    # The top rung (240p) encoded once, for the playback; the ladder's run (the enrichment,
    # in the probe job) encodes the rest.
    top = [names for names in encoded if names]
    assert top == [["240p"], ["180p"]], encoded
    # And the ladder is whole and aligned, the reused rung with the encoded one.
    assert (await rig.asset(asset_id))["current_revision"] == 2
    # The enrichment (revision 2) releases what revision 1's runs made, under its prefix.
    prefix = keys.revision_prefix(rig.tenant_id, asset_id, 1)
    local = tmp_path / "published"
    async for info in rig.store.list(prefix + "/"):
        path = local / info.key[len(prefix) + 1 :]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(await rig.store.get_bytes(info.key, max_bytes=1 << 30))
    assert check_hls(local / "hls" / "master.m3u8") == []


async def _published_playback(rig: Rig, asset_id: Any, tmp_path: Path) -> Path:
    playback = (await rig.variants(asset_id))["playback"]
    path = tmp_path / f"{asset_id}.mp4"
    path.write_bytes(await rig.store.get_bytes(playback["object_key"], max_bytes=1 << 30))
    return path


async def test_a_loud_remux_is_measured_first_and_its_playback_made_once_normalized(
    rig: Rig, media_cache: MediaCache, tmp_path: Path
) -> None:
    source = media_cache.get("loud", lambda d: mf.tone_at(d, volume_db=15))
    asset_id = await rig.quarantine(source.read_bytes())
    await rig.enqueue_probe(asset_id)
    async with running_worker(rig):
        await rig.wait("SELECT 1 FROM assets WHERE status = 'ENRICHED'")
        await rig.wait_idle(asset_id)
    result = await probe_result(rig, asset_id)
    assert result["fast_path"] is True and result["decision"] == "allow"
    # Measured by an audio-only pass before the render, so the playback is made once,
    # normalized: never made again after the frames pass (the "loudness" phase).
    assert "loudness" in result["processes"]
    assert "loudness" not in [p["phase"] for p in result["phases"]]
    first, *_ = await rig.revisions(asset_id)
    plan = first["plan"]
    assert plan["mode"] == "remux" and plan["audio"] == "aac"
    assert plan["loudness"]["integrated_lufs"] > -10
    published = await _published_playback(rig, asset_id, tmp_path)
    assert abs(mf.ebur128_of(published)["I"] - rig.config.media.loudness.target_lufs) <= 1.0
    assert mf.stream_md5(published, "0:v:0") == mf.stream_md5(source, "0:v:0")


async def test_a_tenant_with_normalization_off_keeps_its_audio_on_the_fast_path(
    config: Config, pool: Pool, media_cache: MediaCache, tmp_path: Path
) -> None:
    import msgspec

    source = media_cache.get("loud", lambda d: mf.tone_at(d, volume_db=15))
    async with make_rig(config, pool, tmp_path) as rig:
        media = rig.config.media
        off = msgspec.structs.replace(media.loudness, off_tenants=["acme"])
        rig.config = msgspec.structs.replace(
            rig.config, media=msgspec.structs.replace(media, loudness=off)
        )
        asset_id = await rig.quarantine(source.read_bytes())
        await rig.enqueue_probe(asset_id)
        async with running_worker(rig):
            await rig.wait("SELECT 1 FROM assets WHERE status = 'ENRICHED'")
            await rig.wait_idle(asset_id)
        first, *_ = await rig.revisions(asset_id)
        assert first["plan"]["audio"] == "copy"
        # Measured all the same by the frames pass's audio decode, and recorded; no
        # measuring pass of its own.
        assert "loudness" not in (await probe_result(rig, asset_id))["processes"]
        assert first["plan"]["loudness"]["integrated_lufs"] > -10
        published = await _published_playback(rig, asset_id, tmp_path)
        assert mf.stream_md5(published, "0:a:0") == mf.stream_md5(source, "0:a:0")


async def test_an_inline_enrichment_that_lost_its_lease_writes_nothing_and_wakes_its_job(
    rig: Rig,
) -> None:
    # The probe job stalled past its lease (the reaper may have woken the held render job,
    # which may be rendering this revision): its enrichment, whose lease window has passed,
    # checks before its first upload, stores nothing and wakes the held job.
    from types import SimpleNamespace

    from aivedio.errors import LeaseLostError
    from aivedio.pipeline.inline_enrichment import InlineEnrichment
    from aivedio.pipeline.media_seams import WorkerSeams
    from aivedio.store.job_types import JobSpec

    asset_id = await rig.quarantine(b"not read: the run is a stand-in")
    await rig.enqueue_probe(asset_id)
    queue = Queue(rig.pool)
    (job,) = await queue.claim("media", 1, "test", 60)
    held = JobSpec(
        kind="render",
        lane="media",
        idempotency_key=f"render:{asset_id}:1:hls:v1",
        payload={"asset_id": str(asset_id), "revision": 1, "variant_type": "hls"},
        held_seconds=3600,
        held_by=job.id,
    )
    async with rig.pool.acquire() as conn:
        await queue.enqueue(conn, [held])
    await rig.pool.execute("UPDATE jobs SET lease_token = lease_token + 1 WHERE id = $1", job.id)
    asset = await rig.pool.fetchrow("SELECT id, tenant_id FROM assets WHERE id = $1", asset_id)
    made: list[str] = []

    class Run:
        layout = SimpleNamespace(out=Path("/nonexistent"))
        on_done: Any = None
        report = None

        async def run(self, wants: list[str], plan: Any) -> Any:
            from aivedio.pipeline.ffmpeg.outputs import OutputFile, OutputRecord

            record = OutputRecord(
                variant_type="hls",
                primary="hls/master.m3u8",
                files=[OutputFile(path="hls/master.m3u8", size=1, sha256="0" * 64, mime="x")],
                required=False,
            )
            await self.on_done(record)
            made.append(record.variant_type)

    plan = SimpleNamespace(top=SimpleNamespace(copy=True))
    async with open_media_stage(rig.config, rig.pool, queue, rig.store) as media:
        enrichment = InlineEnrichment(media.revisions)
        with pytest.raises(LeaseLostError):
            await enrichment.run(
                job,
                Run(),  # type: ignore[arg-type]
                asset,
                1,
                plan,  # type: ignore[arg-type]
                ["hls"],
                held.idempotency_key,
                WorkerSeams(),
                hold=3600,
                fenced_until=float("-inf"),
            )
    assert made == []
    prefix = keys.revision_prefix(rig.tenant_id, asset_id, 1)
    assert [info async for info in rig.store.list(prefix + "/")] == []
    status = await rig.pool.fetchval(
        "SELECT status FROM jobs WHERE idempotency_key = $1", held.idempotency_key
    )
    assert status == "queued"  # woken: it renders now, by its own rules
