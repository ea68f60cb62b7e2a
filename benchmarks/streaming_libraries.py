# Part of the MNIST example: a project generated without it has no such file.
"""LitData against MosaicML Streaming on this task: ``python benchmarks/streaming_libraries.py [--repeats 3]``,
in an environment that has both (MosaicML Streaming cannot enter the lock: docs/streaming.md says how to make one).

MNIST's 55,000 training images, as the data module serves them (float32, normalised), written once by each
library into a temporary folder (LitData's chunks by ``stream.py``, Mosaic's MDS shards by ``MDSWriter``, 64 MB
each), then read by each the way a run reads them (shuffled, batches of 64, in the process itself):

- **throughput**: the seconds of one epoch of the loader alone, the second of two (the first warms the page
  cache), alternating the libraries; medians over the repeats, samples a second and the ratio. LitData as
  ``data=stream`` reads it (each shuffled sample decoded alone) and with its default (a window of samples
  decoded around each);
- **exact resume on one process**: an epoch stopped after 400 batches, its loader's ``state_dict`` given to a
  fresh loader, which yields the rest: every sample of the epoch once, and the same batches as the epoch
  never stopped;
- **another number of ranks** (Mosaic): an epoch begun by 2 ranks (processes with RANK and WORLD_SIZE, as
  torchrun gives them), stopped after 100 batches each, resumed on 1: every sample once. (LitData's is the
  project's own test: tests/test_streaming.py, 4 ranks resumed on 2.)

Prints the rows and writes them as JSON to outputs/benchmarks/. Run it alone.
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

import numpy as np
from timing import ROOT, publish, wall

# This folder's streaming.py would hide MosaicML Streaming's package, also named streaming.
sys.path[:] = [entry for entry in sys.path if Path(entry or ".").resolve() != Path(__file__).resolve().parent]

BATCH = 64
STOP = 400  # batches of the stopped epoch (of 860)
RANKS_STOP = 100  # batches each of 2 ranks trains before the stop


def _litdata_loader(folder: str, state: dict | None = None, batch_decode: int | str = 1):
    """LitData's loader as data=stream makes it (batch_decode=1: runtime/data/streaming.py), or with its default."""
    from litdata import StreamingDataLoader, StreamingDataset

    dataset = StreamingDataset(f"{folder}/train", shuffle=True, seed=0, batch_decode=batch_decode)
    loader = StreamingDataLoader(dataset, batch_size=BATCH)
    if state is not None:
        loader.load_state_dict(state)
    return loader


def _litdata_default_loader(folder: str, state: dict | None = None):
    return _litdata_loader(folder, state, batch_decode="auto")


def _mosaic_loader(folder: str, state: dict | None = None):
    from streaming import StreamingDataLoader, StreamingDataset

    dataset = StreamingDataset(local=folder, shuffle=True, shuffle_seed=0, batch_size=BATCH, num_canonical_nodes=1)
    loader = StreamingDataLoader(dataset, batch_size=BATCH)
    if state is not None:
        loader.load_state_dict(state)
    return loader


LOADERS = {
    "LitData (data=stream)": _litdata_loader,
    "LitData (its default batch_decode)": _litdata_default_loader,
    "MosaicML Streaming": _mosaic_loader,
}


def _ids(batch) -> list[int]:
    return [int(i) for i in batch["id"]]


def _write_mds(chunks: str, folder: str) -> None:
    """The training split of LitData's ``chunks`` (as ``stream.py`` wrote it) as Mosaic's MDS shards."""
    from litdata import StreamingDataset
    from streaming import MDSWriter

    columns = {"id": "int64", "input": "ndarray:float32:1,28,28", "target": "int64"}
    with MDSWriter(out=folder, columns=columns, size_limit="64mb") as writer:
        for sample in StreamingDataset(f"{chunks}/train"):
            writer.write(
                {"id": int(sample["id"]), "input": np.asarray(sample["input"]), "target": int(sample["target"])}
            )


def epoch_seconds(kind: str, folder: str) -> float:
    """The second of two epochs of the loader alone."""
    loader = LOADERS[kind](folder)
    for _ in loader:
        pass
    started = time.perf_counter()
    count = sum(len(batch["id"]) for batch in loader)
    assert count >= 54_900, count
    return time.perf_counter() - started


def resumes_exactly(kind: str, folder: str) -> str:
    whole = [_ids(batch) for batch in LOADERS[kind](folder)]
    loader = LOADERS[kind](folder)
    before = []
    for batch in loader:
        before.append(_ids(batch))
        if len(before) == STOP:
            break
    state = loader.state_dict()
    after = [_ids(batch) for batch in LOADERS[kind](folder, state)]
    seen = [i for batch in before + after for i in batch]
    once = sorted(seen) == sorted(i for batch in whole for i in batch) and len(set(seen)) == len(seen)
    same = before + after == whole
    return f"each sample once: {once}; the batches of the epoch never stopped: {same}"


RANK = """
import json, sys
import streaming  # MosaicML's, before this folder (with its own streaming.py) is on the path
sys.path.insert(0, sys.argv[3])
from streaming_libraries import _mosaic_loader, _ids, RANKS_STOP
loader = _mosaic_loader(sys.argv[1])
ids = []
for batch in loader:
    ids += _ids(batch)
    if len(ids) == RANKS_STOP * len(batch["id"]):
        break
json.dump({"ids": ids, "state": loader.state_dict()}, open(sys.argv[2], "w"))
"""


def mosaic_on_fewer_ranks(folder: str, out: Path) -> str:
    """2 ranks stop, 1 resumes: Mosaic's elastic resumption (num_canonical_nodes fixed)."""
    ranks = []
    for rank in range(2):
        env = os.environ | {"RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": "2"}
        env |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29533"}
        command = [sys.executable, "-c", RANK, folder, str(out / f"rank{rank}.json"), str(Path(__file__).parent)]
        ranks.append(subprocess.Popen(command, env=env))
    assert all(process.wait(timeout=600) == 0 for process in ranks)
    stopped = [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(2)]
    before = [i for rank in stopped for i in rank["ids"]]
    after = [i for batch in _mosaic_loader(folder, stopped[0]["state"]) for i in _ids(batch)]
    seen = before + after
    return f"each sample once: {sorted(seen) == list(range(55_000))} ({len(seen)} seen, {len(set(seen))} distinct)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    rows: dict[str, object] = {}
    with tempfile.TemporaryDirectory() as tmp:
        chunks, shards = f"{tmp}/chunks", f"{tmp}/mds"
        wall([sys.executable, str(ROOT / "stream.py"), "data=mnist", f"output={chunks}", f"paths.log_dir={tmp}"])
        _write_mds(chunks, shards)
        folders = {kind: shards if kind == "MosaicML Streaming" else chunks for kind in LOADERS}
        seconds: dict[str, list[float]] = {kind: [] for kind in LOADERS}
        for _ in range(args.repeats):
            for kind in LOADERS:
                seconds[kind].append(epoch_seconds(kind, folders[kind]))
        medians = {kind: statistics.median(values) for kind, values in seconds.items()}
        for kind, value in medians.items():
            rows[f"epoch of the loader alone, {kind} (s, median)"] = round(value, 2)
            rows[f"samples/s, {kind}"] = round(55_000 / value)
            rows[f"/ LitData (data=stream), {kind}"] = round(value / medians["LitData (data=stream)"], 2)
        for kind in LOADERS:
            rows[f"resumed after {STOP} batches, {kind}"] = resumes_exactly(kind, folders[kind])
        rows["2 ranks stopped, resumed on 1, MosaicML Streaming"] = mosaic_on_fewer_ranks(
            folders["MosaicML Streaming"], Path(tmp)
        )
    publish(rows, ROOT / "outputs" / "benchmarks", "streaming_libraries")


if __name__ == "__main__":
    main()
