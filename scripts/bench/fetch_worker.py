"""One fetch as the worker does it, in a process of its own, for scripts/bench/fetch.py.

Guarded fetch (policy, pinned resolver, deadlines, byte cap, SHA-256) streamed into an
upload of the configured object store, completed and HEAD-verified. Prints one JSON line:
bytes, sha256, seconds, and this process's peak RSS (ru_maxrss). Not a test: a workload.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

# Run as a script from scripts/bench, whose queue.py would shadow the stdlib module.
if sys.path and sys.path[0] and __file__.startswith(sys.path[0]):
    sys.path.pop(0)

import anyio

from aivedio.config.load import NetConfig, StorageConfig
from aivedio.memory import tune_allocator
from aivedio.pipeline.services import make_fetcher
from aivedio.store.objects.opening import open_object_store

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))
from seaweedfs import ACCESS_KEY_ID, SECRET_ACCESS_KEY


async def run(args: argparse.Namespace) -> dict[str, object]:
    net = NetConfig(
        allowed_ports=[args.port],
        allow_cidrs=["127.0.0.0/8"],
        ca_file=args.ca_file,
        max_bytes=args.max_bytes,
        total_timeout_seconds=3600,
    )
    storage = StorageConfig(
        url=args.storage_url,
        s3_endpoint_url=args.s3_endpoint or "",
        s3_access_key_id=ACCESS_KEY_ID,
        s3_secret_access_key=SECRET_ACCESS_KEY,
        s3_part_checksum=args.part_checksum,
    )
    fetcher = make_fetcher(net)
    try:
        async with open_object_store(
            storage, part_size_bytes=args.part_size_bytes, parts_in_flight=args.parts_in_flight
        ) as store:
            started = time.perf_counter()
            upload = await store.start_upload(args.key, content_type="video/mp4")
            try:
                result = await fetcher.stream(args.url, upload.write)
                streamed = time.perf_counter() - started  # every part sent; the store completes
                await upload.complete()
            except BaseException:
                await upload.abort()
                raise
            seconds = time.perf_counter() - started
            head = await store.head(args.key)
            assert head is not None and head.size == result.bytes
    finally:
        await fetcher.aclose()
    return {
        "bytes": result.bytes,
        "sha256": result.sha256,
        "seconds": seconds,
        "stream_seconds": streamed,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "cpu_seconds": _cpu_seconds(),
    }


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--ca-file", required=True)
    parser.add_argument("--storage-url", required=True)
    parser.add_argument("--s3-endpoint")
    parser.add_argument("--key", default="quarantine/bench/source.bin")
    parser.add_argument("--max-bytes", type=int, default=8 << 30)
    parser.add_argument("--part-size-bytes", type=int, default=8 << 20)
    parser.add_argument("--parts-in-flight", type=int, default=2)
    parser.add_argument("--part-checksum", choices=["sha256", "crc32"], default="sha256")
    args = parser.parse_args()
    tune_allocator()  # as `aivedio worker` does at start
    figures = anyio.run(run, args, backend="asyncio", backend_options={"use_uvloop": True})
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
