"""Issue 22's bars for pathological input, measured (not a test: a test never reads the clock).

* ``http``: the tiny model behind Ray Serve (``configs/serve-tiny.yaml``'s args). A normal chat request
  alone (median of ``--repeats``), then the same request sent beside a completion whose prompt is one
  12,000-character word (refused by its character count) or one 9,000-character word (it passes that
  guard, is tokenized into 9,000 tokens, then refused): how long each took, and how much the normal one
  was delayed.
* ``job``: the real batch job (``pipeline.run`` on ``configs/tiny-cpu.yaml``) on ``--rows`` demo rows, with
  and without one extra row holding a 60,000-character word, alternating: the long row's error, its
  ``time_taken_llm`` (arrival at the engine to its answer), what tokenizing it costs (the job's
  prompt-length stage does that), and the job's wall time with it over without.

    python -m research long-input --part http --part job
"""
from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import socket
import tempfile
import time
from pathlib import Path

import httpx
import yaml

from benchmarks.summary import median

REPO_ROOT = Path(__file__).resolve().parents[1]
NORMAL = {"model": "blockserve-tiny", "messages": [{"role": "user", "content": "count from 3 to 12"}],
          "max_tokens": 64}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def timed_post(http: httpx.AsyncClient, path: str, body: dict) -> tuple[float, int, dict]:
    started = time.perf_counter()
    response = await http.post(path, json=body)
    return time.perf_counter() - started, response.status_code, response.json()


def measure_http(repeats: int, word_chars: tuple[int, ...]) -> dict:
    import ray
    from ray import serve

    from actors.serving.serve_app import ServeAppConfig, build_deployment_app

    config = yaml.safe_load((REPO_ROOT / "configs" / "serve-tiny.yaml").read_text())
    args = config["applications"][0]["args"]
    ray.init(runtime_env={"env_vars": {"PYTHONPATH": str(REPO_ROOT), "RAY_AUTH_MODE": "disabled"}})
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    serve.run(build_deployment_app(ServeAppConfig(**args), ray_actor_options={"num_cpus": 0.5}),
              name="long-input", route_prefix="/")

    async def scenario():
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=600) as http:
            await timed_post(http, "/v1/chat/completions", NORMAL)  # warm-up
            alone = [(await timed_post(http, "/v1/chat/completions", NORMAL))[0] for _ in range(repeats)]
            pairs = {}
            for chars in word_chars:
                long_body = {"model": "blockserve-tiny", "prompt": "q" * chars, "max_tokens": 32}
                pairs[chars] = []
                for _ in range(repeats):
                    long_task = asyncio.create_task(timed_post(http, "/v1/completions", long_body))
                    normal = await timed_post(http, "/v1/chat/completions", NORMAL)
                    pairs[chars].append((await long_task, normal))
            return alone, pairs

    try:
        alone, pairs = asyncio.run(scenario())
    finally:
        serve.shutdown()
        ray.shutdown()
    alone_s = median(alone)
    results = {"repeats": repeats, "normal_alone_s": alone_s}
    for chars, runs in pairs.items():
        beside_s = median(normal[0] for _, normal in runs)
        results[f"word_{chars}"] = {
            "long_request_s": median(long[0] for long, _ in runs), "long_status": runs[0][0][1],
            "long_error": runs[0][0][2].get("error", {}).get("message"),
            "normal_beside_long_s": beside_s, "normal_delay_s": beside_s - alone_s}
    return results


def run_job(rows: list[dict], workdir: Path) -> tuple[float, list[dict]]:
    import pyarrow.parquet as pq

    from pipeline import run as job

    source = workdir / "input.jsonl"
    source.write_text("".join(json.dumps(row) + "\n" for row in rows))
    output = workdir / "out"
    shutil.rmtree(output, ignore_errors=True)
    config = job.load_config(REPO_ROOT / "configs" / "tiny-cpu.yaml", overrides=[
        f"input={source}", f"output={output}", "limit=null"])
    started = time.perf_counter()
    job.run(config)
    wall_s = time.perf_counter() - started
    written = [row for file in sorted((output / "outputs").glob("*.parquet"))
               for row in pq.read_table(file).to_pylist()]
    return wall_s, written


def measure_job(num_rows: int, word_chars: int, repeats: int) -> dict:
    import ray

    from engine.models.loader import TINY_MODEL_DIR, load_tokenizer
    from pipeline.ray_connect import connect_ray

    demo = [json.loads(line) for line in (REPO_ROOT / "assets" / "data" / "demo.jsonl").open()][:num_rows]
    long_row = {**demo[0], "id": "long-word", "prompt": "w" * word_chars}
    tokenizer = load_tokenizer(TINY_MODEL_DIR)
    started = time.perf_counter()
    num_tokens = len(tokenizer(long_row["prompt"])["input_ids"])  # what the prompt-length stage does
    tokenize_s = time.perf_counter() - started
    connect_ray()
    plain, with_long, long_outputs = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        run_job(demo, Path(tmp))  # warm-up: Ray workers and imports
        for _ in range(repeats):  # alternating, so load drifts hit both alike
            plain.append(run_job(demo, Path(tmp))[0])
            wall_s, written = run_job(demo + [long_row], Path(tmp))
            with_long.append(wall_s)
            long_outputs += [row for row in written if row["id"] == "long-word"]
            assert len(written) == num_rows + 1, "every row is written once"
    ray.shutdown()
    return {"rows": num_rows, "word_chars": word_chars, "repeats": repeats,
            "tokenize_long_word_s": tokenize_s, "long_word_tokens": num_tokens,
            "job_s": median(plain), "job_with_long_row_s": median(with_long),
            "ratio_with_long_row": median(with_long) / median(plain),
            "long_row_time_taken_llm_s": max(row["time_taken_llm"] for row in long_outputs),
            "long_row_error": long_outputs[0]["__inference_error__"]}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", action="append", choices=("http", "job"), required=True)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--job-repeats", type=int, default=2)
    args = parser.parse_args(argv)
    results = {}
    if "http" in args.part:
        results["http"] = measure_http(args.repeats, (12_000, 9_000))
    if "job" in args.part:
        results["job"] = measure_job(args.rows, 60_000, args.job_repeats)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
