"""Building blocks for the OpenAPI document the route modules describe themselves with.

Response bodies are msgspec Structs: the handler encodes the Struct and the document's schema
is generated from the same Struct (``msgspec.json.schema_components``), so the two cannot
drift apart. Each route module lists its Structs in ``SCHEMAS`` and its operations in
``PATHS``; ``openapi.py`` assembles them.
"""

from __future__ import annotations

from typing import Any

import msgspec
from aiohttp import web

REF = "#/components/schemas/{name}"
KEY_AUTH: list[dict[str, list[str]]] = [{"apiKey": []}]


class ErrorDetail(msgspec.Struct, frozen=True, omit_defaults=True):
    code: str
    detail: str
    # Where in the request the error is, when it is about one field: a JSON path such as
    # ``$.outputs[0].size``, or a header's name.
    field: str | None = None


class Error(msgspec.Struct, frozen=True):
    error: ErrorDetail


def ref(name: str | type) -> dict[str, str]:
    return {"$ref": REF.format(name=name if isinstance(name, str) else name.__name__)}


def json_content(schema: dict[str, Any] | type) -> dict[str, Any]:
    body = schema if isinstance(schema, dict) else ref(schema)
    return {"application/json": {"schema": body}}


_ERROR_TEXT = {
    400: "malformed request",
    401: "missing, unknown or revoked API key",
    403: "forbidden (signature or token refused)",
    404: "no such resource for this tenant",
    405: "method not allowed",
    408: "the body did not arrive in time",
    409: "conflicting state",
    410: "gone: the upload ended (expired, terminated or failed)",
    411: "Content-Length required",
    412: "Tus-Resumable is not 1.0.0 (Tus-Version says what is)",
    413: "body too large",
    415: "unsupported media type",
    416: "range not satisfiable",
    422: "well-formed but unacceptable",
    423: "locked: another request is writing to it; retry after Retry-After",
    460: "the body is not what its Upload-Checksum says; nothing of it was kept",
    503: "unavailable; retry later",
}


# Added by openapi.py to every operation a rate limit applies to (api/rate_limits.py).
RATE_LIMITED: dict[str, Any] = {
    "description": "a rate limit refused the request: retry after Retry-After seconds",
    "headers": {
        "Retry-After": {
            "required": True,
            "description": "whole seconds until a request may succeed",
            "schema": {"type": "integer", "minimum": 1},
        }
    },
    "content": json_content(Error),
}


# Added by openapi.py to every operation that needs an API key (api/auth.py).
KEY_REFUSED: dict[str, Any] = {
    "description": _ERROR_TEXT[401],
    "headers": {
        "WWW-Authenticate": {
            "required": True,
            "description": "the scheme to authenticate with: Bearer",
            "schema": {"type": "string"},
        }
    },
    "content": json_content(Error),
}
# What a route that reads a JSON body whole can refuse it with (api/bodies.py, the edge's
# decoder): malformed or out of the edge's bounds (400, naming the field), not whole in time
# (408), too large (413), not JSON (415), against the schema (422, naming the field).
JSON_BODY_ERRORS = (400, 408, 413, 415, 422)


def link(operation_id: str, description: str, parameters: dict[str, str]) -> dict[str, Any]:
    """An OpenAPI link: ``parameters`` maps the target's parameter names to runtime
    expressions such as ``$response.body#/video_id``."""
    return {"operationId": operation_id, "description": description, "parameters": parameters}


def responses(ok: dict[str, dict[str, Any]], *errors: int) -> dict[str, Any]:
    """``ok`` maps status codes to response objects; each error code gets the Error body."""
    out: dict[str, Any] = dict(ok)
    for status in errors:
        out[str(status)] = {"description": _ERROR_TEXT[status], "content": json_content(Error)}
    return out


def ok_json(schema: dict[str, Any] | type, description: str = "OK") -> dict[str, Any]:
    return {"description": description, "content": json_content(schema)}


# The header of api/idempotency.py, on every POST that creates something.
IDEMPOTENCY_KEY: dict[str, Any] = {
    "name": "Idempotency-Key",
    "in": "header",
    "required": False,
    "description": "The same key and request within 24 h answer the first answer again "
    "(Idempotent-Replayed: true) and create nothing more; the same key with another request "
    "is refused 422 (idempotency_key_reused), and 409 (idempotency_key_in_use) while the "
    "first one still runs.",
    "schema": {"type": "string", "minLength": 1, "maxLength": 255, "pattern": "^[!-~]+$"},
}


def path_param(name: str, description: str, *, uuid: bool = True) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string", "format": "uuid"} if uuid else {"type": "string"}
    return {
        "name": name,
        "in": "path",
        "required": True,
        "description": description,
        "schema": schema,
    }


def encode(value: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    """A Struct (or builtins) as a JSON response."""
    return web.Response(
        body=msgspec.json.encode(value),
        status=status,
        content_type="application/json",
        headers=headers,
    )
