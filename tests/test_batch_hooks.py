"""Lightning calls a callback's batch hooks only where its class implements them."""

from collections import Counter
from pathlib import Path

import lightning as L
from lightning.pytorch.callbacks import TQDMProgressBar

from mnistlab.runtime.training import batch_hooks
from mnistlab.tasks import train

from composing import SHORT, compose_config

CALLS: Counter[str] = Counter()


class Counting(L.Callback):
    """Implements two batch hooks; inherits the rest."""

    def on_train_batch_end(self, *args: object) -> None:
        CALLS["on_train_batch_end"] += 1

    def on_before_zero_grad(self, *args: object) -> None:
        CALLS["on_before_zero_grad"] += 1


class Bar(TQDMProgressBar):
    """A subclass that adds a hook of its own to those of a library callback."""

    def on_before_backward(self, *args: object) -> None:
        CALLS["bar on_before_backward"] += 1


def test_only_the_hooks_a_callback_implements_stay() -> None:
    counting, bar, empty = Counting(), Bar(), L.Callback()
    batch_hooks.skip_empty([counting, bar, empty])
    assert [h for h in batch_hooks.BATCH_HOOKS if callable(getattr(counting, h))] == [
        "on_before_zero_grad",
        "on_train_batch_end",
    ]
    assert {"on_before_backward", "on_train_batch_end", "on_validation_batch_end"} <= {
        h for h in batch_hooks.BATCH_HOOKS if callable(getattr(bar, h))
    }
    assert all(getattr(empty, h) is None for h in batch_hooks.BATCH_HOOKS)
    assert callable(empty.on_train_epoch_end)  # epoch and fit hooks are left alone


def test_a_run_calls_every_implemented_batch_hook_at_every_step(tmp_path: Path) -> None:
    CALLS.clear()
    cfg = compose_config(
        "train",
        tmp_path,
        [
            *SHORT,
            "+callbacks.counting._target_=test_batch_hooks.Counting",
            "callbacks.progress_bar._target_=test_batch_hooks.Bar",
        ],
    )
    train(cfg)
    assert CALLS == {"on_train_batch_end": 20, "on_before_zero_grad": 20, "bar on_before_backward": 20}
