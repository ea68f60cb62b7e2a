"""The ranges of numbers that a class's signature does not state.

``signatures.py`` reads each node's types from its class's source; what ``int`` cannot say
(``max_epochs`` is at least -1, a learning rate above 0) Lightning, torch and Ray check only once they are
imported and building (seconds later, in their own words), or not at all: ``accumulate_grad_batches=0``
fails mid-run, ``lr=0`` trains nothing. Listed here, by the class as conf/ names it (its subclasses that
keep its constructor included) or by a package (each class in it), each range is checked with the types,
before torch loads. tests/test_schema.py fails when a class listed here no longer takes the argument (a
release renamed it).
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Range:
    description: str  # what is allowed, as the refusal says it: "at least -1"
    numbers: Callable[[int | float], bool]  # whether a number (never a bool) is in range
    schema: dict[str, Any]  # the same range in JSON Schema, for editors (json_schemas.py; a test checks they agree)

    def fits(self, value: object) -> bool:
        if isinstance(value, bool) or not isinstance(value, int | float):
            return True  # other values: the annotation's business
        return self.numbers(value)


def at_least(low: int) -> Range:
    return Range(f"at least {low}", lambda value: value >= low, {"minimum": low})


POSITIVE = Range("greater than 0", lambda value: value > 0, {"exclusiveMinimum": 0})
# Lightning's limit_*_batches and overfit_batches: a float is a fraction of the batches, an int a count.
FRACTION_OR_COUNT = Range(
    "a fraction from 0.0 to 1.0 or a count of at least 0",
    lambda value: 0 <= value <= 1 if isinstance(value, float) else value >= 0,
    # JSON Schema's "integer" takes 2.0 too: a whole float is read as a count there (YAML keeps 2.0 a float)
    {"anyOf": [{"type": "integer", "minimum": 0}, {"minimum": 0, "maximum": 1}]},
)
DEVICES = Range(
    "at least 1, or -1 (all of them)",
    lambda value: value >= 1 or value == -1,
    {"anyOf": [{"minimum": 1}, {"const": -1}]},
)

RANGES: dict[str, dict[str, Range]] = {
    "lightning.pytorch.Trainer": {
        # refused by Lightning when built:
        "devices": DEVICES,
        "num_nodes": at_least(1),
        "max_epochs": at_least(-1),  # -1: no limit
        "max_steps": at_least(-1),
        "limit_train_batches": FRACTION_OR_COUNT,
        "limit_val_batches": FRACTION_OR_COUNT,
        "limit_test_batches": FRACTION_OR_COUNT,
        "limit_predict_batches": FRACTION_OR_COUNT,
        "overfit_batches": FRACTION_OR_COUNT,
        # taken by Lightning, then meaningless or a failure mid-run:
        "min_epochs": at_least(0),
        "log_every_n_steps": at_least(1),
        "check_val_every_n_epoch": at_least(1),
        "num_sanity_val_steps": at_least(-1),  # -1: all of them
        "accumulate_grad_batches": at_least(1),
    },
    "lightning.pytorch.callbacks.ModelCheckpoint": {
        "save_top_k": at_least(-1),  # -1: all of them
        "every_n_epochs": at_least(0),  # 0: never
        "every_n_train_steps": at_least(0),
    },
    "lightning.pytorch.callbacks.EarlyStopping": {"patience": at_least(0)},  # taken, and stops at once
    "lightning.pytorch.callbacks.EMAWeightAveraging": {  # taken, then an average of nothing or of no change
        "decay": Range(
            "between 0 and 1, both excluded",
            lambda value: 0 < value < 1,
            {"exclusiveMinimum": 0, "exclusiveMaximum": 1},
        ),
        "update_every_n_steps": at_least(1),  # 0: never updated, silently
        "update_starting_at_step": at_least(0),
        "update_starting_at_epoch": at_least(0),
    },
    "torch.optim": {"lr": POSITIVE},  # every optimizer of torch: 0 is taken, and trains nothing
    "ray.train.ScalingConfig": {"num_workers": at_least(1)},
    "mnistlab.runtime.training.stopping.SafeStop": {"check_every_n_steps": at_least(1)},
    "mnistlab.runtime.reporting.pictures.TestPictures": {"misclassified": at_least(0)},
}
