"""What every vendor adapter shares: its API origin, credentials, polling cadence, refresh rule.

Each vendor module states only its knowledge (paths, status names, where outputs live, how
long they last); the rules that must hold for all of them live here once:

* API calls go through the provider's guarded fetcher (same network policy as downloads,
  no redirects followed), with the vendor's credentials on the API origin only.
* ``download_headers`` hands a credential to a download only when the URL is on one of the
  vendor's own origins; the fetcher drops it again on any cross-origin redirect hop.
* A refresh re-reads the task; it never submits a generation. A vendor that never re-issues
  a URL (``refreshable = False``) answers OutputLostError once the documented lifetime has
  passed, so the fetch stage ends in OUTPUT_LOST instead of retrying a dead URL.
* A vendor that shut its API down (``shut_down_on``) takes no new registration: no watched
  task, no callback, no ingested output (``check_open``, a PolicyBlockedError naming the
  date); a task still running then can never finish (the vendor's ``get_task`` answers
  FAILED without asking), and a stored URL cannot be refreshed (OUTPUT_LOST).
* Statuses are normalised to RUNNING, SUCCEEDED, FAILED, CANCELLED; a status a vendor adds
  later reads as RUNNING (keep polling) rather than as a failure.
* A task id comes from a tenant (``POST /v1/generation-tasks``) or from an unsigned callback
  body, and is put into a URL that carries our credentials: ``check_task_id`` refuses one
  that is not a plain id (``/``, ``?``, ``#``, ``%``, ``..``: a path of the vendor's API other
  than the task's, since URL parsers resolve dot segments), and ``path_segment`` encodes it
  where it is used all the same.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, date, datetime, timedelta
from typing import Any, ClassVar
from urllib.parse import urlencode, urlsplit

import msgspec

from aivedio import untrusted
from aivedio.config.load import ProviderConfig
from aivedio.errors import (
    AivedioError,
    ConfigError,
    InvalidResponseError,
    MalformedInputError,
    OutputLostError,
    PolicyBlockedError,
)
from aivedio.net.fetch import Fetcher
from aivedio.providers.seam import (
    ProviderOutput,
    ProviderTask,
    RefreshedUrl,
)
from aivedio.providers.seam import (
    path_segment as path_segment,  # re-exported: the adapters import it from here
)


class CallbackHint(msgspec.Struct, frozen=True, kw_only=True):
    """What a callback body says. ``outputs`` is None when the body carries none we may use
    (unsigned bodies, or a scheme that names the task only): then the task is read from the
    provider before anything is recorded."""

    task_id: str
    status: str
    outputs: list[ProviderOutput] | None = None
    # The delivery's id when the body names it (OpenRouter's ``<job_id>-<status>``) rather
    # than a signature header.
    event_id: str | None = None


def origin(url: str) -> tuple[str, str, int]:
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    port = parts.port or (443 if scheme == "https" else 80)
    return scheme, (parts.hostname or "").lower(), port


def parse_time(value: Any, field: str = "time") -> datetime | None:
    """ISO 8601 text (no offset: UTC), or Unix seconds (or milliseconds, as Kling sends),
    held to the window of a time from outside (``untrusted.instant``)."""
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        raise InvalidResponseError(f"{field} is a boolean, not a time")
    if isinstance(value, int | float):
        if not untrusted.INT64_MIN <= value <= untrusted.INT64_MAX:
            raise MalformedInputError(
                f"{field}: not a Unix time", field=field, reason="time_out_of_range"
            )
        seconds = value / 1000 if value > 10**11 else value
        return untrusted.unix_instant(seconds, field)
    if isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            raise InvalidResponseError(f"{field} is not ISO 8601") from None
        return untrusted.instant(parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC), field)
    raise InvalidResponseError(f"{field} has an unexpected type")


def decode_object(body: bytes | Any) -> dict[str, Any]:
    """A vendor's JSON object: raw bytes (a webhook body) are decoded at the edge's bounds
    (``untrusted.decode``); an answer of its API arrives decoded so by the fetcher."""
    if isinstance(body, bytes | bytearray | memoryview):
        body = untrusted.decode(bytes(body), bounds=untrusted.PROVIDER_BOUNDS)
    if not isinstance(body, dict):
        raise InvalidResponseError("body is not a JSON object")
    return body


def text(doc: Mapping[str, Any], key: str) -> str:
    value = doc.get(key)
    if not isinstance(value, str) or not value:
        raise InvalidResponseError(f"field {key!r} is missing or not text")
    return value


class VendorAdapter:
    """The shared half of a vendor adapter; subclasses set the class attributes and
    implement ``get_task`` (and, for callbacks, ``parse_callback``)."""

    kind: ClassVar[str]
    default_api_base_url: ClassVar[str]
    default_poll_interval_seconds: ClassVar[float]
    default_poll_jitter_seconds: ClassVar[float] = 1.0
    # None: the vendor does not say; [providers.NAME] default_url_ttl_seconds applies.
    lifetime_seconds: ClassVar[float | None] = None
    refreshable: ClassVar[bool] = True
    # "none", "standard_webhooks", "fal_ed25519", "openrouter_hmac", "unsigned",
    # "minimax_challenge"
    callback_scheme: ClassVar[str] = "none"
    # True when a verified callback can only come from our own account (a secret of the
    # account's, as Standard Webhooks' whsec_): its body may be recorded for a task we never
    # saw. fal signs every customer's webhooks with one key, so a verified fal body proves
    # fal sent it, not that the request is ours: for an unknown task it is a hint.
    callback_signed_by_account: ClassVar[bool] = False
    required_secrets: ClassVar[tuple[str, ...]] = ("api_key",)
    statuses: ClassVar[Mapping[str, str]] = {}
    # The day the vendor shut the API down (UTC): nothing new is registered from it on.
    shut_down_on: ClassVar[date | None] = None
    display_name: ClassVar[str] = ""  # how errors name the vendor's API (default: ``kind``)

    @classmethod
    def shut_down(cls, now: datetime | None = None) -> bool:
        when = cls.shut_down_on
        return when is not None and (now or datetime.now(UTC)).date() >= when

    @classmethod
    def shut_down_detail(cls) -> str:
        """Which API went, and on which day (said only of a vendor with ``shut_down_on``)."""
        return f"the {cls.display_name or cls.kind} API was shut down on {cls.shut_down_on}"

    @classmethod
    def check_open(cls, provider: str, now: datetime | None = None) -> None:
        """PolicyBlockedError (``provider_shut_down``) once the vendor's API is gone: no new
        task or output may be registered for it."""
        if cls.shut_down(now):
            raise PolicyBlockedError(
                f"provider_shut_down: {cls.shut_down_detail()}; provider {provider!r} "
                f"(adapter {cls.kind!r}) takes no new tasks or outputs"
            )

    def __init__(self, name: str, config: ProviderConfig, fetcher: Fetcher) -> None:
        for key in self.required_secrets:
            if not getattr(config, key):
                raise ConfigError(
                    f"config error: providers.{name}.{key}: the {self.kind} adapter needs it"
                )
        self.name = name
        self.config = config
        self.fetcher = fetcher
        self.api_base = (config.api_base_url or self.default_api_base_url).rstrip("/")
        self.poll_interval_seconds = (
            config.poll_interval_seconds
            if config.poll_interval_seconds is not None
            else self.default_poll_interval_seconds
        )
        self.poll_jitter_seconds = (
            config.poll_jitter_seconds
            if config.poll_jitter_seconds is not None
            else self.default_poll_jitter_seconds
        )

    # -- the vendor's API ------------------------------------------------------------------

    def api_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.config.api_key}"}

    @classmethod
    def check_task_id(cls, task_id: str) -> None:
        """Refuse (PolicyBlockedError, ``invalid_task_id``) an id this vendor cannot have issued."""
        path_segment(task_id)

    def api_url(self, path: str, **query: str) -> str:
        return self.api_base + path + (f"?{urlencode(query)}" if query else "")

    async def call(self, method: str, url: str, json_body: object = None) -> dict[str, Any]:
        raw = await self.fetcher.fetch_json(
            method, url, headers=self.api_headers(), json_body=json_body
        )
        return decode_object(raw)

    def status(self, value: object) -> str:
        return self.statuses.get(str(value), "RUNNING")

    def expiry(self, start: datetime | None = None) -> datetime:
        """When an output seen now (or made at ``start``) stops being downloadable."""
        seconds = self.lifetime_seconds or self.config.default_url_ttl_seconds
        return (start or datetime.now(UTC)) + timedelta(seconds=seconds)

    async def get_task(self, task_id: str) -> ProviderTask:
        raise NotImplementedError

    @classmethod
    def parse_callback(cls, body: bytes, config: ProviderConfig) -> CallbackHint:
        raise InvalidResponseError(f"{cls.kind} sends no callbacks")

    # -- downloads ---------------------------------------------------------------------------

    def credential_origins(self) -> set[tuple[str, str, int]]:
        """Origins that may receive ``download_credentials`` (none by default: signed URLs)."""
        return set()

    def download_credentials(self) -> dict[str, str]:
        return {}

    def download_headers(self, url: str) -> dict[str, str]:
        if origin(url) in self.credential_origins():
            return self.download_credentials()
        return {}

    # -- refresh ---------------------------------------------------------------------------

    async def refresh_output_url(
        self, task_id: str, output_index: int, *, expires_at: datetime | None = None
    ) -> RefreshedUrl:
        now = datetime.now(UTC)
        if self.shut_down(now):
            raise OutputLostError(f"provider {self.name}: {self.shut_down_detail()}")
        if not self.refreshable and expires_at is not None and expires_at <= now:
            raise OutputLostError(
                f"provider {self.name} ({self.kind}) does not re-issue output URLs and the "
                "output's documented lifetime has passed"
            )
        try:
            task = await self.get_task(task_id)
        except AivedioError as exc:
            if exc.http_status in (404, 410):
                raise OutputLostError(
                    f"provider {self.name} no longer knows task ({exc.http_status})"
                ) from None
            raise
        for output in task.outputs:
            if output.index == output_index:
                if output.expires_at is not None and output.expires_at <= now:
                    raise OutputLostError(
                        f"provider {self.name} says the output expired at "
                        f"{output.expires_at.isoformat()}"
                    )
                expires = output.expires_at
                if not self.refreshable and expires_at is not None:
                    # The same file, not a re-issued one: reading the task again never
                    # extends its lifetime (Gemini's expiry is counted from our first read).
                    expires = min(expires, expires_at) if expires else expires_at
                return RefreshedUrl(url=output.url, expires_at=expires)
        raise OutputLostError(
            f"provider {self.name} lists no output {output_index} for the task any more"
        )
