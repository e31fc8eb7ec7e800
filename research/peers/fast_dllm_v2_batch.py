"""Time Fast-dLLM v2's own batched loop (``batch_sample`` of NVlabs' ``v2/generation_functions.py``, the loop
its ``v2/eval.py`` runs) on a checkpoint folder, as its eval feeds it, and write its tokens, seconds and forwards.

Runs in the reference environment (transformers 4.53), outside the project: the checkpoint's ``modeling.py`` and
``configuration.py`` come from ``--peer-dir`` (see ``fast_dllm_v2_ref.py``), the loop's file from ``--loop``
(NVlabs/Fast-dLLM ``v2/generation_functions.py`` @ d259b48). Like the eval: prompts sorted by length, cut into
batches of ``--batch``, each right-padded with MASK to its longest prompt, with ``min_len`` and ``seq_len``;
greedy (``temperature=0``), ``use_block_cache=False``, float32 on the CPU with ``--threads`` torch threads. A
batch of the four shortest prompts warms up; then the whole list is timed. A forward is one call of the decoder stack.
An answer is the tokens after its prompt, cut before its first stop and at the loop's last block.

    REF_VENV/bin/python research/peers/fast_dllm_v2_batch.py --peer-dir PEER_DIR \\
        --loop GENERATION_FUNCTIONS.py --checkpoint CKPT --prompts PROMPTS.json --out PEER.json
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import shutil
import sys
import tempfile
import time
import types
from pathlib import Path


def load(args: argparse.Namespace):
    """The release's model on ``--checkpoint`` with the loop's ``batch_sample`` bound to it."""
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
    spec = importlib.util.spec_from_file_location("fast_dllm_loop", args.loop)
    loop = sys.modules["fast_dllm_loop"] = importlib.util.module_from_spec(spec)  # its decorator reads the file
    spec.loader.exec_module(loop)
    model.batch_sample = types.MethodType(loop.Fast_dLLM_QwenForCausalLM.batch_sample, model)
    return model, config


def run(model, config, prompts: list[list[int]], args: argparse.Namespace) -> list[list[int]]:
    """Answers of ``prompts`` (already sorted) in batches of ``--batch``, as ``eval.py``'s ``generate_until``."""
    import torch

    block, mask, stop = config.bd_size, config.mask_token_id, config.eos_token_id
    answers = []
    for first in range(0, len(prompts), args.batch):
        batch = prompts[first:first + args.batch]
        lengths = [len(p) for p in batch]
        ids = torch.tensor([p + [mask] * (max(lengths) - len(p)) for p in batch])
        out = model.batch_sample(ids, types.SimpleNamespace(pad_token_id=args.pad_id), block, args.max_new_tokens,
                                 args.sub_block, min(lengths), torch.tensor(lengths), mask_id=mask,
                                 threshold=args.threshold, stop_token=stop, temperature=0)
        end = (args.max_new_tokens // block + max(lengths) // block) * block
        for row, length in enumerate(lengths):
            answer = out[row][length:end].tolist()
            answers.append(answer[:answer.index(stop)] if stop in answer else answer)
    return answers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for name in ("--peer-dir", "--loop", "--checkpoint", "--prompts", "--out"):
        parser.add_argument(name, required=True, type=Path)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--threshold", type=float, default=0.9)
    parser.add_argument("--sub-block", type=int, default=8)
    parser.add_argument("--pad-id", type=int, required=True)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    model, config = load(args)
    forwards, inside = [0], [0.0]  # calls of the decoder stack, and seconds inside them
    model.model.register_forward_pre_hook(lambda *_: inside.__setitem__(0, inside[0] - time.perf_counter()))

    def counted(*_) -> None:  # returns None: the stack's output stands
        forwards[0] += 1
        inside[0] += time.perf_counter()

    model.model.register_forward_hook(counted)
    prompts = sorted(json.loads(args.prompts.read_text()), key=len)
    run(model, config, prompts[:4], args)  # warm-up: one batch of four
    forwards[0], inside[0] = 0, 0.0
    start = time.perf_counter()
    answers = run(model, config, prompts, args)
    seconds = time.perf_counter() - start
    version = importlib.import_module("transformers").__version__
    args.out.write_text(json.dumps({"prompts": prompts, "answers": answers, "seconds": seconds, "transformers": version,
                                    "forwards": forwards[0], "forward_seconds": inside[0]}) + "\n")
    print(f"peer: {sum(map(len, answers))} tokens, {forwards[0]} forwards, {seconds:.2f} s")


if __name__ == "__main__":
    main()
