"""The OpenAPI document promises what the API answers: the edge's bounds on every request
body, the configured upload limit, and every refusal a middleware or the body reader adds."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aivedio import untrusted
from aivedio.api import openapi, rate_limits
from aivedio.config.api import ApiConfig, RateLimitsConfig
from aivedio.store.objects.base import MIB


def served(**api: Any) -> dict[str, Any]:
    document: dict[str, Any] = msgspec.json.decode(openapi.document(ApiConfig(**api)))
    return document


DOC = served()
OPERATIONS = [
    (path, method, op) for path, item in DOC["paths"].items() for method, op in item.items()
]
REQUEST_COMPONENTS = sorted(openapi._request_components(DOC["paths"], DOC["components"]["schemas"]))


def schemas_in(node: Any) -> Iterator[dict[str, Any]]:
    """Every schema object inside ``node`` (itself included)."""
    if isinstance(node, dict):
        if "type" in node:
            yield node
        for value in node.values():
            yield from schemas_in(value)
    elif isinstance(node, list):
        for value in node:
            yield from schemas_in(value)


def request_schemas(kind: str) -> list[dict[str, Any]]:
    components = DOC["components"]["schemas"]
    return [
        node
        for name in REQUEST_COMPONENTS
        for node in schemas_in(components[name]["properties"])
        if node.get("type") == kind
    ]


def test_the_request_bodies_are_found() -> None:
    assert {
        "CreateVideo",
        "CompleteVideo",
        "CompletedPart",
        "WatchTask",
        "CallbackBody",
        "CallbackOutput",
    } <= set(REQUEST_COMPONENTS)


def test_the_upload_limit_served_is_the_configured_one() -> None:
    def limit(doc: dict[str, Any]) -> int:
        size: int = doc["components"]["schemas"]["CreateVideo"]["properties"]["size_bytes"][
            "maximum"
        ]
        return size

    assert limit(DOC) == ApiConfig().upload_max_bytes == 4 * 1024 * MIB
    assert limit(served(upload_max_bytes=10 * MIB)) == 10 * MIB


@pytest.mark.parametrize("node", request_schemas("integer"), ids=str)
def test_every_request_integer_is_within_the_edges_64_bits(node: dict[str, Any]) -> None:
    low = node.get("minimum", node.get("exclusiveMinimum"))
    high = node.get("maximum", node.get("exclusiveMaximum"))
    assert low is not None and high is not None, node
    assert untrusted.INT64_MIN <= low <= high <= untrusted.INT64_MAX


@pytest.mark.parametrize("node", request_schemas("string"), ids=str)
@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_every_request_string_is_text_the_edge_accepts(
    node: dict[str, Any], data: st.DataObject
) -> None:
    if node.get("format") == "date-time":
        return  # a time: its window is the decoder's (untrusted.instant)
    assert "pattern" in node, node
    # Bounded by maxLength, or by a pattern that repeats nothing without a bound.
    assert "maxLength" in node or not re.search(r"[*+]|\{\d+,\}", node["pattern"]), node
    assert node.get("maxLength", 0) <= untrusted.API_BOUNDS.max_string_chars
    text = data.draw(st.from_regex(node["pattern"], fullmatch=True))
    if "maxLength" in node:
        text = text[: node["maxLength"]]
    untrusted.check_tree(text)  # raises for a NUL or a string too long


def test_every_operation_needing_a_key_documents_its_refusals() -> None:
    keyed = [(path, method, op) for path, method, op in OPERATIONS if op.get("security") != []]
    assert len(keyed) >= 10
    for path, method, op in keyed:
        refused = op["responses"]["401"]
        assert refused["headers"]["WWW-Authenticate"]["required"], (path, method)
        assert "503" in op["responses"], (path, method)  # the key could not be looked up


def test_every_rate_limited_operation_documents_429_with_retry_after() -> None:
    for path, method, op in OPERATIONS:
        limited = op["responses"].get("429")
        if path in rate_limits.NEVER_LIMITED:
            assert limited is None, path
        else:
            assert limited["headers"]["Retry-After"]["required"], (path, method)
    off = served(rate_limits=RateLimitsConfig(enabled=False))
    assert not [
        op for item in off["paths"].values() for op in item.values() if "429" in op["responses"]
    ]


def test_every_json_body_documents_how_the_reader_can_refuse_it() -> None:
    bodies = [
        (path, method, op)
        for path, method, op in OPERATIONS
        if "application/json" in op.get("requestBody", {}).get("content", {})
    ]
    # tasks, callbacks, videos, completing one, webhook receivers, a video's text tracks
    assert len(bodies) == 6
    for path, method, op in bodies:
        # Malformed (naming the field), not whole in time, too large, against the schema.
        for status in ("400", "408", "413", "422"):
            error = op["responses"][status]["content"]["application/json"]["schema"]
            assert error == {"$ref": "#/components/schemas/Error"}, (path, method, status)
    detail = DOC["components"]["schemas"]["ErrorDetail"]["properties"]
    assert {"code", "detail", "field"} <= detail.keys()


def test_an_upload_links_to_where_the_video_goes_next() -> None:
    created = DOC["paths"]["/v1/videos"]["post"]["responses"]["201"]["links"]
    assert {link["operationId"] for link in created.values()} == {
        "uploadVideo",
        "completeVideo",
        "getVideoStatus",
        "getVideoPlayback",
    }
    ids = {op["operationId"] for _, _, op in OPERATIONS if "operationId" in op}
    for _, _, op in OPERATIONS:
        for response in op["responses"].values():
            for link in response.get("links", {}).values():
                assert link["operationId"] in ids, link
