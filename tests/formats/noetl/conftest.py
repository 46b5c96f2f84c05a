"""The services the golden playbooks ran against under the real NoETL, started for the tests on free ports:
the oracle kit's HTTP stand-in (``stand_in.py``) and a PostgreSQL server (each case gets a database)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from kit.realservers import free_port, postgres_server, wait_for_port

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="session")
def stand_in() -> Iterator[int]:
    """The kit's HTTP stand-in on a free port; yields the port."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(HERE / "stand_in.py"), str(port)], stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port, proc)
        yield port
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="session")
def noetl_postgres() -> Iterator[str]:
    """A PostgreSQL server for the cases' databases; yields its URL."""
    with postgres_server() as url:
        yield url
