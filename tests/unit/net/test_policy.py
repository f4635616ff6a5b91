"""The SSRF policy: schemes, userinfo, ports, IP spellings, transition addresses, allowlists.

Every case is pure (no DNS, no sockets). Blocked cases assert the stable reason code at the
start of the detail; allowed cases assert the normalised target, so the suite proves the
policy lets the public internet through as well as keeping the inside in.
"""

from __future__ import annotations

import ipaddress

import pytest

from aivedio.errors import ConfigError, PolicyBlockedError, Retry
from aivedio.net.policy import (
    FetchPolicy,
    Target,
    check_address,
    check_answers,
    check_url,
    denied_reason,
    redact_url,
)

DEFAULT = FetchPolicy()
HTTP_TOO = FetchPolicy(
    allowed_schemes=frozenset({"http", "https"}), allowed_ports=frozenset({80, 443})
)
LOOPBACK_ALLOWED = FetchPolicy(allow_cidrs=("127.0.0.0/8",))
SUFFIXES = FetchPolicy(
    allowed_host_suffixes=("example.com", ".example.com", ".cdn.provider.net", ".exämple.org")
)
SECRET = "sig=SECRET-7f3a9"


def blocked(url: str, policy: FetchPolicy = DEFAULT) -> str:
    """The detail of the PolicyBlockedError that check_url must raise for ``url``."""
    with pytest.raises(PolicyBlockedError) as info:
        check_url(url, policy)
    return info.value.detail


def p(*values: object, id: str) -> object:
    return pytest.param(*values, id=id)


# --- schemes -------------------------------------------------------------------------------

DISALLOWED_SCHEMES = [
    p("http://example.com/", id="http"),
    p("ftp://example.com/file", id="ftp"),
    p("file:///etc/passwd", id="file"),
    p("file://localhost/etc/passwd", id="file-localhost"),
    p("gopher://127.0.0.1:6379/_INFO", id="gopher"),
    p("data:text/plain;base64,SGVsbG8=", id="data"),
    p("javascript:alert(1)", id="javascript"),
    p("dict://127.0.0.1:11211/stats", id="dict"),
    p("ldap://127.0.0.1/dc=example", id="ldap"),
    p("ws://example.com/socket", id="ws"),
    p("wss://example.com/socket", id="wss"),
    p("jar:https://example.com/a.jar!/", id="jar"),
    p("netdoc:///etc/passwd", id="netdoc"),
    p("sftp://example.com/", id="sftp"),
    p("tftp://example.com/", id="tftp"),
    p("HTTP://example.com/", id="http-uppercase"),
]


@pytest.mark.parametrize("url", DISALLOWED_SCHEMES)
def test_scheme_outside_the_allowlist_is_blocked(url: str) -> None:
    assert blocked(url).startswith("scheme_not_allowed:")


@pytest.mark.parametrize(
    "url",
    [
        p("HTTPS://example.com/", id="upper"),
        p("Https://example.com/", id="mixed"),
        p("hTTpS://example.com/", id="alternating"),
    ],
)
def test_https_scheme_is_case_insensitive_and_normalised(url: str) -> None:
    assert check_url(url, DEFAULT).scheme == "https"


def test_http_is_allowed_only_when_the_policy_lists_it() -> None:
    target = check_url("http://example.com/x", HTTP_TOO)
    assert (target.scheme, target.port) == ("http", 80)


@pytest.mark.parametrize(
    "url",
    [
        p("://example.com/", id="empty-scheme"),
        p("example.com/path", id="no-scheme"),
        p("1https://example.com/", id="scheme-starts-with-digit"),
        p("ht_tps://example.com/", id="underscore-in-scheme"),
    ],
)
def test_url_without_a_valid_scheme_is_malformed(url: str) -> None:
    assert blocked(url).startswith("malformed_url:")


# --- userinfo ------------------------------------------------------------------------------

USERINFO = [
    p("https://user@example.com/", id="user"),
    p("https://user:pass@example.com/", id="user-pass"),
    p("https://@example.com/", id="empty-at"),
    p("https://:@example.com/", id="empty-user-pass"),
    p("https://user:@example.com/", id="user-empty-pass"),
    p("https://evil.com@internal/", id="evil-at-internal"),
    p("https://example.com@127.0.0.1/", id="name-at-loopback"),
    p("https://example.com:443@169.254.169.254/", id="port-then-at-metadata"),
    p("https://user%40evil.com@example.com/", id="encoded-at-in-user"),
    p("https://a@b@example.com/", id="double-at"),
    p("https://[::1]@example.com/", id="bracket-userinfo"),
    p("https://user:p%40ss@example.com/", id="encoded-at-in-password"),
]


@pytest.mark.parametrize("url", USERINFO)
def test_any_userinfo_in_the_authority_is_blocked(url: str) -> None:
    assert blocked(url).startswith("userinfo_present:")


@pytest.mark.parametrize(
    "url",
    [
        p("https://evil.com%40internal/", id="encoded-at-in-host"),
        p("https://example.com%2f@x/", id="encoded-slash-then-at"),
        p("https://127.0.0.1%2e/", id="encoded-dot"),
    ],
)
def test_percent_encoding_in_the_host_is_never_decoded_into_a_name(url: str) -> None:
    detail = blocked(url)
    assert detail.startswith(("malformed_url:", "userinfo_present:"))


def test_at_sign_in_the_path_is_not_userinfo() -> None:
    target = check_url("https://example.com/@user/video", DEFAULT)
    assert (target.host, target.path_and_query) == ("example.com", "/@user/video")


def test_at_sign_in_the_fragment_does_not_change_the_host() -> None:
    assert check_url("https://example.com#@127.0.0.1", DEFAULT).host == "example.com"


# --- ports ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "port"),
    [
        p("https://example.com:443/", 443, id="explicit-443"),
        p("https://example.com/", 443, id="default-443"),
        p("https://[2606:4700::1111]:443/", 443, id="ipv6-explicit-443"),
    ],
)
def test_allowed_port_passes(url: str, port: int) -> None:
    assert check_url(url, DEFAULT).port == port


@pytest.mark.parametrize(
    "url",
    [
        p("https://example.com:80/", id="80"),
        p("https://example.com:8080/", id="8080"),
        p("https://example.com:22/", id="22"),
        p("https://example.com:0/", id="0"),
        p("https://example.com:65536/", id="65536"),
        p("https://example.com:99999/", id="99999"),
        p("https://example.com:6379/", id="redis"),
        p("https://[2606:4700::1111]:8443/", id="ipv6-8443"),
        p("http://example.com/", id="http-default-80-not-in-ports"),
    ],
)
def test_port_outside_the_allowlist_is_blocked(url: str) -> None:
    policy = FetchPolicy(allowed_schemes=frozenset({"http", "https"}))
    assert blocked(url, policy).startswith("port_not_allowed:")


@pytest.mark.parametrize(
    "url",
    [
        p("https://example.com:-443/", id="negative"),
        p("https://example.com:https/", id="non-numeric"),
        p("https://example.com:44a/", id="hex-ish"),
        p("https://example.com:+443/", id="plus-sign"),
        p("https://example.com:/", id="empty"),
        p("https://example.com:443:443/", id="two-ports"),
        p("https://example.com:0000443/", id="too-many-digits"),
        p("https://example.com:0443/", id="leading-zero"),
        p("https://example.com:00/", id="zero-zero"),
        p("https://example.com:٤٤٣/", id="arabic-indic-digits"),
    ],
)
def test_port_that_is_not_plain_decimal_is_malformed(url: str) -> None:
    assert blocked(url).startswith("malformed_url:")


# --- IPv4 spellings ------------------------------------------------------------------------

NUMERIC_HOSTS = [
    p("https://2130706433/", id="decimal-loopback"),
    p("https://0177.0.0.1/", id="octal-first-octet"),
    p("https://0177.0000.0000.0001/", id="octal-all-octets"),
    p("https://0x7f.0.0.1/", id="hex-first-octet"),
    p("https://0x7f.0x0.0x0.0x1/", id="hex-all-octets"),
    p("https://0x7f000001/", id="hex-whole"),
    p("https://0X7F000001/", id="hex-whole-uppercase"),
    p("https://0x7f.1/", id="hex-short"),
    p("https://127.1/", id="short-two-parts"),
    p("https://127.0.1/", id="short-three-parts"),
    p("https://10.1/", id="short-private"),
    p("https://0/", id="zero"),
    p("https://0x/", id="bare-0x"),
    p("https://017700000001/", id="octal-whole"),
    p("https://127.0.0.01/", id="leading-zero-last-octet"),
    p("https://127.000.000.001/", id="zero-padded"),
    p("https://0x7f.00.0.1/", id="mixed-hex-octal"),
    p("https://3232235521/", id="decimal-192-168-0-1"),
    p("https://2852039166/", id="decimal-metadata"),
    p("https://0xa9fea9fe/", id="hex-metadata"),
    p("https://1.2.3.4.5/", id="five-parts"),
    p("https://256.0.0.1/", id="octet-over-255"),
    p("https://1572395042/", id="decimal-public-still-refused"),
    p("https://127.0.0.1.0x1/", id="trailing-hex-label"),
    p("https://example.123/", id="numeric-tld"),
]


@pytest.mark.parametrize("url", NUMERIC_HOSTS)
def test_non_canonical_numeric_host_is_blocked_not_resolved(url: str) -> None:
    assert blocked(url).startswith("numeric_host:")


def test_numeric_host_is_blocked_even_inside_allow_cidrs() -> None:
    assert blocked("https://127.1/", LOOPBACK_ALLOWED).startswith("numeric_host:")


@pytest.mark.parametrize(
    "url",
    [
        p("https://\uff11\uff12\uff17.\uff10.\uff10.\uff11/", id="fullwidth-digits"),
        p("https://127\u30020\u30020\u30021/", id="ideographic-full-stops"),
        p("https://stra\u00dfe.de/", id="sharp-s-deviation"),
        p("https://\u03c3\u03bf\u03c6\u03bf\u03c2.gr/", id="final-sigma-deviation"),
        p("https://exa\u0308mple.com/", id="decomposed-umlaut"),
        p("https://\u2460.example/", id="circled-digit"),
    ],
)
def test_unicode_host_that_idna_would_map_is_refused(url: str) -> None:
    assert blocked(url).startswith("malformed_url:")


@pytest.mark.parametrize(
    "name",
    [
        p("0x7f.example.com", id="hex-first-label"),
        p("127.0.0.1.nip.io", id="ip-then-name"),
        p("deadbeef.com", id="hex-word"),
        p("1e100.net", id="digit-start"),
    ],
)
def test_name_with_numeric_inner_labels_is_a_name_not_an_address(name: str) -> None:
    target = check_url(f"https://{name}/", DEFAULT)
    assert (target.host, target.ip_literal) == (name, False)


# --- IPv6 literals -------------------------------------------------------------------------

IPV6_DENIED = [
    p("[::1]", "loopback", id="loopback"),
    p("[0:0:0:0:0:0:0:1]", "loopback", id="loopback-long"),
    p("[::]", "unspecified", id="unspecified"),
    p("[::ffff:127.0.0.1]", "loopback", id="mapped-dotted"),
    p("[::ffff:7f00:1]", "loopback", id="mapped-hex"),
    p("[::FFFF:7F00:1]", "loopback", id="mapped-hex-upper"),
    p("[::ffff:10.0.0.1]", "private", id="mapped-private"),
    p("[::ffff:169.254.169.254]", "metadata", id="mapped-metadata"),
    p("[::ffff:93.184.216.34]", "ipv4_mapped", id="mapped-public"),
    p("[::127.0.0.1]", "loopback", id="compatible-loopback"),
    p("[::10.0.0.1]", "private", id="compatible-private"),
    p("[::93.184.216.34]", "ipv4_compatible", id="compatible-public"),
    p("[64:ff9b::a00:1]", "private", id="nat64-private"),
    p("[64:ff9b::127.0.0.1]", "loopback", id="nat64-loopback"),
    p("[64:ff9b::5db8:d822]", "nat64", id="nat64-public"),
    p("[64:ff9b:1:7f00:0:100::]", "loopback", id="nat64-local-loopback"),
    p("[64:ff9b:1:5db8:d8:2200::]", "nat64", id="nat64-local-public"),
    p("[2002:7f00:1::]", "loopback", id="6to4-loopback"),
    p("[2002:a9fe:a9fe::1]", "metadata", id="6to4-metadata"),
    p("[2002:5db8:d822::1]", "6to4", id="6to4-public"),
    p("[2001:0:4136:e378:8000:63bf:80ff:fffe]", "loopback", id="teredo-loopback"),
    p("[2001:0:4136:e378:8000:63bf:a247:27dd]", "teredo", id="teredo-public"),
    p("[fd00:ec2::254]", "metadata", id="aws-metadata"),
    p("[fd12:3456::1]", "unique_local", id="ula"),
    p("[fc00::1]", "unique_local", id="ula-fc"),
    p("[fe80::1]", "link_local", id="link-local"),
    p("[febf::1]", "link_local", id="link-local-top"),
    p("[fec0::1]", "site_local", id="site-local"),
    p("[ff02::1]", "multicast", id="multicast-all-nodes"),
    p("[ff05::2]", "multicast", id="multicast-site"),
    p("[2001:db8::1]", "documentation", id="documentation"),
    p("[3fff::1]", "documentation", id="documentation-3fff"),
    p("[2001:2::1]", "benchmarking", id="benchmarking"),
    p("[2001:10::1]", "reserved", id="orchid"),
    p("[100::1]", "discard", id="discard"),
    p("[4000::1]", "reserved", id="unallocated"),
]


@pytest.mark.parametrize(("literal", "reason"), IPV6_DENIED)
def test_ipv6_literal_is_denied_with_the_reason_of_what_it_reaches(
    literal: str, reason: str
) -> None:
    assert blocked(f"https://{literal}/").startswith(f"ip_denied:{reason}:")


@pytest.mark.parametrize(
    "url",
    [
        p("https://[fe80::1%25eth0]/", id="encoded-zone"),
        p("https://[fe80::1%eth0]/", id="raw-zone"),
        p("https://[::1%251]/", id="loopback-zone"),
        p("https://[2606:4700::1111%25en0]/", id="public-zone"),
    ],
)
def test_ipv6_zone_id_is_blocked(url: str) -> None:
    assert blocked(url).startswith("zone_id:")


@pytest.mark.parametrize(
    "url",
    [
        p("https://[127.0.0.1]/", id="bracketed-ipv4"),
        p("https://[::1/", id="unterminated"),
        p("https://::1/", id="unbracketed"),
        p("https://[::1]x/", id="junk-after-bracket"),
        p("https://[v1.fe]/", id="ipvfuture"),
        p("https://[:::1]/", id="triple-colon"),
        p("https://ex[ample.com/", id="stray-bracket"),
    ],
)
def test_malformed_ipv6_literal_is_blocked(url: str) -> None:
    assert blocked(url).startswith("malformed_url:")


def test_ipv6_literal_host_is_compressed_without_brackets() -> None:
    target = check_url("https://[2606:4700:0000:0000:0000:0000:0000:1111]/", DEFAULT)
    assert (target.host, target.ip_literal) == ("2606:4700::1111", True)


# --- special IPv4 ranges -------------------------------------------------------------------

IPV4_DENIED = [
    p("0.0.0.0", "unspecified", id="this-host"),
    p("0.1.2.3", "unspecified", id="this-network"),
    p("10.0.0.1", "private", id="rfc1918-10"),
    p("10.255.255.255", "private", id="rfc1918-10-top"),
    p("100.64.0.1", "cgnat", id="cgnat"),
    p("100.127.255.254", "cgnat", id="cgnat-top"),
    p("127.0.0.1", "loopback", id="loopback"),
    p("127.255.255.254", "loopback", id="loopback-top"),
    p("169.254.0.1", "link_local", id="link-local"),
    p("172.16.0.1", "private", id="rfc1918-172"),
    p("172.31.255.255", "private", id="rfc1918-172-top"),
    p("192.0.0.1", "reserved", id="ietf-protocol"),
    p("192.0.0.170", "reserved", id="nat64-discovery"),
    p("192.0.2.1", "documentation", id="test-net-1"),
    p("192.88.99.1", "6to4", id="6to4-relay"),
    p("192.168.1.1", "private", id="rfc1918-192"),
    p("198.18.0.1", "benchmarking", id="benchmarking"),
    p("198.19.255.255", "benchmarking", id="benchmarking-top"),
    p("198.51.100.7", "documentation", id="test-net-2"),
    p("203.0.113.9", "documentation", id="test-net-3"),
    p("224.0.0.1", "multicast", id="multicast"),
    p("239.255.255.250", "multicast", id="ssdp"),
    p("240.0.0.1", "reserved", id="class-e"),
    p("255.255.255.254", "reserved", id="class-e-top"),
    p("255.255.255.255", "broadcast", id="broadcast"),
]


@pytest.mark.parametrize(("ip", "reason"), IPV4_DENIED)
def test_special_ipv4_range_is_denied_in_a_url_with_its_reason(ip: str, reason: str) -> None:
    assert blocked(f"https://{ip}/").startswith(f"ip_denied:{reason}:")


@pytest.mark.parametrize(("ip", "reason"), IPV4_DENIED)
def test_denied_reason_names_the_special_ipv4_range(ip: str, reason: str) -> None:
    assert denied_reason(ipaddress.IPv4Address(ip)) == reason


@pytest.mark.parametrize(
    ("ip", "reason"),
    [
        p("::", "unspecified", id="unspecified"),
        p("::1", "loopback", id="loopback"),
        p("::ffff:192.168.0.1", "private", id="mapped-private"),
        p("::ffff:8.8.8.8", "ipv4_mapped", id="mapped-public"),
        p("::8.8.8.8", "ipv4_compatible", id="compatible-public"),
        p("64:ff9b::8.8.8.8", "nat64", id="nat64-public"),
        p("2002:808:808::", "6to4", id="6to4-public"),
        p("fd00:ec2::254", "metadata", id="aws-metadata"),
        p("fd00:ec2::23", "metadata", id="eks-pod-identity"),
        p("fe80::1", "link_local", id="link-local"),
        p("ff02::1", "multicast", id="multicast"),
    ],
)
def test_denied_reason_names_the_special_ipv6_range(ip: str, reason: str) -> None:
    assert denied_reason(ipaddress.IPv6Address(ip)) == reason


def test_denied_reason_refuses_a_scoped_ipv6_address() -> None:
    assert denied_reason(ipaddress.IPv6Address("2606:4700::1111%eth0")) == "zone_id"


# --- metadata services ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        p("https://169.254.169.254/latest/meta-data/", id="aws-gcp-azure-v4"),
        p("https://[fd00:ec2::254]/latest/meta-data/", id="aws-v6"),
        p("https://168.63.129.16/machine", id="azure-wireserver"),
        p("https://100.100.100.200/latest/meta-data/", id="alibaba"),
        p("https://169.254.170.2/v2/credentials", id="ecs-task"),
        p("https://[::ffff:a9fe:a9fe]/", id="aws-v4-mapped"),
        p("https://[64:ff9b::a9fe:a9fe]/", id="aws-v4-nat64"),
    ],
)
def test_cloud_metadata_address_is_denied_as_metadata(url: str) -> None:
    assert blocked(url).startswith("ip_denied:metadata:")


def test_metadata_address_is_denied_even_with_link_local_allowed_nearby() -> None:
    policy = FetchPolicy(allow_cidrs=("169.254.1.0/24",))
    assert blocked("https://169.254.169.254/", policy).startswith("ip_denied:metadata:")


# --- public addresses are allowed ----------------------------------------------------------

PUBLIC = [
    p("93.184.216.34", id="example-dot-com"),
    p("8.8.8.8", id="google-dns"),
    p("1.1.1.1", id="cloudflare-dns"),
    p("52.216.0.1", id="s3"),
    p("100.63.255.255", id="just-below-cgnat"),
    p("100.128.0.0", id="just-above-cgnat"),
    p("172.15.255.255", id="just-below-172-16"),
    p("172.32.0.0", id="just-above-172-31"),
    p("2606:4700::1111", id="cloudflare-v6"),
    p("2001:4860:4860::8888", id="google-v6"),
    p("2a00:1450:4001::1", id="europe-v6"),
]


@pytest.mark.parametrize("ip", PUBLIC)
def test_public_address_is_allowed_by_check_address(ip: str) -> None:
    assert str(check_address(ip, DEFAULT)) == ip
    assert denied_reason(ipaddress.ip_address(ip)) is None


@pytest.mark.parametrize("ip", PUBLIC)
def test_public_address_literal_url_is_allowed(ip: str) -> None:
    host = f"[{ip}]" if ":" in ip else ip
    target = check_url(f"https://{host}/v.mp4", DEFAULT)
    assert target == Target("https", ip, 443, True, "/v.mp4")


# --- host names and the suffix allowlist ---------------------------------------------------

ALLOWED_NAMES = [
    p("https://example.com/", "example.com", id="exact"),
    p("https://www.example.com/", "www.example.com", id="subdomain"),
    p("https://a.b.example.com/", "a.b.example.com", id="deep-subdomain"),
    p("https://EXAMPLE.COM/", "example.com", id="uppercase"),
    p("https://WwW.ExAmPlE.cOm/", "www.example.com", id="mixed-case"),
    p("https://x.cdn.provider.net/", "x.cdn.provider.net", id="suffix-given-with-dot"),
    p("https://v.xn--exmple-cua.org/", "v.xn--exmple-cua.org", id="punycode-host-unicode-suffix"),
    p("https://v.XN--EXMPLE-CUA.org/", "v.xn--exmple-cua.org", id="punycode-uppercase"),
]


@pytest.mark.parametrize(("url", "host"), ALLOWED_NAMES)
def test_host_matching_an_allowed_suffix_passes_normalised(url: str, host: str) -> None:
    target = check_url(url, SUFFIXES)
    assert (target.host, target.ip_literal) == (host, False)


BLOCKED_NAMES = [
    p("https://evilexample.com/", id="lookalike-prefix"),
    p("https://example.com.evil.net/", id="suffix-as-subdomain"),
    p("https://example.co/", id="shorter-tld"),
    p("https://provider.net/", id="parent-of-dotted-suffix"),
    p("https://cdn.provider.net/", id="apex-of-dotted-suffix"),
    p("https://xn--exmple-cua.org/", id="apex-of-dotted-unicode-suffix"),
    p("https://evilcdn.provider.net/", id="lookalike-of-dotted-suffix"),
    p("https://xn--exmple-cua.com/", id="punycode-lookalike"),
    p("https://example.org/", id="ascii-of-unicode-suffix"),
    p("https://examp1e.com/", id="digit-for-letter"),
    p("https://93.184.216.34/", id="ip-literal-is-not-a-name"),
    p("https://[2606:4700::1111]/", id="ipv6-literal-is-not-a-name"),
]


@pytest.mark.parametrize("url", BLOCKED_NAMES)
def test_host_outside_the_suffix_allowlist_is_blocked(url: str) -> None:
    assert blocked(url, SUFFIXES).startswith("host_not_allowed:")


def test_empty_suffix_list_allows_any_public_name() -> None:
    assert check_url("https://anything.example.net/a", DEFAULT).host == "anything.example.net"


def test_a_host_in_its_a_label_form_passes_and_its_unicode_form_does_not() -> None:
    assert check_url("https://xn--bcher-kva.example/", DEFAULT).host == "xn--bcher-kva.example"
    assert blocked("https://bücher.example/").startswith("malformed_url: non-ASCII")


def test_ip_literal_inside_allow_cidrs_passes_a_suffix_allowlist() -> None:
    policy = FetchPolicy(allowed_host_suffixes=("example.com",), allow_cidrs=("127.0.0.0/8",))
    assert check_url("https://127.0.0.1/", policy).host == "127.0.0.1"


# --- malformed URLs ------------------------------------------------------------------------

MALFORMED = [
    p("", id="empty"),
    p("https://", id="no-host"),
    p("https:///x", id="empty-authority"),
    p("https:example.com", id="no-slashes"),
    p("https:/example.com", id="one-slash"),
    p("https://exa mple.com/", id="space-in-host"),
    p("https://example.com/a b", id="space-in-path"),
    p(" https://example.com/", id="leading-space"),
    p("https://example.com/\t", id="tab"),
    p("https://example.com\\@127.0.0.1/", id="backslash-in-authority"),
    p("https:\\\\example.com/", id="backslashes-as-slashes"),
    p("https://example.com/\\..\\", id="backslash-in-path"),
    p("https://exa\x00mple.com/", id="nul"),
    p("https://example.com\r\nHost: evil/", id="crlf"),
    p("https://example.com\x7f/", id="del"),
    p("https://exam\u200bple.com/", id="zero-width-space"),
    p("https://example.com\u3000/", id="ideographic-space"),
    p("https://example.com\u00a0/", id="nbsp"),
    p("https://" + "a" * 64 + ".com/", id="label-over-63"),
    p("https://" + "a." * 127 + "com/", id="host-over-253"),
    p("https://a..b/", id="empty-label"),
    p("https://.example.com/", id="leading-dot"),
    p("https://example.com../", id="two-trailing-dots"),
    p("https://./", id="only-dot"),
    p("https://exa_mple!.com/", id="bang-in-host"),
    p("https://exam*ple.com/", id="star-in-host"),
    p("https://evil.com\uff20internal/", id="fullwidth-at"),
    p("https://evil.com\uff0finternal/", id="fullwidth-slash"),
    p("https://xn--zz.com/", id="invalid-punycode"),
    p("https://\u2100.com/", id="nfkc-to-slash"),
    p("https://example.com:443" + "/x" * 9000, id="over-length-limit"),
]


@pytest.mark.parametrize("url", MALFORMED)
def test_malformed_url_is_blocked(url: str) -> None:
    assert blocked(url).startswith("malformed_url:")


# --- allow_cidrs ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        p("https://127.0.0.1/", id="first"),
        p("https://127.0.0.2/", id="second"),
        p("https://127.255.255.254/", id="top"),
    ],
)
def test_allow_cidrs_lets_the_listed_loopback_range_through(url: str) -> None:
    assert check_url(url, LOOPBACK_ALLOWED).ip_literal


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        p("https://10.0.0.1/", "private", id="private"),
        p("https://128.0.0.1/", None, id="neighbour-is-public"),
        p("https://[::1]/", "loopback", id="ipv6-loopback"),
        p("https://[::ffff:127.0.0.1]/", "loopback", id="mapped-is-other-family"),
        p("https://169.254.169.254/", "metadata", id="metadata"),
    ],
)
def test_allow_cidrs_lets_nothing_else_through(url: str, reason: str | None) -> None:
    if reason is None:
        assert check_url(url, LOOPBACK_ALLOWED).host == "128.0.0.1"
    else:
        assert blocked(url, LOOPBACK_ALLOWED).startswith(f"ip_denied:{reason}:")


def test_allow_cidrs_still_enforces_the_port_allowlist() -> None:
    assert blocked("https://127.0.0.1:8443/", LOOPBACK_ALLOWED).startswith("port_not_allowed:")


def test_check_address_honours_allow_cidrs_for_objects_and_strings() -> None:
    assert check_address(ipaddress.IPv4Address("127.0.0.9"), LOOPBACK_ALLOWED) == (
        ipaddress.IPv4Address("127.0.0.9")
    )
    assert check_address("127.0.0.9", LOOPBACK_ALLOWED) == ipaddress.IPv4Address("127.0.0.9")


@pytest.mark.parametrize(
    ("ip", "prefix"),
    [
        p("fe80::1%eth0", "zone_id:", id="scoped-string"),
        p("not-an-ip", "invalid_address:", id="garbage"),
        p("127.1", "invalid_address:", id="short-form"),
        p("0177.0.0.1", "invalid_address:", id="octal"),
        p("", "invalid_address:", id="empty"),
    ],
)
def test_check_address_rejects_what_is_not_a_plain_address(ip: str, prefix: str) -> None:
    with pytest.raises(PolicyBlockedError) as info:
        check_address(ip, DEFAULT)
    assert info.value.detail.startswith(prefix)


def test_check_address_detail_names_the_embedded_ipv4() -> None:
    with pytest.raises(PolicyBlockedError) as info:
        check_address("::ffff:10.1.2.3", DEFAULT)
    assert info.value.detail.startswith("ip_denied:private: ::ffff:")
    assert info.value.detail.endswith(" (embeds 10.1.2.3)")


# --- DNS answer sets -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("answers", "expected"),
    [
        p(["93.184.216.34"], ["93.184.216.34"], id="one-v4"),
        p(["8.8.8.8", "8.8.4.4"], ["8.8.8.8", "8.8.4.4"], id="two-v4-in-order"),
        p(["8.8.8.8", "8.8.8.8"], ["8.8.8.8"], id="duplicate-v4"),
        p(
            ["2606:4700:0:0:0:0:0:1111", "2606:4700::1111"],
            ["2606:4700::1111"],
            id="duplicate-v6-spellings",
        ),
        p(
            ["1.1.1.1", "2606:4700::1111"],
            ["1.1.1.1", "2606:4700::1111"],
            id="mixed-families",
        ),
        p(["2001:4860:4860:0000::8888"], ["2001:4860:4860::8888"], id="v6-compressed"),
    ],
)
def test_all_public_answers_are_returned_canonical_and_deduplicated(
    answers: list[str], expected: list[str]
) -> None:
    assert check_answers("example.com", answers, DEFAULT) == expected


@pytest.mark.parametrize(
    ("answers", "reason"),
    [
        p(["93.184.216.34", "10.0.0.1"], "private", id="public-then-private"),
        p(["127.0.0.1", "93.184.216.34"], "loopback", id="loopback-first"),
        p(["8.8.8.8", "169.254.169.254"], "metadata", id="metadata-last"),
        p(["2606:4700::1111", "::1"], "loopback", id="v6-loopback"),
        p(["2606:4700::1111", "fd00::1"], "unique_local", id="v6-ula"),
        p(["1.1.1.1", "::ffff:127.0.0.1"], "loopback", id="v6-mapped-loopback"),
        p(["2606:4700::1111", "fe80::1"], "link_local", id="v6-link-local"),
        p(["8.8.8.8", "64:ff9b::808:808"], "nat64", id="v6-nat64"),
        p(["0.0.0.0"], "unspecified", id="unspecified"),
    ],
)
def test_one_denied_answer_blocks_the_whole_name(answers: list[str], reason: str) -> None:
    with pytest.raises(PolicyBlockedError) as info:
        check_answers("rebind.example.com", answers, DEFAULT)
    assert info.value.detail.startswith(f"ip_denied:{reason}:")
    assert "rebind.example.com" in info.value.detail


def test_empty_answer_set_is_blocked_as_no_addresses() -> None:
    with pytest.raises(PolicyBlockedError) as info:
        check_answers("empty.example.com", [], DEFAULT)
    assert info.value.detail.startswith("no_addresses:")


def test_answer_inside_allow_cidrs_is_accepted() -> None:
    assert check_answers("local.test", ["127.0.0.1"], LOOPBACK_ALLOWED) == ["127.0.0.1"]


def test_answers_accept_any_iterable() -> None:
    assert check_answers("example.com", iter(("8.8.8.8",)), DEFAULT) == ["8.8.8.8"]


# --- secrets never leak into details -------------------------------------------------------

LEAK_PROBES = [
    p(f"http://example.com/v.mp4?{SECRET}", id="scheme"),
    p(f"https://user:pw@example.com/v.mp4?{SECRET}", id="userinfo"),
    p(f"https://example.com:8443/v.mp4?{SECRET}", id="port"),
    p(f"https://127.0.0.1/v.mp4?{SECRET}", id="ip-denied"),
    p(f"https://[::ffff:10.0.0.1]/v.mp4?{SECRET}", id="ip-denied-v6"),
    p(f"https://127.1/v.mp4?{SECRET}", id="numeric-host"),
    p(f"https://[fe80::1%25eth0]/v.mp4?{SECRET}", id="zone-id"),
    p(f"https://a..b/v.mp4?{SECRET}", id="malformed-host"),
    p(f"https://example.com/v.mp4?{SECRET}&x=a b", id="malformed-space-in-query"),
    p(f"https://example.com:x/v.mp4?{SECRET}", id="malformed-port"),
    p(f"https://evil.test/v.mp4?{SECRET}", id="host-not-allowed"),
    p(f"https://example.com?{SECRET}@127.0.0.1/", id="at-in-query"),
    p(f"https://example.com#{SECRET}@127.0.0.1", id="at-in-fragment-then-suffix"),
]


@pytest.mark.parametrize("url", LEAK_PROBES)
def test_blocked_detail_never_contains_the_query_secret(url: str) -> None:
    policy = FetchPolicy(allowed_host_suffixes=("example.org",))
    with pytest.raises(PolicyBlockedError) as info:
        check_url(url, policy)
    assert "SECRET" not in info.value.detail
    assert "SECRET" not in str(info.value)


def test_policy_blocked_error_is_never_retried() -> None:
    with pytest.raises(PolicyBlockedError) as info:
        check_url("https://127.0.0.1/", DEFAULT)
    assert info.value.retry is Retry.NEVER


def test_target_keeps_the_query_for_the_request_but_not_in_its_repr() -> None:
    target = check_url(f"https://example.com/v.mp4?{SECRET}#frag", DEFAULT)
    assert target.path_and_query == f"/v.mp4?{SECRET}"
    assert "SECRET" not in repr(target)


@pytest.mark.parametrize(
    ("url", "path_and_query"),
    [
        p("https://example.com", "/", id="no-path"),
        p("https://example.com?a=1", "/?a=1", id="query-without-path"),
        p("https://example.com/a/b?", "/a/b", id="empty-query"),
        p("https://example.com/a#f?x", "/a", id="fragment-dropped"),
        p("https://example.com/%2e%2e/x", "/%2e%2e/x", id="path-kept-verbatim"),
    ],
)
def test_path_and_query_is_the_request_target_without_fragment(
    url: str, path_and_query: str
) -> None:
    assert check_url(url, DEFAULT).path_and_query == path_and_query


# --- redact_url ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "redacted"),
    [
        p(f"https://example.com/v.mp4?{SECRET}", "https://example.com/v.mp4", id="query"),
        p("https://example.com/v.mp4#SECRET", "https://example.com/v.mp4", id="fragment"),
        p("https://u:SECRET@example.com/v", "https://example.com/v", id="userinfo"),
        p(
            f"https://u:SECRET@example.com:8443/a?{SECRET}#SECRET",
            "https://example.com:8443/a",
            id="everything",
        ),
        p("https://a@b@example.com/", "https://example.com/", id="double-at"),
        p("//u:SECRET@example.com/x", "//example.com/x", id="scheme-relative"),
        p("https://example.com/@user", "https://example.com/@user", id="at-in-path-kept"),
        p(f"not a url?{SECRET}", "not a url", id="garbage"),
        p("", "", id="empty"),
    ],
)
def test_redact_url_removes_userinfo_query_and_fragment(url: str, redacted: str) -> None:
    assert redact_url(url) == redacted
    assert "SECRET" not in redact_url(url)


# --- the policy itself ---------------------------------------------------------------------


def test_default_policy_is_https_443_any_public_host_five_redirects() -> None:
    assert DEFAULT.allowed_schemes == frozenset({"https"})
    assert DEFAULT.allowed_ports == frozenset({443})
    assert (DEFAULT.allowed_host_suffixes, DEFAULT.allow_cidrs) == ((), ())
    assert DEFAULT.max_redirects == 5


@pytest.mark.parametrize(
    "kwargs",
    [
        p({"allowed_schemes": frozenset({"ftp"})}, id="non-http-scheme"),
        p({"allowed_ports": frozenset({0})}, id="port-zero"),
        p({"allowed_ports": frozenset({70000})}, id="port-too-big"),
        p({"allow_cidrs": ("not-a-cidr",)}, id="bad-cidr"),
        p({"allowed_host_suffixes": ("a..b",)}, id="bad-suffix"),
        p({"max_redirects": -1}, id="negative-redirects"),
    ],
)
def test_invalid_policy_is_a_config_error(kwargs: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        FetchPolicy(**kwargs)  # type: ignore[arg-type]
