"""The policy never allows a URL that a strict reference refuses, nor reads one differently.

The reference is built from other parts than the policy: ``urllib.parse.urlsplit`` splits the
URL, ``ipaddress`` judges literals (its own ``is_global`` plus the transition ranges and
cloud metadata addresses), and the authority must be exactly ``host`` or ``host:port`` in
canonical form. Hypothesis generates hostile URLs (whitespace and control bytes anywhere,
odd separators, userinfo, full-width dots, numeric and bracketed hosts, non-canonical ports)
as well as well-formed ones; for every URL the policy allows, the reference must allow it
with the same scheme, host and port, and yarl (what aiohttp connects with) must read it so.
"""

from __future__ import annotations

import codecs
import ipaddress
import re
import unicodedata
from urllib.parse import urlsplit

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from aivedio.errors import PolicyBlockedError
from aivedio.net.fetch import client_url
from aivedio.net.policy import FetchPolicy, check_url

POLICIES = [
    FetchPolicy(),
    FetchPolicy(allowed_host_suffixes=(".provider.test", "api.vendor.test")),
    FetchPolicy(
        allowed_schemes=frozenset({"http", "https"}),
        allowed_ports=frozenset({80, 443, 8443}),
        allow_cidrs=("127.0.0.0/8", "::1/128"),
    ),
]

_INVISIBLE = {"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp", "Zs"}
_LABEL = re.compile(r"[a-z0-9_-]{1,63}")
_DEFAULT_PORT = {"http": 80, "https": 443}
_METADATA = {ipaddress.ip_address(a) for a in ("168.63.129.16", "fd00:ec2::254", "fd00:ec2::23")}
_TRANSITION = [
    ipaddress.ip_network(n) for n in ("::/96", "::ffff:0:0/96", "64:ff9b::/96", "64:ff9b:1::/48")
]


def _ip_allowed(ip: ipaddress.IPv4Address | ipaddress.IPv6Address, policy: FetchPolicy) -> bool:
    if any(
        ip.version == n.version and ip in n for n in map(ipaddress.ip_network, policy.allow_cidrs)
    ):
        return True
    if ip in _METADATA or not ip.is_global:
        return False
    if isinstance(ip, ipaddress.IPv6Address):
        embeds = ip.sixtofour or ip.teredo or any(ip in n for n in _TRANSITION)
        return not embeds
    return True


def _name_allowed(host: str, policy: FetchPolicy) -> bool:
    if len(host) > 253 or host.endswith("."):
        return False
    labels = host.split(".")
    if not all(_LABEL.fullmatch(label) for label in labels):
        return False
    last = labels[-1]
    if last.isdigit() or last.startswith("0x"):
        return False  # read as a number by some client: only canonical dotted quads pass
    for label in labels:
        if label.startswith("xn--"):
            try:
                codecs.decode(label[4:], "punycode")
            except UnicodeError:
                return False
    if not policy.allowed_host_suffixes:
        return True
    for entry in policy.allowed_host_suffixes:
        if entry.startswith(".") and host.endswith(entry):
            return True
        if host == entry:
            return True
    return False


def reference(url: str, policy: FetchPolicy) -> tuple[str, str, int] | None:
    """(scheme, host, port) a strict reader would dial for ``url``, or None if it refuses."""
    if any(c.isspace() or c == "\\" or unicodedata.category(c) in _INVISIBLE for c in url):
        return None
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    scheme, netloc, host = parts.scheme, parts.netloc, parts.hostname
    if scheme not in policy.allowed_schemes or not url.lower().startswith(scheme + "://"):
        return None
    if not netloc.isascii() or "@" in netloc or "%" in netloc or not host:
        return None
    shown = f"[{host}]" if netloc.startswith("[") else host
    if netloc.lower() not in (shown, f"{shown}:{port}"):
        return None  # the authority is exactly host[:port], the port in canonical decimal
    port = port if port is not None else _DEFAULT_PORT[scheme]
    if port not in policy.allowed_ports:
        return None
    try:
        ip = ipaddress.IPv6Address(host) if shown != host else ipaddress.IPv4Address(host)
    except ValueError:
        if shown != host:
            return None
        return (scheme, host, port) if _name_allowed(host, policy) else None
    if policy.allowed_host_suffixes and not any(
        ip.version == n.version and ip in n for n in map(ipaddress.ip_network, policy.allow_cidrs)
    ):
        return None
    return (scheme, str(ip), port) if _ip_allowed(ip, policy) else None


# --- hostile URLs ----------------------------------------------------------------------------

# Pieces of URLs. Each part of a generated URL is the ordinary piece three times
# in four and one of these otherwise, and up to three JUNK characters land anywhere.
JUNK = [" ", "\t", "\n", "\r", "\x00", "\x01", "\x0b", "\x0c", "\x1f", "\x7f", "\x85", "\xa0"]
JUNK += ["\u200b", "\u2028", "\u3000", "\ufeff", "\\", "@", "%", "%2e", "%40", "%00", ":", "["]
JUNK += ["]", "/", "?", "#", ".", "..", "\u3002", "\uff0e", "\uff61", "\uff1a", "\uff20", "\uff0f"]
JUNK += ["\u00df", "\u0130", "\u212a", "\uff11", "\u0661", ";", ",", "*", "+", "-", "_", "~", "0"]
JUNK += ["0x", "xn--"]
SCHEMES = ["HTTPS", "Https", "http", "HTTP", "ftp", "", "https+x", "h", "https:"]
SEPARATORS = [":/", ":", ":///", ":\\\\", "://\\", ":/\\", "://%2f"]
USERINFO = ["u@", "u:p@", "@", ":@", "cdn.provider.test@", "a%40b@", "[::1]@"]
HOSTS = ["cdn.provider.test", "a.b.provider.test", "provider.test", "evilprovider.test"]
HOSTS += ["api.vendor.test", "x.api.vendor.test", "CDN.Provider.TEST", "cdn.provider.test."]
HOSTS += ["example.com", "xn--bcher-kva.example", "xn--zz.example", "localhost", "a..b", ".", ""]
HOSTS += ["93.184.216.34", "127.0.0.1", "10.0.0.1", "169.254.169.254", "168.63.129.16", "0.0.0.0"]
HOSTS += ["2130706433", "0x7f.1", "0177.0.0.1", "127.1", "127.0.0.01", "1.2.3.4.5", "example.123"]
HOSTS += ["[::1]", "[2606:4700::1111]", "[::ffff:127.0.0.1]", "[::ffff:93.184.216.34]"]
HOSTS += ["[64:ff9b::a00:1]", "[2002:7f00:1::]", "[fe80::1%25eth0]", "[fe80::1]", "[127.0.0.1]"]
HOSTS += ["[v1.x]", "[::1", "::1", "b\u00fccher.example", "cdn\u3002provider.test"]
PORTS = [":443", ":80", ":8443", ":0443", ":+443", ":", ":0", ":65536", ":-1", ":443:443"]
PORTS += [":\u0664\u0664\u0663", ":1e3", ":0x1bb"]
TAILS = ["/", "/v.mp4?sig=a%2Fb#f", "?q=1", "#f", "/a/../b", "/%2e%2e/", "/@evil.test"]
TAILS += ["?@evil.test", "#@evil", "/\u00e9", ";p"]


def mostly(usual: str, rare: list[str]) -> st.SearchStrategy[str]:
    return st.one_of(st.just(usual), st.just(usual), st.just(usual), st.sampled_from(rare))


label_char = st.sampled_from([*"abcxyz019-_.", "0x", "xn--"])
label_text = st.lists(
    st.one_of(label_char, label_char, label_char, st.sampled_from(JUNK)), max_size=12
).map("".join)
host = st.one_of(
    st.sampled_from(HOSTS),
    st.sampled_from(HOSTS),
    st.lists(label_text, min_size=1, max_size=4).map(".".join),
    st.builds(lambda a, b: f"{a}.{b}", label_text, st.sampled_from(HOSTS)),
)


@st.composite
def hostile_urls(draw: st.DrawFn) -> str:
    url = "".join(
        [
            draw(mostly("https", SCHEMES)),
            draw(mostly("://", SEPARATORS)),
            draw(mostly("", USERINFO)),
            draw(host),
            draw(mostly("", PORTS)),
            draw(mostly("", TAILS)),
        ]
    )
    for _ in range(draw(st.sampled_from([0, 0, 0, 1, 2, 3]))):
        at = draw(st.integers(min_value=0, max_value=len(url)))
        url = url[:at] + draw(st.sampled_from(JUNK)) + url[at:]
    return url


urls = st.one_of(
    hostile_urls(),
    hostile_urls(),
    hostile_urls(),
    st.text(max_size=40).map(lambda tail: "https://" + tail),
    st.text(alphabet=st.characters(codec="utf-8"), max_size=60),
)


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(url=urls, which=st.integers(min_value=0, max_value=len(POLICIES) - 1))
@example(url=" https://cdn.provider.test/v", which=1)
@example(url="\thttps://cdn.provider.test/v", which=1)
@example(url="https://cdn.provider.test./v", which=1)
@example(url="https://provider.test/v", which=1)
@example(url="https://cdn.provider.test:0443/v", which=1)
@example(url="https://cdn\u3002provider.test/v", which=1)
def test_policy_never_allows_what_the_strict_reference_refuses(url: str, which: int) -> None:
    policy = POLICIES[which]
    try:
        target = check_url(url, policy)
    except PolicyBlockedError:
        return
    assert reference(url, policy) == (target.scheme, target.host, target.port), url
    client_url(url, target)  # yarl reads it the same way too (else parse_mismatch)


def test_the_reference_is_strict_where_the_old_policy_was_not() -> None:
    # The reference must itself refuse the three findings, or the property proves nothing.
    policy = POLICIES[1]
    for url in (
        " https://cdn.provider.test/v",
        "https://cdn.provider.test./v",
        "https://provider.test/v",
        "https://cdn.provider.test:0443/v",
    ):
        assert reference(url, policy) is None, url
    assert reference("https://cdn.provider.test/v", policy) == ("https", "cdn.provider.test", 443)
