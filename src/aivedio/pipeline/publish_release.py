"""The release: the one statement that makes a revision the one an asset serves.

Fenced by the publish job's lease, it locks the generation task and then the asset (as a
cancel locks them: no deadlock with it), checks the caller's conditions against the locked
row, and releases: the revision READY with the outputs it publishes, the asset's pointer
moved by compare-and-set (with its state: PROCESSING → PLAYABLE, PLAYABLE → ENRICHED), the
previous revision SUPERSEDED, a ``releases`` row, the task linked to the asset,
``asset.ready`` in the outbox and the processing charge in the ledger. Any check or
compare-and-set that fails raises in the statement and undoes all of it.

The release decides nothing about whether a revision should be published: the publish stage
(``pipeline.publish``) checks that first, and names what must still hold under the lock.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

import asyncpg

from aivedio.config.ledger import LedgerConfig
from aivedio.errors import DatabaseError, TransientError
from aivedio.states import Entity
from aivedio.store import ledger, outbox, publishing
from aivedio.store.database import Pool, acquired
from aivedio.store.publishing import GONE, MOVED, SHIFTED, STALE
from aivedio.store.queue import Job, fenced, write_fenced
from aivedio.store.records import stale, transition, transition_part
from aivedio.store.together import Part, unmet, write_together


class NotPublishable(Exception):
    """A checklist item failed for a reason that waiting will not fix."""


class PointerMoved(TransientError):
    """Under the lock the current revision was not the one the publish replaces."""


class Unmet(Exception):
    """A check of the caller's own (``require``) failed: the release was undone."""

    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.code = code


UNIQUE_VIOLATION = "23505"


async def release(
    pool: Pool,
    ledger_config: LedgerConfig,
    job: Job | None,
    asset: asyncpg.Record,
    checks: dict[str, Part],
    previous: int | None,
    revision_no: int,
    outputs: list[str],
    enriched: bool,
    *,
    enriches: int | None = None,
    copy: dict[str, Part] | None = None,
    credentials: dict[str, Any] | None = None,
) -> None:
    """Lock the task and the asset, check ``checks`` against the locked row, and release:
    the revision READY with the outputs it publishes, the pointer switched, the previous
    revision SUPERSEDED, the release row, the task's link, ``asset.ready`` and the
    charge. The part a publish, an enrichment and a track revision share, ONE statement
    fenced by the job's lease (``job`` None: by no lease, for a track added through the
    API, which holds none), undone whole by any check or compare-and-set that fails (raised as
    NotPublishable, PointerMoved, TransientError, StaleStateError, or Unmet for a check
    of the caller's own). ``copy``: the new revision, inserted READY by its part ``ready``,
    and its outputs (an enrichment's or a track revision's copy of the revision it
    builds on), parts of the same statement. A first publish that makes the asset ENRICHED
    at once needs a second statement, in one transaction with it (a row changes once per
    statement)."""
    asset_id: uuid.UUID = asset["id"]
    head: dict[str, Part] = {"lock": publishing.lock_part(asset_id), **checks}
    # The first write reads the last check, and so waits for the lock and the checks
    # whatever order PostgreSQL runs the parts in (the task before the asset, as cancel
    # locks them: no deadlock with it). A copy's parts wait for it themselves; its new
    # revision is inserted READY (its ``ready`` part).
    checked = publishing.after(list(head)[-1])
    parts: dict[str, Part] = {**head, **(copy or {})}
    if "ready" not in parts:
        parts["ready"] = transition_part(
            Entity.REVISION,
            (asset_id, revision_no),
            expected="BUILDING",
            new="READY",
            values={"published_at": _now(), "published_outputs": outputs},
            when=checked,
        )
    later = _switch(parts, asset_id, asset["status"], previous, revision_no, enriched, when=checked)
    payload: dict[str, Any] = {
        "asset_id": str(asset_id),
        "revision": revision_no,
        "previous_revision": previous,
        "outputs": outputs,
        "state": "ENRICHED" if enriched else "PLAYABLE",
    }
    if enriches is not None:
        payload["enriches"] = enriches
    if credentials is not None:  # the C2PA provenance (pipeline/media/credentials.py)
        payload["content_credentials"] = credentials
    parts["release"] = publishing.release_part(asset_id, revision_no, previous, outputs)
    parts["link"] = publishing.link_task_part(asset_id)
    parts["event"] = outbox.event_part(
        "asset.ready", tenant_id=asset["tenant_id"], aggregate_id=asset_id, payload=payload
    )
    charge = None
    if enriches is None:  # an enrichment republishes what was charged
        charge = ledger.processing_charge_part(
            ledger_config,
            tenant_id=asset["tenant_id"],
            asset_id=asset_id,
            revision=revision_no,
            media_seconds=(asset["duration_us"] or 0) / 1e6,
        )
    if charge is not None:
        parts["charge"] = charge
    parts["won"] = publishing.won_check(with_previous="previous" in parts)
    parts["switched"] = publishing.switched_check()
    try:
        async with acquired(pool) as conn:
            if not later:
                got = await write_fenced(conn, job, parts, "recording the release")
            else:
                async with fenced(conn, job):
                    got = await write_together(conn, parts, "recording the release")
                    await transition(
                        conn, Entity.ASSET, (asset_id,), expected="PLAYABLE", new="ENRICHED"
                    )
    except DatabaseError as exc:
        if getattr(exc.__cause__, "sqlstate", None) == UNIQUE_VIOLATION and copy:
            # A revision took the enrichment's number since the load (a rebuild that
            # committed while this waited at the lock): the retry decides afresh.
            raise TransientError("another revision took the number; will look again") from exc
        code = unmet(exc)
        errors = {GONE: NotPublishable, MOVED: PointerMoved, SHIFTED: TransientError}
        if code in errors:
            raise errors[code](str(getattr(exc.__cause__, "message", exc))) from exc
        if code == STALE:
            raise stale(
                Entity.REVISION, (asset_id, revision_no), expected="BUILDING", new="READY"
            ) from exc
        if code is not None:
            raise Unmet(code) from exc
        raise
    if charge is not None and got["charge"]:
        ledger.log_processing_charge(charge)


def _switch(
    parts: dict[str, Part],
    asset_id: uuid.UUID,
    status: str,
    previous: int | None,
    revision_no: int,
    enriched: bool,
    *,
    when: str | None,
) -> bool:
    """The parts that move the pointer and the asset's state (``asset``) and supersede
    the previous revision (``previous``); whether PLAYABLE → ENRICHED follows after.

    ``status`` is the asset's state as read before the lock: its transition is a
    compare-and-set, and the statement's ``pointer`` check saw ``current_revision ==
    previous`` under the lock, so the pointer moves with the state change or, when the
    state stays, by a compare-and-set of its own. ``when``: a condition each of these
    writes reads first (the statement's checks)."""
    pointer = {"current_revision": revision_no}
    later = False
    if status == "PROCESSING":
        parts["asset"] = transition_part(
            Entity.ASSET,
            (asset_id,),
            expected="PROCESSING",
            new="PLAYABLE",
            values=pointer,
            when=when,
        )
        later = enriched
    elif enriched and status == "PLAYABLE":
        parts["asset"] = transition_part(
            Entity.ASSET,
            (asset_id,),
            expected="PLAYABLE",
            new="ENRICHED",
            values=pointer,
            when=when,
        )
    else:
        parts["asset"] = publishing.move_pointer_part(asset_id, revision_no, previous, when=when)
    if previous is not None:
        parts["previous"] = transition_part(
            Entity.REVISION, (asset_id, previous), expected="READY", new="SUPERSEDED", when=when
        )
    return later


def _now() -> datetime:
    return datetime.now(UTC)
