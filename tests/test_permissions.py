"""Results are as readable as a plain ``open`` makes them: on a shared cluster, a teammate reads a run's
checkpoints, metrics and exports wherever they can read its log (umask 022: 0644; 027: 0640)."""

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from mnistlab.runtime.config import hydra_versions
from mnistlab.runtime.run import atomic, run_folder
from mnistlab.trained.exporting import export

from composing import SHORT, TRUST_SUITE, compose_config
from processes import ROOT


@pytest.fixture(params=[0o022, 0o027], ids=["umask022", "umask027"])
def umask(request: pytest.FixtureRequest) -> Iterator[int]:
    previous = os.umask(request.param)
    yield request.param
    os.umask(previous)


def _modes(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): oct(p.stat().st_mode & 0o777) for p in folder.rglob("*") if p.is_file()}


def test_every_file_of_a_run_and_its_export_follows_the_umask(umask: int, tmp_path: Path) -> None:
    from mnistlab.tasks import train  # not at import: see tests/faults.py

    run = tmp_path / "run"
    train(compose_config("train", run, [*SHORT, "logger=csv"]))
    (best,) = run_folder.checkpoints(run).glob("epoch*.ckpt")
    for format in ("export", "safetensors"):
        with initialize_config_dir(config_dir=str(ROOT / "conf"), **hydra_versions.BASE):
            overrides = [f"ckpt_path={best}", f"format={format}", f"paths.output_dir={tmp_path / format}", TRUST_SUITE]
            export(compose("export", overrides))
    expected = oct(0o666 & ~umask)
    for folder in (run, tmp_path / "export", tmp_path / "safetensors"):
        modes = _modes(folder)
        assert {"checkpoints/last.ckpt", "metrics.json"} <= modes.keys() or folder != run, sorted(modes)
        assert {name for name, mode in modes.items() if mode != expected} == set(), (expected, modes)


def test_a_replaced_result_takes_the_umask_and_leaves_no_partial_file(umask: int, tmp_path: Path) -> None:
    result = tmp_path / "summary.csv"
    result.write_text("old")
    os.chmod(result, 0o600)  # the mode of the file it replaces does not carry over: a plain open's does not either
    atomic.write_text(result, "new")
    assert result.read_text() == "new"
    assert oct(result.stat().st_mode & 0o777) == oct(0o666 & ~umask)
    assert [p.name for p in tmp_path.iterdir()] == ["summary.csv"]
