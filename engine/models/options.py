"""How a loaded model runs its forwards: options of the model object, shared by every engine on it."""
from __future__ import annotations

from dataclasses import dataclass


def _fail(field: str, message: str) -> None:
    raise ValueError(f"ModelOptions.{field}: {message}")


@dataclass(frozen=True)
class ModelOptions:
    """``compile``: forwards run as compiled graphs (``engine.models.compiled``), at exact shapes on
    the CPU and bucketed ones on CUDA; off by default until a GPU run shows it wins.
    ``batch_invariant``: a row's tokens independent of its batch in bf16 too: each row's attention
    on its own keys, and on CUDA process-wide cuBLAS settings (``engine.models.batch_invariance``)."""

    compile: bool = False
    batch_invariant: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.compile, bool):
            _fail("compile", f"must be true or false, got {self.compile!r}")
        if not isinstance(self.batch_invariant, bool):
            _fail("batch_invariant", f"must be true or false, got {self.batch_invariant!r}")
        if self.batch_invariant and self.compile:
            _fail("batch_invariant", "runs each row's attention on its own, eagerly: it cannot be combined with "
                                     "compile=True yet")
