"""How a failure reaches the user: one line for a single run; for a sweep, a record in the failed job's
folder, the other jobs going on, and one line per failed job when the sweep ends.

Hydra's launchers run every job of a sweep even when one raises, but then the sweeper re-raises
the first failure only, with a traceback, and Optuna's stops the study unless failures are allowed.
So a failed job returns None instead (Optuna records the trial as failed and goes on), and its
reason waits in ``failure.txt`` for :class:`mnistlab.sweeps.summary.SweepSummary`, which reads it back from the job folders:
the only place every launcher (basic, joblib workers, SLURM jobs) shares with the sweep's process.
"""

import logging
import os
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig

from mnistlab.runtime.run import atomic, launch, run_folder
from mnistlab.runtime.run.failures import InputError, RunStopped, refused

log = logging.getLogger(__name__)


@contextmanager
def reported() -> Iterator[None]:
    """Around a job: the user's errors as one line; in a sweep, any error recorded and swallowed."""
    try:
        yield
    except Exception as err:
        # A signal stops the whole process, in a sweep too: the sweep was signalled, or its SLURM job is
        # requeued (and writes no result, so that submitit waits for the requeued run).
        signalled = isinstance(err, RunStopped) and err.exit_code > 128
        if HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN and not signalled:
            _record(err)
            return
        if isinstance(err, RunStopped):
            log.error("%s", err)  # through logging: the console shows rank 0's alone
            if err.then is not None:
                err.then()
            raise SystemExit(err.exit_code) from None
        if isinstance(err, InputError):
            _discard_unused_run_folder()
            if os.environ.get("HYDRA_FULL_ERROR") != "1":  # Hydra's switch for the whole traceback
                raise refused(err) from None
        raise


def _discard_unused_run_folder() -> None:
    """A run refused before it wrote anything of its own leaves no folder behind (rank 0, the folder's
    maker: run_folder.discard_if_unused deletes only a folder this process made)."""
    if HydraConfig.initialized() and launch.current().is_rank_zero:
        run_folder.discard_if_unused(Path(HydraConfig.get().runtime.output_dir))


def _record(err: Exception) -> None:
    hydra = HydraConfig.get()
    reason = str(err) if isinstance(err, InputError | RunStopped) else f"{type(err).__name__}: {err}"
    reason = " ".join(reason.split())  # one line
    details = "".join(traceback.format_exception(err))
    atomic.write_text(Path(hydra.runtime.output_dir) / run_folder.FAILURE_FILE, f"{reason}\n\n{details}")
    log.error("Job %s failed: %s", hydra.job.num, reason)


class WritableOutput(Callback):
    """Before Hydra creates the run's (or sweep's) folder: one line if it cannot, not Hydra's traceback."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        _check_writable(Path(config.hydra.run.dir))

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        _check_writable(Path(config.hydra.sweep.dir))


def _check_writable(folder: Path) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if not os.access(folder, os.W_OK):
            raise PermissionError(13, "Permission denied")
    except OSError as err:
        raise refused(
            f"cannot write the output folder {folder} ({err.strerror}); point paths.log_dir at a folder you can write to"
        ) from None
