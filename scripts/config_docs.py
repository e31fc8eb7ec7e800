"""Write the settings tables of docs/configuration.md from the configs' own field descriptions.

    python -m scripts.config_docs          # rewrite the generated tables in place
    python -m scripts.config_docs --check  # exit 1 if the file differs from what the code says

A generated table sits between ``<!-- generated: NAME -->`` and ``<!-- end: NAME -->``; NAME is a key
of :data:`TABLES`. Everything outside those markers is written by hand.
"""
from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

DOC = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"


def _default(field) -> str:
    if field.default_factory is not None:
        value = field.default_factory()
        return f"`{type(value).__name__}()`" if not isinstance(value, (dict, list)) else f"`{value!r}`"
    if field.default is PydanticUndefined:
        return "required"
    return f"`{field.default!r}`"


def table(model: type[BaseModel], only: Callable[[str], bool] = lambda name: True) -> str:
    rows = ["| key | default | meaning |", "|---|---|---|"]
    for name, field in model.model_fields.items():
        if only(name):
            rows.append(f"| `{name}` | {_default(field)} | {field.description or ''} |")
    return "\n".join(rows)


def tables() -> dict[str, str]:
    from actors.ray_data.actor_config import ActorConfig
    from pipeline.config import ActorsConfig, BucketingConfig, PipelineConfig

    actor_fields = set(ActorConfig.model_fields)
    generated = {
        "ActorConfig": table(ActorConfig),
        "PipelineConfig": table(PipelineConfig, lambda name: name not in actor_fields | {"actors", "bucketing"}),
        "ActorsConfig": table(ActorsConfig),
        "BucketingConfig": table(BucketingConfig),
    }
    try:
        from actors.ray_data.processor import BlockServeProcessorConfig
    except RuntimeError:  # a Ray version the processor hook is not tested with
        return generated
    own = set(BlockServeProcessorConfig.model_fields) - set(BlockServeProcessorConfig.__mro__[1].model_fields)
    generated["BlockServeProcessorConfig"] = table(BlockServeProcessorConfig, lambda name: name in own)
    return generated


def render(text: str) -> str:
    for name, body in tables().items():
        pattern = re.compile(rf"(<!-- generated: {name} -->\n)(?:.*?\n)?(<!-- end: {name} -->)", re.S)
        if not pattern.search(text):
            raise ValueError(f"{DOC} has no markers for {name}")
        text = pattern.sub(lambda match, body=body: match.group(1) + body + "\n" + match.group(2), text)
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the file is out of date")
    args = parser.parse_args(argv)
    current = DOC.read_text()
    wanted = render(current)
    if args.check:
        if wanted != current:
            print(f"{DOC} is out of date: run python -m scripts.config_docs", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(wanted)
    return 0


if __name__ == "__main__":
    sys.exit(main())
