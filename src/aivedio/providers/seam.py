"""The provider seam: ask a provider about a task and for a fresh output URL.

A refresh re-reads or re-signs an existing output; it never submits a generation (seed
§11.9.5: retrying a download must not cost a second generation). ``OutputLostError`` is
the adapter's word that the output is gone for good, which ends in OUTPUT_LOST instead of
useless retries. Adapters talk to providers only through the guarded fetcher, so their API
hosts obey the same network policy as downloads, and their credentials go to their own hosts.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol
from urllib.parse import quote

import msgspec

from aivedio import untrusted
from aivedio.config.load import ProviderConfig
from aivedio.errors import (
    AivedioError,
    InvalidResponseError,
    MalformedInputError,
    OutputLostError,
    PolicyBlockedError,
)
from aivedio.net.fetch import Fetcher

MAX_TASK_ID_CHARS = 400
# What an output's description may hold: S3's largest object (no store we write to holds
# more: a larger declared size is a lie or a bug, and overflowed the claim order's sums),
# the index range of the schema's smallint and of callbacks, the URL length we encrypt.
MAX_OUTPUT_BYTES = 5 * 1024**4
MAX_OUTPUT_INDEX = 255
MAX_URL_CHARS = 8192
MAX_CONTENT_TYPE_CHARS = 200
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_SHA256 = re.compile(r"[0-9a-fA-F]{64}")
# Characters that would change which URL a task id lands on, beyond the segment it fills.
_NOT_IN_AN_ID = frozenset("/?#%\\")


def path_segment(task_id: str) -> str:
    """``task_id`` as one URL path segment; PolicyBlockedError (``invalid_task_id``) for an id
    that is not a plain one, which no vendor issues."""
    if (
        not task_id
        or task_id in (".", "..")
        or len(task_id) > MAX_TASK_ID_CHARS
        or not task_id.isprintable()
        or any(c.isspace() or c in _NOT_IN_AN_ID for c in task_id)
    ):
        shown = task_id[:80].encode("unicode_escape").decode()
        raise PolicyBlockedError(f"invalid_task_id: {shown!r} is not a provider task id")
    return quote(task_id, safe=":@")  # pchar: neither changes which path it is


class ProviderCaption(msgspec.Struct, frozen=True, kw_only=True):
    """Captions an adapter found with an output (a vendor that returns a transcript or
    subtitles beside the video): untrusted text, held to sizes here (``check_output``) and
    cleaned into a WebVTT track by the render, which leaves out what it cannot clean."""

    language: str  # a BCP 47 tag; one that is not becomes "und" in the track
    label: str = ""
    kind: str = "subtitles"  # captions or subtitles
    default: bool = False
    text: str  # WebVTT or SRT


class ProviderOutput(msgspec.Struct, frozen=True, kw_only=True):
    index: int
    url: str
    expires_at: datetime | None = None
    sha256: str | None = None
    size: int | None = None
    content_type: str | None = None
    captions: list[ProviderCaption] = msgspec.field(default_factory=list)


class ProviderTask(msgspec.Struct, frozen=True, kw_only=True):
    provider_task_id: str
    status: str  # SUCCEEDED, RUNNING, FAILED, …, normalised upper case
    outputs: list[ProviderOutput] = msgspec.field(default_factory=list)


def check_reported(
    task_id: object, outputs: Sequence[ProviderOutput] | None, *, now: datetime | None = None
) -> None:
    """What a provider reported (a callback, a poll, an ingest) held to what we store:
    MalformedInputError naming the field otherwise. Adapters build outputs from documents
    whose fields may be of any JSON type, so the types are checked here too, once, for
    every way an output is recorded."""
    if (
        not isinstance(task_id, str)
        or not 0 < len(task_id) <= MAX_TASK_ID_CHARS
        or _CONTROL.search(task_id)
    ):
        raise MalformedInputError(
            f"task id {untrusted.shown(task_id)} is not text of 1 to {MAX_TASK_ID_CHARS} "
            "characters without control characters",
            field="task_id",
            reason="invalid_field",
        )
    for position, output in enumerate(outputs or ()):
        check_output(output, f"outputs[{position}]", now=now)


def check_output(output: ProviderOutput, where: str, *, now: datetime | None = None) -> None:
    def refuse(name: str, why: str) -> MalformedInputError:
        return MalformedInputError(
            f"{where}.{name}: {why}", field=f"{where}.{name}", reason="invalid_field"
        )

    index, url, size = output.index, output.url, output.size
    if type(index) is not int or not 0 <= index <= MAX_OUTPUT_INDEX:
        raise refuse("index", f"not an integer in [0, {MAX_OUTPUT_INDEX}]")
    if not isinstance(url, str) or not 0 < len(url) <= MAX_URL_CHARS or _CONTROL.search(url):
        raise refuse("url", f"not text of 1 to {MAX_URL_CHARS} characters without controls")
    if output.expires_at is not None:
        if not isinstance(output.expires_at, datetime):
            raise refuse("expires_at", "not a time")
        untrusted.instant(output.expires_at, f"{where}.expires_at", now=now)
    sha256 = output.sha256
    if sha256 is not None and not (isinstance(sha256, str) and _SHA256.fullmatch(sha256)):
        raise refuse("sha256", "not 64 hex characters")
    if size is not None and (type(size) is not int or not 0 <= size <= MAX_OUTPUT_BYTES):
        raise refuse("size", f"not an integer in [0, {MAX_OUTPUT_BYTES}]")
    content_type = output.content_type
    if content_type is not None and (
        not isinstance(content_type, str)
        or len(content_type) > MAX_CONTENT_TYPE_CHARS
        or _CONTROL.search(content_type)
    ):
        raise refuse("content_type", f"not text of at most {MAX_CONTENT_TYPE_CHARS} characters")
    if len(output.captions) > MAX_CAPTIONS:
        raise refuse("captions", f"more than {MAX_CAPTIONS} caption tracks")
    for at, caption in enumerate(output.captions):
        if len(caption.text.encode()) > MAX_CAPTION_BYTES:
            raise refuse(f"captions[{at}].text", f"over {MAX_CAPTION_BYTES} bytes")
        if len(caption.language) > 35 or len(caption.label) > 100 or len(caption.kind) > 16:
            raise refuse(f"captions[{at}]", "language, label or kind too long")


MAX_CAPTIONS = 8
MAX_CAPTION_BYTES = 1024 * 1024


class RefreshedUrl(msgspec.Struct, frozen=True, kw_only=True):
    url: str
    expires_at: datetime | None


TERMINAL_TASK_STATUSES = frozenset({"SUCCEEDED", "FAILED", "CANCELLED"})


class ProviderAdapter(Protocol):
    """One provider's API, as the fetch stage, the poller and the callback route need it.

    Statuses are normalised to RUNNING, SUCCEEDED, FAILED or CANCELLED."""

    name: str
    poll_interval_seconds: float  # the provider's documented cadence (or our assumption)
    poll_jitter_seconds: float  # ± this much, uniformly

    async def get_task(self, task_id: str) -> ProviderTask:
        """The task as the provider sees it now. Raises the classified network errors."""
        ...

    async def refresh_output_url(
        self, task_id: str, output_index: int, *, expires_at: datetime | None = None
    ) -> RefreshedUrl:
        """A fresh download URL for an existing output; OutputLostError when none can be had.

        ``expires_at`` is when the stored URL was said to expire: a provider that never
        re-issues a URL answers OutputLostError once it has passed."""
        ...

    def download_headers(self, url: str) -> dict[str, str]:
        """Credentials a download of ``url`` needs: empty unless ``url`` is on one of this
        provider's own origins (the fetcher drops them again on any cross-origin hop)."""
        ...


class _TaskDoc(msgspec.Struct):
    id: str
    status: str
    outputs: list[dict[str, Any]] = msgspec.field(default_factory=list)


class GenericAdapter:
    """A provider with a task endpoint and a refresh endpoint, configured by paths.

    ``GET {api_base_url}{task_path}`` → ``{"id", "status", "outputs": [{"index", "url",
    "expires_at", "sha256", "size", "content_type"}]}``; ``POST {refresh_path}`` →
    ``{"url", "expires_at"}``, 404 or 410 when the output is gone.
    """

    poll_interval_seconds = 5.0
    poll_jitter_seconds = 1.0

    def __init__(self, name: str, config: ProviderConfig, fetcher: Fetcher) -> None:
        self.name = name
        self._config = config
        self._fetcher = fetcher
        if config.poll_interval_seconds is not None:
            self.poll_interval_seconds = config.poll_interval_seconds
        if config.poll_jitter_seconds is not None:
            self.poll_jitter_seconds = config.poll_jitter_seconds

    def download_headers(self, url: str) -> dict[str, str]:
        # Generic providers hand out self-authorising (signed) URLs.
        return {}

    def _headers(self) -> dict[str, str]:
        return {"Authorization": self._config.auth_header} if self._config.auth_header else {}

    def _url(self, path: str, **values: object) -> str:
        if not self._config.api_base_url:
            raise OutputLostError(f"provider {self.name} has no api_base_url: cannot ask it")
        # A task id fills one path segment, never more (``path_segment``).
        safe = {k: path_segment(v) if isinstance(v, str) else v for k, v in values.items()}
        return self._config.api_base_url.rstrip("/") + path.format(**safe)

    def _expiry(self, value: Any) -> datetime | None:
        if value is None:
            return datetime.now(UTC) + timedelta(seconds=self._config.default_url_ttl_seconds)
        try:
            parsed = msgspec.convert(value, datetime)
        except msgspec.ValidationError:
            raise InvalidResponseError(f"provider {self.name}: bad expires_at") from None
        return untrusted.instant(parsed, "expires_at")

    async def get_task(self, task_id: str) -> ProviderTask:
        raw = await self._fetcher.fetch_json(
            "GET", self._url(self._config.task_path, task_id=task_id), headers=self._headers()
        )
        try:
            doc = msgspec.convert(raw, _TaskDoc)
            outputs = [
                ProviderOutput(
                    index=int(o["index"]),
                    url=str(o["url"]),
                    expires_at=self._expiry(o.get("expires_at")),
                    sha256=o.get("sha256"),
                    size=o.get("size"),
                    content_type=o.get("content_type"),
                )
                for o in doc.outputs
            ]
        except (msgspec.ValidationError, KeyError, TypeError, ValueError):
            raise InvalidResponseError(f"provider {self.name}: malformed task document") from None
        return ProviderTask(provider_task_id=doc.id, status=doc.status.upper(), outputs=outputs)

    async def refresh_output_url(
        self, task_id: str, output_index: int, *, expires_at: datetime | None = None
    ) -> RefreshedUrl:
        url = self._url(self._config.refresh_path, task_id=task_id, output_index=output_index)
        try:
            raw = await self._fetcher.fetch_json("POST", url, headers=self._headers(), json_body={})
        except AivedioError as exc:
            if exc.http_status in (404, 410):
                raise OutputLostError(
                    f"provider {self.name}: output is gone ({exc.http_status})"
                ) from None
            raise
        if not isinstance(raw, dict) or not isinstance(raw.get("url"), str):
            raise InvalidResponseError(f"provider {self.name}: malformed refresh answer")
        return RefreshedUrl(url=raw["url"], expires_at=self._expiry(raw.get("expires_at")))
