"""Callbacks' batch hooks that do nothing are not called.

Lightning calls each of its per-batch hooks (six a training step) on every callback in the list,
whether the callback's class implements it or inherits ``Callback``'s empty method, and formats a
profiler label for each call, a dict's repr for checkpoint and early-stopping callbacks, even when
nothing profiles. With the eight default callbacks that is 48 calls a step of which 5 do something;
the other 43 cost about 50 us a step on this machine's CPU (``benchmarks/speed.py``), 6% of the
model's whole step. Lightning's dispatch skips a hook that is not callable, so setting the inherited
empty ones to ``None`` on each callback keeps every call that does something and drops the rest.
"""

from collections.abc import Iterable

import lightning as L

BATCH_HOOKS = (
    "on_train_batch_start",
    "on_before_backward",
    "on_after_backward",
    "on_before_optimizer_step",
    "on_before_zero_grad",
    "on_train_batch_end",
    "on_validation_batch_start",
    "on_validation_batch_end",
    "on_test_batch_start",
    "on_test_batch_end",
    "on_predict_batch_start",
    "on_predict_batch_end",
)


def skip_empty(callbacks: Iterable[L.Callback]) -> None:
    """On each callback, mark the batch hooks its class inherits unchanged from ``Callback`` as absent."""
    for callback in callbacks:
        for hook in BATCH_HOOKS:
            if getattr(type(callback), hook) is getattr(L.Callback, hook):
                setattr(callback, hook, None)  # Lightning's dispatch: `if callable(fn): fn(...)`
