"""cookiecutter's pre-generation hook: a package name that copier's question refuses (generator/rename.py's
``package_problem``: not an identifier, too long, or a name Python or a dependency has) is refused here in
one line, before anything is written."""

import json
import sys
from pathlib import Path

TEMPLATE = Path("{{ cookiecutter._repo_dir }}").resolve().parents[1]  # this repository (cookiecutter's clone)
sys.path.insert(0, str(TEMPLATE / "generator"))
from rename import package_problem

# As JSON, in a raw string whose quotes no JSON string holds: any name is data here.
package = json.loads(r'''{{ cookiecutter.package | tojson }}''')  # fmt: skip
if problem := package_problem(package):
    sys.exit(f"Error: package={package}: {problem}")
