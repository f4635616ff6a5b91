"""The bodies of the videos API (``api/videos.py``): what clients send and what they get.

msgspec Structs, so the handlers decode and encode them and the OpenAPI document's schemas
are generated from the same definitions.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Literal

import msgspec

from aivedio.pipeline.media.credentials import ContentCredentials
from aivedio.store import uploads
from aivedio.store.objects.s3_upload import MAX_PARTS
from aivedio.untrusted import whole

ContentType = Literal["video/mp4", "video/quicktime", "video/webm", "video/x-matroska"]
# Visible text: no control characters (PostgreSQL text cannot hold NUL either).
_TEXT = whole(r"^[^\x00-\x1f\x7f]*$")
_SHA256 = whole(r"^[0-9a-fA-F]{64}$")
_ETAG = whole(r"^[\x21-\x7e]+$")  # visible ASCII, as S3 answers them (quotes included)


# The client's own string on a video or a generation task (Mux's ``passthrough``), echoed
# in status, lists and every webhook; visible text, at most 255 characters.
Passthrough = Annotated[
    str,
    msgspec.Meta(
        min_length=1,
        max_length=255,
        pattern=_TEXT,
        description="your own string (an id of yours), echoed in status, lists and webhooks",
    ),
]


class CreateVideo(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """``POST /v1/videos``: what the client is about to upload."""

    size_bytes: Annotated[int, msgspec.Meta(ge=1, description="exact size of the file")]
    sha256: (
        Annotated[
            str,
            msgspec.Meta(
                pattern=_SHA256,
                description="SHA-256 of the file, hex: verified when given, computed when not",
            ),
        ]
        | None
    ) = None
    content_type: ContentType = "video/mp4"
    filename: Annotated[str, msgspec.Meta(min_length=1, max_length=255, pattern=_TEXT)] | None = (
        None
    )
    passthrough: Passthrough | None = None
    resumable: Annotated[
        bool,
        msgspec.Meta(
            description="send the bytes with tus 1.0 (PATCH /v1/uploads/{id}) and a one-time "
            "upload token instead of the API key: for browsers"
        ),
    ] = False


class CompletedPart(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    part_number: Annotated[int, msgspec.Meta(ge=1, le=MAX_PARTS)]
    etag: Annotated[str, msgspec.Meta(min_length=1, max_length=128, pattern=_ETAG)]


class CompleteVideo(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """``POST /v1/videos/{id}/complete``, optional. For a multipart upload, the parts with the
    ETags S3 answered to each part's PUT; without them the API asks S3 which parts arrived."""

    parts: (
        Annotated[list[CompletedPart], msgspec.Meta(min_length=1, max_length=MAX_PARTS)] | None
    ) = None


class UploadPart(msgspec.Struct, frozen=True):
    part_number: int
    url: str
    size_bytes: int


class UploadInstructions(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """How to send the bytes. ``PUT``: one request to ``url`` with exactly ``headers`` (and
    the file as the body). ``MULTIPART``: each part's bytes (``part_size`` each, the last
    one the rest) PUT to that part's ``url``; keep the ``ETag`` each answers for complete.
    ``TUS``: a tus 1.0 upload at ``url`` (HEAD it, PATCH the bytes; it completes with its
    last PATCH), sending ``headers``. ``credentials``: ``api_key`` means send your API key
    (``Authorization: Bearer …``) as on every API call; ``none`` means the URL is presigned:
    send no Authorization header; ``upload_token`` means ``headers`` carry a one-time token
    that opens this one upload only (hand it to the browser, never your API key)."""

    method: Literal["PUT", "MULTIPART", "TUS"]
    credentials: Literal["api_key", "none", "upload_token"]
    expires_at: datetime
    url: str | None = None
    headers: dict[str, str] = {}
    upload_id: str | None = None
    part_size: int | None = None
    parts: list[UploadPart] = []


class VideoCreated(msgspec.Struct, frozen=True, kw_only=True):
    video_id: uuid.UUID
    state: Literal["AWAITING_UPLOAD"]
    expires_at: datetime
    upload: UploadInstructions


class UploadReceived(msgspec.Struct, frozen=True, kw_only=True):
    """The bytes are stored and match the declared size and SHA-256; complete comes next."""

    video_id: uuid.UUID
    state: Literal["AWAITING_UPLOAD"]
    size_bytes: int
    sha256: str


class VideoAccepted(msgspec.Struct, frozen=True, kw_only=True):
    """The upload is verified and its asset exists; ``state`` is the asset's state now
    (QUARANTINED when just completed; a repeated complete shows how far it got)."""

    video_id: uuid.UUID
    state: str
    size_bytes: int
    sha256: str
    status_url: str


class TimelineEntry(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One event, oldest first. ``stage``: ``upload``, ``asset``, ``fetch``, a job kind
    (``probe``, ``render:playback``, ``moderate``, ``publish``…), ``publish`` for a release,
    or a phase of a job that did several stages' work (``probe:render``, ``probe:moderation``
    …, with its length in ``seconds``); ``event``: what happened (a job's status, a fetch
    outcome, ``released``, ``done``…)."""

    at: datetime
    stage: str
    event: str
    finished_at: datetime | None = None
    error_class: str | None = None
    source: str | None = None
    attempts: int | None = None
    bytes: int | None = None
    http_status: int | None = None
    revision: int | None = None
    previous_revision: int | None = None
    outputs: list[str] | None = None
    seconds: float | None = None


class UploadSummary(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    size_bytes: int
    content_type: str
    expires_at: datetime
    sha256: str | None = None
    filename: str | None = None
    received_bytes: int | None = None


class VideoStatus(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Before completion ``state`` is AWAITING_UPLOAD, UPLOAD_FAILED or UPLOAD_EXPIRED; after
    it, the asset's state (QUARANTINED, PROBING, PROCESSING, PLAYABLE, ENRICHED, INVALID_MEDIA,
    PROCESSING_FAILED, REJECTED, DELETED…). ``published_revision`` is the revision playback
    serves. ``upload`` is absent for videos that came from a provider, not an upload.
    ``progress`` is the render's progress in percent (as Cloudflare Stream's ``pctComplete``):
    its slowest running job's, 100 once ENRICHED, absent when nothing is rendering.
    ``content_credentials``: its C2PA provenance (the source's manifest, whether it verified
    and says AI-generated, and the platform's signing of what is published), absent until
    the source was probed."""

    video_id: uuid.UUID
    state: str
    timeline: list[TimelineEntry]
    published_revision: int | None = None
    moderation: str | None = None
    error_class: str | None = None
    error_detail: str | None = None
    upload: UploadSummary | None = None
    passthrough: str | None = None
    progress: float | None = None
    content_credentials: ContentCredentials | None = None


_SESSION_STATE = {
    uploads.AWAITING: "AWAITING_UPLOAD",
    uploads.FAILED: "UPLOAD_FAILED",
    uploads.EXPIRED: "UPLOAD_EXPIRED",
}


def upload_state(session: uploads.UploadSession) -> str:
    """A session not completed as ``VideoStatus.state`` shows it (a completed one shows its
    asset's state)."""
    return "UPLOAD_EXPIRED" if session.expired() else _SESSION_STATE[session.status]
