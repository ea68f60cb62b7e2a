# Part of the MNIST example: a project generated without it has no such file.
"""What streaming costs: ``python benchmarks/streaming.py [--repeats 3]``.

Writes MNIST as LitData chunks (``stream.py``) into a temporary folder, then times, alternating the runs,
the steady-state epoch of ``train.py`` (``test=false``, 4 epochs, the median of epochs 2-4) from memory
(``data=mnist``) and streamed from the folder (``data=mnist_stream``), and the 1-epoch test accuracy of each.
Prints the medians and their ratio, and writes them as JSON to outputs/benchmarks/. Run it alone.
"""

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

from timing import EPOCHS, ROOT, epoch_seconds, publish, wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        chunks = f"{folder}/chunks"
        wall([sys.executable, "stream.py", "data=mnist", f"output={chunks}", f"paths.log_dir={folder}"])
        runs = {"from memory": ["data=mnist"], "streamed": ["data=mnist_stream", f"data.input_dir={chunks}"]}
        seconds: dict[str, list[float]] = {name: [] for name in runs}
        for repeat in range(args.repeats):
            for name, data in runs.items():
                out = Path(folder, f"{name.split()[0]}-{repeat}")
                command = [
                    sys.executable,
                    "train.py",
                    *data,
                    "test=false",
                    "logger=none",
                    f"trainer.max_epochs={EPOCHS}",
                ]
                seconds[name].append(epoch_seconds([*command, f"paths.log_dir={out}"], out))
        accuracy = {}
        for name, data in runs.items():
            out = Path(folder, f"accuracy-{name.split()[0]}")
            wall([sys.executable, "train.py", *data, "logger=none", "trainer.max_epochs=1", f"paths.log_dir={out}"])
            (metrics,) = out.rglob("metrics.json")
            accuracy[name] = json.loads(metrics.read_text())["test/acc"]
    medians = {name: statistics.median(values) for name, values in seconds.items()}
    rows: dict[str, object] = {f"epoch, {name} (s, median)": round(value, 2) for name, value in medians.items()}
    rows["ratio streamed / from memory"] = round(medians["streamed"] / medians["from memory"], 2)
    rows |= {f"test/acc after 1 epoch, {name}": round(value, 4) for name, value in accuracy.items()}
    publish(rows, ROOT / "outputs" / "benchmarks", "streaming")


if __name__ == "__main__":
    main()
