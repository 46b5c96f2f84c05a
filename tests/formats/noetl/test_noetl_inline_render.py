"""Templates that only read (``{{ input.url }}``, ``{{ output.status == 'error' }}``) render in the caller's
thread, without a thread and a watchdog per render; everything else still renders in a thread under its
deadline, and both give the same values and the same errors."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
import trio

from mcpipe.expr._jinja import Compiled, RenderError, compile_value, render, render_async
from mcpipe.formats.noetl._tmpl import INLINE_LITERAL, compile_tmpl


def compiled(source: object) -> Compiled:
    problems: list[tuple[str, str]] = []
    out = compile_value(source, "t", problems)
    assert problems == []
    return out


@pytest.mark.parametrize(
    ("source", "bounded"),
    [
        ("{{ message }}", True),
        ("  {{ input.user['name'] }} ", True),
        ("{{ items[0] }}", True),
        ("{{ output.status == 'error' }}", True),
        ("{{ output.http.status in [500, 502, 503] }}", True),
        ("{{ a and not b or c != 1 }}", True),
        ({"url": "{{ base }}", "n": 1, "list": ["{{ a.b }}", 2]}, True),
        ("plain text", True),
        ("{{ name | upper }}", False),
        ("{{ range(10) }}", False),
        ("{{ a ~ b }}", False),
        ("{{ a * 3 }}", False),
        ("{{ a[b] }}", False),
        ("{{ a is defined }}", False),
        ("{{ [a, b] }}", False),
        ("hello {{ name }}", False),
        ("{% for x in a %}{{ x }}{% endfor %}", False),
        ({"url": "{{ base }}", "q": "{{ q | tojson }}"}, False),
    ],
)
def test_a_template_is_bounded_when_it_only_reads(source, bounded):
    assert compiled(source).bounded is bounded


class Watched(Mapping[str, Any]):
    """A root that records the thread each lookup in it ran in."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.data, self.threads = data, set[int]()

    def __getitem__(self, key: str) -> Any:
        self.threads.add(threading.get_ident())
        return self.data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.data)

    def __len__(self) -> int:
        return len(self.data)


@pytest.mark.parametrize(("source", "inline"), [("{{ input.url }}", True), ("{{ input.url | lower }}", False)])
async def test_a_bounded_template_renders_in_the_callers_thread_and_others_in_a_thread(source, inline):
    root = Watched({"url": "http://127.0.0.1/x"})
    with trio.fail_after(10):
        assert await render_async(compiled(source), {"input": root}, "t") == "http://127.0.0.1/x"
    assert (root.threads == {threading.get_ident()}) is inline


@pytest.mark.parametrize(
    ("source", "roots", "expected"),
    [
        ("{{ output.status == 'error' }}", {"output": {"status": "error"}}, True),
        ("{{ output.http.status in [500, 502] }}", {"output": {"http": {"status": 200}}}, False),
        ("{{ rows[1].id }}", {"rows": [{"id": 1}, {"id": 2}]}, 2),
        ("{{ missing }}", {}, RenderError("t: 'missing' is undefined")),
        ("{{ a.b }}", {"a": {}}, RenderError("t: 'dict object' has no attribute 'b'")),
        (
            "{{ a.__class__ }}",
            {"a": {}},
            RenderError("t: refused by the sandbox: access to attribute '__class__' of 'dict' object is unsafe."),
        ),
    ],
)
async def test_a_bounded_template_answers_as_the_thread_did(source, roots, expected):
    inline = compiled(source)
    threaded = Compiled(inline.render, inline.sources)  # the same template, not marked bounded
    assert inline.bounded and not threaded.bounded
    answers = []
    for c in (inline, threaded):
        try:
            with trio.fail_after(10):
                answers.append(await render_async(c, roots, "t"))
        except RenderError as e:
            answers.append(RenderError(str(e)))
        try:
            answers.append(render(c, roots, "t"))
        except RenderError as e:
            answers.append(RenderError(str(e)))
    if isinstance(expected, RenderError):
        assert {str(a) for a in answers} == {str(expected)}, answers
    else:
        assert answers == [expected] * 4


@pytest.mark.parametrize("size", [10, INLINE_LITERAL + 1])
async def test_a_noetl_value_read_back_as_a_literal_is_the_same_short_or_long(size):
    # A long text is read back in a thread (the inline render gives way), a short one at once: same value.
    text = "[" + ",".join(["7"] * size) + "]"
    problems: list[tuple[str, str]] = []
    t = compile_tmpl({"items": "{{ data }}", "n": "{{ n }}"}, "tool.args", problems)
    assert problems == [] and t.inline is not None
    with trio.fail_after(10):
        got = await t.render_async({"data": text, "n": "5"})
    assert got == {"items": [7] * size, "n": "5"}
    assert t.render({"data": text, "n": "5"}) == got
