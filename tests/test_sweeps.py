"""A sweep survives its failed jobs: the others run, the failures are listed, the exit is non-zero."""

import pytest
from omegaconf import OmegaConf

from conftest import OPTUNA_BOTH_VALUES, SHORT, run_script

pytestmark = pytest.mark.slow


def test_failed_jobs_leave_the_others_running_and_are_listed_at_the_end(tmp_path) -> None:
    lrs = "model.optimizer.lr=1e-3,1e30,-1"  # fine, diverges, refused by the config check
    result = run_script("train.py", "-m", lrs, *SHORT, "logger=none", f"paths.log_dir={tmp_path}")
    assert result.returncode == 1
    (sweep,) = (tmp_path / "train" / "multiruns").iterdir()
    assert (sweep / "0" / "metrics.json").is_file() and (sweep / "0" / "checkpoints" / "last.ckpt").is_file()
    lines = result.stderr.strip().splitlines()[-3:]
    assert lines == [
        f"2 of 3 jobs of the sweep in {sweep} failed:",
        (
            "  1 (model.optimizer.lr=1e+30): The training loss became non-finite (NaN or inf) between steps 0 and 20,"
            " with learning rate 1e+30: lower model.optimizer.lr, or clip gradients (trainer.gradient_clip_val=1.0)."
            " No checkpoint of these weights was written; none was written before"
        ),
        "  2 (model.optimizer.lr=-1): model.optimizer.lr=-1: should be greater than 0",
    ]
    assert "Traceback" not in result.stdout + result.stderr
    assert "Traceback" in (sweep / "1" / "failure.txt").read_text()  # the details, for whoever wants them


def test_an_optuna_trial_that_fails_is_recorded_as_failed_and_the_study_goes_on(tmp_path) -> None:
    result = run_script(
        "train.py",
        "-m",
        "hydra/sweeper=optuna",
        *OPTUNA_BOTH_VALUES,
        "model.optimizer.lr=choice(1e30,1e-3)",
        *SHORT,
        "logger=none",
        f"paths.log_dir={tmp_path}",
    )
    assert result.returncode == 1, result.stderr[-3000:]
    assert result.stdout.count("Failed experiment") == 1  # Optuna's word for a trial it records as failed
    (sweep,) = (tmp_path / "train" / "multiruns").iterdir()
    best = OmegaConf.load(sweep / "optimization_results.yaml")
    assert best.best_params["model.optimizer.lr"] == 1e-3 and best.best_value > 0.5
    assert f"1 of 2 jobs of the sweep in {sweep} failed:" in result.stderr
