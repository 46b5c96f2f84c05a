"""The format rule (scripts/check_formats.py, run by ``make lint``): a format is named only in its own folder."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def rule() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_formats", ROOT / "scripts" / "check_formats.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["check_formats"] = module
    spec.loader.exec_module(module)
    return module


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in {"mcpipe/__init__.py": "", "mcpipe/formats/__init__.py": "", **files}.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return tmp_path


def test_the_package_names_no_format_outside_its_folder(rule):
    assert rule.check(ROOT / "python") == []


def test_an_import_and_an_identifier_naming_a_format_outside_its_folder_fail_the_command(rule, tmp_path, capsys):
    root = _tree(
        tmp_path,
        {
            "mcpipe/server/_app.py": (
                "def audit(a):\n"
                "    from mcpipe.formats.mcpg._audit import McpgAuditLog\n"
                "    return McpgAuditLog(a.path)\n"
            ),
        },
    )
    assert rule.main(["check_formats", str(root)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    where = f"{root}/mcpipe/server/_app.py"
    assert err == [
        f"{where}:2: the name `McpgAuditLog` names the format `mcpg` outside mcpipe/formats/mcpg/: reach it through"
        " mcpipe.formats.FORMATS",
        f"{where}:2: the name `mcpipe.formats.mcpg._audit` names the format `mcpg` outside mcpipe/formats/mcpg/:"
        " reach it through mcpipe.formats.FORMATS",
        f"{where}:3: the name `McpgAuditLog` names the format `mcpg` outside mcpipe/formats/mcpg/: reach it through"
        " mcpipe.formats.FORMATS",
    ]
    assert rule.main(["check_formats", str(ROOT / "python")]) == 0


def test_a_code_string_counts_but_prose_docstrings_and_comments_do_not(rule):
    source = (
        '"""Reads mcpg\'s audit format."""\n'
        "# mcpg's events\n"
        'KIND = "mcpg"\n'
        "def f(a):\n"
        '    """As discord answers."""\n'
        '    raise ValueError(f"{a}: piraeus refuses it")\n'
    )
    found = rule.check_source(source, "gateway.py", None)
    assert [line.split(": ", 1)[0] for line in found] == ["gateway.py:3"]
    assert "the string `mcpg` names the format `mcpg`" in found[0]


def test_a_format_names_itself_freely_in_its_folder_but_not_another(rule, tmp_path):
    root = _tree(
        tmp_path,
        {
            "mcpipe/formats/noetl/__init__.py": "from mcpipe.formats.noetl._steps import PlaybookTool\n",
            "mcpipe/formats/noetl/_steps.py": "def load_piraeus():\n    pass\n",
        },
    )
    assert [p.split(": ", 1)[1] for p in rule.check(root)] == [
        "the name `load_piraeus` names the format `piraeus` outside mcpipe/formats/piraeus/: reach it through"
        " mcpipe.formats.FORMATS"
    ]


def test_a_playbook_is_noetls_name(rule):
    found = rule.check_source("from mcpipe.formats import load_playbook\n", "config.py", None)
    assert found and "names the format `noetl`" in found[0]


def test_what_the_allow_list_names_may_stay_only_where_it_is_listed(rule):
    source = "def f(config):\n    return config.playbooks\n"
    assert rule.check_source(source, "config.py", None, rule.ALLOWED["mcpipe/config.py"]) == []
    assert len(rule.check_source(source, "gateway.py", None, rule.ALLOWED.get("mcpipe/gateway.py", ()))) == 1
