"""cookiecutter's post-generation hook: cookiecutter has written only ``.cookiecutter.json`` (the answers);
this copies the template's files in, the same that copier copies (``rename.template_files``), and runs the
same rename step as copier's task, so both generators give the same project from one copy of the code.
"""

import json
import shutil
import subprocess
import sys
from pathlib import Path

TEMPLATE = Path("{{ cookiecutter._repo_dir }}").resolve().parents[1]  # this repository (cookiecutter's clone)
sys.path.insert(0, str(TEMPLATE / "generator"))
from rename import template_files

project = Path.cwd()
for name in template_files(TEMPLATE):
    (project / name).parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(TEMPLATE / name, project / name)
answers = json.loads((project / ".cookiecutter.json").read_text())
options = {  # rename.py's options: the answers to copier.yml's questions
    "project": "project_name",
    "package": "package",
    "description": "description",
    "author": "author",
    "email": "email",
    "example": "example",
}
rename = [sys.executable, str(TEMPLATE / "generator" / "rename.py")]
rename += [f"--{option}={answers[key]}" for option, key in options.items()]
sys.exit(subprocess.run(rename, check=False).returncode)
