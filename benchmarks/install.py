# Part of the MNIST example: a project generated without it has no such file.
"""How long a fresh install takes, and how big it is: ``python benchmarks/install.py [--repeats 1]
[--only uv]``.

Four installs of this project, each into a new environment from an empty download cache: the core
(no extra) and ``dev`` (every extra and the test tools), each with pip (``pip install -e .`` /
``pip install -e ".[dev]"``, resolved afresh from PyPI) and with the lock (``uv sync --locked --no-dev`` /
``uv sync --locked``, uv.lock's hashed versions). For each: the wall time (the median of ``--repeats``),
the environment's size on disk, and the time as a fraction of pip's for the same set. pip reads no
configuration file, find-links or constraints here (``PIP_CONFIG_FILE=/dev/null``), so that a machine's
local wheels or caps do not stand in for the index. Prints a table and writes it as JSON to outputs/benchmarks/.
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from timing import ROOT, publish

INSTALLS = {  # name: (installer, the command, run in the project's folder; {venv} is the new environment)
    "core, pip": ("pip", ["{venv}/bin/python", "-m", "pip", "install", "--quiet", "-e", "."]),
    "dev, pip": ("pip", ["{venv}/bin/python", "-m", "pip", "install", "--quiet", "-e", ".[dev]"]),
    "core, uv.lock": ("uv", ["uv", "sync", "--quiet", "--locked", "--no-dev"]),
    "dev, uv.lock": ("uv", ["uv", "sync", "--quiet", "--locked"]),
}


def install(command: list[str], installer: str) -> tuple[float, int]:
    """Seconds of one cold install and the size of the environment it made, in bytes."""
    with tempfile.TemporaryDirectory(prefix="install-") as folder:
        venv, cache = Path(folder) / "venv", Path(folder) / "cache"
        # No wheels from this machine's disk, no constraints: what the index serves (certificates kept).
        local = {"PIP_FIND_LINKS", "PIP_CONSTRAINT", "UV_FIND_LINKS", "UV_CONSTRAINT", "VIRTUAL_ENV"}
        env = {k: v for k, v in os.environ.items() if k not in local} | {
            "PIP_CONFIG_FILE": os.devnull,
            "PIP_CACHE_DIR": str(cache),
            "UV_CACHE_DIR": str(cache),
            "UV_PROJECT_ENVIRONMENT": str(venv),  # uv sync's environment, in place of the project's .venv
        }
        if installer == "pip":  # the virtual environment is made before the clock starts, as a user has one
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        start = time.perf_counter()
        command = [part.format(venv=venv) for part in command]
        result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
        seconds = time.perf_counter() - start
        if result.returncode:
            raise SystemExit(f"{' '.join(command)} exited {result.returncode}:\n{result.stderr[-3000:]}")
        return seconds, _size(venv)


def _size(folder: Path) -> int:
    """Bytes on disk, each file once (uv links its files from its cache: they are the environment's too)."""
    return int(subprocess.run(["du", "-sb", str(folder)], capture_output=True, text=True, check=True).stdout.split()[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=1, help="cold installs of each kind (the median is kept)")
    parser.add_argument("--only", choices=["pip", "uv"], help="one installer's rows (pip's take minutes)")
    parser.add_argument("--out", type=Path, default=ROOT / "outputs" / "benchmarks", help="where the JSON goes")
    args = parser.parse_args()
    if shutil.which("uv") is None and args.only != "pip":
        raise SystemExit("uv is not installed: pip install uv")
    rows: dict[str, str] = {}
    seconds: dict[str, float] = {}
    for name, (installer, command) in INSTALLS.items():
        if args.only not in (None, installer):
            continue
        runs = [install(command, installer) for _ in range(args.repeats)]
        seconds[name] = statistics.median(s for s, _ in runs)
        size = statistics.median(b for _, b in runs) / 2**30
        rows[name] = f"{seconds[name]:.1f} s, {size:.2f} GiB"
    for part in ("core", "dev"):
        if f"{part}, pip" in seconds and f"{part}, uv.lock" in seconds:
            rows[f"{part}: uv.lock / pip (time)"] = f"{seconds[f'{part}, uv.lock'] / seconds[f'{part}, pip']:.2f}"
    publish(rows, args.out, "install")


if __name__ == "__main__":
    main()
