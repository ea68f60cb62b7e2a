"""Writes the JSON Schemas of a project made without the example (``generator/blank/.schemas/``, and the
modelines of ``generator/blank/conf/``): its conf/ names the placeholder data module, not MNIST's, so the
template's own ``.schemas/`` would be stale there and its fast tier would fail. Run it after running
``python -m mnistlab.runtime.config.json_schemas`` for the template (generator/check fails until it is run):

    python generator/schemas.py

The project is rendered as the rename step renders it (package name kept), and the project's own command
writes its schemas, reading the placeholders' classes from the rendered sources."""

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from rename import BLANK, BLANK_REPLACES, TEMPLATE, template_files


def main() -> None:
    with tempfile.TemporaryDirectory() as folder:
        project = Path(folder)
        for name in template_files(TEMPLATE):
            (project / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(TEMPLATE / name, project / name)
        rename = [sys.executable, str(TEMPLATE / "generator" / "rename.py"), "--project=Blank", "--package=mnistlab"]
        subprocess.run([*rename, "--example=False"], cwd=project, check=True)
        env = {**os.environ, "PYTHONPATH": str(project / "src")}  # its placeholders, ahead of the template's
        command = [sys.executable, "-m", "mnistlab.runtime.config.json_schemas"]
        subprocess.run(command, cwd=project, env=env, check=True, stdout=subprocess.DEVNULL)
        for replaced in BLANK_REPLACES:
            shutil.rmtree(BLANK / replaced, ignore_errors=True)
            shutil.copytree(project / replaced, BLANK / replaced)
        for path in (BLANK / "conf").rglob("*.yaml"):  # the placeholders' configs, with their modelines
            shutil.copyfile(project / path.relative_to(BLANK), path)


if __name__ == "__main__":
    main()
