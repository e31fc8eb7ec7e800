"""The documents a person reads: README stays short, links resolve, and figures live in RESULTS.

What counts as a measured figure, kept simple on purpose: a number directly followed by a unit of
time, rate, ratio or size (``12 s``, ``3.5 min``, ``450 tok/s``, ``0.44x``, ``0.44×``, ``63%``,
``2 GiB``). Such a figure in README.md or docs/*.md must sit in a paragraph (or table row) that links to
benchmarks/RESULTS.md, where every figure is dated with its command and commit. Settings and sizes of
the shipped defaults are written as code (``max_wait_s: 10.0``): text inside backticks and fenced
code blocks is not prose and is not checked.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
LINKED_DOCUMENTS = [README, *sorted((ROOT / "docs").glob("*.md")), ROOT / "benchmarks" / "README.md",
                    ROOT / "research" / "README.md", ROOT / "tinylm" / "README.md"]
FIGURE_CHECKED = [README, *sorted((ROOT / "docs").glob("*.md"))]

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_CODE = re.compile(r"`[^`]*`")
NUMBER = r"(?<![\w.])\d+(?:[.,]\d+)*"
SPACED_UNITS = r"(?:ms|µs|us|s|min|h|tok/s|tokens/s|req/s|GiB|MiB|GB|MB|CPU-hours)"
FIGURE = re.compile(rf"{NUMBER}(?:\s?{SPACED_UNITS}(?![\w/])|[x×%](?!\w))")


def prose_lines(path: Path) -> list[tuple[int, str]]:
    """(line number, text) of the lines outside fenced code blocks."""
    lines, fenced = [], False
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append((number, line))
    return lines


def paragraphs(path: Path) -> list[tuple[int, str]]:
    """(first line number, text) of each prose paragraph; every table row is a paragraph of its own."""
    found: list[tuple[int, str]] = []
    current: list[str] = []
    start = 0
    for number, line in prose_lines(path) + [(0, "")]:
        if not line.strip() or line.lstrip().startswith("|"):
            if current:
                found.append((start, "\n".join(current)))
                current = []
            if line.lstrip().startswith("|"):
                found.append((number, line))
            continue
        if not current:
            start = number
        current.append(line)
    return found


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    result = set()
    for _, line in prose_lines(path):
        match = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not match:
            continue
        anchor = github_anchor(match.group(1))
        count = seen.get(anchor, 0)
        seen[anchor] = count + 1
        result.add(anchor if count == 0 else f"{anchor}-{count}")
    return result


def relative_links(path: Path) -> list[tuple[int, str]]:
    links = []
    for number, line in prose_lines(path):
        for target in LINK.findall(INLINE_CODE.sub("", line)):
            if not re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto: ...
                links.append((number, target))
    return links


def test_readme_fits_in_two_hundred_lines():
    assert len(README.read_text(encoding="utf-8").splitlines()) <= 200


def test_every_document_the_readme_promises_exists():
    for path in LINKED_DOCUMENTS:
        assert path.is_file(), f"{path.relative_to(ROOT)} is missing"


@pytest.mark.parametrize("document", LINKED_DOCUMENTS, ids=lambda path: str(path.relative_to(ROOT)))
def test_every_relative_link_resolves_to_a_file_and_its_heading(document: Path):
    broken = []
    for number, target in relative_links(document):
        file_part, _, anchor = target.partition("#")
        linked = (document.parent / file_part).resolve() if file_part else document
        where = f"{document.relative_to(ROOT)}:{number}: {target}"
        if not linked.exists():
            broken.append(f"{where} (no such file)")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{where} (no such heading)")
    assert not broken, "\n".join(broken)


@pytest.mark.parametrize("document", FIGURE_CHECKED, ids=lambda path: str(path.relative_to(ROOT)))
def test_readme_and_docs_quote_no_measured_figure_without_a_link_to_results(document: Path):
    unsourced = []
    for number, text in paragraphs(document):
        if "RESULTS.md" in text:
            continue
        for figure in FIGURE.findall(INLINE_CODE.sub("", text)):
            unsourced.append(f"{document.relative_to(ROOT)}:{number}: {figure!r}")
    assert not unsourced, "figures without a link to benchmarks/RESULTS.md:\n" + "\n".join(unsourced)


def test_the_figure_rule_finds_figures_and_spares_settings_in_code():
    assert FIGURE.findall("runs in 0.44× the time, 63% exact, 12 s, 450 tok/s, 2.5 GiB")
    assert not FIGURE.findall(INLINE_CODE.sub("", "block 8, 64 tokens, 3 steps, `max_wait_s: 10 s`"))
    assert not FIGURE.findall("Python ≥ 3.10, port 8000, 16 slots, 2 heads, 4 hosts")


def test_the_configuration_tables_say_what_the_configs_define():
    """docs/configuration.md's generated tables equal the fields' own descriptions and defaults."""
    from scripts.config_docs import main

    assert main(["--check"]) == 0
