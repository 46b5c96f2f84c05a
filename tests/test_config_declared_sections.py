"""The config's ``pipelines``, ``outbound`` and ``sql`` sections are typed: :class:`mcpipe.config.Config` holds each
as the Struct of the package that owns it (:class:`mcpipe.declared.PipelineConfig`,
:class:`mcpipe.declared.OutboundConfig`, :class:`mcpipe.backends.sql.SqlBackendConfig`), decoded by
:mod:`mcpipe.declared` as it compiles them. A value of the wrong type and an unknown key are refused, each in one
line located in the file; a valid section reads back as it was written.
"""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from mcpipe.backends.sql import SqlBackendConfig
from mcpipe.config import Config, ConfigError, Loaded, load
from mcpipe.declared import OutboundConfig, OutboundHttpConfig, PipelineConfig

PIPELINE = {
    "name": "p",
    "description": "Says one.",
    "input_schema": {"type": "object"},
    "steps": [{"id": "v", "kind": "value", "value": 1}],
}

ROWS = [{"id": "q", "kind": "sql", "backend": "db", "sql": "SELECT 1 AS one"}]

VALID = {
    "audit": {"enabled": False},
    "outbound": {
        "http": {"allowed_hosts": ["api.example.com", "*.example.org"], "timeout_ms": 5000.0},
        "commands": {"sh": "/bin/sh", "jq": ["/usr/bin/jq", "-c"]},
        "command_timeout_ms": 2000.0,
    },
    "sql": {"db": {"url": "sqlite://", "pool_size": 1, "max_rows": 50}},
    "pipelines": [
        PIPELINE,
        {
            "name": "rows",
            "input_schema": {"type": "object", "properties": {"n": {"type": "integer"}}},
            "steps": ROWS,
            "timeout_ms": 1000.0,
            "annotations": {"readOnlyHint": True},
        },
    ],
}


def write(tmp_path: Path, doc: dict[str, object]) -> Path:
    path = tmp_path / "mcpipe.json"
    path.write_text(json.dumps({"audit": {"enabled": False}, **doc}))
    return path


def problems_of(path: Path) -> list[str]:
    with pytest.raises(ConfigError) as e:
        load(path, environ={})
    return [str(p) for p in e.value.problems]


@pytest.mark.parametrize(
    ("doc", "problem"),
    [
        (
            {"outbound": {"command_timeout_ms": "soon"}},
            "outbound.command_timeout_ms: Expected `float | null`, got `str`",
        ),
        (
            {"outbound": {"http": {"allowed_hosts": ["api.example.com", 3]}}},
            "outbound.http.allowed_hosts[1]: Expected `str`, got `int`",
        ),
        ({"outbound": {"commands": {"jq": []}}}, "outbound.commands.jq: a command needs an executable"),
        ({"sql": {"db": {"url": "sqlite://", "pool_size": "four"}}}, "sql.db.pool_size: Expected `int`, got `str`"),
        ({"sql": {"db": 3}}, "sql.db: a sql backend must be an object, got number"),
        ({"pipelines": [{**PIPELINE, "description": 3}]}, "pipelines.p.description: Expected `str`, got `int`"),
        ({"pipelines": [{**PIPELINE, "timeout_ms": -1}]}, "pipelines.p.timeout_ms: Expected `float` > 0.0"),
    ],
)
def test_each_declared_section_refuses_a_value_of_the_wrong_type_in_one_located_line(
    tmp_path: Path, doc: dict[str, object], problem: str
) -> None:
    path = write(tmp_path, doc)
    found = problems_of(path)
    assert len(found) == 1 and "\n" not in found[0], found
    assert found[0].startswith(f"{path}:{problem}"), found


@pytest.mark.parametrize(
    ("doc", "problem"),
    [
        ({"outbound": {"comands": {}}}, "outbound.comands: unknown field `comands` (did you mean `commands`?)"),
        ({"outbound": {"http": {"colour": "red"}}}, "outbound.http.colour: unknown field `colour`"),
        ({"outbound": {"python": {"worker": 2}}}, "outbound.python.worker: unknown field `worker`"),
        ({"sql": {"db": {"url": "sqlite://", "pool": 2}}}, "sql.db.pool: unknown field `pool`"),
        ({"pipelines": [{**PIPELINE, "outptu": 1}]}, "pipelines.p.outptu: unknown field `outptu`"),
    ],
)
def test_each_declared_section_refuses_an_unknown_key_in_one_located_line(
    tmp_path: Path, doc: dict[str, object], problem: str
) -> None:
    path = write(tmp_path, doc)
    found = problems_of(path)
    assert len(found) == 1 and "\n" not in found[0], found
    assert found[0].startswith(f"{path}:{problem}"), found


def test_a_section_that_is_not_a_table_is_refused_at_its_key(tmp_path: Path) -> None:
    path = tmp_path / "mcpipe.json"
    path.write_text('{"outbound": 3, "sql": [1], "pipelines": {"a": 1}}')
    assert problems_of(path) == [
        f"{path}:outbound: expected `object | null`, got `int`",
        f"{path}:sql: expected `object`, got `array`",
        f"{path}:pipelines: expected `array`, got `object`",
    ]


def test_the_config_holds_each_declared_section_as_its_owners_struct(tmp_path: Path) -> None:
    config = load(write(tmp_path, VALID), environ={}).config
    assert [type(p) for p in config.pipelines] == [PipelineConfig, PipelineConfig]
    assert isinstance(config.outbound, OutboundConfig)
    assert config.outbound.http.allowed_hosts == ["api.example.com", "*.example.org"]
    assert config.outbound.commands == {"sh": "/bin/sh", "jq": ["/usr/bin/jq", "-c"]}
    assert config.sql == {"db": SqlBackendConfig(url="sqlite://", pool_size=1, max_rows=50)}
    assert config.pipelines[1].steps == ROWS  # the steps as written: the plan compiled from them is the tool's


def test_a_valid_section_round_trips_through_the_file(tmp_path: Path) -> None:
    first = load(write(tmp_path, VALID), environ={}).config
    again = {
        "pipelines": msgspec.to_builtins(first.pipelines),
        "outbound": msgspec.to_builtins(first.outbound),
        "sql": msgspec.to_builtins(first.sql),
    }
    (tmp_path / "again").mkdir()
    second = load(write(tmp_path / "again", again), environ={}).config
    assert (second.pipelines, second.outbound, second.sql) == (first.pipelines, first.outbound, first.sql)
    assert again["sql"] == VALID["sql"]
    assert again["pipelines"] == VALID["pipelines"]


async def test_a_config_built_in_code_with_the_structs_is_compiled_and_served(tmp_path: Path) -> None:
    from mcp import Client

    from mcpipe.server import open_app

    config = msgspec.structs.replace(
        Config(),
        pipelines=[msgspec.convert(PIPELINE, PipelineConfig)],
        outbound=OutboundConfig(http=OutboundHttpConfig(allowed_hosts=["api.example.com"])),
        sql={"db": SqlBackendConfig(url="sqlite://")},
        base_dir=str(tmp_path),
    )
    loaded = Loaded.of(config)
    assert loaded.declared is not None and [t.name for t in loaded.declared.pipelines] == ["p"]
    assert loaded.declared.policy.http.allowed_hosts == ("api.example.com",)
    assert sorted(loaded.declared.policy.sql) == ["db"]
    async with open_app(loaded) as app, Client(app.server) as client:
        result = await client.call_tool("p", {})
    assert result.is_error is False and "1" in str(result.content)


def test_a_struct_built_in_code_is_checked_as_the_file_would_be() -> None:
    config = msgspec.structs.replace(Config(), outbound=OutboundConfig(commands={"jq": []}))
    with pytest.raises(ConfigError) as e:
        Loaded.of(config)
    assert [str(p) for p in e.value.problems] == [
        "outbound.commands.jq: a command needs an executable (a path, or an argv list)"
    ]
