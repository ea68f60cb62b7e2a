"""No dependency specifier of pyproject.toml admits a release known to be malicious, and uv.lock (the exact,
hashed versions CI installs) is the lock of this pyproject.toml; the environment holds its packages compiled."""

import importlib.util
import sys
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

from composing import ROOT

# (package, version, advisory): releases that must never install.
KNOWN_BAD = [
    ("lightning", "2.6.2", "GHSA-w37p-236h-pfx3: a credential-stealing payload run on import"),
    ("lightning", "2.6.3", "GHSA-w37p-236h-pfx3: a credential-stealing payload run on import"),
]


def test_no_specifier_admits_a_known_bad_release() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    specifiers = [*project["dependencies"], *(d for extra in project["optional-dependencies"].values() for d in extra)]
    requirements = [Requirement(text) for text in specifiers]
    assert any(r.name == "lightning" for r in requirements)  # the check reads the real list
    for name, version, why in KNOWN_BAD:
        for requirement in requirements:
            if requirement.name == name:
                assert version not in requirement.specifier, f"{requirement} admits {name} {version} ({why})"


def _locked(lock: Path = ROOT / "uv.lock") -> list[dict]:
    return tomllib.loads(lock.read_text())["package"]


def _locks() -> list:
    """(pyproject.toml's text, its lock): this project's; in the template, also the lock of a project made
    without the example (generator/lock.py makes both), whose pyproject the rename writes."""
    locks = [pytest.param((ROOT / "pyproject.toml").read_text(), ROOT / "uv.lock", id="uv.lock")]
    if (script := ROOT / "generator" / "lock.py").is_file():
        spec = importlib.util.spec_from_file_location("generator_lock", script)
        assert spec and spec.loader
        sys.path.insert(0, str(script.parent))  # it imports the rename beside it
        try:
            generator = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(generator)
        finally:
            sys.path.remove(str(script.parent))
        blank = generator.blank_pyproject((ROOT / "pyproject.toml").read_text())
        locks.append(pytest.param(blank, ROOT / "generator" / "blank" / "uv.lock", id="generator/blank/uv.lock"))
    return locks


@pytest.mark.parametrize(("pyproject", "lock"), _locks())
def test_the_lock_holds_what_pyproject_asks_for(pyproject: str, lock: Path) -> None:
    """The lock was made from this pyproject.toml (``uv lock``, here ``python generator/lock.py``, after any
    change of a specifier): CI's ``uv sync --locked`` refuses a stale one too, this says so in the fast tier,
    offline."""
    project = tomllib.loads(pyproject)["project"]
    asked = {_key(Requirement(text)) for text in project["dependencies"]}
    for extra, texts in project["optional-dependencies"].items():
        asked |= {_key(Requirement(f"{text}; extra == '{extra}'")) for text in texts}
    (own,) = [package for package in _locked(lock) if package["name"] == canonicalize_name(project["name"])]
    locked = {
        (d["name"], str(SpecifierSet(d.get("specifier", ""))), tuple(sorted(d.get("extras", []))), d.get("marker", ""))
        for d in own["metadata"]["requires-dist"]
    }
    assert locked == asked, f"run `uv lock`: {sorted(asked ^ locked)[:5]}"


def _key(requirement: Requirement) -> tuple[str, str, tuple[str, ...], str]:
    name = canonicalize_name(requirement.name)
    marker = str(requirement.marker).replace('"', "'") if requirement.marker else ""
    return (name, str(SpecifierSet(str(requirement.specifier))), tuple(sorted(requirement.extras)), marker)


def test_every_locked_file_has_its_hash_and_no_known_bad_release_is_locked() -> None:
    bad = {(name, version) for name, version, _ in KNOWN_BAD}
    for package in _locked():
        assert (package["name"], package["version"]) not in bad, f"{package['name']} {package['version']} is locked"
        files = [*package.get("wheels", []), *([package["sdist"]] if "sdist" in package else [])]
        assert all(file["hash"].startswith("sha256:") for file in files), package["name"]
        assert files or "editable" in package["source"] or "virtual" in package["source"], package["name"]


@pytest.mark.parametrize("package", ["torch", "lightning", "torchmetrics", "hydra"])
def test_the_environment_holds_its_packages_compiled(package: str) -> None:
    """pyproject.toml's [tool.uv] compile-bytecode: uv sync compiles what it installs, so that no process
    compiles torch and Lightning again where Python may not write its cache (PYTHONDONTWRITEBYTECODE=1, as
    on CI's machines; what it costs: docs/install.md)."""
    folder = Path(importlib.util.find_spec(package).origin).parent  # found, not imported
    sources = list(folder.rglob("*.py"))
    missing = [path for path in sources if not Path(importlib.util.cache_from_source(path)).is_file()]
    missing = [path for path in missing if _compiles(path)]  # not those of another Python (py312_intrinsics.py)
    assert not missing, f"{len(missing)} of {len(sources)} modules of {package} not compiled ({missing[0]}): uv sync"


def _compiles(source: Path) -> bool:
    try:
        compile(source.read_bytes(), str(source), "exec")
    except SyntaxError:
        return False
    return True
