"""Baseline (b'): boto3's upload_fileobj streaming an HTTPS body into S3, as people write it.

Prints one JSON line: bytes, seconds, peak RSS. The body is read through urllib's response
object, so boto3's transfer manager pulls it in parts with its default concurrency.
"""

from __future__ import annotations

import argparse
import json
import resource
import ssl
import sys
import time
import urllib.request
from pathlib import Path

if sys.path and sys.path[0] and __file__.startswith(sys.path[0]):
    sys.path.pop(0)

import boto3

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))
from seaweedfs import ACCESS_KEY_ID, SECRET_ACCESS_KEY


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--ca-file", required=True)
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--bucket", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument(
        "--sha256",
        action="store_true",
        help="ask for SHA-256 checksums per part (default: boto3's, a CRC32)",
    )
    args = parser.parse_args()
    client = boto3.client(
        "s3",
        endpoint_url=args.endpoint,
        region_name="us-east-1",
        aws_access_key_id=ACCESS_KEY_ID,
        aws_secret_access_key=SECRET_ACCESS_KEY,
    )
    context = ssl.create_default_context(cafile=args.ca_file)
    started = time.perf_counter()
    streamed: list[float] = []  # when the transfer manager asks the store to complete

    def before_complete(**_: object) -> None:
        streamed.append(time.perf_counter() - started)

    client.meta.events.register("before-call.s3.CompleteMultipartUpload", before_complete)
    with urllib.request.urlopen(args.url, context=context) as response:  # noqa: S310 - loopback
        extra = {"ChecksumAlgorithm": "SHA256"} if args.sha256 else None
        client.upload_fileobj(response, args.bucket, args.key, ExtraArgs=extra)
    seconds = time.perf_counter() - started
    size = client.head_object(Bucket=args.bucket, Key=args.key)["ContentLength"]
    print(
        json.dumps(
            {
                "bytes": size,
                "seconds": seconds,
                "stream_seconds": streamed[0] if streamed else seconds,
                "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                "cpu_seconds": _cpu_seconds(),
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
