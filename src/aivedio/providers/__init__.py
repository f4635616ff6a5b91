"""Vendor adapters behind the ``ProviderAdapter`` seam (``providers/seam.py``).

``[providers.NAME] adapter`` picks one; ``generic`` is the path-configured adapter for
providers of our own making. docs/providers.md tabulates what each supports and assumes.
"""

from __future__ import annotations

from aivedio.config.load import ProviderConfig
from aivedio.net.fetch import Fetcher
from aivedio.providers.base import VendorAdapter, path_segment
from aivedio.providers.fal import FalAdapter
from aivedio.providers.kling import KlingAdapter
from aivedio.providers.luma import LumaAdapter
from aivedio.providers.minimax import MiniMaxAdapter
from aivedio.providers.openai import OpenAIAdapter
from aivedio.providers.openrouter import OpenRouterAdapter
from aivedio.providers.replicate import ReplicateAdapter
from aivedio.providers.runway import RunwayAdapter
from aivedio.providers.seam import GenericAdapter, ProviderAdapter
from aivedio.providers.seedance import SeedanceAdapter
from aivedio.providers.veo_gemini import VeoGeminiAdapter
from aivedio.providers.veo_vertex import VeoVertexAdapter
from aivedio.providers.wan import WanAdapter

VENDORS: dict[str, type[VendorAdapter]] = {
    cls.kind: cls
    for cls in (
        RunwayAdapter,
        OpenAIAdapter,
        VeoGeminiAdapter,
        VeoVertexAdapter,
        ReplicateAdapter,
        FalAdapter,
        LumaAdapter,
        KlingAdapter,
        MiniMaxAdapter,
        OpenRouterAdapter,
        SeedanceAdapter,
        WanAdapter,
    )
}
GENERIC_CALLBACK_SCHEME = "aivedio_hmac"


def build_adapter(name: str, config: ProviderConfig, fetcher: Fetcher) -> ProviderAdapter | None:
    """The adapter ``config`` selects; None for a generic provider without an API to ask."""
    if config.adapter == "generic":
        return GenericAdapter(name, config, fetcher) if config.api_base_url else None
    return VENDORS[config.adapter](name, config, fetcher)


def check_task_id(config: ProviderConfig, task_id: str) -> None:
    """PolicyBlockedError (``invalid_task_id``) for an id this provider cannot have issued:
    a registered id is put into URLs that carry the provider's credentials."""
    if config.adapter == "generic":
        path_segment(task_id)
    else:
        VENDORS[config.adapter].check_task_id(task_id)


def check_open(name: str, config: ProviderConfig) -> None:
    """PolicyBlockedError (``provider_shut_down``, naming the date) when the provider's
    vendor shut its API down: the one check every registration path makes (a watched task,
    a callback's task or outputs, an ingested output)."""
    if config.adapter != "generic":
        VENDORS[config.adapter].check_open(name)


def callback_scheme(config: ProviderConfig) -> str:
    if config.adapter == "generic":
        return GENERIC_CALLBACK_SCHEME if config.callback_secret else "none"
    return VENDORS[config.adapter].callback_scheme
