"""Host names and allowlist entries: what a host we fetch from may look like, and what an
entry of ``allowed_host_suffixes`` means.

One grammar for both: the configuration is checked with it when it loads, and the fetch
policy (``net.policy``) matches URLs with it, so what an entry allows is decided once.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import lru_cache

MAX_HOST_LENGTH = 253
MAX_LABEL_LENGTH = 63
LABEL_RE = re.compile(r"[a-z0-9_\-]+")


def check_name(host: str) -> str:
    """``host`` lowercased, if it is a DNS name we take as written; ValueError otherwise.

    ASCII only, no trailing dot, no empty label, labels of ``[a-z0-9_-]``, punycode that
    decodes. Nothing is mapped or stripped: a name that needs it is refused (see the module
    docstring), so the policy, the resolver, SNI and the certificate check see one string.
    """
    if not host:
        raise ValueError("empty host")
    if not host.isascii():
        raise ValueError("non-ASCII host (give its A-label, xn--...)")
    if host.endswith("."):
        raise ValueError("trailing dot in host")
    host = host.lower()
    if len(host) > MAX_HOST_LENGTH:
        raise ValueError("host longer than 253 characters")
    for label in host.split("."):
        if not label:
            raise ValueError("empty label in host")
        if len(label) > MAX_LABEL_LENGTH:
            raise ValueError("label longer than 63 characters")
        if not LABEL_RE.fullmatch(label):
            raise ValueError("invalid character in host")
        if label.startswith("xn--"):
            try:
                label.encode("ascii").decode("idna")
            except UnicodeError:
                raise ValueError("invalid punycode label") from None
    return host


def entry_name(text: str) -> str:
    """An allowlist entry's name in A-label form. Configuration is trusted, so a Unicode
    entry is encoded (IDNA 2003), but only when that leaves it as written up to case:
    ``exämple.org`` passes, ``straße.de`` (which IDNA 2003 and 2008 encode differently) not."""
    if not text.isascii():
        try:
            encoded = text.encode("idna").decode("ascii")
            canonical = encoded.encode("ascii").decode("idna") == text.lower()
        except UnicodeError:
            raise ValueError("fails IDNA encoding") from None
        if not canonical:
            raise ValueError("not in IDNA canonical form")
        text = encoded
    return check_name(text)


def is_numeric_looking(host: str) -> bool:
    """Whether a URL host could be read as an IPv4 number (WHATWG: the last label is numeric).
    Any last label starting ``0x`` counts, hex or not: no top-level domain does, and the wider
    rule is the one simple enough that no client's number parser can disagree with it."""
    last = host.rsplit(".", 1)[-1]
    return (last.isascii() and last.isdigit()) or last.startswith("0x")


@lru_cache(maxsize=64)
def host_rules(entries: tuple[str, ...]) -> tuple[tuple[str, bool], ...]:
    """Each entry as (name, subdomains only); ValueError names the first bad entry."""
    out = []
    for entry in entries:
        subdomains = entry.startswith(".")
        try:
            name = entry_name(entry[1:] if subdomains else entry)
            if is_numeric_looking(name):
                raise ValueError("an address, not a name (addresses go in allow_cidrs)")
        except ValueError as exc:
            raise ValueError(f"{entry!r}: {exc}") from None
        out.append((name, subdomains))
    return tuple(out)


def check_host_suffixes(entries: Iterable[str]) -> None:
    """ValueError, naming the entry, unless every allowlist entry is valid: ``name`` (that
    host exactly) or ``.name`` (its subdomains, not ``name`` itself)."""
    host_rules(tuple(entries))


def host_suffix_within(entry: str, wider: Iterable[str]) -> bool:
    """Whether every host ``entry`` allows is allowed by ``wider`` too (a provider's
    allowlist may only narrow ``[net]``'s). ValueError if an entry is invalid."""
    ((name, subdomains),) = host_rules((entry,))
    for wide, wide_subdomains in host_rules(tuple(wider)):
        if not wide_subdomains:
            if not subdomains and name == wide:
                return True
        elif (subdomains and name == wide) or name.endswith("." + wide):
            return True
    return False
