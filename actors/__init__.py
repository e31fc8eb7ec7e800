"""Ray adapters around the engine. Names load on first use, so ``import actors`` pulls in neither
torch nor ray (Ray Data imports this package on every worker)."""
from __future__ import annotations

from engine.lazy_exports import lazy_exports

__getattr__, __all__ = lazy_exports("actors", {
    "BlockServeActor": "actors.block_serve_actor",
    "BlockServeProcessorConfig": "actors.processor",
    "StatsRegistry": "actors.stats_registry",
})
