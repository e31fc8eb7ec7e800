"""Train the shipped tiny masked-diffusion model (LLaDA recipe, adapted to learn on 2 CPU cores).

    python -m tinylm.train --minutes 110 --work .tiny_train --out assets/tiny      # resumable

Recipe (LLaDA SFT: prompt never masked, answer padded with EOS, masked positions' cross-entropy
weighted by 1/t), with the changes the trial notes (shared/design/TINY_MODEL_TRIAL.md) called for:
* "semi-autoregressive" examples (most of them): blocks before a chosen current block are clean, the
  current block is masked with ratio t ~ U(0, 1], later blocks are fully masked (loss weight 0.25), as
  the decoder sees them;
* the canvas ends a random number of blocks after the current one, independent of the answer length,
  so the model cannot read the answer length off the canvas (the trial's leak) and learns to fill any
  canvas;
* EOS padding after the terminating EOS is down-weighted (0.2): it is trivial and would dominate;
* bf16 autocast on CPU (2x faster there), AdamW with warmup and cosine decay, seeded, resumable.
"""
from __future__ import annotations

import argparse
import json
import math
import random
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from engine.models.transformer import BidirectionalTransformer, TransformerConfig
from tinylm.export import llada_config_json, save_checkpoint
from tinylm.tasks import example_key, make_example, make_split, write_jsonl
from tinylm.tokenizer import BOS, EOS, MASK, build_tokenizer, save_tokenizer

BLOCK = 32
CANVAS_BLOCKS = 8  # the engine's default max_new_tokens=256
TINY_CONFIG = TransformerConfig(vocab_size=104, hidden_size=256, num_layers=4, num_heads=4,
                                num_kv_heads=4, intermediate_size=768, rope_theta=10000.0,
                                rms_norm_eps=1e-5, max_position_embeddings=512)
HELDOUT_SEED, DEMO_SEED, HELDOUT_SIZE, DEMO_SIZE = 1234, 5678, 200, 2400


def write_datasets(data_dir: Path) -> set:
    heldout = make_split(HELDOUT_SEED, HELDOUT_SIZE)
    demo = make_split(DEMO_SEED, DEMO_SIZE, exclude={example_key(e) for e in heldout})
    write_jsonl(heldout, data_dir / "heldout.jsonl", "heldout")
    write_jsonl(demo, data_dir / "demo.jsonl", "demo")
    return {example_key(e) for e in heldout}


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=110.0, help="wall-clock training budget")
    parser.add_argument("--steps", type=int, default=6000, help="schedule length (cosine horizon)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work", type=Path, default=Path(".tiny_train"), help="resumable state")
    parser.add_argument("--out", type=Path, default=Path("assets/tiny"))
    parser.add_argument("--data", type=Path, default=Path("assets/data"))
    parser.add_argument("--export-every", type=int, default=250)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    heldout = write_datasets(args.data)
    tokenizer = save_tokenizer(args.out)
    ids = {"eos": tokenizer.convert_tokens_to_ids(EOS), "mask": tokenizer.convert_tokens_to_ids(MASK),
           "bos": tokenizer.convert_tokens_to_ids(BOS)}
    model = BidirectionalTransformer(TINY_CONFIG).to(args.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.98), weight_decay=0.01)
    rng, step, elapsed = random.Random(args.seed), 0, 0.0
    state_file = args.work / "state.pt"
    if state_file.is_file():
        state = torch.load(state_file, weights_only=False)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        rng.setstate(state["rng"])
        torch.set_rng_state(state["torch_rng"])
        step, elapsed = state["step"], state["elapsed"]
        print(f"resumed at step {step} ({elapsed / 60:.1f} min trained)", flush=True)
    args.work.mkdir(parents=True, exist_ok=True)
    started, running_loss = time.time() - elapsed, None
    autocast = torch.autocast(device_type=torch.device(args.device).type, dtype=torch.bfloat16)
    while step < args.steps and time.time() - started < args.minutes * 60:
        input_ids, positions, key_mask, labels, weights = (
            t.to(args.device) for t in make_batch(rng, tokenizer, heldout, ids, args.batch_size))
        progress = max(step / args.steps, (time.time() - started) / (args.minutes * 60))
        lr = learning_rate(step, progress, args.lr)
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
        if step % 25 == 0:
            print(f"step {step} loss {running_loss:.4f} lr {lr:.2e} "
                  f"{(time.time() - started) / 60:.1f} min", flush=True)
        if step % args.export_every == 0:
            export(model, tokenizer, args.out, ids)
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "rng": rng.getstate(), "torch_rng": torch.get_rng_state(), "step": step,
                        "elapsed": time.time() - started}, state_file)
    export(model, tokenizer, args.out, ids)
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "rng": rng.getstate(),
                "torch_rng": torch.get_rng_state(), "step": step, "elapsed": time.time() - started},
               state_file)
    print(f"done: {step} steps, {(time.time() - started) / 60:.1f} min, loss {running_loss:.4f}", flush=True)


if __name__ == "__main__":
    main()
