"""Package attributes that import their module on first use (PEP 562), so importing a package stays cheap."""
from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_exports(package: str, exports: dict[str, str]) -> tuple[Callable[[str], Any], list[str]]:
    """A module ``__getattr__`` that loads ``exports[name]`` (a module path) when ``name`` is first read,
    and the matching ``__all__``."""

    def __getattr__(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(exports[name]), name)

    return __getattr__, sorted(exports)
