"""One simulated vendor per adapter (``src/aivedio/providers/``), on loopback HTTPS."""

from __future__ import annotations

from aivedio.sim.vendors.base import SimTask, VendorSim
from aivedio.sim.vendors.fal import FalSim
from aivedio.sim.vendors.kling import KlingSim
from aivedio.sim.vendors.luma import LumaSim
from aivedio.sim.vendors.minimax import MiniMaxSim
from aivedio.sim.vendors.openrouter import OpenRouterSim
from aivedio.sim.vendors.replicate import ReplicateSim
from aivedio.sim.vendors.runway import RunwaySim
from aivedio.sim.vendors.seedance import SeedanceSim
from aivedio.sim.vendors.veo_gemini import VeoGeminiSim
from aivedio.sim.vendors.veo_vertex import VeoVertexSim
from aivedio.sim.vendors.wan import WanSim

SIMS: dict[str, type[VendorSim]] = {
    cls.vendor: cls
    for cls in (
        RunwaySim,
        VeoGeminiSim,
        VeoVertexSim,
        ReplicateSim,
        FalSim,
        LumaSim,
        KlingSim,
        MiniMaxSim,
        OpenRouterSim,
        SeedanceSim,
        WanSim,
    )
}

__all__ = ["SIMS", "SimTask", "VendorSim"]
