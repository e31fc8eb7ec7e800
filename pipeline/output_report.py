"""What the job says of its output folder at its end: the rows to retry, and (the demo) how many answers are right."""
from __future__ import annotations

import pyarrow.parquet as pq

from pipeline import storage
from pipeline.config import PipelineConfig

ERROR_COLUMN = "__inference_error__"


def first_difference(output: str, expected: str) -> int | None:
    """Index of the first word where ``output`` and ``expected`` differ (None when they are equal)."""
    got, want = output.split(), expected.split()
    for index, (a, b) in enumerate(zip(got, want)):
        if a != b:
            return index
    return None if len(got) == len(want) else min(len(got), len(want))


def around(text: str | None, word: int, before: int = 6, after: int = 6) -> str:
    """The words of ``text`` from ``before`` words ahead of ``word`` to ``after`` past it, with "..."
    where words were left out."""
    words = (text or "").split()  # a row without a prompt holds None
    start, end = max(0, word - before), min(len(words), word + after)
    shown = " ".join(words[start:end]) or "(nothing)"
    return ("... " if start else "") + shown + (" ..." if end < len(words) else "")


def expected_answers(config: PipelineConfig, count: int = 5) -> str:
    """When the input carries an ``answer`` column (the demo data does): how many outputs equal it, and
    a few rows with the expected answer beside the output; a wrong one is shown where it first differs."""
    outputs_dir = storage.join(config.output, "outputs")
    columns = (config.id_column, config.prompt_column, "generated_text", "answer")
    files, (filesystem, _) = storage.list_files(outputs_dir, ".parquet"), storage.resolve(outputs_dir)
    # checked first: read_column deletes a file it cannot read, and a missing column reads as that
    if not files or not set(columns) <= set(pq.read_schema(files[0], filesystem=filesystem).names):
        return ""
    ids, prompts, outputs, expected = (storage.read_column(outputs_dir, c).to_pylist() for c in columns)
    right = sum(o == e for o, e in zip(outputs, expected))
    lines = [f"{right} of {len(ids)} outputs equal the input's expected answer; a few rows:"]
    for _, prompt, output, answer in sorted(zip(ids, prompts, outputs, expected))[:count]:
        differs = first_difference(output, answer)
        if differs is None:
            lines += [f"  {around(prompt, 0, 0, 12)}", f"    output:   {around(output, 0, 0, 12)}",
                      f"    expected: {around(answer, 0, 0, 12)}  [right]"]
        else:
            lines += [f"  {around(prompt, 0, 0, 12)}", f"    output:   {around(output, differs)}",
                      f"    expected: {around(answer, differs)}  [wrong] first differs at word {differs + 1}"]
    return "\n".join(lines)


def retry_hint(config: PipelineConfig) -> str:
    """How many written rows carry an ``__inference_error__`` and how to retry them; empty when none."""
    outputs_dir = storage.join(config.output, "outputs")
    files, (filesystem, _) = storage.list_files(outputs_dir, ".parquet"), storage.resolve(outputs_dir)
    # checked first: read_column deletes a file it cannot read, and a missing column reads as that
    if not files or ERROR_COLUMN not in pq.read_schema(files[0], filesystem=filesystem).names:
        return ""
    failed = sum(1 for error in storage.read_column(outputs_dir, ERROR_COLUMN).to_pylist() if error)
    if not failed:
        return ""
    return f"{failed} row(s) in {outputs_dir} have an {ERROR_COLUMN}; rerun with --output {config.output} to retry them"
