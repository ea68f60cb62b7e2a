# Part of the MNIST example: a project generated without it has no such file.
"""How much do Lightning and Hydra cost? ``python benchmarks/speed.py [--repeats 3] [--gpu]``.

Measures, in one invocation, alternating the runs and taking medians:

- ``baseline``: the seed's loop written in plain PyTorch (same network, Adam, batch 64, data in
  memory, whole-batch indexing), doing the same work per epoch as ``train.py``: train on the 55,000
  training images, then validate on the 5,000 held out; ``baseline fused Adam``: the same loop with
  the optimizer ``train.py`` uses (``fused=True``), to tell the framework's own cost from the
  optimizer's;
- ``train.py`` with the default config (``test=false``), on one process and with
  ``strategy=ddp trainer.devices=2`` at the same global batch;
- ``train.py`` fed the usual way (``benchmarks/usual_data.py``: torchvision's ``MNIST`` with ``ToTensor`` and
  ``Normalize`` through a ``DataLoader`` with a worker per core): what the in-memory data path saves;
- steady-state epoch time: each run trains 4 epochs and times them inside its process (the hand-written
  loops with ``time.perf_counter``, Lightning runs with ``benchmarks/epoch_timer.py``); the median of
  epochs 2-4 is the run's sample, so that start-up and warm-up are not counted;
- start-up: ``train.py debug=fdr`` against a bare import of torch, torchvision, lightning and hydra;
- time to reach 97.5% and 98% test accuracy with the default config;
- how fast a mistake is answered: ``train.py`` with a value of the wrong type, an unknown key and an
  unknown group option, each against ``python -c "import torch, lightning"`` (``--refusals`` measures
  these rows alone);
- ``--startup`` measures these rows alone: the imports of a run from the bytecode compiled at install
  (pyproject.toml's ``[tool.uv] compile-bytecode``) against the same imports compiled afresh, as each
  process compiles them where Python may not write its cache (``PYTHONDONTWRITEBYTECODE=1``, a read-only
  environment): what every rank, torchrun worker and SLURM task pays at its start;
- with ``--switches``, the epoch time with ``model.compile=true``, with ``trainer.precision=bf16-mixed``
  with ``model.optimizer.fused=false``, without the safe-stop callback and with the weights' moving average
  (``callbacks=ema``), each against the default.

``--profile`` prints instead where a training step of the default ``train.py`` goes, per function
and per callback, in microseconds a step (under cProfile); ``--costs`` the time each default callback's hooks
take, per step, timed by Lightning's ``SimpleProfiler`` (``benchmarks/step_costs.py``).

Prints one table and writes it as JSON to outputs/benchmarks/. Every process here runs alone:
never run it beside another heavy job, and quote ratios, which are steadier than seconds.
"""

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from timing import EPOCH_TIMES, EPOCHS, ROOT, epoch_seconds, publish, wall

IMPORTS = "import torch, torchvision, lightning, hydra"
USUAL = "data._target_=usual_data.TorchvisionMNIST"  # benchmarks/usual_data.py
# Mistakes train.py must answer before it imports torch and Lightning: each exits 1 with one message.
REFUSALS = {
    "refused: wrong type": ["trainer.max_epochs=abc"],
    "refused: unknown key": ["modle.optimizer.lr=1"],
    "refused: unknown option": ["strategy=nope"],
    # Keys of nodes with a _target_, checked against the class's signature read from its source:
    "refused: the data module's key": ["+data.val_sise=1"],  # the user's own class
    "refused: the optimizer's key": ["+model.optimizer.lrr=1"],  # torch.optim.Adam, read without importing torch
}


def mnist(device: str) -> tuple[object, ...]:
    """The training split as train.py draws it (conf/data/mnist.yaml), normalised, on ``device``."""
    import torch
    from torchvision.datasets import MNIST

    images = MNIST(os.environ.get("DATA_DIR", str(ROOT / "data")), train=True)
    split = torch.randperm(60_000, generator=torch.Generator().manual_seed(12345))
    x = ((images.data.float() / 255 - 0.1307) / 0.3081).unsqueeze(1).to(device)
    y = images.targets.to(device)
    return x[split[:-5000]], y[split[:-5000]], x[split[-5000:]], y[split[-5000:]]


def baseline(epochs: int, device: str, fused: bool) -> None:
    """The hand-written loop, in its own process like train.py, importing neither Lightning nor Hydra.
    ``fused``: Adam's one-kernel update, as conf/model/simple_nn.yaml chooses, instead of the seed's."""
    import torch
    import torch.nn.functional as F

    from mnistlab.network import SimpleNN  # a plain nn.Module: imports torch only

    torch.manual_seed(0)
    x_train, y_train, x_val, y_val = mnist(device)
    net = SimpleNN().to(device)
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-3, fused=fused)
    seconds = []
    for _ in range(epochs):
        began = time.perf_counter()
        net.train()
        order = torch.randperm(len(y_train), device=device)
        for start in range(0, len(order), 64):
            batch = order[start : start + 64]
            loss = F.cross_entropy(net(x_train[batch]), y_train[batch])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        net.eval()
        with torch.no_grad():
            correct = sum(
                (net(x_val[i : i + 64]).argmax(1) == y_val[i : i + 64]).sum() for i in range(0, len(y_val), 64)
            )
        seconds.append(time.perf_counter() - began)
        print(f"val acc {int(correct) / len(y_val):.4f}")
    Path(os.environ[EPOCH_TIMES]).write_text(json.dumps(seconds))


def bare_lightning(epochs: int, device: str) -> None:
    """The fused-Adam baseline as the smallest LightningModule, under a Trainer with no callback,
    logger, checkpoint, progress bar or metric: Lightning's own loop, the floor under train.py."""
    import lightning as L
    import torch
    import torch.nn.functional as F

    from mnistlab.network import SimpleNN

    os.environ.pop("PYTORCH_NVML_BASED_CUDA_CHECK", None)  # as mnistlab.tasks does on the CPU

    class Batches:
        """Whole-batch indexing in a new order each epoch, as the baseline does."""

        def __init__(self, x: torch.Tensor, y: torch.Tensor, shuffle: bool) -> None:
            self.x, self.y, self.shuffle = x, y, shuffle

        def __len__(self) -> int:
            return math.ceil(len(self.y) / 64)

        def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
            n = len(self.y)
            order = torch.randperm(n, device=device) if self.shuffle else torch.arange(n, device=device)
            return ((self.x[batch], self.y[batch]) for batch in order.split(64))

    class Bare(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = SimpleNN()

        def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], _: int) -> torch.Tensor:
            return F.cross_entropy(self.net(batch[0]), batch[1])

        def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], _: int) -> torch.Tensor:
            return (self.net(batch[0]).argmax(1) == batch[1]).sum()

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.Adam(self.parameters(), lr=1e-3, fused=True)

    torch.manual_seed(0)
    x_train, y_train, x_val, y_val = mnist(device)
    switches = {
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
    }
    from epoch_timer import EpochTimer

    trainer = L.Trainer(
        accelerator="gpu" if device == "cuda" else "cpu",
        devices=1,
        max_epochs=epochs,
        num_sanity_val_steps=0,
        callbacks=[EpochTimer(os.environ[EPOCH_TIMES])],
        **switches,
    )
    trainer.fit(Bare(), Batches(x_train, y_train, True), Batches(x_val, y_val, False))


def refusals(repeats: int) -> dict[str, float]:
    """Median seconds to answer each mistake in REFUSALS, and to import torch and Lightning."""
    samples: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as out:
        for _ in range(repeats):
            samples.setdefault("import torch, lightning", []).append(
                wall([sys.executable, "-c", "import torch, lightning"])
            )
            for name, overrides in REFUSALS.items():
                command = [sys.executable, "train.py", *overrides, f"paths.log_dir={out}"]
                samples.setdefault(name, []).append(wall(command, refused=True))
    times = {name: statistics.median(values) for name, values in samples.items()}
    return times | {
        f"answer ratio {name.removeprefix('refused: ')} / import torch, lightning (target <= 0.33)": round(
            times[name] / times["import torch, lightning"], 3
        )
        for name in REFUSALS
    }


def startup(repeats: int) -> dict[str, float]:
    """Median seconds to import torch, torchvision, Lightning and Hydra from the install's bytecode, and
    compiled afresh: Python then reads its cache from an empty folder (PYTHONPYCACHEPREFIX) and writes none."""
    samples: dict[str, list[float]] = {}
    command = [sys.executable, "-c", IMPORTS]
    with tempfile.TemporaryDirectory() as empty:
        afresh = os.environ | {"PYTHONPYCACHEPREFIX": empty, "PYTHONDONTWRITEBYTECODE": "1"}
        for _ in range(repeats):
            samples.setdefault("imports, compiled at install", []).append(wall(command))
            samples.setdefault("imports, compiled afresh", []).append(wall(command, env=afresh))
    times = {name: statistics.median(values) for name, values in samples.items()}
    ratio = times["imports, compiled at install"] / times["imports, compiled afresh"]
    return times | {"start-up ratio compiled at install / compiled afresh": round(ratio, 3)}


def commands(out: Path, gpu: bool, switches: bool = False) -> dict[str, object]:
    """What to run: name -> a command, or a function of the number of epochs giving one."""
    py = sys.executable
    accelerator = "trainer.accelerator=gpu" if gpu else "trainer.accelerator=cpu"
    train = [py, "train.py", accelerator, "test=false", f"paths.log_dir={out}"]
    device = "cuda" if gpu else "cpu"
    rows: dict[str, object] = {
        "baseline": lambda e: [py, __file__, "--baseline", str(e), "--device", device],
        "baseline fused Adam": lambda e: [py, __file__, "--baseline", str(e), "--device", device, "--fused"],
        "bare Lightning": lambda e: [py, __file__, "--bare-lightning", str(e), "--device", device],
        "train.py": lambda e: [*train, f"trainer.max_epochs={e}"],
        # The same run fed as most templates feed it: torchvision's dataset, transforms, a DataLoader.
        "train.py usual DataLoader": lambda e: [*train, f"trainer.max_epochs={e}", USUAL],
        "import only": [py, "-c", IMPORTS],
        "train.py fast_dev_run": [py, "train.py", accelerator, "debug=fdr", f"paths.log_dir={out}"],
    }
    if not gpu or two_gpus():  # two ranks: two processes on a CPU, two GPUs on a GPU machine
        rows["train.py ddp x2"] = lambda e: [*train, f"trainer.max_epochs={e}", "strategy=ddp", "trainer.devices=2"]
    if switches:  # the config switches, each measured against the default to choose it
        rows["train.py model.compile=true"] = lambda e: [*train, f"trainer.max_epochs={e}", "model.compile=true"]
        rows["train.py bf16-mixed"] = lambda e: [*train, f"trainer.max_epochs={e}", "trainer.precision=bf16-mixed"]
        rows["train.py fused=false"] = lambda e: [*train, f"trainer.max_epochs={e}", "model.optimizer.fused=false"]
        rows["train.py safe_stop=null"] = lambda e: [*train, f"trainer.max_epochs={e}", "callbacks.safe_stop=null"]
        rows["train.py callbacks=ema"] = lambda e: [*train, f"trainer.max_epochs={e}", "callbacks=ema"]
    if switches and gpu:  # half precision with loss scaling: GPUs only
        rows["train.py 16-mixed"] = lambda e: [*train, f"trainer.max_epochs={e}", "trainer.precision=16-mixed"]
    return rows


def two_gpus() -> bool:
    import torch

    return torch.cuda.device_count() >= 2


def measure(repeats: int, gpu: bool, switches: bool) -> dict[str, float]:
    """Median seconds for each row, the runs of one repeat interleaved with those of the others."""
    samples: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as out:
        for _ in range(repeats):
            for name, command in commands(Path(out), gpu, switches).items():
                row = f"{name} epoch" if callable(command) else name
                seconds = epoch_seconds(command(EPOCHS), Path(out)) if callable(command) else wall(command)
                samples.setdefault(row, []).append(seconds)
                # As it is measured: a run cut short (a lease, a time limit) still leaves its rows.
                print(f"{row}: {seconds:.3f} s", file=sys.stderr, flush=True)
    return {name: statistics.median(values) for name, values in samples.items()} | refusals(repeats)


def test_accuracy_per_epoch(gpu: bool, epochs: int = 10) -> list[float]:
    """Test accuracy after each epoch of the default config: every epoch's checkpoint, tested here."""
    import torch

    sys.path.insert(0, str(ROOT / "src"))
    from mnistlab.data import MNISTDataModule
    from mnistlab.network import SimpleNN

    data = MNISTDataModule(os.environ.get("DATA_DIR", str(ROOT / "data")), batch_size=1000)
    data.setup("test")
    net = SimpleNN().eval()
    with tempfile.TemporaryDirectory() as out:
        keep_all = ["callbacks.model_checkpoint.save_top_k=-1", "callbacks.early_stopping=null"]
        wall([*commands(Path(out), gpu)["train.py"](epochs), *keep_all])
        accuracies = []
        for path in sorted(Path(out).rglob("epoch*.ckpt")):
            state = torch.load(path, map_location="cpu", weights_only=True)["state_dict"]
            net.load_state_dict({k.removeprefix("net."): v for k, v in state.items() if k.startswith("net.")})
            with torch.no_grad():
                correct = sum(int((net(x).argmax(1) == y).sum()) for x, y in data.test_dataloader())
            accuracies.append(correct / 10_000)
    return accuracies


def profile(gpu: bool, top: int = 25) -> None:
    """Where a step of the default train.py goes: its training epoch under cProfile (which slows every
    Python call, so read the shares, not the seconds), printed in microseconds per training step."""
    import pstats

    with tempfile.TemporaryDirectory() as out:
        stats_file = Path(out) / "train.prof"
        train = commands(Path(out), gpu)["train.py"](1)
        hook = ["+callbacks.profile._target_=epoch_profile.EpochProfile", f"+callbacks.profile.path={stats_file}"]
        wall(["env", f"PYTHONPATH={ROOT / 'benchmarks'}", *train, *hook, "callbacks.early_stopping=null"])
        stats = pstats.Stats(str(stats_file))
    steps = 860  # one epoch of 55,000 images in batches of 64
    rows = stats.stats  # (file, line, function) -> (primitive calls, calls, own time, cumulative time, callers)
    print(f"{'us/step own':>11} {'us/step cum':>11} {'calls/step':>10}  function")
    for (file, line, name), (_, calls, own, cumulative, _) in sorted(rows.items(), key=lambda r: -r[1][2])[:top]:
        where = f"{Path(file).parent.name}/{Path(file).name}:{line}" if line else file
        print(f"{own / steps * 1e6:11.1f} {cumulative / steps * 1e6:11.1f} {calls / steps:10.1f}  {name} ({where})")
    print("\nHooks, cumulative per step (their own work and what they call):")
    hooks: dict[str, float] = {}
    for (file, _, name), (_, _, _, cumulative, _) in rows.items():
        if name.startswith("on_") and ("callbacks" in file or "mnistlab" in file):
            owner = Path(file).stem
            hooks[owner] = hooks.get(owner, 0.0) + cumulative / steps * 1e6
    for owner, micros in sorted(hooks.items(), key=lambda kv: -kv[1]):
        print(f"{micros:11.1f}  {owner}")


def report(times: dict[str, float], accuracies: list[float]) -> dict[str, object]:
    """The table's rows, with the ratios the targets are stated in."""
    epoch, base = times["train.py epoch"], times["baseline epoch"]
    rows: dict[str, object] = {name: round(seconds, 3) for name, seconds in times.items()}
    rows["epoch ratio train.py / baseline (target <= 1.25)"] = round(epoch / base, 3)
    # The same loop with the optimizer train.py uses: what Lightning, Hydra and the template cost alone.
    fused, bare = times["baseline fused Adam epoch"], times["bare Lightning epoch"]
    rows["epoch ratio train.py / baseline fused Adam"] = round(epoch / fused, 3)
    rows["epoch ratio bare Lightning / baseline fused Adam (Lightning's loop)"] = round(bare / fused, 3)
    rows["epoch ratio train.py / bare Lightning (the template and Hydra)"] = round(epoch / bare, 3)
    rows["start-up ratio fast_dev_run / import only (target <= 1.3)"] = round(
        times["train.py fast_dev_run"] / times["import only"], 3
    )
    if "train.py ddp x2 epoch" in times:  # not on a machine of one GPU
        rows["epoch ratio ddp x2 / one process"] = round(times["train.py ddp x2 epoch"] / epoch, 3)
    rows["epoch ratio usual DataLoader / in-memory (what the in-memory path saves)"] = round(
        times["train.py usual DataLoader epoch"] / epoch, 3
    )
    for switch in ("model.compile=true", "bf16-mixed", "16-mixed", "fused=false", "safe_stop=null"):
        if (seconds := times.get(f"train.py {switch} epoch")) is not None:
            rows[f"epoch ratio {switch} / default"] = round(seconds / epoch, 3)
    rows["test accuracy per epoch"] = [round(a, 4) for a in accuracies]
    for target in (0.975, 0.98):
        first = next((i + 1 for i, a in enumerate(accuracies) if a >= target), None)
        rows[f"time to {target:.1%} test accuracy (s)"] = (
            round(times["train.py fast_dev_run"] + first * epoch, 1) if first else f"not in {len(accuracies)} epochs"
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="runs of each row; the median is reported")
    parser.add_argument(
        "--gpu", action="store_true", help="on a GPU: every row, the switches (compile, bf16, 16-mixed) included"
    )
    parser.add_argument("--switches", action="store_true", help="also time model.compile and bf16-mixed")
    parser.add_argument("--refusals", action="store_true", help="only time how fast mistakes are answered")
    parser.add_argument("--startup", action="store_true", help="only time the imports, compiled at install or not")
    parser.add_argument("--profile", action="store_true", help="only show where a step of train.py goes")
    parser.add_argument("--costs", action="store_true", help="only price each default callback, in us a step")
    parser.add_argument("--baseline", type=int, metavar="EPOCHS", help=argparse.SUPPRESS)
    parser.add_argument("--device", default="cpu", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=ROOT / "outputs" / "benchmarks", help="where the JSON goes")
    parser.add_argument("--fused", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--bare-lightning", type=int, metavar="EPOCHS", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.baseline:
        return baseline(args.baseline, args.device, args.fused)
    if args.bare_lightning:
        return bare_lightning(args.bare_lightning, args.device)
    if args.gpu:
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("--gpu: this machine has no CUDA GPU; run without --gpu to measure the CPU")
    if args.profile:
        return profile(args.gpu)
    if args.refusals or args.startup:
        measured = refusals(args.repeats) if args.refusals else startup(args.repeats)
        rows = {name: round(value, 3) for name, value in measured.items()}
    elif args.costs:
        import step_costs

        rows = step_costs.measure(args.repeats, args.gpu)
    else:
        switches = args.switches or args.gpu  # the first machine with a GPU gets the whole table in one command
        rows = report(measure(args.repeats, args.gpu, switches), test_accuracy_per_epoch(args.gpu))
    publish(rows, args.out, "speed")


if __name__ == "__main__":
    main()
