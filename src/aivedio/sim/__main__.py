"""``python -m aivedio.sim``: the simulated provider as a process, for the demo and benchmarks.

Serves outputs over HTTPS with a fresh test CA (or plain HTTP with ``--plain``) and prints
one JSON line once it serves: ``port``, ``base_url``, ``ca_file`` and each output's ``url``,
``sha256`` and ``size``. Runs until killed. Loopback only.

    python -m aivedio.sim --ca-dir DIR --file task-1:0:clip.mp4 --generate bench:0:1073741824

``--vendor NAME`` speaks one vendor's API instead (``aivedio.sim.vendors``: runway,
veo_gemini, veo_vertex, replicate, fal, luma, kling, minimax, openrouter, seedance, wan),
with the given outputs as finished tasks and ``--api-key`` as the credential it expects;
point a ``[providers.NAME]`` section with that adapter at ``base_url``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import anyio

from aivedio.sim.provider import open_simulated_provider
from aivedio.sim.tls import make_test_ca


def _spec(value: str) -> tuple[str, int, str]:
    task_id, index, rest = value.split(":", 2)
    return task_id, int(index), rest


async def serve(args: argparse.Namespace) -> None:
    server_ctx = None
    ca_file = None
    if not args.plain:
        _ca, server_ctx, pem = make_test_ca((args.public_host,), Path(args.ca_dir))
        ca_file = str(pem)
    settings: dict[str, Any] = {
        "ssl_context": server_ctx,
        "host": args.host,
        "port": args.port,
        "public_host": args.public_host,
        "url_ttl_seconds": args.url_ttl_seconds,
    }
    if args.vendor:
        from aivedio.sim.vendors import SIMS

        settings.update(factory=SIMS[args.vendor], api_key=args.api_key)
    async with open_simulated_provider(**settings) as sim:
        tasks: list[str] = []
        for task_id, index, path in map(_spec, args.file):
            sim.add_output(task_id, index, await anyio.Path(path).read_bytes())
            tasks.append(task_id)
        for task_id, index, size in map(_spec, args.generate):
            sim.add_output(task_id, index, size=int(size))
            tasks.append(task_id)
        if args.vendor:
            from aivedio.sim.vendors import SimTask, VendorSim

            assert isinstance(sim, VendorSim)
            for task_id in dict.fromkeys(tasks):
                sim.tasks[task_id] = SimTask(task_id, len(sim.task_json(task_id)["outputs"]))
                sim.complete(task_id)
        outputs: list[dict[str, Any]] = []
        for task_id in dict.fromkeys(tasks):
            for output in sim.task_json(task_id)["outputs"]:
                outputs.append({"task_id": task_id, **output})
        print(
            json.dumps(
                {"port": sim.port, "base_url": sim.base_url, "ca_file": ca_file, "outputs": outputs}
            ),
            flush=True,
        )
        await anyio.sleep_forever()


def main() -> int:
    parser = argparse.ArgumentParser(
        prog="python -m aivedio.sim", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--public-host", default="127.0.0.1")
    parser.add_argument("--ca-dir", default="var/sim-ca")
    parser.add_argument("--plain", action="store_true", help="HTTP instead of HTTPS")
    parser.add_argument("--url-ttl-seconds", type=float, default=3600)
    parser.add_argument("--file", action="append", default=[], metavar="TASK:INDEX:PATH")
    parser.add_argument("--generate", action="append", default=[], metavar="TASK:INDEX:BYTES")
    parser.add_argument("--vendor", help="speak this vendor's API (aivedio.sim.vendors)")
    parser.add_argument("--api-key", default="sim-api-key", help="the credential it expects")
    args = parser.parse_args()
    if args.host not in ("127.0.0.1", "::1", "localhost"):
        parser.error("the simulated provider listens on loopback only")
    anyio.run(serve, args, backend="asyncio", backend_options={"use_uvloop": True})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
