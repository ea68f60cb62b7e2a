# Part of the MNIST example: a project generated without it has no such file.
"""What streaming costs: ``python benchmarks/streaming.py [--repeats 3]``.

Writes MNIST as LitData chunks (``stream.py``) into a temporary folder and into a bucket of an S3 server on
loopback (moto's, as the tests start it), then times, alternating the runs, the steady-state epoch of
``train.py`` (``test=false``, 4 epochs, the median of epochs 2-4) fed four ways: from memory (``data=mnist``),
by a ``DataLoader`` over the files (``benchmarks/usual_data.py``), streamed from the folder and from the
bucket (``data=mnist_stream``); the 1-epoch test accuracy from memory and streamed; and what a resume costs:
the seconds from the command to the end of one training step, started afresh and started from a checkpoint
in the middle of the first epoch (the bucket's with an empty cache each time, as on a node that joins).
Prints the medians, samples a second and the ratios, and writes them as JSON to outputs/benchmarks/. Run it
alone.
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from timing import EPOCHS, ROOT, epoch_seconds, publish, wall

TRAINING_IMAGES = 55_000  # MNIST's training split, as conf/data/mnist.yaml holds out 5,000
MID_EPOCH = 400  # the step a resumed run starts from: the middle of the first epoch (860 batches of 64)
QUIET = ["test=false", "logger=none"]
# A run that stops at MID_EPOCH with a checkpoint of that step.
STOPPED = [
    f"+trainer.max_steps={MID_EPOCH}",
    "callbacks.model_checkpoint.monitor=null",
    "callbacks.model_checkpoint.filename='step{step}'",
    f"callbacks.model_checkpoint.every_n_train_steps={MID_EPOCH}",
    "callbacks.model_checkpoint.every_n_epochs=null",
]


@contextmanager
def bucket() -> Iterator[str]:
    """An S3 server on loopback with a bucket, its endpoint and keys in this process's environment."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen(["moto_server", "-H", "127.0.0.1", "-p", str(port)], stderr=subprocess.DEVNULL)
    os.environ |= {
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
        "AWS_ACCESS_KEY_ID": "benchmark",
        "AWS_SECRET_ACCESS_KEY": "benchmark",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    import boto3

    try:
        for _ in range(100):
            try:
                boto3.client("s3").create_bucket(Bucket="benchmark")
                break
            except Exception:  # noqa: BLE001 (not listening yet)
                time.sleep(0.2)
        yield "s3://benchmark/mnist"
    finally:
        server.terminate()


def resume_costs(data: list[str], folder: Path, repeats: int) -> tuple[float, float]:
    """The median seconds from the command to the end of one training step: started afresh, and started from
    a checkpoint of step MID_EPOCH (each with a cache of its own, empty: a bucket's chunks fetched anew)."""
    env = ["env", f"PYTHONPATH={ROOT / 'benchmarks'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"]  # usual_data
    # Stopped by max_steps mid-epoch, a run ends its epoch unvalidated: early stopping has nothing to read.
    train = [*env, sys.executable, "train.py", *data, *QUIET, "callbacks.early_stopping=null"]

    def cache(out: Path) -> list[str]:  # a streamed run's (other data modules take no such key)
        return [f"data.cache_dir={out}/cache"] if "data=mnist_stream" in data else []

    wall([*train, *STOPPED, *cache(folder), f"paths.log_dir={folder}/stopped"])
    (checkpoint,) = Path(folder, "stopped").rglob(f"step{MID_EPOCH}.ckpt")
    seconds: dict[str, list[float]] = {"fresh": [], "resumed": []}
    for repeat in range(repeats):
        for kind, start in (("fresh", ["+trainer.max_steps=1"]), ("resumed", [f"ckpt_path={checkpoint}"])):
            out = Path(folder, f"{kind}-{repeat}")
            steps = [f"+trainer.max_steps={MID_EPOCH + 1}"] if kind == "resumed" else []
            seconds[kind].append(wall([*train, *start, *steps, *cache(out), f"paths.log_dir={out}"]))
    return statistics.median(seconds["fresh"]), statistics.median(seconds["resumed"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder, bucket() as remote:
        chunks = f"{folder}/chunks"
        for output in (chunks, remote):
            wall([sys.executable, "stream.py", "data=mnist", f"output={output}", f"paths.log_dir={folder}"])
        runs = {
            "from memory": ["data=mnist"],
            "DataLoader over files": ["data._target_=usual_data.TorchvisionMNIST"],
            "streamed, local chunks": ["data=mnist_stream", f"data.input_dir={chunks}"],
            "streamed, loopback bucket": ["data=mnist_stream", f"data.input_dir={remote}"],
        }
        cache = {name: [f"data.cache_dir={folder}/cache"] if "bucket" in name else [] for name in runs}
        seconds: dict[str, list[float]] = {name: [] for name in runs}
        for repeat in range(args.repeats):
            for number, (name, data) in enumerate(runs.items()):
                out = Path(folder, f"run-{number}-{repeat}")
                command = [sys.executable, "train.py", *data, *cache[name], *QUIET, f"trainer.max_epochs={EPOCHS}"]
                seconds[name].append(epoch_seconds([*command, f"paths.log_dir={out}"], out))
        accuracy = {}
        for number, name in enumerate(("from memory", "streamed, local chunks")):
            out = Path(folder, f"accuracy-{number}")
            command = [sys.executable, "train.py", *runs[name], *cache[name], "logger=none", "trainer.max_epochs=1"]
            wall([*command, f"paths.log_dir={out}"])
            (metrics,) = out.rglob("metrics.json")
            accuracy[name] = json.loads(metrics.read_text())["test/acc"]
        starts = {
            name: resume_costs(data, Path(folder, f"resume-{n}"), args.repeats)
            for n, (name, data) in enumerate(runs.items())
        }
    medians = {name: statistics.median(values) for name, values in seconds.items()}
    rows: dict[str, object] = {}
    for name, value in medians.items():
        rows[f"epoch, {name} (s, median)"] = round(value, 2)
        rows[f"samples/s, {name}"] = round(TRAINING_IMAGES / value)
        rows[f"epoch / from memory, {name}"] = round(value / medians["from memory"], 2)
    rows |= {f"test/acc after 1 epoch, {name}": round(value, 4) for name, value in accuracy.items()}
    for name, (fresh, resumed) in starts.items():
        rows[f"command to 1st step (s, median), {name}, fresh"] = round(fresh, 2)
        rows[f"command to 1st step (s, median), {name}, from step {MID_EPOCH}"] = round(resumed, 2)
        rows[f"resumed / fresh, {name}"] = round(resumed / fresh, 2)
    publish(rows, ROOT / "outputs" / "benchmarks", "streaming")


if __name__ == "__main__":
    main()
