"""Reference outputs from LLaDA2's own HF modeling (dllm's copy of the checkpoint's remote code) dumped to JSON.

Run with the repo venv and transformers 4.57.1 installed with ``pip --target`` (see README.md)::

    .venv/bin/python research/peers/llada2_ref.py --peer-dir runs/peers/ref/llada2 \
        --transformers runs/peers/tf457 --checkpoint DIR --out FILE.json [--make-checkpoint] [--mask-id ID]

The model is the peer's ``LLaDA2MoeModelLM`` (SDPA attention, never eager: the eager path turns the peer's
0/-inf block mask into a uniform one). Two changes are made to the loaded instance, nothing else:
``forward`` casts the peer's bfloat16 block mask to the model dtype (float32 SDPA refuses a bf16 mask), and
``_sample_with_temperature_topk_topp`` is greedy: argmax and its probability under the untempered full
softmax (the peer calls ``torch.multinomial`` even at temperature 0). SGLang's LowConfidence rule is run
on the same forward (``low_confidence_generate`` below). ``--time`` times ``generate`` at batch 1 (block 32,
32 steps, threshold 0.95, greedy as above) for ``throughput.py``; see ``peer_bench.py``.
"""
from __future__ import annotations

import json
from pathlib import Path

import peer_bench as pb
import peer_common as pc
import torch

REPO = "ZHZisZZ/dllm"
COMMIT = "d8cc1190ddbe47a7c38fd0eb5d29d3a0b12043c5"
FILES = {"modeling_llada2_moe.py": "dllm/pipelines/llada2/models/modeling_llada2_moe.py",
         "configuration_llada2_moe.py": "dllm/pipelines/llada2/models/configuration_llada2_moe.py"}
SGLANG = ("sgl-project/sglang python/sglang/srt/dllm/algorithm/low_confidence.py"
          " @0564b5215b333749d722348c3b3d9b92c3de8c44")
PROMPT_LENGTHS = [32, 1, 10, 19, 28, 13, 30, 31]  # P % 8 = 0..7 and P % 32 = 0, 1, 10, 19, 28, 13, 30, 31
BLOCKS = (8, 32)
# (rule, block, threshold, gen_length or None = --gen-length, eos_early_stop); steps = block for the peer.
RUNS = [("l2hf_generate", 8, 0.95, None, False), ("l2hf_generate", 8, 0.5, None, False),
        ("l2hf_generate", 32, 0.95, None, False), ("l2hf_generate", 32, 0.5, None, False),
        ("l2hf_generate", 8, 0.95, None, True),
        ("l2hf_generate", 32, 0.95, 16, False),  # gen 16 < steps 32: the peer cuts steps to 16 (quota 2)
        ("sglang_low_confidence", 8, 0.95, None, False), ("sglang_low_confidence", 8, 0.5, None, False),
        ("sglang_low_confidence", 32, 0.95, None, False), ("sglang_low_confidence", 32, 0.5, None, False)]
TIMED = {"rule": "l2hf_generate", "block_length": 32, "steps": 32, "threshold": 0.95}  # --time: generate's defaults
# Tiny model; special ids keep the real order: <|endoftext|> (eos/pad) then <|mask|> three ids later, the last
# id of any --vocab. initializer_range 0.03 with lm_head x20: ~30% of masked positions over p 0.95, ~75% over 0.5.


def specials(vocab: int) -> tuple[int, int]:
    """<|endoftext|>, <|mask|> of a vocabulary of ``vocab`` ids."""
    return vocab - 4, vocab - 1


ENDOFTEXT, MASK = specials(300)
TINY = dict(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=32, hidden_act="silu", use_qkv_bias=False, use_qk_norm=True,
            use_bias=False, rms_norm_eps=1e-6, norm_head=False, tie_word_embeddings=False, embedding_dropout=0.0,
            attention_dropout=0.0, output_dropout=0.0, initializer_range=0.03, max_position_embeddings=512,
            rope_theta=600000, rope_scaling=None, pad_token_id=ENDOFTEXT, eos_token_id=ENDOFTEXT, num_experts=8,
            num_shared_experts=1, num_experts_per_tok=2, n_group=4, topk_group=2, routed_scaling_factor=2.5,
            moe_intermediate_size=32, first_k_dense_replace=1, partial_rotary_factor=0.5, rotary_dim=16,
            norm_topk_prob=True, router_dtype="fp32", score_function="sigmoid", moe_router_enable_expert_bias=True,
            use_cache=False, architectures=["LLaDA2MoeModelLM"],
            auto_map={"AutoConfig": "configuration_llada2_moe.LLaDA2MoeConfig",
                      "AutoModel": "modeling_llada2_moe.LLaDA2MoeModel",
                      "AutoModelForCausalLM": "modeling_llada2_moe.LLaDA2MoeModelLM"})


def model_config(args) -> dict:
    """TINY with the size options of the command line; eos/pad and the rotary width follow the size."""
    config = pb.sized(TINY, args)
    endoftext, _ = specials(config["vocab_size"])
    config.update(pad_token_id=endoftext, eos_token_id=endoftext,
                  rotary_dim=int(config["head_dim"] * config["partial_rotary_factor"]))
    return config


def make_checkpoint(modeling, args) -> None:
    torch.manual_seed(args.seed)
    values = model_config(args)
    endoftext, mask = specials(values["vocab_size"])
    model = modeling.LLaDA2MoeModelLM(modeling.LLaDA2MoeConfig(**values)).float().eval()
    generator = torch.Generator().manual_seed(args.seed + 1)
    pc.randomize_for_tests(model, mask, generator, head_scale=args.head_scale)
    with torch.no_grad():
        for name, buffer in model.named_buffers():
            if name.endswith("gate.expert_bias"):
                buffer.copy_(torch.randn(buffer.shape, generator=generator) * 0.1)
    model.generation_config.eos_token_id = endoftext
    model.generation_config.pad_token_id = endoftext
    if args.stop_boost:
        prompts = pc.default_prompts(PROMPT_LENGTHS, values["vocab_size"], {endoftext, mask})
        pc.boost_stop_row(model, endoftext, full_logits_fn(model), prompts, 32, 8, mask)
    model.save_pretrained(args.checkpoint, safe_serialization=True)


def patch_instance(model) -> None:
    """Cast the peer's bf16 block mask to the model dtype; make the peer's sampler greedy (SGLang's confidence)."""
    inner = model.forward

    def forward(*args, attention_mask=None, **kwargs):
        if attention_mask is not None and attention_mask.is_floating_point():
            attention_mask = attention_mask.to(model.dtype)  # 0 / -inf survive the cast exactly
        return inner(*args, attention_mask=attention_mask, **kwargs)

    def greedy(logits, temperature=None, top_k=None, top_p=None):
        x0 = logits.argmax(dim=-1)
        return x0, torch.softmax(logits, dim=-1).gather(-1, x0[..., None])[..., 0]

    model.forward = forward
    model._sample_with_temperature_topk_topp = greedy


def block_mask(prompt_length: int, gen_length: int, block: int) -> torch.Tensor:
    """The peer's mask (modeling_llada2_moe.py:1340-1348: 0/1 tril ``.log()``), kept float32, ``[1, 1, T, T]``."""
    return pc.block_mask01(prompt_length, gen_length, block).log()[None, None]


def full_logits_fn(model):
    def run(prompt: list[int], gen_length: int, block: int, mask_id: int, end: int | None = None) -> torch.Tensor:
        x = pc.canvas(prompt, gen_length, block, mask_id)[:, :end]
        mask = block_mask(len(prompt), gen_length, block)[..., :x.shape[1], :x.shape[1]]
        return model(x, attention_mask=mask, position_ids=torch.arange(x.shape[1])[None]).logits[0]
    return run


def step_logits(model, tokens: torch.Tensor, block: int) -> torch.Tensor:
    """The peer's step (:1363-1388): a forward over ``x[:, :block_end]``, logits of the last block (no KV cache)."""
    end = tokens.shape[1]
    mask = block_mask(end, 0, block)
    return model(tokens, attention_mask=mask, position_ids=torch.arange(end)[None]).logits[0, -block:]


def dump_forwards(rec, model, prompts, gen_length: int, mask_id: int) -> None:
    run = full_logits_fn(model)
    for block in BLOCKS:
        for index, prompt in enumerate(prompts):
            x = pc.canvas(prompt, gen_length, block, mask_id)
            full = run(prompt, gen_length, block, mask_id)
            rec.forward(f"p{index}/b{block}/full", full, mask_id, prompt=index, kind="full", tokens=x[0].tolist(),
                        positions="arange", block_size=block)
            first = len(prompt) // block * block
            filled = torch.where(x == mask_id, full.argmax(-1)[None], x)  # MASK is never argmax (see mask_is_argmax)
            for name, start in (("cached_step", first), ("cached_step_after_block", first + block)):
                if start + block > x.shape[1]:
                    continue
                tokens = torch.cat([filled[:, :start], x[:, start:start + block]], dim=1)
                rec.forward(f"p{index}/b{block}/{name}", step_logits(model, tokens, block), mask_id, prompt=index,
                            kind=name, cache_tokens=tokens[0, :start].tolist(), tokens=tokens[0, start:].tolist(),
                            positions=list(range(start, start + block)), block_size=block)


def low_confidence_step(logits: torch.Tensor, block_ids: torch.Tensor, mask_id: int, threshold: float) -> torch.Tensor:
    """One step of SGLang's LowConfidence on ``[rows, B]`` (our rewrite of ``LowConfidence.step``, see SGLANG).

    Greedy x = argmax, confidence = its full-softmax probability on masked positions (-inf elsewhere); commit every
    position with confidence > threshold (strict), or, in rows where none passes, the most confident one.
    """
    masked = block_ids == mask_id
    x = logits.argmax(dim=-1)
    confidence = torch.softmax(logits, dim=-1).gather(-1, x[..., None])[..., 0]
    confidence = torch.where(masked, confidence, -float("inf"))
    commit = confidence > threshold
    top1 = torch.zeros_like(commit)
    top1[torch.arange(commit.shape[0]), confidence.argmax(dim=1)] = True
    commit = torch.where(commit.any(dim=1, keepdim=True), commit, top1)
    return torch.where(commit & masked, x, block_ids)


def low_confidence_generate(model, prompt, mask_id, eos_id, gen_length, block, threshold) -> torch.Tensor:
    """LowConfidence steps in the peer generate's layout (absolute blocks, block-causal mask, no cache); a block
    ends when it holds no MASK, the request after the block holding eos; the answer is trimmed as the peer does."""
    x = pc.canvas(prompt, gen_length, block, mask_id)
    length = len(prompt)
    for start in range(length // block * block, x.shape[1], block):
        end = start + block
        while (x[0, start:end] == mask_id).any():
            logits = step_logits(model, x[:, :end], block)[None]
            x[:, start:end] = low_confidence_step(logits, x[:, start:end], mask_id, threshold)
        if (x[0, length:end] == eos_id).any():
            break
    return x[:, length:length + gen_length]


def run_generation(model, calls, settings, prompt, rule, block, threshold, gen_length, early) -> dict:
    """One prompt through the peer's ``generate`` (or the LowConfidence rule); ``tokens`` as the peer returns them,
    less the prompt where its early-stop path returns it."""
    mask_id, eos_id = settings["mask_token_id"], settings["eos_id"]
    calls[0] = 0
    if rule == "l2hf_generate":
        out = model.generate(inputs=torch.tensor([prompt]), temperature=0.0, block_length=block, steps=block,
                             gen_length=gen_length, eos_early_stop=early, threshold=threshold, eos_id=eos_id,
                             mask_id=mask_id)[0].tolist()
    else:
        raw = low_confidence_generate(model, prompt, mask_id, eos_id, gen_length, block, threshold)[0].tolist()
        out = pc.trim_at_stop(raw, [eos_id], keep_stop=True)  # as the peer's :1419-1431
    with_prompt = early and len(out) > len(prompt) and out[:len(prompt)] == prompt and out[-1] == eos_id
    return {"returned": out, "returned_with_prompt": with_prompt, "tokens": out[len(prompt):] if with_prompt else out,
            "stopped": eos_id in out, "num_forwards": calls[0], "mask_in_output": mask_id in out}


def dump_generations(rec, model, prompts, settings) -> None:
    calls = pc.count_calls(model)
    for index, prompt in enumerate(prompts):
        for rule, block, threshold, gen_length, early in RUNS:
            gen_length = gen_length or settings["gen_length"]
            result = run_generation(model, calls, settings, prompt, rule, block, threshold, gen_length, early)
            rec.generation(prompt=index, prompt_ids=prompt, rule=rule, gen_length=gen_length, block_length=block,
                           steps=block, effective_steps=min(block, gen_length), threshold=threshold,
                           eos_early_stop=early, **result)


def load(args):
    pc.use_transformers(args.transformers)
    import transformers

    modeling = pc.load_peer("llada2_peer", args.peer_dir, "modeling_llada2_moe")
    return transformers, modeling


def setup(args) -> tuple[dict, dict, dict, list[list[int]]]:
    """config.json, generation_config.json, the run's settings and its prompts."""
    config = pc.read_json(Path(args.checkpoint) / "config.json")
    generation = pc.read_json(Path(args.checkpoint) / "generation_config.json")
    mask_id = pc.first_given(args.mask_id, config.get("mask_token_id"), pc.token_id(args.checkpoint, ("<|mask|>",)))
    if mask_id is None:
        raise SystemExit("no MASK id: config.json has none and no tokenizer names <|mask|>; pass --mask-id")
    eos_id = pc.first_id(generation.get("eos_token_id", config.get("eos_token_id")))
    settings = {"gen_length": args.gen_length, "mask_token_id": mask_id, "eos_id": eos_id}
    if args.time:
        settings.update(TIMED, effective_steps=min(TIMED["steps"], args.gen_length), eos_early_stop=False)
    else:
        fields = ("rule", "block", "threshold", "gen_length", "eos_early_stop")
        settings.update(blocks=list(BLOCKS), runs=[dict(zip(fields, run)) for run in RUNS])
    prompts = pc.read_prompts(args.prompts, pb.lengths(args) if args.time else PROMPT_LENGTHS, config["vocab_size"],
                              pc.special_ids(args.checkpoint, config, generation) | {mask_id})
    return config, generation, settings, prompts


def main(argv=None) -> None:
    args = pb.add_options(pc.argument_parser(__doc__, default_gen=32), moe=True).parse_args(argv)
    transformers, modeling = load(args)
    if args.make_checkpoint:
        make_checkpoint(modeling, args)
    if not args.out:
        return
    if args.time:
        torch.set_num_threads(args.threads)
    model = modeling.LLaDA2MoeModelLM.from_pretrained(args.checkpoint, dtype=getattr(torch, args.dtype),
                                                      attn_implementation="sdpa").eval()
    assert model.config._attn_implementation == "sdpa"
    patch_instance(model)
    config, generation, settings, prompts = setup(args)
    header = {"family": "llada2", "peer": pc.peer_record(args.peer_dir, REPO, COMMIT, FILES), "sglang_rule": SGLANG,
              "environment": pc.environment(transformers, args.dtype),
              "checkpoint": str(Path(args.checkpoint).resolve()), "config": config, "generation_config": generation,
              "settings": settings, "prompts": prompts}
    if args.time:
        calls = pc.count_calls(model)
        pb.write_timing(args, header, pb.timed_loop(lambda prompt: run_generation(
            model, calls, settings, prompt, TIMED["rule"], TIMED["block_length"], TIMED["threshold"],
            args.gen_length, False), prompts))
        return
    rec = pc.Recorder(args.out, {**header, "notes": [
        "logits: no shift (position i predicts token i); no KV cache: a step is a forward over "
        "x[:, :block_end] and its last block's logits",
        "l2hf_generate: the peer's generate with the greedy sampler; returned = what it returns "
        "(with the prompt when eos_early_stop fires, :1405-1411), tokens = returned without the prompt",
        "sglang_low_confidence: SGLang's step rule; stop/trim as l2hf_generate (SGLang's request "
        "bookkeeping is not reproduced); num_forwards counts this harness's forwards"]})
    with torch.no_grad():
        dump_forwards(rec, model, prompts, args.gen_length, mask_id=settings["mask_token_id"])
        dump_generations(rec, model, prompts, settings)
    rec.save()
    print(json.dumps({"out": args.out, "forwards": len(rec.report["forwards"]),
                      "generations": len(rec.report["generations"])}))


if __name__ == "__main__":
    main()
