"""No dependency specifier of pyproject.toml admits a release known to be malicious."""

import tomllib
from packaging.requirements import Requirement

from conftest import ROOT

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
