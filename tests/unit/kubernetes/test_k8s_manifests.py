"""deploy/kubernetes/: names, ports, labels and selectors agree; the configuration loads with the
service's loader; the Envoy ConfigMap is envoy/envoy.yaml; the RBAC is the client's calls."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from typing import Any

import pytest
import yaml
from k8s_manifests import DEPLOY, REPO, containers, kustomization, objects, render, role_grants

from ppc_extproc.cli import build_parser
from ppc_extproc.cli.llmd import resolve
from ppc_extproc.config.epp import load_config_text
from ppc_extproc.discovery.kubernetes import KubernetesFlags, config_from_flags
from ppc_extproc.discovery.kubernetes.pool import parse_inference_pool
from ppc_extproc.server.health import LIVENESS_SERVICE, READINESS_SERVICE

DOCS = render()
NAMESPACE = kustomization()["namespace"]


def one(kind: str, name: str) -> dict[str, Any]:
    found = objects(DOCS, kind)
    assert name in found, f"no {kind} {name}; have {sorted(found)}"
    return found[name]


def pod_spec(deployment: dict[str, Any]) -> dict[str, Any]:
    return deployment["spec"]["template"]["spec"]  # type: ignore[no-any-return]


def container_port(deployment: dict[str, Any], name: str) -> int:
    ports = {p["name"]: p["containerPort"] for c in containers(deployment) for p in c.get("ports", []) if "name" in p}
    assert name in ports, f"{deployment['metadata']['name']} has no container port {name!r}"
    return int(ports[name])


def epp_args() -> Any:
    args = containers(one("Deployment", "ppc-extproc"))[0]["args"]
    return build_parser().parse_args(args)


def test_every_file_is_part_of_the_kustomization() -> None:
    k = kustomization()
    listed = set(k["resources"]) | {e.rpartition("=")[2] for g in k["configMapGenerator"] for e in g["files"]}
    on_disk = {str(p.relative_to(DEPLOY)) for p in DEPLOY.rglob("*.yaml")} - {"kustomization.yaml"}
    assert listed == on_disk
    kinds = sorted({d["kind"] for d in DOCS})
    assert kinds == ["ClusterRole", "ClusterRoleBinding", "ConfigMap", "Deployment", "Gateway", "HTTPRoute", "InferencePool", "Namespace", "Role",
                     "RoleBinding", "Service", "ServiceAccount"]


def test_envoy_configmap_is_envoy_yaml_byte_for_byte() -> None:
    data = one("ConfigMap", "envoy-config")["data"]
    assert data == {"envoy.yaml": (REPO / "envoy" / "envoy.yaml").read_text()}
    envoy = one("Deployment", "envoy")
    args = containers(envoy)[0]["args"]
    mount = containers(envoy)[0]["volumeMounts"][0]
    volume = {v["name"]: v for v in pod_spec(envoy)["volumes"]}[mount["name"]]
    assert volume["configMap"]["name"] == "envoy-config" and args[args.index("-c") + 1] == f"{mount['mountPath']}/envoy.yaml"


def test_envoy_reaches_the_service_and_is_reached_on_its_listener() -> None:
    config = yaml.safe_load(one("ConfigMap", "envoy-config")["data"]["envoy.yaml"])
    clusters = {c["name"]: c for c in config["static_resources"]["clusters"]}
    address = clusters["ext_proc"]["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]["socket_address"]
    service = one("Service", "ppc-extproc")
    assert address["address"] == service["metadata"]["name"]
    assert address["port_value"] in [p["port"] for p in service["spec"]["ports"]]
    assert clusters["ext_proc"]["type"] == "STRICT_DNS" and service["spec"]["clusterIP"] == "None"  # every replica
    listener = config["static_resources"]["listeners"][0]["address"]["socket_address"]["port_value"]
    envoy = one("Deployment", "envoy")
    assert container_port(envoy, "http") == listener
    assert one("Service", "envoy")["spec"]["ports"][0]["targetPort"] == "http"


def test_the_epp_configmap_loads_with_the_services_loader_and_matches_the_engines() -> None:
    epp = one("Deployment", "ppc-extproc")
    args = epp_args()
    mount = containers(epp)[0]["volumeMounts"][0]
    volume = {v["name"]: v for v in pod_spec(epp)["volumes"]}[mount["name"]]
    data = one("ConfigMap", volume["configMap"]["name"])["data"]
    key = args.config_file.removeprefix(mount["mountPath"] + "/")
    loaded = load_config_text(data[key], key)
    producer = next(p for p in loaded.roles.producers if p.type_name == "precise-prefix-cache-producer")
    kv = producer.config.kv_events.pod_discovery

    vllm = containers(one("Deployment", "vllm-qwen"))[0]
    flags = dict(a.removeprefix("--").split("=", 1) for a in vllm["args"] if "=" in a)
    events = json.loads(flags["kv-events-config"])
    model = vllm["command"][2]
    pool = parse_inference_pool(one("InferencePool", "vllm-qwen"))
    assert int(flags["block-size"]) == producer.config.token_processor.block_size_tokens
    assert events["enable_kv_cache_events"] is True and events["publisher"] == "zmq"
    assert events["endpoint"] == f"tcp://*:{kv.socket_port}" and events["replay_endpoint"] == f"tcp://*:{kv.replay_socket_port}"
    # The topic names the engine by the endpoint id the picker builds: pod IP (downward API) and port.
    assert events["topic"] == f"kv@$(POD_IP):{pool.target_ports[0]}@{model}"
    assert {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}} in vllm["env"]
    assert int(flags["port"]) == pool.target_ports[0] == container_port(one("Deployment", "vllm-qwen"), "http")
    assert {container_port(one("Deployment", "vllm-qwen"), n) for n in ("kv-events", "kv-replay")} == {
        kv.socket_port, kv.replay_socket_port}


def test_the_epp_watches_the_pool_in_its_own_namespace() -> None:
    epp = one("Deployment", "ppc-extproc")
    args = epp_args()
    pool = one("InferencePool", "vllm-qwen")
    assert args.pool_name == pool["metadata"]["name"]
    assert args.pool_group == pool["apiVersion"].split("/")[0]
    env = {e["name"]: e for e in containers(epp)[0]["env"]}
    assert env["NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    flags = KubernetesFlags(pool_name=args.pool_name, pool_namespace=args.pool_namespace, pool_group=args.pool_group)
    config = config_from_flags(flags, environ={"NAMESPACE": NAMESPACE}, config_file=None)
    assert config is not None and config.namespace == pool["metadata"]["namespace"] == NAMESPACE


def test_ports_probes_and_the_pool_point_at_the_service() -> None:
    epp = one("Deployment", "ppc-extproc")
    args = epp_args()
    service = one("Service", "ppc-extproc")
    ports = {p["name"]: p for p in service["spec"]["ports"]}
    assert container_port(epp, ports["grpc-ext-proc"]["targetPort"]) == args.grpc_port
    assert container_port(epp, ports["http-metrics"]["targetPort"]) == args.admin_port
    assert args.admin_address == "0.0.0.0"  # Prometheus scrapes from outside the pod
    annotations = epp["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true" and int(annotations["prometheus.io/port"]) == args.admin_port
    container = containers(epp)[0]
    # ext_proc serves TLS, which kubelet's gRPC probes cannot speak: they go to the health port.
    settings = resolve(args, env={})
    assert settings.tls_self_signed and settings.grpc_health_port == container_port(epp, "grpc-health")
    assert container["readinessProbe"]["grpc"] == {"port": settings.grpc_health_port, "service": READINESS_SERVICE}
    assert container["livenessProbe"]["grpc"] == {"port": settings.grpc_health_port, "service": LIVENESS_SERVICE}
    assert "appProtocol" not in ports["grpc-ext-proc"]  # kubernetes.io/h2c would say cleartext
    ext_proc = next(c for c in yaml.safe_load((DEPLOY / "config" / "envoy.yaml").read_text())["static_resources"]["clusters"]
                    if c["name"] == "ext_proc")
    assert ext_proc["transport_socket"]["name"] == "envoy.transport_sockets.tls"
    ref = one("InferencePool", "vllm-qwen")["spec"]["endpointPickerRef"]
    assert (ref["kind"], ref["name"], ref["port"]["number"]) == ("Service", "ppc-extproc", ports["grpc-ext-proc"]["port"])
    assert ref["failureMode"] in ("FailOpen", "FailClose")


def test_the_httproute_sends_the_gateways_traffic_to_the_pool() -> None:
    route = one("HTTPRoute", "vllm-qwen")["spec"]
    gateway = one("Gateway", "inference-gateway")
    assert route["parentRefs"] == [{"group": "gateway.networking.k8s.io", "kind": "Gateway",
                                    "name": gateway["metadata"]["name"]}]
    backends = [ref for rule in route["rules"] for ref in rule["backendRefs"]]
    pool = one("InferencePool", "vllm-qwen")
    assert backends == [{"group": "inference.networking.k8s.io", "kind": "InferencePool",
                         "name": pool["metadata"]["name"]}]
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1"


def test_selectors_pick_exactly_their_own_pods() -> None:
    deployments = objects(DOCS, "Deployment")
    pod_labels = {name: d["spec"]["template"]["metadata"]["labels"] for name, d in deployments.items()}
    for name, d in deployments.items():
        assert d["spec"]["selector"]["matchLabels"].items() <= pod_labels[name].items()
    for name, service in objects(DOCS, "Service").items():
        selected = [n for n, labels in pod_labels.items() if service["spec"]["selector"].items() <= labels.items()]
        assert selected == [name], f"Service {name} selects {selected}"
    pool = parse_inference_pool(one("InferencePool", "vllm-qwen"))
    assert [n for n, labels in pod_labels.items() if pool.selector.matches(labels)] == ["vllm-qwen"]


def test_rbac_binds_exactly_the_client_calls_to_the_service_account() -> None:
    epp = one("Deployment", "ppc-extproc")
    account = pod_spec(epp)["serviceAccountName"]
    assert account in objects(DOCS, "ServiceAccount")
    binding = one("RoleBinding", "ppc-extproc")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "ppc-extproc"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}]
    # test_k8s_rbac.py (integration) shows these are exactly the calls the client makes.
    assert role_grants(DOCS) == {("", "pods", "list"), ("", "pods", "watch"),
                                 ("inference.networking.k8s.io", "inferencepools", "list"),
                                 ("inference.networking.k8s.io", "inferencepools", "watch"),
                                 ("coordination.k8s.io", "leases", "get"), ("coordination.k8s.io", "leases", "create"),
                                 ("coordination.k8s.io", "leases", "update"),
                                 *((group, plural, verb) for group in ("llm-d.ai", "inference.networking.x-k8s.io")
                                   for plural in ("inferencemodelrewrites", "inferenceobjectives")
                                   for verb in ("list", "watch"))}


@pytest.mark.integration
@pytest.mark.skipif(shutil.which("kubectl") is None, reason="needs kubectl (kustomize) to render the manifests")
def test_kubectl_kustomize_renders_the_same_objects() -> None:
    out = subprocess.run(["kubectl", "kustomize", str(DEPLOY)], check=True, capture_output=True, text=True, timeout=120).stdout
    rendered = [d for d in yaml.safe_load_all(out) if d]

    def strip(name: str, kind: str) -> str:
        return re.sub(r"-[a-z0-9]{10}$", "", name) if kind == "ConfigMap" else name

    assert sorted((d["kind"], strip(d["metadata"]["name"], d["kind"]), d["metadata"].get("namespace")) for d in rendered) == \
        sorted((d["kind"], d["metadata"]["name"], d["metadata"].get("namespace")) for d in DOCS)
    config_maps = {strip(d["metadata"]["name"], "ConfigMap"): d for d in rendered if d["kind"] == "ConfigMap"}
    assert config_maps["envoy-config"]["data"] == one("ConfigMap", "envoy-config")["data"]
    volumes = [v["configMap"]["name"] for d in rendered if d["kind"] == "Deployment"
               for v in d["spec"]["template"]["spec"].get("volumes", []) if "configMap" in v]
    assert sorted(volumes) == sorted(d["metadata"]["name"] for d in config_maps.values())  # hashed names referenced


def test_chat_is_tokenized_from_the_tokenizer_files_the_init_container_copies() -> None:
    """The epp config runs a local token producer; the init container writes the served model's
    tokenizer into the Hugging Face cache layout at the HF_HUB_CACHE the service reads; vLLM serves
    the render routes the producer falls back to."""
    epp = one("Deployment", "ppc-extproc")
    args = epp_args()
    mount = containers(epp)[0]["volumeMounts"][0]
    volume = {v["name"]: v for v in pod_spec(epp)["volumes"]}[mount["name"]]
    data = one("ConfigMap", volume["configMap"]["name"])["data"]
    loaded = load_config_text(data[args.config_file.removeprefix(mount["mountPath"] + "/")])
    token = next(p for p in loaded.roles.producers if p.type_name == "token-producer")
    assert token.backend_name == "local" and loaded.warnings == []  # type: ignore[attr-defined]
    env = {e["name"]: e.get("value") for e in containers(epp)[0]["env"]}
    (init,) = pod_spec(epp)["initContainers"]
    script = init["command"][-1]
    model = containers(one("Deployment", "vllm-qwen"))[0]["command"][2]
    hub = env["HF_HUB_CACHE"]
    assert f"dst={hub}/models--{model.replace('/', '--')}" in script and 'refs/main"' in script
    shared = {m["name"] for m in init["volumeMounts"]} & {m["name"] for m in containers(epp)[0]["volumeMounts"]}
    assert any(hub.startswith(m["mountPath"]) for m in containers(epp)[0]["volumeMounts"] if m["name"] in shared)
    assert "--enable-scale-out" in containers(one("Deployment", "vllm-qwen"))[0]["args"]
