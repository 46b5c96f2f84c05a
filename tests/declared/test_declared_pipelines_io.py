"""Declared pipelines that reach out: http, graphql and command steps through the pipeline tool, their
timeouts, and cancellation of a running request or process when the call is cancelled."""

from __future__ import annotations

from pathlib import Path

import trio

from kit.pipelines import PY_COMMANDS, load, text_of
from kit.processes import SLEEPER, all_gone, read_pids, watch

LOCAL = {"http": {"allowed_hosts": ["127.0.0.1"]}}


async def test_http_and_graphql_steps_feed_later_steps(http_server):
    p = load(
        f"""
pipelines:
  - name: lookup
    input_schema: {{type: object, properties: {{q: {{type: string}}}}, required: [q]}}
    steps:
      - kind: parallel
        id: fetch
        steps:
          - {{kind: http, id: echo, method: post, url: "{http_server.url}/echo", body: {{q: "${{args.q}}"}}}}
          - kind: graphql
            id: gql
            url: "{http_server.url}/graphql"
            operation: "query Q($q: String) {{ echo(q: $q) }}"
            variables: {{q: "${{args.q}}"}}
      - kind: transform
        id: answer
        expression: '{{"posted": steps.fetch.output.echo.body.body.q, "gql": steps.fetch.output.gql.echo.q}}'
""",
        outbound=LOCAL,
    )
    result = await p.call("lookup", {"q": "tea"})
    assert not result.is_error, text_of(result)
    assert result.structured == {"posted": "tea", "gql": "tea"}


async def test_an_unexpected_status_fails_the_call_naming_the_step(http_server):
    p = load(
        f"pipelines: [{{name: s, steps: [{{kind: http, id: api, url: '{http_server.url}/status/503'}}]}}]",
        outbound=LOCAL,
    )
    result = await p.call("s")
    assert result.is_error
    assert text_of(result).startswith("TOOL_ERROR: step 'api' failed: HTTP 503"), text_of(result)


async def test_a_templated_url_outside_the_allowlist_is_forbidden_at_run_time(http_server):
    p = load(
        "pipelines: [{name: go, steps: [{kind: http, id: get, url: '${args.url}'}]}]",
        outbound={"http": {"allowed_hosts": ["api.example.com"]}},
    )
    result = await p.call("go", {"url": f"{http_server.url}/echo"})
    assert result.is_error
    assert (
        text_of(result) == "FORBIDDEN: step 'get' failed: host '127.0.0.1' is not in the allowed hosts"
        " (list it in outbound.http.allowed_hosts)"
    )
    assert http_server.log.requests == []
    # Listed, but a private address: still refused unless the literal is listed or private is allowed.
    p = load(
        "pipelines: [{name: go, steps: [{kind: http, id: get, url: '${args.url}'}]}]",
        outbound={"http": {"allowed_hosts": ["*"]}},
    )
    result = await p.call("go", {"url": f"http://localhost:{http_server.port}/echo"})
    assert result.is_error and "a loopback address, which is not allowed" in text_of(result)


async def test_cancelling_the_call_closes_a_running_http_request(http_server):
    p = load(
        f"pipelines: [{{name: slow, steps: [{{kind: http, id: wait, url: '{http_server.url}/slow'}}]}}]",
        outbound=LOCAL,
    )
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(p.call, "slow")
            await http_server.log.slow_started.wait()
            nursery.cancel_scope.cancel()
        await http_server.log.slow_disconnected.wait()
    assert [(r["tool"], r["error_code"]) for r in p.audit.records] == [("slow", "CANCELLED")]


async def test_an_http_step_past_its_timeout_fails_the_call_and_closes_the_request(http_server):
    p = load(
        f"pipelines: [{{name: slow, steps: [{{kind: http, id: wait, url: '{http_server.url}/slow',"
        " timeout_ms: 200}]}]",
        outbound=LOCAL,
    )
    result = await p.call("slow")
    assert text_of(result) == "TIMEOUT: step 'wait' failed: timed out after 200 ms"
    with trio.fail_after(5):
        await http_server.log.slow_disconnected.wait()


def sleeper_pipeline(timeout: str = "") -> str:
    return f"""
pipelines:
  - name: job
    steps:
      - {{kind: value, id: before, value: 1}}
      - kind: command
        id: run
        command: py
        args: ["${{args.script}}", "${{args.fifo}}"]{timeout}
"""


async def test_cancelling_the_call_kills_a_running_command_and_its_children(fifo: Path):
    p = load(sleeper_pipeline(), outbound=PY_COMMANDS)
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(p.call, "job", {"script": SLEEPER, "fifo": str(fifo)})
            fds = watch(await read_pids(fifo))
            nursery.cancel_scope.cancel()
        await all_gone(fds)
    assert [(r["tool"], r["error_code"]) for r in p.audit.records] == [("job", "CANCELLED")]


async def test_a_command_past_its_timeout_fails_the_call_and_is_killed(fifo: Path):
    p = load(sleeper_pipeline("\n        timeout_ms: 1000"), outbound=PY_COMMANDS)
    results = []
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:

            async def go() -> None:
                results.append(await p.call("job", {"script": SLEEPER, "fifo": str(fifo)}))

            nursery.start_soon(go)
            fds = watch(await read_pids(fifo))
        await all_gone(fds)
    assert text_of(results[0]) == "TIMEOUT: step 'run' failed: timed out after 1000 ms"


async def test_a_command_step_output_and_exit_code_errors():
    p = load(
        """
pipelines:
  - name: calc
    steps:
      - kind: command
        id: run
        command: py
        args: ["import json, sys; print(json.dumps({'n': int(sys.argv[1]) * 2}))", "${args.n}"]
        require_json_stdout: true
    output: {doubled: "${steps.run.output.json.n}"}
  - name: crash
    steps:
      - {kind: command, id: run, command: py, args: ["import sys; sys.exit('no way')"]}
""",
        outbound=PY_COMMANDS,
    )
    assert (await p.call("calc", {"n": 21})).structured == {"doubled": 42}
    crash = await p.call("crash")
    assert text_of(crash) == "TOOL_ERROR: step 'run' failed: command 'py' exited with code 1: no way"
