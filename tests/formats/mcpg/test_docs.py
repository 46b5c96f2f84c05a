"""``docs/formats/mcpg.md`` stays true: its table of refusals is the front-end's own, and what it names exists."""

from __future__ import annotations

import re
from pathlib import Path

from mcpipe.formats.mcpg._refusals import table

ROOT = Path(__file__).resolve().parents[3]
DOC = ROOT / "docs" / "formats" / "mcpg.md"
BEGIN, END = "<!-- refusals:begin -->", "<!-- refusals:end -->"


def refusal_table(text: str) -> str:
    return text[text.index(BEGIN) + len(BEGIN) : text.index(END)].strip()


def test_the_page_shows_the_refusal_table_as_the_front_end_has_it() -> None:
    """Regenerate with ``python tests/formats/mcpg/test_docs.py`` after changing ``_refusals.py``."""
    assert refusal_table(DOC.read_text()) == table()


def test_the_files_the_page_names_exist() -> None:
    text = DOC.read_text().split("## Evidence")[0]  # the oracle's section names its own build's files
    for path in re.findall(r"`((?:python|tests|scripts|docs|examples)/[\w./-]+)`", text):
        assert (ROOT / path).exists(), path


def regenerate() -> None:
    text = DOC.read_text()
    start, stop = text.index(BEGIN) + len(BEGIN), text.index(END)
    DOC.write_text(text[:start] + "\n" + table() + "\n" + text[stop:])


if __name__ == "__main__":
    regenerate()
