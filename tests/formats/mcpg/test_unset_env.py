"""``mcpipe check --config`` runs without the secrets (in CI, as mcpg's ``config check`` does): an environment
variable the file reads and the environment lacks is a located warning; ``mcpipe serve`` refuses the file, in
one located line, until it is set. Both layouts alike."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mcpipe.config import load_config
from mcpipe.errors import ConfigError, Problem
from mcpipe.server.cli import check_config

HERE = Path(__file__).parent
INDEX: dict[str, str] = json.loads((HERE / "upstream" / "INDEX.json").read_text())
REDIS = HERE / "upstream" / INDEX["examples/deployments/production-single-redis.yaml"]
WARNED = "environment variable `MCPG_REDIS_URL` is not set: `mcpipe serve` refuses the file until it is"
# The example's binding reads a token per call: served, it fails each call until the variable is set.
PER_CALL = (
    "mcp.capabilities.tools[0].backend.headers.Authorization: environment variable `ACCOUNTS_API_TOKEN` is not set: "
    "the binding that reads it fails each call until it is"
)


def test_checking_an_mcpg_example_with_an_unset_variable_is_ok_with_a_located_warning(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("MCPG_REDIS_URL", raising=False)
    monkeypatch.delenv("ACCOUNTS_API_TOKEN", raising=False)
    assert check_config(str(REDIS)) == 0
    out, err = capsys.readouterr()
    assert out.startswith(f"{REDIS}: ok")
    assert err.splitlines() == [f"warning: {REDIS}:{PER_CALL}", f"warning: {REDIS}:cluster.url: {WARNED}"]


def test_serving_an_mcpg_example_with_an_unset_variable_is_refused_in_one_located_line() -> None:
    env = {k: v for k, v in os.environ.items() if k != "MCPG_REDIS_URL"}
    got = subprocess.run(
        [sys.executable, "-m", "mcpipe", "serve", "--config", str(REDIS)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert got.returncode != 0
    assert got.stderr.splitlines() == [f"error: {REDIS}:cluster.url: environment variable `MCPG_REDIS_URL` is not set"]


def test_loading_refuses_an_unset_variable_unless_warnings_are_asked_for() -> None:
    with pytest.raises(ConfigError) as e:
        load_config(REDIS, environ={})
    assert [str(p) for p in e.value.problems] == [
        f"{REDIS}:cluster.url: environment variable `MCPG_REDIS_URL` is not set"
    ]
    assert e.value.problems[0].code == "INVALID_CONFIG"
    warnings: list[Problem] = []
    load_config(REDIS, environ={}, warnings=warnings)
    assert [str(w) for w in warnings] == [f"{REDIS}:{PER_CALL}", f"{REDIS}:cluster.url: {WARNED}"]


def test_mcpipes_own_layout_warns_alike_and_keeps_its_other_problems(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "c.toml"
    path.write_text('[mcpServers.a]\ncommand = "${NOPE_UNSET_X}"\n\n[mcpServers.b]\nurl = "ftp://x"\n')
    assert check_config(str(path)) == 1
    err = capsys.readouterr().err.splitlines()
    assert err == [
        f"error: {path}:mcpServers.b.url: must be an http:// or https:// URL",
        f"warning: {path}:mcpServers.a.command: environment variable `NOPE_UNSET_X` is not set: "
        "`mcpipe serve` refuses the file until it is",
    ]
