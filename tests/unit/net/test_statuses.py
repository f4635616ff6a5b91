"""A provider's status and Retry-After to the error class (net/statuses.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest

from aivedio.errors import (
    InvalidResponseError,
    NotYetAvailableError,
    ProviderServerError,
    ThrottledError,
    UrlExpiredError,
)
from aivedio.net.statuses import classify_status

URL = "https://cdn.provider.test/out.mp4?sig=SECRET"


@pytest.mark.parametrize(
    ("status", "error"),
    [
        (404, NotYetAvailableError),
        (401, UrlExpiredError),
        (403, UrlExpiredError),
        (410, UrlExpiredError),
        (429, ThrottledError),
        (500, ProviderServerError),
        (503, ProviderServerError),
        (206, InvalidResponseError),
        (418, InvalidResponseError),
    ],
)
def test_each_status_has_its_class_and_no_secret(status: int, error: type[Exception]) -> None:
    classified = classify_status(status, URL, None)
    assert isinstance(classified, error)
    assert classified.http_status == status
    assert "SECRET" not in str(classified)


def test_retry_after_in_seconds_or_as_an_http_date() -> None:
    assert classify_status(429, URL, "7").retry_after_seconds == 7
    assert classify_status(503, URL, "0.5").retry_after_seconds == 0.5
    later = format_datetime(datetime.now(UTC) + timedelta(seconds=120), usegmt=True)
    assert 100 < (classify_status(429, URL, later).retry_after_seconds or 0) <= 120
    assert classify_status(429, URL, "Wed, 21 Oct 2015 07:28:00 GMT").retry_after_seconds == 0


@pytest.mark.parametrize(
    "value",
    ["Wed, 21 Oct 2015 07:28:00 -0000", "Wed, 21 Oct 2015 07:28:00", "soon", ""],
)
def test_a_retry_after_without_a_zone_or_a_meaning_is_ignored_not_a_crash(value: str) -> None:
    # A date without a zone used to raise TypeError (naive minus aware) out of the fetch.
    assert classify_status(429, URL, value).retry_after_seconds is None
