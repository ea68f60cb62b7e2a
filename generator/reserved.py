"""Writes ``generator/reserved_packages.yml``: the names a generated project's package may not take, because
importing it would shadow something the project imports. Run it in the template's dev environment after a
change of dependencies (``pip install -e ".[dev]"``; ``tests/test_generator.py`` fails until it is run):

    python generator/reserved.py

Python's keywords and standard library (``sys.stdlib_module_names``), and the top-level modules of every
distribution the project's dependencies pull in, extras included, read from the installed metadata."""

import keyword
import re
import sys
from importlib import metadata
from pathlib import Path

import tomllib
from packaging.requirements import Requirement

TEMPLATE = Path(__file__).resolve().parents[1]
FILE = TEMPLATE / "generator" / "reserved_packages.yml"
PACKAGE = re.compile(r"[a-z][a-z0-9_]*")  # the names copier.yml's package question admits at all


def reserved() -> list[str]:
    names = set(keyword.kwlist) | set(sys.stdlib_module_names) | dependency_modules()
    return sorted(name for name in names if PACKAGE.fullmatch(name))


def dependency_modules() -> set[str]:
    """The top-level modules of the installed distributions that pyproject.toml's dependencies need."""
    project = tomllib.loads((TEMPLATE / "pyproject.toml").read_text())["project"]
    extras = [req for group in project["optional-dependencies"].values() for req in group]
    todo = [Requirement(req) for req in [*project["dependencies"], *extras]]
    seen, modules = {project["name"]}, set()
    while todo:
        requirement = todo.pop()
        if requirement.name in seen:
            continue
        seen.add(requirement.name)
        try:
            distribution = metadata.distribution(requirement.name)
        except metadata.PackageNotFoundError:  # another platform's dependency
            continue
        modules |= _top_level(distribution)
        for needed in map(Requirement, distribution.requires or []):
            if needed.marker is None or needed.marker.evaluate({"extra": ""}):
                todo.append(needed)
    return modules


def _top_level(distribution: metadata.Distribution) -> set[str]:
    if listed := distribution.read_text("top_level.txt"):
        return set(listed.split())
    files = [f.parts for f in distribution.files or [] if not f.parts[0].endswith((".dist-info", ".data", ".."))]
    return {parts[0].partition(".")[0] for parts in files if len(parts) > 1 or parts[0].endswith((".py", ".so"))}


def main() -> None:
    names = reserved()
    lines = [
        "# Written by generator/reserved.py: the names a package may not take (copier.yml's package question,",
        "# generator/rename.py). Do not edit: run that script again.",
        "reserved_packages:",
        "  type: yaml",
        "  when: false  # never asked",
        "  default:",
    ]
    FILE.write_text("\n".join([*lines, *(f"    - {name}" for name in names)]) + "\n")
    print(f"{len(names)} names in {FILE.relative_to(TEMPLATE)}")


if __name__ == "__main__":
    main()
