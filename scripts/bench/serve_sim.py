"""The simulated provider as a process of its own, serving one generated output over HTTPS.

Prints one JSON line (port, url, sha256, size) once it serves, then runs until killed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

if sys.path and sys.path[0] and __file__.startswith(sys.path[0]):
    sys.path.pop(0)

import anyio

from aivedio.sim.provider import open_simulated_provider
from aivedio.sim.tls import make_test_ca


async def serve(args: argparse.Namespace) -> None:
    _ca, server_ctx, pem = make_test_ca(("127.0.0.1",), Path(args.ca_dir))
    async with open_simulated_provider(
        ssl_context=server_ctx, public_host="127.0.0.1", url_ttl_seconds=24 * 3600
    ) as sim:
        sim.add_output("bench", 0, size=args.size)
        doc = sim.task_json("bench")["outputs"][0]
        print(
            json.dumps(
                {
                    "port": sim.port,
                    "url": doc["url"],
                    "sha256": doc["sha256"],
                    "size": doc["size"],
                    "ca_file": str(pem),
                }
            ),
            flush=True,
        )
        await anyio.sleep_forever()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, required=True)
    parser.add_argument("--ca-dir", required=True)
    anyio.run(serve, parser.parse_args(), backend="asyncio", backend_options={"use_uvloop": True})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
