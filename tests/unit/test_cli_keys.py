from __future__ import annotations

import pytest
from vectors import load_vectors

from ppc_extproc.cli import main

VECTORS = load_vectors("llmd_hash_vectors.json")["hash_vectors"]


@pytest.mark.parametrize("vector", VECTORS, ids=[v["name"] for v in VECTORS])
def test_keys_command_prints_the_vector_keys(vector: dict, capsys: pytest.CaptureFixture[str]) -> None:
    argv = [
        "keys", "--model", vector["model"], "--tokens", vector["tokens"] if isinstance(vector["tokens"], str)
        else ",".join(map(str, vector["tokens"])), "--block-size", str(vector["blockSize"]),
        "--hash-seed", vector["hashSeed"], "--hash-algorithm", vector["algorithm"], "--parent", vector["parent"],
    ]
    if "extraPerBlock" in vector:
        import json

        argv += ["--extra-per-block", json.dumps(vector["extraPerBlock"])]
    assert main(argv) == 0
    assert capsys.readouterr().out.split() == vector["keys"]


def test_keys_rejects_bad_tokens(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["keys", "--model", "m", "--tokens", "1,x"])
    assert info.value.code == 2
    assert "expected comma-separated ints" in capsys.readouterr().err


def test_keys_rejects_bad_block_size(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["keys", "--model", "m", "--tokens", "1..16", "--block-size", "0"]) == 2
    assert "blockSizeTokens must be greater than 0" in capsys.readouterr().err
