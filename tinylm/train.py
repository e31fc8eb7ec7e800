"""Train the shipped tiny masked-diffusion model (LLaDA recipe, adapted to learn on 2 CPU cores).

    python -m tinylm.train --minutes 120 --work .tiny_train --out assets/tiny --threads 2   # resumable
    python -m tinylm.train --init assets/tiny --work .tiny_train2 ...      # warm start from shipped weights
    python -m tinylm.train --device cuda --batch-size 256 ...             # the same script on a GPU

The model: 4 layers, d 128, 4 heads, SwiGLU 512, tied embeddings (1.1M parameters, 2.3 MB in bf16),
on the word-level tokenizer (``tinylm/tokenizer.py``: one token per number), so an answer of n numbers
is n tokens and answers span 1 to 8 blocks. Each number's embedding starts as sinusoidal features of its
value, so the successor ``n -> n + 1`` starts as one rotation rather than a table to memorise.

Recipe (LLaDA SFT: prompt never masked, answer padded with EOS, masked positions' cross-entropy
weighted by 1/t), with the changes the trial notes (shared/design/TINY_MODEL_TRIAL.md) called for:
* "semi-autoregressive" examples (75%): blocks before a chosen current block are clean, the current
  block is masked with ratio t ~ U(0, 1], later blocks are fully masked (loss weight 0.25), as the
  decoder sees them; the rest are plain LLaDA masking over the whole canvas;
* the canvas ends a random number of blocks after the current one, independent of the answer length,
  so the model cannot read the answer length off the canvas (the trial's leak);
* EOS padding after the terminating EOS is down-weighted (0.2): it is trivial and would dominate;
* float32 on CPU (bf16 matmuls are ~8x slower on these AMD cores), bf16 autocast on CUDA; AdamW with
  warmup and cosine decay; seeded; resumable (``--work`` keeps model, optimizer, RNG states, step and
  the best score);
* every ``--validate-every`` steps the candidate is exported, read back as shipped (bf16 weights) and
  scored on a validation split (disjoint from held-out and demo) with the engine's default decoding;
  ``--out`` receives a candidate only when it beats the best score so far (exact match, then the right
  stop block), so the shipped checkpoint is the best validated one, not the last.
"""
from __future__ import annotations

import argparse
import json
import math
import random
import shutil
import time
from dataclasses import asdict
from pathlib import Path

import torch
import torch.nn.functional as F

from engine.models.transformer import BidirectionalTransformer, TransformerConfig
from tinylm.export import llada_config_json, save_checkpoint
from tinylm.evaluate import evaluate_model, selection_score
from tinylm.tasks import example_key, make_example, make_split, write_jsonl
from tinylm.tokenizer import BOS, EOS, MASK, MAX_NUMBER, save_tokenizer

BLOCK = 32
CANVAS_BLOCKS = 8  # the engine's default max_new_tokens=256
HELDOUT_SEED, DEMO_SEED, VALIDATION_SEED = 1234, 5678, 4321
HELDOUT_SIZE, DEMO_SIZE, VALIDATION_SIZE = 200, 2400, 64


def tiny_config(vocab_size: int) -> TransformerConfig:
    return TransformerConfig(vocab_size=vocab_size, hidden_size=128, num_layers=4, num_heads=4,
                             num_kv_heads=4, intermediate_size=512, rope_theta=10000.0,
                             rms_norm_eps=1e-5, max_position_embeddings=512, tie_word_embeddings=True)


def initialize(model: BidirectionalTransformer, tokenizer, seed: int) -> None:
    """Small normal init; each number's (tied) embedding starts as sinusoidal features of its value,
    so ``n -> n + 1`` begins as one fixed rotation for every n instead of a table to memorise."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if parameter.dim() == 2:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.02)
        embedding = model.embed_tokens.weight
        pairs = embedding.shape[1] // 2 - 8
        periods = torch.logspace(math.log10(3.0), math.log10(4.0 * MAX_NUMBER), pairs)
        numbers = torch.arange(MAX_NUMBER + 1, dtype=torch.float32)[:, None]
        angles = 2 * math.pi * numbers / periods[None, :]
        features = torch.cat([angles.sin(), angles.cos()], dim=1) * 0.02 * math.sqrt(2.0)
        rows = torch.tensor(tokenizer.convert_tokens_to_ids([str(n) for n in range(MAX_NUMBER + 1)]))
        embedding[rows, : 2 * pairs] = features


def write_datasets(data_dir: Path) -> tuple[set, list]:
    """Held-out (scored), validation (checkpoint selection) and demo splits, disjoint."""
    heldout = make_split(HELDOUT_SEED, HELDOUT_SIZE)
    validation = make_split(VALIDATION_SEED, VALIDATION_SIZE, exclude={example_key(e) for e in heldout})
    excluded = {example_key(e) for e in heldout + validation}
    demo = make_split(DEMO_SEED, DEMO_SIZE, exclude=excluded)
    write_jsonl(heldout, data_dir / "heldout.jsonl", "heldout")
    write_jsonl(demo, data_dir / "demo.jsonl", "demo")
    return excluded, [{"id": f"validation-{i:05d}", **asdict(e)} for i, e in enumerate(validation)]


def build_example(rng: random.Random, tokenizer, heldout: set, ids: dict, last_block: int):
    while True:
        example = make_example(rng)
        if example_key(example) not in heldout:
            break
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": example.prompt}],
                                           add_generation_prompt=True, tokenize=True, return_dict=False)
    answer = tokenizer(example.answer)["input_ids"] + [ids["eos"]]
    eos_block = (len(answer) - 1) // BLOCK
    target = answer + [ids["eos"]] * (CANVAS_BLOCKS * BLOCK - len(answer))
    weights = [1.0] * len(answer) + [0.2] * (CANVAS_BLOCKS * BLOCK - len(answer))
    t = max(rng.random(), 1e-3)
    if rng.random() < 0.75:  # semi-autoregressive: the state the block decoder is in
        current = rng.randint(0, min(last_block, eos_block + 1))
        last = last_block
        masked = [False] * (current * BLOCK)
        masked += [rng.random() < t for _ in range(BLOCK)]
        masked += [True] * ((last - current) * BLOCK)
        scale = [0.0] * (current * BLOCK) + [1.0 / t] * BLOCK + [0.25] * ((last - current) * BLOCK)
        noisy = range(current * BLOCK, (current + 1) * BLOCK)
    else:  # plain LLaDA masking over the whole canvas
        last = last_block
        masked = [rng.random() < t for _ in range((last + 1) * BLOCK)]
        scale = [1.0 / t] * ((last + 1) * BLOCK)
        noisy = range(len(masked))
    width = (last + 1) * BLOCK
    if not any(masked[i] for i in noisy):
        masked[rng.choice(noisy)] = True
    inputs = prompt + [ids["mask"] if m else tok for m, tok in zip(masked, target[:width])]
    labels = [-100] * len(prompt) + [tok if m else -100 for m, tok in zip(masked, target[:width])]
    loss_weights = [0.0] * len(prompt) + [w * s if m else 0.0 for m, w, s in
                                          zip(masked, weights[:width], scale)]
    return inputs, labels, loss_weights


def make_batch(rng, tokenizer, heldout, ids, batch_size):
    # One canvas end per batch (drawn independently of the answers) keeps the padded width small.
    last_block = rng.randint(0, CANVAS_BLOCKS - 1) if rng.random() < 0.5 else CANVAS_BLOCKS - 1
    rows = [build_example(rng, tokenizer, heldout, ids, last_block) for _ in range(batch_size)]
    width = max(len(r[0]) for r in rows)
    input_ids = torch.full((batch_size, width), ids["eos"], dtype=torch.long)
    labels = torch.full((batch_size, width), -100, dtype=torch.long)
    weights = torch.zeros(batch_size, width)
    key_mask = torch.zeros(batch_size, width, dtype=torch.bool)
    positions = torch.zeros(batch_size, width, dtype=torch.long)
    for row, (inputs, row_labels, row_weights) in enumerate(rows):
        pad = width - len(inputs)  # left padding, positions from each row's first real token
        input_ids[row, pad:] = torch.tensor(inputs)
        labels[row, pad:] = torch.tensor(row_labels)
        weights[row, pad:] = torch.tensor(row_weights)
        key_mask[row, pad:] = True
        positions[row, pad:] = torch.arange(len(inputs))
    return input_ids, positions, key_mask, labels, weights


def learning_rate(step: int, progress: float, peak: float, warmup: int = 200) -> float:
    """Linear warmup, then cosine decay to 10% by ``progress`` (fraction of the step or time budget)."""
    if step < warmup:
        return peak * (step + 1) / warmup
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def export(model: BidirectionalTransformer, tokenizer, out: Path, ids: dict) -> None:
    save_checkpoint(model, out, "llada", llada_config_json(model.config, ids["mask"], ids["eos"], ids["eos"]))
    tokenizer.save_pretrained(str(out))
    (out / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": ids["bos"], "eos_token_id": ids["eos"], "pad_token_id": ids["eos"]}) + "\n")


def save_state(path: Path, model, optimizer, rng, step: int, elapsed: float, best: dict) -> None:
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "rng": rng.getstate(),
                "torch_rng": torch.get_rng_state(), "step": step, "elapsed": elapsed, "best": best},
               path.with_suffix(".tmp"))
    path.with_suffix(".tmp").replace(path)


def validate(model, tokenizer, out: Path, work: Path, ids: dict, validation: list, step: int,
             best: dict) -> dict:
    """Export a candidate, score it as shipped (bf16 weights read back), keep it if it is the best."""
    from engine.models import load_model
    candidate = work / "candidate"
    export(model, tokenizer, candidate, ids)
    report = evaluate_model(load_model(candidate, dtype="float32"), validation)
    score = selection_score(report)
    print(f"validation at step {step}: exact {report['exact_match']:.1%} right block "
          f"{report['right_block']:.1%} blocks {report['decoded_blocks_histogram']} "
          f"({report['seconds']:.0f} s)", flush=True)
    if score > best.get("score", float("-inf")):
        best = {"score": score, "step": step, "exact_match": report["exact_match"],
                "right_block": report["right_block"], "near_block": report["near_block"]}
        staging = out.with_name(out.name + ".staging")
        shutil.rmtree(staging, ignore_errors=True)
        shutil.copytree(candidate, staging)
        (staging / "training.json").write_text(json.dumps({"validation": best}, indent=2) + "\n")
        shutil.rmtree(out, ignore_errors=True)
        staging.replace(out)
        print(f"  new best: exported to {out}", flush=True)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=110.0, help="wall-clock training budget")
    parser.add_argument("--steps", type=int, default=20000, help="schedule length (cosine horizon)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work", type=Path, default=Path(".tiny_train"), help="resumable state")
    parser.add_argument("--out", type=Path, default=Path("assets/tiny"))
    parser.add_argument("--data", type=Path, default=Path("assets/data"))
    parser.add_argument("--init", type=Path, default=None,
                        help="warm start from a checkpoint with this tokenizer (e.g. assets/tiny)")
    parser.add_argument("--validate-every", type=int, default=500, help="steps between selections")
    parser.add_argument("--validation-prompts", type=int, default=VALIDATION_SIZE,
                        help="validation prompts scored at each selection")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()

    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    excluded, validation = write_datasets(args.data)
    validation = validation[:args.validation_prompts]
    tokenizer = save_tokenizer(args.work / "tokenizer")
    ids = {"eos": tokenizer.convert_tokens_to_ids(EOS), "mask": tokenizer.convert_tokens_to_ids(MASK),
           "bos": tokenizer.convert_tokens_to_ids(BOS)}
    model = BidirectionalTransformer(tiny_config(len(tokenizer)))
    initialize(model, tokenizer, args.seed)
    if args.init is not None:
        from engine.models import load_model
        model.load_state_dict(load_model(args.init, dtype="float32").transformer.state_dict())
        print(f"warm start from {args.init}", flush=True)
    model.to(args.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.98), weight_decay=0.01)
    rng, step, elapsed, best = random.Random(args.seed), 0, 0.0, {}
    state_file = args.work / "state.pt"
    if state_file.is_file():
        state = torch.load(state_file, weights_only=False, map_location=args.device)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        rng.setstate(state["rng"])
        torch.set_rng_state(state["torch_rng"])
        step, elapsed, best = state["step"], state["elapsed"], state.get("best", {})
        print(f"resumed at step {step} ({elapsed / 60:.1f} min trained, best {best})", flush=True)
    args.work.mkdir(parents=True, exist_ok=True)
    session_start, running_loss = time.time(), None
    budget_end = session_start + args.minutes * 60
    # bf16 autocast on CUDA only: on this project's AMD CPUs bf16 matmuls are ~8x slower than float32.
    autocast = torch.autocast(device_type=torch.device(args.device).type, dtype=torch.bfloat16,
                              enabled=torch.device(args.device).type == "cuda")
    while step < args.steps and time.time() < budget_end:
        input_ids, positions, key_mask, labels, weights = (
            t.to(args.device) for t in make_batch(rng, tokenizer, excluded, ids, args.batch_size))
        lr = learning_rate(step, step / args.steps, args.lr)
        for group in optimizer.param_groups:
            group["lr"] = lr
        with autocast:
            hidden = model.forward_full(input_ids, positions, key_mask)
            selected = labels != -100
            logits = model.logits(hidden[selected]).float()
        losses = F.cross_entropy(logits, labels[selected], reduction="none")
        loss = (losses * weights[selected]).sum() / selected.sum().clamp(min=1)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        step += 1
        running_loss = loss.item() if running_loss is None else 0.98 * running_loss + 0.02 * loss.item()
        trained = elapsed + time.time() - session_start
        if step % 50 == 0:
            print(f"step {step} loss {running_loss:.4f} lr {lr:.2e} {trained / 60:.1f} min", flush=True)
        if step % args.validate_every == 0:
            model.eval()
            best = validate(model, tokenizer, args.out, args.work, ids, validation, step, best)
            model.train()
            save_state(state_file, model, optimizer, rng, step, elapsed + time.time() - session_start, best)
    best = validate(model.eval(), tokenizer, args.out, args.work, ids, validation, step, best)
    save_state(state_file, model, optimizer, rng, step, elapsed + time.time() - session_start, best)
    print(f"done: {step} steps, loss {running_loss}, best {best}", flush=True)


if __name__ == "__main__":
    main()
