"""``aivedio status (ASSET_ID | --task ID | --provider-output ID) [--json] [--follow]``.

One answer to "where is it and what happened": the asset's state and current revision, each
variant of that revision (type, object key, size, SHA-256), and the timeline of its stages
(fetch attempts, jobs with their outcome and error class, releases), oldest first. With
``--task``, one such object per output of the generation task; an output that has no asset
yet (still fetching, or lost) is shown by its fetch state, URL expiry and attempts.

``--follow`` prints that, then every new timeline entry, every change of the render's
``progress`` (a percentage: ``aivedio.progress``, the API's status and event stream carry
the same number) and every state change (of the
asset, its provider output and their generation task) as it happens, until everything
followed is final (an asset ENRICHED, REJECTED, INVALID_MEDIA, PROCESSING_FAILED or
DELETED; an output OUTPUT_LOST or INVALID_RESPONSE before any asset existed): exit 0.
Ctrl-C ends it quietly with exit 130.

How it keeps up: state changes are written to ``stage_events`` by triggers (migration 0007),
which ``NOTIFY aivedio_stage_events`` with the changed row's id at commit. The command holds
one LISTEN connection and re-reads when a row it follows changes, and on a timer anyway
(``--interval``): a notification lost to a reconnect delays a line, never loses it, and job
progress inside a state (a render finishing) is not notified at all. Every re-read is a
fresh snapshot; lines already printed are recognised by their content (timeline entries) or
their event id (state changes), so nothing is printed twice and nothing depends on the
order in which concurrent transactions commit.
"""

from __future__ import annotations

import argparse
import json
import signal
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from typing import Any, Literal

import anyio

from aivedio.cli.common import (
    EXIT_INTERRUPTED,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_USAGE,
    print_json,
    table,
)
from aivedio.config.load import Config, DatabaseConfig
from aivedio.pipeline.media.credentials import content_credentials
from aivedio.store import listening, status_reads
from aivedio.store.asset_status import (
    FINAL_ASSET_STATES,
    FINAL_OUTPUT_STATES_WITHOUT_ASSET,
    asset_status,
    output_status,
)
from aivedio.store.database import Pool, map_db_errors, open_pool
from aivedio.store.stage_events import NOTIFY_CHANNEL
from aivedio.supervision import Loop

# Re-read this often even without a notification (job progress is never notified).
DEFAULT_INTERVAL_SECONDS = 2.0
# After the LISTEN connection is lost, try to open a new one at most this often.
RELISTEN_SECONDS = 10.0
# A generation task in these states has no outputs to come.
_TASK_DONE = frozenset({"PROVIDER_SUCCEEDED", "PROVIDER_FAILED", "CANCELLED"})
# States whose row's last error class is worth printing with the state change (a row moving
# out of a retry still carries its previous error, which would read like a failure).
_STATES_WITH_ERROR = frozenset(
    {
        "RETRY_WAIT",
        "NEED_URL_REFRESH",
        "INVALID_RESPONSE",
        "OUTPUT_LOST",
        "REJECTED",
        "PROCESSING_FAILED",
        "INVALID_MEDIA",
        "DELETED",
    }
)
_ENTITY_LABEL = {"generation_task": "task", "provider_output": "output", "asset": "asset"}

Write = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class Target:
    """What was asked for: an asset id, a provider output id, or a task id (the provider's
    task id, or the generation task's own UUID). For a task, ``tasks`` holds the generation
    tasks it names as (id, provider, provider task id), found once by ``resolve``."""

    kind: Literal["asset", "output", "task"]
    value: str
    tasks: tuple[tuple[uuid.UUID, str, str], ...] = ()


async def resolve(pool: Pool, target: Target) -> Target:
    """The target with its generation tasks looked up (a task id only)."""
    if target.kind != "task":
        return target
    try:
        as_uuid: uuid.UUID | None = uuid.UUID(target.value)
    except ValueError:
        as_uuid = None
    rows = await status_reads.tasks_named(pool, target.value, as_uuid)
    found = tuple((r["id"], r["provider"], r["provider_task_id"]) for r in rows)
    return Target(target.kind, target.value, found)


@dataclass(slots=True)
class Snapshot:
    """Everything followed, read once: one status per output (or the asset alone), the
    generation tasks' states, and the ids whose changes are notified."""

    items: list[dict[str, Any]]
    tasks: dict[uuid.UUID, str]
    keys: set[str] = field(default_factory=set)

    def final(self) -> bool:
        if not self.items:
            # A task that failed or was cancelled before it had any output is over.
            return bool(self.tasks) and all(
                s in ("PROVIDER_FAILED", "CANCELLED") for s in self.tasks.values()
            )
        if any(state not in _TASK_DONE for state in self.tasks.values()):
            return False  # more outputs may come
        return all(_item_final(item) for item in self.items)


def _item_final(item: dict[str, Any]) -> bool:
    if "current_revision" in item:  # an asset's status
        return item["state"] in FINAL_ASSET_STATES
    return item["asset_id"] is None and item["state"] in FINAL_OUTPUT_STATES_WITHOUT_ASSET


# -- reading ------------------------------------------------------------------------------------


async def _outputs(pool: Pool, target: Target) -> list[tuple[uuid.UUID, uuid.UUID | None]]:
    """(output id, asset id or None) for each output the target names, in output order."""
    if target.kind == "output":
        rows = await status_reads.output_with_asset(pool, uuid.UUID(target.value))
    else:
        rows = []
        for _, provider, provider_task_id in target.tasks:
            rows.extend(
                await status_reads.task_outputs_with_assets(pool, provider, provider_task_id)
            )
    return [(r["id"], r["asset_id"]) for r in rows]


async def read_snapshot(pool: Pool, target: Target) -> Snapshot:
    """The target's statuses now (no items when nothing by that id exists). A task target
    must have been through ``resolve``."""
    items: list[dict[str, Any]] = []
    with map_db_errors("reading the status"):
        if target.kind == "asset":
            status = await asset_status(pool, uuid.UUID(target.value))
            items = [status] if status else []
        else:
            for output_id, asset_id in await _outputs(pool, target):
                found = (
                    await asset_status(pool, asset_id)
                    if asset_id is not None
                    else await output_status(pool, output_id)
                )
                if found is not None:
                    items.append(found)
        if target.kind == "task":
            task_rows = await status_reads.task_states(pool, [t[0] for t in target.tasks])
        else:
            task_rows = await status_reads.task_states_of_outputs(
                pool,
                [uuid.UUID(i["provider_output_id"]) for i in items if i.get("provider_output_id")],
            )
    snapshot = Snapshot(items, {r["id"]: r["provider_status"] for r in task_rows})
    for item in items:
        snapshot.keys.update(
            str(v) for v in (item.get("asset_id"), item.get("provider_output_id")) if v
        )
    snapshot.keys.update(str(t) for t in snapshot.tasks)
    return snapshot


async def read_state_changes(pool: Pool, snapshot: Snapshot) -> list[dict[str, Any]]:
    """Every stage event of the followed rows, in id order (a handful per asset)."""
    assets = [uuid.UUID(i["asset_id"]) for i in snapshot.items if i.get("asset_id")]
    outputs = [
        uuid.UUID(i["provider_output_id"]) for i in snapshot.items if i.get("provider_output_id")
    ]
    rows = await status_reads.stage_events_of(pool, assets, outputs, list(snapshot.tasks))
    return [dict(r.items()) for r in rows]


# -- printing -----------------------------------------------------------------------------------


def _at(value: Any) -> str:
    return value.isoformat() if isinstance(value, datetime) else str(value or "")


def _entry_line(entry: dict[str, Any]) -> str:
    error = f"  [{entry['error_class']}]" if entry.get("error_class") else ""
    took = f"  {entry['seconds']:.3f} s" if isinstance(entry.get("seconds"), int | float) else ""
    return f"  {_at(entry['at'])}  {entry['stage']:<18} {entry['event']}{took}{error}"


def _asset_text(status: dict[str, Any]) -> str:
    lines = [
        f"asset {status['asset_id']}: {status['state']}, current revision "
        f"{status['current_revision']}, moderation {status['moderation']}"
        + (f", {status['error_class']}: {status['error_detail']}" if status["error_class"] else "")
        + (f", progress {status['progress']:g}%" if status.get("progress") is not None else "")
    ]
    if status["variants"]:
        rows = [{**v, "sha256": f"{v['sha256'][:16]}…"} for v in status["variants"]]
        variants = table(rows, ("variant_type", "size_bytes", "sha256", "object_key"))
        lines.extend(f"  {line}" for line in variants.splitlines())
    ignored = [
        f"#{i['index']} {i['codec_type']} {i['codec_name']}"
        + (f" [{i['language']}]" if i.get("language") else "")
        + f" ({i['why']})"
        for i in status.get("ignored_streams", [])
    ]
    if ignored:
        lines.append(f"  ignored streams: {', '.join(ignored)}")
    credentials = credentials_text(status)
    if credentials:
        lines.append(f"  content credentials: {credentials}")
    lines.extend(_entry_line(entry) for entry in status["timeline"])
    return "\n".join(lines)


def credentials_text(status: dict[str, Any]) -> str | None:
    """The asset's C2PA provenance on one line: the source's manifest (its state, signer,
    what it says of AI) and the platform's signing of what is published."""
    found = content_credentials(status.get("source_provenance"), status.get("output_signing", {}))
    if found is None:
        return None
    source = found.source
    if source is None:
        parts = ["source not read"]
    elif not source.present:
        parts = ["source has no manifest"]
    else:
        codes = f" ({', '.join(source.codes)})" if source.codes else ""
        parts = [f"source {source.state}{codes}, signed by {source.signer_subject or '?'}"]
        if source.signer_issuer:
            parts[-1] += f" ({source.signer_issuer})"
    if found.ai_generated is not None:
        kind = source.digital_source_type if source else None
        parts.append(("AI-generated" if found.ai_generated else "not AI-generated") + f" ({kind})")
    signed = [name for name, s in found.outputs.items() if s.signed]
    unsigned = [
        f"{name} ({s.unsigned_reason})" for name, s in found.outputs.items() if not s.signed
    ]
    if signed:
        parts.append(f"published {', '.join(signed)} signed by {found.platform_signer}")
    if unsigned:
        parts.append(f"unsigned: {', '.join(unsigned)}")
    return "; ".join(parts)


def _output_text(status: dict[str, Any]) -> str:
    head = (
        f"provider output {status['provider_output_id']} ({status['provider']} task "
        f"{status['provider_task_id']} #{status['output_index']}, task {status['task_state']}):"
        f" {status['state']}, no asset yet"
    )
    if status["url_expires_at"]:
        head += f", URL expires {status['url_expires_at']}"
    if status["error_class"]:
        head += f", {status['error_class']}: {status['error_detail']}"
    return "\n".join([head, *(_entry_line(entry) for entry in status["timeline"])])


def _text(status: dict[str, Any]) -> str:
    return _asset_text(status) if "current_revision" in status else _output_text(status)


def _entry_key(entry: dict[str, Any]) -> str:
    """What makes a timeline entry new: a job that moves on (queued → running → succeeded) or
    a fetch attempt that finishes reads differently, and is shown again with its outcome."""
    return json.dumps(
        [
            entry.get("at"),
            entry.get("stage"),
            entry.get("event"),
            entry.get("error_class"),
            entry.get("revision"),
        ],
        default=str,
    )


def _change_entry(row: dict[str, Any]) -> dict[str, Any]:
    error = row["error_class"] if row["state"] in _STATES_WITH_ERROR else None
    return {
        "at": row["at"],
        "stage": _ENTITY_LABEL.get(row["entity"], row["entity"]),
        "event": f"→ {row['state']}",
        "error_class": error,
    }


def _progress_entry(item: dict[str, Any], shown: dict[str, float]) -> dict[str, Any] | None:
    """A line for the asset's render progress when it moved since the last one shown."""
    value = item.get("progress")
    asset = item.get("asset_id")
    if value is None or asset is None or shown.get(asset) == value:
        return None
    shown[asset] = value
    return {"at": datetime.now(UTC), "stage": "progress", "event": f"{value:g}%"}


def _item_label(item: dict[str, Any]) -> str:
    return f"#{item.get('output_index')}"


# -- following ----------------------------------------------------------------------------------


class _Followed:
    """The followed rows' keys, and the wake-up their changes ring."""

    def __init__(self) -> None:
        self.wakeup = listening.Wakeup()
        self.keys: set[str] = set()

    def heard(self, _conn: Any, _pid: int, _channel: str, payload: object) -> None:
        if payload in self.keys:
            self.wakeup.ring()


@asynccontextmanager
async def _listener(database: DatabaseConfig | None, followed: _Followed) -> AsyncIterator[None]:
    """The command's LISTEN connection (``store/listening.py``) for the body's duration,
    reopened (after a backoff of at most RELISTEN_SECONDS) when it drops. Its failures never
    stop the command: the timer re-reads whatever it misses."""
    if database is None:
        yield
        return
    # What changed before the LISTEN took effect was never announced: read again then.
    loop = Loop("status_listen", event="status_listen_lost", max_seconds=RELISTEN_SECONDS)
    async with anyio.create_task_group() as tg:
        tg.start_soon(
            partial(
                listening.run,
                loop,
                database,
                {NOTIFY_CHANNEL: followed.heard},
                on_listening=followed.wakeup.ring,
            )
        )
        try:
            yield
        finally:
            tg.cancel_scope.cancel()


async def follow(
    pool: Pool,
    target: Target,
    write: Write,
    *,
    listen: DatabaseConfig | None,
    interval_seconds: float = DEFAULT_INTERVAL_SECONDS,
) -> int:
    """Print the target's status, then each new timeline entry and state change as it
    happens, until everything followed is final (EXIT_OK). EXIT_NOT_FOUND when nothing by
    that id exists. ``listen``: the database to LISTEN on (None: the timer alone)."""
    target = await resolve(pool, target)
    snapshot = await read_snapshot(pool, target)
    if not snapshot.items and not snapshot.tasks:
        write("aivedio status: nothing found")
        return EXIT_NOT_FOUND
    many = target.kind == "task"
    shown: set[str] = set()
    seen_events: set[int] = set()
    progress: dict[str, float] = {}  # the progress last shown, by asset
    for item in snapshot.items:
        write(_text(item))
        shown.update(_entry_key(e) for e in item["timeline"])
        if item.get("progress") is not None:
            progress[item["asset_id"]] = item["progress"]
    seen_events.update(row["id"] for row in await read_state_changes(pool, snapshot))
    if not snapshot.items:
        write(
            f"task {target.value}: "
            + ", ".join(sorted(set(snapshot.tasks.values())))
            + ", no output yet"
        )
    followed = _Followed()
    async with _listener(listen, followed):
        while not snapshot.final():
            followed.keys = set(snapshot.keys)
            await followed.wakeup.wait(interval_seconds)
            snapshot = await read_snapshot(pool, target)
            # (at, rank, order, label, entry): at one instant (one transaction), the state
            # changes in commit order first, then the timeline entries.
            fresh: list[tuple[str, int, int, str, dict[str, Any]]] = []
            labels: dict[str, str] = {}
            for item in snapshot.items:
                label = _item_label(item) if many else ""
                for key in (item.get("asset_id"), item.get("provider_output_id")):
                    if key:
                        labels[key] = label
                for entry in item["timeline"]:
                    key = _entry_key(entry)
                    if key not in shown:
                        shown.add(key)
                        fresh.append((_at(entry["at"]), 1, len(fresh), label, entry))
                entry = _progress_entry(item, progress)
                if entry is not None:
                    fresh.append((_at(entry["at"]), 2, len(fresh), label, entry))
            for row in await read_state_changes(pool, snapshot):
                if row["id"] in seen_events:
                    continue
                seen_events.add(row["id"])
                owner = row["asset_id"] if row["entity"] == "asset" else row["provider_output_id"]
                label = labels.get(str(owner), "") if owner else ""
                fresh.append((_at(row["at"]), 0, row["id"], label, _change_entry(row)))
            fresh.sort(key=lambda f: f[:3])
            for *_, label, entry in fresh:
                line = _entry_line(entry)
                write(f"{label}{line}" if label else line)
    for item in snapshot.items:
        what = (
            f"asset {item['asset_id']}"
            if "current_revision" in item
            else f"provider output {item['provider_output_id']}"
        )
        suffix = f" ({item['error_class']})" if item.get("error_class") else ""
        write(f"== {what}: {item['state']}{suffix}, final")
    if not snapshot.items:
        write(f"== task {target.value}: {', '.join(sorted(set(snapshot.tasks.values())))}, final")
    return EXIT_OK


def _target(args: argparse.Namespace) -> Target | None:
    if args.task:
        return Target("task", args.task)
    value = args.asset_id or args.provider_output
    try:
        uuid.UUID(value)
    except ValueError:
        return None
    return Target("asset" if args.asset_id else "output", value)


def _print(line: str) -> None:
    print(line, flush=True)


def cmd_status(config: Config, args: argparse.Namespace) -> int:
    chosen = [x for x in (args.asset_id, args.task, args.provider_output) if x]
    if len(chosen) != 1:
        print("aivedio status: give exactly one of ASSET_ID, --task ID, --provider-output ID")
        return EXIT_USAGE
    target = _target(args)
    if target is None:
        print("aivedio status: ids are UUIDs")
        return EXIT_USAGE
    if args.follow and args.json:
        print("aivedio status: --follow prints text; leave out --json")
        return EXIT_USAGE
    if args.interval <= 0:
        print("aivedio status: --interval must be positive")
        return EXIT_USAGE

    async def once() -> int:
        async with open_pool(config.database, min_size=1, max_size=2) as pool:
            statuses = (await read_snapshot(pool, await resolve(pool, target))).items
        if not statuses:
            print("aivedio status: nothing found")
            return EXIT_NOT_FOUND
        if args.json:
            print_json(statuses if args.task else statuses[0])
        else:
            print("\n".join(_text(s) for s in statuses))
        return EXIT_OK

    async def live() -> int:
        async with anyio.create_task_group() as tg:
            result = EXIT_INTERRUPTED

            async def on_signal() -> None:
                with anyio.open_signal_receiver(signal.SIGINT) as signals:
                    async for _ in signals:
                        tg.cancel_scope.cancel()
                        return

            async def run() -> None:
                nonlocal result
                async with open_pool(config.database, min_size=1, max_size=2) as pool:
                    result = await follow(
                        pool, target, _print, listen=config.database, interval_seconds=args.interval
                    )
                tg.cancel_scope.cancel()

            tg.start_soon(on_signal)
            tg.start_soon(run)
        return result

    try:
        return anyio.run(live if args.follow else once, backend="asyncio")
    except KeyboardInterrupt:  # a Ctrl-C that arrived before the signal receiver was set up
        return EXIT_INTERRUPTED


def add_parsers(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    status = sub.add_parser("status", parents=[common], help="an asset's state and timeline")
    status.add_argument("asset_id", nargs="?", help="an asset's id (a UUID)")
    status.add_argument(
        "--task", help="a provider task id (or generation task id): one status per output"
    )
    status.add_argument("--provider-output", help="a provider output id (with or without asset)")
    status.add_argument("--json", action="store_true", help="one JSON document instead of text")
    status.add_argument(
        "--follow",
        "-f",
        action="store_true",
        help="keep printing new timeline entries, state changes and the render's progress "
        "until final (Ctrl-C: 130)",
    )
    status.add_argument(
        "--interval",
        type=float,
        default=DEFAULT_INTERVAL_SECONDS,
        help="with --follow: re-read at least this often, in seconds (default 2)",
    )
    status.set_defaults(fn=cmd_status)
