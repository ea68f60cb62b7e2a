"""Files from elsewhere that would run code if this project treated them as code: each test that reads
one checks that the marker file it would create never appears."""

import os
from pathlib import Path

MARKER = "payload-ran"  # created in the test's folder by any payload that runs


class Payload:
    """Unpickled, it runs ``touch <marker>``: what torch.load(weights_only=False) would do with it."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def config_payloads(marker: Path) -> list[dict]:
    """Network configs that would run code if instantiated: each passes torch.load(weights_only=True)."""
    touch = f"open({str(marker)!r}, 'w')"
    return [
        {"_target_": "builtins.exec", "_args_": [touch]},
        {"_target_": "os.system", "command": f"touch {marker}"},
        {"_target_": "mnistlab.tasks.os.system", "command": f"touch {marker}"},  # our prefix, not our class
        {"_target_": "mnistlab.trained.loading.torch.load", "f": str(marker), "weights_only": False},
        {"_target_": "subprocess.Popen", "args": ["touch", str(marker)]},
        {"_target_": "mnistlab.network.SimpleNN", "hidden": {"_target_": "builtins.exec", "_args_": [touch]}},
    ]
