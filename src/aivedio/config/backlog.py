"""The [backlog] section: when the fleet counts as under pressure and what it does then.

Kept apart from ``config/load.py`` like the other stage sections. Two signals, read from the
database by one query (``pipeline/upkeep/backlog.py``): the age of the oldest job waiting in the
media lane, and how many provider outputs not yet stored have a URL that expires within
``near_expiry_window_seconds``. Pressure is on once a signal reaches its threshold and off
once every signal is below ``clear_ratio`` of its threshold (hysteresis, so a fleet that has
just caught up does not flap). Under pressure: optional outputs are deferred (published
later by enrichment), new uploads are refused with 503 and Retry-After, and, while outputs
near expiry wait, a worker's media lane gives slots to its fetch lane. Poison media (a
source that crashed its media jobs ``poison_crash_count`` times) is quarantined whatever
the pressure.
"""

from __future__ import annotations

import msgspec

from aivedio.errors import ConfigError


class BacklogConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    # How often workers read the pressure, and how long the API keeps its cached reading.
    check_interval_seconds: float = 5.0
    # Signal 1: the oldest queued job of the media lane is at least this old (0: off).
    media_oldest_job_seconds: float = 300.0
    # Signal 2: at least this many outputs not yet stored have a URL expiring within the
    # window (0: off).
    near_expiry_outputs: int = 20
    near_expiry_window_seconds: float = 900.0
    # Pressure ends when every signal is below this fraction of its threshold.
    clear_ratio: float = 0.5
    # What pressure does; each can be turned off.
    defer_optional_outputs: bool = True
    refuse_uploads: bool = True
    prioritize_fetch: bool = True
    # A deferred optional output's render job looks again after about this long...
    defer_seconds: float = 60.0
    # ...and renders anyway once it has been deferred this long (nothing waits forever).
    defer_max_seconds: float = 6 * 3600.0
    # POST /v1/videos under pressure: 503 with this Retry-After.
    retry_after_seconds: int = 30
    # While outputs near expiry wait, a worker with a fetch lane claims media work for at
    # most this many slots (0: none) and lets its fetch lane claim this many more.
    media_slots_under_expiry_pressure: int = 1
    fetch_extra_slots_under_expiry_pressure: int = 8
    # A source whose media jobs crashed this many times (a sandboxed ffmpeg/ffprobe killed
    # by a crash signal, or the worker dying mid-job) is quarantined, not retried (0: off).
    poison_crash_count: int = 2


def validate_backlog(cfg: BacklogConfig) -> None:
    """Semantic checks that types alone cannot express. Each names the key it is about."""
    for name in (
        "check_interval_seconds",
        "near_expiry_window_seconds",
        "defer_seconds",
        "defer_max_seconds",
    ):
        if not getattr(cfg, name) > 0:
            raise ConfigError(f"config error: backlog.{name}: must be positive")
    for name in (
        "media_oldest_job_seconds",
        "near_expiry_outputs",
        "media_slots_under_expiry_pressure",
        "fetch_extra_slots_under_expiry_pressure",
        "poison_crash_count",
    ):
        if getattr(cfg, name) < 0:
            raise ConfigError(f"config error: backlog.{name}: must be 0 (off) or more")
    if not 0 < cfg.clear_ratio <= 1:
        raise ConfigError("config error: backlog.clear_ratio: must be in (0, 1]")
    if cfg.retry_after_seconds < 1:
        raise ConfigError("config error: backlog.retry_after_seconds: at least 1")
    if cfg.defer_max_seconds < cfg.defer_seconds:
        raise ConfigError(
            "config error: backlog.defer_max_seconds: must be at least backlog.defer_seconds"
        )
