"""The search space in Hydra's override syntax (``hydra.sweeper.params``, and sweeps given on the command
line), as Optuna distributions: ``choice(a, b)`` is categorical, ``range(lo, hi, step)`` a stepped int
(or float) range with ``hi`` excluded as in Python, ``interval(lo, hi)`` continuous,
``tag(log, interval(...))`` on a log scale. Anything else is a fixed override of every trial."""

from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ChoiceSweep, IntervalSweep, Override, RangeSweep, Transformer


def parse(overrides: list[str]) -> tuple[dict[str, Any], list[str]]:
    """The distributions by key, and the overrides that are no sweep (in their order)."""
    space, fixed = {}, []
    for override in OverridesParser.create().parse_overrides(overrides):
        if override.is_sweep_override():
            space[override.get_key_element()] = distribution(override)
        else:
            fixed.append(override.input_line or f"{override.get_key_element()}={override.get_value_element_as_str()}")
    return space, fixed


def distribution(override: Override) -> Any:
    from optuna import distributions as d

    value = override.value()
    if isinstance(value, ChoiceSweep) or (isinstance(value, RangeSweep) and value.shuffle):
        choices: list[Any] = list(override.sweep_iterator(transformer=Transformer.encode))
        return d.CategoricalDistribution(choices)
    if isinstance(value, RangeSweep):
        values: list[Any] = list(override.sweep_iterator())  # Python's range: the stop is left out
        step = values[1] - values[0] if len(values) > 1 else 1
        if all(isinstance(x, int) for x in values):
            return d.IntDistribution(values[0], values[-1], step=step)
        return d.FloatDistribution(values[0], values[-1], step=step)
    if isinstance(value, IntervalSweep):  # Hydra reads both ends as floats: an int interval is a range(...)
        assert value.start is not None and value.end is not None  # the grammar requires both
        return d.FloatDistribution(value.start, value.end, log="log" in value.tags)
    raise ValueError(f"{override.input_line}: glob() sweeps have no Optuna distribution; use choice(...)")
