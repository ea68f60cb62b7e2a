"""The keys of a config node checked against the signature of the class (or function) its ``_target_`` names.

Every node Hydra instantiates, the framework's (Lightning's Trainer, strategies, callbacks; torch's
optimizers; Ray's configs) and the user's (data module, network, LightningModule) alike, is checked here:
its class's constructor is its schema, so there is none to keep in step with a release. It is read from
the source with ``ast``, never imported, so that a typo is answered before torch loads (and a target named
in a checkpoint's config runs nothing). Only what the source states is checked: an unknown key (where there
is no ``**kwargs``), a required argument with no value (unless ``_partial_``), a value that contradicts a
plain annotation (int, float, str, bool, ``Literal``, ``Optional``, unions, paths, lists, dicts, and the
module's aliases of these, as Lightning's ``_PRECISION_INPUT``), and the range of a number that a class
refuses at run time (``bounds.py``). A dataclass's fields are its arguments. Whatever cannot be read
statically (a class built at run time, an annotation of another type) is left to the class itself.
"""

import ast
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from mnistlab.runtime.config import bounds
from mnistlab.runtime.config.checks import did_you_mean
from mnistlab.runtime.run.failures import InputError

HYDRA_KEYS = {"_target_", "_partial_", "_args_", "_recursive_", "_convert_"}
MAX_HOPS = 8  # re-exports and base classes followed before giving up (an unreadable chain is not checked)


@dataclass(frozen=True)
class Parameter:
    name: str
    annotation: ast.expr | None
    required: bool
    defaults_to_none: bool


Definition = ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef


@dataclass(frozen=True)
class Found:
    """A definition (or an alias's value), with the module that holds it (for the names that module imports)."""

    definition: Definition | ast.expr
    tree: ast.Module
    module: str
    path: Path

    @property
    def qualified(self) -> str:
        name = getattr(self.definition, "name", "")
        return f"{self.module}.{name}"


@dataclass(frozen=True)
class Signature:
    target: str
    parameters: dict[str, Parameter]
    any_keyword: bool  # **kwargs: any key is accepted
    defined_in: Found  # the class (or function) whose arguments these are: a base class's, when inherited

    def describe(self) -> str:
        return f"{self.target}({', '.join(self.parameters)})"


def check_tree(value: Any, key: str, later: frozenset[str] = frozenset()) -> None:
    """Check every node with a ``_target_`` in ``value`` (a resolved config or part of it), inner ones first;
    ``key`` is the place of ``value`` in the config (``data``, ``model``); the values of the keys in ``later``
    are left out (the caller checks them again after the rest)."""
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for name, item in items:
        check_tree(item, f"{key}.{name}", later)
    if isinstance(value, dict) and isinstance(value.get("_target_"), str):
        check_node(value, key, later)


def check_node(node: dict[str, Any], key: str, later: frozenset[str] = frozenset()) -> None:
    """Refuse, in one line naming the key, what ``node``'s ``_target_`` does not accept; ``key`` is the
    node's place in the config (``data``, ``model.net``); the values of the keys in ``later`` are not checked."""
    target = node["_target_"]
    if not _installed(target.partition(".")[0]):
        raise InputError(f"{key}._target_={target}: no module {target.partition('.')[0]} is installed")
    if (signature := read(target)) is None:
        return
    given = {name: value for name, value in node.items() if name not in HYDRA_KEYS}
    if not signature.any_keyword:
        for name in given.keys() - signature.parameters.keys():
            hint = did_you_mean(key, name, signature.parameters) or f"it takes {', '.join(signature.parameters)}"
            raise InputError(f"{key}.{name} is not an argument of {signature.target}: {hint}")
    if not node.get("_partial_") and "_args_" not in node:
        for parameter in signature.parameters.values():
            if parameter.required and parameter.name not in given:
                raise InputError(
                    f"{key}.{parameter.name} is missing: {signature.target} needs it; give it in the node's YAML "
                    f"or as {key}.{parameter.name}=..."
                )
    ranges = _ranges(signature)
    for name, value in given.items():
        accepted = signature.parameters.get(name)
        if accepted is None or (value is None and accepted.defaults_to_none) or f"{key}.{name}" in later:
            continue
        expected = _mismatch(value, accepted.annotation, signature.defined_in) if accepted.annotation else None
        if expected is None and name in ranges and not ranges[name].fits(value):
            expected = ranges[name].description
        if expected is not None:
            raise InputError(f"{key}.{name}={_show(value)}: should be {expected} ({signature.target})")


@cache
def read(target: str) -> Signature | None:
    """The signature of the class or function ``target`` names (``package.module.Name``), from its source;
    None when it cannot be found or read without running code."""
    module, _, name = target.rpartition(".")
    found = _find(module, name, hops=0) if module else None
    if found is None:
        return None
    if isinstance(found.definition, ast.ClassDef):
        init = _initializer(found, hops=0)
        if init is None:
            return None
        (arguments, found), skip = init, 1  # self
    elif isinstance(found.definition, ast.FunctionDef | ast.AsyncFunctionDef):
        arguments, skip = found.definition.args, 0
    else:
        return None  # a name bound to an expression: made at run time
    return _signature(target, arguments, skip, found)


def ranges(target: str) -> dict[str, bounds.Range]:
    """The ranges ``bounds.py`` gives the arguments of ``target`` (for its tests)."""
    signature = read(target)
    return _ranges(signature) if signature else {}


def _ranges(signature: Signature) -> dict[str, bounds.Range]:
    """The ranges bounds.py gives this signature's class: as named there, through a re-export
    (``lightning.pytorch.Trainer``), inherited by a subclass that keeps its constructor, or in a package
    whose classes share one (``torch.optim``)."""
    where = signature.defined_in.qualified
    found: dict[str, bounds.Range] = {}
    for owner, rules in bounds.RANGES.items():
        if where.startswith(f"{owner}.") or _qualified(owner) == where:
            found |= rules
    return found


@cache
def _qualified(target: str) -> str | None:
    """Where the class ``target`` names is defined (``lightning.pytorch.trainer.trainer.Trainer``)."""
    module, _, name = target.rpartition(".")
    found = _find(module, name, hops=0) if module else None
    return found.qualified if found else None


def _signature(target: str, arguments: ast.arguments, skip: int, defined_in: Found) -> Signature:
    positional = [*arguments.posonlyargs, *arguments.args]
    defaults = [None] * (len(positional) - len(arguments.defaults)) + list(arguments.defaults)
    pairs = list(zip(positional, defaults, strict=True))[skip:]
    pairs += list(zip(arguments.kwonlyargs, arguments.kw_defaults, strict=True))
    positional_only = {a.arg for a in arguments.posonlyargs}
    parameters = {
        arg.arg: Parameter(
            arg.arg,
            arg.annotation,
            required=default is None,
            defaults_to_none=isinstance(default, ast.Constant) and default.value is None,
        )
        for arg, default in pairs
        if arg.arg not in positional_only
    }
    return Signature(target, parameters, any_keyword=arguments.kwarg is not None, defined_in=defined_in)


def _find(module: str, name: str, hops: int) -> Found | None:
    """The definition of ``name`` in ``module`` (or the value an assignment binds to it, as a type alias's),
    following re-exports (``from .adam import Adam``)."""
    path = _source(module)
    if path is None or hops > MAX_HOPS:
        return None
    tree = _parse(path)
    stars = []
    for statement in reversed(tree.body):  # the last binding wins, as at run time
        if isinstance(statement, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and statement.name == name:
            return Found(statement, tree, module, path)
        if (value := _assigned(statement, name)) is not None:
            return Found(value, tree, module, path)
        if isinstance(statement, ast.ImportFrom):
            origin = _absolute(module, path, statement)
            for alias in statement.names:
                if (alias.asname or alias.name) == name:
                    return _find(origin, alias.name, hops + 1) if origin else None
                if alias.name == "*" and origin:
                    stars.append(origin)
    for origin in stars:  # from .modules import *
        if found := _find(origin, name, hops + 1):
            return found
    return None


def _assigned(statement: ast.stmt, name: str) -> ast.expr | None:
    """The value ``statement`` binds to ``name`` at module level (``X = ...``, ``X: TypeAlias = ...``)."""
    if isinstance(statement, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in statement.targets):
        return statement.value
    if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name) and statement.target.id == name:
        return statement.value
    return None


def _initializer(found: Found, hops: int) -> tuple[ast.arguments, Found] | None:
    """The arguments of the class's ``__init__`` (or ``__new__``, or its dataclass fields), its first base's
    where it has none (object's: none at all); with the class that defines them."""
    cls = found.definition
    assert isinstance(cls, ast.ClassDef)
    if hops > MAX_HOPS or any(_decorator_name(d) in {"define", "attrs"} for d in cls.decorator_list):
        return None  # generated initialisers are not in the source
    for name in ("__init__", "__new__"):  # datetime.timedelta has only the second
        for statement in cls.body:
            if isinstance(statement, ast.FunctionDef) and statement.name == name:
                return statement.args, found
    if _is_dataclass(cls):
        fields = _fields(found, hops)
        return None if fields is None else (_as_arguments(fields), found)
    bases = _bases(cls)
    if not bases:
        empty = ast.arguments(posonlyargs=[], args=[ast.arg("self")], kwonlyargs=[], kw_defaults=[], defaults=[])
        return empty, found
    parent = _resolve(found, bases[0]) if bases[0] else None
    if parent is None or not isinstance(parent.definition, ast.ClassDef):
        return None
    return _initializer(parent, hops + 1)


def _bases(cls: ast.ClassDef) -> list[str]:
    """The dotted names of a class's bases that may define arguments ("" for one that is not a plain name)."""
    named = [_dotted(b.value if isinstance(b, ast.Subscript) else b) for b in cls.bases]
    return [b for b in named if b not in {"object", "Generic", "typing.Generic", "ABC", "abc.ABC"}]


def _is_dataclass(cls: ast.ClassDef) -> bool:
    return any(_decorator_name(d) == "dataclass" for d in cls.decorator_list)


def _fields(found: Found, hops: int) -> dict[str, tuple[ast.AnnAssign, ast.expr | None]] | None:
    """A dataclass's fields in ``__init__``'s order (its dataclass bases' first), each with its default
    (None: required); None where a base cannot be read."""
    cls = found.definition
    assert isinstance(cls, ast.ClassDef)
    fields: dict[str, tuple[ast.AnnAssign, ast.expr | None]] = {}
    for base in reversed(_bases(cls)):  # the first base's fields come first, as in the MRO
        parent = _resolve(found, base) if base and hops < MAX_HOPS else None
        if parent is None or not isinstance(parent.definition, ast.ClassDef):
            return None
        if _is_dataclass(parent.definition):
            if (inherited := _fields(parent, hops + 1)) is None:
                return None
            fields |= inherited
    for statement in cls.body:
        if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
            outer = (
                statement.annotation.value if isinstance(statement.annotation, ast.Subscript) else statement.annotation
            )
            if _dotted(outer).rpartition(".")[2] != "ClassVar":
                fields[statement.target.id] = (statement, _field_default(statement.value))
    return fields


def _field_default(value: ast.expr | None) -> ast.expr | None:
    """A field's default as an expression; ``field(default_factory=...)`` has one (an ``...`` stands for it)."""
    if isinstance(value, ast.Call) and _dotted(value.func).rpartition(".")[2] == "field":
        given = {k.arg: k.value for k in value.keywords}
        return given.get("default", ast.Constant(...) if "default_factory" in given else None)
    return value


def _as_arguments(fields: dict[str, tuple[ast.AnnAssign, ast.expr | None]]) -> ast.arguments:
    kwonly = [ast.arg(name, statement.annotation) for name, (statement, _) in fields.items()]
    defaults = [default for _, default in fields.values()]
    return ast.arguments(posonlyargs=[], args=[ast.arg("self")], kwonlyargs=kwonly, kw_defaults=defaults, defaults=[])


def _resolve(where: Found, dotted: str) -> Found | None:
    """What a (possibly dotted) name in the module of ``where`` refers to: a definition or alias of it, or
    an import."""
    head, _, rest = dotted.partition(".")
    if not rest:
        return _find(where.module, dotted, hops=1)
    for statement in where.tree.body:
        if isinstance(statement, ast.ImportFrom):
            for alias in statement.names:
                origin = _absolute(where.module, where.path, statement)
                if (alias.asname or alias.name) == head and origin:
                    # from lightning import pytorch as pl; pl.LightningModule: the name may be a module
                    inner, _, name = f"{origin}.{alias.name}.{rest}".rstrip(".").rpartition(".")
                    return _find(inner, name, 1) if rest else _find(origin, alias.name, 1)
        if isinstance(statement, ast.Import):
            for alias in statement.names:
                if (alias.asname or alias.name.partition(".")[0]) == head and rest:
                    real = alias.name if alias.asname else head
                    inner, _, name = f"{real}.{rest}".rpartition(".")
                    return _find(inner, name, 1)
    return None


def _absolute(module: str, path: Path, statement: ast.ImportFrom) -> str | None:
    if not statement.level:
        return statement.module
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for _ in range(statement.level - 1):
        package = package.rpartition(".")[0]
    return ".".join(p for p in (package, statement.module) if p) or None


@cache
def _installed(top: str) -> bool:
    try:
        return importlib.util.find_spec(top) is not None
    except (ImportError, ValueError):
        return False


@cache
def _source(module: str) -> Path | None:
    """The source file of ``module``, found without importing it or its parents (find_spec of a
    submodule would import its package: torch's, five seconds)."""
    top, *parts = module.split(".")
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    folders = [Path(p) for p in (spec.submodule_search_locations or [])]
    path = Path(spec.origin) if spec.origin and spec.origin.endswith(".py") else None
    for part in parts:
        path = next((f / part / "__init__.py" for f in folders if (f / part / "__init__.py").is_file()), None) or next(
            (f / f"{part}.py" for f in folders if (f / f"{part}.py").is_file()), None
        )
        folders = [f / part for f in folders if (f / part).is_dir()]
        if path is None and not folders:
            return None
    return path


@cache
def _parse(path: Path) -> ast.Module:
    return ast.parse(path.read_bytes(), filename=str(path))


def _dotted(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}" if _dotted(node.value) else ""
    return ""


def _decorator_name(node: ast.expr) -> str:
    return _dotted(node.func if isinstance(node, ast.Call) else node).rpartition(".")[2]


# What each plain annotation admits of a config value (YAML's: int, float, str, bool, None, list, dict): how a
# refusal says it, whether a value is one, and its JSON Schema (json_schemas.py, for editors).
SIMPLE: dict[str, tuple[str, Callable[[Any], bool], dict[str, str]]] = {
    "int": ("an integer", lambda v: isinstance(v, int) and not isinstance(v, bool), {"type": "integer"}),
    "float": ("a number", lambda v: isinstance(v, int | float) and not isinstance(v, bool), {"type": "number"}),
    "str": ("a string", lambda v: isinstance(v, str), {"type": "string"}),
    "bool": ("true or false", lambda v: isinstance(v, bool), {"type": "boolean"}),
    "Path": ("a path", lambda v: isinstance(v, str), {"type": "string"}),
    "PathLike": ("a path", lambda v: isinstance(v, str), {"type": "string"}),
    "list": ("a list", lambda v: isinstance(v, list), {"type": "array"}),
    "List": ("a list", lambda v: isinstance(v, list), {"type": "array"}),
    "Sequence": ("a list", lambda v: isinstance(v, list), {"type": "array"}),
    "tuple": ("a list", lambda v: isinstance(v, list), {"type": "array"}),
    "Tuple": ("a list", lambda v: isinstance(v, list), {"type": "array"}),
    "dict": ("a mapping", lambda v: isinstance(v, dict), {"type": "object"}),
    "Dict": ("a mapping", lambda v: isinstance(v, dict), {"type": "object"}),
    "Mapping": ("a mapping", lambda v: isinstance(v, dict), {"type": "object"}),
    "None": ("null", lambda v: v is None, {"type": "null"}),
}


@dataclass(frozen=True)
class Admitted:
    """One kind of value an annotation admits: a plain type (a key of SIMPLE), or the values of a Literal."""

    simple: str | None = None
    literal: tuple[Any, ...] = ()

    @property
    def description(self) -> str:
        return SIMPLE[self.simple][0] if self.simple else " or ".join(repr(a) for a in self.literal)

    def fits(self, value: Any) -> bool:
        if self.simple:
            return SIMPLE[self.simple][1](value)
        return any(value == a and type(value) is type(a) for a in self.literal)

    @property
    def json_schema(self) -> dict[str, Any]:
        return dict(SIMPLE[self.simple][2]) if self.simple else {"enum": list(self.literal)}


def admitted(annotation: ast.expr, where: Found, hops: int = 0) -> list[Admitted] | None:
    """The kinds of value ``annotation`` (written in the module of ``where``) admits; None where the source
    cannot tell (a class of its own, an annotation of another type): then any value may do."""
    if hops > MAX_HOPS:
        return None
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):  # "Foo": a forward reference
        try:
            annotation = ast.parse(annotation.value, mode="eval").body
        except SyntaxError:
            return None
    members = _union(annotation)
    if members is not None:
        kinds = [admitted(member, where, hops) for member in members]
        return None if any(k is None for k in kinds) else [kind for k in kinds for kind in k or ()]
    if isinstance(annotation, ast.Constant) and annotation.value is None:
        return [Admitted("None")]
    if isinstance(annotation, ast.Subscript):
        if _dotted(annotation.value).rpartition(".")[2] == "Literal":
            options = annotation.slice.elts if isinstance(annotation.slice, ast.Tuple) else [annotation.slice]
            values = tuple(o.value for o in options if isinstance(o, ast.Constant))
            return [Admitted(literal=values)] if len(values) == len(options) else None
        annotation = annotation.value  # list[int]: a list (its items are the target's business)
    name = _dotted(annotation).rpartition(".")[2]
    if name not in SIMPLE:  # an alias of the module's (_PRECISION_INPUT = Literal[...]), or a class of its own
        alias = _resolve(where, _dotted(annotation)) if _dotted(annotation) else None
        if alias is None or not isinstance(alias.definition, ast.expr):
            return None
        return admitted(alias.definition, alias, hops + 1)
    return [Admitted(name)]


def _mismatch(value: Any, annotation: ast.expr, where: Found) -> str | None:
    """What ``annotation`` (written in the module of ``where``) asks for, where ``value`` is not that; None
    where it fits or cannot be told."""
    if isinstance(value, dict) and "_target_" in value:
        return None  # instantiated: its type is known only at run time
    kinds = admitted(annotation, where)
    if kinds is None or any(kind.fits(value) for kind in kinds):
        return None
    return " or ".join(dict.fromkeys(kind.description for kind in kinds))


def _union(annotation: ast.expr) -> list[ast.expr] | None:
    """The members of ``A | B``, ``Union[A, B]`` or ``Optional[A]``; None for anything else."""
    if isinstance(annotation, ast.BinOp) and isinstance(annotation.op, ast.BitOr):
        return [*(_union(annotation.left) or [annotation.left]), *(_union(annotation.right) or [annotation.right])]
    if isinstance(annotation, ast.Subscript):
        outer = _dotted(annotation.value).rpartition(".")[2]
        inner = annotation.slice.elts if isinstance(annotation.slice, ast.Tuple) else [annotation.slice]
        if outer == "Union":
            return list(inner)
        if outer == "Optional":
            return [*inner, ast.Constant(None)]
    return None


def _show(value: Any) -> str:
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)
