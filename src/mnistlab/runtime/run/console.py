"""The one place that decides what reaches the console: global rank 0's records, without the noise.

Every module logs with plain ``logging``; Hydra's job logging (``conf/hydra/default.yaml``) puts
these filters on the console handler only, so each rank still writes its whole log file.
"""

import logging
import sys

from mnistlab.runtime.run import launch


class RankZeroFilter(logging.Filter):
    """Pass records only on global rank 0 (launch.is_rank_zero: by the launcher, and by Lightning's count)."""

    def __init__(self) -> None:
        super().__init__()
        # Python warnings go to stderr directly, from every rank; route them through logging too.
        logging.captureWarnings(True)

    def filter(self, record: logging.LogRecord) -> bool:
        return launch.is_rank_zero()


class DropNoise(logging.Filter):
    """Keep off the console what a user of this template cannot act on; log files keep everything."""

    NOISE = (
        "💡 Tip:",  # Lightning's advertisement for its cloud products, at every run
        "Trainer already configured with model summary callbacks",  # our RichModelSummary, as configured
        "TPU available:",  # never on the machines this template targets; GPU availability stays shown
        "Restoring states from the checkpoint path at",  # said again by "Restored all states from ..."
        "`weights_only` was not set",  # Lightning's own checkpoints, loaded as it chooses
        "`isinstance(treespec, LeafSpec)` is deprecated",  # Lightning 2.6 on torch 2.14, at every run
        "Directory watcher advancing",  # TensorBoard's reader, file by file (a notebook reading a run's curves)
        "No path found after",  # and at its last file
    )

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(noise in message for noise in self.NOISE)


def adopt_lightning_loggers() -> None:
    """Send Lightning's records through the handlers already configured (Hydra's: these filters, the log
    files). Lightning gives its loggers console handlers of their own when it is imported, and the
    entry points import it after Hydra has configured logging (the config is checked first): left
    there, those would print every record a second time, unfiltered."""
    if not logging.getLogger().handlers:
        return  # nothing configured (a plain Python session): Lightning's own handlers are all there is
    for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.propagate = True


def quiet_console() -> None:
    """The console of ``train.py`` for a process Hydra's logging did not set up (a notebook, a script that
    calls ``train(cfg)``): records of rank 0 without the noise (conf/hydra/default.yaml's filters), Python
    warnings among them, on stdout; no log file. Called again, it replaces its handler (a re-run cell)."""
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("[%(name)s][%(levelname)s] - %(message)s"))
    handler.addFilter(RankZeroFilter())
    handler.addFilter(DropNoise())
    root = logging.getLogger()
    root.handlers = [handler]
    root.setLevel(logging.INFO)
    adopt_lightning_loggers()  # if Lightning is imported already; imported later, it leaves the root's to us
