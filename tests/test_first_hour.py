"""A new user's first hour with the command line: loading tools, one-line errors, --version, tools, call."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import orjson
import pytest

MCPIPE = str(Path(sys.executable).with_name("mcpipe"))
"""The console script (which, unlike ``python -m``, does not put the current directory on sys.path)."""

REGISTRY = """
from mcpipe.tools import ToolRegistry

registry = ToolRegistry()


@registry.tool
def {name}(text: str) -> str:
    \"\"\"Reverse the text.\"\"\"
    return text[::-1]
"""


def mcpipe(*args: str, cwd: Path, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([MCPIPE, *args], cwd=cwd, capture_output=True, text=True, input=stdin, timeout=60)


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


@pytest.mark.parametrize("where", ["next to the config", "in the current directory"])
def test_python_tools_import_a_module_next_to_the_config_or_in_the_current_directory(tmp_path, where):
    module = f"fh_tools_{where.split()[-1]}"
    conf_dir, cwd = tmp_path / "conf", tmp_path / "work"
    cwd.mkdir()
    write((conf_dir if where == "next to the config" else cwd) / f"{module}.py", REGISTRY.format(name="flip"))
    config = write(conf_dir / "mcpipe.toml", f'python_tools = ["{module}:registry"]\n[audit]\nenabled = false\n')
    checked = mcpipe("check", "--config", str(config), cwd=cwd)
    assert checked.returncode == 0, checked.stderr
    listed = mcpipe("tools", "--config", str(config), "--json", cwd=cwd)
    assert listed.returncode == 0, listed.stderr
    assert "flip" in {t["name"] for t in orjson.loads(listed.stdout)}
