"""A throwaway C2PA signing chain, for development, tests and the demo: no real CA.

c2pa-rs refuses to sign with, and refuses as valid, a certificate that does not look like a
real signing certificate: a self-signed end entity, one without an Extended Key Usage that
C2PA accepts, one that is a CA, one without the key identifiers. So the chain here is what a
CA would issue: a root, an intermediate (``pathLen`` 0) and an end-entity certificate for
``digitalSignature`` with the ``emailProtection`` and C2PA-signing EKUs, each ECDSA P-256
(ES256). The root is returned apart, as a verifier's trust anchor: a reader given it says
``Trusted``, one without it says the signer is untrusted.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# The C2PA signing EKU (id-kp-c2pa-signing, C2PA 2.x certificate profile).
C2PA_SIGNING_EKU = x509.ObjectIdentifier("1.3.6.1.4.1.62558.2.1")
VALIDITY_DAYS = 30


@dataclass(frozen=True)
class SigningChain:
    """PEM text: ``chain`` (end entity, then intermediate: what a signer sends), ``key``
    (the end entity's PKCS#8 private key) and ``root`` (the trust anchor, never sent)."""

    chain: str
    key: str
    root: str

    def write(self, directory: Path) -> tuple[Path, Path, Path]:
        """Write ``chain.pem``, ``key.pem`` (mode 0600) and ``root.pem`` in ``directory``."""
        directory.mkdir(parents=True, exist_ok=True)
        chain, key, root = directory / "chain.pem", directory / "key.pem", directory / "root.pem"
        chain.write_text(self.chain)
        key.touch(mode=0o600)
        key.write_text(self.key)
        root.write_text(self.root)
        return chain, key, root


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.COUNTRY_NAME, "US"),
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "aivedio development"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def _certificate(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: tuple[x509.Name, ec.EllipticCurvePrivateKey] | None,
    *,
    ca: bool,
    path_length: int | None = None,
    now: datetime.datetime,
) -> x509.Certificate:
    name = _name(subject)
    issuer_name, issuer_key = issuer if issuer is not None else (name, key)
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=VALIDITY_DAYS))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=path_length), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()),
            critical=False,
        )
    )
    if ca:
        builder = builder.add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
    else:
        builder = builder.add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        ).add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.EMAIL_PROTECTION, C2PA_SIGNING_EKU]),
            critical=False,
        )
    return builder.sign(issuer_key, hashes.SHA256())


def make_chain(organization_unit: str = "aivedio platform") -> SigningChain:
    """A new root, intermediate and end entity (named ``organization_unit``), valid for
    ``VALIDITY_DAYS`` days from now."""
    now = datetime.datetime.now(datetime.UTC)
    root_key = ec.generate_private_key(ec.SECP256R1())
    root = _certificate("aivedio throwaway root", root_key, None, ca=True, now=now)
    mid_key = ec.generate_private_key(ec.SECP256R1())
    mid = _certificate(
        "aivedio throwaway intermediate",
        mid_key,
        (root.subject, root_key),
        ca=True,
        path_length=0,
        now=now,
    )
    leaf_key = ec.generate_private_key(ec.SECP256R1())
    leaf = _certificate(organization_unit, leaf_key, (mid.subject, mid_key), ca=False, now=now)

    def pem(cert: x509.Certificate) -> str:
        return cert.public_bytes(serialization.Encoding.PEM).decode("ascii")

    key = leaf_key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode("ascii")
    return SigningChain(chain=pem(leaf) + pem(mid), key=key, root=pem(root))
