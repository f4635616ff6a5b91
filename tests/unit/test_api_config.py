"""The [api] section's checks: ``public_base_url`` (the base of every absolute URL the API
hands out) and the listen address it defaults to."""

from __future__ import annotations

import pytest

from aivedio.api_config import (
    ApiConfig,
    is_loopback_host,
    listen_base_url,
    require_public_base_url,
    validate_api,
)
from aivedio.config import load_config
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
