"""Run Fast-dLLM v2's own remote code (``generate``) on a checkpoint folder and write its tokens to JSON.

The peer folder holds the checkpoint's ``modeling.py`` and ``configuration.py`` from the Hugging Face repository
``Efficient-Large-Model/Fast_dLLM_v2_7B`` (public copies: Satgoy152/DualDiffusion @ 189fa7a,
``FastDLLM-inferencing/Fast_dLLM_v2_7B/``, whose ``generate`` carries an extra ``steps`` argument that is inert at
its default and was deleted). It runs under transformers 4.53 (the release's ``transformers_version``) in its own
environment. Each prompt runs alone (the loop reads its stop from the first row only), greedy
(``temperature=0``), float32 on the CPU, ``use_block_cache=False``, for every (threshold, small_block_size) of
:data:`SETTINGS`, over ``max_new_tokens`` = 3 blocks. Answers are the loop's tokens after the prompt, cut after its
first stop, as it returns them. ``REF_VENV`` is a virtual environment with transformers 4.53.3 and torch.

    python -m scripts.make_fast_dllm_fixture runs/fast-dllm-v2/tiny
    REF_VENV/bin/python research/peers/fast_dllm_v2_ref.py --peer-dir runs/peers/ref/fast_dllm_v2 \\
        --checkpoint runs/fast-dllm-v2/tiny --out tests/fixtures/fast_dllm_v2_remote_code.json
"""
from __future__ import annotations

import argparse
import importlib
import json
import shutil
import sys
import tempfile
from pathlib import Path

SETTINGS = [(1.0, 8), (0.9, 8), (0.9, 4), (0.9, 32)]  # (threshold, small_block_size): each value once or more
PROMPT_LENGTHS = (7, 20, 45, 64, 96)  # shorter than a block, longer, and whole blocks (64, 96; 32 is not the
# model's intent in this loop, which decodes a one-block prompt without it in context)


def prompts(vocab: int, seed: int) -> list[list[int]]:
    """Prompts of ordinary tokens (below the fixture's special tokens)."""
    import random

    rng = random.Random(seed)
    return [[rng.randrange(0, vocab) for _ in range(length)] for length in PROMPT_LENGTHS]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--peer-dir", required=True, type=Path)
    parser.add_argument("--checkpoint", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    import torch

    scratch = Path(tempfile.mkdtemp())
    shutil.copytree(args.peer_dir, scratch / "fast_dllm_peer")
    (scratch / "fast_dllm_peer" / "__init__.py").touch()
    sys.path.insert(0, str(scratch))
    modeling = importlib.import_module("fast_dllm_peer.modeling")
    configuration = importlib.import_module("fast_dllm_peer.configuration")
    config = configuration.Fast_dLLM_QwenConfig.from_pretrained(str(args.checkpoint))
    model = modeling.Fast_dLLM_QwenForCausalLM.from_pretrained(str(args.checkpoint), config=config,
                                                               torch_dtype=torch.float32).eval()
    block, stop, mask = config.bd_size, config.eos_token_id, config.mask_token_id
    rows = prompts(min(stop, mask) - 2, args.seed)
    command = ["REF_VENV/bin/python", "research/peers/fast_dllm_v2_ref.py", *sys.argv[1:]]  # no machine's paths
    report = {"command": " ".join(command), "transformers": _version("transformers"),
              "max_new_tokens": 3 * block, "prompts": rows, "settings": []}
    for threshold, sub_block in SETTINGS:
        answers = []
        for row in rows:
            output = model.generate(torch.tensor([row]), max_new_tokens=3 * block, mask_id=mask, threshold=threshold,
                                    small_block_size=sub_block, block_size=block, stop_token=stop, temperature=0)
            answers.append(output[0, len(row):].tolist())
        report["settings"].append({"threshold": threshold, "small_block_size": sub_block, "answers": answers})
        print(f"threshold {threshold}, small_block_size {sub_block}: {[len(a) for a in answers]} tokens")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")


def _version(package: str) -> str:
    return importlib.import_module(package).__version__


if __name__ == "__main__":
    main()
