"""What the warning for a malformed request keeps of aiohttp's parser report: its prose."""

from __future__ import annotations

import pytest

from aivedio.http_server import parse_error_reason

KEY = "av_live_074ccae1_w7xWYJXs-4ddWXQAqDIaTaI0h8zXHLsE1VE5MaBIO44"
TOKEN = "WzEsImU2NjhlODZlLTk4NzUtNDUxOC04NDAzLTM3ZWU3NjdhMzc0NyIsMSwxNzk2MjE4ODgxXQ.JqsfIc6JNkWg"


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        (
            f"Invalid header value char:\n\n  b'Authorization: Bearer {KEY}\\x01'\n       ^",
            "Invalid header value char",
        ),
        (
            f"Bad status line:\n  Expected CRLF after version:\n\n  b'GET /media/{TOKEN} x'\n  ^",
            "Bad status line: Expected CRLF after version",
        ),
        (
            f"Got more than 8190 bytes when reading: b'Bearer {KEY}...'.",
            "Got more than 8190 bytes when reading",
        ),
        (
            f"Got more than 8190 bytes when reading: bytearray(b'/media/{TOKEN}')",
            "Got more than 8190 bytes when reading",
        ),
        (f"Invalid HTTP header: 'X-Key: {KEY}'", "Invalid HTTP header"),
        (
            "Content-Length can't be present with Transfer-Encoding:\n\n  b'Content-Length: 5'",
            "Content-Length can't be present with Transfer-Encoding",
        ),
        (
            "400, message:\n  Can not decode content-encoding: gzip",
            "Can not decode content-encoding: gzip",
        ),
        ("Received HTTPS traffic on an HTTP port", "Received HTTPS traffic on an HTTP port"),
        (f"Duplicate '{KEY}' header found.", "Duplicate"),
        (f"b'{KEY}'", ""),
    ],
)
def test_the_reason_is_the_prose_before_the_quoted_bytes(message: str, reason: str) -> None:
    assert parse_error_reason(message) == reason


def test_unquoted_secrets_in_a_report_are_still_redacted_and_the_reason_is_short() -> None:
    out = parse_error_reason(f"weird report naming {KEY} and {TOKEN} " + "x" * 500)
    assert "w7xWYJXs" not in out and "JqsfIc6J" not in out
    assert len(out) <= 120
