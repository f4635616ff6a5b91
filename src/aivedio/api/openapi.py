"""``GET /openapi.json``: the OpenAPI 3.1 document, assembled from the route modules
(``route_modules.ROUTE_MODULES``) and this module's own route.

The document promises what this deployment answers, so a client (or a fuzzer) that follows it
is never refused for something it could not have known:

* **The edge's bounds** are stated on every request body's schema, since every body is
  decoded by ``untrusted.decode``: integers within 64 bits, strings without NUL and no longer
  than the edge allows. (Integral floats such as ``10.0`` are integers to JSON Schema and to
  the decoder alike.)
* **Configured limits**: ``size_bytes`` of ``POST /v1/videos`` has the configured
  ``[api] upload_max_bytes`` as its maximum, so the document served is per configuration.
* **Answers every operation shares** are added here, where the mechanism lives: 401 (with its
  challenge) and 503 (the key cannot be looked up) on every operation that needs an API key,
  and 429 with ``Retry-After`` on every rate-limited one while rate limits are on.
"""

from __future__ import annotations

import functools
from typing import Any

import msgspec
from aiohttp import web

from aivedio import __version__, untrusted
from aivedio.api import rate_limits, schema
from aivedio.api.context import context
from aivedio.api.route_modules import ROUTE_MODULES
from aivedio.config.api import ApiConfig

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
# Where the configured upload limit is stated: (component, property).
UPLOAD_SIZE = ("CreateVideo", "size_bytes")
# Text the edge accepts (untrusted.check_tree): anything but NUL.
NO_NUL = "^[^\\x00]*$"
_SCHEMA_KEYWORDS = ("anyOf", "oneOf", "allOf", "prefixItems")


def document(api: ApiConfig) -> bytes:
    """The document as this configuration serves it."""
    return _document(api.upload_max_bytes, api.rate_limits.enabled)


@functools.cache
def _document(upload_max_bytes: int, rate_limited: bool) -> bytes:
    paths: dict[str, Any] = {}
    structs: list[type] = [schema.Error]
    for module in ROUTE_MODULES:
        # A path's methods may come from several modules (POST /v1/videos creates, GET
        # lists); one method of one path from two is a mistake.
        for path, methods in getattr(module, "PATHS", {}).items():
            twice = set(methods) & set(paths.get(path, {}))
            if twice:
                raise ValueError(f"{path}: {sorted(twice)} described twice")
            paths.setdefault(path, {}).update(methods)
        structs.extend(getattr(module, "SCHEMAS", ()))
    paths.update(PATHS)  # this document's own route, served after the others
    structs.extend(SCHEMAS)
    paths = {path: _shared_answers(path, item, rate_limited) for path, item in paths.items()}
    _, components = msgspec.json.schema_components(structs, ref_template=schema.REF)
    for name in _request_components(paths, components):
        _edge_bounds(components[name])
    component, field = UPLOAD_SIZE
    components[component]["properties"][field]["maximum"] = upload_max_bytes
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


def _shared_answers(path: str, item: dict[str, Any], rate_limited: bool) -> dict[str, Any]:
    """The path's operations with the answers of the middlewares that run before them: the
    API key's (``auth.py``) and the rate limit's (``rate_limits.py``)."""
    out: dict[str, Any] = {}
    for method, op in item.items():
        responses = dict(op["responses"])
        if op.get("security", schema.KEY_AUTH):
            responses = {**schema.responses({}, 503), **responses, "401": schema.KEY_REFUSED}
        if rate_limited and path not in rate_limits.NEVER_LIMITED:
            responses["429"] = schema.RATE_LIMITED
        out[method] = {**op, "responses": responses}
    return out


def _request_components(paths: dict[str, Any], components: dict[str, Any]) -> set[str]:
    """The names of the components a request body refers to, directly or through others."""
    found: set[str] = set()
    pending = [
        media["schema"]
        for item in paths.values()
        for op in item.values()
        for media in op.get("requestBody", {}).get("content", {}).values()
        if "schema" in media
    ]
    while pending:
        node = pending.pop()
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith(schema.REF.format(name="")):
                name = ref.rpartition("/")[2]
                if name not in found:
                    found.add(name)
                    pending.append(components[name])
            pending.extend(node.values())
        elif isinstance(node, list):
            pending.extend(node)
    return found


def _edge_bounds(node: dict[str, Any]) -> None:
    """State ``untrusted.check_tree``'s bounds on a request schema, in place, where the
    schema does not already say more."""
    kind = node.get("type")
    kinds = set(kind) if isinstance(kind, list) else {kind}
    if "integer" in kinds:
        if "minimum" not in node and "exclusiveMinimum" not in node:
            node["minimum"] = untrusted.INT64_MIN
        if "maximum" not in node and "exclusiveMaximum" not in node:
            node["maximum"] = untrusted.INT64_MAX
    if "string" in kinds and "format" not in node and "pattern" not in node:
        # (Our own patterns exclude NUL and bound the length already; a unit test checks.)
        node["pattern"] = NO_NUL
        node.setdefault("maxLength", untrusted.API_BOUNDS.max_string_chars)
    for child in node.get("properties", {}).values():
        _edge_bounds(child)
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), dict):
            _edge_bounds(node[key])
    for key in _SCHEMA_KEYWORDS:
        for child in node.get(key, []):
            _edge_bounds(child)


@routes.get("/openapi.json")
async def openapi_json(request: web.Request) -> web.Response:
    body = document(context(request).config.api)
    return web.Response(body=body, content_type="application/json")
