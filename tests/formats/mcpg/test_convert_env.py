"""A converted mcpg file reads ``${env.NAME}`` where the mcpg file did (issue 27, items 21 and 22).

``mcpipe convert`` keeps ``${env.NAME}`` as written; mcpipe's own layout reads it when the file loads, in every
string (a database URL, a store's, a registry's header, a step's field), as mcpg reads its file. So the
orders example converted writes to the database ``ORDERS_DB`` names, not to a file named ``${env.ORDERS_DB}``.
And ``mcpipe check --config`` of an mcpg file warns, located, of an unset variable a binding reads.
"""

from __future__ import annotations

import os
import subprocess
import sys
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
import yaml
from mcp import Client

from kit.servers import start_process
from mcpipe.config import load_config, parse_config
from mcpipe.errors import ConfigError
from mcpipe.server import open_app

ROOT = Path(__file__).resolve().parents[3]
ORDERS = ROOT / "examples" / "mcpg" / "orders.yaml"


def _mcpipe(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mcpipe", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, **(env or {})},
        cwd=cwd,
    )


@asynccontextmanager
async def _served(config: Path, env: dict[str, str]) -> Any:
    args = [sys.executable, "-m", "mcpipe", "serve", "--config", str(config), "--http", "127.0.0.1:0"]
    with trio.fail_after(60):
        proc, url = await start_process(args, env)
    try:
        with trio.fail_after(60):
            async with Client(url) as client:
                yield client
    finally:
        proc.terminate()
        with trio.move_on_after(10):
            await proc.wait()
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def _orders_answers(config: Path, db: Path) -> list[Any]:
    async with _served(config, {"ORDERS_DB": str(db)}) as c:
        init = await c.call_tool("orders.init", {})
        charged = await c.call_tool("charge_order", {"order_id": "A-17", "role": "admin", "id": 5, "u": 1})
        left = await c.call_tool("orders.db", {"id": 5})
        stock = await c.read_resource("orders://stock")
    return [
        (init.is_error, {k: v for k, v in (init.structured_content or {}).items() if k != "duration_ms"}),
        (charged.is_error, (charged.structured_content or {}).get("result")),
        (left.is_error, [b.model_dump() for b in left.content]),
        [x.model_dump() for x in stock.contents],
    ]


async def test_the_orders_example_converted_writes_to_the_database_orders_db_names_and_answers_the_same(
    tmp_path: Path,
) -> None:
    converted = tmp_path / "converted" / "orders.yaml"
    converted.parent.mkdir()
    done = _mcpipe("convert", "--config", str(ORDERS))
    assert done.returncode == 0, done.stderr
    assert "${env.ORDERS_DB}" in done.stdout  # kept as written: no secret of this shell in the output
    converted.write_text(done.stdout)
    original = await _orders_answers(ORDERS, tmp_path / "original.db")
    again = await _orders_answers(converted, tmp_path / "converted.db")
    assert again == original
    assert original[1] == (False, {"order": "A-17", "recorded": 1})
    assert original[2] == (False, [{"type": "text", "text": "2", "annotations": None, "meta": None}])
    # Each wrote to the database its ORDERS_DB names; nothing is named after the reference.
    assert (tmp_path / "original.db").stat().st_size > 0 and (tmp_path / "converted.db").stat().st_size > 0
    assert [p.name for p in converted.parent.iterdir()] == ["orders.yaml"]
    assert not list(ROOT.glob("**/${env.ORDERS_DB}*"))


def test_a_converted_file_reads_env_references_in_every_section_it_loads(tmp_path: Path) -> None:
    mcpg = {
        "cluster": {"kind": "redis", "url": "${env.T_REDIS_URL}"},
        "mcp": {
            "capabilities": {
                "tools": [
                    {
                        "name": "q",
                        "description": "d",
                        "governance": {"minimum_trust": "unauthenticated"},
                        "backend": {
                            "kind": "sql",
                            "driver": "sqlite",
                            "url": "sqlite:${env.T_DB}",
                            "query": {"sql": "SELECT 1", "row_mode": "scalar"},
                        },
                    }
                ]
            }
        },
    }
    source = tmp_path / "mcpg.yaml"
    source.write_text(yaml.safe_dump(mcpg))
    done = _mcpipe("convert", "--config", str(source))
    assert done.returncode == 0, done.stderr
    converted = tmp_path / "mcpipe.yaml"
    converted.write_text(done.stdout)
    env = {"T_REDIS_URL": "redis://127.0.0.1:6390/2", "T_DB": str(tmp_path / "q.db")}
    mine, theirs = load_config(converted, environ=env), load_config(source, environ=env)
    assert mine.store.url == theirs.store.url == "redis://127.0.0.1:6390/2"
    assert mine.sql["q"].url == theirs.sql["q"].url == f"sqlite:///{tmp_path / 'q.db'}"
    # Unset, each is a located problem (mcpg refuses to start without it): serve refuses, check warns.
    with pytest.raises(ConfigError) as e:
        load_config(converted, environ={})
    assert [str(p) for p in e.value.problems] == [
        f"{converted}:sql.q.url: environment variable `T_DB` is not set",
        f"{converted}:store.url: environment variable `T_REDIS_URL` is not set",
    ]
    checked = _mcpipe("check", "--config", str(converted))  # neither is set here
    assert checked.returncode == 0, checked.stderr
    assert checked.stderr.splitlines() == [
        f"warning: {converted}:sql.q.url: environment variable `T_DB` is not set: `mcpipe serve` refuses the file "
        "until it is",
        f"warning: {converted}:store.url: environment variable `T_REDIS_URL` is not set: `mcpipe serve` refuses the "
        "file until it is",
    ]


def test_check_of_an_mcpg_file_warns_of_an_unset_variable_a_binding_reads_where_it_is_read(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "ORDERS_DB"}
    done = subprocess.run(
        [sys.executable, "-m", "mcpipe", "check", "--config", str(ORDERS)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )
    assert done.returncode == 0
    assert done.stdout.startswith(f"{ORDERS}: ok")
    tail = "environment variable `ORDERS_DB` is not set: the binding that reads it fails each call until it is"
    assert done.stderr.splitlines() == [
        f"warning: {ORDERS}:mcp.capabilities.tools[0].backend.steps[0].backend: {tail}",
        f"warning: {ORDERS}:mcp.capabilities.tools[1].backend.url: {tail}",
        f"warning: {ORDERS}:mcp.capabilities.tools[2].backend.steps[4].backend: {tail}",
        f"warning: {ORDERS}:mcp.capabilities.resources[0].backend.url: {tail}",
    ]


async def test_an_mcpg_pipeline_whose_database_reads_an_unset_variable_fails_each_call_saying_so() -> None:
    """Not an in-memory database in its place: the call fails, naming the variable."""
    config = parse_config(ORDERS.read_text(), "yaml", environ={})
    with trio.fail_after(30):
        async with open_app(config) as app, Client(app.server) as c:
            init = await c.call_tool("orders.init", {})
            lookup = await c.call_tool("orders.db", {"id": 5})
    assert init.is_error and lookup.is_error
    for result in (init, lookup):
        assert "environment variable 'ORDERS_DB' is not set" in result.content[0].text  # type: ignore[union-attr]
