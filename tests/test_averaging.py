"""callbacks=ema: an exponential moving average of the weights validates, is the best checkpoint, is tested, and
is what eval.py, export.py and serve.py read; a resumed run ends with the average of one never stopped; DDP ranks
average as one process does."""

import csv
from pathlib import Path

import lightning as L
import optuna
import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from mnistlab.runtime.checkpointing.checkpoint_io import load_checkpoint
from mnistlab.runtime.config import hydra_versions
from mnistlab.runtime.run import run_folder
from mnistlab.tasks import evaluate, train
from mnistlab.trained import inference, model_card
from mnistlab.trained.exporting import export

import suite_task
from composing import EVERY_7_STEPS, ROOT, SHORT, TRUST_SUITE, TRUSTED, compose_config
from running import (
    assert_trained_as_one_process,
    last_checkpoint,
    one_process_reference,
    run_script,
    train_like_one_process,
)

# A decay that lets a short run's average move away from its start, from step 5 on.
EMA = ["callbacks=ema", "callbacks.ema.decay=0.9", "callbacks.ema.update_starting_at_step=5"]
RUN = [*EMA, "trainer.max_epochs=2", "trainer.limit_train_batches=20", "trainer.limit_val_batches=4", "logger=none"]


@pytest.fixture(scope="module")
def averaged(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, float]]:
    out = tmp_path_factory.mktemp("averaged")
    return out, train(compose_config("train", out, RUN))


def _best(run: Path) -> Path:
    (best,) = run_folder.checkpoints(run).glob("epoch*.ckpt")
    return best


def test_the_best_checkpoint_holds_the_average_and_the_run_tests_it_as_eval_does(averaged, tmp_path: Path) -> None:
    run, metrics = averaged
    checkpoint = load_checkpoint(str(_best(run)))
    moved = [name for name, value in checkpoint["state_dict"].items() if value.is_floating_point()]
    assert any((checkpoint["state_dict"][n] - checkpoint["current_model_state"][n]).abs().max() > 1e-3 for n in moved)
    # The run's test (trainer.test of the best checkpoint, in the Trainer that fit) and eval.py agree: both the
    # average. Lightning's own callback tests the trained weights there.
    evaluated = evaluate(compose_config("eval", tmp_path, [*EMA, f"ckpt_path={_best(run)}", "logger=none"]))
    assert evaluated["test/acc"] == metrics["test/acc"] and evaluated["test/loss"] == pytest.approx(
        metrics["test/loss"]
    )


def test_validation_and_so_what_sweeps_rank_by_is_the_averages(averaged, tmp_path: Path) -> None:
    """The last validation's metrics (what <monitor>_best, the best checkpoint, the sweep table and Optuna rank
    by) are those of the average, validated again from last.ckpt; the trained weights score otherwise."""
    run, metrics = averaged
    cfg = compose_config("train", tmp_path, RUN)
    checkpoint = last_checkpoint(run)
    scores = {}
    for key in ("state_dict", "current_model_state"):  # the average; the weights it averages
        module, data = instantiate(cfg.model), instantiate(cfg.data)
        module.load_state_dict(checkpoint[key])
        trainer = L.Trainer(accelerator="cpu", devices=1, logger=False, limit_val_batches=4, enable_progress_bar=False)
        (scores[key],) = trainer.validate(module, datamodule=data, verbose=False)
    assert scores["state_dict"]["val/loss"] == pytest.approx(metrics["val/loss"], rel=1e-6)
    assert scores["current_model_state"]["val/loss"] != pytest.approx(metrics["val/loss"], rel=1e-3)


def test_every_export_is_the_average_and_its_card_says_so(averaged, tmp_path: Path) -> None:
    run, _ = averaged
    with initialize_config_dir(config_dir=str(ROOT / "conf"), **hydra_versions.BASE):
        overrides = [f"ckpt_path={_best(run)}", "format=safetensors", f"paths.output_dir={tmp_path}", TRUST_SUITE]
        path = export(compose("export", overrides))  # compared with the checkpoint's state_dict: the average
    from safetensors.torch import load_file

    exported = load_file(path)
    checkpoint = load_checkpoint(str(_best(run)))
    for name, value in exported.items():
        assert torch.equal(value, checkpoint["state_dict"][f"net.{name}"]), name
    assert model_card.read(path)["weights"] == "a moving average of the trained weights (exponential, decay 0.9)"


def test_the_served_model_answers_with_the_average(averaged) -> None:
    """serve.py's model (trained/inference.py: what /predict runs) computes the average's outputs."""
    best = _best(averaged[0])
    served, checkpoint = inference.load(best, trusted=TRUSTED), load_checkpoint(str(best))
    inputs = torch.randn(4, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    (answered,) = served.run(inputs.numpy()).values()
    net = suite_task.Net()  # tests/conf/model/suite.yaml's
    for key, same in (("state_dict", True), ("current_model_state", False)):  # the average; the trained weights
        net.load_state_dict({k.removeprefix("net."): v for k, v in checkpoint[key].items() if k.startswith("net.")})
        with torch.no_grad():
            assert torch.allclose(torch.from_numpy(answered), net(inputs), atol=1e-6) == same, key


def test_a_run_resumed_mid_epoch_ends_with_the_average_of_one_never_stopped(averaged, tmp_path: Path) -> None:
    whole, _ = averaged
    train(compose_config("train", tmp_path / "stopped", [*RUN, *EVERY_7_STEPS, "trainer.max_epochs=1", "test=false"]))
    mid_epoch = run_folder.checkpoints(tmp_path / "stopped") / "step14.ckpt"
    train(compose_config("train", tmp_path / "resumed", [*RUN, f"ckpt_path={mid_epoch}"]))
    ended, resumed = last_checkpoint(whole), last_checkpoint(tmp_path / "resumed")
    assert resumed["global_step"] == ended["global_step"] == 40
    for key in ("state_dict", "current_model_state"):  # the average, and the weights it averages
        for name, value in ended[key].items():
            torch.testing.assert_close(resumed[key][name], value, rtol=0, atol=0, msg=f"{key}: {name}")


@pytest.mark.slow
def test_two_ddp_ranks_average_as_one_process_does(tmp_path: Path) -> None:
    one = one_process_reference(tmp_path / "one", *EMA)
    two = train_like_one_process(tmp_path / "two", *EMA, "strategy=ddp", "trainer.devices=2")
    assert_trained_as_one_process(two, one)  # the checkpoints' state_dict: the averages
    ended, other = last_checkpoint(one), last_checkpoint(two)
    for name, value in ended["current_model_state"].items():  # and the weights they average
        torch.testing.assert_close(other["current_model_state"][name], value, rtol=1e-4, atol=3e-4, msg=name)


@pytest.mark.slow
def test_an_optuna_sweep_ranks_each_trial_by_its_averages_metric(tmp_path: Path) -> None:
    """Each trial's value in the study, and its row of the sweep table, is <monitor>_best of its job: the best
    validation of the average (test_validation_and_so_what_sweeps_rank_by_is_the_averages), whose weights the
    job's best checkpoint holds."""
    search = ["-m", "hparams_search=mnist_optuna", "hydra.sweeper.n_trials=2", *EMA, *SHORT, "logger=none"]
    result = run_script("train.py", *search, f"paths.log_dir={tmp_path}")
    assert result.returncode == 0, result.stderr[-3000:]
    multiruns = tmp_path / "train" / "multiruns"
    study = optuna.load_study(study_name="mnist_optuna", storage=f"sqlite:///{multiruns}/optuna.db")
    (sweep,) = [p for p in multiruns.iterdir() if p.is_dir()]
    with (sweep / "summary.csv").open() as file:
        rows = list(csv.DictReader(file))
    assert [t.value for t in study.trials] == pytest.approx([float(row["val/acc_best"]) for row in rows], rel=1e-5)
    for trial in study.trials:
        checkpoint = load_checkpoint(str(_best(sweep / str(trial.number))))
        (score,) = [s["best_model_score"] for s in checkpoint["callbacks"].values() if s.get("monitor") == "val/acc"]
        assert float(score) == pytest.approx(trial.value, rel=1e-6)
        moved = [n for n, v in checkpoint["state_dict"].items() if v.is_floating_point()]
        assert any((checkpoint["state_dict"][n] - checkpoint["current_model_state"][n]).abs().max() > 0 for n in moved)
