# Part of the MNIST example: a project generated without it has no such file.
"""Does pruning pay? ``python benchmarks/pruning.py [--trials 16] [--epochs 5] [--seed 0] [--pruner median]
[overrides of the pruner ...]``.

The same Optuna study twice (``hparams_search=mnist_optuna``, TPE with the same seed, ``test=false``):
with a pruner (``conf/hydra/sweeper/pruner/``: the default one, or ``--pruner`` with overrides such as
``hydra.sweeper.pruner.n_warmup_steps=0``) and with none. For each: the
epochs trained over all trials (the epochs each trial reported to the study), the best
``val/acc_best`` found, the trials by state and the wall time; then epochs and time with pruning as a
fraction of without, and the difference of the bests in points. Target: at most half the epochs, for a
best within 0.3 points. Prints a table and writes it as JSON to outputs/benchmarks/.
"""

import argparse
import sys
import tempfile
from pathlib import Path

from timing import ROOT, publish, wall


def study(pruner: str, trials: int, epochs: int, seed: int, out: Path, *overrides: str) -> dict[str, float]:
    """One study of ``trials`` trials with ``pruner``; what it trained and found."""
    import optuna

    command = [
        sys.executable, "train.py", "-m", "hparams_search=mnist_optuna", f"hydra/sweeper/pruner={pruner}",
        f"hydra.sweeper.n_trials={trials}", f"hydra.sweeper.sampler.seed={seed}", f"hydra.sweeper.study_name={pruner}",
        f"trainer.max_epochs={epochs}", "test=false", "logger=none", f"paths.log_dir={out}", *overrides,
    ]  # fmt: skip
    seconds = wall(command)
    found = optuna.load_study(study_name=pruner, storage=f"sqlite:///{out}/train/multiruns/optuna.db")
    states = [t.state.name.lower() for t in found.trials]
    return {
        "epochs trained": sum(len(t.intermediate_values) for t in found.trials),
        "best val/acc_best": round(found.best_value, 4),
        **{f"trials {state}": states.count(state) for state in ("complete", "pruned", "fail")},
        "wall time (s)": round(seconds, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=16, help="trials of each study")
    parser.add_argument("--epochs", type=int, default=5, help="trainer.max_epochs of each trial")
    parser.add_argument("--seed", type=int, default=0, help="the TPE sampler's seed, the same for both studies")
    parser.add_argument("--pruner", default="median", help="the pruner compared with none (conf/hydra/sweeper/pruner/)")
    parser.add_argument("--out", type=Path, default=ROOT / "outputs" / "benchmarks", help="where the JSON goes")
    parser.add_argument("overrides", nargs="*", help="overrides of the pruned study alone (hydra.sweeper.pruner.*)")
    args = parser.parse_args()
    name = args.pruner
    with tempfile.TemporaryDirectory() as runs:
        pruned = study(name, args.trials, args.epochs, args.seed, Path(runs), *args.overrides)
        full = study("none", args.trials, args.epochs, args.seed, Path(runs))
    rows = {f"{row}, {p} pruner": v for p, result in ((name, pruned), ("none", full)) for row, v in result.items()}
    rows[f"epochs ratio {name} / none (target <= 0.5)"] = round(pruned["epochs trained"] / full["epochs trained"], 3)
    rows[f"time ratio {name} / none"] = round(pruned["wall time (s)"] / full["wall time (s)"], 3)
    gap = 100 * (full["best val/acc_best"] - pruned["best val/acc_best"])
    rows[f"best, none minus {name}, points (target <= 0.3)"] = round(gap, 2)
    publish(rows, args.out, "pruning")


if __name__ == "__main__":
    main()
