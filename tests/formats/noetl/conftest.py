"""The services the golden playbooks ran against under the real NoETL, started for the tests on free ports:
the oracle kit's HTTP stand-in (``stand_in.py``) and a PostgreSQL server (each case gets a database)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from kit.realservers import listening, postgres_server

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="session")
def stand_in() -> Iterator[int]:
    """The kit's HTTP stand-in on a free port; yields the port."""
    with listening(
        lambda port: [sys.executable, str(HERE / "stand_in.py"), str(port)], stderr=subprocess.DEVNULL
    ) as port:
        yield port


@pytest.fixture(scope="session")
def noetl_postgres() -> Iterator[str]:
    """A PostgreSQL server for the cases' databases; yields its URL."""
    with postgres_server() as url:
        yield url
