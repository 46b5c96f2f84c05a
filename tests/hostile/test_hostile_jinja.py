"""Jinja rendering has a byte budget, a time budget and a recursion bound, enforced while it renders (issue
20, point 2): served playbooks attacked over HTTP on a real ``mcpipe serve``, ``/healthz`` probed, the
server's memory measured (it runs under an address-space limit, as the issue's attacks did)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kit.attack import served, write_config
from mcpipe.expr._jinja import MAX_RENDER_DEPTH, compile_value, render

pytestmark = pytest.mark.filterwarnings("ignore::ResourceWarning")

AGAIN = "{% if input.n > 0 %}{{ prompts.again.template | render({'input': {'n': input.n - 1}}) }}{% endif %}."

PLAYBOOK = """apiVersion: noetl.io/v2
kind: Playbook
metadata: {{name: {name}, path: x/{name}}}
mcp:
  prompts:
    - name: again
      template: {again!r}
workbook:
  - name: build
    type: value
    {extra}value: {template!r}
workflow:
  - {{step: start, next: b}}
  - {{step: b, type: workbook, task: build}}
"""

ATTACKS = {
    # 1 MB x 8000 as JSON: orjson was handed 8 GB (SIGSEGV under a memory limit).
    "tojson": "{{ ([input.s] * input.n) | tojson | length }}",
    # 1.5 GB of spaces.
    "center": "{{ input.s | center(input.n) }}",
    # Loops over the caller's list, building nothing: 27 billion rounds.
    "loops": "{% for i in input.x %}{% for j in input.x %}{% for k in input.x %}{% endfor %}{% endfor %}{% endfor %}",
    # A prompt rendering itself input.n deep (2500 froze the server 226 s and logged 20 000 lines).
    "recursion": "{{ prompts.again.template | render({'input': {'n': input.n}}) }}",
    # 1000 characters of constant text written 10^10 times.
    "output": "{% for i in input.x %}{% for j in input.x %}" + "0123456789" * 100 + "{% endfor %}{% endfor %}",
}
SLOW = ATTACKS["loops"]
"""The loops again, in an action whose ``timeout_ms`` (300) is shorter than the deadline (1000)."""


def _config(tmp_path: Path, timeout_ms: int = 1000) -> Path:
    files = []
    for name, template in [*ATTACKS.items(), ("slow", SLOW)]:
        extra = "timeout_ms: 300\n    " if name == "slow" else ""
        (tmp_path / f"{name}.yaml").write_text(PLAYBOOK.format(name=name, template=template, extra=extra, again=AGAIN))
        files.append(f'"{name}.yaml"')
    return write_config(
        tmp_path,
        f"playbooks = [{', '.join(files)}]\n[pipe]\nexpression_timeout_ms = {timeout_ms}\n[audit]\nenabled = false\n",
        ".toml",
    )


CASES = [
    ("tojson", {"s": "x" * 1_000_000, "n": 8000}, "LIMIT_EXCEEDED", "the `tojson` filter would build at least"),
    ("center", {"s": "x", "n": 1_500_000_000}, "LIMIT_EXCEEDED", "the argument 1500000000 is more than the"),
    ("loops", {"x": list(range(3000))}, "TIMEOUT", "the template took longer than 1000 ms to render"),
    ("recursion", {"n": 2500}, "LIMIT_EXCEEDED", f"renders nest more than {MAX_RENDER_DEPTH} deep"),
    ("output", {"x": list(range(100_000))}, "LIMIT_EXCEEDED", "the template built more than 16777216 characters"),
]


async def test_hostile_templates_fail_their_step_located_and_the_server_stays_up_and_small(tmp_path):
    async with served(_config(tmp_path), limit_as_mb=1024) as server:
        await server.call("tojson", {"s": "ab", "n": 2})  # warm up: imports, the first render
        before = server.rss_mb()
        for tool, args, code, message in CASES:
            result, slowest = await server.probed(lambda tool=tool, args=args: server.call(tool, args))
            error = result["content"][0]["text"]
            assert result["isError"] is True
            assert error.startswith(f"{code}: step 'task_build' failed: workbook[0].spec: "), (tool, error)
            assert message in error, (tool, error)
            assert slowest < server.stall_s, (tool, server.health)
            assert server.alive, server.text()[-2000:]
        grown = server.rss_mb() - before
        # An action's timeout_ms (300) interrupts its template before the deadline (1000) would.
        slow, slowest = await server.probed(lambda: server.call("slow", {"x": list(range(3000))}))
        assert slow["content"][0]["text"] == "TIMEOUT: step 'task_build' failed: workbook[0]: timed out after 300 ms"
        assert slowest < server.stall_s, server.health
        fine = await server.call("tojson", {"s": "ab", "n": 3})
        log = server.text()
    assert fine["content"][0]["text"] == "16"
    assert grown < 150, grown
    assert "Traceback" not in log and len(log.splitlines()) < 200


@pytest.mark.parametrize(
    ("template", "roots", "message"),
    [
        ("{{ ([input.s] * 8000) ~ '' }}", {"s": "x" * 1_000_000}, "`~` would build at least"),
        ("{{ '%*d' % (input.n, 1) }}", {"n": 10**9}, "`%` would build at least 1000000003 characters"),
        ("{{ '{:>{w}}'.format('x', w=input.n) }}", {"n": 10**9}, "`format` would build at least 1000000007"),
        ("{{ input.s.center(input.n) }}", {"s": "x", "n": 10**9}, "`center`: the argument 1000000000 is more"),
        ("{{ input.s.replace('x', input.s) }}", {"s": "x" * 5000}, "`replace` would build at least 25005000"),
        ("{{ ([input.s] * 8000) | join }}", {"s": "x" * 10_000}, "the `join` filter would build at least"),
        ("{{ [input.s] * 8000 }}", {"s": "x" * 10_000}, "the value would build at least"),
        ("{{ ([[1] * 10000] * 10000) | sum(start=[]) | length }}", {}, "the template built more than 16777216"),
        ("{{ (1).to_bytes(input.n, 'big') | length }}", {"n": 10**9}, "`to_bytes`: the argument 1000000000"),
        ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", {}, "calls nest more than 64 deep"),
        ("{{ [1] | batch(input.n, 0) | list }}", {"n": 10**9}, "the `batch` filter: the argument 1000000000"),
    ],
)
def test_every_way_a_template_builds_is_bounded_before_it_builds(template, roots, message):
    problems: list[tuple[str, str]] = []
    compiled = compile_value(template, "f", problems)
    assert problems == []
    with pytest.raises(Exception) as caught:
        render(compiled, {"input": roots}, "f")
    assert type(caught.value).__name__ == "RenderError" and caught.value.code == "LIMIT_EXCEEDED"
    assert str(caught.value).startswith("f: ") and message in str(caught.value)


def test_ordinary_templates_render_as_before():
    problems: list[tuple[str, str]] = []
    cases = {
        "hi {{ input.s | upper }} {{ [1, 2] }} {{ {'a': 1} | tojson }}": 'hi X [1, 2] {"a":1}',
        "{{ input.xs | join(', ') }}; {{ '%s-%03d' % ('a', 7) }}; {{ '{:>4}'.format('b') }}": "1, 2; a-007;    b",
        "{{ [[1], [2, 3]] | sum(start=[]) }} {{ 'ab' * 2 }} {{ input.s ~ 1 }}": "[1, 2, 3] abab x1",
        "{% macro m(x) %}<{{ x }}>{% endmacro %}{% for i in range(3) %}{{ m(i) }}{% endfor %}": "<0><1><2>",
    }
    for template, expected in cases.items():
        assert render(compile_value(template, "f", problems), {"input": {"s": "x", "xs": [1, 2]}}, "f") == expected
    assert problems == []
