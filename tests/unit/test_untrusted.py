"""The edge decoder: depth measured before parsing, NUL and ranges refused, fields named."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aivedio.errors import InvalidResponseError, MalformedInputError
from aivedio.providers.base import parse_time
from aivedio.providers.seam import (
    MAX_OUTPUT_BYTES,
    ProviderOutput,
    check_reported,
)
from aivedio.untrusted import (
    API_BOUNDS,
    Bounds,
    decode,
    instant,
    nesting_within,
    stored_instant,
    unix_instant,
)

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)


class Output(msgspec.Struct, frozen=True, kw_only=True):
    url: str
    size: Annotated[int, msgspec.Meta(ge=0)] | None = None
    expires_at: datetime | None = None


class Body(msgspec.Struct, frozen=True, kw_only=True):
    task_id: str
    outputs: list[Output] = []


def refused(body: bytes, kind: Any = None, **kw: Any) -> MalformedInputError:
    typed = {} if kind is None else {"kind": kind, "now": NOW}
    with pytest.raises(MalformedInputError) as info:
        decode(body, **typed, **kw)
    return info.value


def test_a_malformed_input_error_is_a_never_retried_invalid_response() -> None:
    error = MalformedInputError("x", field="$.a", reason="too_deep")
    assert isinstance(error, InvalidResponseError)
    assert (error.field, error.reason, error.error_class) == ("$.a", "too_deep", "malformed")


@pytest.mark.parametrize("opener", [b"[", b'{"a":'])
def test_a_body_nested_a_thousand_levels_is_refused_before_parsing(opener: bytes) -> None:
    closer = b"]" if opener == b"[" else b"}"
    body = opener * 1000 + b"1" + closer * 1000
    with pytest.raises(RecursionError):
        msgspec.json.decode(body)  # what the edge used to do
    assert refused(body).reason == "too_deep"


def test_depth_up_to_the_bound_passes_and_one_more_is_refused() -> None:
    depth = API_BOUNDS.max_depth
    assert decode(b"[" * depth + b"]" * depth) is not None
    assert refused(b"[" * (depth + 1) + b"]" * (depth + 1)).reason == "too_deep"


def test_brackets_inside_strings_do_not_count() -> None:
    text = "[" * 500 + '\\"{' * 100 + "\\\\"
    tree = decode(msgspec.json.encode({"a": [text]}))
    assert tree == {"a": [text]}


def test_unbalanced_text_is_malformed_and_a_megabyte_of_brackets_is_cheap() -> None:
    assert refused(b'{"a": [}').reason == "malformed"
    for body in (b"[" * 1024 * 1024, b"[]" * 512 * 1024, b"{" * 1024 * 1024):
        started = time.perf_counter()
        with pytest.raises(MalformedInputError):
            decode(body)
        assert time.perf_counter() - started < 1.0


def _depth(tree: Any) -> int:
    if isinstance(tree, list):
        return 1 + max((_depth(v) for v in tree), default=0)
    if isinstance(tree, dict):
        return 1 + max((_depth(v) for v in tree.values()), default=0)
    return 0


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet='[]{}"\\ax:,'),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=40,
)


@settings(max_examples=300, deadline=None)
@given(tree=JSON, bound=st.integers(min_value=1, max_value=8))
def test_the_depth_scan_agrees_with_the_tree_it_measures(tree: Any, bound: int) -> None:
    assert nesting_within(msgspec.json.encode(tree), bound) == (_depth(tree) <= bound)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (b'{"task_id": "a\\u0000b"}', "$.task_id"),
        (b'{"task_id": "t", "outputs": [{"url": "u", "x\\u0000": 1}]}', "$.outputs[0]['x\\x00']"),
        (b'{"task_id": "t", "outputs": [{"url": "h\\u0000"}]}', "$.outputs[0].url"),
    ],
)
def test_a_nul_anywhere_is_refused_naming_where(body: bytes, field: str) -> None:
    error = refused(body, Body)
    assert (error.reason, error.field) == ("nul_character", field)


def test_integers_outside_64_bits_and_long_strings_are_refused() -> None:
    assert decode(b"[-9223372036854775808, 9223372036854775807]") is not None
    error = refused(b'{"task_id": "t", "outputs": [{"url": "u", "size": 9223372036854775808}]}')
    assert (error.reason, error.field) == ("out_of_range", "$.outputs[0].size")
    assert refused(b"1e999").reason == "malformed"
    small = Bounds(max_string_chars=8)
    assert refused(b'{"k": "123456789"}', bounds=small).field == "$.k"
    assert decode(b'{"k": "12345678"}', bounds=small) == {"k": "12345678"}


class Measured(msgspec.Struct, frozen=True):
    count: Annotated[int, msgspec.Meta(ge=0)]
    seconds: float = 0.0


@pytest.mark.parametrize("number", [b"10.0", b"1e1", b"10.000", b"1.0E+1"])
def test_an_integral_float_is_the_integer_json_schema_says_it_is(number: bytes) -> None:
    # The document says `"type": "integer"`, which JSON Schema holds 10.0 to be.
    value = decode(b'{"count": %s, "seconds": %s}' % (number, number), Measured)
    assert value == Measured(count=10, seconds=10.0)
    assert type(value.count) is int and type(value.seconds) is float
    assert decode(b"[10.0]") == [10.0]  # an untyped tree keeps what was sent


@pytest.mark.parametrize("number", [b"10.5", b"1e19", b"-1e300", b"9223372036854775808.0"])
def test_a_fractional_or_out_of_range_float_is_no_integer(number: bytes) -> None:
    error = refused(b'{"count": %s}' % number, Measured)
    assert (error.reason, error.field) == ("invalid_field", "$.count")


@pytest.mark.parametrize("body", [b'"\xff"', b'"\xed\xa0\x80"', b'"\\ud800"', b'"\\udc00x"'])
def test_invalid_utf8_and_lone_surrogates_are_refused(body: bytes) -> None:
    assert refused(body).reason == "malformed"


def test_schema_errors_name_the_field() -> None:
    error = refused(b'{"task_id": "t", "outputs": [{"url": "u", "size": -1}]}', Body)
    assert (error.reason, error.field) == ("invalid_field", "$.outputs[0].size")
    assert refused(b"{}", Body).field == "$"


@pytest.mark.parametrize(
    "value",
    [
        "0001-01-01T00:00:00Z",
        "9999-12-31T23:59:59-01:00",
        "9999-12-31T23:59:59Z",
        "infinity",
        "-infinity",
        "2025-04-01T00:00:00Z",
        "2027-08-01T00:00:00Z",
        "2026-06-02T00:00:00",
    ],
)
def test_a_time_outside_the_window_or_without_an_offset_is_refused(value: str) -> None:
    body = msgspec.json.encode({"task_id": "t", "outputs": [{"url": "u", "expires_at": value}]})
    error = refused(body, Body)
    assert error.field.startswith("$.outputs[0].expires_at"), error
    assert error.reason in ("time_out_of_range", "invalid_field", "naive_time")


def test_a_time_inside_the_window_comes_back_in_utc() -> None:
    body = b'{"task_id": "t", "outputs": [{"url": "u", "expires_at": "2026-06-02T14:00:00+02:00"}]}'
    [output] = decode(body, Body, now=NOW).outputs
    assert output.expires_at == datetime(2026, 6, 2, 12, tzinfo=UTC)
    assert instant(NOW - timedelta(days=400), "t", now=NOW) == NOW - timedelta(days=400)
    assert instant(NOW + timedelta(days=400), "t", now=NOW) == NOW + timedelta(days=400)


@pytest.mark.parametrize("seconds", [float("nan"), float("inf"), -1e300, 1e300, 0, 2**62])
def test_unix_seconds_outside_the_window_are_refused_without_overflowing(seconds: float) -> None:
    with pytest.raises(MalformedInputError, match="outside"):
        unix_instant(seconds, "completed_at", now=NOW)


@pytest.mark.parametrize(
    "value", [10**30, -(10**30), 2**62, "0001-01-01T00:00:00", "9999-12-31T23:59:59-01:00"]
)
def test_a_vendors_time_is_held_to_the_window(value: object) -> None:
    with pytest.raises(MalformedInputError) as info:
        parse_time(value, "created_at")
    assert info.value.field == "created_at"
    recent = int(time.time() * 1000) - 60_000  # Kling's milliseconds
    assert parse_time(recent, "created_at") is not None


def test_stored_instants_are_those_the_schema_holds() -> None:
    assert stored_instant(datetime(2001, 1, 1, tzinfo=UTC), "--since").year == 2001
    for bad in (datetime(1969, 12, 31, tzinfo=UTC), datetime(2500, 1, 1, tzinfo=UTC)):
        with pytest.raises(MalformedInputError, match="--since"):
            stored_instant(bad, "--since")
    with pytest.raises(MalformedInputError, match="offset"):
        stored_instant(datetime(2001, 1, 1), "--since")


def output(**fields: Any) -> ProviderOutput:
    return ProviderOutput(**{"index": 0, "url": "https://cdn.example/x.mp4", **fields})


@pytest.mark.parametrize(
    ("reported", "field"),
    [
        (output(size=2**62 + MAX_OUTPUT_BYTES), "outputs[0].size"),
        (output(size=-1), "outputs[0].size"),
        (output(size=True), "outputs[0].size"),
        (output(size=1.5), "outputs[0].size"),
        (output(index=256), "outputs[0].index"),
        (output(url="https://x/\x00"), "outputs[0].url"),
        (output(url=""), "outputs[0].url"),
        (output(content_type={"a": 1}), "outputs[0].content_type"),
        (output(content_type="video/mp4\x00"), "outputs[0].content_type"),
        (output(sha256="ab"), "outputs[0].sha256"),
        (output(expires_at=datetime(1, 1, 1, tzinfo=UTC)), "outputs[0].expires_at"),
        (output(expires_at="soon"), "outputs[0].expires_at"),
    ],
)
def test_what_a_provider_reports_is_held_to_what_we_store(
    reported: ProviderOutput, field: str
) -> None:
    with pytest.raises(MalformedInputError) as info:
        check_reported("task-1", [reported])
    assert info.value.field == field
    check_reported("task-1", [output(size=MAX_OUTPUT_BYTES, sha256="ab" * 32)])


@pytest.mark.parametrize("task_id", ["", "a\x00b", "x" * 401, 7, None])
def test_a_reported_task_id_must_be_plain_bounded_text(task_id: object) -> None:
    with pytest.raises(MalformedInputError) as info:
        check_reported(task_id, [])
    assert info.value.field == "task_id"
