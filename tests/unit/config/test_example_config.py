"""The documented example configuration is valid and matches the built-in defaults."""

from __future__ import annotations

from pathlib import Path

from aivedio.config.load import load_config
from tests.conftest import TEST_KEY

EXAMPLE = Path(__file__).resolve().parents[3] / "config" / "aivedio.example.toml"


def test_example_config_loads_and_equals_the_defaults() -> None:
    env = {"AIVEDIO_URL_ENCRYPTION_KEY": TEST_KEY}
    assert load_config(EXAMPLE, environ=env) == load_config(None, environ=env)
