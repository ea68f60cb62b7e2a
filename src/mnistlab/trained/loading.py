"""A trained network out of a checkpoint, as a plain ``nn.Module`` (no Lightning): what prediction
and export use. The checkpoint carries the run's resolved config, so the network is rebuilt exactly
as it was trained, whatever the overrides of that run were.

A checkpoint is data (docs/reliability.md, Trust): it is read with ``weights_only=True``, and its config may only
name classes of the trusted modules (this package and ``torch.nn``, or conf/trust.yaml's
``trusted_modules``), checked before anything is imported or built.
Rebuilding the network from ``conf/`` instead would be as safe but would lose the run's overrides
(``model.net.hidden=64``): a checkpoint of another width would not load.
"""

from collections.abc import Sequence
from typing import Any, TypeGuard

from hydra.errors import InstantiationException
from hydra.utils import get_class, instantiate
from torch import nn

from mnistlab.runtime.checkpointing.checkpoint_io import fit_weights
from mnistlab.runtime.config import hydra_versions
from mnistlab.runtime.run.failures import InputError

PACKAGE = __name__.partition(".")[0]
# Where a checkpoint's network and data module may come from (export checks on the test data it serves),
# unless the entry point's config names others (conf/trust.yaml).
TRUSTED = (PACKAGE, "torch.nn")


def network(checkpoint: dict[str, Any], trusted: Sequence[str] = TRUSTED) -> nn.Module:
    """The checkpoint's network (``model.net`` of its run), with its weights, in eval mode."""
    modules = _prefixes(trusted)
    net = _build(checked(network_config(checkpoint), nn.Module, modules, "model.net"), "model.net", modules)
    weights = {k.removeprefix("net."): v for k, v in checkpoint["state_dict"].items() if k.startswith("net.")}
    fit_weights(net, weights, "the checkpoint", "its saved config and its weights disagree (a damaged or altered file)")
    net.load_state_dict(weights)
    return net.eval()


def network_config(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """The checkpoint's ``model.net`` config, as data (exported files carry it)."""
    return _config(checkpoint, "model", "net")


def datamodule(checkpoint: dict[str, Any], trusted: Sequence[str] = TRUSTED, **given: Any) -> Any:
    """The checkpoint's data module (``data`` of its run), with ``given`` arguments replacing its own."""
    from lightning import LightningDataModule

    modules = _prefixes(trusted)
    data = checked(_config(checkpoint, "data"), LightningDataModule, modules, "data")
    return _build(data, "data", modules, **{key: value for key, value in given.items() if key in data})


def _prefixes(trusted: Sequence[str]) -> tuple[str, ...]:
    return tuple(f"{module.rstrip('.')}." for module in trusted)


def normalization(checkpoint: dict[str, Any]) -> tuple[float, float]:
    """The pixel mean and standard deviation (0..1 scale) the network was trained with."""
    data = _config(checkpoint, "data")
    mean, std = data.get("mean"), data.get("std")
    if not (_is_number(mean) and _is_number(std)):
        raise InputError(f"the checkpoint's data.mean and data.std are not numbers ({mean!r}, {std!r})")
    return float(mean), float(std)


def _is_number(value: Any) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


def checked(node: Any, base: type, modules: tuple[str, ...], where: str) -> Any:
    """``node``, once every ``_target_`` in it names a subclass of ``base`` defined in ``modules``.

    The module's name is checked before it is imported (importing runs its code), and the class's
    own module after (``mnistlab.x.subprocess.Popen`` names a class of ``subprocess``). Functions
    (``torch.load``, ``os.system``) are refused: they are not classes.
    """
    if isinstance(node, list):
        return [checked(item, nn.Module, modules, f"{where}[{i}]") for i, item in enumerate(node)]
    if not isinstance(node, dict):
        return node
    target = node.get("_target_")
    if target is not None:
        if not isinstance(target, str) or not target.startswith(modules):
            raise _refused(where, target, base, modules)
        try:
            cls = get_class(target)
        except Exception as err:  # not a class, or no such one: Hydra raises ValueError or ImportError
            raise _refused(where, target, base, modules) from err
        if not issubclass(cls, base) or not f"{cls.__module__}.".startswith(modules):
            raise _refused(where, target, base, modules)
    # Arguments that are nodes of their own (layers of a network) are built too: checked the same way.
    return {key: checked(value, nn.Module, modules, f"{where}.{key}") for key, value in node.items()}


def _build(node: dict[str, Any], where: str, trusted: tuple[str, ...], **given: Any) -> Any:
    try:  # Hydra 1.4 is held to the same modules, not to the wider list conf/ may name
        with hydra_versions.allowed([f"{prefix}*" for prefix in trusted], only=True):
            return instantiate(node, **given)
    except InstantiationException as err:
        if isinstance(err.__cause__, InputError):
            raise err.__cause__ from None
        raise InputError(f"the checkpoint's {where} cannot be built: {' '.join(str(err).split())}") from err


def _refused(where: str, target: Any, base: type, modules: tuple[str, ...]) -> InputError:
    return InputError(
        f"the checkpoint's {where} names _target_={target!r}, which is not a {base.__name__} class of "
        f"{' or '.join(m.rstrip('.') for m in modules)}: a checkpoint is data and may not choose code to run "
        "(docs/reliability.md, Trust)"
    )


def _config(checkpoint: dict[str, Any], *keys: str) -> dict[str, Any]:
    node: Any = checkpoint.get("config")
    if node is None:
        raise InputError("the checkpoint holds no 'config' (not written by train.py): cannot tell its network")
    for key in keys:
        node = node.get(key) if isinstance(node, dict) else None
    if not isinstance(node, dict):
        raise InputError(f"the checkpoint's config has no {'.'.join(keys)} section")
    return node
