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

from mnistlab.runtime.config import json_schemas

from composing import ROOT

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
    fast, slow, lock = workflow["jobs"]["fast"], workflow["jobs"]["slow"], workflow["jobs"]["lock"]
    setup = re.search(r"(?m)^(pip install uv) && uv run train\.py", (ROOT / "README.md").read_text())
    assert setup, "the README's set-up line"
    install = f"{setup[1]} && uv sync --locked"  # the README's, with the lock checked (stale: it fails)
    assert install in _runs(fast) and any(install in run for run in _runs(slow))
    assert _runs(fast)[-1].startswith('uv run pytest -m "not slow"')
    assert _runs(slow)[-1].startswith("uv run pytest -m slow")
    assert any(run.endswith("uv run pre-commit run --all-files --show-diff-on-failure") for run in _runs(fast))
    assert set(workflow["on"]) == {"push", "pull_request", "schedule", "workflow_dispatch"}
    assert "'push'" in fast["if"] and "'pull_request'" in fast["if"] and "'schedule'" not in fast["if"]
    for job in (slow, lock):
        assert "'schedule'" in job["if"] and "'workflow_dispatch'" in job["if"] and "'push'" not in job["if"]
    assert workflow["env"]["CI"] == "true"  # a skip fails there, as in this repository's CI (conftest)


def test_the_docs_home_shows_the_readmes_set_up() -> None:
    block = re.compile(r"(?ms)^```bash\n(pip install uv && uv run .*?)^```")
    readme, home = (block.search((ROOT / path).read_text()) for path in ("README.md", "docs/index.md"))
    assert readme and home and home[1] == readme[1]


def test_the_scheduled_lock_upgrade_tests_the_lock_it_leaves() -> None:
    """Monday's job upgrades uv.lock, writes conf/'s schemas for its releases, runs the fast tier on exactly
    that lock, and keeps both to commit."""
    lock = _load(WORKFLOW)["jobs"]["lock"]
    runs = _runs(lock)
    assert "uv lock --upgrade" in runs[0] and runs[-1].startswith('uv run --locked pytest -m "not slow"')
    assert runs[-2] == f"uv run --locked python -m {json_schemas.__name__}"
    (upload,) = [step for step in lock["steps"] if step.get("uses", "").startswith("actions/upload-artifact@")]
    assert upload["with"]["path"].split() == ["uv.lock", f"{json_schemas.FOLDER}/"]
    assert upload["with"]["include-hidden-files"] is True  # .schemas/ is a hidden folder
    assert lock["steps"][-1] is upload  # only after the tests passed
