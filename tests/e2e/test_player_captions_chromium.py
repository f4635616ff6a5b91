"""Captions in a real browser: a video the real pipeline published, a sidecar track attached
through the API, and Debian's chromium (headless, tests/support/chromium.py) on the watch
page. The cue is judged by the browser itself: ``video.textTracks[i].activeCues`` holds the
cue's text at a time inside it and nothing at a time outside it, while hls.js plays the
master playlist through the gateway."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import anyio
import pytest

from aivedio.api import player
from aivedio.config.load import Config
from aivedio.pipeline.media.text_tracks import make_track
from aivedio.store.database import Pool
from tests.support import chromium
from tests.support.api_rig import open_api
from tests.support.media_fixtures import h264_720p

pytestmark = [pytest.mark.anyio, pytest.mark.integration]

CUE_TEXT = "Caption at one second"
SIDECAR = f"""1
00:00:01,000 --> 00:00:02,500
<i>{CUE_TEXT}</i><script>document.title='owned'</script>
"""

TRACKS_JS = """(() => {
  const v = document.querySelector('video');
  if (!v) return {currentTime: -1, readyState: -1, tracks: [], elements: 0};
  const p = window.aivedioPlayer || {};
  const tracks = Array.from(v.textTracks).map(t => ({
    kind: t.kind, language: t.language, label: t.label, mode: t.mode,
    cues: t.cues ? t.cues.length : -1,
    active: t.activeCues ? Array.from(t.activeCues).map(c => c.text) : null}));
  return {currentTime: v.currentTime, readyState: v.readyState, mode: p.mode || null,
          elements: document.querySelectorAll('video > track').length, tracks,
          title: document.title, scripts: document.querySelectorAll('script').length};
})()"""


def seek_js(seconds: float) -> str:
    return f"""(() => {{ const v = document.querySelector('video');
      v.pause(); v.currentTime = {seconds}; return true; }})()"""


async def poll(page: chromium.Page, done: Any, what: str, timeout: float = 30.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    state: dict[str, Any] = {}
    while time.monotonic() < deadline:
        state = await page.evaluate(TRACKS_JS)
        if done(state):
            return state
        await anyio.sleep(0.2)
    pytest.fail(f"{what} never happened in {timeout} s: {json.dumps(state)}")


@pytest.mark.skipif(
    not Path(chromium.CHROMIUM).exists(),
    reason="chromium is not installed (scripts/test installs it: ensure_chromium)",
)
@pytest.mark.timeout(240)
async def test_the_player_page_shows_the_caption_cue_at_its_time_in_chromium(
    config: Config, pool: Pool, tmp_path: Path
) -> None:
    async with open_api(config, pool, tmp_path) as api:
        video = await api.publish(h264_720p(tmp_path / "clip", seconds=5))
        track = {
            "language": "en",
            "label": "English",
            "kind": "captions",
            "default": True,
            "content": SIDECAR,
        }
        await api.json("POST", f"/v1/videos/{video}/tracks", expect=201, json=track)
        play = await api.json("GET", f"/v1/videos/{video}/playback")
        async with chromium.launch(tmp_path) as browser:
            page = await browser.new_page()
            await page.navigate(play["watch_url"])
            state = await poll(
                page,
                lambda s: s["readyState"] >= 2 and s["tracks"] and s["tracks"][0]["cues"] > 0,
                "the caption track loading",
            )
            assert state["elements"] == 1 and state["mode"] == "hls.js", state
            # hls.js leaves the page's track alone: one text track, the page's.
            assert [(t["kind"], t["language"], t["label"]) for t in state["tracks"]] == [
                ("captions", "en", "English")
            ], state
            assert state["tracks"][0]["mode"] == "showing" and state["tracks"][0]["cues"] == 1

            await page.evaluate(seek_js(1.6))
            inside = await poll(
                page,
                lambda s: abs(s["currentTime"] - 1.6) < 0.05 and s["tracks"][0]["active"],
                "the cue becoming active at 1.6 s",
            )
            (cue,) = inside["tracks"][0]["active"]
            # The cue's text as the browser has it: the <i> kept, the script only text.
            assert cue.startswith(f"<i>{CUE_TEXT}</i>") and "<script" not in cue, cue
            assert inside["title"] != "owned"

            await page.evaluate(seek_js(3.5))
            outside = await poll(
                page,
                lambda s: abs(s["currentTime"] - 3.5) < 0.05,
                "the seek to 3.5 s",
            )
            await anyio.sleep(0.5)  # time marches on: give it a frame past the seek
            outside = await page.evaluate(TRACKS_JS)
            assert outside["tracks"][0]["active"] == [], outside

            await page.evaluate(seek_js(0.4))
            before = await poll(
                page, lambda s: abs(s["currentTime"] - 0.4) < 0.05, "the seek to 0.4 s"
            )
            await anyio.sleep(0.5)
            before = await page.evaluate(TRACKS_JS)
            assert before["tracks"][0]["active"] == [], before


async def test_the_page_escapes_what_it_writes_into_each_track_element() -> None:
    track = make_track(
        "a1", kind="captions", language="en", label="A <b>&", default=True, origin="sidecar", cues=1
    )
    files = {"hls": {"path": "hls/master.m3u8", "tracks": [track]}}
    page = await player.render_page(uuid.uuid4(), 2, "tok.en", files)
    assert (
        '<track kind="captions" srclang="en" label="A &lt;b&gt;&amp;"'
        ' src="/media/tok.en/hls/text/a1.vtt" default>'
    ) in page
