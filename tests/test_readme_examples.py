"""Every Python example of the README and the docs runs as written and answers right on the shipped model.

Each ```python block runs in this process, from the repository root, beside the session's Ray instance; an
OpenAI example talks to ``configs/serve-tiny.yaml``'s application, served on a free port instead of 8000.
What a block prints is checked against the tiny model's right answer. A new example needs its line here.
"""
from __future__ import annotations

import contextlib
import io
import os
import re
from pathlib import Path

import httpx
import pytest
import yaml

from tests.serve_helpers import start_serve

REPO_ROOT = Path(__file__).resolve().parents[1]


def counting(start: int, stop: int) -> str:
    step = 1 if stop >= start else -1
    return " ".join(str(number) for number in range(start, stop + step, step))


EXPECTED = {  # document -> what each of its Python blocks prints, in order
    "README.md": ["32 of 32 answers right", "32 of 32 answers right", counting(1, 30),
                  f"{counting(3, 12)} eos"],
    "docs/ray_data.md": [f"count from 14 to 55, one number after another -> {counting(14, 55)}", counting(14, 55)],
    "docs/serving.md": [counting(20, 9)],
    "docs/structured_output.md": [f"{counting(12, 9)}\n['n'] eos", f"{counting(12, 9)}\n['n'] stop",
                                  f"count from 14 to 55, one number after another -> {counting(14, 55)} eos",
                                  "['start', 'stop'] eos"],
}


def python_blocks(document: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", (REPO_ROOT / document).read_text(), flags=re.S | re.M)


def test_every_document_with_python_examples_is_listed_here():
    documents = [path.relative_to(REPO_ROOT).as_posix() for path in [REPO_ROOT / "README.md",
                                                                     *sorted((REPO_ROOT / "docs").glob("*.md"))]]
    assert {document: len(python_blocks(document)) for document in documents if python_blocks(document)} == {
        document: len(printed) for document, printed in EXPECTED.items()}


@pytest.fixture(scope="module")
def serve_tiny(ray_cluster) -> str:
    """``configs/serve-tiny.yaml``'s application as shipped, on a free port: its base URL."""
    from ray import serve

    from actors.serving.serve_app import build_app

    application = yaml.safe_load((REPO_ROOT / "configs" / "serve-tiny.yaml").read_text())["applications"][0]
    base = start_serve()
    serve.run(build_app(application["args"]), name="readme-tiny", route_prefix="/readme")
    url = f"{base}/readme"
    assert httpx.get(f"{url}/health", timeout=10).status_code == 200
    yield url
    serve.delete("readme-tiny")


def run_block(code: str) -> str:
    """What ``code`` prints, run from the repository root."""
    printed, cwd = io.StringIO(), os.getcwd()
    os.chdir(REPO_ROOT)
    try:
        with contextlib.redirect_stdout(printed):
            exec(compile(code, "<example>", "exec"), {"__name__": "__example__"})  # noqa: S102
    finally:
        os.chdir(cwd)
    return printed.getvalue()


@pytest.mark.parametrize("document, index", [(document, index) for document, printed in EXPECTED.items()
                                             for index in range(len(printed))])
def test_the_example_runs_as_written_and_answers_right(request, ray_cluster, document, index):
    code = python_blocks(document)[index]
    if "OpenAI(" in code:
        code = code.replace("http://127.0.0.1:8000", request.getfixturevalue("serve_tiny"))
    printed = run_block(code)
    assert EXPECTED[document][index] in printed, printed[-2000:]
