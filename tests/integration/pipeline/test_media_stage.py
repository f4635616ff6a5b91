"""The media stage through the worker: probe job, one render job per output, variants.

Real PostgreSQL, the local object store, real ffmpeg in the sandbox.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

from aivedio.cli.status import _text as status_text
from aivedio.config.load import Config
from aivedio.errors import DatabaseError, DeferredError, RenderError
from aivedio.pipeline.ffmpeg import media_run
from aivedio.pipeline.media_stage import MediaStage, open_media_stage
from aivedio.store.asset_status import asset_status
from aivedio.store.database import Pool
from aivedio.store.objects import keys
from aivedio.store.objects.base import ObjectStore
from aivedio.store.queue import Queue
from aivedio.worker.daemon import Worker
from aivedio.worker.kinds import default_registry
from tests.support import media_fixtures as mf
from tests.support.hls_check import check_hls
from tests.support.media_fixtures import MediaCache, h264_faststart, html_error_page
from tests.support.pipeline_rig import Rig, fake_job, make_rig

pytestmark = pytest.mark.anyio

REGISTRY = default_registry()


@pytest.fixture(scope="module")
def media_cache(tmp_path_factory: pytest.TempPathFactory) -> MediaCache:
    return MediaCache(tmp_path_factory.mktemp("media"))


@pytest.fixture(scope="module")
def source(media_cache: MediaCache) -> Path:
    return media_cache.get("h264", h264_faststart, width=320, height=240, seconds=2)


@pytest.fixture
async def rig(config: Config, pool: Pool, tmp_path: Path) -> AsyncIterator[Rig]:
    async with make_rig(config, pool, tmp_path) as r:
        yield r


@asynccontextmanager
async def running_worker(rig: Rig) -> AsyncIterator[Worker]:
    queue = Queue(rig.pool)
    async with (
        open_media_stage(rig.config, rig.pool, queue, rig.store) as stage,
        anyio.create_task_group() as tg,
    ):
        w = Worker(rig.config, rig.pool, REGISTRY, services={"media": stage}, queue=queue)
        tg.start_soon(lambda: w.run(install_signal_handlers=False))
        yield w
        w.request_drain(force=True)


async def download_prefix(store: ObjectStore, prefix: str, target: Path) -> list[str]:
    names = []
    async for info in store.list(prefix + "/"):
        name = info.key[len(prefix) + 1 :]
        path = target / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"".join([c async for c in store.get(info.key)]))
        names.append(name)
    return names


async def test_a_valid_source_is_probed_planned_and_every_output_rendered(
    rig: Rig, source: Path, tmp_path: Path
) -> None:
    asset_id = await rig.quarantine(source.read_bytes())
    await rig.enqueue_probe(asset_id)
    async with running_worker(rig):
        await rig.wait_idle(asset_id)
    asset = await rig.asset(asset_id)
    assert asset["status"] == "PROCESSING"
    assert (asset["width"], asset["height"], asset["video_codec"]) == (320, 240, "h264")
    assert asset["probe"]["verdict"] == "valid"
    revision = await rig.pool.fetchrow(
        "SELECT * FROM asset_revisions WHERE asset_id = $1", asset_id
    )
    assert revision["revision"] == 1 and revision["status"] == "BUILDING"
    assert revision["plan"]["mode"] == "remux"
    assert revision["required_outputs"] == ["playback", "poster"]
    variants = await rig.variants(asset_id)
    assert set(variants) == {
        "playback",
        "poster",
        "hls",
        "proxy",
        "sprite",
        "waveform",
        "keyframes",
    }
    prefix = keys.revision_prefix(rig.tenant_id, asset_id, 1)
    for name, variant in variants.items():
        assert variant["status"] == "SUCCEEDED", name
        assert variant["object_key"].startswith(prefix + "/")
        body = await rig.store.get_bytes(variant["object_key"])
        assert len(body) == variant["size_bytes"]
        assert hashlib.sha256(body).hexdigest() == variant["checksum"]
        for file in variant["extra"]["files"]:
            info = await rig.store.head(f"{prefix}/{file['path']}")
            assert info is not None and info.size == file["size"]
    assert variants["playback"]["mime_type"] == "video/mp4"
    assert variants["hls"]["object_key"] == f"{prefix}/hls/master.m3u8"
    # What landed in the store is a complete, aligned, decodable ladder.
    local = tmp_path / "downloaded"
    names = await download_prefix(rig.store, prefix, local)
    assert "playback.mp4" in names
    assert check_hls(local / "hls" / "master.m3u8") == []
    # This worker runs the media stage only: the moderation job it enqueues is not its own.
    history = await rig.pool.fetch(
        "SELECT kind, status, result FROM job_history WHERE payload->>'asset_id' = $1"
        " AND kind IN ('probe', 'render')",
        str(asset_id),
    )
    assert sorted(h["kind"] for h in history) == ["probe", "render"]
    assert all(h["status"] == "succeeded" for h in history)
    # One render job, for the whole revision: it made everything in one run.
    rendered = [h["result"] for h in history if h["result"].get("outcome") == "rendered"]
    assert len(rendered) == 1 and len(rendered[0]["done"]) == 7
    # Whether ffmpeg had a network namespace is recorded in the job results either way.
    probe_result = next(h["result"] for h in history if h["kind"] == "probe")
    assert isinstance(probe_result["network_isolated"], bool)
    assert rendered[0]["network_isolated"] == probe_result["network_isolated"]


async def test_invalid_media_ends_the_asset_and_is_never_retried(
    rig: Rig, media_cache: MediaCache
) -> None:
    html = media_cache.get("html", html_error_page).read_bytes()
    asset_id = await rig.quarantine(html)
    job_id = await rig.enqueue_probe(asset_id)
    async with running_worker(rig):
        await rig.wait("SELECT 1 FROM job_history WHERE id = $1", job_id)
    asset = await rig.asset(asset_id)
    assert asset["status"] == "INVALID_MEDIA"
    assert asset["last_error_class"] == "invalid_media"
    assert asset["probe"]["reasons"] == ["unsupported_container:html"]
    job = await rig.pool.fetchrow("SELECT * FROM job_history WHERE id = $1", job_id)
    assert job["attempts"] == 1 and job["status"] == "succeeded"
    assert await rig.pool.fetchval("SELECT count(*) FROM asset_revisions") == 0


async def test_of_twenty_audio_tracks_the_default_one_is_published(
    rig: Rig, media_cache: MediaCache, tmp_path: Path
) -> None:
    # Stream 3 (the third audio track, 500 Hz, "deu") has the default disposition. Refused
    # as too_many_streams before; now every output carries that track and no other.
    source = media_cache.get("tagged_x20", mf.tagged_audio_streams, n=20, default=2)
    asset_id = await rig.quarantine(source.read_bytes())
    await rig.enqueue_probe(asset_id)
    async with running_worker(rig):
        await rig.wait_idle(asset_id)
    asset = await rig.asset(asset_id)
    assert asset["status"] == "PROCESSING", asset["last_error_detail"]
    media = asset["probe"]["media"]
    assert (media["audio_stream_index"], media["audio_streams"]) == (3, 20)
    revision = await rig.pool.fetchrow(
        "SELECT plan FROM asset_revisions WHERE asset_id = $1", asset_id
    )
    assert revision["plan"]["audio_stream"] == 3
    variants = await rig.variants(asset_id)
    assert {v["status"] for v in variants.values()} == {"SUCCEEDED"}
    local = tmp_path / "downloaded"
    await download_prefix(rig.store, keys.revision_prefix(rig.tenant_id, asset_id, 1), local)
    renditions = [local / "hls" / r["name"] / "index.m3u8" for r in revision["plan"]["rungs"]]
    assert renditions
    for output in (local / "playback.mp4", local / "proxy.mp4", *renditions):
        tracks = [s for s in mf.ffprobe_streams(output) if s["codec_type"] == "audio"]
        assert len(tracks) == 1, output
        assert tracks[0]["channels"] == 1
        assert mf.tone_of(output) == pytest.approx(mf.audio_tone_hz(2), abs=10), output
    [track] = [s for s in mf.ffprobe_streams(local / "playback.mp4") if s["codec_type"] == "audio"]
    assert track["tags"]["language"] == "deu"
    # What the status shows: the 19 tracks left out, and why.
    status = await asset_status(rig.pool, asset_id)
    assert status is not None
    ignored = status["ignored_streams"]
    assert [(i["index"], i["why"]) for i in ignored] == [
        (k, "not_chosen") for k in (1, 2, *range(4, 21))
    ]
    assert ignored[0]["language"] == "eng"
    text = status_text(status)
    assert (
        "ignored streams: #1 audio aac [eng] (not_chosen), #2 audio aac [fra] (not_chosen)," in text
    )


async def test_sources_too_small_or_with_too_many_streams_end_invalid(
    rig: Rig, media_cache: MediaCache
) -> None:
    cases = {
        "dimensions_too_small:1x1": media_cache.get("sized_1x1", mf.sized_video, width=1, height=1),
        "duration_too_short": media_cache.get("short_0.05", mf.short_clip, video_seconds=0.05),
        # 33 streams: past the cap the demuxer is given (max_streams 32).
        "too_many_streams": media_cache.get("audio_x32", mf.many_audio_streams, n=32),
    }
    ids = {reason: await rig.quarantine(path.read_bytes()) for reason, path in cases.items()}
    jobs = {reason: await rig.enqueue_probe(asset_id) for reason, asset_id in ids.items()}
    async with running_worker(rig):
        for job_id in jobs.values():
            await rig.wait("SELECT 1 FROM job_history WHERE id = $1", job_id)
    for reason, asset_id in ids.items():
        asset = await rig.asset(asset_id)
        assert (asset["status"], asset["probe"]["reasons"]) == ("INVALID_MEDIA", [reason])
        assert asset["last_error_class"] == "invalid_media"
    assert await rig.pool.fetchval("SELECT count(*) FROM asset_revisions") == 0


async def test_a_source_that_changed_in_quarantine_is_not_processed(rig: Rig, source: Path) -> None:
    asset_id = await rig.quarantine(source.read_bytes(), sha256="0" * 64)
    job_id = await rig.enqueue_probe(asset_id)
    async with running_worker(rig):
        await rig.wait("SELECT 1 FROM job_history WHERE id = $1", job_id)
    job = await rig.pool.fetchrow("SELECT * FROM job_history WHERE id = $1", job_id)
    assert job["status"] == "dead"
    assert job["last_error_class"] == "checksum_mismatch"
    # Out of retries, the asset does not wait in PROBING: it failed, and says why.
    asset = await rig.asset(asset_id)
    assert asset["status"] == "PROCESSING_FAILED"
    assert asset["last_error_class"] == "checksum_mismatch"


async def test_a_failing_optional_output_never_blocks_the_required_set(
    rig: Rig, source: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken(*_args: Any, **_kwargs: Any) -> Any:
        raise RenderError("sprite sheet could not be verified")

    monkeypatch.setattr(media_run.MediaRun, "_finalize_sprite", broken)
    asset_id = await rig.quarantine(source.read_bytes())
    await rig.enqueue_probe(asset_id)
    async with running_worker(rig):
        await rig.wait_idle(asset_id)
    variants = await rig.variants(asset_id)
    assert variants["sprite"]["status"] == "FAILED"
    assert "could not be verified" in variants["sprite"]["extra"]["error"]
    assert {n: v["status"] for n, v in variants.items() if n != "sprite"} == dict.fromkeys(
        ["playback", "poster", "hls", "proxy", "waveform", "keyframes"], "SUCCEEDED"
    )
    revision = await rig.pool.fetchrow("SELECT status FROM asset_revisions")
    assert revision["status"] == "BUILDING"  # the required set is complete: publishable
    assert (await rig.asset(asset_id))["status"] == "PROCESSING"
    sprite_job = await rig.pool.fetchrow(
        "SELECT * FROM job_history WHERE payload->>'variant_type' = 'sprite'"
    )
    # Retried alone a few times (render failures are LIMITED), then dead and FAILED.
    assert sprite_job["status"] == "dead" and sprite_job["attempts"] == 3
    assert sprite_job["last_error_class"] == "render_failed"


async def test_optional_outputs_made_before_a_crash_are_recorded(
    rig: Rig, source: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Optional outputs are recorded together when the run ends, also when it ends by an
    error the run does not expect: what was made and verified is not made again."""
    finalize = media_run.MediaRun._finalize
    made: list[str] = []

    async def crash_after_two(self: media_run.MediaRun, node: str, *args: Any) -> Any:
        optional = [n for n in made if n not in ("playback", "poster")]
        if len(optional) == 2:
            raise RuntimeError("the worker dies here")
        made.append(node)
        return await finalize(self, node, *args)

    monkeypatch.setattr(media_run.MediaRun, "_finalize", crash_after_two)
    asset_id = await rig.quarantine(source.read_bytes())
    probe_job = await rig.claimed_probe(asset_id)
    async with open_media_stage(rig.config, rig.pool, Queue(rig.pool), rig.store) as stage:
        await stage.probe(probe_job)
        payload = {"asset_id": str(asset_id), "revision": 1, "variant_type": "playback"}
        with pytest.raises(RuntimeError):
            await stage.render(fake_job(payload, "render"))
    variants = await rig.variants(asset_id)
    done = {n for n, v in variants.items() if v["status"] == "SUCCEEDED"}
    assert len([n for n in made if n not in ("playback", "poster")]) == 2
    assert done == set(made) and variants[made[-1]]["extra"]["files"]


async def test_a_failing_required_output_fails_the_revision_and_the_asset(
    rig: Rig, source: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = media_run.MediaRun._finalize

    async def finalize(self: media_run.MediaRun, node: str, *args: Any) -> Any:
        if node == "poster":
            raise RenderError("poster is not a JPEG")
        return await original(self, node, *args)

    monkeypatch.setattr(media_run.MediaRun, "_finalize", finalize)
    asset_id = await rig.quarantine(source.read_bytes())
    await rig.enqueue_probe(asset_id)
    async with running_worker(rig):
        await rig.wait_idle(asset_id)
    variants = await rig.variants(asset_id)
    assert variants["poster"]["status"] == "FAILED"
    assert variants["playback"]["status"] == "SUCCEEDED"
    revision = await rig.pool.fetchrow("SELECT status FROM asset_revisions")
    assert revision["status"] == "FAILED"
    asset = await rig.asset(asset_id)
    assert asset["status"] == "PROCESSING_FAILED"
    assert asset["last_error_class"] == "render_failed"


async def test_a_render_defers_while_another_holds_the_revision(rig: Rig, source: Path) -> None:
    asset_id = await rig.quarantine(source.read_bytes())
    probe_job = await rig.claimed_probe(asset_id)
    async with open_media_stage(rig.config, rig.pool, Queue(rig.pool), rig.store) as stage:
        assert isinstance(stage, MediaStage)
        result = await stage.probe(probe_job)
        assert result["outcome"] == "processing"
        # A second run of the probe job (at-least-once delivery) changes nothing.
        again = await stage.probe(probe_job)
        assert again == {"outcome": "already_probed", "status": "PROCESSING"}
        assert await rig.pool.fetchval("SELECT count(*) FROM asset_revisions") == 1
        payload = {"asset_id": str(asset_id), "revision": 1, "variant_type": "playback"}
        async with stage.renders.revision_lock(asset_id, 1) as held:
            assert held
            with pytest.raises(DeferredError):
                await stage.render(fake_job(payload, "render"))
        result = await stage.render(fake_job(payload, "render"))
        assert result["outcome"] == "rendered"
        # Delivered again after success: nothing is rendered twice.
        assert (await stage.render(fake_job(payload, "render")))["outcome"] == "already_succeeded"


async def test_a_retried_render_whose_output_was_made_gives_the_rest_their_own_jobs(
    rig: Rig, source: Path
) -> None:
    """The revision's one render job made its output, then its worker died before the rest:
    the retry finds its output done and must leave no pending output without a job."""
    asset_id = await rig.quarantine(source.read_bytes())
    probe_job = await rig.claimed_probe(asset_id)
    async with open_media_stage(rig.config, rig.pool, Queue(rig.pool), rig.store) as stage:
        await stage.probe(probe_job)
        # The lead job's first run recorded playback and died: simulated by the record alone.
        await rig.pool.execute(
            "UPDATE asset_variants SET status = 'SUCCEEDED' WHERE asset_id = $1"
            " AND variant_type = 'playback'",
            asset_id,
        )
        await rig.pool.execute("DELETE FROM jobs WHERE payload->>'asset_id' = $1", str(asset_id))
        payload = {"asset_id": str(asset_id), "revision": 1, "variant_type": "playback"}
        result = await stage.render(fake_job(payload, "render", attempts=2))
    assert result["outcome"] == "already_succeeded"
    queued = await rig.pool.fetch(
        "SELECT payload->>'variant_type' AS output FROM jobs WHERE kind = 'render'"
        " AND payload->>'asset_id' = $1",
        str(asset_id),
    )
    pending = {n for n, v in (await rig.variants(asset_id)).items() if v["status"] == "PENDING"}
    assert pending and {r["output"] for r in queued} == pending


async def test_a_last_attempt_failing_before_the_lock_leaves_no_output_without_a_job(
    rig: Rig, source: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The outputs put off under backlog pressure wait on one job. If its last attempt fails
    before it holds the revision's lock (the lock session cannot be opened, say), its output
    is FAILED and every other pending output gets a job of its own, as after a failure under
    the lock."""
    asset_id = await rig.quarantine(source.read_bytes())
    probe_job = await rig.claimed_probe(asset_id)
    async with open_media_stage(rig.config, rig.pool, Queue(rig.pool), rig.store) as stage:
        assert isinstance(stage, MediaStage)
        await stage.probe(probe_job)
        lead = "SELECT payload->>'variant_type' FROM jobs WHERE kind = 'render'"
        assert [r[0] for r in await rig.pool.fetch(lead)] == ["playback"]

        @asynccontextmanager
        async def unreachable(*_args: Any) -> AsyncIterator[bool]:
            raise DatabaseError("opening the lock session: too many connections")
            yield True  # pragma: no cover

        monkeypatch.setattr(stage.renders, "revision_lock", unreachable)
        payload = {"asset_id": str(asset_id), "revision": 1, "variant_type": "proxy"}
        with pytest.raises(DatabaseError):  # not the last attempt: retried, nothing changes
            await stage.render(fake_job(payload, "render", attempts=1))
        assert (await rig.variants(asset_id))["proxy"]["status"] == "PENDING"
        assert [r[0] for r in await rig.pool.fetch(lead)] == ["playback"]
        with pytest.raises(DatabaseError):
            await stage.render(fake_job(payload, "render", attempts=8))  # max_attempts
    variants = await rig.variants(asset_id)
    assert variants["proxy"]["status"] == "FAILED"
    queued = await rig.pool.fetch(
        "SELECT payload->>'variant_type' AS output FROM jobs WHERE kind = 'render'"
        " AND payload->>'asset_id' = $1",
        str(asset_id),
    )
    pending = {n for n, v in variants.items() if v["status"] == "PENDING"}
    assert pending and {r["output"] for r in queued} == pending
