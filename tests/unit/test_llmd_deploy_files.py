"""deploy/llm-d-values.yaml and the Dockerfile: what runs the image under llm-d's chart."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from ppc_extproc.cli import build_parser
from ppc_extproc.cli.llmd import chart_argv, resolve

REPO = Path(__file__).resolve().parents[2]

#: The keys of llm-d's routerlib values.yaml (llm-d/llm-d-router: config/charts/routerlib/values.yaml)
#: under router.epp.image.
LLMD_IMAGE_KEYS = {"registry", "repository", "tag", "pullPolicy"}


def test_the_values_file_sets_the_image_and_nothing_else() -> None:
    values = yaml.safe_load((REPO / "deploy" / "llm-d-values.yaml").read_text())
    assert list(values) == ["router"] and list(values["router"]) == ["epp"] and list(values["router"]["epp"]) == ["image"]
    image = values["router"]["epp"]["image"]
    assert set(image) <= LLMD_IMAGE_KEYS and {"registry", "repository", "tag"} <= set(image)


def test_the_chart_args_with_the_values_file_parse_as_serve() -> None:
    # The values file sets no router.epp.flags, so the chart renders exactly this (one replica, a pool).
    args = ["--pool-name", "qwen", "--pool-namespace", "llm", "--pool-group", "inference.networking.k8s.io",
            "--zap-encoder", "json", "--config-file", "/config/default-plugins.yaml", "--grpc-health-port", "9003",
            "--tracing=false"]
    parsed = build_parser().parse_args(chart_argv(args))
    settings = resolve(parsed, env={"NAMESPACE": "llm", "POD_NAME": "qwen-epp-0"})
    assert parsed.handler.__name__ == "_serve" and parsed.grpc_port == 9002 and settings.admin_port is None
    assert settings.grpc_health_port == 9003 and settings.admin_address == "0.0.0.0"


def test_the_dockerfile_takes_llmd_args_and_has_a_healthcheck() -> None:
    text = (REPO / "Dockerfile").read_text()
    assert 'ENTRYPOINT ["ppc-extproc"]' in text  # the chart's args replace CMD ["serve"]
    healthcheck = re.search(r"^HEALTHCHECK .*?\n(?:\s+CMD .*)$", text, re.M | re.S)
    assert healthcheck is not None and "http://127.0.0.1:9090/healthz" in healthcheck.group(0)
    assert re.search(r"^EXPOSE .*\b9003\b", text, re.M)
