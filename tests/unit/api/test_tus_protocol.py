"""The tus headers as api/tus_protocol.py reads them: offsets and lengths as plain digits
only, Upload-Metadata bounded and strictly base64, Upload-Checksum sha256 only."""

from __future__ import annotations

import base64
import hashlib
import uuid
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aivedio.api import tus_protocol
from aivedio.api.problems import ApiError
from aivedio.api.upload_hashes import UploadHashes


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


@pytest.mark.parametrize("value", ["0", "1", "007", str(2**63 - 1)])
def test_counts_are_plain_digits(value: str) -> None:
    assert tus_protocol.parse_count("Upload-Offset", value) == int(value)


@pytest.mark.parametrize(
    "value",
    [
        None,
        "",
        "-1",
        "+1",
        " 1",
        "1 ",
        "0x10",
        "1e3",
        "1_000",
        "\u0661",
        "\u00b2",
        str(2**63),
        "9" * 20,
    ],
)
def test_anything_else_is_refused_400(value: str | None) -> None:
    with pytest.raises(ApiError) as caught:
        tus_protocol.parse_count("Upload-Length", value)
    assert caught.value.status == 400 and caught.value.field == "Upload-Length"


@given(st.integers(min_value=0, max_value=2**63 - 1))
def test_every_64_bit_count_reads_back(value: int) -> None:
    assert tus_protocol.parse_count("Upload-Offset", str(value)) == value


def test_metadata_pairs_decode() -> None:
    raw = f"filename {b64('clip é.mp4'.encode())},is_private,passthrough {b64(b'x')}"
    found = tus_protocol.parse_metadata(raw)
    assert found == {"filename": "clip é.mp4".encode(), "is_private": b"", "passthrough": b"x"}
    assert tus_protocol.metadata_text(found, "filename", 255) == "clip é.mp4"
    assert tus_protocol.parse_metadata(None) == {} == tus_protocol.parse_metadata("  ")


@pytest.mark.parametrize(
    "raw",
    [
        "k " + "A" * 5000,  # past the byte bound
        ",".join(f"k{i}" for i in range(40)),  # past the pair bound
        "k not-base64!",
        "k QR==",  # padding bits set: not canonical
        "k QQ",  # unpadded
        f"k {b64(b'a')},k {b64(b'b')}",  # a key twice
        "a,b c,d",  # a value that is not base64
        f"ké {b64(b'x')}",  # a key that is not ASCII
        f"k\x01 {b64(b'x')}",  # a control character in a key
    ],
)
def test_metadata_abuse_is_refused(raw: str) -> None:
    with pytest.raises(ApiError) as caught:
        tus_protocol.parse_metadata(raw)
    assert caught.value.status == 400 and caught.value.code == "tus_metadata"


@pytest.mark.parametrize("raw", [b"\xff\xfe", b"a\x00b", b"tab\t", b"", b"x" * 300])
def test_metadata_that_becomes_our_text_must_be_visible_text(raw: bytes) -> None:
    with pytest.raises(ApiError):
        tus_protocol.metadata_text({"filename": raw}, "filename", 255)


def test_checksums_are_sha256_of_32_bytes() -> None:
    digest = hashlib.sha256(b"abc").digest()
    assert tus_protocol.parse_checksum(f"sha256 {b64(digest)}") == digest
    assert tus_protocol.parse_checksum(None) is None
    for bad, code in (
        (f"sha1 {b64(b'x' * 20)}", "checksum_algorithm"),
        (f"md5 {b64(b'x' * 16)}", "checksum_algorithm"),
        (f"sha256 {b64(digest[:20])}", "tus_header"),
        ("sha256 not base64", "tus_header"),
        ("sha256", "tus_header"),
    ):
        with pytest.raises(ApiError) as caught:
            tus_protocol.parse_checksum(bad)
        assert (caught.value.status, caught.value.code) == (400, code), bad


def test_the_version_is_1_0_0_or_412_naming_it() -> None:
    tus_protocol.require_version("1.0.0")
    for bad in (None, "0.2.2", "1.0", "1.0.0 "):
        with pytest.raises(ApiError) as caught:
            tus_protocol.require_version(bad)
        assert caught.value.status == 412
        assert caught.value.headers is not None
        assert caught.value.headers["Tus-Version"] == "1.0.0"


def test_upload_expires_is_an_http_date() -> None:
    moment = datetime(2026, 12, 7, 13, 5, 9, tzinfo=UTC)
    assert tus_protocol.http_date(moment) == "Mon, 07 Dec 2026 13:05:09 GMT"


def test_a_kept_hash_resumes_only_at_its_own_offset() -> None:
    hashes = UploadHashes()
    upload = uuid.uuid4()
    first = hashes.resume(upload, 0)
    assert first is not None
    first.update(b"abc")
    hashes.keep(upload, 3, first)
    assert hashes.resume(upload, 5) is None  # another process took bytes meanwhile
    again = hashes.resume(upload, 3)
    assert again is not None
    again.update(b"def")  # a copy: the kept one stays at offset 3 until this one is kept
    assert hashes.resume(upload, 3).hexdigest() == hashlib.sha256(b"abc").hexdigest()
    hashes.forget(upload)
    assert hashes.resume(upload, 3) is None
