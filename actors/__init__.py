"""Ray adapters around the engine: ``ray_data`` (the batch door: BlockServeActor, build_processor),
``serving`` (the Ray Serve door, over the OpenAI server in ``serving.openai``), and what both share:
``engine_loop`` (the one engine driver, with ``request_stream``) and ``model_options``.

Names load on first use, so ``import actors`` pulls in neither torch nor ray (Ray Data imports this
package on every worker)."""
from __future__ import annotations

from engine.lazy_exports import lazy_exports

__getattr__, __all__ = lazy_exports("actors", {
    "BlockServeActor": "actors.ray_data.block_serve_actor",
    "BlockServeProcessorConfig": "actors.ray_data.processor",
    "StatsRegistry": "actors.ray_data.stats_registry",
})
