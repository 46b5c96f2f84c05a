"""The proxy bench runs mcpg inside the run's temporary folder (``proxy_peer.mcpg_process``), so what mcpg
writes into its working directory (its built-in audit sink's ``./mcpg-audit.log``) never lands in the checkout.

A stand-in for the mcpg binary does what mcpg does at start that matters here: reads ``MCPG_CONFIG``, writes
``./mcpg-audit.log`` and listens on the config's ``bind_address``."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest

from proxy_peer import mcpg_process, process

STAND_IN = f"""#!{sys.executable}
import os, re, socket, time
text = open(os.environ["MCPG_CONFIG"]).read()
port = int(re.search(r'bind_address: "127.0.0.1:(\\d+)"', text).group(1))
open("mcpg-audit.log", "a").write("{{}}\\n")
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", port))
s.listen()
time.sleep(60)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the bench reads /proc")
def test_mcpg_writes_its_audit_log_in_the_runs_temporary_folder_not_where_the_bench_was_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    binary = tmp_path / "mcpg"
    binary.write_text(STAND_IN)
    binary.chmod(binary.stat().st_mode | stat.S_IXUSR)
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    run = tmp_path / "run"
    run.mkdir()
    monkeypatch.chdir(checkout)
    with mcpg_process("../mcpg", run, "http://127.0.0.1:1/mcp") as (url, proc):
        assert url.startswith("http://127.0.0.1:") and url.endswith("/mcp")
        assert Path(f"/proc/{proc.pid}/cwd").resolve() == (run / "mcpg").resolve()
    assert (run / "mcpg" / "mcpg-audit.log").read_text() == "{}\n"
    assert os.listdir(checkout) == []


def test_a_server_that_cannot_start_is_answered_in_one_line_naming_it(tmp_path: Path) -> None:
    missing = str(tmp_path / "no-such-python")
    with pytest.raises(SystemExit) as info, process([missing, "serve"], "base"):
        pass
    message = str(info.value)
    assert "cannot start the base" in message and missing in message and "\n" not in message
