"""``copier copy`` makes a renamed project of this one, and ``copier update`` brings template changes in.

The template is a git repository made of this working tree (what would be committed), so the tests
see the code as it is now. Rendering copies the files and runs ``generator/rename.py`` in the copy.
"""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import onnxruntime
import openapi_spec_validator
import pytest
import s3_server
import yaml

from mnistlab.runtime.run import run_folder
from mnistlab.trained import model_card

import processes
from composing import ROOT, SHORT, locked_versions
from running import serving

pytestmark = pytest.mark.slow  # copier, git and the rendered project run as processes

ANSWERS = ["-d", "project_name=Retina Lab", "-d", "author=Ada Lovelace", "-d", "email=ada@example.org"]
GIT_ENV = {
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.org",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.org",
}


def _run(*command: str, cwd: Path) -> str:
    result = subprocess.run(
        command, cwd=cwd, capture_output=True, text=True, env=os.environ | GIT_ENV, timeout=300, check=False
    )
    assert result.returncode == 0, f"{' '.join(command)}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result.stdout


def _commit(repo: Path, message: str) -> None:
    _run("git", "add", "-A", cwd=repo)
    _run("git", "commit", "-q", "-m", message, cwd=repo)


def _copier(*args: str, cwd: Path) -> None:
    _run(sys.executable, "-m", "copier", *args, "--trust", "--defaults", cwd=cwd)


def _generate(template: Path, project: Path, *answers: str) -> None:
    """``copier copy`` into ``project``, made a git repository with the result committed (as ``copier
    update`` requires)."""
    _copier("copy", *answers, str(template), str(project), cwd=project.parent)
    _run("git", "init", "-q", cwd=project)
    _commit(project, "generated")


def _copy_working_tree(repo: Path) -> None:
    """This working tree's files (tracked, and new ones git does not ignore) into ``repo``."""
    files = _run("git", "ls-files", "--cached", "--others", "--exclude-standard", "-z", cwd=ROOT).split("\0")
    for name in filter(None, files):
        if (ROOT / name).is_file():  # a file deleted but not yet committed is listed too
            (repo / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, repo / name)


@pytest.fixture
def template(tmp_path: Path) -> Path:
    """A git repository holding this working tree's files."""
    repo = tmp_path / "template"
    _copy_working_tree(repo)
    _run("git", "init", "-q", cwd=repo)
    _commit(repo, "template")
    return repo


def _traces(project: Path) -> list[str]:
    """Paths, and lines of text files, that still say mnistlab (in any case)."""
    found = []
    for path in project.rglob("*"):
        if ".git" in path.relative_to(project).parts:
            continue
        if "mnistlab" in path.name.lower():
            found.append(str(path))
        elif path.is_file():
            text = path.read_bytes().decode(errors="ignore").lower()
            found += [f"{path}: {line.strip()}" for line in text.splitlines() if "mnistlab" in line]
    return found


def _fast_dev_run(project: Path, out: Path, *overrides: str) -> subprocess.CompletedProcess[str]:
    """``train.py debug=fdr`` of a rendered project, from its folder, its package importable uninstalled."""
    env = os.environ | {"PYTHONPATH": str(project / "src"), "PROJECT_ROOT": str(project)}
    command = [sys.executable, "train.py", "debug=fdr", f"paths.log_dir={out}", *overrides]
    return processes.run(command, cwd=project, env=env, timeout=300)


def test_copy_renames_everything(template: Path, tmp_path: Path) -> None:
    project = tmp_path / "retina"
    _copier("copy", *ANSWERS, str(template), str(project), cwd=tmp_path)
    assert _traces(project) == []
    assert (project / "src" / "retina_lab" / "tasks.py").is_file()
    assert (project / "src" / "hydra_plugins" / "retina_lab_slurm").is_dir()
    assert "_target_: retina_lab.module.Classifier" in (project / "conf" / "model" / "simple_nn.yaml").read_text()
    assert "RETINA_LAB_EPOCH_TIMES" in (project / "benchmarks" / "timing.py").read_text()
    pyproject = (project / "pyproject.toml").read_text()
    assert 'name = "retina_lab"' in pyproject
    locked, template = locked_versions(project), locked_versions(ROOT)  # the template's lock, renamed
    assert locked.pop("retina-lab") == template.pop("mnistlab") and locked == template
    assert 'authors = [{ name = "Ada Lovelace", email = "ada@example.org" }]' in pyproject
    readme = (project / "README.md").read_text()
    assert readme.startswith("# Retina Lab\n\nA deep-learning project trained with PyTorch Lightning")
    assert "Start your own project" not in readme  # the template's own section
    assert (
        "python predict.py" in readme and (project / "docs" / "example" / "performance.md").is_file()
    )  # the example's
    assert "## Predict" in (project / "docs" / "export-serve.md").read_text()
    assert (
        not (project / "docs" / "generator.md").exists() and "generator.md" not in (project / "mkdocs.yml").read_text()
    )
    assert "(run by tests/test_generator.py)" not in "".join(p.read_text() for p in (project / "docs").rglob("*.md"))
    for generator in ("generator/", "copier.yml", "cookiecutter.json", ".ci/", "tests/test_generator.py"):
        assert not (project / generator).exists() and generator not in readme, generator  # the template's own
    assert "copier" not in readme.lower() and "cookiecutter" not in readme.lower() and "<!--" not in readme
    assert (project / ".github" / "workflows" / "tests.yml").is_file()  # its CI, in the form its users run
    # The renamed project imports, composes its config and builds its model, as it is, from its folder.
    check = "from retina_lab.tasks import train; import hydra; print('ok')"
    env = os.environ | {"PYTHONPATH": str(project / "src")}
    result = processes.run([sys.executable, "-c", check], cwd=project, env=env, timeout=120)
    assert result.stdout.strip() == "ok", result.stderr[-2000:]


def test_copy_without_the_example_trains_on_placeholders(template: Path, tmp_path: Path) -> None:
    project = tmp_path / "blank"
    _copier("copy", "-d", "project_name=Blank Lab", "-d", "example=false", str(template), str(project), cwd=tmp_path)
    assert _traces(project) == []
    gone_with_the_example = (
        "predict.py",
        "conf/data/mnist.yaml",
        "src/blank_lab/example",  # the folder, all of it
        "tests/test_data.py",
    )
    for gone in (
        *gone_with_the_example,
        "benchmarks",
        "tests/test_notebooks.py",
        "demo.py",
        "docs/example",
    ):
        assert not (project / gone).exists(), gone
    assert [p.name for p in (project / "notebooks").iterdir()] == [".gitkeep"]  # for the user's notebooks
    assert "  - placeholder" in (project / "conf" / "data" / "default.yaml").read_text()
    assert (project / "docs" / "make-it-yours.md").is_file()  # the guide of a project with no example
    assert (project / "serve.py").is_file() and "decode: npy" in (project / "conf" / "serve.yaml").read_text()
    for text in (
        (project / "pyproject.toml").read_text(),
        (project / ".github" / "workflows" / "tests.yml").read_text(),
    ):
        assert not {"gradio", "demo", "wrk"} & set(re.findall(r"[a-z]+", text.lower()))
    # Its own lock (no demo extra: the template's would be stale there), with the template's versions.
    locked, template = locked_versions(project), locked_versions(ROOT)
    assert "blank-lab" in locked and "gradio" not in locked
    assert all(versions == template[name] for name, versions in locked.items() if name != "blank-lab")
    assert (
        "_target_: blank_lab.data.PlaceholderDataModule" in (project / "conf" / "data" / "placeholder.yaml").read_text()
    )
    assert "MNIST" not in (project / "src" / "blank_lab" / "__init__.py").read_text()
    readme = (project / "README.md").read_text()
    assert "**This project starts with placeholders:**" in readme
    assert "predict.py" not in readme and "<!--" not in readme
    assert "performance" not in (project / "mkdocs.yml").read_text()
    assert "## Predict" not in (project / "docs" / "export-serve.md").read_text()
    for example_only in ("mnist", "digit", "98", "predict.py", "benchmarks/", "notebooks/"):
        assert example_only not in readme.lower(), example_only
    mentions = [str(path) for path in project.rglob("*") if path.is_file() and "mnist" in path.read_text().lower()]
    assert mentions == []  # nothing speaks of MNIST any more
    assert (project / "conf" / "hparams_search" / "optuna.yaml").is_file()  # was mnist_optuna
    lines = readme.splitlines()
    column = {
        line.split("#")[0].strip(): line.index("#")
        for line in lines
        if line.startswith("python train.py ") and "#" in line
    }
    assert column["python train.py -m hparams_search=optuna"] == column["python train.py"]  # aligned comments
    result = _fast_dev_run(project, tmp_path / "outputs")
    assert result.returncode == 0, result.stderr[-3000:]
    refused = _fast_dev_run(project, tmp_path / "outputs", "data.val_size=60000")
    assert refused.stderr.strip() == "Error: data.val_size=60000 leaves no training images of data.train_size=60000"


def test_update_brings_template_changes_and_keeps_the_users_own(template: Path, tmp_path: Path) -> None:
    project = tmp_path / "retina"
    _generate(template, project, *ANSWERS)
    trainer = project / "conf" / "trainer" / "default.yaml"
    trainer.write_text(trainer.read_text().replace("max_epochs: 10 ", "max_epochs: 30 "))  # the user's edit
    # and a line the template changes too
    trainer.write_text(trainer.read_text().replace("log_every_n_steps: 50 ", "log_every_n_steps: 25 "))
    _commit(project, "train longer")

    tasks = template / "src" / "mnistlab" / "tasks.py"  # the template's change, under the template's name
    tasks.write_text(tasks.read_text() + "\n# A change of the template's: see mnistlab.tasks.train.\n")
    template_trainer = template / "conf" / "trainer" / "default.yaml"
    template_trainer.write_text(
        template_trainer.read_text().replace("log_every_n_steps: 50 ", "log_every_n_steps: 100")
    )
    readme = template / "README.md"
    readme.write_text(readme.read_text() + "\nA new paragraph of the template's.\n")
    _commit(template, "a template change")

    _copier("update", cwd=project)
    tasks_now = (project / "src" / "retina_lab" / "tasks.py").read_text()
    assert tasks_now.endswith("# A change of the template's: see retina_lab.tasks.train.\n")  # renamed on the way
    assert (project / "README.md").read_text().endswith("A new paragraph of the template's.\n")
    assert "max_epochs: 30 " in trainer.read_text()
    # Both changed log_every_n_steps: the file shows both, marked, for the user to choose (inline conflicts).
    conflict = re.search(r"<<<<<<< .*\n(.*)\n=======\n(.*)\n>>>>>>> .*", trainer.read_text())
    assert conflict and "log_every_n_steps: 25 " in conflict[1] and "n_steps: 100" in conflict[2], trainer.read_text()
    assert _traces(project) == []
    assert not list(project.rglob("*.rej"))


def test_update_without_the_example_keeps_the_users_data_module(template: Path, tmp_path: Path) -> None:
    project = tmp_path / "blank"
    _generate(template, project, "-d", "project_name=Blank Lab", "-d", "example=false")
    data = project / "src" / "blank_lab" / "data.py"
    data.write_text('"""My own data module."""\n')  # the placeholder replaced, as its README asks
    mine = project / "notebooks" / "mine.py"  # the folder kept for the user's notebooks
    mine.write_text("# my notebook\n")
    _commit(project, "my data")

    tasks = template / "src" / "mnistlab" / "tasks.py"
    tasks.write_text(tasks.read_text() + "\n# A change of the template's.\n")
    _commit(template, "a template change")

    _copier("update", cwd=project)
    assert (project / "src" / "blank_lab" / "tasks.py").read_text().endswith("# A change of the template's.\n")
    assert data.read_text() == '"""My own data module."""\n'
    assert mine.read_text() == "# my notebook\n"  # the example's notebooks left out, the user's kept
    assert not (project / "predict.py").exists() and not (project / "conf" / "data" / "mnist.yaml").exists()
    assert _traces(project) == []
    assert not list(project.rglob("*.rej"))


def test_update_touches_only_the_files_the_template_renders(template: Path, tmp_path: Path) -> None:
    """In a folder named after the template, the user's files, git-ignored ones and a virtual environment
    keep every byte, whatever they say, through ``copier update``; only the template's files are renamed."""
    project = tmp_path / "mnistlab-fork"
    _generate(template, project, *ANSWERS)
    note = project / "NOTES.md"
    note.write_text("Derived from the MNISTLAB template (mnistlab).\n")
    own_module = project / "src" / "retina_lab" / "ported.py"
    own_module.write_text('"""Ported from mnistlab.runtime.distributed.rendezvous."""\n')
    _commit(project, "my notes")
    pip = project / ".venv" / "bin" / "pip"
    pip.parent.mkdir(parents=True)
    pip.write_text(f"#!{project}/.venv/bin/python\n")  # the shebang an update once broke
    installed = project / ".venv" / "lib" / "site-packages" / "mnistlab_fork.pth"
    installed.parent.mkdir(parents=True)
    installed.write_text(str(project / "src"))
    log = project / "outputs" / "mnistlab.log"
    log.write_text("mnistlab\n")
    untouched = {path: path.read_bytes() for path in (note, own_module, pip, installed, log)}

    tasks = template / "src" / "mnistlab" / "tasks.py"
    tasks.write_text(tasks.read_text() + "\n# See mnistlab.tasks.train.\n")
    _commit(template, "a template change")
    _copier("update", cwd=project)
    assert (project / "src" / "retina_lab" / "tasks.py").read_text().endswith("# See retina_lab.tasks.train.\n")
    assert {path: path.read_bytes() for path in untouched} == untouched
    assert not (project / "src" / "mnistlab").exists() and not list(project.rglob("*.rej"))


def _files(project: Path, answers_file: str) -> dict[str, bytes]:
    return {
        path.relative_to(project).as_posix(): path.read_bytes()
        for path in project.rglob("*")
        if path.is_file() and ".git" not in path.relative_to(project).parts and path.name != answers_file
    }


@pytest.mark.parametrize(
    ("answers", "package"),
    [(ANSWERS, "retina_lab"), (["-d", "project_name=Blank Lab", "-d", "example=false"], "blank_lab")],
)
def test_cookiecutter_gives_the_same_project_as_copier(
    template: Path, tmp_path: Path, answers: list[str], package: str
) -> None:
    """``cookiecutter <template>``: the root's cookiecutter.json leads to generator/cookiecutter/, whose hook
    copies the same files and runs the same rename, so the project is copier's, byte for byte."""
    by_copier = tmp_path / "copier" / "project"
    by_copier.parent.mkdir()
    _copier("copy", *answers, str(template), str(by_copier), cwd=tmp_path)
    config = tmp_path / "cookiecutter.yaml"  # its clones and replays in tmp_path, not in the home folder
    config.write_text(f"cookiecutters_dir: {tmp_path / 'clones'}\nreplay_dir: {tmp_path / 'replay'}\n")
    context = [answer for answer in answers if answer != "-d"]  # cookiecutter takes key=value
    command = ["-m", "cookiecutter", "--no-input", "--config-file", str(config), "-o", "cookiecutter"]
    _run(sys.executable, *command, str(template), *context, cwd=tmp_path)
    by_cookiecutter = tmp_path / "cookiecutter" / package  # the folder is named after the package
    copied = _files(by_copier, ".copier-answers.yml")
    assert f"src/{package}/tasks.py" in copied and _traces(by_copier) == []
    assert _files(by_cookiecutter, ".cookiecutter.json") == copied
    recorded = json.loads((by_cookiecutter / ".cookiecutter.json").read_text())  # the answers, as copier keeps them
    answers_of_copier = yaml.safe_load((by_copier / ".copier-answers.yml").read_text())
    assert recorded == {key: value for key, value in answers_of_copier.items() if not key.startswith("_")}


FLAT_PACKAGE = "677c63bd72659dd99b490d7a03fcc688ea8c04d5"  # the template's last commit with every module at the top


def test_a_project_generated_from_the_flat_package_updates_into_its_subpackages(tmp_path: Path) -> None:
    """``copier update`` across the move of the machinery into runtime/, sweeps/ and trained/: the moved
    modules leave, the new ones arrive renamed, the user's own files and edits stay, nothing conflicts."""
    repo = tmp_path / "template"
    repo.mkdir()
    _run("git", "init", "-q", cwd=repo)
    flat = subprocess.run(["git", "archive", FLAT_PACKAGE], cwd=ROOT, capture_output=True, timeout=60, check=False)
    assert flat.returncode == 0, f"needs this repository's history (a full clone): {flat.stderr.decode()[-500:]}"
    subprocess.run(["tar", "-x", "-C", str(repo)], input=flat.stdout, check=True, timeout=60)
    _commit(repo, "flat package")
    for path in repo.iterdir():
        if path.name != ".git":
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    _copy_working_tree(repo)
    _commit(repo, "subpackages")

    project = tmp_path / "retina"
    _copier("copy", *ANSWERS, "--vcs-ref", "HEAD~1", str(repo), str(project), cwd=tmp_path)
    assert (project / "src" / "retina_lab" / "launch.py").is_file()  # the flat layout
    _run("git", "init", "-q", cwd=project)
    _commit(project, "generated")
    trainer = project / "conf" / "trainer" / "default.yaml"
    # An edit of a line whose neighbours the template leaves alone (git merges adjacent edits as a conflict).
    trainer.write_text(trainer.read_text().replace("log_every_n_steps: 50 ", "log_every_n_steps: 20 "))
    mine = project / "src" / "retina_lab" / "my_callbacks.py"
    mine.write_text('"""The user\'s own module, beside the template\'s."""\n')
    _commit(project, "my changes")

    _copier("update", cwd=project)
    package = project / "src" / "retina_lab"
    assert sorted(p.name for p in package.iterdir() if p.name != "__pycache__") == sorted(
        ["__init__.py", "data.py", "example", "module.py", "my_callbacks.py", "network.py", "runtime", "sweeps",
         "tasks.py", "trained"]
    )  # fmt: skip
    assert (package / "runtime" / "run" / "launch.py").is_file() and (package / "trained" / "loading.py").is_file()
    assert "_target_: retina_lab.runtime.reporting.profiler.NoProfiler" in trainer.read_text()
    assert "log_every_n_steps: 20 " in trainer.read_text()
    assert _traces(project) == [] and not list(project.rglob("*.rej"))
    grep = ["git", "grep", "-l", "<<<<<<<"]
    conflicts = subprocess.run(grep, cwd=project, capture_output=True, text=True, timeout=60, check=False)
    assert conflicts.stdout == "", conflicts.stdout
    result = _fast_dev_run(project, tmp_path / "outputs")
    assert result.returncode == 0, result.stderr[-3000:]


# docs/make-it-yours.md: each walk-through is a section of files (```lang title="path") and rm commands.
WALKTHROUGH = ROOT / "docs" / "make-it-yours.md"
STREAM = "## Your data as a stream"  # the section whose commands need a bucket
# Each walk-through: the sections of docs/make-it-yours.md it applies, in order (the regression's data then streamed).
VARIANTS = {"classifier": ["## An RGB classifier"], "regression": ["## A regression", STREAM]}
USERS_FILES = re.compile(
    r"src/shapes_lab/(data|network|module|regression)\.py|conf/(data|model)/.*|\.schemas/.*|outputs/.*"  # outputs: logs
)
SCHEMAS = "shapes_lab.runtime.config.json_schemas"  # the command that writes them, in the walk-through's project


def _walkthrough(variant: str) -> list[str]:
    sections = re.split(r"(?m)^(?=## )", WALKTHROUGH.read_text())
    return [next(s for s in sections if s.startswith(title)) for title in VARIANTS[variant]]


def _replace_the_example(project: Path, variant: str, env: dict[str, str]) -> None:
    """What the user does, as the guide says, block by block: each file it shows written, each command run."""
    for section in _walkthrough(variant):
        blocks = re.findall(r'(?ms)^```(\w+)(?: title="([^"]+)")?\n(.*?)^```$', section)
        assert any(path for _, path, _ in blocks), section[:200]
        for language, path, text in blocks:
            if path:
                (project / path).parent.mkdir(parents=True, exist_ok=True)
                (project / path).write_text(text)
            elif language == "bash":
                for line in text.splitlines():
                    # The guide removes files, streams the data and writes conf/'s schemas: nothing else runs here.
                    assert line.startswith(("rm ", "python stream.py ", f"python -m {SCHEMAS}")), line
                    command = line.replace("python ", f"{sys.executable} ", 1)
                    result = processes.run(["bash", "-c", command], cwd=project, env=env, timeout=300)
                    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]


def _contents(project: Path) -> dict[str, bytes]:
    return {p.relative_to(project).as_posix(): p.read_bytes() for p in project.rglob("*") if p.is_file()}


@pytest.mark.slow
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_a_project_whose_example_is_replaced_passes_the_tests_of_its_task(
    variant: str, template: Path, tmp_path: Path
) -> None:
    """docs/make-it-yours.md: a project without the example, its placeholders replaced by the user's files
    alone (an RGB CNN on DataLoaders; a regression of one value per sample with its own LightningModule,
    val/loss min, its data then streamed from a bucket): the project's tests of the user's task (``-m yours``:
    the contract, every option composed, the schemas, layout and docs) pass, none skipped, and it trains.
    The regression then resumes, sweeps, evaluates, exports and serves: everything after training on a
    task that is no classifier (the machinery's own tests do it on the suite's classifier)."""
    project = tmp_path / "shapes"
    _copier("copy", "-d", "project_name=Shapes Lab", "-d", "example=false", str(template), str(project), cwd=tmp_path)
    env = os.environ | {"PYTHONPATH": str(project / "src"), "PROJECT_ROOT": str(project), "CI": "true"}
    if STREAM in VARIANTS[variant]:  # the guide's bucket, on an S3 server of this machine
        env |= s3_server.start(tmp_path / "moto.txt", bucket="shapes")
        env["LITDATA_CACHE_DIR"] = str(tmp_path / "chunks")  # each node's copy of the chunks: not ~/.lightning's
    before = _contents(project)
    _replace_the_example(project, variant, env)
    after = _contents(project)
    touched = {path for path in before.keys() | after.keys() if before.get(path) != after.get(path)}
    assert all(USERS_FILES.fullmatch(path) for path in touched), sorted(touched)
    # The quick tests that read the user's task, and the contract's slow one (two DDP processes): the
    # machinery's train the suite's own task, and generator/check runs them in the projects it renders.
    yours = ["-m", "yours", "-k", "test_contract or not slow"]
    command = [sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", *yours]
    result = processes.run(command, cwd=project, env=env, timeout=900)
    assert result.returncode == 0, result.stdout[-4000:]
    (summary,) = re.findall(r"(?m)^\d+ passed.*$", result.stdout)  # pytest -q's last line
    assert not re.search(r"failed|skipped|error", summary), summary
    assert "PASSED tests/test_contract.py::test_two_ddp_processes_train_and_test_as_one" in result.stdout
    if variant == "regression":
        run = _trains_resumes_and_sweeps_on_the_loss(project, env, tmp_path / "outputs")
        _a_scheduler_left_behind_is_named_in_one_line(project, env)
        _evaluates_exports_and_serves_its_best_checkpoint(project, env, run, tmp_path / "after")
    else:
        run = tmp_path / "outputs" / "run"
        trained = processes.run([sys.executable, "train.py", *SHORT, f"hydra.run.dir={run}"], cwd=project, env=env)
        assert trained.returncode == 0, trained.stderr[-3000:]
        assert len(list(run_folder.checkpoints(run).glob("epoch*.ckpt"))) == 1  # its best, by its own metric


def _a_scheduler_left_behind_is_named_in_one_line(project: Path, env: dict[str, str]) -> None:
    """The template's scheduler options, kept by a user whose model takes none (the guide's rm skipped):
    the fast tier's test of every option names the folder to remove, in one line, not Hydra's error."""
    (project / "conf" / "model" / "scheduler").mkdir()
    shutil.copy(ROOT / "conf" / "model" / "scheduler" / "cosine.yaml", project / "conf" / "model" / "scheduler")
    test = "tests/test_config.py::test_every_option_composes_resolves_and_fits_the_schema"
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test, "-k", "cosine"]
    result = processes.run(command, cwd=project, env=env, timeout=300)
    assert result.returncode == 1 and "2 failed" in result.stdout, result.stdout[-3000:]  # train's and eval's
    said = "conf/model/scheduler/cosine.yaml is an option of model configs with a 'scheduler' default, and your model"
    for entry in ("train", "eval"):
        assert f"FAILED {test}[{entry}-model/scheduler-cosine] - Failed: {said}" in result.stdout, result.stdout[-3000:]
    assert "Traceback" not in result.stdout and "No match in the defaults list" not in result.stdout


def _trains_resumes_and_sweeps_on_the_loss(project: Path, env: dict[str, str], out: Path) -> None:
    run = out / "run"
    steps = ["trainer.limit_train_batches=8", "trainer.limit_val_batches=4", "trainer.limit_test_batches=4"]
    commands = [
        ["train.py", "trainer.max_epochs=1", *steps, f"hydra.run.dir={run}"],
        ["train.py", f"resume={run}", "trainer.max_epochs=2"],
        ["train.py", "-m", "model.lr=1e-2,1e-4", "trainer.max_epochs=1", *steps, "logger=none", f"paths.log_dir={out}"],
    ]
    results = [processes.run([sys.executable, *c], cwd=project, env=env, timeout=300) for c in commands]
    for result in results:
        assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["val/loss_best"] <= metrics["val/loss"] and "test/loss" in metrics  # the best is the lowest
    assert yaml.safe_load((run / ".hydra" / "config.yaml").read_text())["mode"] == "min"
    assert torch_epoch(run_folder.last_checkpoint(run)) == 1  # resumed for its second epoch
    (sweep,) = (out / "train" / "multiruns").iterdir()
    losses = {job: json.loads((sweep / job / "metrics.json").read_text())["val/loss_best"] for job in ("0", "1")}
    best = min(losses, key=losses.get)
    assert f"Best: job {best}, val/loss_best={losses[best]:.6g}" in results[2].stdout
    return run


# The exported .pt2 and .onnx run by torch alone and onnxruntime alone, the project unimportable.
ALONE = """
import json, sys
sys.modules["shapes_lab"] = sys.modules["lightning"] = None
import numpy as np, onnxruntime, torch
inputs = np.load(sys.argv[3])
program = torch.export.load(sys.argv[1]).module()(torch.from_numpy(inputs)).detach().numpy()
onnx = onnxruntime.InferenceSession(sys.argv[2]).run(None, {sys.argv[4]: inputs})[0]
print(json.dumps([program.tolist(), onnx.tolist()]))
"""


def _evaluates_exports_and_serves_its_best_checkpoint(project: Path, env: dict[str, str], run: Path, out: Path) -> None:
    """What follows training, on the user's task: eval.py tests the best checkpoint; export.py writes it in
    every format (each checked against the checkpoint by export.py itself); serve.py answers a JSON batch of
    the card's input shape with what the exported ONNX file computes, as its card says (class
    probabilities, or values)."""
    (best,) = [p for p in run_folder.checkpoints(run).glob("*.ckpt") if p != run_folder.last_checkpoint(run)]
    tested = processes.run(
        [sys.executable, "eval.py", f"ckpt_path={best}", f"paths.log_dir={out}"], cwd=project, env=env
    )
    assert tested.returncode == 0 and "test/" in tested.stdout, tested.stderr[-3000:]
    formats = "format=onnx,export,safetensors,torchscript"
    command = [sys.executable, "export.py", "-m", formats, f"ckpt_path={best}", f"paths.log_dir={out}"]
    exported = processes.run(command, cwd=project, env=env, timeout=600)
    assert exported.returncode == 0, exported.stderr[-3000:]
    (sweep,) = (out / "export" / "multiruns").iterdir()
    files = sorted(p.name for p in sweep.glob("*/model.*"))
    assert files == ["model.json", "model.onnx", "model.pt", "model.pt2", "model.safetensors"], files
    onnx = next(sweep.glob("*/model.onnx"))
    card = model_card.read(onnx)
    inputs = np.random.default_rng(0).random((3, *card["input_shape"][1:]), dtype=np.float32)
    normalised = (inputs / card["scale"] - card["mean"]) / card["std"] if "mean" in card else inputs
    session = onnxruntime.InferenceSession(onnx)
    expected = session.run(None, {card["input_name"]: normalised.astype(np.float32)})[0]
    np.save(out / "inputs.npy", normalised.astype(np.float32))
    program = next(sweep.glob("*/model.pt2"))
    alone = [sys.executable, "-c", ALONE, str(program), str(onnx), str(out / "inputs.npy"), card["input_name"]]
    ran = processes.run(alone, cwd=out, env={k: v for k, v in env.items() if k != "PYTHONPATH"})
    assert ran.returncode == 0, ran.stderr[-3000:]
    for outputs in json.loads(ran.stdout):  # torch.export's program, then onnxruntime's: without the project
        np.testing.assert_allclose(outputs, expected, atol=1e-4)
    with serving(out / "serve", f"ckpt_path={best}", "decode=npy", "devices=1", project=project, env=env) as url:
        answer = httpx.post(f"{url}/predict", json={"inputs": inputs.tolist()}, timeout=60)
        document = httpx.get(f"{url}/openapi.json", timeout=60).json()
    assert answer.status_code == 200, answer.text
    predictions = answer.json()["predictions"]
    if card["task"] == "classification":
        probabilities = np.exp(expected) / np.exp(expected).sum(1, keepdims=True)
        assert [p["class"] for p in predictions] == expected.argmax(1).tolist()
        np.testing.assert_allclose([p["probabilities"] for p in predictions], probabilities, atol=1e-4)
    else:
        np.testing.assert_allclose([p["values"] for p in predictions], expected, atol=1e-4)
    openapi_spec_validator.validate(document)


def torch_epoch(checkpoint: Path) -> int:
    import torch

    return torch.load(checkpoint, weights_only=True)["epoch"]


def _refused(*command: str, cwd: Path) -> str:
    result = subprocess.run(
        command, cwd=cwd, capture_output=True, text=True, env=os.environ | GIT_ENV, timeout=300, check=False
    )
    assert result.returncode != 0, result.stdout[-2000:]
    return result.stdout + result.stderr


TAKEN = "is a name Python or a dependency already has: every import of it would fail; choose another"


@pytest.mark.parametrize(
    "answer,message",
    [
        ("package=class", f"class {TAKEN}"),  # a keyword
        ("package=json", f"json {TAKEN}"),  # the standard library
        ("package=torch", f"torch {TAKEN}"),  # a dependency
        ("package=lightning", f"lightning {TAKEN}"),
        (f"package={'a' * 65}", "At most 64 characters: folders and imports are named after it"),
    ],
)
def test_a_package_name_that_could_not_work_is_refused_before_anything_is_written(
    answer: str, message: str, template: Path, tmp_path: Path
) -> None:
    """copier's question and cookiecutter's hook refuse it in one line; a folder rendered into stays as it was."""
    existing = tmp_path / "existing"
    existing.mkdir()
    (existing / "notes.txt").write_text("mine")
    copier = [sys.executable, "-m", "copier", "copy", "--trust", "--defaults", "-d", "project_name=X", "-d", answer]
    output = _refused(*copier, str(template), str(existing), cwd=tmp_path)
    assert message.lower() in output.lower()
    assert [p.name for p in existing.iterdir()] == ["notes.txt"]  # nothing copied, nothing half-renamed
    config = tmp_path / "cookiecutter.yaml"
    config.write_text(f"cookiecutters_dir: {tmp_path / 'clones'}\nreplay_dir: {tmp_path / 'replay'}\n")
    cookiecutter = [sys.executable, "-m", "cookiecutter", "--no-input", "--config-file", str(config), "-o", "made"]
    output = _refused(*cookiecutter, str(template), "project_name=X", answer, cwd=tmp_path)
    assert message.lower() in output.lower()
    assert not (tmp_path / "made").exists() or not any((tmp_path / "made").iterdir())


def test_the_refused_names_cover_keywords_the_standard_library_and_every_dependency() -> None:
    """generator/reserved_packages.yml, written by generator/reserved.py: run it again when this fails."""
    sys.path.insert(0, str(ROOT / "generator"))
    import rename
    import reserved

    listed = set(rename.copier_settings(ROOT)["reserved_packages"]["default"])
    direct = {"torch", "lightning", "hydra", "omegaconf", "torchvision", "torchmetrics", "pydantic", "rich"}
    missing = (set(reserved.reserved()) | direct) - listed
    assert not missing, f"python generator/reserved.py: {sorted(missing)[:20]}"


def test_a_long_project_name_gives_a_package_of_64_characters_at_most(template: Path, tmp_path: Path) -> None:
    """A 300-character name (a pasted sentence): its package is cut to 64 characters, the project renamed whole."""
    name = "Long " * 60
    project = tmp_path / "long"
    _copier("copy", "-d", f"project_name={name}", str(template), str(project), cwd=tmp_path)
    package = ("long_" * 13)[:64].rstrip("_")
    assert (project / "src" / package / "tasks.py").is_file() and _traces(project) == []
    assert (project / "README.md").read_text().splitlines()[0].rstrip() == f"# {name.strip()}"


def test_every_text_the_rename_replaces_is_still_in_the_template() -> None:
    """A replacement whose text a later edit changed would do nothing, silently: a project without the example
    would keep the example's extras, search name or pages (generator/rename.py's BLANK_NAMES, TEMPLATE_NAMES)."""
    sys.path.insert(0, str(ROOT / "generator"))
    import rename

    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True, timeout=60)
    texts = []
    for name in files.stdout.splitlines():
        if name.startswith("generator/") or name == "tests/test_generator.py":
            continue  # the replacements themselves, and this file
        try:
            texts.append((ROOT / name).read_text())
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
            continue  # a binary file (a picture), or one this change deleted
    everything = "".join(texts)
    assert [old for old in {**rename.BLANK_NAMES, **rename.TEMPLATE_NAMES} if old not in everything] == []
