"""Online load benchmark: Poisson arrivals against the serving loop, our schedules vs a static batcher.

Every system is the replica's own serving loop (``actors.engine_loop.EngineLoop``) over one loaded
model, driven in-process without HTTP: the HTTP/Serve layer adds the same few milliseconds to all and
only noise to the comparison, while the loop is where the policies differ. Each system is named by its
engine schedule (results stored before the rename say ``step`` and ``blockserve``; see
``benchmarks.results_io.read_results``).

* ``continuous``: a row leaves or starts its next block at the step its block completes, and arrivals
  join at the next step, under the token budget.
* ``block_sync``: requests join and leave at every block boundary under the token budget.
* ``static``: with ``static_batch_timeout_s``: collect up to
  ``max_batch_size`` requests or until the oldest has waited ``--static-timeout`` s, then run that batch
  to completion on one shared canvas (Fast-dLLM style); arrivals meanwhile wait for the next batch.

Rates are fractions (``--load``) of ``block_sync``'s measured capacity (a closed batch of the same
workload), or absolute (``--rates``, requests/s). The systems are interleaved rate by rate, with the same
arrival times and requests for all. Per run: throughput (generated tokens/s and requests/s over the
makespan), latency p50/p99 (arrival to last block) and time to first block p50/p99.

    python -m benchmarks serve-load --scale quick --out benchmarks/results/serve_load/quick
"""
from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from actors.engine_loop import EngineLoop
from benchmarks.summary import median, percentile
from engine import BlockServeEngine, EngineConfig, SamplingParams
from engine.models.loader import DiffusionLM, load_model, resolve_model_dir
from engine.models.prompts import encode_prompt
from tinylm.tasks import read_jsonl

DATA = Path(__file__).resolve().parents[1] / "assets" / "data" / "heldout.jsonl"
SYSTEMS = ("continuous", "block_sync", "static")  # each one the engine schedule of that name


@dataclass(frozen=True)
class Request:
    prompt_ids: list[int]
    params: SamplingParams


@dataclass
class RunResult:
    system: str
    rate_rps: float
    repeat: int
    requests: int
    completed: int
    makespan_s: float
    throughput_tok_s: float
    throughput_rps: float
    latency_p50_s: float
    latency_p99_s: float
    ttfb_p50_s: float
    ttfb_p99_s: float
    mean_rows: float
    effective_compute_ratio: float
    generated_tokens: int


def build_workload(lm: DiffusionLM, count: int, min_blocks: int, max_blocks: int, block_length: int,
                   seed: int) -> list[Request]:
    """Held-out tiny-model tasks, chat-formatted, each with a random cap of min..max blocks (EOS may
    end it sooner): the length heterogeneity that separates the two policies."""
    rows = read_jsonl(DATA)
    rng = random.Random(seed)
    picks = [rows[rng.randrange(len(rows))] for _ in range(count)]
    return [Request(encode_prompt(lm.tokenizer, [{"role": "user", "content": row["prompt"]}], lm.vocab_size),
                    SamplingParams(max_new_tokens=block_length * rng.randint(min_blocks, max_blocks)))
            for row in picks]


def poisson_arrivals(count: int, rate_rps: float, seed: int) -> list[float]:
    rng = random.Random(seed)
    times, now = [], 0.0
    for _ in range(count):
        times.append(now)
        now += rng.expovariate(rate_rps)
    return times


async def drive(engine: BlockServeEngine, workload: list[Request], arrivals: list[float]) -> tuple[list[tuple], float]:
    """Submit each request at its arrival time; return (stream, output) pairs and the makespan."""
    loop = EngineLoop(engine, max_pending=len(workload) + 1).start()
    start = time.time()

    async def one(index: int):
        await asyncio.sleep(max(0.0, start + arrivals[index] - time.time()))
        stream = loop.submit(workload[index].prompt_ids, workload[index].params, f"r{index}")
        events = [event async for event in stream]
        return stream, events[-1].output

    results = await asyncio.gather(*(one(index) for index in range(len(workload))))
    makespan = max(output.finish_time for _, output in results) - start
    loop.stop()
    return results, makespan


def run(engine: BlockServeEngine, system: str, workload: list[Request], arrivals: list[float],
        rate_rps: float, repeat: int) -> RunResult:
    engine.reset_stats()
    results, makespan = asyncio.run(drive(engine, workload, arrivals))
    latencies = [output.finish_time - stream.arrival_time for stream, output in results]
    ttfb = [stream.first_block_time - stream.arrival_time for stream, _ in results]
    stats = engine.stats()
    tokens = sum(len(output.token_ids) for _, output in results)
    return RunResult(
        system=system, rate_rps=rate_rps, repeat=repeat, requests=len(workload),
        completed=sum(output.finish_reason in ("eos", "length") for _, output in results),
        makespan_s=makespan, throughput_tok_s=tokens / makespan, throughput_rps=len(workload) / makespan,
        latency_p50_s=percentile(latencies, 50), latency_p99_s=percentile(latencies, 99),
        ttfb_p50_s=percentile(ttfb, 50), ttfb_p99_s=percentile(ttfb, 99), mean_rows=stats.rows_per_forward,
        effective_compute_ratio=stats.effective_compute_ratio, generated_tokens=tokens)


def model_fingerprint(model: str) -> dict:
    weights = sorted(resolve_model_dir(model).glob("*.safetensors"))
    digest = hashlib.sha256()
    for path in weights:
        digest.update(path.read_bytes())
    return {"model": model, "weights_sha256": digest.hexdigest()[:16],
            "weights_mtime": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(
                max(path.stat().st_mtime for path in weights)))}


def summarize(results: list[RunResult]) -> list[dict]:
    summary = []
    for rate in dict.fromkeys(result.rate_rps for result in results):
        row = {"rate_rps": round(rate, 4)}
        for system in SYSTEMS:
            runs = [result for result in results if result.rate_rps == rate and result.system == system]
            row[system] = {key: median(getattr(run, key) for run in runs) for key in (
                "throughput_tok_s", "throughput_rps", "latency_p50_s", "latency_p99_s", "ttfb_p50_s",
                "ttfb_p99_s", "effective_compute_ratio")}
        continuous, block_sync, static = (row[system] for system in SYSTEMS)
        row["p99_latency_ratio"] = block_sync["latency_p99_s"] / static["latency_p99_s"]
        row["throughput_ratio"] = block_sync["throughput_tok_s"] / static["throughput_tok_s"]
        row["continuous_over_block_sync_p99_latency"] = continuous["latency_p99_s"] / block_sync["latency_p99_s"]
        row["continuous_over_block_sync_throughput"] = continuous["throughput_tok_s"] / block_sync["throughput_tok_s"]
        summary.append(row)
    return summary


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--requests", type=int, default=48, help="requests per run")
    parser.add_argument("--load", default="0.5,0.8,1.0", help="rates as fractions of block_sync's capacity")
    parser.add_argument("--rates", default=None, help="absolute rates in requests/s (overrides --load)")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--max-batch-size", type=int, default=8)
    parser.add_argument("--block-length", type=int, default=32)
    parser.add_argument("--steps-per-block", type=int, default=None)
    parser.add_argument("--min-blocks", type=int, default=1)
    parser.add_argument("--max-blocks", type=int, default=6)
    parser.add_argument("--static-timeout", type=float, default=0.5, help="static batch window, s")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="16 requests, loads 0.6 and 1.0, 8 steps/block")
    parser.add_argument("--out", type=Path, default=None, help="write the JSON results here")
    args = parser.parse_args(argv)
    if args.quick:
        args.requests, args.load, args.steps_per_block = 16, "0.6,1.0", args.steps_per_block or 8

    export = model_fingerprint(args.model)  # the trainer may re-export later: this is what gets loaded
    lm = load_model(args.model, device=args.device, dtype=args.dtype)
    common = {"max_batch_size": args.max_batch_size, "block_length": args.block_length,
              "steps_per_block": args.steps_per_block}
    collect = {"static": {"static_batch_timeout_s": args.static_timeout}}  # the static batcher's window
    engines = {system: BlockServeEngine(lm, EngineConfig(schedule=system, **common, **collect.get(system, {})))
               for system in SYSTEMS}
    workload = build_workload(lm, args.requests, args.min_blocks, args.max_blocks, args.block_length,
                              args.seed)
    for system in SYSTEMS:  # warm up every path (first-call allocations) on a few requests
        run(engines[system], system, workload[:4], [0.0] * 4, 0.0, -1)
    capacity = run(engines["block_sync"], "block_sync", workload, [0.0] * len(workload), 0.0, -1)
    if args.rates:
        rates = [float(rate) for rate in args.rates.split(",")]
    else:
        rates = [float(load) * capacity.throughput_rps for load in args.load.split(",")]

    results: list[RunResult] = []
    for rate_index, rate in enumerate(rates):
        for repeat in range(args.repeats):
            arrivals = poisson_arrivals(len(workload), rate, args.seed + 1000 * rate_index + repeat)
            order = list(SYSTEMS) if (rate_index + repeat) % 2 == 0 else list(SYSTEMS)[::-1]
            for system in order:  # interleaved, alternating which goes first
                result = run(engines[system], system, workload, arrivals, rate, repeat)
                results.append(result)
                print(json.dumps({"progress": asdict(result)}), flush=True)

    report = {"export": export, "args": {k: (str(v) if isinstance(v, Path) else v)
                                                               for k, v in vars(args).items()},
              "engine": common, "capacity_closed_batch": asdict(capacity), "summary": summarize(results),
              "runs": [asdict(result) for result in results]}
    print(json.dumps(report["summary"], indent=2))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
