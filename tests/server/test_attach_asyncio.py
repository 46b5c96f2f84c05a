"""``attach(server)`` on an asyncio host (the SDK's default loop): in memory and over real stdio.

The host's tools are asyncio coroutines; ``mcp_pipe`` runs its pipeline in a Trio guest run on the host's
loop and calls them back there, in parallel, with deadlines and cancellation reaching them.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
import trio
from mcp import Client, StdioServerParameters
from mcp.server.mcpserver import MCPServer

from mcpipe.gateway import PIPE_TOOL
from mcpipe.server import attach

EXAMPLE = Path(__file__).parents[2] / "examples" / "attach_weather.py"


class Host:
    """An asyncio server with a long-polling tool whose waits are observable (started, cancelled)."""

    def __init__(self) -> None:
        self.app = MCPServer("weather")
        self.loops: set[int] = set()
        self.polling: list[str] = []
        self.cancelled: list[str] = []
        self._changed = asyncio.Event()
        app = self.app

        @app.tool()
        async def forecast(city: str) -> dict[str, Any]:
            """A (very) local forecast."""
            self.loops.add(id(asyncio.get_running_loop()))  # raises unless the tool runs on asyncio
            await asyncio.sleep(0)
            return {"city": city, "high": 21 if city == "Lyon" else 12}

        @app.tool()
        async def alerts(city: str) -> list[str]:
            """Wait for a new alert (one never comes)."""
            self._note(self.polling, city)
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self._note(self.cancelled, city)
                raise
            return []

        @app.tool()
        def shout(text: str) -> str:
            """Upper-case the text."""
            return text.upper()

        attach(app)

    def _note(self, seen: list[str], city: str) -> None:
        seen.append(city)
        self._changed.set()
        self._changed = asyncio.Event()

    async def until(self, predicate: Any) -> None:
        """Wait (event-driven) until ``predicate()`` holds."""
        while not predicate():
            await self._changed.wait()


PARALLEL = {
    "steps": [
        {
            "id": "highs",
            "parallel": [
                {"id": "lyon", "tool": "forecast", "args": {"city": "Lyon"}},
                {"id": "oslo", "tool": "forecast", "args": {"city": "Oslo"}},
                {"id": "lima", "tool": "forecast", "args": {"city": "Lima"}},
            ],
        },
        {"id": "s", "tool": "shout", "args": {"text": "lyon {{step1.lyon.high}}, oslo {{step1.oslo.high}}"}},
    ],
    "return": "{{s.result}}",
}


def on_asyncio(main: Any) -> Any:
    return anyio.run(main, backend="asyncio")


@pytest.mark.parametrize("mode", ["2026-07-28", "legacy"])
def test_mcp_pipe_runs_parallel_steps_of_an_asyncio_host_in_memory(mode):
    host = Host()
    seen: list[float] = []

    async def progress(value: float, total: float | None, message: str | None) -> None:
        seen.append(value)

    async def main() -> Any:
        async with Client(host.app, mode=mode) as client:
            first = await client.call_tool(PIPE_TOOL, PARALLEL, progress_callback=progress)
            both = await asyncio.gather(client.call_tool(PIPE_TOOL, PARALLEL), client.call_tool(PIPE_TOOL, PARALLEL))
            return first, both, id(asyncio.get_running_loop())

    first, both, loop = on_asyncio(main)
    assert not first.is_error, first.content
    assert first.structured_content["result"] == "LYON 21, OSLO 12"
    assert first.structured_content["summary"]["succeeded"] == 4
    assert [r.structured_content["result"] for r in both] == ["LYON 21, OSLO 12"] * 2
    assert host.loops == {loop}
    assert seen == [1.0, 2.0, 3.0, 4.0]


def test_a_step_deadline_cancels_the_asyncio_tool_it_waits_for_and_fails_the_step_with_timeout():
    host = Host()
    spec = {
        "steps": [
            {
                "parallel": [
                    {"id": "wait", "tool": "alerts", "args": {"city": "Oslo"}, "timeout_ms": 50},
                    {"id": "f", "tool": "forecast", "args": {"city": "Lyon"}},
                ]
            },
            {"tool": "shout", "args": {"text": "never"}},
        ]
    }

    async def main() -> Any:
        async with Client(host.app) as client:
            with anyio.fail_after(10):
                return await client.call_tool(PIPE_TOOL, spec)

    r = on_asyncio(main)
    answer = r.structured_content
    assert r.is_error and answer["error_code"] == "TIMEOUT"
    children = answer["steps"]["step1"]["children"]
    assert children["wait"]["error_code"] == "TIMEOUT" and children["f"]["ok"]
    assert "step2" not in answer["steps"] or answer["steps"]["step2"].get("ok") is not True
    assert host.cancelled == ["Oslo"]


def test_a_client_cancelling_mcp_pipe_cancels_the_host_tools_in_flight_and_the_next_call_works():
    host = Host()
    spec = {
        "steps": [
            {"parallel": [{"tool": "alerts", "args": {"city": "Oslo"}}, {"tool": "alerts", "args": {"city": "Lima"}}]}
        ]
    }

    async def main() -> Any:
        async with Client(host.app) as client:
            with anyio.fail_after(10):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(client.call_tool, PIPE_TOOL, spec)
                    await host.until(lambda: len(host.polling) == 2)
                    tg.cancel_scope.cancel()
                await host.until(lambda: len(host.cancelled) == 2)
                return await client.call_tool(PIPE_TOOL, PARALLEL)

    after = on_asyncio(main)
    assert sorted(host.cancelled) == ["Lima", "Oslo"]
    assert after.structured_content["result"] == "LYON 21, OSLO 12"


def stdio_example() -> StdioServerParameters:
    """The example as its docstring runs it: ``python examples/attach_weather.py`` (stdio, asyncio)."""
    return StdioServerParameters(command=sys.executable, args=[str(EXAMPLE)])


@pytest.mark.parametrize("mode", ["2026-07-28", "legacy"])
async def test_the_attach_example_served_over_stdio_on_asyncio_runs_parallel_steps_and_deadlines(mode):
    spec = {
        "steps": [
            {
                "parallel": [
                    {"id": "lyon", "tool": "forecast", "args": {"city": "Lyon"}},
                    {"id": "oslo", "tool": "alerts", "args": {"city": "Oslo"}},
                ]
            },
            {"id": "s", "tool": "shout", "args": {"text": "{{step1.lyon.city}}: {{step1.oslo.result}}"}},
        ],
        "return": "{{s.result}}",
    }
    late = {"steps": [{"tool": "alerts", "args": {"city": "Lima", "wait_s": 60}, "timeout_ms": 100}]}
    with trio.fail_after(30):
        async with Client(stdio_example(), mode=mode) as client:
            r = await client.call_tool(PIPE_TOOL, spec)
            timed_out = await client.call_tool(PIPE_TOOL, late)
            again = await client.call_tool(PIPE_TOOL, spec)
    assert not r.is_error, r.content
    assert r.structured_content["result"] == 'LYON: ["SNOW"]'
    assert timed_out.structured_content["error_code"] == "TIMEOUT"
    assert again.structured_content["result"] == r.structured_content["result"]


async def test_cancelling_a_pipeline_of_the_stdio_example_leaves_it_serving():
    spec = {
        "steps": [
            {"tool": "forecast", "args": {"city": "Lyon"}},
            {
                "parallel": [
                    {"tool": "alerts", "args": {"city": "Oslo", "wait_s": 60}},
                    {"tool": "forecast", "args": {"city": "Oslo"}},
                ]
            },
        ]
    }
    first_step_done = trio.Event()

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        first_step_done.set()

    with trio.fail_after(30):
        async with Client(stdio_example()) as client:
            async with trio.open_nursery() as nursery:

                async def call() -> None:
                    await client.call_tool(PIPE_TOOL, spec, progress_callback=on_progress)

                nursery.start_soon(call)
                await first_step_done.wait()
                nursery.cancel_scope.cancel()
            r = await client.call_tool(PIPE_TOOL, {"steps": [{"tool": "shout", "args": {"text": "still here"}}]})
    assert r.structured_content["result"] == {"result": "STILL HERE"}


def test_the_attach_snippet_of_server_md_runs_its_pipeline_on_asyncio():
    doc = (Path(__file__).parents[2] / "docs" / "server.md").read_text()
    section = doc.split("## Adding mcp_pipe to your own SDK server: `attach`", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    spec = json.loads(section.split("```json\n", 1)[1].split("```", 1)[0])
    namespace: dict[str, Any] = {"__name__": "snippet"}
    exec(compile(code, "server.md", "exec"), namespace)

    async def main() -> Any:
        async with Client(namespace["app"]) as client:
            return await client.call_tool(PIPE_TOOL, spec)

    r = on_asyncio(main)
    assert r.structured_content["result"] == "LYON: 21C"
