"""Serving's configuration, without a server: the shipped Serve configs validate, the app config refuses
unknown keys, inconsistent batching and model options under `engine`, and a server reachable beyond
loopback refuses to start without an API key (from the config or the environment)."""
from __future__ import annotations

import pytest
import yaml

from tests.serve_helpers import REPO_ROOT


def test_a_server_reachable_beyond_loopback_refuses_to_start_without_a_key(monkeypatch):
    from actors.serving.api_keys import check_exposure, resolve_api_key

    with pytest.raises(ValueError, match="refusing to start.*0.0.0.0.*allow_unauthenticated"):
        check_exposure("0.0.0.0", None, allow_unauthenticated=False)
    check_exposure("0.0.0.0", None, allow_unauthenticated=True)  # the explicit opt-out
    check_exposure("0.0.0.0", "key", allow_unauthenticated=False)
    for loopback in ("127.0.0.1", "::1", "localhost"):
        check_exposure(loopback, None, allow_unauthenticated=False)
    monkeypatch.setenv("BLOCKSERVE_API_KEY", "from-env")
    assert resolve_api_key(None, "BLOCKSERVE_API_KEY") == "from-env"
    assert resolve_api_key("from-config", "BLOCKSERVE_API_KEY") == "from-config"
    monkeypatch.delenv("BLOCKSERVE_API_KEY")
    assert resolve_api_key(None, "BLOCKSERVE_API_KEY") is None


@pytest.mark.parametrize("name", ["serve-tiny.yaml", "serve-llada-8b.yaml", "serve-sdar-8b.yaml",
                                  "serve-diffusiongemma-26b-a4b.yaml", "serve-nemotron-labs-diffusion-8b.yaml"])
def test_serve_configs_validate(name):
    from ray.serve.schema import ServeDeploySchema

    from actors.serving.serve_app import DEPLOYMENT_NAME, ServeAppConfig

    config = ServeDeploySchema.model_validate(yaml.safe_load((REPO_ROOT / "configs" / name).read_text()))
    (app,) = config.applications
    assert app.import_path == "actors.serving.serve_app:build_app"
    ServeAppConfig.model_validate(app.args)
    assert [deployment.name for deployment in app.deployments] == [DEPLOYMENT_NAME]


def test_serve_app_config_rejects_unknown_keys_and_inconsistent_batching():
    from actors.serving.serve_app import ServeAppConfig

    with pytest.raises(ValueError, match="max_pendng"):
        ServeAppConfig.model_validate({"max_pendng": 3})
    with pytest.raises(ValueError, match="blok_length"):
        ServeAppConfig.model_validate({"engine": {"blok_length": 32}})
    with pytest.raises(ValueError, match="schedule"):
        ServeAppConfig.model_validate({"batching": "static"})


def test_compile_and_batch_invariant_are_options_of_the_loaded_model_not_engine_settings():
    from actors.serving.serve_app import ServeAppConfig

    config = ServeAppConfig.model_validate({"compile": True})
    assert config.compile and not config.batch_invariant
    with pytest.raises(ValueError, match="batch_invariant: not an engine setting; .* top level"):
        ServeAppConfig.model_validate({"engine": {"batch_invariant": True}})
    with pytest.raises(ValueError, match="compile=True"):
        ServeAppConfig.model_validate({"compile": True, "batch_invariant": True})
