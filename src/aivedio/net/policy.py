"""The SSRF policy: which URLs and which addresses the fetcher may reach. Pure: no I/O, no DNS.

* **Decide on values, never on spellings** (``0x7f.1`` is loopback, any name may resolve to
  169.254.169.254). An IP literal becomes an ``ipaddress`` value checked against our deny
  table; a name must match the host allowlist (``name``: that host exactly, ``.name``: its
  subdomains) and each of its DNS answers passes the same table (``check_answers``). A literal
  never matches the allowlist: only ``allow_cidrs`` admits one.
* **Refuse, never normalise**, wherever two parsers (ours, and yarl's for aiohttp) could read
  different hosts: whitespace or a control character anywhere, backslashes, ``@`` in the
  authority, percent-encoding or non-ASCII in the host (give the A-label), a trailing dot, a
  port not in canonical decimal (``0443``), zone ids, and a numeric host that is not a
  canonical dotted quad (``numeric_host``, whatever ``allow_cidrs`` says). Only ASCII case is
  folded, as every parser folds it.
* **Transition addresses are unwrapped.** IPv4-mapped, IPv4-compatible, NAT64
  (``64:ff9b::/96``, ``64:ff9b:1::/48``), 6to4 (``2002::/16``) and Teredo (``2001::/32``)
  addresses carry an IPv4 address that a dual-stack socket, gateway or relay delivers to. A
  denied embedded address is refused under its own reason (``metadata``, ``loopback``…); a
  public one is refused too, under the transition kind (``ipv4_mapped``, ``nat64``…): a public
  IPv4 target is dialled as IPv4.
* **One denied DNS answer refuses the whole name**: the zone's owner picks which answer a client
  tries (a retry, a happy-eyeballs race, a rebinding round), so none of the others is dialled.
* **No detail contains a query string** (signed URLs carry credentials there): reasons name the
  host, the port or the scheme only; ``redact_url`` strips query, fragment and userinfo from any
  URL that has to be shown.
"""

from __future__ import annotations

import ipaddress
import re
import unicodedata
from collections.abc import Iterable
from functools import lru_cache

import msgspec

from aivedio.config.hosts import check_name, host_rules, is_numeric_looking
from aivedio.errors import ConfigError, PolicyBlockedError

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

DEFAULT_PORTS: dict[str, int] = {"https": 443, "http": 80}
MAX_URL_LENGTH = 16384
_DETAIL_MAX = 80  # longest piece of caller input echoed into a detail

_SCHEME_RE = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*")
_AUTHORITY_RE = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*:)?//([^/\\?#]*)(.*)$", re.DOTALL)


class FetchPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """What the guarded fetch may reach. The default allows public HTTPS on 443 only."""

    allowed_schemes: frozenset[str] = frozenset({"https"})
    allowed_ports: frozenset[int] = frozenset({443})
    # Empty: any public host. Otherwise "name" allows that host exactly and ".name" its
    # subdomains (not name itself); compared in ASCII lowercase (see check_host_suffixes).
    allowed_host_suffixes: tuple[str, ...] = ()
    # The only exception to the deny table (tests and labs), e.g. ("127.0.0.0/8",).
    allow_cidrs: tuple[str, ...] = ()
    max_redirects: int = 5

    def __post_init__(self) -> None:
        for scheme in self.allowed_schemes:
            if scheme not in DEFAULT_PORTS:
                raise ConfigError(f"fetch policy: scheme {scheme!r} is not http or https")
        for port in self.allowed_ports:
            if not 1 <= port <= 65535:
                raise ConfigError(f"fetch policy: port {port!r} is not in 1..65535")
        if self.max_redirects < 0:
            raise ConfigError("fetch policy: max_redirects must be >= 0")
        try:
            host_rules(tuple(self.allowed_host_suffixes))
        except ValueError as exc:
            raise ConfigError(f"fetch policy: allowed_host_suffixes: {exc}") from None
        try:
            _networks(tuple(self.allow_cidrs))
        except ValueError as exc:
            raise ConfigError(f"fetch policy: allow_cidrs: {exc}") from None


class Target(msgspec.Struct, frozen=True):
    """A URL that passed ``check_url``, in the form the fetcher dials.

    ``host`` is the ASCII name as written, in lowercase, or, for an IP literal, the canonical
    address string (dotted IPv4, compressed IPv6 without brackets).
    ``path_and_query`` is what goes on the request line; the fragment is dropped.
    """

    scheme: str
    host: str
    port: int
    ip_literal: bool
    path_and_query: str

    def __repr__(self) -> str:
        # The query may hold a signature: never let a log line print it.
        path = self.path_and_query.split("?", 1)[0]
        return (
            f"Target(scheme={self.scheme!r}, host={self.host!r}, port={self.port}, "
            f"ip_literal={self.ip_literal}, path={path!r})"
        )


# --- the deny table -------------------------------------------------------------------------


def _v4(cidr: str) -> ipaddress.IPv4Network:
    return ipaddress.IPv4Network(cidr)


def _v6(cidr: str) -> ipaddress.IPv6Network:
    return ipaddress.IPv6Network(cidr)


# Most specific first: the first match names the reason.
_V4_DENY: tuple[tuple[ipaddress.IPv4Network, str], ...] = (
    (_v4("169.254.169.254/32"), "metadata"),  # AWS, GCP, Azure IMDS, OpenStack, ...
    (_v4("169.254.170.2/32"), "metadata"),  # ECS task metadata
    (_v4("169.254.170.23/32"), "metadata"),  # EKS pod identity
    (_v4("168.63.129.16/32"), "metadata"),  # Azure wire server
    (_v4("100.100.100.200/32"), "metadata"),  # Alibaba Cloud
    (_v4("255.255.255.255/32"), "broadcast"),
    (_v4("0.0.0.0/8"), "unspecified"),
    (_v4("10.0.0.0/8"), "private"),
    (_v4("100.64.0.0/10"), "cgnat"),
    (_v4("127.0.0.0/8"), "loopback"),
    (_v4("169.254.0.0/16"), "link_local"),
    (_v4("172.16.0.0/12"), "private"),
    (_v4("192.0.0.0/24"), "reserved"),  # IETF protocol assignments
    (_v4("192.0.2.0/24"), "documentation"),
    (_v4("192.88.99.0/24"), "6to4"),  # 6to4 relay anycast
    (_v4("192.168.0.0/16"), "private"),
    (_v4("198.18.0.0/15"), "benchmarking"),
    (_v4("198.51.100.0/24"), "documentation"),
    (_v4("203.0.113.0/24"), "documentation"),
    (_v4("224.0.0.0/4"), "multicast"),
    (_v4("240.0.0.0/4"), "reserved"),
)

_V6_UNSPECIFIED = ipaddress.IPv6Address("::")
_V6_LOOPBACK = ipaddress.IPv6Address("::1")
_V6_MAPPED = _v6("::ffff:0:0/96")
_V6_COMPATIBLE = _v6("::/96")
_V6_NAT64 = _v6("64:ff9b::/96")
_V6_NAT64_LOCAL = _v6("64:ff9b:1::/48")
_V6_6TO4 = _v6("2002::/16")
_V6_TEREDO = _v6("2001::/32")

_V6_DENY: tuple[tuple[ipaddress.IPv6Network, str], ...] = (
    (_v6("fd00:ec2::254/128"), "metadata"),  # AWS IMDS over IPv6
    (_v6("fd00:ec2::23/128"), "metadata"),  # EKS pod identity over IPv6
    (_v6("2001:db8::/32"), "documentation"),
    (_v6("3fff::/20"), "documentation"),
    (_v6("2001:2::/48"), "benchmarking"),
    (_v6("2001:10::/28"), "reserved"),  # ORCHID
    (_v6("100::/64"), "discard"),
    (_v6("fc00::/7"), "unique_local"),
    (_v6("fe80::/10"), "link_local"),
    (_v6("fec0::/10"), "site_local"),
    (_v6("ff00::/8"), "multicast"),
)


def _embedded_v4(ip: ipaddress.IPv6Address) -> tuple[str, ipaddress.IPv4Address] | None:
    """The IPv4 address an IPv6 transition address carries, with the transition's name."""
    if ip.ipv4_mapped is not None:
        return "ipv4_mapped", ip.ipv4_mapped
    value = int(ip)
    if ip in _V6_COMPATIBLE:
        return "ipv4_compatible", ipaddress.IPv4Address(value & 0xFFFFFFFF)
    if ip in _V6_NAT64:
        return "nat64", ipaddress.IPv4Address(value & 0xFFFFFFFF)
    if ip in _V6_NAT64_LOCAL:
        # RFC 6052 /48 prefix: bits 48..63 and 72..87 hold the address (64..71 is "u").
        high = (value >> 64) & 0xFFFF
        low = (value >> 40) & 0xFFFF
        return "nat64", ipaddress.IPv4Address((high << 16) | low)
    if ip in _V6_6TO4 and ip.sixtofour is not None:
        return "6to4", ip.sixtofour
    if ip in _V6_TEREDO and ip.teredo is not None:
        return "teredo", ip.teredo[1]  # the client address, de-obfuscated by ipaddress
    return None


def _v4_reason(ip: ipaddress.IPv4Address) -> str | None:
    for network, reason in _V4_DENY:
        if ip in network:
            return reason
    return _fallback_reason(ip)


def _fallback_reason(ip: IPAddress) -> str | None:
    """What ``ipaddress`` itself knows, for whatever the explicit table missed."""
    if ip.is_unspecified:
        return "unspecified"
    if ip.is_loopback:
        return "loopback"
    if ip.is_link_local:
        return "link_local"
    if ip.is_multicast:
        return "multicast"
    if isinstance(ip, ipaddress.IPv6Address) and ip.is_site_local:
        return "site_local"
    if ip.is_private:
        return "private"
    if ip.is_reserved or not ip.is_global:
        return "reserved"
    return None


def denied_reason(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
    """Why the fetcher must not dial ``ip`` (a short reason code), or None if it is public."""
    if isinstance(ip, ipaddress.IPv4Address):
        return _v4_reason(ip)
    if ip.scope_id:
        return "zone_id"  # a scoped address names an interface, not a destination on the net
    if ip == _V6_UNSPECIFIED:
        return "unspecified"
    if ip == _V6_LOOPBACK:
        return "loopback"
    embedded = _embedded_v4(ip)
    if embedded is not None:
        kind, inner = embedded
        return _v4_reason(inner) or kind
    for network, reason in _V6_DENY:
        if ip in network:
            return reason
    return _fallback_reason(ip)


@lru_cache(maxsize=64)
def _networks(cidrs: tuple[str, ...]) -> tuple[IPNetwork, ...]:
    return tuple(ipaddress.ip_network(cidr, strict=False) for cidr in cidrs)


def _allowed_by_cidr(ip: IPAddress, policy: FetchPolicy) -> bool:
    """Whether ``ip`` (as given, same family only) lies inside one of ``allow_cidrs``."""
    return any(
        ip.version == net.version and ip in net for net in _networks(tuple(policy.allow_cidrs))
    )


def _clip(text: str) -> str:
    """Caller input echoed into a detail: bounded and printable."""
    text = "".join(c if c.isprintable() else "?" for c in text)
    return text if len(text) <= _DETAIL_MAX else text[:_DETAIL_MAX] + "..."


def check_address(
    ip: str | ipaddress.IPv4Address | ipaddress.IPv6Address, policy: FetchPolicy
) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """The address as an ``ipaddress`` object, or PolicyBlockedError if the policy denies it.

    Only ``policy.allow_cidrs`` overrides the deny table. Scoped IPv6 (``fe80::1%eth0``) is
    refused as ``zone_id``; a string that is not an address as ``invalid_address``.
    """
    if isinstance(ip, str):
        if "%" in ip:
            raise PolicyBlockedError(f"zone_id: scoped address {_clip(ip)}")
        try:
            address: IPAddress = ipaddress.ip_address(ip)
        except ValueError:
            raise PolicyBlockedError(f"invalid_address: {_clip(ip)}") from None
    else:
        address = ip
    if isinstance(address, ipaddress.IPv6Address) and address.scope_id:
        raise PolicyBlockedError(f"zone_id: scoped address {_clip(str(address))}")
    if _allowed_by_cidr(address, policy):
        return address
    reason = denied_reason(address)
    if reason is not None:
        shown = str(address)
        if isinstance(address, ipaddress.IPv6Address):
            embedded = _embedded_v4(address)
            if embedded is not None:
                shown += f" (embeds {embedded[1]})"
        raise PolicyBlockedError(f"ip_denied:{reason}: {shown}")
    return address


def check_answers(host: str, addresses: Iterable[str], policy: FetchPolicy) -> list[str]:
    """Validate a DNS answer set for ``host``: canonical address strings, deduplicated in order.

    One denied address blocks the whole name (``ip_denied``); no address is ``no_addresses``.
    """
    out: list[str] = []
    seen: set[str] = set()
    for raw in addresses:
        try:
            address = check_address(raw, policy)
        except PolicyBlockedError as exc:
            raise PolicyBlockedError(f"{exc.detail} (answer for {_clip(host)})") from None
        canonical = str(address)
        if canonical not in seen:
            seen.add(canonical)
            out.append(canonical)
    if not out:
        raise PolicyBlockedError(f"no_addresses: {_clip(host)} has no address")
    return out


# --- the allowlist ------------------------------------------------------------------------


def _host_allowed(host: str, policy: FetchPolicy) -> bool:
    rules = host_rules(tuple(policy.allowed_host_suffixes))
    if not rules:
        return True
    return any(
        host.endswith("." + name) if subdomains else host == name for name, subdomains in rules
    )


# --- URLs -----------------------------------------------------------------------------------


def _forbidden_character(url: str) -> str | None:
    for c in url:
        if c == "\\":
            return "backslash"
        if c.isspace():
            return "whitespace"
        if unicodedata.category(c) in {"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp", "Zs"}:
            return "control_character"
    return None


def _split_authority(netloc: str) -> tuple[str, str | None, bool]:
    """(host, port text or None, bracketed). Raises PolicyBlockedError."""
    if netloc.startswith("["):
        end = netloc.find("]")
        if end < 0:
            raise PolicyBlockedError("malformed_url: unterminated IPv6 literal")
        host, rest = netloc[1:end], netloc[end + 1 :]
        if "%" in host:
            raise PolicyBlockedError("zone_id: IPv6 literal with a zone id")
        if not rest:
            return host, None, True
        if not rest.startswith(":"):
            raise PolicyBlockedError("malformed_url: junk after IPv6 literal")
        return host, rest[1:], True
    if "[" in netloc or "]" in netloc:
        raise PolicyBlockedError("malformed_url: stray bracket in host")
    host, colon, port = netloc.partition(":")
    return host, (port if colon else None), False


def _parse_port(text: str | None, scheme: str, policy: FetchPolicy) -> int:
    if text is None:
        port = DEFAULT_PORTS[scheme]
    else:
        if not text:
            raise PolicyBlockedError("malformed_url: empty port")
        # Canonical decimal, which every parser reads alike: no sign, no leading zero (0443).
        if not (text.isascii() and text.isdigit() and len(text) <= 5 and str(int(text)) == text):
            raise PolicyBlockedError(f"malformed_url: invalid port {_clip(text)!r}")
        port = int(text)
    if port not in policy.allowed_ports:
        raise PolicyBlockedError(f"port_not_allowed: {port}")
    return port


def check_location(location: str) -> None:
    """Refuse a redirect's ``Location`` holding whitespace, a control character or a backslash,
    as received: ``urljoin`` strips leading whitespace and drops tabs and newlines, so the
    joined URL alone would look clean."""
    bad = _forbidden_character(location)
    if bad is not None:
        raise PolicyBlockedError(f"malformed_url: {bad} in Location")


def check_url(url: str, policy: FetchPolicy) -> Target:
    """Parse and validate ``url`` under ``policy``; PolicyBlockedError names the first rule broken.

    The detail starts with a reason code (``scheme_not_allowed:``, ``userinfo_present:``,
    ``port_not_allowed:``, ``host_not_allowed:``, ``ip_denied:<reason>:``, ``malformed_url:``,
    ``zone_id:``, ``numeric_host:``) and never contains the query string.
    """
    if not isinstance(url, str) or not url:
        raise PolicyBlockedError("malformed_url: empty")
    if len(url) > MAX_URL_LENGTH:
        raise PolicyBlockedError(f"malformed_url: longer than {MAX_URL_LENGTH} characters")
    bad = _forbidden_character(url)
    if bad is not None:
        raise PolicyBlockedError(f"malformed_url: {bad} in url")

    scheme_text, colon, rest = url.partition(":")
    if not colon or not _SCHEME_RE.fullmatch(scheme_text):
        raise PolicyBlockedError("malformed_url: no scheme")
    scheme = scheme_text.lower()
    if scheme not in policy.allowed_schemes or scheme not in DEFAULT_PORTS:
        raise PolicyBlockedError(f"scheme_not_allowed: {_clip(scheme)}")
    if not rest.startswith("//"):
        raise PolicyBlockedError("malformed_url: no authority (expected scheme://host)")

    rest = rest[2:]
    end = len(rest)
    for delimiter in "/?#":
        index = rest.find(delimiter)
        if 0 <= index < end:
            end = index
    netloc, tail = rest[:end], rest[end:]
    if "@" in netloc:
        raise PolicyBlockedError("userinfo_present: credentials or '@' in the authority")
    if not netloc.isascii():
        raise PolicyBlockedError("malformed_url: non-ASCII authority (give the A-label, xn--...)")

    raw_host, port_text, bracketed = _split_authority(netloc)
    if not raw_host:
        raise PolicyBlockedError("malformed_url: empty host")
    if bracketed:
        try:
            address: IPAddress = ipaddress.IPv6Address(raw_host)
        except ValueError:
            raise PolicyBlockedError(
                f"malformed_url: invalid IPv6 literal {_clip(raw_host)}"
            ) from None
    elif "%" in raw_host:
        raise PolicyBlockedError("malformed_url: percent-encoding in host")
    port = _parse_port(port_text, scheme, policy)

    if bracketed:
        ip_literal = True
    else:
        try:
            host = check_name(raw_host)
        except ValueError as exc:
            raise PolicyBlockedError(f"malformed_url: {exc}") from None
        try:
            address = ipaddress.IPv4Address(host)
            ip_literal = True
        except ValueError:
            ip_literal = False
        if not ip_literal and is_numeric_looking(host):
            raise PolicyBlockedError(
                f"numeric_host: {_clip(host)} is not a dotted-quad address; refused"
            )

    if ip_literal:
        checked = check_address(address, policy)
        host = str(checked)
        if policy.allowed_host_suffixes and not _allowed_by_cidr(checked, policy):
            raise PolicyBlockedError(f"host_not_allowed: IP literal {host} (suffix allowlist)")
    elif not _host_allowed(host, policy):
        raise PolicyBlockedError(f"host_not_allowed: {_clip(host)}")

    # ``tail`` starts with "/", "?", "#" or is empty; the fragment never goes on the wire.
    path_and_query = tail.partition("#")[0].removesuffix("?")
    if not path_and_query.startswith("/"):
        path_and_query = "/" + path_and_query
    return Target(scheme, host, port, ip_literal, path_and_query)


def redact_url(url: str) -> str:
    """``url`` without userinfo, query string and fragment: safe to show in logs and outputs."""
    cut = len(url)
    for delimiter in "?#":
        index = url.find(delimiter)
        if 0 <= index < cut:
            cut = index
    url = url[:cut]
    match = _AUTHORITY_RE.match(url)
    if match is None:
        return url
    scheme, authority, rest = match.group(1) or "", match.group(2), match.group(3)
    return f"{scheme}//{authority.rpartition('@')[2]}{rest}"
