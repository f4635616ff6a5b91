"""Every job kind this build knows, registered in one place."""

from __future__ import annotations

from aivedio.pipeline import (
    diagnostics,
    fetch,
    media_stage,
    moderation,
    poller,
    publish,
    sweeper,
)
from aivedio.pipeline.registry import Registry


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
