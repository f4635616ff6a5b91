"""The resume rules (net/resume.py): which validator guards a resume, and what an answer means."""

from __future__ import annotations

import pytest

from aivedio.net.resume import (
    Validator,
    Verdict,
    judge,
    parse_content_range,
    range_headers,
    validator_of,
)

ETAG = '"abc123"'
DATE = "Thu, 01 Jan 2026 00:00:00 GMT"
BY_ETAG = Validator(if_range=ETAG, etag=ETAG, last_modified=DATE)
BY_DATE = Validator(if_range=DATE, etag=None, last_modified=DATE)


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"ETag": ETAG, "Last-Modified": DATE}, BY_ETAG),
        ({"ETag": f"W/{ETAG}", "Last-Modified": DATE}, BY_DATE),  # a weak ETag cannot If-Range
        ({"Last-Modified": DATE}, BY_DATE),
        ({"ETag": "abc123"}, None),  # unquoted: not an entity tag
        ({"ETag": '"a b"'}, None),  # a space is not an etagc
        ({}, None),
        ({"ETag": ETAG, "Accept-Ranges": "none"}, None),
        ({"ETag": ETAG, "Accept-Ranges": "bytes"}, Validator(ETAG, ETAG, None)),
    ],
)
def test_the_validator_is_the_strong_etag_else_last_modified(
    headers: dict[str, str], expected: Validator | None
) -> None:
    assert validator_of(headers) == expected


def test_a_resume_asks_for_the_rest_under_if_range() -> None:
    assert range_headers(1000, BY_ETAG) == {"Range": "bytes=1000-", "If-Range": ETAG}
    assert range_headers(0, BY_DATE) == {"Range": "bytes=0-", "If-Range": DATE}


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("bytes 100-999/1000", (100, 999, 1000)),
        (" bytes 0-0/1 ", (0, 0, 1)),
        ("bytes 100-999/*", None),  # the total must be stated
        ("bytes */1000", None),  # unsatisfied
        ("bytes 100-99/1000", None),
        ("bytes 100-1000/1000", None),  # past the end
        ("bytes -100-999/1000", None),
        ("bytes +100-999/1000", None),
        ("bytes 100 - 999/1000", None),
        ("items 100-999/1000", None),
        ("bytes 100-999/1000, bytes 0-1/1000", None),
        ("bytes 1_0-999/1000", None),
        ("", None),
        (None, None),
    ],
)
def test_content_range_is_parsed_strictly(
    value: str | None, expected: tuple[int, int, int] | None
) -> None:
    assert parse_content_range(value) == expected


def _judge(status: int, headers: dict[str, str], **kw: object) -> Verdict:
    args: dict[str, object] = {"offset": 100, "total": 1000, "validator": BY_ETAG}
    args.update(kw)
    return judge(status, headers, **args)  # type: ignore[arg-type]


def test_a_206_at_our_offset_to_the_end_continues() -> None:
    headers = {"Content-Range": "bytes 100-999/1000", "Content-Length": "900", "ETag": ETAG}
    assert _judge(206, headers) == Verdict("continue", total=1000)
    # Origins often omit the validator on a 206: that says nothing against it.
    assert _judge(206, {"Content-Range": "bytes 100-999/1000"}) == Verdict("continue", total=1000)


def test_a_206_without_a_known_total_takes_the_stated_one() -> None:
    headers = {"Content-Range": "bytes 100-4999/5000"}
    assert _judge(206, headers, total=None) == Verdict("continue", total=5000)


@pytest.mark.parametrize(
    "headers",
    [
        {"Content-Range": "bytes 99-999/1000"},  # would repeat a byte
        {"Content-Range": "bytes 101-999/1000"},  # would skip a byte
        {"Content-Range": "bytes 100-998/1000"},  # stops short of the end
        {"Content-Range": "bytes 100-1999/2000"},  # another total: another object
        {"Content-Range": "bytes 100-999/1000", "Content-Length": "899"},
        {"Content-Range": "bytes 100-999/*"},
        {},
    ],
)
def test_a_206_that_does_not_continue_us_exactly_is_refetched(headers: dict[str, str]) -> None:
    assert _judge(206, headers) == Verdict("refetch", "bad_content_range")


def test_a_206_naming_another_object_is_refetched_never_appended() -> None:
    headers = {"Content-Range": "bytes 100-999/1000", "ETag": '"other"'}
    assert _judge(206, headers) == Verdict("refetch", "validator_changed")
    dated = {
        "Content-Range": "bytes 100-999/1000",
        "Last-Modified": "Fri, 02 Jan 2026 00:00:00 GMT",
    }
    assert _judge(206, dated, validator=BY_DATE) == Verdict("refetch", "validator_changed")


def test_a_200_starts_over_with_its_body() -> None:
    assert _judge(200, {"ETag": ETAG}) == Verdict("restart", "range_ignored")
    assert _judge(200, {"ETag": '"new"'}) == Verdict("restart", "validator_changed")


def test_416_refetches_and_other_statuses_are_errors() -> None:
    assert _judge(416, {}) == Verdict("refetch", "range_not_satisfiable")
    for status in (403, 404, 429, 500, 503, 304):
        assert _judge(status, {}).action == "error"
