"""Write the OpenAPI schema of a Kubernetes CRD as a JSON Schema file that jsonschema can check a manifest
against (tests/test_kubernetes.py): ``python deploy/kubernetes/schemas/vendor.py <crd.yaml> <source URL>``.

The CRDs are Kubeflow's (Apache-2.0), from their release tags; the file records its source, and
``apiVersion`` and ``kind`` are pinned to the CRD's own, as the API server would. To follow a new
Kubeflow release, download the CRD from the new tag and run this again (docs/distributed.md).
"""

import json
import sys
from pathlib import Path

import yaml


def schema(crd: dict, source: str) -> dict:
    names, group = crd["spec"]["names"], crd["spec"]["group"]
    (version,) = [v for v in crd["spec"]["versions"] if v.get("storage")]
    openapi = version["schema"]["openAPIV3Schema"]
    openapi["properties"]["apiVersion"] = {"const": f"{group}/{version['name']}"}
    openapi["properties"]["kind"] = {"const": names["kind"]}
    openapi["required"] = sorted({*openapi.get("required", []), "apiVersion", "kind", "metadata", "spec"})
    return {"$comment": f"openAPIV3Schema of {names['kind']} {group}/{version['name']}, from {source}"} | openapi


def main(crd_file: str, source: str) -> None:
    crd = yaml.safe_load(Path(crd_file).read_text())
    target = Path(__file__).parent / f"{crd['spec']['names']['singular']}.json"
    target.write_text(json.dumps(schema(crd, source), indent=1, sort_keys=True) + "\n")
    print(f"wrote {target}")


if __name__ == "__main__":
    main(*sys.argv[1:])
