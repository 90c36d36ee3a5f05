"""The kustomize tree, rendered by ``kubectl kustomize``, passes an offline schema check: built-in
kinds with kubernetes-validate (strict: an unknown field fails), InferencePool, HTTPRoute and
Gateway against their CRDs' OpenAPI schemas (tests/fixtures/crd-schemas, from GIE and Gateway API).
Every rendered object is checked by one of the two; a broken object fails."""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from k8s_manifests import DEPLOY

SCHEMAS = Path(__file__).resolve().parents[2] / "fixtures" / "crd-schemas"
K8S_VERSION = "1.31.0"

pytestmark = pytest.mark.skipif(shutil.which("kubectl") is None, reason="needs kubectl (kustomize)")


def crd_schemas() -> dict[tuple[str, str], dict[str, Any]]:
    """(apiVersion, kind) → openAPIV3Schema."""
    out = {}
    for path in SCHEMAS.glob("*.json"):
        doc = json.loads(path.read_text())
        out[(f"{doc['group']}/{doc['version']}", doc["kind"])] = doc["openAPIV3Schema"]
    return out


def rendered() -> list[dict[str, Any]]:
    out = subprocess.run(["kubectl", "kustomize", str(DEPLOY)], check=True, capture_output=True, text=True,
                         timeout=120).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def check(obj: dict[str, Any], crds: dict[tuple[str, str], dict[str, Any]]) -> None:
    """Raise when ``obj`` does not validate (jsonschema or kubernetes-validate errors)."""
    schema = crds.get((obj["apiVersion"], obj["kind"]))
    if schema is not None:
        jsonschema.validate(obj, schema, cls=jsonschema.Draft7Validator)
    else:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def test_every_rendered_object_passes_its_schema() -> None:
    crds = crd_schemas()
    docs = rendered()
    kinds = {d["kind"] for d in docs}
    assert {"InferencePool", "HTTPRoute", "Gateway", "Deployment", "Role"} <= kinds
    for obj in docs:
        check(obj, crds)


@pytest.mark.parametrize(("kind", "breakage"), [
    ("InferencePool", lambda o: o["spec"].update(targetPorts=[{"number": "eight thousand"}])),
    ("InferencePool", lambda o: o["spec"].pop("selector")),
    ("HTTPRoute", lambda o: o["spec"]["rules"][0]["backendRefs"][0].update(weight=-1)),
    ("Gateway", lambda o: o["spec"].pop("listeners")),
    ("Deployment", lambda o: o["spec"]["template"]["spec"].update(containerz=[])),
    ("Role", lambda o: o["rules"][0].update(verbs="get")),
])
def test_a_broken_object_fails_the_check(kind: str, breakage: Any) -> None:
    crds = crd_schemas()
    obj = copy.deepcopy(next(d for d in rendered() if d["kind"] == kind))
    breakage(obj)
    with pytest.raises((jsonschema.ValidationError, kubernetes_validate.ValidationError)):
        check(obj, crds)
