"""What each install path brings: the CPU install stays lean, GPU nodes get the ``gpu`` extra."""
from __future__ import annotations

import re

import pytest
import yaml

from tests.pipeline_helpers import REPO_ROOT

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11


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
