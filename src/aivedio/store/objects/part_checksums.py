"""The checksum each S3 part (or single put) carries, which the store verifies on arrival.

A part's checksum is a transport check: S3 computes it over the bytes it received and
refuses the part (``BadDigest``) when it differs, and a store that echoes another value than
the one sent stored other bytes (``check_echoed``). It is not the object's integrity
guarantee: that is the whole object's SHA-256, computed as the bytes stream through,
recorded, and checked against the provider's (or the uploader's) by the stage that stores it.

Two algorithms:

* ``SHA256``, the default for uploads that live in one process (``S3Upload``: fetches and
  outputs), and always for appends (``s3_append``: resumable uploads), whose multipart
  uploads outlive a process and whose marks, recorded in the database, name each part's
  SHA-256: an upload begun with one algorithm must be continued and completed with it, so a
  change would strand the uploads open at the time of a deploy.
* ``CRC32``, chosen by ``[storage] s3_part_checksum = "crc32"`` for one-process uploads. It
  catches what a transport check must (any burst of up to 32 flipped bits, and all but one
  in 2^32 of any other corruption) at a third of SHA-256's CPU (zlib's CRC32 against
  hashlib's SHA-256, both run with the GIL released): on a machine whose cores the TLS
  reads, the engine and the uploader share, the part's SHA-256 on top of the object's is
  the cost that holds the fetch at or below boto3's (whose default is CRC32 too).
"""

from __future__ import annotations

import base64
import hashlib
import zlib
from collections.abc import Callable
from typing import Any

import msgspec

from aivedio.errors import ChecksumMismatchError

Buffer = bytes | bytearray | memoryview


def sha256_b64(data: Buffer) -> str:
    return base64.b64encode(hashlib.sha256(data).digest()).decode("ascii")


def crc32_b64(data: Buffer) -> str:
    """S3's ``ChecksumCRC32``: the big-endian CRC32 (zlib's, ISO-HDLC), base64."""
    return base64.b64encode(zlib.crc32(data).to_bytes(4, "big")).decode("ascii")


class PartChecksum(msgspec.Struct, frozen=True):
    """An algorithm as S3 names it: ``ChecksumAlgorithm``, and the field of its value."""

    algorithm: str
    field: str
    compute: Callable[[Buffer], str]


CRC32 = PartChecksum("CRC32", "ChecksumCRC32", crc32_b64)
SHA256 = PartChecksum("SHA256", "ChecksumSHA256", sha256_b64)
BY_NAME = {"sha256": SHA256, "crc32": CRC32}


def part_checksum_named(name: str) -> PartChecksum:
    """``[storage] s3_part_checksum``'s algorithm; ValueError names the choices."""
    try:
        return BY_NAME[name]
    except KeyError:
        raise ValueError(f"s3_part_checksum: {name!r}: one of {sorted(BY_NAME)}") from None


def check_echoed(response: Any, checksum: PartChecksum, value: str, what: str) -> None:
    """A store that echoes a checksum other than the one we sent stored other bytes."""
    echoed = response.get(checksum.field)
    if echoed is not None and echoed != value:
        raise ChecksumMismatchError(
            f"{what}: the store computed {checksum.algorithm} {echoed}, we sent {value}"
        )
