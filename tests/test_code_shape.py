"""The code stays in small pieces: no module of the project or of its tests over 300 lines, no function
over 60, and no more than 3,000 lines of Python in ``benchmarks/``.

Test modules are held to both limits too: a test file is a specification of one subject, and a subject
that needs more than 300 lines is split into files that each specify one part of it.
"""
from __future__ import annotations

import ast
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("engine", "actors", "pipeline", "benchmarks", "research", "tinylm", "scripts")
MAX_FILE_LINES = 300
MAX_FUNCTION_LINES = 60
MAX_BENCHMARKS_LINES = 3_000  # what a user runs to measure a deployment; the paper's experiments are research/


def python_files(*folders: str) -> list[Path]:
    return sorted(path for folder in folders for path in (REPO_ROOT / folder).rglob("*.py"))


def long_functions(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    return [f"{path.relative_to(REPO_ROOT)}:{node.lineno} {node.name}: {node.end_lineno - node.lineno + 1} lines"
            for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]


def test_the_project_finds_its_python_files():
    files = python_files(*PACKAGES)
    assert REPO_ROOT / "engine" / "engine.py" in files and len(files) > 50


def test_no_module_of_the_project_or_its_tests_is_over_300_lines():
    sizes = {path: len(path.read_text().splitlines()) for path in python_files(*PACKAGES, "tests")}
    too_long = [f"{path.relative_to(REPO_ROOT)}: {lines} lines" for path, lines in sizes.items()
                if lines > MAX_FILE_LINES]
    assert not too_long, too_long


def test_no_function_is_over_60_lines():
    too_long = [problem for path in python_files(*PACKAGES, "tests") for problem in long_functions(path)]
    assert not too_long, too_long


def test_benchmarks_holds_at_most_3000_lines_of_python():
    """Counted as ``find benchmarks -name '*.py' | xargs wc -l`` counts them."""
    lines = sum(len(path.read_text().splitlines()) for path in python_files("benchmarks"))
    assert lines <= MAX_BENCHMARKS_LINES, f"benchmarks/ holds {lines} lines of Python: does research/ own some?"
