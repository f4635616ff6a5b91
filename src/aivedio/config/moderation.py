"""The [moderation] section: which moderator decides, and how it is reached.

There is no silent default: a worker refuses to start until ``backend`` is chosen, and the
development policy allows everything only when ``allow_all = true`` is written out.
"""

from __future__ import annotations

from urllib.parse import urlsplit

import msgspec

from aivedio.errors import ConfigError


class LocalModerationConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """A rule-based policy for development and tests."""

    allow_all: bool = False
    # Provider safety labels that reject or send to review outright.
    reject_labels: list[str] = msgspec.field(default_factory=list)
    review_labels: list[str] = msgspec.field(default_factory=list)
    # Media longer than this goes to review (0: no limit).
    review_over_seconds: float = 0.0


class ModerationConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    backend: str = ""  # "http" or "local"; empty: the worker refuses to start
    version: str = "v1"  # stored with every verdict
    url: str = ""
    auth_header: str = ""  # secret, e.g. "Bearer …"
    timeout_seconds: float = 10.0
    attempts: int = 3  # per call, with backoff, before the job waits and tries again
    backoff_base_seconds: float = 0.5
    # While the moderator is unavailable the asset stays private; its job looks again after.
    unavailable_retry_seconds: float = 30.0
    frame_width: int = 480
    max_scene_frames: int = 6
    scene_threshold: float = 0.35
    # A rejected source is kept in quarantine this long for appeal and audit.
    reject_retention_days: float = 30.0
    local: LocalModerationConfig = msgspec.field(default_factory=LocalModerationConfig)


def validate_moderation(cfg: ModerationConfig) -> None:
    """Checks that hold whenever a value is set; ``require_moderation`` adds the start check."""
    if cfg.backend not in ("", "http", "local"):
        raise ConfigError("config error: moderation.backend: one of http, local")
    if cfg.backend == "http":
        parts = urlsplit(cfg.url)
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.username:
            raise ConfigError(
                "config error: moderation.url: an http(s) URL without credentials is needed "
                'with backend = "http"'
            )
    for name in ("timeout_seconds", "attempts", "unavailable_retry_seconds", "frame_width"):
        if getattr(cfg, name) <= 0:
            raise ConfigError(f"config error: moderation.{name}: must be positive")
    if not 0 < cfg.scene_threshold < 1:
        raise ConfigError("config error: moderation.scene_threshold: must be in (0, 1)")


def require_moderation(cfg: ModerationConfig) -> None:
    """A worker publishes assets, so it must know who decides: no backend, no start."""
    if not cfg.backend:
        raise ConfigError(
            'config error: moderation.backend: not set; choose "http" (with url) or '
            '"local" (with its rules; [moderation.local] allow_all = true only for '
            "development). Unmoderated assets are never published."
        )
