"""cluster.yaml is a valid Ray cluster launcher config (checked against the schema shipped in ray)."""
from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def schema() -> dict:
    import ray.autoscaler

    return json.loads((Path(ray.autoscaler.__file__).parent / "ray-schema.json").read_text())


@pytest.fixture(scope="module")
def cluster() -> dict:
    return yaml.safe_load((REPO_ROOT / "cluster.yaml").read_text())


def test_cluster_yaml_validates_against_rays_schema(schema, cluster):
    jsonschema.validate(cluster, schema)


def test_schema_check_would_catch_a_misspelt_key(schema, cluster):
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**cluster, "idle_timeout_minute": 5}, schema)


def test_cluster_has_an_autoscaling_gpu_worker_type_and_installs_the_project(cluster):
    workers = [node for name, node in cluster["available_node_types"].items()
               if name != cluster["head_node_type"]]
    assert any(node["resources"].get("GPU", 0) > 0 and node["min_workers"] < node["max_workers"]
               for node in workers)
    assert any("pip install" in command and "blockserve" in command for command in cluster["setup_commands"])


def test_runtime_env_file_for_ray_job_submit_is_a_valid_runtime_env():
    from ray.runtime_env import RuntimeEnv

    runtime_env = RuntimeEnv(**yaml.safe_load((REPO_ROOT / "configs" / "runtime-env.yaml").read_text()))
    assert runtime_env["working_dir"] == "." and "transformers>=5.24" in runtime_env["pip"]["packages"]
