"""What differs between the Hydra the lock holds (1.3) and its next release (1.4, tried by .ci/hydra-next),
in one place: which code a config may run, and how a resolver is registered.

Hydra 1.4 calls a config's ``_target_`` only if trusted code named its package (an execution whitelist;
without one it warns, and Hydra 1.5 will refuse). ``conf/`` and the command line are trusted input here
(docs/reliability.md, Trust), so the whitelist is every package ``conf/`` names: add yours to ``TARGETS``
when a config of yours names a class of another library (``tests/test_hydra_versions.py`` fails until it
does). A checkpoint's config is held to a narrower list, conf/trust.yaml's (``trained/loading.py``).
"""

import functools
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import hydra
import omegaconf
from omegaconf import OmegaConf
from packaging.version import Version

PACKAGE = __name__.partition(".")[0]
# Packages (``name.*``) and single names whose classes and functions conf/ may call.
TARGETS = (f"{PACKAGE}.*", "hydra_plugins.*", "torch.*", "lightning.*", "optuna.*", "ray.train.*", "datetime.timedelta")
HYDRA_1_4 = Version(hydra.__version__) >= Version("1.4.0.dev0")
OMEGACONF_2_4 = Version(omegaconf.__version__) >= Version("2.4.0.dev0")  # Hydra 1.4's
# initialize_config_dir(..., **BASE): Hydra 1.3's defaults are asked for by name; 1.4 deprecates the name.
BASE: dict[str, Any] = {} if HYDRA_1_4 else {"version_base": "1.3"}
# @hydra.main(..., **MAIN): that, and what Hydra's own instantiations (callbacks, launcher, sweeper) and the
# task's may call.
MAIN: dict[str, Any] = BASE | ({"execution_whitelist": list(TARGETS)} if HYDRA_1_4 else {})


def allowed(targets: Sequence[str] = TARGETS, only: bool = False) -> AbstractContextManager[Any]:
    """Hydra 1.4's whitelist for the ``instantiate`` calls, and the partials they return, run within: added
    to the caller's, or, with ``only``, in place of it. Under Hydra 1.3 there is none to set."""
    if not HYDRA_1_4:
        return nullcontext()
    from hydra.utils import execution_whitelist  # type: ignore[attr-defined]  # Hydra 1.4

    return execution_whitelist(list(targets), reset=only)


def register_resolver(name: str, resolver: Callable[..., Any], use_cache: bool = False) -> None:
    """``${name:...}`` in configs; OmegaConf 2.4 (Hydra 1.4's) renamed ``register_new_resolver``."""
    # OmegaConf 2.3's register_resolver is another, deprecated one (its resolvers get strings).
    register = getattr(OmegaConf, "register_resolver" if OMEGACONF_2_4 else "register_new_resolver")
    register(name, resolver, replace=True, use_cache=use_cache)


def plain_partial(node: Any) -> functools.partial:
    """A ``_partial_: true`` config, built once and returned as a plain ``functools.partial``: Hydra's own
    partial checks its target policy again at every call (100 us under Hydra 1.3.8, as much as decoding a
    digit), and a call from a server's thread or worker would meet Hydra 1.4 without the whitelist."""
    from hydra.utils import instantiate

    with allowed():
        built = instantiate(node)
    return functools.partial(built.func, *built.args, **built.keywords)
