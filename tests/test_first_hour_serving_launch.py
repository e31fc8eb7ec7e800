"""A bad Serve config fails before anything is deployed (issue 64, item 6): an unknown key or a model that
does not resolve is a message naming it, from the app builder itself and from ``python -m actors.serving``,
which exits 2 before Ray starts (Ray's own ``serve run FILE`` waits forever instead)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.serve_helpers import REPO_ROOT

SUBPROCESS_TIMEOUT_S = 120  # a hang is the bug under test: fail, never wait for it


def tiny_config(**args_changes) -> dict:
    """configs/serve-tiny.yaml with its application's ``args`` changed."""
    config = yaml.safe_load((REPO_ROOT / "configs" / "serve-tiny.yaml").read_text())
    config["applications"][0]["args"].update(args_changes)
    return config


def launch(config: dict, directory: Path) -> subprocess.CompletedProcess:
    path = directory / "serve.yaml"
    path.write_text(yaml.safe_dump(config))
    env = {key: value for key, value in os.environ.items() if key != "RAY_ADDRESS"}
    return subprocess.run([sys.executable, "-m", "actors.serving", str(path)], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S)


def test_the_builder_refuses_an_unknown_key_and_a_bad_model_before_any_deployment(tmp_path):
    import ray

    from actors.serving.serve_app import build_app

    connected = ray.is_initialized()  # another test of the session may have started Ray: it stays as it was
    with pytest.raises(ValueError, match=r"^max_pendin: unknown key$"):
        build_app({**tiny_config()["applications"][0]["args"], "max_pendin": 64})
    with pytest.raises(ValueError, match=r"^model: unknown model './no-such-model': not 'tiny', not a directory"):
        build_app({"model": "./no-such-model"})
    with pytest.raises(ValueError, match=rf"^model: model directory {tmp_path} has no config.json$"):
        build_app({"model": str(tmp_path)})
    assert ray.is_initialized() == connected  # nothing was deployed, no cluster was started
    build_app(tiny_config()["applications"][0]["args"])  # the shipped config builds


def test_launching_a_config_with_an_unknown_key_exits_2_naming_it_before_ray_starts(tmp_path):
    done = launch(tiny_config(max_pendin=64), tmp_path)
    assert done.returncode == 2, done.stderr
    assert f"not deployed: {tmp_path / 'serve.yaml'}: applications.0.args.max_pendin: unknown key" in done.stderr
    assert "Started a local Ray instance" not in done.stdout + done.stderr


def test_launching_a_config_with_a_bad_model_path_exits_2_with_the_loaders_message(tmp_path):
    done = launch(tiny_config(model="./no-such-model"), tmp_path)
    assert done.returncode == 2, done.stderr
    assert ("applications.0.args.model: unknown model './no-such-model': not 'tiny', not a directory, "
            "not a hub id") in done.stderr
    assert "Traceback" not in done.stderr
