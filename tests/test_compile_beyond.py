"""Beyond the seeds (issue 17): what ``compile_spec`` refuses, located, before anything runs."""

from __future__ import annotations

from typing import Any

import pytest

from mcpipe.compile import compile_spec
from mcpipe.errors import SpecError


def problems(spec: dict[str, Any]) -> list[tuple[str, str]]:
    with pytest.raises(SpecError) as e:
        compile_spec(spec)
    return [(p.location, p.message) for p in e.value.problems]


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (
            {"steps": [{"tool": "echo", "args": {"v": "${item.x}"}}]},
            ("steps[0].args.v", "reference `item.x`: `item` is defined only inside a `for_each` step"),
        ),
        (
            {"steps": [{"tool": "echo", "when": "vars. >"}]},
            ("steps[0].when", "invalid CEL: syntax error at line 1, column 7: no viable alternative at input '. >'"),
        ),
        (
            {"steps": [{"tool": "echo", "when": "${steps.later.ok}"}, {"id": "later", "tool": "echo"}]},
            ("steps[0].when", "reference to step 'later', which does not run before this step"),
        ),
        (
            {"steps": [{"tool": "echo", "when": "steps.later.ok"}, {"id": "later", "tool": "echo"}]},
            ("steps[0].when", "reference to step 'later', which does not run before this step"),
        ),
        (
            {"steps": [{"id": "e", "for_each": [1, 2], "step": {"tool": "echo"}}]},
            ("steps[0].for_each", "for_each takes one reference to an array, got array"),
        ),
        (
            {
                "vars": {"a": 1},
                "steps": [{"id": "e", "for_each": "${vars.a}", "as": "steps", "step": {"tool": "echo"}}],
            },
            (
                "steps[0].as",
                "`as` names the element: an identifier other than vars, steps, last, args, context or index, "
                'got "steps"',
            ),
        ),
        (
            {"steps": [{"tool": "echo", "continue_on_error": "yes"}]},
            ("steps[0].continue_on_error", "Expected `bool | null`, got `str`"),
        ),
        (
            {"steps": [{"tool": "echo", "args": {"v": "${vars.a ?? nope}"}}], "vars": {"a": 1}},
            (
                "steps[0].args.v",
                "invalid placeholder at character 0: expected a default after `??` (a string, a number, true, "
                "false or null) (character 12)",
            ),
        ),
        (
            {"steps": [{"id": "e", "for_each": "${vars.a}", "step": {"tool": "echo", "args": {"i": "${item.y}"}}}]},
            ("steps[0].for_each", "reference `vars.a`: no var named 'a'"),
        ),
    ],
)
def test_bad_additions_are_refused_located(spec: dict[str, Any], expected: tuple[str, str]) -> None:
    assert problems(spec) == [expected]


def test_item_and_index_are_in_scope_inside_for_each_and_its_groups_but_not_nested_pipes() -> None:
    ok = {
        "vars": {"xs": [1]},
        "steps": [
            {
                "id": "e",
                "for_each": "${vars.xs}",
                "step": {"parallel": [{"tool": "echo", "args": {"v": "${item}", "i": "${index}"}}]},
            }
        ],
    }
    compile_spec(ok)
    nested = {
        "vars": {"xs": [1]},
        "steps": [
            {
                "id": "e",
                "for_each": "${vars.xs}",
                "step": {"pipe": {"vars": {"it": "${item}"}, "steps": [{"tool": "echo", "args": {"v": "${item}"}}]}},
            }
        ],
    }
    assert problems(nested) == [
        ("steps[0].step.pipe.steps[0].args.v", "reference `item`: `item` is defined only inside a `for_each` step")
    ]


def test_the_servers_config_sets_max_items_and_the_idempotent_tools() -> None:
    from mcpipe.config import ConfigError, parse_config
    from mcpipe.server._app import limits_of

    limits = limits_of(parse_config('[pipe]\nmax_items = 3\nidempotent_tools = ["search_*"]\n'))
    assert (limits.max_items, limits.idempotent_tools) == (3, ("search_*",))
    assert limits_of(parse_config("")).max_items == 100
    with pytest.raises(ConfigError) as e:
        parse_config("[pipe]\nmax_items = 0\n")
    assert [(p.location, p.message) for p in e.value.problems] == [("pipe.max_items", "must be positive")]
