"""The byte transfer CPU account: a block's thread CPU added to its kind, nothing else's."""

from __future__ import annotations

import hashlib
import threading
import time

import pytest

from aivedio import transfer_cpu
from aivedio.metrics import WorkerMetrics


def spin(seconds: float) -> None:
    """Burn this thread's CPU for about ``seconds``."""
    end = time.thread_time() + seconds
    data = b"x" * 65536
    while time.thread_time() < end:
        hashlib.sha256(data).digest()


def test_a_block_adds_its_own_thread_cpu_to_its_kind() -> None:
    before = transfer_cpu.seconds()
    with transfer_cpu.measured("hash"):
        spin(0.05)
    time.sleep(0.05)  # wall time outside and inside a block is not CPU
    with transfer_cpu.measured("hash"):
        time.sleep(0.05)
    after = transfer_cpu.seconds()
    assert 0.04 < after["hash"] - before["hash"] < 0.2
    assert after["store"] == before["store"] and after["fetch"] == before["fetch"]


def test_another_threads_cpu_is_not_counted() -> None:
    before = transfer_cpu.seconds()["store"]
    busy = threading.Thread(target=spin, args=(0.2,))
    with transfer_cpu.measured("store"):
        busy.start()
        busy.join()  # this thread waits: the other one burns its own CPU
    assert transfer_cpu.seconds()["store"] - before < 0.05


def test_measuring_wraps_a_call_for_a_thread() -> None:
    before = transfer_cpu.seconds()["fetch"]
    wrapped = transfer_cpu.measuring("fetch", spin)
    done = threading.Thread(target=wrapped, args=(0.05,))
    done.start()
    done.join()
    assert transfer_cpu.seconds()["fetch"] - before > 0.04


def test_an_unknown_kind_is_refused() -> None:
    with (
        pytest.raises(ValueError, match="unknown byte transfer kind"),
        transfer_cpu.measured("network"),
    ):
        pass


def test_the_worker_exports_the_totals() -> None:
    with transfer_cpu.measured("store"):
        spin(0.01)
    text = WorkerMetrics().render().decode()
    lines = [
        line
        for line in text.splitlines()
        if line.startswith("aivedio_byte_transfer_cpu_seconds_total{")
    ]
    values = {
        line.split('kind="')[1].split('"')[0]: float(line.rsplit(" ", 1)[1]) for line in lines
    }
    assert set(values) == set(transfer_cpu.KINDS)
    assert values["store"] >= 0.01
