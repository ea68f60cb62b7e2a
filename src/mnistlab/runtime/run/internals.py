"""The private parts of Lightning, torch, Ray, Optuna, LitData and Hydra that the machinery relies on, in one
place: each with why no public API serves, and the version it was read from. A new release that moves one breaks
here, and the canary (``.ci/frameworks-next``: the fast tier and a DDP run against the newest Lightning
and torch the specifiers admit, pre-releases included) says so before a user does.

Read from: lightning 2.6.6, torch 2.15.0, ray 2.60.0, optuna 5.1.0, litdata 0.2.76, hydra-core 1.3.8 (uv.lock).
"""

import functools
import threading
from datetime import timedelta
from typing import Any

# Imported within each function: Lightning's import takes seconds, and the entry points import this module
# (through rendezvous) before they check the config.


def flat_hyperparameters(params: Any, delimiter: str = "/", plain: bool = False) -> dict[str, Any]:
    """A config flattened into hyperparameters (``model/optimizer/lr``) as Lightning's loggers flatten it
    (``_convert_params``, ``_flatten_dict``; ``plain``: and ``_sanitize_params``, TensorBoard's types), so
    that the project's views of them (TensorBoard's HPARAMS, MLflow, W&B) name them alike."""
    from lightning.fabric.utilities.logger import _convert_params, _flatten_dict, _sanitize_params

    flat = _flatten_dict(_convert_params(params), delimiter=delimiter)
    return _sanitize_params(flat) if plain else flat


def ddp_timeout(strategy: Any) -> timedelta | None:
    """The collective timeout a DDP strategy was given (``strategy.timeout`` in conf/strategy/), which
    Lightning keeps as ``DDPStrategy._timeout`` and never exposes; None for a strategy without one."""
    return getattr(strategy, "_timeout", None)


def is_spawning(launcher: Any) -> bool:
    """Whether Lightning started the ranks with multiprocessing (``ddp_spawn``, ``ddp_notebook``): its
    ``_MultiProcessingLauncher``, the one launcher whose ranks end inside this process's teardown."""
    from lightning.pytorch.strategies.launchers import _MultiProcessingLauncher

    return isinstance(launcher, _MultiProcessingLauncher)


def started_ranks(launcher: Any) -> list[Any]:
    """The ``Popen`` of each rank Lightning's ``_SubprocessScriptLauncher`` started (its ``procs``); none
    for another launcher."""
    return list(getattr(launcher, "procs", []))


def stop_watching_started_ranks() -> None:
    """Lightning's watcher of the ranks it started (``_ChildProcessObserver``, a thread named
    ``child-process-observer``) SIGKILLs this process too as soon as one of them exits with an error: a
    run that explains a lost rank would end by SIGKILL (-9) instead of its own line and exit code."""
    for thread in threading.enumerate():
        if thread.name == "child-process-observer":
            thread._child_processes = []  # type: ignore[attr-defined]


def batches_done_this_epoch(trainer: Any) -> int:
    """The training batches the current epoch has completed: the fit loop's progress counter, which
    Lightning restores mid-epoch (``trainer.fit_loop.epoch_loop.batch_progress``, no public property)."""
    return int(trainer.fit_loop.epoch_loop.batch_progress.current.completed)


def trained_epochs(checkpoint: dict[str, Any]) -> int:
    """The epochs a Lightning checkpoint has trained, as Lightning counts them when it restores one: its
    fit loop's processed epochs (``loops.fit_loop.epoch_progress``), where one saved at an epoch's end
    counts that epoch and one saved mid-epoch does not (``epoch`` alone cannot tell)."""
    progress = checkpoint.get("loops", {}).get("fit_loop", {}).get("epoch_progress", {}).get("current", {})
    return int(progress.get("processed", checkpoint.get("epoch", 0)))


def rates_at_last_step(scheduler: Any) -> list[float]:
    """A torch scheduler's closed-form rates at its ``last_epoch`` (``_get_closed_form_lr``), and
    records them as its last rates (``_last_lr``, which ``get_last_lr`` returns): a schedule re-planned
    on resume continues from where its new plan puts it, without a step."""
    rates = list(scheduler._get_closed_form_lr())
    scheduler._last_lr = rates
    return rates


def tensorboard_file_writer(writer: Any) -> Any:
    """The event file writer of a ``SummaryWriter``, as ``TensorBoardLogger.log_hyperparams`` takes it:
    ``add_summary`` of a hyperparameter summary needs it (``SummaryWriter._get_file_writer``)."""
    return writer._get_file_writer()


def ray_node() -> Any:
    """Ray's handle on the processes ``ray.init`` started on this machine (``ray._private.worker
    ._global_node``): the raylet's pid, which the reaper of a local cluster watches. None when not started."""
    import ray

    return ray._private.worker._global_node


def ray_loopback_node() -> None:
    """Make the node this process starts a loopback one, as ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` does
    where it is set before Ray's import (``ray._private.ray_constants.ENABLE_RAY_CLUSTER``, read by
    ``services.get_node_ip_address`` at ``ray.init``): the config's checks import Ray's classes before the
    run starts its cluster, and ``ray.init`` takes no node address that stays loopback."""
    from ray._private import ray_constants

    ray_constants.ENABLE_RAY_CLUSTER = False


def optuna_trial_id(trial: Any) -> int:
    """An Optuna trial's id in its storage (``_trial_id``): what a storage's calls take, where a trial's
    ``number`` counts within its study only."""
    return int(trial._trial_id)


@functools.cache  # once a process: it builds a boto3 client
def litdata_downloads_over_plain_http() -> None:
    """LitData 0.2.76 downloads chunks with obstore, which it configures without ``allow_http``: from an S3
    endpoint over plain HTTP (a MinIO on a private network, the tests' S3 server) every chunk fails with
    "builder error", and no setting reaches it. There its boto3 downloader (the same credentials and endpoint)
    serves instead: ``_OBSTORE_AVAILABLE``, read at each download."""
    import boto3
    from litdata.streaming import downloader

    if boto3.client("s3").meta.endpoint_url.startswith("http://"):
        downloader._OBSTORE_AVAILABLE = False


def hydra_package(text: str) -> str | None:
    """The package a config file's header names (``# @package _global_``), as Hydra reads it: its header
    ends at the first line that is not ``# @...`` (``ConfigSource._get_header_dict``; no public reader)."""
    from hydra.plugins.config_source import ConfigSource

    return ConfigSource._get_header_dict(text)["package"]
