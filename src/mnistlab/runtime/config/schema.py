"""The type and range of every framework key in ``conf/``, checked as soon as Hydra has composed the config.

Entry points check here before they import torch and Lightning (5 s on a 2-core CPU; pydantic and
Hydra take 0.3 s): a mistyped value is answered at once, in one line that names the key, the value
and what is allowed, instead of a traceback from inside Lightning minutes into a run.

The models mirror the framework's config groups (trainer, strategy, paths, the machinery's callbacks,
the entry points' own keys). The user's parts (``data``, ``model`` and whatever else a node's
``_target_`` names) have no model here: every node Hydra instantiates is checked against its target's
own signature (``signatures.py``), so a data module of your own needs no schema to run.
"""

from typing import Annotated, Any, Literal

from omegaconf import DictConfig, OmegaConf
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from mnistlab.runtime.config import signatures
from mnistlab.runtime.config.checks import did_you_mean, indivisible_batch
from mnistlab.runtime.run.failures import InputError

Positive = Annotated[int, Field(ge=1)]
NonNegative = Annotated[int, Field(ge=0)]
PositiveFloat = Annotated[float, Field(gt=0)]
# Lightning's limit_*_batches: a fraction of the batches (float) or a number of them (int).
BatchLimit = Annotated[float, Field(ge=0, le=1)] | NonNegative | None
Precision = Literal["32-true", "32", 32, "bf16-mixed", "16-mixed", "bf16-true", "16-true", "64-true", "64", 64]


class Node(BaseModel):
    # strict: 10.0 is no number of epochs, "true" no boolean; Lightning asserts on both.
    model_config = ConfigDict(strict=True, extra="forbid")


class Target(Node):
    """A node Hydra instantiates: ``_target_`` names the class, the class checks what is not listed."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)
    target: str = Field(alias="_target_")
    partial: bool = Field(False, alias="_partial_")


class Timeout(Target):
    seconds: PositiveFloat


class Strategy(Target):
    process_group_backend: Literal["nccl", "gloo", "mpi"] | None = None
    start_method: Literal["popen", "spawn", "fork", "forkserver"] = "popen"
    timeout: Timeout | None = None
    find_unused_parameters: bool = False
    gradient_as_bucket_view: bool = False
    static_graph: bool = False
    sharding_strategy: Literal["FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD"] = "FULL_SHARD"
    cpu_offload: bool = False
    state_dict_type: Literal["full", "sharded"] = "full"


class Trainer(Target):
    default_root_dir: str
    accelerator: Literal["auto", "cpu", "gpu", "cuda", "mps"]
    devices: Positive | Literal["auto", -1] | list[NonNegative]
    num_nodes: Positive
    strategy: Literal["auto", "ddp", "ddp_spawn", "ddp_notebook", "fsdp", "deepspeed"] | Strategy
    max_epochs: Annotated[int, Field(ge=-1)] | None  # -1: no limit
    min_epochs: NonNegative | None = None
    max_steps: Annotated[int, Field(ge=-1)] = -1
    precision: Precision
    deterministic: bool | Literal["warn"]
    log_every_n_steps: Positive
    check_val_every_n_epoch: Positive | None
    limit_train_batches: BatchLimit
    limit_val_batches: BatchLimit
    limit_test_batches: BatchLimit
    num_sanity_val_steps: Annotated[int, Field(ge=-1)]
    gradient_clip_val: PositiveFloat | None
    accumulate_grad_batches: Positive
    plugins: list[Target] | None
    fast_dev_run: bool | NonNegative = False
    overfit_batches: Annotated[float, Field(ge=0, le=1)] | NonNegative = 0.0
    profiler: Target | Literal["simple", "advanced", "pytorch"] | None = None


class Optimizer(Target):  # any torch.optim class: the one argument they all share is torch's, checked here
    lr: PositiveFloat | None = None


class Model(Target):  # the LightningModule: its own signature checks its keys (signatures.py)
    optimizer: Optimizer | None = None


class Checkpoint(Target):
    dirpath: str
    filename: str
    monitor: str | None
    mode: Literal["min", "max"] = "min"
    save_top_k: Annotated[int, Field(ge=-1)]  # -1: all
    every_n_epochs: Positive | None
    every_n_train_steps: Positive | None


class EarlyStopping(Target):
    monitor: str
    mode: Literal["min", "max"]
    patience: NonNegative
    min_delta: Annotated[float, Field(ge=0)]


class SafeStopConfig(Target):
    checkpoint: str
    check_every_n_steps: Positive
    requeue: bool = True


class TestPicturesConfig(Target):
    misclassified: NonNegative
    png_dir: str | None


class Callbacks(Node):
    model_config = ConfigDict(extra="allow")  # a callback of your own: its class checks its arguments
    __pydantic_extra__: dict[str, Target | None]
    model_checkpoint: Checkpoint | None = None
    last_checkpoint: Checkpoint | None = None
    early_stopping: EarlyStopping | None = None
    safe_stop: SafeStopConfig | None = None
    test_pictures: TestPicturesConfig | None = None
    lr_monitor: Target | None = None
    progress_bar: Target | None = None
    model_summary: Target | None = None


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
    data: Target  # the data module: its own signature checks its keys (signatures.py)
    model: Model
    trainer: Trainer
    callbacks: Callbacks | None = None
    logger: dict[str, Target | None] | None = None  # logger=none removes the key
    paths: Paths
    hydra: Any = None  # Hydra's own config, when a test composes it in: typed by Hydra


class RayScaling(Target):  # ray.train.ScalingConfig
    num_workers: Positive
    use_gpu: bool = False


class Engine(Node):
    """engine=ray (conf/engine/ray.yaml): Ray Train runs the ranks."""

    address: str | None
    connect_timeout_s: PositiveFloat
    scaling_config: RayScaling
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
        devices, nodes = self.trainer.devices, self.trainer.num_nodes
        per_node = len(devices) if isinstance(devices, list) else devices
        world = per_node * nodes if isinstance(per_node, int) and per_node != -1 else 1  # "auto", -1: unknown yet
        named_by = "trainer.devices x trainer.num_nodes"
        if self.engine is not None:
            if devices not in (1, "auto") or nodes != 1:
                raise ValueError(
                    f"engine=ray runs one rank per Ray worker, so trainer.devices={devices} and trainer.num_nodes={nodes} "
                    "would multiply them: leave both out and set engine.scaling_config.num_workers"
                )
            world, named_by = self.engine.scaling_config.num_workers, "engine.scaling_config.num_workers"
        batch = (self.data.model_extra or {}).get("batch_size")  # a data module of this project's kind: global
        if isinstance(batch, int) and not isinstance(batch, bool) and batch % world:
            raise ValueError(indivisible_batch(batch, world, named_by))
        return self


class EvalConfig(RunConfig):
    ckpt_path: str


class PredictConfig(Node):
    task_name: str
    ckpt_path: str
    input: str
    output: str
    overwrite: bool
    max_pixels: Positive
    batch_size: Positive
    device: Literal["auto", "cpu", "cuda"]
    trusted_modules: list[str]  # conf/trust.yaml: the modules a checkpoint's config may name
    paths: Paths
    hydra: Any = None


class ExportConfig(Node):
    task_name: str
    ckpt_path: str
    format: Literal["export", "onnx", "safetensors", "torchscript"]
    output_dir: str
    check_images: Positive
    tolerance: PositiveFloat
    trusted_modules: list[str]  # conf/trust.yaml: the modules a checkpoint's config may name
    paths: Paths
    hydra: Any = None


class ServeConfig(Node):
    task_name: str
    ckpt_path: str
    host: str
    port: Annotated[int, Field(ge=1024, le=65535)]
    accelerator: Literal["auto", "cpu", "cuda"]
    devices: Literal["auto"] | Positive
    workers_per_device: Positive
    max_batch_size: Positive
    batch_timeout: Annotated[float, Field(ge=0)]
    max_images: Positive
    max_body_bytes: Positive
    timeout: PositiveFloat | int
    decode: dict[str, Any]  # a _partial_ function of conf/decode/: its keys are its arguments
    trusted_modules: list[str]  # conf/trust.yaml: the modules a checkpoint's config may name
    paths: Paths
    hydra: Any = None


class DemoConfig(Node):
    task_name: str
    ckpt_path: str
    host: str
    port: Annotated[int, Field(ge=1024, le=65535)]
    top_classes: Positive
    brush: Positive
    canvas: Annotated[int, Field(ge=28)]
    decode: dict[str, Any]  # a _partial_ function of conf/decode/: its keys are its arguments
    trusted_modules: list[str]  # conf/trust.yaml: the modules a checkpoint's config may name
    paths: Paths
    hydra: Any = None


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
    for key, node in values.items():
        if key != "hydra":
            signatures.check_tree(node, str(key))


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
