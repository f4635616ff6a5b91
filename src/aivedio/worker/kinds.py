"""Every job kind this build knows, registered in one place."""

from __future__ import annotations

from aivedio.pipeline import fetch, media_stage, moderation, poller, publish
from aivedio.pipeline.jobs import Registry
from aivedio.pipeline.upkeep import diagnostics, sweeper


def default_registry() -> Registry:
    registry = Registry()
    diagnostics.register(registry)
    fetch.register(registry)
    media_stage.register(registry)
    moderation.register(registry)
    poller.register(registry)
    publish.register(registry)
    sweeper.register(registry)
    return registry
