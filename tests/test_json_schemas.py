"""The JSON Schemas of conf/ (.schemas/) are current, every file of conf/ fits its own, and an editor that
reads them flags a typo'd key, a wrong type, a number out of range and a missing argument."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jsonschema
import pytest
from check_jsonschema.cli.main_command import main as check_jsonschema
from click.testing import CliRunner

from mnistlab.runtime.config import bounds, json_schemas

import processes
from composing import ROOT

pytestmark = pytest.mark.yours  # reads your task: pytest -m yours (docs/make-it-yours.md)

COMMAND = [sys.executable, "-m", json_schemas.__name__]


def _validate(file: Path, schema: Path) -> str:
    """What check-jsonschema (the CLI, in this process) says of ``file``, every error (an editor lists them
    all); "" when it fits."""
    result = CliRunner().invoke(check_jsonschema, ["--verbose", "--schemafile", str(schema), str(file)])
    return "" if result.exit_code == 0 else result.output


def _schema_of(file: Path) -> Path:
    """The schema a file's modeline names, as an editor reads it."""
    line = next(line for line in file.read_text().splitlines() if line.startswith(json_schemas.MODELINE))
    return (file.parent / line.removeprefix(json_schemas.MODELINE)).resolve()


def test_the_schemas_and_modelines_are_current() -> None:
    """As a stale lock does, a stale schema fails the fast tier: a class's arguments or conf/'s targets changed."""
    stale = json_schemas.stale(ROOT)
    assert not stale, f"stale: {', '.join(stale)}: run {json_schemas.COMMAND}"


@pytest.mark.parametrize("file", sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "conf").rglob("*.yaml")))
def test_every_file_of_conf_fits_the_schema_its_modeline_names(file: str) -> None:
    path = ROOT / file
    assert _schema_of(path).parent == ROOT / json_schemas.FOLDER
    assert _validate(path, _schema_of(path)) == ""


# In a copy of conf/ with the suite's own configs beside the template's (tests/conf/: conf/data/suite.yaml names
# suite_task.Patterns), so that no case depends on the example's classes.
FLAGGED = [  # (file under conf/, its text, what check-jsonschema says)
    ("data/typo.yaml", "defaults: [suite]\nbatch_sise: 64\n", "'batch_sise' was unexpected"),
    ("data/typo_own.yaml", "_target_: suite_task.Patterns\nbatch_sise: 64\n", "'batch_sise' was unexpected"),
    ("data/type.yaml", "defaults: [suite]\nbatch_size: big\n", "'big' is not of type 'integer'"),
    (
        "callbacks/missing.yaml",
        "stop:\n  _target_: lightning.pytorch.callbacks.EarlyStopping\n",
        "'monitor' is a required",
    ),
    ("model/scheduler/missing.yaml", "_target_: torch.optim.lr_scheduler.StepLR\n", "'step_size' is a required"),
    ("trainer/short.yaml", "defaults: [default]\nmax_epochs: -4\n", "-4 is less than the minimum of -1"),
    ("trainer/literal.yaml", "defaults: [default]\nprecision: fp8\n", "'fp8' is not valid under any of the given"),
    ("callbacks/typo.yaml", "early_stopping:\n  patince: 3\n", "'patince' was unexpected"),
    ("debug/typo.yaml", "# @package _global_\ntrainer:\n  max_epoch: 3\n", "'max_epoch' was unexpected"),
    ("debug/own_key.yaml", "# @package _global_\nmonitr: val/loss\n", "'monitr' was unexpected"),
    ("experiment/nested.yaml", "# @package _global_\ndata:\n  batch_sise: 8\n", "'batch_sise' was unexpected"),
    (
        "model/nested.yaml",
        "defaults: [suite]\noptimizer:\n  _target_: torch.optim.Adam\n  _partial_: true\n  lr: 0\n",
        "0 is less than or equal to the minimum of 0",
    ),
    ("paths/typo.yaml", "log_dri: /tmp\n", "'log_dri' was unexpected"),
]
FITS = [  # what Hydra fills in, and what inherits its keys
    ("data/interpolated.yaml", "defaults: [suite]\nbatch_size: ${oc.env:BATCH}\nval_size: ???\n"),
    ("model/scheduler/partial.yaml", "_target_: torch.optim.lr_scheduler.StepLR\n_partial_: true\nstep_size: 3\n"),
    ("trainer/fraction.yaml", "defaults: [default]\nlimit_train_batches: 0.25\ndevices: -1\n"),
    ("callbacks/off.yaml", "defaults: [default]\nearly_stopping: null\n"),
]


def _project_with(tmp_path: Path, file: str, text: str) -> Path:
    """A copy of the project's conf/ and the suite's, with ``file`` added, its schemas written by the command."""
    project = tmp_path / "project"
    for folder in (ROOT / "conf", ROOT / "tests" / "conf"):
        for path in folder.rglob("*.yaml"):
            target = project / "conf" / path.relative_to(folder)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(path.read_text())
    (project / "conf" / file).parent.mkdir(parents=True, exist_ok=True)
    (project / "conf" / file).write_text(text)
    json_schemas.write(project)
    return project / "conf" / file


@pytest.mark.parametrize("file,text,said", FLAGGED, ids=[f for f, _, _ in FLAGGED])
def test_an_editor_flags_a_typo_a_wrong_type_a_bad_number_and_a_missing_argument(file, text, said, tmp_path) -> None:
    path = _project_with(tmp_path, file, text)
    assert said in _validate(path, _schema_of(path))


@pytest.mark.parametrize("file,text", FITS, ids=[f for f, _ in FITS])
def test_interpolations_partial_nodes_and_inherited_keys_are_not_flagged(file, text, tmp_path) -> None:
    path = _project_with(tmp_path, file, text)
    assert _validate(path, _schema_of(path)) == ""


SAMPLES = [-2, -1, 0, 0.0, 0.5, 1, 1.0, 1.5, 3, 1e9]


RULES = [(owner, key) for owner, rules in bounds.RANGES.items() for key in rules]


@pytest.mark.parametrize("owner,key", RULES, ids=[f"{owner}.{key}" for owner, key in RULES])
def test_each_range_says_in_json_schema_what_the_check_says(owner: str, key: str) -> None:
    """bounds.py spells each range twice (a test in Python, a schema for editors): they agree on every sample.
    A whole float above 1 is JSON Schema's integer (FRACTION_OR_COUNT's comment), left out."""
    rule = bounds.RANGES[owner][key]
    for value in SAMPLES:
        if isinstance(value, float) and value.is_integer() and value > 1:
            continue
        fits_schema = jsonschema.Draft7Validator(rule.schema).is_valid(value)
        assert fits_schema == rule.fits(value), f"{owner}.{key}={value}: {rule.description} vs {rule.schema}"


@pytest.mark.slow  # the command runs as a process, as a user runs it
def test_an_argument_added_to_a_users_class_is_in_its_schema_once_the_command_runs(tmp_path: Path) -> None:
    """The fast tier fails (--check) from the moment a class gains an argument until the command is run."""
    module = tmp_path / "own_task.py"
    module.write_text("class Data:\n    def __init__(self, data_dir: str, batch_size: int = 8):\n        pass\n")
    (tmp_path / "conf" / "data").mkdir(parents=True)
    (tmp_path / "conf" / "data" / "own.yaml").write_text("_target_: own_task.Data\ndata_dir: x\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}

    def command(*args: str) -> subprocess.CompletedProcess[str]:
        return processes.run([*COMMAND, *args], cwd=tmp_path, env=env, timeout=120)

    assert command().returncode == 0
    assert command("--check").returncode == 0
    module.write_text(module.read_text().replace("batch_size: int = 8", "batch_size: int = 8, workers: int = 0"))
    stale = command("--check")
    assert stale.returncode == 1
    assert f"stale: {json_schemas.FOLDER}/conf.json: run {json_schemas.COMMAND}" in stale.stderr
    assert command().returncode == 0
    shared = json.loads((tmp_path / json_schemas.FOLDER / "conf.json").read_text())
    arguments = shared["definitions"]["arguments of own_task.Data"]["properties"]
    assert {"data_dir", "batch_size", "workers"} <= arguments.keys()
    assert (tmp_path / "conf" / "data" / "own.yaml").read_text().startswith(f"{json_schemas.MODELINE}../../")
    text = textwrap.dedent("""\
        _target_: own_task.Data
        data_dir: x
        workers: many
    """)
    (tmp_path / "conf" / "data" / "own.yaml").write_text(text)
    assert "'many' is not of type 'integer'" in _validate(
        tmp_path / "conf" / "data" / "own.yaml", tmp_path / json_schemas.FOLDER / "data.json"
    )
