"""The catalog's index by ``metadata.path`` reads at most ``MAX_SCAN`` playbook files of the scanned
directories (other files not counted), after the playbook's own directory, and finds the rest by file path."""

from __future__ import annotations

from pathlib import Path

import pytest

from mcpipe.formats.noetl import _catalog
from mcpipe.formats.noetl._catalog import Catalog


def _playbook(path: Path, catalog_path: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"metadata:\n  name: x\n  path: {catalog_path}\nworkflow: []\n")


def _never(file: str, stack: tuple[str, ...]) -> tuple[None, list[object]]:
    raise AssertionError("not compiled here")


def test_the_catalog_indexes_at_most_max_scan_playbook_files_of_its_scanned_directories(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_catalog, "MAX_SCAN", 3)
    own = tmp_path / "own"
    _playbook(own / "main.yaml", "own/main")
    _playbook(own / "sibling.yaml", "own/sibling")
    scanned = tmp_path / "scanned"
    for i, name in enumerate("abcde"):  # a.yaml ... e.yaml, walked in name order
        _playbook(scanned / f"{name}.yaml", f"lib/p{i}")
        (scanned / f"{name}.txt").write_text("not a playbook file: not counted")
    catalog = Catalog.around(_never, str(own / "main.yaml"), scan=[str(scanned)])
    found = {p: catalog.find(p) for p in ("own/sibling", "lib/p0", "lib/p1", "lib/p2", "lib/p3", "lib/p4")}
    assert found["own/sibling"] == str((own / "sibling.yaml").resolve())  # its own directory: not counted
    for i, name in enumerate("abc"):  # the first three playbook files walked, in name order
        assert found[f"lib/p{i}"] == str((scanned / f"{name}.yaml").resolve())
    assert found["lib/p3"] is None and found["lib/p4"] is None  # past the bound
    assert catalog.find("d") == str((scanned / "d.yaml").resolve())  # by file path, as ever
