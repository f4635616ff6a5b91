"""The demo itself, run by ``scripts/demo`` once the machine is bootstrapped.

    .venv/bin/python scripts/lib/demo_driver.py --server-dsn DSN [--s3] [--exit] [--timeout S]

What it does, in order (every file under ``var/demo``):

1. a fresh ``aivedio_demo`` database (or ``$AIVEDIO_DEMO_DATABASE``) on the given server
   (dropped and created: each run starts empty), the secrets (made once, kept in ``*.key``
   files, mode 600), the sample media (made with ffmpeg once: an H.264/AAC clip that only
   needs a remux, an HEVC clip that needs a transcode, a portrait clip to upload, and an
   HTML error page named ``.mp4``); a throwaway C2PA signing chain for the provider and one
   for the platform (``aivedio.provenance.throwaway``, made every run), and the two provider
   clips signed as an AI video provider signs them (CREATE, trainedAlgorithmicMedia);
2. the simulated provider (HTTPS on loopback, its own test CA) serving three outputs; with
   ``--s3``, SeaweedFS (a real S3 engine, ``seaweedfs.py``) on loopback and a bucket;
3. ``aivedio.toml``, migrations, tenant ``demo`` and an API key;
4. ``aivedio api`` and two ``aivedio worker`` processes, each in its own session (so Ctrl-C
   reaches only this driver, which stops them in order) with its log in ``var/demo/*.log``;
5. the provider's callbacks, signed to the Standard Webhooks specification (``webhook-id``,
   ``webhook-timestamp``, ``webhook-signature``), one replayed to show it is refused, and one
   upload through ``POST /v1/videos``;
6. waits for every video to settle (ENRICHED, or INVALID_MEDIA for the error page), printing
   each state as it changes, then each video's timeline and Content Credentials (the
   source's manifest verified, the published files signed by the platform with the source
   as their ingredient), the final states, the ``/watch``
   URLs (checked: the page and the HLS master answer 200), and where the logs are;
7. keeps serving until Ctrl-C or SIGTERM (``--exit``: stops at once), then SIGTERMs the API
   and the workers, waits for them to drain, and stops the provider and S3 server.

Exit status: 0 when every video ended as expected, 1 otherwise or on any failure.
Only loopback addresses are ever contacted.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import ctypes
import fcntl
import hashlib
import hmac
import ipaddress
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import IO, Any, NoReturn

import seaweedfs

from aivedio.provenance.throwaway import make_chain

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "var" / "demo"
MEDIA = DEMO / "media"
AIVEDIO = [sys.executable, "-m", "aivedio"]  # the package as installed or on PYTHONPATH

DEFAULT_DATABASE = "aivedio_demo"
# A database name the driver may put in DDL unquoted by anything but its double quotes.
_DATABASE_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")
TENANT = "demo"
PROVIDER = "sim"
BUCKET = "aivedio-demo"
DEFAULT_API_PORT = 8080
LOOPBACK_NAMES = "127.0.0.1,localhost,::1"
WORKERS = 2
POLL_SECONDS = 0.25
START_TIMEOUT_SECONDS = 30.0
# SIGTERM lets a worker finish running jobs for [worker] drain_timeout_seconds (30 s).
STOP_TIMEOUT_SECONDS = 45.0
# After every video settled: how long its remaining (no-op) jobs may take to finish.
LAST_JOBS_SECONDS = 20.0

# Where a video's life ends: it is done, or it will never move again.
FINAL_STATES = frozenset(
    {"ENRICHED", "INVALID_MEDIA", "PROCESSING_FAILED", "REJECTED", "DELETED"}
    | {"INVALID_RESPONSE", "OUTPUT_LOST", "UPLOAD_FAILED", "UPLOAD_EXPIRED"}
)
PUBLISHED = ("ENRICHED", "PLAYABLE")

# -- output ------------------------------------------------------------------------------------


class DemoError(Exception):
    """Something the demo cannot go on without; the message says what and where to look."""


class Stop(Exception):
    """SIGTERM or SIGHUP (Ctrl-C arrives as KeyboardInterrupt): stop everything, in order."""


def out(line: str = "") -> None:
    print(line, flush=True)


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def megabytes(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 100_000 else f"{n} bytes"


# -- the samples -------------------------------------------------------------------------------

LAVFI = ["-f", "lavfi", "-i"]


@dataclass(frozen=True)
class Sample:
    label: str
    file: str
    what: str
    expect: tuple[str, ...]  # acceptable final states, the preferred one first
    uploaded: bool = False  # through POST /v1/videos, not from the provider
    ffmpeg: tuple[str, ...] = ()  # inputs and encoding options; empty: the HOSTILE bytes


SAMPLES = (
    Sample(
        "remux",
        "clip-h264.mp4",
        "H.264/AAC MP4, 6 s 1280x720: needs only a remux",
        PUBLISHED,
        ffmpeg=(
            *LAVFI,
            "testsrc2=size=1280x720:rate=24:duration=6",
            *LAVFI,
            "sine=frequency=440:duration=6",
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
            "128k",
            "-shortest",
            "-movflags",
            "+faststart",
        ),
    ),
    Sample(
        "hevc",
        "clip-hevc.mp4",
        "HEVC/AAC MP4, 5 s 1280x720: needs a transcode",
        PUBLISHED,
        ffmpeg=(
            *LAVFI,
            "testsrc2=size=1280x720:rate=25:duration=5",
            *LAVFI,
            "sine=frequency=660:duration=5",
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
            "128k",
            "-shortest",
            "-movflags",
            "+faststart",
        ),
    ),
    Sample(
        "hostile",
        "error-page.mp4",
        "an HTML error page served as .mp4",
        ("INVALID_MEDIA",),
    ),
    Sample(
        "upload",
        "phone-upload.mp4",
        "portrait H.264/AAC MP4, 5 s 720x1280, from a user",
        PUBLISHED,
        uploaded=True,
        ffmpeg=(
            *LAVFI,
            "testsrc=size=720x1280:rate=30:duration=5",
            *LAVFI,
            "sine=frequency=880:duration=5",
            "-c:v",
            "libx264",
            "-preset",
            "veryfast",
            "-g",
            "60",
            "-pix_fmt",
            "yuv420p",
            "-c:a",
            "aac",
            "-b:a",
            "96k",
            "-shortest",
            "-movflags",
            "+faststart",
        ),
    ),
)

HOSTILE = b"""<!DOCTYPE html>
<html><head><title>502 Bad Gateway</title></head>
<body><h1>502 Bad Gateway</h1><p>upstream render node timed out; please retry</p></body></html>
"""


PROVENANCE = DEMO / "c2pa"


def make_signing_chains(directory: Path = PROVENANCE) -> None:
    """A provider's (``provider/``) and the platform's (``platform/``) throwaway C2PA chains,
    new every run, and the trust anchors (``anchors.pem``: both roots) the platform reads
    and verifies with."""
    provider = make_chain("Example Video Provider (demo)")
    platform = make_chain("aivedio demo platform")
    provider.write(directory / "provider")
    platform.write(directory / "platform")
    (directory / "anchors.pem").write_text(provider.root + platform.root)


def provenance_config(directory: Path = PROVENANCE) -> str:
    """The ``[provenance]`` section that reads with both roots trusted and signs with the
    platform's chain of ``make_signing_chains``."""
    return f"""[provenance]
trust_anchors_file = {toml_str(str(directory / "anchors.pem"))}
certificate_chain_file = {toml_str(str(directory / "platform" / "chain.pem"))}
private_key_file = {toml_str(str(directory / "platform" / "key.pem"))}
"""


def sign_as_provider(unsigned: Path, target: Path, directory: Path = PROVENANCE) -> None:
    """``unsigned`` signed into ``target`` as an AI video provider signs its outputs."""
    import c2pa

    chain = directory / "provider"
    manifest = {
        "claim_generator_info": [{"name": "example-video-provider", "version": "demo"}],
        "title": target.name,
        "format": "video/mp4",
        "assertions": [
            {
                "label": "c2pa.actions",
                "data": {
                    "actions": [
                        {
                            "action": "c2pa.created",
                            "digitalSourceType": "http://cv.iptc.org/newscodes/"
                            "digitalsourcetype/trainedAlgorithmicMedia",
                        }
                    ]
                },
            }
        ],
    }
    info = c2pa.C2paSignerInfo(
        c2pa.C2paSigningAlg.ES256,
        (chain / "chain.pem").read_bytes(),
        (chain / "key.pem").read_bytes(),
        None,
    )
    with c2pa.Signer.from_info(info) as signer:
        builder = c2pa.Builder(manifest)
        builder.set_intent(
            c2pa.C2paBuilderIntent.CREATE, c2pa.C2paDigitalSourceType.TRAINED_ALGORITHMIC_MEDIA
        )
        with unsigned.open("rb") as source, target.open("w+b") as out:
            builder.sign(signer, "video/mp4", source, out)


def make_samples() -> None:
    """Each sample once; remade when its recipe changes (the recipe is kept beside it). The
    provider's MP4 samples are signed again every run, with this run's provider chain."""
    MEDIA.mkdir(parents=True, exist_ok=True)
    make_signing_chains()
    for sample in SAMPLES:
        path = MEDIA / sample.file
        if sample.ffmpeg and not sample.uploaded:
            path = path.with_name(path.stem + ".unsigned.mp4")
        recipe_file = path.with_name(path.name + ".recipe")
        recipe = json.dumps(sample.ffmpeg) if sample.ffmpeg else HOSTILE.decode()
        if path.is_file() and recipe_file.is_file() and recipe_file.read_text() == recipe:
            continue
        if sample.ffmpeg:
            out(f"  making {rel(path)}: {sample.what}")
            argv = ["ffmpeg", "-nostdin", "-v", "error", "-y", *sample.ffmpeg, str(path)]
            done = subprocess.run(argv, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise DemoError(f"ffmpeg could not make {rel(path)}: {done.stderr.strip()}")
        else:
            path.write_bytes(HOSTILE)
        recipe_file.write_text(recipe)
    for sample in SAMPLES:
        if sample.ffmpeg and not sample.uploaded:
            target = MEDIA / sample.file
            sign_as_provider(target.with_name(target.stem + ".unsigned.mp4"), target)


# -- child processes ---------------------------------------------------------------------------


def _die_with_parent() -> None:
    # Runs in the child before exec: SIGTERM it if this driver dies without stopping it.
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class Service:
    """A child process in its own session, its stderr (JSON log events) in ``log``."""

    def __init__(
        self,
        name: str,
        argv: list[str],
        log: Path,
        env: dict[str, str],
        *,
        stdout: Path | None = None,
    ) -> None:
        self.name = name
        self.log = log
        self.stdout = stdout
        self._files: list[IO[bytes]] = [open(log, "wb")]  # noqa: SIM115 - closed in reap()
        if stdout is not None:
            self._files.append(open(stdout, "wb"))  # noqa: SIM115
        self.proc = subprocess.Popen(
            argv,
            env=env,
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=self._files[-1] if stdout is not None else self._files[0],
            stderr=self._files[0],
            start_new_session=True,
            preexec_fn=_die_with_parent,  # the driver runs no threads
        )
        self.exit_code: int | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def events(self) -> Iterator[dict[str, Any]]:
        for line in self.log.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                event = json.loads(line)
                if isinstance(event, dict):
                    yield event

    def tail(self, lines: int = 15) -> str:
        text = self.log.read_text(errors="replace").splitlines()[-lines:]
        return "\n".join("    " + line[:300] for line in text)

    def died(self) -> DemoError:
        return DemoError(
            f"{self.name} exited with status {self.proc.returncode}; the end of "
            f"{rel(self.log)}:\n{self.tail()}"
        )

    def wait_for(self, ready: Callable[[], Any], what: str, timeout: float) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = ready()
            if found:
                return found
            if not self.alive():
                raise self.died()
            time.sleep(0.05)
        raise DemoError(f"{self.name}: no {what} within {timeout:g} s (see {rel(self.log)})")

    def wait_for_event(self, name: str, timeout: float = START_TIMEOUT_SECONDS) -> dict[str, Any]:
        def found() -> dict[str, Any] | None:
            return next((e for e in self.events() if e.get("event") == name), None)

        event: dict[str, Any] = self.wait_for(found, f"{name!r} log event", timeout)
        return event

    def signal(self, signum: int) -> None:
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signum)

    def reap(self, timeout: float) -> int | None:
        try:
            self.exit_code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        for file in self._files:
            file.close()
        return self.exit_code


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def port_is_free(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def choose_api_port() -> tuple[int, str]:
    """AIVEDIO_DEMO_API_PORT when set (busy: an error), else 8080, else any free port."""
    given = os.environ.get("AIVEDIO_DEMO_API_PORT", "").strip()
    if given:
        try:
            port = int(given)
        except ValueError:
            raise DemoError(f"AIVEDIO_DEMO_API_PORT={given!r} is not a port number") from None
        if not port_is_free(port):
            raise DemoError(
                f"port {port} (AIVEDIO_DEMO_API_PORT) is in use on 127.0.0.1: stop what "
                "listens there, or choose another port, or unset it to pick a free one"
            )
        return port, ""
    if port_is_free(DEFAULT_API_PORT):
        return DEFAULT_API_PORT, ""
    port = free_port()
    return port, f" (port {DEFAULT_API_PORT} is in use; set AIVEDIO_DEMO_API_PORT to choose)"


# -- HTTP, to loopback only ----------------------------------------------------------------------

# No proxies: every request of the demo goes to this machine.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@dataclass
class Reply:
    status: int
    headers: Any
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    def detail(self) -> str:
        try:
            error = self.json().get("error", {})
            return f"{self.status} {error.get('code')}: {error.get('detail')}"
        except (ValueError, AttributeError):
            return f"{self.status}: {self.body[:300]!r}"


def loopback_only(url: str) -> None:
    host = urllib.parse.urlsplit(url).hostname or ""
    try:
        ok = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        ok = False
    if not ok:
        raise DemoError(f"refusing to contact {host!r}: the demo talks to loopback only")


def http(
    method: str,
    url: str,
    *,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = 30,
) -> Reply:
    loopback_only(url)
    # loopback_only admits http(s) URLs to this machine only.
    request = urllib.request.Request(url, data=body, method=method, headers=headers or {})  # noqa: S310
    try:
        with _OPENER.open(request, timeout=timeout) as response:
            return Reply(response.status, response.headers, response.read())
    except urllib.error.HTTPError as exc:
        return Reply(exc.code, exc.headers, exc.read())
    except (urllib.error.URLError, OSError) as exc:
        raise DemoError(f"{method} {url.split('?')[0]}: {exc}") from None


class Api:
    def __init__(self, base: str, key: str) -> None:
        self.base = base
        self.key = key

    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}

    def call(self, method: str, path: str, body: Any = None, *, expect: int = 200) -> Any:
        headers = self.auth()
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        reply = http(method, self.base + path, body=data, headers=headers)
        if reply.status != expect:
            raise DemoError(f"{method} {path}: expected {expect}, got {reply.detail()}")
        return reply.json()


# -- set-up ------------------------------------------------------------------------------------


def secret_file(name: str) -> str:
    """Base64 of 32 random bytes, made once and kept in var/demo/NAME (mode 600)."""
    path = DEMO / name
    if not path.is_file() or not path.read_text().strip():
        path.write_text(base64.b64encode(os.urandom(32)).decode() + "\n")
    path.chmod(0o600)
    return path.read_text().strip()


def database_name(environ: Mapping[str, str] = os.environ) -> str:
    """AIVEDIO_DEMO_DATABASE when set, else aivedio_demo: two checkouts that share one
    PostgreSQL each name their own, or each run drops the other's database."""
    name = environ.get("AIVEDIO_DEMO_DATABASE", "").strip() or DEFAULT_DATABASE
    if not _DATABASE_NAME.fullmatch(name):
        raise DemoError(
            f"AIVEDIO_DEMO_DATABASE={name!r}: use lower-case letters, digits and _ "
            "(at most 63, not starting with a digit)"
        )
    return name


def reset_database(server_dsn: str) -> str:
    """Drop and create the demo database (each run starts empty); its DSN."""
    import asyncio

    database = database_name()

    import asyncpg

    async def reset() -> None:
        conn = await asyncpg.connect(server_dsn, timeout=10)
        try:
            users = await conn.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = $1", database
            )
            if users:
                raise DemoError(
                    f"database {database} has {users} open connections: another scripts/demo "
                    "(or a client) is using it; stop it first"
                )
            await conn.execute(f'DROP DATABASE IF EXISTS "{database}"')
            await conn.execute(f'CREATE DATABASE "{database}"')
        finally:
            await conn.close()

    asyncio.run(reset())
    return urllib.parse.urlunsplit(urllib.parse.urlsplit(server_dsn)._replace(path=f"/{database}"))


def toml_str(value: str) -> str:
    return json.dumps(value)  # a JSON string is a valid TOML basic string


def write_config(
    path: Path,
    *,
    dsn: str,
    api_port: int,
    sim: dict[str, Any],
    callback_secret: str,
    s3_endpoint: str | None,
) -> None:
    if s3_endpoint is None:
        storage = f"""[storage]
# The local filesystem store.
url = {toml_str("file://" + str(DEMO / "objects"))}
"""
    else:
        storage = f"""[storage]
# SeaweedFS's S3 gateway on loopback, started by the demo with this identity.
url = "s3://{BUCKET}/demo"
s3_endpoint_url = {toml_str(s3_endpoint)}
s3_access_key_id = {toml_str(seaweedfs.ACCESS_KEY_ID)}
s3_secret_access_key = {toml_str(seaweedfs.SECRET_ACCESS_KEY)}
"""
    text = f"""# Written by scripts/demo for one run (every run rewrites it); for every key and its
# default see config/aivedio.example.toml. The secrets not written here come from the
# environment: AIVEDIO_URL_ENCRYPTION_KEY (var/demo/url.key) and
# AIVEDIO_PLAYBACK_TOKEN_SECRET (var/demo/playback.key).

[database]
url = {toml_str(dsn)}

{storage}
[api]
host = "127.0.0.1"
port = {api_port}
drain_delay_seconds = 0.0  # no balancer to wait for here: stop at once

[worker]
# Each worker's /healthz, /readyz and /metrics on a free port (printed by the demo).
http_port = 0

[log]
format = "json"

[net]
# The provider runs on this machine, so the demo allows loopback and its port explicitly.
# The default policy never does: https on port 443 to public addresses only.
allowed_ports = [{sim["port"]}]
allow_cidrs = ["127.0.0.0/8"]
ca_file = {toml_str(sim["ca_file"])}

[providers.{PROVIDER}]
api_base_url = {toml_str(sim["base_url"])}
# Callbacks are signed (Standard Webhooks) with this secret (var/demo/callback.key); a task first
# seen in a callback belongs to this tenant.
callback_secret = {toml_str(callback_secret)}
tenant = "{TENANT}"

# C2PA: the provider's outputs are read and verified at the probe; what is published is
# signed with the platform's throwaway chain (var/demo/c2pa, made every run). Production
# uses a certificate from a CA on the C2PA trust list, or key_callback for a KMS.
{provenance_config()}
# Development moderation, chosen explicitly: allow everything. Production uses
# backend = "http" with the moderation service's url and auth_header.
[moderation]
backend = "local"
[moderation.local]
allow_all = true
"""
    path.write_text(text)
    path.chmod(0o600)


def run_cli(env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [*AIVEDIO, *args], env=env, cwd=ROOT, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise DemoError(f"aivedio {' '.join(args)} failed ({done.returncode}):\n{done.stderr}")
    return done.stdout


def start_s3(env: dict[str, str]) -> tuple[Service, str]:
    """SeaweedFS on free loopback ports, its data in ``var/demo/seaweedfs`` (empty each run),
    and the demo's bucket."""
    shutil.rmtree(DEMO / "seaweedfs", ignore_errors=True)
    engine = seaweedfs.Engine.create(DEMO / "seaweedfs")
    server = Service("S3 server (SeaweedFS)", engine.argv(), DEMO / "s3.log", env)
    server.wait_for(engine.answers, "answer", START_TIMEOUT_SECONDS)
    engine.ensure_bucket(BUCKET)
    return server, engine.endpoint


# -- the videos ----------------------------------------------------------------------------------


@dataclass
class Video:
    sample: Sample
    task_id: str = ""
    generation_task_id: str | None = None
    video_id: str | None = None  # the asset id (an upload's video id is its asset id)
    state: str = "SENT"
    status: dict[str, Any] = field(default_factory=dict)
    error: str | None = None

    @property
    def settled(self) -> bool:
        return self.state in FINAL_STATES

    @property
    def ok(self) -> bool:
        return self.state in self.sample.expect


def send_callback(base: str, secret: str, task_id: str, output: dict[str, Any]) -> Reply:
    """The provider's SUCCEEDED for one output, signed as Standard Webhooks say: the
    ``webhook-signature`` header carries ``v1,`` and the base64 HMAC-SHA256 of
    ``"{webhook-id}.{webhook-timestamp}.{body}"`` under the secret (its UTF-8 bytes; a
    ``whsec_`` secret's base64 part would be the key); the event id is the task's."""
    described = {k: output[k] for k in ("index", "url", "expires_at", "sha256", "size")}
    described["content_type"] = output.get("content_type", "video/mp4")
    event_id = f"evt-{task_id}"
    body = json.dumps(
        {
            "event_id": event_id,
            "task_id": task_id,
            "status": "SUCCEEDED",
            "outputs": [described],
        },
        separators=(",", ":"),
    ).encode()
    timestamp = str(int(time.time()))
    signed = f"{event_id}.{timestamp}.".encode() + body
    signature = hmac.new(secret.encode(), signed, hashlib.sha256).digest()
    headers = {
        "Content-Type": "application/json",
        "webhook-id": event_id,
        "webhook-timestamp": timestamp,
        "webhook-signature": "v1," + base64.b64encode(signature).decode("ascii"),
    }
    return http("POST", f"{base}/v1/providers/{PROVIDER}/callbacks", body=body, headers=headers)


def upload(api: Api, video: Video) -> None:
    """POST /v1/videos, the bytes where ``upload`` says, then POST .../complete."""
    data = (MEDIA / video.sample.file).read_bytes()
    created = api.call(
        "POST",
        "/v1/videos",
        {
            "size_bytes": len(data),
            "sha256": hashlib.sha256(data).hexdigest(),
            "content_type": "video/mp4",
            "filename": video.sample.file,
        },
        expect=201,
    )
    video.video_id = str(created["video_id"])
    out(
        f"  {video.sample.label:<8} POST /v1/videos ({len(data)} bytes, its SHA-256): 201, "
        f"video {video.video_id}"
    )
    instructions = created["upload"]
    auth = api.auth() if instructions.get("credentials") == "api_key" else {}
    complete: dict[str, Any] | None = None
    if instructions["method"] == "PUT":
        where = instructions["url"]
        reply = http("PUT", where, body=data, headers={**instructions.get("headers", {}), **auth})
        if reply.status not in (200, 201, 204):
            raise DemoError(f"PUT of the upload failed: {reply.detail()}")
        out(f"  {'':<8} PUT {describe_upload_url(where, api.base)}: {reply.status}")
    else:  # MULTIPART: each part to its presigned URL, then complete with the ETags
        parts = []
        offset = 0
        for part in instructions["parts"]:
            chunk = data[offset : offset + part["size_bytes"]]
            offset += len(chunk)
            reply = http("PUT", part["url"], body=chunk, headers=auth)
            if reply.status != 200:
                raise DemoError(f"PUT of part {part['part_number']} failed: {reply.detail()}")
            parts.append({"part_number": part["part_number"], "etag": reply.headers["ETag"]})
        complete = {"parts": parts}
        out(f"  {'':<8} PUT {len(parts)} parts to presigned URLs, straight to S3: 200")
    accepted = api.call("POST", f"/v1/videos/{video.video_id}/complete", complete, expect=202)
    video.state = accepted["state"]
    out(f"  {'':<8} POST /v1/videos/{{id}}/complete: 202 {video.state}")


def describe_upload_url(url: str, api_base: str) -> str:
    if url.startswith(api_base):
        path = url[len(api_base) :].split("?")[0].replace(url.split("/")[-2], "{id}")
        return f"{path} (through the API, with the API key)"
    parts = urllib.parse.urlsplit(url)
    key = parts.path.rsplit("/", 1)[0]
    return f"{parts.scheme}://{parts.netloc}{key}/… (presigned, straight to S3)"


def refresh(api: Api, video: Video) -> None:
    """Where the video is now: its provider output's fetch state until it has an asset,
    then the asset's state and timeline from GET /v1/videos/{id}/status."""
    if video.video_id is None:
        if video.generation_task_id is None:
            return
        task = api.call("GET", f"/v1/generation-tasks/{video.generation_task_id}")
        output = task["outputs"][0]
        video.state = output["fetch_status"]
        if output.get("error_class"):
            video.error = output["error_class"]
        if output["asset_id"] is None:
            return
        video.video_id = str(output["asset_id"])
    video.status = api.call("GET", f"/v1/videos/{video.video_id}/status")
    video.state = video.status["state"]
    if video.status.get("error_class"):
        detail = video.status.get("error_detail") or ""
        video.error = f"{video.status['error_class']}: {detail}".rstrip(": ")


PENDING_JOB_EVENTS = frozenset({"queued", "waiting", "running"})


def pending_jobs(video: Video) -> int:
    return sum(e["event"] in PENDING_JOB_EVENTS for e in video.status.get("timeline", []))


def wait_for_last_jobs(api: Api, videos: list[Video], timeout: float) -> int:
    """Jobs of a settled video may still be due (outputs deferred while one render made them
    all finish as no-ops): wait for them, bounded, so the timelines show how each ended."""
    deadline = time.monotonic() + timeout
    while True:
        for video in videos:
            if video.video_id is not None:
                refresh(api, video)
        pending = sum(pending_jobs(video) for video in videos)
        if not pending or time.monotonic() > deadline:
            return pending
        time.sleep(POLL_SECONDS)


def wait_until_settled(
    api: Api, videos: list[Video], services: list[Service], t0: float, timeout: float
) -> float:
    """Poll until every video is in a final state or ``timeout`` passes; print each change."""
    started = time.monotonic()
    deadline = started + timeout
    last: dict[str, str] = {}
    while True:
        for video in videos:
            if not video.settled:
                refresh(api, video)
            if last.get(video.sample.label) != video.state:
                last[video.sample.label] = video.state
                out(f"  {time.time() - t0:6.1f}s  {video.sample.label:<8} {video.state}")
        if all(video.settled for video in videos) or time.monotonic() > deadline:
            return time.monotonic() - started
        for service in services:
            if not service.alive():
                raise service.died()
        time.sleep(POLL_SECONDS)


# -- the report --------------------------------------------------------------------------------


def at(value: str) -> float:
    return datetime.fromisoformat(value).timestamp()


def timeline_line(entry: dict[str, Any], t0: float) -> str:
    notes: list[str] = []
    if entry.get("finished_at"):
        notes.append(f"{at(entry['finished_at']) - at(entry['at']):.2f} s")
    elif isinstance(entry.get("seconds"), int | float):  # a phase of a job: how long it took
        notes.append(f"{entry['seconds']:.2f} s")
    if entry.get("bytes"):
        notes.append(megabytes(int(entry["bytes"])))
    if entry.get("http_status"):
        notes.append(f"HTTP {entry['http_status']}")
    if entry.get("attempts", 0) > 1:
        notes.append(f"{entry['attempts']} attempts")
    if entry.get("revision") is not None:
        notes.append(f"revision {entry['revision']}: {', '.join(entry.get('outputs') or [])}")
    if entry.get("error_class"):
        notes.append(f"[{entry['error_class']}]")
    return (
        f"  {at(entry['at']) - t0:+7.2f}s  {entry['stage']:<29} {entry['event']:<16} "
        + "  ".join(notes)
    ).rstrip()


def describe_media(env: dict[str, str], video: Video) -> str:
    """The source as probed and the plan chosen for it (``aivedio assets show``)."""
    if video.video_id is None:
        return ""
    asset = json.loads(run_cli(env, "assets", "show", video.video_id, "--json"))
    if not asset.get("video_codec"):
        return ""
    codecs = "/".join(filter(None, [asset["video_codec"], asset.get("audio_codec")]))
    seconds = (asset.get("duration_us") or 0) / 1e6
    size = megabytes(asset.get("source_size_bytes") or 0)
    modes = ", ".join(sorted({r["mode"] for r in asset["revisions"] if r.get("mode")})) or "-"
    return (
        f"source {codecs} {asset['width']}x{asset['height']} {seconds:.1f} s, {size}; plan {modes}"
    )


def credentials_line(found: dict[str, Any] | None) -> str:
    """The video's C2PA chain as the status API gives it: the source's manifest (verified?
    by whom? AI-generated?) and the platform's signing of what was published."""
    if not found:
        return ""
    source = found.get("source") or {}
    if not source.get("present"):
        parts = ["source unsigned"]
    else:
        parts = [f"source manifest {source.get('state')}, signed by {source.get('signer_subject')}"]
        if found.get("ai_generated"):
            parts.append(f"AI-generated ({source.get('digital_source_type')})")
    outputs = found.get("outputs") or {}
    signed = sorted(name for name, o in outputs.items() if o.get("signed"))
    kept = sorted(name for name, o in outputs.items() if o.get("parent_manifest"))
    if signed:
        parts.append(f"published {', '.join(signed)} signed by {found.get('platform_signer')}")
    if kept:
        parts.append(f"source manifest kept as ingredient of {', '.join(kept)}")
    return "; ".join(parts)


def report(api: Api, env: dict[str, str], videos: list[Video], t0: float) -> bool:
    out()
    out("== timelines (seconds since the first callback; from GET /v1/videos/ID/status)")
    for video in videos:
        out()
        source = "upload" if video.sample.uploaded else f"provider task {video.task_id}"
        out(f"{video.sample.label}: video {video.video_id or '-'} ({source}), {video.state}")
        media = describe_media(env, video)
        if media:
            out(f"  {media}")
        for entry in video.status.get("timeline", []):
            out(timeline_line(entry, t0))
        credentials = credentials_line(video.status.get("content_credentials"))
        if credentials:
            out(f"  content credentials: {credentials}")
        if video.error:
            out(f"  error: {video.error}")
    out()
    out("== final states")
    out(f"  {'sample':<8} {'video':<36}  {'state':<14} {'expected':<22} result")
    every_ok = True
    for video in videos:
        expected = " or ".join(video.sample.expect)
        if video.ok and video.state != video.sample.expect[0]:
            verdict = f"ok ({video.sample.expect[0]} not reached in time)"
        else:
            verdict = "ok" if video.ok else "UNEXPECTED"
        every_ok &= video.ok
        out(
            f"  {video.sample.label:<8} {video.video_id or '-':<36}  {video.state:<14} "
            f"{expected:<22} {verdict}"
        )
    return every_ok


def watch_urls(api: Api, videos: list[Video]) -> None:
    out()
    out("== watch (each URL carries a playback token valid for 1 h; open it in a browser here)")
    for video in videos:
        if video.state not in PUBLISHED:
            continue
        playback = api.call("GET", f"/v1/videos/{video.video_id}/playback")
        out(f"  {video.sample.label:<8} {playback['watch_url']}")
        checks = []
        page = http("GET", playback["watch_url"])
        checks.append(f"/watch page {page.status}")
        if playback.get("master_playlist"):
            master = http("GET", playback["master_playlist"])
            renditions = master.body.count(b"#EXT-X-STREAM-INF")
            checks.append(f"HLS master {master.status} ({renditions} renditions)")
        if playback.get("mp4"):
            mp4 = http("GET", playback["mp4"], headers={"Range": "bytes=0-1023"})
            checks.append(f"MP4 {mp4.status}")
        out(f"  {'':<8} checked: {', '.join(checks)}")


# -- stopping ------------------------------------------------------------------------------------


def stop(services: list[Service]) -> bool:
    """SIGTERM the API and the workers together, wait for them to drain, then the rest.
    A second Ctrl-C sends SIGTERM again, which makes a worker skip its drain wait."""
    running = [s for s in services if s.alive()]
    if not running:
        return True
    out()
    out("== stopping: SIGTERM to each process; the API and the workers drain first")

    def again(_signum: int, _frame: Any) -> None:
        out("  (again: skipping the drain wait)")
        for service in services:
            service.signal(signal.SIGTERM)

    signal.signal(signal.SIGINT, again)
    signal.signal(signal.SIGTERM, again)
    clean = True
    first = [s for s in running if s.name.startswith(("API", "worker"))]
    rest = [s for s in running if s not in first]
    for group in (first, rest):
        for service in group:
            service.signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_SECONDS
        for service in group:
            code = service.reap(max(0.1, deadline - time.monotonic()))
            if code is None:
                service.signal(signal.SIGKILL)
                code = service.reap(5)
                out(f"  {service.name:<21} did not stop in time: killed")
                clean = False
            elif service in rest:  # the provider and S3 server have no drain to wait for
                out(f"  {service.name:<21} stopped")
            else:
                out(f"  {service.name:<21} exited {code}{'' if code == 0 else ' (FAILED)'}")
                clean &= code == 0
    return clean


# -- main --------------------------------------------------------------------------------------


def child_env(secrets: dict[str, str]) -> dict[str, str]:
    """This environment without any AIVEDIO_* (the demo's file decides), plus its secrets."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIVEDIO_")}
    env.update(secrets)
    env["AIVEDIO_CONFIG"] = str(DEMO / "aivedio.toml")
    env["AWS_EC2_METADATA_DISABLED"] = "true"
    return env


def lock() -> IO[str]:
    DEMO.mkdir(parents=True, exist_ok=True)
    handle = open(DEMO / ".lock", "a+")  # noqa: SIM115 - held for the whole run
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise DemoError(
            f"another scripts/demo is running in this checkout ({rel(DEMO)} is locked)"
        ) from None
    return handle


def jobs_succeeded(port: int) -> int:
    """The jobs one worker completed, from its /metrics (aivedio_jobs_succeeded_total)."""
    text = http("GET", f"http://127.0.0.1:{port}/metrics").body.decode()
    return round(
        sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("aivedio_jobs_succeeded_total{")
        )
    )


def on_sigterm(_signum: int, _frame: Any) -> NoReturn:
    raise Stop


@dataclass
class Stack:
    """What runs for the demo, once it all answers."""

    env: dict[str, str]
    api: Api
    api_proc: Service
    workers: list[Service]
    metrics_ports: list[int]
    callback_secret: str
    outputs: dict[str, dict[str, Any]]  # the provider's outputs by task id


def start(args: argparse.Namespace, videos: list[Video], services: list[Service]) -> Stack:
    """A fresh database, secrets, samples; the provider (and S3), configuration, tenant and
    key; the API and the workers, each waited for until it answers."""
    api_port, port_note = choose_api_port()
    dsn = reset_database(args.server_dsn)
    env = child_env(
        {
            "AIVEDIO_URL_ENCRYPTION_KEY": secret_file("url.key"),
            "AIVEDIO_PLAYBACK_TOKEN_SECRET": secret_file("playback.key"),
        }
    )
    callback_secret = secret_file("callback.key")
    shutil.rmtree(DEMO / "objects", ignore_errors=True)
    for log in DEMO.glob("*.log"):
        log.unlink()
    make_samples()

    specs = [f"--file={v.task_id}:0:{MEDIA / v.sample.file}" for v in videos if v.task_id]
    sim = Service(
        "provider (sim)",
        [sys.executable, "-m", "aivedio.sim", "--ca-dir", str(DEMO / "ca"), *specs],
        DEMO / "sim.log",
        env,
        stdout=DEMO / "sim.json",
    )
    services.append(sim)
    provider = json.loads(
        sim.wait_for(
            lambda: sim.stdout and sim.stdout.read_text().strip(),
            "JSON line",
            START_TIMEOUT_SECONDS,
        )
    )
    s3_endpoint = None
    if args.s3:
        s3_server, s3_endpoint = start_s3(env)
        services.append(s3_server)

    write_config(
        DEMO / "aivedio.toml",
        dsn=dsn,
        api_port=api_port,
        sim=provider,
        callback_secret=callback_secret,
        s3_endpoint=s3_endpoint,
    )
    run_cli(env, "migrate")
    run_cli(env, "tenants", "create", TENANT)
    key = json.loads(run_cli(env, "keys", "create", "--tenant", TENANT))["key"]
    (DEMO / "api.key").write_text(key + "\n")
    (DEMO / "api.key").chmod(0o600)

    api_proc = Service("API", [*AIVEDIO, "api"], DEMO / "api.log", env)
    services.append(api_proc)
    base = f"http://127.0.0.1:{api_port}"
    api_proc.wait_for_event("api_listening")
    api_proc.wait_for(
        lambda: http("GET", f"{base}/readyz", timeout=2).status == 200,
        "200 from /readyz",
        START_TIMEOUT_SECONDS,
    )
    workers = []
    for n in range(1, WORKERS + 1):
        workers.append(Service(f"worker {n}", [*AIVEDIO, "worker"], DEMO / f"worker-{n}.log", env))
        services.append(workers[-1])
    ports = [int(w.wait_for_event("http_listening")["port"]) for w in workers]

    out(f"  provider  {provider['base_url']}  (simulated, HTTPS with its own test CA)")
    if s3_endpoint:
        out(f"  S3        {s3_endpoint}  bucket {BUCKET}  (SeaweedFS)")
    out(f"  API       {base}  pid {api_proc.pid}{port_note}")
    for worker, port in zip(workers, ports, strict=True):
        out(f"  {worker.name}  http://127.0.0.1:{port}/metrics  pid {worker.pid}")
    out(f"  config    {rel(DEMO / 'aivedio.toml')}")
    return Stack(
        env=env,
        api=Api(base, key),
        api_proc=api_proc,
        workers=workers,
        metrics_ports=ports,
        callback_secret=callback_secret,
        outputs={o["task_id"]: o for o in provider["outputs"]},
    )


def provider_calls_back(stack: Stack, videos: list[Video]) -> None:
    """One signed SUCCEEDED callback per provider task, then the first one again."""
    base, secret = stack.api.base, stack.callback_secret
    for video in videos:
        if video.sample.uploaded:
            continue
        output = stack.outputs[video.task_id]
        reply = send_callback(base, secret, video.task_id, output)
        if reply.status != 202:
            raise DemoError(f"callback for {video.task_id}: expected 202, got {reply.detail()}")
        accepted = reply.json()
        video.generation_task_id = accepted["generation_task_id"]
        video.state = accepted["outputs"][0]["fetch_status"]
        out(
            f"  {video.sample.label:<8} task {video.task_id}: {video.sample.what}"
            f" ({megabytes(output['size'])}): 202 {video.state}"
        )
    first = videos[0]
    replay = send_callback(base, secret, first.task_id, stack.outputs[first.task_id])
    out(f"  {first.sample.label:<8} the same callback again (same event id): {replay.detail()}")


def summary(stack: Stack, videos: list[Video], waited: float, settled: bool, left: int) -> bool:
    """Dead jobs, processes, jobs per worker, where to look next; True if nothing crashed."""
    dead = run_cli(stack.env, "jobs", "list", "--status", "dead", "--json").splitlines()
    alive = all(s.alive() for s in [stack.api_proc, *stack.workers])
    done = [jobs_succeeded(port) for port in stack.metrics_ports]
    how = f"settled in {waited:.1f} s" if settled else f"NOT all settled in {waited:.0f} s"
    out()
    out(
        f"== summary: {how}; dead jobs: {len(dead)}; the API and both "
        f"workers {'ran throughout' if alive else 'did NOT all keep running'}"
    )
    if left and settled:
        out(f"  ({left} jobs still queued after {LAST_JOBS_SECONDS:g} s: shown as waiting)")
    out(
        "  jobs done  "
        + ", ".join(f"{w.name}: {n}" for w, n in zip(stack.workers, done, strict=True))
    )
    logs = [DEMO / "sim.log", DEMO / "s3.log", stack.api_proc.log, *(w.log for w in stack.workers)]
    out(f"  logs       {', '.join(rel(log) for log in logs if log.exists())}")
    key, first = rel(DEMO / "api.key"), videos[0].video_id
    out(
        f'  API key    {key}, e.g. curl -H "Authorization: Bearer $(cat {key})" '
        f"{stack.api.base}/v1/videos/{first}/status"
    )
    out(
        f"  operator   AIVEDIO_CONFIG={rel(DEMO / 'aivedio.toml')} .venv/bin/aivedio status {first}"
    )
    return alive and not dead


def demo(args: argparse.Namespace, services: list[Service]) -> int:
    mode = "S3 (SeaweedFS)" if args.s3 else "the local filesystem"
    out(f"== aivedio demo: store {mode}, PostgreSQL database {database_name()}")
    run = time.strftime("%H%M%S")
    videos = [Video(sample) for sample in SAMPLES]
    for video in videos:
        if not video.sample.uploaded:
            video.task_id = f"{video.sample.label}-{run}"
    stack = start(args, videos, services)

    out()
    out(f"== the provider calls back: POST /v1/providers/{PROVIDER}/callbacks (Standard Webhooks)")
    t0 = time.time()
    provider_calls_back(stack, videos)
    out()
    out("== a user uploads a video: POST /v1/videos, the bytes, POST /v1/videos/ID/complete")
    for video in videos:
        if video.sample.uploaded:
            upload(stack.api, video)

    out()
    out(f"== waiting for every video to settle (at most {args.timeout:g} s)")
    waited = wait_until_settled(
        stack.api, videos, [stack.api_proc, *stack.workers], t0, args.timeout
    )
    settled = all(video.settled for video in videos)
    # Settled: give their last jobs a moment. Not: report them as they are now.
    left = wait_for_last_jobs(stack.api, videos, LAST_JOBS_SECONDS if settled else 0)
    every_ok = report(stack.api, stack.env, videos, t0)
    watch_urls(stack.api, videos)
    every_ok &= summary(stack, videos, waited, settled, left)
    if args.exit:
        out(
            "== every video ended as expected"
            if every_ok
            else "== some videos did NOT end as expected (see the final states above)"
        )
        return 0 if every_ok else 1
    out()
    out("== serving until Ctrl-C (then the workers drain and everything stops)")
    while True:
        for service in services:
            if not service.alive():
                raise service.died()
        time.sleep(1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server-dsn", required=True, help="a PostgreSQL server to use")
    parser.add_argument("--s3", action="store_true", help="store in SeaweedFS's S3 gateway")
    parser.add_argument("--exit", action="store_true", help="stop after the summary")
    parser.add_argument("--timeout", type=float, default=120, help="seconds to wait (120)")
    args = parser.parse_args()
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    # The driver's own requests (urllib is told no proxies; boto3 reads these) stay local.
    for name in ("NO_PROXY", "no_proxy"):
        os.environ[name] = ",".join(filter(None, [os.environ.get(name), LOOPBACK_NAMES]))
    # Explicitly: a shell that started this in the background may have left SIGINT ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, on_sigterm)
    signal.signal(signal.SIGHUP, on_sigterm)
    services: list[Service] = []
    status = 1
    try:
        held = lock()
    except DemoError as exc:
        out(f"error: {exc}")
        return 1
    try:
        status = demo(args, services)
    except (KeyboardInterrupt, Stop):
        status = 130 if args.exit else 0
    except DemoError as exc:
        out(f"error: {exc}")
    finally:
        if not stop(services):
            status = status or 1
        held.close()
    out("== stopped")
    return status


if __name__ == "__main__":
    raise SystemExit(main())
