"""Tracked text names no folder of one machine, so a reader on any machine can follow every instruction.

Refused in every tracked text file (``git ls-files``; binary files are skipped):

* an absolute path into a home or work directory: ``/{root,work}/...``, ``/home/<user>/...`` or
  ``/Users/<user>/...``. ``/home/ray/`` is allowed: it is the home of the user of Ray's cluster images,
  where ``cluster.yaml`` installs the project on every node.

Refused in Markdown documents, which readers follow step by step:

* a path under ``/tmp/<folder>``: a scratch folder exists only on the machine that made it. Documents
  give ``git clone`` URLs with pinned commits, and relative paths (git ignores ``runs/``).

The run records that the benchmarks write under ``benchmarks/results/`` (JSON) are checked for home
and work directories too: their writers record paths inside the repository relative to it. A /tmp
folder in a record says where a run wrote, not where a reader should go, so it is not refused there.
This file is not checked: its examples are the paths it refuses.

A path counts only where it begins: at the start of a line or after a space, quote, bracket, ``=`` or
``:``. Inside a URL (``https://host/home/...``) or a relative path (``runs/work/...``) it is not one.
"""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
THIS_FILE = Path(__file__).resolve().relative_to(ROOT).as_posix()
RUN_RECORDS = re.compile(r"^benchmarks/results/.*\.jsonl?$")
DOCUMENT_SUFFIXES = (".md",)

PATH_START = r"(?<![\w.~/-])"
HOME_OR_WORK = re.compile(PATH_START + r"/(?:root|work|home/(?!ray/)[\w.-]+|Users/[\w.-]+)/")
SCRATCH = re.compile(PATH_START + r"/tmp/[\w.-]")


def tracked_texts() -> list[tuple[str, str]]:
    """(path, text) of every tracked file that decodes as UTF-8 and holds no NUL byte."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the tracked files are unknown")
    texts = []
    for name in listed.decode().split("\0"):
        path = ROOT / name
        if not name or name == THIS_FILE or not path.is_file():
            continue
        data = path.read_bytes()
        if b"\0" in data:
            continue
        try:
            texts.append((name, data.decode("utf-8")))
        except UnicodeDecodeError:
            continue
    return texts


def hits(pattern: re.Pattern, texts: list[tuple[str, str]]) -> list[str]:
    """``path:line: text`` of every line where ``pattern`` finds a path."""
    return [f"{name}:{number}: {line.strip()}" for name, text in texts
            for number, line in enumerate(text.splitlines(), start=1) if pattern.search(line)]


def test_no_tracked_text_names_a_home_or_work_directory():
    found = hits(HOME_OR_WORK, tracked_texts())
    assert not found, "absolute paths of one machine's home or work directory:\n" + "\n".join(found)


def test_no_document_sends_its_reader_to_a_scratch_folder():
    documents = [(name, text) for name, text in tracked_texts()
                 if name.endswith(DOCUMENT_SUFFIXES) and not RUN_RECORDS.match(name)]
    found = hits(SCRATCH, documents)
    assert not found, "scratch folders under /tmp in documents (give relative paths):\n" + "\n".join(found)


@pytest.mark.parametrize("line", [
    "cd /work/main && make test",
    "SDAR=/work/.mirror/JetAstra+SDAR/repo",
    "open `/root/notes.md`",
    'path = "/home/alice/checkout"',
    "(/Users/bob/code/blockserve)",
    "git show c2041a8:/work/x",
])
def test_a_home_or_work_directory_is_refused(line: str):
    assert HOME_OR_WORK.search(line)


@pytest.mark.parametrize("line", [
    "pip install -e '/home/ray/blockserve[gpu]'",
    "https://github.com/root/work/home/x/",
    "s3://bucket/work/run1",
    "--out runs/work/x",
    "cat ~/work/notes",
    "2>/dev/null",
    "/workspace and /homes are other folders",
])
def test_urls_relative_paths_and_the_ray_image_home_are_spared(line: str):
    assert not HOME_OR_WORK.search(line)


def test_a_scratch_folder_is_refused_and_a_mention_of_tmp_is_not():
    assert SCRATCH.search("--peer-dir /tmp/issue29/ref/sdar")
    assert SCRATCH.search("python -m benchmarks gpu --out /tmp/g")
    assert not SCRATCH.search("a harness in /tmp, not in the repo")
    assert not SCRATCH.search("pytest's tmp_path, or runs/tmp/x")
