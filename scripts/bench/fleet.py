"""Fleet load: provider outputs through the API and two workers, end to end, on this machine.

Everything runs as separate processes, as in production, on a throwaway PostgreSQL cluster
started for the run (``initdb`` + ``pg_ctl`` under ``var/bench-fleet/pg``, Debian's binaries)
with ``pg_stat_statements`` preloaded (``track = top``, ``track_utility = on``, so BEGIN,
COMMIT, LISTEN… are counted too), so every statement the API and the workers send is counted
exactly. Each process connects as a role of its own (``fleet_api``, ``fleet_worker``, and
``fleet_observer`` for this script's own sampling), so the counts are split by process kind
and the benchmark's own queries are left out.

1. two clips made with ffmpeg once (``var/bench-fleet/media``): a 2 s 320x240 H.264/AAC MP4
   (faststart; the remux path) and a 2 s 320x240 HEVC/AAC MP4 (the transcode path);
2. the simulated provider (``python -m aivedio.sim``, HTTPS on loopback with its own test CA,
   as the demo) serving those bytes under ``--remux`` + ``--transcode`` task ids;
3. ``aivedio api`` and ``--workers`` ``aivedio worker`` processes on a config written to
   ``var/bench-fleet/aivedio.toml`` (local filesystem store under ``var/bench-fleet/objects``,
   ``[moderation] backend = "local"`` allow all, ``[net] allow_cidrs`` loopback, the
   provider's callback secret and tenant, a one-rung ladder: see ``MEDIA``);
4. once every process answers: ``pg_stat_statements_reset()`` and a CPU snapshot of each
   process, then one signed SUCCEEDED callback per task at ``--rate`` callbacks per second
   (steady; ``--rate 0``: one after another as fast as one client sends), transcode tasks
   spread evenly among the remux ones. The send time of each callback is its t0;
5. every second (``fleet_observer``): queued jobs and the oldest queued job's age per kind,
   assets per state, the CPU of each process (``/proc``);
6. done when every output's asset is in a final state (ENRICHED, or a failure) and no job is
   queued or running; then latencies from ``stage_events`` (the asset's first PLAYABLE or
   ENRICHED event), CPU (``/proc/PID/stat``: the process's own utime+stime vs ``cutime`` +
   ``cstime``, its waited-for children, i.e. ffmpeg/ffprobe), peak RSS (``VmHWM``), the
   statements by role, and a JSON result in ``var/bench-fleet/result-*.json``.

Usage: .venv/bin/python scripts/bench/fleet.py [--remux 1000] [--transcode 100] [--rate 10]
       [--pin [--pin-workers 1,2] [--cores-per-node 1]] [--smoke]

``--pin`` (issue 25): nodes simulated on this machine (``_nodes.py``): the same load once per
count of ``--pin-workers``, each run on a cluster and in a directory of its own
(``var/bench-fleet/pinned-Nw``), worker N under ``taskset -c`` on CPUs of its own (every
ffmpeg it starts inherits them; checked from ``/proc`` every 0.5 s); the API, the provider,
PostgreSQL and this script are not pinned. The runs end with their throughputs side by side:
assets with every output made (ENRICHED) per minute, first callback to last ENRICHED, the
workers' cores busy, what else kept the machine busy (``/proc/stat`` less the fleet's
processes and cluster: this script and any other work on the host, which takes its share of
the pinned CPUs too), and the target of 1.7x for 2 workers against 1.

Every process is a watched child (``scripts/lib/children.py``): one that exits by itself
fails the run at once with the end of its log (``var/bench-fleet/*.log``). ``--smoke``: 3
remux and 1 transcode outputs back to back, 1 s idle, under ``var/bench-fleet-smoke``
(``-pin``, with 1 and 2 pinned workers); the result must show every asset ENRICHED, no
callback refused, no dead job, and every figure measured (pinned: no process off its node).

Only loopback addresses are contacted. Needs root or the postgres user's binaries to run a
cluster (as root the cluster runs as ``postgres`` via ``runuser``).
"""

from __future__ import annotations

import sys

if sys.path and sys.path[0] and __file__.startswith(sys.path[0]):
    sys.path.pop(0)

import argparse
import asyncio
import base64
import contextlib
import importlib.util
import json
import os
import platform
import shutil
import statistics
import subprocess
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts" / "lib"))
from children import Child, Children  # noqa: E402
from demo_driver import free_port, http, send_callback  # noqa: E402
from smoke import positive, verdict  # noqa: E402


def _sibling(name: str) -> Any:
    """A module of scripts/bench by its path (that directory is off sys.path: see above)."""
    if f"bench_{name}" in sys.modules:
        return sys.modules[f"bench_{name}"]
    spec = importlib.util.spec_from_file_location(
        f"bench_{name}", ROOT / "scripts/bench" / f"{name}.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


nodes = _sibling("_nodes")  # --pin: each worker on CPUs of its own (taskset)

BENCH = ROOT / "var" / "bench-fleet"
MEDIA_DIR = BENCH / "media"
PG_DIR = BENCH / "pg"
AIVEDIO = [sys.executable, "-m", "aivedio"]  # the package as installed or on PYTHONPATH
DATABASE = "aivedio_bench_fleet"
TENANT = "fleet"
ROLES = ("fleet_api", "fleet_worker", "fleet_observer")
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")
ASSET_FINAL = ("ENRICHED", "INVALID_MEDIA", "PROCESSING_FAILED", "REJECTED", "DELETED")
OUTPUT_FAILED = ("INVALID_RESPONSE", "OUTPUT_LOST")

LAVFI = ["-f", "lavfi", "-i"]
CLIPS = {
    "remux": (
        "clip-h264.mp4",
        [
            *LAVFI,
            "testsrc2=size=320x240:rate=24:duration=2",
            *LAVFI,
            "sine=frequency=440:duration=2",
            "-c:v",
            "libx264",
            "-preset",
            "veryfast",
            "-g",
            "48",
            "-pix_fmt",
            "yuv420p",
            "-c:a",
            "aac",
            "-b:a",
            "96k",
            "-shortest",
            "-movflags",
            "+faststart",
        ],
    ),
    "transcode": (
        "clip-hevc.mp4",
        [
            *LAVFI,
            "testsrc2=size=320x240:rate=24:duration=2",
            *LAVFI,
            "sine=frequency=660:duration=2",
            "-c:v",
            "libx265",
            "-preset",
            "ultrafast",
            "-x265-params",
            "log-level=error",
            "-tag:v",
            "hvc1",
            "-pix_fmt",
            "yuv420p",
            "-c:a",
            "aac",
            "-b:a",
            "96k",
            "-shortest",
            "-movflags",
            "+faststart",
        ],
    ),
}

# The media settings of the run: the defaults except a single 240p rung (the sources are
# 320x240, so the default ladder would give the same single rung: it never upscales; written
# out so the run does not depend on that).
MEDIA = """[media]
[[media.ladder]]
height = 240
crf = 25
maxrate_kbps = 800
bufsize_kbps = 1600
"""


def out(line: str = "") -> None:
    print(line, flush=True)


# -- the cluster -------------------------------------------------------------------------------


def pg_bindir() -> Path:
    for d in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
        if (d / "initdb").exists() and (d / "pg_ctl").exists():
            return d
    raise SystemExit("no PostgreSQL binaries under /usr/lib/postgresql/*/bin")


def as_postgres(argv: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *argv] if os.getuid() == 0 else argv


class Cluster:
    """A throwaway cluster with pg_stat_statements preloaded, stopped (and removed) at exit."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.bindir = pg_bindir()
        self.data = PG_DIR / "data"
        self.started = False

    def start(self) -> None:
        shutil.rmtree(PG_DIR, ignore_errors=True)
        PG_DIR.mkdir(parents=True)
        if os.getuid() == 0:
            shutil.chown(PG_DIR, "postgres", "postgres")
        subprocess.run(
            as_postgres(
                [
                    str(self.bindir / "initdb"),
                    "-D",
                    str(self.data),
                    "-U",
                    "postgres",
                    "--auth=trust",
                    "-E",
                    "UTF8",
                    "--no-sync",
                ]
            ),
            check=True,
            capture_output=True,
        )
        conf = f"""
port = {self.port}
listen_addresses = '127.0.0.1'
unix_socket_directories = '{PG_DIR}'
max_connections = 200
shared_preload_libraries = 'pg_stat_statements'
pg_stat_statements.track = top
pg_stat_statements.track_utility = on
pg_stat_statements.max = 10000
"""
        with open(self.data / "postgresql.conf", "a") as handle:
            handle.write(conf)
        subprocess.run(
            as_postgres(
                [
                    str(self.bindir / "pg_ctl"),
                    "-D",
                    str(self.data),
                    "-l",
                    str(PG_DIR / "server.log"),
                    "-w",
                    "start",
                ]
            ),
            check=True,
            capture_output=True,
        )
        self.started = True

    def stop(self) -> None:
        if self.started:
            subprocess.run(
                as_postgres(
                    [str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop"]
                ),
                check=False,
                capture_output=True,
            )
            self.started = False

    def dsn(self, user: str = "postgres", database: str = DATABASE) -> str:
        return f"postgresql://{user}@127.0.0.1:{self.port}/{database}"

    def postmaster_pid(self) -> int:
        return int((self.data / "postmaster.pid").read_text().split()[0])


# -- /proc ---------------------------------------------------------------------------------------


def proc_cpu(pid: int) -> dict[str, float]:
    """utime+stime of the process itself and cutime+cstime of its waited-for children, s."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    # fields[0] is the state (field 3); utime is field 14.
    utime, stime, cutime, cstime = (int(x) / CLK_TCK for x in fields[11:15])
    return {"own": utime + stime, "children": cutime + cstime, "user": utime, "sys": stime}


def proc_mem(pid: int) -> dict[str, int]:
    values = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmHWM", "VmRSS"):
            values[key] = int(rest.split()[0]) * 1024
    return values


def children_of(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat[stat.rindex(")") + 2 :].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def byte_transfer_cpu(ports: list[int]) -> dict[str, dict[str, float]]:
    """Each worker's ``aivedio_byte_transfer_cpu_seconds_total`` by kind, from its /metrics."""
    found: dict[str, dict[str, float]] = {}
    for n, port in enumerate(ports, 1):
        text = http("GET", f"http://127.0.0.1:{port}/metrics").body.decode()
        kinds: dict[str, float] = {}
        for line in text.splitlines():
            if line.startswith("aivedio_byte_transfer_cpu_seconds_total{"):
                labels, value = line.rsplit(" ", 1)
                kinds[labels.split('kind="', 1)[1].split('"', 1)[0]] = float(value)
        found[f"worker-{n}"] = kinds
    return found


def cluster_cpu(postmaster: int) -> float:
    """The whole cluster's CPU: the postmaster with its reaped backends, plus live ones."""
    total = sum(proc_cpu(postmaster)[k] for k in ("own", "children"))
    for pid in children_of(postmaster):
        with contextlib.suppress(OSError):
            total += proc_cpu(pid)["own"]
    return total


def machine_cpu() -> float:
    """Busy CPU seconds of the whole machine since boot (/proc/stat: user, nice, system, irq,
    softirq; not idle, iowait or steal)."""
    user, nice, system, _idle, _iowait, irq, softirq = (
        int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:8]
    )
    return (user + nice + system + irq + softirq) / CLK_TCK


# -- set-up ------------------------------------------------------------------------------------


def make_clips() -> dict[str, Path]:
    MEDIA_DIR.mkdir(parents=True, exist_ok=True)
    paths = {}
    for kind, (name, recipe) in CLIPS.items():
        path = MEDIA_DIR / name
        marker = path.with_name(name + ".recipe")
        if not (path.is_file() and marker.is_file() and marker.read_text() == json.dumps(recipe)):
            subprocess.run(
                ["ffmpeg", "-nostdin", "-v", "error", "-y", *recipe, str(path)], check=True
            )
            marker.write_text(json.dumps(recipe))
        paths[kind] = path
    return paths


def write_config(
    path: Path,
    *,
    dsn: str,
    api_port: int,
    sim: dict[str, Any],
    callback_secret: str,
    media_slots: int,
) -> None:
    text = f"""# Written by scripts/bench/fleet.py for one run.
[database]
url = {json.dumps(dsn)}

[storage]
url = {json.dumps("file://" + str(BENCH / "objects"))}

[api]
host = "127.0.0.1"
port = {api_port}
drain_delay_seconds = 0.0  # no balancer to wait for here: stop at once

# Every callback comes from one loopback address: at --rate 0 a large run would meet the
# per-(provider, address) bucket, which measures the limiter, not the fleet.
[api.rate_limits]
enabled = false

[worker]
http_port = 0
# Every lane written out: a [worker.lanes] table replaces the default one, and a lane it
# does not name is not run. fetch and control keep their defaults (16, 8).
[worker.lanes.fetch]
slots = 16
[worker.lanes.media]
slots = {media_slots}
[worker.lanes.control]
slots = 8

[log]
format = "json"

[net]
allowed_ports = [{sim["port"]}]
allow_cidrs = ["127.0.0.0/8"]
ca_file = {json.dumps(sim["ca_file"])}

[providers.sim]
api_base_url = {json.dumps(sim["base_url"])}
callback_secret = {json.dumps(callback_secret)}
tenant = "{TENANT}"

[moderation]
backend = "local"
[moderation.local]
allow_all = true

{MEDIA}"""
    path.write_text(text)
    path.chmod(0o600)


def run_cli(env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [*AIVEDIO, *args], env=env, cwd=ROOT, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise SystemExit(f"aivedio {' '.join(args)} failed:\n{done.stderr}")
    return done.stdout


def role_env(env: dict[str, str], cluster: Cluster, role: str) -> dict[str, str]:
    return {**env, "AIVEDIO_DATABASE_URL": cluster.dsn(role)}


# -- the run -----------------------------------------------------------------------------------


SAMPLE_SQL = """
SELECT
  (SELECT coalesce(json_object_agg(kind, json_build_object('queued', n, 'oldest_s', age)), '{}')
     FROM (SELECT kind, count(*) AS n,
                  extract(epoch FROM clock_timestamp() - min(created_at)) AS age
             FROM jobs WHERE status = 'queued' GROUP BY kind) q) AS queued,
  (SELECT count(*) FROM jobs WHERE status = 'running') AS running,
  (SELECT coalesce(json_object_agg(status, n), '{}')
     FROM (SELECT status, count(*) AS n FROM assets GROUP BY status) a) AS assets,
  (SELECT count(*) FROM provider_outputs WHERE fetch_status = ANY($1::text[])) AS failed
"""


async def sampler(
    obs: asyncpg.Connection,
    pids: dict[str, int],
    postmaster: int,
    t_start: float,
    samples: list[dict[str, Any]],
    total: int,
    done: asyncio.Event,
    limit_s: float,
) -> None:
    idle = 0
    while True:
        row = await obs.fetchrow(SAMPLE_SQL, list(OUTPUT_FAILED))
        now = time.time()
        queued = json.loads(row["queued"])
        assets = json.loads(row["assets"])
        cpu = {}
        for name, pid in pids.items():
            try:
                cpu[name] = proc_cpu(pid)
            except OSError:
                cpu[name] = {}
        sample = {
            "t": round(now - t_start, 3),
            "queued": queued,
            "queued_total": sum(v["queued"] for v in queued.values()),
            "oldest_queued_s": max((v["oldest_s"] for v in queued.values()), default=0.0),
            "running": row["running"],
            "assets": assets,
            "published": assets.get("PLAYABLE", 0) + assets.get("ENRICHED", 0),
            "cpu": cpu,
            "postgres_cpu": cluster_cpu(postmaster),
        }
        samples.append(sample)
        settled = sum(assets.get(s, 0) for s in ASSET_FINAL) + row["failed"]
        if settled >= total and not sample["queued_total"] and not row["running"]:
            idle += 1
            if idle >= 2:
                done.set()
                return
        else:
            idle = 0
        if now - t_start > limit_s:
            done.set()
            return
        await asyncio.sleep(1.0)


def send_all(
    base: str,
    secret: str,
    tasks: list[tuple[str, str]],
    outputs: dict[str, Any],
    rate: float,
    sent: dict[str, float],
    errors: list[str],
) -> None:
    """Runs in a thread: one callback per task at ``rate`` per second (0: back to back)."""
    start = time.monotonic()
    for i, (task_id, _kind) in enumerate(tasks):
        if STOP_SENDING.is_set():
            return
        if rate > 0:
            delay = start + i / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        t0 = time.time()
        reply = send_callback(base, secret, task_id, outputs[task_id])
        sent[task_id] = t0
        if reply.status != 202:
            errors.append(f"{task_id}: {reply.detail()}")


STOP_SENDING = threading.Event()  # set when the run is interrupted
RESET_PARTS = ("SELECT pg_advisory_unlock_all()", "CLOSE ALL", "UNLISTEN *", "RESET ALL")


def round_trips(statements: list[dict[str, Any]]) -> int:
    """Statements, less those sent in the same simple query as another: asyncpg's pool reset
    (unlock, CLOSE ALL, UNLISTEN *, RESET ALL: one round trip, counted once here) and a fenced
    transaction's ``BEGIN; SELECT aivedio_hold_lease(…)`` (store/queue.py ``fenced``: one round
    trip, counted as its BEGIN)."""
    total = sum(s["calls"] for s in statements)
    resets = sum(s["calls"] for s in statements if s["query"].strip() == "RESET ALL")
    fenced = sum(s["calls"] for s in statements if "aivedio_hold_lease(" in s["query"])
    return total - 3 * resets - fenced


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def summarise(values: list[float]) -> dict[str, float]:
    return {
        "n": len(values),
        "p50": pct(values, 0.5),
        "p95": pct(values, 0.95),
        "p99": pct(values, 0.99),
        "max": max(values, default=float("nan")),
        "mean": statistics.fmean(values) if values else float("nan"),
    }


LATENCY_SQL = """
SELECT o.provider_task_id, o.fetch_status, a.id AS asset_id, a.status, a.source_size_bytes,
       (SELECT min(e.at) FROM stage_events e
         WHERE e.entity = 'asset' AND e.asset_id = a.id
           AND e.state IN ('PLAYABLE', 'ENRICHED')) AS playable_at,
       (SELECT min(e.at) FROM stage_events e
         WHERE e.entity = 'asset' AND e.asset_id = a.id AND e.state = 'ENRICHED') AS enriched_at,
       (SELECT min(e.at) FROM stage_events e
         WHERE e.entity = 'provider_output' AND e.provider_output_id = o.id
           AND e.state = 'FETCHING') AS fetching_at,
       gt.created_at AS accepted_at
  FROM provider_outputs o
  JOIN generation_tasks gt ON gt.id = o.generation_task_id
  LEFT JOIN assets a ON a.source_provider_output_id = o.id
"""

STATEMENTS_SQL = """
SELECT r.rolname AS role, s.query, s.calls, s.total_exec_time, s.rows
  FROM pg_stat_statements s JOIN pg_roles r ON r.oid = s.userid
  JOIN pg_database d ON d.oid = s.dbid
 WHERE d.datname = $1 AND r.rolname = ANY($2::text[])
 ORDER BY s.calls DESC
"""


async def run(args: argparse.Namespace, cluster: Cluster) -> dict[str, Any]:
    # Entered inside the event loop: a child that dies cancels this task (see children.py).
    with Children(BENCH) as children:
        try:
            return await bench(args, cluster, children)
        finally:
            STOP_SENDING.set()
            stop_all(children)


async def bench(args: argparse.Namespace, cluster: Cluster, children: Children) -> dict[str, Any]:
    clips = make_clips()
    admin = await asyncpg.connect(cluster.dsn(database="postgres"))
    await admin.execute(f"CREATE DATABASE {DATABASE}")
    for role in ROLES:
        await admin.execute(f"CREATE ROLE {role} SUPERUSER LOGIN")
    await admin.close()
    conn = await asyncpg.connect(cluster.dsn())
    await conn.execute("CREATE EXTENSION pg_stat_statements")
    await conn.close()

    env = {k: v for k, v in os.environ.items() if not k.startswith("AIVEDIO_")}
    env["AIVEDIO_CONFIG"] = str(BENCH / "aivedio.toml")
    env["AIVEDIO_URL_ENCRYPTION_KEY"] = base64.b64encode(os.urandom(32)).decode()
    env["AIVEDIO_PLAYBACK_TOKEN_SECRET"] = base64.b64encode(os.urandom(32)).decode()
    env["AWS_EC2_METADATA_DISABLED"] = "true"
    callback_secret = base64.b64encode(os.urandom(32)).decode()
    shutil.rmtree(BENCH / "objects", ignore_errors=True)
    for log in BENCH.glob("*.log"):
        log.unlink()

    run = time.strftime("%H%M%S")
    kinds = [
        "transcode"
        if args.transcode and (i * args.transcode) % (args.remux + args.transcode) < args.transcode
        else "remux"
        for i in range(args.remux + args.transcode)
    ]
    tasks = [(f"{kind}-{run}-{i:05d}", kind) for i, kind in enumerate(kinds)]
    kind_of = dict(tasks)
    specs = BENCH / "sim-args.txt"
    sim_argv = [sys.executable, "-m", "aivedio.sim", "--ca-dir", str(BENCH / "ca")]
    if args.plain:
        sim_argv.append("--plain")
    sim_argv += [f"--file={t}:0:{clips[k]}" for t, k in tasks]
    specs.write_text("\n".join(sim_argv))
    sim = children.start(
        "provider (sim)", sim_argv, log="sim.log", env=env, stdout=BENCH / "sim.json"
    )

    def line() -> str | None:  # the whole line: with 1,100 outputs it is written in pieces
        text = sim.stdout.read_text() if sim.stdout else ""
        return text if text.endswith("\n") else None

    provider = json.loads(sim.wait_for(line, "JSON line", 120))
    outputs = {o["task_id"]: o for o in provider["outputs"]}

    api_port = free_port()
    write_config(
        BENCH / "aivedio.toml",
        dsn=cluster.dsn(),
        api_port=api_port,
        sim=provider,
        callback_secret=callback_secret,
        media_slots=args.media_slots,
    )
    if args.plain:
        text = (
            (BENCH / "aivedio.toml")
            .read_text()
            .replace("[net]\n", '[net]\nallowed_schemes = ["http", "https"]\n')
        )
        (BENCH / "aivedio.toml").write_text(text)
    run_cli(env, "migrate")
    run_cli(env, "tenants", "create", TENANT)

    api = children.start(
        "API", [*AIVEDIO, "api"], log="api.log", env=role_env(env, cluster, "fleet_api")
    )
    base = f"http://127.0.0.1:{api_port}"
    api.wait_for_event("api_listening")
    api.wait_for(lambda: http("GET", f"{base}/readyz", timeout=2).status == 200, "readyz", 30)
    # --pin: worker N on the Nth node's CPUs, its ffmpeg children with it (they inherit them).
    cpus = nodes.node_cpus(args.workers, args.cores_per_node) if args.pin else None
    workers: list[Child] = []
    for n in range(1, args.workers + 1):
        workers.append(
            children.start(
                f"worker {n}",
                nodes.pinned([*AIVEDIO, "worker"], cpus[n - 1] if cpus else None),
                log=f"worker-{n}.log",
                env=role_env(env, cluster, "fleet_worker"),
            )
        )
    ports = [int(w.wait_for_event("http_listening")["port"]) for w in workers]
    out(
        f"  provider  {provider['base_url']}  {len(outputs)} outputs "
        f"(remux {clips['remux'].stat().st_size} B, "
        f"transcode {clips['transcode'].stat().st_size} B)"
    )
    out(f"  API       {base}  pid {api.pid}")
    for n, (w, p) in enumerate(zip(workers, ports, strict=True)):
        on = f" on CPU(s) {cpus[n]}" if cpus else ""
        out(f"  {w.name}  http://127.0.0.1:{p}/metrics  pid {w.pid}{on}")
    await asyncio.sleep(
        args.settle
    )  # start-up work (periodic jobs seeded, LISTENs) before the clock

    pids = {
        "api": api.pid,
        **{f"worker-{n}": w.pid for n, w in enumerate(workers, 1)},
        "sim": sim.pid,
    }
    postmaster = cluster.postmaster_pid()
    obs = await asyncpg.connect(cluster.dsn("fleet_observer"))
    # The idle fleet's background (claim polls, heartbeats, maintenance), per second.
    await obs.execute("SELECT pg_stat_statements_reset()")
    idle_cpu0 = {name: proc_cpu(pid) for name, pid in pids.items()}
    idle_t0 = time.monotonic()
    await asyncio.sleep(args.idle)
    idle_rows = [dict(r) for r in await obs.fetch(STATEMENTS_SQL, DATABASE, list(ROLES[:2]))]
    idle_cpu1 = {name: proc_cpu(pid) for name, pid in pids.items()}
    idle_s = time.monotonic() - idle_t0
    idle = {
        "seconds": idle_s,
        "statements_per_s": sum(r["calls"] for r in idle_rows) / idle_s,
        "round_trips_per_s": round_trips(idle_rows) / idle_s,
        "cpu_ms_per_s": {
            name: 1000 * (idle_cpu1[name]["own"] - idle_cpu0[name]["own"]) / idle_s for name in pids
        },
        "top": [
            {"query": " ".join(r["query"].split())[:200], "calls": r["calls"]}
            for r in idle_rows[:10]
        ],
    }
    out(
        f"  idle {idle_s:.0f} s: {idle['statements_per_s']:.1f} statements/s, "
        f"{idle['round_trips_per_s']:.1f} round trips/s, CPU ms/s "
        + ", ".join(f"{k} {v:.1f}" for k, v in idle["cpu_ms_per_s"].items())
    )
    await obs.execute("SELECT pg_stat_statements_reset()")
    db0 = await obs.fetchrow(
        "SELECT xact_commit, xact_rollback FROM pg_stat_database WHERE datname = $1", DATABASE
    )
    transfer0 = byte_transfer_cpu(ports)
    cpu0 = {name: proc_cpu(pid) for name, pid in pids.items()}
    pg0 = cluster_cpu(postmaster)
    machine0 = machine_cpu()
    t_start = time.time()
    mono0 = time.monotonic()
    sent: dict[str, float] = {}
    errors: list[str] = []
    samples: list[dict[str, Any]] = []
    done = asyncio.Event()
    out(
        f"== {len(tasks)} callbacks ({args.remux} remux, {args.transcode} transcode) at "
        f"{'back to back' if args.rate <= 0 else f'{args.rate:g}/s'}"
    )
    sampling = asyncio.create_task(
        sampler(obs, pids, postmaster, t_start, samples, len(tasks), done, args.timeout)
    )
    sender = asyncio.create_task(
        asyncio.to_thread(send_all, base, callback_secret, tasks, outputs, args.rate, sent, errors)
    )
    worker_pids = {f"worker-{n}": w.pid for n, w in enumerate(workers, 1)}
    affinity = nodes.Affinity(dict(zip(worker_pids, cpus, strict=True))) if cpus else None
    last_print = 0.0
    while not done.is_set():
        await asyncio.sleep(0.5)  # a process that dies meanwhile cancels this task
        if affinity is not None:  # what the workers' children run on, while they run
            await asyncio.to_thread(affinity.take, worker_pids)
        if samples and samples[-1]["t"] - last_print >= 15:
            s = samples[-1]
            last_print = s["t"]
            out(
                f"  {s['t']:6.0f}s  sent {len(sent):5d}  published {s['published']:5d}  "
                f"queued {s['queued_total']:5d}  oldest {s['oldest_queued_s']:6.1f}s  "
                f"running {s['running']:3d}"
            )
    await sender
    await sampling
    wall = time.monotonic() - mono0
    callbacks_wall = max(sent.values()) - t_start if sent else 0.0

    # Everything settled: read the processes before stopping them.
    cpu1 = {name: proc_cpu(pid) for name, pid in pids.items()}
    transfer1 = byte_transfer_cpu(ports)
    mem = {name: proc_mem(pid) for name, pid in pids.items()}
    pg1 = cluster_cpu(postmaster)
    machine1 = machine_cpu()
    db1 = await obs.fetchrow(
        "SELECT xact_commit, xact_rollback FROM pg_stat_database WHERE datname = $1", DATABASE
    )
    statements = [dict(r) for r in await obs.fetch(STATEMENTS_SQL, DATABASE, list(ROLES[:2]))]
    rows = [dict(r) for r in await obs.fetch(LATENCY_SQL)]
    jobs = [
        dict(r)
        for r in await obs.fetch(
            "SELECT kind, status, count(*) AS n, sum(attempts) AS attempts FROM job_history "
            "GROUP BY kind, status ORDER BY kind, status"
        )
    ]
    dead = await obs.fetchval("SELECT count(*) FROM job_history WHERE status = 'dead'")
    await obs.close()
    jobs_metrics = {}
    for w, p in zip(workers, ports, strict=True):
        text = http("GET", f"http://127.0.0.1:{p}/metrics").body.decode()
        jobs_metrics[w.name] = round(
            sum(
                float(line.rsplit(" ", 1)[1])
                for line in text.splitlines()
                if line.startswith("aivedio_jobs_succeeded_total{")
            )
        )
    objects_bytes = sum(p.stat().st_size for p in (BENCH / "objects").rglob("*") if p.is_file())

    result = analyse(
        args,
        tasks,
        kind_of,
        sent,
        errors,
        rows,
        samples,
        cpu0,
        cpu1,
        transfer0,
        transfer1,
        mem,
        pg0,
        pg1,
        db0,
        db1,
        statements,
        jobs,
        dead,
        jobs_metrics,
        objects_bytes,
        wall,
        callbacks_wall,
        clips,
        provider,
    )
    result["idle"] = idle
    # What else kept the machine busy meanwhile (this script, other work on the host): the
    # machine's busy CPU less the fleet's processes, their children and the cluster.
    fleet_cpu = sum(p["own_cpu_s"] + p["children_cpu_s"] for p in result["processes"].values()) + (
        pg1 - pg0
    )
    result["machine_cpu_s"] = machine1 - machine0
    result["other_cores"] = max(0.0, machine1 - machine0 - fleet_cpu) / wall
    if affinity is not None:
        result["pin"] = {"cpus": cpus, "cores_per_node": args.cores_per_node}
        result["affinity"] = affinity.summary()
    return result


def analyse(
    args: argparse.Namespace,
    tasks: list[tuple[str, str]],
    kind_of: dict[str, str],
    sent: dict[str, float],
    errors: list[str],
    rows: list[dict[str, Any]],
    samples: list[dict[str, Any]],
    cpu0: dict[str, Any],
    cpu1: dict[str, Any],
    transfer0: dict[str, dict[str, float]],
    transfer1: dict[str, dict[str, float]],
    mem: dict[str, Any],
    pg0: float,
    pg1: float,
    db0: Any,
    db1: Any,
    statements: list[dict[str, Any]],
    jobs: list[dict[str, Any]],
    dead: int,
    jobs_metrics: dict[str, int],
    objects_bytes: int,
    wall: float,
    callbacks_wall: float,
    clips: dict[str, Path],
    provider: dict[str, Any],
) -> dict[str, Any]:
    settled = sum(
        1
        for r in rows
        if r["provider_task_id"] in sent
        and (r["status"] in ASSET_FINAL or r["fetch_status"] in OUTPUT_FAILED)
    )
    timed_out = settled < len(tasks)
    # Per asset: over every asset; if the run timed out, over the settled ones (an upper
    # bound: the unsettled ones' work so far is counted too).
    n = settled if timed_out and settled else len(tasks)
    latency: dict[str, list[float]] = {"remux": [], "transcode": []}
    enriched: dict[str, list[float]] = {"remux": [], "transcode": []}
    accept: list[float] = []
    in_service: dict[str, list[float]] = {"remux": [], "transcode": []}
    final: dict[str, int] = {}
    fetched_bytes = 0
    last_published = 0.0
    last_enriched = 0.0
    for r in rows:
        task = r["provider_task_id"]
        kind = kind_of.get(task)
        if kind is None or task not in sent:
            continue
        final[r["status"] or r["fetch_status"]] = final.get(r["status"] or r["fetch_status"], 0) + 1
        fetched_bytes += r["source_size_bytes"] or 0
        t0 = sent[task]
        accept.append(r["accepted_at"].timestamp() - t0)
        if r["playable_at"] is not None:
            latency[kind].append(r["playable_at"].timestamp() - t0)
            last_published = max(last_published, r["playable_at"].timestamp())
            if r["fetching_at"] is not None:
                in_service[kind].append((r["playable_at"] - r["fetching_at"]).total_seconds())
        if r["enriched_at"] is not None:
            enriched[kind].append(r["enriched_at"].timestamp() - t0)
            last_enriched = max(last_enriched, r["enriched_at"].timestamp())
    first_sent = min(sent.values())
    published = sum(len(v) for v in latency.values())
    span = last_published - first_sent if published else float("nan")
    done_n = sum(len(v) for v in enriched.values())
    done_span = last_enriched - first_sent if done_n else float("nan")

    per_proc = {}
    for name in cpu1:
        per_proc[name] = {
            "own_cpu_s": cpu1[name]["own"] - cpu0[name]["own"],
            "user_s": cpu1[name]["user"] - cpu0[name]["user"],
            "sys_s": cpu1[name]["sys"] - cpu0[name]["sys"],
            "children_cpu_s": cpu1[name]["children"] - cpu0[name]["children"],
            "peak_rss_bytes": mem[name].get("VmHWM", 0),
            "rss_bytes": mem[name].get("VmRSS", 0),
        }
    workers = [k for k in per_proc if k.startswith("worker")]
    # Byte transfer by kind, as the workers measured it in the threads that spent it.
    transfer: dict[str, float] = {}
    for w in workers:
        for kind, seconds in transfer1.get(w, {}).items():
            transfer[kind] = transfer.get(kind, 0.0) + seconds - transfer0.get(w, {}).get(kind, 0.0)
        per_proc[w]["byte_transfer_cpu_s"] = sum(transfer1.get(w, {}).values()) - sum(
            transfer0.get(w, {}).values()
        )
    worker_own = sum(per_proc[w]["own_cpu_s"] for w in workers)
    worker_transfer = sum(transfer.values())
    worker_children = sum(per_proc[w]["children_cpu_s"] for w in workers)
    api_own = per_proc["api"]["own_cpu_s"]
    # The definition: everything except ffmpeg (the children) and byte transfer.
    orchestration = worker_own - worker_transfer + api_own

    by_role: dict[str, int] = {}
    for s in statements:
        by_role[s["role"]] = by_role.get(s["role"], 0) + s["calls"]
    total_calls = sum(by_role.values())
    merged: dict[str, dict[str, Any]] = {}
    for s in statements:
        key = " ".join(s["query"].split())
        entry = merged.setdefault(key, {"query": key, "calls": 0, "roles": {}, "exec_ms": 0.0})
        entry["calls"] += s["calls"]
        entry["exec_ms"] += s["total_exec_time"]
        entry["roles"][s["role"]] = entry["roles"].get(s["role"], 0) + s["calls"]
    top = sorted(merged.values(), key=lambda e: -e["calls"])

    # Oldest queued job age: the max, and one line per 30 s.
    series = []
    for s in samples:
        if not series or s["t"] - series[-1]["t"] >= 30 or s is samples[-1]:
            series.append(s)
    table = []
    prev = None
    for s in series:
        row = {
            "t": s["t"],
            "published": s["published"],
            "queued": s["queued_total"],
            "oldest_queued_s": s["oldest_queued_s"],
            "running": s["running"],
            "queued_by_kind": {k: v["queued"] for k, v in s["queued"].items()},
        }
        if prev is not None:
            dt = s["t"] - prev["t"]
            for w in workers:
                if s["cpu"].get(w) and prev["cpu"].get(w):
                    row[f"{w}_own_pct"] = 100 * (s["cpu"][w]["own"] - prev["cpu"][w]["own"]) / dt
                    row[f"{w}_children_pct"] = (
                        100 * (s["cpu"][w]["children"] - prev["cpu"][w]["children"]) / dt
                    )
            row["postgres_pct"] = 100 * (s["postgres_cpu"] - prev["postgres_cpu"]) / dt
        table.append(row)
        prev = s
    oldest_max = max((s["oldest_queued_s"] for s in samples), default=0.0)
    oldest_by_kind: dict[str, float] = {}
    for s in samples:
        for k, v in s["queued"].items():
            oldest_by_kind[k] = max(oldest_by_kind.get(k, 0.0), v["oldest_s"])

    return {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {
            "nproc": os.cpu_count(),
            "cpu": cpu_model(),
            "python": platform.python_version(),
            "kernel": platform.release(),
        },
        "args": vars(args),
        "clips": {
            k: {"file": str(p.relative_to(ROOT)), "bytes": p.stat().st_size}
            for k, p in clips.items()
        },
        "media_config": MEDIA,
        "tls": not args.plain,
        "assets": n,
        "assets_sent": len(sent),
        "timed_out": timed_out,
        "callback_errors": errors[:20],
        "callback_errors_total": len(errors),
        "final_states": final,
        "dead_jobs": dead,
        "wall_s": wall,
        "callbacks_wall_s": callbacks_wall,
        "published": published,
        "first_callback_to_last_published_s": span,
        "throughput_assets_per_min": published / span * 60 if published else 0.0,
        # Every output made (ENRICHED): the whole work of an asset, none of it deferred.
        "enriched": done_n,
        "first_callback_to_last_enriched_s": done_span,
        "enriched_throughput_assets_per_min": done_n / done_span * 60 if done_n else 0.0,
        "latency_callback_to_playable_s": {k: summarise(v) for k, v in latency.items()},
        "latency_callback_to_enriched_s": {k: summarise(v) for k, v in enriched.items()},
        "latency_callback_to_accepted_s": summarise(accept),
        "latency_fetching_to_playable_s": {k: summarise(v) for k, v in in_service.items()},
        "oldest_queued_job_s": {"max": oldest_max, "by_kind": oldest_by_kind},
        "series": table,
        "processes": per_proc,
        "postgres_cluster_cpu_s": pg1 - pg0,
        "cpu_per_asset_ms": {
            "orchestration": 1000 * orchestration / n,
            "workers_own": 1000 * worker_own / n,
            "byte_transfer": 1000 * worker_transfer / n,
            "byte_transfer_by_kind": {k: 1000 * v / n for k, v in transfer.items()},
            "own_with_byte_transfer": 1000 * (worker_own + api_own) / n,
            "api": 1000 * api_own / n,
            "ffmpeg_children": 1000 * worker_children / n,
            "postgres": 1000 * (pg1 - pg0) / n,
        },
        "bytes": {"fetched": fetched_bytes, "objects_stored": objects_bytes},
        "statements": {
            "total": total_calls,
            "round_trips": round_trips(statements),
            "round_trips_per_asset": round_trips(statements) / n,
            "round_trips_by_role_per_asset": {
                role: round_trips([x for x in statements if x["role"] == role]) / n
                for role in by_role
            },
            "by_role": by_role,
            "per_asset": total_calls / n,
            "per_asset_by_role": {k: v / n for k, v in by_role.items()},
            "transactions": (
                db1["xact_commit"]
                + db1["xact_rollback"]
                - db0["xact_commit"]
                - db0["xact_rollback"]
            ),
            "top": top[:40],
        },
        "jobs": jobs,
        "jobs_succeeded_by_worker": jobs_metrics,
    }


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def report(r: dict[str, Any]) -> None:
    n = r["assets"]
    out()
    out(
        f"== fleet: {n} assets ({r['args']['remux']} remux + {r['args']['transcode']} transcode), "
        f"{r['args']['workers']} workers ({r['args']['media_slots']} media slots each), "
        f"{'HTTPS' if r['tls'] else 'HTTP'} provider"
    )
    out(
        f"  final states        {r['final_states']}; dead jobs {r['dead_jobs']}; "
        f"callback errors {r['callback_errors_total']}"
    )
    out(
        f"  wall                {r['wall_s']:.1f} s "
        f"(callbacks sent over {r['callbacks_wall_s']:.1f} s)"
    )
    out(
        f"  throughput          {r['throughput_assets_per_min']:.1f} assets/min published "
        f"({r['published']} in {r['first_callback_to_last_published_s']:.1f} s, first "
        f"callback to last PLAYABLE)"
    )
    if "enriched_throughput_assets_per_min" in r:
        out(
            f"  every output made   {r['enriched_throughput_assets_per_min']:.1f} assets/min "
            f"({r['enriched']} ENRICHED in {r['first_callback_to_last_enriched_s']:.1f} s, "
            f"first callback to last ENRICHED)"
        )
    if "other_cores" in r:
        out(
            f"  other processes     {r['other_cores']:.2f} cores busy on average (this script "
            "and anything else on the host)"
        )
    if r.get("affinity"):
        for line in nodes.describe(r["affinity"]):
            out(f"  {line}")
    out()
    out(f"  {'callback → PLAYABLE':<24} {'n':>5} {'p50':>8} {'p95':>8} {'p99':>8} {'max':>8}")
    for label, key in (
        ("PLAYABLE", "latency_callback_to_playable_s"),
        ("ENRICHED", "latency_callback_to_enriched_s"),
        ("PLAYABLE*", "latency_fetching_to_playable_s"),
    ):
        for kind, s in r[key].items():
            out(
                f"  {kind + ' → ' + label:<24} {s['n']:>5} {s['p50']:>7.2f}s {s['p95']:>7.2f}s "
                f"{s['p99']:>7.2f}s {s['max']:>7.2f}s"
            )
    out("  (* from the fetch's start, the output's FETCHING event, instead of the callback)")
    s = r["latency_callback_to_accepted_s"]
    out(
        f"  {'callback → task row':<24} {s['n']:>5} {s['p50'] * 1000:>6.1f}ms "
        f"{s['p95'] * 1000:>6.1f}ms {s['p99'] * 1000:>6.1f}ms {s['max'] * 1000:>6.1f}ms"
    )
    out()
    out(
        f"  oldest queued job: max {r['oldest_queued_job_s']['max']:.1f} s; by kind "
        + ", ".join(
            f"{k} {v:.1f} s" for k, v in sorted(r["oldest_queued_job_s"]["by_kind"].items())
        )
    )
    out(
        f"  {'t (s)':>6} {'published':>9} {'queued':>6} {'oldest (s)':>10} {'running':>7} "
        f"{'w1 own%':>7} {'w1 ffm%':>7} {'w2 own%':>7} {'w2 ffm%':>7} {'pg%':>5}"
    )
    for row in r["series"]:
        cols = [
            row.get(k)
            for k in (
                "worker-1_own_pct",
                "worker-1_children_pct",
                "worker-2_own_pct",
                "worker-2_children_pct",
                "postgres_pct",
            )
        ]
        cells = " ".join(f"{c:7.0f}" if c is not None else f"{'':>7}" for c in cols[:4])
        pg = f"{cols[4]:5.0f}" if cols[4] is not None else ""
        out(
            f"  {row['t']:6.0f} {row['published']:9d} {row['queued']:6d} "
            f"{row['oldest_queued_s']:10.1f} {row['running']:7d} {cells} {pg}"
        )
    out()
    out(f"  {'process':<10} {'own CPU':>9} {'user':>8} {'sys':>8} {'children':>9} {'peak RSS':>9}")
    for name, p in r["processes"].items():
        out(
            f"  {name:<10} {p['own_cpu_s']:8.1f}s {p['user_s']:7.1f}s {p['sys_s']:7.1f}s "
            f"{p['children_cpu_s']:8.1f}s {p['peak_rss_bytes'] / 2**20:6.0f} MiB"
        )
    out(f"  {'postgres':<10} {r['postgres_cluster_cpu_s']:8.1f}s  (the whole cluster)")
    c = r["cpu_per_asset_ms"]
    out(
        f"  per asset: orchestration {c['orchestration']:.1f} ms CPU (workers' own "
        f"{c['workers_own']:.1f} - byte transfer {c['byte_transfer']:.1f} + API {c['api']:.1f}); "
        f"ffmpeg/ffprobe {c['ffmpeg_children']:.1f} ms; "
        f"PostgreSQL {c['postgres']:.1f} ms"
    )
    out(
        "  byte transfer, as the workers measured it (thread CPU of the sections that move or "
        "hash bytes): "
        + ", ".join(f"{k} {v:.1f} ms" for k, v in c["byte_transfer_by_kind"].items())
        + f"; the processes' own CPU with it: {c['own_with_byte_transfer']:.1f} ms"
    )
    b = r["bytes"]
    out(
        f"  bytes: fetched {b['fetched'] / 2**20:.1f} MiB, stored objects "
        f"{b['objects_stored'] / 2**20:.1f} MiB"
    )
    st = r["statements"]
    out()
    out(
        f"  statements (pg_stat_statements, top level, utility included): {st['total']} = "
        f"{st['per_asset']:.1f} per asset ("
        + ", ".join(f"{k} {v:.1f}" for k, v in st["per_asset_by_role"].items())
        + f"); transactions {st['transactions']} = {st['transactions'] / n:.1f} per asset"
    )
    out(f"  {'calls/asset':>11}  {'worker':>7} {'api':>6}  statement")
    for e in st["top"][:25]:
        out(
            f"  {e['calls'] / n:11.2f}  {e['roles'].get('fleet_worker', 0) / n:7.2f} "
            f"{e['roles'].get('fleet_api', 0) / n:6.2f}  {e['query'][:110]}"
        )
    out(
        f"  round trips (the pool's 4-statement reset and BEGIN + lease check counted once): "
        f"{st['round_trips']} = "
        f"{st['round_trips_per_asset']:.1f} per asset ("
        + ", ".join(f"{k} {v:.1f}" for k, v in st["round_trips_by_role_per_asset"].items())
        + ")"
    )
    idle = r.get("idle")
    if idle:
        bg_rt = idle["round_trips_per_s"] * r["wall_s"] / n
        bg_cpu = sum(v for k, v in idle["cpu_ms_per_s"].items() if k != "sim") * r["wall_s"] / n
        out(
            f"  idle background over the run's wall time, per asset: {bg_rt:.1f} round trips, "
            f"{bg_cpu:.1f} ms CPU (from {idle['seconds']:.0f} s idle before the clock; "
            "included in the figures above)"
        )
    cpu_ok = c["orchestration"] < 50
    rt_ok = st["round_trips_per_asset"] < 40
    out()
    out(
        f"  target: orchestration CPU < 50 ms/asset: {c['orchestration']:.1f} ms "
        f"{'met' if cpu_ok else 'NOT met'}"
    )
    out(
        f"  target: < 40 database round trips/asset: {st['round_trips_per_asset']:.1f} "
        f"{'met' if rt_ok else 'NOT met'}"
    )


def stop_all(children: Children) -> None:
    """The API and the workers first (they drain), then the provider."""
    children.stop([c for c in children.children if c.name.startswith(("API", "worker"))], 45)
    children.stop(timeout=45)


def sanity(r: dict[str, Any]) -> list[str]:
    """What a smoke run must show: every asset ENRICHED, nothing refused or dead, and every
    figure the report is about measured."""
    problems = []
    n = r["args"]["remux"] + r["args"]["transcode"]
    if r["timed_out"] or r["final_states"] != {"ENRICHED": n}:
        problems.append(
            f"final states {r['final_states']} for {n} outputs"
            f"{' (timed out)' if r['timed_out'] else ''}"
        )
    if r["callback_errors_total"]:
        problems.append(f"callbacks refused: {r['callback_errors']}")
    if r["dead_jobs"]:
        problems.append(f"{r['dead_jobs']} dead jobs: {r['jobs']}")
    if r["published"] != n:
        problems.append(f"{r['published']} published of {n}")
    c, st = r["cpu_per_asset_ms"], r["statements"]
    figures = {
        "orchestration CPU": c["orchestration"],
        "ffmpeg CPU": c["ffmpeg_children"],
        "round trips per asset": st["round_trips_per_asset"],
        "throughput": r["throughput_assets_per_min"],
        "fetched bytes": r["bytes"]["fetched"],
    }
    problems += [f"{k} = {v}" for k, v in figures.items() if not positive(v)]
    for kind in ("remux", "transcode"):
        if r["latency_callback_to_playable_s"][kind]["n"] != r["args"][kind]:
            problems.append(f"{kind}: latencies {r['latency_callback_to_playable_s'][kind]}")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--remux", type=int, default=1000)
    parser.add_argument("--transcode", type=int, default=100)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument(
        "--rate", type=float, default=10.0, help="callbacks per second, steady (0: back to back)"
    )
    parser.add_argument("--timeout", type=float, default=1800, help="seconds to wait for all")
    parser.add_argument("--settle", type=float, default=3.0, help="idle seconds before the clock")
    parser.add_argument(
        "--media-slots",
        type=int,
        default=4,
        help="[worker.lanes.media] slots per worker (the default config: 2)",
    )
    parser.add_argument(
        "--idle", type=float, default=10.0, help="seconds of idle fleet measured before the clock"
    )
    parser.add_argument("--plain", action="store_true", help="the provider over plain HTTP")
    parser.add_argument(
        "--pin",
        action="store_true",
        help="one run per --pin-workers count, each worker (and its ffmpeg) on CPUs of its "
        "own with taskset: a node each",
    )
    parser.add_argument(
        "--pin-workers", default="1,2", help="worker counts of the --pin runs, in order (1,2)"
    )
    parser.add_argument(
        "--cores-per-node", type=int, default=1, help="CPUs per worker with --pin (1)"
    )
    parser.add_argument("--keep-cluster", action="store_true")
    parser.add_argument(
        "--smoke", action="store_true", help="3 remux + 1 transcode, back to back; sanity"
    )
    args = parser.parse_args()
    if args.smoke:
        global BENCH, PG_DIR, MEDIA_DIR  # the run's directories, read by everything above
        # A run by hand keeps its own; the pinned smoke run, which the suite may run at the
        # same time as the other, too.
        BENCH = ROOT / "var" / ("bench-fleet-smoke-pin" if args.pin else "bench-fleet-smoke")
        MEDIA_DIR = BENCH / "media"  # its clips made by itself, not raced for
        PG_DIR = BENCH / "pg"
        args.remux, args.transcode, args.rate = 3, 1, 0.0
        args.idle, args.settle, args.timeout, args.media_slots = 1.0, 0.5, 120.0, 2
    for name in ("NO_PROXY", "no_proxy"):
        os.environ[name] = ",".join(filter(None, [os.environ.get(name), "127.0.0.1,localhost"]))
    if args.pin:
        return pinned_runs(args)
    BENCH.mkdir(parents=True, exist_ok=True)
    result = one_fleet(args)
    report(result)
    path = BENCH / f"result-{args.remux}+{args.transcode}-{time.strftime('%Y%m%dT%H%M%S')}.json"
    path.write_text(json.dumps(result, indent=2, default=str))
    out(f"  result: {path.relative_to(ROOT)}")
    return verdict("fleet", sanity(result)) if args.smoke else 0


def one_fleet(args: argparse.Namespace) -> dict[str, Any]:
    """One run on a cluster of its own, stopped at the end."""
    cluster = Cluster(free_port())
    try:
        cluster.start()
        return asyncio.run(run(args, cluster))
    finally:
        if not args.keep_cluster:
            cluster.stop()


# Issue 25: the throughput of 2 one-CPU nodes against 1.
PIN_TARGET = 1.7


def pinned_runs(args: argparse.Namespace) -> int:
    """``--pin``: the same load once per worker count, each worker on a node of its own,
    each run in a directory and on a cluster of its own; then the throughputs side by side."""
    global BENCH, PG_DIR
    base = BENCH
    counts = [int(n) for n in args.pin_workers.split(",")]
    results = []
    for n in counts:
        run_args = argparse.Namespace(**{**vars(args), "workers": n})  # its own, kept
        BENCH = base / f"pinned-{n}w"
        PG_DIR = BENCH / "pg"
        BENCH.mkdir(parents=True, exist_ok=True)
        out(f"== {n} pinned worker(s), {args.cores_per_node} CPU(s) each  ({time.ctime()})")
        STOP_SENDING.clear()
        results.append(one_fleet(run_args))
        report(results[-1])
        out()
    BENCH = base
    out(
        f"== pinned fleet: {args.remux} remux + {args.transcode} transcode assets, "
        f"{args.media_slots} media slots per worker, {args.cores_per_node} CPU(s) per worker; "
        "PostgreSQL, the API, the provider and this script on every CPU"
    )
    out(
        "| workers | CPUs | every output made (ENRICHED) | vs 1 worker | published (PLAYABLE) "
        "| vs 1 worker | workers' CPU + ffmpeg | their cores busy | PostgreSQL | API + provider "
        "| other processes, cores |"
    )
    out("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    first = results[0]
    for r in results:
        procs = r["processes"]
        workers_cpu = sum(
            p["own_cpu_s"] + p["children_cpu_s"] for k, p in procs.items() if k.startswith("worker")
        )
        others = procs["api"]["own_cpu_s"] + procs["sim"]["own_cpu_s"]
        done = r["enriched_throughput_assets_per_min"]
        out(
            f"| {r['args']['workers']} | {' '.join(r['pin']['cpus'])} | "
            f"{r['enriched_throughput_assets_per_min']:.1f} /min | "
            f"{done / first['enriched_throughput_assets_per_min']:.2f}x | "
            f"{r['throughput_assets_per_min']:.1f} /min | "
            f"{r['throughput_assets_per_min'] / first['throughput_assets_per_min']:.2f}x | "
            f"{workers_cpu:.1f} s | {workers_cpu / r['first_callback_to_last_enriched_s']:.2f} | "
            f"{r['postgres_cluster_cpu_s']:.1f} s | {others:.1f} s | {r['other_cores']:.2f} |"
        )
    by_count = {r["args"]["workers"]: r for r in results}
    if 1 in by_count and 2 in by_count:
        speed = (
            by_count[2]["enriched_throughput_assets_per_min"]
            / by_count[1]["enriched_throughput_assets_per_min"]
        )
        met = "met" if speed >= PIN_TARGET else f"NOT met ({speed / PIN_TARGET:.0%} of it)"
        out(f"  target: 2 pinned workers >= {PIN_TARGET}x the throughput of 1: {speed:.2f}x, {met}")
    path = (
        base / f"result-pinned-{args.remux}+{args.transcode}-{time.strftime('%Y%m%dT%H%M%S')}.json"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"command": sys.argv, "runs": results}, indent=2, default=str))
    out(f"  result: {path.relative_to(ROOT)}")
    if not args.smoke:
        return 0
    problems = []
    for r in results:
        label = f"{r['args']['workers']} pinned worker(s)"
        problems += [f"{label}: {p}" for p in sanity(r)]
    problems += nodes.problems([r["affinity"] for r in results])
    return verdict("fleet", problems)


if __name__ == "__main__":
    raise SystemExit(main())
