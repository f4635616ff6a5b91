"""``scripts/chaos``: the chaos run. See ``scripts/chaos --help`` and docs/benchmarks.md.

    .venv/bin/python scripts/lib/chaos/main.py [--seed S] [--n N] [--store s3|fs] ...

Exit status: 0 when every invariant held, 1 on any violation or when the run could not be
completed (the report says which), 2 on bad usage.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import fcntl
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from children import ChildExited, Children
from demo_driver import DemoError, free_port, http
from seaweedfs import ACCESS_KEY_ID, SECRET_ACCESS_KEY, Engine

from chaos import checks
from chaos.checks import Result
from chaos.load import Load
from chaos.media import make_media
from chaos.plan import KINDS, Plan, make_plan
from chaos.stack import (
    AIVEDIO,
    ROOT,
    START_TIMEOUT_SECONDS,
    ChaosError,
    Postgres,
    Proc,
    Sampler,
    out,
    sql,
    stop_all,
)

DATABASE = "aivedio_chaos"
BUCKET = "aivedio-chaos"
TENANT = "chaos"
LOOPBACK_NAMES = "127.0.0.1,localhost,::1"
DRAIN_TIMEOUT_SECONDS = 20.0
LEASE_SECONDS = 10.0
# The media lane's oldest job this old turns backlog pressure on (the default, 300 s, is
# never reached in a run of a few minutes).
BACKLOG_MEDIA_OLDEST_SECONDS = 20.0
RUN_SWEEP_INTERVAL = 10.0
RUN_GRACE_SECONDS = 10.0
RUN_MULTIPART_STALE_SECONDS = 60.0
FINAL_GRACE_SECONDS = 2.0
DB_CONNECT_TIMEOUT_SECONDS = 5
# A worker that had not started yet when PostgreSQL went down may fail its startup: the
# command's fail-fast path (`aivedio: database error: …`, exit 1, before the Worker runs) and
# its supervisor's restart (systemd Restart=on-failure; here the harness) are the design. Such
# an exit is accepted while the restart lasts and for this long after (a connect attempt made
# during the restart may take the connect timeout to fail), and shown in the report.
STARTUP_WINDOW_SECONDS = DB_CONNECT_TIMEOUT_SECONDS + 5


def toml_str(value: str) -> str:
    return json.dumps(value)


def write_config(
    path: Path,
    *,
    dsn: str,
    api_port: int,
    sim: dict[str, Any],
    callback_secret: str,
    s3_endpoint: str | None,
    objects: Path,
) -> None:
    if s3_endpoint is None:
        storage = f"url = {toml_str('file://' + str(objects))}"
    else:
        storage = (
            f'url = "s3://{BUCKET}/chaos"\ns3_endpoint_url = {toml_str(s3_endpoint)}\n'
            f"s3_access_key_id = {toml_str(ACCESS_KEY_ID)}\n"
            f"s3_secret_access_key = {toml_str(SECRET_ACCESS_KEY)}"
        )
    path.write_text(f"""# Written by scripts/chaos for one run. Secrets come from the environment.
[database]
url = {toml_str(dsn)}
pool_max_size = 8
connect_timeout_seconds = {DB_CONNECT_TIMEOUT_SECONDS}

[storage]
{storage}

[api]
host = "127.0.0.1"
port = {api_port}

[worker]
http_port = 0
lease_seconds = {LEASE_SECONDS}
heartbeat_interval_seconds = 2
poll_interval_seconds = 0.5
drain_timeout_seconds = {DRAIN_TIMEOUT_SECONDS}
[worker.lanes.fetch]
slots = 8
[worker.lanes.media]
slots = 2
[worker.lanes.control]
slots = 8

[backlog]
# Low enough for this run's media backlog to cross it: degradation runs under the chaos too.
check_interval_seconds = 1.0
media_oldest_job_seconds = {BACKLOG_MEDIA_OLDEST_SECONDS}
defer_seconds = 2.0

[queue]
backoff_base_seconds = 0.5
backoff_max_seconds = 5
retry_penalty_seconds = 1

[log]
format = "json"

[net]
allowed_ports = [{sim["port"]}]
allow_cidrs = ["127.0.0.0/8"]
ca_file = {toml_str(sim["ca_file"])}
connect_timeout_seconds = 3
header_timeout_seconds = 5
idle_read_timeout_seconds = 3
total_timeout_seconds = 60

[fetch]
breaker_failures = 5
breaker_open_seconds = 2

[providers.sim]
api_base_url = {toml_str(sim["base_url"])}
callback_secret = {toml_str(callback_secret)}
tenant = "{TENANT}"

[media]
segment_seconds = 1.0
threads = 1
required_outputs = ["playback", "poster"]
optional_outputs = ["hls"]
[[media.ladder]]
height = 240
crf = 28
maxrate_kbps = 600
bufsize_kbps = 1200

[moderation]
backend = "local"
[moderation.local]
allow_all = true

[sweeper]
periodic = true
interval_seconds = {RUN_SWEEP_INTERVAL}
orphan_grace_seconds = {RUN_GRACE_SECONDS}
multipart_stale_seconds = {RUN_MULTIPART_STALE_SECONDS}
processing_budget_seconds = 900
audit_sample = 1000
""")
    path.chmod(0o600)


class Run:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.dir: Path = args.workdir
        self.logs = self.dir / "logs"
        self.plan: Plan = make_plan(args.seed, args.n, workers=args.workers)
        self.procs: list[Proc] = []
        self.children = Children(self.logs, cwd=ROOT)  # watches the infrastructure
        self.workers: dict[int, Proc] = {}
        self.worker_history: list[Proc] = []
        self.generation = Counter[int]()
        self.sampler = Sampler()
        self.pg: Postgres | None = None
        self.s3: Engine | None = None  # SeaweedFS: its ports and data directory
        self.s3_proc: Proc | None = None
        self.api: Proc | None = None
        self.env: dict[str, str] = {}
        self.events: list[dict[str, Any]] = []
        self.violations: list[Result] = []
        self.secrets: dict[str, str] = {}
        self.drain_result: dict[str, Any] = {}
        self.pg_result: dict[str, Any] = {}
        self.s3_result: dict[str, Any] = {}
        self.unexpected: list[str] = []
        self.startup_refused: list[str] = []
        self.t0 = 0.0

    # -- start ----------------------------------------------------------------------------------

    def log(self, what: str, **data: Any) -> None:
        at = time.time() - self.t0 if self.t0 else 0.0
        self.events.append({"at": round(at, 2), "what": what, **data})
        out(f"  {at:7.1f}s  {what}" + (f"  {data}" if data else ""))

    def start(self) -> Load:
        args = self.args
        shutil.rmtree(self.logs, ignore_errors=True)
        shutil.rmtree(self.dir / "objects", ignore_errors=True)
        self.logs.mkdir(parents=True)
        (self.dir / "plan.json").write_text(json.dumps(self.plan.to_json(), indent=1))
        make_media(self.dir / "media")
        url_key = base64.b64encode(os.urandom(32)).decode()
        playback_secret = base64.b64encode(os.urandom(32)).decode()
        callback_secret = secrets.token_urlsafe(32)
        signing_key = os.urandom(32)
        (self.dir / "signing.key").write_text(signing_key.hex())
        (self.dir / "signing.key").chmod(0o600)
        self.secrets = {
            "url encryption key": url_key,
            "playback token secret": playback_secret,
            "callback secret": callback_secret,
            "provider signing key": signing_key.hex(),
        }
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("AIVEDIO_")}
        self.env.update(
            AIVEDIO_URL_ENCRYPTION_KEY=url_key,
            AIVEDIO_PLAYBACK_TOKEN_SECRET=playback_secret,
            AIVEDIO_CONFIG=str(self.dir / "aivedio.toml"),
            AWS_EC2_METADATA_DISABLED="true",
        )

        # PostgreSQL: a cluster of our own, so it can be restarted.
        if args.server_dsn:
            server_dsn = args.server_dsn
            out(f"  PostgreSQL  {server_dsn.split('@')[-1]} (given; it is not restarted)")
        else:
            self.pg = Postgres(self.dir / "pg", free_port())
            self.pg.start()
            server_dsn = self.pg.dsn
            out(
                f"  PostgreSQL  127.0.0.1:{self.pg.port}  throwaway cluster in "
                f"{self.pg.dir.relative_to(ROOT)} ({self.pg.bindir})"
            )
        sql(server_dsn, f'DROP DATABASE IF EXISTS "{DATABASE}"')
        sql(server_dsn, f'CREATE DATABASE "{DATABASE}"')
        dsn = server_dsn.rsplit("/", 1)[0] + f"/{DATABASE}"
        self.dsn = dsn

        s3_endpoint = None
        if args.store == "s3":
            shutil.rmtree(self.dir / "seaweedfs", ignore_errors=True)
            self.s3 = Engine.create(self.dir / "seaweedfs")
            self.s3_proc = self.start_s3("s3.log")
            self.s3.ensure_bucket(BUCKET)
            s3_endpoint = self.s3.endpoint
            out(
                f"  S3          {s3_endpoint}  SeaweedFS ({self.s3.directory.relative_to(ROOT)}),"
                f" bucket {BUCKET}"
            )

        sim = self.spawn(
            "provider (sim)",
            [
                sys.executable,
                str(Path(__file__).parent / "provider.py"),
                "--plan",
                str(self.dir / "plan.json"),
                "--media",
                str(self.dir / "media"),
                "--ca-dir",
                str(self.dir / "ca"),
                "--signing-key-file",
                str(self.dir / "signing.key"),
                "--signatures-out",
                str(self.dir / "signatures.txt"),
            ],
            "provider.log",
            stdout=self.dir / "provider.json",
        )
        (self.dir / "signatures.txt").write_text("")
        provider = json.loads(
            sim.wait_for(lambda: (self.dir / "provider.json").read_text().strip(), "JSON line", 30)
        )
        out(f"  provider    {provider['base_url']} (simulated, HTTPS, faults per output)")

        api_port = free_port()
        write_config(
            self.dir / "aivedio.toml",
            dsn=dsn,
            api_port=api_port,
            sim=provider,
            callback_secret=callback_secret,
            s3_endpoint=s3_endpoint,
            objects=self.dir / "objects",
        )
        self.cli("migrate")
        self.cli("tenants", "create", TENANT)
        key = json.loads(self.cli("keys", "create", "--tenant", TENANT))["key"]
        self.secrets["API key"] = key
        self.api = self.spawn("API", [*AIVEDIO, "api"], "api.log", watched=False)
        base = f"http://127.0.0.1:{api_port}"
        self.api.wait_for_event("api_listening")
        self.api.wait_for(lambda: self.answers(f"{base}/readyz"), "200 from /readyz", 30)
        self.sampler.add(self.api)
        for slot in range(args.workers):
            self.start_worker(slot)
        for worker in self.workers.values():
            worker.wait_for_event("http_listening")
        out(f"  API         {base}  pid {self.api.pid}")
        out(
            f"  workers     {args.workers}: "
            + ", ".join(f"{w.name} pid {w.pid}" for w in self.workers.values())
        )
        out(f"  config      {(self.dir / 'aivedio.toml').relative_to(ROOT)}")
        self.sampler.start()
        return Load(
            api_base=base,
            api_key=key,
            callback_secret=callback_secret,
            provider_base=provider["base_url"],
            signing_key=signing_key,
            files=provider["files"],
            env=self.env,
            dsn=dsn,
            t0=0.0,
        )

    def spawn(
        self,
        name: str,
        argv: list[str],
        log: str,
        *,
        stdout: Path | None = None,
        watched: bool = True,
    ) -> Proc:
        proc = Proc(name, argv, self.logs / log, self.env, stdout=stdout, watched=watched)
        self.procs.append(proc)
        self.children.add(proc)
        return proc

    def start_worker(self, slot: int) -> Proc:
        self.generation[slot] += 1
        gen = self.generation[slot]
        proc = self.spawn(
            f"worker {slot + 1}.{gen}",
            [*AIVEDIO, "worker"],
            f"worker-{slot + 1}-{gen}.log",
            watched=False,
        )
        self.workers[slot] = proc
        self.worker_history.append(proc)
        self.sampler.add(proc)
        return proc

    @staticmethod
    def answers(url: str) -> bool:
        try:
            return http("GET", url, timeout=2).status == 200
        except DemoError:
            return False

    def cli(self, *argv: str, check: bool = True, extra_env: dict[str, str] | None = None) -> str:
        env = {**self.env, **(extra_env or {})}
        done = subprocess.run(
            [*AIVEDIO, *argv], env=env, cwd=ROOT, capture_output=True, text=True, check=False
        )
        if check and done.returncode != 0:
            raise ChaosError(
                f"aivedio {' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()[-500:]}"
            )
        return done.stdout

    # -- chaos ----------------------------------------------------------------------------------

    def ready(self, worker: Proc, timeout: float = 15.0) -> None:
        """Wait (bounded) until the worker serves: a kill or SIGTERM before its signal
        handlers exist tests nothing but the default signal action."""
        deadline = time.monotonic() + timeout
        while worker.alive() and time.monotonic() < deadline:
            if any(e.get("event") == "http_listening" for e in worker.events()):
                return
            time.sleep(0.1)

    def kill(self, slot: int) -> None:
        worker = self.workers[slot]
        self.ready(worker)
        if not worker.alive():
            return
        worker.sample_rss()
        worker.signal(signal.SIGKILL)
        worker.reap(10)
        worker.fate = "killed"
        new = self.start_worker(slot)
        self.log(f"SIGKILL {worker.name} (pid {worker.pid}); started {new.name} (pid {new.pid})")

    def drain(self, slot: int) -> None:
        worker = self.workers[slot]
        self.ready(worker)
        time.sleep(1.0)  # let it claim work to drain
        worker.fate = "drained"
        worker.signal(signal.SIGTERM)
        new = self.start_worker(slot)
        self.log(f"SIGTERM {worker.name} (pid {worker.pid}) to drain; started {new.name}")

        def wait() -> None:
            t = time.monotonic()
            code = worker.reap(DRAIN_TIMEOUT_SECONDS + 15)
            text = worker.log.read_text(errors="replace")
            if code != 0 and '"worker_draining"' not in text and "Exception Group" in text:
                # It had crashed by itself before the SIGTERM came: a finding of its own, and
                # the drain is done again on the other slot's worker.
                self.unexpected.append(
                    f"{worker.name} exited by itself ({code}) at "
                    f"{time.time() - self.t0:.1f} s (crashed before the drain)"
                )
                self.log(f"{worker.name} had crashed before the SIGTERM; draining another")
                self.drain((slot + 1) % len(self.workers))
                return
            self.drain_result = {
                "worker": worker.name,
                "exit": code,
                "seconds": round(time.monotonic() - t, 1),
            }
            self.log(f"{worker.name} drained: exit {code}", seconds=self.drain_result["seconds"])

        threading.Thread(target=wait, daemon=True).start()

    def restart_pg(self) -> None:
        if self.pg is None:
            self.pg_result = {"skipped": "a given server is not restarted"}
            return

        def restart() -> None:
            assert self.pg is not None
            t = time.monotonic()
            self.pg_result = {"at": round(time.time() - self.t0, 1)}
            self.log("pg_ctl restart -m fast (PostgreSQL restarts)")
            try:
                self.pg.restart()
                self.pg_result.update(ok=True, seconds=round(time.monotonic() - t, 1))
            except ChaosError as exc:
                self.pg_result.update(ok=False, error=str(exc))
            self.log("PostgreSQL is back", **self.pg_result)

        threading.Thread(target=restart, daemon=True).start()

    def start_s3(self, log: str) -> Proc:
        """``weed server`` on the run's SeaweedFS directory and ports, answering."""
        assert self.s3 is not None
        proc = self.spawn("S3 server (SeaweedFS)", self.s3.argv(), log)
        proc.wait_for(self.s3.answers, "answer", START_TIMEOUT_SECONDS)
        return proc

    def restart_s3(self, down_seconds: float) -> None:
        """SIGKILL the S3 server (no shutdown of its own: what it had not written is lost
        as in a crash), keep it down, then start it again on its data directory."""
        if self.s3_proc is None:
            self.s3_result = {"skipped": "the filesystem store has no server to restart"}
            return
        killed = self.s3_proc
        killed.expect_exit()
        killed.signal(signal.SIGKILL)
        killed.reap(10)
        at = round(time.time() - self.t0, 1)
        self.log(f"SIGKILL the S3 server (SeaweedFS); down for {down_seconds:g} s")

        def start_again() -> None:
            time.sleep(down_seconds)
            t = time.monotonic()
            self.s3_result = {"at": at, "down_seconds": down_seconds}
            try:
                self.s3_proc = self.start_s3("s3-2.log")
                self.s3_result.update(ok=True, start_seconds=round(time.monotonic() - t, 1))
            except ChildExited as exc:
                self.s3_result.update(ok=False, error=exc.message[:300])
            self.log("S3 back (SeaweedFS started again on its data)", **self.s3_result)

        threading.Thread(target=start_again, daemon=True).start()

    def refused_start_during_restart(self, worker: Proc) -> str | None:
        """How a worker that never started failed its startup while PostgreSQL restarted, or
        None. Strict: exit 1; no ``worker_starting`` event (the Worker never ran, so no job
        was claimed); its last log line the command's own database error (no traceback); the
        log's last write within the restart's window."""
        pg = self.pg_result
        if worker.proc.returncode != 1 or "at" not in pg:
            return None
        if any(e.get("event") == "worker_starting" for e in worker.events()):
            return None
        lines = worker.log.read_text(errors="replace").strip().splitlines()
        if not lines or not lines[-1].startswith("aivedio: database error: "):
            return None
        if _unexplained_traceback(lines):
            return None
        last_write = worker.log.stat().st_mtime - self.t0
        end = pg["at"] + pg.get("seconds", 60.0) + STARTUP_WINDOW_SECONDS
        if not pg["at"] - 0.5 <= last_write <= end:
            return None
        return f"{worker.name} at {last_write:.1f} s: {lines[-1].removeprefix('aivedio: ')[:160]}"

    def watch_processes(self) -> None:
        """A worker or the API that exits by itself is a finding; the slot is refilled (as
        its supervisor would). A worker still starting when PostgreSQL restarted that failed
        its startup is recorded apart (``refused_start_during_restart``)."""
        for slot, worker in list(self.workers.items()):
            if not worker.alive() and worker.fate == "running":
                refused = self.refused_start_during_restart(worker)
                if refused is not None:
                    worker.fate = "refused_start"
                    self.startup_refused.append(refused)
                    new = self.start_worker(slot)
                    self.log(
                        f"{worker.name} refused to start while PostgreSQL restarted "
                        f"(exit 1, before the worker ran); started {new.name}"
                    )
                    continue
                worker.fate = "exited"
                self.unexpected.append(
                    f"{worker.name} exited by itself ({worker.proc.returncode})"
                    f" at {time.time() - self.t0:.1f} s"
                )
                new = self.start_worker(slot)
                self.log(
                    f"{worker.name} EXITED by itself ({worker.proc.returncode}); started {new.name}"
                )
        if self.api is not None and not self.api.alive() and self.api.fate == "running":
            self.api.fate = "exited"
            self.unexpected.append(f"the API exited by itself ({self.api.proc.returncode})")
            self.log("the API EXITED by itself")
            self.api = self.spawn("API (restarted)", [*AIVEDIO, "api"], "api-2.log", watched=False)

    def load_and_chaos(self, load: Load) -> None:
        plan, chaos = self.plan, self.plan.chaos
        schedule: list[tuple[float, str, Any]] = [(at, "kill", slot) for at, slot in chaos.kills]
        schedule += [
            (chaos.drain_at, "drain", chaos.drain_slot),
            (chaos.pg_restart_at, "pg", None),
            (chaos.s3_restart_at, "s3", chaos.s3_down_seconds),
        ]
        schedule.sort(key=lambda item: item[0])
        self.t0 = load.t0 = time.time()
        threads = [threading.Thread(target=load.run, args=(o,), daemon=True) for o in plan.outputs]
        for thread in threads:
            thread.start()
        for at, action, arg in schedule:
            while time.time() < self.t0 + at:
                self.watch_processes()
                time.sleep(min(0.2, max(0.0, self.t0 + at - time.time())))
            if action == "kill":
                self.kill(arg)
            elif action == "drain":
                self.drain(arg)
            elif action == "pg":
                self.restart_pg()
            else:
                self.restart_s3(arg)
        for thread in threads:
            while thread.is_alive():
                self.watch_processes()
                thread.join(0.2)
        self.log("load done: every callback, duplicate, cancel and delete sent")

    # -- the end --------------------------------------------------------------------------------

    def settle(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        last = 0.0
        while True:
            self.watch_processes()
            rows = checks.snapshot(self.dsn)
            live = sql(self.dsn, "SELECT count(*) AS n FROM jobs WHERE kind <> 'sweep'")[0]["n"]
            done = sum(
                1
                for o in self.plan.outputs
                if o.task_id in rows and checks.settled(rows[o.task_id])
            )
            if done == len(self.plan.outputs) and live == 0:
                self.log(f"settled: {done} outputs final, no live jobs")
                return True
            if time.monotonic() - last > 10:
                last = time.monotonic()
                states = Counter(checks.outcome_of(r) for r in rows.values())
                self.log(
                    f"waiting: {done}/{len(self.plan.outputs)} final, {live} live jobs",
                    states=dict(states),
                )
            if time.monotonic() > deadline:
                self.log(f"NOT settled after {timeout:g} s: {done} final, {live} live jobs")
                return False
            time.sleep(1.0)

    def lease_check(self) -> Result:
        """A RUNNING job whose lease expired must be reaped by a live worker: one seen twice,
        with the same lease token, two maintenance beats apart, is left behind."""
        first = {(r["id"], r["lease_token"]) for r in checks.expired_leases(self.dsn)}
        time.sleep(2.0)
        second = [
            r for r in checks.expired_leases(self.dsn) if (r["id"], r["lease_token"]) in first
        ]
        return Result(
            "no job RUNNING with an expired lease",
            not second,
            f"{len(first)} seen expired, {len(second)} still there "
            "2 s later (the reaper runs every 0.5 s)",
            second,
        )

    def final_sweep(self) -> tuple[Result, datetime, dict[str, Any]]:
        time.sleep(FINAL_GRACE_SECONDS + 1)
        extra = {
            "AIVEDIO_SWEEPER__ORPHAN_GRACE_SECONDS": str(FINAL_GRACE_SECONDS),
            "AIVEDIO_SWEEPER__MULTIPART_STALE_SECONDS": str(FINAL_GRACE_SECONDS),
        }
        report: dict[str, Any] = {}
        for _ in range(30):
            at = datetime.now(UTC)
            text = self.cli("sweep", "--json", check=False, extra_env=extra)
            with contextlib.suppress(ValueError):
                report = json.loads(text)
            if report.get("outcome") == "swept":
                break
            time.sleep(1)
        counts = report.get("counts", {})
        self.log(
            "aivedio sweep",
            outcome=report.get("outcome"),
            counts={k: v for k, v in counts.items() if v},
        )
        ok = report.get("outcome") == "swept" and not report.get("errors")
        return (
            Result(
                "the final sweep ran every scan",
                ok,
                f"outcome {report.get('outcome')}, errors {report.get('errors') or 0}",
            ),
            at,
            report,
        )

    def stop_fleet(self) -> Result:
        running = [w for w in self.workers.values() if w.alive()]
        if self.api is not None:
            running.append(self.api)
        for proc in running:
            proc.fate = "stopped"
            proc.signal(signal.SIGTERM)
        bad = []
        for proc in running:
            code = proc.reap(DRAIN_TIMEOUT_SECONDS + 15)
            if code != 0:
                bad.append(f"{proc.name}: exit {code}")
                if code is None:
                    proc.signal(signal.SIGKILL)
                    proc.reap(5)
        return Result(
            "the API and the workers stop on SIGTERM with exit 0",
            not bad,
            f"{len(running)} stopped",
            bad,
        )

    def stop_rest(self) -> None:
        self.sampler.stop()
        if self.s3_proc is not None and self.s3_proc.alive():
            # SIGKILLed, not told to stop: the store was checked above and its directory is
            # thrown away by the next run, and a graceful stop of SeaweedFS takes 10-15 s (its
            # filer waits out the S3 gateway's metadata stream), which was this run's tail.
            self.s3_proc.expect_exit()
            self.s3_proc.signal(signal.SIGKILL)
            self.s3_proc.reap(10)
        stop_all([p for p in self.procs if p.alive()], 10)
        if self.pg is not None:
            self.pg.stop()


# -- the report ----------------------------------------------------------------------------------


def fault_table(plan: Plan, per_output: list[dict[str, Any]]) -> list[dict[str, Any]]:
    by_kind: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for item in per_output:
        by_kind[item["kind"]].append(item)
    rows = []
    for kind in KINDS:
        items = by_kind.get(kind.name, [])
        if not items:
            continue
        states = Counter(i["state"] for i in items)
        bad = sum(1 for i in items if not i["ok"])
        rows.append(
            {
                "fault": kind.name,
                "n": len(items),
                "reached": ", ".join(f"{s} {n}" for s, n in states.most_common()),
                "expected": " or ".join(kind.expect),
                "result": "ok" if not bad else f"VIOLATION ({bad})",
            }
        )
    return rows


def print_table(rows: list[dict[str, Any]], columns: list[str]) -> None:
    widths = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in columns}
    out("  " + "  ".join(c.ljust(widths[c]) for c in columns))
    out("  " + "  ".join("-" * widths[c] for c in columns))
    for row in rows:
        out("  " + "  ".join(str(row[c]).ljust(widths[c]) for c in columns))


def run(args: argparse.Namespace) -> int:
    started = time.monotonic()
    runner = Run(args)
    plan = runner.plan
    out(
        f"== aivedio chaos: seed {args.seed}, {args.n} provider outputs, store {args.store}, "
        f"{args.workers} workers"
    )
    results: list[Result] = []
    report: dict[str, Any] = {
        "seed": args.seed,
        "n": args.n,
        "store": args.store,
        "workers": args.workers,
        "started": datetime.now(UTC).isoformat(),
    }
    per_output: list[dict[str, Any]] = []
    exit_code = 1
    try:
        # A server of the run (SeaweedFS, the provider) that exits by itself ends
        # the run at once, as a failure of its own: "the run completed" below.
        with runner.children:
            load = runner.start()
            out()
            out(
                f"== load: {args.n} callbacks over {max(o.send_at for o in plan.outputs):.0f} s; "
                f"{len(plan.chaos.kills)} worker kills, one drain, one PostgreSQL restart, "
                f"one S3 restart (SIGKILL)"
            )
            runner.load_and_chaos(load)
            out()
            out("== waiting for every output to settle")
            settled = runner.settle(args.timeout)
            results.append(
                Result(
                    "everything settled in time",
                    settled,
                    f"within {args.timeout:g} s of the last action",
                )
            )
            results.append(runner.lease_check())
            sweep_result, sweep_at, sweep_report = runner.final_sweep()
            results.append(sweep_result)
            report["sweep"] = {
                "outcome": sweep_report.get("outcome"),
                "counts": sweep_report.get("counts"),
            }
            runner.settle(60)  # whatever the sweep enqueued
            published = sql(runner.dsn, "SELECT id FROM assets WHERE status = 'ENRICHED' LIMIT 10")
            for row in published:
                load.playback(row["id"])
            out()
            out("== stopping the API and the workers (SIGTERM), then checking")
            results.append(runner.stop_fleet())
            killed = {
                str(e["owner"])
                for w in runner.worker_history
                if w.fate == "killed"
                for e in w.events()
                if e.get("event") == "worker_starting"
            }
            per_output, outcome_results = checks.outcomes(plan, runner.dsn, load.records, killed)
            results += outcome_results
            results += checks.uniqueness(runner.dsn)
            results += checks.leftovers(runner.dsn)
            worker_events = [e for w in runner.worker_history for e in w.events()]
            degraded, degraded_result = checks.degradation(runner.dsn, worker_events)
            results.append(degraded_result)
            report["degradation"] = degraded
            results += checks.store_checks(
                runner.dir / "aivedio.toml", runner.dsn, sweep_at, FINAL_GRACE_SECONDS
            )
            drain = runner.drain_result
            results.append(
                Result(
                    "the SIGTERMed worker drained and exited 0",
                    drain.get("exit") == 0,
                    json.dumps(drain),
                )
            )

            def exits_near(at: float | None, seconds: float) -> list[str]:
                if at is None:
                    return []
                return [
                    u
                    for u in runner.unexpected
                    if at - 1 <= float(u.rsplit(" at ", 1)[1].split()[0]) <= at + seconds + 15
                ]

            if runner.pg is not None:
                near = exits_near(runner.pg_result.get("at"), runner.pg_result.get("seconds", 0))
                refused = (
                    f"; {len(runner.startup_refused)} worker(s) still starting "
                    "refused to start (exit 1, restarted)"
                    if runner.startup_refused
                    else ""
                )
                results.append(
                    Result(
                        "PostgreSQL restarted once; the API and workers carried on",
                        bool(runner.pg_result.get("ok")) and not near,
                        json.dumps(runner.pg_result) + refused,
                        near,
                    )
                )
            if args.store == "s3":
                near = exits_near(
                    runner.s3_result.get("at"),
                    runner.s3_result.get("down_seconds", 0)
                    + runner.s3_result.get("start_seconds", 0),
                )
                results.append(
                    Result(
                        "S3 server SIGKILLed and started again; the API and workers carried on",
                        bool(runner.s3_result.get("ok")) and not near,
                        json.dumps(runner.s3_result),
                        near,
                    )
                )
            results.append(
                Result(
                    "no worker or API exited by itself",
                    not runner.unexpected,
                    f"{len(runner.worker_history)} worker processes in all"
                    + (
                        f"; {len(runner.startup_refused)} refused to start during the"
                        " PostgreSQL restart"
                        if runner.startup_refused
                        else ""
                    ),
                    runner.unexpected,
                )
            )
            bound = args.rss_bound_mib * 1024
            over = [
                f"{w.name}: {w.peak_rss_kib / 1024:.0f} MiB"
                for w in runner.worker_history
                if w.peak_rss_kib > bound
            ]
            peak = max((w.peak_rss_kib for w in runner.worker_history), default=0)
            results.append(
                Result(
                    f"every worker's peak RSS under {args.rss_bound_mib} MiB",
                    not over,
                    f"highest {peak / 1024:.0f} MiB over "
                    f"{len(runner.worker_history)} worker processes; API "
                    f"{runner.api.peak_rss_kib / 1024 if runner.api else 0:.0f} MiB",
                    over,
                )
            )
            report["rss_mib"] = {
                w.name: round(w.peak_rss_kib / 1024) for w in runner.worker_history
            }
    except (ChaosError, DemoError, ChildExited) as exc:
        out(f"error: {exc}")
        results.append(Result("the run completed", False, str(exc)))
    finally:
        runner.stop_rest()
    # The logs are complete once everything stopped.
    signatures = (
        set((runner.dir / "signatures.txt").read_text().split())
        if (runner.dir / "signatures.txt").exists()
        else set()
    )
    if "load" in locals():
        signatures |= load.signatures
        tokens = {f"playback token {i}": t for i, t in enumerate(sorted(load.tokens))}
    else:
        tokens = {}
    logs = sorted(runner.logs.glob("*.log"))
    if runner.pg is not None:
        logs.append(runner.pg.log)
    results.append(checks.secrets_in_logs(logs, signatures, {**runner.secrets, **tokens}))

    wall = time.monotonic() - started
    out()
    out(f"== outcomes by fault (seed {args.seed}, N={args.n})")
    table = fault_table(plan, per_output)
    if table:
        print_table(table, ["fault", "n", "reached", "expected", "result"])
    out()
    out("== chaos")
    kills = sum(1 for w in runner.worker_history if w.fate == "killed")
    out(
        f"  workers SIGKILLed and restarted: {kills}; worker processes in all: "
        f"{len(runner.worker_history)}"
    )
    out(f"  drain (SIGTERM): {runner.drain_result or 'not reached'}")
    out(f"  PostgreSQL restart (pg_ctl restart -m fast): {runner.pg_result or 'not reached'}")
    for refused in runner.startup_refused:
        out(f"    a worker still starting refused to start (exit 1; restarted): {refused}")
    out(
        f"  S3 restart (SIGKILL SeaweedFS, start it again on its data): "
        f"{runner.s3_result or 'not reached'}"
    )
    if report.get("degradation"):
        out()
        out("== degradation under backlog ([backlog] of this run's config)")
        print_table(report["degradation"], ["what", "seen", "detail"])
    out()
    out("== invariants")
    rows = [
        {"invariant": r.name, "result": "ok" if r.ok else "VIOLATION", "detail": r.detail}
        for r in results
    ]
    print_table(rows, ["invariant", "result", "detail"])
    failed = [r for r in results if not r.ok]
    for result in failed:
        out(f"\n  VIOLATION: {result.name}")
        for offender in result.offenders[:20]:
            out(f"    {offender}")
    report.update(
        wall_seconds=round(wall, 1),
        faults=table,
        outputs=per_output,
        records=load.records if "load" in locals() else {},
        chaos={
            "events": runner.events,
            "drain": runner.drain_result,
            "pg": runner.pg_result,
            "s3": runner.s3_result,
            "kills": kills,
            "startup_refused": runner.startup_refused,
        },
        invariants=[r.to_json() for r in results],
    )
    path = runner.dir / f"report-{args.seed}-{args.n}.json"
    path.write_text(json.dumps(report, indent=1, default=str))
    out()
    verdict = "every invariant held" if not failed else f"{len(failed)} invariant(s) VIOLATED"
    out(f"== {verdict}; wall {wall:.0f} s; report {path.relative_to(ROOT)}")
    exit_code = 0 if not failed else 1
    return exit_code


def main() -> int:
    parser = argparse.ArgumentParser(prog="scripts/chaos", description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=None, help="the fault plan's seed")
    parser.add_argument("--n", type=int, default=200, help="provider outputs (200)")
    parser.add_argument("--store", choices=("s3", "fs"), default="s3")
    parser.add_argument("--workers", type=int, default=2, help="worker daemons (2)")
    parser.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="seconds to wait for every output to settle (300 + N)",
    )
    parser.add_argument("--rss-bound-mib", type=int, default=600)
    parser.add_argument("--workdir", type=Path, default=ROOT / "var" / "chaos")
    parser.add_argument(
        "--server-dsn",
        default="",
        help="use this PostgreSQL server (not restarted) instead of a cluster",
    )
    args = parser.parse_args()
    if args.seed is None:
        args.seed = int.from_bytes(os.urandom(3), "big")
    if args.timeout is None:
        args.timeout = 300.0 + args.n
    if args.n < 1 or args.workers < 2:
        parser.error("--n must be >= 1 and --workers >= 2")
    args.workdir = args.workdir.resolve()
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    for name in ("NO_PROXY", "no_proxy"):
        os.environ[name] = ",".join(filter(None, [os.environ.get(name), LOOPBACK_NAMES]))
    args.workdir.mkdir(parents=True, exist_ok=True)
    handle: IO[str] = open(args.workdir / ".lock", "a+")  # noqa: SIM115 - held for the run
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        print(f"error: another scripts/chaos is running on {args.workdir}", file=sys.stderr)
        return 1
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    return run(args)


# asyncpg logs this itself (pool.py, _maintain_min_size) with the traceback of the failed
# reconnect, then retries: a warning of a background task, not a crash of the process.
ASYNCPG_FLOOR_WARNING = "Failed to restore the pool connection floor; retrying"


def _unexplained_traceback(lines: list[str]) -> bool:
    """A traceback in the log other than asyncpg's own logged reconnect warning (a block
    right after ``ASYNCPG_FLOOR_WARNING`` ending in an ``asyncpg.exceptions.`` line)."""
    i = 0
    while i < len(lines):
        if "Traceback" not in lines[i]:
            i += 1
            continue
        explained = i > 0 and ASYNCPG_FLOOR_WARNING in lines[i - 1]
        j = i + 1
        while j < len(lines) and (lines[j].startswith((" ", "\t")) or not lines[j].strip()):
            j += 1
        if not (explained and j < len(lines) and lines[j].startswith("asyncpg.exceptions.")):
            return True
        i = j + 1
    return False


if __name__ == "__main__":
    raise SystemExit(main())
