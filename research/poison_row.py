"""What one poison row costs the batch job, with its convicted batch's rows isolated and without.

The job is ``configs/tiny-cpu.yaml`` on ``--rows`` demo rows plus one row that ends its actor's process
each time it is being generated: at the entry of the actor's ``generate_rows`` (``entry``), or by an
engine step that raises (``engine``). Both come from the tests' fault-injecting actors
(``tests/fault_injection.py``). Each job runs with the default ``max_isolation_deaths`` and with 0.

``python -m research poison-row [--rows N] [--points entry,engine] [--repeats R] [--out DIR]``
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
POISON = {"id": "poison-0", "prompt": "count from 3 to 11, the row that ends its actor"}
POINTS = {  # where the poison row ends the process: the job's overrides
    "entry": ("actors.actor_class=tests.fault_injection.ExitAtEntry",),
    "engine": ("actors.actor_class=tests.fault_injection.ExitOnPrompt", "actors.actor_options.exit_with=engine"),
}


def write_input(path: Path, rows: int) -> None:
    demo = [json.loads(line) for line in (ROOT / "assets" / "data" / "demo.jsonl").read_text().splitlines()]
    path.write_text("".join(json.dumps(row) + "\n" for row in [*demo[:rows], POISON]))


def job_command(input_path: Path, output: Path, point: str, isolate: bool) -> list[str]:
    overrides = [*POINTS[point], f"actors.actor_options.exit_on_prompt={json.dumps(POISON['prompt'])}",
                 "limit=null", "overwrite=true", *(() if isolate else ("max_isolation_deaths=0",))]
    return [sys.executable, "-m", "pipeline.run", "--config", "configs/tiny-cpu.yaml", "--input", str(input_path),
            "--output", str(output), *(part for override in overrides for part in ("--set", override))]


def run_job(input_path: Path, output: Path, point: str, isolate: bool) -> dict:
    """One job in its own process (its own Ray instance): what it wrote, its deaths and its times."""
    started = time.perf_counter()
    done = subprocess.run(job_command(input_path, output, point, isolate), cwd=ROOT, capture_output=True,
                          text=True, env={**os.environ, "RAY_AUTH_MODE": "disabled"})
    command_s = time.perf_counter() - started
    rows = [row for file in sorted((output / "outputs").glob("*.parquet"))
            for row in pq.read_table(file, columns=["id", "finish_reason", "__inference_error__"]).to_pylist()]
    stats = json.loads((output / "stats.json").read_text()) if done.returncode == 0 else {}
    isolation = stats.get("batch_isolation", {})
    others = [row for row in rows if row["id"] != POISON["id"]]
    poison = [row for row in rows if row["id"] == POISON["id"]]
    return {"point": point, "isolation": isolate, "exit_code": done.returncode, "rows_written": len(rows),
            "unique_ids": len({row["id"] for row in rows}),
            "poison_flagged": bool(poison) and all(row["__inference_error__"] for row in poison),
            "poison_error": poison[0]["__inference_error__"] if poison else None,
            "flagged": sum(bool(row["__inference_error__"]) for row in rows),
            "others_generated": sum(row["finish_reason"] in ("eos", "length") for row in others),
            "deaths": len(stats.get("actor_deaths", [])), "isolation_deaths": isolation.get("deaths", 0),
            "isolation_wait_s": isolation.get("wait_s", 0.0), "job_wall_s": stats.get("run", {}).get("wall_s"),
            "command_s": command_s, "summary_tail": done.stdout.splitlines()[-12:]}


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200)
    parser.add_argument("--points", default="entry,engine", help=f"comma-separated, of {sorted(POINTS)}")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "poison_row")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    input_path = args.out / "input.jsonl"
    write_input(input_path, args.rows)
    results = []
    for repeat in range(args.repeats):
        for point in args.points.split(","):
            for isolate in (True, False):  # alternating, so a busy spell of the machine hits both
                result = run_job(input_path, args.out / f"{point}-{isolate}", point, isolate)
                results.append({"repeat": repeat, **result})
                print(json.dumps({k: v for k, v in result.items() if k != "summary_tail"}), flush=True)
    (args.out / "poison_row.json").write_text(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    main()
