"""A whole-value template that only reads a root and attributes or items of it by constant keys
(``{{ workload.numbers }}``, ``{{ rows[0]['id'] }}``) is read by the sandbox's own ``getattr`` and
``getitem``, without building a template context, and gives the values and errors the template gives."""

from __future__ import annotations

from typing import Any

import jinja2
import pytest

from mcpipe.expr._jinja import compile_value, environment


class _Obj:
    def __init__(self) -> None:
        self.name = "attr"
        self._secret = "hidden"

    def __getitem__(self, key: object) -> str:
        return f"item {key}"


ROOTS: dict[str, Any] = {
    "workload": {"numbers": [{"value": 10}, {"value": 20}], "items": "a key named like a method"},
    "rows": [{"id": 1}, {"id": 2}],
    "obj": _Obj(),
    "none": None,
    "text": "abc",
}

SOURCES = [
    "{{ workload }}",
    "{{ workload.numbers }}",
    " {{ workload.numbers[1].value }} ",
    "{{ workload['numbers'][0]['value'] }}",
    "{{ workload.items }}",  # jinja's attribute first: the dict's method, not the key
    "{{ workload['items'] }}",
    "{{ rows[-1].id }}",
    "{{ rows[5] }}",
    "{{ obj.name }}",
    "{{ obj['name'] }}",
    "{{ obj.missing }}",
    "{{ obj._secret }}",
    "{{ obj.__class__ }}",  # the sandbox refuses it
    "{{ text.upper }}",
    "{{ none.x }}",
    "{{ missing }}",
    "{{ missing.x }}",
    "{{ self }}",  # the template's own reference, never a root
    "{{ range }}",  # a global, not a root
    "{{ workload.numbers | length }}",  # not a path: the template as before
]


def _outcome(fn: Any) -> tuple[Any, ...]:
    try:
        out = fn()
    except Exception as exc:  # the outcome compared is the error's type and text
        return ("error", (type(exc).__name__, str(exc)))
    if out is None or isinstance(out, str | int | float | list | dict):
        return ("value", out)
    return ("object", type(out).__name__, getattr(out, "__name__", None))


@pytest.mark.parametrize("source", SOURCES)
def test_a_whole_path_template_gives_what_the_template_gives(source: str) -> None:
    problems: list[tuple[str, str]] = []
    compiled = compile_value(source, "t", problems)
    assert problems == []
    expr = environment().compile_expression(source.strip()[2:-2], undefined_to_none=False)

    def through_jinja() -> Any:
        out = expr(**ROOTS)
        if isinstance(out, jinja2.Undefined):
            out._fail_with_undefined_error()
        return out

    assert _outcome(lambda: compiled.render(ROOTS)) == _outcome(through_jinja)


@pytest.mark.parametrize("source", ["{{ workload.numbers }}", "{{ rows[0]['id'] }}", "{{ obj.name }}"])
def test_a_whole_path_template_renders_without_a_template_context(source: str, monkeypatch) -> None:
    made: list[object] = []
    new_context = jinja2.runtime.new_context
    monkeypatch.setattr(jinja2.runtime, "new_context", lambda *a, **k: made.append(1) or new_context(*a, **k))
    monkeypatch.setattr(jinja2.environment, "new_context", jinja2.runtime.new_context)
    compiled = compile_value(source, "t", [])
    compiled.render(ROOTS)
    assert made == []
    compile_value("{{ workload.numbers | length }}", "t", []).render(ROOTS)
    assert made == [1]  # (what is counted is counted: a filter still builds its context)
