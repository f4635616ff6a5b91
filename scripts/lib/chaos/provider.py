"""The simulated provider as a process, serving the plan's outputs with their faults.

    python scripts/lib/chaos/provider.py --plan PLAN.json --media DIR --ca-dir DIR
        --signing-key-file F --signatures-out F

Prints one JSON line once it serves (``port``, ``base_url``, ``ca_file`` and each file's
``sha256`` and ``size``), then runs until SIGTERM. Every URL signature it issues is appended
to ``--signatures-out`` (one a line): the harness greps every log for them afterwards.

On top of the simulator's own :class:`Faults`, two transient transport faults: the first N
downloads of an output are cut (``truncate_at_bytes``) or stall (``stall_after_bytes``), and
later ones are served whole; the simulator's own are permanent.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import signal
import sys
from pathlib import Path
from typing import IO, Any

import anyio
import msgspec
from aiohttp import web

from aivedio.sim.provider import Faults, SimulatedProvider, _Output
from aivedio.sim.tls import make_test_ca

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from chaos.plan import BY_NAME


def faults_for(kind: str, size: int) -> tuple[Faults, int]:
    """The simulator's faults for a kind, and how many first downloads the transport fault
    (if any) lasts."""
    if kind == "provider_5xx":
        return Faults(error_requests=2), 0
    if kind == "throttled":
        return Faults(throttle_requests=2, retry_after_seconds=0.5), 0
    if kind == "not_ready":
        return Faults(not_ready_requests=1), 0
    if kind in ("gone", "gone_expired"):
        return Faults(gone=True), 0
    if kind == "redirects":
        return Faults(redirect_hops=2), 0
    if kind == "truncated_transfer":
        return Faults(truncate_at_bytes=max(1, size * 3 // 10)), 2
    if kind == "stalled_transfer":
        return Faults(stall_after_bytes=min(20_000, size // 2)), 1
    return Faults(), 0


class ChaosProvider(SimulatedProvider):
    def __init__(self, *, record: IO[str], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.record = record
        self.transient: dict[tuple[str, int], int] = {}

    def _signed(self, task_id: str, index: int, ttl_seconds: float | None) -> tuple[str, int]:
        url, exp = super()._signed(task_id, index, ttl_seconds)
        self.record.write(self._signature(task_id, index, exp) + "\n")
        self.record.flush()
        return url, exp

    async def _send_body(self, request: web.Request, output: _Output) -> web.StreamResponse:
        budget = self.transient.get((output.task_id, output.index))
        if budget is not None and output.attempts > budget:
            output.faults = msgspec.structs.replace(
                output.faults, truncate_at_bytes=None, stall_after_bytes=None
            )
        return await super()._send_body(request, output)


def prepare(args: argparse.Namespace) -> tuple[ChaosProvider, dict[str, Any], str]:
    """The provider with every output of the plan (blocking reads, before the loop runs)."""
    plan = json.loads(Path(args.plan).read_text())
    _ca, server_ctx, pem = make_test_ca(("127.0.0.1",), Path(args.ca_dir))
    record = open(args.signatures_out, "a")  # noqa: SIM115 - open for the process's life
    key = bytes.fromhex(Path(args.signing_key_file).read_text())
    provider = ChaosProvider(
        record=record,
        ssl_context=server_ctx,
        host="127.0.0.1",
        port=0,
        public_host="127.0.0.1",
        signing_key=key,
    )
    files: dict[str, dict[str, Any]] = {}
    for entry in plan["outputs"]:
        kind = BY_NAME[entry["kind"]]
        data = (Path(args.media) / kind.source).read_bytes()
        faults, transient = faults_for(kind.name, len(data))
        provider.add_output(entry["task_id"], 0, data, faults=faults)
        if transient:
            provider.transient[(entry["task_id"], 0)] = transient
        files[kind.source] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
    return provider, files, str(pem)


async def serve(provider: ChaosProvider, files: dict[str, Any], ca_file: str) -> None:
    await provider.start()
    try:
        print(
            json.dumps(
                {
                    "port": provider.port,
                    "base_url": provider.base_url,
                    "ca_file": ca_file,
                    "files": files,
                }
            ),
            flush=True,
        )
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for _ in signals:
                break
    finally:
        await provider.aclose()
        provider.record.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name in ("--plan", "--media", "--ca-dir", "--signing-key-file", "--signatures-out"):
        parser.add_argument(name, required=True)
    provider, files, ca_file = prepare(parser.parse_args())
    anyio.run(serve, provider, files, ca_file, backend="asyncio")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
