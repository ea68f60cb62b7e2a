"""Runs compared in one figure: at the end of every sweep (comparison.png beside summary.csv), and by
compare.py for any run or sweep folders. The figure's points and curves are the runs' own figures."""

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
from PIL import Image

from mnistlab.runtime.run import run_folder
from mnistlab.runtime.run.failures import InputError
from mnistlab.runtime.run.run_folder import FIGURE_FILE
from mnistlab.sweeps import comparison
from mnistlab.sweeps.jobs import read_jobs, varied

from running import run_script

TWO_EPOCHS = [
    "trainer.max_epochs=2",
    "trainer.limit_train_batches=10",
    "trainer.limit_val_batches=5",
    "test=false",
]


@dataclass
class Run:
    folder: Path
    params: dict[str, str]
    metric: float | None


@pytest.fixture(scope="session")  # computed once a worker: see test_ray.cluster
def sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("compared")
    lrs = "model.optimizer.lr=1e-3,3e-2"
    result = run_script("train.py", "-m", lrs, *TWO_EPOCHS, "logger=tensorboard", f"paths.log_dir={out}")
    assert result.returncode == 0, result.stderr[-3000:]
    (folder,) = (out / "train" / "multiruns").iterdir()
    return folder


@pytest.mark.slow
def test_a_sweep_ends_with_a_figure_whose_points_and_curves_are_the_jobs_own(sweep: Path) -> None:
    with Image.open(sweep / FIGURE_FILE) as png:
        assert png.format == "PNG" and png.width > 400
    runs = read_jobs(sweep, "val/acc_best")
    figure = comparison.draw(runs, varied(runs), "val/acc_best")
    by_lr, curves = figure.axes[0], figure.axes[1]
    assert by_lr.get_xlabel() == "model.optimizer.lr" and by_lr.get_xscale() == "log"  # 1e-3 to 3e-2: decades
    metrics = [json.loads((sweep / job / "metrics.json").read_text()) for job in ("0", "1")]
    points = by_lr.collections[0].get_offsets().flatten().tolist()  # x, y of each job in turn
    assert points == pytest.approx([1e-3, metrics[0]["val/acc_best"], 3e-2, metrics[1]["val/acc_best"]])
    lines = curves.get_lines()
    assert [line.get_label() for line in lines] == ["lr=0.001", "lr=0.03"]  # the values as Hydra wrote them
    for line, own in zip(lines, metrics, strict=True):
        values = list(line.get_ydata())
        assert list(line.get_xdata()) == [9, 19]  # 10 steps an epoch, two epochs
        assert values[-1] == pytest.approx(own["val/acc"]) and max(values) == pytest.approx(own["val/acc_best"])


@pytest.mark.slow
def test_compare_draws_any_runs_and_refuses_a_folder_of_none(sweep: Path, tmp_path: Path) -> None:
    run = tmp_path / "csv_run"
    single = run_script("train.py", *TWO_EPOCHS, "logger=csv", "model.net.hidden=32", f"hydra.run.dir={run}")
    assert single.returncode == 0, single.stderr[-3000:]
    out = tmp_path / "both.png"
    result = run_script("compare.py", str(sweep), str(run), "--out", str(out))
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"Compared the runs in {out}" in result.stdout and Image.open(out).format == "PNG"
    runs = [*read_jobs(sweep, "val/acc_best"), *read_jobs(run, "val/acc_best")]
    # What differs: the sweep's own, then the run's (false and the sweep's False are one value).
    assert varied(runs) == ["model.optimizer.lr", "logger", "paths.log_dir", "model.net.hidden"]
    csv_curve = comparison.read_curve(run, "val/acc")  # the CSV logger's metrics.csv
    assert [step for step, _ in csv_curve] == [9, 19]
    assert csv_curve[-1][1] == pytest.approx(json.loads((run / "metrics.json").read_text())["val/acc"])
    refused = run_script("compare.py", str(run_folder.checkpoints(tmp_path / "csv_run")))
    assert refused.returncode == 1
    assert refused.stderr.strip().splitlines()[-1] == (
        f"Error: {run / 'checkpoints'} is neither a run's folder nor a sweep's (no .hydra/ in it or in its jobs)"
    )


def test_values_over_decades_get_a_log_axis_and_words_get_categories(tmp_path: Path) -> None:
    runs = [
        Run(tmp_path, {"lr": "1e-4", "opt": "adam", "width": "64"}, 0.9),
        Run(tmp_path, {"lr": "1e-2", "opt": "sgd", "width": "128"}, 0.8),
        Run(tmp_path, {"lr": "1e-3", "opt": "adam", "width": "96"}, None),  # no metric: no point
    ]
    figure = comparison.draw(runs, ["lr", "opt", "width"], "val/acc_best")
    lr, opt, width, curves = figure.axes[:4]
    assert (lr.get_xscale(), width.get_xscale()) == ("log", "linear")  # 64 to 128: less than a decade
    assert [tick.get_text() for tick in opt.get_xticklabels()] == ["adam", "sgd"]
    assert opt.collections[0].get_offsets().tolist() == [[0, 0.9], [1, 0.8]]
    assert curves.get_title() == "val/acc of 0 of 3 runs"  # none logged a curve here


def test_compare_names_a_missing_folder_and_a_metric_no_run_has(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such folder; name run or sweep folders"):
        comparison.compare([tmp_path / "nope"])
    run = tmp_path / "run"
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "overrides.yaml").write_text("- model.optimizer.lr=0.01\n")
    (run / ".hydra" / "config.yaml").write_text("optimized_metric: val/acc_best\n")
    (run / "metrics.json").write_text('{"val/acc_best": 0.9}')
    with pytest.raises(InputError, match="none of the 1 runs has val/loss in its metrics.json"):
        comparison.compare([run], metric="val/loss")
    assert comparison.compare([run]) == run / FIGURE_FILE  # the run's own metric, by default


def _run(folder: Path, metrics: str, overrides: str = "- model.optimizer.lr=0.01\n") -> Path:
    (folder / ".hydra").mkdir(parents=True)
    (folder / ".hydra" / "overrides.yaml").write_text(overrides)
    (folder / ".hydra" / "config.yaml").write_text("optimized_metric: val/acc_best\n")
    (folder / "metrics.json").write_text(metrics)
    return folder


def test_results_of_the_wrong_kind_read_as_no_result(tmp_path: Path) -> None:
    """A metrics.json holding a list or a number, an overrides.yaml holding a number: no result, no traceback."""
    good = _run(tmp_path / "good", '{"val/acc_best": 0.9}')
    odd = [_run(tmp_path / "list", "[0.9]"), _run(tmp_path / "number", '{"val/acc_best": 0.8}', overrides="5\n")]
    runs = [run for folder in (good, *odd) for run in read_jobs(folder, "val/acc_best")]
    lr = {"model.optimizer.lr": "0.01"}
    assert [(run.metric, run.params) for run in runs] == [(0.9, lr), (None, lr), (0.8, {})]
    assert comparison.compare([good, *odd], out=tmp_path / "all.png") == tmp_path / "all.png"


def test_an_out_that_cannot_be_written_is_refused_in_one_line_before_any_work(tmp_path: Path) -> None:
    run = _run(tmp_path / "run", '{"val/acc_best": 0.9}')
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    refusals = {
        tmp_path: f"--out {tmp_path} is a folder: name the PNG to write, e.g. --out {tmp_path / 'comparison.png'}",
        a_file / "x.png": f"--out {a_file / 'x.png'}: no folder {a_file} to write it in",
        Path("/proc/x.png"): "cannot write /proc/x.png: ",  # a folder no one may write in, root included
    }
    for out, message in refusals.items():
        with pytest.raises(InputError) as refused:
            comparison.compare([run], out=out)
        assert str(refused.value).startswith(message) and "\n" not in str(refused.value)
    assert list(tmp_path.glob("*.png")) == [] and a_file.read_text() == ""
