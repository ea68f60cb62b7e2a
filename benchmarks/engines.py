# Part of the MNIST example: a project generated without it has no such file.
"""What does Ray Train cost beside Lightning's own DDP? ``python benchmarks/engines.py [--repeats 2]``.

Runs ``train.py`` (the project's default task, ``test=false``, 3 epochs) with 2 CPU processes each way,
alternating the two, and prints medians:

- ``ddp x2``: ``strategy=ddp trainer.devices=2`` (Lightning starts the second process);
- ``ray x2``: ``engine=ray`` (a Ray cluster of this machine, started by the run; 2 Ray Train workers).

Per run: the wall time of the whole command, the steady epoch (the median of epochs 2-3, timed inside
the process by ``benchmarks/epoch_timer.py``) and the start-up and end (wall time minus the epochs):
what each engine adds before the first epoch and after the last. Run it alone on the machine.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENGINES = {
    "ddp x2": ["strategy=ddp", "trainer.devices=2"],
    "ray x2": ["engine=ray", "engine.scaling_config.num_workers=2"],
}
COMMON = ["trainer.max_epochs=3", "trainer.accelerator=cpu", "test=false", "logger=none"]


def run(engine: list[str], out: Path) -> dict[str, float]:
    epochs = out / "epochs.json"
    timer = ["+callbacks.epoch_timer._target_=epoch_timer.EpochTimer", f"+callbacks.epoch_timer.path={epochs}"]
    env = os.environ | {
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "benchmarks"), os.environ.get("PYTHONPATH")]))
    }
    command = [sys.executable, str(ROOT / "train.py"), *COMMON, *engine, *timer, f"paths.log_dir={out}"]
    started = time.perf_counter()
    subprocess.run(command, env=env, check=True, capture_output=True, timeout=1800)
    wall = time.perf_counter() - started
    seconds = json.loads(epochs.read_text())
    return {"wall_s": wall, "epoch_s": statistics.median(seconds[1:]), "outside_epochs_s": wall - sum(seconds)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    samples: dict[str, list[dict[str, float]]] = {name: [] for name in ENGINES}
    with tempfile.TemporaryDirectory() as folder:
        for repeat in range(args.repeats):
            for name, engine in ENGINES.items():
                samples[name].append(run(engine, Path(folder) / f"{name.replace(' ', '')}-{repeat}"))
    table = {name: {key: statistics.median(s[key] for s in runs) for key in runs[0]} for name, runs in samples.items()}
    ddp = table["ddp x2"]
    print(f"{'engine':<8} {'wall s':>8} {'epoch s':>8} {'outside epochs s':>17} {'epoch / ddp':>12}")
    for name, row in table.items():
        print(f"{name:<8} {row['wall_s']:8.1f} {row['epoch_s']:8.2f} {row['outside_epochs_s']:17.1f} "
              f"{row['epoch_s'] / ddp['epoch_s']:12.3f}")  # fmt: skip
    target = ROOT / "outputs" / "benchmarks" / "engines.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps({"repeats": args.repeats, "medians": table, "samples": samples}, indent=2))


if __name__ == "__main__":
    main()
