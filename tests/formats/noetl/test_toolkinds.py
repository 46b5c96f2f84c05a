"""NoETL's python, postgres, duckdb and shell tools mapped onto mcpipe's step kinds (formats/noetl/toolkinds):
the fields NoETL reads, what cannot be honoured refused where it is, and the mapped steps run as NoETL runs
them once their Jinja is rendered (as the front-end renders it)."""

from __future__ import annotations

import base64
from typing import Any

import jinja2
import pytest
import trio

from kit.declared import env
from mcpipe.declared import CommandPolicy, StepPolicy, StepScope, compile_step
from mcpipe.errors import Problem
from mcpipe.formats.noetl.toolkinds import JINJA_IN_CODE, TEMPLATE_FIELDS, map_tool, secret_value
from mcpipe.tools._base import ToolContext

POLICY = StepPolicy(command=CommandPolicy(commands={"sh": "/bin/sh"}))
JINJA = jinja2.Environment(undefined=jinja2.StrictUndefined)


def mapped(kind: str, tool: dict[str, Any]) -> dict[str, Any]:
    problems: list[Problem] = []
    step = map_tool(kind, tool, "workflow[1].tool", problems)
    assert problems == [] and step is not None, problems
    return step


def refused(kind: str, tool: dict[str, Any]) -> list[tuple[str, str]]:
    problems: list[Problem] = []
    assert map_tool(kind, tool, "workflow[1].tool", problems) is None
    return [(p.location, p.message) for p in problems]


def render(value: Any, scope: dict[str, Any]) -> Any:
    """The front-end's part: NoETL Jinja rendered, recursively (strings to text)."""
    if isinstance(value, str):
        return JINJA.from_string(value).render(scope) if ("{{" in value or "{%" in value) else value
    if isinstance(value, dict):
        return {k: render(v, scope) for k, v in value.items()}
    if isinstance(value, list):
        return [render(v, scope) for v in value]
    return value


async def run_mapped(kind: str, tool: dict[str, Any], scope: dict[str, Any], policy: StepPolicy = POLICY) -> Any:
    step = mapped(kind, tool)
    fields = TEMPLATE_FIELDS[kind]
    raw = {k: ({"$literal": render(v, scope)} if k in fields else v) for k, v in step.items()}
    compiled, problems = compile_step(raw, "steps[0]", StepScope(policy=policy))
    assert problems == [] and compiled is not None, problems
    with trio.fail_after(30):
        return await compiled.execute(env(), ToolContext())


# --- python ---


async def test_a_python_tool_runs_with_its_input_as_globals_and_libs_imported():
    tool = {
        "kind": "python",
        "libs": {"m": "math", "dd": {"from": "collections", "import": "defaultdict"}},
        "args": {"base": 1},
        "input": {"message": "{{ workload.message }}", "items": "{{ workload.nums }}"},
        "code": (
            "def main(message, items, base):\n"
            "    return {'msg': message, 'n': base + m.floor(sum(items)), 'dd': type(dd()).__name__}"
        ),
    }
    out = await run_mapped("python", tool, {"workload": {"message": "hi", "nums": [1.5, 2]}})
    # `items` is rendered to text, "[1.5, 2]", and decoded back (NoETL's coercion of literals).
    assert out.ok, out.error
    assert out.output == {"msg": "hi", "n": 4, "dd": "defaultdict"}


def test_python_code_in_base64_is_decoded_and_code_holding_jinja_is_marked_to_run_as_written():
    code = "result = 1"
    step = mapped("python", {"code_b64": base64.b64encode(code.encode()).decode()})
    assert step == {"kind": "python", "code": code, "coerce": True}
    # Never rendered (a value would become code): the front-end warns and the code runs as written.
    jinja = mapped("python", {"code": "result = '{{ workload.x }}'"})
    assert jinja["code"] == "result = '{{ workload.x }}'" and jinja[JINJA_IN_CODE] is True


@pytest.mark.parametrize(
    ("tool", "where"),
    [
        ({"code": "x", "script": {"uri": "gs://b/s.py"}}, "workflow[1].tool.script"),
        ({"code": "x", "deps": {"packages": {"t": ["pandas"]}}}, "workflow[1].tool.deps"),
        ({"code": "x", "auth": {"gcs": "gcs_cred"}}, "workflow[1].tool.auth"),
        ({"code": "x", "libs": {"np": "numpy; import os"}}, "workflow[1].tool.libs.np"),
        ({"input": {"a": 1}}, "workflow[1].tool.code"),
    ],
)
def test_what_a_python_tool_cannot_have_is_refused_where_it_is(tool, where):
    assert [loc for loc, _ in refused("python", tool)] == [where]


# --- postgres ---


@pytest.mark.parametrize(
    ("tool", "connection"),
    [
        ({"auth": "pg_local"}, {"backend": "pg_local"}),
        ({"auth": "{{ workload.pg_auth }}"}, {"backend": "{{ workload.pg_auth }}"}),
        ({"auth": {"type": "postgres", "credential": "pg_k8s"}}, {"backend": "pg_k8s"}),
        ({"credential": "pg_old"}, {"backend": "pg_old"}),
        (
            {
                "auth": {
                    "source": "inline",
                    "type": "postgres",
                    "fields": {"host": "h", "port": 5, "user": "u", "database": "d"},
                }
            },
            {"dsn": {"host": "h", "port": 5, "user": "u", "dbname": "d"}},
        ),
    ],
)
def test_a_postgres_tools_auth_names_its_database(tool, connection):
    step = mapped("postgres", {"command": "SELECT 1", **tool})
    assert step == {"kind": "postgres", "command": "SELECT 1", **connection}


def test_a_postgres_tool_without_auth_or_sql_is_refused():
    assert [loc for loc, _ in refused("postgres", {"command": "SELECT 1"})] == ["workflow[1].tool.auth"]
    assert [loc for loc, _ in refused("postgres", {"auth": "pg"})] == ["workflow[1].tool.command"]
    assert [loc for loc, _ in refused("postgres", {"auth": {"source": "secret", "name": "x"}, "query": "x"})] == [
        "workflow[1].tool.auth"
    ]


# --- duckdb ---


async def test_a_duckdb_tool_answers_noetls_summary():
    tool = {
        "kind": "duckdb",
        "database": ":memory:",
        "query": "CREATE TABLE u (n INTEGER);\nINSERT INTO u VALUES (1), (2);\nSELECT sum(n) AS s FROM u;",
    }
    out = await run_mapped("duckdb", tool, {})
    assert out.ok, out.error
    assert out.output["executed_commands"] == 3 and out.output["command_3_sample"] == [[3]]


def test_a_duckdb_tool_without_database_keeps_noetls_file_per_execution_and_its_auth_names_secrets():
    step = mapped("duckdb", {"commands": ["SELECT 1", "SELECT 2"]})
    assert step["commands"] == "SELECT 1\nSELECT 2" and step["database"].endswith("duckdb_{{ execution_id }}.duckdb")
    auth = {"pg_db": {"type": "postgres", "key": "pg_local"}, "gcs": {"tool": "hmac", "key": "h", "scope": "gs://b"}}
    assert mapped("duckdb", {"command": "SELECT 1", "auth": auth})["secrets"] == [
        {"name": "pg_db", "type": "postgres", "credential": "pg_local"},
        {"name": "gcs", "type": "hmac", "credential": "h", "scope": "gs://b"},
    ]
    assert [loc for loc, _ in refused("duckdb", {"command": "SELECT 1", "auth": {"pg": "pg_local"}})] == [
        "workflow[1].tool.auth.pg"  # an alias names `{type, key}`
    ]
    assert [loc for loc, _ in refused("duckdb", {"command": "SELECT 1", "auth": {"sf": {"type": "snowflake"}}})] == [
        "workflow[1].tool.auth.sf.type"  # a cloud warehouse
    ]


# --- shell ---


async def test_a_shell_tool_runs_its_rendered_programs():
    tool = {
        "kind": "shell",
        "cmds": ["echo '{{ workload.action }}'", "echo $GREETING"],
        "env": {"GREETING": "{{ workload.g }}"},
    }
    out = await run_mapped("shell", tool, {"workload": {"action": "deploy", "g": "hello"}})
    assert out.ok, out.error
    assert out.output["stdout"] == "deploy\n\nhello\n"
    assert mapped("shell", tool)["timeout_ms"] == 2 * 600_000


def test_a_shell_tool_needs_the_operators_shell():
    step = mapped("shell", {"cmd": "echo hi", "timeout_seconds": 5})
    assert step == {"kind": "shell", "cmds": ["echo hi"], "timeout_ms": 5000.0}
    _, problems = compile_step(step, "steps[0]", StepScope(policy=StepPolicy()))
    assert [(p.location, p.code) for p in problems] == [("steps[0].cmds", "FORBIDDEN")]


def test_secrets_are_read_from_the_environment_as_noetl_reads_them():
    environ = {"API_TOKEN": "t1", "NOETL_SECRET_OPENAI": "t2"}
    assert secret_value({"source": "env", "name": "API_TOKEN"}, environ) == "t1"
    assert secret_value({"source": "secret", "name": "openai"}, environ) == "t2"
    assert secret_value({"source": "secret", "name": "absent"}, environ) is None


def test_an_unknown_kind_is_refused_naming_the_kinds():
    assert refused("snowflake", {"query": "x"}) == [
        ("workflow[1].tool.kind", "NoETL tool kind `snowflake` is not one of duckdb, postgres, python, shell")
    ]
