"""``mcpipe check --config`` reads a config's OpenAPI documents as ``serve`` does: the refused operations are
warnings, located; a document that cannot be read fails the check, located."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kit.openapi_standin import DOCUMENTS
from mcpipe.server.cli import check_config


def test_check_counts_the_tools_and_warns_of_each_refused_operation(tmp_path: Path, capsys: Any) -> None:
    config = tmp_path / "mcpipe.toml"
    config.write_text(
        f'[openapi.pets]\nspec = "{DOCUMENTS / "swagger-petstore-3.1.yaml"}"\nbase_url = "http://127.0.0.1:9"\n'
    )
    assert check_config(str(config)) == 0
    out, err = capsys.readouterr()
    assert "4 OpenAPI tools (2 operations refused)" in out
    assert f"warning: {config}:openapi.pets: paths./pet.put: a `$ref` is a string, not null" in err.splitlines()


def test_check_fails_on_a_document_it_cannot_read_located(tmp_path: Path, capsys: Any) -> None:
    config = tmp_path / "mcpipe.toml"
    config.write_text('[openapi.pets]\nspec = "missing.yaml"\nbase_url = "http://127.0.0.1:9"\n')
    assert check_config(str(config)) == 1
    _, err = capsys.readouterr()
    assert f"{config}:openapi.pets.spec" in err and "cannot read" in err
