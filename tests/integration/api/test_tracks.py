"""``POST /v1/videos/{id}/tracks`` against the API on loopback (real PostgreSQL, the local
store) with a video the real pipeline published: the track is judged from what is served
through the playback gateway (the master playlist's attributes, ffprobe of the HLS and of
the WebVTT file, the file's own text), never from our rows."""

from __future__ import annotations

import io
import json
import re
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urljoin

import anyio
import pytest

from aivedio.config.load import Config
from aivedio.store.database import Pool
from tests.support.api_rig import Api, open_api, published
from tests.support.caption_media import (
    FRIENDLY_SRT,
    GOOD_VTT,
    HOSTILE_SRT,
    clip_with_mov_text,
    probe,
)
from tests.support.media_fixtures import h264_720p
from tests.support.pipeline_rig import running_worker

pytestmark = [pytest.mark.anyio, pytest.mark.integration, pytest.mark.timeout(240)]


def body(content: str, language: str = "en", **more: Any) -> dict[str, Any]:
    return {"language": language, "label": f"Label {language}", "content": content, **more}


async def post(
    api: Api,
    video: uuid.UUID | str,
    payload: Any,
    *,
    key: str | None = None,
    api_key: str | None = None,
) -> tuple[int, dict[str, str], dict[str, Any]]:
    headers = {**api.auth(api_key), "Content-Type": "application/json"}
    if key is not None:
        headers["Idempotency-Key"] = key
    data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    url = f"{api.base}/v1/videos/{video}/tracks"
    sent = io.BytesIO(data) if len(data) > 1024 * 1024 else data
    async with api.http.post(url, data=sent, headers=headers) as resp:
        raw = await resp.read()
        return resp.status, dict(resp.headers), json.loads(raw) if raw else {}


async def text(api: Api, url: str) -> str:
    async with api.http.get(url) as resp:
        assert resp.status == 200, (url, resp.status)
        return (await resp.read()).decode()


def attributes(line: str) -> dict[str, str]:
    return {k: v.strip('"') for k, v in re.findall(r'([A-Z-]+)=("[^"]*"|[^,]*)', line)}


async def test_a_sidecar_track_is_published_in_a_new_revision_served_by_the_gateway(
    config: Config, pool: Pool, tmp_path: Path
) -> None:
    async with open_api(config, pool, tmp_path) as api:
        video = await api.publish(h264_720p(tmp_path / "clip", seconds=4))
        before = await api.json("GET", f"/v1/videos/{video}/playback")
        assert before["tracks"] == []
        old_master = await text(api, before["master_playlist"])

        status, _, added = await post(api, video, body(HOSTILE_SRT, kind="captions"))
        assert status == 201, added
        assert added["revision"] == before["revision"] + 1
        assert added["track"]["cues"] == 2 and added["track"]["origin"] == "sidecar"

        play = await api.json("GET", f"/v1/videos/{video}/playback")
        assert play["revision"] == added["revision"]
        (track,) = play["tracks"]
        assert track["url"].startswith(f"{api.base}/media/{play['token']}/hls/text/")
        assert (track["language"], track["kind"], track["label"]) == ("en", "captions", "Label en")

        # The WebVTT file as served: clean text, the cues at their times.
        async with api.http.get(track["url"]) as resp:
            assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/vtt")
            vtt = (await resp.read()).decode()
        assert vtt.startswith("WEBVTT\n")
        assert "<script" not in vtt and "<img" not in vtt and "<font" not in vtt
        assert "<i>kept</i>" in vtt and "&lt;b&gt;not a tag&lt;/b&gt;" in vtt
        assert re.findall(r"^(\S+) --> (\S+)", vtt, re.M) == [
            ("00:00:01.000", "00:00:02.500"),
            ("00:00:03.000", "00:00:04.000"),
        ]
        vtt_file = tmp_path / "served.vtt"
        vtt_file.write_text(vtt)
        packets = probe(vtt_file, "-show_streams", "-show_packets")
        assert packets["streams"][0]["codec_name"] == "webvtt"
        assert [(p["pts_time"], p["duration_time"]) for p in packets["packets"]] == [
            ("1.000000", "1.500000"),
            ("3.000000", "1.000000"),
        ]

        # The master playlist: the group, its attributes, SUBTITLES on every variant.
        master = await text(api, play["master_playlist"])
        media = [
            attributes(line) for line in master.splitlines() if line.startswith("#EXT-X-MEDIA:")
        ]
        assert len(media) == 1
        assert {
            k: media[0][k]
            for k in ("TYPE", "GROUP-ID", "LANGUAGE", "NAME", "DEFAULT", "AUTOSELECT")
        } == {
            "TYPE": "SUBTITLES",
            "GROUP-ID": "subs",
            "LANGUAGE": "en",
            "NAME": "Label en",
            "DEFAULT": "NO",
            "AUTOSELECT": "YES",
        }
        variants = [line for line in master.splitlines() if line.startswith("#EXT-X-STREAM-INF:")]
        assert variants and all(attributes(v)["SUBTITLES"] == "subs" for v in variants)
        assert [attributes(v)["CODECS"] for v in variants] == [
            attributes(v)["CODECS"]
            for v in old_master.splitlines()
            if v.startswith("#EXT-X-STREAM-INF:")
        ]
        # The group's URI, resolved against the master, is the track's subtitle playlist:
        # ffprobe reads it through the gateway (in a thread: the API answering it runs on
        # this event loop) and finds the WebVTT stream with its two cues.
        subtitles = urljoin(play["master_playlist"], media[0]["URI"])
        assert subtitles == track["playlist"]
        found = await anyio.to_thread.run_sync(
            lambda: probe(subtitles, "-show_streams", "-show_packets")
        )
        assert [s["codec_name"] for s in found["streams"]] == ["webvtt"]
        assert [p["pts_time"] for p in found["packets"]] == ["1.000000", "3.000000"]
        # The revision it replaced still plays as it was: its token, its master, unchanged.
        assert await text(api, before["master_playlist"]) == old_master
        assert "SUBTITLES" not in old_master

        # A second track, default: it takes the default; both are in the group.
        status, _, second = await post(api, video, body(GOOD_VTT, "pt-BR", default=True))
        assert status == 201, second
        assert [(t["language"], t["default"]) for t in second["tracks"]] == [
            ("en", False),
            ("pt-BR", True),
        ]
        play = await api.json("GET", f"/v1/videos/{video}/playback")
        master = await text(api, play["master_playlist"])
        media = [
            attributes(line) for line in master.splitlines() if line.startswith("#EXT-X-MEDIA:")
        ]
        assert [(m["LANGUAGE"], m["DEFAULT"]) for m in media] == [("en", "NO"), ("pt-BR", "YES")]
        vtt = await text(api, play["tracks"][1]["url"])
        assert "<v Narrator>Caption at one second</v>" in vtt and "url(" not in vtt
        # Every output of the revision before is still there, through the new token.
        for field in ("mp4", "poster", "thumbnails_vtt", "waveform"):
            if before.get(field):
                assert (
                    play[field]
                    and play[field].split("/media/")[1].split("/", 1)[1]
                    == (before[field].split("/media/")[1].split("/", 1)[1])
                )
                async with api.http.head(play[field]) as resp:
                    assert resp.status == 200, field
        # The player page links each track.
        page = await text(api, play["watch_url"])
        assert page.count("<track ") == 2 and 'srclang="pt-BR"' in page


async def test_an_idempotency_key_adds_one_track_however_often_it_is_sent(
    config: Config, pool: Pool, tmp_path: Path
) -> None:
    async with open_api(config, pool, tmp_path) as api:
        video = await published(api)
        payload = body("1\n00:00:00,000 --> 00:00:00,900\nhi\n")
        first = await post(api, video, payload, key="track-1")
        again = await post(api, video, payload, key="track-1")
        assert first[0] == again[0] == 201 and again[1]["Idempotent-Replayed"] == "true"
        assert again[2] == first[2]
        other = await post(
            api, video, body("1\n00:00:00,000 --> 00:00:00,900\nbye\n"), key="track-1"
        )
        assert other[0] == 422 and other[2]["error"]["code"] == "idempotency_key_reused"
        play = await api.json("GET", f"/v1/videos/{video}/playback")
        assert len(play["tracks"]) == 1 and play["revision"] == first[2]["revision"]


@pytest.mark.parametrize(
    ("payload", "status", "code", "field"),
    [
        (body("WEBVTT\n\n00:01.5 --> 00:02.000\nx\n"), 422, "invalid_timestamp", "$.content"),
        (
            body("1\n00:00:05,000 --> 00:00:01,000\nbackwards\n"),
            422,
            "invalid_timestamp",
            "$.content",
        ),
        (
            body("WEBVTT\n\n" + "00:01.000 --> 00:02.000\nx\n\n" * 2001),
            422,
            "too_many_cues",
            "$.content",
        ),
        (
            body("1\n00:00:01,000 --> 00:00:02,000\n" + "y" * 501 + "\n"),
            422,
            "line_too_long",
            "$.content",
        ),
        (body("\x01\x02\x7f\x80binary\x1b"), 422, "invalid_timestamp", "$.content"),
        (body("1\n00:00:01,000 --> 00:00:02,000\nnul\x00\n"), 400, "nul_character", None),
        (body("x" * (64 * 1024 + 1)), 400, "too_long", "$.content"),
        (body("é" * (64 * 1024 - 10)), 422, "too_large", "$.content"),
        (
            body("1\n00:00:01,000 --> 00:00:02,000\nx\n", "english!"),
            422,
            "unprocessable",
            "$.language",
        ),
        (
            body("1\n00:00:01,000 --> 00:00:02,000\nx\n", label='a"b'),
            422,
            "unprocessable",
            "$.label",
        ),
        (
            body("1\n00:00:01,000 --> 00:00:02,000\nx\n", kind="chapters"),
            422,
            "unprocessable",
            "$.kind",
        ),
        (b"\x89PNG\r\n\x1a\n\x00\x00", 400, None, None),
    ],
)
async def test_hostile_and_malformed_tracks_are_refused_clearly(
    config: Config,
    pool: Pool,
    tmp_path: Path,
    payload: Any,
    status: int,
    code: str | None,
    field: str | None,
) -> None:
    async with open_api(config, pool, tmp_path) as api:
        video = await published(api)
        got, _, answer = await post(api, video, payload)
        assert got == status, answer
        if code is not None:
            assert answer["error"]["code"] == code, answer
        if field is not None:
            assert answer["error"]["field"] == field, answer
        revisions = await pool.fetchval(
            "SELECT count(*) FROM asset_revisions WHERE asset_id = $1", video
        )
        assert revisions == 1  # nothing was published


async def test_only_the_owner_and_only_a_published_video_get_a_track(
    config: Config, pool: Pool, tmp_path: Path
) -> None:
    async with open_api(config, pool, tmp_path) as api:
        video = await published(api)
        payload = body("1\n00:00:01,000 --> 00:00:02,000\nx\n")
        _, other_key = await api.tenant("other")
        got, _, answer = await post(api, video, payload, api_key=other_key)
        assert got == 404, answer
        got, _, answer = await post(api, uuid.uuid4(), payload)
        assert got == 404, answer
        await pool.execute("UPDATE assets SET status = 'DELETED' WHERE id = $1", video)
        got, _, answer = await post(api, video, payload)
        assert got == 404, answer


async def test_a_mov_text_stream_of_the_source_is_published_as_a_track(
    config: Config, pool: Pool, tmp_path: Path
) -> None:
    srt = FRIENDLY_SRT + "\n3\n00:00:03,600 --> 00:00:03,900\n<script>alert(1)</script>tail\n"
    clip = clip_with_mov_text(tmp_path / "clip", srt)
    streams = probe(clip, "-show_streams")["streams"]
    assert [s["codec_name"] for s in streams if s["codec_type"] == "subtitle"] == ["mov_text"]
    async with open_api(config, pool, tmp_path) as api:
        video = await api.publish(clip)
        play = await api.json("GET", f"/v1/videos/{video}/playback")
        (track,) = play["tracks"]
        assert (track["language"], track["kind"], track["default"]) == ("eng", "subtitles", True)
        vtt = await text(api, track["url"])
        assert re.findall(r"^(\S+) --> (\S+)", vtt, re.M) == [
            ("00:00:00.500", "00:00:01.800"),
            ("00:00:02.000", "00:00:03.500"),
            ("00:00:03.600", "00:00:03.900"),
        ]
        assert "Hello" in vtt and "Second line &amp; more" in vtt and "<script" not in vtt
        master = await text(api, play["master_playlist"])
        media = [attributes(x) for x in master.splitlines() if x.startswith("#EXT-X-MEDIA:")]
        assert [(m["TYPE"], m["LANGUAGE"], m["DEFAULT"]) for m in media] == [
            ("SUBTITLES", "eng", "YES")
        ]
        variants = [x for x in master.splitlines() if x.startswith("#EXT-X-STREAM-INF:")]
        assert variants and all(attributes(v)["SUBTITLES"] == "subs" for v in variants)
        subtitles = urljoin(play["master_playlist"], media[0]["URI"])
        found = await anyio.to_thread.run_sync(
            lambda: probe(subtitles, "-show_streams", "-show_packets")
        )
        assert [s["codec_name"] for s in found["streams"]] == ["webvtt"]
        assert [p["pts_time"] for p in found["packets"]] == ["0.500000", "2.000000", "3.600000"]
        # A sidecar added later joins the source's track in the new revision.
        status, _, added = await post(api, video, body(GOOD_VTT, "fr"))
        assert status == 201, added
        assert [(t["origin"], t["language"]) for t in added["tracks"]] == [
            ("source", "eng"),
            ("sidecar", "fr"),
        ]


async def test_captions_a_provider_reported_are_published_as_a_track(
    config: Config, pool: Pool, tmp_path: Path
) -> None:
    clip = h264_720p(tmp_path / "clip", seconds=3)
    async with open_api(config, pool, tmp_path) as api:
        asset = await api.rig.quarantine(clip.read_bytes(), task=("sim", "captioned-task"))
        # As intake records them (pipeline/intake.py), from the adapter's ProviderCaption.
        captions = [
            {
                "language": "de",
                "label": "Deutsch",
                "kind": "captions",
                "default": False,
                "text": HOSTILE_SRT,
            },
            {"language": "not a tag!", "label": "", "text": "garbage without timing"},
        ]
        await pool.execute(
            "UPDATE provider_outputs SET captions = $1::jsonb WHERE id ="
            " (SELECT source_provider_output_id FROM assets WHERE id = $2)",
            captions,
            asset,
        )
        await api.rig.enqueue_probe(asset)
        async with running_worker(api.rig):
            await api.wait_state(asset, ("PLAYABLE", "ENRICHED"))
            await api.rig.wait_idle(asset)
        play = await api.json("GET", f"/v1/videos/{asset}/playback")
        # The garbage one is left out; the other is published, cleaned.
        assert [(t["language"], t["kind"], t["label"]) for t in play["tracks"]] == [
            ("de", "captions", "Deutsch")
        ]
        vtt = await text(api, play["tracks"][0]["url"])
        assert "<script" not in vtt and "<i>kept</i>" in vtt
        master = await text(api, play["master_playlist"])
        assert 'LANGUAGE="de"' in master and 'SUBTITLES="subs"' in master


async def test_tracks_added_at_once_are_both_published(
    config: Config, pool: Pool, tmp_path: Path
) -> None:
    async with open_api(config, pool, tmp_path) as api:
        video = await published(api)
        answers: dict[str, tuple[int, dict[str, str], dict[str, Any]]] = {}

        async def add(language: str) -> None:
            cue = f"1\n00:00:00,000 --> 00:00:00,900\n{language}\n"
            answers[language] = await post(api, video, body(cue, language))

        async with anyio.create_task_group() as group:
            for language in ("en", "fr", "de"):
                group.start_soon(add, language)
        assert all(status == 201 for status, _, _ in answers.values()), answers
        play = await api.json("GET", f"/v1/videos/{video}/playback")
        # Each was published on top of the others: the last revision has all three.
        assert sorted(t["language"] for t in play["tracks"]) == ["de", "en", "fr"]
        assert play["revision"] == 4
        master = await text(api, play["master_playlist"])
        assert master.count("#EXT-X-MEDIA:TYPE=SUBTITLES") == 3
        states = await pool.fetch(
            "SELECT revision, status FROM asset_revisions WHERE asset_id = $1 ORDER BY revision",
            video,
        )
        assert [(r["revision"], r["status"]) for r in states] == [
            (1, "SUPERSEDED"),
            (2, "SUPERSEDED"),
            (3, "SUPERSEDED"),
            (4, "READY"),
        ]
