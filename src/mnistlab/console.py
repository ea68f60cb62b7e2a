"""The one place that decides which process talks to the console: global rank 0.

Every module logs with plain ``logging``; Hydra's job logging (``conf/hydra/default.yaml``) puts
this filter on the console handler only, so each rank still writes its own log file.
"""

import logging


class RankZeroFilter(logging.Filter):
    """Pass records only on global rank 0 (as Lightning knows it, also under torchrun and SLURM)."""

    def __init__(self) -> None:
        super().__init__()
        # Python warnings go to stderr directly, from every rank; route them through logging too.
        logging.captureWarnings(True)

    def filter(self, record: logging.LogRecord) -> bool:
        # Imported here: Hydra builds this filter before the job runs, and Lightning's import is slow.
        from lightning.fabric.utilities.rank_zero import rank_zero_only

        return getattr(rank_zero_only, "rank", 0) == 0
