"""The OpenAPI description of the tus routes (``api/tus.py``, which serves them)."""

from __future__ import annotations

from typing import Any

import msgspec

from aivedio.api import schema
from aivedio.api.tus_protocol import EXTENSIONS, METADATA_MAX_BYTES, VERSION


class UploadCreated(msgspec.Struct, frozen=True, kw_only=True):
    """``POST /v1/uploads``: the upload's video and how far it got (tus clients read the
    headers; the body is for everyone else)."""

    video_id: str
    upload_url: str
    upload_offset: int
    expires_at: str


_B64 = (
    r"(?:[A-Za-z0-9+/]{4})*"
    r"(?:[A-Za-z0-9+/][AQgw]==|[A-Za-z0-9+/]{2}[AEIMQUYcgkosw048]=)?"
)
_PAIR = rf"[!-+\--~]{{1,64}}(?: {_B64})?"
_ID = schema.path_param("video_id", "the upload's id: its video's id")


def _header(name: str, description: str, value: dict[str, Any], *, required: bool) -> Any:
    return {
        "name": name,
        "in": "header",
        "required": required,
        "description": description,
        "schema": value,
    }


_VERSION = _header(
    "Tus-Resumable",
    "the protocol version: 1.0.0 (else 412)",
    {"type": "string", "enum": [VERSION]},
    required=True,
)
_OFFSET_VALUE = {"type": "integer", "minimum": 0, "maximum": 2**63 - 1}
_OFFSET = _header(
    "Upload-Offset",
    "where these bytes start: the offset HEAD answered",
    _OFFSET_VALUE,
    required=True,
)
_CHECKSUM = _header(
    "Upload-Checksum",
    "`sha256 <base64 of the body's SHA-256>`: a body of other bytes is refused 460 and "
    "nothing of it is kept; another algorithm is 400",
    {"type": "string", "pattern": r"^sha256 [A-Za-z0-9+/]{43}=$"},
    required=False,
)
_TUS_HEADERS = {
    "Tus-Resumable": {"description": "1.0.0", "schema": {"type": "string"}},
    "Upload-Offset": {
        "description": "the bytes stored for good",
        "schema": {"type": "integer", "minimum": 0},
    },
    "Upload-Expires": {
        "description": "when the upload expires unless more bytes arrive (HTTP date)",
        "schema": {"type": "string"},
    },
}
_ERRORS = (400, 404, 409, 410, 412, 503)
_BYTES = {"application/offset+octet-stream": {"schema": {"type": "string", "format": "binary"}}}
_TAGS = ["uploads"]

PATHS: dict[str, Any] = {
    "/v1/uploads": {
        "options": {
            "summary": "What this tus server supports",
            "description": f"tus discovery (and a browser's CORS preflight): Tus-Version "
            f"{VERSION}, Tus-Extension `{EXTENSIONS}`, Tus-Max-Size, Tus-Checksum-Algorithm "
            "sha256. No credential needed.",
            "operationId": "discoverUploads",
            "tags": _TAGS,
            "security": [],
            "responses": {"204": {"description": "the server's capabilities, in its headers"}},
        },
        "post": {
            "summary": "Open a resumable upload (tus creation)",
            "description": "Opens a video whose bytes arrive with tus 1.0 PATCHes, with the API "
            "key, or answers the upload an upload token opens (from POST /v1/videos with "
            "`resumable`). `Upload-Metadata` may carry `filename`, `filetype` (video/mp4, "
            "video/quicktime, video/webm, video/x-matroska), `passthrough` and `sha256` (hex: "
            "the file is verified against it). A body "
            "(`application/offset+octet-stream`, creation-with-upload) is the first bytes. "
            "`Upload-Length` over the limit is 413; `Upload-Defer-Length` and `Upload-Concat` "
            "are not supported (400).",
            "operationId": "createUpload",
            "tags": _TAGS,
            "parameters": [
                _VERSION,
                _header(
                    "Upload-Length",
                    "the file's exact size in bytes",
                    {"type": "integer", "minimum": 1, "maximum": 2**63 - 1},
                    required=True,
                ),
                _header(
                    "Upload-Metadata",
                    "comma-separated `key base64(value)` pairs, each key once, at most "
                    f"{METADATA_MAX_BYTES} bytes",
                    {
                        "type": "string",
                        "maxLength": METADATA_MAX_BYTES,
                        "pattern": rf"^{_PAIR}(?:,{_PAIR})*$",
                    },
                    required=False,
                ),
                _CHECKSUM,
                schema.IDEMPOTENCY_KEY,
            ],
            "requestBody": {"required": False, "content": _BYTES},
            "responses": schema.responses(
                {
                    "201": {
                        **schema.ok_json(UploadCreated, "opened; PATCH the bytes to Location"),
                        "headers": {
                            **_TUS_HEADERS,
                            "Location": {
                                "required": True,
                                "description": "the upload's URL",
                                "schema": {"type": "string"},
                            },
                        },
                    }
                },
                *_ERRORS,
                408,
                413,
                415,
                422,
                423,
                460,
            ),
        },
    },
    "/v1/uploads/{video_id}": {
        "options": {
            "summary": "What this tus server supports",
            "description": "As OPTIONS /v1/uploads (for CORS preflights of an upload's URL).",
            "operationId": "discoverUpload",
            "tags": _TAGS,
            "security": [],
            "parameters": [_ID],
            "responses": {"204": {"description": "the server's capabilities, in its headers"}},
        },
        "head": {
            "summary": "How many bytes of the upload are stored",
            "description": "Upload-Offset is where to resume; Upload-Length the file's size "
            "(a completed upload answers its full length).",
            "operationId": "getUploadOffset",
            "tags": _TAGS,
            "parameters": [_ID, _VERSION],
            "responses": schema.responses(
                {"200": {"description": "its offset, in the headers", "headers": _TUS_HEADERS}},
                *_ERRORS,
            ),
        },
        "patch": {
            "summary": "Append bytes to the upload",
            "description": "The body is appended at Upload-Offset, which must be the stored "
            "offset (409 otherwise: HEAD and resume). One PATCH at a time (423). A body cut "
            "short without Upload-Checksum is kept as far as it arrived. The last byte "
            "completes the upload: the video's processing starts, as after complete.",
            "operationId": "appendUpload",
            "tags": _TAGS,
            "parameters": [_ID, _VERSION, _OFFSET, _CHECKSUM],
            "requestBody": {"required": True, "content": _BYTES},
            "responses": schema.responses(
                {"204": {"description": "stored; the new offset", "headers": _TUS_HEADERS}},
                *_ERRORS,
                408,
                413,
                415,
                422,
                423,
                460,
            ),
        },
        "delete": {
            "summary": "Terminate the upload",
            "description": "The upload ends and what it stored is removed (a completed one is "
            "a video now: 409).",
            "operationId": "terminateUpload",
            "tags": _TAGS,
            "parameters": [_ID, _VERSION],
            "responses": schema.responses(
                {"204": {"description": "terminated", "headers": _TUS_HEADERS}}, *_ERRORS, 423
            ),
        },
    },
}
