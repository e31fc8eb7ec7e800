"""Import boundaries. The packages import in one direction: no module reaches itself again through its
imports, and ``research`` (experiments outside the product) is imported by nothing outside it. Light
modules stay light: the engine never imports Ray, ``actors`` loads neither torch nor Ray, and the
scheduler loads neither torch nor transformers.

Every import counts, also one inside a function or under ``TYPE_CHECKING``: a deferred import hides a
tangle, it does not remove it. Importing ``a.b.c`` also runs the ``__init__`` of packages ``a.b`` and
``a``, unless the importer lives inside them (then they are already being imported).
"""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("engine", "actors", "pipeline", "tinylm", "scripts", "benchmarks", "research")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_names(tree: ast.AST, importer: str, is_package: bool) -> set[str]:
    """Dotted names of the modules (or the package attributes) an import statement asks for."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = importer.split(".")[:len(importer.split(".")) - node.level + is_package]
                base = ".".join([*anchor, *([base] if base else [])])
            names.update(f"{base}.{alias.name}" for alias in node.names)
            names.add(base)
    return names


def import_graph() -> dict[str, set[str]]:
    paths = {module_name(path): path for package in PACKAGES for path in (ROOT / package).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        is_package = path.name == "__init__.py"
        edges = set()
        for imported in imported_names(ast.parse(path.read_text()), name, is_package):
            parts = imported.split(".")
            for end in range(1, len(parts) + 1):
                target = ".".join(parts[:end])
                inside = name == target or name.startswith(target + ".")
                if target in paths and not inside:
                    edges.add(target)
        graph[name] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_import_graph_of_every_package_has_no_cycle():
    assert cycles(import_graph()) == []


def test_nothing_outside_research_imports_it():
    graph = import_graph()
    assert any(edge.startswith("benchmarks") for edge in graph["research.paper.run"])  # research builds on them
    assert {name: sorted(edges) for name, edges in graph.items() if not name.startswith("research")
            and any(edge.split(".")[0] == "research" for edge in edges)} == {}


def test_the_cycle_finder_sees_a_cycle_through_a_deferred_import():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    tree = ast.parse("def f():\n    from tinylm.tasks import vocabulary_words\n")
    assert "tinylm.tasks" in imported_names(tree, "tinylm.tokenizer", is_package=False)


def modules_loaded_by(code: str, top_level: bool = True) -> set[str]:
    """The modules (by default the top-level ones) a fresh interpreter holds after running ``code``."""
    name = "name.split('.')[0]" if top_level else "name"
    probe = f"{code}; import sys; print(' '.join(sorted({{{name} for name in sys.modules}})))"
    result = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True)
    return set(result.stdout.split())


def test_importing_the_engine_never_imports_ray():
    assert "ray" not in modules_loaded_by("import engine, engine.engine, engine.models")


@pytest.mark.parametrize("fixture", ["tiny-llada2", "tiny-diffusion_gemma", "tiny-nemotron_labs_diffusion"])
def test_an_eager_model_loads_and_decodes_without_the_compiler_sympy_or_xgrammar(fixture):
    """Each is a quarter to over a second of every actor's, rank's and replica's start: torch._dynamo is for
    compile=True, sympy for torch's Python references, xgrammar for a constrained request."""
    code = ("from engine import BlockServeEngine, EngineConfig, SamplingParams; from engine.models import load_model; "
            f"lm = load_model({str(ROOT / 'tests' / 'fixtures' / fixture)!r}); "
            "engine = BlockServeEngine(lm, EngineConfig(max_batch_size=2)); "
            "engine.generate([[5, 6, 7]], SamplingParams(max_new_tokens=4))")
    assert not {"torch._dynamo", "sympy", "xgrammar"} & modules_loaded_by(code, top_level=False)


def test_importing_actors_loads_neither_torch_nor_ray():
    code = "import actors; assert 'BlockServeActor' in actors.__all__"
    assert not {"torch", "ray"} & modules_loaded_by(code)


def test_importing_the_scheduler_loads_neither_torch_nor_transformers():
    assert not {"torch", "transformers"} & modules_loaded_by("import engine.scheduling.scheduler")


def test_the_scheduling_side_of_the_engine_loads_neither_torch_nor_transformers():
    scheduling = sorted(path.stem for path in (ROOT / "engine" / "scheduling").glob("*.py"))
    imports = "; ".join(f"import engine.scheduling.{name}" for name in scheduling)
    assert not {"torch", "transformers"} & modules_loaded_by(imports)


def test_the_engine_top_level_holds_only_the_public_api_and_its_sides():
    top = {path.name for path in (ROOT / "engine").iterdir() if not path.name.startswith((".", "__pycache__"))}
    assert top == {"__init__.py", "lazy_exports.py", "config.py", "engine.py", "executor.py",
                   "scheduling", "rules", "runner", "models", "layers", "oracle", "parallel", "structured"}


COLLECTIVES = {"engine.parallel.shard.all_reduce", "engine.parallel.shard.all_reduce_max",
               "engine.parallel.shard.all_gather", "engine.parallel.shard.gather_vocabulary", "torch.distributed"}


def collectives_imported(package: str) -> dict[str, list[str]]:
    """Per module of ``package``, the collectives it imports (a module that calls one must import it)."""
    found = {}
    for path in (ROOT / package.replace(".", "/")).rglob("*.py"):
        name = module_name(path)
        names = imported_names(ast.parse(path.read_text()), name, path.name == "__init__.py") & COLLECTIVES
        if names:
            found[name] = sorted(names)
    return found


def test_no_model_file_calls_a_collective_the_layer_kit_owns_them():
    assert collectives_imported("engine.models") == {}
    assert set(collectives_imported("engine.layers")) >= {"engine.layers.linear", "engine.layers.vocab"}


def test_tensor_parallel_knows_neither_the_engine_nor_its_executor():
    """``engine.parallel`` splits a model and runs its ranks; the executor above it drives them for the engine."""
    graph = import_graph()
    above = {"engine.engine", "engine.executor"}
    assert {name: sorted(edges & above) for name, edges in graph.items()
            if name.startswith("engine.parallel") and edges & above} == {}
    assert "engine.parallel.ranks" in graph["engine.executor"]
