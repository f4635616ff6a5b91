"""Resumable uploads: one file through tus into each store, against a plain ``curl -T`` PUT
of the same file to the same engine, in one run (issue 27).

1. PostgreSQL: a throwaway database on ``--server-dsn``; SeaweedFS (``scripts/lib/
   seaweedfs.py``) under ``var/bench-uploads/seaweedfs``; a file of ``--size-mib`` random
   bytes (1024) under ``var/bench-uploads``, its SHA-256 computed once.
2. Per store (``s3``: SeaweedFS, ``local``: ``var/bench-uploads/objects``), an ``aivedio
   api`` process of its own with the defaults (8 MiB tus parts on S3), then:

   * **baseline**: ``curl -T FILE`` with ``Expect:`` off. S3: to a presigned PUT URL of
     SeaweedFS (the engine itself, no API in between). Local: to a trivial loopback sink,
     this script's ``--sink`` mode (aiohttp): it streams the body into a file under the same
     directory as the local store and fsyncs it, the work a local upload must do at least.
   * **tus**: ``curl`` as the tus client: a creation ``POST /v1/uploads``, then one ``PATCH``
     of the whole file (``curl -X PATCH -T FILE``), timed until its 204, which comes after
     the upload is complete (parts assembled or the append file published, the asset and
     its probe job recorded). The asset's ``source_sha256`` must be the file's.

   MiB/s is size / wall time of the transfer. The API's memory: its RSS (``/proc/PID/
   status`` ``VmRSS``) sampled every 50 ms during the transfer; "peak" is the highest
   sample, "growth" the peak less the RSS just before. CPU: the user + system time of the
   receiving process during the transfer (``/proc/PID/stat``): the sink or SeaweedFS for the
   baseline, the API for tus; unlike MiB/s, it does not move with the load of a shared
   machine. The targets: tus at least 0.8x the
   baseline, and the growth flat (bounded by the part buffers, not the file's size).

Result: a table on stdout and ``var/bench-uploads/result.json``.

Usage: .venv/bin/python scripts/bench/uploads.py [--server-dsn DSN] [--size-mib 1024]
         [--smoke]

``--smoke``: a 16 MiB file; every transfer must finish, with the right digest, and every
figure must be a positive number. Only loopback addresses are contacted.
"""

from __future__ import annotations

import sys

if sys.path and sys.path[0] and __file__.startswith(sys.path[0]):
    sys.path.pop(0)  # scripts/bench/queue.py would shadow the standard library's queue

import argparse
import asyncio
import base64
import hashlib
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import threading
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import boto3

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE.parent / "lib"))
from children import Children, environ_without_aivedio  # noqa: E402
from seaweedfs import ACCESS_KEY_ID, SECRET_ACCESS_KEY, Engine  # noqa: E402
from smoke import positive, verdict  # noqa: E402

AIVEDIO = [sys.executable, "-m", "aivedio"]
BUCKET = "aivedio-bench"
TENANT = "bench"
MIB = 1 << 20
SAMPLE_SECONDS = 0.05
TARGET_RATIO = 0.8


def log(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


class RssSampler:
    """The RSS of ``pid`` every 50 ms while running: before, and the peak."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.before = rss_bytes(pid)
        self.peak = self.before
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_SECONDS):
            self.peak = max(self.peak, rss_bytes(self.pid))

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_bytes(self.pid))


def curl(*args: str) -> tuple[float, str]:
    """Run curl; (seconds, stdout). Any failure ends the run."""
    started = time.perf_counter()
    done = subprocess.run(
        ["curl", "-sS", "-f", "-H", "Expect:", *args], capture_output=True, text=True, check=False
    )
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"curl {' '.join(args[:3])}… failed: {done.stderr.strip()}")
    return seconds, done.stdout


def cpu_seconds(pid: int) -> float:
    """User + system CPU of ``pid`` so far (all its threads), from ``/proc/PID/stat``."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measured(pid: int, send: Any, *, rss: bool = True) -> dict[str, Any]:
    """Wall time of ``send()``, and the CPU (and, with ``rss``, memory) of the receiving
    process ``pid`` meanwhile."""
    cpu = cpu_seconds(pid)
    if not rss:
        seconds = send()
        return {"seconds": seconds, "cpu_seconds": cpu_seconds(pid) - cpu}
    with RssSampler(pid) as sampler:
        seconds = send()
    return {
        "seconds": seconds,
        "cpu_seconds": cpu_seconds(pid) - cpu,
        "rss_before": sampler.before,
        "rss_peak": sampler.peak,
    }


# -- the servers -------------------------------------------------------------------------------


def sink_main(port: int, directory: Path) -> None:
    """``--sink``: accept a PUT body into a file and fsync it; nothing else."""
    from aiohttp import web

    async def put(request: web.Request) -> web.Response:
        path = directory / f"sink-{uuid.uuid4().hex}.bin"
        with path.open("wb") as handle:
            async for chunk in request.content.iter_chunked(MIB):
                handle.write(chunk)
            handle.flush()
            os.fsync(handle.fileno())
        path.unlink()
        return web.Response(status=201)

    app = web.Application(client_max_size=1 << 40)
    app.router.add_put("/{name}", put)
    print(json.dumps({"port": port}), flush=True)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


def write_config(path: Path, *, dsn: str, port: int, storage: str, endpoint: str) -> None:
    s3 = (
        f"s3_endpoint_url = {json.dumps(endpoint)}\n"
        f"s3_access_key_id = {json.dumps(ACCESS_KEY_ID)}\n"
        f"s3_secret_access_key = {json.dumps(SECRET_ACCESS_KEY)}\n"
        if storage.startswith("s3://")
        else ""
    )
    path.write_text(
        f"""# Written by scripts/bench/uploads.py for one run.
[database]
url = {json.dumps(dsn)}

[storage]
url = {json.dumps(storage)}
{s3}
[api]
host = "127.0.0.1"
port = {port}
drain_delay_seconds = 0.0

[log]
format = "json"
"""
    )
    path.chmod(0o600)


def run_cli(env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [*AIVEDIO, *args], env=env, cwd=ROOT, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise SystemExit(f"aivedio {' '.join(args)} failed:\n{done.stderr}")
    return done.stdout


# -- the transfers -----------------------------------------------------------------------------


def tus_upload(base: str, key: str, path: Path) -> float:
    size = path.stat().st_size
    auth = ["-H", f"Authorization: Bearer {key}", "-H", "Tus-Resumable: 1.0.0"]
    _, headers = curl(
        "-D",
        "-",
        "-o",
        "/dev/null",
        "-X",
        "POST",
        *auth,
        "-H",
        f"Upload-Length: {size}",
        f"{base}/v1/uploads",
    )
    location = next(
        line.split(":", 1)[1].strip()
        for line in headers.splitlines()
        if line.lower().startswith("location:")
    )
    seconds, _ = curl(
        "-o",
        "/dev/null",
        "-X",
        "PATCH",
        "-T",
        str(path),
        *auth,
        "-H",
        "Upload-Offset: 0",
        "-H",
        "Content-Type: application/offset+octet-stream",
        location,
    )
    return seconds


async def one_store(
    kind: str,
    *,
    children: Children,
    env: dict[str, str],
    dsn: str,
    engine: Engine,
    engine_pid: int,
    path: Path,
    size: int,
    digest: str,
    work: Path,
) -> dict[str, Any]:
    port = free_port()
    config = work / f"aivedio-{kind}.toml"
    objects = work / "objects"
    storage = f"s3://{BUCKET}/{kind}" if kind == "s3" else f"file://{objects}"
    write_config(config, dsn=dsn, port=port, storage=storage, endpoint=engine.endpoint)
    run_env = {**env, "AIVEDIO_CONFIG": str(config)}
    key = json.loads(run_cli(run_env, "keys", "create", "--tenant", TENANT))["key"]
    api = children.start(f"API ({kind})", [*AIVEDIO, "api"], log=f"api-{kind}.log", env=run_env)
    api.wait_for_event("api_listening")
    base = f"http://127.0.0.1:{port}"
    row: dict[str, Any] = {"store": kind}
    if kind == "s3":
        client = boto3.client(
            "s3",
            endpoint_url=engine.endpoint,
            region_name="us-east-1",
            aws_access_key_id=ACCESS_KEY_ID,
            aws_secret_access_key=SECRET_ACCESS_KEY,
        )
        url = client.generate_presigned_url(
            "put_object", Params={"Bucket": BUCKET, "Key": "baseline.bin"}, ExpiresIn=3600
        )
        row["baseline"] = measured(
            engine_pid, lambda: curl("-o", "/dev/null", "-T", str(path), url)[0], rss=False
        )
        row["baseline_target"] = "SeaweedFS, presigned PUT"
    else:
        sink_port = free_port()
        sink = children.start(
            "sink",
            [sys.executable, __file__, "--sink", str(sink_port), str(objects)],
            log="sink.log",
            stdout=work / "sink.json",
            env=env,
        )
        sink.json_line(30)
        row["baseline"] = measured(
            sink.pid,
            lambda: curl("-o", "/dev/null", "-T", str(path), f"http://127.0.0.1:{sink_port}/x")[0],
            rss=False,
        )
        row["baseline_target"] = "loopback sink (aiohttp, file + fsync)"
        sink.stop()
    row["tus"] = measured(api.pid, lambda: tus_upload(base, key, path))
    conn = await asyncpg.connect(dsn)
    try:
        stored = await conn.fetchval(
            "SELECT source_sha256 FROM assets ORDER BY created_at DESC LIMIT 1"
        )
    finally:
        await conn.close()
    row["sha256_ok"] = stored == digest
    api.stop()
    for leg in ("baseline", "tus"):
        row[leg]["mib_per_s"] = size / MIB / row[leg]["seconds"]
    row["ratio"] = row["tus"]["mib_per_s"] / row["baseline"]["mib_per_s"]
    row["rss_growth"] = row["tus"]["rss_peak"] - row["tus"]["rss_before"]
    return row


def make_file(path: Path, size: int) -> str:
    digest = hashlib.sha256()
    if path.exists() and path.stat().st_size == size and path.with_suffix(".sha256").exists():
        return path.with_suffix(".sha256").read_text().strip()
    with path.open("wb") as handle:
        left = size
        while left:
            block = os.urandom(min(left, 8 * MIB))
            digest.update(block)
            handle.write(block)
            left -= len(block)
    path.with_suffix(".sha256").write_text(digest.hexdigest())
    return digest.hexdigest()


def dsn_for(server: str, name: str) -> str:
    return urlunsplit(urlsplit(server)._replace(path=f"/{name}"))


async def run(args: argparse.Namespace) -> dict[str, Any]:
    work = ROOT / "var" / ("bench-uploads-smoke" if args.smoke else "bench-uploads")
    work.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(work / "objects", ignore_errors=True)
    shutil.rmtree(work / "seaweedfs", ignore_errors=True)
    size = (16 if args.smoke else args.size_mib) * MIB
    path = work / f"file-{size // MIB}m.bin"
    log(f"making {size // MIB} MiB of random bytes in {path}")
    digest = make_file(path, size)
    database = f"aivedio_bench_uploads_{os.getpid()}"
    admin = await asyncpg.connect(args.server_dsn)
    await admin.execute(f"CREATE DATABASE {database}")
    await admin.close()
    dsn = dsn_for(args.server_dsn, database)
    env = environ_without_aivedio(
        AIVEDIO_URL_ENCRYPTION_KEY=base64.b64encode(os.urandom(32)).decode(),
        AIVEDIO_PLAYBACK_TOKEN_SECRET=base64.b64encode(os.urandom(32)).decode(),
        AIVEDIO_DATABASE_URL=dsn,
        AWS_EC2_METADATA_DISABLED="true",
        NO_PROXY="127.0.0.1,localhost",
    )
    try:
        with Children(work) as children:
            engine = Engine.create(work / "seaweedfs")
            server = children.start("SeaweedFS", engine.argv(), log="seaweedfs.log")
            server.wait_for(engine.answers, "an answer", 60)
            engine.ensure_bucket(BUCKET)
            run_cli(env, "migrate")
            run_cli(env, "tenants", "create", TENANT)
            rows = []
            for kind in ("s3", "local"):
                log(f"{kind}: curl -T, then tus")
                rows.append(
                    await one_store(
                        kind,
                        children=children,
                        env=env,
                        dsn=dsn,
                        engine=engine,
                        engine_pid=server.pid,
                        path=path,
                        size=size,
                        digest=digest,
                        work=work,
                    )
                )
            # Its data directory is thrown away: SIGKILL, not the graceful stop (about 15 s).
            server.stop(signum=signal.SIGKILL)
            children.stop()
    finally:
        admin = await asyncpg.connect(args.server_dsn)
        await admin.execute(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")
        await admin.close()
    result = {
        "size_bytes": size,
        "machine": f"{os.cpu_count()} cores, Python {platform.python_version()}",
        "utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "rows": rows,
    }
    (work / "result.json").write_text(json.dumps(result, indent=2))
    return result


def report(result: dict[str, Any]) -> str:
    lines = [
        f"{result['size_bytes'] // MIB} MiB, {result['machine']}, {result['utc']}",
        f"{'store':6} {'baseline MiB/s':>15} {'tus MiB/s':>10} {'ratio':>6} "
        f"{'RSS before':>11} {'RSS peak':>9} {'growth':>8} {'CPU base':>9} {'CPU API':>8}"
        "  baseline",
    ]
    for row in result["rows"]:
        tus = row["tus"]
        lines.append(
            f"{row['store']:6} {row['baseline']['mib_per_s']:15.1f} {tus['mib_per_s']:10.1f} "
            f"{row['ratio']:6.2f} {tus['rss_before'] / MIB:10.1f}M {tus['rss_peak'] / MIB:8.1f}M "
            f"{row['rss_growth'] / MIB:7.1f}M {row['baseline']['cpu_seconds']:8.2f}s "
            f"{tus['cpu_seconds']:7.2f}s  {row['baseline_target']}"
        )
    return "\n".join(lines)


def problems_of(result: dict[str, Any]) -> list[str]:
    problems = []
    for row in result["rows"]:
        if not row["sha256_ok"]:
            problems.append(f"{row['store']}: the asset's SHA-256 is not the file's")
        for figure in (row["baseline"]["mib_per_s"], row["tus"]["mib_per_s"], row["ratio"]):
            if not positive(figure):
                problems.append(f"{row['store']}: a figure is not a positive number: {figure}")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server-dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--sink", nargs=2, metavar=("PORT", "DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.sink:
        sink_main(int(args.sink[0]), Path(args.sink[1]))
        return 0
    result = asyncio.run(run(args))
    print(report(result), flush=True)
    problems = problems_of(result)
    if args.smoke:
        return verdict("uploads", problems)
    for row in result["rows"]:
        if row["ratio"] < TARGET_RATIO:
            log(f"{row['store']}: tus at {row['ratio']:.2f}x the baseline, under {TARGET_RATIO}x")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
