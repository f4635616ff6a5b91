"""``POST /v1/videos/{video_id}/tracks``: a caption or subtitle track attached to a
published video.

The body is JSON: the track's ``language`` (a BCP 47 tag), ``label``, ``kind``
(``captions`` or ``subtitles``), ``default`` and its text, ``content``, in WebVTT (a
``WEBVTT`` first line) or SRT. The text is untrusted and will be shown in pages, so it is
never stored as sent: ``pipeline/media/webvtt.py`` parses it and writes a new, clean WebVTT
file (only the WebVTT-safe tags, escaped text, valid timestamps, bounded cues and lines),
or refuses it 422 with a stable code and the line at fault. The track is published as a new
revision that carries the current one's outputs plus the track (``pipeline/
track_revision.py``); the answer names that revision and every track it has.

``Idempotency-Key`` is honoured as on the other POSTs that create something
(``api/idempotency.py``): a retried request answers the first answer and adds no second
track.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from aiohttp import web

from aivedio import untrusted
from aivedio.api import schema
from aivedio.api.auth import tenant_of
from aivedio.api.bodies import read_body
from aivedio.api.context import context
from aivedio.api.idempotency import idempotent
from aivedio.api.ids import path_uuid
from aivedio.api.problems import ApiError
from aivedio.errors import MalformedInputError
from aivedio.pipeline.media import webvtt
from aivedio.pipeline.media.text_tracks import Kind, Label, Language, TextTrack
from aivedio.pipeline.track_revision import NewTrack, TrackNotAdded, add_track

routes = web.RouteTableDef()

# A sidecar is a JSON string, so it is held to the edge's string bound (64 KiB: captions
# for an hour of speech, more than a generated video has) and, within it, to 2,000 cues.
CAPTION_LIMITS = webvtt.Limits(max_bytes=untrusted.API_BOUNDS.max_string_chars, max_cues=2000)
# The largest body read: the largest caption text, each character escaped in JSON at worst.
BODY_MAX_BYTES = 6 * CAPTION_LIMITS.max_bytes + 4096
_STATUS = {"not_found": 404, "not_published": 409, "revision_busy": 409, "no_hls": 409}


class AddTrack(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """``POST /v1/videos/{id}/tracks``: one caption or subtitle track."""

    language: Language
    label: Label
    kind: Kind = "subtitles"
    default: Annotated[
        bool, msgspec.Meta(description="players select this track unless told otherwise")
    ] = False
    content: Annotated[
        str,
        msgspec.Meta(
            min_length=1,
            max_length=CAPTION_LIMITS.max_bytes,
            description="the track's text, WebVTT (first line WEBVTT) or SRT, at most "
            f"{CAPTION_LIMITS.max_bytes} bytes of UTF-8, {CAPTION_LIMITS.max_cues} cues, "
            f"{CAPTION_LIMITS.max_lines_per_cue} lines per cue and "
            f"{CAPTION_LIMITS.max_line_chars} characters per line",
        ),
    ]


class Track(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    kind: Kind
    language: str
    label: str
    default: bool
    origin: str
    cues: int


class TrackAdded(msgspec.Struct, frozen=True, kw_only=True):
    video_id: str
    revision: Annotated[int, msgspec.Meta(description="the new revision, now the current one")]
    track: Track
    tracks: list[Track]


def public(track: TextTrack) -> Track:
    return Track(
        id=track.id,
        kind=track.kind,
        language=track.language,
        label=track.label,
        default=track.default,
        origin=track.origin,
        cues=track.cues,
    )


@routes.post("/v1/videos/{video_id}/tracks")
async def create_track(request: web.Request) -> web.StreamResponse:
    video = path_uuid(request, "video_id", "video")
    raw = await read_body(
        request,
        limit_bytes=BODY_MAX_BYTES,
        timeout_seconds=context(request).config.api.body_read_timeout_seconds,
    )
    return await idempotent(request, raw, lambda: _create_track(request, video, raw))


async def _create_track(request: web.Request, video: Any, raw: bytes) -> web.Response:
    ctx = context(request)
    body = _decode(request, raw)
    try:
        captions = webvtt.clean(body.content.encode(), CAPTION_LIMITS)
    except webvtt.CaptionsRefused as exc:
        raise ApiError(422, f"content: {exc.detail}", exc.reason, field="$.content") from None
    new = NewTrack(
        kind=body.kind,
        language=body.language,
        label=body.label,
        default=body.default,
        origin="sidecar",
        captions=captions,
    )
    try:
        added = await add_track(
            ctx.pool, ctx.store, ctx.config.ledger, tenant_of(request), video, new
        )
    except TrackNotAdded as exc:
        headers = {"Retry-After": str(exc.retry_after_seconds)} if exc.retry_after_seconds else None
        raise ApiError(_STATUS[exc.reason], exc.detail, exc.reason, headers=headers) from None
    return schema.encode(
        TrackAdded(
            video_id=str(video),
            revision=added.revision,
            track=public(added.track),
            tracks=[public(t) for t in added.tracks],
        ),
        status=201,
    )


def _decode(request: web.Request, raw: bytes) -> AddTrack:
    if not raw.strip():
        raise ApiError(400, "a JSON object is required as the request body")
    media_type = request.content_type
    if request.headers.get("Content-Type") is not None and not (
        media_type == "application/json" or media_type.endswith("+json")
    ):
        raise ApiError(415, f"the body must be application/json, not {media_type}")
    try:
        return untrusted.decode(raw, AddTrack)
    except MalformedInputError as exc:
        if exc.reason == "invalid_field":
            raise ApiError(422, f"request body: {exc.detail}", field=exc.field) from None
        raise ApiError(400, f"request body: {exc.detail}", exc.reason, field=exc.field) from None


PATHS: dict[str, Any] = {
    "/v1/videos/{video_id}/tracks": {
        "post": {
            "summary": "Attach a caption or subtitle track to a published video",
            "description": "The text (WebVTT or SRT) is parsed and written again as clean "
            "WebVTT: only the WebVTT tags b, i, u, c, v, lang, ruby and rt are kept, "
            "everything else is escaped text. Text that cannot be made into a track is "
            "refused 422 with a code (`binary`, `not_utf8`, `too_large`, "
            "`invalid_timestamp`, `too_many_cues`, `line_too_long`, `too_many_lines`, "
            "`no_cues`) and the line at fault. The track is published as a new revision "
            "carrying the current outputs plus the track: a SUBTITLES group in the HLS "
            "master playlist, a `tracks` entry in the playback answer and a <track> in the "
            "player page. 409 while the video is not published (`not_published`), has no "
            "HLS output (`no_hls`) or is still being made (`revision_busy`, with "
            "Retry-After).",
            "operationId": "createVideoTrack",
            "tags": ["videos"],
            "parameters": [
                schema.path_param("video_id", "the video (asset) id"),
                schema.IDEMPOTENCY_KEY,
            ],
            "requestBody": {"required": True, "content": schema.json_content(AddTrack)},
            "responses": schema.responses(
                {"201": schema.ok_json(TrackAdded, "published in a new revision")},
                *schema.JSON_BODY_ERRORS,
                404,
            )
            | {
                "409": {
                    "description": "not published, no HLS output, or still being made "
                    "(retry after Retry-After)",
                    "headers": {
                        "Retry-After": {
                            "description": "seconds to wait, when waiting helps",
                            "schema": {"type": "integer"},
                        }
                    },
                    "content": schema.json_content(schema.Error),
                }
            },
        }
    }
}
SCHEMAS: tuple[type, ...] = (AddTrack, Track, TrackAdded)
