"""Run Nemotron-Labs-Diffusion's own remote code on a checkpoint folder and write its tokens to JSON.

The peer folder holds the checkpoint's ``modeling_nemotron_labs_diffusion.py`` and
``configuration_nemotron_labs_diffusion.py`` (from the Hugging Face repository) and our stand-in for its
companion ``modeling_ministral.py``, which is not public (``research/peers/shims/nemotron/``). It runs under
transformers 5.0.0 (the release's ``transformers_version``): 5.25's ``DynamicCache.crop`` reads a positive
length as an error, and ``linear_spec_generate`` crops with one. Each prompt runs alone (batch 1), greedy,
float32 on the CPU: ``generate`` (dLM, ``causal_context`` True and False), ``ar_generate`` and
``linear_spec_generate``. Every answer is cut after its first EOS, as the loops return it.

    .venv/bin/python research/peers/nemotron_ref.py --peer-dir runs/peers/ref/nemotron \\
        --transformers runs/peers/tf500 --checkpoint tests/fixtures/tiny-nemotron_labs_diffusion --out FILE
"""
from __future__ import annotations

import argparse
import importlib
import json
import shutil
import sys
import tempfile
from pathlib import Path

MODES = {  # name -> (method, keyword arguments); block_length is added from the checkpoint
    "dlm_threshold_none": ("generate", {}),  # its default: one token a step
    "dlm_threshold_0.5": ("generate", {"threshold": 0.5}),
    "dlm_threshold_0.9": ("generate", {"threshold": 0.9}),
    "dlm_bidirectional_context": ("generate", {"threshold": 0.5, "causal_context": False}),
    "autoregressive": ("ar_generate", {}),
    "linear_spec_0.0": ("linear_spec_generate", {"threshold": 0.0}),
    "linear_spec_0.5": ("linear_spec_generate", {"threshold": 0.5}),
}


def prompts(count: int, vocab: int, seed: int) -> list[list[int]]:
    """Prompts of ordinary tokens (below the fixture's special tokens), 3 to 80 long."""
    import random

    rng = random.Random(seed)
    return [[rng.randrange(0, vocab) for _ in range(rng.randrange(3, 80))] for _ in range(count)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--peer-dir", required=True, type=Path)
    parser.add_argument("--transformers", required=True, type=Path, help="a folder with transformers 5.0.0")
    parser.add_argument("--checkpoint", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--prompts", type=int, default=12)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    sys.path.insert(0, str(args.transformers))
    import torch

    scratch = Path(tempfile.mkdtemp())
    shutil.copytree(args.peer_dir, scratch / "nemotron_peer")
    (scratch / "nemotron_peer" / "__init__.py").touch()
    sys.path.insert(0, str(scratch))
    modeling = importlib.import_module("nemotron_peer.modeling_nemotron_labs_diffusion")
    configuration = importlib.import_module("nemotron_peer.configuration_nemotron_labs_diffusion")
    config = configuration.NemotronLabsDiffusionConfig.from_pretrained(str(args.checkpoint))
    model = modeling.NemotronLabsDiffusionModel.from_pretrained(str(args.checkpoint), config=config,
                                                                torch_dtype=torch.float32).eval()
    eos = config.eos_token_id
    rows = prompts(args.prompts, min(config.mask_token_id, eos), args.seed)
    report = {"command": " ".join([".venv/bin/python", *sys.argv]), "checkpoint": str(args.checkpoint),
              "max_new_tokens": args.max_new_tokens, "prompts": rows, "modes": {}}
    for name, (method, kwargs) in MODES.items():
        extra = {"block_length": config.block_size} if method != "ar_generate" else {}
        answers, forwards = [], []
        for row in rows:
            ids = torch.tensor([row])
            output, nfe = getattr(model, method)(ids, max_new_tokens=args.max_new_tokens, **extra, **kwargs)
            answer = output[0, len(row):].tolist()[:args.max_new_tokens]
            answers.append(answer[:answer.index(eos) + 1] if eos in answer else answer)
            forwards.append(int(nfe))
        report["modes"][name] = {"method": method, "kwargs": kwargs, "answers": answers, "forwards": forwards}
        print(f"{name}: {sum(map(len, answers))} tokens in {sum(forwards)} forwards")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
