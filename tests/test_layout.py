"""The package shows its seams: what a user replaces at the top, the machinery in subpackages whose
imports point one way (docs/layout.md; each subpackage's ``__init__.py``). These checks guard the
machinery, never the user: any module a user adds at the top is accepted."""

import ast
import re
from pathlib import Path

import pytest

import mnistlab

from composing import ROOT, locked_versions

pytestmark = pytest.mark.yours  # reads your task: pytest -m yours (docs/make-it-yours.md)

PACKAGE = Path(mnistlab.__file__).parent
NAME = PACKAGE.name
# What each subpackage may import of this package besides itself; the top may import anything.
MAY_IMPORT = {"runtime": set(), "sweeps": {"runtime"}, "trained": {"runtime"}, "example": {"runtime", "trained"}}
OPTIONAL = {"example"}  # the example's own: a project generated without it has none
# runtime/'s subpackages, bottom first: each may import those before it, never one after (docs/layout.md).
RUNTIME_LAYERS = ("run", "config", "distributed", "data", "checkpointing", "reporting", "training")


def _imports(path: Path, within: ast.AST | None = None) -> set[str]:
    """The modules of this package that ``path`` imports, anywhere in it (a function's import too)."""
    found = set()
    for node in ast.walk(within or ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            assert node.level == 0, f"{path}: a relative import (the package imports by its name)"
            found |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    return {name for name in found if name == NAME or name.startswith(f"{NAME}.")}


def test_the_top_of_the_package_holds_the_story_of_a_run_beside_the_users_modules() -> None:
    """Whatever the user adds, renames or removes at the top (network, module, data module, modules of
    their own) is theirs: only ``tasks.py`` and the machinery's subpackages are required there."""
    assert {"tasks.py", *MAY_IMPORT.keys() - OPTIONAL} <= {path.name for path in PACKAGE.iterdir()}


@pytest.mark.parametrize("subpackage", sorted(s for s in MAY_IMPORT if (PACKAGE / s).is_dir()))
def test_a_subpackage_imports_only_what_its_docstring_allows(subpackage: str) -> None:
    folder = PACKAGE / subpackage
    assert ast.get_docstring(ast.parse((folder / "__init__.py").read_text())), "say what it holds and may import"
    allowed = {subpackage} | MAY_IMPORT[subpackage]
    for path in sorted(folder.rglob("*.py")):
        for name in _imports(path):
            part = name.split(".")[1] if "." in name else ""
            assert part in allowed, f"{path.relative_to(PACKAGE)} imports {name}; {subpackage}/ may import {allowed}"


def _runtime_layer(name: str) -> str | None:
    parts = name.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "runtime" else None


@pytest.mark.parametrize("layer", RUNTIME_LAYERS)
def test_runtimes_subpackages_import_only_the_ones_below_them(layer: str) -> None:
    """An arrow back up (``run/`` importing ``checkpointing/``) would make a cycle: refused here."""
    assert {p.name for p in (PACKAGE / "runtime").iterdir() if p.is_dir() and p.name != "__pycache__"} == set(
        RUNTIME_LAYERS
    ), "a new subpackage of runtime/ takes its place in RUNTIME_LAYERS"
    below = set(RUNTIME_LAYERS[: RUNTIME_LAYERS.index(layer) + 1])
    for path in sorted((PACKAGE / "runtime" / layer).rglob("*.py")):
        for name in _imports(path):
            assert _runtime_layer(name) in below, f"{path.relative_to(PACKAGE)} imports {name}: above runtime/{layer}/"


def test_no_import_inside_a_function_reaches_another_subpackage() -> None:
    """An import put inside a function to dodge a cycle hides an arrow; one of the module's own subpackage
    (imported late for speed: torch, matplotlib) is the only kind allowed."""
    for path in sorted(path for sub in MAY_IMPORT for path in (PACKAGE / sub).rglob("*.py")):
        home = ".".join(path.relative_to(PACKAGE.parent).parts[: 3 if path.parts[-3] == "runtime" else 2])
        for function in ast.walk(ast.parse(path.read_text())):
            if isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
                for name in _imports(path, ast.Module(body=function.body, type_ignores=[])):
                    assert name.startswith(home), f"{path.relative_to(PACKAGE)}: {function.name} imports {name}"


def test_no_folder_of_the_machinery_holds_more_than_ten_modules() -> None:
    """A folder's name tells its concern: past ten modules it holds several (runtime/ is grouped by them)."""
    folders = {path.parent for sub in MAY_IMPORT for path in (PACKAGE / sub).rglob("*.py")}
    crowded = {f.relative_to(PACKAGE).as_posix(): n for f in folders if (n := len(list(f.glob("*.py"))) - 1) > 10}
    assert crowded == {}  # modules besides __init__.py


def test_no_two_classes_of_the_package_share_a_name() -> None:
    seen: dict[str, str] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and node.col_offset == 0:
                where = path.relative_to(PACKAGE).as_posix()
                assert node.name not in seen, f"class {node.name} in {where} and in {seen[node.name]}"
                seen[node.name] = where


FRAMEWORKS = ("lightning", "torch", "ray", "optuna", "hydra")
INTERNALS = PACKAGE / "runtime" / "run" / "internals.py"


def _private_uses(path: Path) -> list[str]:
    """What ``path`` uses of another package's private parts: ``x._name`` on anything but ``self``/``cls``
    (``_target_`` is Hydra's public key), and ``_name`` imported from a framework."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            owner = node.value.id if isinstance(node.value, ast.Name) else ""
            if owner not in {"self", "cls", "os", "sys"} and node.attr != "_target_":
                found.append(f"line {node.lineno}: .{node.attr}")
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(FRAMEWORKS):
            found += [f"line {node.lineno}: {node.module}.{a.name}" for a in node.names if a.name.startswith("_")]
            if any(part.startswith("_") for part in (node.module or "").split(".")):
                found.append(f"line {node.lineno}: {node.module}")
    return found


def test_the_frameworks_private_parts_are_used_in_one_module() -> None:
    """A Lightning or torch release that moves one breaks one module (runtime/run/internals.py), which says
    why each is used and the version it was read from; the canary (.ci/frameworks-next) tries the next."""
    plugins = PACKAGE.parent / "hydra_plugins"
    for path in sorted([*PACKAGE.rglob("*.py"), *plugins.rglob("*.py")]):
        if path != INTERNALS:
            assert _private_uses(path) == [], f"{path.relative_to(PACKAGE.parent)}: use runtime/run/internals.py"
    read_from = re.search(r"Read from: (.+) \(uv.lock\)", INTERNALS.read_text())
    assert read_from, "say which versions the private parts were read from"
    locked = locked_versions(ROOT)
    for name, version in (entry.split() for entry in read_from[1].split(", ")):
        assert version in locked[name], f"internals.py was read from {name} {version}; the lock holds {locked[name]}"


def _module_level_imports(path: Path) -> set[str]:
    """The modules of this package that importing ``path`` imports in turn: its imports outside functions,
    each with the packages around it (``a.b.c`` imports ``a`` and ``a.b`` first)."""
    found: set[str] = set()
    pending: list[ast.AST] = [ast.parse(path.read_text())]
    while pending:
        for node in ast.iter_child_nodes(pending.pop()):
            if isinstance(node, ast.Import | ast.ImportFrom):
                for name in _imports(path, node):
                    parts = name.split(".")
                    found |= {".".join(parts[:i]) for i in range(1, len(parts) + 1)}
            elif not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                pending.append(node)
    modules = {_module_name(p) for p in PACKAGE.rglob("*.py")}
    return found & modules


def _module_name(path: Path) -> str:
    return ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__")


def test_no_two_modules_import_each_other_at_import_time() -> None:
    """A cycle among modules (``failures`` importing ``run_folder``, which imports ``failures``) fails on
    the one import order that meets it first, in a user's process and not in the suite's: refused here."""
    # A module's own packages are initialised before it whatever it imports: no edge back to them.
    graph = {
        (name := _module_name(p)): {m for m in _module_level_imports(p) if not f"{name}.".startswith(f"{m}.")}
        for p in PACKAGE.rglob("*.py")
    }
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> None:
        if module in path:
            pytest.fail(f"import cycle: {' -> '.join([*path[path.index(module) :], module])}")
        if module in done:
            return
        for imported in sorted(graph.get(module, ())):
            visit(imported, [*path, module])
        done.add(module)

    for module in sorted(graph):
        visit(module, [])
