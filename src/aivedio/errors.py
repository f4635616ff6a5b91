"""The error taxonomy: one root, a few categories, each carrying its retry class.

Pipeline code raises only these. Foreign exceptions (asyncpg, aiohttp, botocore) are
translated at their seam with ``raise … from exc``. The queue reads ``retry`` to decide
what happens to a failed job, so the decision lives here and nowhere else.
"""

from __future__ import annotations

import enum


class Retry(enum.Enum):
    """What the queue does with a job that failed with this error."""

    BACKOFF = "backoff"  # retry with exponential backoff and full jitter, within the budget
    NEVER = "never"  # deterministic: straight to the dead state
    LIMITED = "limited"  # retry, but only a few times (checksum mismatch)


class AivedioError(Exception):
    """Root of every error aivedio raises on purpose."""

    error_class: str = "internal"
    retry: Retry = Retry.BACKOFF
    http_status: int | None = None  # the remote status that caused it, when one did

    def __init__(self, detail: str = "", *, retry_after_seconds: float | None = None) -> None:
        super().__init__(detail or self.__doc__ or self.error_class)
        self.detail = detail or (self.__doc__ or self.error_class)
        self.retry_after_seconds = retry_after_seconds


class ConfigError(AivedioError):
    """The configuration is invalid; nothing may start."""

    error_class = "config"
    retry = Retry.NEVER


class DatabaseError(AivedioError):
    """PostgreSQL failed or could not be reached."""

    error_class = "database"
    # Set at the seam (``store/database.py``) when the driver said the server went away: a
    # dependency down, never the fault of the row or request being worked on.
    server_gone: bool = False


class InvalidValueError(DatabaseError):
    """PostgreSQL refused a value (a CHECK constraint, a NUL in text, a number out of range):
    the input is wrong, not the database, so it is no outage and retrying cannot help."""

    error_class = "invalid_value"
    retry = Retry.NEVER


class StaleStateError(AivedioError):
    """A compare-and-set found another state or version: someone else won; do not overwrite."""

    error_class = "stale_state"
    retry = Retry.NEVER


class TransitionError(AivedioError):
    """A state change that the transition table does not allow."""

    error_class = "illegal_transition"
    retry = Retry.NEVER


class LeaseLostError(AivedioError):
    """The job's lease expired or was taken over; its fencing token no longer matches."""

    error_class = "lease_lost"
    retry = Retry.NEVER


class NotFoundError(AivedioError):
    """A named record does not exist."""

    error_class = "not_found"
    retry = Retry.NEVER


class TransientError(AivedioError):
    """A transient network or service failure: retry with backoff."""

    error_class = "transient"


class ThrottledError(AivedioError):
    """The remote side asked us to slow down (429); honour Retry-After."""

    error_class = "throttled"


class ProviderServerError(AivedioError):
    """The provider answered 5xx."""

    error_class = "provider_5xx"


class NotYetAvailableError(AivedioError):
    """The output is not there yet (a short 404 window after success)."""

    error_class = "not_yet_available"
    retry = Retry.LIMITED


class UrlExpiredError(AivedioError):
    """The signed URL expired (403 or past its expiry): refresh it, never retry it."""

    error_class = "url_expired"
    retry = Retry.NEVER


class TooLargeError(AivedioError):
    """The body exceeds the configured cap."""

    error_class = "too_large"
    retry = Retry.NEVER


class ChecksumMismatchError(AivedioError):
    """Size or SHA-256 differs from what was expected."""

    error_class = "checksum_mismatch"
    retry = Retry.LIMITED


class InvalidMediaError(AivedioError):
    """The bytes are not a valid video by our rules; deterministic."""

    error_class = "invalid_media"
    retry = Retry.NEVER

    def __init__(
        self,
        detail: str = "",
        *,
        reasons: list[str] | None = None,
        retry_after_seconds: float | None = None,
    ) -> None:
        super().__init__(detail, retry_after_seconds=retry_after_seconds)
        # Reason codes (``too_many_streams``, ``decode_failed``…) for the verdict and metrics.
        self.reasons: list[str] = list(reasons or [])


class ResourceExhaustedError(AivedioError):
    """A process ran out of memory, time, disk or another bounded resource."""

    error_class = "resource_exhausted"
    retry = Retry.LIMITED


class RenderError(AivedioError):
    """ffmpeg failed to render an output from a source that passed validation: probably
    deterministic, so retried only a few times, alone."""

    error_class = "render_failed"
    retry = Retry.LIMITED


class SigningError(RenderError):
    """An output could not be signed with the platform's C2PA manifest (the signer or its
    key failed): the output fails like a failed render, unless configured to be published
    unsigned."""

    error_class = "signing_failed"


class PoisonMediaError(AivedioError):
    """The source crashed its media jobs too often (a decoder killed by a crash signal, or a
    worker dying mid-job): the asset is quarantined with its source kept, never retried."""

    error_class = "poison_media"
    retry = Retry.NEVER


class PolicyBlockedError(AivedioError):
    """The network policy refused the target (SSRF defence); never retried, always alerted."""

    error_class = "policy_blocked"
    retry = Retry.NEVER


class ModerationRejectedError(AivedioError):
    """The moderator rejected the output."""

    error_class = "moderation_rejected"
    retry = Retry.NEVER


class InvalidResponseError(AivedioError):
    """The remote answered something we will not accept (an encoded body, a 4xx, a bad header)."""

    error_class = "invalid_response"
    retry = Retry.NEVER


class MalformedInputError(InvalidResponseError):
    """A body, field or flag from outside is malformed or out of bounds (``untrusted.py``):
    the sender's mistake, refused as 400 at the API; retrying the same input cannot help."""

    error_class = "malformed"

    def __init__(self, detail: str = "", *, field: str = "$", reason: str = "malformed") -> None:
        super().__init__(detail)
        self.field = field  # where, as a JSON path (``$.outputs[0].size``) or a flag's name
        self.reason = reason  # what: too_deep, nul_character, out_of_range, invalid_field…


class OutputLostError(AivedioError):
    """The provider confirms the output can no longer be downloaded."""

    error_class = "output_lost"
    retry = Retry.NEVER


class DeferredError(AivedioError):
    """Not attempted: the stage put the job off (a provider's circuit is open); the attempt
    is refunded and the job comes back after ``retry_after_seconds``."""

    error_class = "deferred"


def unexpected(exc: BaseException, detail: str) -> AivedioError:
    """An exception no seam translated: a bug until shown otherwise. It is retried with
    backoff like a transient failure (a crash that repeats goes dead within the budget), and
    recorded as ``internal:<its class>`` (``internal:TypeError``), so the job's record, its
    log events and ``aivedio status`` say what crashed, not only that something did."""
    error = TransientError(detail)
    error.error_class = f"internal:{type(exc).__name__}"
    return error
