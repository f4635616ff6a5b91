"""The load: one thread per provider output (its callback, then its duplicate, cancel or
delete at the planned moment), and the calls they make. Loopback only.

A callback is retried like a provider would retry it: on a refused connection or a 5xx
(the API is up but PostgreSQL is restarting) with the same event id, so a retry after a
delivery whose answer was lost is refused 409 and that counts as delivered.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import subprocess
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from demo_driver import DemoError, Reply, http

from chaos.plan import Output
from chaos.stack import AIVEDIO, ROOT, sql

PROVIDER = "sim"
RETRY_SECONDS = 120.0


@dataclass
class Load:
    """What every output thread needs, and what they record (by task id)."""

    api_base: str
    api_key: str
    callback_secret: str
    provider_base: str
    signing_key: bytes
    files: dict[str, dict[str, Any]]
    env: dict[str, str]
    dsn: str
    t0: float
    records: dict[str, dict[str, Any]] = field(default_factory=dict)
    signatures: set[str] = field(default_factory=set)
    tokens: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def note(self, task_id: str, **values: Any) -> None:
        with self.lock:
            self.records.setdefault(task_id, {}).update(values)

    # -- the provider's side -------------------------------------------------------------------

    def signed_url(self, task_id: str, ttl: float) -> tuple[str, int]:
        """The simulator's URL scheme (``/files/{task}/{index}?exp=&sig=``) for index 0."""
        exp = int(time.time() + ttl) + (1 if ttl >= 0 else 0)
        sig = hmac.new(self.signing_key, f"{task_id}/0/{exp}".encode(), hashlib.sha256)
        with self.lock:
            self.signatures.add(sig.hexdigest())
        return f"{self.provider_base}/files/{task_id}/0?exp={exp}&sig={sig.hexdigest()}", exp

    def callback(self, output: Output, event_id: str, *, retry: bool = True) -> Reply:
        url, exp = self.signed_url(output.task_id, output.callback_ttl)
        described = {
            "index": 0,
            "url": url,
            "expires_at": datetime.fromtimestamp(exp, UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            **self.files[output.fault.source],
            "content_type": "video/mp4",
        }
        body = json.dumps(
            {
                "event_id": event_id,
                "task_id": output.task_id,
                "status": "SUCCEEDED",
                "outputs": [described],
            },
            separators=(",", ":"),
        ).encode()
        deadline = time.monotonic() + RETRY_SECONDS
        while True:
            # The legacy scheme on purpose: the demo and the simulator send Standard
            # Webhooks, so the chaos load keeps the older senders' path under failure too.
            timestamp = str(int(time.time()))
            mac = hmac.new(
                self.callback_secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256
            )
            headers = {
                "Content-Type": "application/json",
                "X-Aivedio-Timestamp": timestamp,
                "X-Aivedio-Signature": "sha256=" + mac.hexdigest(),
            }
            try:
                reply = http(
                    "POST",
                    f"{self.api_base}/v1/providers/{PROVIDER}/callbacks",
                    body=body,
                    headers=headers,
                    timeout=30,
                )
            except DemoError:
                reply = Reply(0, {}, b"connection failed")
            if not retry or reply.status in (202, 409) or 400 <= reply.status < 500:
                return reply
            if time.monotonic() > deadline:
                return reply
            time.sleep(1.0)

    # -- the user's and operator's side ----------------------------------------------------------

    def asset_of(self, task_id: str) -> Any:
        rows = sql(
            self.dsn,
            "SELECT a.id, a.status FROM assets a JOIN provider_outputs o ON"
            " a.source_provider_output_id = o.id WHERE o.provider_task_id = $1",
            task_id,
        )
        return rows[0] if rows else None

    def delete(self, asset_id: Any) -> dict[str, Any]:
        deadline = time.monotonic() + RETRY_SECONDS
        t_start = time.time()
        while True:
            try:
                reply = http(
                    "DELETE",
                    f"{self.api_base}/v1/assets/{asset_id}",
                    headers={"Authorization": f"Bearer {self.api_key}"},
                )
            except DemoError:
                reply = Reply(0, {}, b"connection failed")
            if reply.status == 200 or time.monotonic() > deadline:
                return {
                    "ok": reply.status == 200,
                    "status": reply.status,
                    "t_start": t_start,
                    "t_end": time.time(),
                    "answer": reply.body[:200].decode("utf-8", "replace"),
                }
            time.sleep(1.0)

    def cancel(self, task_id: str) -> dict[str, Any]:
        deadline = time.monotonic() + RETRY_SECONDS
        t_start = time.time()
        while True:
            done = subprocess.run(
                [*AIVEDIO, "cancel", "--provider", PROVIDER, "--task-id", task_id],
                env=self.env,
                cwd=ROOT,
                capture_output=True,
                text=True,
                check=False,
            )
            if done.returncode == 0 or time.monotonic() > deadline:
                answer: Any = done.stdout.strip()
                with contextlib.suppress(ValueError):
                    answer = json.loads(answer)
                return {
                    "ok": done.returncode == 0,
                    "exit": done.returncode,
                    "t_start": t_start,
                    "t_end": time.time(),
                    "answer": answer,
                    "stderr": done.stderr.strip()[-300:] if done.returncode else "",
                }
            time.sleep(1.0)

    def playback(self, asset_id: Any) -> None:
        """A playback token for a published asset (kept for the log check), and its master."""
        try:
            reply = http(
                "GET",
                f"{self.api_base}/v1/videos/{asset_id}/playback",
                headers={"Authorization": f"Bearer {self.api_key}"},
            )
            if reply.status != 200:
                return
            answer = reply.json()
            for value in answer.values():
                if isinstance(value, str) and "/media/" in value:
                    with self.lock:
                        self.tokens.add(value.split("/media/")[1].split("/")[0])
            if answer.get("master_playlist"):
                http("GET", answer["master_playlist"])
        except (DemoError, ValueError):
            pass

    # -- one output's life -------------------------------------------------------------------------

    def run(self, output: Output) -> None:
        try:
            self._run(output)
        except Exception as exc:  # recorded, reported as a failed action
            self.note(output.task_id, error=f"{type(exc).__name__}: {exc}")

    def _run(self, output: Output) -> None:
        time.sleep(max(0.0, self.t0 + output.send_at - time.time()))
        event_id = f"evt-{output.task_id}"
        reply = self.callback(output, event_id)
        self.note(output.task_id, callback=reply.status, callback_at=time.time() - self.t0)
        if reply.status not in (202, 409):
            self.note(output.task_id, callback_detail=reply.body[:300].decode("utf-8", "replace"))
            return
        kind = output.kind
        if kind == "duplicate_same_event":
            time.sleep(output.delay)
            again = self.callback(output, event_id, retry=True)
            self.note(output.task_id, duplicate={"status": again.status, "expect": 409})
        elif kind == "duplicate_new_event":
            time.sleep(output.delay)
            again = self.callback(output, event_id + "-again", retry=True)
            self.note(output.task_id, duplicate={"status": again.status, "expect": 202})
        elif kind == "cancel":
            time.sleep(output.delay)
            before = self.asset_of(output.task_id)
            done = self.cancel(output.task_id)
            done["asset_before"] = before["status"] if before else None
            self.note(output.task_id, cancel=done)
        elif kind == "delete":
            deadline = time.monotonic() + RETRY_SECONDS
            asset = self.asset_of(output.task_id)
            while asset is None and time.monotonic() < deadline:
                time.sleep(0.3)
                asset = self.asset_of(output.task_id)
            if asset is None:
                self.note(output.task_id, delete={"ok": False, "why": "no asset to delete"})
                return
            time.sleep(output.delay)
            asset = self.asset_of(output.task_id)
            done = self.delete(asset["id"])
            done["asset_before"] = asset["status"]
            self.note(output.task_id, delete=done)
