"""The schemathesis run of ``test_schemathesis.py`` (its docstring says what is checked and
what is told per operation) with ids that exist, so that the handlers' success paths answer
too: a published video with a real playback, a generation task, a valid playback token,
webhook receivers with a dead delivery, an uploaded video. Every warning fails this run.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from aivedio.config.load import Config
from aivedio.store.database import Pool
from tests.support.api_rig import published
from tests.support.schemathesis_run import (
    DOCUMENT_WARNINGS,
    fuzzed_api,
    run_schemathesis,
    settings,
    uploaded,
    webhook_with_a_dead_delivery,
)

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(600)]


async def test_schemathesis_finds_no_conformance_failure_with_ids_that_exist(
    config: Config, pool: Pool, tmp_path: Path
) -> None:
    async with fuzzed_api(config, pool, tmp_path) as api:
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
