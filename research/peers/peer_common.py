"""Helpers shared by the peer drivers (``sdar_ref.py``, ``llada2_ref.py``).

Nothing here imports transformers: a driver first calls :func:`use_transformers` to put its pinned
transformers (and our shims) at the front of ``sys.path``, then loads the peer's files as a package with
:func:`load_peer`. This module must stay importable with plain torch, so that it never pins the venv's
transformers before the peer's one.
"""
from __future__ import annotations

import argparse
import hashlib
import importlib
import importlib.util
import json
import platform
import sys
import types
from pathlib import Path

import torch

SHIMS = Path(__file__).resolve().parent / "shims"
REPO_ROOT = Path(__file__).resolve().parents[2]
SCHEMA = "blockserve-peer-reference/1"


def use_transformers(path: str) -> None:
    """Put ``path`` (a ``pip install --target`` dir) and our shims first on ``sys.path``."""
    if "transformers" in sys.modules:
        raise RuntimeError("transformers was imported before the pinned copy was put on sys.path")
    for entry in (str(SHIMS), str(Path(path).resolve())):
        sys.path.insert(0, entry)


def load_peer(package: str, peer_dir: str, module: str, stubs: dict[str, types.ModuleType] | None = None):
    """Import ``peer_dir/module.py`` as ``package.module`` so its relative imports resolve in ``peer_dir``.

    The peer dir's own ``__init__.py`` (if any) is not run. ``stubs`` maps sibling module names to modules
    that stand in for them (for example a module that imports triton at its top).
    """
    root = types.ModuleType(package)
    root.__path__ = [str(Path(peer_dir).resolve())]
    sys.modules[package] = root
    for name, stub in (stubs or {}).items():
        sys.modules[f"{package}.{name}"] = stub
    return importlib.import_module(f"{package}.{module}")


def load_module_file(name: str, path: Path) -> types.ModuleType:
    """A module object from one of our own files (a shim), without putting its folder on ``sys.path``."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def argument_parser(doc: str, default_gen: int) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=doc.split("\n")[0])
    parser.add_argument("--peer-dir", required=True, help="folder holding the peer's extracted files")
    parser.add_argument("--transformers", required=True, help="a `pip install --target` folder with the pinned "
                        "transformers (and its tokenizers / huggingface_hub)")
    parser.add_argument("--checkpoint", required=True, help="checkpoint folder (config.json + safetensors)")
    parser.add_argument("--out", help="the JSON report; full logits go next to it as .logits.safetensors")
    parser.add_argument("--prompts", help="JSON list of prompts (lists of token ids); default: 8 built-in")
    parser.add_argument("--gen-length", type=int, default=default_gen)
    parser.add_argument("--mask-id", type=int, help="MASK id (default: config.mask_token_id, else the tokenizer's)")
    parser.add_argument("--make-checkpoint", action="store_true",
                        help="first write a tiny random checkpoint to --checkpoint with the peer's own classes")
    parser.add_argument("--seed", type=int, default=0, help="seed of --make-checkpoint")
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32",
                        help="the peer model's dtype (float64 removes float rounding from the logit comparison)")
    parser.add_argument("--head-scale", type=float, default=20.0, help="with --make-checkpoint: the lm_head's "
                        "multiplier (20 makes confidence thresholds fire; 1 keeps the init's logits, near 1)")
    parser.add_argument("--stop-boost", action="store_true", help="with --make-checkpoint: make the stop token "
                        "win where the most frequent greedy token would, so generations stop early")
    return parser


def git_blob(path: Path) -> str:
    """The git blob id of a file: compare with ``git ls-tree COMMIT path`` in the mirror."""
    data = path.read_bytes()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def portable_path(path: str | Path) -> str:
    """``path`` relative to this repository when it lies inside it: a record names no machine's folders."""
    resolved = Path(path).resolve()
    return str(resolved.relative_to(REPO_ROOT)) if resolved.is_relative_to(REPO_ROOT) else str(path)


def peer_record(peer_dir: str, repo: str, commit: str, files: dict[str, str]) -> dict:
    """Where the peer code came from: repo, commit, and for each file its source path and blob id."""
    root = Path(peer_dir).resolve()
    return {"repo": repo, "commit": commit, "dir": portable_path(root),
            "files": {name: {"source": source, "git_blob": git_blob(root / name)} for name, source in files.items()}}


def environment(transformers_module, dtype: str = "float32") -> dict:
    return {"transformers": transformers_module.__version__,
            "transformers_path": portable_path(transformers_module.__file__), "torch": torch.__version__,
            "python": platform.python_version(), "device": "cpu", "dtype": dtype}


def special_ids(checkpoint: str, config: dict, generation: dict) -> set[int]:
    """Every token id the checkpoint's config.json / generation_config.json / tokenizer added tokens name."""
    found: set[int] = set(added_tokens(checkpoint).values())
    for source in (config, generation):
        for key in ("bos_token_id", "eos_token_id", "pad_token_id", "mask_token_id"):
            value = source.get(key)
            found.update(value if isinstance(value, list) else [] if value is None else [value])
    return found


def default_prompts(lengths: list[int], vocab_size: int, avoid: set[int], seed: int = 1234) -> list[list[int]]:
    """Prompts of the given lengths, ids drawn from the ordinary vocabulary: below the first special id of the
    vocabulary's upper half (so untrained padding rows above the specials are never used), ``avoid`` excluded."""
    ceiling = min([vocab_size, *(i for i in avoid if i >= vocab_size // 2)])
    ordinary = torch.tensor([i for i in range(ceiling) if i not in avoid])
    generator = torch.Generator().manual_seed(seed)
    return [ordinary[torch.randint(0, len(ordinary), (length,), generator=generator)].tolist() for length in lengths]


def read_prompts(path: str | None, lengths: list[int], vocab_size: int, avoid: set[int]) -> list[list[int]]:
    if path is None:
        return default_prompts(lengths, vocab_size, avoid)
    prompts = json.loads(Path(path).read_text())
    if not all(isinstance(p, list) and p and all(isinstance(t, int) for t in p) for p in prompts):
        raise ValueError(f"{path}: expected a JSON list of non-empty lists of token ids")
    return prompts


def read_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


def added_tokens(checkpoint: str) -> dict[str, int]:
    """Added (special) tokens named by the checkpoint's tokenizer files: content -> id."""
    folder = Path(checkpoint)
    found = {entry.get("content"): int(key)
             for key, entry in read_json(folder / "tokenizer_config.json").get("added_tokens_decoder", {}).items()}
    found.update({entry.get("content"): entry.get("id") for entry in read_json(folder / "tokenizer.json").get(
        "added_tokens", [])})
    return found


def token_id(checkpoint: str, contents: tuple[str, ...]) -> int | None:
    """The id of the first added token spelled as one of ``contents``."""
    found = added_tokens(checkpoint)
    return next((found[name] for name in contents if name in found), None)


def first_given(*values):
    """The first value that is not None (a token id 0 is a valid id)."""
    return next((value for value in values if value is not None), None)


def first_id(value) -> int | None:
    return value[0] if isinstance(value, list) else value


def block_mask01(prompt_length: int, gen_length: int, block: int) -> torch.Tensor:
    """The peers' block-causal mask as 0/1 float ``[total, total]`` (SDAR generate.py:79-86, same in bd3/L2-HF)."""
    num_blocks = (prompt_length + gen_length + block - 1) // block
    tril = torch.tril(torch.ones(num_blocks, num_blocks))
    return tril.repeat_interleave(block, dim=0).repeat_interleave(block, dim=1)


def canvas(prompt: list[int], gen_length: int, block: int, mask_id: int) -> torch.Tensor:
    """``[1, total]``: the prompt then MASK up to a whole number of blocks, as every peer lays it out."""
    total = (len(prompt) + gen_length + block - 1) // block * block
    x = torch.full((1, total), mask_id, dtype=torch.long)
    x[0, :len(prompt)] = torch.tensor(prompt)
    return x


def summary(logits: torch.Tensor) -> dict:
    """Per position of ``[positions, vocab]`` logits: argmax, max logit and the argmax's softmax probability."""
    logits = logits.float()
    top, arg = logits.max(dim=-1)
    prob = torch.softmax(logits, dim=-1).gather(-1, arg[:, None])[:, 0]
    return {"argmax": arg.tolist(), "max": top.tolist(), "prob": prob.tolist()}


def trim_at_stop(tokens: list[int], stop_ids: list[int], keep_stop: bool) -> list[int]:
    for index, token in enumerate(tokens):
        if token in stop_ids:
            return tokens[:index + keep_stop]
    return tokens


class Recorder:
    """Collects the JSON report and the full logits (saved next to it as safetensors)."""

    def __init__(self, out: str, header: dict):
        self.out = Path(out)
        self.tensors: dict[str, torch.Tensor] = {}
        self.report = {"schema": SCHEMA, **header, "logits_file": self.out.with_suffix(".logits.safetensors").name,
                       "forwards": [], "generations": []}

    def forward(self, key: str, logits: torch.Tensor, mask_id: int, **fields) -> None:
        logits = logits.detach().float().contiguous()
        self.tensors[key] = logits
        info = summary(logits)
        self.report["forwards"].append({"key": key, **fields, "shape": list(logits.shape), **info,
                                        "mask_is_argmax": mask_id in info["argmax"]})

    def generation(self, **fields) -> None:
        self.report["generations"].append(fields)

    def save(self) -> None:
        from safetensors.torch import save_file

        self.out.parent.mkdir(parents=True, exist_ok=True)
        save_file(self.tensors, str(self.out.with_suffix(".logits.safetensors")))
        self.out.write_text(json.dumps(self.report, indent=1) + "\n")


def count_calls(model) -> list[int]:
    """Wrap ``model.forward`` (the instance attribute, so ``self.forward`` sees it too); returns a counter."""
    counter = [0]
    inner = model.forward

    def counted(*args, **kwargs):
        counter[0] += 1
        return inner(*args, **kwargs)

    model.forward = counted
    return counter


QK_NORMS = ("q_norm", "k_norm", "query_layernorm", "key_layernorm")


@torch.no_grad()
def randomize_for_tests(model, mask_id: int, generator: torch.Generator, head_scale: float = 20.0) -> None:
    """Norm weights random in [0.5, 1.5), q/k norms in [1.5, 4.5) (sharper attention, so masked positions of one
    block differ); lm_head x ``head_scale`` so confidence thresholds fire; the MASK row zeroed (never argmax)."""
    for name, param in model.named_parameters():
        if name.endswith("norm.weight"):
            scale = 3.0 if any(f"{part}.weight" in name for part in QK_NORMS) else 1.0
            param.copy_((torch.rand(param.shape, generator=generator) + 0.5) * scale)
    head = model.lm_head.weight
    head.mul_(head_scale)
    head[mask_id].zero_()


@torch.no_grad()
def boost_stop_row(model, stop_id: int, logits_fn, prompts: list[list[int]], gen_length: int, block: int,
                   mask_id: int, rank: int = 0) -> int:
    """Copy (x1.05) into the stop token's lm_head row the row of the ``rank``-th most frequent greedy token at the
    masked positions of the full forwards of ``prompts``; returns that token."""
    counts: dict[int, int] = {}
    for prompt in prompts:
        argmax = logits_fn(prompt, gen_length, block, mask_id).argmax(-1)[len(prompt):]
        for token in argmax.tolist():
            counts[token] = counts.get(token, 0) + 1
    token = sorted(counts, key=lambda t: (-counts[t], t))[rank]
    model.lm_head.weight[stop_id] = model.lm_head.weight[token] * 1.05
    return token
