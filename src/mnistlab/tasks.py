"""What the entry points do, as pure functions of a composed config: ``train`` and ``evaluate``."""

import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import lightning as L
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from lightning.pytorch.accelerators import CPUAccelerator
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from omegaconf import DictConfig, OmegaConf
from torch.distributed import DistNetworkError, DistStoreError

from mnistlab.runtime.checkpointing import resume
from mnistlab.runtime.checkpointing.checkpoint_io import RUN_ID_KEY, AtomicCheckpointIO, fit_weights, load_checkpoint
from mnistlab.runtime.config import hydra_versions
from mnistlab.runtime.config.checks import check_devices
from mnistlab.runtime.distributed import ray_train, rendezvous
from mnistlab.runtime.reporting import config_tree, hyperparameters, run_record
from mnistlab.runtime.run import atomic, console, folder_lock, internals, launch, run_folder
from mnistlab.runtime.run.failures import InputError, resume_command
from mnistlab.runtime.training import batch_hooks, signals
from mnistlab.runtime.training.stopping import SafeStop

log = logging.getLogger(__name__)
console.adopt_lightning_loggers()  # Lightning was imported just now, after Hydra configured logging


def train(cfg: DictConfig) -> dict[str, float]:
    """Fit the model, then test the best checkpoint on the test set; return every logged metric."""
    check_devices(cfg)
    rendezvous.check_environment(cfg)
    if rendezvous.is_distributed_sweep_job(cfg):
        return rendezvous.run_job_in_fresh_processes()
    folder = Path(cfg.paths.output_dir)
    folder_lock.hold(folder, "the run")  # a second start on this folder (resume=) is refused while it runs
    try:
        if cfg.get("engine"):  # engine=ray: Ray's workers run fit_and_test
            with hydra_versions.allowed():
                return ray_train.run(cfg, fit_and_test)
        return fit_and_test(cfg)
    finally:
        folder_lock.release(folder)


def fit_and_test(
    cfg: DictConfig, prepare: Callable[[L.Trainer], L.Trainer] = lambda trainer: trainer
) -> dict[str, float]:
    """What every rank of a run does: fit, then test the best checkpoint; ``prepare``: an engine's last
    word on the Trainer (Ray's ``prepare_trainer``)."""
    with hydra_versions.allowed():  # what conf/ may call, also where train(cfg) is called directly
        # A missing or broken file: one line now, not a traceback from fit; read once, for every check.
        given = (cfg.ckpt_path, load_checkpoint(cfg.ckpt_path)) if cfg.get("ckpt_path") else None
        start = given or _last_checkpoint(cfg)
        if start:
            _refuse_fewer_epochs(cfg, *start)  # before anything is written: Lightning would refuse it mid-way
        config_tree.show(cfg)
        L.seed_everything(cfg.seed, workers=True)
        datamodule, model, trainer = _build(cfg, given)
        start_from = _before_fit(cfg, prepare(trainer), datamodule, start)
        _fit(trainer, model, datamodule, start_from)
        signals.release()  # trained and saved: testing stops at a signal, as any program
        metrics = _floats(trainer.callback_metrics)
        if cfg.get("test", True):
            metrics |= _test(trainer, model, datamodule)
        _finish(metrics, trainer, cfg)
        return metrics


def _before_fit(
    cfg: DictConfig, trainer: L.Trainer, datamodule: L.LightningDataModule, start: tuple[str, dict[str, Any]] | None
) -> str | None:
    """What fit starts from (``ckpt_path``, or the run's own ``last.ckpt`` on a restart), compared with this
    code and data; the run's overrides logged; a resume recorded once training starts."""
    _log_overrides(cfg)
    rendezvous.isolate_restarted_workers(trainer.strategy)
    # (Trainer.callbacks is set by Lightning's callback connector, not declared by the Trainer)
    if not any(isinstance(callback, SafeStop) for callback in trainer.callbacks):  # type: ignore[attr-defined]
        signals.release()  # nothing would act on a stop signal the entry point notes
    if start:
        if start[0] != cfg.get("ckpt_path"):
            if (
                launch.current().is_rank_zero
            ):  # a newer checkpoint than last.ckpt becomes last.ckpt (the others read either)
                start = str(resume.adopt_as_last(Path(start[0]))), start[1]
            log.info("Resuming from %s, this run folder's last checkpoint", start[0])
        run_record.warn_if_different(start[1], start[0], run_record.data_files(datamodule))
    if cfg.get("resume") and HydraConfig.initialized():
        trainer.callbacks.append(_RecordResume(cfg, HydraConfig.get().overrides.task))  # type: ignore[attr-defined]
    return start[0] if start else None


class _RecordResume(L.Callback):
    """Adds ``resume=`` to the run folder's history once training has started from its checkpoint: a resume
    refused on the way (by Lightning's restore among others) is not replayed by the next one."""

    def __init__(self, cfg: DictConfig, overrides: list[str]) -> None:
        self.cfg, self.overrides = cfg, overrides

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.is_global_zero:
            log.info("Recorded this resume in %s", resume.record(self.cfg, self.overrides))


def _fit(trainer: L.Trainer, model: L.LightningModule, datamodule: L.LightningDataModule, start: str | None) -> None:
    """``trainer.fit``, with a lost peer or a failed rendezvous said in one line with the way to resume."""
    try:
        trainer.fit(model, datamodule=datamodule, ckpt_path=start)
    except (DistNetworkError, DistStoreError) as err:
        raise rendezvous.rendezvous_failure(err) from err
    except RuntimeError as err:  # DistBackendError among them: a rank that stopped answering
        raise rendezvous.lost_peer(err, trainer) from err
    finally:
        if trainer.progress_bar_callback is not None and trainer.interrupted and trainer.is_global_zero:
            print(flush=True)  # end the progress bar's line: the one line that says why stands on its own


def _test(trainer: L.Trainer, model: L.LightningModule, datamodule: L.LightningDataModule) -> dict[str, float]:
    """Test this run's best checkpoint; the last weights where it wrote none, saying so."""
    callback = _checkpointer(trainer)
    best = callback.best_model_path if callback else ""
    if not best:
        log.warning("No checkpoint was saved (fast_dev_run, or no ModelCheckpoint): testing the last weights")
    elif callback and callback.dirpath and Path(best).parent.resolve() != Path(callback.dirpath).resolve():
        # Restored from ckpt_path= with the rest of ModelCheckpoint's state: another run's file.
        log.warning(
            "This run wrote no best checkpoint of its own (the best is still %s): testing its last weights", best
        )
        best = ""
    trainer.test(model, datamodule=datamodule, ckpt_path=best or None)
    metrics = _floats(trainer.callback_metrics)
    log.info("Tested %s: %s", best or "the last weights", _describe(metrics, "test/"))
    return metrics


def evaluate(cfg: DictConfig) -> dict[str, float]:
    """Test the checkpoint ``cfg.ckpt_path`` on the test set; return the test metrics."""
    check_devices(cfg)
    rendezvous.check_environment(cfg)
    if OmegaConf.is_missing(cfg, "ckpt_path"):
        raise InputError(
            f"which checkpoint? pass ckpt_path=<file>, e.g. {run_folder.last_checkpoint(Path('<run folder>'))}"
        )
    checkpoint = load_checkpoint(cfg.ckpt_path)
    config_tree.show(cfg)
    with hydra_versions.allowed():
        datamodule, model, trainer = _build(cfg, (cfg.ckpt_path, checkpoint))
    run_record.warn_if_different(checkpoint, cfg.ckpt_path, run_record.data_files(datamodule))
    model.load_state_dict(checkpoint["state_dict"])
    trainer.test(model, datamodule=datamodule)
    metrics = _floats(trainer.callback_metrics)
    log.info("Evaluated %s: %s", cfg.ckpt_path, _describe(metrics, "test/"))
    _finish(metrics, trainer, cfg)
    return metrics


def stream(cfg: DictConfig) -> dict[str, int]:
    """Write the data module ``cfg.data``'s splits as chunks at ``cfg.output``; return each split's samples."""
    from mnistlab.runtime.data import chunks

    with hydra_versions.allowed():
        datamodule = _instantiate(cfg.data, "data")
    written = chunks.write(datamodule, cfg.output, cfg.chunk_bytes, cfg.overwrite)
    counts = ", ".join(f"{split} {count}" for split, count in written.items())
    log.info("Wrote %s samples into %s: train with data=stream data.input_dir=%s", counts, cfg.output, cfg.output)
    return written


def _log_overrides(cfg: DictConfig) -> None:
    """On every rank, into its own log file: what this process trains."""
    if not HydraConfig.initialized():
        return
    overrides = HydraConfig.get().overrides.task
    if cfg.get("resume"):
        own, given = resume.split(overrides)
        log.info("Resuming the run in %s; its overrides: %s", cfg.paths.output_dir, " ".join(own) or "none")
        log.info("Overrides given now, on top: %s", " ".join(given) or "none")
        if resume.refused:
            log.warning(
                "Not replayed from the run folder, as they could run code (give them on the command line if you "
                "trust them): %s",
                " ".join(resume.refused),
            )
    else:
        log.info("Overrides: %s", " ".join(overrides) or "none")


def _build(
    cfg: DictConfig, weights_from: tuple[str, dict[str, Any]] | None = None
) -> tuple[L.LightningDataModule, L.LightningModule, L.Trainer]:
    """The run's parts; ``weights_from``: (path, checkpoint) whose weights the model must fit, checked before the
    loggers and the trainer write anything into the run's folder."""
    _set_matmul_precision(cfg.get("float32_matmul_precision", "highest"))
    datamodule, model = _instantiate(cfg.data, "data"), _instantiate(cfg.model, "model")
    if weights_from:
        path, checkpoint = weights_from
        fit_weights(model, checkpoint["state_dict"], f"ckpt_path={path}")
    # A group entry set to null (e.g. callbacks.early_stopping=null) switches that object off.
    callbacks = [_instantiate(c, f"callbacks.{k}") for k, c in (cfg.get("callbacks") or {}).items() if c is not None]
    loggers = [_instantiate(c, f"logger.{k}") for k, c in (cfg.get("logger") or {}).items() if c is not None]
    # Lightning refuses a combination of trainer settings with its own error: Hydra 1.3 wraps it, 1.4 does not.
    try:
        trainer = instantiate(cfg.trainer, callbacks=callbacks, logger=loggers)
    except (InstantiationException, ValueError, MisconfigurationException) as err:
        raise InputError(f"invalid trainer settings: {err.__cause__ or err}") from err
    batch_hooks.skip_empty(trainer.callbacks)  # Lightning's defaults among them
    # Plain containers only: checkpoints must load with torch.load(weights_only=True).
    job_keys = [str(key) for key in cfg if key != "hydra"]  # tests compose with Hydra's own config included
    config = cast(dict[str, Any], OmegaConf.to_container(OmegaConf.masked_copy(cfg, job_keys), resolve=True))
    if isinstance(trainer.strategy.checkpoint_io, AtomicCheckpointIO):  # conf/trainer/: what writes checkpoints
        trainer.strategy.checkpoint_io.config = config
    compared = hyperparameters.compared(cfg)
    for logger in trainer.loggers:
        logger.log_hyperparams(compared)
        hyperparameters.save_config(logger, config)
    if isinstance(trainer.accelerator, CPUAccelerator):
        _skip_nvml_probe()
    return datamodule, model, trainer


def _instantiate(node: DictConfig, key: str) -> Any:
    """A part of the run, built: a value its class refuses (ValueError, TypeError) is the user's to fix, in
    one line, as is what it finds wrong in the run's folder (InputError). Hydra 1.3 wraps the class's error,
    1.4 does not."""
    try:
        return instantiate(node)
    except (InstantiationException, ValueError, TypeError) as err:
        cause = err.__cause__ if isinstance(err, InstantiationException) and err.__cause__ else err
        if isinstance(cause, InputError):
            raise cause from err
        raise InputError(
            f"{key} ({node.get('_target_')}) refused its settings: {type(cause).__name__}: {cause} "
            "(HYDRA_FULL_ERROR=1 shows where)"
        ) from err


def _set_matmul_precision(precision: str) -> None:
    """Tensor cores for float32 matrix products on a GPU (torch only warns about a wrong value)."""
    if precision not in ("highest", "high", "medium"):
        raise InputError(f"float32_matmul_precision={precision}: one of highest, high (TF32 on a GPU), medium (bf16)")
    torch.set_float32_matmul_precision(precision)


def _skip_nvml_probe() -> None:
    """Stop torch from loading the NVIDIA management library at every optimizer step of a CPU run.

    Lightning sets PYTORCH_NVML_BASED_CUDA_CHECK=1 on import so that asking whether CUDA is there
    never initialises it (a forked process could not use CUDA then). Adam and its kin ask at every
    ``step()``, and until CUDA is initialised torch does not cache the answer: with a CUDA build of
    torch on a machine without a GPU, each step re-opens libnvidia-ml, 0.2 ms a step here, a fifth
    of this model's whole step (benchmarks/speed.py). A run on the CPU never initialises CUDA, so
    the runtime's own check, which it answers once and caches, is as safe in this process.
    """
    os.environ.pop("PYTORCH_NVML_BASED_CUDA_CHECK", None)


def _checkpointer(trainer: L.Trainer) -> ModelCheckpoint | None:
    """The trainer's checkpoint callback, where it is Lightning's ``ModelCheckpoint`` (conf/callbacks/)."""
    callback = trainer.checkpoint_callback
    return callback if isinstance(callback, ModelCheckpoint) else None


def _last_checkpoint(cfg: DictConfig) -> tuple[str, dict[str, Any]] | None:
    """The run folder's own last checkpoint, read, if it has one and this run wrote it: a requeued or restarted
    job, or ``resume=``, continues from it (``resume.continue_from``: last.ckpt, or a newer one of the run's)."""
    folder = Path(cfg.paths.output_dir)
    if any(folder.glob(run_folder.SLURM_CHECKPOINTS)):
        return None  # Lightning resumes from the newer checkpoint it saved when SLURM signalled the job
    path = resume.continue_from(folder)
    if path is None:
        return None
    checkpoint = load_checkpoint(path, what=path.name)
    writer = checkpoint.get(RUN_ID_KEY)
    if not cfg.get("resume") and (writer is None or writer != launch.run_id()):
        raise InputError(  # ownership.OwnFolder refuses it before Hydra writes; train(cfg) called directly, here
            f"{folder} already holds a run's {run_folder.last_checkpoint(folder).relative_to(folder)} (written by "
            f"{writer or 'a run started by hand'}), and this run did not write it. Continue that run with "
            f"{resume_command(folder)}, or start this one in a folder of its own"
        )
    return str(path), checkpoint


def _refuse_fewer_epochs(cfg: DictConfig, path: str, checkpoint: dict[str, Any]) -> None:
    """A checkpoint that has trained more epochs than ``trainer.max_epochs``: one line, before anything is
    written or recorded (Lightning refuses it while restoring, after the loggers and the resume's record)."""
    epochs, limit = internals.trained_epochs(checkpoint), cfg.trainer.get("max_epochs")
    if isinstance(limit, int) and limit >= 0 and epochs > limit:
        named = f"resume={cfg.resume}" if cfg.get("resume") else f"ckpt_path={path}"
        raise InputError(
            f"{named} has trained {epochs} epochs, more than trainer.max_epochs={limit}: nothing was changed; "
            f"give trainer.max_epochs={epochs + 1} or more to train it further"
        )


def _finish(metrics: dict[str, float], trainer: L.Trainer, cfg: DictConfig) -> None:
    """Save the run's final metrics as <run dir>/metrics.json (rank 0, as all run files), then end the
    process group on every rank together. Left to interpreter exit, a rank that outlives the one
    hosting the rendezvous store can abort ("terminate called without an active exception")."""
    if trainer.is_global_zero:
        atomic.write_text(Path(cfg.paths.output_dir) / run_folder.METRICS_FILE, json.dumps(metrics, indent=2))
    if torch.distributed.is_initialized():
        trainer.strategy.barrier("end of run")
        torch.distributed.destroy_process_group()


def _floats(metrics: dict[str, torch.Tensor]) -> dict[str, float]:
    return {name: float(value) for name, value in metrics.items()}


def _describe(metrics: dict[str, float], prefix: str) -> str:
    return ", ".join(f"{k}={v:.6g}" for k, v in sorted(metrics.items()) if k.startswith(prefix))
