"""The player page in a real browser, and its refusals over HTTP.

A real clip goes through the real pipeline (tests/support/api_rig.py), the API serves it on
loopback, and Debian's chromium (headless, driven over the DevTools protocol:
tests/support/chromium.py) opens the watch URL from GET /v1/videos/{id}/playback. The test
waits until the video has played past 2 s, checks that hls.js played the master playlist
through the gateway, that the sprite thumbnails and the waveform loaded, and keeps a screenshot
as a test artifact (``$AIVEDIO_TEST_ARTIFACTS`` or ``var/test-artifacts/``,
``player-currentTime.png``).
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path
from typing import Any

import anyio
import pytest
import structlog
from multidict import CIMultiDict

from aivedio.api import player
from aivedio.api.tokens import TokenSigner
from aivedio.config.load import Config
from aivedio.store.database import Pool
from tests.support import chromium
from tests.support.api_rig import TOKEN_KEY, Api, open_api
from tests.support.media_fixtures import h264_720p

pytestmark = [pytest.mark.anyio, pytest.mark.integration]

PLAY_SECONDS = 2.0
PLAY_TIMEOUT = 60.0

STATE_JS = """(() => {
  const v = document.querySelector('video');
  const p = window.aivedioPlayer || {};
  return {currentTime: v ? v.currentTime : -1, paused: v ? v.paused : null,
          readyState: v ? v.readyState : null, currentSrc: v ? v.currentSrc : null,
          hlsAttachedAttr: v ? v.dataset.hlsAttached || null : null,
          mode: p.mode || null, hlsJs: !!p.hlsJs, hlsAttached: !!p.hlsAttached,
          errors: p.errors || null, notes: p.notes || null,
          thumbnails: p.thumbnails || 0, waveform: !!p.waveform};
})()"""

RESOURCES_JS = """performance.getEntriesByType('resource').map(
  e => ({name: e.name, initiator: e.initiatorType, status: e.responseStatus}))"""

PREVIEW_JS = """(() => {
  const t = document.getElementById('player-timeline').getBoundingClientRect();
  return {x: t.left + t.width * 0.6, y: t.top + t.height / 2};
})()"""

PREVIEW_STATE_JS = """(() => {
  const p = document.getElementById('player-preview');
  const i = document.getElementById('player-preview-image');
  return {hidden: p.hidden, image: i.style.backgroundImage, width: i.style.width};
})()"""


def artifacts() -> Path:
    root = os.environ.get("AIVEDIO_TEST_ARTIFACTS")
    path = Path(root) if root else Path(__file__).resolve().parents[2] / "var" / "test-artifacts"
    path.mkdir(parents=True, exist_ok=True)
    return path


async def get(api: Api, url: str, **headers: str) -> tuple[int, CIMultiDict[str], bytes]:
    async with api.http.get(url, headers=headers, allow_redirects=False) as resp:
        return resp.status, resp.headers.copy(), await resp.read()


async def wait_for_playback(
    page: chromium.Page, browser: chromium.Browser, seconds: float = PLAY_SECONDS
) -> dict[str, Any]:
    deadline = time.monotonic() + PLAY_TIMEOUT
    state: dict[str, Any] = {}
    while time.monotonic() < deadline:
        state = await page.evaluate(STATE_JS)
        if state["currentTime"] > seconds:
            return state
        await anyio.sleep(0.25)
    console = "\n".join(browser.cdp.console()[-40:])
    pytest.fail(
        f"the video never played past {seconds} s in {PLAY_TIMEOUT} s\n"
        f"player state: {state}\nconsole:\n{console}\nchromium:\n{browser.log_tail()}"
    )


@pytest.mark.skipif(
    not Path(chromium.CHROMIUM).exists(),
    reason="chromium is not installed (scripts/test installs it: ensure_chromium)",
)
@pytest.mark.timeout(180)
async def test_the_player_plays_the_published_hls_in_chromium(
    config: Config, pool: Pool, tmp_path: Path
) -> None:
    assert player.HLS_JS.exists(), f"hls.js is missing: {player.INSTALL_HINT}"
    async with open_api(config, pool, tmp_path) as api:
        asset_id = await api.publish(h264_720p(tmp_path / "clip", seconds=5))
        play = await api.json("GET", f"/v1/videos/{asset_id}/playback")
        for field in ("master_playlist", "mp4", "poster", "thumbnails_vtt", "waveform"):
            assert play.get(field), (field, play)
        status, headers, body = await get(api, play["watch_url"])
        assert status == 200, body[:500]
        assert headers["Content-Type"] == "text/html; charset=utf-8"
        assert headers["Cache-Control"] == "no-store"
        assert headers["X-Content-Type-Options"] == "nosniff"
        assert headers["Referrer-Policy"] == "no-referrer"
        csp = headers["Content-Security-Policy"]
        assert "default-src 'none'" in csp and "script-src 'self'" in csp
        assert "unsafe-inline" not in csp
        assert b"/static/hls.min.js?v=" in body and b"player-notice" not in body

        async with chromium.launch(tmp_path) as browser:
            page = await browser.new_page()
            await page.navigate(play["watch_url"])
            state = await wait_for_playback(page, browser)
            # hls.js played it through Media Source Extensions, not the MP4 fallback.
            assert state["mode"] == "hls.js", state
            assert state["hlsAttached"] and state["hlsAttachedAttr"] == "true", state
            assert state["currentSrc"].startswith("blob:"), state
            assert state["errors"] == [], state
            # The master playlist came through the playback gateway under the token.
            resources = await page.evaluate(RESOURCES_JS)
            master = f"{api.base}/media/{play['token']}/hls/master.m3u8"
            fetched = [r for r in resources if r["name"] == master]
            assert fetched and fetched[0]["status"] == 200, resources
            segments = [r for r in resources if r["name"].endswith(".m4s")]
            assert segments and all(r["status"] in (200, 206) for r in segments), resources
            assert not [r for r in resources if r["name"] == play["mp4"]], resources
            # Thumbnails and the waveform loaded; hovering the timeline shows a sprite tile.
            for _ in range(40):
                state = await page.evaluate(STATE_JS)
                if state["thumbnails"] and state["waveform"]:
                    break
                await anyio.sleep(0.25)
            assert state["thumbnails"] > 0 and state["waveform"], state
            point = await page.evaluate(PREVIEW_JS)
            await page.mouse_move(point["x"], point["y"])
            preview = await page.evaluate(PREVIEW_STATE_JS)
            assert not preview["hidden"] and "/sprites/" in preview["image"], preview
            png = await page.screenshot()
            shot = artifacts() / "player-currentTime.png"
            shot.write_bytes(png)
            assert png.startswith(b"\x89PNG\r\n\x1a\n") and shot.stat().st_size > 1000
            final = await page.evaluate(STATE_JS)
            assert final["errors"] == [], (final, browser.cdp.console())

            # Without hls.js the page still renders, says so, names the script installing it,
            # and plays without it.
            missing = tmp_path / "missing" / "hls.min.js"
            with pytest.MonkeyPatch.context() as patch, structlog.testing.capture_logs() as logs:
                patch.setattr(player, "HLS_JS", missing)
                status, headers, body = await get(api, play["watch_url"])
                assert status == 200 and b'id="player-notice"' in body, body[:2000]
                assert b"ensure_web_assets" in body and b"hls.min.js" not in body
                bare = await browser.new_page()
                await bare.navigate(play["watch_url"])
                state = await wait_for_playback(bare, browser, seconds=0.5)
            warnings = [e for e in logs if e["event"] == "hls_js_missing"]
            assert warnings and "ensure_web_assets" in warnings[0]["hint"], logs
            # Chromium plays HLS natively too; a browser with neither gets the MP4.
            assert state["mode"] in ("native-hls", "mp4") and not state["hlsJs"], state
            assert state["errors"] == [], (state, browser.cdp.console())


async def test_the_watch_page_refuses_bad_tokens(
    config: Config, pool: Pool, tmp_path: Path
) -> None:
    async with open_api(config, pool, tmp_path) as api:
        signer = TokenSigner.hs256(TOKEN_KEY)
        asset, other = uuid.uuid4(), uuid.uuid4()
        token, claims = signer.issue(api.rig.tenant_id, asset, 1, 600)
        header, body, mac = token.split(".")
        expired, _ = signer.issue(api.rig.tenant_id, asset, 1, -1)
        foreign, _ = TokenSigner.hs256(b"q" * 32).issue(api.rig.tenant_id, asset, 1, 600)
        refused = {
            "tampered": f"/watch/{asset}?token={header}.{body}.{mac[:-2]}AA",
            "forged claims": f"/watch/{asset}?token={header}.{body[:-2]}AA.{mac}",
            "expired": f"/watch/{asset}?token={expired}",
            "another key": f"/watch/{asset}?token={foreign}",
            "another asset": f"/watch/{other}?token={token}",
            "no token": f"/watch/{asset}",
            "garbage": f"/watch/{asset}?token=garbage",
            "not ascii": f"/watch/{asset}?token=abc.d%C3%A9f",
        }
        for what, path in refused.items():
            status, headers, answer = await get(api, api.base + path)
            assert status == 403, (what, status, answer)
            assert headers["Content-Type"].startswith("application/json"), what
        # A valid token of an asset that was never published: not found.
        assert (await get(api, f"{api.base}/watch/{asset}?token={token}"))[0] == 404
        assert (await get(api, f"{api.base}/watch/not-a-uuid?token={token}"))[0] == 404
        assert claims.asset_id == asset


async def test_static_files_are_served_from_a_fixed_list(
    config: Config, pool: Pool, tmp_path: Path
) -> None:
    assert player.HLS_JS.exists(), f"hls.js is missing: {player.INSTALL_HINT}"
    async with open_api(config, pool, tmp_path) as api:
        status, headers, body = await get(api, f"{api.base}/static/hls.min.js")
        assert status == 200 and body == player.HLS_JS.read_bytes()
        assert headers["Content-Type"].split(";")[0] in (
            "text/javascript",
            "application/javascript",
        )
        assert headers["X-Content-Type-Options"] == "nosniff"
        assert headers["Cache-Control"] == player.SHORT_CACHE
        url = await player.static_url("hls.min.js")
        assert url is not None
        status, headers, _ = await get(api, api.base + url)
        assert (status, headers["Cache-Control"]) == (200, player.LONG_CACHE)
        status, _, _ = await get(api, api.base + url, **{"If-None-Match": headers["ETag"]})
        assert status == 304
        described = player.PATHS["/static/{name}"]["get"]["parameters"][0]["schema"]["enum"]
        assert sorted(described) == sorted(player.static_files())
        for name in ("watch.js", "watch.css", "hls.worker.js", "hls.js-LICENSE.txt"):
            assert (await get(api, f"{api.base}/static/{name}"))[0] == 200, name
        for name in ("watch.html", "nope.js", "..%2Fplayer.py", "vendor%2Fhls.min.js"):
            assert (await get(api, f"{api.base}/static/{name}"))[0] == 404, name


async def test_the_page_without_hls_js_says_so_and_escapes_what_it_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(player, "HLS_JS", tmp_path / "missing" / "hls.min.js")
    files = {
        "hls": {"path": "hls/master.m3u8"},
        "playback": {"path": "playback.mp4"},
        "poster": {"path": 'poster"<x>.jpg'},
        "sprite": {"path": "sprites/</script><b>.vtt"},
    }
    asset = uuid.uuid4()
    page = await player.render_page(asset, 3, "tok.en", files)
    assert 'id="player-notice"' in page and "ensure_web_assets" in page
    assert "hls.min.js" not in page and "/static/watch.js?v=" in page
    assert '"hls":"/media/tok.en/hls/master.m3u8"' in page
    assert '"mp4":"/media/tok.en/playback.mp4"' in page
    assert 'poster="/media/tok.en/poster%22%3Cx%3E.jpg"' in page
    assert "</script><b>" not in page and "<b>" not in page
    assert page.count("</script>") == page.count("<script")
