"""Where a Ray Data actor runs: its actor id, its node, and whether Ray restarted it."""
from __future__ import annotations

import warnings
from dataclasses import dataclass

LOCAL = "local"  # the ids outside a Ray actor


@dataclass(frozen=True)
class Placement:
    actor_id: str
    node_id: str
    restarted: bool  # Ray rebuilt this actor after its process died

    @property
    def in_ray_actor(self) -> bool:
        return self.actor_id != LOCAL


def current_placement() -> Placement:
    """This process's placement; ``local`` ids outside a Ray actor (or without Ray)."""
    try:
        import ray
    except ImportError:
        return Placement(LOCAL, LOCAL, False)
    if not ray.is_initialized():
        return Placement(LOCAL, LOCAL, False)
    context = ray.get_runtime_context()
    actor_id = context.get_actor_id()
    if actor_id is None:
        return Placement(LOCAL, context.get_node_id(), False)
    with warnings.catch_warnings():  # Ray 2.60 warns from inside its own property
        warnings.simplefilter("ignore", DeprecationWarning)
        restarted = bool(context.was_current_actor_reconstructed)
    return Placement(actor_id, context.get_node_id(), restarted)
