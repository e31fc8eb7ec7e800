"""Train the shipped tiny masked-diffusion model (LLaDA recipe, adapted to learn on 2 CPU cores).

    python -m tinylm.train --minutes 120 --work .tiny_train --out assets/tiny --threads 2   # resumable
    python -m tinylm.train --init assets/tiny --work .tiny_train2 ...      # warm start from shipped weights
    python -m tinylm.train --device cuda --batch-size 256 ...             # the same script on a GPU

The model: 4 layers, d 128, 4 heads, SwiGLU 512, tied embeddings (1.1M parameters, 2.3 MB in bf16),
on the word-level tokenizer (``tinylm/tokenizer.py``: one token per number), so an answer of n numbers
is n tokens and answers span 1 to 8 blocks of 8 (``tinylm/tasks.py``). Each number's embedding starts as
sinusoidal features of its value, so the successor ``n -> n + 1`` starts as one rotation rather than a
table to memorise.

Recipe (LLaDA SFT: prompt never masked, answer padded with EOS over the full canvas), trained on the
states the block decoder visits (``tinylm/mixtures.py``; ``--mixture``): committed prefixes of random
length in the current block, frontiers at the answer's last number and its EOS, semi-autoregressive
and plain masking. Then:
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

from engine.models.config import TransformerConfig
from engine.models.families import CheckpointIds, family_named
from engine.models.transformer import BidirectionalTransformer
from tinylm.evaluate import SHIPPED_DECODING, SHIPPED_DEFAULTS, evaluate_model, selection_score
from tinylm.export import save_checkpoint
from tinylm.mixtures import MIXTURES, TokenIds, make_batch
from tinylm.progress import Progress, continue_record, resume, save_state, training_record, weight_average
from tinylm.tasks import MAX_NUMBER, VALIDATION_SIZE, define_splits, example_key, write_jsonl
from tinylm.tokenizer import BOS, EOS, MASK, save_tokenizer

REWARM_STEPS = 100


def tiny_config(vocab_size: int) -> TransformerConfig:
    return TransformerConfig(vocab_size=vocab_size, hidden_size=128, num_layers=4, num_heads=4,
                             num_kv_heads=4, intermediate_size=512, rope_theta=10000.0,
                             rms_norm_eps=1e-5, max_position_embeddings=512, tie_word_embeddings=True)


def initialize(model: BidirectionalTransformer, tokenizer, seed: int) -> None:
    """Small normal init; each number's (tied) embedding starts as sinusoidal features of its value,
    so ``n -> n + 1`` begins as one fixed rotation for every n instead of a table to memorise."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _name, parameter in model.named_parameters():
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
    heldout, validation, demo = define_splits()
    excluded = {example_key(e) for e in heldout + validation}
    write_jsonl(heldout, data_dir / "heldout.jsonl", "heldout")
    write_jsonl(demo, data_dir / "demo.jsonl", "demo")
    return excluded, [{"id": f"validation-{i:05d}", **asdict(e)} for i, e in enumerate(validation)]


def learning_rate(step: int, progress: float, peak: float, warmup: int = 200) -> float:
    """Linear warmup, then cosine decay to 10% by ``progress`` (fraction of the step or time budget)."""
    if step < warmup:
        return peak * (step + 1) / warmup
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def export(model: BidirectionalTransformer, tokenizer, out: Path, ids: TokenIds) -> None:
    config_json = family_named("llada").config_json(model.config, CheckpointIds(ids.mask, ids.eos, ids.eos), None)
    save_checkpoint(model, out, "llada", config_json)
    tokenizer.save_pretrained(str(out))
    (out / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": ids.bos, "eos_token_id": ids.eos, "pad_token_id": ids.eos} | SHIPPED_DEFAULTS) + "\n")


def validate(model, tokenizer, args, ids: TokenIds, validation: list, progress: Progress) -> None:
    """Export a candidate, score it as shipped (bf16 weights read back), keep it if it is the best."""
    from engine.models import load_model
    candidate = args.work / "candidate"
    export(model, tokenizer, candidate, ids)
    report = evaluate_model(load_model(candidate, dtype="float32"), validation, args.decoding)
    score = selection_score(report)
    point = {"step": progress.step, "cpu_hours": round(progress.cpu_seconds / 3600, 3),
             "exact_match": report["exact_match"], "right_block": report["right_block"],
             "near_block": report["near_block"], "blocks": report["decoded_blocks_histogram"]}
    progress.history.append(point)
    print(f"validation at step {progress.step}: exact {report['exact_match']:.1%} right block "
          f"{report['right_block']:.1%} blocks {report['decoded_blocks_histogram']} "
          f"({report['seconds']:.0f} s)", flush=True)
    better = score > progress.best.get("score", float("-inf"))
    if better:
        progress.best = {"score": score, **{k: v for k, v in point.items() if k != "blocks"}}
    if better or not published(args.out):  # an empty --out takes the model as it stands
        staging = args.out.with_name(args.out.name + ".staging")
        shutil.rmtree(staging, ignore_errors=True)
        shutil.copytree(candidate, staging)
        (staging / "training.json").write_text(json.dumps(training_record(progress, args), indent=2) + "\n")
        shutil.rmtree(args.out, ignore_errors=True)
        staging.replace(args.out)
        print(f"  new best: exported to {args.out}", flush=True)
    (args.work / "training.json").write_text(json.dumps(training_record(progress, args), indent=2) + "\n")


def published(out: Path) -> bool:
    return (out / "model.safetensors").is_file()


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=110.0, help="wall-clock training budget")
    parser.add_argument("--steps", type=int, default=20000, help="schedule length (cosine horizon)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--mixture", choices=sorted(MIXTURES), default="frontier",
                        help="the kinds of decoder state trained on (tinylm/mixtures.py)")
    parser.add_argument("--decoding", default=SHIPPED_DECODING, help="validation's decoding rule")
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
    parser.add_argument("--average", type=float, default=0.0,
                        help="decay of an exponential moving average of the weights (e.g. 0.999); "
                             "validation and export use the average. 0: the weights as trained")
    return parser.parse_args()


def starting_point(args: argparse.Namespace, state_file: Path, model, optimizer) -> tuple[Progress, random.Random]:
    """Resume the work directory's state, else continue ``--init``'s record, else start at step 0."""
    if state_file.is_file():
        progress = resume(state_file, model, optimizer, rng := random.Random(args.seed))
        print(f"resumed at step {progress.step} ({progress.elapsed / 60:.1f} min trained, "
              f"best {progress.best})", flush=True)
        return progress, rng
    if args.init is not None and (args.init / "training.json").is_file():
        progress = continue_record(args.init / "training.json")
        print(f"continuing {args.init}'s record at step {progress.step}, fresh optimizer moments", flush=True)
        return progress, random.Random(f"{args.seed}-{progress.step}")  # not the record's first examples
    return Progress(), random.Random(args.seed)


def build_model(args: argparse.Namespace, tokenizer) -> BidirectionalTransformer:
    """The tiny transformer, initialized (or warm-started from ``args.init``), on ``args.device``."""
    model = BidirectionalTransformer(tiny_config(len(tokenizer)))
    initialize(model, tokenizer, args.seed)
    if args.init is not None:
        from engine.models import load_model
        model.load_state_dict(load_model(args.init, dtype="float32").model.state_dict())
        print(f"warm start from {args.init}", flush=True)
    return model.to(args.device)


def train_step(model: BidirectionalTransformer, optimizer: torch.optim.Optimizer, autocast,
               batch: tuple[torch.Tensor, ...], lr: float) -> torch.Tensor:
    """One optimizer step at learning rate ``lr`` on the weighted loss of the labelled positions."""
    input_ids, positions, key_mask, labels, weights = batch
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
    return loss


def main() -> None:
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    excluded, validation = write_datasets(args.data)
    validation = validation[:args.validation_prompts]
    tokenizer = save_tokenizer(args.work / "tokenizer")
    ids = TokenIds(eos=tokenizer.convert_tokens_to_ids(EOS), mask=tokenizer.convert_tokens_to_ids(MASK),
                   bos=tokenizer.convert_tokens_to_ids(BOS))
    model = build_model(args, tokenizer)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.98), weight_decay=0.01)
    state_file = args.work / "state.pt"
    progress, rng = starting_point(args, state_file, model, optimizer)
    args.work.mkdir(parents=True, exist_ok=True)
    mixture = MIXTURES[args.mixture]
    wall, cpu, running_loss = time.time(), time.process_time(), None
    budget_end = wall + args.minutes * 60

    def account() -> None:
        nonlocal wall, cpu
        progress.elapsed += time.time() - wall
        progress.cpu_seconds += time.process_time() - cpu
        wall, cpu = time.time(), time.process_time()

    # bf16 autocast on CUDA only: on this project's AMD CPUs bf16 matmuls are ~8x slower than float32.
    autocast = torch.autocast(device_type=torch.device(args.device).type, dtype=torch.bfloat16,
                              enabled=torch.device(args.device).type == "cuda")
    averaged = weight_average(model, args.average, state_file)
    scored = averaged if averaged is not None else model
    while progress.step < args.steps and time.time() < budget_end:
        batch = tuple(t.to(args.device) for t in make_batch(rng, tokenizer, excluded, ids, args.batch_size, mixture))
        lr = learning_rate(progress.step, progress.step / args.steps, args.lr)
        if progress.rewarm_from is not None:
            lr *= min(1.0, (progress.step - progress.rewarm_from + 1) / REWARM_STEPS)
        loss = train_step(model, optimizer, autocast, batch, lr)
        if averaged is not None:
            torch._foreach_lerp_(list(averaged.parameters()), list(model.parameters()), 1.0 - args.average)
        progress.step += 1
        running_loss = loss.item() if running_loss is None else 0.98 * running_loss + 0.02 * loss.item()
        if progress.step % 50 == 0:
            account()
            print(f"step {progress.step} loss {running_loss:.4f} lr {lr:.2e} "
                  f"{progress.elapsed / 60:.1f} min {progress.cpu_seconds / 3600:.3f} CPU-h", flush=True)
        if progress.step % args.validate_every == 0:
            model.eval()
            validate(scored, tokenizer, args, ids, validation, progress)
            model.train()
            account()
            save_state(state_file, model, optimizer, rng, progress, averaged)
    if not progress.history or progress.history[-1]["step"] != progress.step or not published(args.out):
        validate(scored.eval(), tokenizer, args, ids, validation, progress)
    account()
    save_state(state_file, model, optimizer, rng, progress, averaged)
    print(f"done: {progress.step} steps, loss {running_loss}, best {progress.best}", flush=True)


if __name__ == "__main__":
    main()
