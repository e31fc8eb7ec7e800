"""What each install path brings: the CPU install stays lean, GPU nodes get the ``gpu`` extra, and the
wheel holds the runtime (the engine, the Ray side, the job and the tiny model), never the benchmarks,
the research experiments, the tiny model's training or the scripts, which run from a checkout."""
from __future__ import annotations

import fnmatch
import re

import pytest
import yaml

from tests.pipeline_helpers import REPO_ROOT

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
RUNTIME = ("engine", "actors", "pipeline")


@pytest.fixture(scope="module")
def project() -> dict:
    return tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]


def requirement(specs: list[str], name: str) -> str | None:
    found = [spec for spec in specs if re.split(r"[<>=!~\[ ;]", spec, maxsplit=1)[0] == name]
    return found[0] if found else None


def test_torch_is_at_least_2_5_where_sdpa_takes_enable_gqa(project):
    import torch
    import torch.nn.functional as F

    assert requirement(project["dependencies"], "torch") == "torch>=2.5"
    query, key = torch.randn(1, 4, 3, 8), torch.randn(1, 2, 3, 8)  # 4 query heads share 2 KV heads
    assert F.scaled_dot_product_attention(query, key, key, enable_gqa=True).shape == (1, 4, 3, 8)


def test_nvml_is_in_the_gpu_extra_and_not_in_the_cpu_install(project):
    assert requirement(project["dependencies"], "nvidia-ml-py") is None
    assert requirement(project["optional-dependencies"]["gpu"], "nvidia-ml-py") is not None


def test_cluster_nodes_and_the_job_runtime_env_install_the_gpu_extra(project):
    cluster = yaml.safe_load((REPO_ROOT / "cluster.yaml").read_text())
    assert any(re.search(r"pip install -e '?/home/ray/blockserve\[gpu\]", command)
               for command in cluster["setup_commands"])
    packages = yaml.safe_load((REPO_ROOT / "configs" / "runtime-env.yaml").read_text())["pip"]["packages"]
    assert requirement(packages, "nvidia-ml-py") is not None
    assert requirement(packages, "torch") == requirement(project["dependencies"], "torch")


@pytest.fixture(scope="module")
def wheel_packages() -> list[str]:
    """The packages ``pip install .`` puts in the wheel, found as setuptools finds them."""
    setuptools = pytest.importorskip("setuptools")
    found = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    return setuptools.find_namespace_packages(where=str(REPO_ROOT), include=found["include"],
                                              exclude=found.get("exclude", ()))


def test_the_wheel_holds_the_runtime_and_the_tiny_model_and_nothing_else(wheel_packages):
    assert {name.split(".")[0] for name in wheel_packages} == {"engine", "actors", "pipeline", "assets"}
    assert {"engine.models", "actors.serving", "assets.tiny"} <= set(wheel_packages)
    assert [name for name in wheel_packages if name.startswith("assets")] == ["assets.tiny"]  # not the demo data


def test_every_file_of_the_tiny_model_ships_as_package_data():
    package_data = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    patterns = package_data["*"] + package_data.get("assets.tiny", [])
    files = [path.name for path in (REPO_ROOT / "assets" / "tiny").iterdir()]
    assert "model.safetensors" in files
    assert [name for name in files if not any(fnmatch.fnmatch(name, pattern) for pattern in patterns)] == []


def test_nothing_in_the_wheel_imports_code_the_wheel_leaves_out():
    from tests.test_import_boundaries import import_graph

    left_out = ("benchmarks", "research", "tinylm", "scripts")
    shipped = {name: edges for name, edges in import_graph().items() if name.split(".")[0] in RUNTIME}
    assert set(shipped) >= {"engine.engine", "actors.engine_loop", "pipeline.run"}
    assert {name: sorted(edges) for name, edges in shipped.items()
            if any(edge.split(".")[0] in left_out for edge in edges)} == {}
