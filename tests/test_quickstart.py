"""The quick start (issue 24): README's two commands, and what ``make serve`` installs (only the server's
dependencies, beside the Rust core's build, with progress lines) where ``make test`` installs everything.

The time it takes from a fresh clone is measured by ``scripts/quickstart_time.py`` (docs/performance.md).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]


def test_the_readme_still_says_two_commands_make_serve_and_make_test():
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Two commands", 1)[1].split("\n## ", 1)[0]
    block = section.split("```sh\n", 1)[1].split("```", 1)[0]
    commands = [line.split("#", 1)[0].strip() for line in block.splitlines() if line.startswith("make")]
    assert commands == ["make serve", "make test"]


def dry_run(target: str, tmp_path: Path) -> str:
    """``make -n TARGET`` in an empty copy of the tree's Makefile (no venv yet: every install step shows)."""
    shutil.copy(ROOT / "Makefile", tmp_path / "Makefile")
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    (tmp_path / "rust").mkdir()
    (tmp_path / "Cargo.toml").touch()
    make = ["make", "--no-print-directory", "-n", target]
    out = subprocess.run(make, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_serve_installs_only_the_servers_dependencies_beside_the_core_build(tmp_path):
    serve = dry_run("serve", tmp_path)
    assert "[test]" not in serve and ".mcpipe-installed" not in serve
    assert "uv pip install" in serve and "-r .venv/serve-requirements.txt" in serve
    assert "pip install --disable-pip-version-check -v --no-build-isolation --no-deps -e ." in serve
    assert "cargo fetch --quiet & fetch=$!" in serve, "the crates download while the venv is created"
    assert re.search(r"\) & deps=\$!", serve), "the dependencies install in the background, beside the build"
    assert "progress_lines.py '[deps]'" in serve and "progress_lines.py '[core]'" in serve
    assert serve.rstrip().endswith(".venv/bin/mcpipe serve")


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_test_still_installs_everything_the_tests_need(tmp_path):
    setup = dry_run("setup", tmp_path)
    assert "pip install -q -e '.[test]'" in setup
    assert "touch .venv/.mcpipe-installed .venv/.mcpipe-serve" in setup


def test_the_serve_requirements_are_pyprojects_dependencies_without_extras():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    deps = project["dependencies"]
    assert not any(d.split("[")[0].split(">")[0] in {"pytest", "ruff", "mypy", "grpcio", "psycopg"} for d in deps)
    assert {"pytest>=8", "ruff>=0.6", "mypy>=1.10"} <= set(project["optional-dependencies"]["test"])
