"""The player page chooses the AV1 ladder where the browser decodes it, H.264 elsewhere.

A clip goes through the real pipeline with the AV1 ladder on for its tenant; Debian's
chromium (headless, tests/support/chromium.py) opens the watch page twice: as it is (this
chromium decodes AV1 in software: dav1d) and with ``MediaSource.isTypeSupported`` answering
no for ``av01`` (as a browser without AV1 does), injected before the page's scripts run.
Each time the test waits until the video has played past 2 s and reads which renditions'
segments the page fetched: AV1 ones only in the first case, H.264 ones only in the second.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from aivedio.api import player
from aivedio.config.load import Config
from aivedio.config.media import AV1Config
from aivedio.store.database import Pool
from tests.e2e.test_player_chromium import RESOURCES_JS, wait_for_playback
from tests.support import chromium
from tests.support import media_fixtures as mf
from tests.support.api_rig import open_api
from tests.support.media_fixtures import h264_720p

pytestmark = [pytest.mark.anyio, pytest.mark.integration]

CODEC_JS = """(() => {
  const p = window.aivedioPlayer || {};
  return {codec: p.codec, av1Supported: p.av1Supported, playingCodec: p.playingCodec,
          says: MediaSource.isTypeSupported('video/mp4; codecs="av01.0.05M.08"')};
})()"""

# What a browser without AV1 answers; everything else is asked of the real MediaSource.
NO_AV1 = """(() => {
  const asked = MediaSource.isTypeSupported.bind(MediaSource);
  MediaSource.isTypeSupported = (type) => !/av01/.test(type) && asked(type);
})();"""


async def segments_played(page: chromium.Page, token: str, base: str) -> set[str]:
    """The renditions (directories under hls/) whose segments the page fetched."""
    resources: list[dict[str, Any]] = await page.evaluate(RESOURCES_JS)
    prefix = f"{base}/media/{token}/hls/"
    found = set()
    for entry in resources:
        name = entry["name"]
        if name.startswith(prefix) and name.endswith(".m4s"):
            assert entry["status"] in (200, 206), entry
            found.add(name[len(prefix) :].split("/")[0])
    return found


@pytest.mark.skipif(
    not Path(chromium.CHROMIUM).exists(),
    reason="chromium is not installed (scripts/test installs it: ensure_chromium)",
)
@pytest.mark.timeout(240)
async def test_the_player_plays_av1_where_the_browser_decodes_it_else_h264(
    config: Config, pool: Pool, tmp_path: Path
) -> None:
    assert player.HLS_JS.exists(), f"hls.js is missing: {player.INSTALL_HINT}"
    async with open_api(config, pool, tmp_path, av1=AV1Config(tenants=["acme"])) as api:
        asset_id = await api.publish(h264_720p(tmp_path / "clip", seconds=5), timeout=180)
        play = await api.json("GET", f"/v1/videos/{asset_id}/playback")
        async with api.http.get(play["master_playlist"]) as resp:
            master = (await resp.read()).decode()
        assert 'CODECS="av01.' in master and 'CODECS="avc1.' in master, master

        async with chromium.launch(tmp_path) as browser:
            page = await browser.new_page()
            await page.navigate(play["watch_url"])
            await wait_for_playback(page, browser)
            codec = await page.evaluate(CODEC_JS)
            played = await segments_played(page, play["token"], api.base)
            # This chromium's own answer decides: it decodes AV1 (dav1d), so AV1 it is.
            assert codec["says"] is True, codec
            assert codec["codec"] == "av1" and codec["av1Supported"] is True, codec
            assert codec["playingCodec"].startswith("av01."), codec
            assert played and all(name.startswith("av1_") for name in played), played
            state = await page.evaluate("window.aivedioPlayer.errors")
            assert state == [], (state, browser.cdp.console())

            without = await browser.new_page()
            await without.send("Page.addScriptToEvaluateOnNewDocument", {"source": NO_AV1})
            await without.navigate(play["watch_url"])
            await wait_for_playback(without, browser)
            codec = await without.evaluate(CODEC_JS)
            played = await segments_played(without, play["token"], api.base)
            assert codec["says"] is False and codec["codec"] == "h264", codec
            assert codec["playingCodec"].startswith("avc1."), codec
            assert played and not any(name.startswith("av1_") for name in played), played
            state = await without.evaluate("window.aivedioPlayer.errors")
            assert state == [], (state, browser.cdp.console())


LEVELS_JS = """(() => {
  const p = window.aivedioPlayer || {};
  return {levels: p.levels, hdrDisplay: p.hdrDisplay, codec: p.codec, errors: p.errors};
})()"""

# What a page on an HDR display is told by matchMedia("(dynamic-range: high)").
HDR_DISPLAY = """(() => {
  const asked = window.matchMedia.bind(window);
  const none = () => {};
  window.matchMedia = (query) => /dynamic-range:\\s*high/.test(query)
    ? {matches: true, media: query, onchange: null, addEventListener: none,
       removeEventListener: none, addListener: none, removeListener: none}
    : asked(query);
})();"""


@pytest.mark.skipif(
    not Path(chromium.CHROMIUM).exists(),
    reason="chromium is not installed (scripts/test installs it: ensure_chromium)",
)
@pytest.mark.timeout(240)
async def test_the_hdr10_rendition_is_offered_only_to_an_hdr_display(
    config: Config, pool: Pool, tmp_path: Path
) -> None:
    av1 = AV1Config(tenants=["acme"], hdr10=True)
    async with open_api(config, pool, tmp_path, av1=av1) as api:
        clip = mf.colour_tagged(tmp_path / "clip", transfer="smpte2084", seconds=5)
        asset_id = await api.publish(clip, timeout=180)
        play = await api.json("GET", f"/v1/videos/{asset_id}/playback")
        async with api.http.get(play["master_playlist"]) as resp:
            master = (await resp.read()).decode()
        assert "VIDEO-RANGE=PQ" in master and "VIDEO-RANGE=SDR" in master, master

        async with chromium.launch(tmp_path) as browser:
            # Headless chromium reports an SDR display: the HDR10 level is dropped.
            page = await browser.new_page()
            await page.navigate(play["watch_url"])
            await wait_for_playback(page, browser)
            state = await page.evaluate(LEVELS_JS)
            assert state["hdrDisplay"] is False and state["codec"] == "av1", state
            assert [level["range"] for level in state["levels"]] == ["SDR", "SDR"], state
            played = await segments_played(page, play["token"], api.base)
            assert played and not any("hdr10" in name for name in played), played
            assert state["errors"] == [], (state, browser.cdp.console())

            # On an HDR display it is kept beside the SDR AV1 levels, and hls.js starts on it.
            hdr = await browser.new_page()
            await hdr.send("Page.addScriptToEvaluateOnNewDocument", {"source": HDR_DISPLAY})
            await hdr.navigate(play["watch_url"])
            await wait_for_playback(hdr, browser)
            state = await hdr.evaluate(LEVELS_JS)
            assert state["hdrDisplay"] is True, state
            assert sorted(level["range"] for level in state["levels"]) == ["PQ", "SDR", "SDR"]
            played = await segments_played(hdr, play["token"], api.base)
            assert any("hdr10" in name for name in played), played
            assert state["errors"] == [], (state, browser.cdp.console())
