"""The [api] section's checks: ``public_base_url`` (the base of every absolute URL the API
hands out), the listen address it defaults to, and ``[api.rate_limits]``."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from aivedio.config.api import (
    ApiConfig,
    RateLimitConfig,
    RateLimitsConfig,
    is_loopback_host,
    listen_base_url,
    require_public_base_url,
    validate_api,
)
from aivedio.config.load import load_config
from aivedio.errors import ConfigError
from tests.conftest import TEST_KEY


@pytest.mark.parametrize(
    "host", ["0.0.0.0", "::", "", "10.0.0.5", "192.0.2.1", "api.internal", "2001:db8::1"]
)
def test_a_non_loopback_host_needs_public_base_url(host: str) -> None:
    with pytest.raises(ConfigError, match=r"api\.public_base_url: required when api\.host"):
        validate_api(ApiConfig(host=host))
    validate_api(ApiConfig(host=host, public_base_url="https://video.example"))


@pytest.mark.parametrize("host", ["127.0.0.1", "127.1.2.3", "::1", "localhost", "LOCALHOST"])
def test_a_loopback_host_may_leave_public_base_url_empty(host: str) -> None:
    assert is_loopback_host(host)
    validate_api(ApiConfig(host=host))


@pytest.mark.parametrize(
    "url",
    [
        "https://video.example",
        "https://video.example/",
        "http://127.0.0.1:8080",
        "https://video.example:8443/api",
        "https://[2001:db8::1]:443",
    ],
)
def test_good_public_base_urls(url: str) -> None:
    validate_api(ApiConfig(host="0.0.0.0", public_base_url=url))


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("video.example", "absolute http"),
        ("//video.example", "absolute http"),
        ("ftp://video.example", "absolute http"),
        ("https:///path", "absolute http"),
        ("https://video.example?x=1", "no query"),
        ("https://video.example/?", "no query"),
        ("https://video.example#top", "no query"),
        ("https://video.example/#", "no query"),
        ("https://user:pw@video.example", "userinfo"),
        ("https://@video.example", "userinfo"),
        ("https://video.example:99999", "TCP port"),
        ("https://video.example:https", "TCP port"),
        (" https://video.example", "whitespace"),
        ("https://video.example\t", "whitespace"),
        ("https://video.example/\x00", "control"),
        ("https://video.exa mple", "whitespace"),
    ],
)
def test_bad_public_base_urls_are_refused_naming_the_field(url: str, says: str) -> None:
    with pytest.raises(ConfigError, match=rf"api\.public_base_url: .*{says}"):
        validate_api(ApiConfig(public_base_url=url))


def test_the_served_host_is_checked_as_well_as_the_configured_one() -> None:
    with pytest.raises(ConfigError, match="public_base_url: required"):
        require_public_base_url(ApiConfig(host="127.0.0.1"), "0.0.0.0")
    require_public_base_url(ApiConfig(host="0.0.0.0", public_base_url="https://x.test"), "::")


def test_listen_base_url_brackets_ipv6() -> None:
    assert listen_base_url("127.0.0.1", 8080) == "http://127.0.0.1:8080"
    assert listen_base_url("::1", 8080) == "http://[::1]:8080"
    assert listen_base_url("localhost", 1) == "http://localhost:1"


def test_loading_a_config_that_listens_everywhere_without_public_base_url_fails() -> None:
    env = {"AIVEDIO_URL_ENCRYPTION_KEY": TEST_KEY, "AIVEDIO_API__HOST": "0.0.0.0"}
    with pytest.raises(ConfigError, match=r"api\.public_base_url: required"):
        load_config(None, environ=env)
    env["AIVEDIO_API__PUBLIC_BASE_URL"] = "https://video.example"
    assert load_config(None, environ=env).api.public_base_url == "https://video.example"


@pytest.mark.parametrize(
    ("limits", "says"),
    [
        ({"key": RateLimitConfig(rate_per_second=0, burst=1)}, "rate_limits.key.rate_per_second"),
        ({"address": RateLimitConfig(rate_per_second=1, burst=0)}, "rate_limits.address.burst"),
        (
            {"auth_failure": RateLimitConfig(rate_per_second=float("inf"), burst=1)},
            "rate_limits.auth_failure.rate_per_second",
        ),
        (
            {"callback_providers": {"fal": RateLimitConfig(rate_per_second=-1, burst=9)}},
            r"rate_limits.callback_providers.fal.rate_per_second",
        ),
        ({"trusted_proxies": ["10.0.0.0/33"]}, "rate_limits.trusted_proxies"),
        ({"trusted_proxies": ["proxy.internal"]}, "rate_limits.trusted_proxies"),
        ({"max_buckets": 0}, "rate_limits.max_buckets"),
    ],
)
def test_bad_rate_limits_are_refused_naming_the_field(limits: dict[str, Any], says: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(f"api.{says}")):
        validate_api(ApiConfig(rate_limits=RateLimitsConfig(**limits)))


def test_rate_limits_from_toml_and_the_environment(tmp_path: Path) -> None:
    path = tmp_path / "aivedio.toml"
    path.write_text(
        "[api.rate_limits]\n"
        'trusted_proxies = ["10.0.0.0/8", "fd00::1"]\n'
        "key = { rate_per_second = 5.0, burst = 20 }\n"
        "[api.rate_limits.callback_providers.fal]\n"
        "rate_per_second = 500.0\nburst = 5000\n"
        '[providers.fal]\nadapter = "fal"\n'
    )
    env = {"AIVEDIO_URL_ENCRYPTION_KEY": TEST_KEY, "AIVEDIO_API__RATE_LIMITS__ENABLED": "false"}
    limits = load_config(path, environ=env).api.rate_limits
    assert limits.enabled is False
    assert limits.key == RateLimitConfig(rate_per_second=5.0, burst=20)
    assert limits.callback_providers["fal"].burst == 5000
    assert limits.address == RateLimitsConfig().address
    path.write_text("[api.rate_limits]\nkey = { rate_per_second = 5.0, bust = 20 }\n")
    with pytest.raises(ConfigError, match=re.escape("api.rate_limits.key.bust: unknown key")):
        load_config(path, environ=env)


def test_a_providers_own_callback_rate_must_name_a_configured_provider(tmp_path: Path) -> None:
    path = tmp_path / "aivedio.toml"
    rate = "[api.rate_limits.callback_providers.fal]\nrate_per_second = 5.0\nburst = 50\n"
    path.write_text(rate)
    env = {"AIVEDIO_URL_ENCRYPTION_KEY": TEST_KEY}
    with pytest.raises(ConfigError, match=re.escape("callback_providers.fal: no [providers.fal]")):
        load_config(path, environ=env)
    path.write_text(rate + '[providers.fal]\nadapter = "fal"\n')
    assert load_config(path, environ=env).api.rate_limits.callback_providers["fal"].burst == 50
