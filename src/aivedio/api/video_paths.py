"""The OpenAPI description of the videos routes (``api/videos.py``, which serves them): what
each answers, and the links from an answer to where the video goes next."""

from __future__ import annotations

from typing import Any

from aivedio.api import schema
from aivedio.api.video_bodies import (
    CompleteVideo,
    CreateVideo,
    UploadReceived,
    VideoAccepted,
    VideoCreated,
    VideoStatus,
)

_ID = schema.path_param("video_id", "the video's id (also its asset's id)")
_GONE = {
    "410": {
        "description": "the upload session expired",
        "content": schema.json_content(schema.Error),
    }
}
_LOCATION = {
    "Location": {
        "required": True,
        "description": "the video's status URL",
        "schema": {"type": "string"},
    }
}
_VIDEO_ID = "$response.body#/video_id"
# Where a video goes next, from any answer that carries its id.
_VIDEO = {"video_id": _VIDEO_ID}
_AFTER_CREATE = {
    "uploadVideo": schema.link("uploadVideo", "send the bytes (stores without presigning)", _VIDEO),
    "completeVideo": schema.link("completeVideo", "confirm the upload", _VIDEO),
    "getVideoStatus": schema.link("getVideoStatus", "where it is", _VIDEO),
    "getVideoPlayback": schema.link("getVideoPlayback", "409 until it is published", _VIDEO),
}
_AFTER_COMPLETE = {
    "getVideoStatus": _AFTER_CREATE["getVideoStatus"],
    "getVideoPlayback": _AFTER_CREATE["getVideoPlayback"],
    "getAsset": schema.link("getAsset", "the asset made from the upload", {"asset_id": _VIDEO_ID}),
}
PATHS: dict[str, Any] = {
    "/v1/videos": {
        "post": {
            "summary": "Open an upload session for a video",
            "description": "Declare the file (exact size, SHA-256, type); the answer says where "
            "and how to send the bytes, which must then be confirmed with "
            "complete before the session expires. `size_bytes` over this API's "
            "limit (its schema's maximum) is refused 422, naming the field.",
            "operationId": "createVideo",
            "tags": ["videos"],
            "parameters": [schema.IDEMPOTENCY_KEY],
            "requestBody": {"required": True, "content": schema.json_content(CreateVideo)},
            "responses": schema.responses(
                {
                    "201": {
                        **schema.ok_json(
                            VideoCreated, "session open; send the bytes as `upload` says"
                        ),
                        "headers": _LOCATION,
                        "links": _AFTER_CREATE,
                    }
                },
                *schema.JSON_BODY_ERRORS,
                409,
            )
            | {
                "503": {
                    "description": "overloaded (the processing backlog is draining: try again "
                    "after Retry-After seconds) or the database is unavailable",
                    "headers": {
                        "Retry-After": {
                            "description": "seconds to wait",
                            "schema": {"type": "integer"},
                        }
                    },
                    "content": schema.json_content(schema.Error),
                }
            },
        }
    },
    "/v1/videos/{video_id}/upload": {
        "put": {
            "summary": "Send the bytes through the API (stores without presigned URLs)",
            "description": "The whole file as the body; it is kept only when its size and SHA-256 "
            "are the declared ones (else 422 `size_mismatch` or "
            "`checksum_mismatch`, and the session stays open for another try). "
            "Sessions on S3 upload to their presigned URLs instead (409 here). "
            "A body that sends nothing for `[api] body_read_timeout_seconds` is "
            "refused 408.",
            "operationId": "uploadVideo",
            "tags": ["videos"],
            "parameters": [_ID],
            "requestBody": {
                "required": True,
                "content": {
                    "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}
                },
            },
            "responses": schema.responses(
                {
                    "200": {
                        **schema.ok_json(UploadReceived, "stored and verified; complete next"),
                        "links": {"completeVideo": _AFTER_CREATE["completeVideo"]},
                    },
                    **_GONE,
                },
                400,
                404,
                408,
                409,
                422,
                503,
            ),
        }
    },
    "/v1/videos/{video_id}/complete": {
        "post": {
            "summary": "Confirm the upload and start processing",
            "description": "Verifies the object's size and SHA-256 against the declared ones, then "
            "creates the asset and its probe job. Idempotent.",
            "operationId": "completeVideo",
            "tags": ["videos"],
            "parameters": [_ID],
            "requestBody": {"required": False, "content": schema.json_content(CompleteVideo)},
            "responses": schema.responses(
                {
                    "202": {
                        **schema.ok_json(VideoAccepted, "verified; processing"),
                        "headers": _LOCATION,
                        "links": _AFTER_COMPLETE,
                    },
                    **_GONE,
                },
                *schema.JSON_BODY_ERRORS,
                404,
                409,
                503,
            ),
        }
    },
    "/v1/videos/{video_id}/status": {
        "get": {
            "summary": "The video's state and the timeline of its stages",
            "operationId": "getVideoStatus",
            "tags": ["videos"],
            "parameters": [_ID],
            "responses": schema.responses({"200": schema.ok_json(VideoStatus)}, 404, 503),
        }
    },
}
