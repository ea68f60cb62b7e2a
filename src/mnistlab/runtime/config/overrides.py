"""The command line's overrides, said in one line where Hydra would not.

``key=value`` for a key the config lacks (``data.batch_sise=32``) gets Hydra's six lines ending in
"Key 'batch_sise' is not in struct", advising ``+data.batch_sise=32``: appending the typo. Here the
same override is checked as its ``+`` form is (``schema.check``, which reads each ``_target_``'s own
signature), so it gets the same one line, naming the closest key: "data.batch_sise is not an argument
of ...: did you mean data.batch_size?". Composing costs 0.1 s, and only a command line with a dotted
``key=value`` pays it; a start Hydra would accept is left to Hydra.
"""

from collections.abc import Sequence
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import ConfigCompositionException, HydraException
from omegaconf import DictConfig
from omegaconf.errors import ConfigAttributeError, ConfigKeyError

from mnistlab.runtime.config import hydra_versions, schema
from mnistlab.runtime.run.failures import InputError


def refuse_unknown_keys(argv: Sequence[str], conf: Path, config_name: str, model: type[schema.Node]) -> None:
    """Raise the ``+`` form's one line for the first ``key=value`` whose key the config composed from ``conf``
    lacks; ``model``: the schema the entry point checks (``schema.TrainConfig``)."""
    if any(arg.startswith("-") and arg not in ("-m", "--multirun") for arg in argv[1:]):
        return  # another config (--config-name, -cp), a shell completion, --help...: Hydra's own business
    overrides = [first_value(arg) for arg in argv[1:] if not arg.startswith("-") and _for_the_job(arg)]
    if not any("." in arg.partition("=")[0] and arg[:1] not in "+~" for arg in overrides):
        return
    try:
        _compose(conf, config_name, overrides)
        return
    except Exception as err:  # noqa: BLE001 (any other problem: Hydra's own message says it)
        missing = err.__cause__
        if not isinstance(err, ConfigCompositionException) or not isinstance(
            missing, ConfigAttributeError | ConfigKeyError
        ):
            return
    if not missing.full_key:
        return
    given = [arg for arg in overrides if arg.partition("=")[0] == missing.full_key]
    if not given:
        return
    try:
        # paths.output_dir is Hydra's run folder, which only a run has: any path will do for the check
        plus = [f"+{arg}" if arg == given[-1] else arg for arg in overrides]
        cfg = _compose(conf, config_name, [*plus, "paths.output_dir=checked"])
    except HydraException:
        return
    schema.check(cfg, model)  # the + form's line: not an argument of the class, did you mean...
    parent, _, name = str(missing.full_key).rpartition(".")
    raise InputError(f"{given[-1]}: {parent or 'the config'} has no key {name}; to add one, write +{given[-1]}")


def first_value(override: str) -> str:
    """``key=a,b`` (or ``choice(a,b)``, ``range(...)``) as a sweep's first job has it: ``key=a``; ``interval(a,b)``:
    ``key=a``."""
    try:
        parsed = OverridesParser.create().parse_override(override)
    except HydraException:
        return override  # Hydra reports it
    if not parsed.is_sweep_override():
        return override
    try:
        value = next(iter(parsed.sweep_string_iterator()))
    except HydraException:  # interval(a, b), Optuna's: no values to list; its lower end is one of its values
        value = str(getattr(parsed.value(), "start", ""))
    return f"{parsed.get_key_element()}={value}"


def _for_the_job(override: str) -> bool:
    """Hydra's own settings shape how jobs run, not what a job is; but for where configs are found."""
    key = override.lstrip("+~").partition("=")[0]
    return not key.startswith("hydra") or key == "hydra.searchpath"


def _compose(conf: Path, config_name: str, overrides: list[str]) -> DictConfig:
    with initialize_config_dir(config_dir=str(conf.resolve()), job_name=config_name, **hydra_versions.BASE):
        return compose(config_name, overrides=overrides)
