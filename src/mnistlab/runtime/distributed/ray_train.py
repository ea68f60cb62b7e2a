"""Ray Train as the engine of a run: ``python train.py engine=ray`` (conf/engine/ray.yaml).

The process that Hydra started (the driver) holds the run's folder and connects to a Ray cluster
(or starts one on this machine); Ray Train's ``TorchTrainer`` then starts ``num_workers`` workers,
sets up their process group, and each worker runs the run's fit and test (``tasks.fit_and_test``) with
Lightning's DDP on Ray's ranks (``RayDDPStrategy``, ``RayLightningEnvironment``, and ``prepare_trainer``,
which checks both). The workers write the run's folder as the ranks of any run do: rank 0 the
checkpoints, ``metrics.json`` and ``train.log``, each other rank its ``train_ddp_process_<N>.log``. The
run folder's ``last.ckpt`` is the checkpoint: Ray's own copy (``RayTrainReportCallback``) would be a
second one, so the workers report only their metrics to Ray.

A worker that dies ends the run with the resume line (``engine.failure_config.max_failures: 0``), or
Ray starts the workers again, and they continue from ``last.ckpt``: the checkpoints name this launch
(``RUN_ID``), so a restart within it resumes, as a requeued SLURM job does.
"""

import json
import logging
import os
import secrets
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from mnistlab.runtime.distributed import local_ray
from mnistlab.runtime.run import console, launch, run_folder
from mnistlab.runtime.run.failures import InputError, RunStopped, continue_line

log = logging.getLogger(__name__)
LOG_FORMAT = "[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"  # conf/hydra/'s, for the workers' logs


def run(cfg: DictConfig, fit_and_test: Callable[..., dict[str, float]]) -> dict[str, float]:
    """Train ``cfg`` on Ray's workers, each running ``fit_and_test`` (tasks'); return the metrics rank 0 saved."""
    import ray
    from ray.train import RunConfig
    from ray.train.torch import TorchTrainer

    engine = cfg.engine
    folder = Path(cfg.paths.output_dir)
    scaling = instantiate(engine.scaling_config)
    _connect(engine, scaling)
    trainer = TorchTrainer(
        _worker,
        train_loop_config={
            "cfg": _for_workers(cfg),
            "fit_and_test": fit_and_test,
            "cwd": os.getcwd(),
            "run_id": f"ray-{secrets.token_hex(4)}",
        },
        scaling_config=scaling,
        torch_config=instantiate(engine.torch_config),
        run_config=RunConfig(
            name=folder.name,
            storage_path=str(folder / "ray"),  # Ray's record of the run's attempts, in the run's folder
            failure_config=instantiate(engine.failure_config),
        ),
    )
    started = time.monotonic()
    try:
        trainer.fit()
    except ray.train.TrainingFailedError as err:
        raise RunStopped(
            f"Stopped: a Ray worker failed ({_first_line(err)}). {continue_line(folder)}",
            exit_code=1,
        ) from err
    log.info("Ray Train's %d workers ran fit and test in %.1f s", scaling.num_workers, time.monotonic() - started)
    return json.loads((folder / run_folder.METRICS_FILE).read_text())


def _connect(engine: DictConfig, scaling: Any) -> None:
    """Join the cluster at ``engine.address`` (or start one here), or refuse in one line: an address that
    does not answer, GPUs that are not there."""
    import ray

    if scaling.use_gpu and engine.address is None:
        import torch

        if torch.cuda.device_count() < scaling.num_workers:
            raise InputError(
                f"engine.scaling_config.use_gpu=true asks for {scaling.num_workers} GPUs and this machine has "
                f"{torch.cuda.device_count()}: set engine.scaling_config.use_gpu=false to train on CPUs"
            )
    connect(engine.address, engine.connect_timeout_s, "engine")
    if scaling.use_gpu and ray.cluster_resources().get("GPU", 0) < scaling.num_workers:
        raise InputError(
            f"engine.scaling_config.use_gpu=true asks for {scaling.num_workers} GPUs and the Ray cluster at "
            f"{engine.address} has {ray.cluster_resources().get('GPU', 0):g}"
        )


def connect(address: str | None, timeout_s: float, key: str) -> None:
    """``ray.init`` at ``address`` (None: a cluster of this machine, started now), once the address has
    answered within ``timeout_s`` (Ray's own wait is long and silent); ``key`` names the setting."""
    import ray

    if address not in (None, "auto", "local"):
        host, _, port = str(address).removeprefix("ray://").rpartition(":")
        try:
            socket.create_connection((host, int(port)), timeout=timeout_s).close()
        except (OSError, ValueError) as err:
            raise InputError(
                f"{key}.address={address}: no Ray cluster answered there within {timeout_s:g} s "
                f"({key}.connect_timeout_s): {err}. Start one (ray start --head) or leave {key}.address null"
            ) from err
    if ray.is_initialized():
        return
    if address is None:  # a cluster of this machine, the run's alone (local_ray.py)
        local_ray.start(include_dashboard=False, logging_level=logging.WARNING)
    else:
        ray.init(address=address, include_dashboard=False, logging_level=logging.WARNING)


def _for_workers(cfg: DictConfig) -> dict:
    """The run's config as the workers run it: resolved here (Hydra's ``${hydra:...}`` lives only in this
    process), without ``engine`` (the workers are the engine)."""
    resolved = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(resolved, dict)
    resolved.pop("engine")
    return resolved


def _worker(config: dict[str, Any]) -> None:
    """One rank: the run's fit and test, logging to its own file of the run's folder."""
    import ray.train
    from ray.train.lightning import prepare_trainer

    os.chdir(config["cwd"])  # relative paths of the config mean the driver's folder (a shared one, on a cluster)
    os.environ[launch.RUN_ID] = config["run_id"]
    cfg = OmegaConf.create(config["cfg"])
    rank = ray.train.get_context().get_world_rank()
    handler = logging.FileHandler(Path(cfg.paths.output_dir) / f"{launch.log_name(rank, 'train')}.log")
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    logging.getLogger().addHandler(handler)
    logging.getLogger().setLevel(logging.INFO)
    console.adopt_lightning_loggers()  # Lightning was imported with this function, before the file had a handler
    context = ray.train.get_context()
    log.info("Ray Train's worker of rank %d of %d (node %d)", rank, context.get_world_size(), context.get_node_rank())
    metrics = config["fit_and_test"](cfg, prepare=prepare_trainer)  # prepare_trainer: Ray's check of the Trainer
    ray.train.report({name: value for name, value in metrics.items()})


def _first_line(err: BaseException) -> str:
    """What Ray says of the failure, in a sentence: the first of its last line (Ray's are paragraphs)."""
    cause = err.__cause__ or err
    lines = [line.strip() for line in str(cause).splitlines() if line.strip()]
    return lines[-1].split(". ")[0].rstrip(".") if lines else type(cause).__name__
