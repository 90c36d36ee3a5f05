"""Every plugin type documents itself (``ppc-extproc plugins TYPE``): type, parameters, YAML."""

from __future__ import annotations

import pytest

from ppc_extproc.cli import main
from ppc_extproc.plugins.registry import plugin_doc, registered_types


@pytest.mark.parametrize("type_name", registered_types())
def test_each_plugin_type_has_a_doc_with_a_yaml_example(type_name: str) -> None:
    doc = plugin_doc(type_name)
    assert doc.startswith(f"``{type_name}``: ")
    assert "Type" in doc and "Parameters" in doc
    assert f"type: {type_name}" in doc  # a YAML example


def test_plugins_command_lists_and_documents(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plugins"]) == 0
    listing = capsys.readouterr().out
    assert all(t in listing for t in registered_types())
    assert main(["plugins", "queue-scorer"]) == 0
    assert "vllm:num_requests_waiting" in capsys.readouterr().out
    assert main(["plugins", "nope"]) == 2
