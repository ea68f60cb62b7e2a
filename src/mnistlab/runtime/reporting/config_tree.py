"""The composed config as a tree: printed by global rank 0 when a run starts (``print_config``) and
saved as ``config_tree.txt`` in the run's folder, beside the YAML Hydra saves in ``.hydra/``."""

from pathlib import Path

from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig, OmegaConf
from rich.console import Console
from rich.tree import Tree

from mnistlab.runtime.run.run_folder import TREE_FILE

FIRST = ("data", "model", "trainer", "callbacks", "logger", "paths")  # the groups, then the top-level keys


@rank_zero_only
def show(cfg: DictConfig) -> None:
    if not cfg.get("print_config"):
        return
    # Here, not at the top: its highlighter (pygments) costs 0.3 s of every process's start, and only
    # rank 0 prints the tree.
    from rich.syntax import Syntax

    folder = Path(cfg.paths.output_dir)
    tree = Tree("config", guide_style="dim")
    keys = [k for k in FIRST if k in cfg] + [k for k in cfg if k not in FIRST and k != "hydra"]
    for key in keys:
        value = cfg[key]
        text = OmegaConf.to_yaml(value, resolve=True) if isinstance(value, DictConfig) else f"{value}\n"
        tree.add(str(key), style="bold").add(Syntax(text.rstrip(), "yaml", background_color="default"))
    Console(soft_wrap=True).print(tree)
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / TREE_FILE).open("w") as file:
        Console(file=file, width=120, color_system=None).print(tree)
