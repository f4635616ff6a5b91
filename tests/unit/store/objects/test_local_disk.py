"""store/objects/local_disk.py's write_all: a batch of chunks in order through writev, going
on after short writes (which regular files rarely make, so they are forced here)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from aivedio.store.objects import local_disk


def test_chunks_go_in_order_after_what_the_file_held(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"head-")
    chunks = [os.urandom(size) for size in (1, 70_000, 3, 250_000)]
    with open(path, "r+b", buffering=0) as file:
        file.seek(5)
        local_disk.write_all(file.fileno(), chunks)
    assert path.read_bytes() == b"head-" + b"".join(chunks)


def test_short_writes_and_more_chunks_than_one_writev_takes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    writev = os.writev
    calls: list[int] = []

    def short(fd: int, buffers: list[bytes]) -> int:
        calls.append(len(buffers))
        # At most 7 bytes, often ending inside a buffer.
        taken, left = [], 7
        for buffer in buffers:
            if not left:
                break
            piece = bytes(buffer[:left])
            taken.append(piece)
            left -= len(piece)
        return writev(fd, taken)

    monkeypatch.setattr(os, "writev", short)
    monkeypatch.setattr(local_disk, "IOV_MAX", 4)
    chunks = [bytes([n]) * (n % 5 + 1) for n in range(30)]
    path = tmp_path / "f"
    with open(path, "wb", buffering=0) as file:
        local_disk.write_all(file.fileno(), chunks)
    assert path.read_bytes() == b"".join(chunks)
    assert max(calls) <= 4 and len(calls) > len(chunks) // 4


def test_a_writev_that_writes_nothing_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "writev", lambda fd, buffers: 0)
    with (
        open(tmp_path / "f", "wb", buffering=0) as file,
        pytest.raises(OSError, match="wrote nothing"),
    ):
        local_disk.write_all(file.fileno(), [b"x"])
