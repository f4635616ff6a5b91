"""``GET /openapi.json``: the OpenAPI 3.1 document, assembled from the route modules."""

from __future__ import annotations

import functools
from typing import Any

import msgspec
from aiohttp import web

from aivedio import __version__
from aivedio.api import rate_limits, schema

routes = web.RouteTableDef()

PATHS: dict[str, Any] = {
    "/openapi.json": {
        "get": {
            "summary": "This document",
            "tags": ["operations"],
            "security": [],
            "operationId": "getOpenApi",
            "responses": {"200": schema.ok_json({"type": "object"})},
        }
    },
}
SCHEMAS: tuple[type, ...] = ()


@functools.cache
def document() -> bytes:
    from aivedio.api.app import ROUTE_MODULES

    paths: dict[str, Any] = {}
    structs: list[type] = [schema.Error]
    for module in ROUTE_MODULES:
        paths.update(getattr(module, "PATHS", {}))
        structs.extend(getattr(module, "SCHEMAS", ()))
    paths = {path: _rate_limited(path, item) for path, item in paths.items()}
    _, components = msgspec.json.schema_components(structs, ref_template=schema.REF)
    doc = {
        "openapi": "3.1.0",
        "info": {
            "title": "aivedio",
            "version": __version__,
            "description": "Provider callbacks, uploads, status, events and signed playback.",
        },
        "servers": [{"url": "/"}],
        "paths": dict(sorted(paths.items())),
        "components": {
            "schemas": components,
            "securitySchemes": {
                "apiKey": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "An API key: av_live_… or av_test_…",
                },
            },
        },
        "security": schema.KEY_AUTH,
    }
    return msgspec.json.encode(doc)


def _rate_limited(path: str, item: dict[str, Any]) -> dict[str, Any]:
    """The path's operations, each with its 429 unless no rate limit applies to the path."""
    if path in rate_limits.NEVER_LIMITED:
        return item
    return {
        method: {**op, "responses": {**op["responses"], "429": schema.RATE_LIMITED}}
        for method, op in item.items()
    }


@routes.get("/openapi.json")
async def openapi_json(_request: web.Request) -> web.Response:
    return web.Response(body=document(), content_type="application/json")
