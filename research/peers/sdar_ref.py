"""Reference outputs from SDAR's own code (JetAstra/SDAR) on a checkpoint directory, dumped to JSON.

Run with the repo venv and transformers 4.52.4 installed with ``pip --target`` (see README.md)::

    .venv/bin/python research/peers/sdar_ref.py --peer-dir runs/peers/ref/sdar \
        --transformers runs/peers/tf452 --checkpoint DIR --out FILE.json [--make-checkpoint]

The model is the peer's ``SDARForCausalLM`` (``modeling_sdar.py``); generation is the peer's own
``block_diffusion_generate`` from ``huggingface_bd3.py`` (the loop behind SDAR's paper evals), compiled out of
that file's AST because the file imports opencompass at its top. Greedy = their eval setting: temperature 1.0,
top_k 1 (x0 = argmax, confidence = the unfiltered softmax probability). ``--time`` times that loop at batch 1 (block 4,
4 steps, dynamic threshold 0.9, as their evals run it) for ``throughput.py``; see ``peer_bench.py``.
"""
from __future__ import annotations

import ast
import json
from pathlib import Path

import numpy as np
import peer_bench as pb
import peer_common as pc
import torch

REPO = "JetAstra/SDAR"
COMMIT = "c2041a8333333d685f6e15122c84f60f51f85ebd"
FILES = {"modeling_sdar.py": "training/model/SDAR-4B-Chat/modeling_sdar.py",
         "configuration_sdar.py": "training/model/SDAR-4B-Chat/configuration_sdar.py",
         "huggingface_bd3.py": "evaluation/opencompass/opencompass/models/huggingface_bd3.py"}
BD3_FUNCTIONS = ("add_gumbel_noise", "top_k_logits", "top_p_logits", "sample_with_temperature_topk_topp",
                 "get_num_transfer_tokens", "block_diffusion_generate")
PROMPT_LENGTHS = [4, 1, 6, 3, 8, 13, 10, 7]  # P % 4 = 0, 1, 2, 3 twice; P < 4 skips the prefill
RUNS = [(4, 0.9), (4, 0.95), (4, 1.0), (2, 0.9), (2, 0.95), (2, 1.0)]  # (denoising steps, threshold), block 4
TIMED = {"rule": "bd3_dynamic", "steps": 4, "threshold": 0.9}  # --time: their eval setting (block 4)
# The tiny model: Qwen3 shape, head_dim 32 != hidden / heads = 16. Special ids copy the real layout's order:
# <|endoftext|> (bos/eos/pad), <|im_start|>, <|im_end|>, <think>, </think>, <|MASK|> (no untrained padding rows):
# the last six ids of any --vocab. initializer_range 0.05 with lm_head x20: ~45% of masked positions over p 0.9,
# ~80% over 0.5 (tiny model).


def specials(vocab: int) -> tuple[int, int, int, int]:
    """<|endoftext|>, <|im_start|>, <|im_end|>, <|MASK|> of a vocabulary of ``vocab`` ids."""
    return vocab - 6, vocab - 5, vocab - 4, vocab - 1


ENDOFTEXT, IM_START, IM_END, MASK = specials(300)
TINY = dict(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=32, hidden_act="silu", max_position_embeddings=512, rms_norm_eps=1e-6,
            rope_theta=1000000, rope_scaling=None, attention_bias=False, tie_word_embeddings=False,
            use_sliding_window=False, sliding_window=None, max_window_layers=2, use_cache=False,
            initializer_range=0.05, bos_token_id=ENDOFTEXT, eos_token_id=ENDOFTEXT, pad_token_id=ENDOFTEXT,
            block_size=4, mask_token_id=MASK, fuse_cross_entropy=False, architectures=["SDARForCausalLM"],
            auto_map={"AutoConfig": "configuration_sdar.SDARConfig", "AutoModel": "modeling_sdar.SDARModel",
                      "AutoModelForCausalLM": "modeling_sdar.SDARForCausalLM"})


def load_modules(args):
    pc.use_transformers(args.transformers)
    import transformers
    from transformers.cache_utils import DynamicCache

    stub = pc.load_module_file("sdar_fused_ce_stub", pc.SHIMS / "sdar_fused_ce_stub.py")
    modeling = pc.load_peer("sdar_peer", args.peer_dir, "modeling_sdar", {"fused_linear_diffusion_cross_entropy": stub})
    path = Path(args.peer_dir) / "huggingface_bd3.py"
    tree = ast.parse(path.read_text(), filename=str(path))
    keep = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name in BD3_FUNCTIONS]
    if sorted(node.name for node in keep) != sorted(BD3_FUNCTIONS):
        raise RuntimeError(f"{path}: expected the functions {BD3_FUNCTIONS}")
    bd3 = {"torch": torch, "F": torch.nn.functional, "np": np, "DynamicCache": DynamicCache}
    exec(compile(ast.Module(body=keep, type_ignores=[]), str(path), "exec"), bd3)
    return transformers, modeling, bd3


def model_config(args) -> dict:
    """TINY with the size options of the command line; special ids and window layers follow the size."""
    config = pb.sized(TINY, args)
    endoftext, _, _, mask = specials(config["vocab_size"])
    config.update(bos_token_id=endoftext, eos_token_id=endoftext, pad_token_id=endoftext, mask_token_id=mask,
                  max_window_layers=config["num_hidden_layers"])
    return config


def make_checkpoint(modeling, args) -> None:
    torch.manual_seed(args.seed)
    values = model_config(args)
    endoftext, im_start, im_end, mask = specials(values["vocab_size"])
    model = modeling.SDARForCausalLM(modeling.SDARConfig(**values)).float().eval()
    pc.randomize_for_tests(model, mask, torch.Generator().manual_seed(args.seed + 1), head_scale=args.head_scale)
    model.generation_config.eos_token_id = [im_end, endoftext]
    model.generation_config.pad_token_id = endoftext
    if args.stop_boost:
        prompts = pc.default_prompts(PROMPT_LENGTHS, values["vocab_size"], {endoftext, im_start, im_end, mask})
        pc.boost_stop_row(model, im_end, full_logits_fn(model), prompts, 16, values["block_size"], mask)
    model.save_pretrained(args.checkpoint, safe_serialization=True)


def full_logits_fn(model):
    def run(prompt: list[int], gen_length: int, block: int, mask_id: int) -> torch.Tensor:
        x = pc.canvas(prompt, gen_length, block, mask_id)
        mask = pc.block_mask01(len(prompt), gen_length, block)[None]
        positions = torch.arange(x.shape[1])[None]
        return model(x, attention_mask=mask, position_ids=positions, use_cache=False).logits[0]
    return run


def cached_step(model, DynamicCache, context: torch.Tensor, block_tokens: torch.Tensor, block: int) -> torch.Tensor:
    """Store ``context`` (whole blocks) with store_kv=True, then one store_kv=False step on the next block.

    This is generate.py:92-106 then :131-137 (bd3 :160-170 then :203-209): the mask of the step is all ones,
    so the peer takes its flash_attn_func path (our SDPA shim).
    """
    cache = DynamicCache()
    start = context.shape[1]
    mask = pc.block_mask01(start + block, 0, block)[None]
    positions = torch.arange(start + block)[None]
    if start:
        model(context, attention_mask=mask[:, :start, :start], position_ids=positions[:, :start],
              past_key_values=cache, use_cache=True, store_kv=True)
    out = model(block_tokens, attention_mask=mask[:, start:, :], position_ids=positions[:, start:],
                past_key_values=cache, use_cache=True, store_kv=False)
    return out.logits[0]


def dump_forwards(rec, model, DynamicCache, prompts, settings) -> None:
    block, gen_length, mask_id = settings["block_length"], settings["gen_length"], settings["mask_token_id"]
    run = full_logits_fn(model)
    for index, prompt in enumerate(prompts):
        x = pc.canvas(prompt, gen_length, block, mask_id)
        full = run(prompt, gen_length, block, mask_id)
        rec.forward(f"p{index}/b{block}/full", full, mask_id, prompt=index, kind="full", tokens=x[0].tolist(),
                    positions="arange", block_size=block)
        first = len(prompt) // block * block
        filled = torch.where(x == mask_id, full.argmax(-1)[None], x)  # MASK is never argmax (asserted in the JSON)
        for name, start in (("cached_step", first), ("cached_step_after_block", first + block)):
            if start + block > x.shape[1]:
                continue
            step_tokens = x[:, start:start + block]
            logits = cached_step(model, DynamicCache, filled[:, :start], step_tokens, block)
            rec.forward(f"p{index}/b{block}/{name}", logits, mask_id, prompt=index, kind=name,
                        cache_tokens=filled[0, :start].tolist(), tokens=step_tokens[0].tolist(),
                        positions=list(range(start, start + block)), block_size=block)


def bd3_generate(model, bd3, calls, settings, prompt, steps, threshold) -> dict:
    """One prompt through bd3's loop, greedy; ``tokens`` trimmed as bd3 trims."""
    mask_id, stop_ids = settings["mask_token_id"], settings["stop_ids"]
    torch.manual_seed(0)  # multinomial over a one-hot distribution (top_k 1): deterministic anyway
    calls[0] = 0
    ids = torch.tensor([prompt])
    x = bd3["block_diffusion_generate"](
        model, None, {"input_ids": ids, "attention_mask": torch.ones_like(ids)}, mask_id=mask_id,
        gen_length=settings["gen_length"], block_length=settings["block_length"], denoising_steps=steps,
        temperature=1.0, top_k=1, top_p=1.0, remasking="low_confidence", threshold=threshold,
        stopping_criteria_idx=stop_ids)
    raw = x[0, len(prompt):].tolist()  # huggingface_bd3.py:779: outputs = x[:, P:]
    # bd3 :781-784 trims text: drop '<|MASK|>', cut before the first stop string; same on ids:
    tokens = [t for t in pc.trim_at_stop(raw, stop_ids, keep_stop=False) if t != mask_id]
    return {"tokens": tokens, "raw": raw, "stopped": any(t in stop_ids for t in raw), "num_forwards": calls[0],
            "mask_in_raw": mask_id in raw}


def dump_generations(rec, model, bd3, prompts, settings) -> None:
    calls = pc.count_calls(model)
    for index, prompt in enumerate(prompts):
        for steps, threshold in RUNS:
            result = bd3_generate(model, bd3, calls, settings, prompt, steps, threshold)
            rec.generation(prompt=index, prompt_ids=prompt, rule="bd3_dynamic" if threshold < 1 else "bd3_static",
                           gen_length=settings["gen_length"], block_length=settings["block_length"], steps=steps,
                           threshold=threshold, temperature=1.0, top_k=1, top_p=1.0, **result)


def setup(args) -> tuple[dict, dict, dict, list[list[int]]]:
    """config.json, generation_config.json, the run's settings and its prompts."""
    config = pc.read_json(Path(args.checkpoint) / "config.json")
    generation = pc.read_json(Path(args.checkpoint) / "generation_config.json")
    # config.json, else tokenizer_config's mask_token "<|MASK|>" (added_tokens.json spells it "<MASK>"; same id)
    mask_id = pc.first_given(args.mask_id, config.get("mask_token_id"),
                             pc.token_id(args.checkpoint, ("<|MASK|>", "<MASK>")))
    if mask_id is None:
        raise SystemExit("no MASK id: config.json has no mask_token_id and no tokenizer names <|MASK|>; pass --mask-id")
    eos = generation.get("eos_token_id", config.get("eos_token_id"))
    settings = {"block_length": config.get("block_size", 4), "gen_length": args.gen_length,
                "mask_token_id": mask_id, "stop_ids": sorted(set(eos if isinstance(eos, list) else [eos]))}
    if args.time:
        settings.update(TIMED)
    prompts = pc.read_prompts(args.prompts, pb.lengths(args) if args.time else PROMPT_LENGTHS, config["vocab_size"],
                              pc.special_ids(args.checkpoint, config, generation) | {mask_id})
    return config, generation, settings, prompts


def main(argv=None) -> None:
    args = pb.add_options(pc.argument_parser(__doc__, default_gen=16), moe=False).parse_args(argv)
    transformers, modeling, bd3 = load_modules(args)
    if args.make_checkpoint:
        make_checkpoint(modeling, args)
    if not args.out:
        return
    if args.time:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = modeling.SDARForCausalLM.from_pretrained(args.checkpoint, torch_dtype=getattr(torch, args.dtype),
                                                     attn_implementation="sdpa").eval()
    config, generation, settings, prompts = setup(args)
    header = {"family": "sdar", "peer": pc.peer_record(args.peer_dir, REPO, COMMIT, FILES),
              "environment": pc.environment(transformers, args.dtype),
              "checkpoint": str(Path(args.checkpoint).resolve()), "config": config, "generation_config": generation,
              "settings": settings, "prompts": prompts}
    if args.time:
        calls = pc.count_calls(model)
        pb.write_timing(args, header, pb.timed_loop(lambda prompt: bd3_generate(
            model, bd3, calls, settings, prompt, TIMED["steps"], TIMED["threshold"]), prompts))
        return
    rec = pc.Recorder(args.out, {**header, "notes": [
        "logits: no shift (position i predicts token i)",
        "stop ids: generation_config eos (bd3 takes the first token of each stop string)",
        "tokens: x[P:] cut before the first stop id, MASK ids dropped (bd3 :779-784); raw: x[P:]"]})
    with torch.no_grad():
        from transformers.cache_utils import DynamicCache

        dump_forwards(rec, model, DynamicCache, prompts, settings)
        dump_generations(rec, model, bd3, prompts, settings)
    rec.save()
    print(json.dumps({"out": args.out, "forwards": len(rec.report["forwards"]),
                      "generations": len(rec.report["generations"])}))


if __name__ == "__main__":
    main()
