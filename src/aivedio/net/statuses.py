"""What an HTTP status from a provider means: the error class the queue acts on.

Pure: a status and its ``Retry-After`` to an error that never carries the URL (scheme, host
and a path hash only).
"""

from __future__ import annotations

from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

from aivedio.errors import (
    AivedioError,
    InvalidResponseError,
    NotYetAvailableError,
    ProviderServerError,
    ThrottledError,
    UrlExpiredError,
)
from aivedio.logs import url_for_log


def _retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        try:
            when = parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:
            return None  # "-0000" or no zone: not an HTTP date, and not comparable to now
        return max(0.0, (when - datetime.now(UTC)).total_seconds())


def classify_status(status: int, url: str, retry_after: str | None) -> AivedioError:
    error = _classify_status(status, url, retry_after)
    error.http_status = status
    return error


def _classify_status(status: int, url: str, retry_after: str | None) -> AivedioError:
    where = url_for_log(url)
    if status == 404:
        return NotYetAvailableError(f"404 from {where}")
    if status in (401, 403, 410):
        return UrlExpiredError(f"{status} from {where}: signature expired or refused")
    if status == 429:
        return ThrottledError(f"429 from {where}", retry_after_seconds=_retry_after(retry_after))
    if status >= 500:
        return ProviderServerError(
            f"{status} from {where}", retry_after_seconds=_retry_after(retry_after)
        )
    return InvalidResponseError(f"unexpected status {status} from {where}")
