"""The fault plan: one fault per provider output, drawn from the seed, and what it calls for.

``make_plan(seed, n)`` is a pure function of its arguments: the same seed gives the same
outputs, faults, delays and chaos schedule (the timing of the run itself still differs).

What each fault calls for (``Fault.expect``: the acceptable final states of the output, the
asset's state when it has one, else the output's fetch state):

* every fault whose bytes are a good video and whose provider trouble is transient (5xx,
  429, a URL that expires before the fetch with a working refresh, a first download that is
  truncated or stalls, redirect hops, duplicate callbacks) ends ENRICHED: with every output
  made (the optional ones here are cheap), the complete revision is released;
* hostile bytes (an HTML error page, a truncated MP4, random bytes) end INVALID_MEDIA: the
  probe decides, nothing is retried;
* an output the provider says is gone (refresh answers 410) ends OUTPUT_LOST, whether its
  URL had expired before the callback or answers 404 "gone";
* a delete of the asset at a random moment ends DELETED, whatever the asset was doing;
* a cancel of the generation task at a random moment has two legitimate outcomes, because
  the cancel races the pipeline: before the asset's first release, the asset is retired
  (DELETED with ``last_error_class = 'cancelled'``); after it, the published asset keeps
  serving what was released before the cancel (PLAYABLE, or ENRICHED when the complete
  revision was released first) and nothing is released after the cancel. Which of the two
  happened is checked against the release times (see ``checks``), not just accepted.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field
from typing import Any

PUBLISHED = ("ENRICHED",)


@dataclass(frozen=True)
class FaultKind:
    name: str
    source: str  # a media file name (see media.SOURCES)
    expect: tuple[str, ...]
    weight: int
    what: str


KINDS: tuple[FaultKind, ...] = (
    FaultKind("remux", "remux.mp4", PUBLISHED, 14, "H.264/AAC source: a remux"),
    FaultKind("transcode", "hevc.mp4", PUBLISHED, 12, "HEVC source: a transcode"),
    FaultKind("hostile_html", "error-page.mp4", ("INVALID_MEDIA",), 4, "an HTML error page"),
    FaultKind(
        "hostile_truncated",
        "truncated.mp4",
        ("INVALID_MEDIA",),
        4,
        "an MP4 cut at 60 % (served whole, checksum of the cut bytes)",
    ),
    FaultKind("hostile_random", "random.mp4", ("INVALID_MEDIA",), 3, "40 kB of random bytes"),
    FaultKind("provider_5xx", "remux.mp4", PUBLISHED, 8, "503 twice, then the file"),
    FaultKind("throttled", "hevc.mp4", PUBLISHED, 6, "429 with Retry-After twice, then OK"),
    FaultKind("not_ready", "remux.mp4", PUBLISHED, 4, "404 not_ready once, then the file"),
    FaultKind(
        "expired_refresh_ok",
        "remux.mp4",
        PUBLISHED,
        6,
        "the callback's URL has already expired; refresh works",
    ),
    FaultKind(
        "expiring_url",
        "hevc.mp4",
        PUBLISHED,
        6,
        "the callback's URL expires 1-4 s later, during the run; refresh works",
    ),
    FaultKind(
        "gone_expired",
        "remux.mp4",
        ("OUTPUT_LOST",),
        4,
        "the URL has expired and refresh answers 410",
    ),
    FaultKind("gone", "remux.mp4", ("OUTPUT_LOST",), 3, "downloads 404 gone, refresh 410"),
    FaultKind(
        "truncated_transfer",
        "hevc.mp4",
        PUBLISHED,
        5,
        "the first two downloads close the connection at 30 %",
    ),
    FaultKind(
        "stalled_transfer",
        "remux.mp4",
        PUBLISHED,
        3,
        "the first download stalls after 20 kB (idle read timeout)",
    ),
    FaultKind("redirects", "remux.mp4", PUBLISHED, 3, "two redirect hops on the same host"),
    FaultKind(
        "duplicate_same_event",
        "remux.mp4",
        PUBLISHED,
        5,
        "the callback again with the same event id (409)",
    ),
    FaultKind(
        "duplicate_new_event",
        "hevc.mp4",
        PUBLISHED,
        5,
        "the callback again under a new event id (no second output)",
    ),
    FaultKind(
        "cancel",
        "remux.mp4",
        ("DELETED", "PLAYABLE", "ENRICHED"),
        8,
        "aivedio cancel of the task 0-12 s after the callback",
    ),
    FaultKind(
        "delete", "hevc.mp4", ("DELETED",), 8, "DELETE /v1/assets/{id} 0-8 s after the asset exists"
    ),
)
BY_NAME = {kind.name: kind for kind in KINDS}


@dataclass(frozen=True)
class Output:
    index: int
    task_id: str
    kind: str
    send_at: float  # seconds after the load starts
    delay: float  # cancel/delete/duplicate: seconds after the trigger; expiring: URL ttl
    callback_ttl: float  # the callback URL's ttl (negative: already expired)

    @property
    def fault(self) -> FaultKind:
        return BY_NAME[self.kind]


@dataclass(frozen=True)
class Chaos:
    """The chaos schedule, seconds after the load starts."""

    kill_every: tuple[float, float]  # SIGKILL + restart a random worker, this often
    kills: tuple[tuple[float, int], ...]  # (at, worker slot)
    drain_at: float
    drain_slot: int
    pg_restart_at: float
    s3_restart_at: float  # SIGKILL the S3 server, then start it again on its data
    s3_down_seconds: float  # how long it stays down


@dataclass(frozen=True)
class Plan:
    seed: int
    n: int
    outputs: tuple[Output, ...]
    chaos: Chaos
    workers: int = 2
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _pick(rng: random.Random, n: int) -> list[str]:
    """n kinds: each kind at least once when n allows, the rest by weight."""
    names = [kind.name for kind in KINDS]
    chosen = list(names) if n >= len(names) else []
    weights = [kind.weight for kind in KINDS]
    chosen += rng.choices(names, weights=weights, k=n - len(chosen))
    rng.shuffle(chosen)
    return chosen


def make_plan(seed: int, n: int, *, workers: int = 2, load_seconds: float | None = None) -> Plan:
    rng = random.Random(f"aivedio-chaos:{seed}")
    # Callbacks spread over the load window: about 0.2 s apart, at least 15 s in all.
    window = load_seconds if load_seconds is not None else max(10.0, n * 0.2)
    outputs = []
    for i, kind in enumerate(_pick(rng, n)):
        send_at = round(rng.uniform(0, window), 2)
        delay = 0.0
        ttl = 3600.0
        if kind == "cancel":
            delay = round(rng.uniform(0, 12), 2)
        elif kind == "delete":
            delay = round(rng.uniform(0, 8), 2)
        elif kind.startswith("duplicate"):
            delay = round(rng.uniform(0, 5), 2)
        elif kind in ("expired_refresh_ok", "gone_expired"):
            ttl = -60.0
        elif kind == "expiring_url":
            ttl = round(rng.uniform(1, 4), 2)
        outputs.append(Output(i, f"chaos-{seed}-{i:04d}", kind, send_at, delay, ttl))
    outputs.sort(key=lambda o: o.send_at)
    # Chaos over the load window and a little after it (the pipeline lags the callbacks).
    span = window + min(20.0, 5.0 + n * 0.1)
    kills = []
    t = rng.uniform(3, 6)
    while t < span:
        kills.append((round(t, 2), rng.randrange(workers)))
        t += rng.uniform(4, 8)
    chaos = Chaos(
        kill_every=(4, 8),
        kills=tuple(kills),
        drain_at=round(rng.uniform(0.3, 0.6) * span, 2),
        drain_slot=rng.randrange(workers),
        pg_restart_at=round(rng.uniform(0.25, 0.5) * span, 2),
        s3_restart_at=round(rng.uniform(0.55, 0.8) * span, 2),
        s3_down_seconds=round(rng.uniform(3, 6), 1),
    )
    return Plan(seed=seed, n=n, outputs=tuple(outputs), chaos=chaos, workers=workers)
