"""JSON Schemas of conf/, for editors: a typo'd key, a wrong type or a missing argument underlined as you type.

They are made from what the entry points check: ``schema.py``'s models for the project's own keys, and for
every ``_target_`` that conf/ names, its class's arguments as ``signatures.py`` reads them from the source
(with ``bounds.py``'s ranges). ``.schemas/`` holds one file per place a config file's content lands: its
package (conf/data/*.yaml -> ``data.json``; a primary config, or a ``# @package _global_`` file, -> its entry
point's, ``train.json``), and ``conf.json``, what they share. Each YAML file of conf/ names its schema in
a ``yaml-language-server`` modeline (after a ``# @package`` line: Hydra reads only a header at the very
top), which the YAML language server of VS Code's YAML extension reads, and the JetBrains IDEs too. Run from the project's folder after changing a class's arguments or a ``_target_`` in conf/
(the fast tier fails while a schema is stale, tests/test_json_schemas.py):

    python -m mnistlab.runtime.config.json_schemas          # writes .schemas/ and the modelines
    python -m mnistlab.runtime.config.json_schemas --check  # names what is stale, changes nothing

What an editor cannot know is left open: a value of a class the source does not describe, a key whose
value Hydra interpolates (``${...}``) or asks for (``???``), and a file's keys where its node's class comes
from a config outside conf/ (a Hydra plugin's).
"""

import argparse
import json
import os
import re
import sys
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from mnistlab.runtime.config import bounds, schema, signatures
from mnistlab.runtime.run import internals
from mnistlab.runtime.run.failures import InputError

COMMAND = "python -m mnistlab.runtime.config.json_schemas"  # run from the project's folder
FOLDER = ".schemas"  # beside conf/
SHARED = "conf.json"
MODELINE = "# yaml-language-server: $schema="
DRAFT = "http://json-schema.org/draft-07/schema#"  # the newest the YAML language server reads
GLOBAL_ENTRY = "train"  # whose schema a `# @package _global_` file of a group gets: train.py composes every group
REF = "#/definitions/"
DEFAULTS = {  # a file's defaults list: names, `override /group: option` and `_self_`
    "type": "array",
    "items": {"anyOf": [{"type": "string"}, {"type": "object", "maxProperties": 1}]},
}
SHARED_DEFINITIONS: dict[str, Any] = {
    # A value Hydra fills in: an interpolation, or ??? (given on the command line).
    "interpolation": {"type": "string", "pattern": r"\$\{|^\?\?\?$"},
    "instantiated": {"type": "object", "required": ["_target_"]},  # Hydra builds it: its class is checked
    "value": {
        "anyOf": [
            {"type": ["string", "number", "boolean", "null"]},
            {"type": "array", "items": {"$ref": f"{REF}value"}},
            {"$ref": f"{REF}node"},
        ]
    },
}
HYDRA_KEYS: dict[str, Any] = {
    "_partial_": {"type": "boolean"},
    "_args_": {"type": "array"},
    "_recursive_": {"type": "boolean"},
    "_convert_": {"enum": ["none", "partial", "object", "all"]},
    "defaults": DEFAULTS,
}
assert set(HYDRA_KEYS) | {"_target_"} == signatures.HYDRA_KEYS | {"defaults"}


@dataclass(frozen=True)
class ConfFile:
    path: Path
    primary: bool  # at the top of conf/: an entry point's config (train.yaml), or one they share (run.yaml)
    package: str  # where its content lands: "" for the root, "data", "model.scheduler"
    content: Any  # as YAML reads it

    @property
    def schema(self) -> str:
        """The file of .schemas/ that describes it."""
        if self.package:
            return f"{self.package}.json"
        return f"{self.path.stem if self.primary else GLOBAL_ENTRY}.json"


def read_conf(conf: Path) -> list[ConfFile]:
    files = []
    for path in sorted(conf.rglob("*.yaml")):
        text = path.read_text()
        group = path.parent.relative_to(conf).as_posix().replace("/", ".").strip(".")  # "" at the top
        package = internals.hydra_package(text) or group
        package = "" if package == "_global_" else package.replace("_group_", group)
        try:
            content = yaml.safe_load(text)
        except yaml.YAMLError as err:
            raise InputError(f"{path}: not YAML ({str(err).splitlines()[0]})") from None
        files.append(ConfFile(path, path.parent == conf, package, content))
    return files


def generate(files: list[ConfFile]) -> dict[str, dict[str, Any]]:
    """The files of .schemas/ for the files of a config folder (``read_conf``), by name."""
    targets = list(dict.fromkeys(t for f in files for t in _targets(f.content)))
    definitions = dict(SHARED_DEFINITIONS)
    definitions["node"] = {
        "type": "object",
        "additionalProperties": {"$ref": f"{REF}value"},
        "allOf": [
            {"if": {"properties": {"_target_": {"const": t}}, "required": ["_target_"]}, "then": {"$ref": f"{REF}{t}"}}
            for t in targets
        ],
    }
    for target in targets:
        arguments, required = _arguments(target)
        definitions[f"arguments of {target}"] = arguments
        definitions[target] = _with_required(target, required)
    packages = list(dict.fromkeys(f.package for f in files if f.package))
    models = {f.schema: schema.PRIMARY.get(f.path.stem) for f in files if f.primary}
    roots = {name: _model_schema(model, definitions, packages) for name, model in models.items() if model}
    for package in packages:
        definitions[f"group {package}"] = _package(package, [f for f in files if f.package == package])
    out = {SHARED: {"$schema": DRAFT, "title": "conf/: what its files share", "definitions": definitions}}
    for file in files:
        if file.schema not in out:
            body = _shared_refs(
                roots.get(file.schema, {"$ref": f"{REF}group {file.package}" if file.package else f"{REF}node"})
            )
            # An empty file (conf/callbacks/none.yaml) is YAML's null.
            out[file.schema] = {"$schema": DRAFT, "title": _title(file), **_or_null(body)}
    return out


def write(root: Path) -> list[str]:
    """Write ``root``/.schemas/ and the modeline of each file of ``root``/conf/; the paths changed."""
    changed, expected = [], _expected(root)
    for path, text in expected.items():
        if not path.is_file() or path.read_text() != text:
            path.parent.mkdir(exist_ok=True)
            path.write_text(text)
            changed.append(path.relative_to(root).as_posix())
    for path in sorted((root / FOLDER).glob("*.json")):
        if path not in expected:  # a group that is no more
            path.unlink()
            changed.append(path.relative_to(root).as_posix())
    return changed


def stale(root: Path) -> list[str]:
    """The files that ``write`` would change, each with what is wrong."""
    expected = _expected(root)
    found = [p for p in expected if not p.is_file() or p.read_text() != expected[p]]
    extra = [p for p in (root / FOLDER).glob("*.json") if p not in expected]
    return [p.relative_to(root).as_posix() for p in [*found, *sorted(extra)]]


def _expected(root: Path) -> dict[Path, str]:
    conf = root / "conf"
    if not conf.is_dir():
        raise InputError(f"{root} has no conf/ folder: run this from the project's folder")
    files = read_conf(conf)  # read once: the schemas and the modelines
    expected = {root / FOLDER / name: json.dumps(body, indent=2) + "\n" for name, body in generate(files).items()}
    for file in files:
        schema_path = Path(os.path.relpath(root / FOLDER / file.schema, file.path.parent)).as_posix()
        expected[file.path] = _with_modeline(file.path.read_text(), f"{MODELINE}{schema_path}\n")
    return expected


def _with_modeline(text: str, modeline: str) -> str:
    """``text`` with ``modeline`` after its ``# @package`` line (Hydra reads a header only at the very top)."""
    lines = [line for line in text.splitlines(keepends=True) if not line.startswith(MODELINE)]
    header = 0
    while header < len(lines) and re.match(r"\s*#\s*@", lines[header]):
        header += 1
    return "".join([*lines[:header], modeline, *lines[header:]])


def _targets(value: Any) -> list[str]:
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    found = [value["_target_"]] if isinstance(value, dict) and _is_named(value.get("_target_")) else []
    return found + [t for _, item in items for t in _targets(item)]


def _is_named(target: Any) -> bool:
    return isinstance(target, str) and "${" not in target


def _arguments(target: str) -> tuple[dict[str, Any], list[str]]:
    """The schema of the keys ``target``'s class takes (its signature; any key where it cannot be read), and
    the arguments it needs."""
    signature = signatures.read(target)
    properties: dict[str, Any] = {"_target_": {"const": target}, **HYDRA_KEYS}
    if signature is None:
        return {"description": f"{target}: its arguments cannot be read from its source", "properties": properties}, []
    ranges = signatures.ranges(target)
    for name, parameter in signature.parameters.items():
        properties[name] = _argument(parameter, signature, ranges.get(name))
    arguments: dict[str, Any] = {"description": f"the arguments of {signature.describe()}", "properties": properties}
    if not signature.any_keyword:
        arguments["additionalProperties"] = False
    return arguments, [p.name for p in signature.parameters.values() if p.required]


def _argument(
    parameter: signatures.Parameter, signature: signatures.Signature, bound: bounds.Range | None
) -> dict[str, Any]:
    """The values an argument takes, as its annotation and range say (any value where neither does), or a
    value Hydra fills in or instantiates."""
    kinds = signatures.admitted(parameter.annotation, signature.defined_in) if parameter.annotation else None
    if kinds is not None and parameter.defaults_to_none:
        kinds.append(signatures.Admitted("None"))
    said = [k.description for k in kinds or ()] + ([bound.description] if bound else [])
    if not said:
        return {}  # the class's business
    accepted: dict[str, Any] = {"anyOf": _unique(k.json_schema for k in kinds)} if kinds else {}
    if bound:
        accepted = {"allOf": [accepted, bound.schema]} if accepted else bound.schema
    alternatives = [{**accepted, "description": ", ".join(dict.fromkeys(said))}, {"$ref": f"{REF}interpolation"}]
    return {"anyOf": [*alternatives, {"$ref": f"{REF}instantiated"}]}


def _with_required(target: str, required: list[str]) -> dict[str, Any]:
    """A node of ``target``'s class: its arguments, the required ones given (unless the node is partial, has
    positional arguments, or inherits its keys from its defaults list)."""
    node: dict[str, Any] = {"allOf": [{"$ref": f"{REF}arguments of {target}"}]}
    if required:
        exempt = [
            {"properties": {"_partial_": {"const": True}}, "required": ["_partial_"]},
            {"required": ["_args_"]},
            {"required": ["defaults"]},
        ]
        node["allOf"].append({"if": {"anyOf": exempt}, "else": {"required": required}})
    return node


def _unique(schemas: Any) -> list[dict[str, Any]]:
    kept: list[dict[str, Any]] = []
    for item in schemas:
        if item not in kept:
            kept.append(item)
    return kept


def _model_schema(model: type[schema.Node], definitions: dict[str, Any], packages: list[str]) -> dict[str, Any]:
    """``model``'s JSON Schema (pydantic's), as files of conf/ are written: any key may be left to another
    file or interpolated, and ``defaults`` lists them; a key with a group of its own is that group's; its
    nested models go into ``definitions``."""
    made = model.model_json_schema(ref_template=REF + "{model}")  # pydantic's field for the model's name
    for name, nested in made.pop("$defs", {}).items():
        if name != "Target":
            definitions[name] = _as_written(nested)
    made = _as_written(made)
    for name in made["properties"].keys() & set(packages):
        made["properties"][name] = {"$ref": f"{REF}group {name}"}
    return made


def _as_written(model: dict[str, Any]) -> dict[str, Any]:
    model = {k: v for k, v in model.items() if k not in ("required", "title")}
    if "properties" in model:
        properties = {
            name: {"anyOf": [value, {"$ref": f"{REF}interpolation"}]} for name, value in model["properties"].items()
        }
        model["properties"] = {**properties, "defaults": DEFAULTS}
    return _replace_target(model)


def _replace_target(value: Any) -> Any:
    """``value`` with pydantic's ``Target`` model (a node Hydra instantiates) replaced by the shared node."""
    if isinstance(value, dict):
        if value.get("$ref") == f"{REF}Target":
            return {"$ref": f"{REF}node"}
        return {k: _replace_target(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_replace_target(v) for v in value]
    return value


def _package(package: str, files: list[ConfFile]) -> dict[str, Any]:
    """What a file of ``package`` holds: what a primary config's model says that key is (``paths``; callbacks:
    a mapping of nodes by name), else one node."""
    field = next((m.model_fields[package] for m in schema.PRIMARY.values() if package in m.model_fields), None)
    shape = _shape(field.annotation) if field else "node"
    if isinstance(shape, type):
        return {"$ref": f"{REF}{shape.__name__}"}
    if shape == "node":
        inherited = all(_names_its_class(f, files) for f in files)
        return _node([f.content for f in files] if inherited else [])
    entries: dict[str, list[Any]] = {}
    for file in files:
        for name, entry in (file.content or {}).items():
            entries.setdefault(name, []).append(entry)
    properties = {name: _or_null(_node(nodes)) for name, nodes in entries.items()}
    return {
        "type": "object",
        "properties": {**properties, "defaults": DEFAULTS},
        "additionalProperties": _or_null({"$ref": f"{REF}node"}),
    }


def _or_null(value: dict[str, Any]) -> dict[str, Any]:
    """``value``, or null (an entry switched off, an empty file); as if/else, so that an editor's message
    names what is wrong with ``value``, not that it is not null."""
    return {"if": {"type": "null"}, "else": value}


def _node(contents: list[Any]) -> dict[str, Any]:
    """A node; one without a ``_target_`` takes the keys of one of the classes that ``contents`` name (the
    files of its group, or the entries of its name: a key of callbacks.early_stopping is EarlyStopping's)."""
    named = list(dict.fromkeys(c["_target_"] for c in contents if isinstance(c, dict) and _is_named(c.get("_target_"))))
    if not named:
        return {"$ref": f"{REF}node"}
    untargeted = {"anyOf": [{"$ref": f"{REF}arguments of {t}"} for t in named]}
    return {"allOf": [{"$ref": f"{REF}node"}, {"if": {"not": {"required": ["_target_"]}}, "then": untargeted}]}


def _shape(annotation: Any) -> str | type[schema.Node]:
    """How a model's field holds nodes: ``node`` (one, or a value of any kind), ``entries`` (a mapping of
    them), or the project's model of its keys (``Paths``)."""
    if isinstance(annotation, type) and issubclass(annotation, schema.Node) and annotation is not schema.Target:
        return annotation
    if typing.get_origin(annotation) is dict and _mentions_target(annotation):
        return "entries"
    return next((s for s in map(_shape, typing.get_args(annotation)) if s != "node"), "node")


def _mentions_target(annotation: Any) -> bool:
    return annotation is schema.Target or any(map(_mentions_target, typing.get_args(annotation)))


def _names_its_class(file: ConfFile, package: list[ConfFile]) -> bool:
    """Whether a node file names its class, or takes it from the files its defaults list names, beside it."""
    content = file.content if isinstance(file.content, dict) else {}
    if "_target_" in content or not content:
        return True
    named = [d for d in content.get("defaults") or [] if d != "_self_"]
    return bool(named) and all(_is_beside(default, file, package) for default in named)


def _is_beside(default: Any, file: ConfFile, package: list[ConfFile]) -> bool:
    """Whether a defaults entry names a file of ``file``'s folder: ``default``, ``/data/stream@_here_``."""
    if not isinstance(default, str):
        return False
    name = default.partition("@")[0]
    folder = file.path.parent
    if name.startswith("/"):
        group, _, name = name[1:].rpartition("/")
        if not folder.as_posix().endswith(f"/{group}"):
            return False
    return any(f.path.parent == folder and f.path.stem == name for f in package)


def _shared_refs(value: Any) -> Any:
    """``value`` with its references pointing into conf.json."""
    if isinstance(value, dict):
        return {k: f"{SHARED}{v}" if k == "$ref" and v.startswith(REF) else _shared_refs(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_shared_refs(v) for v in value]
    return value


def _title(file: ConfFile) -> str:
    if file.package:
        return f"conf/: a file whose content is {file.package}"
    return f"conf/{file.schema.removesuffix('.json')}.yaml and the # @package _global_ files of its groups"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog=COMMAND, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--check", action="store_true", help="name the stale files, write nothing")
    arguments = parser.parse_args(argv)
    root = Path.cwd()
    try:
        if arguments.check:
            if found := stale(root):
                print(f"stale: {', '.join(found)}: run {COMMAND}", file=sys.stderr)
                return 1
            return 0
        for path in write(root):
            print(f"wrote {path}")
    except InputError as err:
        print(f"Error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
