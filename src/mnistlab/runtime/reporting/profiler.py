"""The trainer's profiler when none is asked for (``trainer.profiler``; ``debug=profiler`` picks a real one).

Lightning's own "no profiler" (``PassThroughProfiler``) still opens a generator-based context manager
around every hook it calls: 68 a training step with the default callbacks, about 0.6 us each on this
CPU (``benchmarks/speed.py --profile``). This one hands back a single reusable ``nullcontext``.
"""

from contextlib import AbstractContextManager, nullcontext

from lightning.pytorch.profilers import PassThroughProfiler

_NOTHING = nullcontext()


class NoProfiler(PassThroughProfiler):
    # A plain context manager where Lightning's is generator-based: the point of this class.
    def profile(self, action_name: str) -> AbstractContextManager[None]:  # type: ignore[override]
        return _NOTHING
