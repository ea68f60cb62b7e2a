"""No dependency specifier of pyproject.toml admits a release known to be malicious, and uv.lock (the exact,
hashed versions CI installs) is the lock of this pyproject.toml."""

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


def _locked() -> list[dict]:
    return tomllib.loads((ROOT / "uv.lock").read_text())["package"]


def test_the_lock_holds_what_pyproject_asks_for() -> None:
    """uv.lock was made from this pyproject.toml (``uv lock`` after any change of a specifier): CI's
    ``uv sync --locked`` refuses a stale one too, this says so in the fast tier, offline."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    asked = {_key(Requirement(text)) for text in project["dependencies"]}
    for extra, texts in project["optional-dependencies"].items():
        asked |= {_key(Requirement(f"{text}; extra == '{extra}'")) for text in texts}
    (own,) = [package for package in _locked() if package["name"] == canonicalize_name(project["name"])]
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
