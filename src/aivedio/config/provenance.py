"""The [provenance] section: reading C2PA manifests at the probe, signing what we publish.

Reading is on by default and never blocks publication by itself (a provider's
``require_provenance`` does). Signing is off until a signer is configured: a PEM
certificate chain (end entity first) with its private key, or a chain with a
``key_callback`` (``"package.module:function"``, called with the bytes to sign and returning
the signature: the seam for a KMS or an HSM).
"""

from __future__ import annotations

from typing import Any

import msgspec

from aivedio.errors import ConfigError

SIGNABLE_OUTPUTS = ("playback", "proxy", "poster")
ALGORITHMS = ("es256", "es384", "es512", "ps256", "ps384", "ps512", "ed25519")


class ProvenanceConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    # Read the source's C2PA manifest store at the probe (in a sandboxed child process).
    read: bool = True
    # PEM roots a source's (and our own) signer must chain to, to count as trusted; empty:
    # every signer is "untrusted" (its signature and hashes are still checked).
    trust_anchors_file: str = ""
    reader_timeout_seconds: float = 15.0
    # The reader's own rlimits (tighter than ffmpeg's: a manifest store is small).
    reader_address_space_mib: int = 2048
    reader_cpu_seconds: int = 30
    # Signing: on when certificate_chain_file is set.
    certificate_chain_file: str = ""
    private_key_file: str = ""
    key_callback: str = ""
    algorithm: str = "es256"
    timestamp_url: str = ""  # an RFC 3161 timestamp authority, optional
    signed_outputs: list[str] = msgspec.field(default_factory=lambda: list(SIGNABLE_OUTPUTS))
    # fail: a signing failure fails the output (a required one blocks publication);
    # publish_unsigned: the output is published unsigned, the reason recorded on it.
    on_sign_failure: str = "fail"
    # Assertions added verbatim to every platform manifest ({label = ..., data = {...}});
    # none by default: the platform's manifest carries no user data.
    assertions: list[dict[str, Any]] = msgspec.field(default_factory=list)

    @property
    def signing(self) -> bool:
        return bool(self.certificate_chain_file)


def validate_provenance(config: ProvenanceConfig) -> None:
    """Semantic checks on [provenance]; each error names its key."""
    if config.algorithm not in ALGORITHMS:
        raise ConfigError(f"config error: provenance.algorithm: one of {', '.join(ALGORITHMS)}")
    if config.on_sign_failure not in ("fail", "publish_unsigned"):
        raise ConfigError("config error: provenance.on_sign_failure: fail or publish_unsigned")
    for output in config.signed_outputs:
        if output not in SIGNABLE_OUTPUTS:
            raise ConfigError(
                f"config error: provenance.signed_outputs: {output!r} cannot be signed; "
                f"signable: {', '.join(SIGNABLE_OUTPUTS)}"
            )
    if config.signing and bool(config.private_key_file) == bool(config.key_callback):
        raise ConfigError(
            "config error: provenance.private_key_file: set it or key_callback (one of them)"
        )
    if not config.signing and (config.private_key_file or config.key_callback):
        raise ConfigError("config error: provenance.certificate_chain_file: needed to sign")
    if config.key_callback and ":" not in config.key_callback:
        raise ConfigError("config error: provenance.key_callback: 'package.module:function'")
    if config.timestamp_url and not config.timestamp_url.startswith(("http://", "https://")):
        raise ConfigError("config error: provenance.timestamp_url: an http(s) URL")
    if config.reader_timeout_seconds <= 0 or config.reader_address_space_mib < 256:
        raise ConfigError(
            "config error: provenance.reader_timeout_seconds: > 0, and "
            "reader_address_space_mib: >= 256"
        )
    for index, assertion in enumerate(config.assertions):
        if not isinstance(assertion.get("label"), str) or "data" not in assertion:
            raise ConfigError(
                f"config error: provenance.assertions[{index}]: needs a label and data"
            )
