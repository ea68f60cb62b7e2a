"""The Hydra the lock holds (1.3) and its next release (1.4, .ci/hydra-next) run the project alike: what
conf/ names is what Hydra 1.4 is told it may call, and train(cfg) says so itself."""

import warnings
from contextlib import nullcontext
from pathlib import Path

import yaml

from mnistlab.runtime.config import hydra_versions
from mnistlab.tasks import train

from composing import ROOT, SUITE_MODULES, compose_config


def _targets(node: object) -> list[str]:
    if isinstance(node, dict):
        own = [node["_target_"]] if isinstance(node.get("_target_"), str) else []
        return own + [target for value in node.values() for target in _targets(value)]
    if isinstance(node, list):
        return [target for value in node for target in _targets(value)]
    return []


def _whitelisted(target: str) -> bool:
    return any(
        target.startswith(pattern[:-1]) if pattern.endswith(".*") else target == pattern
        for pattern in hydra_versions.TARGETS
    )


def test_every_target_conf_names_is_one_hydra_may_call() -> None:
    """A config of yours that names a class of another library (timm.create_model) fails here until that
    library is in hydra_versions.TARGETS: Hydra 1.4 would refuse to call it."""
    named = {
        f"{path.relative_to(ROOT)}: {target}"
        for path in (ROOT / "conf").rglob("*.yaml")
        for target in _targets(yaml.safe_load(path.read_text()))
    }
    assert named, "conf/ names no _target_"
    assert [entry for entry in sorted(named) if not _whitelisted(entry.split(": ")[1])] == []


def test_train_called_directly_gives_hydra_its_whitelist_itself(tmp_path: Path) -> None:
    """As from a notebook, with no Hydra main around it: under Hydra 1.4 the caller here names only the
    suite's own modules, so the project's packages (its trainer, callbacks, loggers) are allowed by
    train(cfg) itself, and nothing warns. Hydra 1.3 has nothing to warn of; .ci/hydra-next runs this on 1.4."""
    cfg = compose_config("train", tmp_path, ["debug=fdr", "logger=none"])
    outside = nullcontext()
    if hydra_versions.HYDRA_1_4:
        outside = hydra_versions.allowed(SUITE_MODULES, only=True)
    with outside, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        metrics = train(cfg)
    assert metrics, "train(cfg) returned no metric"
    hydra_said = [str(w.message) for w in caught if "whitelist" in str(w.message) or "resolver" in str(w.message)]
    assert hydra_said == []
