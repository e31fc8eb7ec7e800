"""What a new user reads matches what ships: every config is listed where configs are listed, the
package says which families it serves, and a job's runtime environment installs what the project needs."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from engine.models.families import FAMILIES

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

REPO_ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted(path.name for path in (REPO_ROOT / "configs").glob("*.yaml"))


@pytest.mark.parametrize("document", ["README.md", "docs/configuration.md"])
def test_every_shipped_config_is_listed_where_configs_are_listed(document):
    text = (REPO_ROOT / document).read_text()
    missing = [name for name in CONFIGS if name.removesuffix(".yaml") not in text]
    assert not missing, f"{document} does not name {missing}"


def test_the_package_description_names_every_family_served():
    description = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["description"]
    assert [family.title for family in FAMILIES if family.title not in description] == []


def test_the_jobs_runtime_environment_installs_the_projects_own_requirements():
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    required = {requirement.split(";")[0].strip() for requirement in project["dependencies"]
                if not requirement.startswith("ray")}
    runtime = yaml.safe_load((REPO_ROOT / "configs" / "runtime-env.yaml").read_text())
    assert required <= set(runtime["pip"]["packages"])
