"""The project's own keys in ``conf/`` (those no class takes), typed, and one check of a whole config.

Entry points check here before they import torch and Lightning (5 s on a 2-core CPU; pydantic and
Hydra take 0.3 s): a mistyped value is answered at once, in one line that names the key, the value
and what is allowed, instead of a traceback from inside Lightning minutes into a run.

The models hold what the entry points read themselves (``seed``, ``monitor``, ``paths``, ``ckpt_path``,
``engine.address``...). Every node with a ``_target_`` (the trainer, strategy, callbacks, loggers,
optimizer, and the user's data module and network) is checked against its class's own signature
instead (``signatures.py``): Lightning's classes and yours alike, with no copy here to keep in step.
"""

from collections.abc import Iterator
from typing import Annotated, Any, Literal, TypeGuard

from omegaconf import DictConfig, OmegaConf
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from mnistlab.runtime.config import signatures
from mnistlab.runtime.config.checks import did_you_mean, indivisible_batch
from mnistlab.runtime.run.failures import InputError

Positive = Annotated[int, Field(ge=1)]
NonNegative = Annotated[int, Field(ge=0)]
PositiveFloat = Annotated[float, Field(gt=0)]


class Node(BaseModel):
    # strict: 10.0 is no number of epochs, "true" no boolean.
    model_config = ConfigDict(strict=True, extra="forbid")


class Target(Node):
    """A node Hydra instantiates: ``_target_`` names the class, whose signature checks the rest."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)
    target: str = Field(alias="_target_")
    partial: bool = Field(False, alias="_partial_")


class Paths(Node):
    root_dir: str
    data_dir: str
    log_dir: str
    output_dir: str


class RunConfig(Node):
    """Keys and groups shared by train.yaml and eval.yaml."""

    task_name: str
    seed: int
    print_config: bool = True
    hparams: list[str] = []  # config keys the loggers record as hyperparameters
    float32_matmul_precision: Literal["highest", "high", "medium"]
    monitor: str  # a metric the module logs at validation
    mode: Literal["min", "max"]
    allow_cpu_oversubscription: bool = False  # checks.check_cpu_processes
    data: Target
    model: Target
    trainer: Target
    callbacks: dict[str, Target | None] | None = None  # callbacks.<name>=null switches one off
    logger: dict[str, Target | None] | None = None  # logger=none removes the key
    paths: Paths
    hydra: Any = None  # Hydra's own config, when a test composes it in: typed by Hydra


class Engine(Node):
    """engine=ray (conf/engine/ray.yaml): Ray Train runs the ranks."""

    address: str | None
    connect_timeout_s: PositiveFloat
    scaling_config: Target  # ray.train.ScalingConfig: num_workers is the world size
    torch_config: Target
    failure_config: Target


class TrainConfig(RunConfig):
    engine: Engine | None = None
    ckpt_path: str | None
    resume: str | None = None
    test: bool
    optimized_metric: str | None
    optuna_trial: NonNegative | None = None  # set by the Optuna sweeper for its jobs (hparams_search=mnist_optuna)

    @model_validator(mode="after")
    def _batch_divides_into_processes(self) -> "TrainConfig":
        trainer = self.trainer.model_extra or {}
        devices, nodes = trainer.get("devices", "auto"), trainer.get("num_nodes", 1)
        per_node = len(devices) if isinstance(devices, list) else devices
        world = (
            per_node * nodes if _count(per_node) and per_node != -1 and _count(nodes) else 1
        )  # "auto": not yet known
        named_by = "trainer.devices x trainer.num_nodes"
        if self.engine is not None:
            if devices not in (1, "auto") or nodes != 1:
                raise ValueError(
                    f"engine=ray runs one rank per Ray worker, so trainer.devices={devices} and trainer.num_nodes={nodes} "
                    "would multiply them: leave both out and set engine.scaling_config.num_workers"
                )
            world = (self.engine.scaling_config.model_extra or {}).get("num_workers", 1)
            named_by = "engine.scaling_config.num_workers"
        batch = (self.data.model_extra or {}).get("batch_size")  # a data module of this project's kind: global
        if _count(batch) and _count(world) and world > 0 and batch % world:
            raise ValueError(indivisible_batch(batch, world, named_by))
        return self


def _count(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


class EvalConfig(RunConfig):
    ckpt_path: str


class Trust(Node):
    """conf/trust.yaml, read by the entry points that rebuild a checkpoint's network."""

    trusted_modules: list[str]  # the modules a checkpoint's config may name


class PredictConfig(Trust):
    task_name: str
    ckpt_path: str
    input: str
    output: str
    overwrite: bool
    max_pixels: Positive
    batch_size: Positive
    device: Literal["auto", "cpu", "cuda"]
    paths: Paths
    hydra: Any = None


class ExportConfig(Trust):
    task_name: str
    ckpt_path: str
    format: Literal["export", "onnx", "safetensors", "torchscript"]
    output_dir: str
    check_images: Positive
    tolerance: PositiveFloat
    paths: Paths
    hydra: Any = None


class ServeConfig(Trust):
    task_name: str
    ckpt_path: str
    host: str
    port: Annotated[int, Field(ge=1024, le=65535)]
    accelerator: Literal["auto", "cpu", "cuda"]
    devices: Literal["auto"] | Positive
    workers_per_device: Positive
    max_batch_size: Positive
    batch_timeout: Annotated[float, Field(ge=0)]
    max_inputs: Positive
    max_body_bytes: Positive
    timeout: PositiveFloat | int
    decode: dict[str, Any]  # a _partial_ function of conf/decode/: its keys are its arguments
    paths: Paths
    hydra: Any = None


class DemoConfig(Trust):
    task_name: str
    ckpt_path: str
    host: str
    port: Annotated[int, Field(ge=1024, le=65535)]
    top_classes: Positive
    brush: Positive
    canvas: Annotated[int, Field(ge=28)]
    decode: dict[str, Any]  # a _partial_ function of conf/decode/: its keys are its arguments
    paths: Paths
    hydra: Any = None


class StreamConfig(RunConfig):
    output: str
    chunk_bytes: str
    overwrite: bool


# The schema of each primary config of conf/ (and of the two its entry points share): what the entry point
# checks, and what json_schemas.py gives editors for the file.
PRIMARY: dict[str, type[Node]] = {
    "train": TrainConfig,
    "eval": EvalConfig,
    "run": RunConfig,
    "stream": StreamConfig,
    "predict": PredictConfig,
    "export": ExportConfig,
    "serve": ServeConfig,
    "demo": DemoConfig,
    "trust": Trust,
}


def check(cfg: DictConfig, schema: type[Node]) -> None:
    """Raise InputError naming the first key whose value does not fit ``schema``."""
    if missing := sorted(OmegaConf.missing_keys(cfg)):
        raise InputError(f"{missing[0]} needs a value: pass {missing[0]}=... on the command line")
    values = OmegaConf.to_container(cfg, resolve=True)
    try:
        schema.model_validate(values)
    except ValidationError as err:
        raise InputError(_describe(err, values)) from None
    assert isinstance(values, dict)
    # A value copied by interpolation (model.scheduler.T_max: ${trainer.max_epochs}) is checked after the
    # rest, so that a wrong value is named where the user gave it.
    copies = frozenset(_interpolations(OmegaConf.to_container(cfg, resolve=False), ""))
    for later in (copies, frozenset[str]()):
        for key, node in values.items():
            if key != "hydra":
                signatures.check_tree(node, str(key), later)


def _interpolations(value: Any, key: str) -> Iterator[str]:
    """The keys under ``key`` whose (unresolved) value is an interpolation."""
    if isinstance(value, str) and value.startswith("${"):
        yield key
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for name, item in items:
        yield from _interpolations(item, f"{key}.{name}" if key else str(name))


def _describe(err: ValidationError, values: Any) -> str:
    """The most specific wrong key as ``key=value: what is allowed``, the ways a union could match joined."""
    problems = [(p, *_config_key(p, values)) for p in err.errors(include_url=False)]
    first = problems[0][1]  # a union reports each member: the one that got furthest is the closest fit
    problem, key, value = max((p for p in problems if p[1].startswith(first)), key=lambda p: p[1].count("."))
    if problem["type"] == "missing":
        where = ".".join(map(str, problem["loc"]))
        return f"{where} is missing from the config: give it a value ({where}=...), as conf/ does"
    if problem["type"] == "extra_forbidden":
        parent, _, name = key.rpartition(".")
        node = values
        for part in filter(None, parent.split(".")):
            node = node.get(part, {}) if isinstance(node, dict) else {}
        hint = did_you_mean(parent, name, node if isinstance(node, dict) else ()) or "remove it, or check its spelling"
        return f"{key} is not a setting of {parent or 'the config'}: {hint}"
    if problem["type"] == "value_error":  # a check across keys (model_validator): its message names them
        return problem["msg"].removeprefix("Value error, ")
    allowed = [p["msg"].removeprefix("Input should be ") for p, k, _ in problems if k == key]
    others = len({k for _, k, _ in problems if not key.startswith(k)})
    return f"{key}={value}: should be {' or '.join(dict.fromkeys(allowed))}" + (
        f" (and {others} more key{'s' * (others > 1)})" if others else ""
    )


def _config_key(problem: Any, values: Any) -> tuple[str, Any]:
    """The config key a pydantic location points at, and its value. Pydantic puts the union member it
    tried (``int``, ``literal['auto']``, ``Strategy``) into the location: those parts are skipped."""
    loc = problem["loc"]
    path: list[str] = []
    for part in loc:
        if (isinstance(values, dict) and part in values) or (
            isinstance(values, list) and isinstance(part, int) and part < len(values)
        ):
            values = values[part]
        elif problem["type"] in ("missing", "extra_forbidden") and part == loc[-1]:
            return ".".join([*path, str(part)]), None
        else:
            continue
        path.append(str(part))
    return ".".join(path), values
