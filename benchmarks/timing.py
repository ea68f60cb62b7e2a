# Part of the MNIST example: a project generated without it has no such file.
"""What the benchmarks share: how a command is timed from outside (``wall``), a training run's epochs
from inside (``epoch_seconds``, with ``epoch_timer.py``), and their table printed and saved as JSON
(``publish``). ``speed.py``, ``step_costs.py`` and ``pruning.py`` import it; none imports another's helpers."""

import json
import os
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
EPOCH_TIMES = "MNISTLAB_EPOCH_TIMES"  # where a benchmarked run writes the seconds of its epochs
EPOCHS = 4  # per timed run: the first warms up, the median of the other three is the row's sample


def wall(command: list[str], refused: bool = False, env: dict[str, str] | None = None) -> float:
    """Seconds a command takes from start to exit; it must succeed (or, if ``refused``, exit 1)."""
    start = time.perf_counter()
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - start
    if result.returncode != int(refused):
        raise SystemExit(f"{' '.join(command)} exited {result.returncode}:\n{result.stderr[-3000:]}")
    return seconds


def epoch_seconds(command: list[str], out: Path) -> float:
    """The median of a run's steady-state epochs (all but the first), timed inside the run: start-up,
    teardown and the machine's noise between processes stay out of it."""
    times = out / "epochs.json"
    if "train.py" in command:
        command = [
            *command,
            "+callbacks.epoch_timer._target_=epoch_timer.EpochTimer",
            f"+callbacks.epoch_timer.path={times}",
        ]
    path = os.pathsep.join(filter(None, [str(ROOT / "benchmarks"), str(ROOT / "src"), os.environ.get("PYTHONPATH")]))
    env = ["env", f"{EPOCH_TIMES}={times}", f"PYTHONPATH={path}"]  # the caller's own paths kept, after these
    wall([*env, *command])
    return statistics.median(json.loads(times.read_text())[1:])


def publish(rows: dict[str, Any], out: Path, name: str) -> None:
    """Print a benchmark's table and write it as JSON to ``out/<name>-<time>.json``."""
    width = max(map(len, rows))
    for row, value in rows.items():
        print(f"{row:<{width}}  {value}")
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}-{time.strftime('%Y-%m-%d_%H-%M-%S')}.json"
    path.write_text(json.dumps(rows, indent=2))
    print(f"written to {path}")
