"""The [backlog] section's validation, and the pressure rule (on at the threshold, off below
clear_ratio of it) as a pure function."""

from __future__ import annotations

import pytest

from aivedio.config.backlog import BacklogConfig, validate_backlog
from aivedio.config.load import load_config
from aivedio.errors import ConfigError
from aivedio.pipeline.upkeep.backlog import MEDIA_OLDEST, NEAR_EXPIRY, Reading, active_signals
from tests.conftest import TEST_KEY


def test_defaults_are_valid_and_production_minded() -> None:
    cfg = BacklogConfig()
    validate_backlog(cfg)
    assert cfg.media_oldest_job_seconds == 300.0
    assert cfg.poison_crash_count == 2


@pytest.mark.parametrize(
    ("settings", "key"),
    [
        ({"check_interval_seconds": 0}, "backlog.check_interval_seconds"),
        ({"media_oldest_job_seconds": -1}, "backlog.media_oldest_job_seconds"),
        ({"near_expiry_outputs": -1}, "backlog.near_expiry_outputs"),
        ({"near_expiry_window_seconds": 0}, "backlog.near_expiry_window_seconds"),
        ({"clear_ratio": 0}, "backlog.clear_ratio"),
        ({"clear_ratio": 1.5}, "backlog.clear_ratio"),
        ({"retry_after_seconds": 0}, "backlog.retry_after_seconds"),
        ({"defer_seconds": 10, "defer_max_seconds": 5}, "backlog.defer_max_seconds"),
        ({"poison_crash_count": -1}, "backlog.poison_crash_count"),
        ({"media_slots_under_expiry_pressure": -1}, "backlog.media_slots_under_expiry"),
    ],
)
def test_errors_name_the_key(settings: dict[str, float], key: str) -> None:
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        validate_backlog(BacklogConfig(**settings))  # type: ignore[arg-type]


def test_the_section_loads_from_the_environment() -> None:
    env = {
        "AIVEDIO_URL_ENCRYPTION_KEY": TEST_KEY,
        "AIVEDIO_BACKLOG__POISON_CRASH_COUNT": "3",
        "AIVEDIO_BACKLOG__REFUSE_UPLOADS": "false",
    }
    cfg = load_config(None, environ=env).backlog
    assert cfg.poison_crash_count == 3 and cfg.refuse_uploads is False
    with pytest.raises(ConfigError, match=r"backlog\.nope: unknown key"):
        load_config(None, environ={**env, "AIVEDIO_BACKLOG__NOPE": "1"})


def test_signals_turn_on_at_the_threshold_and_off_below_the_clear_ratio() -> None:
    cfg = BacklogConfig(media_oldest_job_seconds=300, near_expiry_outputs=10, clear_ratio=0.5)
    none: frozenset[str] = frozenset()
    assert active_signals(cfg, none, 299, 9) == none
    assert active_signals(cfg, none, 300, 0) == {MEDIA_OLDEST}
    assert active_signals(cfg, none, 0, 10) == {NEAR_EXPIRY}
    on = frozenset({MEDIA_OLDEST, NEAR_EXPIRY})
    assert active_signals(cfg, on, 150, 5) == on  # between: stays on
    assert active_signals(cfg, on, 149, 4) == none
    off = BacklogConfig(media_oldest_job_seconds=0, near_expiry_outputs=0)
    assert active_signals(off, none, 10**6, 10**6) == none  # 0 turns a signal off
    assert Reading().describe() == "no pressure"
