"""The generator's rename step: run by copier (``copier.yml``, ``_tasks``) in the project it has just
copied, it turns this template, named ``mnistlab``, into the user's project.

The template's files carry no placeholders, so that it stays a normal project that installs, trains
and passes its tests; copier copies them as they are and this step renames: the package folder and
every other path holding the name, the name in every text file (imports, ``_target_`` paths in
``conf/``, ``MNISTLAB_*`` environment variables, the pyproject's name and extras), the pyproject's
description and author, and the README's title and first paragraph. With ``--example=False`` it
first leaves the MNIST example out and puts the placeholders of ``generator/blank/`` in its place.
Copier runs it again on both template versions it compares during ``copier update``, and in the
project after writing the new version there, so updates arrive in the renamed files.
"""

import argparse
import re
import shutil
from pathlib import Path

NAME = "mnistlab"
BLANK = Path(__file__).parent / "blank"  # the placeholders, under the template's names, copied over it
EXAMPLE_ONLY = [  # what only the MNIST example needs: left out with --no-example
    "src/mnistlab/trained/digits.py",
    "src/mnistlab/trained/prediction.py",
    "predict.py",
    "conf/predict.yaml",
    "conf/data/mnist.yaml",
    "conf/data/fashion_mnist.yaml",
    "conf/data/kmnist.yaml",
    "tests/test_data.py",
    "tests/test_prediction.py",
    "tests/test_notebooks.py",
    "tests/test_benchmarks.py",
    "notebooks",
    "benchmarks",
]
PLACEHOLDERS = """
**This project starts with placeholders:** `src/{package}/data.py` serves random images of 10 classes
and `src/{package}/network.py` is a small MLP for them. Replace them with your data module and network,
and `conf/data/`, `conf/model/` and the `Data` model of `src/{package}/schema.py` with them; everything
else (training, checkpoints, resume, DDP, SLURM, sweeps, the tests of these) stays as it is.
"""
TEMPLATE_ONLY = re.compile(r"<!-- template only -->.*?<!-- end template only -->\n*", re.DOTALL)
EXAMPLE_ONLY_TEXT = re.compile(r"<!-- example only -->.*?<!-- end example only -->\n*", re.DOTALL)


def rename(root: Path, package: str) -> None:
    """``mnistlab`` -> ``package`` and ``MNISTLAB`` -> its upper case, in file contents and paths."""
    for path in sorted(p for p in root.rglob("*") if p.is_file() and ".git" not in p.relative_to(root).parts):
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue  # not text (a picture): nothing to rename inside
        if NAME in text.lower():
            path.write_text(text.replace(NAME, package).replace(NAME.upper(), package.upper()))
    for path in sorted(root.rglob(f"*{NAME}*"), key=lambda p: -len(p.parts)):  # the deepest first
        _move(path, path.with_name(path.name.replace(NAME, package)))


def _move(source: Path, target: Path) -> None:
    """``mv``, but into a folder that exists already: ``copier update`` writes the template's new
    version, under the template's names, over the renamed project before this step runs there."""
    if source.is_dir() and target.is_dir():
        for child in source.iterdir():
            _move(child, target / child.name)
        source.rmdir()
    else:
        source.replace(target)


def describe(root: Path, project: str, package: str, description: str, author: str, email: str, example: bool) -> None:
    """The pyproject's description and author; the README's title and first paragraph."""
    pyproject = root / "pyproject.toml"
    text = re.sub(r'(?m)^description = ".*"$', f"description = {_toml(description)}", pyproject.read_text())
    text = re.sub(r"(?m)^authors = .*\n", "", text)  # copier update runs this step again
    person = ", ".join(f"{key} = {_toml(value)}" for key, value in (("name", author), ("email", email)) if value)
    author_line = f"authors = [{{ {person} }}]\n" if person else ""  # an empty e-mail is no valid one
    pyproject.write_text(text.replace('readme = "README.md"\n', f'readme = "README.md"\n{author_line}', 1))
    readme = root / "README.md"
    text = TEMPLATE_ONLY.sub("", readme.read_text())  # what is about the template itself
    text = text if example else EXAMPLE_ONLY_TEXT.sub("", text)  # digit prediction, the MNIST benchmarks
    _, rest = text.split("\n## ", 1)  # the title and first paragraph end at the first section
    intro = f"# {project}\n\n{description}\n\nBuilt on a Lightning + Hydra template for distributed training.\n"
    if not example:
        intro += PLACEHOLDERS.format(package=package)
    readme.write_text(f"{intro}\n## {rest}")


def leave_out_example(root: Path) -> None:
    """The MNIST example's own files out, the placeholders in, the config and schema pointed at them."""
    for name in EXAMPLE_ONLY:
        path = root / name
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
    shutil.copytree(BLANK, root, dirs_exist_ok=True)
    for entry in ("train", "eval"):
        path = root / "conf" / f"{entry}.yaml"
        path.write_text(re.sub(r"(?m)^  - data: mnist\b.*$", "  - data: placeholder", path.read_text()))
    schema = root / "src" / NAME / "schema.py"
    data = (BLANK / "schema_data.txt").read_text()
    schema.write_text(re.sub(r"(?s)class Data\(Target\):\n.*?\n\n\n", data + "\n\n", schema.read_text(), count=1))
    (root / "schema_data.txt").unlink()


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
    root, example = Path.cwd(), args.example == "True"
    if not example and (root / "src" / NAME).is_dir():  # the template's files, as copied (or updated) just now
        leave_out_example(root)
    describe(root, args.project, args.package, args.description, args.author, args.email, example)
    rename(root, args.package)


if __name__ == "__main__":
    main()
