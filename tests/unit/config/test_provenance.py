"""``[provenance]``: defaults read and never sign; each bad key is named."""

from __future__ import annotations

import pytest

from aivedio.config.provenance import ProvenanceConfig, validate_provenance
from aivedio.errors import ConfigError


def test_the_defaults_read_and_do_not_sign() -> None:
    config = ProvenanceConfig()
    validate_provenance(config)
    assert config.read and not config.signing
    assert config.signed_outputs == ["playback", "proxy", "poster"]


@pytest.mark.parametrize(
    ("settings", "key"),
    [
        ({"algorithm": "rsa1024"}, "provenance.algorithm"),
        ({"on_sign_failure": "ignore"}, "provenance.on_sign_failure"),
        ({"signed_outputs": ["hls"]}, "provenance.signed_outputs"),
        ({"certificate_chain_file": "chain.pem"}, "provenance.private_key_file"),
        (
            {"certificate_chain_file": "c.pem", "private_key_file": "k.pem", "key_callback": "a:b"},
            "provenance.private_key_file",
        ),
        ({"private_key_file": "k.pem"}, "provenance.certificate_chain_file"),
        (
            {"certificate_chain_file": "c.pem", "key_callback": "no_colon"},
            "provenance.key_callback",
        ),
        ({"timestamp_url": "ftp://tsa"}, "provenance.timestamp_url"),
        ({"assertions": [{"data": {}}]}, "provenance.assertions[0]"),
    ],
)
def test_a_bad_key_is_named(settings: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError, match=key.replace("[", r"\[").replace("]", r"\]")):
        validate_provenance(ProvenanceConfig(**settings))  # type: ignore[arg-type]
