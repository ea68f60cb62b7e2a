"""The generator's rename step: run by copier (``copier.yml``, ``_tasks``) and by cookiecutter's hook
(``generator/cookiecutter/``) in the project they have just written, it turns this template, named
``mnistlab``, into the user's project.

The template's files carry no placeholders, so that it stays a normal project that installs, trains
and passes its tests; the generator copies them as they are and this step renames them: the package
folder and every other path holding the name, the name in their text (imports, ``_target_`` paths in
``conf/``, ``MNISTLAB_*`` environment variables, the pyproject's name and extras), the pyproject's
description and author, and the README's title and first paragraph. With ``--example=False`` it
first leaves the MNIST example out and puts the placeholders of ``generator/blank/`` in its place.
It touches only the files the template holds (``template_files``): in a project's folder, the user's
own files, git-ignored ones and a virtual environment are never read, whatever their names say.
Copier runs it again on both template versions it compares during ``copier update``, and in the
project after writing the new version there, so updates arrive in the renamed files.
"""

import argparse
import json
import keyword
import os
import re
import shutil
import subprocess
import sys
from fnmatch import fnmatch
from pathlib import Path, PurePosixPath

import yaml  # copier's and cookiecutter's own dependency: there wherever this runs

NAME = "mnistlab"
LOCK = "uv.lock"  # the exact, hashed versions `uv sync` installs (README: Set up)
TEMPLATE = Path(__file__).resolve().parents[1]
BLANK = TEMPLATE / "generator" / "blank"  # the placeholders, under the template's names, copied over it
BLANK_REPLACES = [".schemas"]  # folders of generator/blank/ that replace the template's whole (generator/schemas.py)
# An editor's modeline, which a conf/ file holds before its first line of text (json_schemas.MODELINE; the
# project's package cannot be imported here, in copier's environment).
MODELINE = "# yaml-language-server:"
# What belongs to the MNIST example says so itself (src/mnistlab/example/__init__.py): whatever lies in a
# folder named example/, and a file whose first line (after a Hydra "# @package" line; a notebook's: its first
# cell's) carries this mark. The example left out (--example=False), they go.
EXAMPLE_FOLDER = "example"
EXAMPLE_MARK = "Part of the MNIST example"
PLACEHOLDERS = """
**This project starts with placeholders:** `src/{package}/data.py` serves random images of 10 classes
and `src/{package}/network.py` is a small MLP for them. Replace them with your data module and network,
and `conf/data/` and `conf/model/` with them (their keys are checked against your classes' own arguments):
docs/make-it-yours.md shows how, step by step. Everything else (training, checkpoints, resume, DDP, SLURM, sweeps, the tests of these) stays as it is.
"""
BLANK_NAMES = {  # renamed with the example left out: the search config and its study (the README's command
    "hparams_search=mnist_optuna      ": "hparams_search=optuna            ",  # first: its comment column stays)
    "mnist_optuna": "optuna",
    "  - decode: digits": "  - decode: npy",  # serve.py: digit images are the example's
    " munge chromium wrk": " munge chromium",  # the serving benchmark's client: the example's alone
    ", Chromium and wrk (the browser tests, the serving benchmark's)": " and Chromium (the docs site's tests)",
    'demo = ["gradio>=6,<7"]  # demo.py: draw a digit in the browser\n': "",  # pyproject.toml: the demo's packages
    '    "gradio_client>=1.5",  # the demo\'s other client\n': "",
    ",serve,demo,loggers,ray,stream]": ",serve,loggers,ray,stream]",
    "      - Performance: example/performance.md\n": "",  # mkdocs.yml: the benchmarks' page
}
TEMPLATE_NAMES = {  # in every project made
    "      - Start your own project: generator.md\n": "",  # mkdocs.yml: a page copier.yml leaves out
    "[//]: # (run by tests/test_generator.py)": "[//]: # (not run: the template's tests write these files into a new project)",
}
BLANK_TEXT = re.compile(r"(?s)<!-- blank: (.*?) -->")  # the README's words for a project without the example


def template_files(template: Path) -> list[str]:
    """The files a render writes, as paths under the template's names: its files in git (a clone, as
    copier and cookiecutter make of a repository), less copier.yml's ``_exclude`` and copier's own
    templates (``*.jinja`` names holding ``{{``)."""
    if (template / ".git").exists():
        listed = subprocess.run(
            ["git", "ls-files", "-z"], cwd=template, capture_output=True, text=True, check=True
        ).stdout.split("\0")
    else:  # a plain folder: what it holds
        listed = [p.relative_to(template).as_posix() for p in template.rglob("*") if p.is_file()]
    exclude = copier_settings(template)["_exclude"]
    return [name for name in listed if name and "{{" not in name and not _excluded(name, exclude)]


def copier_settings(template: Path) -> dict:
    """copier.yml's settings and questions: its documents merged, the ``!include``d ones read in."""

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_constructor("!include", lambda loader, node: yaml.safe_load((template / node.value).read_text()))
    merged: dict = {}
    for document in yaml.load_all((template / "copier.yml").read_text(), Loader=Loader):
        merged |= document or {}
    return merged


def package_problem(package: str) -> str | None:
    """Why ``package`` cannot name a project's package, as copier.yml's question says it; None if it can."""
    if not re.fullmatch(r"[a-z][a-z0-9_]*", package):
        return "a lower-case Python identifier: a letter, then letters, digits or _"
    if len(package) > 64:
        return "at most 64 characters: folders and imports are named after it"
    taken = copier_settings(TEMPLATE)["reserved_packages"]["default"]
    if package in taken or keyword.iskeyword(package) or package in sys.stdlib_module_names:
        return f"{package} is a name Python or a dependency already has: every import of it would fail; choose another"
    return None


def _excluded(name: str, patterns: list[str]) -> bool:
    """gitignore's rule, as copier applies it, for patterns like copier.yml's: one with a slash matches the
    path from the top, one without matches any part of it. Written out because cookiecutter, which runs
    this too, does not install pathspec (copier's matcher)."""
    parts = PurePosixPath(name).parts
    return any(fnmatch(name, p) if "/" in p else any(fnmatch(part, p) for part in parts) for p in patterns)


def rename(root: Path, files: list[str], names: dict[str, str]) -> None:
    """Each of ``names`` (``mnistlab`` -> the package, ...) renamed in the contents and paths of the
    rendered ``files`` only: the user's own files, git-ignored ones and a virtual environment in the
    project's folder are never read. All or nothing: every new path is checked before anything changes."""
    texts, moves = {}, {}
    for name in files:
        path = root / name
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            text = ""  # not text (a picture): nothing to rename inside
        if any(old in text for old in names):
            # uv.lock names packages as uv normalises them: retina-lab for retina_lab.
            texts[path] = _replace(text, names | {NAME: names[NAME].replace("_", "-")} if name == LOCK else names)
        if any(old in name for old in names):
            moves[path] = root / _replace(name, names)
    longest = os.pathconf(root, "PC_NAME_MAX")
    for target in moves.values():
        if too_long := [part for part in target.relative_to(root).parts if len(part.encode()) > longest]:
            raise SystemExit(f"Error: {too_long[0][:60]}... would be longer than a file name may be ({longest} bytes)")
    for path, text in texts.items():
        path.write_text(text)
    for path, target in moves.items():
        target.parent.mkdir(parents=True, exist_ok=True)
        path.replace(target)  # over the user's version: copier update applies their edits afterwards
        _prune(root, path.parent)


def _replace(text: str, names: dict[str, str]) -> str:
    for old, new in names.items():
        text = text.replace(old, new)
    return text


def _prune(root: Path, folder: Path) -> None:
    """Remove ``folder`` and the folders above it that a move or a removal left empty."""
    while folder != root and not any(folder.iterdir()):
        folder.rmdir()
        folder = folder.parent


def describe(root: Path, project: str, package: str, description: str, author: str, email: str, example: bool) -> None:
    """The pyproject's description and author; the README's title and first paragraph."""
    pyproject = root / "pyproject.toml"
    text = re.sub(r'(?m)^description = ".*"$', f"description = {_toml(description)}", pyproject.read_text())
    text = re.sub(r"(?m)^authors = .*\n", "", text)  # copier update runs this step again
    person = ", ".join(f"{key} = {_toml(value)}" for key, value in (("name", author), ("email", email)) if value)
    author_line = f"authors = [{{ {person} }}]\n" if person else ""  # an empty e-mail is no valid one
    pyproject.write_text(text.replace('readme = "README.md"\n', f'readme = "README.md"\n{author_line}', 1))
    readme = root / "README.md"
    # The title and first paragraph end at the first section.
    _, rest = own_text(readme.read_text(), example).split("\n## ", 1)
    intro = f"# {project}\n\n{description}\n\nBuilt on a Lightning + Hydra template for distributed training.\n"
    if not example:
        intro += PLACEHOLDERS.format(package=package)
    readme.write_text(f"{intro}\n## {rest}")


def own_text(text: str, example: bool) -> str:
    """A page of the README or the docs as the project has it: what is about the template itself out,
    the example's parts (MNIST's data, digit prediction, the benchmarks) kept with the example."""
    text = _section(text, "template only", keep=False)
    text = _section(text, "example only", keep=example)
    text = BLANK_TEXT.sub("" if example else r"\1", text)
    return re.sub(r"\n{3,}", "\n\n", text)  # where a section went between two blank lines


def _section(text: str, name: str, keep: bool) -> str:
    """The README's text between ``<!-- name -->`` and ``<!-- end name -->`` (HTML comments: GitHub shows
    this repository's README without them), kept without its markers or left out. A section opened at the
    start of a line goes with the end of its last line; one inside a line (a table cell) leaves it."""
    if keep:
        return re.sub(rf"(?m)^<!-- (?:end )?{name} -->\n|<!-- (?:end )?{name} -->", "", text)
    span = rf"<!-- {name} -->.*?<!-- end {name} -->"
    return re.sub(rf"(?ms)^{span}\n?|{span}", "", text)


def leave_out_example(root: Path, files: list[str]) -> list[str]:
    """The MNIST example's own files out, the placeholders in (``conf/data/default.yaml`` names theirs);
    returns the rendered files as they are now. Only rendered files go: a notebook of the user's stays."""
    gone = [name for name in files if is_example(root, name) or name.split("/")[0] in BLANK_REPLACES]
    for name in gone:
        (root / name).unlink()
        _prune(root, (root / name).parent)
    blank = [p.relative_to(BLANK).as_posix() for p in BLANK.rglob("*") if p.is_file()]
    for name in blank:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(BLANK / name, root / name)
    kept = [name for name in files if name not in gone]
    return kept + [name for name in blank if name not in kept]


def is_example(root: Path, name: str) -> bool:
    """Whether the file ``name`` (under ``root``) is the MNIST example's: in an ``example/`` folder, or marked."""
    return EXAMPLE_FOLDER in PurePosixPath(name).parts[:-1] or EXAMPLE_MARK in _first_line(root / name)


def _first_line(path: Path) -> str:
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError):  # an image: only its folder can say
        return ""
    if path.suffix == ".ipynb":
        cells = json.loads(text).get("cells") or [{"source": ""}]
        text = "".join(cells[0]["source"])
    lines = [line for line in text.splitlines() if not line.startswith(("# @", MODELINE))]
    return lines[0] if lines else ""


def _toml(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--project", required=True, help="the project's name, the README's title")
    parser.add_argument("--package", required=True, help="the Python package's name")
    parser.add_argument("--description", default="")
    parser.add_argument("--author", default="")
    parser.add_argument("--email", default="")
    parser.add_argument("--example", choices=["True", "False"], default="True", help="keep the MNIST example")
    args = parser.parse_args()
    if problem := package_problem(args.package):
        parser.error(f"--package={args.package}: {problem}")
    root, example = Path.cwd(), args.example == "True"
    files = [name for name in template_files(TEMPLATE) if (root / name).is_file()]  # written here just now
    if not example:
        files = leave_out_example(root, files)
    describe(root, args.project, args.package, args.description, args.author, args.email, example)
    for page in [root / name for name in files if name.startswith("docs/") and name.endswith(".md")]:
        page.write_text(own_text(page.read_text(), example))
    names = {NAME: args.package, NAME.upper(): args.package.upper()} | TEMPLATE_NAMES | ({} if example else BLANK_NAMES)
    rename(root, files, names)


if __name__ == "__main__":
    main()
