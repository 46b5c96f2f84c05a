"""The formats' registry (``mcpipe.formats.FORMATS``): every format registers itself, is asked only when a
config uses it, and the server, the check and the audit log reach it only through the registry."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from mcpipe.config import parse_config
from mcpipe.formats import FORMATS, Format, audit_log, detect_config, format_named, turned_on
from mcpipe.server._app import tool_sources


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_every_registered_format_defines_a_format_under_its_name(name):
    fmt = format_named(name)
    assert isinstance(fmt, Format) and fmt.name == name


def test_a_config_turns_on_only_the_formats_whose_keys_it_sets(tmp_path: Path):
    plain = parse_config("[audit]\nenabled = false\n", "toml", base_dir=str(tmp_path))
    assert turned_on(plain) == []
    discord = parse_config("[audit]\nenabled = false\n[pipe]\nmcp_pipeline = true\n", "toml", base_dir=str(tmp_path))
    assert [f.name for f in turned_on(discord)] == ["discord"]


def test_the_discord_format_serves_mcp_pipeline_through_the_registry(tmp_path: Path):
    config = parse_config("[audit]\nenabled = false\n[pipe]\nmcp_pipeline = true\n", "toml", base_dir=str(tmp_path))
    names = {tool.name for source in tool_sources(config) for tool in source}
    assert "mcp_pipeline" in names


def test_the_audit_format_names_a_registered_format_or_is_mcpipes_own(tmp_path: Path):
    log = audit_log("mcpg", None, parse_config('[audit]\nformat = "mcpg"\n', "toml").audit)
    assert type(log).__module__ == "mcpipe.formats.mcpg._audit"
    assert audit_log("mcpipe", None, None) is None  # the server writes its own records then


def test_a_document_in_mcpipes_layout_is_claimed_by_no_format():
    assert detect_config({"pipelines": {}}) is None


def test_a_config_that_uses_no_format_imports_only_the_formats_that_tell_a_config_files_format(tmp_path: Path):
    config = tmp_path / "mcpipe.toml"
    config.write_text("[audit]\nenabled = false\n")
    script = textwrap.dedent(
        f"""
        import sys
        from mcpipe.config import load_config
        from mcpipe.server._app import tool_sources
        tool_sources(load_config({str(config)!r}))
        print(sorted(m for m in sys.modules if m.startswith("mcpipe.formats.")))
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    # Only the modules that tell a config file's format (mcpg's, 60 lines) are asked about every config.
    detectors = sorted(entry.module for entry in FORMATS.values() if entry.config_files)
    assert out.strip() == repr(detectors)
