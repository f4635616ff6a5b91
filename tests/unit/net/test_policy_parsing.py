"""URL parsing differentials: wherever the policy and the HTTP client could read a URL apart.

The rule under test is "refuse, never normalise": whitespace, control characters, a trailing
dot, a port in any but canonical decimal, a non-ASCII host are refused, not cleaned up; a
host allowlist entry ``.name`` allows the subdomains of ``name`` only and ``name`` that one
host; and aiohttp is only ever handed a URL that yarl reads as the policy did.
"""

from __future__ import annotations

import base64
import re
from pathlib import Path

import pytest

from aivedio.config.hosts import check_host_suffixes, host_suffix_within
from aivedio.config.load import load_config
from aivedio.errors import ConfigError, PolicyBlockedError
from aivedio.logs import url_for_log
from aivedio.net.fetch import client_url
from aivedio.net.policy import FetchPolicy, Target, check_location, check_url

DEFAULT = FetchPolicy()
PROVIDER = FetchPolicy(allowed_host_suffixes=(".provider.test", "api.vendor.test"))
KEY = base64.b64encode(bytes(range(32))).decode()


def blocked(url: str, policy: FetchPolicy = DEFAULT) -> str:
    with pytest.raises(PolicyBlockedError) as info:
        check_url(url, policy)
    return info.value.detail


def p(*values: object, id: str) -> object:
    return pytest.param(*values, id=id)


# --- whitespace and control characters, anywhere -------------------------------------------

INVISIBLE = [
    p(" ", id="space"),
    p("\t", id="tab"),
    p("\n", id="lf"),
    p("\r", id="cr"),
    p("\x0b", id="vt"),
    p("\x0c", id="ff"),
    p("\x00", id="nul"),
    p("\x1f", id="unit-separator"),
    p("\x7f", id="del"),
    p("\x85", id="nel"),
    p("\xa0", id="nbsp"),
    p("\u1680", id="ogham-space"),
    p("\u2000", id="en-quad"),
    p("\u200b", id="zero-width-space"),
    p("\u200e", id="lrm"),
    p("\u2028", id="line-separator"),
    p("\u2029", id="paragraph-separator"),
    p("\u3000", id="ideographic-space"),
    p("\ufeff", id="bom"),
]

# Where the character goes in https://cdn.provider.test:443/v.mp4?sig=1#f
POSITIONS = [
    p(0, id="before-scheme"),
    p(5, id="before-colon"),
    p(8, id="after-slashes"),
    p(11, id="inside-host"),
    p(25, id="before-port"),
    p(27, id="inside-port"),
    p(30, id="path"),
    p(38, id="query"),
    p(42, id="fragment"),
    p(43, id="trailing"),
]
BASE = "https://cdn.provider.test:443/v.mp4?sig=1#f"


@pytest.mark.parametrize("char", INVISIBLE)
@pytest.mark.parametrize("at", POSITIONS)
def test_whitespace_or_control_character_anywhere_is_blocked(char: str, at: int) -> None:
    assert check_url(BASE, PROVIDER).host == "cdn.provider.test"
    detail = blocked(BASE[:at] + char + BASE[at:], PROVIDER)
    assert detail.startswith(("malformed_url: whitespace", "malformed_url: control_character"))


@pytest.mark.parametrize("char", INVISIBLE)
@pytest.mark.parametrize(
    "location",
    [
        p("{c}https://cdn.provider.test/v", id="leading"),
        p("https://cdn.provider.test/v{c}", id="trailing"),
        p("https://cdn.pro{c}vider.test/v", id="in-host"),
        p("/fi{c}les/v", id="relative"),
        p("//cdn.provider.test{c}/v", id="scheme-relative"),
    ],
)
def test_location_with_whitespace_or_control_character_is_blocked(char: str, location: str) -> None:
    with pytest.raises(PolicyBlockedError, match=r"^malformed_url: .* in Location"):
        check_location(location.format(c=char))


@pytest.mark.parametrize(
    "location",
    ["https://cdn.provider.test/v?sig=1", "/files/t1/0?x=1", "//cdn.provider.test/v", "v.mp4"],
)
def test_clean_location_passes(location: str) -> None:
    check_location(location)


def test_backslash_in_location_is_blocked() -> None:
    with pytest.raises(PolicyBlockedError, match="backslash in Location"):
        check_location("/\\evil.test/")


# --- trailing dots ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        p("https://cdn.provider.test./v", id="allowed-host"),
        p("https://cdn.provider.test.:443/v", id="with-port"),
        p("https://api.vendor.test./v", id="exact-entry"),
        p("https://provider.test./v", id="apex"),
        p("https://93.184.216.34./", id="dotted-quad"),
        p("https://cdn.provider.test\u3002/v", id="ideographic-full-stop"),
        p("https://cdn.provider.test\uff0e/v", id="fullwidth-full-stop"),
        p("https://cdn.provider.test\uff61/v", id="halfwidth-ideographic-full-stop"),
    ],
)
def test_trailing_dot_host_is_blocked_not_stripped(url: str) -> None:
    assert blocked(url, PROVIDER).startswith("malformed_url:")


# --- the allowlist: ".name" is subdomains only, "name" that host only -----------------------


@pytest.mark.parametrize(
    "host",
    ["cdn.provider.test", "a.b.provider.test", "CDN.Provider.TEST", "api.vendor.test"],
)
def test_allowlist_admits_subdomains_of_a_dotted_entry_and_an_exact_host(host: str) -> None:
    assert check_url(f"https://{host}/v", PROVIDER).host == host.lower()


@pytest.mark.parametrize(
    "host",
    [
        p("provider.test", id="apex-of-dotted-entry"),
        p("x.api.vendor.test", id="subdomain-of-exact-entry"),
        p("vendor.test", id="parent-of-exact-entry"),
        p("evilprovider.test", id="lookalike"),
        p("provider.test.evil.test", id="entry-as-subdomain"),
    ],
)
def test_allowlist_refuses_the_apex_of_a_dotted_entry_and_subdomains_of_an_exact_one(
    host: str,
) -> None:
    assert blocked(f"https://{host}/v", PROVIDER).startswith("host_not_allowed:")


def test_apex_and_subdomains_are_allowed_when_both_entries_are_given() -> None:
    policy = FetchPolicy(allowed_host_suffixes=("provider.test", ".provider.test"))
    assert check_url("https://provider.test/", policy).host == "provider.test"
    assert check_url("https://cdn.provider.test/", policy).host == "cdn.provider.test"


@pytest.mark.parametrize(
    "entry",
    [
        p("", id="empty"),
        p(".", id="only-dot"),
        p("..provider.test", id="two-leading-dots"),
        p("provider.test.", id="trailing-dot"),
        p(" provider.test", id="leading-space"),
        p("*.provider.test", id="wildcard"),
        p("10.0.0.1", id="address"),
        p("stra\u00dfe.de", id="idna-deviation"),
    ],
)
def test_invalid_allowlist_entry_is_refused_naming_it(entry: str) -> None:
    with pytest.raises(ValueError, match=re.escape(repr(entry))):
        check_host_suffixes([entry])
    with pytest.raises(ConfigError):
        FetchPolicy(allowed_host_suffixes=(entry,))


@pytest.mark.parametrize(
    ("narrow", "wide", "within"),
    [
        p("cdn.example.com", [".example.com"], True, id="host-in-subdomains"),
        p(".cdn.example.com", [".example.com"], True, id="subdomains-in-subdomains"),
        p(".example.com", [".example.com"], True, id="same-subdomains"),
        p("example.com", ["example.com"], True, id="same-host"),
        p("cdn.example.com", ["example.com"], False, id="host-not-in-exact-host"),
        p("example.com", [".example.com"], False, id="apex-not-in-subdomains"),
        p(".example.com", ["example.com"], False, id="subdomains-not-in-host"),
        p(".a.example.com", ["a.example.com"], False, id="subdomains-not-in-exact"),
        p("evilexample.com", [".example.com"], False, id="lookalike"),
    ],
)
def test_a_provider_entry_is_within_net_only_if_every_host_it_allows_is(
    narrow: str, wide: list[str], within: bool
) -> None:
    assert host_suffix_within(narrow, wide) is within


def _load(tmp_path: Path, text: str) -> object:
    config = tmp_path / "c.toml"
    config.write_text(text)
    return load_config(config, environ={"AIVEDIO_URL_ENCRYPTION_KEY": KEY})


def test_config_refuses_a_provider_entry_that_relied_on_the_old_apex_match(
    tmp_path: Path,
) -> None:
    # "example.com" allows that one host now; a provider's "cdn.example.com" widens it.
    with pytest.raises(ConfigError, match=r"providers\.acme\.allowed_host_suffixes.*\.name"):
        _load(
            tmp_path,
            '[net]\nallowed_host_suffixes = ["example.com"]\n'
            '[providers.acme]\nallowed_host_suffixes = ["cdn.example.com"]\n',
        )


@pytest.mark.parametrize(
    ("text", "field"),
    [
        p('[net]\nallowed_host_suffixes = ["cdn.example.com."]\n', "net", id="net"),
        p(
            '[providers.acme]\nallowed_host_suffixes = ["*.example.com"]\n',
            "providers.acme",
            id="provider",
        ),
    ],
)
def test_config_refuses_an_invalid_entry_naming_the_field(
    tmp_path: Path, text: str, field: str
) -> None:
    with pytest.raises(ConfigError, match=re.escape(f"{field}.allowed_host_suffixes")):
        _load(tmp_path, text)


# --- ports -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "port",
    [
        p("0443", id="leading-zero"),
        p("00443", id="two-leading-zeros"),
        p("+443", id="plus"),
        p("443 ", id="trailing-space"),
        p("\uff14\uff14\uff13", id="fullwidth-digits"),
        p("4\u200b43", id="zero-width-inside"),
        p("0x1bb", id="hex"),
    ],
)
def test_port_in_any_but_canonical_decimal_is_blocked(port: str) -> None:
    assert blocked(f"https://cdn.provider.test:{port}/v", PROVIDER).startswith("malformed_url:")


# --- non-ASCII hosts ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "host",
    [
        p("b\u00fccher.example", id="unicode-label"),
        p("cdn\u3002provider.test", id="ideographic-full-stop"),
        p("cdn\uff0eprovider.test", id="fullwidth-full-stop"),
        p("cdn\uff61provider.test", id="halfwidth-full-stop"),
        p("\uff43dn.provider.test", id="fullwidth-letter"),
        p("cdn.provider.\u212aest", id="kelvin-sign"),
        p("cdn.prov\u0130der.test", id="dotted-capital-i"),
        p("\u0441dn.provider.test", id="cyrillic-lookalike"),
    ],
)
def test_non_ascii_host_is_blocked_whatever_idna_would_make_of_it(host: str) -> None:
    policy = FetchPolicy(
        allowed_host_suffixes=(".provider.test", ".example", ".b\u00fccher.example")
    )
    assert blocked(f"https://{host}/v", policy).startswith("malformed_url: non-ASCII")


def test_unicode_allowlist_entry_matches_the_a_label_host() -> None:
    policy = FetchPolicy(allowed_host_suffixes=(".ex\u00e4mple.org",))
    assert check_url("https://v.xn--exmple-cua.org/", policy).host == "v.xn--exmple-cua.org"


# --- the client's reading (yarl) ---------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "https://cdn.provider.test/v.mp4?sig=a%2Fb&x=1#frag",
        "HTTPS://CDN.Provider.test:443/v",
        "https://93.184.216.34/v",
        "https://[2606:4700:0:0::1111]:443/v",
    ],
)
def test_client_url_is_what_the_policy_checked(url: str) -> None:
    policy = FetchPolicy(allowed_host_suffixes=(".provider.test",), allow_cidrs=("0.0.0.0/0",))
    target = check_url(url, policy if "provider" in url else DEFAULT)
    wire = client_url(url, target)
    assert (wire.scheme, wire.port) == (target.scheme, target.port)
    assert wire.host == target.host


@pytest.mark.parametrize(
    ("url", "target"),
    [
        p("https://b.test/", Target("https", "a.test", 443, False, "/"), id="other-host"),
        p("https://a.test:8443/", Target("https", "a.test", 443, False, "/"), id="other-port"),
        p("http://a.test/", Target("https", "a.test", 443, False, "/"), id="other-scheme"),
        p("https://a.test./", Target("https", "a.test", 443, False, "/"), id="trailing-dot"),
        p("https://a.test:99999/", Target("https", "a.test", 443, False, "/"), id="unparsable"),
    ],
)
def test_client_url_refuses_a_url_the_client_reads_differently(url: str, target: Target) -> None:
    with pytest.raises(PolicyBlockedError, match=r"^parse_mismatch: .*a\.test"):
        client_url(url, target)


# --- logging a hostile URL -----------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    ["https://cdn.provider.test:99999/v?sig=S", "https://[::1/v?sig=S", "https://h/\udcff?sig=S"],
)
def test_url_for_log_never_raises_and_never_shows_the_query(url: str) -> None:
    shown = url_for_log(url)
    assert "sig=S" not in shown
    assert shown.rsplit("#", 1)[1].isalnum()
