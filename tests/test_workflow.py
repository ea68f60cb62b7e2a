"""The GitHub Actions workflow (``.github/workflows/tests.yml``): valid for GitHub, and running the
README's commands: the fast tests on every push, the whole suite on a schedule and by hand.
``generator/check`` runs its steps in generated projects."""

import importlib.resources
import json
import re
from pathlib import Path
from typing import Any

import check_jsonschema.builtin_schemas.vendor as vendored
from jsonschema.validators import validator_for
from ruamel.yaml import YAML

from conftest import ROOT

WORKFLOW = ROOT / ".github" / "workflows" / "tests.yml"


def _load(path: Path) -> dict[str, Any]:
    return YAML(typ="safe").load(path.read_text())  # YAML 1.2, as GitHub reads it: `on` stays a string


def _errors(workflow: dict[str, Any]) -> list[str]:
    """What GitHub's schema (schemastore's, as check-jsonschema vendors it) finds wrong."""
    schema = json.loads((importlib.resources.files(vendored) / "github-workflows.json").read_text())
    validator = validator_for(schema)(schema)
    return [
        f"{'.'.join(map(str, error.absolute_path))}: {error.message[:200]}" for error in validator.iter_errors(workflow)
    ]


def test_the_workflow_is_valid_for_github_actions() -> None:
    workflow = _load(WORKFLOW)
    assert _errors(workflow) == []
    workflow["jobs"]["fast"]["runs_on"] = workflow["jobs"]["fast"].pop("runs-on")  # a typo the check must catch
    assert _errors(workflow)


def _runs(job: dict[str, Any]) -> list[str]:
    return [step["run"].strip() for step in job["steps"] if "run" in step]


def test_the_workflow_runs_the_readmes_commands() -> None:
    workflow = _load(WORKFLOW)
    fast, slow = workflow["jobs"]["fast"], workflow["jobs"]["slow"]
    setup = re.search(r"(?m)^(pip install -e \"\.\[dev\]\") && python train\.py", (ROOT / "README.md").read_text())
    assert setup, "the README's set-up line"
    assert setup[1] in _runs(fast) and any(setup[1] in run for run in _runs(slow))
    assert _runs(fast)[-1].startswith('pytest -m "not slow"') and _runs(slow)[-1].startswith("pytest -m slow")
    assert any(run.endswith("pre-commit run --all-files --show-diff-on-failure") for run in _runs(fast))
    assert set(workflow["on"]) == {"push", "pull_request", "schedule", "workflow_dispatch"}
    assert "'push'" in fast["if"] and "'pull_request'" in fast["if"] and "'schedule'" not in fast["if"]
    assert "'schedule'" in slow["if"] and "'workflow_dispatch'" in slow["if"] and "'push'" not in slow["if"]
    assert workflow["env"]["CI"] == "true"  # a skip fails there, as in this repository's CI (conftest)
