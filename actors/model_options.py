"""The loaded model's options (``compile``, ``batch_invariant``) as both doors' configs spell them.

``ActorConfig`` (Ray Data) and ``ServeAppConfig`` (Serve) each take the two options at their top level,
with one description, and refuse them inside an ``engine`` section (they are options of the loaded
model, :class:`engine.models.options.ModelOptions`, not of its engines).
"""
from __future__ import annotations

MODEL_OPTIONS = ("compile", "batch_invariant")  # options of the loaded model, not of its engines
COMPILE_DESCRIPTION = ("load the model compiled: exact shapes on the CPU, bucketed ones on CUDA "
                       "(engine/models/compiled_shapes.py); not with batch_invariant")
BATCH_INVARIANT_DESCRIPTION = ("load the model batch-invariant: a row's tokens independent of its batch in bf16 "
                               "too (each row's attention alone; on CUDA, process-wide cuBLAS settings)")


def refuse_model_options_in_engine(engine: object) -> None:
    """A ``compile`` or ``batch_invariant`` key in an engine section is an error naming its key."""
    moved = [key for key in MODEL_OPTIONS if isinstance(engine, dict) and key in engine]
    if moved:
        raise ValueError(f"{', '.join(moved)}: not an engine setting; an option of the loaded model, set at "
                         f"the top level ({', '.join(f'{key}: true' for key in moved)})")
