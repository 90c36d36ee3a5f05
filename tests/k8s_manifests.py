"""deploy/kubernetes/ read as kustomize builds it: the listed resources, the generated ConfigMaps,
the namespace and image overrides. Enough for the cross-checks in the tests; ``kubectl kustomize``
(when installed) is compared with this rendering in tests/unit/kubernetes/test_k8s_manifests.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy" / "kubernetes"
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition"}


def kustomization() -> dict[str, Any]:
    return yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())  # type: ignore[no-any-return]


def render() -> list[dict[str, Any]]:
    """Every object kustomize would emit (ConfigMap names without kustomize's hash suffix)."""
    k = kustomization()
    docs = [d for name in k["resources"] for d in yaml.safe_load_all((DEPLOY / name).read_text()) if d]
    for generator in k.get("configMapGenerator", []):
        data = {}
        for entry in generator["files"]:
            key, _, path = entry.rpartition("=")
            data[key or Path(path).name] = (DEPLOY / path).read_text()
        docs.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": generator["name"]}, "data": data})
    images = {i["name"]: f"{i.get('newName', i['name'])}:{i['newTag']}" for i in k.get("images", [])}
    for doc in docs:
        if doc["kind"] == "Namespace":
            doc["metadata"]["name"] = k["namespace"]
        elif doc["kind"] not in CLUSTER_SCOPED:
            doc["metadata"]["namespace"] = k["namespace"]
        for container in containers(doc):
            container["image"] = images.get(container["image"], container["image"])
    return docs


def containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    spec = doc.get("spec", {}).get("template", {}).get("spec", {})
    return list(spec.get("containers", []))


def objects(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def role_grants(docs: list[dict[str, Any]] | None = None) -> set[tuple[str, str, str]]:
    """(apiGroup, resource, verb) for every rule of every Role."""
    grants = set()
    for role in objects(docs or render(), "Role").values():
        for rule in role["rules"]:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    grants.update((group, resource, verb) for verb in rule["verbs"])
    return grants
