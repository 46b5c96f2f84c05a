"""Commands load only what they need: a structural guard of start-up (issue 32, item 4), not a timing.

Each case runs a command in a fresh interpreter, then lists the modules it imported (``sys.modules``); none
of the heavy libraries a command does not use may be among them. An eager import put back at the top of a
module (``import jsonschema`` in a module every command imports, a step kind importing the MCP SDK) makes
its case fail, naming the module. The figures are in benches/test_startup.py and docs/performance.md.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from mcpipe.kinds import KINDS

ROOT = Path(__file__).resolve().parents[1]
HELLO = ROOT / "tests" / "formats" / "noetl" / "golden" / "4.26.0" / "hello_world.yaml"

SERVER_STACK = ("mcp", "mcp_types", "pydantic", "hypercorn", "starlette", "sse_starlette", "uvicorn", "anyio")
"""The MCP SDK and the HTTP server under it: ``mcpipe serve`` (and ``call``/``tools`` through a server) only."""
HEAVY = (
    *SERVER_STACK,
    "jsonschema",
    "rfc3987_syntax",
    "lark",
    "cel",
    "jsonata",
    "cedarpy",
    "jwt",
    "duckdb",
    "psycopg",
    "openapi_spec_validator",
    "bm25s",
    "httpx",
    "httpx2",
    "httpcore2",
    "grpc",
    "nats",
    "kafka",
    "redis",
    "rich",
    "prompt_toolkit",
)
"""Libraries slow to import that a command loads only when its input uses them (a schema to validate, a CEL
expression, a Cedar gate, an HTTP step, a backend)."""

LIST_MODULES = """
import sys
from mcpipe.cli import main
from mcpipe._sdk import still_deferred
try:
    status = main(sys.argv[1:])
except SystemExit as e:
    status = e.code
sys.stdout.flush()
loaded = sorted(n for n, m in sys.modules.items() if m is None or not still_deferred(m))
sys.stderr.write("\\nMODULES " + " ".join(loaded) + "\\n")
sys.exit(status)
"""
"""Runs ``mcpipe ARGV`` and lists the modules it loaded: an SDK package whose ``__init__`` has not run (entered
by ``mcpipe._sdk``, holding nothing yet) is not counted as loaded."""


def all_modules_after(*argv: str, cwd: Path) -> set[str]:
    """Every module loaded by ``mcpipe ARGV`` in a fresh interpreter (which must succeed)."""
    out = subprocess.run(
        [sys.executable, "-c", LIST_MODULES, *argv], capture_output=True, text=True, cwd=cwd, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return set(out.stderr.rpartition("\nMODULES ")[2].split())


def modules_after(*argv: str, cwd: Path) -> set[str]:
    """The top-level modules loaded by ``mcpipe ARGV`` in a fresh interpreter (which must succeed)."""
    return {name.partition(".")[0] for name in all_modules_after(*argv, cwd=cwd)}


def kind_modules(modules: set[str]) -> list[str]:
    """The step kinds whose modules are among ``modules`` (the registry's table says which module is whose)."""
    return sorted(name for name in KINDS if KINDS.module_of(name) in modules)


def loaded(modules: set[str], names: tuple[str, ...]) -> list[str]:
    return sorted(n for n in names if n in modules)


@pytest.fixture
def spec(tmp_path: Path) -> Path:
    path = tmp_path / "spec.json"
    path.write_bytes(orjson.dumps({"steps": [{"id": "a", "tool": "echo", "args": {"text": "hi"}}]}))
    return path


def test_version_loads_no_heavy_library_nor_trio(tmp_path):
    modules = modules_after("--version", cwd=tmp_path)
    assert loaded(modules, (*HEAVY, "trio", "yaml", "jinja2", "opentelemetry")) == []


def test_importing_the_command_line_loads_no_heavy_library(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, mcpipe.cli\n"
            "from mcpipe._sdk import still_deferred\n"
            "print(' '.join(n for n, m in sys.modules.items() if m is None or not still_deferred(m)))",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
        check=True,
    )
    modules = {name.partition(".")[0] for name in out.stdout.split()}
    assert loaded(modules, (*HEAVY, "trio", "yaml", "jinja2")) == []


@pytest.mark.parametrize("command", ["check", "run"])
def test_check_and_run_of_a_simple_spec_load_no_heavy_library(command, spec, tmp_path):
    modules = modules_after(command, str(spec), cwd=tmp_path)
    assert loaded(modules, (*HEAVY, "yaml", "jinja2", "asyncio", "opentelemetry")) == []


@pytest.mark.parametrize("argv", [("check",), ("run",), ("playbook", "run")])
def test_a_command_that_draws_nothing_does_not_load_the_plan_drawing(argv, spec, tmp_path):
    modules = all_modules_after(*argv, str(HELLO if argv[0] == "playbook" else spec), cwd=tmp_path)
    assert "mcpipe.plan._draw" not in modules


def test_playbook_run_of_a_python_only_playbook_loads_neither_the_sdk_nor_jsonschema(tmp_path):
    # NoETL's templates are Jinja and its playbooks YAML: those two it needs, nothing of the server. Its python
    # step's coroutines run under asyncio in the worker, and nothing installs telemetry.
    modules = modules_after("playbook", "run", str(HELLO), cwd=tmp_path)
    assert loaded(modules, (*HEAVY, "asyncio", "opentelemetry", "prometheus_client")) == []


def test_playbook_run_of_a_python_only_playbook_imports_the_python_kind_and_no_other(tmp_path):
    # The registry imports a kind's module when a plan first uses it: not the SQL, messaging or HTTP kinds.
    modules = all_modules_after("playbook", "run", str(HELLO), cwd=tmp_path)
    assert kind_modules(modules) == ["python"]


@pytest.mark.parametrize("command", ["check", "run"])
def test_check_and_run_of_a_tool_step_spec_import_no_kind_module(command, spec, tmp_path):
    assert kind_modules(all_modules_after(command, str(spec), cwd=tmp_path)) == []


def test_the_public_names_are_still_there_when_loaded_on_first_use():
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, mcpipe\n"
            "from mcpipe._sdk import still_deferred\n"
            "sdk = lambda: any(n.partition('.')[0] in ('mcp', 'mcp_types') and not still_deferred(m)"
            " for n, m in list(sys.modules.items()))\n"
            "assert 'mcpipe.compile' not in sys.modules and not sdk()\n"
            "from mcpipe import compile_spec, run_pipeline, ToolRegistry, __version__\n"
            "assert compile_spec.__module__ == 'mcpipe.compile' and isinstance(__version__, str)\n"
            "assert not sdk()\n"
            "assert mcpipe.attach.__name__ == 'attach' and sdk()\n"
            "assert set(mcpipe.__all__) <= set(dir(mcpipe))\n",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr


CONFIG = ROOT / "examples" / "mcpipe.toml"
OTHER_ENGINES = (
    "mcpipe.formats.noetl._draft",
    "mcpipe.formats.noetl._runtime2025",
    "mcpipe.formats.noetl._workflow2023",
)
"""NoETL's engines before today's: each claims a file by a look at its keys (``_engines``), imported when one
is compiled."""
SEED_FRONT_END = ("mcpipe.formats.noetl._compile", "mcpipe.formats.noetl._run", "mcpipe.models")
"""Seed 004's ``mcp:`` front-end (turns, models): imported for a file with an ``mcp:`` section or a workbook."""
NOT_FOR_A_RUN = (
    "mcpipe.server._app",
    "mcpipe.server._http",
    "mcpipe.console",
    "mcpipe.access._gates",
    "mcpipe.access._identity",
)
"""mcpipe's own modules a command that serves nothing does not need: the server, the console, the gates."""
NOR_THEIR_LIBRARIES = ("hypercorn", "httpx2", "sqlglot", "duckdb", "psycopg", "prometheus_client", "cryptography")


def test_playbook_run_of_a_python_only_playbook_imports_neither_other_engines_nor_the_mcp_front_end(tmp_path):
    modules = all_modules_after("playbook", "run", str(HELLO), cwd=tmp_path)
    unneeded = (*OTHER_ENGINES, *SEED_FRONT_END, *NOT_FOR_A_RUN, "mcpipe.access._cedar")
    assert sorted(m for m in unneeded if m in modules) == []
    assert loaded({m.partition(".")[0] for m in modules}, NOR_THEIR_LIBRARIES) == []


def test_checking_a_config_loads_neither_the_server_nor_the_sdk(tmp_path):
    # `check --config` runs through `mcpipe.server.cli`: the server package's names load on first use.
    modules = all_modules_after("check", "--config", str(CONFIG), cwd=tmp_path)
    assert sorted(m for m in NOT_FOR_A_RUN if m in modules) == []
    top = {m.partition(".")[0] for m in modules}
    assert loaded(top, (*SERVER_STACK, *NOR_THEIR_LIBRARIES, "jinja2", "opentelemetry")) == []


SERVER_MODULES = """
import sys, types
import mcpipe.server._app, mcpipe.server._http, mcpipe.server.cli
from mcpipe import telemetry
from mcpipe._sdk import still_deferred
telemetry.configure(types.SimpleNamespace(), service="mcpipe")
if sys.argv[1:] == ["sdk"]:
    from mcpipe.server._http import _import_sdk
    _import_sdk()
print(" ".join(n for n, m in sys.modules.items() if m is None or not still_deferred(m)))
"""

SDK_BEFORE_BIND = ("mcp_types._types", "mcp.server.lowlevel", "mcp.server.streamable_http", "mcp.shared.exceptions")
"""What ``mcpipe serve --http`` must not import before it answers: the SDK's types, server and transport."""


def _server_modules(tmp_path, *args: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", SERVER_MODULES, *args], capture_output=True, text=True, cwd=tmp_path, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return set(out.stdout.split())


def test_the_http_server_answers_before_it_imports_the_sdk(tmp_path):
    # What `mcpipe serve --http` imports before it binds and answers (the early answers, /healthz), with the
    # default telemetry: none of the SDK's types, server or transport (a thread imports them once it answers:
    # `_serve_sdk`), nor pydantic, the OpenTelemetry SDK (no exporter asked for) or prometheus_client.
    modules = _server_modules(tmp_path)
    assert sorted(m for m in SDK_BEFORE_BIND if m in modules) == []
    assert sorted(m for m in modules if m.partition(".")[0] in ("pydantic", "prometheus_client")) == []
    assert sorted(m for m in modules if "opentelemetry.sdk" in m) == []


def test_the_http_servers_sdk_thread_imports_neither_the_sdk_client_nor_its_high_level_server(tmp_path):
    # What the thread loading the SDK imports: its low-level server and HTTP transport, not its package
    # __init__ files (the client, MCPServer) nor the stdio transport.
    modules = _server_modules(tmp_path, "sdk")
    assert "mcp.server.lowlevel.server" in modules and "mcp.server.streamable_http_manager" in modules
    unwanted = ("mcp", "mcp.server", "mcp.client.client", "mcp.server.mcpserver", "mcp.server.stdio")
    assert sorted(m for m in unwanted if m in modules) == []
