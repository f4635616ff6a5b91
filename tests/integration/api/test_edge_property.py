"""Property: no body, however hostile, gets a 5xx or a traceback out of the API's edge.

Bodies are generated for the provider callback (signed, so they pass the signature and
reach the decoding), Replicate's and fal's signed webhooks, Luma's unsigned one and the
upload route: valid-shaped documents whose values are hostile (NUL, 2^62 and 2^64, the
years 1 and 9999, "infinity", 70,000-character text, wrong types), arbitrary JSON, and raw
bytes (invalid UTF-8, brackets nested past any bound). Each is sent to the real API over
real PostgreSQL; every answer must be below 500 (503 means a dependency is down, and none
is), and nothing may log an error or a traceback.

Hypothesis runs in a worker thread with a blocking HTTP client, while the API serves on
the test's event loop.
"""

from __future__ import annotations

import http.client
import logging
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import anyio.to_thread
import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

from aivedio.config.load import Config
from aivedio.store.database import Pool
from tests.support.api_rig import open_api
from tests.support.edge_client import SIGNERS, signed_fal, with_edge_providers

pytestmark = pytest.mark.anyio
EXAMPLES = 300

TIMES = st.sampled_from(
    [
        "0001-01-01T00:00:00Z",
        "9999-12-31T23:59:59Z",
        "9999-12-31T23:59:59-01:00",
        "infinity",
        "-infinity",
        "2026-01-01T00:00:00",
        "1970-01-01T00:00:00Z",
        "NaN",
        time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 3600)),
    ]
)
TEXT = st.one_of(
    st.text(max_size=12),
    TIMES,
    st.sampled_from(
        [
            "",
            "\x00",
            "a\x00b",
            "x" * 70_000,
            "https://cdn.provider.example/a.mp4",
            "video/mp4",
            "ab" * 32,
            "\u202e\ufeff",
            "\x01\x7f",
        ]
    ),
)
INTEGERS = st.one_of(
    st.integers(min_value=-5, max_value=300),
    st.sampled_from([2**62, 2**63 - 1, 2**63, 2**64, -(2**63) - 1, 10**30, 5 * 1024**4 + 1]),
)
SCALARS = st.none() | st.booleans() | INTEGERS | st.floats(allow_nan=False) | TEXT
JSONISH = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=12,
)


def maybe(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """The field's kind of value mostly, sometimes anything at all."""
    return st.one_of(strategy, strategy, strategy, JSONISH)


OUTPUT = st.fixed_dictionaries(
    {"url": maybe(TEXT)},
    optional={
        "index": maybe(INTEGERS),
        "expires_at": maybe(TIMES),
        "sha256": maybe(TEXT),
        "size": maybe(INTEGERS),
        "content_type": maybe(TEXT),
    },
)
GENERIC = st.fixed_dictionaries(
    {
        "event_id": maybe(TEXT),
        "task_id": maybe(TEXT),
        "status": maybe(st.sampled_from(["SUCCEEDED", "running", "FAILED", "done"])),
        "outputs": maybe(st.lists(OUTPUT, max_size=3)),
    }
)
REPLICATE = st.fixed_dictionaries(
    {
        "id": maybe(TEXT),
        "status": maybe(st.sampled_from(["succeeded", "failed", "starting"])),
        "completed_at": maybe(TIMES | INTEGERS),
        "output": maybe(st.lists(TEXT, max_size=3) | TEXT),
    }
)
FAL_FILE = st.fixed_dictionaries(
    {"url": maybe(TEXT)}, optional={"file_size": maybe(INTEGERS), "content_type": maybe(TEXT)}
)
FAL = st.fixed_dictionaries(
    {
        "request_id": maybe(TEXT),
        "status": maybe(st.sampled_from(["OK", "ERROR"])),
        "payload": maybe(
            st.fixed_dictionaries({"video": maybe(FAL_FILE)})
            | st.fixed_dictionaries({"videos": st.lists(FAL_FILE, max_size=3)})
        ),
    }
)
LUMA = st.fixed_dictionaries({"id": maybe(TEXT), "state": maybe(TEXT)})
UPLOAD = st.fixed_dictionaries(
    {"size_bytes": maybe(INTEGERS), "sha256": maybe(TEXT)},
    optional={"content_type": maybe(TEXT), "filename": maybe(TEXT)},
)
RAW = st.one_of(
    st.binary(max_size=64),
    st.sampled_from(
        [
            b"[" * 5000,
            b'{"a":' * 3000,
            b"[" * 2000 + b"]" * 2000,
            b'"\xff"',
            b'{"id": "\xed\xa0\x80"}',
            b'"\\ud800"',
            b"1e999",
            b"",
            b"null",
        ]
    ),
)
SHAPES = {"sim": GENERIC, "replicate": REPLICATE, "fal": FAL, "luma": LUMA, "upload": UPLOAD}


def encoded(shape: st.SearchStrategy[Any]) -> st.SearchStrategy[bytes]:
    return st.one_of(
        shape.map(msgspec.json.encode),
        shape.map(msgspec.json.encode),
        JSONISH.map(msgspec.json.encode),
        RAW,
    )


TARGETS = st.sampled_from(sorted(SHAPES)).flatmap(
    lambda target: st.tuples(st.just(target), encoded(SHAPES[target]))
)


class Errors(logging.Handler):
    """Standard-library records at ERROR or with a traceback (aiohttp's own reports)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= logging.ERROR or record.exc_info:
            self.records.append(record)


async def test_no_generated_body_gets_a_5xx_or_a_traceback(
    config: Config, pool: Pool, tmp_path: Path
) -> None:
    async with open_api(with_edge_providers(config), pool, tmp_path) as api:
        url = urlsplit(api.base)
        seen: dict[int, int] = {}
        counter = iter(range(10**9))

        def send(target: str, body: bytes) -> tuple[int, bytes]:
            if target == "upload":
                path, headers = "/v1/videos", {**api.auth(), "Content-Type": "application/json"}
            else:
                path = f"/v1/providers/{target}/callbacks"
                sign = SIGNERS[target]
                headers = (
                    signed_fal(body, f"req-{next(counter)}") if target == "fal" else sign(body)
                )
            conn = http.client.HTTPConnection(url.hostname or "", url.port, timeout=20)
            try:
                conn.request("POST", path, body=body, headers=headers)
                response = conn.getresponse()
                return response.status, response.read()
            finally:
                conn.close()

        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(case=TARGETS)
        def property(case: tuple[str, bytes]) -> None:
            target, body = case
            status, answer = send(target, body)
            seen[status] = seen.get(status, 0) + 1
            assert status < 500, (target, body[:300], status, answer[:300])

        errors = Errors()
        logging.getLogger().addHandler(errors)
        started = time.monotonic()
        try:
            with capture_logs() as logs:
                await anyio.to_thread.run_sync(property)
        finally:
            logging.getLogger().removeHandler(errors)
        elapsed = time.monotonic() - started
        print(f"{EXAMPLES} examples in {elapsed:.1f} s; statuses {sorted(seen.items())}")
        crashed = [e for e in logs if e.get("exc_info") or e["log_level"] in ("error", "critical")]
        assert crashed == [], crashed[:3]
        assert errors.records == [], [r.getMessage() for r in errors.records[:3]]
        # The generated bodies reached every kind of answer, not only the first refusal.
        assert {400, 401}.isdisjoint(seen) is False and any(s < 300 for s in seen), seen
