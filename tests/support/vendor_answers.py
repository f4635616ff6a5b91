"""An adapter whose vendor API answers from a table: the pure half of ``get_task`` (parsing,
statuses, expiry) tested without a network; the real API calls are tested against the
simulators (tests/integration/providers)."""

from __future__ import annotations

from typing import Any

from aivedio.config.load import ProviderConfig
from aivedio.net.fetch import Fetcher, FetchLimits
from aivedio.net.policy import FetchPolicy
from aivedio.providers import VENDORS
from aivedio.providers.base import VendorAdapter, decode_object

FETCHER = Fetcher(FetchPolicy(), FetchLimits())


def answering(kind: str, answers: dict[str, Any], **settings: Any) -> VendorAdapter:
    """The ``kind`` adapter, its API answering ``answers[path]`` (the path after the base)."""
    config = ProviderConfig(adapter=kind, api_key="k", **settings)
    adapter = VENDORS[kind](kind, config, FETCHER)
    asked: list[str] = []

    async def call(method: str, url: str, json_body: object = None) -> dict[str, Any]:
        path = url.removeprefix(adapter.api_base)
        asked.append(path)
        return decode_object(answers[path])

    adapter.call = call  # type: ignore[method-assign]
    adapter.asked = asked  # type: ignore[attr-defined]
    return adapter
