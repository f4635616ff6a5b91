"""Fetch benchmark: a large body from a loopback HTTPS server into storage, against baselines.

All in one run, for each body size (1 GiB and 4 GiB by default):

(a)  the full guarded fetch (policy, pinned resolver, deadlines, cap, SHA-256) into the local
     filesystem store (temp file, fsync, atomic rename), in a process of its own;
(a') ``curl | tee FILE | sha256sum`` writing the same file;

and then on each S3 engine, SeaweedFS (a real distributed object store) and moto's server
(a mock, single-threaded, objects in memory), both started here:

(b)  the same guarded fetch into S3 (multipart, bounded parts in flight, the object's
     SHA-256 computed as the body streams; each part's checksum as ``--part-checksum`` says,
     ``[storage] s3_part_checksum``: sha256, the default, or crc32);
(b') boto3's ``upload_fileobj`` streaming the same HTTP body into the same S3 server (boto3's
     default: a CRC32 per part);
(b'') the same with SHA-256 checksums per part (the guarded fetch's default);
(c)  on SeaweedFS only, its own ``weed upload`` of the file (a') wrote, straight to the
     master and volume server (no S3 gateway, no filer, no HTTPS body): the engine's
     ceiling on this machine.

The server is the simulated provider in a process of its own (``python -m aivedio.sim``);
the engines run as processes of their own too. Peak RSS is each fetching process's
``ru_maxrss``. The S3 paths are split into phases: streaming (until every part was sent)
and completing (the engine assembling the parts). On each engine the three S3 paths run
``--rounds`` times (3 by default), each round after a discarded warm-up upload and in a
rotated order (each path once in each place over three rounds), each path after an
``os.sync()``; each path's figure is the mean of its rounds.

Usage: .venv/bin/python scripts/bench/fetch.py [--sizes-gib 1 4] [--part-checksum crc32]
       [--engines SeaweedFS moto] [--rounds 3] [--workdir DIR] [--smoke]

Every process's stderr is kept under the work directory's ``logs/``; a server that exits
during the run fails it at once with the end of its log, and so does a fetch or an upload
that fails. ``--smoke``: one 8 MiB body (two 5 MiB parts), no warm-up, and the figures
checked for sanity (every path moved every byte, with the right checksum).
"""

from __future__ import annotations

import sys

if sys.path and sys.path[0] and __file__.startswith(sys.path[0]):
    sys.path.pop(0)

import argparse
import json
import os
import platform
import shutil
import signal
import socket
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import boto3

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "lib"))
from children import Child, Children  # noqa: E402
from seaweedfs import ACCESS_KEY_ID, SECRET_ACCESS_KEY, Engine  # noqa: E402
from smoke import positive, verdict  # noqa: E402

BUCKET = "aivedio-bench"
GIB = 1 << 30
MIB = 1 << 20


def log(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def answers(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=1)  # noqa: S310 - loopback
    except OSError:
        return False
    return True


def start_moto(children: Children) -> str:
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    moto = children.start(
        "S3 server (moto)",
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        log="moto.log",
    )
    moto.wait_for(lambda: answers(f"{endpoint}/moto-api/"), "an answer", 30)
    s3_client(endpoint).create_bucket(Bucket=BUCKET)
    return endpoint


def start_seaweedfs(children: Children, workdir: Path) -> tuple[Engine, Child]:
    engine = Engine.create(workdir / "seaweedfs")
    server = children.start("S3 server (SeaweedFS)", engine.argv(), log="seaweedfs.log")
    server.wait_for(engine.answers, "an answer", 60)
    engine.ensure_bucket(BUCKET)
    return engine, server


def s3_client(endpoint: str) -> Any:
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id=ACCESS_KEY_ID,
        aws_secret_access_key=SECRET_ACCESS_KEY,
    )


def weed_upload(children: Children, engine: Engine, path: Path) -> dict[str, Any]:
    """(c): ``weed upload`` of a local file to the master and volume server, in 8 MiB
    chunks; its wall time and the size it reports."""
    master = f"127.0.0.1:{engine.ports['master']}.{engine.ports['master.grpc']}"
    argv = [engine.argv()[0], "upload", f"-master={master}", "-maxMB=8", str(path)]
    started = time.perf_counter()
    stdout = children.run("weed upload", argv)
    seconds = time.perf_counter() - started
    (uploaded,) = json.loads(stdout)
    # A file split into chunks is answered with its manifest's id and no size.
    size = int(uploaded.get("size") or path.stat().st_size)
    if uploaded.get("error") or not uploaded.get("fid") or size != path.stat().st_size:
        raise SystemExit(f"weed upload of {path.stat().st_size} bytes failed: {stdout}")
    return {"bytes": size, "seconds": seconds}


def start_server(children: Children, size: int, workdir: Path) -> tuple[Child, dict[str, Any]]:
    server = children.start(
        "HTTPS server (sim)",
        [
            sys.executable,
            "-m",
            "aivedio.sim",
            "--ca-dir",
            str(workdir / "ca"),
            "--url-ttl-seconds",
            str(24 * 3600),
            "--generate",
            f"bench:0:{size}",
        ],
        stdout=workdir / "sim.json",
    )
    # It hashes the whole body before it answers: a minute or so per GiB on a busy machine.
    served = server.json_line(timeout=120 + 120 * size / GIB)
    output = served["outputs"][0]
    return server, {
        "port": served["port"],
        "ca_file": served["ca_file"],
        "url": output["url"],
        "sha256": output["sha256"],
        "size": output["size"],
    }


TUNING: list[str] = []  # part size and parts in flight, from the command line


def guarded(
    children: Children, server: dict[str, Any], storage_url: str, endpoint: str | None, key: str
) -> dict[str, Any]:
    argv = [
        sys.executable,
        str(HERE / "fetch_worker.py"),
        *TUNING,
        "--url",
        server["url"],
        "--port",
        str(server["port"]),
        "--ca-file",
        server["ca_file"],
        "--storage-url",
        storage_url,
        "--key",
        key,
    ]
    if endpoint:
        argv += ["--s3-endpoint", endpoint]
    figures: dict[str, Any] = children.run_json("guarded fetch", argv)
    if figures["sha256"] != server["sha256"]:
        raise SystemExit("guarded fetch produced a wrong checksum")
    return figures


def curl_tee_sha(children: Children, server: dict[str, Any], path: Path) -> dict[str, Any]:
    script = (
        f"set -o pipefail; curl -sS --fail --cacert {server['ca_file']} '{server['url']}'"
        f" | tee {path} | sha256sum"
    )
    if shutil.which("curl") is None:
        raise SystemExit("fetch: the (a') baseline needs curl (apt-get install curl)")
    started = time.perf_counter()
    stdout = children.run("curl | tee | sha256sum", ["bash", "-c", script])
    seconds = time.perf_counter() - started
    digest = stdout.split()[0]
    if digest != server["sha256"]:
        raise SystemExit("curl baseline produced a wrong checksum")
    return {"bytes": path.stat().st_size, "seconds": seconds}


def boto3_upload(
    children: Children, server: dict[str, Any], endpoint: str, key: str, *flags: str
) -> dict[str, Any]:
    figures: dict[str, Any] = children.run_json(
        "boto3 upload_fileobj",
        [
            sys.executable,
            str(HERE / "boto3_upload.py"),
            "--url",
            server["url"],
            "--ca-file",
            server["ca_file"],
            "--endpoint",
            endpoint,
            "--bucket",
            BUCKET,
            "--key",
            key,
            *flags,
        ],
    )
    return figures


def delete(endpoint: str, key: str) -> None:
    s3_client(endpoint).delete_object(Bucket=BUCKET, Key=key)


def mbps(figures: dict[str, Any]) -> float:
    return float(figures["bytes"]) / MIB / float(figures["seconds"])


def machine() -> str:
    cpu = "unknown CPU"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    return f"{os.cpu_count()} cores ({cpu}), Python {platform.python_version()}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-gib", type=float, nargs="+", default=[1.0, 4.0])
    parser.add_argument("--workdir", help="scratch directory (default: a temp dir)")
    parser.add_argument(
        "--skip-s3-above-gib", type=float, default=99.0, help="run the S3 pair only up to this size"
    )
    parser.add_argument("--part-size-mib", type=int, default=8)
    parser.add_argument("--parts-in-flight", type=int, default=2)
    parser.add_argument(
        "--part-checksum",
        choices=["sha256", "crc32"],
        default="sha256",
        help="(b)'s [storage] s3_part_checksum: the checksum each S3 part carries",
    )
    parser.add_argument(
        "--engines",
        nargs="+",
        choices=["SeaweedFS", "moto"],
        default=["SeaweedFS", "moto"],
        help="S3 engines to run (b), (b') and (b'') on",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="S3 rounds per engine and size, each after a warm-up, in rotated order (3)",
    )
    parser.add_argument(
        "--smoke", action="store_true", help="one 8 MiB body in 5 MiB parts; sanity, not speed"
    )
    args = parser.parse_args()
    if args.smoke:
        args.sizes_gib, args.part_size_mib = [8 * MIB / GIB], 5  # 5 MiB: S3's smallest part
        args.rounds = 1  # a smoke checks the paths, not their order
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    TUNING.extend(
        [
            "--part-size-bytes",
            str(args.part_size_mib * MIB),
            "--parts-in-flight",
            str(args.parts_in_flight),
            "--part-checksum",
            args.part_checksum,
        ]
    )
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="aivedio-fetch-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    try:
        with Children(workdir / "logs") as children:
            engine, seaweedfs = start_seaweedfs(children, workdir)
            engines = {"SeaweedFS": engine.endpoint}
            if "moto" in args.engines:
                engines["moto"] = start_moto(children)
            if "SeaweedFS" not in args.engines:
                del engines["SeaweedFS"]
            for size_gib in args.sizes_gib:
                rows.append(one_size(children, args, workdir, engines, engine, size_gib))
            # Its data directory is thrown away: SIGKILL, not the graceful stop (about 15 s
            # of every run, the smoke's in scripts/test included).
            seaweedfs.stop(signum=signal.SIGKILL)
    finally:
        if not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    print(report(rows))
    print(json.dumps(rows))
    if args.smoke:
        return verdict("fetch", sanity(rows, [int(s * GIB) for s in args.sizes_gib]))
    return 0


def one_size(
    children: Children,
    args: argparse.Namespace,
    workdir: Path,
    engines: dict[str, str],
    seaweedfs: Engine,
    size_gib: float,
) -> dict[str, Any]:
    size, name = int(size_gib * GIB), size_label(size_gib)
    log(f"{name}: starting the HTTPS server (hashing the body once)")
    sim, server = start_server(children, size, workdir)
    try:
        store_dir = workdir / f"store-{size_gib:g}"
        log(f"{name}: (a) guarded fetch into the local store")
        a = guarded(children, server, f"file://{store_dir}", None, "quarantine/bench/source.bin")
        shutil.rmtree(store_dir)
        log(f"{name}: (a') curl | tee | sha256sum")
        body = workdir / "curl.bin"
        a_prime = curl_tee_sha(children, server, body)
        row: dict[str, Any] = {"size_gib": size_gib, "a": a, "a_prime": a_prime, "s3": {}}
        if size_gib <= args.skip_s3_above_gib:
            for engine, endpoint in engines.items():
                row["s3"][engine] = s3_paths(children, args, server, engine, endpoint, size_gib)
            log(f"{name}: (c) weed upload of the same bytes from a file (SeaweedFS's ceiling)")
            row["c"] = weed_upload(children, seaweedfs, body)
        body.unlink()
        log(f"{name} done: {json.dumps(row)}")  # kept if a later size fails
        return row
    finally:
        sim.stop(10)


def s3_paths(
    children: Children,
    args: argparse.Namespace,
    server: dict[str, Any],
    engine: str,
    endpoint: str,
    size_gib: float,
) -> dict[str, Any]:
    """(b), (b') and (b'') into one engine, each object deleted once measured."""
    name, base = size_label(size_gib), f"bench/{size_gib:g}"
    runs: dict[str, list[dict[str, Any]]] = {path: [] for path in S3_PATHS}
    for round_ in range(args.rounds):
        if not args.smoke:
            # moto keeps objects in its own memory, SeaweedFS grows its volumes: an upload
            # right after a large one pays page faults, heap or volume growth (the path
            # first after a single warm-up ran 5 s slower than in its other round at 4 GiB).
            # Every round starts with a discarded upload, so each path takes that slot once.
            log(f"{name}: warming {engine} up with a discarded upload, round {round_ + 1}")
            boto3_upload(children, server, endpoint, f"{base}/warmup-{round_}.bin")
            delete(endpoint, f"{base}/warmup-{round_}.bin")
        # Rotate the order ((b), (b'), (b'') then (b'), (b''), (b), ...): over three rounds
        # each path runs once in each place, after the warm-up, between the others and
        # last, while the page cache writes back what the previous one stored.
        order = S3_PATHS[round_ % 3 :] + S3_PATHS[: round_ % 3]
        for path in order:
            key = f"{base}/{path}-{round_}.bin"
            log(f"{name}: {S3_LABELS[path]} into {engine}, round {round_ + 1}/{args.rounds}")
            os.sync()  # the previous path's writes on disk, not still being written back
            if path == "b":
                figures = guarded(children, server, f"s3://{BUCKET}", endpoint, key)
            else:
                flags = ("--sha256",) if path == "b_sha" else ()
                figures = boto3_upload(children, server, endpoint, key, *flags)
            delete(endpoint, key)
            runs[path].append(figures)
    return {path: combined(figures) for path, figures in runs.items()}


S3_PATHS = ("b", "b_prime", "b_sha")
S3_LABELS = {
    "b": "(b) guarded fetch",
    "b_prime": "(b') boto3 upload_fileobj",
    "b_sha": "(b'') boto3 upload_fileobj with SHA-256 checksums",
}


def combined(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One path's rounds as one figure: the mean time, streaming time and CPU, the largest
    peak RSS; each round's own figures kept under ``rounds``."""
    out = dict(runs[0])
    for field in ("seconds", "stream_seconds", "cpu_seconds"):
        if all(field in f for f in runs):
            out[field] = sum(float(f[field]) for f in runs) / len(runs)
    if all("peak_rss_bytes" in f for f in runs):
        out["peak_rss_bytes"] = max(f["peak_rss_bytes"] for f in runs)
    if any(f["bytes"] != out["bytes"] for f in runs):
        out["bytes"] = -1  # sanity() fails it
    out["rounds"] = runs
    return out


def size_label(size_gib: float) -> str:
    return f"{size_gib:g} GiB" if size_gib >= 1 else f"{size_gib * 1024:g} MiB"


def sanity(rows: list[dict[str, Any]], sizes: list[int]) -> list[str]:
    """Every path moved every byte of every size on every engine (the checksums were checked
    as it ran), in a positive time, and the fetching processes reported their peak RSS."""
    problems = []
    for row, size in zip(rows, sizes, strict=True):
        label = size_label(row["size_gib"])
        paths = {"a": row.get("a"), "a_prime": row.get("a_prime"), "c": row.get("c")}
        for engine in ("SeaweedFS", "moto"):
            for path in ("b", "b_prime", "b_sha"):
                paths[f"{path} on {engine}"] = row["s3"].get(engine, {}).get(path)
        for path, f in paths.items():
            if f is None:
                problems.append(f"{label}: no ({path}) figures")
            elif f["bytes"] != size or not positive(f["seconds"]):
                problems.append(f"{label} ({path}): {f}")
            elif path not in ("a_prime", "c") and not positive(f["peak_rss_bytes"]):
                problems.append(f"{label} ({path}): no peak RSS: {f}")
    if len(rows) != len(sizes):
        problems.append(f"{len(rows)} sizes measured of {len(sizes)}")
    return problems


def report(rows: list[dict[str, Any]]) -> str:
    out = [
        "| body | path | MiB/s | ratio | peak RSS of the fetching process |",
        "|---|---|---:|---:|---:|",
    ]
    for r in rows:
        size = size_label(r["size_gib"])
        a, ap = r["a"], r["a_prime"]
        out.append(
            f"| {size} | (a) guarded fetch → local store | {mbps(a):,.0f} | "
            f"{mbps(a) / mbps(ap):.2f}x (a') | {a['peak_rss_bytes'] / MIB:,.0f} MiB |"
        )
        out.append(f"| {size} | (a') curl \\| tee \\| sha256sum | {mbps(ap):,.0f} | | |")
        for engine, f in r["s3"].items():
            b, bp, bs = f["b"], f["b_prime"], f["b_sha"]
            out += [
                f"| {size} | (b) guarded fetch → {engine} | {mbps(b):,.0f} | "
                f"{mbps(b) / mbps(bp):.2f}x (b') | {b['peak_rss_bytes'] / MIB:,.0f} MiB |",
                f"| {size} | (b') boto3 upload_fileobj → {engine} | {mbps(bp):,.0f} | | "
                f"{bp['peak_rss_bytes'] / MIB:,.0f} MiB |",
                f"| {size} | (b'') boto3 upload_fileobj, SHA-256 → {engine} | {mbps(bs):,.0f} | "
                f"(b) is {mbps(b) / mbps(bs):.2f}x | {bs['peak_rss_bytes'] / MIB:,.0f} MiB |",
            ]
        if "c" in r:
            ceiling = mbps(r["s3"]["SeaweedFS"]["b"]) / mbps(r["c"])
            out.append(
                f"| {size} | (c) weed upload of the file → SeaweedFS (its ceiling) | "
                f"{mbps(r['c']):,.0f} | (b) is {ceiling:.2f}x | |"
            )
    s3_rows = [r for r in rows if r["s3"]]
    if s3_rows:
        out += [
            "",
            "S3 paths by phase: streaming (until every part is sent) and completing (the store",
            "assembling the parts), with the CPU of the uploading process.",
            "",
            "| body | engine | path | streaming | completing | CPU |",
            "|---|---|---|---:|---:|---:|",
        ]
        for r in s3_rows:
            for engine, paths in r["s3"].items():
                for name, label in (("b", "(b)"), ("b_prime", "(b')"), ("b_sha", "(b'')")):
                    f = paths[name]
                    out.append(
                        f"| {size_label(r['size_gib'])} | {engine} | {label} | "
                        f"{f['stream_seconds']:.2f} s | {f['seconds'] - f['stream_seconds']:.2f} s"
                        f" | {f['cpu_seconds']:.2f} s |"
                    )
    out.append("")
    out.append(f"Machine: {machine()}.")
    return "\n".join(out)


if __name__ == "__main__":
    raise SystemExit(main())
