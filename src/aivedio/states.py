"""The state machines of every record with a status, in one table.

Every status column is changed only through ``store.records.transition``, which consults
``allowed`` and then runs a compare-and-set (``WHERE status = expected AND version = v``).
Anything not listed here is refused, so a late event can never move a record backwards.

Additions to the design's diagrams, each because a real path needs it:

* provider outputs: ``FETCHING → FETCH_PENDING`` (a drained worker releases its lease),
  ``FETCH_PENDING → NEED_URL_REFRESH`` (the URL expired before any fetch began),
  ``RETRY_WAIT → FETCHING``, ``NEED_URL_REFRESH → FETCH_PENDING`` (a fresh URL arrived),
  and ``→ OUTPUT_LOST`` from every waiting state (the expiry passed or the provider says gone);
* assets: ``PROBING → PROCESSING_FAILED`` (the probe ran out of retries for a reason that is
  not the media's fault: resource limits, a changed source); ``PROCESSING → PROCESSING`` is
  not allowed, but ``PLAYABLE → PROCESSING`` is not
  needed either: enrichment publishes a new revision while the asset stays PLAYABLE, then
  moves it to ENRICHED. ``DELETED`` is reachable from every live state (the tombstone);
* generation tasks and revisions are not drawn in the design; a task follows the provider's
  own states, a revision is BUILDING until it is READY (published), FAILED or ABANDONED, and a READY
  one is SUPERSEDED by the next publish.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping


class Entity(enum.Enum):
    GENERATION_TASK = "generation_task"
    PROVIDER_OUTPUT = "provider_output"
    ASSET = "asset"
    REVISION = "revision"
    VARIANT = "variant"
    PIECE = "piece"


# entity -> (table, status column, key columns)
TABLES: Mapping[Entity, tuple[str, str, tuple[str, ...]]] = {
    Entity.GENERATION_TASK: ("generation_tasks", "provider_status", ("id",)),
    Entity.PROVIDER_OUTPUT: ("provider_outputs", "fetch_status", ("id",)),
    Entity.ASSET: ("assets", "status", ("id",)),
    Entity.REVISION: ("asset_revisions", "status", ("asset_id", "revision")),
    Entity.VARIANT: ("asset_variants", "status", ("asset_id", "revision", "variant_type")),
    Entity.PIECE: ("media_pieces", "status", ("asset_id", "revision", "piece")),
}

_ASSET_LIVE = ("QUARANTINED", "PROBING", "PROCESSING", "PLAYABLE", "ENRICHED")

TRANSITIONS: Mapping[Entity, Mapping[str, frozenset[str]]] = {
    Entity.GENERATION_TASK: {
        "SUBMITTED": frozenset(
            {"PROVIDER_RUNNING", "PROVIDER_SUCCEEDED", "PROVIDER_FAILED", "CANCELLED"}
        ),
        "PROVIDER_RUNNING": frozenset({"PROVIDER_SUCCEEDED", "PROVIDER_FAILED", "CANCELLED"}),
        "PROVIDER_SUCCEEDED": frozenset({"CANCELLED"}),
        "PROVIDER_FAILED": frozenset(),
        "CANCELLED": frozenset(),
    },
    Entity.PROVIDER_OUTPUT: {
        "DISCOVERED": frozenset({"FETCH_PENDING", "OUTPUT_LOST"}),
        "FETCH_PENDING": frozenset({"FETCHING", "NEED_URL_REFRESH", "OUTPUT_LOST"}),
        "FETCHING": frozenset(
            {
                "STORED",
                "RETRY_WAIT",
                "NEED_URL_REFRESH",
                "INVALID_RESPONSE",
                "OUTPUT_LOST",
                "FETCH_PENDING",
            }
        ),
        "RETRY_WAIT": frozenset({"FETCHING", "NEED_URL_REFRESH", "OUTPUT_LOST"}),
        "NEED_URL_REFRESH": frozenset({"FETCH_PENDING", "OUTPUT_LOST"}),
        "STORED": frozenset(),
        "INVALID_RESPONSE": frozenset(),
        "OUTPUT_LOST": frozenset(),
    },
    Entity.ASSET: {
        "QUARANTINED": frozenset({"PROBING", "DELETED"}),
        "PROBING": frozenset({"PROCESSING", "INVALID_MEDIA", "PROCESSING_FAILED", "DELETED"}),
        "PROCESSING": frozenset({"PLAYABLE", "REJECTED", "PROCESSING_FAILED", "DELETED"}),
        "PLAYABLE": frozenset({"ENRICHED", "DELETED"}),
        "ENRICHED": frozenset({"DELETED"}),
        "REJECTED": frozenset({"DELETED"}),
        "PROCESSING_FAILED": frozenset({"DELETED"}),
        "INVALID_MEDIA": frozenset({"DELETED"}),
        "DELETED": frozenset(),
    },
    Entity.REVISION: {
        "BUILDING": frozenset({"READY", "FAILED", "ABANDONED"}),
        "READY": frozenset({"SUPERSEDED"}),
        "SUPERSEDED": frozenset(),
        "FAILED": frozenset(),
        "ABANDONED": frozenset(),
    },
    Entity.VARIANT: {
        "PENDING": frozenset({"SUCCEEDED", "FAILED"}),
        "SUCCEEDED": frozenset(),
        "FAILED": frozenset(),
    },
    # A piece of a chunked revision (a transcoding task keyed by its segment): done once, by
    # whichever attempt commits first; a later duplicate finds it DONE and keeps nothing of its own.
    Entity.PIECE: {
        "PENDING": frozenset({"DONE", "FAILED"}),
        "DONE": frozenset(),
        "FAILED": frozenset(),
    },
}

INITIAL: Mapping[Entity, frozenset[str]] = {
    Entity.GENERATION_TASK: frozenset({"SUBMITTED", "PROVIDER_SUCCEEDED"}),
    Entity.PROVIDER_OUTPUT: frozenset({"DISCOVERED", "FETCH_PENDING"}),
    Entity.ASSET: frozenset({"QUARANTINED"}),
    Entity.REVISION: frozenset({"BUILDING"}),
    Entity.VARIANT: frozenset({"PENDING", "SUCCEEDED"}),
    Entity.PIECE: frozenset({"PENDING", "DONE"}),
}

TERMINAL_OUTPUT_STATES = frozenset({"STORED", "INVALID_RESPONSE", "OUTPUT_LOST"})
LIVE_ASSET_STATES = frozenset(_ASSET_LIVE)


def states(entity: Entity) -> frozenset[str]:
    return frozenset(TRANSITIONS[entity])


def allowed(entity: Entity, current: str, new: str) -> bool:
    """Whether ``current → new`` is a legal change for ``entity``."""
    return new in TRANSITIONS[entity].get(current, frozenset())
